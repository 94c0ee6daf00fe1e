"""The prepared GPU check of the issue's figures, one run of at most 8 minutes on a lent H100 or H200.

Random-initialised models of the real architectures (no weights travel to the device; timing and row invariance
do not depend on weight values). For the target shapes (1.5B, 7B): the padded forward installed, the bitwise
probe, c(1) and c(16) of the eager path and, where this tree has one, of the CUDA-graph path; plain decoding
(`ar`) per token on the 7B shape. For the sidecar's shape (0.5B): the job latency with a 900-token prompt and its
slot rows (the real predictor when a tokenizer folder is given, else the same work through the row runner:
the prompt encoded once, one row per tool name scored, one row per slot decoded). Every figure is set beside the
issue's bound for the card. Results are written after every step; steps left when the time budget runs out are
recorded as skipped, so a run always ends with its JSON.

    python tests/gpu_graph_check.py --out $OUT [--tokenizer DIR]           # on the lent GPU
    python tests/gpu_graph_check.py --device cpu --out /tmp/graph-check    # dry run: tiny shapes, short prompts

On the device machine a tokenizer travels as an ignored folder named in `carry`, e.g.
    mkdir -p .gpu-carry && cd ~/.cache/oospec/models/qwen2.5-coder-0.5b && \
        cp tokenizer.json tokenizer_config.json chat_template.jinja $OLDPWD/.gpu-carry/
then `--tokenizer .gpu-carry`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/helpers, run as a script

from oospec.bench.cost_curve import measure  # noqa: E402
from oospec.engine import padded  # noqa: E402
from oospec.engine.decode import generate  # noqa: E402
from oospec.engine.drafting import Drafter, Request  # noqa: E402
from oospec.engine.precision import PADDED_PROBE_PROMPT, probe  # noqa: E402
from oospec.engine.target import TargetBackend  # noqa: E402
from oospec.models.random_init import random_model  # noqa: E402

# The bounds, per card: c(1) in ms for each target shape; the rest hold on any card.
C1_BOUND_MS = {"H200": {"qwen2.5-1.5b": 1.5, "qwen2.5-7b": 6.5}, "H100": {"qwen2.5-1.5b": 2.0, "qwen2.5-7b": 9.0}}
C16_RATIO_BOUND = 1.1
AR_OVER_C1_BOUND = 1.2
SIDECAR_JOB_BOUND_S = 0.050
TARGETS = ("qwen2.5-1.5b", "qwen2.5-7b")
SIDECAR_SHAPE = "qwen2.5-0.5b"
AR_SHAPE = "qwen2.5-7b"
KS = (1, 16, 64)  # 16: the figure; 64: the widest padded forward, so a projection never extrapolates


def card(device_name: str) -> str | None:
    return next((c for c in C1_BOUND_MS if c in device_name), None)


def build(shape: str, dtype: torch.dtype, device: str, tiny: bool, vocab: int | None = None):
    if tiny:
        from helpers import VOCAB, tiny_model

        return tiny_model("qwen2", vocab=vocab or VOCAB).to(dtype).to(device)
    return random_model(shape, dtype, device)


def graph_path():
    """The CUDA-graph runner of this tree, or None where it has none."""
    try:
        from oospec.engine import cuda_graphs
    except ImportError:
        return None
    return cuda_graphs


def backend_costs(target, vocab: int, prompt_len: int, repeats: int, seed: int = 0) -> dict:
    """c(1) and c(16) of `target` (any TargetBackend) on a cached prompt, as oospec.bench.cost_curve times them
    (round-robin over k, median; verify ends with the choices on the host, so each timing includes the sync)."""
    import statistics

    from oospec.engine.tree import TokenTree

    rng = np.random.default_rng(seed)
    target.reset(prompt_len + 20)
    pending = target.prefill(rng.integers(0, vocab, prompt_len))
    trees = {k: TokenTree.chain(rng.integers(0, vocab, k - 1)) for k in KS}
    for k in trees:
        target.verify(pending, trees[k])  # warm-up (and, for graphs, the capture)
    times: dict[int, list[float]] = {k: [] for k in trees}
    for _ in range(repeats):
        for k, tree in trees.items():
            t0 = time.perf_counter()
            target.verify(pending, tree)
            times[k].append(time.perf_counter() - t0)
    return _costs({k: statistics.median(v) for k, v in times.items()}, prompt_len, repeats)


def _costs(seconds: dict[int, float], prompt_len: int, repeats: int, **extra) -> dict:
    c1 = seconds[1]
    return {**{f"c{k}_ms": round(1000 * s, 3) for k, s in seconds.items()}, "c16_over_c1": round(seconds[16] / c1, 3),
            "prompt_len": prompt_len, "repeats": repeats, **extra}


def graph_check(model, prompt_len: int, repeats: int, seed: int = 0) -> dict:
    """The graph path against the padded forward: logits of random trees bitwise, then c(1) and c(16)."""
    from oospec.engine.cuda_graphs import GraphTargetBackend
    from oospec.engine.precision import random_tree

    vocab = int(model.config.vocab_size)
    graph, eager = GraphTargetBackend(model), TargetBackend(model)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, prompt_len)
    identical = []
    for b in (graph, eager):
        b.reset(prompt_len + 80)
    pending = graph.prefill(prompt)
    eager.prefill(prompt)
    for nodes in (16, 4, 9, 63):
        tree = random_tree(rng, nodes, vocab)
        identical.append(bool(torch.equal(graph.verify_logits(pending, tree), eager.verify_logits(pending, tree))))
    result = {"uses_graphs": graph.uses_graphs, "why_not": graph.graph_reason, "bitwise_equal_trees": identical,
              "captures": graph.captures}
    result.update(backend_costs(graph, vocab, prompt_len, repeats, seed))
    return result


def forward_costs(model, prompt_len: int, repeats: int) -> dict:
    curve = measure(model, prompt_len=prompt_len, ks=KS, repeats=repeats)
    return _costs({k: curve["seconds"][str(k)] for k in KS}, prompt_len, repeats,
                  prefill_s=round(curve["prefill_s"], 4))


def ar_per_token(model, prompt_len: int, new: int, seed: int = 0, graphs: bool = False) -> dict:
    vocab = int(model.config.vocab_size)
    prompt = np.random.default_rng(seed).integers(0, vocab, prompt_len)
    if graphs:
        from oospec.engine.cuda_graphs import GraphTargetBackend

        target = GraphTargetBackend(model)
    else:
        target = TargetBackend(model)
    request = Request(prompt_ids=prompt, eos_ids=frozenset(), max_new_tokens=8)
    generate(target, Drafter(), request)  # warm-up: kernels, allocator
    out = generate(target, Drafter(), replace(request, max_new_tokens=new))
    steps = max(out.tokens.size - 1, 1)
    return {"new_tokens": int(out.tokens.size), "prefill_s": round(out.stats.prefill_s, 4),
            "decode_s": round(out.stats.decode_s, 4), "ms_per_token": round(1000 * out.stats.decode_s / steps, 3)}


def sidecar_job(model, prompt_len: int, tokenizer: str | None, repeats: int) -> dict:
    """Seconds of one cold sidecar job (the prompt encoded, names scored, slots decoded), median of `repeats`."""
    if tokenizer:
        return _predictor_job(model, prompt_len, tokenizer, repeats)
    return _row_runner_job(model, prompt_len, repeats)


def _row_runner_job(model, prompt_len: int, repeats: int, names: int = 6, slots: int = 4, value_tokens: int = 16,
                    seed: int = 0) -> dict:
    from oospec.sidecar.rowrunner import RowRunner

    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    name_rows = [rng.integers(0, vocab, 8).tolist() for _ in range(names)]
    slot_rows = [rng.integers(0, vocab, 20).tolist() for _ in range(slots)]
    times = []
    for _ in range(repeats + 1):  # the first: warm-up
        runner = RowRunner(model)  # cold: nothing of the last job's prompt kept
        _sync(model)
        t0 = time.perf_counter()
        runner.encode_prefix(prompt)
        runner.run(name_rows, keep_all_logits=True)
        runner.run(slot_rows, steps=value_tokens)
        _sync(model)
        times.append(time.perf_counter() - t0)
    return {"how": f"row runner: a {prompt_len}-token prompt, {names} name rows scored, {slots} slot rows of "
                   f"{value_tokens} tokens (no tokenizer given)", "prompt_tokens": prompt_len,
            "job_s": round(float(np.median(times[1:])), 4), "repeats": repeats}


def _predictor_job(model, prompt_len: int, tokenizer: str, repeats: int) -> dict:
    from transformers import AutoTokenizer

    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.sidecar.protocol import Job

    tok = AutoTokenizer.from_pretrained(tokenizer)
    predictor = SidecarPredictor(model, tok, max_value_tokens=24)
    tool = {"type": "function", "function": {
        "name": "ModifyRegistration", "description": "Change an appointment",
        "parameters": {"type": "object", "properties": {
            "appointment_id": {"type": "string"}, "new_date": {"type": "string"},
            "doctor": {"type": "string"}, "notes": {"type": "string"}}, "required": ["appointment_id"]}}}
    tools = [tool] + [{"type": "function", "function": {"name": f"Tool{i}", "description": "another tool",
                                                         "parameters": {"type": "object", "properties": {}}}}
                      for i in range(5)]
    words = "Please move my appointment to next week with another doctor if one is free. "
    text = words
    job = None
    while True:  # the user turn grown until the rendered prompt holds prompt_len tokens
        job = Job(request_id="gpu-check", messages=[{"role": "user", "content": text}], tools=tools,
                  chat_tools=tools, opener="<tool_call>\n")
        n = len(predictor.format.encode(predictor.format.prompt(job)))
        if n >= prompt_len:
            break
        text += words
    times = []
    for _ in range(repeats + 1):
        predictor.clear_cache()
        _sync(model)
        t0 = time.perf_counter()
        predictor.predict(job)
        _sync(model)
        times.append(time.perf_counter() - t0)
    return {"how": "SidecarPredictor.predict: 6 tools, 4 slots, values up to 24 tokens (random weights rarely "
                   "close a value: an upper bound)", "prompt_tokens": n,
            "job_s": round(float(np.median(times[1:])), 4), "repeats": repeats}


def _sync(model) -> None:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def verdicts(report: dict) -> dict:
    """Each measured figure against the issue's bound (None where the card has no bound or it was not measured)."""
    bounds = C1_BOUND_MS.get(card(report["device"]) or "", {})
    out = {}
    for shape in TARGETS:
        entry = report["shapes"].get(shape, {})
        for path in ("eager", "graph"):
            cost = entry.get(f"{path}_cost")
            if not isinstance(cost, dict) or "c1_ms" not in cost:
                continue
            bound = bounds.get(shape)
            if bound is None:
                out[f"{shape} {path} c(1): no bound for {report['device']}"] = None
            else:
                out[f"{shape} {path} c(1) <= {bound} ms"] = cost["c1_ms"] <= bound
            out[f"{shape} {path} c(16)/c(1) <= {C16_RATIO_BOUND}"] = cost["c16_over_c1"] <= C16_RATIO_BOUND
        if "probe" in entry:
            out[f"{shape} bitwise probe"] = entry["probe"]["invariant"]
        graph = entry.get("graph_cost")
        if isinstance(graph, dict) and "bitwise_equal_trees" in graph:
            out[f"{shape} graph path bitwise equal to the padded forward"] = all(graph["bitwise_equal_trees"])
    entry = report["shapes"].get(AR_SHAPE, {})
    for path, ar_key in (("eager", "ar"), ("graph", "ar_graph")):
        ar, cost = entry.get(ar_key), entry.get(f"{path}_cost")
        if isinstance(ar, dict) and "ms_per_token" in ar and isinstance(cost, dict) and "c1_ms" in cost:
            out[f"ar per token <= {AR_OVER_C1_BOUND} x c(1) ({path})"] = \
                ar["ms_per_token"] <= AR_OVER_C1_BOUND * cost["c1_ms"]
    job = report.get("sidecar")
    if isinstance(job, dict) and "job_s" in job:
        out[f"sidecar job <= {SIDECAR_JOB_BOUND_S * 1000:.0f} ms"] = job["job_s"] <= SIDECAR_JOB_BOUND_S
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder for the real sidecar predictor")
    ap.add_argument("--budget-s", type=float, default=420.0, help="steps that would start after this are skipped")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes and short prompts (implied by --device cpu)")
    args = ap.parse_args(argv)
    tiny = args.dry_run or args.device == "cpu"
    dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_graph_check.json"
    cuda = args.device.startswith("cuda")
    report = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
              "torch": torch.__version__, "dtype": args.dtype, "dry_run": tiny, "shapes": {}, "skipped": []}
    prompt_len, new, repeats = (90, 24, 3) if tiny else (650, 128, 9)
    start = time.perf_counter()
    graphs = graph_path()
    report["graph_path"] = ("present (UNTESTED on hardware before this run)" if graphs
                            else "absent: no oospec.engine.cuda_graphs in this tree")

    def save():
        report["elapsed_s"] = round(time.perf_counter() - start, 1)
        report["verdicts"] = verdicts(report)
        path.write_text(json.dumps(report, indent=1))

    def step(entry: dict, key: str, fn):
        if time.perf_counter() - start > args.budget_s:
            report["skipped"].append(key)
            return
        try:
            t0 = time.perf_counter()
            entry[key] = fn()
            entry[f"{key}_took_s"] = round(time.perf_counter() - t0, 2)
        except Exception as exc:  # keep what the other steps measure
            entry[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            print(entry[key]["traceback"], flush=True)
        save()

    for shape in TARGETS:
        entry = report["shapes"][shape] = {}
        model = build(shape, dtype, args.device, tiny)
        entry["install"] = padded.install(model, allow_cpu=not cuda)
        step(entry, "probe", lambda: _probe(model))
        step(entry, "eager_cost", lambda: forward_costs(model, prompt_len, repeats))
        if shape == AR_SHAPE:
            step(entry, "ar", lambda: ar_per_token(model, prompt_len, new))
        if graphs is not None:
            step(entry, "graph_cost", lambda: graph_check(model, prompt_len, repeats))
            if shape == AR_SHAPE:
                step(entry, "ar_graph", lambda: ar_per_token(model, prompt_len, new, graphs=True))
        print(shape, json.dumps({k: v for k, v in entry.items() if k != "install"}, default=str)[:1200], flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    vocab = None
    if tiny and args.tokenizer:  # the tiny stand-in reads every id of the tokenizer
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(args.tokenizer))
    sidecar_model = build(SIDECAR_SHAPE, dtype, args.device, tiny, vocab)
    holder: dict = {}
    step(holder, "sidecar", lambda: sidecar_job(sidecar_model, 120 if tiny else 900, args.tokenizer,
                                                 2 if tiny else 5))
    if "sidecar" in holder:
        report["sidecar"] = {**holder["sidecar"], "shape": SIDECAR_SHAPE}
    save()
    print(json.dumps(report["verdicts"], indent=1))
    print(f"wrote {path} in {report['elapsed_s']} s")
    return report


def _probe(model) -> dict:
    from dataclasses import asdict

    return asdict(probe(model, prompt_len=PADDED_PROBE_PROMPT))


if __name__ == "__main__":
    main()
