"""`oospec bench cost-curve | run | serve | vllm`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from oospec.cli.options import (add_budget_option, add_command, add_max_new_tokens_option, add_runtime_options,
                                add_sampling_options, add_sidecar_options, positive_int, set_threads, sidecar_settings)
from oospec.integrations.vllm.bench import add_vllm_bench_parser
from oospec.models.registry import DEFAULT_PREFIX_CACHE_MB, DEFAULT_SIDECAR, TINY_TARGET

COST_CURVE_EXAMPLE = "oospec bench cost-curve --model smollm2-135m --ks 1,4,16 --out curve.json"
RUN_EXAMPLE = """oospec bench run --dataset apibank:1 --limit 8 --methods ar,toolspec,oospec
oospec bench run --model smollm2-135m --dataset bfcl:simple_python --limit 5 --methods ar,pld"""
SERVE_EXAMPLE = "oospec bench serve --model smollm2-135m --turns 4 --methods ar,toolspec"
DATASET_HELP = ("apibank (splits 1, 2, 3, all), bfcl (simple_python, multiple, parallel, parallel_multiple, all), "
                "toolalpaca (eval_simulated), name:split, or a file; a comma list for several")


def cmd_bench_cost_curve(args) -> None:
    import torch

    from oospec.bench import cost_curve

    set_threads(args.threads)
    ks = tuple(int(k) for k in args.ks.split(","))
    if args.random_init:
        from oospec.models.cpu_features import auto_dtype

        name = auto_dtype(args.device) if args.dtype == "auto" else args.dtype
        dtype = getattr(torch, name)
        from oospec.models.random_init import random_model

        model = random_model(args.random_init, dtype, args.device)
        model.config._name_or_path = f"random:{args.random_init}"
    else:
        from oospec.models.loading import load_model

        model, _ = load_model(args.model, dtype=args.dtype, device=args.device)
        model.config._name_or_path = args.model
    from oospec.engine.precision import prepare

    prepare(model, not args.no_optimize)  # the target's kernels (the invariant forward), as Engine uses them
    result = cost_curve.measure(model, prompt_len=args.prompt_len, ks=ks, repeats=args.repeats)
    result["optimized"] = not args.no_optimize
    print(cost_curve.format_table(result))
    if args.out:
        cost_curve.write(result, args.out)
        print(f"written to {args.out}")


def cmd_bench_run(args) -> None:
    from oospec.bench.config import BenchConfig
    from oospec.bench.run import invoked_command, run_benchmark

    run_benchmark(BenchConfig(
        datasets=[d for d in (args.dataset or "").split(",") if d.strip()],
        methods=args.methods, target=args.model, split=args.split, data=args.data or [], limit=args.limit,
        offset=args.offset, held_out_only=args.held_out_only, sessions=args.sessions, tool_choice=args.tool_choice,
        items=[i.strip() for i in (args.items or "").split(",") if i.strip()],
        secondary_baseline=not args.no_secondary_baseline,
        max_new_tokens=args.max_new_tokens, budget=args.budget, threads=args.threads, out=args.out,
        assistant=args.assistant, dtype=args.dtype, device=args.device, optimize=not args.no_optimize,
        warmup=not args.no_warmup, progress=not args.no_progress, command=invoked_command(),
        sidecar_model=args.sidecar_model, sidecar_threads=args.sidecar_threads, sidecar_device=args.sidecar_device,
        sidecar_adapter=args.sidecar_adapter, allow_trained_items=args.allow_trained_items,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
    ))


def cmd_bench_serve(args) -> None:
    from oospec.server import replay

    report = replay.run(args.model, [m.strip() for m in args.methods.split(",") if m.strip()], sidecar_settings(args),
                        dialogue=args.dialogue, turns=args.turns, max_tokens=args.max_new_tokens,
                        prefix_cache_mb=args.prefix_cache_mb, threads=args.threads, dtype=args.dtype,
                        device=args.device, optimize=not args.no_optimize)
    out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-serve")
    out.mkdir(parents=True, exist_ok=True)
    table = replay.markdown(report)
    (out / "serve.json").write_text(json.dumps(report, indent=1))
    (out / "serve.md").write_text(table)
    print(table)
    print(f"written to {out}/serve.md and serve.json", file=sys.stderr)


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_cmd", required=True,
                                                                      metavar="BENCH_COMMAND")
    p = add_command(bench, "cost-curve", "time one target forward verifying k tokens on a cached prompt",
                    COST_CURVE_EXAMPLE)
    p.add_argument("--random-init", metavar="ARCH",
                   help="random weights of a preset architecture (qwen2.5-7b, qwen2.5-1.5b, qwen2.5-0.5b) or a "
                        "config folder, instead of --model")
    p.add_argument("--prompt-len", type=positive_int, default=580)
    p.add_argument("--ks", default="1,2,4,8,16,32,64", help="comma list of draft sizes k")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--out", help="write the curve as JSON here")
    add_runtime_options(p)
    p.set_defaults(func=cmd_bench_cost_curve)

    p = add_command(bench, "run", "speed, identical-output rate and accuracy of decoding methods on benchmarks",
                    RUN_EXAMPLE)
    p.add_argument("--dataset", help=DATASET_HELP)
    p.add_argument("--split", help="split for datasets given without :split (apibank 1/2/3/all, bfcl simple_python...)")
    p.add_argument("--data", action="append", metavar="PATH", help="a dataset file in a supported format (repeatable)")
    p.add_argument("--methods", default="ar,pld,toolspec,hf-pld,oracle",
                   help="comma list: ar, pld, toolspec, oospec, ... (any drafter), oracle, ar-all-cores, hf-pld, "
                        "hf-assisted; ar always runs")
    p.add_argument("--assistant", default=DEFAULT_SIDECAR, help="assistant model for hf-assisted")
    p.add_argument("--limit", type=positive_int, default=None, help="first N samples of each dataset (default: all)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N samples of each dataset")
    p.add_argument("--held-out-only", action="store_true",
                   help="drop the items the sidecar adapter was trained on (before --limit) instead of refusing them")
    p.add_argument("--items", default=None, metavar="ID,ID",
                   help="only these item ids (another run's items, in each dataset's order)")
    p.add_argument("--sessions", action="store_true",
                   help="agent sessions: each dialogue replayed turn by turn, every method reusing its own prefix "
                        "cache (target and sidecar) across a session's turns; --limit/--offset count sessions "
                        "(API-Bank level 1)")
    p.add_argument("--tool-choice", default="auto", choices=("auto", "required"),
                   help="required: every reply must call one of the item's tools, decoded under the call grammar "
                        "(llguidance), ar and every method alike")
    p.add_argument("--no-secondary-baseline", action="store_true",
                   help="skip ar at the target's share of the cores beside sidecar methods (the secondary column)")
    add_max_new_tokens_option(p)
    add_budget_option(p)
    add_sampling_options(p, "0: greedy; > 0: every method samples, `ar` plainly, the others speculatively, with "
                            "the same seed per item", 0, "the run's seed (items get their own from it)")
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-<datasets>)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--allow-trained-items", action="store_true",
                   help="run items the sidecar adapter was trained on (its manifest holds their request, by content, "
                        "or an earlier turn of it, or their tool; refused otherwise)")
    add_runtime_options(p)
    add_sidecar_options(p)
    p.set_defaults(func=cmd_bench_run)

    p = add_command(bench, "serve", "replay a multi-turn API-Bank dialogue against the server: per-turn latency with "
                                    "and without prefix reuse, ar vs a fast method", SERVE_EXAMPLE)
    p.add_argument("--methods", default="ar,toolspec,oospec",
                   help="comma list of drafters; each runs with prefix reuse off and on")
    p.add_argument("--dialogue", help="API-Bank dialogue file name (default: the longest level-1 dialogue)")
    p.add_argument("--turns", type=positive_int, default=None, help="replay only the first N turns (default: all)")
    add_max_new_tokens_option(p, old_spelling="--max-tokens")
    p.add_argument("--prefix-cache-mb", type=float, default=DEFAULT_PREFIX_CACHE_MB)
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-serve)")
    add_runtime_options(p, model_default=TINY_TARGET)
    add_sidecar_options(p, device_default=None)  # the sidecar shares the target's --device unless told
    p.set_defaults(func=cmd_bench_serve)

    p = add_vllm_bench_parser(bench)  # oospec's proposer inside vLLM: oospec/integrations/vllm/bench.py
    add_max_new_tokens_option(p, old_spelling="--max-tokens")
