"""How many draft tokens to verify per step: the tree that maximises expected tokens per second.

A verification forward over k tokens costs c(k) (the measured cost curve). A tree whose nodes would be
accepted with probabilities w_1 >= w_2 >= ... yields 1 + sum(w) tokens in expectation, so each step keeps
the n best nodes with the largest (1 + w_1 + ... + w_n) / c(n + 1). On a GPU c(k) is flat and trees grow
wide; on this CPU a 64-token forward costs several single-token ones and trees stay small and sure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


# c(k)/c(1) of Qwen2.5-Coder-1.5B, float32, 2 cores of an AMD EPYC (AVX512_BF16), the invariant kernels
# (oospec.engine.invariant), 580-token cached prompt: `oospec bench cost-curve --model qwen2.5-coder-1.5b`.
# bfloat16's curve is flatter (c(16)/c(1) 2.3), so this one is the cautious choice for both dtypes. Serving
# hardware should use its own curve: `oospec bench cost-curve --out curve.json`, then CostModel.from_json.
DEFAULT_CPU_CURVE = {1: 1.0, 2: 1.45, 4: 1.8, 8: 2.44, 16: 3.57, 32: 5.83}
# The same with one thread (the target's share when the sidecar has the other core).
ONE_THREAD_CPU_CURVE = {1: 1.0, 2: 1.4, 4: 1.7, 8: 2.44, 16: 3.63}


@dataclass(frozen=True)
class CostModel:
    ks: np.ndarray  # (m,) tokens per forward, increasing
    ratios: np.ndarray  # (m,) c(k)/c(1)

    @classmethod
    def from_curve(cls, curve: dict) -> CostModel:
        items = sorted((int(k), float(v)) for k, v in curve.items())
        return cls(np.array([k for k, _ in items], dtype=np.float64), np.array([v for _, v in items]))

    @classmethod
    def from_json(cls, path: str | Path) -> CostModel:
        """A file written by `oospec bench cost-curve --out`."""
        return cls.from_curve(json.loads(Path(path).read_text())["ratio"])

    @classmethod
    def flat(cls) -> CostModel:
        """Verification is free up to the budget (an idealised accelerator)."""
        return cls.from_curve({1: 1.0, 4096: 1.0})

    def cost(self, k: np.ndarray | int) -> np.ndarray:
        """c(k)/c(1), interpolated linearly, extrapolated with the last slope."""
        k = np.asarray(k, dtype=np.float64)
        inside = np.interp(k, self.ks, self.ratios)
        if self.ks.size > 1:
            slope = (self.ratios[-1] - self.ratios[-2]) / (self.ks[-1] - self.ks[-2])
            inside = np.where(k > self.ks[-1], self.ratios[-1] + slope * (k - self.ks[-1]), inside)
        return inside


def default_cost_model() -> CostModel:
    """The measured CPU curve for the torch thread count in use now."""
    import torch

    return CostModel.from_curve(ONE_THREAD_CPU_CURVE if torch.get_num_threads() == 1 else DEFAULT_CPU_CURVE)


class PriorMean:
    """A running mean that starts at `prior`, worth `prior_weight` observations."""

    def __init__(self, prior: float, prior_weight: float = 1.0):
        self.total = prior * prior_weight
        self.count = prior_weight

    def add(self, x: float) -> None:
        self.total += x
        self.count += 1.0

    @property
    def value(self) -> float:
        return self.total / self.count


class SampledAcceptance(PriorMean):
    """How much likelier a draft is rejected when sampling than when greedy, learnt during one request.

    Drafters weigh their tokens as guesses of the target's greedy choice. When sampling, the target's most
    likely token is drawn only with its probability p_max, so a node at depth d that greedy decoding would
    accept with weight w is accepted with about w * a^(d+1), a the mean p_max. With that discount the
    cost-aware budget keeps smaller trees where the target is less sure (high temperature) and full ones where
    it is sure (the braces and keys of a call). The estimate reads only positions already emitted, never the
    draws of the step it shapes, so sampling stays exact (oospec.engine.speculative_sampling)."""

    def __init__(self, prior: float = 1.0, prior_weight: float = 1.0):
        super().__init__(prior, prior_weight)

    observe = PriorMean.add  # the probability of the most likely token at one verified position
    discount = PriorMean.value

