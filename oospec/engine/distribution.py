"""The target's processed next-token distribution: one function for plain sampling and speculative sampling.

Both paths must see exactly the same distribution p (temperature, then top-k, then top-p), or speculative
sampling would preserve a different distribution than the one plain sampling draws from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How a sampled request turns the target's logits into its next-token distribution."""

    temperature: float  # > 0; temperature 0 is greedy decoding, which never comes here
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose mass reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    seed: int | None = None  # None: torch's global generator

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"sampling needs temperature > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def generator(self) -> torch.Generator | None:
        """A fresh per-request generator: the same seed gives the same draws."""
        if self.seed is None:
            return None
        return torch.Generator(device="cpu").manual_seed(int(self.seed))

    def describe(self) -> str:
        return f"temperature={self.temperature:g}, top_p={self.top_p:g}, top_k={self.top_k}"


def target_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., vocab) float64 probabilities of softmax(logits / temperature) restricted to top-k, then top-p.

    Renormalised after the cuts. float64 so that repeated renormalisation in the verifier stays exact."""
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    vocab = probs.shape[-1]
    if 0 < params.top_k < vocab or params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)
        if 0 < params.top_k < vocab:
            keep[..., params.top_k :] = False
        if params.top_p < 1.0:
            # Keep every token whose preceding mass is below top_p (the first token always stays).
            keep &= (sorted_probs.cumsum(-1) - sorted_probs) < params.top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return probs / probs.sum(-1, keepdim=True)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from (vocab,) probabilities (they need not sum to 1)."""
    return int(torch.multinomial(probs, 1, generator=generator))
