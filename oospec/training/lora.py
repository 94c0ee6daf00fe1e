"""LoRA training of the sidecar on its own task rows (`oospec sidecar train`).

Each step encodes a request's prompt once without gradients and trains all of its rows as one batch over that
cached prompt (left-padded rows, as the predictor runs them): a request with five slots costs one prompt
forward, not five. Gradients flow through the row tokens only (the prompt's keys and values are treated as
given), which is what makes training fit this CPU. Loss: cross-entropy on the completion tokens.
"""

from __future__ import annotations

import inspect
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from oospec.sidecar.predictor import SIDECAR_SETTINGS, TaskFormat, common_prefix_len
from oospec.training.rows import RequestRows, rows_for

LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class TrainConfig:
    """Defaults sized for a 2-core CPU and a few hundred requests: see docs in the README's training section."""

    base: str = "qwen2.5-coder-0.5b"
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(LINEAR_MODULES))
    lr: float = 3e-4
    epochs: int = 2
    batch_requests: int = 4  # requests per optimizer step (each carries all its rows)
    warmup_steps: int = 4
    max_prompt_tokens: int = 2048
    seed: int = 0
    threads: int | None = None


@dataclass
class Encoded:
    shared: list[int]  # prompt tokens shared by every row
    rows: list[list[int]]  # per row: tokens after the shared part
    label_from: list[int]  # per row: index in `rows[i]` of its first completion token (>= 1)


def encode_rows(rr: RequestRows, fmt: TaskFormat, max_prompt_tokens: int) -> Encoded | None:
    full = [fmt.encode(rr.prompt + p + c) for p, c in zip(rr.prefixes, rr.completions)]
    ctx = [fmt.encode(rr.prompt + p) for p in rr.prefixes]
    starts = [common_prefix_len([f, c]) for f, c in zip(full, ctx)]
    shared = min(common_prefix_len(full), min(starts) - 1)
    if shared <= 0 or shared > max_prompt_tokens:
        return None
    return Encoded(full[0][:shared], [f[shared:] for f in full], [s - shared for s in starts])


def _cache_kw(model) -> str:
    params = inspect.signature(model.get_base_model().forward if hasattr(model, "get_base_model")
                               else model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def request_loss(model, enc: Encoded, cache_kw: str) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over the completion tokens of one request's rows, and how many there are."""
    from transformers.cache_utils import DynamicCache

    s = len(enc.shared)
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([enc.shared]), position_ids=torch.arange(s)[None], use_cache=True,
              **{cache_kw: cache}, logits_to_keep=1)
    r = len(enc.rows)
    cache.batch_repeat_interleave(r)
    width = max(len(x) for x in enc.rows)
    ids = torch.zeros((r, width), dtype=torch.long)
    pos = torch.full((r, width), s, dtype=torch.long)
    real = torch.zeros((r, width), dtype=torch.bool)
    labels = torch.full((r, width), -100, dtype=torch.long)
    for i, row in enumerate(enc.rows):
        off = width - len(row)
        ids[i, off:] = torch.tensor(row)
        pos[i, off:] = s + torch.arange(len(row))
        real[i, off:] = True
        for j in range(max(1, enc.label_from[i]), len(row)):
            labels[i, off + j - 1] = row[j]  # position off+j-1 predicts token j
    allowed = torch.tril(torch.ones((width, width), dtype=torch.bool))[None] & real[:, None, :]
    dtype = next(model.parameters()).dtype
    mask = torch.zeros((r, 1, width, s + width), dtype=dtype)
    mask[:, 0, :, s:] = torch.where(allowed, 0.0, torch.finfo(dtype).min)
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **{cache_kw: cache})
    logits = out.logits.float()
    n = int((labels != -100).sum())
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                                             reduction="sum")
    return loss, n


def _store_half(path: Path) -> None:
    """float16 on disk (half the size to ship; loaded into the base model's dtype, merged at load time)."""
    from safetensors.torch import load_file, save_file

    if path.is_file():
        tensors = load_file(str(path))
        save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})


def train(traces: list[dict], out_dir: str | Path, cfg: TrainConfig, *, model=None, tokenizer=None,
          progress: bool = True) -> dict:
    """Train a LoRA adapter on `traces`; writes the adapter, its config, the loss log and a PNG to out_dir."""
    from peft import LoraConfig, get_peft_model
    from tqdm.auto import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if model is None:
        from oospec.models.loading import load_model

        model, tokenizer = load_model(cfg.base, dtype="float32", device="cpu")
    fmt = TaskFormat(tokenizer)
    encoded = []
    for t in traces:
        rr = rows_for(t, fmt)
        enc = encode_rows(rr, fmt, cfg.max_prompt_tokens) if rr is not None else None
        if enc is not None:
            encoded.append(enc)
    if not encoded:
        raise ValueError("no usable training rows in these traces (no parsed calls?)")
    lora = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=cfg.target_modules,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = (len(encoded) + cfg.batch_requests - 1) // cfg.batch_requests
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min(1.0, (k + 1) / max(1, cfg.warmup_steps)) * max(0.0, 1 - k / max(1, total)))
    cache_kw = _cache_kw(model)
    rng = random.Random(cfg.seed)
    log = []
    t0 = time.time()
    bar = tqdm(total=total, desc="train", unit="step", disable=not progress)
    for epoch in range(cfg.epochs):
        order = list(range(len(encoded)))
        rng.shuffle(order)
        for k in range(0, len(order), cfg.batch_requests):
            batch = [encoded[i] for i in order[k : k + cfg.batch_requests]]
            opt.zero_grad(set_to_none=True)
            tokens = sum(sum(len(r) - max(1, f) for r, f in zip(e.rows, e.label_from)) for e in batch)
            total_loss = 0.0
            for enc in batch:
                loss, n = request_loss(model, enc, cache_kw)
                (loss / max(1, tokens)).backward()
                total_loss += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            log.append({"step": len(log) + 1, "epoch": epoch, "loss": total_loss / max(1, tokens),
                        "tokens": tokens, "elapsed_s": round(time.time() - t0, 1)})
            bar.set_postfix(loss=f"{log[-1]['loss']:.3f}")
            bar.update(1)
    bar.close()
    model.save_pretrained(str(out))
    _store_half(out / "adapter_model.safetensors")
    summary = {"config": asdict(cfg), "requests": len(encoded), "rows": sum(len(e.rows) for e in encoded),
               "steps": len(log), "train_s": round(time.time() - t0, 1),
               "first_loss": log[0]["loss"], "last_loss": float(np.mean([x["loss"] for x in log[-3:]]))}
    (out / "train_config.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "loss.json").write_text(json.dumps(log) + "\n")
    # The call-or-none row was trained: this adapter's belief that a call comes is worth acting on.
    (out / SIDECAR_SETTINGS).write_text(json.dumps({"min_call_probability": 0.5}) + "\n")
    plot_loss(log, out / "loss.png", title=f"LoRA r={cfg.r} on {cfg.base}: {len(encoded)} requests")
    return summary


def plot_loss(log: list[dict], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([x["step"] for x in log], [x["loss"] for x in log], marker=".", linewidth=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("completion loss (nats/token)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
