"""What the server refuses when it admits a request, and what it does when a grammar fails anyway, without a
server: text that is not Unicode, schemas no call grammar can follow, a grammar that fails mid-reply (the reply
ends there, identically whatever the drafter), repeated and parallel calls, Retry-After."""

import numpy as np
import pytest
import torch
from adversarial import DecoyOracleDrafter, EmptyDrafter, HugeTreeDrafter, RandomTreeDrafter
from helpers import tiny_model

from oospec.drafters import make_drafter
from oospec.engine.constraint import probe
from oospec.engine.tree import TokenTree
from oospec.engine.engine import Engine
from oospec.server.errors import APIError, json_bytes
from oospec.server.reply import ToolCallStream
from oospec.server.schemas import parse_chat_request
from oospec.server.worker import MAX_RETRY_AFTER_S, Worker
from oospec.tools.call_grammar import call_grammar, forced_call_start
from oospec.tools.dialects import get_dialect
from oospec.tools.schema_limits import MAX_ALTERNATIVES, UnsupportedSchema, check_schema

HERMES = get_dialect("hermes")


def obj(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


def tool(name, parameters):
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# -- text that is not Unicode ----------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "\udc00"}]}]},
     "messages[0].content[1].text"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"x": "\\ud800"}'}}]}]},
     "messages[1].tool_calls[0].function.arguments.x"),
    ({"messages": [{"role": "tool", "content": "ok\udfff", "tool_call_id": "1"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": "d\ud800"}}]}, "tools[0].function.description"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": obj({"k\ud800": {"type": "string"}})}}]},
     "tools[0].function.parameters.properties (a key)"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": ["x", "\ud800"]}, "stop[1]"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "m\ud800"}, "model"),
])
def test_a_lone_surrogate_is_refused_naming_its_field(body, param):
    with pytest.raises(APIError) as caught:
        parse_chat_request(body)
    error = caught.value
    assert error.status == 400 and error.code == "invalid_unicode" and error.param == param
    assert error.message.startswith(param) and "lone surrogate" in error.message
    json_bytes(error.body()).decode("utf-8")  # the answer itself encodes


def test_valid_pairs_noncharacters_and_controls_are_served_as_given():
    text = "\U0001f600 \ufffe\uffff\ufdd0 \x00\x1b \u202e"
    req = parse_chat_request({"messages": [{"role": "user", "content": text}], "stop": ["\U0010fffe"]})
    assert req.messages[0]["content"] == text and req.stop == ["\U0010fffe"]


def test_answers_that_quote_a_surrogate_still_encode():
    raw = json_bytes({"error": {"message": "model 'm\ud800' is not served"}})
    assert b"\\ud800" in raw and raw.decode("utf-8")


# -- schemas no grammar can follow -----------------------------------------------------------------------------


def defs(definitions, top):
    return {**obj({"a": top}, ["a"]), "definitions": definitions}


REFUSED = {
    "optional properties": obj({f"p{i}": {"type": "string"} for i in range(MAX_ALTERNATIVES + 1)}),
    "anyOf with": obj({"a": {"anyOf": [{"const": i} for i in range(MAX_ALTERNATIVES + 1)]}}),
    "cycle that reads no character": defs({"A": {"$ref": "#/definitions/B"}, "B": {"$ref": "#/definitions/A"}},
                                          {"$ref": "#/definitions/A"}),
    "cycle that reads no character ": defs({"A": {"allOf": [{"$ref": "#/definitions/B"}]},
                                            "B": {"allOf": [{"$ref": "#/definitions/A"}]}}, {"$ref": "#/definitions/A"}),
    "cycle that reads no character  ": {"$ref": "#"},
    "references followed in a row": defs({**{f"A{i}": {"$ref": f"#/definitions/A{i + 1}"} for i in range(80)},
                                          "A80": {"type": "string"}}, {"$ref": "#/definitions/A0"}),
}
KEPT = {
    "required properties": obj({f"p{i}": {"type": "string"} for i in range(600)}, [f"p{i}" for i in range(600)]),
    "loop through properties": defs({"A": obj({"b": {"$ref": "#/definitions/B"}}),
                                     "B": obj({"a": {"$ref": "#/definitions/A"}})}, {"$ref": "#/definitions/A"}),
    "loop through items": obj({"x": {"$ref": "#"}, "ys": {"type": "array", "items": {"$ref": "#"}}}),
    "junk keywords": obj({"a": [1, {"$ref": 5}], "b": {"$ref": "#/nowhere"}}),
}


@pytest.mark.parametrize("reason", REFUSED)
def test_schemas_no_grammar_can_follow_are_refused_by_shape(reason):
    with pytest.raises(UnsupportedSchema, match=reason.strip()):
        check_schema(REFUSED[reason])
    with pytest.raises(UnsupportedSchema, match="function 'f'"):
        call_grammar([tool("f", REFUSED[reason])], ["f"], HERMES)


