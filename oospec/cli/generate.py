"""`oospec generate` (one reply with its tool calls, the sidecar's report and decoding statistics) and
`oospec demo` (greedy vs oospec, side by side)."""

from __future__ import annotations

import json
import sys

from oospec.cli.options import (add_budget_option, add_command, add_max_new_tokens_option, add_method_option,
                                add_runtime_options, add_sampling_options, add_sidecar_options, load_json, load_tools,
                                method_sidecar)
from oospec.errors import OospecError

GENERATE_EXAMPLE = """oospec generate --messages examples/messages.json --tools examples/tools.json
oospec generate --model smollm2-135m --method pld --messages m.json --json"""
DEMO_EXAMPLE = "oospec demo --sample 3"


def generate_request(args, messages: list[dict], tools: list[dict] | None):
    """The Request the parsed `generate` options ask for."""
    from oospec.engine.drafting import Request

    return Request.chat(messages, tools, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def cmd_generate(args) -> None:
    from oospec.engine.engine import Engine
    from oospec.pipeline import attach, check_template_renders_tools, sidecar_lines, target_threads, use_threads

    check_sampling_options(args)
    messages = load_json(args.messages, "messages")
    tools = load_tools(args.tools) if args.tools else None
    request = generate_request(args, messages, tools)
    options = {}
    if args.memory:
        from oospec.drafters.retrieval import CallMemory

        if args.method not in ("retrieval", "toolspec", "oospec"):
            raise OospecError("--memory needs --method retrieval, toolspec or oospec")
        options["memory"] = CallMemory(args.memory)
    sidecar = method_sidecar(args)
    use_threads(target_threads(args.threads, sidecar))
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device, optimize=not args.no_optimize)
    if tools:  # before the sidecar's process starts: a template that drops the tools is refused at once
        check_template_renders_tools(engine, messages, tools)
    with attach(engine, args.method, sidecar, args.budget, **options) as pipe:
        result = pipe.generate(request)
        report = pipe.sidecar_report
    calls = [c.to_dict() for c in pipe.tool_calls(result)] if tools else []
    stats = result.stats
    if args.json:
        print(json.dumps({"text": result.text, "tool_calls": calls, "tokens": result.tokens.tolist(),
                          "prompt_tokens": result.prompt_tokens, "method": args.method, **stats.as_dict(),
                          "sidecar": report.as_dict() if report is not None else None}, ensure_ascii=False))
        return
    print(result.text)
    if tools:
        print("\ntool calls: " + (json.dumps(calls, ensure_ascii=False) if calls else "none"))
    decode_tps = (stats.new_tokens - 1) / stats.decode_s if stats.decode_s > 0 else float("nan")
    print(
        f"\n[{args.method}, {stats.sampling}] prompt {result.prompt_tokens} tokens | new tokens {stats.new_tokens} | "
        f"target forwards {stats.target_forwards} | tau {stats.tau:.2f} tokens/forward | "
        f"mean accepted/step {stats.mean_accepted:.2f} | prefill {stats.prefill_s:.2f} s | "
        f"decode {stats.decode_s:.2f} s ({decode_tps:.2f} tokens/s) | target threads {pipe.threads}",
        file=sys.stderr,
    )
    for line in sidecar_lines(report):
        print(line, file=sys.stderr)


def check_sampling_options(args) -> None:
    """Refuse bad --temperature/--top-p/--top-k before the model is loaded."""
    from oospec.engine.distribution import check_sampling_options as check

    check(args.temperature, args.top_p, args.top_k, args.seed)


def cmd_demo(args) -> None:
    from oospec.demo import run_demo

    if not run_demo(args.model, args.method, args.sample, args.warmup, args.max_new_tokens, args.threads,
                    method_sidecar(args), dtype=args.dtype, device=args.device, optimize=not args.no_optimize,
                    budget=args.budget):
        raise OospecError("the speculative output differed from greedy decoding: please report this as a bug")


def add_generate_parser(sub) -> None:
    p = add_command(sub, "generate", "generate one reply: its text, tool calls, the sidecar's report and decoding "
                                     "statistics", GENERATE_EXAMPLE)
    p.add_argument("--messages", required=True, help="JSON file: a list of chat messages")
    p.add_argument("--tools", help="JSON file: a list of OpenAI-style tools (or {\"tools\": [...]})")
    add_method_option(p)
    add_max_new_tokens_option(p)
    add_budget_option(p)
    add_sampling_options(p, "0: greedy, token-identical to plain greedy; > 0: sample, the drafts verified by "
                            "speculative sampling (the distribution of plain sampling)",
                         "the same seed, the same reply")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--memory", help="JSONL store of past calls that retrieval reads and appends to, across runs")
    add_runtime_options(p)
    add_sidecar_options(p)
    p.set_defaults(func=cmd_generate)


def add_demo_parser(sub) -> None:
    p = add_command(sub, "demo", "one API-Bank tool call: greedy decoding vs oospec, side by side", DEMO_EXAMPLE)
    add_method_option(p)
    p.add_argument("--sample", type=int, default=0, help="index of the API-Bank level-1 item")
    p.add_argument("--warmup", type=int, default=2, help="earlier calls of the session the drafter has seen")
    add_max_new_tokens_option(p)
    add_budget_option(p)
    add_runtime_options(p)
    add_sidecar_options(p)
    p.set_defaults(func=cmd_demo)
