"""Tool schemas read from the datasets' own formats: API-Bank's prose and ToolAlpaca's OpenAPI documents."""

from __future__ import annotations

import json

import pytest
from helpers import DATA

from oospec.datasets import tools_from_apibank_prompt, tools_from_toolalpaca
from oospec.errors import SchemaError

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
