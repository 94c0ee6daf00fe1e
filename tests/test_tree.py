"""Token trees from drafters' candidates: the one trie builder, under a budget and a cost model, and pruning."""

import numpy as np
import pytest

from oospec.engine.budget import CostModel, SampledAcceptance

# A steep CPU curve (the 1.5B's in float32 on one thread before the packed kernels): fixed here, so that these
# tests do not move when the measured defaults do.
STEEP_CURVE = {1: 1.0, 2: 1.4, 4: 1.7, 8: 2.44, 16: 3.63}
from oospec.engine.drafting import Candidate, build_tree


def test_build_tree_respects_budget_and_cost():
    cands = [Candidate(np.arange(10, 20), 0.9, 0.95), Candidate(np.array([10, 11, 99]), 0.5, 0.9),
             Candidate(np.arange(30, 40), 0.2, 0.5)]
    free = build_tree(cands, 64, CostModel.flat())
    assert len(free) == 10 + 1 + 10  # shared prefix [10, 11] counted once
    capped = build_tree(cands, 5, CostModel.flat())
    assert len(capped) == 5 and capped.max_depth == 5  # the surest chain first
    steep = build_tree(cands, 64, CostModel.from_curve({1: 1.0, 2: 2.0, 64: 64.0}))
    assert len(steep) <= 1  # verifying a token costs a whole forward: only a near-certain one pays
    # Always a valid tree (parents before children), whatever was cut.
    for tree in (free, capped, steep):
        assert np.all(tree.parents < np.arange(len(tree)))


def test_tree_pruned_keeps_tree_shape():
    tree = build_tree([Candidate(np.array(s)) for s in ([1, 2, 3, 4], [1, 5, 6], [7])], budget=10)
    pruned = tree.pruned(budget=4, max_depth=2)
    assert len(pruned) == 4 and pruned.max_depth == 2
    assert np.all(pruned.parents < np.arange(len(pruned)))


def test_sampled_acceptance_discount_shrinks_trees():
    """When sampling, nodes are discounted by the learnt p_max per level: less sure targets get smaller trees."""
    meter = SampledAcceptance()
    assert meter.discount == 1.0  # greedy's weights until something is observed
    for peak in (0.5, 0.5, 0.5):
        meter.observe(peak)
    assert meter.discount == (1.0 + 1.5) / 4
    cands = [Candidate(np.arange(10, 26), 0.95, 0.97), Candidate(np.array([10, 50, 51]), 0.4, 0.9)]
    cost = CostModel.from_curve(STEEP_CURVE)
    sure = build_tree(cands, 16, cost)
    unsure = build_tree(cands, 16, cost, discount=0.5)
    assert len(sure) >= 12 and 0 < len(unsure) <= len(sure) // 3
    assert np.array_equal(unsure.tokens, sure.tokens[: len(unsure)])  # the same nodes, cut sooner
    assert len(build_tree(cands, 16, None, discount=0.1)) == 16  # order-ranked trees take no discount


@pytest.mark.parametrize("amx", [False, True])
def test_the_default_curve_follows_the_targets_dtype_and_threads(amx, monkeypatch):
    import torch

    from oospec.engine import budget
    from oospec.engine.budget import CPU_CURVES, default_cost_model

    monkeypatch.setattr(budget, "kernel_isa", lambda: "amx_bf16" if amx else "avx512_bf16")  # any CPU alike
    bf16 = "bfloat16-amx" if amx else "bfloat16"
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for dtype, name in ((torch.bfloat16, bf16), (torch.float32, "float32"), (None, "float32")):
            cost = default_cost_model(dtype)
            assert np.allclose(cost.cost(16), CPU_CURVES[name, 2][16]), name
        assert np.allclose(default_cost_model(torch.bfloat16, "cuda").cost(16), CPU_CURVES["float32", 2][16])
        torch.set_num_threads(1)
        assert np.allclose(default_cost_model(torch.bfloat16).cost(16), CPU_CURVES[bf16, 1][16])
    finally:
        torch.set_num_threads(before)
    assert CPU_CURVES[bf16, 2][16] != CPU_CURVES["float32", 2][16]  # else the dtype would not matter
    assert CPU_CURVES["bfloat16-amx", 2][16] < CPU_CURVES["bfloat16", 2][16]  # tiles: rows nearly free


@pytest.mark.parametrize("isa,dtype", [("amx_bf16", "bfloat16"), ("avx512_bf16", "bfloat16"),
                                       ("avx512f", "float32"), ("avx2", "float32")])
