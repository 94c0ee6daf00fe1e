"""`oospec sidecar traces | train | eval`: the sidecar's training pipeline (oospec/training)."""

from __future__ import annotations

import json
from pathlib import Path

from oospec.cli.options import add_command, add_threads_option, positive_int, set_threads
from oospec.errors import OospecError
from oospec.models.registry import DEFAULT_SIDECAR, DEFAULT_TARGET


def cmd_traces(args) -> None:
    import random

    from oospec.engine.engine import Engine
    from oospec.training.split import build_split, write_manifest
    from oospec.training.traces import record_traces

    set_threads(args.threads)
    out = Path(args.out)
    split = build_split(args.seed, args.heldout_fraction, args.bench_items, args.synthetic_per_tool)
    rng = random.Random(args.seed)
    train = list(split.train)
    rng.shuffle(train)
    train = train[: args.train_items] + split.synthetic[: args.synthetic_items]
    heldout = [s for s in split.heldout if s.dataset == "apibank"][: args.heldout_items]
    write_manifest(split, out / "manifest.json", args.seed,
                   {"apibank": "levels 1-3", "toolalpaca": "eval_simulated", "teacher": args.teacher,
                    "used_train_items": [s.id for s in train], "used_heldout_items": [s.id for s in heldout]})
    engine = Engine.from_pretrained(args.teacher)
    record_traces(engine, train, out / "train_traces.jsonl", max_new_tokens=args.max_new_tokens)
    record_traces(engine, heldout, out / "heldout_traces.jsonl", max_new_tokens=args.max_new_tokens)
    print(f"traces in {out}: {len(train)} training requests, {len(heldout)} held-out")


def cmd_train(args) -> None:
    from oospec.training.lora import TrainConfig, train
    from oospec.training.traces import read_traces

    traces = read_traces(args.traces)
    if not traces:
        raise OospecError(f"no traces in {args.traces}: run `oospec sidecar traces` first")
    if args.datasets:
        keep = set(args.datasets.split(","))
        traces = [t for t in traces if t.get("dataset") in keep]
        if not traces:
            raise OospecError(f"no traces of datasets {sorted(keep)} in {args.traces}")
    cfg = TrainConfig(base=args.base, r=args.r, alpha=args.alpha, lr=args.lr, epochs=args.epochs,
                      batch_requests=args.batch_requests, rank_weight=args.rank_weight, seed=args.seed,
                      threads=args.threads)
    summary = train(traces, args.out, cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


def cmd_eval(args) -> None:
    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.training.evaluate import agreement, format_table
    from oospec.training.traces import read_traces

    set_threads(args.threads)
    if args.from_bench:
        from oospec.training.traces import traces_from_bench

        dataset, _, split = args.from_bench_dataset.partition(":")
        traces = traces_from_bench(args.from_bench, dataset, split or None)[: args.limit]
    else:
        traces = read_traces(args.traces)[: args.limit]
    # Overrides of how the trained adapter is queried (its sidecar.json otherwise), to compare choices.
    overrides = {k: v for k, v in (("rank_by", args.rank_by), ("prior_weight", args.prior_weight)) if v is not None}
    runs = [] if args.skip_base else [("base " + args.base, None)]
    if args.adapter:
        runs.append(("trained " + args.adapter + "".join(f" {k}={v}" for k, v in overrides.items()), args.adapter))
    if not runs:
        raise OospecError("nothing to evaluate: --skip-base needs --adapter")
    results = {}
    for name, adapter in runs:
        predictor = SidecarPredictor.from_pretrained(args.base, adapter=adapter, **(overrides if adapter else {}))
        results[name] = agreement(predictor, traces)
    table = format_table(results)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        Path(args.out).with_suffix(".md").write_text(table + "\n")


def add_sidecar_parser(sub) -> None:
    sc = sub.add_parser("sidecar", help="train and evaluate the sidecar").add_subparsers(
        dest="sidecar_cmd", required=True, metavar="SIDECAR_COMMAND")
    p = add_command(sc, "traces", "split by tool, then record the teacher's calls (resumable)",
                    "oospec sidecar traces --out runs/sidecar-data --train-items 60")
    p.add_argument("--out", default="runs/sidecar-data")
    p.add_argument("--teacher", default=DEFAULT_TARGET)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-fraction", type=float, default=0.3)
    p.add_argument("--bench-items", type=int, default=8, help="API-Bank level-1 benchmark items whose tools are held out")
    p.add_argument("--train-items", type=int, default=60, help="real training requests traced (shuffled)")
    p.add_argument("--synthetic-per-tool", type=int, default=2)
    p.add_argument("--synthetic-items", type=int, default=120)
    p.add_argument("--heldout-items", type=int, default=30)
    p.add_argument("--max-new-tokens", type=int, default=128)
    add_threads_option(p)
    p.set_defaults(func=cmd_traces)
    p = add_command(sc, "train", "LoRA on the sidecar's task rows",
                    "oospec sidecar train --traces runs/sidecar-data/train_traces.jsonl --out runs/sidecar-adapter")
    p.add_argument("--traces", default="runs/sidecar-data/train_traces.jsonl")
    p.add_argument("--out", default="runs/sidecar-adapter")
    p.add_argument("--base", default=DEFAULT_SIDECAR)
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-requests", type=int, default=4)
    p.add_argument("--datasets", default=None, metavar="A,B",
                   help="train on the traces of these datasets only (e.g. apibank,toolalpaca: no synthetic requests)")
    p.add_argument("--rank-weight", type=float, default=1.0,
                   help="weight of the function-ranking loss (teacher's tool above the other offered tools)")
    p.add_argument("--seed", type=int, default=0)
    add_threads_option(p)
    p.set_defaults(func=cmd_train)
    p = add_command(sc, "eval", "agreement with the teacher on held-out tools, base vs trained",
                    "oospec sidecar eval --adapter runs/sidecar-adapter")
    p.add_argument("--traces", default="runs/sidecar-data/heldout_traces.jsonl")
    p.add_argument("--base", default=DEFAULT_SIDECAR)
    p.add_argument("--adapter", default=None)
    p.add_argument("--from-bench", default=None, metavar="SAMPLES_JSONL",
                   help="held-out traces from a `bench run`: its ar outputs are the teacher's calls")
    p.add_argument("--from-bench-dataset", default="apibank:1", help="dataset[:split] of --from-bench")
    p.add_argument("--limit", type=positive_int, default=None, help="first N traces (default: all)")
    p.add_argument("--out", default=None, help="JSON results here (and a .md table beside it)")
    add_threads_option(p)
    p.add_argument("--skip-base", action="store_true", help="evaluate the adapter only")
    p.add_argument("--rank-by", choices=("greedy", "total"), default=None,
                   help="how the adapter's function is chosen (default: its sidecar.json)")
    p.add_argument("--prior-weight", type=float, default=None,
                   help="weight of the names' prior taken out of their scores (default: the adapter's sidecar.json)")
    p.set_defaults(func=cmd_eval)
