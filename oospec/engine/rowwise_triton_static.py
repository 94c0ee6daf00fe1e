"""The row-wise attention of `oospec.engine.rowwise_triton` for captured forwards (oospec.engine.cuda_graphs):
the same per-row algorithm, with the cache length read from device memory and the key loop running to the
buffer's capacity, so that nothing the host knows only at run time is baked into a graph. Blocks past a row's
keys are all masked and change nothing (alpha = exp(0) = 1, p = 0): a row's result is bitwise the padded
forward's. UNTESTED ON GPU HARDWARE (no Triton on the CPU test machines); tests/gpu_graph_check.py compares it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oospec.engine.padded import BLOCK


@triton.jit
def _rowwise_static_kernel(Q, K, V, O, TREE, LENS, START, scale, rows, capacity,
                           s_qh, s_qr, s_kh, s_kl, s_vh, s_vl, s_or, s_oh,
                           GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, BLK: tl.constexpr):
    r = tl.program_id(0)
    g = tl.program_id(1)
    start = tl.load(START)
    heads = g * GROUP + tl.arange(0, GROUP_PAD)
    in_group = tl.arange(0, GROUP_PAD) < GROUP
    d = tl.arange(0, DIM)
    q = tl.load(Q + heads[:, None] * s_qh + r * s_qr + d[None, :], mask=in_group[:, None], other=0.0).to(tl.float32)
    n = tl.load(LENS + r)
    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    total = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, DIM), tl.float32)
    for a in range(0, capacity, BLK):
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


def static_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, static, scale: float) -> torch.Tensor:
    """q (heads, rows, dim), k/v (kv_heads, capacity, dim) -> (rows, heads, dim); every row computed (padding
    rows see the prefix only), `static` holding the compacted tree slots, key counts and the cache length."""
    heads, rows, dim = q.shape
    kv_heads, capacity = k.shape[0], k.shape[1]
    group = heads // kv_heads
    if k.stride(-1) != 1 or v.stride(-1) != 1 or q.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty(rows, heads, dim, dtype=q.dtype, device=q.device)
    _rowwise_static_kernel[(rows, kv_heads)](
        q, k, v, out, static.tree_slots, static.lengths, static.start, float(scale), rows, capacity,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), DIM=dim, BLK=BLOCK,
    )
    return out
