"""Token trees from drafters' candidates: the one trie builder, under a budget and a cost model, and pruning."""

import numpy as np

from oospec.engine.budget import ONE_THREAD_CPU_CURVE, CostModel, SampledAcceptance
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
    cost = CostModel.from_curve(ONE_THREAD_CPU_CURVE)
    sure = build_tree(cands, 16, cost)
    unsure = build_tree(cands, 16, cost, discount=0.5)
    assert len(sure) >= 12 and 0 < len(unsure) <= len(sure) // 3
    assert np.array_equal(unsure.tokens, sure.tokens[: len(unsure)])  # the same nodes, cut sooner
    assert len(build_tree(cands, 16, None, discount=0.1)) == 16  # order-ranked trees take no discount
