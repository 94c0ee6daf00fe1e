"""The server's request parsing and reply assembly, without a model (a real tokenizer only)."""

import json

import pytest

from oospec.server.errors import APIError
from oospec.server.reply import (
    Detokenizer,
    ReplyBuilder,
    StopMatcher,
    ToolCallStream,
    parse_reply,
)
from oospec.server.guard import check_json_body
from oospec.server.schemas import parse_chat_request
from oospec.tools.dialects import get_dialect

HERMES = get_dialect("hermes")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


# --------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------


def bad(body, param_part=""):
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    assert info.value.status == 400
    assert param_part in (info.value.param or "")
    return info.value


def test_deep_and_non_object_bodies():
    for body in ([1, 2], "text", None):
        bad(body)
    with pytest.raises(APIError) as info:
        check_json_body(b"[" * 65 + b"]" * 65)
    assert info.value.status == 400
    check_json_body(b'{"a": "[[[[' + b"[" * 100 + b'"}')  # brackets inside strings do not count


def test_messages_are_validated_with_the_field_named():
    bad({}, "messages")
    bad({"messages": []}, "messages")
    bad({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role")
    bad({"messages": [{"role": "user"}]}, "messages[0].content")
    image = bad({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                "messages[0].content[0]")
    assert "'image_url'" in image.message and "str" not in image.message  # the part named, not the union's members
    bad({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text")
    long_name = bad({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                     "tool_choice": {"type": "function", "function": {"name": "x" * 100_000}}}, "tool_choice")
    assert len(long_name.message) < 400
    bad({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                          "arguments": "{oops"}}]}]},
        "arguments")
    req = parse_chat_request({"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]})
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    assert req.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert req.messages[3]["tool_call_id"] == "c1"


def test_tools_and_tool_choice():
    msgs = [{"role": "user", "content": "hi"}]
    bad({"messages": msgs, "tools": {"name": "f"}}, "tools")
    bad({"messages": msgs, "tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0]")
    bad({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools")
    bad({"messages": msgs, "tools": TOOLS + TOOLS[:1]}, "tools")  # defined twice
    bad({"messages": msgs, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice")
    bad({"messages": msgs, "tool_choice": "required"}, "tool_choice")
    bad({"messages": msgs, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice")
    assert parse_chat_request({"messages": msgs, "tools": TOOLS}).tool_choice == "auto"
    assert parse_chat_request({"messages": msgs}).tool_choice == "none"
    named = parse_chat_request({"messages": msgs, "tools": TOOLS,
                                "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert (named.tool_choice, named.forced_function) == ("function", "get_time")
    assert parse_chat_request({"messages": msgs, "tools": TOOLS, "tool_choice": "required"}).tool_choice == "required"
    single = parse_chat_request({"messages": msgs, "tools": TOOLS[:1], "tool_choice": "required"})
    assert (single.tool_choice, single.forced_function) == ("function", "get_weather")


def test_sampling_and_limits_fields():
    msgs = [{"role": "user", "content": "hi"}]
    for field, value in [("max_tokens", 0), ("max_tokens", "5"), ("max_tokens", True), ("temperature", 3),
                         ("temperature", "hot"), ("top_p", 0), ("n", 2), ("stop", ["a"] * 5), ("stop", [""]),
                         ("stop", 7), ("stream", "yes"), ("presence_penalty", 0.5), ("logprobs", True),
                         ("response_format", {"type": "json_object"}), ("oospec", {"dialect": "klingon"}),
                         ("oospec", {"speed": "max"}), ("seed", 1.5)]:
        bad({"messages": msgs, field: value}, field)
    req = parse_chat_request({"messages": msgs, "max_completion_tokens": 7, "max_tokens": 99, "stop": "END",
                              "temperature": 0.7, "stream": True, "stream_options": {"include_usage": True},
                              "model": "gpt-4o", "user": "ignored", "n": 1})
    assert (req.max_tokens, req.stop, req.temperature, req.stream, req.include_usage) == (7, ["END"], 0.7, True, True)
    assert parse_chat_request({"messages": msgs}).temperature == 0.0  # this server's default: greedy
    assert parse_chat_request({"messages": msgs}, default_temperature=1.0).temperature == 1.0


# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------


def test_detokenizer_deltas_add_up_to_the_full_decode(tokenizer):
    text = 'Héllo wörld — ünïcödé ✓ 日本語のテキスト 🚀🚀 {"city": "Zürich"}\n\tend'
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) + detok.flush() == tokenizer.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)  # never half a character
    assert sum(1 for d in deltas if d == "") > 0  # multi-byte characters were held back at least once


def test_stop_matcher_cuts_before_the_first_stop_across_pieces():
    m = StopMatcher(["STOP", "\n\n"])
    out = []
    for piece in ["abc S", "TO", "x ST", "OP tail"]:
        text, hit = m.feed(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "abc STOx "
    assert hit
    m = StopMatcher(["END"])
    assert m.feed("the E") == ("the ", False)
    assert m.feed("N") == ("", False)
    assert m.flush() == "EN"  # the reply ended without the stop string: the held text is real text


def test_reply_builder_counts_tokens_up_to_the_stop_string(tokenizer):
    ids = tokenizer.encode("one two three four five six", add_special_tokens=False)
    rb = ReplyBuilder(tokenizer, stops=["four"], tool_names=None, dialect=HERMES)
    assert rb.push(ids[:2]) is False
    assert rb.push(ids[2:]) is True
    reply = rb.finish()
    assert reply.text == "one two three "
    assert reply.stopped
    prefix = tokenizer.decode(ids[: reply.completion_tokens])
    assert "four" in prefix and "four" not in tokenizer.decode(ids[: reply.completion_tokens - 1])


# --------------------------------------------------------------------------------------------------
# Tool calls
# --------------------------------------------------------------------------------------------------


CALL_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"centre\\"", '
             '"nested": {"a": [1, {"b": "}"}]}}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
             '</tool_call>')


def test_parse_reply_rules():
    names = ["get_weather", "get_time"]
    content, calls = parse_reply(CALL_TEXT, names, HERMES)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": 'Paris "centre"', "nested": {"a": [1, {"b": "}"}]}}
    assert parse_reply(CALL_TEXT, None, HERMES) == (CALL_TEXT, [])  # tools not offered: all content
    assert parse_reply("Just text {\"a\": 1}", names, HERMES) == ("Just text {\"a\": 1}", [])
    content, calls = parse_reply('```json\n{"name": "get_time", "arguments": {}}\n```', names, HERMES)
    assert content is None and calls[0].name == "get_time"
    # JSON-only text naming a function that was not offered is content, not a call
    text = '{"name": "launch_rockets", "arguments": {}}'
    assert parse_reply(text, names, HERMES) == (text, [])
    # A call whose object the model never closed: its arguments still count (as streamed)
    unclosed = '<tool_call>\n{"name": "get_weather", "arguments": \n{"city": "Oslo"}\n</tool_call> and more'
    assert json.loads(parse_reply(unclosed, names, HERMES)[1][0].arguments) == {"city": "Oslo"}
    # Arguments that are not JSON come back as written; arguments as a JSON string are decoded
    odd = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {'city': 'Rome'}}</tool_call>"
    assert parse_reply(odd, names, HERMES)[1][0].arguments == "{'city': 'Rome'}"
    as_string = '<tool_call>\n{"name": "get_time", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>'
    assert json.loads(parse_reply(as_string, names, HERMES)[1][0].arguments) == {"city": "Rome"}
    # Keys in another order: the lenient extraction still finds the call
    swapped = '<tool_call>\n{"arguments": {"city": "Lima"}, "name": "get_weather"}\n</tool_call>'
    assert parse_reply(swapped, names, HERMES)[1][0].name == "get_weather"
    # A forced call without the opener (llama3_json style) is read the same way
    llama = get_dialect("llama3_json")
    forced = '{"name": "get_weather", "parameters": {"city": "Oslo"}'
    assert parse_reply(forced, names, llama, "get_weather")[1][0].arguments == '{"city": "Oslo"}'
    assert parse_reply(forced, names, llama)[1] == []
    # A call cut off by max_tokens comes back incomplete, with the arguments written so far (as OpenAI does)
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    content, calls = parse_reply(cut, names, HERMES)
    assert content is None and (calls[0].name, calls[0].arguments, calls[0].complete) == ("get_weather", '{"ci', False)
    content, calls = parse_reply(CALL_TEXT + '\n<tool_call>\n{"name": "get_time", "arguments": {"x', names, HERMES)
    assert [c.complete for c in calls] == [True, True, False]
    # A call region without a call header is content
    assert parse_reply("<tool_call>\nno idea", names, HERMES) == ("<tool_call>\nno idea", [])


def replay(stream: ToolCallStream, text: str, step: int):
    events = []
    for i in range(0, len(text), step):
        events += stream.feed(text[i:i + step])
    content, calls, ids, final = stream.finish()
    return events + final, content, calls, ids


def assemble(events):
    """What an OpenAI client accumulates from the deltas."""
    content, calls = "", {}
    for ev in events:
        if ev[0] == "content":
            content += ev[1]
        elif ev[0] == "call":
            calls[ev[1]] = {"id": ev[2], "name": ev[3], "arguments": ""}
        else:
            calls[ev[1]]["arguments"] += ev[2]
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_calls_match_the_final_parse(step):
    events, content, calls, ids = replay(ToolCallStream(["get_weather", "get_time"], HERMES), CALL_TEXT, step)
    streamed_content, streamed = assemble(events)
    assert streamed_content == content == "Let me check."
    assert [c["name"] for c in streamed] == [c.name for c in calls]
    assert [json.loads(c["arguments"]) for c in streamed] == [json.loads(c.arguments) for c in calls]
    assert [c["id"] for c in streamed] == ids
    if step < len(CALL_TEXT):  # arguments really were streamed in pieces, not sent whole at the end
        assert sum(1 for ev in events if ev[0] == "args" and ev[1] == 0) > 1


@pytest.mark.parametrize("text", [
    "Plain answer with trailing space and newline \n",
    "Almost an opener <tool_ but not quite",
    '{"name": "get_time", "arguments": {}}',
    '{"not": "a call"}',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>',
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {'city': 'Rome'}}\n</tool_call>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_time", "arguments": "{}"}</tool_call>',
])
def test_streams_agree_with_the_final_message(text):
    for step in (1, 4, 1000):
        events, content, calls, ids = replay(ToolCallStream(["get_weather", "get_time"], HERMES), text, step)
        streamed_content, streamed = assemble(events)
        assert streamed_content == (content or "")
        if not streamed:
            assert [c.name for c in calls] == []
        else:
            assert [c["name"] for c in streamed] == [c.name for c in calls]
            for s_call, call in zip(streamed, calls):
                try:
                    assert json.loads(s_call["arguments"]) == json.loads(call.arguments)
                except ValueError:  # cut off, or not JSON: exactly as written
                    assert s_call["arguments"] == call.arguments


def test_content_is_streamed_before_the_reply_ends():
    stream = ToolCallStream(["get_time"], HERMES)
    assert stream.feed("Hello") == [("content", "Hello")]
    assert stream.feed(" there <tool") == [("content", " there")]  # the possible opener and blank are held
    assert stream.feed("box>") == [("content", " <toolbox>")]


def test_parallel_tool_calls_false_keeps_the_first_call():
    events, content, calls, ids = replay(ToolCallStream(["get_weather", "get_time"], HERMES, parallel=False),
                                         CALL_TEXT, 5)
    assert [c.name for c in calls] == ["get_weather"]
    assert [c["name"] for c in assemble(events)[1]] == ["get_weather"]


# --------------------------------------------------------------------------------------------------
# Issue 33: only offered functions are called; non-object arguments; forced starts are not content
# --------------------------------------------------------------------------------------------------

NAMES = ["get_weather", "get_time"]
UNKNOWN = '<tool_call>\n{"name": "Paris", "arguments": {"city": "Paris"}}\n</tool_call>'
KNOWN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def both_ways(text, step=3, **kwargs):
    """(content, calls) parsed whole, after checking that a stream of the same text agrees with it."""
    events, content, calls, ids = replay(ToolCallStream(NAMES, HERMES, **kwargs), text, step)
    streamed_content, streamed = assemble(events)
    assert streamed_content == (content or "")
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c.name, c.arguments) for c in calls]
    assert all(ev[3] in NAMES for ev in events if ev[0] == "call")  # no unoffered name is ever announced
    return content, calls


def test_a_call_to_a_function_not_offered_is_text():
    assert both_ways(UNKNOWN) == (UNKNOWN, [])
    assert both_ways("Sure.\n" + UNKNOWN) == ("Sure.\n" + UNKNOWN, [])
    unknown_last = "Two calls.\n" + KNOWN + "\n" + UNKNOWN  # the calls end at the unoffered one
    content, calls = both_ways(unknown_last)
    assert content == "Two calls." and [c.name for c in calls] == ["get_weather"]
    content, calls = both_ways(UNKNOWN + "\n" + KNOWN)  # the first call is not offered: all of it is text
    assert content == UNKNOWN + "\n" + KNOWN and calls == []
    for name in ("time_in_tokyo", "get_weather ", "GET_WEATHER"):  # near misses are not offered either
        text = UNKNOWN.replace("Paris", name, 1)
        assert parse_reply(text, NAMES, HERMES) == (text, [])


def test_a_forced_reply_that_calls_nothing_offered_is_the_models_text_only():
    forced = "<tool_call>\n"  # tool_choice required
    text = forced + UNKNOWN[len(forced):]
    content, calls = both_ways(text, forced=forced)
    assert content == UNKNOWN[len(forced):] and calls == []
    assert parse_reply(forced, NAMES, HERMES, forced=forced) == (None, [])  # nothing of the model's: no content
    named = '<tool_call>\n{"name": "get_time", "arguments": '  # tool_choice names get_time
    content, calls = both_ways(named + 'oops', forced=named, forced_function="get_time")
    assert content == "oops" and calls == []


@pytest.mark.parametrize("value", ["17", "-2.5e3", "true", "null", "[1, 2]", '"17 * 23 + 4"'])
def test_arguments_that_are_not_an_object_are_still_a_call_with_the_models_text(value):
    text = '<tool_call>\n{"name": "get_time", "arguments": ' + value + ', "extra": 1}\n</tool_call>'
    content, calls = both_ways(text)
    assert content is None and [(c.name, c.arguments, c.complete) for c in calls] == [("get_time", value, True)]


def test_a_number_at_the_very_end_may_go_on_so_the_call_is_cut():
    text = '<tool_call>\n{"name": "get_time", "arguments": 17'
    assert [(c.arguments, c.complete) for c in parse_reply(text, NAMES, HERMES)[1]] == [("17", False)]
    assert [(c.arguments, c.complete) for c in parse_reply(text + "}", NAMES, HERMES)[1]] == [("17", True)]


def test_a_forced_call_cut_right_after_its_start_is_a_cut_call(tokenizer):
    forced = '<tool_call>\n{"name": "get_time", "arguments": '
    for written in ("", "{", '{"ci'):
        rb = ReplyBuilder(tokenizer, stops=[], forced_text=forced, tool_names=NAMES, dialect=HERMES,
                          forced_function="get_time")
        rb.push(tokenizer.encode(written, add_special_tokens=False))
        reply = rb.finish()
        assert reply.content is None and not reply.calls_complete
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls] == [("get_time", written)]
        content, streamed = assemble(rb.drain())
        assert content == "" and [c["name"] for c in streamed] == ["get_time"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice_in_the_pythonic_dialect_is_refused(smollm2_tokenizer, choice):
    """Pythonic calls have no grammar: a forced `[get_weather(` start alone could end as text with finish_reason
    stop, which the client that asked for a call takes as done (issue 33). The server says it cannot; auto in
    that dialect, and the same choice in a JSON dialect, are prepared."""
    from helpers import tiny_model

    from oospec.engine.engine import Engine
    from oospec.server.service import ModelService, ServerConfig

    service = ModelService(Engine(tiny_model("qwen2", vocab=len(smollm2_tokenizer)), smollm2_tokenizer),
                           ServerConfig(model_name="tiny", method="toolspec"))
    try:
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [weather, clock], "tool_choice": choice,
                "oospec": {"dialect": "pythonic"}}
        with pytest.raises(APIError) as e:
            service.prepare(parse_chat_request(body))
        assert e.value.status == 400 and e.value.body()["error"]["code"] == "unsupported_tool_choice"
        assert "pythonic" in e.value.body()["error"]["message"] and e.value.body()["error"]["param"] == "tool_choice"
        assert service.prepare(parse_chat_request({**body, "tool_choice": "auto"})).request.constraint is None
        assert service.prepare(parse_chat_request({**body, "oospec": {"dialect": "hermes"}})).request.constraint is not None
    finally:
        service.close()
