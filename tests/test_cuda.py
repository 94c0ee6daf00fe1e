"""The invariant forward on a CUDA GPU (oospec.engine.padded with its Triton kernel): bitwise row invariance,
speculative output equal to plain greedy under adversarial drafters, in bfloat16 and float32.

Marked `gpu`: deselected by `make test`, run by `make test-gpu` on a machine with CUDA and Triton, where a
missing GPU is a failure, not a skip. Results of a run: experiments/results/gpu-h200/."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adversarial import DecoyOracleDrafter, HugeTreeDrafter, RandomTreeDrafter
from helpers import VOCAB, save_tiny_qwen2, tiny_model, tree_mask

from oospec.engine import padded
from oospec.engine.decode import generate
from oospec.engine.drafting import Drafter, Request
from oospec.engine.precision import load_target, probe, random_tree
from oospec.engine.target import TargetBackend

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float32]


@pytest.fixture(scope="module", autouse=True)
def cuda():
    assert torch.cuda.is_available(), "make test-gpu needs a CUDA GPU"


def gpu_model(arch: str, dtype: torch.dtype):
    model = tiny_model(arch).to(dtype).to("cuda")
    report = padded.install(model)
    assert report["applied"] and "triton" in report["kernels"], report
    return model


@pytest.mark.parametrize("start", [5, 64, 100, 300])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_attention_is_the_reference_algorithm(start, dtype):
    from oospec.engine.rowwise_triton import rowwise_attention_triton

    g = torch.Generator(device="cuda").manual_seed(start)
    heads, kv_heads, dim, rows = 12, 2, 128, 64
    tree = random_tree(np.random.default_rng(start), 20, VOCAB)
    mask = tree_mask(tree, start, rows).to("cuda")
    q = torch.randn(heads, rows, dim, generator=g, device="cuda").to(dtype)
    k = torch.randn(kv_heads, start + rows, dim, generator=g, device="cuda").to(dtype)
    v = torch.randn(kv_heads, start + rows, dim, generator=g, device="cuda").to(dtype)
    slots, lengths = padded.compact_rows(mask, rows, start + rows)
    out = rowwise_attention_triton(q, k, v, slots, lengths, dim ** -0.5, 21, block=padded.BLOCK)
    ref = padded.attention_reference(q, k, v, slots, lengths, dim ** -0.5, 21)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), ref.float(), atol=tol)
    assert not out[21:].any()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_probe_sees_every_tree_row_bitwise_equal_on_the_gpu(arch, dtype):
    result = probe(gpu_model(arch, dtype), prompt_len=100)
    assert result.invariant, result.detail


@pytest.mark.parametrize("dtype", DTYPES)
def test_speculative_output_is_plain_greedy_on_the_gpu(dtype):
    target = TargetBackend(gpu_model("qwen2", dtype))
    rng = np.random.default_rng(2)
    for case in range(3):
        prompt = rng.integers(0, VOCAB, int(rng.integers(20, 400)))
        plain = generate(target, Drafter(), Request(prompt_ids=prompt, max_new_tokens=64)).tokens
        for drafter in (RandomTreeDrafter(VOCAB, case), HugeTreeDrafter(VOCAB, case),
                        DecoyOracleDrafter(plain, VOCAB, case)):
            out = generate(target, drafter, Request(prompt_ids=prompt, max_new_tokens=64, budget=63)).tokens
            assert np.array_equal(out, plain), (case, drafter.name)


def test_load_target_on_cuda_is_bfloat16_padded_and_probed(tmp_path, home):
    import warnings

    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a BatchVarianceWarning would fail here
        model, _, note = load_target(save_tiny_qwen2(tmp_path / "m", hidden_size=64), device="cuda", say=said.append)
    assert model.dtype == torch.bfloat16 and model.oospec_invariant["padded"]
    assert "bitwise equal at every layer" in note and said and "bfloat16" in said[0]
    assert TargetBackend(model).step_rows == padded.STEP_ROWS
