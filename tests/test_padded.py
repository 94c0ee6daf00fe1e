"""The accelerators' invariant forward (oospec.engine.padded), on the CPU: padded forwards, masks, compacted
tree attention and the probe. The GEMMs' row invariance at one shape is the device BLAS's part, checked by the
probe where it runs (tests/test_cuda.py on a GPU); here the linears are the CPU's invariant ones, so a failure
below can only come from the padding or the attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from adversarial import DecoyOracleDrafter, HugeTreeDrafter, RandomTreeDrafter
from helpers import VOCAB, tiny_model, tree_mask

from oospec.engine import padded
from oospec.engine.decode import generate
from oospec.engine.drafting import Drafter, Request
from oospec.engine.invariant import TorchKernels
from oospec.engine.invariant import install as install_cpu
from oospec.engine.precision import probe
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree


def padded_model(arch: str, dtype: torch.dtype, kernel: str = "torch"):
    """A tiny model with row-invariant linears and norms (CPU kernels), then the padded forward on top."""
    model = tiny_model(arch).to(dtype)
    install_cpu(model, TorchKernels())
    del model.oospec_invariant
    report = padded.install(model, allow_cpu=True, kernel=kernel)
    assert report["applied"] and report["padded"], report
    return model


def test_compact_rows_lists_each_rows_keys_in_position_order():
    tree = TokenTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 2]))  # two branches; node 3 below 2 below 0
    mask = tree_mask(tree, start=10, rows=8)
    slots, lengths = padded.compact_rows(mask, 8, 18)
    assert lengths.tolist() == [11, 12, 12, 13, 14, 10, 10, 10]  # rows past the tree: the prefix only
    assert slots[4, :4].tolist() == [0, 1, 3, 4]  # node 3: pending, node 0, node 2, itself
    assert slots[2, :2].tolist() == [0, 2]  # node 1 hangs below the pending token, past node 0's slot


@pytest.mark.parametrize("start", [3, 63, 64, 130])  # the tree inside the first block, at and across its edge
def test_reference_attention_is_attention_and_skips_padding(start):
    g = torch.Generator().manual_seed(start)
    heads, kv_heads, dim, rows = 4, 2, 16, 12
    tree = TokenTree(np.arange(7), np.array([-1, 0, 1, -1, 3, 1, 5]))
    mask = tree_mask(tree, start, rows)
    q = torch.randn(heads, rows, dim, generator=g)
    k = torch.randn(kv_heads, start + rows, dim, generator=g)
    v = torch.randn(kv_heads, start + rows, dim, generator=g)
    slots, lengths = padded.compact_rows(mask, rows, start + rows)
    out = padded.attention_reference(q, k, v, slots, lengths, dim ** -0.5, real_rows=8)
    ref = F.scaled_dot_product_attention(q[None], k.repeat_interleave(2, 0)[None], v.repeat_interleave(2, 0)[None],
                                         attn_mask=mask)[0].transpose(0, 1)
    assert torch.allclose(out[:8], ref[:8], atol=1e-5)
    assert not out[8:].any()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_probe_sees_every_tree_row_bitwise_equal_to_its_decode_row(arch, dtype):
    result = probe(padded_model(arch, dtype), prompt_len=100)  # trees start mid-block
    assert result.invariant, result.detail


def test_probe_rejects_attention_that_depends_on_the_rows_in_the_forward():
    model = padded_model("qwen2", torch.float32)
    for layer in model.model.layers:
        honest = layer.self_attn.oospec_rowwise
        layer.self_attn.oospec_rowwise = lambda q, *a, honest=honest: honest(q, *a) * (1 + 1e-3 * a[-1])
    assert not probe(model, prompt_len=100).invariant


def test_padded_forward_matches_the_stock_forward_and_computes_real_rows_only():
    stock = tiny_model("llama")
    model = tiny_model("llama")
    padded.install(model, allow_cpu=True)
    calls = []
    for layer in model.model.layers:
        honest = layer.self_attn.oospec_rowwise
        layer.self_attn.oospec_rowwise = lambda *a, honest=honest: calls.append(a[-1]) or honest(*a)
    prompt = np.random.default_rng(0).integers(0, VOCAB, 70)
    tree = TokenTree(np.array([3, 4, 5]), np.array([-1, 0, -1]))
    logits = []
    for m in (stock, model):
        target = TargetBackend(m)
        target.reset(100)
        pending = target.prefill(prompt)
        logits.append(target.verify_logits(pending, tree))
    assert logits[1].shape == (4, VOCAB)
    assert torch.allclose(logits[0], logits[1], atol=1e-4)
    assert calls == [4, 4]  # the tagged mask reached the attention: the 60 padding rows were skipped
    assert TargetBackend(model).cost_model().cost(16) < 1.05  # one shape: nearly one cost


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_speculative_output_is_plain_greedy_under_adversarial_drafters(dtype):
    model = padded_model("qwen2", dtype)
    target = TargetBackend(model)
    rng = np.random.default_rng(1)
    for case in range(2):
        prompt = rng.integers(0, VOCAB, int(rng.integers(20, 140)))
        plain = generate(target, Drafter(), Request(prompt_ids=prompt, max_new_tokens=48)).tokens
        drafters = (RandomTreeDrafter(VOCAB, case), HugeTreeDrafter(VOCAB, case),
                    DecoyOracleDrafter(plain, VOCAB, case))
        for drafter in drafters:
            out = generate(target, drafter, Request(prompt_ids=prompt, max_new_tokens=48, budget=63)).tokens
            assert np.array_equal(out, plain), (case, drafter.name)
