"""Several calls in one turn (BFCL parallel): the payload's list of calls, the predictor's later calls, and
hints that follow the target from one call to the next (alignment on text here; on a real model, tau and
identical output, in test_sidecar_faults.py)."""

from __future__ import annotations

import json

import pytest
from test_sidecar import END, GOOD, TOOLS, WEATHER, drafter_after

from oospec.drafters.sidecar import dialect_joint
from oospec.engine.drafting import Request
from oospec.sidecar.protocol import MAX_CALLS, Guess, Job, encode_payload, parse_payload
from oospec.tools.dialects import DIALECTS

LYON = Guess("get_weather", {"city": "Lyon", "days": 2, "metric": False})
TIME = Guess("get_time", {"zone": "CET"})
JOINT = "\n</tool_call>\n<tool_call>\n"


def call(g: Guess) -> str:
    return json.dumps({"name": g.function, "arguments": g.arguments})


# -- the payload -------------------------------------------------------------------------------------------


def test_a_payload_carries_the_turns_calls_and_reads_as_before_with_one():
    raw = encode_payload("r", [GOOD, TIME], 0.1, 1.0, following=[LYON, TIME])
    p = parse_payload(raw, "r", TOOLS)
    assert p.best == GOOD and p.alternatives == (TIME,) and p.following == (LYON, TIME)
    assert p.calls == (GOOD, LYON, TIME) and p.guesses == (GOOD, TIME)
    one = encode_payload("r", [GOOD], 0.1, 1.0)
    assert b'"next"' not in one and parse_payload(one, "r", TOOLS).following == ()
    # "No call" carries no later calls, whatever else the payload says.
    none = json.loads(encode_payload("r", [], 0.1, 1.0, following=[LYON]))
    assert "next" not in none
    assert parse_payload(json.dumps({**none, "next": [{"function": "get_time"}]}).encode(), "r", TOOLS).calls == ()


def test_later_calls_are_checked_cut_and_bounded():
    doc = json.loads(encode_payload("r", [GOOD], 0, 0, following=[LYON]))
    bad_slots = {"function": "get_weather", "arguments": {"days": "three"}}
    for later, kept, problem in [
        ([{"function": "rm_rf"}, {"function": "get_time", "arguments": {"zone": "CET"}}], (), "call 2"),
        ([{"function": "get_time", "arguments": {"zone": "CET"}}, bad_slots, {"function": "get_time"}],
         (TIME,), "call 3"),
        ([{"function": "get_time", "arguments": {"zone": "CET", "x": 1}}], (TIME,), "get_time.x"),
        ("get_time", (), "next: not a list"),
        ([{"function": "get_time", "arguments": {"zone": "CET"}}] * 20, (TIME,) * (MAX_CALLS - 1), "next: more than"),
    ]:
        p = parse_payload(json.dumps({**doc, "next": later}).encode(), "r", TOOLS)
        assert p.best == GOOD and tuple(g.function for g in p.following) == tuple(g.function for g in kept)
        assert any(d.startswith(problem) for d in p.dropped), (problem, p.dropped)


# -- the predictor's later calls ---------------------------------------------------------------------------


class ScriptedPredictor:
    """The predictor's turn loop with its model replaced by a script: what follows each call, and the call
    guessed for each job (by the calls written before it)."""

    def __new__(cls, joints, calls, max_calls=4):
        from oospec.sidecar.predictor import SidecarPredictor, TaskFormat

        class Tok:
            eos_token = "<|im_end|>"

            def apply_chat_template(self, messages, **_):
                return "PROMPT:"

        pred = object.__new__(SidecarPredictor)
        pred.format, pred.max_calls = TaskFormat(Tok()), max_calls
        pred.prompt_without_adapter = False  # the prompt read as the rows are: the 0.5B sidecar's way
        pred.asked = []
        pred.next_call_opening = lambda text: (pred.asked.append(("next", text)), joints.pop(0) if joints else None)[1]
        pred.guess = lambda job, tools, later=False: (pred.asked.append(("guess", job.opener, later)), [calls.pop(0)])[1]
        return pred


def test_later_calls_are_guessed_with_the_calls_before_them_until_the_turn_ends():
    job = Job("r", [], [], opener="<tool_call>\n")
    pred = ScriptedPredictor([JOINT, JOINT, None], [LYON, TIME])
    assert pred.following_calls(job, TOOLS, GOOD) == [LYON, TIME]
    first = "<tool_call>\n" + call(GOOD)
    second = first + JOINT + call(LYON)
    assert pred.asked == [("next", "PROMPT:" + first), ("guess", first + JOINT, True),
                          ("next", "PROMPT:" + second), ("guess", second + JOINT, True),
                          ("next", "PROMPT:" + second + JOINT + call(TIME))]
    # A call guessed again is a loop, not a turn; and the list is bounded.
    assert ScriptedPredictor([JOINT] * 5, [GOOD]).following_calls(job, TOOLS, GOOD) == []
    assert len(ScriptedPredictor([JOINT] * 9, [LYON, TIME, GOOD], max_calls=3).following_calls(job, TOOLS, GOOD)) == 2


