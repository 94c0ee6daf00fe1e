"""`oospec bench run`: speed, equality and accuracy of decoding methods on tool-calling benchmarks.

For every sample, `ar` (plain greedy decoding through our engine) runs first: its token ids are the
reference every other method must reproduce (``identical``) and its text gives the call accuracy. Then each
other method (oospec.bench.methods) decodes the same prompt. Every method gets the same CPU cores
(oospec.bench.config.Cores), so each speed-up is against `ar` on equal cores.

Results: ``samples.jsonl`` (one line per sample and method), ``report.md`` (one table per dataset),
``summary.json``, ``speedup.png`` and ``run.json`` (machine, cores, sidecar adapter) in the output folder.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from oospec.bench.config import BenchConfig, Cores, check_sampling, plan_cores
from oospec.bench.items import BenchError, select
from oospec.bench.methods import (TARGET_THREADS, BenchMethod, Reference, Run, Shared, build_methods,
                                  check_methods_sample, check_engine_features, parse_methods, uses_sidecar)
from oospec.bench.records import RecordLog, compared, output_folder, write_json
from oospec.bench.report import (format_report, format_stdout, plot_speedup, plural, public_summary, summarize,
                                 summarize_sidecar, summarize_turns)
from oospec.engine.threads import torch_threads
from oospec.errors import MissingExtraError
from oospec.models.cpu_features import cpu_model

log = logging.getLogger("oospec.bench")


def run_benchmark(cfg: BenchConfig, *, engine=None, assistant_model=None, assistant_tokenizer=None,
                  sidecar=None) -> dict:
    """Run the benchmark, write its files under `cfg.out` and return {"summary", "out", "report", "divergences"}.

    `engine` / `assistant_model` / `sidecar` (a SidecarClient) may be given ready (tests); otherwise they are
    loaded from `cfg.target` / `cfg.assistant` / `cfg.sidecar_model` (a ready sidecar should use
    `cfg.sidecar_adapter`: that is the adapter recorded and checked). Torch threads are restored afterwards.
    """
    import torch

    with torch_threads(None):
        names = parse_methods(cfg.methods)
        check_sampling(cfg)
        check_methods_sample(names, cfg.temperature)
        check_engine_features(names, cfg.sessions, cfg.tool_choice)
        if cfg.budget < 1 or cfg.max_new_tokens < 1:
            raise BenchError("--budget and --max-new-tokens must be at least 1")
        with_sidecar = any(uses_sidecar(m) for m in names)
        adapter = _resolved_adapter(cfg) if with_sidecar else None
        datasets, trained = select(cfg, adapter)
        cores = plan_cores(cfg, torch.get_num_threads(), with_sidecar)
        if cores.target != cores.total and TARGET_THREADS not in names and cfg.secondary_baseline:
            names.insert(1, TARGET_THREADS)  # the baseline of the secondary column
        out = output_folder(cfg.out, [*cfg.datasets, *cfg.data])
        if engine is None:
            from oospec.engine.engine import Engine

            engine = Engine.from_pretrained(cfg.target, dtype=cfg.dtype, device=cfg.device, optimize=cfg.optimize)
        if cfg.slot_adapter:  # every method shares the target: only slot rows (oospec-rows) read the LoRA
            from oospec.engine.slot_rows import add_slot_lora

            add_slot_lora(engine.model, cfg.slot_adapter)
        shared = Shared(engine, cfg, cores, assistant_model=assistant_model, assistant_tokenizer=assistant_tokenizer)
        methods = build_methods(names, shared)
        own_sidecar = sidecar is None and with_sidecar
        if own_sidecar:
            sidecar = _start_sidecar(cfg)
        shared.sidecar = sidecar if with_sidecar else None
        header = _header(cfg, engine, methods, cores, datasets, adapter, trained, shared.sidecar)
        t0 = time.perf_counter()
        try:
            records, divergences = _run_methods(methods, datasets, shared, out)
        finally:
            for m in methods:
                m.close()
            if own_sidecar:
                sidecar.close()
        if shared.sidecar is not None:
            header["sidecar"]["faults"] = sidecar.stats.faults
        header["elapsed_s"] = time.perf_counter() - t0
        return _write_results(cfg, out, records, divergences, header, [m.name for m in methods], cores)


def _run_methods(methods: list[BenchMethod], datasets, shared: Shared, out: Path) -> tuple[list[dict], list[dict]]:
    """Every method on every sample, `ar` first on each (its tokens are the reference); records as they come."""
    from tqdm.auto import tqdm

    cfg, engine = shared.cfg, shared.engine
    if cfg.warmup:
        _warm_up(methods, datasets[0][1][0], engine)
    records: list[dict] = []
    divergences: list[dict] = []
    bar = tqdm(total=sum(len(s) for _, s in datasets) * len(methods), desc="bench", unit="gen",
               disable=not cfg.progress, file=sys.stderr)
    with RecordLog(out) as jsonl:
        for label, samples in datasets:
            for m in methods:
                m.start()
            for session, turns in _units(samples, cfg.sessions):
                prompts = [engine.encode(s.messages, s.chat_tools()) for s in turns]
                references: list[Reference | None] = [None] * len(turns)
                for m in methods:  # `ar` first: each turn's reference
                    m.start_session(reuse_prefixes=session is not None)
                    for turn, (sample, prompt_ids) in enumerate(zip(turns, prompts)):
                        bar.set_postfix_str(f"{label} {sample.id} {m.name}", refresh=False)
                        run = _run_one(m, sample, prompt_ids, references[turn], cfg.max_new_tokens)
                        # its clock has stopped: what it left running (a sidecar's job) ends before the next starts
                        leftover_s = m.settle()
                        references[turn] = references[turn] or Reference(run.tokens, run.stats["prefill_s"])
                        rec, div = _record(label, sample, m, run, references[turn], engine)
                        rec["leftover_s"] = round(leftover_s, 3)
                        if session is not None:
                            rec["session"], rec["turn"] = session, turn + 1
                        if div is not None:
                            divergences.append(div)
                            bar.write(f"[not identical] {label} {sample.id} {m.name}: first difference at token "
                                      f"{div['first_diff']} (ar {div['ar_token']} vs {div['method_token']})")
                        records.append(rec)
                        jsonl.write(rec)
                        bar.update(1)
    bar.close()
    return records, divergences


def _units(samples, sessions: bool) -> list[tuple[str | None, list]]:
    """What runs as one unit, every method in turn: each sample alone (cold requests), or each session's turns."""
    if not sessions:
        return [(None, [s]) for s in samples]
    from oospec.datasets import group_sessions

    return group_sessions(samples)


