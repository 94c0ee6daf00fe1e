"""The invariant forward: every forward after the prefill gives each row the bits a 1-row forward gives it.

Speculative decoding is lossless only if the target's logits for a token do not depend on how many other
tokens share its forward. Stock CPU kernels break that (float32 GEMMs block by row count, oneDNN's bfloat16
kernels too, attention reduces over masked slots), so `install(model)` rebuilds the decoder of a qwen2 /
llama model from kernels whose every reduction has one fixed order:

  * `InvariantLinear` (q/k/v/o, gate/up/down, the output head): with the C++ kernels the weight is packed
    once into 16-output panels and every forward goes through them, each output reduced over k in order in
    its own vector lane (float32 prefills keep a oneDNN copy: faster GEMMs there); with the pure-torch
    kernels forwards of at most `STEP_ROWS` rows take the fixed-order kernel, larger ones torch's GEMM.
    A tied input embedding reads the head's panels (`PackedEmbedding`).
  * attention: the same for at most `STEP_ROWS` query rows: keys visited in slot order, masked tree slots
    skipped, exp as one fixed polynomial.
  * RMSNorm, SiLU: row-wise and element-wise in one formula; rotary cos/sin read from a table built once.

The kernels are the C++ extension of `oospec.engine.kernels` where it builds (`native`), else `TorchKernels`,
the same guarantee in pure torch (elementwise IEEE operations and fixed pairwise sums), much slower.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oospec.engine.onednn import PackedLinear, cpu_sdpa_attention, onednn_available
from oospec.models.registry import SUPPORTED_ARCHITECTURES as _SUPPORTED

# The most rows a forward may hold and still take the invariant path: the verification budget plus the
# pending token must stay within it (TargetBackend caps trees at STEP_ROWS - 1 nodes).
STEP_ROWS = 64
ATTN_NAME = "oospec_invariant"


# ---------------------------------------------------------------------------------------------------------
# The pure-torch kernels: only elementwise operations (correctly rounded in vector and scalar code alike)
# and pairwise sums of fixed shape, so no result depends on row counts, threads or instruction sets.

def tree_sum(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over `dim` by halving: (a[:h] + a[h:]) until one element is left, zero-padded to even widths."""
    t = t.movedim(dim, -1)
    while t.shape[-1] > 1:
        if t.shape[-1] % 2:
            t = torch.cat([t, t.new_zeros(t.shape[:-1] + (1,))], -1)
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


