"""A qwen2 / llama model run from its GGUF as stored: weights stay in their blocks, dequantized inside the kernels.

`load_gguf_model(path, dtype)` builds the transformers model from the file's metadata with no weights, then
fills it: every linear layer becomes a `QuantizedLinear` over the tensor's raw blocks (memory-mapped; a llama's
q and k rows reordered as transformers' loader reorders them), the input embedding a `QuantizedEmbedding`, a
tied output head a `QuantizedLinear` over the embedding's own blocks (held once), and the small float tensors
(norms, biases) ordinary parameters. `oospec.engine.invariant.install` then makes the rest row-invariant as for
any model.

The bits are the expanded model's: each weight element is gguf-py's dequantization (what `convert.py`'s float32
folder holds), rounded to bfloat16 as torch rounds it for a bfloat16 model, and the product is the invariant
kernel's, in its order, on its path (kernels/linear.cpp: `linear_quant` reads the panels `linear_packed` reads,
made from the blocks per chunk instead of once at load). One difference from an installed expanded model:
forwards of more than STEP_ROWS rows in float32 also take the invariant kernel here (there is no float32 copy
of the weights for oneDNN), as every bfloat16 forward does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from oospec.errors import ModelIntegrityError


class QuantizedLinear(nn.Module):
    """y = x W^T + b with W [out, in] held as GGUF blocks (`raw`: uint8 [out, row bytes], shared, not copied)."""

    def __init__(self, raw: torch.Tensor, qtype: int, in_features: int, dtype: torch.dtype, ops,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, raw.shape[0]
        self.qtype, self.dtype, self.ops = int(qtype), dtype, ops
        self.register_buffer("raw", raw, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        x2 = x.reshape(rows, self.in_features).to(self.dtype)
        y = self.ops.linear_quant(x2, self.raw, self.qtype, self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype}"


class QuantizedEmbedding(nn.Module):
    """The rows of an embedding held as GGUF blocks, dequantized when looked up (then rounded to `dtype`, as the
    expanded model's embedding matrix was)."""

    def __init__(self, raw: torch.Tensor, qtype: int, dim: int, dtype: torch.dtype, ops):
        super().__init__()
        self.num_embeddings, self.embedding_dim = raw.shape[0], dim
        self.qtype, self.dtype, self.ops = int(qtype), dtype, ops
        self.register_buffer("raw", raw, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.raw[ids.reshape(-1)]  # the looked-up rows' blocks only
        values = self.ops.dequantize(rows, self.qtype, self.embedding_dim).to(self.dtype)
        return values.view(*ids.shape, self.embedding_dim)


def _raw(stored) -> torch.Tensor:
    return torch.from_numpy(stored.raw)


def load_gguf_model(path: str | Path, *, dtype: torch.dtype = torch.float32, ops=None):
    """(model, tokenizer) of a qwen2 / llama GGUF, its weights kept as stored (module docstring), in eval mode.
    ops: the kernels (default: `invariant.kernels()`)."""
    from transformers import AutoModelForCausalLM

    from oospec.engine.invariant import kernels
    from oospec.models.gguf_weights import GGUFFile, read_config, read_tokenizer, row_order, hf_names

    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantized GGUF weights run in float32 or bfloat16, not {dtype}")
    ops = ops or kernels()
    gguf = GGUFFile(path)
    bad = gguf.unsupported()
    if bad:
        raise ModelIntegrityError(f"{path}: tensor types the kernels cannot read: {sorted(set(bad.values()))} "
                                  f"(e.g. {next(iter(bad))})")
    config = read_config(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    names = hf_names(model, gguf)
    by_hf = {hf: name for name, hf in names.items() if name in gguf.tensors}
    inner = model.model

    def stored(hf: str):
        name = by_hf.get(hf)
        if name is None:
            raise ModelIntegrityError(f"{path} has no tensor for {hf}")
        order = row_order(model, gguf, name)
        return gguf.tensors[name] if order is None else gguf.tensors[name].rows(order)

    with torch.no_grad():
        for module_name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                full = f"{module_name}.{child_name}" if module_name else child_name
                if type(child) is nn.Linear and full != "lm_head":
                    w = stored(f"{full}.weight")
                    bias = None
                    if child.bias is not None:
                        bias = torch.from_numpy(stored(f"{full}.bias").dequantize().copy())
                    setattr(module, child_name, QuantizedLinear(_raw(w), w.qtype, child.in_features, dtype, ops, bias))
        embed = stored("model.embed_tokens.weight")
        inner.embed_tokens = QuantizedEmbedding(_raw(embed), embed.qtype, config.hidden_size, dtype, ops)
        if "lm_head.weight" in by_hf:
            head = stored("lm_head.weight")
            model.lm_head = QuantizedLinear(_raw(head), head.qtype, config.hidden_size, dtype, ops)
        else:  # tied: the embedding's blocks, the same tensor
            model.lm_head = QuantizedLinear(inner.embed_tokens.raw, embed.qtype, config.hidden_size, dtype, ops)
        for hf, param in list(model.named_parameters()):
            if param.is_meta:
                owner, _, leaf = hf.rpartition(".")
                value = torch.from_numpy(stored(hf).dequantize().copy()).to(dtype)
                setattr(model.get_submodule(owner), leaf, nn.Parameter(value, requires_grad=False))
        inner.rotary_emb = type(inner.rotary_emb)(config=config)  # its buffers were made on the meta device
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ModelIntegrityError(f"{path}: no weights for {left[:5]}")
    model.config.tie_word_embeddings = "lm_head.weight" not in by_hf
    model.eval()
    model.requires_grad_(False)
    model.oospec_gguf = {"path": str(path), "stored_bytes": gguf.stored_bytes,
                         "types": sorted({t.qtype.name for t in gguf.tensors.values()})}
    model._oospec_gguf_file = gguf  # keeps the mapping open as long as the model lives
    return model, read_tokenizer(path)


def dequantized(module: nn.Module) -> np.ndarray:
    """The float32 weight a QuantizedLinear / QuantizedEmbedding stands for (tests, comparisons)."""
    return module.ops.dequantize(module.raw, module.qtype, getattr(module, "in_features", None)
                                 or module.embedding_dim).numpy()
