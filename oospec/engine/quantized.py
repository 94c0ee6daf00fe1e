"""A qwen2 / llama model run from its GGUF as stored: weights stay in their blocks, dequantized inside the kernels.

`load_gguf_model(path, dtype)` builds the transformers model from the file's metadata with no weights, then
fills it: every linear layer becomes a `QuantizedLinear` over a `BlockWeight`, the tensor's blocks regrouped by 16
rows (a llama's q and k rows reordered first, as transformers' loader reorders them), the input embedding a
`QuantizedEmbedding`, a tied output head a `QuantizedLinear` over the embedding's own weight (held once), and the
small float tensors (norms, biases) ordinary parameters. `oospec.engine.invariant.install` then makes the rest
row-invariant as for any model.

The bits are the expanded model's: each weight element is gguf-py's dequantization (what `convert.py`'s float32
folder holds), rounded to bfloat16 as torch rounds it for a bfloat16 model, and the product is the invariant
kernel's, in its order, on its path (kernels/gguf_linear.cpp: `linear_repacked` reads the panels `linear_packed`
reads, made from the regrouped blocks per chunk instead of once at load). One difference from an installed expanded model:
forwards of more than STEP_ROWS rows in float32 also take the invariant kernel here (there is no float32 copy
of the weights for oneDNN), as every bfloat16 forward does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from oospec.errors import ModelIntegrityError


class BlockWeight(nn.Module):
    """A GGUF weight [rows, cols] as the kernels read it: regrouped by 16 rows (`blocks` is repack.h's panels)
    where the kernels can, else the file's own rows (`blocks` uint8 [rows, row bytes], `regrouped` False: the
    pure-torch kernels, float types, a block scale that is not finite). Either way the same bits (see the tests).
    A module so that a tied embedding and head can hold the one weight."""

    def __init__(self, raw: torch.Tensor, qtype: int, cols: int, ops):
        super().__init__()
        self.qtype, self.rows, self.cols, self.ops = int(qtype), raw.shape[0], cols, ops
        self.regrouped = False
        blocks = raw
        if hasattr(ops, "repack_quant"):  # the C++ kernels: they say which types they regroup (repack.h)
            try:
                blocks, self.regrouped = ops.repack_quant(raw, self.qtype, cols), True
            except RuntimeError:  # a float type, or a scale that is not finite: the file's rows, the same bits
                pass
        self.register_buffer("blocks", blocks, persistent=False)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, cols] -> [M, rows] through the invariant kernels, in x's dtype."""
        if self.regrouped:
            return self.ops.linear_repacked(x, self.blocks, self.qtype, self.rows, bias)
        return self.ops.linear_quant(x, self.blocks, self.qtype, bias)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), cols]: those rows, as gguf-py dequantizes them."""
        if self.regrouped:
            return self.ops.dequantize_repacked(self.blocks, self.qtype, self.rows, self.cols, ids)
        return self.ops.dequantize(self.blocks[ids], self.qtype, self.cols)

    def extra_repr(self) -> str:
        return f"rows={self.rows}, cols={self.cols}, qtype={self.qtype}, regrouped={self.regrouped}"


class QuantizedLinear(nn.Module):
    """y = x W^T + b with W a `BlockWeight` (possibly shared with a tied embedding)."""

    def __init__(self, weight: BlockWeight, dtype: torch.dtype, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = weight.cols, weight.rows
        self.weight_blocks, self.dtype = weight, dtype
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    @property
    def ops(self):
        return self.weight_blocks.ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        x2 = x.reshape(rows, self.in_features)
        y = self.weight_blocks.matmul(x2 if x.dtype == self.dtype else x2.to(self.dtype), self.bias)
        y = y if x.dtype == self.dtype else y.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)


class LinearGroup:
    """Several QuantizedLinear that read the same x (q, k and v; gate and up) as one kernel call
    (`linear_repacked_many`): one pool of work for the threads, one wake-up, each output the bits of its own
    layer's call. `of` says None where the layers are not all plain regrouped QuantizedLinear of one dtype."""

    def __init__(self, layers: list[QuantizedLinear]):
        self.blocks = [q.weight_blocks.blocks for q in layers]
        self.types = [q.weight_blocks.qtype for q in layers]
        self.rows = [q.out_features for q in layers]
        self.biases = [q.bias for q in layers]
        self.in_features, self.dtype, self.ops = layers[0].in_features, layers[0].dtype, layers[0].ops

    @classmethod
    def of(cls, layers: list[nn.Module]) -> LinearGroup | None:
        plain = all(type(q) is QuantizedLinear and q.weight_blocks.regrouped for q in layers)
        if not plain or len({(q.in_features, q.dtype, id(q.ops)) for q in layers}) != 1:
            return None
        return cls(layers) if hasattr(layers[0].ops, "linear_repacked_many") else None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        rows = x.numel() // self.in_features
        x2 = x.reshape(rows, self.in_features)
        ys = self.ops.linear_repacked_many(x2 if x.dtype == self.dtype else x2.to(self.dtype), self.blocks,
                                           self.types, self.rows, self.biases)
        if x.dtype != self.dtype:
            ys = [y.to(x.dtype) for y in ys]
        return [y.view(*x.shape[:-1], n) for y, n in zip(ys, self.rows)]


