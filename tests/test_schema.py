"""Tool/Param and JSON Schema: tools read from OpenAI and BFCL specs, written back as OpenAI tools, and calls
validated against them."""

from __future__ import annotations

import json

import pytest
from helpers import DATA, WEATHER

from oospec.errors import SchemaError
from oospec.tools.dialects import ToolCall, validate
from oospec.tools.schema import (
    Param,
    Tool,
    normalize_type,
    to_openai,
    tool_from_openai,
    tools_from_openai,
)

# --------------------------------------------------------------------------------------------------
# Schema: OpenAI / JSON Schema / BFCL
# --------------------------------------------------------------------------------------------------


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
    assert counts == {"BFCL_v4_irrelevance": 240, "BFCL_v4_multiple": 557, "BFCL_v4_parallel": 200,
                      "BFCL_v4_parallel_multiple": 520, "BFCL_v4_simple_java": 100,
                      "BFCL_v4_simple_javascript": 50, "BFCL_v4_simple_python": 400}


def test_a_blank_type_is_inferred_like_a_missing_one():
    # BFCL simple_javascript_23 ships `"type": ""` for a nested property; one blank field must not lose the tool.
    def tool(issuer):
        return {"name": "t", "parameters": {"type": "object", "properties": {
            "options": {"type": "dict", "properties": {"issuer": issuer, "role": {"type": "string"}}}}}}
    blank, missing = (tools_from_openai([tool(s)])[0] for s in ({"type": " "}, {"description": "d"}))
    assert blank.parameters[0].properties[0].type == missing.parameters[0].properties[0].type == "any"
    with pytest.raises(SchemaError, match="unknown|not"):
        tools_from_openai([tool({"type": "strnig"})])


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
