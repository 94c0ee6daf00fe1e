"""Constrained decoding: a grammar the output must follow, applied the same way to plain and speculative decoding.

A `GrammarConstraint` follows one request's output through an llguidance matcher (its state: every token produced
so far, the pending token included). The decode loops ask it three things:

1. `prune(tree)`: walk the draft tree through the matcher (consume a node, compute the mask after it, roll back),
   drop every node the grammar forbids (and its subtree) before the forward, and return the allowed-token bitmask
   after the pending token and after each kept node;
2. `apply(logits, bitmask)`: set the logits of forbidden tokens to -inf, one tensor op per forward;
3. `advance(tokens)`: the tokens the step produced, into the matcher.

Plain decoding is the empty tree. The target's choice after every node is then the argmax (greedy) or the draw
(sampling) of exactly the masked logits plain constrained decoding would see at that position, so speculative
output stays token-identical to constrained greedy and has constrained sampling's distribution.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import cached_property

import llguidance
import llguidance.hf
import numpy as np
import torch

from oospec.engine.tree import ROOT, TokenTree
from oospec.errors import OospecError

log = logging.getLogger("oospec.engine")


class GrammarError(OospecError):
    """A grammar that does not compile, or a forced reply start it does not accept."""


class GrammarVocabulary:
    """The target's tokenizer as llguidance reads it: built once per target (about a second for 150k tokens)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Iterable[int]):
        eos = sorted(eos_ids) or [tokenizer.eos_token_id]
        self.eos_ids = tuple(int(e) for e in eos)
        self.vocab_size = vocab_size  # the width of the target's logits
        self.tokenizer = tokenizer
        self.ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=max(vocab_size, len(tokenizer)), eos_token=eos)
        self.words = (self.ll.vocab_size + 31) // 32  # int32 words of one bitmask row
        # Added tokens llguidance keeps apart from their text (a grammar names them as <[id]>): text -> id.
        self.special_tokens = {
            t.content: i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
            if i < self.ll.vocab_size and self.ll.is_special_token(i) and t.content
        }

    @cached_property
    def punctuation_ids(self) -> np.ndarray:
        """The tokens that are one piece of JSON punctuation (`{`, `", "`, ...), for `probe`'s walks."""
        pieces = ['"', "{", "}", "[", "]", ",", ":", ", ", ": ", '{"', '"}', '",', '": ', '", "', "0", "1"]
        return np.array(sorted({ids[0] for ids in map(self.encode, pieces) if len(ids) == 1}), dtype=np.int64)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []


