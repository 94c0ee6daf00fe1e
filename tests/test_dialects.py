"""The dialect table: each dialect's openers, closer, arguments key and forced start agree with the calls it
renders, and what it renders its own extractor reads back; the one call renderer in a learned style; each
dialect's rendering (checked against the chat templates) and parsing of many calls."""

from __future__ import annotations

import random

import pytest
from helpers import QWEN25_CHAT_TEMPLATE, WEATHER, render_template

from oospec.tools.callscan import CallScanner
from oospec.tools.dialects import (
    ARGS_KEYS,
    CALL_HEADER,
    CALL_TAG,
    CLOSERS,
    DIALECTS,
    ToolCall,
    extract_json_calls,
    get_dialect,
    header_name,
)
from oospec.tools.pythonic import py_literal
from oospec.tools.render import CallRenderer, Style
from oospec.tools.schema import to_openai, tools_from_openai

CALLS = [ToolCall("get_weather", {"city": "Zürich \"old town\"", "days": 2, "opts": {"tags": ["a", "}"]}}),
         ToolCall("math.factorial", {"number": 5}), ToolCall("noop", {})]


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_each_dialect_reads_back_what_it_renders(name):
    dialect = DIALECTS[name]
    for calls in ([CALLS[0]], CALLS):
        text = dialect.render(calls)
        assert dialect.parse(text) == calls, text
        assert text.startswith(dialect.call_prefix)  # what tool_choice "required" forces is how a call starts


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_openers_closers_and_arguments_key_are_those_of_the_rendered_text(name):
    dialect = DIALECTS[name]
    text = dialect.render(CALLS[1])
    if not dialect.openers:  # not a JSON dialect: drafters that follow JSON calls leave it alone
        assert name == "pythonic"
        return
    assert text.startswith(dialect.opener + '{"name": ')
    closer = dialect.closer(dialect.opener)
    assert text.endswith("}" + (closer or ""))
    assert f'"{dialect.args_key}": ' in text and dialect.args_key in ARGS_KEYS
    for opener in dialect.openers:
        assert opener == "" or opener in CLOSERS  # every opener knows its closer
    header = CALL_HEADER.search(text)  # the server's streaming reader follows every JSON dialect's calls
    assert header is not None and header_name(header) == "math.factorial"
    assert (CALL_TAG in text) == dialect.opener.startswith(CALL_TAG)


def test_the_arguments_keys_are_the_tables():
    assert ARGS_KEYS == ("arguments", "parameters")
    assert {d.args_key for d in DIALECTS.values()} == set(ARGS_KEYS)


def test_renderer_in_the_default_style_is_tojson():
    r = CallRenderer(args_key="parameters")
    assert r.call("f", {"a": [1, {"b": None}], "é": "x"}) == (
        '{"name": "f", "parameters": {"a": [1, {"b": null}], "é": "x"}}')
    assert r.call("f", {}) == '{"name": "f", "parameters": {}}'
    assert r.start() + "f" + '"' + r.args_open() == '{"name": "f", "parameters": {'


def test_renderer_writes_a_call_in_the_style_the_scanner_learned():
    text = '{\n  "name": "f",\n  "arguments": {\n    "a": 1,\n    "b": "x"\n  }\n}'
    style = Style()
    CallScanner(style).feed(text)
    assert CallRenderer(style).call("f", {"a": 1, "b": "x"}) == text
    compact = '{"name":"f","arguments":{"a":1,"b":"x"}}'
    style = Style()
    CallScanner(style).feed(compact)
    assert CallRenderer(style).call("f", {"a": 1, "b": "x"}) == compact


def test_sidecar_job_for_a_request_without_a_call_takes_its_dialects_opener_and_key():
    from oospec.training.rows import job_for

    trace = {"id": "t", "messages": [], "tools": [], "dialect": "apibank", "text": "I cannot help.", "call": None}
    job = job_for(trace)  # as the sidecar drafter asks before the target has shown its own opener
    assert (job.opener, job.args_key) == (DIALECTS["apibank"].opener, "parameters") == ("<tool_call>\n", "parameters")
    called = {**trace, "text": '```json\n{"name": "f", "parameters": {}}\n```', "call": {"name": "f", "arguments": {}}}
    assert (job_for(called).opener, job_for(called).args_key) == ("```json\n", "parameters")  # the teacher's own


# --------------------------------------------------------------------------------------------------
# Dialects
# --------------------------------------------------------------------------------------------------

# The tool-call branch of the Llama-3.1 Instruct chat template.
LLAMA31_TOOL_CALL_SNIPPET = """{%- for message in messages %}{%- if 'tool_calls' in message %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{{- '{"name": "' + tool_call.name + '", ' }}
{{- '"parameters": ' }}
{{- tool_call.arguments | tojson }}
{{- "}" }}
{{- "<|eot_id|>" }}
{%- endif %}{%- endfor %}"""


