"""Every drafter, however adversarial, must reproduce plain greedy decoding token for token."""

import numpy as np
import pytest
from adversarial import (DecoyOracleDrafter, EmptyDrafter, HugeTreeDrafter, RandomTreeDrafter, RepeatDrafter,
                         SlotRowDrafter)
from helpers import decode_request, greedy_reference

from oospec.drafters import make_drafter
from oospec.engine.decode import generate
from oospec.engine.target import TargetBackend

VOCAB = 320
N_PROMPTS = 8
MAX_NEW = 40


def prompts(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(N_PROMPTS):
        n = int(rng.integers(2, 60))
        if i % 2:  # repetitive prompts give prompt lookup something to find
            base = rng.integers(2, VOCAB, 6)
            out.append(np.tile(base, n // 6 + 2)[:n])
        else:
            out.append(rng.integers(2, VOCAB, n))
    return out


def drafters_for(reference, seed):
    return [
        make_drafter("ar"),
        make_drafter("pld"),
        EmptyDrafter(),
        RandomTreeDrafter(VOCAB, seed),
        HugeTreeDrafter(VOCAB, seed),
        DecoyOracleDrafter(reference, VOCAB, seed),
        RepeatDrafter(),
        SlotRowDrafter(VOCAB, seed),
    ]


@pytest.mark.parametrize("budget", [4, 64])
def test_all_drafters_match_greedy(tiny, budget):
    target = TargetBackend(tiny)
    for i, prompt in enumerate(prompts()):
        reference = greedy_reference(tiny, prompt, MAX_NEW)
        assert reference.size == MAX_NEW
        for drafter in drafters_for(reference, i):
            out = generate(target, drafter, decode_request(prompt, MAX_NEW, budget))
            assert np.array_equal(out.tokens, reference), f"{drafter.name} diverged on prompt {i}"


def test_huge_trees_hundreds_of_nodes(tiny):
    target = TargetBackend(tiny)
    prompt = prompts(1)[0]
    reference = greedy_reference(tiny, prompt, MAX_NEW)
    for drafter in (HugeTreeDrafter(VOCAB, 7), DecoyOracleDrafter(reference, VOCAB, 7, depth=30, decoys=20)):
        out = generate(target, drafter, decode_request(prompt, MAX_NEW, 300))
        assert np.array_equal(out.tokens, reference)
        assert out.stats.tree_sizes[0] > 100


def test_oracle_accepts_many_tokens_per_forward(tiny):
    """The decoy oracle must actually be accepted deep in the tree, or the tests above prove little."""
    target = TargetBackend(tiny)
    prompt = prompts(2)[3]
    reference = greedy_reference(tiny, prompt, MAX_NEW)
    out = generate(target, DecoyOracleDrafter(reference, VOCAB, 3), decode_request(prompt, MAX_NEW, 64))
    assert np.array_equal(out.tokens, reference)
    assert out.stats.tau > 5
    assert out.stats.target_forwards < MAX_NEW / 4


@pytest.mark.parametrize("max_new", [1, 2, 3, 17])
def test_max_new_tokens_is_exact(tiny, max_new):
    target = TargetBackend(tiny)
    prompt = prompts(3)[1]
    reference = greedy_reference(tiny, prompt, max_new)
    out = generate(target, DecoyOracleDrafter(reference, VOCAB, 0), decode_request(prompt, max_new, 32))
    assert np.array_equal(out.tokens, reference)
    assert out.stats.new_tokens == max_new


def test_stops_at_end_of_turn_even_inside_accepted_draft(tiny):
    """Choose end-of-turn tokens that occur mid-output: decoding must stop exactly where greedy does,
    though drafts run past them."""
    target = TargetBackend(tiny)
    for i, prompt in enumerate(prompts(4)):
        free = greedy_reference(tiny, prompt, MAX_NEW)
        eos = frozenset({int(free[7]), int(free[20])})
        reference = greedy_reference(tiny, prompt, MAX_NEW, eos_ids=eos)
        assert reference.size <= 8
        full = greedy_reference(tiny, prompt, MAX_NEW)  # what an oracle that ignores end-of-turn would draft
        for drafter in (DecoyOracleDrafter(full, VOCAB, i), make_drafter("pld"), RepeatDrafter()):
            out = generate(target, drafter, decode_request(prompt, MAX_NEW, 16, eos_ids=eos))
            assert np.array_equal(out.tokens, reference), drafter.name


def test_backend_reused_across_requests_of_different_sizes(tiny):
    """The KV buffers are reused between requests: a long request after a short one and vice versa."""
    target = TargetBackend(tiny)
    ps = prompts(5)
    order = sorted(ps, key=len) + sorted(ps, key=len, reverse=True)
    for prompt in order:
        reference = greedy_reference(tiny, prompt, 20)
        out = generate(target, make_drafter("pld"), decode_request(prompt, 20, 16))
        assert np.array_equal(out.tokens, reference)