def test_a_gguf_target_takes_its_kernel_paths_own_curve(isa, dtype, monkeypatch):
    import torch

    from oospec.engine import budget
    from oospec.engine.budget import CPU_CURVES, CostModel, default_cost_model

    monkeypatch.setattr(budget, "kernel_isa", lambda: isa)
    own = CPU_CURVES[f"gguf-{dtype}-{isa}", 2]
    got = default_cost_model(getattr(torch, dtype), threads=2, quantized=True)
    assert np.allclose(got.cost(np.arange(1, 65)), CostModel.from_curve(own).cost(np.arange(1, 65)))
    dense = default_cost_model(getattr(torch, dtype), threads=2)  # the same path without GGUF blocks
    assert not np.allclose(got.cost(16), dense.cost(16))
    monkeypatch.setattr(budget, "kernel_isa", lambda: "scalar")  # a path never measured: the dense curve
    assert np.allclose(default_cost_model(getattr(torch, dtype), threads=2, quantized=True).cost(16),
                       default_cost_model(getattr(torch, dtype), threads=2).cost(16))


def test_a_gguf_targets_backend_reads_the_quantized_curve(monkeypatch):
    import torch
    from helpers import tiny_model

    from oospec.engine import budget
    from oospec.engine.budget import CPU_CURVES
    from oospec.engine.quantized import load_gguf_model
    from oospec.engine.target import TargetBackend
    from oospec.models.provision import pull_gguf

    monkeypatch.setattr(budget, "kernel_isa", lambda: "amx_bf16")
    model, _ = load_gguf_model(pull_gguf("smollm2-135m", progress=False), dtype=torch.bfloat16)
    assert np.allclose(TargetBackend(model).cost_model(2).cost(17), CPU_CURVES["gguf-bfloat16-amx_bf16", 2][17])
    dense = tiny_model("qwen2").to(torch.bfloat16)
    assert np.allclose(TargetBackend(dense).cost_model(2).cost(16), CPU_CURVES["bfloat16-amx", 2][16])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generate_gives_drafters_the_targets_curve_unless_the_request_has_one(dtype):
    """A request without a curve gets its target's (dtype, threads); one with a curve keeps it, and the merged
    drafters size their trees with it."""
    import torch
    from helpers import tiny_model

    from oospec.drafters.toolspec import ToolSpecDrafter
    from oospec.engine.decode import generate
    from oospec.engine.drafting import Request
    from oospec.engine.target import TargetBackend
    from oospec.engine.threads import torch_threads

    target = TargetBackend(tiny_model("qwen2").to(getattr(torch, dtype)))
    seen = []

    class Recording(ToolSpecDrafter):
        def start(self, request):
            super().start(request)
            seen.append(self.cost)

    prompt = np.arange(1, 9, dtype=np.int64)
    generate(target, Recording(), Request(prompt_ids=prompt, max_new_tokens=4))
    assert np.allclose(seen[-1].ratios, target.cost_model().ratios)
    mine = CostModel.from_curve({1: 1.0, 64: 1.0})
    generate(target, Recording(), Request(prompt_ids=prompt, cost=mine, max_new_tokens=4))
    assert seen[-1] is mine

    class Lending(Recording):  # an idle sidecar's thread: the target verifies on its own and that one
        def idle_threads(self):
            return 1

    with torch_threads(1):
        generate(target, Lending(), Request(prompt_ids=prompt, max_new_tokens=4))
        assert np.allclose(seen[-1].ratios, target.cost_model(2).ratios)
        assert not np.allclose(target.cost_model(2).ratios, target.cost_model(1).ratios)


def test_a_tree_leaves_room_for_slot_rows_worth_more_than_its_last_nodes():
    from oospec.engine.budget import beside_slot_rows, paying_rows

    step = CostModel.from_curve({1: 1.0, 16: 1.3, 17: 1.6, 64: 4.0})  # one x block holds 16 rows
    cands = [Candidate(np.arange(10, 40), 0.95, 0.85)]  # the last nodes of a long chain are weak
    full = build_tree(cands, 16, step)
    assert 12 <= len(full) <= 15  # at most 16 rows: the 17th costs a step its node does not pay for
    assert paying_rows(step, 16, wanted=6, credit=0.05) == 0  # beside 16 rows no row pays: the step
    joint = build_tree(cands, 16, beside_slot_rows(step, 17, wanted=6, credit=0.05))
    rows = paying_rows(step, len(joint) + 1, wanted=6, credit=0.05)
    assert len(joint) < len(full) and rows > 0 and len(joint) + 1 + rows <= 16  # rows in the tree's place
    # rows that save nothing change nothing: the same curve, the same tree
    assert np.allclose(beside_slot_rows(step, 17, 6, 0.0).cost(np.arange(1, 18)), step.cost(np.arange(1, 18)))
    assert len(build_tree(cands, 16, beside_slot_rows(step, 17, 6, 0.0))) == len(full)
    # rows worth a lot take the whole x block
    greedy = build_tree(cands, 16, beside_slot_rows(step, 17, wanted=6, credit=1.0))
    assert len(greedy) + 1 + paying_rows(step, len(greedy) + 1, 6, 1.0) >= 16
