"""GGUF weights inside the invariant linear: each block dequantizes to gguf-py's float32 bits, and a product over
the raw blocks (`linear_quant`) is bitwise the invariant product over the expanded weight, for every type, both
dtypes, 1..64 rows and 1 or 2 threads.

The kernels under test are this process's build: the CPU's best instruction set, or the one
$OOSPEC_KERNEL_ISA caps it to (test_gguf_isas.py runs this file once per lower level)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from oospec.engine.invariant import TorchKernels
from oospec.engine.kernels import FORCE_ISA_ENV, native
from oospec.models.gguf_weights import SUPPORTED, Q

TYPES = sorted(SUPPORTED, key=int)
# The quantized types, which the loader regroups by 16 rows (kernels/repack.h); plain floats keep their rows.
REGROUPED = [t for t in TYPES if t not in (Q.F32, Q.F16, Q.BF16)]
DTYPES = (torch.float32, torch.bfloat16)
# Byte offsets of each block's float16 scales: random blocks get finite ones there (a NaN scale is garbage in,
# and NaN payloads are not what this compares).
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
# Scales at the edges of float16: subnormal, the largest, negative, zero, ordinary.
EDGE_SCALES = np.array([2 ** -24, 3 * 2 ** -20, 6.1e-5, 65504.0, -65504.0, -0.0, 0.0, -0.0123, 0.07, 1.5],
                       np.float16)


@pytest.fixture(scope="module")
def cxx():
    module = native()
    assert module is not None, "the C++ invariant kernels did not build (see the logged reason)"
    return module


def bits(t) -> np.ndarray:
    t = t.numpy() if isinstance(t, torch.Tensor) and t.dtype != torch.bfloat16 else t
    if isinstance(t, torch.Tensor):  # bfloat16: numpy has none, compare its 16-bit patterns
        return t.contiguous().view(torch.int16).numpy()
    return np.ascontiguousarray(t).view(np.uint8)


def random_blocks(qtype, rows: int, k: int, rng, scales: np.ndarray | None = None) -> np.ndarray:
    """uint8 [rows, row bytes]: random quants; float16 scales drawn from `scales` (default: ordinary weights)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F32, Q.F16, Q.BF16):  # plain floats: gguf-py's own conversion of random finite values
        return quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype).view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows, k // block, size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        pick = rng.uniform(-0.05, 0.05, raw.shape[:2]) if scales is None else rng.choice(scales, raw.shape[:2])
        raw[:, :, offset:offset + 2] = pick.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def weights(qtype, rows: int, k: int, seed: int) -> np.ndarray:
    """Blocks as a model has them: gguf-py's quantization of random weights where gguf-py can quantize the type,
    else random quants with ordinary scales."""
    rng = np.random.default_rng(seed)
    try:
        return quantize((rng.standard_normal((rows, k)) * 0.05).astype(np.float32), qtype).view(np.uint8)
    except NotImplementedError:  # gguf-py dequantizes the K-quants but does not quantize them
        return random_blocks(qtype, rows, k, rng)