def test_the_predictor_asks_for_later_calls_as_the_rows_teach_them(smollm2_model, smollm2_tokenizer):
    """The text the predictor decodes after a call is the training row's prefix, and its opening of another
    call, cut at NEXT_CALL, primes the next call's rows exactly as training primed them."""
    import torch

    from oospec.sidecar.predictor import SidecarPredictor

    pred = SidecarPredictor(smollm2_model, smollm2_tokenizer, max_calls=4)
    job = Job("r", [{"role": "user", "content": "Weather in Paris for 3 days, and in Lyon for 2 days?"}],
              WEATHER, opener="<tool_call>\n")
    raw = pred.predict(job)
    p = parse_payload(raw, "r", TOOLS)
    assert p.best is not None and len(p.calls) <= 4
    # next_call_opening is plain greedy decoding after the call (last token decoded again): compare.
    text = pred.format.prompt(job) + pred.format.call_text(job, p.best.function, p.best.arguments)
    ids = pred.format.encode(text)
    with torch.no_grad():
        out = smollm2_model.generate(torch.tensor([ids[:-1]]), max_new_tokens=pred.max_joint_tokens, do_sample=False)
    greedy = smollm2_tokenizer.decode(out[0, len(ids) - 1:].tolist())
    last = smollm2_tokenizer.decode(ids[-1:])
    joint = pred.next_call_opening(text)
    if greedy.startswith(last) and '{"name": "' in greedy[len(last):]:
        assert joint == greedy[len(last):greedy.index('{"name": "', len(last))]
    else:
        assert joint is None


# -- hints that follow the target through the turn ---------------------------------------------------------


def test_the_dialects_joint_between_two_calls():
    assert dialect_joint(DIALECTS["hermes"]) == JOINT
    assert dialect_joint(DIALECTS["apibank"]) == "\n"
    assert dialect_joint(DIALECTS["llama3_json"]) == "; "


@pytest.mark.parametrize("written, expected", [
    # From the start: the first call, the joint, the second call (then cut at the drafter's token limit).
    ("", "<tool_call>\n" + call(GOOD) + JOINT + call(LYON)),
    # Inside the first call: its rest, then on into the second.
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', call(GOOD)[49:] + JOINT + call(LYON)),
    # Between the calls: the rest of the joint and the second call; after it, the end of the turn.
    ("<tool_call>\n" + call(GOOD) + "\n</tool", "_call>\n<tool_call>\n" + call(LYON) + END),
    # Inside the second call: the second prediction, not the first.
    ("<tool_call>\n" + call(GOOD) + JOINT + '{"name": "get_weather", "arguments": {"ci',
     'ty": "Lyon", "days": 2, "metric": false}}' + END),
])
def test_drafts_follow_the_target_into_the_second_call(written, expected):
    _, texts = drafter_after(written, [GOOD], following=[LYON])
    assert texts[0] == expected[:96]


def test_calls_in_another_order_or_more_calls_than_predicted():
    # The target writes the second prediction first: the first prediction is what is left for its next call.
    lyon_first = "<tool_call>\n" + call(LYON) + JOINT + '{"name": "get_weather", "arguments": {"ci'
    _, texts = drafter_after(lyon_first, [GOOD], following=[LYON])
    assert texts == ['ty": "Paris", "days": 3, "metric": true}}' + END]
    # While it writes Lyon first, the Lyon prediction is the branch that follows it.
    _, texts = drafter_after('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ly', [GOOD], following=[LYON])
    assert texts == ['on", "days": 2, "metric": false}}' + END]
    # The second prediction first (matched by name), then the others in order, the next one as a branch.
    after_time = "<tool_call>\n" + call(TIME) + JOINT + '{"name": "get_weather", "arguments": {"ci'
    _, texts = drafter_after(after_time, [GOOD], following=[TIME, LYON])
    assert texts == [('ty": "Paris", "days": 3, "metric": true}}' + JOINT + call(LYON))[:96],
                     'ty": "Lyon", "days": 2, "metric": false}}' + END]
    # A third call where two were predicted: nothing from the sidecar.
    third = "<tool_call>\n" + call(GOOD) + JOINT + call(LYON) + JOINT + '{"name": "get_weather", "arguments": {"ci'
    _, texts = drafter_after(third, [GOOD], following=[LYON])
    assert texts == []
    # One call predicted, a second written: nothing either (as before several calls were predicted).
    _, texts = drafter_after("<tool_call>\n" + call(GOOD) + JOINT + '{"name": "get_weather", "arg', [GOOD])
    assert texts == []


def test_the_joint_this_target_wrote_is_used_for_its_next_calls():
    fence = "```json\n" + call(GOOD) + "\n```\n```json\n" + call(LYON) + "\n```\n```json\n" + '{"name": "get_ti'
    _, texts = drafter_after(fence, [GOOD], following=[LYON, TIME])
    assert texts[0].startswith('me", "arguments": {"zone": "CET"}}')
    # Before it has written two calls, a target that opened its own way gets no joint guessed for it.
    _, texts = drafter_after("```json\n" + call(GOOD) + "\n```", [GOOD], following=[LYON])
    assert texts == []


