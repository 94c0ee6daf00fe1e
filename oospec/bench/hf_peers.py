"""Hugging Face `generate` as a peer: greedy, on the engine's own model, with prompt lookup or an assistant model,
the same threads, eos ids and max_new_tokens as our methods."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

PROMPT_LOOKUP_NUM_TOKENS = 10


class ForwardCounter:
    """Counts calls of a module's forward (prefill included) while attached."""

    def __init__(self, module):
        self.module = module
        self.count = 0
        self._handle = None

    def __enter__(self):
        self.count = 0

        def hook(*_):
            self.count += 1

        self._handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        self._handle = None


def greedy_generation_config(model, eos_ids: Sequence[int], pad_token_id: int):
    """A copy of the model's generation config that is plain greedy: no sampling knobs, no penalties."""
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample = False
    gc.num_beams = 1
    for name in ("temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty",
                 "no_repeat_ngram_size", "encoder_repetition_penalty", "length_penalty"):
        if hasattr(gc, name):
            setattr(gc, name, None)
    gc.eos_token_id = list(eos_ids)
    gc.pad_token_id = pad_token_id
    return gc


def _pad_token_id(engine) -> int:
    for source in (engine.tokenizer, engine.model.generation_config, engine.model.config):
        value = getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return min(engine.eos_ids)


def optimize_like_target(model, optimize: bool) -> None:
    """The CPU kernels Engine.from_pretrained(optimize=...) gives the target, for a model loaded beside it."""
    from oospec.engine.precision import prepare

    prepare(model, optimize)


class HFPeer:
    """Hugging Face `generate` on the engine's model, greedy; subclasses add the drafting."""

    def __init__(self, engine):
        self.engine = engine
        self.pad_token_id = _pad_token_id(engine)
        self.generation_config = greedy_generation_config(engine.model, sorted(engine.eos_ids), self.pad_token_id)

    def call_config(self, max_new_tokens: int):
        """The generation config of one call: greedy, our eos ids and pad id, this many new tokens."""
        gc = copy.deepcopy(self.generation_config)
        gc.max_new_tokens = max_new_tokens
        gc.max_length = None
        return gc

    def kwargs(self) -> dict:
        return {}

    def generate(self, prompt_ids: np.ndarray, max_new_tokens: int) -> tuple[np.ndarray, int, float]:
        """(new token ids, target forwards, end-to-end seconds)."""
        import torch

        model = self.engine.model
        device = next(model.parameters()).device
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).view(1, -1)
        mask = torch.ones_like(ids)
        with ForwardCounter(model) as counter:
            t0 = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=mask,
                generation_config=self.call_config(max_new_tokens),  # do_sample=False, eos, pad: see there
                **self.kwargs(),
            )
            e2e = time.perf_counter() - t0
        tokens = out[0, ids.shape[1]:].detach().cpu().numpy().astype(np.int64)
        return tokens, counter.count, e2e


class PromptLookupPeer(HFPeer):
    def call_config(self, max_new_tokens: int):
        gc = super().call_config(max_new_tokens)
        gc.prompt_lookup_num_tokens = PROMPT_LOOKUP_NUM_TOKENS
        return gc


class AssistedPeer(HFPeer):
    """Assisted generation with a separate assistant model (its forwards are not counted as the target's)."""

    def __init__(self, engine, assistant_model: Any, assistant_tokenizer: Any = None):
        super().__init__(engine)
        self.assistant_model = assistant_model
        same_vocab = assistant_tokenizer is None or assistant_tokenizer.get_vocab() == engine.tokenizer.get_vocab()
        self.assistant_tokenizer = None if same_vocab else assistant_tokenizer

    def kwargs(self) -> dict:
        kw: dict[str, Any] = {"assistant_model": self.assistant_model}
        if self.assistant_tokenizer is not None:
            kw.update(tokenizer=self.engine.tokenizer, assistant_tokenizer=self.assistant_tokenizer)
        return kw
