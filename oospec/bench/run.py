"""`oospec bench run`: speed, equality and accuracy of decoding methods on tool-calling benchmarks.

For every sample, `ar` (plain greedy decoding through our engine) runs first: its token ids are the
reference every other method must reproduce (``identical``) and its text gives the call accuracy. Then each
other method decodes the same prompt:

- our drafters through the engine (``ar``, ``pld``, ``toolspec``, any name in ``oospec.drafters.DRAFTERS``);
- ``oracle``: a drafter that proposes the reference tokens themselves, a chain as long as the budget (the
  ceiling of any drafter here, given what verification costs);
- ``hf-pld`` / ``hf-assisted``: Hugging Face ``generate`` with prompt lookup / an assistant model, greedy,
  on the same model object, threads, eos ids and max_new_tokens.

One drafter instance per method serves all samples of a dataset, in sample order (drafters that learn,
learn as they would in service). Results: ``samples.jsonl`` (one line per sample and method),
``report.md`` (one table per dataset), ``summary.json`` and ``speedup.png`` in the output folder.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oospec.errors import OospecError

REFERENCE = "ar"
ORACLE = "oracle"
SIDECAR_METHODS = ("oospec", "sidecar", "oospec-wait")  # engine methods that run with a sidecar process
# `oospec` whose target waits for the payload before its first draft: the tau that hints always in time give
# (a sidecar on its own accelerator), for targets that outpace a CPU sidecar. The wait counts in decode time.
WAIT_FOR_SIDECAR = "oospec-wait"
ALL_CORES = "ar-all-cores"  # plain greedy decoding with every core, for reference when the target has fewer
HF_METHODS = ("hf-pld", "hf-assisted")
PROMPT_LOOKUP_NUM_TOKENS = 10


class BenchError(OospecError):
    """A benchmark run that cannot start as asked (unknown method or dataset, bad options)."""


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    datasets: list[str] = field(default_factory=list)  # names, "name:split" or file paths
    methods: list[str] = field(default_factory=lambda: ["ar", "pld", "toolspec"])
    target: str = "qwen2.5-coder-1.5b"
    split: str | None = None  # applies to every dataset given without ":split"
    data: list[str] = field(default_factory=list)  # extra dataset files (load_path)
    limit: int | None = None
    max_new_tokens: int = 128
    budget: int = 16
    threads: int | None = None  # the target's torch threads (default: torch's choice, all cores)
    sidecar_model: str = "qwen2.5-coder-0.5b"
    sidecar_threads: int = 1
    sidecar_device: str = "cpu"
    sidecar_adapter: str | None = "auto"  # see oospec.sidecar.process.resolve_adapter
    out: str | Path | None = None
    assistant: str = "qwen2.5-coder-0.5b"
    dtype: str = "auto"
    device: str = "cpu"
    optimize: bool = True
    warmup: bool = True
    progress: bool = True
    echo: bool = True  # print the tables
    command: str | None = None  # the command line, for the report header


def known_methods() -> list[str]:
    from oospec.drafters import DRAFTERS

    names = [REFERENCE, *(m for m in DRAFTERS if m != REFERENCE), ORACLE, ALL_CORES, WAIT_FOR_SIDECAR, *HF_METHODS]
    return list(dict.fromkeys(names))


def parse_methods(methods: str | Sequence[str]) -> list[str]:
    """Method names in run order, `ar` first (added when missing: it is the reference)."""
    items = methods.split(",") if isinstance(methods, str) else list(methods)
    items = [m.strip() for m in items if m and m.strip()]
    known = known_methods()
    unknown = [m for m in items if m not in known]
    if unknown:
        raise BenchError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from: {', '.join(known)}")
    ordered = [REFERENCE] + [m for m in dict.fromkeys(items) if m != REFERENCE]
    return ordered


def _dataset_label(spec: str, split: str | None) -> str:
    if Path(spec).exists():
        return Path(spec).stem
    if split is not None and ":" not in spec:
        return f"{spec}:{split}"
    return spec


def load_datasets(cfg: BenchConfig) -> list[tuple[str, list]]:
    """[(label, samples)] for every dataset asked for, validated before any model is loaded."""
    from oospec.bench.datasets import load_dataset, load_path

    specs = [s.strip() for s in cfg.datasets if s and s.strip()]
    if not specs and not cfg.data:
        raise BenchError("no dataset given: use --dataset apibank|bfcl|toolalpaca (comma list) or --data PATH")
    out: list[tuple[str, list]] = []
    for spec in specs:
        split = None if ":" in spec or Path(spec).exists() else cfg.split
        samples = load_dataset(spec, split=split, limit=cfg.limit)  # DatasetError (an OospecError) if unknown
        out.append((_dataset_label(spec, split), samples))
    for path in cfg.data:
        if not Path(path).exists():
            raise BenchError(f"--data file not found: {path}")
        samples = load_path(path)
        if cfg.limit is not None:
            samples = samples[: max(0, int(cfg.limit))]
        out.append((Path(path).stem, samples))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise BenchError(f"the same dataset is listed twice: {', '.join(labels)}")
    empty = [label for label, samples in out if not samples]
    if empty:
        raise BenchError(f"no samples in: {', '.join(empty)}")
    return out


def default_out_dir(datasets: Sequence[str]) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    names = "+".join(re.sub(r"[^A-Za-z0-9._-]+", "_", Path(d).stem if Path(d).exists() else d) for d in datasets)
    return Path("runs") / f"{stamp}-{names or 'data'}"


# --------------------------------------------------------------------------------------------------
# Machine
# --------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    import torch
    import transformers

    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# --------------------------------------------------------------------------------------------------
# Running one method on one sample
# --------------------------------------------------------------------------------------------------


class ForwardCounter:
    """Counts calls of a module's forward (prefill included) while attached."""

    def __init__(self, module):
        self.module = module
        self.count = 0
        self._handle = None

    def __enter__(self):
        self.count = 0

        def hook(*_):
            self.count += 1

        self._handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        self._handle = None


