"""Prefix reuse and streaming callbacks in the engine: outputs stay those of a cold greedy decode."""

import numpy as np
import pytest
from adversarial import DecoyOracleDrafter, RandomTreeDrafter
from helpers import VOCAB, conversation, decode_request, greedy_reference

from oospec.drafters import make_drafter
from oospec.engine.decode import generate
from oospec.engine.prefix_cache import PrefixCache, common_prefix_length
from oospec.engine.target import TargetBackend

MAX_NEW = 24

pytestmark = pytest.mark.usefixtures("one_thread")


def test_common_prefix_length():
    a = np.array([1, 2, 3, 4])
    assert common_prefix_length([a, np.array([1, 2, 9])]) == 2
    assert common_prefix_length([a, a[:2]]) == 2
    assert common_prefix_length([a, np.array([7])]) == 0
    assert common_prefix_length([a, np.array([], dtype=np.int64)]) == 0
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2  # token lists, several rows
    assert common_prefix_length([[1], [2]]) == 0


@pytest.mark.parametrize("method", ["ar", "pld", "random", "oracle"])
def test_reuse_matches_cold_greedy(tiny, method):
    target = TargetBackend(tiny)
    cache = PrefixCache(max_bytes=64 << 20, min_tokens=4)
    reused = []
    for i, prompt in enumerate(conversation()):
        reference = greedy_reference(tiny, prompt, MAX_NEW)
        drafter = {"ar": make_drafter("ar"), "pld": make_drafter("pld"), "random": RandomTreeDrafter(VOCAB, i),
                   "oracle": DecoyOracleDrafter(reference, VOCAB, i)}[method]
        out = generate(target, drafter, decode_request(prompt, MAX_NEW, 16), prefix_cache=cache)
        assert np.array_equal(out.tokens, reference), f"turn {i}"
        reused.append(out.stats.prompt_tokens_reused)
    prompts = conversation()
    assert reused[0] == 0
    assert reused[1] == prompts[0].size  # the whole earlier prompt (its output was not part of this prompt)
    assert reused[4] == prompts[1].size - 3  # the branch shares turn 2 up to where it diverges
    assert reused[5] == prompts[2].size - 1  # a repeated prompt: everything but the token that gives the logits
    assert cache.stats.hits == 5


def test_reuse_of_the_previous_output(tiny):
    """An agent's next prompt contains the reply just generated: that part is reused too."""
    target = TargetBackend(tiny)
    cache = PrefixCache(max_bytes=64 << 20, min_tokens=4)
    prompt = conversation()[0]
    first = generate(target, make_drafter("pld"), decode_request(prompt, MAX_NEW), prefix_cache=cache)
    follow_up = np.concatenate([prompt, first.tokens, np.arange(10, 20)])
    out = generate(target, make_drafter("pld"), decode_request(follow_up, MAX_NEW), prefix_cache=cache)
    # Every token whose key and value were committed: the prompt and all output but the last token.
    assert out.stats.prompt_tokens_reused == prompt.size + first.tokens.size - 1
    assert np.array_equal(out.tokens, greedy_reference(tiny, follow_up, MAX_NEW))


def test_memory_bound_and_lru_eviction(tiny):
    target = TargetBackend(tiny)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(2, VOCAB, 50) for _ in range(4)]
    generate(target, make_drafter("ar"), decode_request(prompts[0], 4))
    per_entry = (50 + 3) * target.slot_bytes  # prompt plus committed output
    cache = PrefixCache(max_bytes=int(2.5 * per_entry), min_tokens=4)
    for p in prompts[:3]:
        generate(target, make_drafter("ar"), decode_request(p, 4), prefix_cache=cache)
        assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 2 and cache.stats.evictions == 1
    # prompts[0] was evicted (least recently used); prompts[1] and [2] are still there
    assert cache.restore(target_reset(target), prompts[0]) == 0
    assert cache.restore(target_reset(target), prompts[1]) == 49
    assert cache.restore(target_reset(target), prompts[2]) == 49
    # Touching [1] then storing a new entry evicts [2], not [1]
    cache.restore(target_reset(target), prompts[1])
    generate(target, make_drafter("ar"), decode_request(prompts[3], 4), prefix_cache=cache)
    assert cache.restore(target_reset(target), prompts[2]) == 0
    assert cache.restore(target_reset(target), prompts[1]) == 49
    # An entry larger than the whole budget is not kept
    small = PrefixCache(max_bytes=per_entry // 2, min_tokens=4)
    generate(target, make_drafter("ar"), decode_request(prompts[0], 4), prefix_cache=small)
    assert len(small) == 0 and small.nbytes == 0


def target_reset(target):
    target.reset(128)
    return target


def test_extended_entries_replace_their_prefix(tiny):
    target = TargetBackend(tiny)
    cache = PrefixCache(max_bytes=64 << 20, min_tokens=4)
    prompt = conversation()[0]
    for turn in range(4):  # each prompt is the last one, its reply and a new message
        out = generate(target, make_drafter("ar"), decode_request(prompt, 4), prefix_cache=cache)
        assert out.stats.prompt_tokens_reused == (0 if turn == 0 else prompt.size - 8 - 1)
        prompt = np.concatenate([prompt, out.tokens, np.arange(50 + turn, 58 + turn)])
    assert len(cache) == 1  # one growing conversation is one entry, not four copies


def test_on_tokens_sees_every_token_and_can_stop(tiny):
    target = TargetBackend(tiny)
    prompt = conversation(1)[0]
    reference = greedy_reference(tiny, prompt, MAX_NEW)
    seen = []
    out = generate(target, DecoyOracleDrafter(reference, VOCAB, 0), decode_request(prompt, MAX_NEW),
                   on_tokens=lambda t: seen.append(t.copy()))
    assert np.array_equal(np.concatenate(seen), out.tokens)
    assert max(s.size for s in seen) > 1  # steps that accepted several tokens report them together
    assert out.finish_reason == "length"
    calls = []
    out = generate(target, make_drafter("ar"), decode_request(prompt, MAX_NEW),
                   on_tokens=lambda t: calls.append(t.copy()) or len(calls) == 5)
    assert out.finish_reason == "callback"
    assert np.array_equal(out.tokens, reference[:5])
    eos = frozenset({int(reference[3])})
    out = generate(target, make_drafter("pld"), decode_request(prompt, MAX_NEW, eos_ids=eos))
    assert out.finish_reason == "stop" and out.tokens[-1] == reference[3]


def test_smollm2_multi_turn_apibank_reuse_matches_cold_ar(smollm2_engine):
    """A real multi-turn API-Bank dialogue, turn by turn, with toolspec and prefix reuse: token-identical to
    cold plain greedy (`ar`, no cache) on SmolLM2-135M."""
    from oospec.bench.serve import pick_dialogue
    from oospec.datasets import load_dataset

    engine = smollm2_engine
    _, turns = pick_dialogue(load_dataset("apibank", split="1"), None)
    cache = PrefixCache(max_bytes=256 << 20)
    drafter = make_drafter("toolspec")
    for i, sample_ in enumerate(turns[:3]):
        prompt = engine.encode(sample_.messages)
        fast = engine.generate(sample_.request(prompt_ids=prompt, max_new_tokens=40), drafter=drafter,
                               prefix_cache=cache)
        cold = engine.generate(prompt_ids=prompt, max_new_tokens=40)
        assert np.array_equal(fast.tokens, cold.tokens), f"turn {i}"
        if i:
            assert fast.stats.prompt_tokens_reused > prompt.size // 2
