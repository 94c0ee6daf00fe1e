"""`oospec serve` and `oospec bench serve`: parsers and commands, wired into oospec/cli.py."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from oospec.errors import OospecError

API_KEY_ENV = "OOSPEC_API_KEY"


def add_runtime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the target (default: all cores)")
    p.add_argument("--no-optimize", action="store_true", help="keep the stock transformers kernels")


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible chat-completions server (tool calls, streaming)",
                       description="Serve one target model behind POST /v1/chat/completions, GET /v1/models and "
                                   "GET /health. Greedy requests are decoded speculatively (token-identical to "
                                   "plain greedy); temperature > 0 is ordinary sampling.")
    p.add_argument("--target", "--model", dest="target", default="qwen2.5-coder-1.5b",
                   help="known model name or local Hugging Face folder")
    p.add_argument("--method", default="toolspec", help="drafter for greedy requests: ar, pld, toolspec, oospec, ...")
    p.add_argument("--sidecar", "--sidecar-model", dest="sidecar", metavar="MODEL",
                   help="run the out-of-order sidecar with this model and give it to the drafter (method oospec)")
    p.add_argument("--sidecar-adapter", help="a LoRA adapter folder for the sidecar model")
    p.add_argument("--sidecar-threads", type=int, default=1, help="CPU threads of the sidecar's own process")
    p.add_argument("--sidecar-device", default="cpu", help="the sidecar's device: cpu, cuda:1, ...")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on every route but /health "
                                     f"(default: ${API_KEY_ENV} if set)")
    p.add_argument("--served-model-name", help="model id reported to clients (default: --target)")
    p.add_argument("--max-queue", type=int, default=8, help="requests waiting behind the running one; more get 429")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request, queueing included")
    p.add_argument("--default-max-tokens", type=int, default=1024, help="when a request sets none")
    p.add_argument("--default-temperature", type=float, default=0.0,
                   help="when a request sets none (OpenAI's default is 1; 0 is greedy, lossless and fastest)")
    p.add_argument("--prefix-cache-mb", type=float, default=512.0, help="KV memory for prefix reuse; 0 turns it off")
    p.add_argument("--budget", type=int, default=None, help="most draft tokens verified per forward")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds in-flight work may take to finish on shutdown before it is cancelled")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation before serving")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_runtime_options(p)
    p.set_defaults(func=cmd_serve)


def add_bench_serve_parser(bench_sub) -> None:
    from oospec.bench.serve import add_arguments, cmd_bench_serve

    p = bench_sub.add_parser("serve", help="replay a multi-turn API-Bank dialogue against the server: per-turn "
                                           "latency with and without prefix reuse, ar vs a fast method")
    add_arguments(p)
    p.set_defaults(func=cmd_bench_serve)


def make_server_drafter(method: str, sidecar_model: str | None, threads: int = 1, device: str = "cpu",
                        adapter: str | None = None):
    """The server's one drafter (it learns across requests), and the sidecar client it uses, if any."""
    from oospec.drafters import make_drafter

    sidecar = None
    options = {}
    if sidecar_model:
        try:
            from oospec.sidecar import SidecarClient
        except ImportError as exc:
            raise OospecError(f"--sidecar needs the oospec.sidecar package, which cannot be imported here ({exc})") \
                from None
        sidecar = SidecarClient(model=sidecar_model, threads=threads, device=device, adapter=adapter)
        options["sidecar"] = sidecar
    try:
        drafter = make_drafter(method, **options)
    except (ValueError, TypeError) as exc:
        if sidecar is not None:
            sidecar.close()
        raise OospecError(f"cannot make drafter {method!r}: {exc}") from None
    return drafter, sidecar


def build_service(args):
    from oospec.engine.engine import Engine
    from oospec.server.service import ModelService, ServerConfig

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.target, dtype=args.dtype, device=args.device, optimize=not args.no_optimize)
    if not args.no_warmup:  # first forwards initialise kernels; keep that out of the first request's latency
        engine.generate([{"role": "user", "content": "Hi"}], max_new_tokens=2)
    drafter, sidecar = make_server_drafter(args.method, args.sidecar, args.sidecar_threads, args.sidecar_device,
                                           args.sidecar_adapter)
    config = ServerConfig(
        model_name=args.served_model_name or args.target,
        method=args.method,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout,
        default_max_tokens=args.default_max_tokens,
        default_temperature=args.default_temperature,
        prefix_cache_mb=args.prefix_cache_mb,
        budget=args.budget,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        shutdown_grace_s=args.shutdown_grace,
    )
    return ModelService(engine, config, drafter, sidecar)


def cmd_serve(args) -> None:
    import uvicorn

    from oospec.server.app import GracefulServer, create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    service = build_service(args)
    app = create_app(service)
    c = service.config
    print(f"oospec serve: {c.model_name} ({c.method}) on http://{args.host}:{args.port}/v1 "
          f"(queue {c.max_queue}, prefix cache {c.prefix_cache_mb:g} MB, API key {'on' if c.api_key else 'off'})",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            # our own cancellation comes first (after the grace period): streams end cleanly
                            timeout_graceful_shutdown=int(args.shutdown_grace) + 5)
    try:
        GracefulServer(config, service).run()
    finally:
        service.close()  # already done by the app's shutdown unless uvicorn failed to start