@pytest.mark.parametrize("shape", KEPT)
def test_recursive_and_wide_required_schemas_are_kept(shape):
    check_schema(KEPT[shape])


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer, one_thread):
    return Engine(tiny_model("qwen2", seed=5, vocab=len(smollm2_tokenizer)), smollm2_tokenizer)


def test_the_probe_finds_what_the_shape_rules_let_through(engine):
    """The library's own limits (an Earley row of 2,000 items), met at the start of the arguments, are found
    before decoding: the shape rules are bypassed here by building the grammar text directly."""
    vocab = engine.grammar_vocabulary()
    wide = tool("f", obj({f"p{i}": {"type": "string"} for i in range(700)}))
    grammar = call_grammar([tool("f", obj({}))], ["f"], HERMES, special_tokens=vocab.special_tokens).replace(
        '"properties": {}', '"properties": ' + __import__("json").dumps(wide["function"]["parameters"]["properties"]))
    problem = probe(vocab, grammar, forced_call_start(HERMES, "f"))
    assert problem is not None and "row" in problem.lower(), problem
    fine = call_grammar([tool("f", KEPT["loop through properties"])], ["f"], HERMES,
                        special_tokens=vocab.special_tokens)
    assert probe(vocab, fine, forced_call_start(HERMES, "f")) is None
    assert "compile" in probe(vocab, "start: nowhere\n")


# -- a grammar that fails mid-reply ------------------------------------------------------------------------------


def failing_grammar(engine, optional: int = 700) -> tuple[str, str]:
    """A named call whose argument `a` is an enum and `b` an object with `optional` optional properties: the library
    fails where `b`'s object opens (the shape rules are bypassed, as a schema they do not know would be)."""
    vocab = engine.grammar_vocabulary()
    params = obj({"a": {"type": "string", "enum": ["x", "y"]}, "b": obj({"PLACEHOLDER": {"type": "string"}})},
                 ["a", "b"])
    grammar = call_grammar([tool("f", params)], ["f"], HERMES, special_tokens=vocab.special_tokens)
    wide = ", ".join(f'"q{i}": {{"type": "string"}}' for i in range(optional))
    return grammar.replace('"PLACEHOLDER": {"type": "string"}', wide), forced_call_start(HERMES, "f")


def prompt_of(engine, forced):
    messages = [{"role": "user", "content": "Call f."}]
    return np.concatenate([engine.encode(messages), engine.tokenizer.encode(forced, add_special_tokens=False)])


def test_a_grammar_failing_mid_reply_ends_it_there_identically_for_every_drafter(engine):
    grammar, forced = failing_grammar(engine)
    prompt = prompt_of(engine, forced)
    constraint = engine.constraint(grammar, forced)
    plain = engine.generate(prompt_ids=prompt, max_new_tokens=60, constraint=constraint)
    text = engine.tokenizer.decode(plain.tokens, skip_special_tokens=True)
    assert constraint.failure is not None and plain.generation.finish_reason == "stop", text
    assert int(plain.tokens[-1]) in engine.eos_ids and '"a": ' in text and len(plain.tokens) > 4, text
    vocab = len(engine.tokenizer)
    for drafter in (EmptyDrafter(), RandomTreeDrafter(vocab, 1), HugeTreeDrafter(vocab, 2),
                    DecoyOracleDrafter(plain.tokens, vocab, 3), make_drafter("toolspec")):
        for budget in (4, 32):
            again = engine.constraint(grammar, forced)
            spec = engine.generate(prompt_ids=prompt, max_new_tokens=60, drafter=drafter, budget=budget,
                                   constraint=again, tools=[tool("f", obj({}))], dialect="hermes")
            assert np.array_equal(spec.tokens, plain.tokens), (drafter.name, budget)
            assert again.failure is not None


