"""The out-of-order sidecar: payload checks, the predictor's batched rows and hint alignment.

The faults, and the sidecar with a real target, are in test_sidecar_faults.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from sidecar_fakes import InstantSidecar

from oospec.drafters.schema import SchemaDrafter
from oospec.drafters.sidecar import SidecarDrafter, SidecarReport
from oospec.sidecar.predictor import RowRunner, SidecarPredictor
from oospec.sidecar.slot_values import parse_value
from oospec.sidecar.protocol import Guess, Job, PayloadError, encode_payload, parse_payload
from oospec.tools.dialects import CALL_OPENERS
from oospec.tools.render import CallRenderer, Style
from oospec.tools.schema import tools_from_openai

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                           "required": ["zone"]}}}]
TOOLS = tools_from_openai(WEATHER)


# -- the payload -------------------------------------------------------------------------------------------


def test_values_written_as_python_literals_are_read_as_json():
    assert parse_value('[{"a": 1}]') == [{"a": 1}]
    assert parse_value("[{'name': 'heart_rate', 'value': '80'}]") == [{"name": "heart_rate", "value": "80"}]
    assert parse_value("{'ok': True, 'n': None}") == {"ok": True, "n": None}
    for bad in ("[1, 2", "{'a': {1, 2}}", "(1, 2)", "__import__('os')", "b'x'"):
        with pytest.raises(ValueError):
            parse_value(bad)


def test_payload_round_trip_and_checks():
    raw = encode_payload("r1", [Guess("get_weather", {"city": "Paris", "days": 3}, -0.5),
                                Guess("get_time", {"zone": "CET"}, -2.0)], 0.2, 123.0)
    p = parse_payload(raw, "r1", TOOLS)
    assert p.best == Guess("get_weather", {"city": "Paris", "days": 3}, -0.5)
    assert p.alternatives[0].function == "get_time" and p.size_bytes == len(raw) and p.compute_s == 0.2
    with pytest.raises(PayloadError) as e:
        parse_payload(raw, "r2", TOOLS)
    assert e.value.kind == "wrong-request"
    # "No call expected" is an answer too: no guesses, the sidecar's belief kept.
    none = parse_payload(encode_payload("r1", [], 0.1, 1.0, call_probability=0.12), "r1", TOOLS)
    assert none.best is None and none.guesses == () and none.call_probability == 0.12
    assert parse_payload(encode_payload("r1", [Guess("get_time", {})], 0, 0, 1.7), "r1", TOOLS).call_probability is None
    with pytest.raises(PayloadError) as e:
        parse_payload(b'{"id": "r1", "function": ', "r1", TOOLS)
    assert e.value.kind == "invalid-json"
    with pytest.raises(PayloadError) as e:
        parse_payload(encode_payload("r1", [Guess("rm_rf", {})], 0, 0), "r1", TOOLS)
    assert e.value.kind == "unknown-function"
    with pytest.raises(PayloadError) as e:
        parse_payload(b"[" + b"1," * 40000 + b"1]", "r1", TOOLS)
    assert e.value.kind == "too-large"
    # Wrong types, unknown slots, enum violations and absurd lengths are dropped; the rest is kept.
    raw = encode_payload("r1", [Guess("get_weather", {"city": "Oslo", "days": "three", "metric": 1, "unit": "k",
                                                      "colour": "red"})], 0, 0)
    p = parse_payload(raw, "r1", TOOLS)
    assert p.best.arguments == {"city": "Oslo"} and len(p.dropped) == 4
    p = parse_payload(encode_payload("r1", [Guess("get_weather", {"city": "x" * 5000, "days": 2})], 0, 0), "r1", TOOLS)
    assert p.best.arguments == {"days": 2}
    with pytest.raises(PayloadError) as e:  # nothing usable left: not even the function is trusted
        parse_payload(encode_payload("r1", [Guess("get_weather", {"city": 5, "days": "x" * 5000})], 0, 0), "r1", TOOLS)
    assert e.value.kind == "bad-slots"


# -- hint rendering and alignment --------------------------------------------------------------------------


class CharTokenizer:
    """One token per character (ids = code points): alignment tests read as text."""

    all_special_ids = [0]
    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return chr(ids) if ids else None
        return [chr(i) for i in ids]


def drafter_after(text: str, guesses, dialect="hermes", slots=None, following=()):
    from oospec.engine.drafting import Request

    schema = SchemaDrafter()
    drafter = SidecarDrafter(InstantSidecar(guesses, slots, following), schema=schema)
    prompt = np.array([ord("x")], dtype=np.int64)
    req = Request(prompt_ids=prompt, eos_ids=frozenset({0}), tokenizer=CharTokenizer(),
                  messages=[{"role": "user", "content": "weather in Paris for 3 days"}], tools=TOOLS, dialect=dialect)
    schema.start(req)
    drafter.start(req)
    written = np.array([ord(c) for c in text], dtype=np.int64)
    schema.observe(written)
    context = np.concatenate([prompt, written])
    return drafter, ["".join(map(chr, c.tokens)) for c in drafter.candidates(context)]


GOOD = Guess("get_weather", {"city": "Paris", "days": 3, "metric": True})
END = "\n</tool_call>\x00"


def test_renderer_matches_the_call_text():
    r = CallRenderer(Style(), "arguments")
    assert r.call(GOOD.function, GOOD.arguments, TOOLS[0]) == (
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "metric": true}}')
    # A required slot without a value ends the hint after its key: that value is the target's to write.
    assert r.call("get_weather", {"city": "Paris"}, TOOLS[0]) == (
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": ')


@pytest.mark.parametrize("written, expected", [
    ("", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "metric": true}}'),
    ('<tool_call>\n{"name": "get_w', 'eather", "arguments": {"city": "Paris", "days": 3, "metric": true}}'),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', 'ris", "days": 3, "metric": true}}'),
    # The value differs from the hint: nothing until the next boundary...
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon', None),
    # ...then the remaining slots, in order.
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"', ', "days": 3, "metric": true}}'),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", ', '"days": 3, "metric": true}}'),
    # A key out of the hint's order: its value, then what is left.
    ('<tool_call>\n{"name": "get_weather", "arguments": {"met', 'ric": true, "city": "Paris", "days": 3}}'),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"days": 5, "metric": ', 'true, "city": "Paris"}}'),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"days": 5, "metric": fa', None),
    # Another function than the hint's: no hint.
    ('<tool_call>\n{"name": "get_time", "arguments": {', None),
    # A name that is no tool (a misnamed call): its arguments may still be the hint's, from the next boundary.
    ('<tool_call>\n{"name": "Name", "arguments": {', '"city": "Paris", "days": 3, "metric": true}}'),
    ('<tool_call>\n{"name": "Name", "arguments": {"days": 5, "met', 'ric": true, "city": "Paris"}}'),
    ('<tool_call>\n{"name": "Nam', None),
])
def test_sidecar_drafter_aligns_and_realigns(written, expected):
    _, texts = drafter_after(written, [GOOD])
    if expected is None:
        assert texts == []
    else:  # a whole call is followed by the closer its opener calls for, and end of turn (id 0 here)
        assert texts[0] == (expected + END)[: SidecarDrafter().max_tokens]


def test_alternative_function_becomes_a_branch():
    alt = Guess("get_time", {"zone": "CET"}, -2.5)
    drafter, texts = drafter_after('<tool_call>\n{"name": "get_', [replace(GOOD, score=-0.5), alt])
    assert drafter.report.alternatives == [{"function": "get_time", "arguments": {"zone": "CET"}, "log_odds": -2.0}]
    assert texts == ['weather", "arguments": {"city": "Paris", "days": 3, "metric": true}}' + END,
                     'time", "arguments": {"zone": "CET"}}' + END]
    _, texts = drafter_after('<tool_call>\n{"name": "get_time", ', [GOOD, alt])
    assert texts == ['"arguments": {"zone": "CET"}}' + END]


def test_target_choosing_another_function_asks_for_its_slots():
    drafter, texts = drafter_after('<tool_call>\n{"name": "get_time", ', [GOOD], slots={"get_time": {"zone": "CET"}})
    follow_up = drafter.sidecar.jobs[-1]
    assert follow_up.function == "get_time" and follow_up.messages == drafter.sidecar.jobs[0].messages
    assert drafter.report.followup.function == "get_time"
    written = np.array([ord(c) for c in '<tool_call>\n{"name": "get_time", '], dtype=np.int64)
    texts = ["".join(map(chr, c.tokens)) for c in drafter.candidates(np.concatenate([[ord("x")], written]))]
    assert texts == ['"arguments": {"zone": "CET"}}' + END] and drafter.report.followup.arrived
    assert len(drafter.sidecar.jobs) == 2  # asked once
    # The sidecar expected no call: nothing is drafted from it, until the target names a function after all.
    drafter, texts = drafter_after('<tool_call>\n{"name": "get_', [])
    assert texts == [] and drafter.report.no_call and len(drafter.sidecar.jobs) == 1
    drafter, _ = drafter_after('<tool_call>\n{"name": "get_time", ', [], slots={"get_time": {"zone": "CET"}})
    assert drafter.sidecar.jobs[-1].function == "get_time"
    # A function that is one of the guesses, or no tool at all, asks nothing more.
    for name in ("get_weather", "no_such_tool"):
        drafter, _ = drafter_after(f'<tool_call>\n{{"name": "{name}", ', [GOOD], slots={"get_time": {"zone": "CET"}})
        assert len(drafter.sidecar.jobs) == 1 and drafter.report.followup is None


def test_no_payload_no_candidates():
    drafter, texts = drafter_after('<tool_call>\n{"name": "', None)
    schedule = drafter.report.schedule  # a test double that names no device: its own, so it always runs
    assert schedule["run"] and schedule["why"] == "own device" and schedule["cost_s"] == 0.0
    assert texts == [] and drafter.report == SidecarReport(submitted=True, schedule=schedule)
    assert drafter.report.as_dict() == {"submitted": True, "schedule": schedule}


# -- the predictor -----------------------------------------------------------------------------------------
def test_row_runner_batches_equal_single_rows():
    """Rows decoded together (shared prefix cache, left padding) give each row's own greedy tokens."""
    from helpers import tiny_model

    model = tiny_model("llama", seed=3)
    prefix = [5, 17, 42, 99, 7, 12]
    suffixes = [[3], [8, 9, 10], [44, 45], [100, 101, 102, 103]]
    runner = RowRunner(model)
    runner.encode_prefix(prefix)
    logprobs, generated = runner.run(suffixes, steps=6, keep_all_logits=True)
    for suf, lp, gen in zip(suffixes, logprobs, generated):
        ids = torch.tensor([prefix + suf])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        want_lp = torch.log_softmax(logits, -1)[len(prefix) - 1 : -1].gather(1, torch.tensor(suf)[:, None])[:, 0]
        assert np.allclose(lp, want_lp.numpy(), atol=1e-4)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                             pad_token_id=0)[0, ids.shape[1]:].numpy()
        assert np.array_equal(gen, ref)
    # A prefix that shares its start with the cached one is encoded from where they part, with the same result.
    for longer in (prefix + [61, 62, 63], prefix[:4] + [70, 71], prefix[:3]):
        runner.encode_prefix(longer)
        fresh = RowRunner(model)
        fresh.encode_prefix(longer)
        assert runner.prefix_ids == longer and torch.allclose(runner.prefix_logits, fresh.prefix_logits, atol=1e-4)
        assert all(torch.allclose(a.keys[:, :, : len(longer)], b.keys[:, :, : len(longer)], atol=1e-5)
                   for a, b in zip(runner._prefix_layers, fresh._prefix_layers))
        lp, gen = runner.run(suffixes, steps=4, keep_all_logits=True)
        lp2, gen2 = fresh.run(suffixes, steps=4, keep_all_logits=True)
        assert np.array_equal(gen, gen2) and all(np.allclose(a, b, atol=1e-4) for a, b in zip(lp, lp2))


