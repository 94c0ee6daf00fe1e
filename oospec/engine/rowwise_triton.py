"""The row-wise attention of `oospec.engine.padded` as a Triton kernel (CUDA; on a CPU in Triton's interpreter).

One program per (query row, kv head): the query heads that share the kv head are the rows of its dot
products (padded to 16; float32, IEEE: the same code runs in Triton's interpreter on a CPU, where the tests
check it), and the row's visible keys are visited in position order, BLOCK positions at a time
from position 0, with one online softmax. A token's row therefore runs the same instructions on the same
values whether it is the only row of a decode forward or a node deep in a verified tree: the committed
prefix is read in place, the tree's slots through the row's compacted list of ancestors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rowwise_kernel(Q, K, V, O, TREE, LENS, scale, start, rows, keys,
                    s_qh, s_qr, s_kh, s_kl, s_vh, s_vl, s_or, s_oh,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, BLK: tl.constexpr):
    r = tl.program_id(0)
    g = tl.program_id(1)
    heads = g * GROUP + tl.arange(0, GROUP_PAD)
    in_group = tl.arange(0, GROUP_PAD) < GROUP
    d = tl.arange(0, DIM)
    q = tl.load(Q + heads[:, None] * s_qh + r * s_qr + d[None, :], mask=in_group[:, None], other=0.0).to(tl.float32)
    n = tl.load(LENS + r)
    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    total = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, DIM), tl.float32)
    # Up to the forward's key count rather than the row's own: blocks past the row's keys are all masked and
    # change nothing (alpha = exp(0) = 1, p = 0), and a loop bound loaded from memory would not run in
    # Triton's interpreter (where the tests run it on a CPU).
    for a in range(0, keys, BLK):
        pos = a + tl.arange(0, BLK)
        valid = pos < n
        in_tree = pos >= start
        tree_slot = tl.load(TREE + r * rows + (pos - start), mask=valid & in_tree, other=0)
        slot = tl.where(in_tree, start + tree_slot, pos)
        slot = tl.where(valid, slot, 0)
        k = tl.load(K + g * s_kh + slot[:, None] * s_kl + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(V + g * s_vh + slot[:, None] * s_vl + d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m = m_new
    out = acc / total[:, None]
    tl.store(O + r * s_or + heads[:, None] * s_oh + d[None, :], out.to(O.dtype.element_ty), mask=in_group[:, None])


def rowwise_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_slots: torch.Tensor,
                             lengths: torch.Tensor, scale: float, real_rows: int | None = None, *,
                             block: int) -> torch.Tensor:
    """q (heads, rows, dim), k/v (kv_heads, start+rows, dim) -> (rows, heads, dim); see the module docstring.
    real_rows: only the first real_rows rows are computed, the others (padding) are zero. block: key positions
    per block (oospec.engine.padded.BLOCK)."""
    heads, rows, dim = q.shape
    kv_heads = k.shape[0]
    group = heads // kv_heads
    if k.stride(-1) != 1 or v.stride(-1) != 1 or q.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.zeros(rows, heads, dim, dtype=q.dtype, device=q.device)
    _rowwise_kernel[(real_rows or rows, kv_heads)](
        q, k, v, out, tree_slots, lengths, float(scale), k.shape[1] - rows, rows, k.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), DIM=dim, BLK=block,
    )
    return out
