"""The one chain vLLM verifies, chosen from oospec's merged candidates.

vLLM verifies a chain per request, not a tree. The candidates of all drafters are merged into one trie (shared
prefixes are one node, a node weighs what the strongest candidate through it says: the probability that the
target accepts at least up to it); the chain kept is the root path, cut at any depth, with the largest expected
tokens per step over the cost of verifying it: (1 + sum of its weights) / c(length + 1). It may be empty.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oospec.engine.budget import CostModel
from oospec.engine.drafting import Candidate


def best_chain(candidates: Sequence[Candidate], max_len: int, cost: CostModel) -> list[int]:
    """At most `max_len` token ids (Python ints), the best cut of the best path; [] when nothing pays."""
    if max_len <= 0 or not candidates:
        return []
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    weights: list[float] = []
    for cand in candidates:
        parent = -1
        chain = cand.tokens[:max_len]
        for tok, w in zip(chain.tolist(), cand.weights()[: chain.size].tolist()):
            node = index.get((parent, tok))
            if node is None:
                node = index[(parent, tok)] = len(tokens)
                tokens.append(int(tok))
                parents.append(parent)
                weights.append(w)
            elif w > weights[node]:
                weights[node] = w
            parent = node
    if not tokens:
        return []
    # Nodes are created after their parents, so one pass in creation order sees every parent first.
    # A child is capped by its parent (acceptance never grows along a path) and accumulates its path's weight.
    total = [0.0] * len(tokens)
    depth = [0] * len(tokens)
    for i, p in enumerate(parents):
        if p >= 0:
            weights[i] = min(weights[i], weights[p])
            total[i], depth[i] = total[p] + weights[i], depth[p] + 1
        else:
            total[i], depth[i] = weights[i], 1
    score = (1.0 + np.asarray(total)) / cost.cost(np.asarray(depth) + 1)
    best = int(np.argmax(score))  # ties: the earliest node, i.e. the earlier (higher-ranked) candidate
    if score[best] <= 1.0 / float(cost.cost(1)):
        return []
    chain = []
    while best >= 0:
        chain.append(tokens[best])
        best = parents[best]
    return chain[::-1]
