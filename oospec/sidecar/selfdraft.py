"""The sidecar's own drafts for writing a call in order: the call its parallel rows guessed, followed token by
token and re-aligned after every place where the in-order text departs from it.

The parallel guess is usually right slot by slot; writing the call in order (each value behind the ones
before it, the keys the model chooses in the order it chooses) fixes what one row per slot cannot see, and
with the guess as the draft it costs a forward per departure, not per token.
"""

from __future__ import annotations

from collections.abc import Sequence

# How the best guess's slots are written: "parallel", one row per slot (the guess as it is); "in-order", then
# the whole call once more in one row with the parallel values as the draft. Plain data: the CLI reads it.
SLOT_ORDERS = ("parallel", "in-order")
MAX_ALIGN_NGRAM = 3  # the longest run of written tokens looked up in the guess to find where it resumes


class AlignedDraft:
    """Proposes the rest of `guess` (token ids) after what has been written so far.

    While the written tokens follow the guess, the proposal is what comes next in it. Where they depart
    (a value written otherwise), the guess is searched forward, never back, for the last few tokens written
    (the longest run first: a closing quote and comma alone also end every other value); the proposal
    resumes after the first place they match, or where it stood when none does (the written token may be one
    the guess does not have)."""

    def __init__(self, guess: Sequence[int], max_tokens: int = 48):
        self.guess = [int(t) for t in guess]
        self.max_tokens = max_tokens
        self.at = 0  # where the next written token is expected in the guess
        self.seen = 0  # written tokens already aligned

    def __call__(self, written: Sequence[int]) -> list[int]:
        for i in range(self.seen, len(written)):
            if self.at < len(self.guess) and self.guess[self.at] == written[i]:
                self.at += 1
            else:
                self.at = self._resume(written[: i + 1])
        self.seen = len(written)
        return self.guess[self.at : self.at + self.max_tokens]

    def _resume(self, written: Sequence[int]) -> int:
        """Just after the first match at or past the expected place of the longest tail of `written`; the
        expected place itself when none matches (an inserted token: the guess goes on from there)."""
        for n in range(min(MAX_ALIGN_NGRAM, len(written)), 0, -1):
            tail = list(written[-n:])
            for end in range(max(self.at, n - 1), len(self.guess)):
                if self.guess[end - n + 1 : end + 1] == tail:
                    return end + 1
        return self.at
