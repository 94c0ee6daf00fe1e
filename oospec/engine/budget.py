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


# c(k)/c(1) of Qwen2.5-Coder-1.5B by dtype and torch threads (1: the target's share while a sidecar has the
# other core), measured on 2 cores of an AMD EPYC (Zen 4, AVX512_BF16) with the invariant kernels
# (oospec.engine.invariant), 580-token cached prompt, the k timed round-robin, median of 7:
# `oospec bench cost-curve --model qwen2.5-coder-1.5b --dtype D --threads T --ks 1,2,3,4,6,8,12,16,24,32 --repeats 7`
# (experiments/results/kernel-cost-curve-attention/). Other hardware should measure its own: `--out curve.json`,
# then CostModel.from_json (the vLLM proposer: OOSPEC_VLLM_COST_CURVE).
# Where one k was timed twice the mean is taken, and a k timed faster than a smaller one (noise) gets the
# smaller one's ratio. c(1) itself moves by up to 20% between runs on this machine (memory bandwidth), so the
# ratios are good to about 0.1.
CPU_CURVES = {
    ("float32", 2): {1: 1.0, 2: 1.06, 4: 1.09, 8: 1.23, 12: 1.36, 16: 1.52, 24: 2.22, 32: 2.93},
    ("float32", 1): {1: 1.0, 2: 1.0, 4: 1.09, 8: 1.23, 12: 1.52, 16: 1.87, 24: 2.75, 32: 3.51},
    ("bfloat16", 2): {1: 1.0, 2: 1.05, 4: 1.09, 8: 1.23, 12: 1.40, 16: 1.66, 24: 2.29, 32: 2.90},
    ("bfloat16", 1): {1: 1.0, 2: 1.04, 4: 1.16, 8: 1.43, 12: 1.74, 16: 2.14, 24: 3.14, 32: 4.09},
    # bfloat16 on AMX tiles (kernels/linear.cpp), 2 cores of an Intel Xeon with AMX, same command with
    # --ks 1,2,3,4,6,8,12,16,24,32,48,63 (experiments/results/kernel-cost-curve-amx/): 16 rows cost one
    # TDPBF16PS as one row does, so a forward stays memory-bound far longer.
    ("bfloat16-amx", 1): {1: 1.00, 2: 1.01, 3: 1.02, 4: 1.05, 6: 1.10, 8: 1.14, 12: 1.19, 16: 1.26, 24: 1.44, 32: 1.50, 48: 2.04, 63: 2.50},
    ("bfloat16-amx", 2): {1: 1.00, 2: 1.01, 3: 1.01, 4: 1.06, 6: 1.07, 8: 1.09, 12: 1.15, 16: 1.20, 24: 1.40, 32: 1.48, 48: 1.94, 63: 2.35},
    # A GGUF target (the default: Qwen2.5-Coder-1.5B Q4_K_M read from its blocks, oospec.engine.quantized), by
    # the kernel path ("gguf-DTYPE-ISA", ISA: kernels.ISA_NAMES), on the same Xeon, 580-token prompt:
    # `[OOSPEC_KERNEL_ISA=ISA] oospec bench cost-curve --model qwen2.5-coder-1.5b --dtype DTYPE --threads T
    # --ks 1,2,3,4,6,8,12,16,17,20,24,32,40,48,64` (experiments/results/kernel-cost-curve-amx/gguf/). On AMX a
    # forward is bound by making the weights, and past 16 rows a second x block costs a step (17 rows: 1.55;
    # median of 6 runs, --repeats 7). The other paths were forced on this Xeon (median of 2 runs, --repeats 5):
    # their per-row work is the same instructions on any CPU that has them, their memory is this Xeon's. Each
    # row costs far more than the dense model's curve of the same path says (c(16): 3.42 against 1.66 on
    # VDPBF16PS, 2.33 against 1.52 in float32 on AVX-512). AVX2 was measured again after its fill was written
    # with AVX2 (repack_avx2.h: c(1) 458-531 -> 173-228 ms; avx2-fill/, 2 runs at 2 threads, 1 at 1): each row
    # costs relatively more now that the one-row forward is cheap (c(16) 1.70 -> 3.03).
    ("gguf-bfloat16-avx512_bf16", 1): {1: 1.00, 2: 1.16, 3: 1.33, 4: 1.52, 6: 1.87, 8: 2.24, 12: 2.95, 16: 3.70, 17: 3.87, 20: 4.42, 24: 5.12, 32: 6.54, 40: 7.94, 48: 9.40, 64: 12.39},
    ("gguf-bfloat16-avx512_bf16", 2): {1: 1.00, 2: 1.13, 3: 1.32, 4: 1.50, 6: 1.81, 8: 2.16, 12: 2.82, 16: 3.42, 17: 3.56, 20: 4.08, 24: 4.68, 32: 6.07, 40: 7.25, 48: 8.71, 64: 11.51},
    ("gguf-float32-avx512f", 1): {1: 1.00, 2: 1.08, 3: 1.54, 4: 1.54, 6: 1.54, 8: 1.90, 12: 2.05, 16: 2.38, 17: 2.38, 20: 2.76, 24: 2.76, 32: 3.44, 40: 4.14, 48: 4.79, 64: 6.38},
    ("gguf-float32-avx512f", 2): {1: 1.00, 2: 1.12, 3: 1.16, 4: 1.16, 6: 1.40, 8: 1.74, 12: 1.93, 16: 2.33, 17: 2.34, 20: 2.73, 24: 2.73, 32: 3.67, 40: 4.30, 48: 5.17, 64: 6.43},
    ("gguf-float32-avx2", 1): {1: 1.00, 2: 1.14, 3: 1.28, 4: 1.43, 6: 2.07, 8: 2.23, 12: 2.94, 16: 3.83, 17: 3.83, 20: 3.92, 24: 4.89, 32: 6.63, 40: 6.82, 48: 9.00, 64: 11.30},
    ("gguf-float32-avx2", 2): {1: 1.00, 2: 1.10, 3: 1.19, 4: 1.26, 6: 1.85, 8: 1.94, 12: 2.47, 16: 3.03, 17: 3.03, 20: 3.34, 24: 4.18, 32: 5.48, 40: 6.79, 48: 8.05, 64: 10.72},
    ("gguf-bfloat16-amx_bf16", 1): {1: 1.00, 2: 1.04, 3: 1.07, 4: 1.09, 6: 1.14, 8: 1.18, 12: 1.27, 16: 1.34, 17: 1.52, 20: 1.66, 24: 1.75, 32: 1.94, 40: 3.06, 48: 3.12, 64: 3.80},
    ("gguf-bfloat16-amx_bf16", 2): {1: 1.00, 2: 1.06, 3: 1.08, 4: 1.10, 6: 1.15, 8: 1.18, 12: 1.27, 16: 1.35, 17: 1.55, 20: 1.69, 24: 1.81, 32: 1.94, 40: 3.19, 48: 3.33, 64: 3.91},
}

