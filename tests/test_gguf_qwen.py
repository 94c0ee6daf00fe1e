"""The shipped Qwen GGUFs run as stored: the 1.5B target (Q4_K and Q6_K) and the 0.5B (Q5_0, Q8_0, Q4_K, Q6_K) give
the expanded float32 folder's logits bit for bit and its greedy tokens, in bfloat16 and float32. Slow: each pulls
and expands its model (1.1 GB and 0.5 GB downloads, 6.7 GB and 2.4 GB folders)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oospec.drafters import make_drafter
from oospec.engine.decode import generate
from oospec.engine.drafting import Request
from oospec.engine.invariant import STEP_ROWS, install
from oospec.engine.quantized import load_gguf_model
from oospec.engine.target import TargetBackend

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris tomorrow, in celsius?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                    b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_the_qwen_ggufs_are_their_expanded_folders(name, dtype):
    from oospec.models.loading import load_model
    from oospec.models.provision import pull, pull_gguf

    quantized, tokenizer = load_gguf_model(pull_gguf(name, progress=False), dtype=dtype)
    expanded, _ = load_model(pull(name, progress=False), dtype=str(dtype).removeprefix("torch."))
    assert install(quantized)["applied"] and install(expanded)["applied"]
    prompt = np.asarray(tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                                      return_dict=True)["input_ids"], dtype=np.int64)
    outs = []
    for model in (quantized, expanded):
        # chunks within the invariant forward's rows: a longer float32 prefill of the expanded model takes oneDNN
        target = TargetBackend(model, prefill_chunk=STEP_ROWS)
        target.reset(prompt.size + 40)
        first = target.prefill_logits(prompt)
        out = generate(target, make_drafter("toolspec"), Request(prompt, frozenset(), max_new_tokens=32))
        outs.append((first, out.tokens))
    assert same_bits(outs[0][0], outs[1][0]), "first logits differ"
    assert np.array_equal(outs[0][1], outs[1][1]), f"{outs[0][1]} vs {outs[1][1]}"
