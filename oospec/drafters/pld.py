"""`pld`: prompt lookup. Continue the text the way it continued after the last occurrence of its suffix.

Tool calls copy a lot from the prompt (names, ids, dates), so the longest n-gram that ends the context and
appeared before is a strong hint. Several earlier occurrences with different continuations become branches.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from oospec.drafters.priors import ACCEPTANCE
from oospec.engine.drafting import Candidate, Drafter, Request


def lookup_continuations(corpus: np.ndarray, query: np.ndarray, *, max_ngram: int, min_ngram: int = 1,
                         draft_len: int, max_results: int, latest_first: bool = True) -> list[tuple[np.ndarray, int]]:
    """(continuation, n) for occurrences in `corpus` of the last n tokens of `query` that have something
    after them: longest n first, then the latest (or earliest) occurrences, distinct continuations only.

    Prompt lookup searches the context for its own suffix (corpus and query are the same array: windows
    end before the last token, so the suffix never matches itself); retrieval searches past outputs."""
    found: list[tuple[np.ndarray, int]] = []
    seen: set[bytes] = set()
    for n in range(min(max_ngram, query.size, corpus.size - 1), min_ngram - 1, -1):
        # Windows that start early enough to have at least one token after them.
        windows = sliding_window_view(corpus[:-1], n)
        starts = np.flatnonzero((windows == query[-n:]).all(axis=1))
        for start in starts[::-1] if latest_first else starts:
            cont = corpus[start + n : start + n + draft_len]
            key = cont.tobytes()
            if key in seen:
                continue
            seen.add(key)
            found.append((cont, n))
            if len(found) >= max_results:
                return found
    return found


class PromptLookupDrafter(Drafter):
    name = "pld"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, draft_len: int = 10, max_branches: int = 4):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.draft_len = draft_len
        self.max_branches = max_branches
        self._eos = np.zeros(0, dtype=np.int64)

    def start(self, request: Request) -> None:
        self._eos = np.fromiter(request.eos_ids, dtype=np.int64)

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        found = lookup_continuations(context, context, max_ngram=self.max_ngram, min_ngram=self.min_ngram,
                                     draft_len=self.draft_len, max_results=self.max_branches)
        # Longer matched n-grams come first and are more trustworthy; later branches are fallbacks.
        return [Candidate(cut_at_eos(c, self._eos), ACCEPTANCE.lookup(n, i), ACCEPTANCE.lookup_persistence)
                for i, (c, n) in enumerate(found)]


def cut_at_eos(draft: np.ndarray, eos: np.ndarray) -> np.ndarray:
    """A draft never needs tokens after an end-of-turn token: generation stops there."""
    hits = np.flatnonzero(np.isin(draft, eos))
    return draft[: hits[0] + 1] if hits.size else draft
