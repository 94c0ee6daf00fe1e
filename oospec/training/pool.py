"""The requests the teacher is traced on: many tool families and styles, drawn reproducibly from the shipped data.

Which of them are trained on is decided later, by tool, from the teacher's own calls (`split.split_traces`):
the teacher's output does not depend on the split, so one resumable trace run serves every split.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from oospec.datasets import Sample

# (dataset, split, the first N items: reserved for benchmarks and never traced, items drawn from the rest).
# Sized so that the teacher (Qwen2.5-Coder-1.5B, 2 cores) traces the pool in about 45 minutes.
POOL_SOURCES: tuple[tuple[str, str | None, int, int], ...] = (
    ("apibank", "1", 60, 70),
    ("apibank", "2", 0, 20),
    ("apibank", "3", 0, 35),
    ("toolalpaca", None, 0, 35),
    ("bfcl", "simple_python", 30, 45),
    ("bfcl", "multiple", 0, 30),
    ("bfcl", "parallel", 0, 15),
    ("bfcl", "parallel_multiple", 0, 15),
    ("bfcl", "simple_java", 0, 10),
    ("bfcl", "simple_javascript", 0, 8),
    ("bfcl", "irrelevance", 0, 30),
)


@dataclass(frozen=True)
class PoolSource:
    dataset: str
    split: str | None
    reserved: int  # the first items: benchmark items, never traced (their tools are kept out of training)
    drawn: int  # more, drawn at random from the rest

    @property
    def label(self) -> str:
        return self.dataset + (f":{self.split}" if self.split else "")


def pool_sources(scale: float = 1.0) -> list[PoolSource]:
    return [PoolSource(d, sp, reserved, round(drawn * scale)) for d, sp, reserved, drawn in POOL_SOURCES]


def training_pool(sources: Sequence[PoolSource], seed: int = 0, rounds: int = 2) -> list[list[Sample]]:
    """The pool in `rounds` parts, each holding its share of every source: traced part by part, a run cut short
    still covers every tool family."""
    from oospec.datasets import load_dataset

    parts: list[list[Sample]] = [[] for _ in range(rounds)]
    for src in sources:
        samples = list(load_dataset(src.dataset, split=src.split))
        rest = samples[src.reserved:]
        random.Random(f"{seed}:{src.label}").shuffle(rest)
        chosen = rest[: src.drawn]
        for i, s in enumerate(chosen):
            parts[i * rounds // max(1, len(chosen))].append(s)
    return parts
