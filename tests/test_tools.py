"""Tool schemas from every source, the tool-call dialects (render -> parse) and call validation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from oospec.datasets import tools_from_apibank_prompt, tools_from_toolalpaca
from oospec.errors import SchemaError
from oospec.tools.dialects import (
    DIALECTS,
    ToolCall,
    extract_json_calls,
    get_dialect,
    validate,
)
from oospec.tools.pythonic import py_literal
from oospec.tools.schema import (
    Param,
    Tool,
    normalize_type,
    to_openai,
    tool_from_openai,
    tools_from_openai,
)

DATA = Path(__file__).resolve().parents[1] / "oospec" / "data"

# Qwen2.5 / Qwen2.5-Coder chat template (tokenizer_config.json), used to check the hermes dialect byte for byte.
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

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


def render_template(template: str, messages, tools=None, add_generation_prompt=False) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt)
    return rendered[0]


# --------------------------------------------------------------------------------------------------
# Schema: OpenAI / JSON Schema / BFCL
# --------------------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer"},
                "hourly": {"type": "boolean"},
                "coords": {"type": "array", "items": {"type": "number"}},
                "filters": {"type": "object", "properties": {"min": {"type": "number"}, "tags": {
                    "type": "array", "items": {"type": "string"}}}, "required": ["min"]},
                "note": {"type": ["string", "null"]},
            },
            "required": ["city"],
        },
    },
}


def test_openai_wrapped_and_bare_agree():
    wrapped = tools_from_openai([WEATHER])
    bare = tools_from_openai([WEATHER["function"]])
    assert wrapped == bare
    t = wrapped[0]
    assert t.name == "get_weather" and t.description == "Weather for a city."
    assert t.param_names == ("city", "unit", "days", "hourly", "coords", "filters", "note")  # order kept
    assert t.required == ("city",)
    assert [p.type for p in t.parameters] == ["string", "string", "integer", "boolean", "array", "object", "string"]
    assert t.param("unit").enum == ("celsius", "fahrenheit") and t.param("unit").default == "celsius"
    assert not t.param("city").has_default
    assert t.param("coords").items == Param("", "number")
    f = t.param("filters")
    assert [p.name for p in f.properties] == ["min", "tags"] and f.required == ("min",)
    assert f.property("tags").items.type == "string"
    assert t.param("note").nullable
    assert tools_from_openai(WEATHER) == wrapped  # a single dict is accepted too


def test_to_openai_round_trips_and_is_standard_json_schema():
    t = tools_from_openai([WEATHER])[0]
    spec = to_openai(t)
    assert spec["type"] == "function" and spec["function"]["parameters"]["type"] == "object"
    assert list(spec["function"]["parameters"]["properties"]) == list(t.param_names)
    assert spec["function"]["parameters"]["properties"]["note"]["type"] == ["string", "null"]
    assert tools_from_openai([spec])[0] == t
    json.dumps(spec)  # serialisable


def test_bfcl_type_names_are_mapped():
    spec = {"name": "math.hypot", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "pt": {"type": "tuple", "items": {"type": "float"}}, "anything": {"type": "any"},
        "conf": {"type": "dict", "properties": {"a": {"type": "integer"}}},
        "pop": {"type": "dict", "required": ["adults"], "description": "free-form"},
        "flag": {"type": "boolean", "optional": True, "default": True}}, "required": ["x"]}}
    t = tool_from_openai(spec)
    assert [p.type for p in t.parameters] == ["number", "array", "any", "object", "object", "boolean"]
    assert t.param("pt").items.type == "number"
    assert t.param("pop").required == ("adults",) and t.param("pop").properties == ()
    out = to_openai(t)["function"]["parameters"]["properties"]
    assert out["x"]["type"] == "number" and out["pt"]["type"] == "array" and out["conf"]["type"] == "object"
    assert "type" not in out["anything"]  # JSON Schema's "any"
    assert out["flag"]["optional"] is True  # unknown keys are carried through


@pytest.mark.parametrize("raw,expected", [
    ("str", ("string", None)), ("int", ("integer", None)), ("float", ("number", None)), ("bool", ("boolean", None)),
    ("list", ("array", None)), ("list(str)", ("array", "string")), ("Array[string]", ("array", "string")),
    ("Array of Integers", ("array", "integer")), ("dict", ("object", None)), ("tuple", ("array", None)),
    ("any", ("any", None)), ("HashMap", ("object", None)), ("double", ("number", None)),
])
def test_normalize_type(raw, expected):
    assert normalize_type(raw) == expected


@pytest.mark.parametrize("spec,needle", [
    ({"description": "no name"}, "no name"),
    ({"name": "f", "parameters": "oops"}, "'f'"),
    ({"name": "f", "parameters": {"type": "array"}}, "type 'object'"),
    ({"name": "f", "parameters": {"type": "object", "properties": []}}, "properties must be an object"),
    ({"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strang"}}}}, "unknown type 'strang'"),
    ({"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}},
     "['b']"),
    ({"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"}},
     "'required' must be a list"),
    ({"name": "f", "parameters": {"type": "object", "properties": {"a": "string"}}}, "schema must be an object"),
    ({"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "items": {}}}}},
     "'items' given"),
    ({"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "integer"}}, "required": ["c"]}}}}, "not among properties"),
    ({"name": "f", "description": 3}, "description must be a string"),
    ({"name": "", "parameters": {}}, "no name"),
])
def test_malformed_openai_schemas_raise(spec, needle):
    with pytest.raises(SchemaError) as e:
        tools_from_openai([spec])
    assert needle in str(e.value)
    if spec.get("name"):
        assert repr(spec["name"]) in str(e.value)  # the message names the tool


def test_duplicate_tools_and_params_raise():
    with pytest.raises(SchemaError, match="'f' is defined twice"):
        tools_from_openai([{"name": "f"}, {"name": "f"}])
    with pytest.raises(SchemaError, match="duplicate parameter"):
        Tool("g", parameters=(Param("a"), Param("a")))
    with pytest.raises(SchemaError, match="not one of"):
        Param("a", "str")
    with pytest.raises(SchemaError, match="tools must be a list"):
        tools_from_openai('[{"name": "f"}]')
    with pytest.raises(SchemaError, match="must be an object"):
        tools_from_openai([["f"]])


def test_tools_are_hashable_values():
    a, b = tools_from_openai([WEATHER])[0], tools_from_openai([WEATHER])[0]
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


def test_all_bfcl_functions_parse():
    counts = {}
    for f in sorted((DATA / "bfcl").glob("BFCL_v4_*.json")):
        n = 0
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            tools = tools_from_openai(rec["function"])
            assert [t.name for t in tools] == [fn["name"] for fn in rec["function"]]
            for t, fn in zip(tools, rec["function"], strict=True):
                assert list(t.param_names) == list(fn["parameters"]["properties"])
                assert tools_from_openai([to_openai(t)])[0] == t
            n += len(tools)
        counts[f.stem] = n
    assert counts == {"BFCL_v4_multiple": 557, "BFCL_v4_parallel": 200, "BFCL_v4_parallel_multiple": 520,
                      "BFCL_v4_simple_python": 400}


# --------------------------------------------------------------------------------------------------
# Schema: API-Bank prose
# --------------------------------------------------------------------------------------------------


def _apibank(level):
    return json.loads((DATA / "apibank" / f"level-{level}-api_processed.json").read_text())


def test_apibank_named_layout():
    tools = tools_from_apibank_prompt(_apibank(1)[0]["system"])
    assert [t.name for t in tools] == ["QueryHealthData", "CancelRegistration", "ModifyRegistration"]
    q = tools[0]
    assert q.param_names == ("user_id", "start_time", "end_time") and q.required == q.param_names
    assert q.description.startswith("This API queries the recorded health data")
    assert q.param("start_time").description == "The start time of the time span. Format: %Y-%m-%d %H:%M:%S"


def test_apibank_inline_layout_level3():
    tools = tools_from_apibank_prompt(_apibank(3)[0]["system"])
    assert [(t.name, t.param_names) for t in tools] == [("QueryMeeting", ("user_name",))]
    assert tools[0].description == "The API for retrieving the meeting details from the user's calendar."


def test_apibank_types_and_optional():
    all_tools = {}
    for level in (1, 2, 3):
        for rec in _apibank(level):
            for t in tools_from_apibank_prompt(rec["system"]):
                all_tools[t.name] = t
    assert all_tools["AddMeeting"].param("attendees").type == "array"
    assert all_tools["AddMeeting"].param("attendees").items.type == "string"  # 'list(str)'
    assert all_tools["RecordHealthData"].param("health_data").type == "array"  # 'list'
    assert all_tools["BookHotel"].param("room_count").type == "integer"
    assert all_tools["TimedSwitch"].param("on").type == "boolean"
    assert all_tools["Translate"].required == ("src",)  # '[Optional] ...' parameters are not required
    assert len(all_tools) >= 40


def test_apibank_every_prompt_parses():
    n_tools = {}
    for level in (1, 2, 3):
        recs = _apibank(level)
        n_tools[level] = sum(len(tools_from_apibank_prompt(r["system"])) for r in recs)
        assert all(tools_from_apibank_prompt(r["system"]) for r in recs)
    assert n_tools == {1: 872, 2: 109, 3: 226}


def test_apibank_malformed():
    with pytest.raises(SchemaError, match="'Broken'"):
        tools_from_apibank_prompt("1. Name: Broken\nDescription: x\nParameters: {'a': {'type': 'str'")
    with pytest.raises(SchemaError, match="'Weird'.*unknown type"):
        tools_from_apibank_prompt("1. Name: Weird\nDescription: x\nParameters: {'a': {'type': 'blob'}}")
    assert tools_from_apibank_prompt("no tools here") == []


# --------------------------------------------------------------------------------------------------
# Schema: ToolAlpaca
# --------------------------------------------------------------------------------------------------


def _toolalpaca():
    return json.loads((DATA / "toolalpaca" / "eval_simulated.json").read_text())


def test_toolalpaca_openapi():
    apis = _toolalpaca()
    per_api = {a["Name"]: tools_from_toolalpaca(a) for a in apis}
    assert sum(len(v) for v in per_api.values()) == 54
    for api in apis:
        assert [t.name for t in per_api[api["Name"]]] == list(api["Function_Projection"])
    axo = {t.name: t for t in per_api["Axolotl"]}
    assert axo["searchAxolotlImages"].param_names == ("color", "gender", "size", "page")
    assert axo["searchAxolotlImages"].param("color").enum == ("wild", "leucistic", "albino")
    assert axo["searchAxolotlImages"].param("page").type == "integer"
    assert axo["getRandomAxolotlImage"].parameters == ()
    sup = {t.name: t for t in per_api["Apache Superset"]}  # request bodies behind $ref
    assert sup["managePermissions"].param_names == ("targetId", "targetType", "permissions", "users")
    assert sup["managePermissions"].param("permissions").items.type == "string"
    assert sup["createDashboard"].required == ("dashboardName",)  # from the "Required." prose
    ame = {t.name: t for t in per_api["Améthyste"]}  # query and body both list userId: kept once
    assert ame["generateAvatar"].param_names == ("userId", "style", "format")
    ani = {t.name: t for t in per_api["AniAPI"]}
    assert ani["getAnimeDetails"].required == ("animeId",)  # path parameter
    assert ani["synchronizeTracking"].param_names == ("animeId", "trackingService", "progress")


def test_toolalpaca_prose_fallback_matches_openapi():
    for api in _toolalpaca():
        from_openapi = tools_from_toolalpaca(api)
        from_prose = tools_from_toolalpaca({k: v for k, v in api.items() if k != "Documentation"})
        assert [t.name for t in from_prose] == [t.name for t in from_openapi]
        for a, b in zip(from_openapi, from_prose, strict=True):
            if a.name == "configureAlerts":  # the OpenAPI body lacks the prose's alertId
                assert b.param_names == ("alertId", *a.param_names)
                continue
            assert a.param_names == b.param_names, a.name
            assert [p.type for p in a.parameters] == [p.type for p in b.parameters], a.name


def test_toolalpaca_accepts_openapi_document_and_rejects_junk():
    doc = json.loads(_toolalpaca()[0]["Documentation"])
    assert [t.name for t in tools_from_toolalpaca(doc)] == ["getRandomAxolotlImage", "searchAxolotlImages",
                                                            "getAxolotlFacts"]
    with pytest.raises(SchemaError, match="neither an OpenAPI"):
        tools_from_toolalpaca({"Name": "Empty"})
    with pytest.raises(SchemaError, match="unresolvable \\$ref"):
        tools_from_toolalpaca({"paths": {"/x": {"post": {"operationId": "x", "requestBody": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Nope"}}}}}}}})


# --------------------------------------------------------------------------------------------------
# Dialects
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def test_validate_reports_problems():
    tools = tools_from_openai([WEATHER])
    ok = ToolCall("get_weather", {"city": "Paris", "unit": "celsius", "days": 3, "coords": [1, 2.5],
                                  "filters": {"min": 1, "tags": ["x"]}, "note": None})
    assert validate(ok, tools) == []
    assert validate(ToolCall("nope", {}), tools) == ["unknown function 'nope' (available: get_weather)"]
    probs = validate(ToolCall("get_weather", {"town": "Paris"}), tools)
    assert any("unknown argument 'town'" in p for p in probs)
    assert any("missing required argument 'city'" in p for p in probs)

    def one(**args):
        return validate(ToolCall("get_weather", {"city": "x", **args}), tools)

    assert "expected integer, got string" in one(days="3")[0]
    assert "expected integer, got boolean" in one(days=True)[0]
    assert "expected integer, got number" in one(days=3.5)[0]
    assert "expected boolean" in one(hourly=1)[0]
    assert "is not one of ['celsius', 'fahrenheit']" in one(unit="kelvin")[0]
    assert "coords[1]: expected number, got string" in one(coords=[1, "2"])[0]
    assert "expected array" in one(coords="1,2")[0]
    assert "missing required key 'min'" in one(filters={"tags": []})[0]
    assert "unknown key 'max'" in one(filters={"min": 1, "max": 2})[0]
    assert "filters.tags[0]: expected string" in one(filters={"min": 1, "tags": [1]})[0]
    assert "expected string, got null" in one(unit=None)[0]
    assert one(note=None) == []  # nullable


def test_validate_coerce_strings():
    tools = tools_from_openai([WEATHER])
    call = ToolCall("get_weather", {"city": "x", "days": "3", "hourly": "True", "coords": "[1, 2.5]",
                                    "filters": "{'min': 0.5}"})
    assert len(validate(call, tools)) == 4
    assert validate(call, tools, coerce_strings=True) == []
    assert validate(ToolCall("get_weather", {"city": "x", "days": "three"}), tools, coerce_strings=True)


def test_validate_accepts_tool_mapping():
    tools = {t.name: t for t in tools_from_openai([WEATHER])}
    assert validate(ToolCall("get_weather", {"city": "x"}), tools) == []
