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
    # A closing tag not written yet (`</tool_call>` while the call is being written) is spelled as its opening tag.
    enc.added["</repo_name>"] = token_id + 10_000
    enc.learn_spelling(as_text)
    assert enc.plain == {piece, "</repo_name>"}


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

