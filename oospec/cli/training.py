"""`oospec sidecar traces | split | rehash | train | tune | eval`: the sidecar's training pipeline (oospec/training)."""

from __future__ import annotations

import json
from pathlib import Path

from oospec.cli.options import (add_command, add_max_new_tokens_option, add_threads_option, default_of, positive_int,
                                set_threads)
from oospec.errors import OospecError
from oospec.models.cpu_features import DRAFTER_DTYPES
from oospec.models.registry import DEFAULT_SIDECAR, DEFAULT_TARGET
from oospec.training.config import LINEAR_MODULES, MAX_MISSED_CALLS, TrainConfig  # no torch: cheap at parse time
from oospec.training.pool import pool_sources, training_pool
from oospec.training.split import split_traces


def cmd_traces(args) -> None:
    from oospec.engine.engine import Engine
    from oospec.training.traces import record_traces

    set_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = pool_sources(args.scale)
    parts = training_pool(sources, seed=args.seed, rounds=args.rounds)
    (out / "pool.json").write_text(json.dumps(
        {"seed": args.seed, "teacher": args.teacher, "max_new_tokens": args.max_new_tokens,
         "sources": [{"source": s.label, "reserved": s.reserved, "drawn": s.drawn} for s in sources],
         "items": [s.id for part in parts for s in part]}, indent=1) + "\n")
    engine = Engine.from_pretrained(args.teacher)
    for k, part in enumerate(parts):
        traces = record_traces(engine, part, out / "traces.jsonl", max_new_tokens=args.max_new_tokens)
        print(f"part {k + 1}/{len(parts)} traced: {len(traces)} traces in {out / 'traces.jsonl'}")


def cmd_split(args) -> None:
    from collections import Counter

    from oospec.sidecar.process import resolve_adapter
    from oospec.training.content import split_content
    from oospec.training.evaluate import source_of
    from oospec.training.split import PARTS, adapter_trained_tools, benchmark_tools, write_trace_split
    from oospec.training.traces import read_traces

    traces = read_traces(args.traces)
    if not traces:
        raise OospecError(f"no traces in {args.traces}: run `oospec sidecar traces` first")
    pool_file = Path(args.traces).parent / "pool.json"
    pool = json.loads(pool_file.read_text()) if pool_file.exists() else {}
    pool.pop("items", None)
    init = resolve_adapter(DEFAULT_SIDECAR, args.init_adapter) if args.init_adapter else None
    fractions = tuple(float(x) for x in args.fractions.split(","))
    split = split_traces(traces, args.seed, fractions,
                         always_test_tools=benchmark_tools([(s.dataset, s.split, s.reserved) for s in pool_sources()]),
                         always_train_tools=adapter_trained_tools(init) if init else ())
    paths = write_trace_split(split, args.out, teacher=pool.get("teacher"), pool=pool,
                              init_adapter=Path(init).name if init else None, content=split_content(split, init))
    for part in PARTS:
        by = Counter(source_of(t) for t in split.traces[part])
        print(f"{part}: {len(split.traces[part])} traces, {len(split.tools[part])} tools  {dict(sorted(by.items()))}")
    print(f"dropped {len(split.dropped)}; files in {paths['manifest'].parent}")


def cmd_rehash(args) -> None:
    from oospec.sidecar.process import resolve_adapter
    from oospec.training.content import rehash_adapter

    folder = resolve_adapter(DEFAULT_SIDECAR, args.adapter)
    if folder is None:
        raise OospecError(f"--adapter {args.adapter}: no adapter folder")
    content = rehash_adapter(folder, args.traces)
    inherited = content["inherited"] or {}
    parent = (f", and {len(inherited['used'])} requests of adapter {inherited['adapter']} ({len(inherited['not_hashed'])} "
              "of its items not in the project's data, not hashed)") if inherited else ""
    print(f"{folder}/data_manifest.json: content hashes of {len(content['used'])} used and "
          f"{len(content['held_out'])} held-out requests{parent}")


