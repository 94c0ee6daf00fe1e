"""`oospec generate` (one reply with decoding statistics) and `oospec demo` (greedy vs oospec, side by side)."""

from __future__ import annotations

import json
import sys

from oospec.cli.options import add_runtime_options, add_sidecar_options, load_json, set_threads, sidecar_settings
from oospec.errors import OospecError


def cmd_generate(args) -> None:
    from oospec.drafters import SIDECAR_DRAFTERS, make_drafter
    from oospec.engine.engine import Engine

    check_sampling_options(args)
    set_threads(args.threads)
    messages = load_json(args.messages, "messages")
    tools = load_json(args.tools, "tools") if args.tools else None
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device, optimize=not args.no_optimize)
    options = {}
    if args.memory:
        from oospec.drafters.retrieval import CallMemory

        if args.method not in ("retrieval", "toolspec", "oospec"):
            raise OospecError("--memory needs --method retrieval, toolspec or oospec")
        options["memory"] = CallMemory(args.memory)
    sidecar = None
    if args.method in SIDECAR_DRAFTERS:
        from oospec.sidecar.process import make_sidecar

        sidecar = options["sidecar"] = make_sidecar(sidecar_settings(args))
    try:
        drafter = make_drafter(args.method, **options)
    except ValueError as exc:
        raise OospecError(str(exc)) from None
    try:
        result = engine.generate(messages, tools=tools, drafter=drafter, max_new_tokens=args.max_new_tokens,
                                 budget=args.budget, temperature=args.temperature, top_p=args.top_p,
                                 top_k=args.top_k, seed=args.seed)
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
        f"\n[{args.method}, {stats.sampling}] prompt {result.prompt_tokens} tokens | new tokens {stats.new_tokens} | "
        f"target forwards {stats.target_forwards} | tau {stats.tau:.2f} tokens/forward | "
        f"mean accepted/step {stats.mean_accepted:.2f} | prefill {stats.prefill_s:.2f} s | "
        f"decode {stats.decode_s:.2f} s ({decode_tps:.2f} tokens/s)",
        file=sys.stderr,
    )


def check_sampling_options(args) -> None:
    """Refuse bad --temperature/--top-p/--top-k before the model is loaded."""
    from oospec.engine.distribution import SamplingParams

    if args.temperature < 0:
        raise OospecError(f"--temperature must be >= 0, got {args.temperature}")
    if args.temperature > 0:
        try:
            SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
        except ValueError as exc:
            raise OospecError(str(exc)) from None


def cmd_demo(args) -> None:
    from oospec.demo import run_demo

    if not run_demo(args.model, args.method, args.sample, args.warmup, args.max_new_tokens, args.threads,
                    sidecar_settings(args), dtype=args.dtype, device=args.device, optimize=not args.no_optimize):
        raise OospecError("the speculative output differed from greedy decoding: please report this as a bug")


def add_generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate one reply and print it with decoding statistics")
    p.add_argument("--messages", required=True, help="JSON file: a list of chat messages")
    p.add_argument("--tools", help="JSON file: a list of OpenAI-style tools")
    p.add_argument("--method", default="pld", help="decoding method: ar, pld, ...")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--budget", type=int, default=None, help="most draft tokens verified per forward")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, token-identical to plain greedy; > 0: sample, the drafts verified by "
                        "speculative sampling (the distribution of plain sampling)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --temperature > 0: nucleus sampling mass")
    p.add_argument("--top-k", type=int, default=0, help="with --temperature > 0: the k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=None, help="with --temperature > 0: the same seed, the same reply")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--memory", help="JSONL store of past calls that retrieval reads and appends to, across runs")
    add_runtime_options(p)
    add_sidecar_options(p)
    p.set_defaults(func=cmd_generate)


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="one API-Bank tool call: greedy decoding vs oospec, side by side")
    p.add_argument("--method", default="oospec")
    p.add_argument("--sample", type=int, default=0, help="index of the API-Bank level-1 item")
    p.add_argument("--warmup", type=int, default=2, help="earlier calls of the session the drafter has seen")
    p.add_argument("--max-new-tokens", type=int, default=128)
    add_runtime_options(p)  # demo: --threads defaults to all cores less the sidecar's
    add_sidecar_options(p)
    p.set_defaults(func=cmd_demo)
