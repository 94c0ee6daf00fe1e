"""The options that several commands share, each defined once, with defaults from the model registry.

Runtime: the target model and how it runs (--model/--target, --dtype, --device, --threads, --no-optimize).
Items: which benchmark items `bench run`, `bench serve` and `bench vllm` run (`add_item_options`).
Decoding: --method and --budget, the same default in every command. Sidecar: the out-of-order sidecar's model,
adapter, threads and device. `sidecar_settings` turns the parsed sidecar options into `make_sidecar`'s
settings, so every command starts the same sidecar for the same flags.

An option that sets a field of a dataclass (SidecarSettings, Selection, Request, and each command's own config)
takes that field's default, never a literal of its own: tests/test_defaults_once.py checks both.
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from oospec.bench.items import Selection
from oospec.engine.drafting import Request
from oospec.errors import OospecError, did_you_mean
from oospec.models.cpu_features import DRAFTER_DTYPES
from oospec.models.loading import DTYPES
from oospec.models.registry import (DEFAULT_BUDGET, DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_METHOD,
                                     DEFAULT_TARGET, KNOWN_MODELS)
from oospec.sidecar.process import SidecarSettings


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default in --help (unless it is None or off, or the help names it already), and the
    description and examples (the epilog) printed as written."""

    def _format_action(self, action):
        if not action.help and action.option_strings and not _unset(action.default):
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action):
        help = action.help or ""
        if "%(default)" in help or "(default:" in help or _unset(action.default):
            return help
        return help + " (default: %(default)s)"


def _unset(default) -> bool:
    """A default not worth printing: none, a flag that is off, or one argparse hides."""
    return default is None or default is False or default == argparse.SUPPRESS


def add_command(sub, name: str, help: str, example: str, **options) -> argparse.ArgumentParser:
    """A subcommand whose --help shows defaults and ends with `example`; it takes -v/--verbose too, so that the
    flag works after the command name as well as before it."""
    p = sub.add_parser(name, help=help, description=options.pop("description", help), formatter_class=HelpFormatter,
                       epilog="example:\n  " + example.replace("\n", "\n  "), **options)
    add_verbose_option(p, default=argparse.SUPPRESS)  # SUPPRESS: leaves the top-level flag's value alone
    return p


def add_verbose_option(p: argparse.ArgumentParser, default=False) -> None:
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="show library warnings and weight-loading progress bars")


