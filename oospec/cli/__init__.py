"""The `oospec` command line: one module per command group, the options they share in `options`."""

from __future__ import annotations

import argparse
import sys

from oospec.cli.bench import add_bench_parser
from oospec.cli.generate import add_demo_parser, add_generate_parser
from oospec.cli.models import add_models_parser
from oospec.cli.serve import add_serve_parser
from oospec.cli.training import add_sidecar_parser
from oospec.errors import OospecError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oospec", description="Lossless speculative decoding for tool calls.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_models_parser(sub)
    add_generate_parser(sub)
    add_demo_parser(sub)
    add_serve_parser(sub)
    add_sidecar_parser(sub)
    add_bench_parser(sub)
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


__all__ = ["build_parser", "main"]
