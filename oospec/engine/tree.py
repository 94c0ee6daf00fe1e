"""Token trees: the draft format every drafter proposes and the target verifies in one forward pass.

A tree hangs below the *pending* token (the last token the target produced, not yet in the KV cache).
Nodes are stored flat in topological order (a parent always comes before its children), so a node's
attention row is its parent's row plus itself, and acceptance is one pass from first to last node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

ROOT = -1  # parent index of first-level nodes: they follow the pending token directly


@dataclass(frozen=True)
class TokenTree:
    """Draft tokens arranged as a tree below the pending token. Empty means nothing to propose."""

    tokens: np.ndarray  # (n,) int64 draft token ids
    parents: np.ndarray  # (n,) int32 index of each node's parent, ROOT for first-level nodes; parents[i] < i
    depths: np.ndarray = field(init=False)  # (n,) int32 1 for first-level nodes

    def __post_init__(self):
        tokens = np.ascontiguousarray(self.tokens, dtype=np.int64).reshape(-1)
        parents = np.ascontiguousarray(self.parents, dtype=np.int32).reshape(-1)
        if tokens.shape != parents.shape:
            raise ValueError(f"tree has {tokens.size} tokens but {parents.size} parents")
        if parents.size and np.any(parents >= np.arange(parents.size)):
            raise ValueError("tree nodes must be in topological order (parents[i] < i)")
        if parents.size and parents.min() < ROOT:
            raise ValueError("tree parent index below ROOT")
        depths = np.empty(parents.size, dtype=np.int32)
        for i, p in enumerate(parents.tolist()):
            depths[i] = 1 if p == ROOT else depths[p] + 1
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "depths", depths)

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if self.depths.size else 0

    @classmethod
    def empty(cls) -> TokenTree:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32))

    @classmethod
    def chain(cls, tokens: Sequence[int] | np.ndarray) -> TokenTree:
        n = len(tokens)
        return cls(np.asarray(tokens, dtype=np.int64), np.arange(-1, n - 1, dtype=np.int32))

    def pruned(self, budget: int, max_depth: int) -> TokenTree:
        """Keep the first `budget` nodes no deeper than `max_depth` (topological order keeps it a tree)."""
        if len(self) <= budget and self.max_depth <= max_depth:
            return self
        keep = np.flatnonzero(self.depths <= max_depth)
        # A node is kept only if its parent is (true for a depth cut); then the first `budget` survivors.
        keep = keep[:budget]
        remap = np.full(len(self), ROOT, dtype=np.int32)
        remap[keep] = np.arange(keep.size, dtype=np.int32)
        old_parents = self.parents[keep]
        new_parents = np.where(old_parents == ROOT, ROOT, remap[np.maximum(old_parents, 0)])
        return TokenTree(self.tokens[keep], new_parents)

    def ancestor_mask(self) -> np.ndarray:
        """(n+1, n+1) bool: row i may attend column j. Row/column 0 is the pending token, node k is k+1."""
        n = len(self)
        mask = np.zeros((n + 1, n + 1), dtype=bool)
        mask[:, 0] = True
        rows = self.parents + 1  # parent's row in the (n+1) layout; ROOT maps to the pending token's row
        for i in range(n):
            mask[i + 1, : i + 1] = mask[rows[i], : i + 1]
            mask[i + 1, i + 1] = True
        return mask

    def path_to(self, node: int) -> np.ndarray:
        """Node indices from the first level down to `node`, inclusive."""
        path = []
        while node != ROOT:
            path.append(node)
            node = int(self.parents[node])
        return np.asarray(path[::-1], dtype=np.int64)
