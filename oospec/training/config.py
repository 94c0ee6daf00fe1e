"""The training options' defaults, in a module light enough for the command line to read at parse time (the
trainer itself imports torch and transformers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from oospec.models.registry import DEFAULT_SIDECAR

LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# `oospec sidecar tune`: the largest share of the teacher's calls a chosen setting may answer "no call".
MAX_MISSED_CALLS = 0.02


@dataclass
class TrainConfig:
    """Defaults sized for a 2-core CPU and a few hundred requests: see docs in the README's training section.
    The LoRA rank and alpha are the shipped adapter's (its adapter_config.json)."""

    base: str = DEFAULT_SIDECAR
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(LINEAR_MODULES))
    lr: float = 3e-4
    epochs: int = 2
    batch_requests: int = 4  # requests per optimizer step (each carries all its rows)
    warmup_steps: int = 4
    rank_weight: float = 1.0  # function-ranking loss, per request, beside the per-token cross-entropy
    max_prompt_tokens: int = 2048
    seed: int = 0
    threads: int | None = None
    checkpoint_every: int = 10  # optimizer steps between saved training states (a stopped run resumes there)
    # Start from this adapter's weights (its r and alpha) instead of a fresh LoRA: more data on top of a trained
    # adapter. Its training tools must then count as used (`split_traces(always_train_tools=...)`).
    init_adapter: str | None = None
    # In-target slot rows: the base is the target itself, which reads the prompt with its own weights;
    # the LoRA applies to the rows only. The shared prompt is then exactly the request's prompt (never a row's
    # primed text) and is computed with the adapter disabled, as the target's own forward computes it.
    prompt_without_adapter: bool = False
    # The base model's weights in training: "bfloat16" runs its matmuls on the CPU's bfloat16 units (AMX,
    # AVX512-BF16) with the LoRA factors kept in float32; "float32" as before.
    dtype: str = "float32"
