"""The options that several commands share, each defined once, with defaults from the model registry.

Runtime: the target model and how it runs (--model/--target, --dtype, --device, --threads, --no-optimize).
Sidecar: the out-of-order sidecar's model, adapter, threads and device. `sidecar_settings` turns the parsed
sidecar options into `make_sidecar`'s settings, so every command starts the same sidecar for the same flags.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oospec.errors import OospecError
from oospec.models.registry import DEFAULT_SIDECAR, DEFAULT_TARGET

DTYPES = ["auto", "float32", "bfloat16", "float16"]


def add_runtime_options(p: argparse.ArgumentParser, model_default: str = DEFAULT_TARGET) -> None:
    """The target model and how it runs; read back as args.model, args.dtype, args.device, args.threads and
    args.no_optimize."""
    p.add_argument("--model", "--target", dest="model", default=model_default,
                   help=f"known model name or local Hugging Face folder (default: {model_default})")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: float32 on CPU, bfloat16 on CUDA")
    add_threads_option(p, "--target-threads", what="the target")
    p.add_argument("--no-optimize", action="store_true", help="keep the stock transformers kernels")


def add_threads_option(p: argparse.ArgumentParser, *aliases: str, what: str = "torch") -> None:
    p.add_argument("--threads", *aliases, dest="threads", type=int, default=None,
                   help=f"CPU threads for {what} (default: all cores)")


def add_sidecar_options(p: argparse.ArgumentParser, model_default: str | None = DEFAULT_SIDECAR,
                        device_default: str | None = "cpu") -> None:
    """The sidecar of --method oospec/sidecar. model_default None: no sidecar unless --sidecar-model is given
    (`serve`); device_default None: the target's --device (`bench serve`)."""
    p.add_argument("--sidecar-model", "--sidecar", dest="sidecar_model", metavar="MODEL", default=model_default,
                   help="the sidecar of --method oospec/sidecar: a known model name or a local Hugging Face folder "
                        + (f"(default: {model_default})" if model_default else "(default: none)"))
    p.add_argument("--sidecar-adapter", default="auto",
                   help="LoRA adapter of the sidecar: auto (the one shipped for the default sidecar model), none (the "
                        "base model), or an adapter folder")
    p.add_argument("--sidecar-threads", type=int, default=1, help="CPU threads of the sidecar's own process")
    p.add_argument("--sidecar-device", default=device_default,
                   help="the sidecar's device: cpu, cuda:1, ... (default: " + (device_default or "--device") + ")")


def sidecar_settings(args: argparse.Namespace):
    """The SidecarSettings that the parsed sidecar and runtime options ask for (see `add_sidecar_options`)."""
    from oospec.sidecar.process import SidecarSettings  # imports torch: not at parse time

    return SidecarSettings(model=args.sidecar_model, adapter=args.sidecar_adapter, threads=args.sidecar_threads,
                           device=args.sidecar_device or args.device, dtype=args.dtype)


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