class GrammarConstraint:
    """One request's grammar (Lark text, see oospec.tools.call_grammar), followed token by token.

    forced_text: the start of the reply already in the prompt (tool_choice's forced prefix): the grammar must
    accept it, and decoding continues from there."""

    def __init__(self, vocabulary: GrammarVocabulary, grammar: str, forced_text: str = ""):
        self.vocab = vocabulary
        self.grammar = grammar
        self.forced_ids = vocabulary.encode(forced_text)
        self.matcher = llguidance.LLMatcher(vocabulary.ll, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {_first_line(self.matcher.get_error())}")
        if not self.matcher.consume_tokens(self.forced_ids):
            raise GrammarError(f"the grammar does not accept the forced reply start {forced_text!r}")
        self.committed: list[int] = []  # the tokens `advance` took: what a rebuilt matcher replays
        # Why the grammar library could not go on, once the committed reply reached such a state (an Earley row
        # wider than it holds, a dead end): from there only the end of the turn is allowed, so the reply ends
        # cleanly, and at the same token whether it was decoded plainly or speculatively.
        self.failure: str | None = None
        self._branch_failure: str | None = None  # why the last draft node after which only the end may come failed
        self._eos = frozenset(vocabulary.eos_ids)
        self._end_row = _row_of(vocabulary.eos_ids, vocabulary.words)
        self._shifts = torch.arange(32, dtype=torch.int32)
        self._bitmask = torch.empty(0, vocabulary.words, dtype=torch.int32)

    # -- the three steps -------------------------------------------------------------------------------------

    def prune(self, tree: TokenTree) -> tuple[TokenTree, torch.Tensor]:
        """(the tree without the nodes the grammar forbids, (len(kept)+1, words) int32 bitmask): row 0 the tokens
        allowed after the pending token, row k+1 those allowed after kept node k. The matcher ends where it began.

        A node after which the grammar library fails gets the end-of-turn row, exactly the row plain decoding would
        see once it committed that node (see `failure`); the matcher is then rebuilt for the other branches."""
        n = len(tree)
        rows = self._rows(n + 1)
        if self.failure is None and not self._fill(rows[0]):
            self._fail(self._error())
        if self.failure is not None:
            rows[0] = self._end_row
        if n == 0:
            return tree, rows[:1]
        words = rows.numpy()
        end_row = self._end_row.numpy()
        tokens, parents, depths = tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()
        children: dict[int, list[int]] = {ROOT: []}
        for i, parent in enumerate(parents):
            children[i] = []
            children[parent].append(i)
        keep = np.zeros(n, dtype=bool)
        ended = np.zeros(n, dtype=bool)  # nodes after which only the end of the turn may follow
        path = [0] * (max(depths) + 1)  # the tokens from the pending one down to the node being visited, by depth
        consumed = 0  # tokens the matcher holds beyond the pending one: a prefix of `path`
        stack = children[ROOT][::-1]
        while stack:
            node = stack.pop()
            parent, token = parents[node], tokens[node]
            depth_above = depths[node] - 1
            if not _allowed(words[parent + 1], token, self.vocab.vocab_size):
                continue  # this node and its subtree go
            keep[node] = True
            if self.failure is not None or (parent != ROOT and ended[parent]) or token in self._eos:
                ended[node] = True  # an end-of-turn token (all that is allowed here): decoding stops there
                words[node + 1] = end_row
                continue
            if consumed > depth_above:
                self.matcher.rollback(consumed - depth_above)
            elif consumed < depth_above:  # only after a rebuild: replay the path down to the parent
                self.matcher.consume_tokens(path[consumed:depth_above])
            consumed = depth_above
            path[depth_above] = token
            if self.matcher.consume_token(token) and self._fill(rows[node + 1]):
                consumed += 1
            else:
                ended[node] = True
                words[node + 1] = end_row
                self._branch_failure = self._error()
                self._rebuild()
                consumed = 0
            stack.extend(children[node][::-1])
        if consumed:
            self.matcher.rollback(consumed)
        if keep.all():
            return tree, rows
        kept = np.flatnonzero(keep)
        remap = np.full(n, ROOT, dtype=np.int32)
        remap[kept] = np.arange(kept.size, dtype=np.int32)
        old = tree.parents[kept]
        pruned = TokenTree(tree.tokens[kept], np.where(old == ROOT, ROOT, remap[np.maximum(old, 0)]))
        return pruned, rows[np.concatenate([[0], kept + 1])]

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """(k, vocab) logits with every token its row's bitmask forbids at -inf (a new tensor)."""
        k, vocab = logits.shape
        bits = (bitmask.unsqueeze(-1) >> self._shifts) & 1  # (k, words, 32), bit j of word w is token 32*w+j
        allowed = bits.view(k, -1)[:, :vocab].bool()
        if allowed.shape[1] < vocab:  # logits wider than the tokenizer: the extra ids are never allowed
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))

    def mask_next(self, logits: torch.Tensor) -> torch.Tensor:
        """(vocab,) logits of the next token (no draft), forbidden tokens at -inf."""
        return self.apply(logits[None], self.prune(TokenTree.empty())[1])[0]

    def advance(self, tokens: Sequence[int] | np.ndarray) -> None:
        """The tokens a step produced (chosen under the masks, so the grammar accepts them, or they end the turn
        after a `failure`)."""
        if self.failure is not None:
            return
        tokens = [int(t) for t in tokens]
        for i, token in enumerate(tokens):
            if token in self._eos:  # the end of the turn: the grammar's, or the one a failure left
                if not self.matcher.is_accepting():
                    self.committed += tokens[:i]
                    self._fail(self._branch_failure or "the reply ended where the grammar could not go on")
                return
            if not self.matcher.consume_token(token):
                self.committed += tokens[:i + 1]
                self._fail(self._error())
                return
        self.committed += tokens

    # -- helpers ---------------------------------------------------------------------------------------------

    def _rows(self, n: int) -> torch.Tensor:
        if self._bitmask.shape[0] < n:  # grown to the largest tree once, then reused
            self._bitmask = torch.empty(n, self.vocab.words, dtype=torch.int32)
        return self._bitmask[:n]

    def _fill(self, row: torch.Tensor) -> bool:
        """The tokens allowed after the matcher's state, into `row`; False when the library failed there or
        allows nothing at all (a dead end the grammar cannot leave)."""
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        return not self.matcher.is_error() and bool(row.numpy().any())  # numpy: no torch dispatch per node

    def _error(self) -> str:
        return _first_line(self.matcher.get_error()) if self.matcher.is_error() else "no token is allowed here"

    def _fail(self, reason: str) -> None:
        self.failure = reason
        log.warning("the grammar could not go on after %d generated tokens (%s): the reply ends there",
                    len(self.committed), reason)

    def _rebuild(self) -> None:
        """A new matcher at the committed state (one that failed cannot roll back)."""
        self.matcher = llguidance.LLMatcher(self.vocab.ll, self.grammar, log_level=0)
        self.matcher.consume_tokens(self.forced_ids + self.committed)