# -- agreement over a turn ---------------------------------------------------------------------------------


def test_turn_agreement_is_order_insensitive_and_pairs_each_call_once():
    from oospec.sidecar.agreement import compare_calls
    from oospec.tools.dialects import ToolCall

    paris, lyon = ToolCall(GOOD.function, GOOD.arguments), ToolCall(LYON.function, LYON.arguments)
    a = compare_calls([LYON, GOOD], [paris, lyon])
    assert a.full_match and a.function_match and (a.slots_matched, a.slots_total, a.calls_full) == (6, 6, 2)
    # One call predicted twice is paired once: the second written call has no prediction left.
    a = compare_calls([GOOD, GOOD], [paris, lyon])
    assert a.function_match and not a.full_match and a.calls_full == 1 and a.slots_matched == 3
    # Fewer calls predicted than written; a near miss pairs with the call it is nearest.
    near = Guess("get_weather", {"city": "Lyon", "days": 3, "metric": True})
    a = compare_calls([near], [paris, lyon])
    assert (a.functions_matched, a.slots_matched, a.calls_full) == (1, 2, 0) and not a.function_match
    # More calls predicted than written, and other functions: counted, never paired.
    a = compare_calls([TIME, GOOD, LYON], [paris])
    assert (a.functions_matched, a.calls_full, a.calls_predicted) == (1, 1, 3) and not a.full_match
    assert compare_calls([], []).full_match and not compare_calls([], [paris]).function_match


# -- on a real target: tau and identical output ------------------------------------------------------------


@pytest.fixture(scope="module")
def two_call_case(smollm2_engine):
    """A request on which SmolLM2 writes two calls in one turn (two examples before it show how), its greedy
    tokens and the two calls it writes."""
    from test_sidecar import WEATHER

    from oospec.tools.dialects import DIALECTS

    def turn(calls):
        return "\n".join("<tool_call>\n" + call(g) + "\n</tool_call>" for g in calls)

    messages = []
    for user, calls in [("Weather in Paris for 3 days and in Lyon for 2 days, metric.", [GOOD, LYON]),
                        ("Weather in Berlin for 1 day and in Madrid for 4 days, metric.",
                         [Guess("get_weather", {"city": "Berlin", "days": 1, "metric": True}),
                          Guess("get_weather", {"city": "Madrid", "days": 4, "metric": True})])]:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": turn(calls)}]
    messages.append({"role": "user", "content": "Weather in Rome for 5 days and in Oslo for 2 days, metric."})
    prompt = smollm2_engine.encode(messages, WEATHER)
    ref = smollm2_engine.generate(prompt_ids=prompt, max_new_tokens=96)
    written = DIALECTS["hermes"].parse(ref.text)
    assert len(written) == 2, ref.text
    return messages, prompt, ref.tokens, [Guess(c.name, c.arguments) for c in written]


def _run(engine, case, drafter):
    messages, prompt, _, _ = case
    return engine.generate(Request(prompt_ids=prompt, messages=messages, tools=TOOLS, dialect="hermes",
                                   max_new_tokens=96), drafter=drafter)


def test_hints_for_the_second_call_come_from_the_second_prediction(smollm2_engine, two_call_case):
    import numpy as np
    from sidecar_fakes import InstantSidecar

    from oospec.drafters import make_drafter

    _, _, ref, (first, second) = two_call_case
    one = _run(smollm2_engine, two_call_case, make_drafter("sidecar", sidecar=InstantSidecar([first])))
    turn = _run(smollm2_engine, two_call_case, make_drafter("sidecar", sidecar=InstantSidecar([first],
                                                                                               following=[second])))
    assert np.array_equal(one.tokens, ref) and np.array_equal(turn.tokens, ref)
    # The hints alone: with the second call predicted, both calls (and what joins them) come from hints.
    assert turn.stats.tau > 1.5 * one.stats.tau, (one.stats.accepted_per_step, turn.stats.accepted_per_step)
    assert turn.stats.target_forwards <= 8, turn.stats.accepted_per_step


def test_adversarial_turns_never_change_the_output(smollm2_engine, two_call_case):
    import numpy as np
    from sidecar_fakes import InstantSidecar

    from oospec.drafters import make_drafter

    _, _, ref, (first, second) = two_call_case
    lie = Guess(second.function, {k: ("x\"}\n</tool_call>" if isinstance(v, str) else v) for k, v in second.arguments.items()})
    turns = {"more calls than written": ([first], [second, TIME, LYON]),
             "fewer": ([first], []),
             "wrong order": ([second], [first]),
             "the first twice": ([first], [first]),
             "lying values": ([first], [lie, second]),
             "another function": ([TIME], [second, first])}
    for name, (best, following) in turns.items():
        out = _run(smollm2_engine, two_call_case, make_drafter("oospec", sidecar=InstantSidecar(best, following=following)))
        assert np.array_equal(out.tokens, ref), name
