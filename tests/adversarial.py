"""Drafters built to break lossless decoding: random, empty, huge, decoy-laden and past-the-end trees.

A drafter proposes candidates (oospec.engine.drafting); a tree is proposed as the root path of every node,
in node order, which the engine's trie rebuilds (siblings with the same token become one node)."""

from __future__ import annotations

import numpy as np

from oospec.engine.drafting import Candidate, Drafter, Request
from oospec.engine.tree import ROOT, TokenTree


def tree_candidates(tree: TokenTree) -> list[Candidate]:
    return [Candidate(tree.tokens[tree.path_to(i)]) for i in range(len(tree))]


class RandomTreeDrafter(Drafter):
    name = "random-tree"

    def __init__(self, vocab: int, seed: int, max_nodes: int = 64):
        self.vocab, self.rng, self.max_nodes = vocab, np.random.default_rng(seed), max_nodes

    def candidates(self, context):
        n = int(self.rng.integers(0, self.max_nodes + 1))
        parents = np.array([self.rng.integers(ROOT, i) if i else ROOT for i in range(n)], dtype=np.int32)
        return tree_candidates(TokenTree(self.rng.integers(0, self.vocab, n), parents))


class HugeTreeDrafter(RandomTreeDrafter):
    """More nodes than any budget (hundreds), mostly wide and shallow, with a few deep chains."""

    name = "huge-tree"

    def candidates(self, context):
        n = 512
        parents = np.where(self.rng.random(n) < 0.5, ROOT, np.arange(-1, n - 1))
        return tree_candidates(TokenTree(self.rng.integers(0, self.vocab, n), parents.astype(np.int32)))


class DecoyOracleDrafter(Drafter):
    """Knows the true output, hides it among decoys at every depth, and keeps drafting past its end
    (through the end-of-turn token into random tokens), so acceptance must pick non-first branches and
    the cache must be compacted, not just truncated."""

    name = "decoy-oracle"

    def __init__(self, reference: np.ndarray, vocab: int, seed: int, depth: int = 12, decoys: int = 3):
        self.reference, self.vocab, self.rng = reference, vocab, np.random.default_rng(seed)
        self.depth, self.decoys = depth, decoys

    def start(self, request: Request) -> None:
        self.prompt_len = request.prompt_ids.size

    def candidates(self, context):
        done = context.size - self.prompt_len  # tokens produced, the pending one included
        truth = self.reference[done : done + self.depth]
        tail = self.rng.integers(0, self.vocab, self.depth - truth.size)  # past the end of the reference
        truth = np.concatenate([truth, tail]).astype(np.int64)
        seqs = []
        for cut in range(truth.size):
            for _ in range(self.decoys):
                wrong = truth[: cut + 1].copy()
                wrong[cut] = (wrong[cut] + 1 + self.rng.integers(0, self.vocab - 1)) % self.vocab
                seqs.append(wrong)
        self.rng.shuffle(seqs)
        seqs.insert(int(self.rng.integers(0, len(seqs) + 1)), truth)
        return [Candidate(seq) for seq in seqs]


class RepeatDrafter(Drafter):
    """Proposes the last tokens again, as a model stuck in a loop would."""

    name = "repeat"

    def candidates(self, context):
        return [Candidate(context[-8:])]


class EmptyDrafter(Drafter):
    name = "empty"


class ProbingDrafter(RandomTreeDrafter):
    """Random trees, plus random probe chains beyond the budget (Drafter.probes): long ones, repeated ones,
    ones equal to the tree's own branches; keeps every (context, probe, choices) it was shown."""

    name = "probing"

    def __init__(self, vocab: int, seed: int, max_nodes: int = 16, probe_nodes: int = 24):
        super().__init__(vocab, seed, max_nodes)
        self.probe_nodes = probe_nodes
        self.seen: list[tuple[np.ndarray, list[np.ndarray], TokenTree, np.ndarray]] = []

    def probes(self, context):
        self._context = context.copy()
        chains = [self.rng.integers(0, self.vocab, int(self.rng.integers(1, 40))) for _ in range(3)]
        self._probes = chains + [chains[0]]
        return self._probes

    def verified(self, tree, choices):
        self.seen.append((self._context, self._probes, tree, np.asarray(choices).copy()))
