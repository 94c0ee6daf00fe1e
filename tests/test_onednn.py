"""optimize_for_cpu must not change what the model computes: same logits up to float rounding, same tokens."""

import copy

import numpy as np
import pytest
import torch
from helpers import greedy_reference, tiny_model
from transformers import DynamicCache

from oospec.engine.onednn import optimize_for_cpu
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree

VOCAB = 512
TOL = 1e-4


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def pair(request):
    """(stock, optimized) copies of one tiny random model."""
    stock = tiny_model(request.param, seed=1, vocab=VOCAB)
    fast = copy.deepcopy(stock)
    report = optimize_for_cpu(fast)
    assert report["applied"], report
    assert report["linear"] == 14 and report["lm_head"]  # 7 projections x 2 layers
    return stock, fast


def _ids(n, seed=0):
    return torch.as_tensor(np.random.default_rng(seed).integers(1, VOCAB, n)).view(1, n)


@torch.inference_mode()
@pytest.mark.parametrize("n", [1, 2, 7, 33, 120])
def test_prompt_logits_match(pair, n):
    stock, fast = pair
    ids = _ids(n, n)
    a, b = stock(ids).logits, fast(ids).logits
    assert (a - b).abs().max().item() < TOL
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@torch.inference_mode()
def test_k_new_tokens_over_cache(pair):
    """The verification shape: k = 1..17 new tokens over a cached prompt, as one forward each."""
    stock, fast = pair
    prompt = _ids(45, 3)
    caches = []
    for model in (stock, fast):
        cache = DynamicCache(config=model.config)
        model(prompt, cache=cache, use_cache=True)
        caches.append(cache)
    for k in range(1, 18):
        new = _ids(k, 100 + k)
        outs = []
        for model, cache in zip((stock, fast), caches):
            outs.append(model(new, cache=cache, use_cache=True).logits)
            cache.crop(-k)  # back to the prompt
        assert (outs[0] - outs[1]).abs().max().item() < TOL, k
        assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1)), k


def test_tree_verification_matches(pair):
    """Through the engine's own path: preallocated slot cache and an additive 4D tree mask."""
    stock, fast = pair
    rng = np.random.default_rng(5)
    prompt = rng.integers(1, VOCAB, 30)
    targets = [TargetBackend(m) for m in (stock, fast)]
    for t in targets:
        t.reset(64)
    pendings = [t.prefill(prompt) for t in targets]
    assert pendings[0] == pendings[1]
    for k in (1, 4, 9, 17):
        tree = TokenTree.chain(rng.integers(1, VOCAB, k - 1))
        a, b = (t.verify(pendings[0], tree) for t in targets)
        assert np.array_equal(a, b), k


@pytest.mark.parametrize("n", [3, 17, 60])
def test_greedy_generate_identical(pair, n):
    stock, fast = pair
    prompt = np.random.default_rng(n).integers(1, VOCAB, n)
    a = greedy_reference(stock, prompt, 20)
    b = greedy_reference(fast, prompt, 20)
    assert a.size == 20 and np.array_equal(a, b)


def test_second_call_is_harmless(pair):
    _, fast = pair
    report = optimize_for_cpu(fast)
    assert report["applied"] and report["linear"] == 0 and not report["lm_head"]


def test_noop_on_unsupported():
    bf16 = tiny_model("qwen2", vocab=VOCAB).to(torch.bfloat16)
    report = optimize_for_cpu(bf16)
    assert not report["applied"] and "float32" in report["reason"]
    assert type(bf16.model.layers[0].mlp.up_proj) is torch.nn.Linear

    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)).eval()
    report = optimize_for_cpu(gpt2)
    assert not report["applied"] and "architecture" in report["reason"]


@torch.inference_mode()
def test_padded_batch_matches(pair):
    """A left-padded batch: the 2D padding mask goes through the same mask code as "sdpa"."""
    stock, fast = pair
    ids = torch.cat([torch.zeros(1, 6, dtype=torch.long), _ids(10, 1)], 1)
    ids = torch.cat([ids, _ids(16, 2)], 0)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    a, b = stock(ids, attention_mask=mask).logits, fast(ids, attention_mask=mask).logits
    assert (a[0, 6:] - b[0, 6:]).abs().max().item() < TOL and (a[1] - b[1]).abs().max().item() < TOL
    gen = dict(attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(stock.generate(ids, **gen), fast.generate(ids, **gen))


def test_noop_off_cpu():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):  # stands in for CUDA: any device that is not the CPU is left alone
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    report = optimize_for_cpu(model)
    assert not report["applied"] and "not cpu" in report["reason"]
    assert model.config._attn_implementation != "oospec_cpu_sdpa"