def greedy_generation_config(model, eos_ids: Sequence[int], pad_token_id: int):
    """A copy of the model's generation config that is plain greedy: no sampling knobs, no penalties."""
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample = False
    gc.num_beams = 1
    for name in ("temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty",
                 "no_repeat_ngram_size", "encoder_repetition_penalty", "length_penalty"):
        if hasattr(gc, name):
            setattr(gc, name, None)
    gc.eos_token_id = list(eos_ids)
    gc.pad_token_id = pad_token_id
    return gc


def _pad_token_id(engine) -> int:
    for source in (engine.tokenizer, engine.model.generation_config, engine.model.config):
        value = getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return min(engine.eos_ids)


@dataclass
class HFPeer:
    """Hugging Face `generate` on the engine's model, greedy, with prompt lookup or an assistant model."""

    engine: Any
    method: str
    assistant_model: Any = None
    assistant_tokenizer: Any = None  # only when its vocabulary differs from the target's

    def __post_init__(self):
        self.pad_token_id = _pad_token_id(self.engine)
        self.generation_config = greedy_generation_config(self.engine.model, sorted(self.engine.eos_ids),
                                                          self.pad_token_id)

    def call_config(self, max_new_tokens: int):
        """The generation config of one call: greedy, our eos ids and pad id, this many new tokens."""
        gc = copy.deepcopy(self.generation_config)
        gc.max_new_tokens = max_new_tokens
        gc.max_length = None
        if self.method == "hf-pld":
            gc.prompt_lookup_num_tokens = PROMPT_LOOKUP_NUM_TOKENS
        return gc

    def kwargs(self) -> dict:
        if self.method == "hf-pld":
            return {}
        kw: dict[str, Any] = {"assistant_model": self.assistant_model}
        if self.assistant_tokenizer is not None:
            kw.update(tokenizer=self.engine.tokenizer, assistant_tokenizer=self.assistant_tokenizer)
        return kw

    def generate(self, prompt_ids: np.ndarray, max_new_tokens: int) -> tuple[np.ndarray, int, float]:
        """(new token ids, target forwards, end-to-end seconds)."""
        import torch

        model = self.engine.model
        device = next(model.parameters()).device
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).view(1, -1)
        mask = torch.ones_like(ids)
        with ForwardCounter(model) as counter:
            t0 = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=mask,
                generation_config=self.call_config(max_new_tokens),  # do_sample=False, eos, pad: see there
                **self.kwargs(),
            )
            e2e = time.perf_counter() - t0
        tokens = out[0, ids.shape[1]:].detach().cpu().numpy().astype(np.int64)
        return tokens, counter.count, e2e


def make_method(name: str, sidecar=None, wait_s: float = 120.0):
    """A fresh drafter for an engine method (state is kept per dataset by the caller)."""
    if name == ORACLE:
        from oospec.drafters.oracle import OracleDrafter

        return OracleDrafter()
    from oospec.drafters import make_drafter

    if name == ALL_CORES:
        return make_drafter(REFERENCE)
    if name == WAIT_FOR_SIDECAR:
        return make_drafter("oospec", sidecar=sidecar, wait_s=wait_s)
    if name in SIDECAR_METHODS:
        return make_drafter(name, sidecar=sidecar)
    return make_drafter(name)


