"""Slot rows (oospec.engine.slot_rows): rows appended to every verification forward, read through a huge random
LoRA, grown, branched and dropped at random, change nothing the target commits: the tree rows' logits are
bitwise those of the same forward without them, greedy output is plain greedy's, sampled output plain
sampling's; and each slot row's logits are those of the rows a slot LoRA is trained on (the prompt without the
adapter, then the row's chain with it)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from adversarial import RandomTreeDrafter, SlotRowDrafter
from helpers import VOCAB, conversation, decode_request, greedy_reference, tiny_model, write_random_lora

from oospec.engine.acceptance import greedy_accept
from oospec.engine.decode import generate
from oospec.engine.distribution import SamplingParams
from oospec.engine.drafting import Drafter, build_tree
from oospec.engine.invariant import STEP_ROWS, InvariantLinear, install, kernels
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.quantized import LoRALinear
from oospec.engine.slot_rows import PROMPT, RowLoRALinear, RowSpan, SlotFeed, SlotForest, add_slot_lora, lora_rows
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree

MAX_NEW = 40


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                    b.contiguous().view(torch.uint8))


def prompts(seed: int, n: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, VOCAB, int(rng.integers(3, 90))) for _ in range(n)]


def with_slot_lora(model, tmp_path, scale: float = 10.0):
    """A copy of `model` whose slot rows take a random LoRA of entries of size ~`scale`."""
    model = copy.deepcopy(model)
    add_slot_lora(model, write_random_lora(tmp_path / f"lora-{scale}", model, scale=scale))
    return model


@pytest.fixture(scope="module", params=[("qwen2", torch.float32), ("llama", torch.bfloat16)], ids=str)
def invariant_pair(request, tmp_path_factory):
    """(plain, with slot LoRA): one tiny random model on the invariant kernels, without and with a huge slot LoRA."""
    arch, dtype = request.param
    plain = tiny_model(arch).to(dtype)
    lora = with_slot_lora(plain, tmp_path_factory.mktemp("slot-lora"))
    assert install(plain)["applied"] and install(lora)["applied"]
    return plain, lora


@torch.inference_mode()
def test_the_lora_changes_its_rows_only_and_the_base_call_is_the_plain_one():
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(40, 24)
    a, b = torch.randn(4, 40, generator=g) * 10, torch.randn(24, 4, generator=g) * 10
    x = torch.randn(1, 9, 40, generator=g)
    for base in (linear, InvariantLinear(linear, kernels())):
        span = RowSpan()
        wrapped = RowLoRALinear(base, a, b, 2.0, torch.float32, span)
        plain = base(x)
        assert same_bits(wrapped(x), plain)  # no span: the base call, nothing added
        span.start, span.stop = 6, 9
        y = wrapped(x)
        assert same_bits(y[:, :6], plain[:, :6])
        assert torch.allclose(y[:, 6:], plain[:, 6:] + LoRALinear(base, a, b, 2.0, torch.float32).delta(x[:, 6:]),
                              rtol=1e-5, atol=1e-3)
        assert not torch.allclose(y[:, 6:], plain[:, 6:])
        if base is not linear:  # on the invariant kernels, a slot row's bits whatever slot rows share its forward
            span.start, span.stop = 8, 9
            assert same_bits(wrapped(x)[:, 8], y[:, 8])


def test_the_forest_names_places_and_drops_nodes():
    forest = SlotForest(anchor=10)
    feed = SlotFeed(np.array([5, 6, 7, 8]), np.array([PROMPT, 0, 1, 0]), first_id=0)
    plan = forest.plan(feed)
    assert plan.positions.tolist() == [10, 11, 12, 11]
    assert plan.visible.astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    forest.append(feed, plan)
    with pytest.raises(ValueError, match="next node is 4"):
        forest.plan(SlotFeed(np.array([1]), np.array([PROMPT]), first_id=0))
    with pytest.raises(ValueError, match="not an earlier row"):
        forest.plan(SlotFeed(np.array([1, 2]), np.array([5, PROMPT]), first_id=4))
    assert forest.drop([1]).tolist() == [0, 3]  # node 1 and its child 2
    assert forest.ids.tolist() == [0, 3]
    with pytest.raises(ValueError, match=r"\[2\] are not in the forest"):
        forest.plan(SlotFeed(np.array([1]), np.array([2]), first_id=4))
    plan = forest.plan(SlotFeed(np.array([9]), np.array([3]), first_id=4))
    assert plan.positions.tolist() == [12] and plan.visible.tolist() == [[True, True, True]]


def test_tree_logits_are_bitwise_those_of_the_forward_without_slot_rows(invariant_pair):
    """Every step: the same tree verified with slot rows (through the LoRA, with the store of earlier steps'
    slot nodes in the cache) and without any (a model without the LoRA, a cache without a store)."""
    plain, lora = invariant_pair
    for seed, prompt in enumerate(prompts(1)):
        bare, slotted = TargetBackend(plain), TargetBackend(lora)
        trees = RandomTreeDrafter(VOCAB, seed, max_nodes=24)
        slots = SlotRowDrafter(VOCAB, seed, slot_rows=STEP_ROWS - 1 - 24)
        slots.start(decode_request(prompt, MAX_NEW))
        for target in (bare, slotted):
            target.reset(prompt.size + MAX_NEW + STEP_ROWS + slots.slot_store)
        pending = bare.prefill(prompt)
        assert slotted.prefill(prompt) == pending
        for _ in range(12):
            candidates = trees.candidates(prompt)
            tree = build_tree(candidates, 24)
            feed = slots.slot_feed(prompt, STEP_ROWS - 1 - len(tree))
            expected = bare.verify_logits(pending, tree)
            unfed = slotted.verify_logits(pending, tree)  # the store in the cache, no slot rows
            logits, slot_logits = slotted.verify_rows(pending, tree, feed)
            assert same_bits(unfed, expected) and same_bits(logits, expected)
            assert slot_logits.shape == (len(feed), expected.shape[-1])
            slots.slot_logits(feed, slot_logits)
            path, pending = greedy_accept(tree, expected.argmax(-1).numpy())
            bare.commit(path)
            slotted.commit(path)
        assert slotted.slots.size > 10  # the store held nodes while the tree rows were checked


def test_slot_logits_are_those_of_the_rows_the_lora_is_trained_on(invariant_pair):
    """A slot row's logits: the prompt prefilled without the LoRA, then the row's chain below the prompt at
    positions prompt_len, prompt_len+1, ... with it, bitwise; and not those without the LoRA."""
    plain, lora = invariant_pair
    prompt = prompts(2)[0]
    drafter = SlotRowDrafter(VOCAB, 3)
    out = generate(TargetBackend(lora), drafter, decode_request(prompt, MAX_NEW, 8))
    assert np.array_equal(out.tokens, generate(TargetBackend(plain), None, decode_request(prompt, MAX_NEW)).tokens)
    checked = 0
    for paths, logits in drafter.seen[::5]:
        for j in range(0, len(paths), 4):
            chain = torch.as_tensor(paths[j]).view(1, -1)
            expected, unadapted = (_chain_logits(lora, prompt, chain, adapted) for adapted in (True, False))
            assert same_bits(logits[j], expected), f"a slot row of depth {chain.shape[1]} differs"
            assert not torch.allclose(logits[j].float(), unadapted.float())
            checked += 1
    assert checked >= 10 and max(len(p) for paths, _ in drafter.seen for p in paths) >= 5


def _chain_logits(model, prompt: np.ndarray, chain: torch.Tensor, adapted: bool) -> torch.Tensor:
    """The last logits of `chain` after `prompt` by the model's own forwards and cache (not TargetBackend's)."""
    from transformers import DynamicCache

    from oospec.engine.target import cache_arg

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.as_tensor(prompt).view(1, -1), use_cache=True, **cache_arg(cache))
        positions = torch.arange(prompt.size, prompt.size + chain.shape[1]).view(1, -1)
        with lora_rows(model, 0, chain.shape[1] if adapted else 0):
            out = model(input_ids=chain, position_ids=positions, use_cache=True, **cache_arg(cache))
    return out.logits[0, -1]


@pytest.mark.parametrize("budget", [4, 16, 60])
def test_greedy_output_is_plain_greedy_with_slot_rows_in_every_forward(invariant_pair, budget):
    plain, lora = invariant_pair
    bare, slotted = TargetBackend(plain), TargetBackend(lora)
    for seed, prompt in enumerate(prompts(3)):
        reference = generate(bare, None, decode_request(prompt, MAX_NEW)).tokens
        drafter = SlotRowDrafter(VOCAB, seed, max_nodes=budget)
        out = generate(slotted, drafter, decode_request(prompt, MAX_NEW, budget))
        assert np.array_equal(out.tokens, reference), f"prompt {seed} diverged"
        assert set(drafter.given) == {min(24, STEP_ROWS - 1 - budget)}  # the rows the tree leaves, at most its own
        assert len(drafter.seen) >= out.stats.target_forwards - 2  # every forward but the last may have had some


def test_sampled_output_is_plain_samplings_with_slot_rows(invariant_pair):
    plain, lora = invariant_pair
    for seed, prompt in enumerate(prompts(4, 2)):
        sampling = SamplingParams(temperature=0.8, seed=seed)
        reference = generate(TargetBackend(plain), None, decode_request(prompt, MAX_NEW, sampling=sampling)).tokens
        out = generate(TargetBackend(lora), SlotRowDrafter(VOCAB, seed, max_nodes=8),
                       decode_request(prompt, MAX_NEW, 8, sampling=sampling))
        assert np.array_equal(out.tokens, reference)


def test_a_conversation_through_the_prefix_cache_with_slot_rows(invariant_pair):
    """Cached prefixes hold committed slots only: the store never leaks into the next request's prompt. (The
    reference reuses prefixes too: a prompt prefilled in two parts may round otherwise than in one.)"""
    plain, lora = invariant_pair
    bare, slotted = TargetBackend(plain), TargetBackend(lora)
    bare_cache, cache = PrefixCache(1 << 26), PrefixCache(1 << 26)
    for seed, prompt in enumerate(conversation(5)):
        reference = generate(bare, None, decode_request(prompt, 24), prefix_cache=bare_cache).tokens
        out = generate(slotted, SlotRowDrafter(VOCAB, seed, max_nodes=8), decode_request(prompt, 24, 8),
                       prefix_cache=cache)
        assert np.array_equal(out.tokens, reference), f"turn {seed} diverged"
        assert seed == 0 or out.stats.prompt_tokens_reused > 0


def test_plain_transformers_model_with_slot_rows_decodes_as_greedy(tiny, tmp_path):
    """Without the invariant kernels (the tiny model as transformers runs it) the output is still greedy's."""
    lora = with_slot_lora(tiny, tmp_path, scale=3.0)
    target = TargetBackend(lora)
    for seed, prompt in enumerate(prompts(6)):
        out = generate(target, SlotRowDrafter(VOCAB, seed, max_nodes=8), decode_request(prompt, MAX_NEW, 8))
        assert np.array_equal(out.tokens, greedy_reference(tiny, prompt, MAX_NEW))


