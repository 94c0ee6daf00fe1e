"""The `oospec` command line: one module per command group, the options they share in `options`."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from oospec import __version__
from oospec.cli.bench import add_bench_parser
from oospec.cli.generate import add_demo_parser, add_generate_parser
from oospec.cli.models import add_models_parser
from oospec.cli.options import HelpFormatter, add_verbose_option
from oospec.cli.serve import add_serve_parser
from oospec.cli.training import add_sidecar_parser
from oospec.errors import OospecError

FIRST_STEPS = """first steps:
  oospec demo                                     greedy vs oospec on one API-Bank call, side by side
  oospec generate --messages m.json --tools t.json
  oospec serve                                    OpenAI-compatible server on http://127.0.0.1:8000/v1
  oospec <command> --help                         options, defaults and an example"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oospec", description="Lossless speculative decoding for tool calls.",
                                     formatter_class=HelpFormatter, epilog=FIRST_STEPS)
    parser.add_argument("--version", action="version", version=f"oospec {__version__}")
    add_verbose_option(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_models_parser(sub)
    add_generate_parser(sub)
    add_demo_parser(sub)
    add_serve_parser(sub)
    add_sidecar_parser(sub)
    add_bench_parser(sub)
    return parser


def quiet_libraries() -> None:
    """No library warnings and no weight-loading progress bars (what -v shows). Set in the environment before
    transformers is imported, so that the sidecar's own process, which inherits it, is quiet too."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="transformers|torch|peft")
    if "transformers" in sys.modules:  # already imported (e.g. by a test): its switches, not the environment
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.verbose:
        quiet_libraries()
    try:
        args.func(args)
    except OospecError as exc:
        print(f"oospec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


__all__ = ["build_parser", "main"]
