"""Equivalence on real weights: SmolLM2-135M (llama family) in the fast suite, Qwen2.5-Coder-0.5B marked slow."""

import numpy as np
import pytest
from adversarial import DecoyOracleDrafter, HugeTreeDrafter, RandomTreeDrafter, RepeatDrafter
from helpers import greedy_reference

from oospec.drafters import make_drafter
from oospec.engine.drafting import Request

CHATS = [
    [{"role": "user", "content": "What is 2+2? Answer in one sentence."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "List three colours of the rainbow, comma separated."}],
    [{"role": "user", "content": "Write a JSON object with keys name and age for Alice, 30."}],
    [{"role": "user", "content": "Repeat after me: the quick brown fox jumps over the lazy dog."}],
    [{"role": "user", "content": "Call the weather tool for Paris. Reply with JSON "
                                 "{\"name\": \"get_weather\", \"arguments\": {\"city\": ...}}."}],
]


@pytest.fixture(scope="module")
def smol(smollm2_engine):
    """The shared engine's model with one prefill forward, as transformers' generate (the reference) does: a
    prompt prefilled in other chunks may round differently, and every method here shares this one."""
    from oospec.engine.engine import Engine

    return Engine(smollm2_engine.model, smollm2_engine.tokenizer, prefill_chunk=0)


def check_engine(engine, chats, max_new, extra_drafters=True):
    vocab = engine.model.config.vocab_size
    for i, messages in enumerate(chats):
        prompt = engine.encode(messages)
        reference = greedy_reference(engine.model, prompt, max_new, eos_ids=engine.eos_ids)
        drafters = [make_drafter("ar"), make_drafter("pld")]
        if extra_drafters:
            drafters += [RandomTreeDrafter(vocab, i), HugeTreeDrafter(vocab, i), RepeatDrafter(),
                         DecoyOracleDrafter(reference, vocab, i)]
        for drafter in drafters:
            out = engine.generate(prompt_ids=prompt, drafter=drafter, max_new_tokens=max_new, budget=24)
            assert np.array_equal(out.tokens, reference), f"{drafter.name} diverged on chat {i}"


def test_smollm2_all_drafters_match_greedy(smol):
    check_engine(smol, CHATS, max_new=48)


def test_smollm2_tool_drafters_on_apibank_match_greedy(smol):
    """Schema, retrieval and toolspec drafting on real tool-call prompts, drafters reused across requests
    (habits and memory carry over, as in an agent session)."""
    from oospec.datasets import load_dataset

    drafters = [make_drafter(m) for m in ("schema", "retrieval", "toolspec")]
    for sample in load_dataset("apibank", split="1", limit=4):
        prompt = smol.encode(sample.messages, sample.chat_tools())
        reference = greedy_reference(smol.model, prompt, 64, eos_ids=smol.eos_ids)
        for drafter in drafters:
            out = smol.generate(Request(prompt_ids=prompt, tools=sample.tools, dialect=sample.dialect,
                                        max_new_tokens=64, budget=16), drafter=drafter)
            assert np.array_equal(out.tokens, reference), f"{drafter.name} diverged on {sample.id}"


def test_smollm2_text_is_sensible(smol):
    out = smol.generate(CHATS[0], drafter=make_drafter("pld"), max_new_tokens=24)
    assert "4" in out.text
    assert out.stats.new_tokens <= 24


@pytest.mark.slow
def test_qwen_coder_05b_apibank_matches_greedy():
    from oospec.datasets import load_dataset
    from oospec.engine.engine import Engine

    engine = Engine.from_pretrained("qwen2.5-coder-0.5b")
    samples = load_dataset("apibank", split="1", limit=3)
    check_engine(engine, [s.messages for s in samples], max_new=64, extra_drafters=False)