def test_the_kernels_are_the_build_this_process_asked_for(cxx):
    forced = os.environ.get(FORCE_ISA_ENV)
    if forced:
        assert cxx.isa() == forced, f"{FORCE_ISA_ENV}={forced} but the kernels report {cxx.isa()}"
    assert cxx.isa() in ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "scalar")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_block_dequantizes_to_gguf_py_bit_for_bit(cxx, qtype):
    rng = np.random.default_rng(int(qtype))
    k = 512  # two K-quant super-blocks, sixteen 32-blocks
    samples = [weights(qtype, 19, k, int(qtype)), random_blocks(qtype, 19, k, rng)]
    if qtype in F16_FIELDS:
        samples.append(random_blocks(qtype, 19, k, rng, EDGE_SCALES))
    for raw in samples:
        ref = dequantize(raw, qtype).reshape(raw.shape[0], k)
        got = cxx.dequantize(torch.from_numpy(raw), int(qtype), k)
        assert got.dtype == torch.float32 and np.array_equal(bits(got), bits(ref)), f"{qtype.name} differs"
        # the pure-torch kernels' fallback is gguf-py itself
        assert np.array_equal(bits(TorchKernels().dequantize(torch.from_numpy(raw), int(qtype), k)), bits(ref))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_the_product_over_blocks_is_the_expanded_product_for_every_row_count(cxx, qtype, dtype):
    """1280 k: three float32 chunks of the tile loop (512, 512, 256) and two bfloat16 ones; 67 outputs: a short
    last panel. Every m in 1..64 rows gives each row the bits it has in the 64-row product and alone."""
    n, k = 67, 1280
    raw = weights(qtype, n, k, 7 + int(qtype))
    g = torch.Generator().manual_seed(int(qtype))
    x = torch.randn(64, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    w = torch.from_numpy(dequantize(raw, qtype).reshape(n, k)).to(dtype)  # the expanded model's weight
    blocks = torch.from_numpy(raw)
    full = cxx.linear_quant(x, blocks, int(qtype), bias)
    assert np.array_equal(bits(full), bits(cxx.linear(x, w, bias))), "64 rows differ from the expanded product"
    for m in range(1, 65):
        assert np.array_equal(bits(cxx.linear_quant(x[:m].contiguous(), blocks, int(qtype), bias)), bits(full[:m])), m
        alone = cxx.linear_quant(x[m - 1:m].contiguous(), blocks, int(qtype), bias)
        assert np.array_equal(bits(alone), bits(full[m - 1:m])), f"row {m - 1} alone"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_product_over_blocks_does_not_depend_on_the_thread_count(cxx, dtype):
    qtype, n, k = Q.Q4_K, 301, 1024  # 301 outputs: many panel groups, split over both threads
    blocks = torch.from_numpy(weights(qtype, n, k, 3))
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cxx.linear_quant(x, blocks, int(qtype), None)
        torch.set_num_threads(2)
        two = cxx.linear_quant(x, blocks, int(qtype), None)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(bits(one), bits(two))


def test_the_pure_torch_kernels_give_their_own_expanded_product():
    ops, qtype, n, k = TorchKernels(), Q.Q4_1, 21, 64
    raw = weights(qtype, n, k, 5)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5))
    w = torch.from_numpy(dequantize(raw, qtype).reshape(n, k))
    assert torch.equal(ops.linear_quant(x, torch.from_numpy(raw), int(qtype), None), ops.linear(x, w, None))


