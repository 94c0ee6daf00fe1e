"""Faster float32 CPU inference for Hugging Face qwen2 / llama models, same math.

Why: speculative decoding verifies k draft tokens in one target forward, and on a CPU the price of that
forward decides how large k can be. A forward is ~all linear layers (GEMMs whose weight matrix is read once
per call), so its cost at small k is the time to stream the weights from memory. torch's default fp32
`nn.Linear` calls MKL sgemm, which on small row counts (2..64) re-packs the whole weight matrix on every
call: 4 rows cost ~3x one row although the weights are read once either way. oneDNN (bundled with torch)
can take the weight *pre-packed once* in its own blocked layout, so a k-row product costs about what a
one-row product costs until the arithmetic, not the memory, is the limit.

`optimize_for_cpu(model)` therefore, in place and only for inference:
  * replaces each decoder `nn.Linear` (q/k/v/o, gate/up/down) and the `lm_head` by `PackedLinear`, which
    holds the weight pre-packed for oneDNN and calls `torch.ops.mkldnn._linear_pointwise` (1-3 rows are
    zero-padded to 4: oneDNN's 4-row kernel streams a packed weight faster than its 1- and 2-row kernels);
  * switches "sdpa" attention to `cpu_sdpa_attention`, which lets SDPA broadcast grouped kv heads instead
    of copying the whole KV cache num_heads/num_kv_heads times per layer (what transformers does whenever
    a mask is passed with more than one query, i.e. on every tree verification).

Numerics: every product is still an IEEE float32 dot product with float32 accumulation (no TF32/bf16
"fast math" unless the user enabled it globally, which changes the stock path too); only the summation
order differs from MKL's, so logits differ by float rounding (Qwen2.5-Coder-1.5B: max 8e-5 on logits up to
26, i.e. ~3e-6 relative) and greedy tokens are the same on realistic inputs. Everything else (norms, rotary,
activation, attention arithmetic) is torch's own.

The replaced modules drop the original `nn.Linear` weights (the packed copy replaces them), so
`state_dict()` no longer holds them: call this on a model that is only used for inference. The
model stays usable through `model(...)` and `model.generate(...)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oospec.models.registry import SUPPORTED_ARCHITECTURES as _SUPPORTED

ATTN_NAME = "oospec_cpu_sdpa"


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] reordered once into oneDNN's preferred blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def _rows_padded(x: torch.Tensor, min_rows: int) -> tuple[torch.Tensor, int]:
    """x as a 2D [rows, in] matrix with at least `min_rows` rows (zero rows appended), and the real row count."""
    x2 = x.reshape(-1, x.shape[-1])
    n = x2.shape[0]
    if n >= min_rows or n == 0:
        return x2, n
    padded = x2.new_zeros((min_rows, x2.shape[1]))
    padded[:n] = x2
    return padded, n


class PackedLinear(nn.Module):
    """Inference-only `nn.Linear` over a pre-packed oneDNN weight: y = x @ W.T + b (float32, exact products).

    oneDNN's kernels for 1 and 2 rows over a packed weight are slower than its 4-row kernel here (they stream
    the weight less efficiently), so fewer rows than `min_rows` are zero-padded: each output row is still
    computed from its own input row only, and the padding rows are dropped.
    """

    min_rows = 4

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.packed = _pack(weight)
        self.bias = None if bias is None else bias.detach().contiguous().clone()

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "PackedLinear":
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, n = _rows_padded(x, self.min_rows)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y[:n].view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def cpu_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                       **kwargs):
    """transformers' "sdpa" attention, except that grouped-query heads are never copied.

    With a mask and more than one query, transformers calls `repeat_kv`, which copies every cached key and
    value num_heads/num_kv_heads times per layer (6x for Qwen2.5-1.5B): on CPU that copy costs more than the
    attention itself. `enable_gqa=True` makes SDPA broadcast the kv heads instead; same arithmetic.
    """
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = q_len > 1 and attention_mask is None and is_causal
    if is_causal and key.shape[2] > q_len:  # as transformers: SDPA's causal mask is aligned top-left
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    if q_len == 1 and heads != kv_heads and (attention_mask is None or attention_mask.shape[1] == 1):
        # one query: the heads sharing a kv head become that head's query rows (as transformers' pack_gqa)
        out = F.scaled_dot_product_attention(query.reshape(b, kv_heads, heads // kv_heads, dim), key, value,
                                             attn_mask=attention_mask, dropout_p=dropout, scale=scaling)
        out = out.reshape(b, heads, 1, value.shape[-1])
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, is_causal=is_causal, enable_gqa=heads != kv_heads)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTN_NAME, cpu_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)  # masks exactly as for "sdpa"


def optimize_for_cpu(model: nn.Module, *, linear: bool = True, attention: bool = True, lm_head: bool = True) -> dict:
    """Make float32 CPU forwards of a qwen2 / llama causal LM faster, in place, with the same math.

    linear:    every `nn.Linear` in the decoder layers -> `PackedLinear` (pre-packed oneDNN weight).
    attention: "sdpa" -> `cpu_sdpa_attention` (no copies of grouped kv heads); other choices are kept.
    lm_head:   the output projection -> `PackedLinear` too. With tied embeddings this keeps a packed copy
               of the vocab x hidden matrix (0.9 GB for Qwen2.5-1.5B); pass False to save that memory.

    Returns a report: `applied` (bool), `reason` (why not), what was replaced, and the torch thread count.
    A no-op (applied=False) on CUDA or any non-CPU device, for non-float32 weights, for architectures other
    than qwen2/llama, and on a torch without oneDNN. Calling it twice is harmless.
    Numerical differences: float32 summation order only (logits agree to a few 1e-6 relative; see the
    module docstring); greedy tokens are unchanged on realistic inputs.
    """
    report: dict = {"applied": False, "reason": "", "linear": 0, "lm_head": False, "attention": None,
                    "threads": torch.get_num_threads(), "fp32_precision": torch.get_float32_matmul_precision()}
    config = getattr(model, "config", None)
    arch = getattr(config, "model_type", None)
    param = next(model.parameters(), None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if param is None:
        report["reason"] = "model has no parameters"
    elif param.device.type != "cpu":
        report["reason"] = f"device is {param.device.type}, not cpu"
    elif param.dtype != torch.float32:
        report["reason"] = f"dtype is {param.dtype}, only float32 is handled"
    elif arch not in _SUPPORTED or layers is None:
        report["reason"] = f"architecture {arch!r} is not one of {_SUPPORTED}"
    elif not onednn_available():
        report["reason"] = "torch was built without oneDNN (mkldnn)"
    if report["reason"]:
        return report

    with torch.no_grad():
        for layer in layers if linear else ():
            # q/k/v/o and gate/up/down; the modules' own forwards (activation, heads, rope) stay as they are
            for owner in list(layer.modules()):
                for name, child in list(owner.named_children()):
                    if type(child) is nn.Linear:
                        setattr(owner, name, PackedLinear.from_linear(child))
                        report["linear"] += 1
        head = getattr(model, "lm_head", None)
        if lm_head and type(head) is nn.Linear:
            model.lm_head = PackedLinear.from_linear(head)
            report["lm_head"] = True
    if attention and getattr(config, "_attn_implementation", None) == "sdpa":
        _register_attention()
        config._attn_implementation = ATTN_NAME
        report["attention"] = ATTN_NAME
    report["applied"] = True
    return report