def train_config(args) -> TrainConfig:
    """The TrainConfig the parsed `sidecar train` options ask for."""
    from oospec.sidecar.process import resolve_adapter

    return TrainConfig(base=args.base, r=args.r, alpha=args.alpha, lr=args.lr, epochs=args.epochs,
                       batch_requests=args.batch_requests, rank_weight=args.rank_weight, seed=args.seed,
                       threads=args.threads, init_adapter=resolve_adapter(args.base, args.init_adapter),
                       target_modules=args.target_modules.split(","),
                       prompt_without_adapter=args.prompt_without_adapter, dtype=args.dtype)


def cmd_train(args) -> None:
    from oospec.training.lora import train
    from oospec.training.traces import read_traces

    traces = read_traces(args.traces)
    if not traces:
        raise OospecError(f"no traces in {args.traces}: run `oospec sidecar traces` first")
    if args.datasets:
        keep = set(args.datasets.split(","))
        traces = [t for t in traces if t.get("dataset") in keep]
        if not traces:
            raise OospecError(f"no traces of datasets {sorted(keep)} in {args.traces}")
    summary = train(traces, args.out, train_config(args), max_minutes=args.max_minutes)
    # The split's manifest goes with the adapter (and each epoch's checkpoint): which items and tools it used.
    manifest = Path(args.traces).parent / "manifest.json"
    if manifest.is_file():
        for folder in [Path(args.out), *Path(args.out).glob("epoch-*")]:
            (folder / "data_manifest.json").write_text(manifest.read_text())
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


def cmd_eval(args) -> None:
    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.sidecar.process import resolve_adapter
    from oospec.training.evaluate import agreement, format_report, not_held_out
    from oospec.training.traces import read_traces

    set_threads(args.threads)
    if args.from_bench:
        from oospec.training.traces import traces_from_bench

        dataset, _, split = args.from_bench_dataset.partition(":")
        traces = traces_from_bench(args.from_bench, dataset, split or None)[: args.limit]
    else:
        traces = read_traces(args.traces)[: args.limit]
    if not traces:
        raise OospecError(f"no traces in {args.from_bench or args.traces}")
    # Overrides of how the trained adapters are queried (their sidecar.json otherwise), to compare choices.
    overrides = {k: v for k, v in (("rank_by", args.rank_by), ("prior_weight", args.prior_weight)) if v is not None}
    runs = [] if args.skip_base else [("base " + args.base, None)]
    for given in args.adapter or []:
        folder = resolve_adapter(args.base, given)
        if folder is None or not Path(folder).is_dir():
            raise OospecError(f"--adapter {given}: no such adapter folder")
        label = given if given != "auto" else f"shipped ({Path(folder).name})"
        runs.append((label + "".join(f" {k}={v}" for k, v in overrides.items()), folder))
    if not runs:
        raise OospecError("nothing to evaluate: --skip-base needs --adapter")
    results, notes = {}, []
    for name, adapter in runs:
        used = not_held_out(adapter, traces)
        if used:
            notes.append(f"{name}: {len(used)} of {len(traces)} requests are not held out from its training data "
                         f"(e.g. {used[0]}): its figures on them measure recall")
        predictor = SidecarPredictor.from_pretrained(args.base, adapter=adapter, dtype=args.dtype,
                                                     **(overrides if adapter else {}))
        results[name] = {**agreement(predictor, traces), "not_held_out": used}
    report = format_report(results) + "".join(f"\n\nNote: {n}" for n in notes)
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        Path(args.out).with_suffix(".md").write_text(report + "\n")