class _Threads:
    """Run a block with this many torch threads (None: unchanged)."""

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)


def _normalized(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def sidecar_agreement(report: dict, sample, text: str) -> dict:
    """How the sidecar's payload compares with the call the target actually wrote."""
    no_call = bool(report.get("no_call"))
    if not report.get("function") and not no_call:
        return {}
    try:
        calls = sample.parse(text)
    except Exception:
        calls = []
    if not calls or no_call:  # "no call" agrees with a target that wrote none, and only with that
        agree = not calls and no_call
        return {"function_match": agree, "slots_total": 0, "slots_matched": 0, "full_match": agree}
    call = calls[0]
    guesses = [{"function": report["function"], "arguments": report.get("arguments") or {}},
               *[g for g in report.get("alternatives", []) if isinstance(g, dict)]]
    # Slots are compared with the guess for the function the target chose (the best or an alternative branch).
    guess = next((g for g in guesses if g["function"] == call.name), None)
    hinted = guess["arguments"] if guess else {}
    args = call.arguments if isinstance(call.arguments, dict) else {}
    matched = sum(1 for k, v in args.items() if k in hinted and _normalized(hinted[k]) == _normalized(v))
    full = guess is not None and matched == len(args) and set(hinted) == set(args)
    return {"function_match": call.name == report["function"], "function_in_payload": guess is not None,
            "slots_total": len(args), "slots_matched": matched, "full_match": full}


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first position where two token sequences differ (a length difference counts), None if equal."""
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        return int(diff[0])
    return None if a.size == b.size else n


def _accuracy(sample, text: str) -> tuple[bool | None, str | None]:
    from oospec.bench.datasets import DatasetError, call_accuracy

    try:
        return bool(call_accuracy(sample, text)), None
    except DatasetError as exc:  # no gold answer: not scored
        return None, str(exc)
    except Exception as exc:  # a parser failure on odd output counts as wrong, and is recorded
        return False, f"{type(exc).__name__}: {exc}"


def run_engine_method(engine, sample, prompt_ids, drafter, cfg: BenchConfig):
    t0 = time.perf_counter()
    result = engine.generate(
        sample.messages,
        prompt_ids=prompt_ids,
        drafter=drafter,
        max_new_tokens=cfg.max_new_tokens,
        budget=cfg.budget,
        tool_schemas=sample.tools,
        dialect=sample.dialect,
        # The only sample metadata a drafter sees: gold answers and source files stay out of the request.
        tools_in_prompt=sample.meta.get("tools_in_prompt"),
    )
    e2e = time.perf_counter() - t0
    st = result.stats
    return result.tokens.astype(np.int64), {
        "new_tokens": st.new_tokens,
        "target_forwards": st.target_forwards,
        "tau": st.tau,
        "accepted_per_step": list(map(int, st.accepted_per_step)),
        "prefill_s": st.prefill_s,
        "decode_s": st.decode_s,
        "e2e_s": e2e,
        "draft_s": st.draft_s,
    }


# --------------------------------------------------------------------------------------------------
# Aggregation and reporting
# --------------------------------------------------------------------------------------------------


def _safe_div(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize_sidecar(records: Sequence[dict]) -> dict:
    """{dataset: {method: sidecar stats}} for methods that ran with a sidecar."""
    out: dict[str, dict[str, dict]] = {}
    for r in records:
        sc = r.get("sidecar")
        if not sc:
            continue
        out.setdefault(r["dataset"], {}).setdefault(r["method"], []).append(sc)
    table: dict[str, dict[str, dict]] = {}
    for ds, per_method in out.items():
        for m, scs in per_method.items():
            answered = [x for x in scs if x.get("function") or x.get("no_call")]
            in_time = [x for x in answered if x.get("arrived")]
            agree = [x for x in answered if "function_match" in x]
            slots_total = sum(x.get("slots_total", 0) for x in agree)
            table.setdefault(ds, {})[m] = {
                "n": len(scs),
                "answered": len(answered) / len(scs),
                "in_time": len(in_time) / len(scs),
                "latency_s": float(np.mean([x["latency_s"] for x in answered if x.get("latency_s")])) if answered else None,
                "tokens_written_at_arrival": float(np.mean([x["tokens_written_at_arrival"] for x in in_time]))
                if in_time else None,
                "function_agreement": float(np.mean([x["function_match"] for x in agree])) if agree else None,
                "function_in_payload": float(np.mean([x.get("function_in_payload", x["function_match"])
                                                      for x in agree])) if agree else None,
                "slot_agreement": sum(x.get("slots_matched", 0) for x in agree) / slots_total if slots_total else None,
                "full_call_agreement": float(np.mean([x["full_match"] for x in agree])) if agree else None,
                "payload_bytes": float(np.mean([x["payload_bytes"] for x in answered])) if answered else None,
                "faults": sorted({x["fault"] for x in scs if x.get("fault")}),
                "followups": sum(1 for x in scs if x.get("followup", {}).get("submitted")),
                "followups_arrived": sum(1 for x in scs if x.get("followup", {}).get("arrived")),
            }
    return table


def format_sidecar_table(rows: dict[str, dict]) -> str:
    lines = ["| method | n | answered | in time | latency | tokens written at arrival "
             "| function agreement (best, any branch) | slot agreement | full-call agreement | payload bytes "
             "| follow-ups (arrived) | faults |",
             "|" + "---|" * 12]
    for m, r in rows.items():
        lines.append(f"| {m} | {r['n']} | {_pct(r['answered'])} | {_pct(r['in_time'])} "
                     f"| {_fmt(r['latency_s'], '.1f', ' s')} | {_fmt(r['tokens_written_at_arrival'], '.1f')} "
                     f"| {_pct(r['function_agreement'])}, {_pct(r.get('function_in_payload'))} "
                     f"| {_pct(r['slot_agreement'])} "
                     f"| {_pct(r['full_call_agreement'])} | {_fmt(r['payload_bytes'], '.0f')} "
                     f"| {r.get('followups', 0)} ({r.get('followups_arrived', 0)}) "
                     f"| {', '.join(r['faults']) or 'none'} |")
    return "\n".join(lines)


def summarize(records: Sequence[dict], methods: Sequence[str]) -> dict:
    """{dataset: {method: stats}}; speed-ups are ratios of summed times over the same samples, vs ar."""
    by_ds: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        by_ds.setdefault(r["dataset"], {}).setdefault(r["method"], []).append(r)
    summary: dict[str, dict[str, dict]] = {}
    for ds, per_method in by_ds.items():
        ref = {r["sample_id"]: r for r in per_method.get(REFERENCE, [])}
        rows: dict[str, dict] = {}
        for m in methods:
            recs = [r for r in per_method.get(m, []) if r["sample_id"] in ref]
            if not recs:
                continue
            refs = [ref[r["sample_id"]] for r in recs]
            tok = sum(r["new_tokens"] for r in recs)
            fwd = sum(r["target_forwards"] for r in recs)
            scored = [r["accurate"] for r in recs if r["accurate"] is not None]
            ratios = [x["e2e_s"] / r["e2e_s"] for x, r in zip(refs, recs) if r["e2e_s"] > 0]
            rows[m] = {
                "n": len(recs),
                "cores": recs[0].get("cores"),
                "tau": _safe_div(tok, fwd),
                "decode_speedup": _safe_div(sum(x["decode_s"] for x in refs), sum(r["decode_s"] for r in recs)),
                "e2e_speedup": _safe_div(sum(x["e2e_s"] for x in refs), sum(r["e2e_s"] for r in recs)),
                "e2e_ratio_mean": float(np.mean(ratios)) if ratios else None,
                "oracle_fraction": None,
                "oracle_share": None,
                "identical_rate": float(np.mean([bool(r["identical"]) for r in recs])),
                "accuracy": float(np.mean(scored)) if scored else None,
                "new_tokens": tok,
                "target_forwards": fwd,
                "decode_s": sum(r["decode_s"] for r in recs),
                "e2e_s": sum(r["e2e_s"] for r in recs),
            }
        oracle = rows.get(ORACLE, {}).get("decode_speedup")
        for row in rows.values():
            s = row["decode_speedup"]
            if oracle is not None and s is not None and oracle > 1:
                row["oracle_fraction"] = (s - 1) / (oracle - 1)
                row["oracle_share"] = s / oracle
        summary[ds] = rows
    return summary


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def format_table(rows: dict[str, dict]) -> str:
    head = ("| method | cores | n | tau | decode speed-up | e2e speed-up | mean e2e ratio | of oracle's speed-up "
            "| oracle fraction | identical | accuracy |")
    lines = [head, "|" + "---|" * 11]
    for m, r in rows.items():
        lines.append(
            f"| {m} | {r.get('cores') or '–'} | {r['n']} | {_fmt(r['tau'])} | {_fmt(r['decode_speedup'], suffix='x')} "
            f"| {_fmt(r['e2e_speedup'], suffix='x')} | {_fmt(r['e2e_ratio_mean'], suffix='x')} "
            f"| {_pct(r.get('oracle_share'))} | {_pct(r['oracle_fraction'])} | {_pct(r['identical_rate'])} "
            f"| {_pct(r['accuracy'])} |"
        )
    return "\n".join(lines)


FOOTNOTES = """\
- tau: new tokens / target forwards, summed over samples (prefill counted as one forward; 1.00 for ar).
  For hf-* the target forwards are counted with a forward hook on the target model (the assistant's own
  forwards are not counted).
- decode speed-up: sum of ar's decode times / sum of the method's, over the same samples (decode = after
  the prefill forward). e2e speed-up: the same with end-to-end times of the generate call (prompt already
  tokenized). mean e2e ratio: mean over samples of ar e2e / method e2e.
- hf-* peers are timed end to end only; their decode time is their e2e time minus the prefill time that
  our `ar` measured on the same sample.
- of oracle's speed-up: decode speed-up / oracle's decode speed-up. oracle fraction: the stricter share
  of the gain, (speed-up - 1) / (oracle speed-up - 1); 100% = as fast as the oracle, 0% = no faster than
  ar. The oracle drafts ar's own tokens as one chain of `budget` tokens.
- identical: generated token ids equal to ar's. accuracy: the benchmark's call check on the decoded text.
- cores: the target's torch threads, plus the sidecar's for methods that run one (it has its own process).
  oospec-wait: oospec whose target waits (up to 120 s, counted in its decode time) for the payload before
  its first draft: the tau of hints that are always in time, as a sidecar on its own accelerator gives a
  target that outpaces the CPU sidecar here.
  ar-all-cores: ar with every core, for reference; speed-ups are against ar with the target's threads.
- sidecar table: answered = a valid payload came back (perhaps after the request ended); in time = it
  arrived while the target was still decoding, so its hints could be used; tokens written at arrival (of
  those in time): 1.0 = before the first decode step (the sidecar ran during the prefill);
  latency = from the request's start to the payload; agreement = payload vs the call the target wrote
  (function: the best guess, and the best or an alternative branch; slots and full call: the guess for the
  target's function, exact JSON equality, full call = every slot right and no extra slot), for the first
  payload; follow-ups = requests where the target named a function no guess had, so the sidecar was asked
  for that function's slots (arrived: before the request ended).
"""


def format_report(summary: dict, header: dict, divergences: Sequence[dict], sidecar: dict | None = None) -> str:
    lines = ["# oospec bench run", ""]
    lines.append(f"- command: `{header['command']}`")
    mi = header["machine"]
    lines.append(f"- machine: {mi['cpu']}, {mi['cores']} cores, torch threads {mi['torch_threads']}"
                 + (f", GPU {mi['gpu']}" if mi.get("gpu") else ""))
    lines.append(f"- target: {header['target']} ({header['dtype']}, {header['device']}, "
                 f"kernels: {header['kernels']})")
    if header.get("assistant"):
        lines.append(f"- hf-assisted assistant: {header['assistant']}")
    if header.get("sidecar"):
        sc = header["sidecar"]
        lines.append(f"- sidecar: {sc['model']}{' + ' + sc['adapter'] if sc.get('adapter') else ''} on {sc['device']}, "
                     f"{sc['threads']} thread(s), own process; target threads {header['target_threads']}")
    lines.append(f"- max_new_tokens {header['max_new_tokens']}, budget {header['budget']}, "
                 f"hf-pld prompt_lookup_num_tokens {PROMPT_LOOKUP_NUM_TOKENS}")
    lines.append(f"- software: torch {mi['torch']}, transformers {mi['transformers']}, python {mi['python']}")
    lines.append(f"- started {header['started']}, took {header.get('elapsed_s', 0):.0f} s")
    for ds, rows in summary.items():
        lines += ["", f"## {ds}", "", format_table(rows)]
        if sidecar and sidecar.get(ds):
            lines += ["", "Sidecar:", "", format_sidecar_table(sidecar[ds])]
    lines += ["", FOOTNOTES.rstrip()]
    if divergences:
        lines += ["", "## Outputs not identical to ar", "",
                  "| dataset | sample | method | first differing position | ar token | method token |",
                  "|---|---|---|---|---|---|"]
        for d in divergences:
            lines.append(f"| {d['dataset']} | {d['sample_id']} | {d['method']} | {d['first_diff']} "
                         f"| {d['ar_token']} | {d['method_token']} |")
    return "\n".join(lines) + "\n"


def plot_speedup(summary: dict, methods: Sequence[str], path: Path, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    shown = [m for m in methods if m != REFERENCE]
    datasets = list(summary)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(datasets) * max(1, len(shown)) ** 0.5 + 2), 3.8))
    width = 0.8 / max(1, len(shown))
    x = np.arange(len(datasets))
    for i, m in enumerate(shown):
        vals = [summary[ds].get(m, {}).get("decode_speedup") or 0.0 for ds in datasets]
        bars = ax.bar(x - 0.4 + width * (i + 0.5), vals, width, label=m)
        for b, v in zip(bars, vals):
            if v:
                ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    top = max([1.0] + [summary[ds].get(m, {}).get("decode_speedup") or 0.0 for ds in datasets for m in shown])
    ax.set_ylim(0, top * 1.3)  # room for the labels and the legend
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    if title:
        ax.set_title(title, fontsize=9)
    ax.set_xticks(x, datasets)
    ax.set_ylabel("decode speed-up vs ar")
    ax.legend(fontsize=8, ncol=min(4, max(1, len(shown))), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def _to_json(value):
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value


def _warm_up(engine, sample, prompt_ids, engine_methods, hf_peers, cfg: BenchConfig, sidecar=None) -> None:
    """One short generation per method, not recorded, with throwaway drafters (first-call overheads:
    allocator, kernels, tokenizer caches)."""
    n = min(16, cfg.max_new_tokens)
    warm_cfg = copy.copy(cfg)
    warm_cfg.max_new_tokens = n
    ref, _ = run_engine_method(engine, sample, prompt_ids, make_method(REFERENCE), warm_cfg)
    for m in engine_methods:
        if m == REFERENCE:
            continue
        drafter = make_method(m, sidecar)
        if m == ORACLE:
            drafter.set_reference(ref)
        with _Threads(os.cpu_count() if m == ALL_CORES else None):
            run_engine_method(engine, sample, prompt_ids, drafter, warm_cfg)
    for peer in hf_peers.values():
        peer.generate(prompt_ids, n)


def run_benchmark(cfg: BenchConfig, *, engine=None, assistant_model=None, assistant_tokenizer=None,
                  sidecar=None) -> dict:
    """Run the benchmark, write its files under `cfg.out` and return {"summary", "out", "report"}.

    `engine` / `assistant_model` / `sidecar` (a SidecarClient) may be given ready (tests); otherwise they are
    loaded from `cfg.target` / `cfg.assistant` / `cfg.sidecar_model`. The target runs with `cfg.threads`
    torch threads (restored afterwards).
    """
    with _Threads(cfg.threads):
        return _run_benchmark(cfg, engine, assistant_model, assistant_tokenizer, sidecar)


def _run_benchmark(cfg: BenchConfig, engine, assistant_model, assistant_tokenizer, sidecar) -> dict:
    import torch
    from tqdm.auto import tqdm

    methods = parse_methods(cfg.methods)
    datasets = load_datasets(cfg)
    if cfg.budget < 1 or cfg.max_new_tokens < 1:
        raise BenchError("--budget and --max-new-tokens must be at least 1")
    out = Path(cfg.out) if cfg.out else default_out_dir([*cfg.datasets, *cfg.data])
    out.mkdir(parents=True, exist_ok=True)

    if engine is None:
        from oospec.engine.engine import Engine

        engine = Engine.from_pretrained(cfg.target, dtype=cfg.dtype, device=cfg.device, optimize=cfg.optimize)
    engine_methods = [m for m in methods if m not in HF_METHODS]
    hf_peers: dict[str, HFPeer] = {}
    for m in methods:
        if m == "hf-pld":
            hf_peers[m] = HFPeer(engine, m)
        elif m == "hf-assisted":
            if assistant_model is None:
                from oospec.models.loading import load_model

                assistant_model, assistant_tokenizer = load_model(cfg.assistant, dtype=cfg.dtype, device=cfg.device)
            if assistant_model is engine.model:
                raise BenchError("the assistant must be a separate model instance (its forwards would be counted "
                                 "as the target's)")
            same_vocab = assistant_tokenizer is None or assistant_tokenizer.get_vocab() == engine.tokenizer.get_vocab()
            hf_peers[m] = HFPeer(engine, m, assistant_model, None if same_vocab else assistant_tokenizer)

    own_sidecar = sidecar is None
    if sidecar is None and any(m in SIDECAR_METHODS for m in methods):
        from oospec.sidecar import SidecarClient

        sidecar = SidecarClient(cfg.sidecar_model, threads=cfg.sidecar_threads, device=cfg.sidecar_device,
                                dtype=cfg.dtype, adapter=cfg.sidecar_adapter)
        if not sidecar.ready:
            raise BenchError(f"the sidecar {cfg.sidecar_model!r} did not start: see the warning above")
    target_threads = torch.get_num_threads()

    def cores(m: str) -> str:
        if m == ALL_CORES:
            return str(os.cpu_count())
        if m in SIDECAR_METHODS:
            return f"{target_threads}+{cfg.sidecar_threads}" if cfg.sidecar_device == "cpu" else \
                f"{target_threads}+{cfg.sidecar_device}"
        return str(target_threads)

    header = {
        "command": cfg.command or command_line(cfg),
        "machine": machine_info(),
        "target": cfg.target,
        "dtype": str(next(engine.model.parameters()).dtype).replace("torch.", ""),
        "device": str(next(engine.model.parameters()).device),
        "optimize": cfg.optimize,
        "kernels": kernels_note(cfg.optimize),
        "assistant": cfg.assistant if "hf-assisted" in methods else None,
        "sidecar": {"model": cfg.sidecar_model, "adapter": _resolved_adapter(cfg), "threads": cfg.sidecar_threads,
                    "device": cfg.sidecar_device} if sidecar is not None else None,
        "target_threads": target_threads,
        "max_new_tokens": cfg.max_new_tokens,
        "budget": cfg.budget,
        "methods": methods,
        "datasets": [label for label, _ in datasets],
        "eos_ids": sorted(int(i) for i in engine.eos_ids),
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    t_start = time.perf_counter()

    if cfg.warmup:
        label, samples = datasets[0]
        s0 = samples[0]
        _warm_up(engine, s0, engine.encode(s0.messages, s0.chat_tools()), engine_methods, hf_peers, cfg, sidecar)

    records: list[dict] = []
    divergences: list[dict] = []
    total = sum(len(s) for _, s in datasets) * len(methods)
    bar = tqdm(total=total, desc="bench", unit="gen", disable=not cfg.progress, file=sys.stderr)
    with open(out / "samples.jsonl", "w", encoding="utf-8") as jsonl:
        for label, samples in datasets:
            drafters = {m: make_method(m, sidecar) for m in engine_methods}
            for sample in samples:
                prompt_ids = engine.encode(sample.messages, sample.chat_tools())
                ref_tokens: np.ndarray | None = None
                ref_prefill = 0.0
                for m in methods:
                    bar.set_postfix_str(f"{label} {sample.id} {m}", refresh=False)
                    if m in hf_peers:
                        tokens, forwards, e2e = hf_peers[m].generate(prompt_ids, cfg.max_new_tokens)
                        stats = {
                            "new_tokens": int(tokens.size),
                            "target_forwards": forwards,
                            "tau": tokens.size / forwards if forwards else 0.0,
                            "accepted_per_step": None,
                            "prefill_s": ref_prefill,  # ar's, on this sample (see the footnote)
                            "decode_s": max(0.0, e2e - ref_prefill),
                            "e2e_s": e2e,
                            "draft_s": None,
                        }
                    else:
                        drafter = drafters[m]
                        if m == ORACLE:
                            drafter.set_reference(ref_tokens)
                        with _Threads(os.cpu_count() if m == ALL_CORES else None):
                            tokens, stats = run_engine_method(engine, sample, prompt_ids, drafter, cfg)
                    if m == REFERENCE:
                        ref_tokens, ref_prefill = tokens, stats["prefill_s"]
                    text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
                    diff = first_difference(ref_tokens, tokens)
                    accurate, acc_note = _accuracy(sample, text)
                    rec = {"dataset": label, "sample_id": sample.id, "method": m, "cores": cores(m), **stats,
                           "identical": diff is None, "accurate": accurate, "text": text}
                    if m in SIDECAR_METHODS:
                        report = drafters[m].report.as_dict()
                        rec["sidecar"] = {**report, **sidecar_agreement(report, sample, text)}
                    if diff is not None:
                        rec["first_diff"] = diff
                        div = {"dataset": label, "sample_id": sample.id, "method": m, "first_diff": diff,
                               "ar_token": _token_at(engine, ref_tokens, diff),
                               "method_token": _token_at(engine, tokens, diff)}
                        divergences.append(div)
                        bar.write(f"[not identical] {label} {sample.id} {m}: first difference at token {diff} "
                                  f"(ar {div['ar_token']} vs {div['method_token']})")
                    if acc_note:
                        rec["accuracy_note"] = acc_note
                    records.append(rec)
                    jsonl.write(json.dumps(_to_json(rec), ensure_ascii=False) + "\n")
                    jsonl.flush()
                    bar.update(1)
    bar.close()
    if sidecar is not None:
        header["sidecar"]["faults"] = sidecar.stats.faults
        if own_sidecar:
            sidecar.close()
    header["elapsed_s"] = time.perf_counter() - t_start

    summary = summarize(records, methods)
    sidecar_summary = summarize_sidecar(records)
    report = format_report(summary, header, divergences, sidecar_summary)
    (out / "report.md").write_text(report, encoding="utf-8")
    public = {ds: {m: {k: r[k] for k in ("n", "cores", "tau", "decode_speedup", "e2e_speedup", "e2e_ratio_mean",
                                          "oracle_fraction", "oracle_share", "identical_rate", "accuracy")}
                   for m, r in rows.items()} for ds, rows in summary.items()}
    for ds, rows in sidecar_summary.items():
        for m, r in rows.items():
            public[ds][m]["sidecar"] = r
    (out / "summary.json").write_text(json.dumps(_to_json(public), indent=2) + "\n", encoding="utf-8")
    (out / "run.json").write_text(json.dumps(_to_json({**header, "divergences": divergences}), indent=2) + "\n",
                                  encoding="utf-8")
    plot_speedup(summary, methods, out / "speedup.png",
                 title=f"{cfg.target}, {header['machine']['cpu']}, {header['machine']['torch_threads']} threads")
    if cfg.echo:
        print(report)
        print(f"written to {out}")
    return {"summary": public, "out": out, "report": report, "divergences": divergences}


def _resolved_adapter(cfg: BenchConfig) -> str | None:
    from oospec.sidecar.process import resolve_adapter

    return resolve_adapter(cfg.sidecar_model, cfg.sidecar_adapter)


def kernels_note(optimize: bool) -> str:
    """What Engine.from_pretrained(optimize=...) actually did: the CPU kernels are optional."""
    if not optimize:
        return "stock transformers (--no-optimize)"
    import importlib.util

    if importlib.util.find_spec("oospec.engine.cpu_kernels") is None:
        return "stock transformers (oospec.engine.cpu_kernels not available)"
    return "oospec.engine.cpu_kernels"


def _token_at(engine, tokens: np.ndarray, i: int) -> str:
    if i >= tokens.size:
        return "(end)"
    tok = int(tokens[i])
    return f"{tok} {engine.tokenizer.decode([tok])!r}"


def command_line(cfg: BenchConfig) -> str:
    """The command that reproduces this run, every option spelled out."""
    parts = ["oospec", "bench", "run"]
    if cfg.datasets:
        parts += ["--dataset", ",".join(cfg.datasets)]
    if cfg.split is not None:
        parts += ["--split", str(cfg.split)]
    for d in cfg.data:
        parts += ["--data", d]
    parts += ["--methods", ",".join(cfg.methods if isinstance(cfg.methods, list) else [cfg.methods]),
              "--target", cfg.target]
    if cfg.limit is not None:
        parts += ["--limit", str(cfg.limit)]
    parts += ["--max-new-tokens", str(cfg.max_new_tokens), "--budget", str(cfg.budget)]
    if cfg.threads:
        parts += ["--target-threads", str(cfg.threads)]
    if any(m in SIDECAR_METHODS for m in (cfg.methods if isinstance(cfg.methods, list) else cfg.methods.split(","))):
        parts += ["--sidecar-model", cfg.sidecar_model, "--sidecar-threads", str(cfg.sidecar_threads),
                  "--sidecar-device", cfg.sidecar_device]
        parts += ["--sidecar-adapter", str(cfg.sidecar_adapter or "none")]
    if cfg.out:
        parts += ["--out", str(cfg.out)]
    if "hf-assisted" in (cfg.methods if isinstance(cfg.methods, list) else cfg.methods.split(",")):
        parts += ["--assistant", cfg.assistant]
    parts += ["--dtype", cfg.dtype, "--device", cfg.device]
    if not cfg.optimize:
        parts.append("--no-optimize")
    return shlex.join(parts)


def invoked_command() -> str | None:
    """The command line as typed, when this process is the `oospec` command."""
    if Path(sys.argv[0]).name in ("oospec", "__main__.py", "cli.py"):
        return shlex.join(["oospec", *sys.argv[1:]])
    return None


__all__ = ["BenchConfig", "BenchError", "HFPeer", "command_line", "known_methods", "load_datasets",
           "parse_methods", "run_benchmark", "summarize", "format_table"]

