"""Benchmark loaders: every item loads, prompts render through a chat template, gold calls validate, and
call_accuracy accepts the gold and rejects perturbed gold."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path

import pytest
from helpers import DATA, QWEN25_CHAT_TEMPLATE, render_template

from oospec.datasets import (
    BFCL_SPLITS,
    DatasetError,
    Sample,
    bfcl_check,
    call_accuracy,
    data_path,
    is_placeholder,
    load_apibank,
    load_bfcl,
    load_dataset,
    load_path,
    load_toolalpaca,
    normalize_value,
    parse_toolalpaca_input,
)
from oospec.tools.dialects import ToolCall, validate

COUNTS = {
    ("apibank", "1"): 399, ("apibank", "2"): 67, ("apibank", "3"): 131,
    ("bfcl", "simple_python"): 400, ("bfcl", "multiple"): 200, ("bfcl", "parallel"): 200,
    ("bfcl", "parallel_multiple"): 200, ("toolalpaca", None): 100,
}


@pytest.fixture(scope="module")
def everything() -> dict[tuple[str, str | None], list[Sample]]:
    return {key: load_dataset(*key) for key in COUNTS}


def test_counts(everything):
    assert {k: len(v) for k, v in everything.items()} == COUNTS
    assert len(load_apibank("all")) == 597 and len(load_bfcl("all")) == 1000
    assert len(load_dataset("bfcl")) == 1000 and len(load_dataset("apibank")) == 597


def test_ids_unique_and_fields(everything):
    ids = [s.id for ss in everything.values() for s in ss]
    assert len(ids) == len(set(ids))
    for (name, _), samples in everything.items():
        for s in samples:
            assert s.dataset == name and s.tools and s.gold
            assert s.dialect in ("apibank", "hermes")


def test_messages_are_valid_chat(everything):
    for samples in everything.values():
        for s in samples:
            assert isinstance(s.messages, list) and s.messages
            for m in s.messages:
                assert set(m) == {"role", "content"}, m
                assert m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str)
            assert s.messages[-1]["role"] == "user"


def test_prompts_render_through_qwen_template(everything):
    for samples in everything.values():
        for s in samples:
            text = render_template(QWEN25_CHAT_TEMPLATE, s.messages, s.chat_tools(), add_generation_prompt=True)
            assert text.endswith("<|im_start|>assistant\n")
            assert s.messages[-1]["content"] in text
            for t in s.tools:
                assert t.name in text  # in the template's <tools> block or in the prose system prompt
            assert ("<tools>" in text) == (s.dataset != "apibank")


def test_prompt_text_with_a_real_tokenizer_object():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tok.chat_template = QWEN25_CHAT_TEMPLATE
    for s in (load_apibank(1)[0], load_bfcl("multiple")[0], load_toolalpaca()[0]):
        text = s.prompt_text(tok)
        assert text == render_template(QWEN25_CHAT_TEMPLATE, s.messages, s.chat_tools(), add_generation_prompt=True)


def test_apibank_mirrors_toolspec_prompt():
    raw = json.loads((DATA / "apibank" / "level-2-api_processed.json").read_text())
    s = load_apibank(2)[5]
    assert s.messages == [{"role": "system", "content": raw[5]["system"]}, {"role": "user", "content": raw[5]["user"]}]
    assert s.chat_tools() is None and s.meta["tools_in_prompt"]
    assert s.gold == [ToolCall.from_dict(raw[5]["answer"])]  # level 2 stores one dict, not a list
    # The gold, rendered, looks like earlier calls in API-Bank dialogue histories.
    text = s.gold_text()
    assert text.startswith('<tool_call>\n{"name": "') and text.endswith("}\n</tool_call>")


def test_bfcl_sample_shape():
    s = load_bfcl("parallel_multiple")[0]
    assert s.id == "parallel_multiple_0" and s.meta["category"] == "parallel_multiple"
    assert [t.name for t in s.tools] == ["math_toolkit.sum_of_multiples", "math_toolkit.product_of_primes"]
    assert s.chat_tools()[0]["function"]["parameters"]["type"] == "object"
    assert s.gold == [ToolCall("math_toolkit.sum_of_multiples", {"lower_limit": 1, "upper_limit": 1000,
                                                                 "multiples": [3, 5]}),
                      ToolCall("math_toolkit.product_of_primes", {"count": 5})]
    py = load_bfcl("parallel_multiple", dialect="pythonic")[0]
    assert py.chat_tools() is None and py.messages[0]["role"] == "system"
    assert "[func_name1(params_name1=params_value1" in py.messages[0]["content"]
    assert "math_toolkit.sum_of_multiples" in py.messages[0]["content"]
    assert py.gold_text() == ("[math_toolkit.sum_of_multiples(lower_limit=1, upper_limit=1000, multiples=[3, 5]), "
                              "math_toolkit.product_of_primes(count=5)]")


def test_toolalpaca_sample_shape():
    samples = load_toolalpaca()
    s = samples[12]
    assert s.meta["api"] == "AniAPI" and s.messages[1]["content"].startswith('I want to watch "Your Lie in April."')
    assert s.gold == [ToolCall("searchAnime", {"query": "Your Lie in April."}),
                      ToolCall("getStreamingServices", {"animeId": "${animeId from searchAnime}"})]
    assert s.meta["placeholders"] == [(1, "animeId")]
    assert "getDetails" in [t.name for t in s.tools]
    assert sum(len(x.gold) for x in samples) == 154
    assert sum(1 for x in samples if x.meta["optional_steps"]) == 1


def test_toolalpaca_action_input_placeholders():
    assert parse_toolalpaca_input('{"animeId": ${animeId from searchAnime}}') == {"animeId": "${animeId from searchAnime}"}
    assert parse_toolalpaca_input('{"a": ${start date of a month}", "b": 1}') == {"a": "${start date of a month}", "b": 1}
    assert parse_toolalpaca_input('{"u": ${userId from auth, "t": ${tok from auth}}') == {
        "u": "${userId from auth}", "t": "${tok from auth}"}
    assert parse_toolalpaca_input('{"p": [${some permission}], "pw": "Pa$$w0rd"}') == {
        "p": ["${some permission}"], "pw": "Pa$$w0rd"}
    assert is_placeholder("{start date}") and is_placeholder("${x}") and not is_placeholder("Pa$$w0rd")
    with pytest.raises(DatasetError):
        parse_toolalpaca_input("{not json at all")


# --------------------------------------------------------------------------------------------------
# Gold calls against the samples' own tools
# --------------------------------------------------------------------------------------------------


def _validity(samples: list[Sample]) -> tuple[int, int]:
    total = bad = 0
    for s in samples:
        placeholders = set(s.meta.get("placeholders", ()))
        for i, call in enumerate(s.gold):
            total += 1
            problems = validate(call, s.tools, coerce_strings=s.dataset == "apibank")
            problems = [p for p in problems if not any(p.startswith(f"{call.name}.{k}") for (j, k) in placeholders
                                                       if j == i)]
            bad += bool(problems)
    return total - bad, total


def test_gold_calls_validate(everything, capsys):
    rates = {}
    for key, samples in everything.items():
        ok, total = _validity(samples)
        rates[key] = (ok, total)
    with capsys.disabled():
        print("\ngold-call validity against the sample's tools:")
        for (name, split), (ok, total) in rates.items():
            print(f"  {name:10s} {split or '':18s} {ok}/{total} = {ok / total:.1%}")
    # API-Bank: gold names unknown tools (6 in level 2), uses device_id for TimedSwitch's name (8), omits
    # ForgotPassword/BookHotel arguments (13); see the data notes in the report.
    assert rates[("apibank", "1")] == (378, 399)
    assert rates[("apibank", "2")] == (61, 67)
    assert rates[("apibank", "3")] == (131, 131)
    assert rates[("bfcl", "simple_python")] == (400, 400)
    assert rates[("bfcl", "multiple")] == (200, 200)
    assert rates[("bfcl", "parallel")] == (540, 540)
    assert rates[("bfcl", "parallel_multiple")] == (605, 607)  # a variable ("data['sales']"), a mistyped list
    assert rates[("toolalpaca", None)] == (149, 154)
    ok = sum(v[0] for v in rates.values())
    total = sum(v[1] for v in rates.values())
    assert ok / total > 0.97


def test_gold_round_trips_through_its_dialect(everything):
    for samples in everything.values():
        for s in samples:
            assert s.parse(s.gold_text()) == s.gold, s.id
    for s in load_bfcl("all", dialect="pythonic"):
        assert s.parse(s.gold_text()) == s.gold, s.id


# --------------------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------------------


def test_gold_is_accurate_everywhere(everything):
    for samples in everything.values():
        for s in samples:
            assert call_accuracy(s, s.gold), s.id
            assert call_accuracy(s, s.gold_text()), s.id  # raw model text is parsed with the sample's dialect


def _perturbations(call: ToolCall):
    yield ToolCall(call.name + "_x", call.arguments)
    if call.arguments:
        k = next(iter(call.arguments))
        yield ToolCall(call.name, {kk: v for kk, v in call.arguments.items() if kk != k})
        v = call.arguments[k]
        changed = (not v) if isinstance(v, bool) else v + 1 if isinstance(v, int | float) else \
            (str(v) + " zz") if isinstance(v, str) else [*v, "zz"] if isinstance(v, list) else {**v, "zz": 1}
        yield ToolCall(call.name, {**call.arguments, k: changed})
    yield ToolCall(call.name, {**call.arguments, "unexpected_arg": 1})


def test_perturbed_gold_is_rejected(everything):
    checked = rejected = 0
    for samples in everything.values():
        for s in samples:
            for i, call in enumerate(s.gold):
                for bad in _perturbations(call):
                    pred = copy.deepcopy(s.gold)
                    pred[i] = bad
                    checked += 1
                    rejected += not call_accuracy(s, pred)
            assert not call_accuracy(s, [])
            assert not call_accuracy(s, s.gold + [s.gold[0]]) or s.dataset == "toolalpaca"
    # Not every perturbation must fail: a value whose options allow anything (a ToolAlpaca placeholder, an
    # optional "" in BFCL) or a later ToolAlpaca step past the predicted prefix is legitimately accepted.
    assert rejected / checked > 0.97, (rejected, checked)


def test_bfcl_accepts_any_listed_answer_and_normalises():
    s = next(x for x in load_bfcl("simple_python") if x.id == "simple_python_0")
    # ground truth: base [10], height [5], unit ["units", ""]
    assert call_accuracy(s, [ToolCall("calculate_triangle_area", {"base": 10, "height": 5})])
    assert call_accuracy(s, [ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})])
    assert call_accuracy(s, [ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": ""})])
    assert not call_accuracy(s, [ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "cm"})])
    assert not call_accuracy(s, [ToolCall("calculate_triangle_area", {"base": 10.0, "height": 5})])  # int expected
    assert not call_accuracy(s, [ToolCall("calculate_triangle_area", {"base": 10})])  # required height
    # float parameters accept ints; strings ignore case, spaces and punctuation
    pm = next(x for x in load_bfcl("parallel_multiple") if x.id == "parallel_multiple_1")
    calls = [ToolCall("area_rectangle.calculate", {"length": 7, "breadth": 3}),
             ToolCall("area_circle.calculate", {"radius": 5})]
    assert call_accuracy(pm, calls) and call_accuracy(pm, calls[::-1])  # parallel: any order
    assert not call_accuracy(pm, calls[:1])
    alt = next(x for x in load_bfcl("parallel_multiple") if x.id == "parallel_multiple_4")
    # function: ["x**2", "lambda x : x**2"] -> the second option, differently spaced, also passes
    pred = copy.deepcopy(alt.gold)
    pred[0].arguments["function"] = "lambda x: x**2"
    assert call_accuracy(alt, pred)
    # multiple: the right function among several
    m = load_bfcl("multiple")[0]
    other = next(t.name for t in m.tools if t.name != m.gold[0].name)
    assert not call_accuracy(m, [ToolCall(other, m.gold[0].arguments)])


def test_bfcl_dict_and_list_checks():
    functions = [{"name": "f", "parameters": {"type": "dict", "properties": {
        "cond": {"type": "dict", "properties": {"dept": {"type": "string"}, "school": {"type": "string"}}},
        "items": {"type": "array", "items": {"type": "string"}}}, "required": ["cond"]}}]
    pa = [{"f": {"cond": [{"dept": ["Science"], "school": ["Bluebird High School", "Bluebird HS", ""]}],
                 "items": [["a", "b"], ["b", "a"], ""]}}]
    assert bfcl_check(functions, pa, [ToolCall("f", {"cond": {"dept": "science"}})], "simple")
    assert bfcl_check(functions, pa, [ToolCall("f", {"cond": {"dept": "Science", "school": "bluebird hs"},
                                                     "items": ["B", "a"]})], "simple")
    assert not bfcl_check(functions, pa, [ToolCall("f", {"cond": {"dept": "Art"}})], "simple")
    assert not bfcl_check(functions, pa, [ToolCall("f", {"cond": {"dept": "Science", "x": 1}})], "simple")
    assert not bfcl_check(functions, pa, [ToolCall("f", {"cond": {"dept": "Science"}, "items": ["a"]})], "simple")


def test_apibank_accuracy_normalises_types():
    s = next(x for x in load_apibank(1) if x.gold[0].name == "QueryMeeting" and "attendees" in x.gold[0].arguments)
    typed = copy.deepcopy(s.gold)
    typed[0].arguments["attendees"] = json.loads(typed[0].arguments["attendees"].replace("'", '"'))
    assert isinstance(typed[0].arguments["attendees"], list)
    assert call_accuracy(s, typed)  # a real list matches the gold's "['John Smith', 'Jane Doe']"
    s2 = next(x for x in load_apibank(2) if x.gold[0].name == "BookHotel")
    typed = copy.deepcopy(s2.gold)
    typed[0].arguments["room_count"] = int(typed[0].arguments["room_count"])
    assert call_accuracy(s2, typed)  # 1 == "1"
    typed[0].arguments["room_count"] += 1
    assert not call_accuracy(s2, typed)
    assert normalize_value("1") == normalize_value(1.0) != normalize_value(True)
    assert normalize_value(" x ") == "x" and normalize_value("X", casefold=True) == "x"


def test_toolalpaca_accuracy_prefix_and_placeholders():
    s = load_toolalpaca()[12]  # searchAnime -> getStreamingServices(animeId=${animeId from searchAnime})
    first, second = s.gold
    assert call_accuracy(s, [first])  # a correct first step is right for a single turn
    assert call_accuracy(s, [first, ToolCall(second.name, {"animeId": 1234})])  # placeholder: any value
    assert not call_accuracy(s, [first, ToolCall(second.name, {})])
    assert not call_accuracy(s, [second])  # must start at the beginning
    assert call_accuracy(s, [ToolCall("searchAnime", {"query": "your lie in april."})])  # case-insensitive
    axo = load_toolalpaca()[1]  # golden input has "gender": "" -> omitted or empty both match
    assert "gender" not in axo.gold[0].arguments
    assert call_accuracy(axo, [ToolCall(axo.gold[0].name, {**axo.gold[0].arguments, "gender": ""})])
    opt = next(x for x in load_toolalpaca() if x.meta["optional_steps"])
    steps = [c for i, c in enumerate(opt.gold) if i not in opt.meta["optional_steps"]]
    assert call_accuracy(opt, steps) and call_accuracy(opt, opt.gold)


# --------------------------------------------------------------------------------------------------
# Files and names
# --------------------------------------------------------------------------------------------------


def _same(a: list[Sample], b: list[Sample]) -> bool:
    return [(x.messages, x.tools, x.gold, x.dialect) for x in a] == [(x.messages, x.tools, x.gold, x.dialect) for x in b]


def test_load_path_reads_every_format(tmp_path):
    for level in (1, 2, 3):
        name = f"level-{level}-api_processed.json"
        shutil.copy(DATA / "apibank" / name, tmp_path / name)
        assert _same(load_path(tmp_path / name), load_apibank(level))
    (tmp_path / "possible_answer").mkdir()
    for split in BFCL_SPLITS:
        name = f"BFCL_v4_{split}.json"
        shutil.copy(DATA / "bfcl" / name, tmp_path / name)
        shutil.copy(DATA / "bfcl" / "possible_answer" / name, tmp_path / "possible_answer" / name)
        got = load_path(tmp_path / name)
        assert _same(got, load_bfcl(split)) and all("possible_answer" in s.meta for s in got)
    shutil.copy(DATA / "toolalpaca" / "eval_simulated.json", tmp_path / "ta.json")
    assert _same(load_path(tmp_path / "ta.json"), load_toolalpaca())
    # gzip, and a gzipped twin found from the plain name
    gz = tmp_path / "ta2.json.gz"
    gz.write_bytes(gzip.compress((DATA / "toolalpaca" / "eval_simulated.json").read_bytes()))
    assert _same(load_path(gz), load_toolalpaca())
    assert _same(load_path(tmp_path / "ta2.json"), load_toolalpaca())


def test_load_path_generic_jsonl(tmp_path):
    recs = [{"id": "g1", "messages": [{"role": "user", "content": "weather in Paris?"}],
             "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                 "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
             "gold": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
            {"messages": [{"role": "user", "content": "hi"}], "tools": []}]
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in recs))
    a, b = load_path(f)
    assert a.id == "g1" and a.gold == [ToolCall("get_weather", {"city": "Paris"})] and a.dialect == "hermes"
    assert call_accuracy(a, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert b.gold is None and b.chat_tools() is None and b.id == "mine-1"
    assert load_dataset(str(f), limit=1)[0].id == "g1"


def test_load_errors(tmp_path):
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("nope")
    with pytest.raises(DatasetError, match="level"):
        load_apibank(4)
    with pytest.raises(DatasetError, match="split"):
        load_bfcl("live_simple")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"foo": 1}]))
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_path(bad)
    bad.write_text(json.dumps([{"system": "1. Name: X\nDescription: d\nParameters: {'a': {'type': 'blob'}}",
                                "user": "u"}]))
    with pytest.raises(DatasetError, match="item 0.*'X'.*unknown type"):
        load_path(bad)
    with pytest.raises(DatasetError, match="not found"):
        load_path(tmp_path / "missing.json")


def test_load_dataset_names_and_limits():
    assert len(load_dataset("bfcl:parallel")) == 200
    assert len(load_dataset("api-bank", 3)) == 131
    assert len(load_dataset("bfcl", "simple", limit=5)) == 5
    assert [s.id for s in load_dataset("toolalpaca", limit=2)] == ["toolalpaca-0-0", "toolalpaca-0-1"]


def test_data_is_packaged():
    root = Path(str(data_path("bfcl", "BFCL_v4_parallel.json"))).resolve()
    assert root.is_file() and root.is_relative_to(Path(__file__).resolve().parents[1] / "oospec" / "data")
    readme = (DATA / "README.md").read_text()
    for needle in ("hemingkx/ToolSpec", "bfcl-eval==2026.3.23", "tangqiaoyu/ToolAlpaca", "Apache", "MIT"):
        assert needle in readme
    assert (DATA / "LICENSES" / "Apache-2.0.txt").is_file() and (DATA / "LICENSES" / "MIT.txt").is_file()
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total < 20 * 2**20


# --------------------------------------------------------------------------------------------------
# Malformed records: skipped with a one-line warning and counted, the rest of the file loads
# --------------------------------------------------------------------------------------------------


def _skip_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "oospec.datasets" and r.levelname == "WARNING"]


def test_toolalpaca_unresolvable_ref_skips_that_api(tmp_path, caplog):
    apis = json.loads((DATA / "toolalpaca" / "eval_simulated.json").read_text())
    doc = apis[8]["Documentation"]  # Apache Superset: request bodies behind $ref
    assert '"$ref": "#/components/schemas/' in doc
    apis[8]["Documentation"] = doc.replace('"$ref": "#/components/schemas/', '"$ref": "#/components/schemas/Gone', 1)
    f = tmp_path / "ta.json"
    f.write_text(json.dumps(apis))
    got = load_path(f)
    good = [s for s in load_toolalpaca() if s.meta["api_index"] != 8]
    assert [s.id for s in got] == [s.id for s in good] and _same(got, good)
    assert len(got.skipped) == 1 and "API 8" in got.skipped[0] and "unresolvable $ref" in got.skipped[0]
    (line,) = _skip_warnings(caplog)
    assert "\n" not in line and "Apache Superset" in line


def test_toolalpaca_unreadable_action_input_skips_that_instruction(tmp_path, caplog):
    apis = json.loads((DATA / "toolalpaca" / "eval_simulated.json").read_text())
    apis[0]["Golden_Answers"][3][0]["Action_Input"] = '{"color": "albino", '  # cut off mid-object
    f = tmp_path / "ta.json"
    f.write_text(json.dumps(apis))
    got = load_dataset(str(f))
    good = [s for s in load_toolalpaca() if s.id != "toolalpaca-0-3"]
    assert len(got) == 99 and [s.id for s in got] == [s.id for s in good] and _same(got, good)
    assert len(got.skipped) == 1 and "instruction 3" in got.skipped[0] and "Action_Input" in got.skipped[0]
    assert len(_skip_warnings(caplog)) == 1
    assert len(load_dataset(str(f), limit=5).skipped) == 1  # a limit keeps the count


def test_json_lines_with_a_line_that_is_not_json(tmp_path, caplog):
    recs = json.loads((DATA / "apibank" / "level-1-api_processed.json").read_text())[:4]
    lines = [json.dumps(r) for r in recs]
    f = tmp_path / "level-1-mine.jsonl"
    f.write_text("\n".join(lines[:2] + ['{"system": "truncated'] + lines[2:]))
    got = load_path(f)
    assert _same(got, load_apibank(1)[:4]) and [s.id for s in got] == ["apibank-l1-0", "apibank-l1-1",
                                                                        "apibank-l1-3", "apibank-l1-4"]
    assert len(got.skipped) == 1 and "line 3" in got.skipped[0] and "not JSON" in got.skipped[0]

    questions = [json.loads(x) for x in (DATA / "bfcl" / "BFCL_v4_multiple.json").read_text().splitlines()[:3]]
    answers = (DATA / "bfcl" / "possible_answer" / "BFCL_v4_multiple.json").read_text().splitlines()[:3]
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "possible_answer" / "BFCL_v4_multiple.json").write_text("\n".join(answers + ["not json"]))
    f = tmp_path / "BFCL_v4_multiple.json"
    f.write_text("\n".join([json.dumps(questions[0]), "[oops", *map(json.dumps, questions[1:])]))
    got = load_path(f)
    assert _same(got, load_bfcl("multiple")[:3]) and all(call_accuracy(s, s.gold) for s in got)
    assert len(got.skipped) == 2 and len(_skip_warnings(caplog)) == 3


def test_a_file_with_nothing_usable_still_fails(tmp_path):
    f = tmp_path / "junk.jsonl"
    f.write_text("not json\nnor this\n")
    with pytest.raises(DatasetError, match="neither JSON nor JSON Lines"):
        load_path(f)
    f.write_text('[{"system": "x", "user": "y"},\n oops]')
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_path(f)
