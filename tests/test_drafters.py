"""Drafters propose what they should; correctness never depends on them (see test_equivalence)."""

import json

import numpy as np
import pytest

from oospec.drafters import make_drafter
from oospec.engine.drafting import Candidate, Request, build_tree
from oospec.drafters.pld import lookup_continuations
from oospec.drafters.retrieval import CallMemory, RetrievalDrafter
from oospec.engine.budget import CostModel
from oospec.engine.tree import ROOT
from oospec.tools.callscan import CallScanner, Habits, structure_continuations
from oospec.tools.schema import Param, Tool

TOOLS = [
    Tool("QueryHealthData", parameters=(Param("user_id"), Param("start_time"), Param("end_time")),
         required=("user_id", "start_time", "end_time")),
    Tool("CancelRegistration", parameters=(Param("appointment_id"),), required=("appointment_id",)),
    Tool("ModifyRegistration", parameters=(Param("appointment_id"), Param("new_appointment_date"),
                                           Param("urgent", type="boolean")), required=("appointment_id",)),
]
CALL = {"name": "ModifyRegistration", "parameters": {"appointment_id": "34567890",
                                                     "new_appointment_date": "2023-03-26", "urgent": True}}


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


def simulate(drafter, tokenizer, text, runs=2, tools=TOOLS, dialect="apibank", eos=2):
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


def test_callscan_tracks_states():
    scan = CallScanner(Habits().style)
    scan.feed('<tool_call>\n{"name": "Mod')
    conts = structure_continuations(scan, TOOLS, Habits(), "parameters", ("<tool_call>\n",))
    assert conts and conts[0].text.startswith('ifyRegistration", "parameters": {"appointment_id": "')
    scan.feed('ifyRegistration", "parameters": {"appointment_id": "34567890"')
    conts = structure_continuations(scan, TOOLS, Habits(), "parameters", ())
    assert conts[0].text == ', "new_appointment_date": "'
    scan.feed(', "new_appointment_date": "2023-03-26", "urgent": t')
    conts = structure_continuations(scan, TOOLS, Habits(), "parameters", ())
    assert [c.text for c in conts] == ["rue"]
    scan.feed('rue}}')
    assert scan.calls_done == 1 and scan.name == "ModifyRegistration" and scan.opener == "<tool_call>\n"
    # Before the target has finished a request, its opener says how the call is closed; after, its habit does.
    conts = structure_continuations(scan, TOOLS, Habits(), "parameters", ())
    assert [(c.text, c.end_of_turn) for c in conts] == [("\n</tool_call>", True)]
    learned = Habits(closers=["\n</tool_call>\n"])
    assert [c.text for c in structure_continuations(scan, TOOLS, learned, "parameters", ())] == ["\n</tool_call>\n"]
    fenced = CallScanner(Habits().style)
    fenced.feed('```json\n{"name": "CancelRegistration", "parameters": {"appointment_id": "1"}}\n`')
    assert [c.text for c in structure_continuations(fenced, TOOLS, Habits(), "parameters", ())] == ["``"]


def test_callscan_ignores_braces_inside_strings():
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "CancelRegistration", "parameters": {"appointment_id": "a}\\"{b"')
    assert scan.depth == 2 and not scan.in_string
    conts = structure_continuations(scan, TOOLS, Habits(), "parameters", ())
    assert conts[0].text == "}}"


def test_unknown_tool_name_proposes_nothing_for_arguments():
    scan = CallScanner(Habits().style)
    scan.feed('{"name": "NoSuchTool", "parameters": {"x": "1"')
    assert structure_continuations(scan, TOOLS, Habits(), "parameters", ()) == []


def test_build_tree_respects_budget_and_cost():
    cands = [Candidate(np.arange(10, 20), 0.9, 0.95), Candidate(np.array([10, 11, 99]), 0.5, 0.9),
             Candidate(np.arange(30, 40), 0.2, 0.5)]
    free = build_tree(cands, 64, CostModel.flat())
    assert len(free) == 10 + 1 + 10  # shared prefix [10, 11] counted once
    capped = build_tree(cands, 5, CostModel.flat())
    assert len(capped) == 5 and capped.max_depth == 5  # the surest chain first
    steep = build_tree(cands, 64, CostModel.from_curve({1: 1.0, 2: 2.0, 64: 64.0}))
    assert len(steep) <= 1  # verifying a token costs a whole forward: only a near-certain one pays
    # Always a valid tree (parents before children), whatever was cut.
    for tree in (free, capped, steep):
        assert np.all(tree.parents < np.arange(len(tree)))


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


def test_tree_pruned_keeps_tree_shape():
    tree = build_tree([Candidate(np.array(s)) for s in ([1, 2, 3, 4], [1, 5, 6], [7])], budget=10)
    pruned = tree.pruned(budget=4, max_depth=2)
    assert len(pruned) == 4 and pruned.max_depth == 2
    assert np.all(pruned.parents < np.arange(len(pruned)))