class _Greedy(Drafter):
    """Feeds one more slot row than it is given."""

    slot_rows, slot_store = 24, 100

    def slot_feed(self, context, rows, beside=1):
        self.given = rows
        return SlotFeed(np.zeros(rows + 1, dtype=np.int64), np.full(rows + 1, PROMPT), 0)


def test_tree_and_slot_rows_stay_within_the_invariant_forward(invariant_pair):
    _, lora = invariant_pair
    drafter = _Greedy()
    with pytest.raises(ValueError, match="fed 4 slot rows, more than the 3"):
        generate(TargetBackend(lora), drafter, decode_request(prompts(7)[0], 8, 60))
    assert drafter.given == STEP_ROWS - 1 - 60


def test_padded_targets_refuse_slot_rows_and_decode_without_them(invariant_pair):
    plain, lora = invariant_pair
    target = TargetBackend(lora)
    target.step_rows = STEP_ROWS  # as on an accelerator (oospec.engine.padded): every forward padded to 64 rows
    target.reset(64)
    with pytest.raises(ValueError, match="not the padded one"):
        target.verify_rows(1, TokenTree.empty(), SlotFeed(np.array([1]), np.array([PROMPT]), 0))
    prompt = prompts(8)[0]
    drafter = SlotRowDrafter(VOCAB, 0, max_nodes=8)
    out = generate(target, drafter, decode_request(prompt, 16, 8))
    assert np.array_equal(out.tokens, generate(TargetBackend(plain), None, decode_request(prompt, 16)).tokens)
    assert drafter.given == [] and out.stats.target_forwards > 1


