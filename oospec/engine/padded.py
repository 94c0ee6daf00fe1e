"""The invariant forward on accelerators: every forward after the prefill has one shape, and attention reads
each row's keys in the order a 1-row forward reads them.

A GPU's stock kernels give a row of a verification forward other bits than the same token's 1-row decode
forward: cuBLAS picks its GEMM by row count, and attention reduces over all key slots, the masked gaps of a
token tree included, in blocks that start wherever the tree starts. So speculative output could differ from
plain greedy decoding. `install(model)` makes that impossible by construction, for qwen2 / llama models:

  * `TargetBackend` pads every decode and verification forward to `STEP_ROWS` rows (the pad rows repeat the
    pending token; their keys land in slots no real row reads, later overwritten): every GEMM, norm and
    elementwise kernel then runs at one shape, and a row's output depends on its own inputs only.
  * attention (`rowwise_attention`) visits each row's visible keys compacted in position order, in blocks of
    `BLOCK` positions counted from position 0, with one online softmax per row: the row of a token at position
    p reads exactly the keys, in exactly the blocks, that the 1-row forward at position p reads, whatever tree
    it sits in. On CUDA this is a Triton kernel (`oospec.engine.rowwise_triton`); elsewhere (tests) the same
    blocked algorithm in torch.

The prefill (more than STEP_ROWS rows) keeps the stock kernels: every method shares it. `precision.probe`
checks the result bitwise, layer by layer, on the device it will run on.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from oospec.engine.invariant import STEP_ROWS  # the same row limit on every device
from oospec.models.registry import SUPPORTED_ARCHITECTURES as _SUPPORTED

BLOCK = 64  # key positions per attention block
ATTN_NAME = "oospec_rowwise"

# Every layer of a forward gets the same mask object: it is compacted once, for the first layer.
_last: list = [None, None]  # [mask, (tree_slots, lengths)]


def compact_rows(mask: torch.Tensor, rows: int, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From TargetBackend's (1, 1, rows, keys) mask, keys = start + rows: every row sees slots [0, start), then
    some of the last `rows` slots. Returns (tree_slots (rows, rows) int32: row r's visible slots among the last `rows`,
    relative to start, in slot order, which is position order; lengths (rows,) int32: keys row r sees)."""
    if _last[0] is mask:
        return _last[1]
    m = (mask[0, 0] if mask.dim() == 4 else mask[0])[-rows:, :keys]
    tail = m[:, -rows:]
    visible = tail if tail.dtype == torch.bool else tail > torch.finfo(tail.dtype).min / 2
    order = torch.argsort((~visible).to(torch.int8), dim=1, stable=True).to(torch.int32)
    lengths = (visible.sum(1) + (keys - rows)).to(torch.int32)
    _last[:] = [mask, (order.contiguous(), lengths.contiguous())]
    return _last[1]


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_slots: torch.Tensor,
                        lengths: torch.Tensor, scale: float, real_rows: int | None = None) -> torch.Tensor:
    """The Triton kernel's algorithm in torch: q (heads, rows, dim), k/v (kv_heads, keys, dim) with
    keys = start + rows -> (rows, heads, dim). Row by row, BLOCK positions at a time, one online softmax;
    rows from real_rows on (padding) are zero."""
    heads, rows, dim = q.shape
    group = heads // k.shape[0]
    start = k.shape[1] - rows
    out = torch.zeros(rows, heads, v.shape[-1], dtype=q.dtype, device=q.device)
    for r in range(real_rows or rows):
        n = int(lengths[r])
        slots = torch.cat([torch.arange(start, device=q.device),
                           start + tree_slots[r, : n - start].long()])
        m = torch.full((heads,), float("-inf"), device=q.device)
        total = torch.zeros(heads, device=q.device)
        acc = torch.zeros(heads, v.shape[-1], device=q.device)
        for a in range(0, n, BLOCK):
            block = slots[a : a + BLOCK]
            ks = k[:, block].float().repeat_interleave(group, 0)  # (heads, block, dim)
            vs = v[:, block].float().repeat_interleave(group, 0)
            s = (q[:, r].float().unsqueeze(1) * ks).sum(-1) * scale  # (heads, block)
            m_new = torch.maximum(m, s.max(-1).values)
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new.unsqueeze(-1))
            total = total * alpha + p.sum(-1)
            acc = acc * alpha.unsqueeze(-1) + (p.unsqueeze(-1) * vs).sum(1)
            m = m_new
        out[r] = (acc / total.unsqueeze(-1)).to(q.dtype)
    return out


def _kernel(name: str):
    if name == "triton":
        from oospec.engine.rowwise_triton import rowwise_attention_triton

        return functools.partial(rowwise_attention_triton, block=BLOCK)
    return attention_reference


def rowwise_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention interface: forwards of at most STEP_ROWS rows (TargetBackend's padded decode and
    verification forwards, always with its mask) row by row as the module docstring says; longer ones (the
    prefill) through transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, rows, dim = query.shape
    special = kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None
    if rows > STEP_ROWS or attention_mask is None or b != 1 or special or query.requires_grad:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    tree_slots, lengths = compact_rows(attention_mask, rows, key.shape[2])
    scale = scaling if scaling is not None else dim ** -0.5
    # TargetBackend tags its mask with the rows that are not padding (a mask without the tag: all rows).
    real_rows = getattr(attention_mask, "oospec_real_rows", None)
    out = module.oospec_rowwise(query[0], key[0], value[0], tree_slots, lengths, scale, real_rows)
    return out.unsqueeze(0), None


def _register_attention() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTN_NAME, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)


def unsupported_reason(model: nn.Module, allow_cpu: bool = False) -> str:
    """Why `install` cannot make this model invariant ('' when it can)."""
    config = getattr(model, "config", None)
    param = next(model.parameters(), None)
    if param is None:
        return "model has no parameters"
    if param.device.type == "cpu" and not allow_cpu:
        return "device is cpu (oospec.engine.invariant serves CPUs)"
    if param.device.type not in ("cpu", "cuda"):
        return f"device is {param.device.type}: cuda only"
    if param.device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed"
    if getattr(config, "model_type", None) not in _SUPPORTED:
        return f"architecture {getattr(config, 'model_type', None)!r} is not one of {_SUPPORTED}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head size {head_dim} is not a power of two >= 16"
    return ""


def install(model: nn.Module, allow_cpu: bool = False, kernel: str | None = None) -> dict:
    """Make every forward of at most STEP_ROWS rows row-invariant, in place (inference only): padded forwards
    (TargetBackend reads `padded`) and row-wise attention. allow_cpu: also on a CPU (tests; CPUs have
    oospec.engine.invariant). kernel: "triton" (default on CUDA) or "torch" (default elsewhere; the same
    algorithm, slow). Returns the report `oospec.engine.invariant.install` returns."""
    reason = unsupported_reason(model, allow_cpu)
    report = {"applied": False, "reason": reason, "kernels": None, "step_rows": STEP_ROWS, "padded": True}
    if reason:
        return report
    if getattr(model, "oospec_invariant", None):
        return model.oospec_invariant
    kernel = kernel or ("triton" if next(model.parameters()).device.type == "cuda" else "torch")
    for layer in model.model.layers:
        layer.self_attn.oospec_rowwise = _kernel(kernel)
    _register_attention()
    model.config._attn_implementation = ATTN_NAME
    report.update(applied=True, kernels=f"padded rows, row-wise attention ({kernel})")
    model.oospec_invariant = report
    return report
