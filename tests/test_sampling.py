"""Sampling in the engine: seeded, and at a tiny temperature (or top_p) the greedy tokens, also from a reused
prefix."""

import numpy as np
import pytest
from helpers import conversation, decode_request, greedy_reference

from oospec.engine.distribution import SamplingParams
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.decode import generate
from oospec.engine.target import TargetBackend

MAX_NEW = 24

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sampling_is_seeded_and_tends_to_greedy_at_low_temperature(tiny):
    target = TargetBackend(tiny)
    prompt = conversation(2)[0]
    a = generate(target, None, decode_request(prompt, MAX_NEW, sampling=SamplingParams(1.0, seed=7)))
    b = generate(target, None, decode_request(prompt, MAX_NEW, sampling=SamplingParams(1.0, seed=7)))
    c = generate(target, None, decode_request(prompt, MAX_NEW, sampling=SamplingParams(1.0, seed=8)))
    assert np.array_equal(a.tokens, b.tokens) and not np.array_equal(a.tokens, c.tokens)
    assert a.stats.sampling.startswith("sample(") and a.stats.tau == 1.0
    # At a tiny temperature, sampling picks the argmax: the sampler reads the right logits at every step.
    cold = generate(target, None, decode_request(prompt, MAX_NEW, sampling=SamplingParams(1e-4, seed=1)))
    assert np.array_equal(cold.tokens, greedy_reference(tiny, prompt, MAX_NEW))
    # ... also when the prompt starts from a reused prefix, and top_p -> 0 keeps only the top token.
    cache = PrefixCache(max_bytes=64 << 20, min_tokens=4)
    generate(target, None, decode_request(prompt, 4, sampling=SamplingParams(1.0, seed=1)), prefix_cache=cache)
    longer = np.concatenate([prompt, np.arange(30, 40)])
    out = generate(target, None, decode_request(longer, MAX_NEW, sampling=SamplingParams(1.0, top_p=1e-6, seed=3)),
                   prefix_cache=cache)
    assert out.stats.prompt_tokens_reused >= prompt.size
    assert np.array_equal(out.tokens, greedy_reference(tiny, longer, MAX_NEW))