def test_row_runner_first_token_is_the_likeliest_allowed_one():
    """`first` restricts a row's first generated token to the likeliest of the allowed ids; the rest is the greedy
    continuation after it; a row given None decodes as it does without."""
    from helpers import tiny_model

    model = tiny_model("llama", seed=3)
    prefix, suffixes = [5, 17, 42, 99, 7, 12], [[3], [8, 9, 10]]
    runner = RowRunner(model)
    runner.encode_prefix(prefix)
    _, free = runner.run(suffixes, steps=5)
    allowed = np.array([t for t in range(40, 90) if t != free[0, 0]], dtype=np.int64)
    _, gen = runner.run(suffixes, steps=5, first=[allowed, None])
    assert np.array_equal(gen[1], free[1])
    ids = torch.tensor([prefix + suffixes[0]])
    with torch.no_grad():
        want = int(allowed[model(ids).logits[0, -1, torch.from_numpy(allowed)].argmax()])
    assert gen[0, 0] == want != free[0, 0]
    forced = torch.tensor([prefix + suffixes[0] + [want]])
    ref = model.generate(forced, attention_mask=torch.ones_like(forced), do_sample=False, max_new_tokens=4,
                         pad_token_id=0)[0, forced.shape[1]:].numpy()
    assert np.array_equal(gen[0, 1:], ref)


