"""`oospec serve`: the OpenAI-compatible server, one target model behind it."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from oospec.cli.options import (add_budget_option, add_command, add_max_new_tokens_option, add_method_option,
                                add_runtime_options, add_sidecar_options, method_sidecar)
from oospec.server.config import ServerConfig  # no engine import: cheap at parse time

API_KEY_ENV = "OOSPEC_API_KEY"


SERVE_EXAMPLE = """oospec serve --port 8000
oospec serve qwen2.5-coder-1.5b                      # the model as vLLM takes it, or --model
oospec serve --model smollm2-135m --method toolspec  # no sidecar
curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
  -d '{"messages": [{"role": "user", "content": "Hi"}]}'"""


def add_serve_parser(sub) -> None:
    p = add_command(sub, "serve", "an OpenAI-compatible chat-completions server (tool calls, streaming)", SERVE_EXAMPLE,
                    description="Serve one target model behind POST /v1/chat/completions, GET /v1/models and\n"
                                "GET /health. Greedy requests are decoded speculatively (token-identical to plain\n"
                                "greedy); temperature > 0 is sampled speculatively (plain sampling's distribution).\n"
                                "One log line per request: prompt and new tokens, tau, the path it ran.")
    # `oospec serve MODEL`, as vLLM takes it: the same args.model as --model (SUPPRESS: absent, --model's stands)
    p.add_argument("model", nargs="?", default=argparse.SUPPRESS, metavar="MODEL",
                   help="the target model (the same as --model)")
    add_method_option(p, default=ServerConfig.method)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on every route but /health "
                                     f"(default: ${API_KEY_ENV} if set)")
    p.add_argument("--served-model-name", help="model id reported to clients (default: --model)")
    # The defaults of the options that ServerConfig holds are its own (server_config reads them back).
    p.add_argument("--max-queue", type=int, default=ServerConfig.max_queue,
                   help="requests waiting behind the running one; more get 429")
    p.add_argument("--request-timeout", type=float, default=ServerConfig.request_timeout_s,
                   help="seconds per request, queueing included")
    # A server has its own default: a client that sets no max_tokens expects the whole reply, not a tool call.
    add_max_new_tokens_option(p, default=ServerConfig.default_max_tokens, old_spelling="--default-max-tokens",
                              help="most tokens of a reply whose request sets no max_tokens (capped by the context)")
    p.add_argument("--default-temperature", type=float, default=ServerConfig.default_temperature,
                   help="when a request sets none (OpenAI's default is 1; 0 is greedy, lossless and fastest)")
    p.add_argument("--prefix-cache-mb", type=float, default=ServerConfig.prefix_cache_mb,
                   help="KV memory for prefix reuse; 0 turns it off")
    add_budget_option(p, default=ServerConfig.budget)
    p.add_argument("--shutdown-grace", type=float, default=ServerConfig.shutdown_grace_s,
                   help="seconds in-flight work may take to finish on shutdown before it is cancelled")
    p.add_argument("--accept-any-model", action="store_true",
                   help="serve requests whatever `model` they name (else 404 unless it is the served name)")
    p.add_argument("--max-body-mb", type=float, default=ServerConfig.max_body_mb,
                   help="largest request body; larger ones get 413")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection may take to send a request's headers before it is closed")
    p.add_argument("--body-timeout", type=float, default=ServerConfig.body_timeout_s,
                   help="seconds a request's body may take to arrive whole before the server answers 408 and closes")
    # "always": every request with tools sends the sidecar its job (what a memory or load test needs to measure);
    # "cost": only where the cost model expects it to pay (oospec.drafters.sidecar_schedule), the default.
    p.add_argument("--sidecar-schedule", choices=["cost", "always"], default="cost",
                   help="which requests send the sidecar a job (method oospec/sidecar): where the cost model expects "
                        "it to pay, or always")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation before serving")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_runtime_options(p)
    add_sidecar_options(p)
    p.set_defaults(func=cmd_serve)


def make_server_drafter(args):
    """The server's one drafter (it learns across requests), and the sidecar client it uses, if any: a sidecar
    starts for --method oospec/sidecar only, with the same settings (adapter auto) as every other command."""
    from oospec.pipeline import start_drafter

    sidecar = method_sidecar(args)
    return start_drafter(args.method, sidecar, **({"schedule": args.sidecar_schedule} if sidecar is not None else {}))


def server_config(args) -> ServerConfig:
    """The ServerConfig the parsed `serve` options ask for."""
    return ServerConfig(
        model_name=args.served_model_name or args.model,
        method=args.method,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout,
        default_max_tokens=args.max_new_tokens,
        default_temperature=args.default_temperature,
        prefix_cache_mb=args.prefix_cache_mb,
        budget=args.budget,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        shutdown_grace_s=args.shutdown_grace,
        accept_any_model=args.accept_any_model,
        max_body_mb=args.max_body_mb,
        body_timeout_s=args.body_timeout,
    )


def build_service(args):
    from oospec.engine.engine import Engine
    from oospec.pipeline import target_threads, use_threads
    from oospec.server.service import ModelService

    use_threads(target_threads(args.threads, method_sidecar(args)))
    # The target first: a bad model fails before the sidecar's process is started (it takes seconds to load).
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device, optimize=not args.no_optimize)
    if not args.no_warmup:  # first forwards initialise kernels; keep that out of the first request's latency
        engine.generate([{"role": "user", "content": "Hi"}], max_new_tokens=2)
        engine.grammar_vocabulary()  # what tool_choice's grammars are built on (a second or so, once)
    drafter, sidecar = make_server_drafter(args)
    return ModelService(engine, server_config(args), drafter, sidecar)


def cmd_serve(args) -> None:
    import torch
    import uvicorn

    from oospec.server.app import GracefulServer, create_app
    from oospec.server.guard import header_timeout_protocol

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    service = build_service(args)
    app = create_app(service)
    c = service.config
    sidecar = f", sidecar {service.sidecar.model}" if service.sidecar is not None else ""
    print(f"oospec serve: {c.model_name} ({c.method}{sidecar}, {torch.get_num_threads()} target threads) on "
          f"http://{args.host}:{args.port}/v1 (queue {c.max_queue}, prefix cache {c.prefix_cache_mb:g} MB, "
          f"API key {'on' if c.api_key else 'off'})",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            http=header_timeout_protocol(args.header_timeout),
                            # our own cancellation comes first (after the grace period): streams end cleanly
                            timeout_graceful_shutdown=int(args.shutdown_grace) + 5)
    try:
        GracefulServer(config, service).run()
    finally:
        service.close()  # already done by the app's shutdown unless uvicorn failed to start
