"""SmolLM2-135M run from its GGUF as published (Q4_1 layers, a Q8_0 tied embedding, float32 norms), weights kept
in their blocks: the same logits, bit for bit, and the same greedy tokens as the expanded float32 folder the
same file converts into, in float32 and in bfloat16, plain and speculative; and no expanded copy in memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oospec.drafters import make_drafter
from oospec.engine.decode import generate
from oospec.engine.drafting import Request
from oospec.engine.invariant import install
from oospec.engine.quantized import QuantizedEmbedding, QuantizedLinear, dequantized, load_gguf_model
from oospec.engine.target import TargetBackend

SMOLLM2 = "smollm2-135m"
# Prompt chunks within the invariant forward's row limit: the expanded float32 model's longer prefills take
# oneDNN's GEMM (another summation order), the quantized one's never do, so longer chunks could differ there.
PREFILL_CHUNK = 32
MESSAGES = (
    [{"role": "user", "content": "What is the weather in Paris tomorrow? Answer in one sentence."}],
    [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Book a table for 4 at 7pm."}],
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def smollm2_gguf():
    from oospec.models.provision import pull_gguf

    try:
        return pull_gguf(SMOLLM2, progress=False)
    except Exception as exc:  # no network, a failed integrity check: say so and stop here
        reason = f"{type(exc).__name__}: {exc}"
    pytest.fail(f"these tests need the {SMOLLM2} GGUF and could not pull it: {reason}", pytrace=False)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=str)
def models(request, smollm2_gguf, smollm2_path):
    """(quantized, expanded, tokenizer from the GGUF, tokenizer of the folder), both models installed."""
    from oospec.models.loading import load_model

    quantized, tokenizer = load_gguf_model(smollm2_gguf, dtype=request.param)
    expanded, folder_tokenizer = load_model(smollm2_path, dtype=str(request.param).removeprefix("torch."))
    assert install(quantized)["applied"] and install(expanded)["applied"]
    return quantized, expanded, tokenizer, folder_tokenizer


def prompt_ids(tokenizer, messages) -> np.ndarray:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return np.asarray(encoded["input_ids"], dtype=np.int64)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                    b.contiguous().view(torch.uint8))


def test_the_metadata_gives_the_folders_tokenizer_and_chat_template(models):
    _, _, tokenizer, folder_tokenizer = models
    assert tokenizer.chat_template == folder_tokenizer.chat_template
    for messages in MESSAGES:
        assert np.array_equal(prompt_ids(tokenizer, messages), prompt_ids(folder_tokenizer, messages))


def test_weights_stay_in_their_blocks(models, smollm2_gguf):
    quantized = models[0]
    linears = [m for m in quantized.modules() if isinstance(m, QuantizedLinear)]
    assert len(linears) == 7 * quantized.config.num_hidden_layers + 1  # q k v o gate up down, and the head
    assert isinstance(quantized.model.embed_tokens, QuantizedEmbedding)
    # the tied head reads the embedding's blocks, held once
    assert quantized.lm_head.weight_blocks is quantized.model.embed_tokens.weight_blocks
    assert all(m.weight_blocks.regrouped for m in linears)  # Q4_1 and Q8_0: regrouped by 16 rows
    held = {t.data_ptr(): t.nbytes for t in list(quantized.parameters()) + list(quantized.buffers())}
    assert sum(held.values()) < 1.05 * smollm2_gguf.stat().st_size  # float32 would be ~5x the file


def test_the_tied_head_and_embedding_are_the_expanded_matrices(models):
    quantized, expanded = models[:2]
    ids = torch.tensor([[0, 1, 17, 4095, 49151]])
    assert same_bits(quantized.model.embed_tokens(ids), expanded.model.embed_tokens(ids))
    head = torch.from_numpy(dequantized(quantized.lm_head)).to(expanded.dtype)
    # the expanded head is packed for the kernels (its panels replace the matrix): compare through a product
    x = torch.randn(3, head.shape[1], generator=torch.Generator().manual_seed(0)).to(expanded.dtype)
    assert same_bits(quantized.lm_head(x), expanded.lm_head(x))
    assert same_bits(quantized.lm_head.ops.linear(x, head, None), expanded.lm_head(x))


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_greedy_tokens_and_logits_are_the_expanded_models(models, method):
    quantized, expanded, tokenizer, _ = models
    for i, messages in enumerate(MESSAGES):
        prompt = prompt_ids(tokenizer, messages)
        outs = []
        for model in (quantized, expanded):
            target = TargetBackend(model, prefill_chunk=PREFILL_CHUNK)
            target.reset(prompt.size + 64)
            first = target.prefill_logits(prompt)
            out = generate(target, make_drafter(method), Request(prompt, frozenset(), max_new_tokens=24))
            outs.append((first, out.tokens))
        (q_first, q_tokens), (e_first, e_tokens) = outs
        assert same_bits(q_first, e_first), f"prompt {i}: first logits differ"
        assert np.array_equal(q_tokens, e_tokens), f"prompt {i}: {q_tokens} vs {e_tokens}"
        # every logit of the generated text, the last STEP_ROWS positions in one forward of each model
        ids = torch.as_tensor(np.concatenate([prompt, q_tokens]))[-48:].view(1, -1)
        with torch.inference_mode():
            assert same_bits(quantized(ids).logits, expanded(ids).logits), f"prompt {i}: logits differ"
