"""The target's processed next-token distribution: one function for plain sampling and speculative sampling.

Both paths must see exactly the same distribution p (temperature, then top-k, then top-p), or speculative
sampling would preserve a different distribution than the one plain sampling draws from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oospec.errors import OospecError


@dataclass(frozen=True)
class SamplingParams:
    """How a sampled request turns the target's logits into its next-token distribution."""

    temperature: float  # > 0; temperature 0 is greedy decoding, which never comes here
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose mass reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    seed: int | None = None  # the per-request generator's seed; None: torch's global generator

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"sampling needs temperature > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def uniforms(self, n: int) -> torch.Tensor:
        """(n,) float64 in [0, 1): one draw per output position, from a per-request generator seeded by `seed`
        (torch's global one when None). Position j's token is inverse_cdf(p_j, uniforms[j]) in plain and in
        speculative sampling alike, so the same seed gives the same output whatever the drafts."""
        generator = None if self.seed is None else torch.Generator(device="cpu").manual_seed(int(self.seed))
        return torch.rand(n, generator=generator, dtype=torch.float64)

    def describe(self) -> str:
        return f"temperature={self.temperature:g}, top_p={self.top_p:g}, top_k={self.top_k}"


def check_sampling_options(temperature: float, top_p: float = 1.0, top_k: int = 0, seed: int | None = None) -> None:
    """Refuse bad sampling options in one clear line before anything is loaded (the CLI and bench call it);
    at temperature 0 (greedy) the others are unused and not checked."""
    if temperature < 0:
        raise OospecError(f"--temperature must be >= 0, got {temperature}")
    if temperature > 0:
        try:
            SamplingParams(temperature, top_p, top_k, seed)
        except ValueError as exc:
            raise OospecError(str(exc)) from None


def target_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., vocab) float64 probabilities of softmax(logits / temperature) restricted to top-k, then top-p.

    Renormalised after the cuts; float64 so that cumulative sums over a large vocabulary stay accurate."""
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


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative-probability interval holds u * total: a draw from (vocab,) probs given one
    uniform u in [0, 1). Tokens of probability 0 have empty intervals and are never returned."""
    cdf = probs.cumsum(-1)
    return min(int(torch.searchsorted(cdf, cdf[-1:] * u, right=True)[0]), probs.numel() - 1)
