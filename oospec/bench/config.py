"""What `oospec bench run` is asked to do: its options and the CPU cores each method gets (its items: items.py)."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from oospec.bench.items import Selection
from oospec.engine.drafting import Request
from oospec.models.registry import (DEFAULT_BUDGET, DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_MAX_NEW_TOKENS,
                                     DEFAULT_SIDECAR, DEFAULT_TARGET)
from oospec.sidecar.process import SidecarSettings


@dataclass
class BenchConfig(Selection):
    """A benchmark run: its items (the Selection it extends: datasets, split, data, items, offset, limit,
    held_out_only, allow_trained_items, sessions, with their defaults) and how each method runs on them."""

    # ar always runs, listed or not: every speed-up is against it (oospec.bench.methods.parse_methods).
    methods: list[str] = field(default_factory=lambda: ["ar", "pld", "toolspec", "hf-pld", "oracle"])
    target: str = DEFAULT_TARGET
    # ar at the target's share of the cores beside sidecar methods (the report's secondary column); off, a run
    # that only needs tau and identity costs a third less
    secondary_baseline: bool = True
    # "required": every reply must call one of the item's tools, decoded under the call grammar (the forced start
    # appended to the prompt), for `ar` and every method alike; "auto": the model decides, no grammar.
    tool_choice: str = "auto"
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    budget: int = DEFAULT_BUDGET
    # Sampling (a Request's defaults): temperature 0 is greedy. Above it every method samples with the same
    # per-item seed (see item_seed), so `ar` is plain sampling and a lossless method returns exactly its tokens
    # (coupled draws); the run's seed is fixed, so that a rerun draws the same tokens.
    temperature: float = Request.temperature
    top_p: float = Request.top_p
    top_k: int = Request.top_k
    seed: int = 0
    # The target's torch threads while a sidecar method runs; every other method gets these plus the sidecar's
    # (see Cores). None: all cores torch would use, less the sidecar's.
    threads: int | None = None
    # The sidecar of the methods that use one, as SidecarSettings describe it.
    sidecar_model: str = SidecarSettings.model
    sidecar_threads: int = SidecarSettings.threads
    sidecar_device: str = SidecarSettings.device
    sidecar_dtype: str = SidecarSettings.dtype  # see oospec.models.cpu_features.drafter_dtype
    sidecar_adapter: str | None = SidecarSettings.adapter  # see oospec.sidecar.process.resolve_adapter
    # The slot LoRA of oospec-rows: a peft adapter folder for the target, read by slot rows only
    # (oospec.engine.slot_rows.add_slot_lora); None: the slot rows read the target's own weights.
    slot_adapter: str | None = None
    out: str | Path | None = None
    assistant: str = DEFAULT_SIDECAR  # the draft model of hf-assisted
    dtype: str = DEFAULT_DTYPE
    device: str = DEFAULT_DEVICE
    optimize: bool = True
    warmup: bool = True
    progress: bool = True
    echo: bool = True  # print the tables
    command: str | None = None  # the command line, for the report header


@dataclass(frozen=True)
class Cores:
    """The CPU threads of a run, decided once, so that every method gets the same total (equal cores).

    A sidecar method splits the total: `target` threads for the target, `sidecar` for its own process (0 when
    the sidecar has an accelerator). Every other method runs the target with the whole total, so each
    speed-up is against `ar` on as many cores as the method used.
    """

    target: int
    sidecar: int
    sidecar_device: str | None  # None: no sidecar method in this run
    machine: int  # os.cpu_count()

    @property
    def total(self) -> int:
        return self.target + self.sidecar

    def sidecar_label(self) -> str:
        """`cores` of a sidecar method: "1+1" (target + sidecar threads) or "1+cuda:1"."""
        return f"{self.target}+{self.sidecar if self.sidecar_device == 'cpu' else self.sidecar_device}"

    def as_json(self) -> dict:
        return {"total": self.total, "target_threads_with_sidecar": self.target, "sidecar_threads": self.sidecar,
                "sidecar_device": self.sidecar_device, "machine_cores": self.machine,
                "rule": "every method gets `total` CPU threads: sidecar methods split them between the target and "
                        "the sidecar's process, the others give them all to the target; ar-all-cores uses every "
                        "core, ar-target-threads the target's share only (the secondary baseline)"}


def item_seed(cfg: BenchConfig, dataset: str, sample_id) -> int:
    """The sampling seed of one item: the run's --seed and the item, so every method of a run draws the same
    uniforms on it (and a rerun with the same --seed the same tokens), while items differ from one another."""
    return (int(cfg.seed) * 1_000_003 + zlib.crc32(f"{dataset}\x1f{sample_id}".encode())) % 2**63


def check_sampling(cfg: BenchConfig) -> None:
    """Refuse bad sampling options before any model is loaded."""
    from oospec.engine.distribution import check_sampling_options

    check_sampling_options(cfg.temperature, cfg.top_p, cfg.top_k, cfg.seed)


def plan_cores(cfg: BenchConfig, default_threads: int, with_sidecar: bool) -> Cores:
    """`default_threads`: torch's own choice (all physical cores)."""
    from oospec.engine.threads import split_cores

    device = cfg.sidecar_device if with_sidecar else None
    target, sidecar = split_cores(default_threads, cfg.threads, cfg.sidecar_threads, device)
    return Cores(target, sidecar, cfg.sidecar_device if with_sidecar else None, os.cpu_count() or 1)
