"""The CUDA-graph path on a CUDA GPU (oospec.engine.cuda_graphs): the static-shape Triton kernel against the padded
forward's, captured forwards bitwise equal to the padded forward, speculative output equal to plain greedy.

Marked `gpu`: deselected by `make test`, run by `make test-gpu`, where a missing GPU is a failure, not a skip.
Written without a GPU at hand: its first run on one is also the first test of the graph path on hardware."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from adversarial import DecoyOracleDrafter, HugeTreeDrafter, RandomTreeDrafter
from helpers import VOCAB, tiny_model

from oospec.engine import padded
from oospec.engine.acceptance import greedy_accept
from oospec.engine.cuda_graphs import GraphTargetBackend, StaticInputs
from oospec.engine.decode import generate
from oospec.engine.drafting import Drafter, Request
from oospec.engine.precision import random_tree
from oospec.engine.target import TargetBackend

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float32]


@pytest.fixture(scope="module", autouse=True)
def cuda():
    assert torch.cuda.is_available(), "make test-gpu needs a CUDA GPU"


def gpu_model(dtype: torch.dtype):
    model = tiny_model("qwen2").to(dtype).to("cuda")
    assert padded.install(model)["applied"]
    return model


@pytest.mark.parametrize("start", [5, 64, 300])
@pytest.mark.parametrize("dtype", DTYPES)
def test_static_kernel_is_bitwise_the_padded_kernel(start, dtype):
    from oospec.engine.rowwise_triton import rowwise_attention_triton
    from oospec.engine.rowwise_triton_static import static_kernel

    g = torch.Generator(device="cuda").manual_seed(start)
    heads, kv_heads, dim, rows, capacity = 12, 2, 128, 64, 1024
    tree = random_tree(np.random.default_rng(start), 20, VOCAB)
    static = StaticInputs(rows, capacity, torch.device("cuda"), dtype)
    static.fill(3, tree, start)
    q = torch.randn(heads, rows, dim, generator=g, device="cuda").to(dtype)
    k = torch.randn(kv_heads, capacity, dim, generator=g, device="cuda").to(dtype)  # beyond start+rows: never read
    v = torch.randn(kv_heads, capacity, dim, generator=g, device="cuda").to(dtype)
    out = static_kernel(q, k, v, static, dim ** -0.5)
    ref = rowwise_attention_triton(q, k[:, : start + rows], v[:, : start + rows], static.tree_slots, static.lengths,
                                   dim ** -0.5, static.real_rows, block=padded.BLOCK)
    assert torch.equal(out[: static.real_rows], ref[: static.real_rows])


@pytest.mark.parametrize("dtype", DTYPES)
def test_replayed_forwards_are_bitwise_the_padded_forward(dtype):
    model = gpu_model(dtype)
    graph, eager = GraphTargetBackend(model), TargetBackend(model)
    assert graph.uses_graphs, graph.graph_reason
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, VOCAB, 150)
    for b in (graph, eager):
        b.reset(400)
    pending = graph.prefill(prompt)
    assert eager.prefill(prompt) == pending
    for _ in range(8):
        tree = random_tree(rng, int(rng.integers(1, 64)), VOCAB)
        lg, le = graph.verify_logits(pending, tree), eager.verify_logits(pending, tree)
        assert torch.equal(lg, le)
        path, pending = greedy_accept(tree, lg.argmax(-1).cpu().numpy())
        graph.commit(path)
        eager.commit(path)
    assert graph.captures == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_speculative_output_through_graphs_is_plain_greedy(dtype):
    model = gpu_model(dtype)
    plain_target, graph = TargetBackend(model), GraphTargetBackend(model)
    rng = np.random.default_rng(2)
    for case in range(3):
        prompt = rng.integers(0, VOCAB, int(rng.integers(20, 400)))
        request = Request(prompt_ids=prompt, eos_ids=frozenset(), max_new_tokens=64)
        plain = generate(plain_target, Drafter(), request).tokens
        assert np.array_equal(generate(graph, Drafter(), request).tokens, plain)
        for drafter in (RandomTreeDrafter(VOCAB, case), HugeTreeDrafter(VOCAB, case),
                        DecoyOracleDrafter(plain, VOCAB, case)):
            out = generate(graph, drafter, replace(request, budget=63)).tokens
            assert np.array_equal(out, plain), (case, drafter.name)