_STRINGS = ["", "plain", "héllo wörld", "日本語のテキスト", "emoji 🙂🚀", 'say "hi"', "it's", "back\\slash",
            "line1\nline2\ttab", "</tool_call>", "{not: json}", "[f(a=1)]", "a, b = 1", "  padded  ", "null",
            "\u0000ctl\u001f", "€100 ≥ 5%"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 5)
    if kind == 0:
        return rng.choice(_STRINGS)
    if kind == 1:
        return rng.choice([0, 1, -7, 42, 10**12, -(2**40)])
    if kind == 2:
        return rng.choice([0.5, -2.25, 1e-07, 3.141592653589793, 1e21, 100.0])
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None if rng.random() < 0.3 else rng.choice(_STRINGS)
    if kind in (5, 6):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}_{rng.choice(['x', 'name', 'arguments', 'ü'])}": _random_value(rng, depth + 1)
            for i in range(rng.randrange(4))}


def _random_calls(seed: int, n: int = 200):
    rng = random.Random(seed)
    names = ["get_weather", "math.factorial", "QueryMeeting", "a", "spotify.play", "calc_2nd_value"]
    out = []
    for _ in range(n):
        calls = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            args = {rng.choice(["city", "n", "name", "arguments", "parameters", "x_y", "tags"]) + str(i):
                    _random_value(rng) for i in range(rng.randrange(5))}
            calls.append(ToolCall(rng.choice(names), args))
        out.append(calls)
    return out


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_round_trip_many_calls(dialect):
    d = get_dialect(dialect)
    for calls in _random_calls(seed=len(dialect)):
        text = d.render(calls)
        assert d.parse(text) == calls, text
        if len(calls) == 1:
            assert d.render(calls[0]) == text


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_parse_is_robust_to_surroundings(dialect):
    d = get_dialect(dialect)
    calls = [ToolCall("get_weather", {"city": "Paris", "days": 3, "opts": {"unit": "celsius", "tags": ["a", "b"]}}),
             ToolCall("math.factorial", {"number": 5})]
    text = d.render(calls)
    wrappers = [
        "Sure! Let me check that for you.\n{}\nHope this helps.",
        "```json\n{}\n```",
        "```\n{}\n```\nDone.",
        "Thought: I need two tools [see below].\n{}",
    ]
    for w in wrappers:
        assert d.parse(w.format(text)) == calls, w
    assert d.parse("I cannot help with that.") == []
    assert d.parse(text[: len(text) // 3]) == []  # a truncated call yields nothing


def test_render_exact_text():
    call = ToolCall("get_weather", {"city": "Zürich", "days": 2, "hourly": False, "coords": [47.3, 8.5]})
    args = '{"city": "Zürich", "days": 2, "hourly": false, "coords": [47.3, 8.5]}'
    assert get_dialect("hermes").render(call) == '<tool_call>\n{"name": "get_weather", "arguments": ' + args + '}\n</tool_call>'
    assert get_dialect("apibank").render([call, ToolCall("f", {})]) == (
        '<tool_call>\n{"name": "get_weather", "parameters": ' + args + '}\n{"name": "f", "parameters": {}}\n</tool_call>')
    assert get_dialect("llama3_json").render(call) == '{"name": "get_weather", "parameters": ' + args + "}"
    assert get_dialect("pythonic").render([call, ToolCall("f", {})]) == (
        '[get_weather(city="Zürich", days=2, hourly=False, coords=[47.3, 8.5]), f()]')


def test_hermes_matches_qwen25_chat_template():
    tools = [to_openai(t) for t in tools_from_openai([WEATHER])]
    messages = [{"role": "user", "content": "Weather in Paris and Zürich?"}]
    for calls in _random_calls(seed=7, n=40) + [[ToolCall("get_weather", {"city": "Paris"}),
                                                  ToolCall("get_weather", {"city": "Zürich", "days": 2})]]:
        prompt = render_template(QWEN25_CHAT_TEMPLATE, messages, tools, add_generation_prompt=True)
        full = render_template(QWEN25_CHAT_TEMPLATE, messages + [
            {"role": "assistant", "content": "", "tool_calls": [c.to_openai() for c in calls]}], tools)
        assert full.startswith(prompt)
        assert full[len(prompt):] == get_dialect("hermes").render(calls) + "<|im_end|>\n"


def test_llama3_json_matches_llama31_chat_template():
    for (call,) in [c for c in _random_calls(seed=11, n=60) if len(c) == 1]:
        out = render_template(LLAMA31_TOOL_CALL_SNIPPET, [{"role": "assistant", "tool_calls": [call.to_openai()]}])
        assert out == ("<|start_header_id|>assistant<|end_header_id|>\n\n" + get_dialect("llama3_json").render(call)
                       + "<|eot_id|>")


@pytest.mark.slow  # pulls Qwen2.5-Coder-0.5B; the fast suite checks the same template text above
def test_hermes_matches_real_qwen_tokenizer():
    from oospec.models.loading import load_tokenizer

    tok = load_tokenizer("qwen2.5-coder-0.5b")
    tools = [to_openai(t) for t in tools_from_openai([WEATHER])]
    messages = [{"role": "user", "content": "Weather?"}]
    calls = [ToolCall("get_weather", {"city": "Paris", "days": 2}), ToolCall("get_weather", {"city": "Zürich"})]
    prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": "",
                                                "tool_calls": [c.to_openai() for c in calls]}],
                                   tools=tools, tokenize=False)
    assert full[len(prompt):].startswith(get_dialect("hermes").render(calls))