def default_of(function: Callable, parameter: str):
    """The default of `function`'s `parameter`: the default of an option whose value the command passes there."""
    return inspect.signature(function).parameters[parameter].default


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count of samples, tokens, threads...)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (an offset)."""
    return _int_at_least(text, 0)


def one_of(names: Iterable[str], what: str) -> Callable[[str], str]:
    """argparse type: one of `names`, or an error that suggests the closest name."""
    names = list(names)

    def check(text: str) -> str:
        if text in names:
            return text
        raise argparse.ArgumentTypeError(f"unknown {what} {text!r}{did_you_mean(text, names)}; "
                                         f"choose one of: {', '.join(names)}")

    check.__name__ = what  # argparse names the type in some messages
    return check


def method_names() -> list[str]:
    from oospec.drafters import DRAFTERS  # imports torch (through the engine): here, not when the module loads

    return list(DRAFTERS)


def add_method_option(p: argparse.ArgumentParser, default: str = DEFAULT_METHOD) -> None:
    """--method: the drafter. One default everywhere (the registry's DEFAULT_METHOD)."""
    names = method_names()
    p.add_argument("--method", default=default, type=one_of(names, "method"), metavar="METHOD",
                   help=f"decoding method, one of: {', '.join(names)} (ar: plain greedy decoding; oospec: "
                        "toolspec's drafts plus the sidecar's hints)")


def add_budget_option(p: argparse.ArgumentParser, default: int = DEFAULT_BUDGET) -> None:
    p.add_argument("--budget", type=positive_int, default=default, help="most draft tokens verified per forward")


def add_max_new_tokens_option(p: argparse.ArgumentParser, default: int = DEFAULT_MAX_NEW_TOKENS,
                              help: str = "most tokens of the reply", old_spelling: str | None = None) -> None:
    """The reply's length limit, one name in every command (args.max_new_tokens); `old_spelling`, an earlier
    name of the option, still parses but is not shown."""
    p.add_argument("--max-new-tokens", type=positive_int, default=default, help=help)
    if old_spelling:
        p.add_argument(old_spelling, dest="max_new_tokens", type=positive_int, default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)


def add_runtime_options(p: argparse.ArgumentParser, model_default: str = DEFAULT_TARGET) -> None:
    """The target model and how it runs; read back as args.model, args.dtype, args.device, args.threads and
    args.no_optimize."""
    p.add_argument("--model", "--target", dest="model", default=model_default, metavar="MODEL",
                   help=f"target model: a known name ({', '.join(KNOWN_MODELS)}) or a local Hugging Face folder")
    p.add_argument("--device", default=DEFAULT_DEVICE, help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPES, help="auto: bfloat16 on CUDA (padded row-invariant forward, probed at load); on a CPU bfloat16 where it "
                        "is native and a probe finds the forward row-invariant, else float32")
    add_threads_option(p, "--target-threads", what="the target",
                       default_text="all cores, less the sidecar's while one runs on the CPU")
    p.add_argument("--no-optimize", action="store_true",
                   help="keep the stock transformers kernels (not row-invariant: speculative output may then differ "
                        "from plain greedy output)")


def add_threads_option(p: argparse.ArgumentParser, *aliases: str, what: str = "torch",
                       default_text: str = "all cores") -> None:
    p.add_argument("--threads", *aliases, dest="threads", type=positive_int, default=None,
                   help=f"CPU threads for {what} (default: {default_text})")


def add_sidecar_options(p: argparse.ArgumentParser, device_default: str | None = SidecarSettings.device) -> None:
    """The sidecar of --method oospec/sidecar (no other method starts one), with SidecarSettings' defaults.
    device_default None: the target's --device (`bench serve`)."""
    p.add_argument("--sidecar-model", "--sidecar", dest="sidecar_model", metavar="MODEL", default=SidecarSettings.model,
                   help="the sidecar of --method oospec/sidecar: a known model name or a local Hugging Face folder")
    p.add_argument("--sidecar-adapter", default=SidecarSettings.adapter,
                   help="LoRA adapter of the sidecar: auto (the one shipped for the sidecar model, if any), none (the "
                        "base model), or an adapter folder")
    p.add_argument("--sidecar-threads", type=positive_int, default=SidecarSettings.threads,
                   help="CPU threads of the sidecar's own process")
    p.add_argument("--sidecar-device", default=device_default,
                   help="the sidecar's device: cpu, cuda:1, ... (default: " + (device_default or "--device") + ")")
    p.add_argument("--sidecar-dtype", choices=DRAFTER_DTYPES, default=SidecarSettings.dtype,
                   help="the sidecar's precision, whatever the target's (auto: bfloat16 on CUDA; on a CPU int8 where it "
                        "measures faster than the CPU's float precision)")


def sidecar_settings(args: argparse.Namespace):
    """The SidecarSettings that the parsed sidecar and runtime options ask for (see `add_sidecar_options`)."""
    return SidecarSettings(model=args.sidecar_model, adapter=args.sidecar_adapter, threads=args.sidecar_threads,
                           device=args.sidecar_device or args.device, dtype=args.sidecar_dtype)  # not --dtype


def method_sidecar(args: argparse.Namespace):
    """The SidecarSettings of the sidecar args.method runs with, or None for the methods that use none."""
    from oospec.drafters import uses_sidecar

    return sidecar_settings(args) if uses_sidecar(args.method) else None


def set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def load_json(path: str, what: str):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OospecError(f"{what} file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise OospecError(f"{what} file {path} is not valid JSON: {exc}") from None


def load_tools(path: str) -> list[dict]:
    """OpenAI-style tools from a JSON file: a list of tools, or an object {"tools": [...]} as in a request body."""
    tools = load_json(path, "tools")
    if isinstance(tools, dict) and isinstance(tools.get("tools"), list):
        tools = tools["tools"]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise OospecError(f"tools file must be a JSON list of tools (or {{\"tools\": [...]}}); {path} holds "
                          f"{type(tools).__name__ if not isinstance(tools, list) else 'a list of non-objects'}")
    return tools


DATASET_HELP = ("apibank (splits 1, 2, 3, all), bfcl (simple_python, multiple, parallel, parallel_multiple, all), "
                "toolalpaca (eval_simulated), name:split, or a file; a comma list for several (repeatable)")


def add_item_options(p: argparse.ArgumentParser) -> None:
    """The benchmark items, one definition for every bench command (read back by `item_selection`), with
    Selection's defaults; what they select: oospec.bench.items."""
    p.add_argument("--dataset", action="append", metavar="NAME[:SPLIT]", help=DATASET_HELP)
    p.add_argument("--split", help="split for datasets given without :split (apibank 1/2/3/all, bfcl simple_python...)")
    p.add_argument("--data", action="append", metavar="PATH", help="a dataset file in a supported format (repeatable)")
    p.add_argument("--items", default=None, metavar="ID,ID",
                   help="only these item ids (another run's items, in each dataset's order)")
    p.add_argument("--offset", type=non_negative_int, default=Selection.offset,
                   help="skip the first N items of each dataset (sessions, where the command runs sessions)")
    p.add_argument("--limit", type=positive_int, default=Selection.limit,
                   help="the first N items of each dataset after --offset (sessions, where the command runs "
                        "sessions) (default: all)")
    p.add_argument("--held-out-only", action="store_true",
                   help="drop the items the sidecar adapter was trained on (before --limit) instead of refusing them")
    p.add_argument("--allow-trained-items", action="store_true",
                   help="run items the sidecar adapter was trained on (its manifest holds their request, by content, "
                        "or an earlier turn of it, or their tool; refused otherwise)")


def item_selection(args: argparse.Namespace) -> dict:
    """The fields of oospec.bench.items.Selection (which BenchConfig extends) that the item options ask for."""
    return {"datasets": [d.strip() for spec in args.dataset or () for d in spec.split(",") if d.strip()],
            "split": args.split, "data": list(args.data or ()), "offset": args.offset, "limit": args.limit,
            "items": [i.strip() for i in (args.items or "").split(",") if i.strip()],
            "held_out_only": args.held_out_only, "allow_trained_items": args.allow_trained_items}


def add_sampling_options(p: argparse.ArgumentParser, temperature_help: str, seed_help: str, *,
                         seed_default: int | None = Request.seed) -> None:
    """--temperature (0: greedy), --top-p, --top-k and --seed, with a Request's defaults (a command may seed its
    runs itself); read back under the same names."""
    p.add_argument("--temperature", type=float, default=Request.temperature, help=temperature_help)
    p.add_argument("--top-p", type=float, default=Request.top_p, help="with --temperature > 0: nucleus sampling mass")
    p.add_argument("--top-k", type=int, default=Request.top_k,
                   help="with --temperature > 0: the k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=seed_default, help=f"with --temperature > 0: {seed_help}")

