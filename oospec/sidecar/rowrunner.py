"""Batched forwards of the sidecar model over rows that share one cached prefix (the predictor's engine)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch
from transformers.cache_utils import Cache

from oospec.engine.prefix_cache import common_prefix_length
from oospec.engine.target import SlotLayer, cache_arg
from oospec.sidecar.memory import (CHUNK_BYTES, MEMORY_ENV, ForwardCost, WorkingSetTooLarge, default_memory_budget,
                                   gigabytes)


class RowRunner:
    """Batched forwards of a causal LM over rows that share one cached prefix.

    Rows are right-aligned after the prefix (left padding); pads attend to the prefix only, so they stay
    finite and are never attended to by real tokens. Every row of a batch holds its own copy of the prefix's
    cache, so rows run in chunks of at most `chunk_bytes` (each chunk laid out as the whole batch would be:
    a row's result does not depend on the chunk it ran in). Work whose estimated working set (the prefix and
    one row) exceeds `memory_budget` bytes raises WorkingSetTooLarge before anything is allocated.

    `prompt_without_adapter` (in-target slot rows): the model carries a LoRA that applies to the rows
    only. The leading part of a prefix that is the prompt (`prompt_ids`, set by the caller per request) runs with
    the adapter disabled, as the target's own forward reads it; the rest of the prefix and the rows with it."""

    def __init__(self, model: torch.nn.Module, memory_budget: int | None = None, chunk_bytes: int = CHUNK_BYTES,
                 prompt_without_adapter: bool = False):
        self.model = model
        self.prompt_without_adapter = prompt_without_adapter
        self.prompt_ids: list[int] = []  # the request's prompt (prompt_without_adapter only)
        self._prefix_plain = 0  # leading tokens of the cached prefix computed without the adapter
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.neg = torch.finfo(self.dtype).min
        self.memory_budget = memory_budget if memory_budget is not None else default_memory_budget()
        self.chunk_bytes = chunk_bytes
        self.cost = ForwardCost.of(model.config, self.dtype.itemsize)
        self.prefix_ids: list[int] = []
        self._prefix_layers: list[SlotLayer] = []
        self.prefix_logits: torch.Tensor | None = None
        self.kv_bytes_peak = 0  # the most keys-and-values bytes held at once (prefix and rows) since created

    def _check(self, need: int, what: str) -> None:
        if need > self.memory_budget:
            raise WorkingSetTooLarge(f"{what} needs about {gigabytes(need)}, over the sidecar's memory budget of "
                                     f"{gigabytes(self.memory_budget)} (set {MEMORY_ENV} to change it)")

    def rows_per_chunk(self, rows: int, capacity: int, queries: int, keys: int, kept_logits: int) -> int:
        """How many of `rows` rows (each: a cache of `capacity` slots, a first forward of `queries` tokens over
        `keys` keys keeping `kept_logits` logits) run in one forward; raises WorkingSetTooLarge if not even one
        fits beside the prefix."""
        prefix = len(self.prefix_ids) * self.cost.kv_per_token
        one = self.cost.row(capacity, queries, keys, kept_logits)
        self._check(prefix + one, f"a row over a {len(self.prefix_ids)}-token prefix")
        return max(1, min(rows, min(self.chunk_bytes, self.memory_budget - prefix) // one))

    @torch.inference_mode()
    def encode_prefix(self, ids: Sequence[int]) -> None:
        """Run the shared prefix once (batch 1) and keep its keys and values. What it shares with the prefix
        encoded last (the same prompt, then its call opening; the same request asked again for the function
        the target chose) is reused."""
        ids = list(ids)
        if ids == self.prefix_ids:
            return
        n = len(ids)
        reuse = min(common_prefix_length([ids, self.prefix_ids]) if self.prefix_ids else 0, n - 1)
        plain = min(common_prefix_length([ids, self.prompt_ids]), n) if self.prompt_without_adapter else 0
        if plain != self._prefix_plain:  # the cached tokens past the shorter prompt were computed the other way
            reuse = min(reuse, plain, self._prefix_plain)
        # With a row after it: a prefix whose one row cannot run is refused before it is encoded.
        self._check(self.cost.prefix(n, n - reuse) + self.cost.row(n + 1, 1, n + 1, 1), f"a {n}-token prompt")
        layers = [SlotLayer(n) for _ in range(self.model.config.num_hidden_layers)]
        if reuse > 0:
            for layer, old in zip(layers, self._prefix_layers):
                layer.load(old.keys, old.values, reuse)
        cache = Cache(layers=layers)
        if plain > reuse:
            with adapter_disabled(self.model):
                logits = self._extend(ids, reuse, plain, cache, layers)
        if n > max(reuse, plain):
            logits = self._extend(ids, max(reuse, plain), n, cache, layers)
        self._note_kv(layers, self._prefix_layers)
        self.prefix_ids, self._prefix_layers, self._prefix_plain = ids, layers, plain
        self.prefix_logits = logits

    def _extend(self, ids: list[int], start: int, end: int, cache: Cache, layers: list[SlotLayer]) -> torch.Tensor:
        """Append ids[start:end] to the prefix's cache; the logits after its last token."""
        x = torch.tensor([ids[start:end]], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, position_ids=torch.arange(start, end, device=self.device)[None], use_cache=True,
                         **cache_arg(cache), logits_to_keep=1)
        for layer in layers:
            layer.keep(None, end - start)
        return out.logits[0, -1].float()

    def _note_kv(self, *held: list[SlotLayer]) -> None:
        """Record the keys-and-values bytes of the caches held at once (for the memory tests)."""
        now = sum(x.keys.nbytes + x.values.nbytes for layers in held for x in layers if x.is_initialized)
        self.kv_bytes_peak = max(self.kv_bytes_peak, now)

    def _row_cache(self, rows: int, capacity: int) -> tuple[Cache, list[SlotLayer]]:
        layers = [SlotLayer(capacity) for _ in self._prefix_layers]
        for layer, src in zip(layers, self._prefix_layers):
            layer.load(src.keys, src.values, len(self.prefix_ids), rows=rows)
        self._note_kv(layers, self._prefix_layers)
        return Cache(layers=layers), layers

    @torch.inference_mode()
    def run(self, suffixes: Sequence[Sequence[int]], steps: int = 0, keep_all_logits: bool = False,
            stop=None, first: Sequence[np.ndarray | None] | None = None):
        """Feed each row its suffix after the prefix, then decode greedily up to `steps` tokens per row.

        Returns (suffix log-probs: list of (len,) arrays of each suffix token's log-probability, generated
        ids: (rows, <=steps) array; a row's ids after the one its `stop` accepted mean nothing). `stop(row, ids)
        -> bool` ends a row early (all rows of a chunk ended: its decoding stops). `first`: per row, the ids its
        first generated token is chosen among (None: any). Rows run in chunks (`rows_per_chunk`), each padded
        to the width of the whole batch, so a row's tokens are those it gets in a batch of any size."""
        r = len(suffixes)
        width = max(len(suf) for suf in suffixes)
        s = len(self.prefix_ids)
        chunk = self.rows_per_chunk(r, s + width + steps, width, s + width, width if keep_all_logits else 1)
        logprobs: list[np.ndarray] = []
        parts: list[np.ndarray] = []
        for start in range(0, r, chunk):
            rows = range(start, min(r, start + chunk))
            chunk_stop = None if stop is None else (lambda i, ids, start=start: stop(start + i, ids))
            lp, gen = self._run_rows([suffixes[i] for i in rows], width, steps, keep_all_logits, chunk_stop,
                                     None if first is None else [first[i] for i in rows])
            logprobs += lp
            parts.append(gen)
        if len(parts) == 1:
            return logprobs, parts[0]
        generated = np.zeros((r, max(p.shape[1] for p in parts)), dtype=np.int64)
        for start, part in zip(range(0, r, chunk), parts):
            generated[start : start + len(part), : part.shape[1]] = part
        return logprobs, generated

    def _run_rows(self, suffixes: Sequence[Sequence[int]], width: int, steps: int, keep_all_logits: bool, stop,
                  first: Sequence[np.ndarray | None] | None):
        """`run` over one chunk of rows, left-padded to `width`."""
        r = len(suffixes)
        lens = np.array([len(s) for s in suffixes])
        s = len(self.prefix_ids)
        cache, layers = self._row_cache(r, s + width + steps)
        ids = np.zeros((r, width), dtype=np.int64)
        pos = np.zeros((r, width), dtype=np.int64)
        real = np.zeros((r, width), dtype=bool)
        for i, suf in enumerate(suffixes):
            ids[i, width - len(suf):] = suf
            pos[i, width - len(suf):] = s + np.arange(len(suf))
            pos[i, : width - len(suf)] = s
            real[i, width - len(suf):] = True
        # (r, 1, width, s+width): the prefix for everyone; causal among a row's real tokens.
        mask = torch.zeros((r, 1, width, s + width), dtype=self.dtype)
        causal = np.tril(np.ones((width, width), dtype=bool))
        allowed = causal[None] & real[:, None, :]
        mask[:, 0, :, s:] = torch.where(torch.from_numpy(allowed), 0.0, self.neg).to(self.dtype)
        out = self.model(input_ids=torch.from_numpy(ids).to(self.device),
                         position_ids=torch.from_numpy(pos).to(self.device), attention_mask=mask.to(self.device),
                         use_cache=True, **cache_arg(cache), logits_to_keep=0 if keep_all_logits else 1)
        for layer in layers:
            layer.keep(None, width)
        logits = out.logits.float()
        logprobs = []
        if keep_all_logits:
            lsm = torch.log_softmax(logits, -1)
            at_prefix = torch.log_softmax(self.prefix_logits, -1)
            for i, suf in enumerate(suffixes):
                off = width - len(suf)
                lp = [float(at_prefix[suf[0]])] + [float(lsm[i, off + j - 1, suf[j]]) for j in range(1, len(suf))]
                logprobs.append(np.array(lp))
        generated = np.zeros((r, steps), dtype=np.int64)
        if steps == 0:
            return logprobs, generated
        done = np.zeros(r, dtype=bool)
        kv_real = np.concatenate([np.ones((r, s), dtype=bool), real], axis=1)
        last = logits[:, -1]
        if first is not None:
            allowed = torch.zeros_like(last, dtype=torch.bool)
            for i, ids_i in enumerate(first):
                if ids_i is None:
                    allowed[i] = True
                else:
                    allowed[i, torch.from_numpy(ids_i).to(last.device)] = True
            last = last.masked_fill(~allowed, float("-inf"))
        next_ids = last.argmax(-1).cpu().numpy()
        next_pos = s + lens
        for t in range(steps):
            generated[:, t] = next_ids
            for i in np.flatnonzero(~done):
                if stop is not None and stop(i, generated[i, : t + 1]):
                    done[i] = True
            if done.all() or t == steps - 1:
                return logprobs, generated[:, : t + 1]
            kv_real = np.concatenate([kv_real, np.ones((r, 1), dtype=bool)], axis=1)
            step_mask = torch.where(torch.from_numpy(kv_real), 0.0, self.neg).to(self.dtype).view(r, 1, 1, -1)
            out = self.model(input_ids=torch.from_numpy(next_ids).view(r, 1).to(self.device),
                             position_ids=torch.from_numpy(next_pos + t).view(r, 1).to(self.device),
                             attention_mask=step_mask.to(self.device), use_cache=True, **cache_arg(cache))
            for layer in layers:
                layer.keep(None, 1)
            next_ids = out.logits[:, -1].argmax(-1).cpu().numpy()
        return logprobs, generated


@contextmanager
def adapter_disabled(model: torch.nn.Module):
    """The model without its LoRA for the duration: a peft model's `disable_adapter`, or the unmerged LoRAs the
    quantized loader adds (oospec.engine.quantized.LoRALinear) switched off."""
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield
        return
    from oospec.engine.quantized import LoRALinear

    loras = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in loras:
        m.enabled = False
    try:
        yield
    finally:
        for m in loras:
            m.enabled = True