def test_a_gguf_target_with_a_slot_lora_decodes_as_without(tmp_path, one_thread):
    """SmolLM2's GGUF (QuantizedLinear over its blocks, the kernels every GGUF target runs): a slot LoRA over all
    seven projections, slot rows in every forward; the output is the one of the same file without a LoRA."""
    from oospec.engine.quantized import QuantizedLinear, load_gguf_model
    from oospec.models.provision import pull_gguf

    gguf = pull_gguf("smollm2-135m", progress=False)
    plain, tokenizer = load_gguf_model(gguf, dtype=torch.bfloat16)
    lora, _ = load_gguf_model(gguf, dtype=torch.bfloat16)
    assert add_slot_lora(lora, write_random_lora(tmp_path / "lora", lora, scale=1.0)) == \
        7 * lora.config.num_hidden_layers
    assert isinstance(lora.model.layers[0].mlp.down_proj.base, QuantizedLinear)
    assert install(plain)["applied"] and install(lora)["applied"]
    messages = [{"role": "user", "content": "What is the weather in Paris tomorrow? Answer in one sentence."}]
    prompt = np.asarray(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
                        ["input_ids"], dtype=np.int64)
    reference = generate(TargetBackend(plain), None, decode_request(prompt, 24)).tokens
    drafter = SlotRowDrafter(plain.config.vocab_size, 0, max_nodes=8, slot_rows=16)
    out = generate(TargetBackend(lora), drafter, decode_request(prompt, 24, 8))
    assert np.array_equal(out.tokens, reference)
    paths, logits = next((p, lg) for p, lg in drafter.seen if p and len(p[-1]) > 1)
    chain = torch.as_tensor(paths[-1]).view(1, -1)
    assert same_bits(logits[-1], _chain_logits(lora, prompt, chain, adapted=True))


def test_trees_are_sized_for_forwards_that_hold_the_slot_rows_too():
    """A cost-aware tree pays for its nodes in a forward that also holds the slot rows: c(k + s)."""
    from oospec.engine.budget import CostModel

    curve = CostModel.from_curve({1: 1.0, 16: 2.0, 64: 8.0})
    beside = curve.beside(24)
    assert np.allclose(beside.cost([1, 8, 40, 100]), curve.cost([25, 32, 64, 124]))
    assert curve.beside(0) is curve