def test_a_failing_side_branch_changes_nothing_on_the_other(engine):
    """A draft tree with two branches below the pending token: one runs into the part of the grammar the library
    cannot follow (an optional `b` with 700 optional properties), the other closes the call after `a`. The rows of
    the good branch are exactly those plain decoding sees along it, no failure is recorded, and the matcher,
    rebuilt after the failing branch, goes on."""
    vocab = engine.grammar_vocabulary()
    params = obj({"a": {"type": "string", "enum": ["x", "y"]}, "b": obj({"PLACEHOLDER": {"type": "string"}})}, ["a"])
    grammar = call_grammar([tool("f", params)], ["f"], HERMES, special_tokens=vocab.special_tokens)
    grammar = grammar.replace('"PLACEHOLDER": {"type": "string"}',
                              ", ".join(f'"q{i}": {{"type": "string"}}' for i in range(700)))
    forced = forced_call_start(HERMES, "f")
    encode = lambda text: engine.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    good, bad = encode('{"a": "x"}'), encode('{"a": "x", "b": {"q1": "z"}}')
    shared = next(i for i, (g, b) in enumerate(zip(good, bad)) if g != b)
    first, pending = good[0], good[1:]  # the pending token is `first`; the tree hangs below it
    tokens = pending + bad[shared:]
    suffix = len(bad) - shared  # good[k] is node k-1; the bad branch leaves below good[shared-1]
    parents = [i - 1 for i in range(len(pending))] + [shared - 2 if j == 0 else len(pending) + j - 1
                                                      for j in range(suffix)]
    tree = TokenTree(np.array(tokens), np.array(parents, dtype=np.int32))
    constraint = engine.constraint(grammar, forced)
    constraint.advance([first])
    pruned, rows = constraint.prune(tree)
    assert list(pruned.tokens[:len(pending)]) == pending and constraint.failure is None
    assert 1 <= len(pruned) - len(pending) < suffix  # the bad branch is kept down to where it fails
    reference = engine.constraint(grammar, forced)
    reference.advance([first])
    for i, token in enumerate(pending):  # row 0: after the pending token; row i+1: after good node i
        assert torch.equal(rows[i], reference.prune(TokenTree.empty())[1][0]), i
        reference.advance([token])
    failing_rows = rows[len(pending) + 1:]
    assert any(torch.equal(r, constraint._end_row) for r in failing_rows)  # the bad branch ends where it fails
    constraint.advance(pending)
    assert torch.equal(constraint.prune(TokenTree.empty())[1][0], reference.prune(TokenTree.empty())[1][0])
    assert constraint.failure is None


# -- repeated calls, parallel calls, Retry-After --------------------------------------------------------------------

CALL = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>\n'


def stream_all(stream: ToolCallStream, text: str, piece: int = 3):
    events = []
    for i in range(0, len(text), piece):
        events += stream.feed(text[i:i + piece])
        if stream.repeated:
            break
    content, calls, ids, final = stream.finish()
    return events + final, calls, ids


def test_a_repeated_call_is_dropped_and_ends_the_reply_in_both_modes():
    text = (CALL.format("get_time", '{"city": "Tokyo"}') + CALL.format("get_time", '{"city":"Tokyo"}')
            + CALL.format("get_time", '{"city": "Oslo"}'))
    stream = ToolCallStream(["get_time"], HERMES)
    events, calls, ids = stream_all(stream, text)
    assert stream.repeated and [c.arguments for c in calls] == ['{"city": "Tokyo"}']
    announced = [e for e in events if e[0] == "call"]
    assert [e[2] for e in announced] == ids and len(ids) == 1
    whole = ToolCallStream(["get_time"], HERMES)  # the final parse alone (no streaming) drops the same repeat
    whole.text = text
    assert [c.arguments for c in whole.finish()[1]] == ['{"city": "Tokyo"}', '{"city": "Oslo"}']


def test_distinct_later_calls_are_sent_whole_and_agree_with_the_final_message():
    text = CALL.format("get_time", '{"city": "Tokyo"}') + CALL.format("get_weather", '{"city": "Oslo"}')
    events, calls, ids = stream_all(ToolCallStream(["get_time", "get_weather"], HERMES), text)
    args = {}
    for e in events:
        if e[0] == "args":
            args[e[1]] = args.get(e[1], "") + e[2]
    assert [args[i] for i in sorted(args)] == [c.arguments for c in calls] and len(ids) == 2


def test_parallel_calls_off_keeps_the_first_call():
    text = CALL.format("get_time", '{"city": "Tokyo"}') + CALL.format("get_weather", '{"city": "Oslo"}')
    events, calls, ids = stream_all(ToolCallStream(["get_time", "get_weather"], HERMES, parallel=False), text)
    assert [c.name for c in calls] == ["get_time"] and len({e[1] for e in events if e[0] == "call"}) == 1


def test_retry_after_follows_typical_jobs_not_one_slow_one_and_is_bounded():
    worker = Worker(lambda job: None, max_queue=4)
    try:
        worker.recent_s.extend([2.0] * 9 + [1282.0])  # one request that took 21 minutes
        worker._queue.put_nowait(object())  # one job waiting (never run: the worker thread is not fed it)
        assert 2 <= worker.retry_after_s() <= 3
        worker.recent_s.extend([500.0] * 20)
        assert worker.retry_after_s() == MAX_RETRY_AFTER_S
    finally:
        worker._queue.get_nowait()
        worker.close(1)