def test_slot_values_are_decoded_with_token_healing(smol_predictor):
    """A value's first characters merge with the opener before them (` "(` and ` -` are single tokens), so a
    row ending on the opener would ask for a split the model never saw (it drops the bracket of a formula).
    Each slot row stops one token short; its first token must begin with the text left out; the value is read
    after that text."""
    p = SidecarPredictor(smol_predictor.model, smol_predictor.tokenizer)
    spec = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {
        "formula": {"type": "string"}, "shift": {"type": "integer"}, "terms": {"type": "array"}}}}}]
    tool = tools_from_openai(spec)[0]
    job = Job("h", [{"role": "user", "content": "Work out (7+2)*4, shifted by -3."}], spec, chat_tools=spec)
    prompt = p.format.prompt(job)
    answers = [' "(7+2)*4"}', " -3}", ' ["a", "b"]}']  # as the model would write them after `"formula":`
    seen = {}

    def run(rows, steps=0, keep_all_logits=False, stop=None, first=None):
        seen.update(rows=rows, first=first)
        for i, text in enumerate(answers):
            gen = np.asarray(p.format.encode(text), dtype=np.int64)
            assert gen[0] in first[i]
            assert any(stop(i, gen[:k]) for k in range(1, gen.size + 1))  # the value ends
        return [], None

    p.runner.run = run
    values = p.decode_free(job, prompt, [(tool, q) for q in tool.parameters])
    assert values == {("calc", "formula"): "(7+2)*4", ("calc", "shift"): -3, ("calc", "terms"): ["a", "b"]}
    for q, row, allowed in zip(tool.parameters, seen["rows"], seen["first"]):
        whole = p.format.encode(prompt + p.format.slot_prefix(job, "calc", q))
        assert row == whole[:-1]  # one token short of the opener
        left_out = p.token_bytes(whole[-1])
        assert left_out.strip() in (b'"', b"", b"[") and left_out.startswith(b" ")
        begins = {t for t in range(len(p.tokenizer)) if p.token_bytes(t).startswith(left_out) and p.token_bytes(t)}
        if q.type == "integer":  # and goes on as a number can: ` "` would make it a string, which is dropped
            begins = {t for t in begins if p.token_bytes(t)[len(left_out):len(left_out) + 1] in b"-0123456789"}
            assert p.format.encode(' "')[0] not in allowed
        assert set(allowed.tolist()) == begins


