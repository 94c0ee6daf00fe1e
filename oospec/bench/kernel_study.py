"""Where the time of one target forward goes on CPU, and what `optimize_for_cpu` buys.

    python -m oospec.bench.kernel_study                       # everything, random Qwen2.5-Coder-1.5B
    python -m oospec.bench.kernel_study --sections curve --model ~/.cache/oospec/models/qwen2.5-coder-1.5b

Sections (`--sections`, comma separated):
  gemm      one 1536x8960 float32 projection (the 1.5B MLP shape) per kernel and row count
  check     stock vs optimized logits on a chat prompt (random ids for a random model), greedy generations
  curve     c(k): one `TargetBackend.verify` of k tokens over a cached prompt, stock vs optimized, plus the
            numerical check (max |logit diff| and argmax agreement)
  levers    the same for each lever on its own (attention, packed linears, padding, lm_head)
  breakdown per-module time (forward hooks) for k = 1, 4, 16, stock vs optimized
  profile   torch.profiler's top operators for k = 1, 4, 16, stock vs optimized

Variants are measured interleaved in one process (one model; the stock and optimized modules are swapped in
and out), so a slow spell hits all of them. Other processes on a 2-core machine distort wall-clock numbers
badly (a 2-thread kernel waits for its preempted second thread), so each sample also records how much CPU
the rest of the machine used while it ran, and samples above `--max-other` are discarded and retaken until
`--repeats` clean ones exist or `--budget-s` is spent (then all samples are used and the cell is starred);
after a spoiled sample the script sleeps until the machine is idle again rather than compete.
`--threads 1 --clock thread` measures single-thread CPU time instead, which other processes barely affect.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict

import numpy as np
import torch
from torch import nn

from oospec.engine.cpu_kernels import PackedLinear, optimize_for_cpu
from oospec.engine.target import TargetBackend, cache_arg
from oospec.engine.tree import TokenTree
from oospec.models.random_init import random_model

_HZ = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- timing
def _machine_busy_s() -> float:
    v = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / _HZ  # all CPUs, seconds not idle nor waiting on I/O


class Timer:
    """Runs a callable once and returns (seconds, CPU share the *other* processes took meanwhile)."""

    def __init__(self, clock: str):
        self.thread = clock == "thread"

    def __call__(self, fn) -> tuple[float, float]:
        if self.thread:
            t = time.thread_time()
            fn()
            return time.thread_time() - t, 0.0
        b, p, t = _machine_busy_s(), time.process_time(), time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        other = max(0.0, (_machine_busy_s() - b) - (time.process_time() - p)) / (dt * (os.cpu_count() or 1))
        return dt, other


def _wait_quiet(max_other: float, until: float) -> None:
    """Sleep (using no CPU) until a one-second window in which the machine was idle enough, or `until`."""
    while time.time() < until:
        b, t = _machine_busy_s(), time.perf_counter()
        time.sleep(1.0)
        if (_machine_busy_s() - b) / ((time.perf_counter() - t) * (os.cpu_count() or 1)) <= max_other:
            return


def interleaved(cells: dict, setup, timer: Timer, repeats: int, max_other: float, budget_s: float) -> dict:
    """cells: key -> fn; setup(key) is called before each fn (untimed). Round-robin until each key has
    `repeats` clean samples or the budget is spent. Returns key -> (median seconds, clean?, n clean, n all)."""
    clean, every = defaultdict(list), defaultdict(list)
    end = time.time() + budget_s
    for key, fn in cells.items():  # warm-up: allocator, oneDNN kernel creation
        setup(key)
        fn()
    while True:
        for key, fn in cells.items():
            if len(clean[key]) >= repeats:
                continue
            setup(key)
            dt, other = timer(fn)
            every[key].append(dt)
            if other <= max_other:
                clean[key].append(dt)
            elif not timer.thread:  # someone else is busy: back off instead of competing with them
                _wait_quiet(max_other, end)
        if all(len(clean[k]) >= repeats for k in cells) or time.time() > end:
            break
    out = {}
    for key in cells:
        ok = len(clean[key]) >= max(1, repeats // 2 + 1)
        out[key] = (statistics.median(clean[key] if ok else every[key]), ok, len(clean[key]), len(every[key]))
    return out


def _fmt(cell, scale=1.0, digits=3) -> str:
    return f"{cell[0] * scale:.{digits}f}" + ("" if cell[1] else "*")


# ------------------------------------------------------------------------------------------------ gemm
def _openblas_threads(n: int) -> None:
    """numpy's OpenBLAS keeps its own thread pool: match torch's thread count (best effort)."""
    import ctypes
    import glob

    for path in glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*.so*")):
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name)(n)
                return


def section_gemm(args, timer) -> dict:
    _openblas_threads(torch.get_num_threads())
    k_in, n_out = 1536, 8960
    w = torch.randn(n_out, k_in) * 0.02
    wt_np = w.t().contiguous().numpy()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    lin = nn.Linear(k_in, n_out, bias=False)
    lin.weight.data = w
    padded = PackedLinear.from_linear(lin)

    def numpy_mm(x):
        out = np.empty((x.shape[0], n_out), np.float32)
        np.matmul(x.numpy(), wt_np, out=out)
        return out

    kernels = {
        "torch F.linear (MKL)": lambda x: torch.nn.functional.linear(x, w),
        "numpy matmul (OpenBLAS)": numpy_mm,
        "oneDNN, plain weight": lambda x: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
        "oneDNN, pre-packed": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "oneDNN, pre-packed, pad to 4 rows": padded,
    }
    rows = [1, 2, 4, 8, 16, 32, 64]
    xs = {m: torch.randn(m, k_in) for m in rows}
    cells = {(name, m): (lambda f=f, x=xs[m]: [f(x) for _ in range(5)]) for name, f in kernels.items() for m in rows}
    with torch.inference_mode():
        res = interleaved(cells, lambda key: None, timer, args.repeats, args.max_other, args.budget_s / 4)
    print(f"\n## One 1536x8960 float32 projection (x[rows,1536] @ W.T), ms per call, {torch.get_num_threads()} threads")
    print("| kernel | " + " | ".join(f"{m} rows" for m in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for name in kernels:
        print(f"| {name} | " + " | ".join(_fmt(res[(name, m)], 1000 / 5, 2) for m in rows) + " |")
    return {f"{name}|{m}": res[(name, m)][0] / 5 for name in kernels for m in rows}


# --------------------------------------------------------------------------------------------- model
class Variants:
    """One model whose stock and optimized modules can be swapped in and out, lever by lever."""

    def __init__(self, model):
        self.model = model
        self.points = [(owner, name) for owner in model.model.layers.modules()
                       for name, child in owner.named_children() if type(child) is nn.Linear]
        self.stock = [getattr(o, n) for o, n in self.points]
        self.stock_head, self.stock_attn = model.lm_head, model.config._attn_implementation
        self.report = optimize_for_cpu(model)
        self.fast = [getattr(o, n) for o, n in self.points]
        self.fast_head, self.fast_attn = model.lm_head, model.config._attn_implementation

    def use(self, linear=True, attention=True, lm_head=True, pad=True) -> None:
        for (owner, name), a, b in zip(self.points, self.stock, self.fast):
            setattr(owner, name, b if linear else a)
        self.model.lm_head = self.fast_head if lm_head else self.stock_head
        self.model.config._attn_implementation = self.fast_attn if attention else self.stock_attn
        PackedLinear.min_rows = 4 if pad else 1


STOCK = dict(linear=False, attention=False, lm_head=False)
OPTIMIZED = dict(linear=True, attention=True, lm_head=True)


def build(args):
    if os.path.isdir(os.path.expanduser(args.model)):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(args.model), dtype=torch.float32,
                                                     attn_implementation="sdpa")
        return model.eval().requires_grad_(False)
    return random_model(args.model, attn_implementation="sdpa")


class Bench:
    """A prompt in a slot cache and, per k, a chain of k-1 draft tokens under the pending token."""

    def __init__(self, model, prompt_len: int, ks, seed: int = 0):
        rng = np.random.default_rng(seed)
        vocab = model.config.vocab_size
        self.target = TargetBackend(model)
        self.target.reset(prompt_len + max(ks) + 2)
        self.pending = self.target.prefill(rng.integers(0, vocab, prompt_len))
        self.trees = {k: TokenTree.chain(rng.integers(0, vocab, k - 1)) for k in ks}

    def verify(self, k):
        return self.target.verify(self.pending, self.trees[k])  # never committed: the cache stays at the prompt

    @torch.inference_mode()
    def logits(self, k):
        """The logits `verify(k)` takes its argmax of (same inputs, same cache)."""
        t, tree = self.target, self.trees[k]
        start = t.length
        ids = torch.as_tensor(np.concatenate([[self.pending], tree.tokens])).view(1, -1)
        pos = torch.as_tensor(np.concatenate([[start], start + tree.depths])).view(1, -1)
        return t.model(input_ids=ids, position_ids=pos, attention_mask=t._tree_mask(tree, start), use_cache=True,
                       **cache_arg(t._cache)).logits[0]


def section_curve(args, timer, var: Variants, bench: Bench, ks) -> dict:
    names = {"stock": STOCK, "optimized": OPTIMIZED}
    cells = {(v, k): (lambda k=k: bench.verify(k)) for k in ks for v in names}
    res = interleaved(cells, lambda key: var.use(**names[key[0]]), timer, args.repeats, args.max_other,
                      args.budget_s)
    print(f"\n## c(k): one verify forward of k tokens over a {args.prompt}-token cached prompt "
          f"({torch.get_num_threads()} threads, median of {args.repeats}; * = too few clean samples)")
    print("| k | stock s | stock c(k)/c(1) | optimized s | optimized c(k)/c(1) | speed-up | max abs logit diff "
          "| argmax same |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = {}
    for k in ks:
        s, o = res[("stock", k)], res[("optimized", k)]
        var.use(**STOCK)
        ref = bench.logits(k)
        var.use(**OPTIMIZED)
        got = bench.logits(k)
        diff, same = (ref - got).abs().max().item(), bool(torch.equal(ref.argmax(-1), got.argmax(-1)))
        s1, o1 = res[("stock", ks[0])][0], res[("optimized", ks[0])][0]
        print(f"| {k} | {_fmt(s)} | {s[0] / s1:.2f} | {_fmt(o)} | {o[0] / o1:.2f} | {s[0] / o[0]:.2f}x "
              f"| {diff:.2e} | {same} |")
        out[k] = {"stock_s": s[0], "optimized_s": o[0], "clean": [s[2], o[2]], "max_abs_diff": diff,
                  "argmax_same": same}
    return out


def section_levers(args, timer, var: Variants, bench: Bench, ks) -> dict:
    levers = {
        "stock": STOCK,
        "attention only": dict(linear=False, attention=True, lm_head=False),
        "packed linears, no padding": dict(linear=True, attention=False, lm_head=False, pad=False),
        "packed linears": dict(linear=True, attention=False, lm_head=False),
        "packed linears + lm_head": dict(linear=True, attention=False, lm_head=True),
        "all but padding": dict(OPTIMIZED, pad=False),
        "all (optimize_for_cpu)": OPTIMIZED,
    }
    cells = {(v, k): (lambda k=k: bench.verify(k)) for k in ks for v in levers}
    res = interleaved(cells, lambda key: var.use(**levers[key[0]]), timer, args.repeats, args.max_other,
                      args.budget_s)
    print("\n## Levers one by one: seconds per verify forward")
    print("| variant | " + " | ".join(f"k={k}" for k in ks) + " |")
    print("|---|" + "---:|" * len(ks))
    for v in levers:
        print(f"| {v} | " + " | ".join(_fmt(res[(v, k)]) for k in ks) + " |")
    var.use(**OPTIMIZED)
    return {f"{v}|{k}": res[(v, k)][0] for v in levers for k in ks}


PROMPT = ("You can call these functions: get_weather(city: str, unit: 'C'|'F'), book_table(restaurant: str, "
          "time: str, people: int). Answer with one JSON function call and nothing else.\n"
          "User: Book a table for four at Luigi's tomorrow at 7pm, and tell me if it will rain in Turin.")


@torch.inference_mode()
def section_check(args, var: Variants, new_tokens: int = 48) -> dict:
    """Realistic input: stock vs optimized logits over a chat prompt, and greedy generations."""
    model = var.model
    folder = os.path.expanduser(args.model)
    if os.path.isfile(os.path.join(folder, "tokenizer.json")):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                       add_generation_prompt=True)
        ids = torch.as_tensor([tok(text)["input_ids"]])
    else:
        tok, ids = None, torch.randint(0, model.config.vocab_size, (1, 120), generator=torch.Generator().manual_seed(1))
    logits, outs = {}, {}
    for name, v in (("stock", STOCK), ("optimized", OPTIMIZED)):
        var.use(**v)
        logits[name] = model(ids).logits[0]
        outs[name] = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=new_tokens, pad_token_id=0)[0, ids.shape[1]:]
    a, b = logits["stock"], logits["optimized"]
    top2 = a.topk(2, -1).values
    res = {"prompt_tokens": ids.shape[1], "max_abs_logit": a.abs().max().item(),
           "max_abs_diff": (a - b).abs().max().item(),
           "argmax_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
           "min_top2_margin": (top2[:, 0] - top2[:, 1]).min().item(),
           "generate_identical": bool(torch.equal(outs["stock"], outs["optimized"]))}
    print(f"\n## Numerical check on a {res['prompt_tokens']}-token prompt ({'chat template' if tok else 'random ids'})")
    print(f"max |logit| {res['max_abs_logit']:.2f}, max |stock - optimized| {res['max_abs_diff']:.2e}, argmax agree "
          f"at {res['argmax_agree'] * 100:.1f}% of positions (smallest top-2 margin {res['min_top2_margin']:.2e}), "
          f"greedy {new_tokens} tokens identical: {res['generate_identical']}")
    if tok:
        print("stock:    ", repr(tok.decode(outs["stock"])))
        print("optimized:", repr(tok.decode(outs["optimized"])))
    var.use(**OPTIMIZED)
    return res


_CATEGORIES = ("embed", "norms", "q/k/v proj", "attention core", "o_proj", "mlp", "lm_head", "other")


def _hook_categories(model):
    """(module, category) pairs whose forward time is summed; attention core = self_attn minus its projections."""
    pairs = [(model.model.embed_tokens, "embed"), (model.lm_head, "lm_head"), (model.model.norm, "norms")]
    for layer in model.model.layers:
        a = layer.self_attn
        pairs += [(a, "self_attn"), (a.q_proj, "q/k/v proj"), (a.k_proj, "q/k/v proj"), (a.v_proj, "q/k/v proj"),
                  (a.o_proj, "o_proj"), (layer.mlp, "mlp"), (layer.input_layernorm, "norms"),
                  (layer.post_attention_layernorm, "norms")]
    return pairs


def section_breakdown(args, timer, var: Variants, bench: Bench, ks=(1, 4, 16)) -> dict:
    clock = time.thread_time if timer.thread else time.perf_counter
    out = {}
    print("\n## Where the time goes: ms per verify forward, by module (forward hooks; median of repeats)")
    print("| variant | k | total | " + " | ".join(_CATEGORIES) + " |")
    print("|---|---:|---:|" + "---:|" * len(_CATEGORIES))
    for vname, v in (("stock", STOCK), ("optimized", OPTIMIZED)):
        var.use(**v)
        acc, handles = defaultdict(float), []
        for module, cat in _hook_categories(var.model):
            handles.append(module.register_forward_pre_hook(lambda m, a: setattr(m, "_t0", clock())))
            handles.append(module.register_forward_hook(
                lambda m, a, o, cat=cat: acc.__setitem__(cat, acc[cat] + clock() - m._t0)))
        try:
            for k in ks:
                bench.verify(k)
                rows = []
                for _ in range(args.repeats):
                    acc.clear()
                    dt, _ = timer(lambda: bench.verify(k))
                    row = dict(acc)
                    row["attention core"] = row.pop("self_attn") - row["q/k/v proj"] - row["o_proj"]
                    row["other"] = dt - sum(row.values())
                    row["total"] = dt
                    rows.append(row)
                med = {c: statistics.median(r[c] for r in rows) for c in ("total",) + _CATEGORIES}
                print(f"| {vname} | {k} | {med['total'] * 1e3:.0f} | "
                      + " | ".join(f"{med[c] * 1e3:.1f}" for c in _CATEGORIES) + " |")
                out[f"{vname}|{k}"] = med
        finally:
            for h in handles:
                h.remove()
    var.use(**OPTIMIZED)
    return out


def section_profile(args, var: Variants, bench: Bench, ks=(1, 4, 16)) -> None:
    from torch.profiler import ProfilerActivity, profile

    for vname, v in (("stock", STOCK), ("optimized", OPTIMIZED)):
        var.use(**v)
        for k in ks:
            bench.verify(k)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    bench.verify(k)
            print(f"\n### torch.profiler, {vname}, k={k} (3 forwards)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))
    var.use(**OPTIMIZED)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", help="preset of oospec.bench.cost_curve or a model folder")
    ap.add_argument("--sections", default="gemm,check,curve,levers,breakdown,profile")
    ap.add_argument("--ks", default="1,2,4,8,16,32,64")
    ap.add_argument("--lever-ks", default="1,4,16,64")
    ap.add_argument("--prompt", type=int, default=580)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall")
    ap.add_argument("--max-other", type=float, default=0.05, help="discard samples where other processes "
                    "used more than this share of the machine")
    ap.add_argument("--budget-s", type=float, default=1200, help="per section, to collect clean samples")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and torch.get_num_threads() != 1:
        ap.error("--clock thread measures one thread's CPU time: use it with --threads 1")
    sections = set(args.sections.split(","))
    timer = Timer(args.clock)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, clock={args.clock}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    results: dict = {"args": vars(args)}
    if "gemm" in sections:
        results["gemm"] = section_gemm(args, timer)
    if sections & {"check", "curve", "levers", "breakdown", "profile"}:
        ks = [int(k) for k in args.ks.split(",")]
        lever_ks = [int(k) for k in args.lever_ks.split(",")]
        t = time.time()
        model = build(args)
        var = Variants(model)
        print(f"\nmodel {args.model} built in {time.time() - t:.0f} s; optimize_for_cpu: {var.report}")
        with torch.inference_mode():
            var.use(**STOCK)
            bench = Bench(model, args.prompt, sorted(set(ks) | set(lever_ks) | {1, 4, 16}))
        if "check" in sections:
            results["check"] = section_check(args, var)
        if "curve" in sections:
            results["curve"] = section_curve(args, timer, var, bench, ks)
        if "levers" in sections:
            results["levers"] = section_levers(args, timer, var, bench, lever_ks)
        if "breakdown" in sections:
            results["breakdown"] = section_breakdown(args, timer, var, bench)
        if "profile" in sections:
            section_profile(args, var, bench)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