def _run_one(m: BenchMethod, sample, prompt_ids, reference: Reference | None, max_new_tokens: int) -> Run:
    with torch_threads(m.threads):
        return m.run(sample, prompt_ids, reference, max_new_tokens)


def _warm_up(methods: list[BenchMethod], sample, engine) -> None:
    """One short generation per method, not recorded, with throwaway state (first-call overheads: allocator,
    kernels, tokenizer caches), then whatever it left running finished (BenchMethod.settle)."""
    prompt_ids = engine.encode(sample.messages, sample.chat_tools())
    reference = None
    for m in methods:
        m.start()
        run = _run_one(m, sample, prompt_ids, reference, min(16, m.shared.cfg.max_new_tokens))
        m.settle()
        reference = reference or Reference(run.tokens, run.stats["prefill_s"])


def _record(label: str, sample, m: BenchMethod, run: Run, reference: Reference, engine) -> tuple[dict, dict | None]:
    """The samples.jsonl line of one run, and its divergence from ar (None: identical)."""
    text = engine.tokenizer.decode(run.tokens, skip_special_tokens=True)
    comparison = compared(reference.tokens, run.tokens)
    accurate, acc_note = scored_call(sample, text)
    rec = {"dataset": label, "sample_id": sample.id, "method": m.name, "cores": m.cores, "cpu_threads": m.cpu_threads,
           "target_threads": m.threads, **run.stats, "identical": comparison["identical"], "accurate": accurate,
           "text": text, **run.extra}
    div = None
    if not comparison["identical"]:
        diff = rec["first_diff"] = comparison["first_diff"]
        div = {"dataset": label, "sample_id": sample.id, "method": m.name, "first_diff": diff,
               "ar_token": _token_at(engine, reference.tokens, diff), "method_token": _token_at(engine, run.tokens, diff)}
    if acc_note:
        rec["accuracy_note"] = acc_note
    return rec, div