def test_function_choice_greedy_path_or_whole_name():
    """Greedy follows the likelier first token (as free generation would); "total" takes the likelier whole name
    (what the ranking loss trains). Runners-up within the margin follow either way."""
    rows = [[1, 2, 10, 11], [1, 2, 20, 21], [1, 2, 30, 31]]
    logprobs = [np.array([-0.1, -5.0]), np.array([-0.5, -0.1]), np.array([-9.0, -0.1])]
    greedy = SidecarPredictor.__new__(SidecarPredictor)
    greedy.alternative_margin, greedy.max_alternatives, greedy.rank_by = 3.0, 3, "greedy"
    # Greedy takes A (-0.1 first); B, the likeliest whole name (-0.6 vs -5.1), stays as the runner-up.
    assert [i for i, _ in greedy.rank_functions(rows, 2, logprobs)] == [0, 1]
    total = SidecarPredictor.__new__(SidecarPredictor)
    total.alternative_margin, total.max_alternatives, total.rank_by = 3.0, 3, "total"
    assert total.rank_functions(rows, 2, logprobs) == [(1, pytest.approx(-0.6))]  # A is 4.5 nats below
    total.alternative_margin = 5.0
    assert total.rank_functions(rows, 2, logprobs) == [(1, pytest.approx(-0.6)), (0, pytest.approx(-5.1))]
    # With the names' prior taken out (PMI): A is far likelier than its prior says, B just as likely as its prior.
    total.alternative_margin, total.prior_weight = 3.0, 1.0
    prior = np.array([-6.0, -0.1, -9.0])  # scores: 0.9, -0.5, -0.1
    # Each comes with the score it was ranked by (the payload's score; the report's log-odds are differences).
    assert total.rank_functions(rows, 2, logprobs, prior) == [(0, pytest.approx(0.9)), (2, pytest.approx(-0.1)),
                                                              (1, pytest.approx(-0.5))]
    with pytest.raises(ValueError, match="rank_by"):
        SidecarPredictor(None, None, rank_by="best")


