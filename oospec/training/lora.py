"""LoRA training of the sidecar on its own task rows (`oospec sidecar train`).

Each step encodes a request's prompt once without gradients and trains all of its rows as one batch over that
cached prompt (left-padded rows, as the predictor runs them): a request with five slots costs one prompt
forward, not five. Gradients flow through the row tokens only (the prompt's keys and values are treated as
given), which is what makes training fit this CPU. Loss: cross-entropy on the completion tokens, plus (weight
`rank_weight`) a ranking loss on the function choice: the softmax, over the offered tools, of each name row's
summed log-probability (the predictor's own score) should put the teacher's tool first.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from oospec.engine.prefix_cache import common_prefix_length
from oospec.engine.target import cache_arg
from oospec.errors import MissingExtraError, optional_import
from oospec.sidecar.predictor import SIDECAR_SETTINGS, TaskFormat
from oospec.training.config import TrainConfig
from oospec.training.rows import RequestRows, rows_for

STATE_FILE = "train_state.pt"
# Settings that may differ between a run and the run it resumes (they do not change what is trained).
_RESUME_FREE = ("threads", "checkpoint_every")


@dataclass
class Encoded:
    shared: list[int]  # prompt tokens shared by every row
    rows: list[list[int]]  # per row: tokens after the shared part
    label_from: list[int]  # per row: index in `rows[i]` of its first completion token (>= 1)
    supervised: list[bool]  # per row: cross-entropy on its completion
    choices: list[int]  # rows scoring each offered tool's name ([]: one tool, nothing to rank)
    chosen: int  # the teacher's tool, as an index into `choices`


def encode_rows(rr: RequestRows, fmt: TaskFormat, max_prompt_tokens: int, prompt_only: bool = False) -> Encoded | None:
    """`prompt_only`: the shared part is the prompt exactly (in-target rows: what the target reads without the
    adapter), so a row may start at its completion (its first token is then predicted by the prompt's last
    position, outside the rows, and carries no loss); else the longest part all rows share, short of every
    completion."""
    full = [fmt.encode(rr.prompt + p + c) for p, c in zip(rr.prefixes, rr.completions)]
    ctx = [fmt.encode(rr.prompt + p) for p in rr.prefixes]
    starts = [common_prefix_length([f, c]) for f, c in zip(full, ctx)]
    if prompt_only:
        shared = min(common_prefix_length([fmt.encode(rr.prompt), *full]), min(map(len, full)) - 1)
    else:
        shared = min(common_prefix_length(full), min(starts) - 1)
    if shared <= 0 or shared > max_prompt_tokens:
        return None
    return Encoded(full[0][:shared], [f[shared:] for f in full], [s - shared for s in starts],
                   rr.supervised or [True] * len(full), rr.choices, rr.chosen)


def supervised_tokens(enc: Encoded) -> int:
    """How many completion tokens of `enc` carry cross-entropy (the labels `request_loss` sets)."""
    return sum(len(r) - max(1, f) for r, f, sup in zip(enc.rows, enc.label_from, enc.supervised) if sup)


class RequestLoss(NamedTuple):
    tokens_nll: torch.Tensor  # summed cross-entropy over the completion tokens of the supervised rows
    rank: torch.Tensor | None  # function-ranking loss (None: the request offers one tool)
    ranked_first: bool  # the teacher's tool has the highest score


def request_loss(model, enc: Encoded, prompt_without_adapter: bool = False) -> RequestLoss:
    """`prompt_without_adapter`: the shared prompt's keys and values are the base model's own (peft's
    `disable_adapter`), the rows' the adapted model's (in-target slot rows)."""
    from contextlib import nullcontext

    from transformers.cache_utils import DynamicCache

    s = len(enc.shared)
    cache = DynamicCache()
    with torch.no_grad(), model.disable_adapter() if prompt_without_adapter else nullcontext():
        model(input_ids=torch.tensor([enc.shared]), position_ids=torch.arange(s)[None], use_cache=True,
              **cache_arg(cache), logits_to_keep=1)
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
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **cache_arg(cache))
    logits = out.logits.float()
    token_nll = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                                                  ignore_index=-100, reduction="none").view(r, width)
    supervised = torch.tensor(enc.supervised)[:, None] & (labels != -100)
    loss = (token_nll * supervised).sum()
    rank, first = None, False
    if enc.choices:
        # The predictor's score of a name: its row's summed log-probability after the shared prefix.
        scores = -token_nll[enc.choices].sum(-1)
        rank = torch.nn.functional.cross_entropy(scores[None], torch.tensor([enc.chosen]))
        first = int(scores.argmax()) == enc.chosen
    return RequestLoss(loss, rank, first)


def predictor_settings(cfg: TrainConfig) -> dict:
    """How the predictor should query an adapter trained with `cfg` (saved beside it as SIDECAR_SETTINGS)."""
    # The call-or-none row was trained: this adapter's belief that a call comes is worth acting on.
    settings = {"min_call_probability": 0.5}
    if cfg.prompt_without_adapter:  # trained on rows over the base model's own reading of the prompt
        settings["prompt_without_adapter"] = True
    if cfg.rank_weight > 0:
        # Trained to rank whole names; and it leans towards the names it was trained on, whatever the request:
        # that lean (the names' prior without the conversation) is taken out.
        settings.update(rank_by="total", prior_weight=1.0)
    return settings


def _name_base(path: Path, base: str) -> None:
    """The base model by its oospec name, not this machine's cache path: the adapter is shipped."""
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _store_half(path: Path) -> None:
    """float16 on disk (half the size to ship; loaded into the base model's dtype, merged at load time)."""
    from safetensors.torch import load_file, save_file

    if path.is_file():
        tensors = load_file(str(path))
        save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})