class QuantizedEmbedding(nn.Module):
    """The rows of an embedding held as a `BlockWeight`, dequantized when looked up (then rounded to `dtype`, as
    the expanded model's embedding matrix was)."""

    def __init__(self, weight: BlockWeight, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.rows, weight.cols
        self.weight_blocks, self.dtype = weight, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        values = self.weight_blocks.lookup(ids.reshape(-1)).to(self.dtype)
        return values.view(*ids.shape, self.embedding_dim)


class LoRALinear(nn.Module):
    """A linear layer plus a LoRA beside it, unmerged: y = base(x) + (x A^T) B^T * scaling, as peft computes an
    unmerged adapter. Why unmerged: a merge would change the weights the file's blocks hold. For a drafter (the
    sidecar), whose precision is free; a target's output never goes through one (slot rows: only their own rows,
    oospec.engine.slot_rows). dtype: the factors' (default: the base's, a QuantizedLinear's or InvariantLinear's)."""

    def __init__(self, base: nn.Module, a: torch.Tensor, b: torch.Tensor, scaling: float,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.base, self.scaling = base, scaling
        dtype = dtype or base.dtype
        self.lora_a = nn.Parameter(a.to(dtype), requires_grad=False)  # [r, in]
        self.lora_b = nn.Parameter(b.to(dtype), requires_grad=False)  # [out, r]
        self.enabled = True  # off: the base layer alone (a target's prompt read beside rows that carry the LoRA)

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """(x A^T) B^T * scaling, in x's dtype."""
        h = x.to(self.lora_a.dtype)
        return ((h @ self.lora_a.T) @ self.lora_b.T * self.scaling).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self.base(x)
        return self.base(x) + self.delta(x)


LoRAWrap = Callable[[nn.Module, torch.Tensor, torch.Tensor, float], "nn.Module | None"]


def wrap_lora(model: nn.Module, adapter: str | Path, wrap: LoRAWrap) -> int:
    """Replace every module a peft LoRA adapter folder (adapter_config.json, adapter_model.safetensors) names by
    `wrap(module, A [r, in], B [out, r], scaling)` (None: leave that one). Returns how many were replaced;
    refuses an adapter that replaces none or uses what LoRALinear does not compute (DoRA, rsLoRA, per-module
    ranks, bias)."""
    import json

    from safetensors.torch import load_file

    adapter = Path(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    unsupported = [k for k in ("use_dora", "use_rslora", "rank_pattern", "alpha_pattern") if config.get(k)]
    if unsupported or config.get("bias", "none") != "none":
        raise ModelIntegrityError(f"{adapter}: oospec adds plain LoRA only, not {unsupported or 'bias'}")
    scaling = config["lora_alpha"] / config["r"]
    factors = load_file(str(adapter / "adapter_model.safetensors"))
    done = 0
    for name, module in list(model.named_modules()):
        a = factors.get(f"base_model.model.{name}.lora_A.weight")
        if a is None:
            continue
        wrapped = wrap(module, a, factors[f"base_model.model.{name}.lora_B.weight"], scaling)
        if wrapped is None:
            continue
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, wrapped)
        done += 1
    if not done:
        raise ModelIntegrityError(f"{adapter}: none of its LoRA factors names a layer of this model")
    return done


def add_lora(model: nn.Module, adapter: str | Path) -> int:
    """Put a peft LoRA adapter folder beside the quantized linears it targets, unmerged (LoRALinear, wrap_lora)."""
    return wrap_lora(model, adapter,
                     lambda module, a, b, scaling: LoRALinear(module, a, b, scaling)
                     if isinstance(module, QuantizedLinear) else None)


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

    def blocks(hf: str) -> BlockWeight:
        tensor = stored(hf)
        weight = BlockWeight(torch.from_numpy(tensor.raw), tensor.qtype, tensor.row_elements, ops)
        if weight.regrouped:  # the copy is what runs: the file's pages need not stay in memory
            gguf.release(gguf.tensors[by_hf[hf]])
        return weight

    with torch.no_grad():
        for module_name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                full = f"{module_name}.{child_name}" if module_name else child_name
                if type(child) is nn.Linear and full != "lm_head":
                    bias = None
                    if child.bias is not None:
                        bias = torch.from_numpy(stored(f"{full}.bias").dequantize().copy())
                    setattr(module, child_name, QuantizedLinear(blocks(f"{full}.weight"), dtype, bias))
        inner.embed_tokens = QuantizedEmbedding(blocks("model.embed_tokens.weight"), dtype)
        if "lm_head.weight" in by_hf:
            model.lm_head = QuantizedLinear(blocks("lm_head.weight"), dtype)
        else:  # tied: the embedding's weight, held once
            model.lm_head = QuantizedLinear(inner.embed_tokens.weight_blocks, dtype)
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
    weight = module.weight_blocks
    return weight.lookup(torch.arange(weight.rows)).numpy()
