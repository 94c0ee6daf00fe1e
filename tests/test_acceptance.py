"""The verifier's two pure functions on hand-made trees: greedy acceptance and the tree attention mask."""

import numpy as np
import pytest

from oospec.engine.acceptance import greedy_accept
from oospec.engine.tree import ROOT, TokenTree

# pending
# ├── 0:10 ── 1:11 ── 3:13
# │      └─── 2:12 ── 4:14
# └── 5:20 ── 6:21
BRANCHY = TokenTree(np.array([10, 11, 12, 13, 14, 20, 21]), np.array([ROOT, 0, 0, 1, 2, ROOT, 5]))
NO = 99  # a token no node holds


def choices(tree: TokenTree, after_pending: int, after_node: dict[int, int]) -> np.ndarray:
    """The target's greedy choice after the pending token and after each node (NO where not given)."""
    out = np.full(len(tree) + 1, NO, dtype=np.int64)
    out[0] = after_pending
    for node, token in after_node.items():
        out[node + 1] = token
    return out


def accept(tree, target_choice):
    path, bonus = greedy_accept(tree, target_choice)
    return path.tolist(), bonus


def test_empty_tree_gives_the_bonus_token_only():
    assert accept(TokenTree.empty(), np.array([7])) == ([], 7)


def test_chain_accepted_whole_and_the_bonus_follows_the_last_node():
    chain = TokenTree.chain([5, 6, 7])
    assert accept(chain, np.array([5, 6, 7, 8])) == ([0, 1, 2], 8)


def test_rejected_at_the_root():
    assert accept(TokenTree.chain([5, 6, 7]), np.array([4, 6, 7, 8])) == ([], 4)
    assert accept(BRANCHY, choices(BRANCHY, 30, {0: 11, 1: 13, 5: 21})) == ([], 30)


def test_rejected_mid_chain_the_bonus_is_the_targets_token():
    assert accept(TokenTree.chain([5, 6, 7]), np.array([5, 6, 3, 8])) == ([0, 1], 3)


def test_branch_choice_follows_the_target():
    assert accept(BRANCHY, choices(BRANCHY, 10, {0: 12, 2: 14, 4: 77})) == ([0, 2, 4], 77)
    assert accept(BRANCHY, choices(BRANCHY, 10, {0: 11, 1: 13, 3: 78})) == ([0, 1, 3], 78)
    assert accept(BRANCHY, choices(BRANCHY, 20, {5: 21, 6: 79})) == ([5, 6], 79)
    assert accept(BRANCHY, choices(BRANCHY, 10, {0: 12, 2: 15})) == ([0, 2], 15)


def test_a_node_whose_parent_was_rejected_is_not_accepted():
    """Nodes 1 and 3 each match the target's choice after their parent, but node 0 was rejected: the deeper
    dead branch must lose to the one-node live branch."""
    assert accept(BRANCHY, choices(BRANCHY, 20, {0: 11, 1: 13, 5: 80})) == ([5], 80)


def test_deep_chain():
    tokens = np.arange(1000, 1200)
    chain = TokenTree.chain(tokens)
    assert accept(chain, np.append(tokens, 5)) == (list(range(200)), 5)
    rejected_at_150 = np.append(tokens, 5)
    rejected_at_150[150] = 6
    assert accept(chain, rejected_at_150) == (list(range(150)), 6)


def random_trie(rng: np.random.Generator, n: int, vocab: int) -> TokenTree:
    """A random tree in topological order whose siblings hold distinct tokens (as a trie of drafts does)."""
    parents, tokens, taken = [], [], {}
    for i in range(n):
        parent = int(rng.integers(ROOT, i))
        free = sorted(set(range(vocab)) - taken.setdefault(parent, set()))
        if not free:
            parent, free = i - 1, list(range(vocab))  # a fresh node's children are all free
            taken.setdefault(parent, set())
        token = int(rng.choice(free))
        taken[parent].add(token)
        parents.append(parent)
        tokens.append(token)
    return TokenTree(np.array(tokens), np.array(parents))


def walk(tree: TokenTree, target_choice: np.ndarray) -> tuple[list[int], int]:
    """Greedy decoding one token at a time: step into the child holding the target's token while there is one."""
    node, path = ROOT, []
    want = int(target_choice[0])
    while True:
        child = [k for k in range(len(tree)) if tree.parents[k] == node and tree.tokens[k] == want]
        if not child:
            return path, want
        node = child[0]
        path.append(node)
        want = int(target_choice[node + 1])


@pytest.mark.parametrize("seed", range(40))
def test_random_tries_accept_what_token_by_token_greedy_would(seed):
    rng = np.random.default_rng(seed)
    tree = random_trie(rng, int(rng.integers(1, 40)), vocab=3)
    # A target that mostly agrees with the draft, so that paths of every length occur.
    agree = rng.random(len(tree) + 1) < 0.7
    target_choice = rng.integers(0, 3, len(tree) + 1)
    for node in range(len(tree)):
        if agree[node + 1]:
            children = np.flatnonzero(tree.parents == node)
            if children.size:
                target_choice[node + 1] = tree.tokens[rng.choice(children)]
    assert accept(tree, target_choice) == walk(tree, target_choice)


def test_ancestor_mask_of_a_branching_tree():
    tree = TokenTree(np.array([1, 2, 3, 4, 5]), np.array([ROOT, 0, ROOT, 2, 0]))
    #            pending n0 n1 n2 n3 n4
    want = np.array([[1, 0, 0, 0, 0, 0],   # pending
                     [1, 1, 0, 0, 0, 0],   # n0
                     [1, 1, 1, 0, 0, 0],   # n1 below n0
                     [1, 0, 0, 1, 0, 0],   # n2, a second first-level node
                     [1, 0, 0, 1, 1, 0],   # n3 below n2
                     [1, 1, 0, 0, 0, 1]],  # n4 below n0, stored after the other branch
                    dtype=bool)
    assert np.array_equal(tree.ancestor_mask(), want)
    assert np.array_equal(TokenTree.empty().ancestor_mask(), np.ones((1, 1), dtype=bool))


def brute_force_mask(tree: TokenTree) -> np.ndarray:
    """Row i attends column j iff j is the pending token, or node j-1 is node i-1 or one of its ancestors."""
    n = len(tree)
    mask = np.zeros((n + 1, n + 1), dtype=bool)
    mask[0, 0] = True
    for node in range(n):
        mask[node + 1, 0] = True
        mask[node + 1, tree.path_to(node) + 1] = True
    return mask


@pytest.mark.parametrize("seed", range(20))
def test_ancestor_mask_equals_brute_force_on_random_trees(seed):
    rng = np.random.default_rng(100 + seed)
    tree = random_trie(rng, int(rng.integers(1, 60)), vocab=4)
    assert np.array_equal(tree.ancestor_mask(), brute_force_mask(tree))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_choices_are_torchs_argmax_ties_and_nans_included(dtype):
    import torch

    from oospec.engine.target import greedy_choices

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 5000, generator=g) * 4).to(getattr(torch, dtype))
    logits[1, [7, 4000]] = 100.0  # a tie: the first
    logits[2, [9, 30]] = float("nan")  # a NaN counts as the largest, the first one
    logits[3, 11] = float("inf")
    logits[4] = float("-inf")  # all equal: index 0
    got = greedy_choices(logits)
    assert got.dtype == np.int64 and got.tolist() == logits.argmax(-1).tolist()
    assert got[1:5].tolist() == [7, 9, 11, 0]
    assert int(greedy_choices(logits[5])) == int(logits[5].argmax())