def probe(vocabulary: GrammarVocabulary, grammar: str, forced_text: str = "", steps: int = 16,
          seed: int = 0) -> str | None:
    """Why `grammar` cannot be decoded under, found before any decoding (None: nothing found): it does not
    compile, it refuses the forced start, or the library fails within `steps` tokens of a walk that takes, at
    each step, a random allowed JSON punctuation token when there is one (so that the walk goes through keys and
    values rather than staying inside one string), else a random allowed token. A guard, not a proof: what it
    misses ends its reply at the failure (`GrammarConstraint.failure`)."""
    try:
        constraint = GrammarConstraint(vocabulary, grammar, forced_text)
    except GrammarError as exc:
        return str(exc)
    rng = np.random.default_rng(seed)
    row = torch.empty(vocabulary.words, dtype=torch.int32)
    punctuation = vocabulary.punctuation_ids
    matcher = constraint.matcher
    for _ in range(steps):
        if matcher.is_stopped() or matcher.is_accepting():
            return None
        if not constraint._fill(row):
            return constraint._error()
        bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[: vocabulary.vocab_size]
        bits[list(vocabulary.eos_ids)] = 0  # the end of the turn ends a walk; it is not a step into the grammar
        allowed = np.flatnonzero(bits)
        if not allowed.size:
            return None
        structural = allowed[np.isin(allowed, punctuation)]
        token = int(rng.choice(structural if structural.size else allowed))
        if not matcher.consume_token(token):
            return constraint._error()
    return None


def _row_of(token_ids: Iterable[int], words: int) -> torch.Tensor:
    """A bitmask row allowing exactly `token_ids`."""
    row = np.zeros(words, dtype=np.uint32)
    for token in token_ids:
        row[token >> 5] |= np.uint32(1) << np.uint32(token & 31)
    return torch.from_numpy(row.view(np.int32))


def _allowed(row: np.ndarray, token: int, vocab_size: int) -> bool:
    return 0 <= token < vocab_size and bool((int(row[token >> 5]) >> (token & 31)) & 1)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