def scored_call(sample, text: str) -> tuple[bool | None, str | None]:
    """(accurate, why not scored or what failed): the benchmark's call check of a reply's text, for every
    method and peer alike."""
    from oospec.datasets import DatasetError, call_accuracy

    try:
        return bool(call_accuracy(sample, text)), None
    except DatasetError as exc:  # no gold answer: not scored
        return None, str(exc)
    except Exception as exc:  # a parser failure on odd output counts as wrong, and is recorded
        return False, f"{type(exc).__name__}: {exc}"


def _token_at(engine, tokens: np.ndarray, i: int) -> str:
    if i >= tokens.size:
        return "(end)"
    tok = int(tokens[i])
    return f"{tok} {engine.tokenizer.decode([tok])!r}"


# -- the sidecar, and what its adapter was trained on ---------------------------------------------------------
def _resolved_adapter(cfg: BenchConfig) -> str | None:
    from oospec.sidecar.process import resolve_adapter

    return resolve_adapter(cfg.sidecar_model, cfg.sidecar_adapter)


def _start_sidecar(cfg: BenchConfig):
    from oospec.sidecar.process import SidecarSettings, make_sidecar

    # The sidecar's dtype is not the target's: a drafter runs in the fastest precision its device has.
    sidecar = make_sidecar(SidecarSettings(cfg.sidecar_model, cfg.sidecar_adapter, cfg.sidecar_threads,
                                           cfg.sidecar_device, cfg.sidecar_dtype))
    if not sidecar.ready:
        raise BenchError(f"the sidecar {cfg.sidecar_model!r} did not start: see the warning above")
    return sidecar


# -- the files ------------------------------------------------------------------------------------------------
def _header(cfg: BenchConfig, engine, methods: list[BenchMethod], cores: Cores, datasets, adapter: str | None,
            trained: list[dict], shared_sidecar=None) -> dict:
    """The run's facts; `shared_sidecar`: the started sidecar, whose precision ("auto" resolved) is recorded."""
    from oospec.sidecar.provenance import weights_sha256

    names = [m.name for m in methods]
    param = next(engine.model.parameters())
    return {
        "command": cfg.command or command_line(cfg),
        "machine": machine_info(),
        "target": cfg.target,
        "dtype": str(param.dtype).replace("torch.", ""),
        "device": str(param.device),
        "optimize": cfg.optimize,
        "kernels": kernels_note(engine.model),
        "dtype_choice": getattr(engine, "dtype_note", ""),
        "assistant": cfg.assistant if "hf-assisted" in names else None,
        "assistant_kernels": kernels_note(methods[0].shared.assistant_model) if "hf-assisted" in names else None,
        "sidecar": {"model": cfg.sidecar_model, "adapter": adapter, "adapter_sha256": weights_sha256(adapter),
                    "threads": cfg.sidecar_threads, "device": cfg.sidecar_device,
                    "dtype": getattr(shared_sidecar, "precision", None) or cfg.sidecar_dtype,
                    "cache": "cleared before a run of the item the sidecar served last (another method's, or "
                             "the warm-up)"} if cores.sidecar_device is not None else None,
        "target_threads": cores.target,
        "cores": {**cores.as_json(), "methods": {m.name: {"cores": m.cores, "target_threads": m.threads,
                                                          "cpu_threads": m.cpu_threads} for m in methods}},
        "trained_items": trained,
        "max_new_tokens": cfg.max_new_tokens,
        "budget": cfg.budget,
        "slot_adapter": cfg.slot_adapter,
        "decoding": decoding_note(cfg),
        "methods": names,
        "datasets": [label for label, _ in datasets],
        "items": {label: [s.id for s in samples] for label, samples in datasets},
        "mode": ("sessions (turn by turn, prefix reuse per method)" if cfg.sessions else "cold single requests")
        + ("; tool_choice required: every reply decoded under the call grammar" if cfg.tool_choice != "auto" else ""),
        "eos_ids": sorted(int(i) for i in engine.eos_ids),
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
    }


