"""Greedy acceptance: the one rule that makes speculative decoding lossless.

Glossary. The *target* is the model whose output we reproduce. A *draft* (token tree) is what drafters
propose. After one verification forward the target has a greedy choice after every tree node. The
*accepted tokens* are the longest root-to-node path whose every token equals the target's choice at its
parent; the *bonus token* is the target's own choice after the last accepted node. Every step therefore
produces len(accepted) + 1 tokens, exactly the tokens greedy decoding would have produced one by one.
"""

from __future__ import annotations

import numpy as np

from oospec.engine.tree import TokenTree


def greedy_accept(tree: TokenTree, target_choice: np.ndarray) -> tuple[np.ndarray, int]:
    """Return (accepted node indices from the top of the tree down, bonus token).

    target_choice: (len(tree)+1,) int64; entry 0 is the target's choice after the pending token, entry
    k+1 its choice after node k.
    """
    if len(tree) == 0:
        return np.zeros(0, dtype=np.int64), int(target_choice[0])
    alive = tree.tokens == target_choice[tree.parents + 1]
    # A node survives only if its whole ancestry does; going level by level keeps it to max_depth numpy ops.
    for depth in range(2, tree.max_depth + 1):
        level = tree.depths == depth
        alive[level] &= alive[tree.parents[level]]
    if not alive.any():
        return np.zeros(0, dtype=np.int64), int(target_choice[0])
    deepest = int(np.argmax(np.where(alive, tree.depths, 0)))
    return tree.path_to(deepest), int(target_choice[deepest + 1])
