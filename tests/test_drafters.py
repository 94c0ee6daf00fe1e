"""Drafters propose what they should; correctness never depends on them (see test_equivalence)."""

import json

import numpy as np
import pytest
from helpers import APIBANK_TOOLS

from oospec.drafters import make_drafter
from oospec.engine.drafting import Request, build_tree
from oospec.drafters.pld import lookup_continuations
from oospec.drafters.retrieval import CallMemory, RetrievalDrafter
from oospec.engine.tree import ROOT

CALL = {"name": "ModifyRegistration", "parameters": {"appointment_id": "34567890",
                                                     "new_appointment_date": "2023-03-26", "urgent": True}}


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


def simulate(drafter, tokenizer, text, runs=2, tools=APIBANK_TOOLS, dialect="apibank", eos=2):
    """Greedy acceptance against a known output: the forwards a drafter would need, per run."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [eos]
    steps_per_run = []
    for _ in range(runs):
        prompt = np.array([1, 5, 7], dtype=np.int64)
        drafter.start(Request(prompt, frozenset([eos]), tokenizer=tokenizer, tools=tools, dialect=dialect,
                              messages=[{"role": "user", "content": "modify appointment 34567890"}]))
        ctx, i, steps = list(prompt) + ids[:1], 1, 1
        drafter.observe(np.array(ids[:1]))
        while i < len(ids):
            tree = build_tree(drafter.candidates(np.array(ctx)), 32, drafter.cost)
            parent, j = ROOT, i
            while j < len(ids):
                nxt = [k for k in range(len(tree)) if tree.parents[k] == parent and tree.tokens[k] == ids[j]]
                if not nxt:
                    break
                parent, j = nxt[0], j + 1
            produced = ids[i : j + 1]
            drafter.observe(np.array(produced))
            ctx += produced
            i += len(produced)
            steps += 1
        drafter.finish()
        steps_per_run.append(steps)
    return len(ids), steps_per_run


@pytest.mark.parametrize("indent", [None, 2])
def test_schema_drafts_structure_and_learns_habits(tokenizer, indent):
    text = "```json\n" + json.dumps(CALL, indent=indent) + "\n```"
    n, steps = simulate(make_drafter("schema"), tokenizer, text)
    # Values (digits, dates) are left to other drafters, so expect the structure to be almost free, and the
    # second call (habits learned: fence, whitespace, closer) to be cheaper than the first.
    assert steps[1] <= steps[0]
    assert steps[1] < 0.5 * n


def test_toolspec_beats_its_parts(tokenizer):
    text = "<tool_call>\n" + json.dumps(CALL) + "\n</tool_call>"
    n, schema_steps = simulate(make_drafter("schema"), tokenizer, text)
    _, pld_steps = simulate(make_drafter("pld"), tokenizer, text)
    _, toolspec_steps = simulate(make_drafter("toolspec"), tokenizer, text)
    assert toolspec_steps[1] <= min(schema_steps[1], pld_steps[1])
    assert toolspec_steps[1] < 0.3 * n  # retrieval remembers the first call


def test_pld_finds_most_recent_longest_match():
    ctx = np.array([1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 5, 1, 2, 3])
    found = lookup_continuations(ctx, ctx, max_ngram=3, min_ngram=1, draft_len=2, max_results=2)
    assert found[0][1] == 3 and found[0][0].tolist() == [7, 7]
    assert found[1][0].tolist() == [9, 9]


def test_retrieval_memory_persists(tmp_path, tokenizer):
    store = tmp_path / "calls.jsonl"
    text = json.dumps(CALL)
    first = RetrievalDrafter(CallMemory(store))
    simulate(first, tokenizer, text, runs=1)
    store.write_text(store.read_text() + "{broken line\n")
    second = RetrievalDrafter(CallMemory(store))  # a new process: only the store remains
    n, steps = simulate(second, tokenizer, text, runs=1)
    assert steps[0] < 0.3 * n


def test_drafts_spell_an_added_token_as_the_target_wrote_it(tokenizer):
    """A target may write an added token's text as plain characters (Qwen2.5 writes `<tool_call>` so inside a ```
    fence): after a reply written so, continuations spell it so; after one written with the token, as the token."""
    from oospec.tools.tokens import ContinuationEncoder, encode_plain

    piece = "<repo_name>"  # an added token of SmolLM2's with a text of its own, as `<tool_call>` is in Qwen2.5's
    token_id = tokenizer.get_added_vocab()[piece]
    enc = ContinuationEncoder(tokenizer)
    text = f'```{piece}\n{{"name": "'
    as_token, as_text = enc.encode(text), encode_plain(tokenizer, text)
    assert token_id in as_token and token_id not in as_text and tokenizer.decode(as_text) == text
    enc.learn_spelling(as_text + [2])
    assert enc.encode(text) == as_text and enc.plain == {piece}
    written = np.asarray(tokenizer.encode("```", add_special_tokens=False))
    assert token_id not in enc.continue_after(written, f'{piece}\n{{"').tolist()
    enc.learn_spelling(as_token)
    assert enc.encode(text) == as_token and not enc.plain


def test_retrieval_recalls_the_ids_the_target_wrote(tokenizer):
    """A remembered call is drafted as the tokens the target produced, not as its text re-encoded (which could
    spell an added token differently)."""
    from oospec.tools.tokens import encode_plain

    drafter = RetrievalDrafter(CallMemory())
    reply = encode_plain(tokenizer, '<repo_name>{"name": "ModifyRegistration"}')
    request = Request(np.array([1, 5, 7]), frozenset([2]), tokenizer=tokenizer,
                      messages=[{"role": "user", "content": "modify appointment 34567890"}])
    drafter.start(request)
    drafter.observe(np.array(reply + [2]))
    drafter.finish()
    drafter.start(request)
    assert [ids.tolist() for _, ids in drafter.corpus] == [reply]


def test_slot_guesses_grow_from_the_targets_own_choices_and_become_the_draft(tokenizer):
    """Fused sidecar (oospec.drafters.slots): where extra rows are free, every argument not written yet gets a
    probe; the target's choices there build the value, which is drafted once the target reaches its key."""
    from oospec.drafters.sidecar import OoOSpecDrafter
    from oospec.engine.budget import CostModel
    from oospec.engine.tree import TokenTree

    drafter = OoOSpecDrafter(cost=CostModel.flat())
    prompt = np.array([1, 5, 7], dtype=np.int64)
    drafter.start(Request(prompt, frozenset([2]), tokenizer=tokenizer, tools=APIBANK_TOOLS, dialect="apibank",
                          messages=[{"role": "user", "content": "move appointment 34567890"}], cost=CostModel.flat()))
    assert drafter.probe_nodes > 0
    head = tokenizer.encode('{"name": "ModifyRegistration", "parameters": {"appointment_id": "345',
                            add_special_tokens=False)
    drafter.observe(np.array(head))
    context = np.concatenate([prompt, head])
    value = tokenizer.encode('2023-03-26"', add_special_tokens=False)
    for step in range(len(value)):  # the last choice is the closing quote: the guess is done
        probes = drafter.probes(context)
        texts = [tokenizer.decode(p) for p in probes]
        date = next(i for i, t in enumerate(texts) if '"new_appointment_date": "' in t)
        assert texts[date].startswith('", "new_appointment_date": "')
        tree = TokenTree.empty().extended(probes, 256, 256)
        choices = np.full(len(tree) + 1, 0, dtype=np.int64)  # token 0 everywhere else: not a value's end
        nodes = tree.find(probes[date].tolist())
        jump = len(nodes) - step  # the probe holds the guess so far (step tokens) after the jump
        for i in range(step + 1):  # the target's token after the jump and after each guessed token
            choices[nodes[jump - 1 + i] + 1] = value[i]
        drafter.verified(tree, choices)
        if step < len(value) - 1:
            assert drafter.probes(context)[date].size == len(nodes) + 1  # grew by the target's one token
    assert not any('"new_appointment_date"' in tokenizer.decode(p) for p in drafter.probes(context))  # done
    rest = tokenizer.encode('67890", "new_appointment_date": "', add_special_tokens=False)
    drafter.observe(np.array(rest))
    context = np.concatenate([context, rest])
    drafts = [tokenizer.decode(c.tokens) for c in drafter.candidates(context)]
    assert any(d.startswith('2023-03-26"') for d in drafts), drafts


def test_no_probes_where_rows_cost_a_forward_a_few_percent_each(tokenizer):
    from oospec.drafters.sidecar import OoOSpecDrafter
    from oospec.engine.budget import CPU_CURVES, CostModel, cheap_rows

    for curve in CPU_CURVES.values():
        drafter = OoOSpecDrafter()
        drafter.start(Request(np.array([1]), frozenset([2]), tokenizer=tokenizer, tools=APIBANK_TOOLS,
                              dialect="apibank", cost=CostModel.from_curve(curve)))
        assert drafter.probe_nodes == 0
    assert cheap_rows(CostModel.flat(), 17, 0.03) == 64
    assert cheap_rows(CostModel.from_curve({1: 1.0, 32: 1.0, 64: 2.0}), 17, 0.03) == 15  # the flat part: 32 rows
