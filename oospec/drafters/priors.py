"""The drafters' acceptance priors, in one table: how likely the target is to take each drafter's tokens.

Each candidate a drafter proposes carries a rough acceptance model (oospec.engine.drafting.Candidate): its first
token is right with probability `confidence`, each further token with probability `persistence` given the ones
before. The numbers are set by hand from benchmark traces (Qwen2.5-Coder and SmolLM2 targets); they
only decide which nodes the token tree keeps (oospec.engine.budget), never the output, which the target
verifies. The schema drafter's per-structure confidences live beside the structures themselves
(oospec.tools.continuations).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AcceptancePriors:
    # Forced structure (keys, braces, closers) from the schema: once its first token is right, the rest nearly
    # always is.
    structure_persistence: float = 0.97
    # The sidecar's hints: the best guess (or the guess naming the function the target is writing), the other
    # guesses, and how far a call the target misnamed (no tool has its name) still follows a guess's arguments.
    hint_confidence: float = 0.9
    alternative_hint_confidence: float = 0.35
    misnamed_call_factor: float = 0.5
    hint_persistence: float = 0.97
    # Prompt lookup: a continuation after an n-token match is right with min(cap, base + per_token * n), divided
    # by 1 + its rank (later branches are fallbacks).
    lookup_base: float = 0.15
    lookup_per_token: float = 0.15
    lookup_cap: float = 0.8
    lookup_persistence: float = 0.85
    # Retrieval from past outputs: the same rule, scaled by 0.5 + 0.5 * the past request's similarity.
    retrieval_base: float = 0.25
    retrieval_per_token: float = 0.1
    retrieval_cap: float = 0.9
    retrieval_persistence: float = 0.9

    def lookup(self, matched: int, rank: int) -> float:
        """Prompt lookup's confidence in the continuation after `matched` tokens, ranked `rank` (0: first)."""
        return min(self.lookup_cap, self.lookup_base + self.lookup_per_token * matched) / (1 + rank)

    def retrieval(self, matched: int, similarity: float) -> float:
        """Retrieval's confidence in a past output's continuation after `matched` tokens."""
        return min(self.retrieval_cap, self.retrieval_base + self.retrieval_per_token * matched) * (0.5 + 0.5 * similarity)


ACCEPTANCE = AcceptancePriors()