# c(k)/c(1) of the padded invariant forward on a GPU (oospec.engine.padded: every forward holds 64 rows, so the
# curve is nearly flat by construction), measured on an NVIDIA H200 in bfloat16 with random-initialised
# Qwen2.5-0.5B/1.5B/7B-shaped models, 650-token cached prompt, median of 9 (tests/gpu_check.py,
# experiments/results/gpu-h200/); per k the largest of the three (7B at 64).
GPU_PADDED_CURVE = {1: 1.0, 16: 1.02, 64: 1.83}


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

    def beside(self, rows: int) -> CostModel:
        """The curve of forwards that hold `rows` rows besides the k counted (slot rows): c(k + rows)/c(1)."""
        return CostModel(self.ks - rows, self.ratios) if rows else self

    def cost(self, k: np.ndarray | int) -> np.ndarray:
        """c(k)/c(1), interpolated linearly, extrapolated with the last slope."""
        k = np.asarray(k, dtype=np.float64)
        inside = np.interp(k, self.ks, self.ratios)
        if self.ks.size > 1:
            slope = (self.ratios[-1] - self.ratios[-2]) / (self.ks[-1] - self.ks[-2])
            inside = np.where(k > self.ks[-1], self.ratios[-1] + slope * (k - self.ks[-1]), inside)
        return inside