@pytest.fixture(scope="module")
def smol_predictor(smollm2_engine):
    """The predictor `SidecarPredictor.from_pretrained` builds (CPU kernels, no adapter), on the engine's weights:
    it only reads them."""
    return SidecarPredictor(smollm2_engine.model, smollm2_engine.tokenizer)


def test_predictor_payload_on_real_model(smol_predictor):
    job = Job("r1", [{"role": "user", "content": "What's the weather in Paris for the next 3 days? Use celsius."}],
              WEATHER, chat_tools=WEATHER, opener="<tool_call>\n")
    raw = smol_predictor.predict(job)
    payload = parse_payload(raw, "r1", TOOLS)
    assert payload.best.function in ("get_weather", "get_time")
    assert payload.size_bytes == len(raw) < 600
    # Every slot value the small model produced is typed by the schema (parse_payload keeps only those).
    assert set(payload.best.arguments) <= {p.name for p in TOOLS[0].parameters} | {"zone"}
    assert not payload.dropped
    # Its belief that a call comes, in any wrapper: the sum over every known opener, whichever the job names
    # (a drafter's first request sends its dialect's guess, which need not be what the target writes).
    assert 0 < payload.call_probability <= 1 and payload.call_probability == pytest.approx(
        smol_predictor.call_probability, rel=1e-3)
    prompt = smol_predictor.format.prompt(job)
    each = [smol_predictor.call_likelihood(replace(job, opener=o, openers=[]), prompt) for o in CALL_OPENERS]
    assert each == pytest.approx([each[0]] * len(each), rel=1e-3)
    # ... and it is the sum of the openers' own probabilities, so no single opener's is lost.
    rows = [smol_predictor.format.encode(prompt + smol_predictor.format.function_prefix(replace(job, opener=o)))
            for o in CALL_OPENERS]
    _, logprobs = smol_predictor.score_rows(rows)
    alone = [float(np.exp(lp.sum())) for lp in logprobs]
    assert 0 < each[0] == pytest.approx(min(1.0, sum(alone)), rel=1e-3)
    # The follow-up once the target has chosen: that function's slots only.
    forced = Job("r2", job.messages, WEATHER, chat_tools=WEATHER, opener="<tool_call>\n", function="get_time")
    payload = parse_payload(smol_predictor.predict(forced), "r2", TOOLS)
    assert payload.best.function == "get_time" and not payload.alternatives
    with pytest.raises(ValueError, match="does not offer"):
        smol_predictor.predict(Job("r3", job.messages, WEATHER, function="rm_rf"))


def test_name_prior_leaves_the_conversation_out_and_is_kept_per_tool_list(smol_predictor):
    p = SidecarPredictor(smol_predictor.model, smol_predictor.tokenizer, prior_weight=1.0)
    ask = lambda text: Job("r", [{"role": "system", "content": "You call tools."},  # noqa: E731
                                 {"role": "user", "content": text}], WEATHER, chat_tools=WEATHER, opener="<tool_call>\n")
    first = p.name_prior(ask("Weather in Paris?"), TOOLS)
    assert len(first) == len(TOOLS) and np.all(first < 0) and len(p._priors) == 1
    fresh = SidecarPredictor(smol_predictor.model, smol_predictor.tokenizer, prior_weight=1.0)
    assert np.allclose(fresh.name_prior(ask("What time is it in Tokyo?"), TOOLS), first, atol=1e-4)
    payload = parse_payload(p.predict(ask("What time is it in Tokyo?")), "r", TOOLS)
    assert payload.best.function in ("get_weather", "get_time") and len(p._priors) == 1  # the same tools: reused


def test_job_is_plain_data():
    job = Job("r", [{"role": "user", "content": "hi"}], WEATHER, None, "<tool_call>\n", "arguments")
    assert Job.from_dict(json.loads(json.dumps(job.to_dict()))) == job