def _write_results(cfg: BenchConfig, out: Path, records, divergences, header: dict, names: list[str],
                   cores: Cores) -> dict:
    summary = summarize(records, names, target_threads=cores.target)
    header["leftover"] = leftover_work(records)
    sidecar_summary = summarize_sidecar(records)
    report = format_report(summary, header, divergences, sidecar_summary, summarize_turns(records))
    (out / "report.md").write_text(report, encoding="utf-8")
    public = public_summary(summary, sidecar_summary)
    write_json(out / "summary.json", public)
    write_json(out / "run.json", {**header, "divergences": divergences})
    try:
        plot_speedup(summary, names, out / "speedup.png",
                     title=f"{cfg.target}, {header['machine']['cpu']}, {plural(cores.total, 'core')} per method")
    except MissingExtraError as e:
        print(f"speedup.png not written: {e}", file=sys.stderr)
    if cfg.echo:
        print(format_stdout(summary, out))
    return {"summary": public, "out": out, "report": report, "divergences": divergences}


def leftover_work(records) -> dict:
    """Per method, the work its runs left running after their clocks stopped (a sidecar's job), which the
    benchmark waited out before the next run started: {"runs": how many left some, "seconds": waited}."""
    out: dict[str, dict] = {}
    for rec in records:
        if rec.get("leftover_s", 0) > 0.02:  # below: the poll's own period, nothing was running
            entry = out.setdefault(rec["method"], {"runs": 0, "seconds": 0.0})
            entry["runs"] += 1
            entry["seconds"] = round(entry["seconds"] + rec["leftover_s"], 3)
    return out


def decoding_note(cfg: BenchConfig) -> dict:
    """How every method decodes in this run, and what `identical` means for it."""
    if cfg.temperature <= 0:
        return {"mode": "greedy", "identical": "the same token ids as ar, plain greedy decoding"}
    return {"mode": "sampling", "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
            "seed": cfg.seed,
            "identical": "the same token ids as ar, plain sampling with the item's seed (oospec.bench.config."
                         "item_seed): speculative sampling draws position j's token from the same uniform as "
                         "plain sampling, so a lossless method returns exactly ar's tokens; the distribution "
                         "itself is checked by the statistical tests in tests/test_speculative_sampling.py"}


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


def kernels_note(model) -> str:
    """Which kernels the model's forwards run (oospec.engine.precision.prepare installed them, or not)."""
    report = getattr(model, "oospec_invariant", None) if model is not None else None
    if not report:
        return "stock transformers"
    return f"oospec.engine.invariant: {report['kernels']}, forwards of <= {report['step_rows']} rows row-invariant"


def command_line(cfg: BenchConfig) -> str:
    """The command that reproduces this run, every option spelled out."""
    methods = cfg.methods if isinstance(cfg.methods, list) else cfg.methods.split(",")
    parts = ["oospec", "bench", "run"]
    if cfg.datasets:
        parts += ["--dataset", ",".join(cfg.datasets)]
    if cfg.split is not None:
        parts += ["--split", str(cfg.split)]
    for d in cfg.data:
        parts += ["--data", d]
    parts += ["--methods", ",".join(methods), "--target", cfg.target]
    if cfg.offset:
        parts += ["--offset", str(cfg.offset)]
    if cfg.held_out_only:
        parts.append("--held-out-only")
    if cfg.limit is not None:
        parts += ["--limit", str(cfg.limit)]
    if cfg.items:
        parts += ["--items", ",".join(cfg.items)]
    if not cfg.secondary_baseline:
        parts.append("--no-secondary-baseline")
    parts += ["--max-new-tokens", str(cfg.max_new_tokens), "--budget", str(cfg.budget)]
    if cfg.temperature > 0:
        parts += ["--temperature", f"{cfg.temperature:g}", "--top-p", f"{cfg.top_p:g}", "--top-k", str(cfg.top_k),
                  "--seed", str(cfg.seed)]
    if cfg.threads:
        parts += ["--target-threads", str(cfg.threads)]
    if any(uses_sidecar(m.strip()) for m in methods):
        parts += ["--sidecar-model", cfg.sidecar_model, "--sidecar-threads", str(cfg.sidecar_threads),
                  "--sidecar-device", cfg.sidecar_device]
        parts += ["--sidecar-adapter", str(cfg.sidecar_adapter or "none")]
        if cfg.sidecar_dtype != "auto":
            parts += ["--sidecar-dtype", cfg.sidecar_dtype]
        if cfg.allow_trained_items:
            parts.append("--allow-trained-items")
    if cfg.slot_adapter:
        parts += ["--slot-adapter", str(cfg.slot_adapter)]
    if cfg.out:
        parts += ["--out", str(cfg.out)]
    if "hf-assisted" in methods:
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