def cmd_tune(args) -> None:
    from oospec.sidecar.predictor import SIDECAR_SETTINGS, SidecarPredictor
    from oospec.sidecar.provenance import MANIFEST_FILES
    from oospec.training.evaluate import format_percent
    from oospec.training.traces import read_traces
    from oospec.training.tune import check_validation_traces, choose, format_grid, tune, write_tuning

    set_threads(args.threads)
    traces = read_traces(args.traces)
    if not traces:
        raise OospecError(f"no traces in {args.traces}: tune on the split's validation.jsonl")
    for folder in args.adapter:
        if not Path(folder).is_dir():
            raise OospecError(f"--adapter {folder}: no such adapter folder")
    checked = {}
    for folder in args.adapter:  # every check before any model loads
        # A checkpoint (run/epoch-N) finds the split's manifest in its run's folder.
        manifest = args.manifest or next((d / n for d in (Path(folder), Path(folder).parent) for n in MANIFEST_FILES
                                          if (d / n).is_file()), None)
        checked[folder] = check_validation_traces(manifest, traces)
        print(f"{folder}: validation traces: {checked[folder]}")
    chosen = []
    for folder in args.adapter:
        result = tune(SidecarPredictor.from_pretrained(args.base, adapter=folder, dtype="float32"), traces,
                      max_missed_calls=args.max_missed_calls)
        print(f"\n{folder}\n\n{format_grid(result)}")
        settings = write_tuning(folder, result, args.traces, checked[folder])
        met = "" if result["constraint_met"] else (
            f" (no setting answers 'no call' to at most {result['max_missed_calls']:.0%} of the teacher's calls: "
            "the fewest missed calls was chosen)")
        print(f"wrote {Path(folder) / SIDECAR_SETTINGS}: {json.dumps(settings)}{met}")
        chosen.append((folder, result["figures"]))
    if len(chosen) > 1:  # checkpoints compared at their own chosen settings, by the same rule
        best, figures, _ = choose(chosen, result["max_missed_calls"])
        print(f"\nbest on validation: {best} (full-call agreement {format_percent(figures['full_call_agreement'])}, "
              f"{figures['missed_calls']} of {figures['n']} calls answered 'no call')")