def _fused(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A Q4_K product with the dequantization folded into it, llama.cpp's way: per sub-block
    (d sc) * sum(x q) - (dmin m) * sum(x), in float32, sums in k order. Not the expanded model's bits."""
    from gguf.quants import Q4_K

    d = raw[:, :, 0:2].copy().view(np.float16).astype(np.float32)  # [n, blocks, 1]
    dmin = raw[:, :, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(raw[:, :, 4:16].reshape(-1, 12))
    sc = sc.reshape(*raw.shape[:2], 8).astype(np.float32)
    m = m.reshape(*raw.shape[:2], 8).astype(np.float32)
    qs = raw[:, :, 16:].reshape(*raw.shape[:2], 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 15).reshape(raw.shape[0], -1, 32).astype(np.float32)  # [n, sub-blocks, 32]
    xs = x.reshape(x.shape[0], -1, 32)  # [rows, sub-blocks, 32]
    out = np.zeros((x.shape[0], raw.shape[0]), np.float32)
    for i in range(x.shape[0]):
        for j in range(raw.shape[0]):
            acc = np.float32(0)
            for s in range(q.shape[1]):
                b, t = divmod(s, 8)
                xq = np.float32(0)
                xsum = np.float32(0)
                for e in range(32):
                    xq = np.float32(xq + xs[i, s, e] * q[j, s, e])
                    xsum = np.float32(xsum + xs[i, s, e])
                ds = np.float32(d[j, b, 0] * sc[j, b, t])
                dm = np.float32(dmin[j, b, 0] * m[j, b, t])
                acc = np.float32(acc + np.float32(ds * xq) - np.float32(dm * xsum))
            out[i, j] = acc
    return out


def test_dequantization_is_neither_contracted_nor_folded_into_the_product(cxx):
    """Two ways to lose the expanded bits, checked on Q4_K (K-quants' (d sc) q - dmin m, the shipped target's type).

    Contraction inside an element, fma(d sc, q, -dmin m) for two roundings: every product there is exact in
    float32 (a float16 scale has 11 significant bits, sc and m 6, q 4: at most 21), so only the final subtract
    rounds and the fused form gives the same bits. Asserted here over all blocks, edge scales included: if a
    type ever breaks that (float32 scales, grid values), this fails first and says why.

    Folding the dequantization into the product (scales applied to partial sums, as llama.cpp's dot products
    do) does change the bits: the data here make such a kernel differ, and linear_quant must not."""
    qtype, n, k = Q.Q4_K, 16, 512
    rng = np.random.default_rng(11)
    raw = random_blocks(qtype, n, k, rng, EDGE_SCALES)
    ordinary = random_blocks(qtype, n, k, rng)
    for blocks in (raw, ordinary):
        from gguf.quants import Q4_K

        b3 = blocks.reshape(n, -1, 144)
        d = b3[:, :, 0:2].copy().view(np.float16).astype(np.float64)
        dmin = b3[:, :, 2:4].copy().view(np.float16).astype(np.float64)
        sc, m = (a.reshape(n, -1, 8).astype(np.float64) for a in Q4_K.get_scale_min(b3[:, :, 4:16].reshape(-1, 12)))
        ds, dm = d * sc, dmin * m  # exact in float64; exact in float32 too iff these round-trip
        assert np.array_equal(ds.astype(np.float32).astype(np.float64), ds)
        assert np.array_equal(dm.astype(np.float32).astype(np.float64), dm)
        qs = b3[:, :, 16:].reshape(n, -1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        q = (qs & 15).reshape(n, -1, 8, 32).astype(np.float64)
        one_rounding = (ds[..., None] * q - dm[..., None]).astype(np.float32).reshape(n, k)  # what an FMA gives
        assert np.array_equal(one_rounding.view(np.uint32), dequantize(blocks, qtype).reshape(n, k).view(np.uint32))

    x = torch.randn(2, k, generator=torch.Generator().manual_seed(11))
    expanded = cxx.linear(x, torch.from_numpy(dequantize(ordinary, qtype).reshape(n, k)), None)
    fused = _fused(ordinary.reshape(n, -1, 144), x.numpy())
    assert not np.array_equal(bits(fused), bits(expanded)), "the data cannot tell a folded product apart"
    assert np.array_equal(bits(cxx.linear_quant(x, torch.from_numpy(ordinary), int(qtype), None)), bits(expanded))


def test_blocks_that_do_not_fill_the_rows_are_refused(cxx):
    raw = torch.zeros(4, 144, dtype=torch.uint8)  # one Q4_K super-block per row: K = 256
    with pytest.raises(RuntimeError, match="do not fill rows"):
        cxx.linear_quant(torch.zeros(1, 255), raw, int(Q.Q4_K), None)
    with pytest.raises(RuntimeError, match="not one these kernels read"):
        cxx.linear_quant(torch.zeros(1, 256), raw, int(Q.Q2_K), None)


@pytest.mark.parametrize("qtype", REGROUPED, ids=lambda t: t.name)
def test_regrouped_blocks_dequantize_to_gguf_py_bit_for_bit(cxx, qtype):
    """Every element of the 16-row regrouping (scales a, b and quants split into planes) is gguf-py's, signed
    zeros included (a negative scale times a zero quant), over model-like, random and edge-scale blocks; 35
    rows: a last panel with 3 rows."""
    rng = np.random.default_rng(100 + int(qtype))
    k = 512
    samples = [weights(qtype, 35, k, int(qtype)), random_blocks(qtype, 35, k, rng),
               random_blocks(qtype, 35, k, rng, EDGE_SCALES)]
    for raw in samples:
        ref = dequantize(raw, qtype).reshape(raw.shape[0], k)
        packed = cxx.repack_quant(torch.from_numpy(raw), int(qtype), k)
        rows = torch.arange(raw.shape[0])
        got = cxx.dequantize_repacked(packed, int(qtype), raw.shape[0], k, rows.flip(0)).flip(0)
        assert np.array_equal(bits(got), bits(ref)), f"{qtype.name} differs"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("qtype", REGROUPED, ids=lambda t: t.name)
def test_the_product_over_regrouped_blocks_is_the_expanded_product_for_every_row_count(cxx, qtype, dtype):
    n, k = 67, 1280  # as for the file's own blocks: chunk edges and a short last panel
    raw = weights(qtype, n, k, 17 + int(qtype))
    g = torch.Generator().manual_seed(int(qtype))
    x = torch.randn(64, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    w = torch.from_numpy(dequantize(raw, qtype).reshape(n, k)).to(dtype)
    packed = cxx.repack_quant(torch.from_numpy(raw), int(qtype), k)
    full = cxx.linear_repacked(x, packed, int(qtype), n, bias)
    assert np.array_equal(bits(full), bits(cxx.linear(x, w, bias))), "64 rows differ from the expanded product"
    for m in range(1, 65):
        part = cxx.linear_repacked(x[:m].contiguous(), packed, int(qtype), n, bias)
        assert np.array_equal(bits(part), bits(full[:m])), m
        alone = cxx.linear_repacked(x[m - 1:m].contiguous(), packed, int(qtype), n, bias)
        assert np.array_equal(bits(alone), bits(full[m - 1:m])), f"row {m - 1} alone"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_product_over_regrouped_blocks_does_not_depend_on_the_thread_count(cxx, dtype):
    qtype, n, k = Q.Q6_K, 301, 1024
    packed = cxx.repack_quant(torch.from_numpy(weights(qtype, n, k, 4)), int(qtype), k)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(4)).to(dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cxx.linear_repacked(x, packed, int(qtype), n, None)
        torch.set_num_threads(2)
        two = cxx.linear_repacked(x, packed, int(qtype), n, None)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(bits(one), bits(two))


def test_a_block_scale_that_is_not_finite_is_not_regrouped(cxx):
    raw = random_blocks(Q.Q4_K, 16, 256, np.random.default_rng(0))
    raw[3, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(RuntimeError, match="not finite"):
        cxx.repack_quant(torch.from_numpy(raw), int(Q.Q4_K), 256)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_sharing_one_call_each_get_their_own_products(cxx, dtype):
    # q, k and v (gate and up) in one pool of work: mixed types, with and without a bias, a short last panel, row
    # counts on both sides of each tile path, 1 and 2 threads; each output must be its own call's bits
    k, mix = 1024, [(Q.Q4_K, 67, True), (Q.Q6_K, 16, False), (Q.Q4_0, 33, True), (Q.Q8_0, 5, False)]
    packed, types, ns, biases = [], [], [], []
    g = torch.Generator().manual_seed(5)
    for i, (qtype, n, has_bias) in enumerate(mix):
        packed.append(cxx.repack_quant(torch.from_numpy(weights(qtype, n, k, 40 + i)), int(qtype), k))
        types.append(int(qtype))
        ns.append(n)
        biases.append(torch.randn(n, generator=g).to(dtype) if has_bias else None)
    x = torch.randn(70, k, generator=g).to(dtype)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (1, 2, 16, 17, 32, 33, 64, 70):
                xm = x[:m].contiguous()
                together = cxx.linear_repacked_many(xm, packed, types, ns, biases)
                for j in range(len(mix)):
                    alone = cxx.linear_repacked(xm, packed[j], types[j], ns[j], biases[j])
                    assert np.array_equal(bits(together[j]), bits(alone)), (threads, m, mix[j])
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match="not \\["):
        cxx.linear_repacked_many(x, packed[:2], types[:2], [ns[0], ns[0]], biases[:2])