def paying_rows(cost: CostModel, beside: int, wanted: int, credit: float) -> int:
    """The most of `wanted` slot rows whose added cost beside `beside` rows, c(beside + r) - c(beside), is within
    what they are expected to save: `credit` forwards each, a forward of `beside` rows costing c(beside)."""
    return int(_paying_rows(cost, np.asarray(beside), wanted, credit))


def _paying_rows(cost: CostModel, beside: np.ndarray, wanted: int, credit: float) -> np.ndarray:
    """paying_rows for every element of `beside` at once (one broadcast, no loop per tree size)."""
    if wanted <= 0 or credit <= 0.0:
        return np.zeros(beside.shape, dtype=np.int64)
    base = cost.cost(beside)[..., None]
    r = np.arange(wanted + 1)
    pays = cost.cost(beside[..., None] + r) - base <= r * credit * base + 1e-9
    return np.where(pays, r, 0).max(-1)


def beside_slot_rows(cost: CostModel, k_max: int, wanted: int, credit: float) -> CostModel:
    """The curve a tree is sized on when slot rows may ride beside it: for k = 1..k_max rows (the pending token
    and k - 1 nodes), the forward with the rows that pay beside them (`paying_rows`), less what those rows are
    expected to save. A smaller tree then leaves room for rows worth more than its last nodes (16 rows fit one
    x block of the AMX kernels: the 17th row costs a step, which rows beside a full tree never pay)."""
    ks = np.arange(1, k_max + 1)
    own = cost.cost(ks)
    rows = _paying_rows(cost, ks, wanted, credit)
    net = cost.cost(ks + rows) - rows * credit * own
    # The rows may at most halve what a forward seems to cost: a tree is ranked by tokens per cost, which a
    # cost near zero (rows credited with more than they cost) would turn into "no tree at all".
    return CostModel(ks, np.maximum(net, 0.5 * own))


def kernel_isa() -> str | None:
    """The instruction set this process's C++ invariant kernels were built for (kernels.ISA_NAMES; None: the
    pure-torch kernels)."""
    from oospec.engine.kernels import native

    ops = native()
    return ops.isa() if ops is not None else None


def default_cost_model(dtype=None, device: str = "cpu", threads: int | None = None,
                       quantized: bool = False) -> CostModel:
    """The measured CPU curve for `dtype` (a torch dtype; default and anything but bfloat16: float32's; bfloat16
    on AMX tiles its own) at `threads` torch threads (None: the count in use now). `quantized`: the target reads
    GGUF blocks (oospec.engine.quantized), whose curve on each kernel path is its own where it was measured
    ("gguf-DTYPE-ISA"). Other devices get the float32 CPU curve too, the cautious choice (it keeps trees small):
    an accelerator's flatter curve should be measured and given (CostModel.from_json)."""
    import torch

    name = "bfloat16" if dtype == torch.bfloat16 and device == "cpu" else "float32"
    isa = kernel_isa() if device == "cpu" else None
    threads = 1 if (torch.get_num_threads() if threads is None else threads) <= 1 else 2
    if quantized and (f"gguf-{name}-{isa}", threads) in CPU_CURVES:
        return CostModel.from_curve(CPU_CURVES[f"gguf-{name}-{isa}", threads])
    if name == "bfloat16" and isa == "amx_bf16":
        name = "bfloat16-amx"
    return CostModel.from_curve(CPU_CURVES[name, threads])


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

