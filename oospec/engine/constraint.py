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

from collections.abc import Iterable, Sequence

import llguidance
import llguidance.hf
import numpy as np
import torch

from oospec.engine.tree import ROOT, TokenTree
from oospec.errors import OospecError


class GrammarError(OospecError):
    """A grammar that does not compile, or a forced reply start it does not accept."""


class GrammarVocabulary:
    """The target's tokenizer as llguidance reads it: built once per target (about a second for 150k tokens)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Iterable[int]):
        eos = sorted(eos_ids) or [tokenizer.eos_token_id]
        self.vocab_size = vocab_size  # the width of the target's logits
        self.tokenizer = tokenizer
        self.ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=max(vocab_size, len(tokenizer)), eos_token=eos)
        self.words = (self.ll.vocab_size + 31) // 32  # int32 words of one bitmask row
        # Added tokens llguidance keeps apart from their text (a grammar names them as <[id]>): text -> id.
        self.special_tokens = {
            t.content: i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
            if i < self.ll.vocab_size and self.ll.is_special_token(i) and t.content
        }

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []


class GrammarConstraint:
    """One request's grammar (Lark text, see oospec.tools.call_grammar), followed token by token.

    forced_text: the start of the reply already in the prompt (tool_choice's forced prefix): the grammar must
    accept it, and decoding continues from there."""

    def __init__(self, vocabulary: GrammarVocabulary, grammar: str, forced_text: str = ""):
        self.vocab = vocabulary
        self.matcher = llguidance.LLMatcher(vocabulary.ll, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {_first_line(self.matcher.get_error())}")
        if not self.matcher.consume_tokens(vocabulary.encode(forced_text)):
            raise GrammarError(f"the grammar does not accept the forced reply start {forced_text!r}")
        self._shifts = torch.arange(32, dtype=torch.int32)
        self._bitmask = torch.empty(0, vocabulary.words, dtype=torch.int32)

    # -- the three steps -------------------------------------------------------------------------------------

    def prune(self, tree: TokenTree) -> tuple[TokenTree, torch.Tensor]:
        """(the tree without the nodes the grammar forbids, (len(kept)+1, words) int32 bitmask): row 0 the tokens
        allowed after the pending token, row k+1 those allowed after kept node k. The matcher ends where it began."""
        n = len(tree)
        rows = self._rows(n + 1)
        self._fill(rows[0])
        if n == 0:
            return tree, rows[:1]
        words = rows.numpy()
        tokens, parents, depths = tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()
        children: dict[int, list[int]] = {ROOT: []}
        for i, parent in enumerate(parents):
            children[i] = []
            children[parent].append(i)
        keep = np.zeros(n, dtype=bool)
        consumed = 0  # tokens the matcher holds beyond the pending one: the path to the node being visited
        stack = children[ROOT][::-1]
        while stack:
            node = stack.pop()
            parent, token = parents[node], tokens[node]
            depth_above = depths[node] - 1
            if consumed > depth_above:
                self.matcher.rollback(consumed - depth_above)
                consumed = depth_above
            if not _allowed(words[parent + 1], token, self.vocab.vocab_size):
                continue  # this node and its subtree go
            if not self.matcher.consume_token(token):
                raise GrammarError(f"the grammar matcher failed on an allowed token: {self.matcher.get_error()}")
            consumed += 1
            keep[node] = True
            self._fill(rows[node + 1])
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
        """The tokens a step produced (chosen under the masks, so the grammar accepts them)."""
        if not self.matcher.consume_tokens([int(t) for t in tokens]):
            raise GrammarError(f"the grammar rejected produced tokens: {_first_line(self.matcher.get_error())}")

    # -- helpers ---------------------------------------------------------------------------------------------

    def _rows(self, n: int) -> torch.Tensor:
        if self._bitmask.shape[0] < n:  # grown to the largest tree once, then reused
            self._bitmask = torch.empty(n, self.vocab.words, dtype=torch.int32)
        return self._bitmask[:n]

    def _fill(self, row: torch.Tensor) -> None:
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        if self.matcher.is_error():
            raise GrammarError(f"the grammar matcher failed: {_first_line(self.matcher.get_error())}")


def _allowed(row: np.ndarray, token: int, vocab_size: int) -> bool:
    return 0 <= token < vocab_size and bool((int(row[token >> 5]) >> (token & 31)) & 1)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
