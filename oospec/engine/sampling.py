"""Ordinary sampling (temperature > 0), one target forward per token, through the same backend and caches.

Speculative decoding here is lossless for greedy decoding only; until distribution-preserving speculative
sampling exists, sampled requests get no drafts (stats.sampling says so, and tau is 1).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from oospec.engine.decode import Generation, GenerationStats, OnTokens, check_fits
from oospec.engine.drafting import Request
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """One token from softmax(logits / temperature), restricted to the smallest top-p set of tokens."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep every token whose preceding mass is below top_p (the first token always stays).
        keep = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
        probs = torch.zeros_like(probs).scatter_(-1, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(
    target: TargetBackend,
    request: Request,
    max_new_tokens: int,
    *,
    temperature: float,
    top_p: float = 1.0,
    seed: int | None = None,
    prefix_cache: PrefixCache | None = None,
    on_tokens: OnTokens | None = None,
) -> Generation:
    """Sample a reply to `request.prompt_ids` token by token (see the module docstring)."""
    if not temperature > 0:
        raise ValueError(f"sampling needs temperature > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    prompt = np.asarray(request.prompt_ids, dtype=np.int64)
    p = prompt.size
    check_fits(p, max_new_tokens, target.max_context)
    generator = None
    if seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
    stats = GenerationStats(sampling=f"sample(temperature={temperature:g}, top_p={top_p:g})")
    tokens: list[int] = []
    finish_reason = "length"
    target.reset(p + max_new_tokens + 1)
    t0 = time.perf_counter()
    reused = prefix_cache.restore(target, prompt) if prefix_cache is not None else 0
    logits = target.prefill_logits(prompt, start=reused)
    stats.prefill_s = time.perf_counter() - t0
    stats.prompt_tokens_reused = reused
    t_decode = time.perf_counter()
    while True:
        token = sample_token(logits.cpu(), temperature, top_p, generator)
        tokens.append(token)
        stats.target_forwards += 1
        told_to_stop = on_tokens is not None and on_tokens(np.array([token], dtype=np.int64))
        if token in request.eos_ids:
            finish_reason = "stop"
            break
        if len(tokens) >= max_new_tokens:
            break
        if told_to_stop:
            finish_reason = "callback"
            break
        logits = target.verify_logits(token, TokenTree.empty())[0]
        target.commit(np.empty(0, dtype=np.int64))
    stats.decode_s = time.perf_counter() - t_decode
    if prefix_cache is not None:
        prefix_cache.store(target, np.concatenate([prompt, np.asarray(tokens, dtype=np.int64)]))
    stats.new_tokens = len(tokens)
    return Generation(tokens=np.asarray(tokens, dtype=np.int64), stats=stats, finish_reason=finish_reason)