def exp_fixed(x: torch.Tensor) -> torch.Tensor:
    """exp as invariant.cpp's exp_fixed: the same IEEE operations in the same order (float32 in, out)."""
    x = x.clamp(-87.0, 88.0)
    n = torch.round(x * 1.44269504088896341)
    r = x - n * 0.693145751953125
    r = r - n * 1.42860682030941723212e-6
    p = torch.full_like(r, 1.0 / 5040.0)
    for c in (1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + c
    scale = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return p * scale


class TorchKernels:
    """The invariant kernels in pure torch: the same guarantee as the C++ ones, not the same bits."""

    name = "pure-torch"
    _CHUNK = 8192  # output features per product: bounds the temporary to CHUNK x in_features floats

    def isa(self) -> str:
        return "torch"

    def linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32)
        xf = x.float()
        for a in range(0, w.shape[0], self._CHUNK):
            wf = w[a:a + self._CHUNK].float()
            for i in range(x.shape[0]):
                out[i, a:a + wf.shape[0]] = tree_sum(wf * xf[i])
        if bias is not None:
            out = out + bias.float()
        return out.to(x.dtype)

    def dequantize(self, raw: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
        """GGUF blocks -> float32 [rows, k] by gguf-py itself: the expanded model's weights by definition."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return torch.from_numpy(dequantize(raw.numpy(), GGMLQuantizationType(qtype)).reshape(-1, k))

    def linear_quant(self, x: torch.Tensor, raw: torch.Tensor, qtype: int, bias: torch.Tensor | None) -> torch.Tensor:
        """`linear` over a weight held as GGUF blocks, dequantized _CHUNK outputs at a time."""
        out = torch.empty(x.shape[0], raw.shape[0], dtype=x.dtype)
        for a in range(0, raw.shape[0], self._CHUNK):
            w = self.dequantize(raw[a:a + self._CHUNK], qtype, x.shape[1]).to(x.dtype)
            b = None if bias is None else bias[a:a + w.shape[0]]
            out[:, a:a + w.shape[0]] = self.linear(x, w, b)
        return out

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        inv = 1.0 / torch.sqrt(tree_sum(xf * xf) / x.shape[-1] + eps)
        return (w.float() * (xf * inv.unsqueeze(-1)).to(x.dtype).float()).to(x.dtype)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf / (1.0 + exp_fixed(-xf))).to(x.dtype)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                  scale: float) -> torch.Tensor:
        heads, rows, dim = q.shape
        group = heads // k.shape[0]
        keys = k.shape[1]
        out = torch.empty(rows, heads, v.shape[-1], dtype=q.dtype)
        for i in range(rows):
            seen = valid[i].nonzero().view(-1) if valid.numel() else torch.arange(keys - rows + i + 1)
            ks = k[:, seen].float().repeat_interleave(group, 0)  # (heads, n, dim)
            vs = v[:, seen].float().repeat_interleave(group, 0)
            scores = tree_sum(q[:, i].float().unsqueeze(1) * ks) * scale  # (heads, n)
            p = exp_fixed(scores - scores.max(-1, keepdim=True).values)
            o = tree_sum(p.unsqueeze(-1) * vs, dim=1)  # (heads, dim)
            out[i] = (o / tree_sum(p).unsqueeze(-1)).to(q.dtype)
        return out


def kernels():
    """The C++ kernels where they build, else the pure-torch ones."""
    from oospec.engine.kernels import native

    return native() or TorchKernels()


# ---------------------------------------------------------------------------------------------------------
# The modules that replace the stock ones.

class InvariantLinear(nn.Module):
    """y = x W^T + b through the invariant kernel (pure torch: at most STEP_ROWS rows, more through torch's GEMM).

    With the C++ kernels the weight is packed once into their panel layout (`pack_linear`, kernels/linear.cpp),
    which *replaces* the plain weight: the panels serve every forward, the prefill's too, so the weights are
    not held twice. With the pure-torch kernels the original parameter is kept (a tied output
    head stays tied: no copy).

    prefill_packed: for float32, also keep a oneDNN pre-packed copy for the prefill's GEMMs
    (onednn.PackedLinear): there the invariant kernel is compute-bound at one FMA per weight and row, and
    oneDNN's blocked GEMM is faster (twice the weights' memory, float32 only).
    packed: panels already made by `ops.pack_linear` for this weight (a tied output head's, shared with
    `PackedEmbedding`)."""

    def __init__(self, linear: nn.Linear, ops, prefill_packed: bool = False, packed: torch.Tensor | None = None):
        super().__init__()
        self.ops = ops
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.prefill = None
        if prefill_packed and linear.weight.dtype == torch.float32 and onednn_available():
            self.prefill = PackedLinear.from_linear(linear)
        self.bias = linear.bias
        if packed is None and hasattr(ops, "pack_linear"):
            packed = ops.pack_linear(linear.weight.detach())
        if packed is not None:
            self.weight = None
            self.register_buffer("packed", packed, persistent=False)
            self.dtype = packed.dtype
        else:
            self.weight = linear.weight
            self.packed = None
            self.dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > STEP_ROWS and self.prefill is not None and x.dtype == torch.float32 and not x.requires_grad:
            return self.prefill(x)
        if self.packed is not None:  # every row count: the panels are the only copy of the weight
            x2 = x.reshape(rows, self.in_features).to(self.dtype)
            y = self.ops.linear_packed(x2, self.packed, self.bias, self.out_features)
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        if rows > STEP_ROWS or x.dtype != self.weight.dtype or x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        y = self.ops.linear(x.reshape(rows, self.in_features), self.weight, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed={self.packed is not None}")


class PackedEmbedding(nn.Module):
    """The input embedding of a model whose output head is tied to it, read from the head's packed panels
    (pack_linear's layout: panel p holds rows 16p..16p+15, k-major), so the matrix is held once."""

    def __init__(self, embedding: nn.Embedding, packed: torch.Tensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        dim = self.embedding_dim
        if self.packed.dtype == torch.bfloat16:  # [panels][pairs of k][16][2]
            panels = self.packed.view(-1, (dim + 1) // 2, 16, 2)
            return panels[ids // 16, :, ids % 16, :].reshape(*ids.shape, -1)[..., :dim]
        panels = self.packed.view(-1, dim, 16)  # [panels][k][16]
        return panels[ids // 16, :, ids % 16]


class InvariantRMSNorm(nn.Module):
    """transformers' Llama/Qwen2 RMSNorm, row by row in one fixed order (every forward, prefill included)."""

    def __init__(self, norm: nn.Module, ops):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


class InvariantSiLU(nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.silu(x)


class RotaryTable(nn.Module):
    """The model's own rotary embedding, evaluated once per position and then read from a table, so a
    position's cos/sin do not depend on which other positions share the call. The table only grows by
    appending: entries once computed never change."""

    def __init__(self, rotary: nn.Module, initial: int):
        super().__init__()
        self.rotary = rotary
        self.cos = torch.empty(0)
        self.sin = torch.empty(0)
        self._extend(initial)

    @torch.no_grad()
    def _extend(self, size: int) -> None:
        start = self.cos.shape[0]
        if size <= start:
            return
        positions = torch.arange(start, size).view(1, -1)
        cos, sin = self.rotary(torch.zeros(1, dtype=torch.float32), positions)  # float32 table, cast per call
        self.cos = torch.cat([self.cos.view(-1, cos.shape[-1]), cos[0]]) if start else cos[0]
        self.sin = torch.cat([self.sin.view(-1, sin.shape[-1]), sin[0]]) if start else sin[0]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        need = int(position_ids.max()) + 1
        if need > self.cos.shape[0]:
            self._extend(max(need, 2 * self.cos.shape[0]))
        return self.cos[position_ids].to(x.dtype), self.sin[position_ids].to(x.dtype)


_CAUSAL = torch.empty(0, dtype=torch.uint8)
# Every layer of a forward gets the same mask object: it is converted once, for the first layer.
_last_mask: list = [None, None]  # [mask, its per-batch (rows, keys) bytes]


def _valid_keys(mask: torch.Tensor | None, rows: int, keys: int) -> list[torch.Tensor]:
    """Per batch row, (rows, keys) bytes of the keys each query row may see; empty for causal (no mask)."""
    if mask is None:
        return [_CAUSAL]
    if _last_mask[0] is mask:
        return _last_mask[1]
    m = mask[:, 0] if mask.dim() == 4 else mask
    m = m[:, -rows:, -keys:]
    ok = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    valid = list(ok.to(torch.uint8).contiguous())
    _last_mask[:] = [mask, valid]
    return valid


def invariant_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                        **kwargs):
    """transformers' attention interface: at most STEP_ROWS query rows through the invariant kernel, longer
    ones (prefill) through SDPA without copies of grouped kv heads (onednn.cpu_sdpa_attention)."""
    b, heads, rows, dim = query.shape
    special = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None or \
        kwargs.get("sliding_window") is not None
    if rows > STEP_ROWS or special or query.requires_grad:
        return cpu_sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)
    ops = module.oospec_ops
    scale = scaling if scaling is not None else dim ** -0.5
    valid = _valid_keys(attention_mask, rows, key.shape[2])
    outs = [ops.attention(query[i], key[i], value[i], valid[i if len(valid) > 1 else 0], scale) for i in range(b)]
    return (outs[0].unsqueeze(0) if b == 1 else torch.stack(outs)), None  # one request: no copy


def _register_attention() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTN_NAME, invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)


def unsupported_reason(model: nn.Module) -> str:
    """Why `install` cannot make this model invariant ('' when it can)."""
    config = getattr(model, "config", None)
    param = next(model.parameters(), None)
    if param is None:
        return "model has no parameters"
    if param.device.type != "cpu":
        return f"device is {param.device.type}, not cpu"
    if param.dtype not in (torch.float32, torch.bfloat16):
        return f"dtype is {param.dtype}: float32 and bfloat16 only"
    if getattr(config, "model_type", None) not in _SUPPORTED:
        return f"architecture {getattr(config, 'model_type', None)!r} is not one of {_SUPPORTED}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    return ""


def install(model: nn.Module, ops=None) -> dict:
    """Make every forward of at most STEP_ROWS rows row-invariant, in place (inference only).

    ops: the kernels (default `kernels()`: C++ where it builds). Returns a report: `applied`, `reason`,
    `kernels` (which implementation and instruction set), `step_rows`. A no-op (applied=False) on other
    devices, dtypes and architectures; calling it twice is harmless."""
    reason = unsupported_reason(model)
    report = {"applied": False, "reason": reason, "kernels": None, "step_rows": STEP_ROWS}
    if reason:
        return report
    if getattr(model, "oospec_invariant", None):
        return model.oospec_invariant
    ops = ops or kernels()
    inner = model.model
    with torch.no_grad():
        for layer in inner.layers:
            for owner in list(layer.modules()):
                for name, child in list(owner.named_children()):
                    if type(child) is nn.Linear:
                        setattr(owner, name, InvariantLinear(child, ops, prefill_packed=True))
                    elif type(child).__name__.endswith("RMSNorm"):
                        setattr(owner, name, InvariantRMSNorm(child, ops))
            layer.mlp.act_fn = InvariantSiLU(ops)
            layer.self_attn.oospec_ops = ops
        inner.norm = InvariantRMSNorm(inner.norm, ops)
        if type(model.lm_head) is nn.Linear:
            head = model.lm_head
            embed = inner.embed_tokens
            tied = type(embed) is nn.Embedding and embed.weight is head.weight
            model.lm_head = InvariantLinear(head, ops)
            if tied and model.lm_head.packed is not None:  # the plain matrix would otherwise stay for the input
                inner.embed_tokens = PackedEmbedding(embed, model.lm_head.packed)
        initial = min(int(getattr(model.config, "max_position_embeddings", 4096) or 4096), 32768)
        inner.rotary_emb = RotaryTable(inner.rotary_emb, initial)
    _register_attention()
    model.config._attn_implementation = ATTN_NAME
    report.update(applied=True, kernels=f"{getattr(ops, 'name', 'c++')} ({ops.isa()})")
    model.oospec_invariant = report
    return report
