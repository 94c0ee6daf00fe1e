"""The dialect table: each dialect's openers, closer, arguments key and forced start agree with the calls it
renders, and what it renders its own extractor reads back; the one call renderer in a learned style."""

from __future__ import annotations

import pytest

from oospec.tools.callscan import CallScanner
from oospec.tools.dialects import ARGS_KEYS, CALL_HEADER, CALL_TAG, CLOSERS, DIALECTS, ToolCall, header_name
from oospec.tools.render import CallRenderer, Style

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
