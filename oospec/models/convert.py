"""A verified GGUF file turned once into a float32 safetensors folder that transformers loads directly.

Used by ``oospec.models.provision.pull`` after it has assembled and checked the GGUF.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from oospec.errors import OospecError
from oospec.models.registry import ModelSpec


def has_weights(folder: Path) -> bool:
    """Whether `folder` holds safetensors weights (one file or an index of shards)."""
    return any((folder / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json"))


@contextlib.contextmanager
def _spinner(progress: bool, msg: str) -> Iterator[None]:
    if not progress:
        yield
        return
    try:
        from rich.console import Console

        console = Console(stderr=True)
    except Exception:  # pragma: no cover - rich is a dependency, but a spinner is not worth failing for
        console = None
    start = time.monotonic()
    if console is not None and console.is_terminal:
        with console.status(msg):
            yield
    else:
        print(msg, file=sys.stderr, flush=True)
        yield
    print(f"  done in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def convert_gguf(spec: ModelSpec, gguf: Path, out_dir: Path, *, progress: bool = True) -> dict:
    """Load the GGUF with transformers (de-quantizing it) and save it as a float32 safetensors folder.

    The converted model is the float32 de-quantization of the quantized GGUF: every weight is exactly
    the value the GGUF's quantized blocks encode, widened to float32 (not the original bf16 checkpoint,
    and not re-quantized). That is what makes it a faithful stand-in for the GGUF in float32 PyTorch.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)

    load_kwargs: dict = {"gguf_file": gguf.name, "dtype": torch.float32}
    try:  # Ask for plain dense float32 weights, never GGUF blocks kept packed behind a kernel.
        from transformers import GgufConfig

        load_kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers: GGUF loading always de-quantizes
        pass

    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # our spinner replaces transformers' own bars
    hf_logging.set_verbosity_error()
    started = time.monotonic()
    try:
        with _spinner(progress, f"Converting {spec.name} from GGUF to float32 safetensors (takes a minute or more) ..."):
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **load_kwargs)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

            odd = {type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()}
            dtypes = {p.dtype for p in model.parameters()}
            if odd or dtypes != {torch.float32}:
                raise OospecError(
                    f"Converting {spec.name}: transformers {transformers.__version__} kept the GGUF weights packed "
                    f"(modules {sorted(odd)}, dtypes {sorted(map(str, dtypes))}) instead of de-quantizing them to "
                    "float32; this version of transformers is not supported for conversion."
                )
            # transformers marks a model loaded from GGUF as quantized, which blocks save_pretrained even
            # though every weight is now a plain float32 tensor: drop that marker before saving.
            model.hf_quantizer = None
            if getattr(model.config, "quantization_config", None) is not None:
                del model.config.quantization_config
            if hasattr(model, "is_quantized"):
                with contextlib.suppress(AttributeError):
                    model.is_quantized = False
            model.config.dtype = torch.float32
            model.eval()

            tmp.mkdir(parents=True)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            if getattr(model, "generation_config", None) is not None and not (tmp / "generation_config.json").exists():
                model.generation_config.save_pretrained(tmp)
            n_params = sum(p.numel() for p in model.parameters())
            del model

            # The folder must stand on its own: a tokenizer with its chat template, a config, weights.
            reloaded = AutoTokenizer.from_pretrained(str(tmp))
            if not reloaded.chat_template:
                raise OospecError(
                    f"Converting {spec.name}: the tokenizer saved to {tmp} has no chat template after reloading; "
                    "oospec needs it to build prompts. Please report this with your transformers version."
                )
            if not (tmp / "config.json").is_file() or not has_weights(tmp):
                raise OospecError(f"Converting {spec.name}: save_pretrained wrote no config or weights to {tmp}.")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_enabled:
            hf_logging.enable_progress_bar()

    for f in tmp.iterdir():  # save_pretrained writes some files 0600; the cache is for every user of the account
        with contextlib.suppress(OSError):
            f.chmod(0o644)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out_dir)
    return {
        "n_params": n_params,
        "convert_seconds": round(time.monotonic() - started, 1),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
