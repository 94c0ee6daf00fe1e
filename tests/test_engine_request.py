"""The engine decodes the Request it is given: Engine.prepare fills that object (no copy), the context is checked
in one function, and what a decode derives for itself (the cost curve) does not stay behind in the request."""

import numpy as np
import pytest
from helpers import tiny_model

from oospec.engine.drafting import Request
from oospec.engine.engine import Engine, fit_context
from oospec.errors import ContextLengthError


def test_fit_context_lowers_max_new_tokens_and_refuses_what_cannot_fit():
    assert fit_context(10, 5, 100) == 5
    assert fit_context(90, 50, 100) == 10
    with pytest.raises(ContextLengthError, match="100 tokens but the model's context is 100"):
        fit_context(100, 1, 100)
    with pytest.raises(ValueError, match="empty prompt"):
        fit_context(0, 1, 100)


def test_prepare_fills_the_request_itself_and_generate_leaves_no_derived_cost(smollm2_tokenizer, one_thread):
    engine = Engine(tiny_model("qwen2", seed=3, vocab=len(smollm2_tokenizer)), smollm2_tokenizer, budget=7)
    request = Request(prompt_ids=[5, 6, 7], max_new_tokens=10**9)
    assert engine.prepare(request) is request
    assert request.prompt_ids.dtype == np.int64 and request.prompt_ids.tolist() == [5, 6, 7]
    assert request.max_new_tokens == engine.target.max_context - 3
    assert request.budget == 7 and request.eos_ids == engine.eos_ids and request.tokenizer is smollm2_tokenizer
    with pytest.raises(ContextLengthError):
        engine.prepare(Request(prompt_ids=np.ones(engine.target.max_context, dtype=np.int64)))
    request = Request(prompt_ids=[5, 6, 7], max_new_tokens=6)
    first = engine.generate(request).tokens
    assert request.cost is None  # the curve of this decode's threads, not kept for the next
    assert np.array_equal(engine.generate(request).tokens, first) and first.size == 6
