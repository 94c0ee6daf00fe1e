"""The drafter interface: propose a token tree from the current context, learn from what was accepted.

Drafters carry no probabilities: the verifier treats their tokens as guesses to be matched against the
target's greedy choices, so any drafter, however wrong, leaves the output unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oospec.engine.tree import TokenTree


@dataclass
class Request:
    """What a drafter may know about the request it drafts for."""

    prompt_ids: np.ndarray  # (p,) int64 token ids of the rendered prompt
    eos_ids: frozenset[int]  # tokens that end the turn
    tokenizer: Any = None  # the target's tokenizer (drafters that render text into target tokens)
    messages: list[dict] | None = None  # the chat messages the prompt was rendered from
    tools: list[Any] | None = None  # the tools offered to the model (oospec.tools.schema.Tool or OpenAI dicts)
    dialect: str | None = None  # how the target writes calls (oospec.tools.dialects), None: guess from the tools
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """One proposed continuation with a rough acceptance model: the first token is right with probability
    `confidence`, each further token with probability `persistence` given the ones before."""

    tokens: np.ndarray  # (m,) int64
    confidence: float = 0.5
    persistence: float = 0.8

    def weights(self) -> np.ndarray:
        """(m,) probability that the target accepts this candidate at least up to each position."""
        return self.confidence * self.persistence ** np.arange(self.tokens.size)


class Drafter:
    """Base drafter: proposes nothing. Subclasses override `candidates` (or `propose`) and, if they learn,
    `observe`."""

    name = "base"

    def start(self, request: Request) -> None:
        """Called once per request before the first proposal."""

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        """Continuations of `context` ((n,) int64: prompt, then every token produced so far, the last being
        the pending token), best first."""
        return []

    def propose(self, context: np.ndarray, budget: int) -> TokenTree:
        """Draft continuations of `context` in a tree of at most `budget` nodes."""
        return TokenTree.from_sequences((c.tokens for c in self.candidates(context)), budget)

    def observe(self, produced: np.ndarray) -> None:
        """The tokens the last step produced (accepted draft tokens, then the bonus token)."""

    def finish(self) -> None:
        """Called once when the request ends (also on errors)."""
