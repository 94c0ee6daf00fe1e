"""Plain sampling (temperature > 0), one target forward per token, through the same backend and caches.

The baseline of speculative sampling (decode.generate with SamplingParams): both draw position j's token as
inverse_cdf(target_distribution(logits), uniforms[j]), so with the same seed they return the same tokens.
Here tau is 1 and stats.sampling says "sample(...)".
"""

from __future__ import annotations

import time

import numpy as np

from oospec.engine.constraint import GrammarConstraint
from oospec.engine.decode import Generation, GenerationStats, OnTokens, check_fits
from oospec.engine.distribution import SamplingParams, inverse_cdf, target_distribution
from oospec.engine.drafting import Request
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree


def sample(
    target: TargetBackend,
    request: Request,
    max_new_tokens: int,
    sampling: SamplingParams,
    *,
    prefix_cache: PrefixCache | None = None,
    on_tokens: OnTokens | None = None,
    constraint: GrammarConstraint | None = None,
) -> Generation:
    """Sample a reply to `request.prompt_ids` token by token (see the module docstring); under `constraint`, from
    the logits its grammar allows (oospec.engine.constraint)."""
    prompt = np.asarray(request.prompt_ids, dtype=np.int64)
    p = prompt.size
    check_fits(p, max_new_tokens, target.max_context)
    uniforms = sampling.uniforms(max(max_new_tokens, 1))  # one per output position, as speculative sampling draws them
    stats = GenerationStats(sampling=f"sample({sampling.describe()})")
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
        if constraint is not None:
            logits = constraint.mask_next(logits)
        token = inverse_cdf(target_distribution(logits.cpu(), sampling), float(uniforms[len(tokens)]))
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
        if constraint is not None:
            constraint.advance([token])
        logits = target.verify_logits(token, TokenTree.empty())[0]
        target.commit(np.empty(0, dtype=np.int64))
    stats.decode_s = time.perf_counter() - t_decode
    if prefix_cache is not None:
        prefix_cache.store(target, np.concatenate([prompt, np.asarray(tokens, dtype=np.int64)]))
    stats.new_tokens = len(tokens)
    return Generation(tokens=np.asarray(tokens, dtype=np.int64), stats=stats, finish_reason=finish_reason)
