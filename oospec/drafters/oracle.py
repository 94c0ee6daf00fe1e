"""`oracle`: drafts the exact greedy output it was given, as one chain (the budget cuts it).

It knows the answer (the `ar` reference tokens of the same request), so every draft token is accepted and
each forward verifies `budget` tokens: the ceiling any drafter can reach on this hardware, given what a
verification forward of that size costs. It is a measuring stick for benchmarks, not a usable method.
"""

from __future__ import annotations

import numpy as np

from oospec.engine.drafting import Candidate, Drafter, Request


class OracleDrafter(Drafter):
    """Proposes `reference[i:]` where i is the number of tokens already produced (the engine keeps the first
    `budget` of them: one chain, earliest first).

    The reference is set with `set_reference` before each request, or given as the request's
    `reference_tokens`. Without one it proposes nothing (plain autoregressive decoding).
    """

    name = "oracle"

    def __init__(self, reference: np.ndarray | None = None):
        self._next_reference = None if reference is None else np.asarray(reference, dtype=np.int64).reshape(-1)
        self._reference = np.zeros(0, dtype=np.int64)
        self._prompt_len = 0

    def set_reference(self, tokens) -> None:
        """The greedy output of the next request (its token ids after the prompt)."""
        self._next_reference = np.asarray(tokens, dtype=np.int64).reshape(-1)

    def start(self, request: Request) -> None:
        ref = request.reference_tokens
        if ref is None:
            ref = self._next_reference
        self._reference = np.zeros(0, dtype=np.int64) if ref is None else np.asarray(ref, dtype=np.int64).reshape(-1)
        self._prompt_len = int(np.asarray(request.prompt_ids).size)

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        produced = context.size - self._prompt_len  # the last produced token is the pending one
        # The pending token is reference[produced - 1]; the tokens after it are the draft, if the past agrees.
        if produced < 1 or produced > self._reference.size:
            return []
        if not np.array_equal(context[self._prompt_len :], self._reference[:produced]):
            return []  # the output left the reference: nothing left to know
        draft = self._reference[produced:]
        return [Candidate(draft, 1.0, 1.0)] if draft.size else []

    def finish(self) -> None:
        self._next_reference = None
