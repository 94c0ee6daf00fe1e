"""Drafters built to break lossless decoding: random, empty, huge, decoy-laden and past-the-end trees.

A drafter proposes candidates (oospec.engine.drafting); a tree is proposed as the root path of every node,
in node order, which the engine's trie rebuilds (siblings with the same token become one node)."""

from __future__ import annotations

import numpy as np

from oospec.engine.drafting import Candidate, Drafter, Request
from oospec.engine.slot_rows import PROMPT, SlotFeed
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


class SlotRowDrafter(RandomTreeDrafter):
    """Random trees, plus random slot rows in every forward it may (Drafter.slot_feed): chains started at the
    prompt, several tokens of one chain in one forward (a primer), chains grown, branched and dropped; keeps every
    row's token path below the prompt with the logits the target gave it."""

    name = "slot-rows"

    def __init__(self, vocab: int, seed: int, max_nodes: int = 16, slot_rows: int = 24, slot_store: int = 200):
        super().__init__(vocab, seed, max_nodes)
        self.slot_rows, self.slot_store = slot_rows, slot_store

    def start(self, request: Request) -> None:
        self.prompt = np.asarray(request.prompt_ids)
        self.paths: dict[int, list[int]] = {}  # live node id -> its tokens from the prompt on
        self.parent: dict[int, int] = {}
        self.next_id = 0
        self.seen: list[tuple[list[list[int]], np.ndarray]] = []  # (each row's path, (s, vocab) logits)
        self.given: list[int] = []  # the rows the engine let it feed, per forward

    def _forget(self, drop: list[int]) -> None:
        gone = set(drop)
        for node in sorted(self.paths):  # parents before children
            if self.parent[node] in gone:
                gone.add(node)
        for node in gone:
            del self.paths[node], self.parent[node]

    def slot_feed(self, context, rows, beside=1):
        self.given.append(rows)
        rng = self.rng
        live = sorted(self.paths)
        drop = [int(i) for i in rng.choice(live, int(rng.integers(1, 3)), replace=False)] if \
            len(live) > 2 and rng.random() < 0.3 else []
        n = int(rng.integers(0, rows + 1))
        if len(live) + n > self.slot_store:
            drop = [i for i in live if self.parent[i] == PROMPT]
        self._forget(drop)
        live = sorted(self.paths)
        tokens, parents, self._paths = [], [], []
        for j in range(n):
            r = rng.random()
            if r < 0.15 or not (live or j):
                parent, path = PROMPT, []
            elif r < 0.6 and j:  # below an earlier row of this feed: a chain fed several tokens at once
                k = int(rng.integers(0, j))
                parent, path = self.next_id + k, self._paths[k]
            elif live:
                parent = int(rng.choice(live))
                path = self.paths[parent]
            else:
                parent, path = PROMPT, []
            tokens.append(int(rng.integers(0, self.vocab)))
            parents.append(parent)
            self._paths.append(path + [tokens[-1]])
        return SlotFeed(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64), self.next_id, drop)

    def slot_logits(self, feed, logits):
        assert logits.shape[0] == len(feed)
        for j, path in enumerate(self._paths):
            self.paths[self.next_id + j] = path
            self.parent[self.next_id + j] = int(feed.parents[j])
        self.next_id += len(feed)
        self.seen.append((self._paths, logits.clone()))