def test_json_parsers_accept_variants():
    hermes, apibank = get_dialect("hermes"), get_dialect("apibank")
    # arguments/parameters interchangeable, arguments as a JSON string (OpenAI style)
    assert hermes.parse('<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>') == [ToolCall("f", {"a": 1})]
    assert hermes.parse('{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}') == [ToolCall("f", {"a": [1, 2]})]
    # Python-literal dicts (single quotes, True/None)
    assert apibank.parse("{'name': 'f', 'parameters': {'a': 'x', 'b': True, 'c': None}}") == [
        ToolCall("f", {"a": "x", "b": True, "c": None})]
    # API-Bank answers in the ToolSpec output format: fenced block around a <tool_call> with several lines
    text = '```<tool_call>\n{"name": "A", "parameters": {"x": "1"}}\n{"name": "B", "parameters": {}}\n</tool_call>\n```'
    assert apibank.parse(text) == [ToolCall("A", {"x": "1"}), ToolCall("B", {})]
    # a list of calls, an OpenAI tool_calls envelope, and a message with no arguments key is not a call
    assert extract_json_calls('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": 1}}]') == [
        ToolCall("a", {}), ToolCall("b", {"k": 1})]
    assert extract_json_calls('{"tool_calls": [{"id": "1", "type": "function", "function": '
                              '{"name": "a", "arguments": "{}"}}]}') == [ToolCall("a", {})]
    assert extract_json_calls('{"name": "just a name"}') == []
    # JSON-ish with lowercase constants inside a Python-ish object
    assert extract_json_calls("{'name': 'f', 'arguments': {'ok': true, 'v': null}}") == [
        ToolCall("f", {"ok": True, "v": None})]


def test_pythonic_parser_details():
    p = get_dialect("pythonic")
    assert p.parse('[math.factorial(number=5), geo.dist(a=(1.5, 2), b={"k": [1]})]') == [
        ToolCall("math.factorial", {"number": 5}), ToolCall("geo.dist", {"a": [1.5, 2], "b": {"k": [1]}})]
    assert p.parse("```python\n[f(x='single quotes', y=-3)]\n```") == [ToolCall("f", {"x": "single quotes", "y": -3})]
    # variables and expressions are kept as source text, positional arguments ignored (as BFCL does)
    assert p.parse("[integral(function=lambda x: x**2, a=data['a'])]") == [
        ToolCall("integral", {"function": "lambda x: x ** 2", "a": "data['a']"})]
    assert p.parse("[f(1, b=2)]") == [ToolCall("f", {"b": 2})]
    # a bare call without brackets, inside prose; prose parentheses are not calls
    assert p.parse("I will call get_time(zone=\"UTC\") now (quickly).") == [ToolCall("get_time", {"zone": "UTC"})]
    assert p.parse("[1, 2, 3] is not a call list") == []
    assert p.parse("[]") == []
    assert py_literal({"a": [True, None, 1.5, "x\"y"]}) == '{"a": [True, None, 1.5, "x\\"y"]}'


def test_toolcall_from_dict_shapes():
    assert ToolCall.from_dict({"name": "f", "arguments": {"a": 1}}) == ToolCall("f", {"a": 1})
    assert ToolCall.from_dict({"name": "f", "parameters": {"a": 1}}) == ToolCall("f", {"a": 1})
    assert ToolCall.from_dict({"function": {"name": "f", "arguments": '{"a": 1}'}}) == ToolCall("f", {"a": 1})
    assert ToolCall.from_dict({"f": {"a": 1}}) == ToolCall("f", {"a": 1})  # BFCL ground truth shape
    with pytest.raises(ValueError):
        ToolCall.from_dict({"x": 1, "y": 2})
    with pytest.raises(ValueError, match="unknown tool-call dialect"):
        get_dialect("xml")