def add_sidecar_parser(sub) -> None:
    sc = sub.add_parser("sidecar", help="train and evaluate the sidecar").add_subparsers(
        dest="sidecar_cmd", required=True, metavar="SIDECAR_COMMAND")
    p = add_command(sc, "traces", "record the teacher's greedy calls on the training pool (resumable)",
                    "oospec sidecar traces --out runs/sidecar-data")
    p.add_argument("--out", default="runs/sidecar-data")
    p.add_argument("--teacher", default=DEFAULT_TARGET)
    p.add_argument("--seed", type=int, default=default_of(training_pool, "seed"))
    p.add_argument("--scale", type=float, default=default_of(pool_sources, "scale"),
                   help="times the pool's drawn items per source")
    p.add_argument("--rounds", type=positive_int, default=default_of(training_pool, "rounds"),
                   help="parts traced one after another, each with its share of every source")
    add_max_new_tokens_option(p, help="most tokens of each teacher reply")
    add_threads_option(p)
    p.set_defaults(func=cmd_traces)
    p = add_command(sc, "train", "LoRA on the sidecar's task rows",
                    "oospec sidecar train --traces runs/sidecar-data/train_traces.jsonl --out runs/sidecar-adapter")
    p.add_argument("--traces", default="runs/sidecar-data/train_traces.jsonl")
    p.add_argument("--out", default="runs/sidecar-adapter")
    # The defaults are TrainConfig's (train_config reads the options back).
    p.add_argument("--base", default=TrainConfig.base)
    p.add_argument("--r", type=int, default=TrainConfig.r, help="LoRA rank")
    p.add_argument("--alpha", type=int, default=TrainConfig.alpha, help="LoRA alpha")
    p.add_argument("--lr", type=float, default=TrainConfig.lr)
    p.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    p.add_argument("--batch-requests", type=int, default=TrainConfig.batch_requests)
    p.add_argument("--datasets", default=None, metavar="A,B",
                   help="train on the traces of these datasets only (e.g. apibank,toolalpaca: no synthetic requests)")
    p.add_argument("--rank-weight", type=float, default=TrainConfig.rank_weight,
                   help="weight of the function-ranking loss (teacher's tool above the other offered tools)")
    p.add_argument("--seed", type=int, default=TrainConfig.seed)
    p.add_argument("--init-adapter", default=TrainConfig.init_adapter, metavar="DIR",
                   help="start from this adapter's weights (split with the same --init-adapter)")
    p.add_argument("--target-modules", default=",".join(LINEAR_MODULES), metavar="A,B",
                   help="the linear layers that take a LoRA")
    p.add_argument("--prompt-without-adapter", action="store_true",
                   help="in-target slot rows: the prompt is read by the base model alone, the LoRA trains on the "
                        "rows only (with --base the target, e.g. qwen2.5-coder-1.5b)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=TrainConfig.dtype,
                   help="the base model's weights (bfloat16: the CPU's bfloat16 units; the LoRA stays float32)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop after this long, saving the state: the same command resumes")
    add_threads_option(p)
    p.set_defaults(func=cmd_train)
    p = add_command(sc, "split", "split traces by tool into train / validation / test",
                    "oospec sidecar split --traces runs/sidecar-data/traces.jsonl --out runs/sidecar-split")
    p.add_argument("--traces", default="runs/sidecar-data/traces.jsonl")
    p.add_argument("--out", default="runs/sidecar-split")
    p.add_argument("--seed", type=int, default=default_of(split_traces, "seed"))
    p.add_argument("--fractions", default=",".join(map(str, default_of(split_traces, "fractions"))),
                   help="of the called tools: train,validation,test")
    p.add_argument("--init-adapter", default=None, metavar="DIR",
                   help="an adapter training will start from: its training tools are kept in train")
    p.set_defaults(func=cmd_split)
    p = add_command(sc, "rehash", "rewrite the content hashes of an adapter's data manifest from its traces",
                    "oospec sidecar rehash --adapter oospec/sidecar/adapters/qwen2.5-coder-0.5b-toolcalls-v3")
    p.add_argument("--adapter", default="auto", help="an adapter folder, or a shipped adapter's name (default: auto)")
    p.add_argument("--traces", default=None,
                   help="the traces the adapter was split from (default: its traces.jsonl.gz)")
    p.set_defaults(func=cmd_rehash)
    p = add_command(sc, "eval", "agreement and calibration on held-out traces: base vs adapters, per source",
                    "oospec sidecar eval --traces runs/sidecar-split/test.jsonl --adapter auto "
                    "--adapter runs/sidecar-adapter --out runs/sidecar-eval/test.json")
    p.add_argument("--traces", default="runs/sidecar-split/test.jsonl")
    p.add_argument("--base", default=DEFAULT_SIDECAR)
    p.add_argument("--adapter", action="append", default=None, metavar="DIR",
                   help="an adapter folder to evaluate ('auto': the shipped one); repeat to compare several")
    p.add_argument("--from-bench", default=None, metavar="SAMPLES_JSONL",
                   help="held-out traces from a `bench run`: its ar outputs are the teacher's calls")
    p.add_argument("--from-bench-dataset", default="apibank:1", help="dataset[:split] of --from-bench")
    p.add_argument("--limit", type=positive_int, default=None, help="first N traces (default: all)")
    p.add_argument("--out", default=None, help="JSON results here (and the markdown report beside it, .md)")
    add_threads_option(p)
    p.add_argument("--skip-base", action="store_true", help="evaluate the adapters only")
    p.add_argument("--rank-by", choices=("greedy", "total"), default=None,
                   help="how the adapters' function is chosen (default: each one's sidecar.json)")
    p.add_argument("--prior-weight", type=float, default=None,
                   help="weight of the names' prior taken out of their scores (default: each one's sidecar.json)")
    p.add_argument("--dtype", choices=DRAFTER_DTYPES, default="float32",
                   help="the sidecar's precision (auto: what a running sidecar takes on this machine)")
    p.set_defaults(func=cmd_eval)
    p = add_command(sc, "tune", "choose an adapter's sidecar.json settings on the validation traces",
                    "oospec sidecar tune --traces runs/sidecar-split/validation.jsonl --adapter runs/sidecar-adapter")
    p.add_argument("--traces", default="runs/sidecar-split/validation.jsonl")
    p.add_argument("--adapter", required=True, action="append", metavar="DIR",
                   help="an adapter folder (its sidecar.json is rewritten); repeat to compare checkpoints")
    p.add_argument("--base", default=DEFAULT_SIDECAR)
    p.add_argument("--manifest", default=None, metavar="JSON",
                   help="the split's manifest, to check the traces are validation items (default: the adapter's)")
    p.add_argument("--max-missed-calls", type=float, default=MAX_MISSED_CALLS,
                   help="most of the teacher's calls a chosen setting may answer 'no call', a fraction")
    add_threads_option(p)
    p.set_defaults(func=cmd_tune)
