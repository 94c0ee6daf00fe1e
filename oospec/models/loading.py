"""Load a model and its tokenizer for inference, with errors a user can act on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from oospec.errors import ModelIntegrityError, ModelNotFoundError, OospecError
from oospec.models.provision import oospec_home, resolve_model_path
from oospec.models.registry import KNOWN_MODELS

DTYPES = ("auto", "float32", "bfloat16", "float16")  # what load_model and every --dtype take


def _fix_hint(folder: Path) -> str:
    """What to do about a broken folder: re-pull a known model, or re-save a local one."""
    try:
        rel = folder.resolve().relative_to((oospec_home() / "models").resolve())
        name = rel.parts[0] if rel.parts else ""
    except (ValueError, OSError):
        name = ""
    if name in KNOWN_MODELS:
        return f"Run `oospec models pull {name} --force` to download and convert it again."
    return "Re-create the folder with save_pretrained (or copy it again), then retry."


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files the folder's checkpoint consists of; raises if there are none or some are missing."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelIntegrityError(f"{index} is unreadable ({exc}). {_fix_hint(folder)}") from exc
        shards = sorted({folder / f for f in weight_map.values()})
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise ModelIntegrityError(
                f"{folder} is missing weight shard(s) {', '.join(missing)} named in {index.name}. {_fix_hint(folder)}"
            )
        return shards
    if single.is_file():
        return [single]
    if any(folder.glob("*.bin")) or any(folder.glob("*.safetensors")):
        return sorted(folder.glob("*.safetensors"))  # unusual naming: let transformers decide
    raise ModelIntegrityError(
        f"{folder} has a config.json but no model weights (no model.safetensors or model.safetensors.index.json). "
        f"{_fix_hint(folder)}"
    )


def _check_safetensors(files: list[Path], folder: Path) -> None:
    """Parse each file's header; safetensors also checks the data section covers the whole file,
    so a truncated or garbled download fails here, cheaply, instead of deep inside from_pretrained."""
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # SafetensorError, OSError, ...
            size = f.stat().st_size if f.exists() else 0
            raise ModelIntegrityError(
                f"Weights file {f} ({size:,} bytes) is corrupt or truncated: {exc}. {_fix_hint(folder)}"
            ) from exc


def _resolve_folder(name_or_path: str | os.PathLike) -> Path:
    folder = resolve_model_path(name_or_path)
    if not (folder / "config.json").is_file():  # resolve_model_path checks, but a folder can vanish in between
        raise ModelNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder.")
    return folder


def _torch_dtype(dtype: Any, device: str):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise OospecError(f"Unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}.")
    if dtype == "auto":
        from oospec.models.cpu_features import auto_dtype

        dtype = auto_dtype(device)
    return getattr(torch, dtype)


class BatchVarianceWarning(UserWarning):
    """bfloat16 was asked for on a CPU with native bfloat16 without the invariant kernels, whose stock GEMMs are
    not batch-invariant (oospec.engine.precision warns)."""


def _check_device(device: str) -> None:
    import torch

    dev = str(device)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise OospecError(f"Device {dev!r} was asked for, but this PyTorch sees no CUDA device. Use --device cpu.")
    if dev.startswith("mps") and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise OospecError(f"Device {dev!r} was asked for, but MPS is not available here. Use --device cpu.")
    try:
        torch.device(dev)
    except (RuntimeError, TypeError) as exc:
        raise OospecError(f"Unknown device {dev!r}: {exc}") from exc


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer (with its chat template) of a known model name or a local Hugging Face folder."""
    folder = _resolve_folder(name_or_path)
    return _load_tokenizer_from(folder)


def _load_tokenizer_from(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except OospecError:
        raise
    except Exception as exc:
        raise ModelIntegrityError(
            f"Could not load the tokenizer from {folder}: {type(exc).__name__}: {exc}. {_fix_hint(folder)}"
        ) from exc


def load_model(
    name_or_path: str | os.PathLike,
    *,
    dtype: str = "auto",
    device: str = "cpu",
    attn_implementation: str | None = "sdpa",
):
    """Load ``(model, tokenizer)`` for inference.

    ``name_or_path`` is a known model name (pulled and converted on first use) or a local Hugging Face
    folder. ``dtype="auto"`` means bfloat16 on CUDA and float32 on every CPU
    (oospec.models.cpu_features.auto_dtype says why). The model is in eval mode with
    gradients off. Raises ``ModelNotFoundError`` for a missing model and ``ModelIntegrityError`` for
    corrupt, truncated or missing weights.
    """
    _check_device(device)
    torch_dtype = _torch_dtype(dtype, device)
    folder = _resolve_folder(name_or_path)
    files = _weight_files(folder)
    _check_safetensors(files, folder)

    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch_dtype, "output_loading_info": True}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    except OospecError:
        raise
    except (ValueError, ImportError) as exc:
        if "attn_implementation" in str(exc) or "attention" in str(exc).lower():
            raise OospecError(f"Attention implementation {attn_implementation!r} is not available: {exc}") from exc
        raise ModelIntegrityError(f"Could not load the model in {folder}: {type(exc).__name__}: {exc}. {_fix_hint(folder)}") from exc
    except Exception as exc:  # SafetensorError, OSError, RuntimeError (shape mismatch), ...
        raise ModelIntegrityError(f"Could not load the model in {folder}: {type(exc).__name__}: {exc}. {_fix_hint(folder)}") from exc

    missing = [k for k in (info or {}).get("missing_keys", []) if k]
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    mismatched = (info or {}).get("mismatched_keys", [])
    if missing or mismatched:
        bad = (list(missing) + [str(m) for m in mismatched])[:5]
        raise ModelIntegrityError(
            f"The weights in {folder} do not match its config.json: {len(missing)} missing and "
            f"{len(mismatched)} mismatched tensor(s), e.g. {', '.join(map(str, bad))}. {_fix_hint(folder)}"
        )

    try:
        model.to(device)
    except Exception as exc:
        raise OospecError(f"Could not move the model to {device!r}: {exc}") from exc
    model.eval()
    model.requires_grad_(False)
    row_major_head_input(model)
    tokenizer = _load_tokenizer_from(folder)
    return model, tokenizer


def row_major_head_input(model) -> None:
    """Hand the output projection its input in plain row-major strides. transformers computes logits on
    `hidden_states[:, -k:, :]` (logits_to_keep), a strided 3-D view; torch's CPU matmul does not fold such a
    view into one GEMM but broadcasts the weight to a batched matmul, copying all of it on every call: in
    bfloat16 1-3 s for a 152k-token vocabulary (torch 2.13 on a Xeon with AMX), 30-100x the GEMM itself, once
    per prefill and per sidecar row batch. `.contiguous()` is not enough: a (1, 1, h) view counts as
    contiguous whatever its strides, and matmul still takes the slow path. Copying the kept rows costs
    nothing next to that; the values are the same."""
    import torch

    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(
            lambda _module, args: (args[0].clone(memory_format=torch.contiguous_format), *args[1:]))