def _save_adapter(model, out: Path, cfg: TrainConfig) -> None:
    model.save_pretrained(str(out))
    _store_half(out / "adapter_model.safetensors")
    _name_base(out / "adapter_config.json", cfg.base)
    (out / SIDECAR_SETTINGS).write_text(json.dumps(predictor_settings(cfg)) + "\n")


def _resume_key(cfg: TrainConfig, n_requests: int) -> dict:
    return {"config": {k: v for k, v in asdict(cfg).items() if k not in _RESUME_FREE}, "requests": n_requests}


def _load_state(path: Path, key: dict) -> dict | None:
    """The saved state of an interrupted run of the same training, else None (a different run starts afresh)."""
    if not path.exists():
        return None
    state = torch.load(path, weights_only=False)
    return state if state.get("key") == key else None


def train(traces: list[dict], out_dir: str | Path, cfg: TrainConfig, *, model=None, tokenizer=None,
          progress: bool = True, max_minutes: float | None = None, max_steps: int | None = None) -> dict:
    """Train a LoRA adapter on `traces`; writes the adapter, its config, the loss log and a PNG to out_dir, and
    the adapter after each epoch to out_dir/epoch-N (so a checkpoint can be chosen on validation).

    Resumable: the training state is saved every `cfg.checkpoint_every` steps; the same call on the same traces
    and config continues where a stopped run left off. `max_minutes` (or `max_steps` steps in this call) stops and
    saves; the summary then says `"finished": false`."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from peft.utils import get_peft_model_state_dict
    from tqdm.auto import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if model is None:
        from oospec.models.loading import load_model

        model, tokenizer = load_model(cfg.base, dtype=cfg.dtype, device="cpu")
    fmt = TaskFormat(tokenizer)
    encoded = []
    for t in traces:
        rr = rows_for(t, fmt)
        enc = encode_rows(rr, fmt, cfg.max_prompt_tokens, cfg.prompt_without_adapter) if rr is not None else None
        if enc is not None:
            encoded.append(enc)
    if not encoded:
        raise ValueError("no usable training rows in these traces (no parsed calls?)")
    if cfg.init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
    else:
        lora = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=cfg.target_modules, task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:  # adapters are shipped in float16, a bfloat16 base would round them: the factors train in float32
        p.data = p.data.float()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = (len(encoded) + cfg.batch_requests - 1) // cfg.batch_requests
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min(1.0, (k + 1) / max(1, cfg.warmup_steps)) * max(0.0, 1 - k / max(1, total)))
    rng = random.Random(cfg.seed)
    log: list[dict] = []
    key = _resume_key(cfg, len(encoded))
    state_path = out / STATE_FILE
    state = _load_state(state_path, key)
    epoch0, next0, order, done_s = 0, 0, None, 0.0
    if state is not None:
        set_peft_model_state_dict(model, state["lora"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        rng.setstate(state["rng"])
        log, epoch0, next0, order, done_s = state["log"], state["epoch"], state["next"], state["order"], state["train_s"]

    def save_state(epoch: int, nxt: int, order: list[int]) -> None:
        torch.save({"key": key, "lora": get_peft_model_state_dict(model), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "rng": rng.getstate(), "log": log, "epoch": epoch, "next": nxt,
                    "order": order, "train_s": done_s + time.time() - t0}, state_path)

    t0 = time.time()
    deadline = t0 + 60 * max_minutes if max_minutes else None
    finished, steps_now = True, 0
    bar = tqdm(total=total, initial=len(log), desc="train", unit="step", disable=not progress)
    for epoch in range(epoch0, cfg.epochs):
        if order is None or epoch != epoch0:
            order = list(range(len(encoded)))
            rng.shuffle(order)
            next0 = 0 if epoch != epoch0 else next0
        for k in range(next0, len(order), cfg.batch_requests):
            if (deadline is not None and time.time() > deadline) or (max_steps is not None and steps_now >= max_steps):
                save_state(epoch, k, order)
                finished = False
                break
            batch = [encoded[i] for i in order[k : k + cfg.batch_requests]]
            opt.zero_grad(set_to_none=True)
            tokens = sum(supervised_tokens(e) for e in batch)
            total_loss, rank_loss, ranked, top = 0.0, 0.0, 0, 0
            for enc in batch:
                loss = request_loss(model, enc, cfg.prompt_without_adapter)
                objective = loss.tokens_nll / max(1, tokens)
                if loss.rank is not None:
                    objective = objective + cfg.rank_weight * loss.rank / len(batch)
                    rank_loss += float(loss.rank.detach())
                    ranked += 1
                    top += loss.ranked_first
                objective.backward()
                total_loss += float(loss.tokens_nll.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            log.append({"step": len(log) + 1, "epoch": epoch, "loss": total_loss / max(1, tokens),
                        "rank_loss": rank_loss / ranked if ranked else None, "ranked": ranked, "ranked_top": top,
                        "tokens": tokens, "elapsed_s": round(done_s + time.time() - t0, 1)})
            bar.set_postfix(loss=f"{log[-1]['loss']:.3f}", rank=f"{log[-1]['rank_loss'] or 0:.3f}")
            bar.update(1)
            steps_now += 1
            if len(log) % cfg.checkpoint_every == 0:
                save_state(epoch, k + cfg.batch_requests, order)
        if not finished:
            break
        _save_adapter(model, out / f"epoch-{epoch + 1}", cfg)
        save_state(epoch + 1, 0, None)  # the next epoch shuffles afresh (from the saved rng state)
    bar.close()
    summary = {"config": asdict(cfg), "requests": len(encoded), "rows": sum(len(e.rows) for e in encoded),
               "steps": len(log), "finished": finished, "train_s": round(done_s + time.time() - t0, 1),
               "first_loss": log[0]["loss"] if log else None,
               "last_loss": float(np.mean([x["loss"] for x in log[-3:]])) if log else None,
               # Training requests whose tool the sidecar ranked first, as it went (per epoch).
               "function_ranked_first": [round(sum(x["ranked_top"] for x in log if x["epoch"] == e)
                                               / max(1, sum(x["ranked"] for x in log if x["epoch"] == e)), 3)
                                         for e in sorted({x["epoch"] for x in log})]}
    # The record so far, also of a stopped run (`finished` says which): a checkpoint of it may be what is shipped.
    (out / "train_config.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "loss.json").write_text(json.dumps(log) + "\n")
    if not finished:
        return summary
    _save_adapter(model, out, cfg)
    try:
        plot_loss(log, out / "loss.png", title=f"LoRA r={cfg.r} on {cfg.base}: {len(encoded)} requests")
    except MissingExtraError as e:
        print(f"loss.png not written: {e}")
    return summary


def plot_loss(log: list[dict], path: Path, title: str = "") -> None:
    """Needs the `plot` extra."""
    matplotlib = optional_import("matplotlib", "plot")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([x["step"] for x in log], [x["loss"] for x in log], marker=".", linewidth=1,
            label="completion loss (nats/token)")
    ranked = [x for x in log if x.get("rank_loss") is not None]
    if ranked:
        ax.plot([x["step"] for x in ranked], [x["rank_loss"] for x in ranked], marker=".", linewidth=1,
                label="function ranking loss (nats/request)")
        ax.legend(fontsize=7)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
