"""Issue 14's evaluation side: which benchmark items are fresh for an adapter (data manifest version 2), the
calibration of "call or none", and settings chosen on validation traces (`oospec sidecar tune`)."""

from __future__ import annotations

import json

import pytest

from oospec.bench import run as bench_run
from oospec.bench.config import BenchConfig
from oospec.bench.run import load_datasets
from oospec.errors import OospecError
from oospec.sidecar.provenance import training_manifest


# -- provenance: manifest version 2 ---------------------------------------------------------------------------
def _v2_adapter(folder, items, tools, init_adapter=None):
    folder.mkdir(parents=True)
    (folder / "data_manifest.json").write_text(json.dumps({
        "version": 2, "seed": 0, "teacher": "qwen2.5-coder-1.5b", "pool": {}, "rule": "by tool",
        "tools": tools, "items": items, "dropped": {"d-1": "stray call"}, "init_adapter": init_adapter}))
    return folder


def test_v2_manifest_counts_train_and_validation_as_used_and_test_as_held_out(tmp_path):
    folder = _v2_adapter(tmp_path / "new", items={"train": ["a-1"], "validation": ["v-1"], "test": ["t-1"]},
                         tools={"train": ["Add"], "validation": ["Tune"], "test": ["Fresh"]})
    m = training_manifest(folder)
    assert m.overlap("a-1", set()) == ["item a-1 is a training item"]
    assert m.overlap("v-1", {"Fresh"}) == ["item v-1 is a training item"]  # validation chose settings: not fresh
    assert m.overlap("x", {"Tune", "Other"}) == ["calls training tool Tune"]
    assert m.overlap("x", {"Add"}) == ["calls training tool Add"]
    assert m.overlap("x", {"Fresh", "Other"}) == []  # never traced, gold tools not used: fresh
    assert m.overlap("d-1", {"Other"}) == []  # traced but dropped: never trained on
    # A test item is fresh even if its gold call names a used tool: the split placed it by the teacher's call.
    assert m.overlap("t-1", {"Add"}) == []


def test_v2_manifest_carries_what_the_adapter_it_started_from_used(tmp_path):
    old = tmp_path / "adapters" / "old"
    old.mkdir(parents=True)
    (old / "data_manifest.json").write_text(json.dumps({"seed": 0, "sources": {"used_train_items": ["u-1"]},
                                                        "train_tools": ["OldTool"], "train_items": ["o-1"]}))
    items = {"train": ["a-1"], "validation": [], "test": ["o-1", "t-1"]}
    new = _v2_adapter(tmp_path / "adapters" / "new", items, {"train": ["Add"], "validation": [], "test": []},
                      init_adapter="old")  # a sibling folder's name, as `oospec sidecar split --init-adapter` writes
    m = training_manifest(new)
    assert m.overlap("o-1", set()) == ["item o-1 is a training item"]  # the old adapter trained on it
    assert m.overlap("u-1", set()) and m.overlap("x", {"OldTool"}) == ["calls training tool OldTool"]
    assert m.overlap("t-1", {"OldTool"}) == []
    same = _v2_adapter(tmp_path / "self", items, {"train": [], "validation": [], "test": []}, init_adapter="self")
    assert training_manifest(same).overlap("t-1", set()) == []  # replaced in place: no loop
    lost = _v2_adapter(tmp_path / "lost", items, {"train": [], "validation": [], "test": []}, init_adapter="gone")
    with pytest.raises(OospecError, match="started from adapter 'gone'"):
        training_manifest(lost)


def test_held_out_only_keeps_test_items_and_fresh_items_and_refuses_the_rest(tmp_path):
    cfg = BenchConfig(datasets=["apibank"], split="1", limit=6)
    (_, items), = load_datasets(cfg)
    assert [s.gold[0].name for s in items[:4]] == ["ModifyRegistration", "QueryHealthData", "CancelRegistration",
                                                   "Calculator"]
    # Item 0 was trained on; item 1 calls a train tool, item 2 a validation tool; item 3 calls a train tool
    # but is a test item (the teacher called something else); items 4 and 5 were never traced, tools unused.
    folder = _v2_adapter(tmp_path / "adapter", tools={"train": ["QueryHealthData", "Calculator"],
                                                      "validation": ["CancelRegistration"], "test": []},
                         items={"train": [items[0].id], "validation": [], "test": [items[3].id]})
    (_, kept), = load_datasets(cfg, exclude=bench_run.trained_item_filter(str(folder)))
    assert [s.id for s in kept[:3]] == [items[i].id for i in (3, 4, 5)] and len(kept) == 6  # --limit counts after
    assert bench_run.check_trained_items([("apibank", kept)], str(folder), allow=False) == []
    with pytest.raises(bench_run.BenchError, match="3 benchmark item.*not held out.*calls training tool "
                                                    "CancelRegistration"):
        bench_run.check_trained_items([("apibank", items)], str(folder), allow=False)


# -- calibration of call or none ------------------------------------------------------------------------------
def _tool(name, *params):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params)}}}


def _trace(tid, dataset, call, tools=None):
    tools = tools or [_tool("get_weather", "city"), _tool("get_time", "zone")]
    text = "" if call is None else '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (
        call["name"], json.dumps(call["arguments"]))
    return {"id": tid, "dataset": dataset, "messages": [{"role": "user", "content": f"request {tid}"}],
            "tools": tools, "chat_tools": tools, "dialect": "hermes", "text": text or "Hello there.",
            "call": call, "calls": [call] if call else []}


class Scripted:
    """A predictor that answers each request id as told: (call probability, guess or None for "no call")."""

    def __init__(self, answers):
        self.answers = answers

    def predict(self, job):
        from oospec.sidecar.protocol import encode_payload

        p, guess = self.answers[job.request_id]
        return encode_payload(job.request_id, [guess] if guess else [], 0.01, 0.0, p)


WEATHER = {"name": "get_weather", "arguments": {"city": "Paris"}}


def _scripted_set():
    from oospec.sidecar.protocol import Guess

    traces = [_trace("apibank-l1-1", "apibank", WEATHER), _trace("simple_python_3", "bfcl", WEATHER),
              _trace("simple_python_4", "bfcl", WEATHER), _trace("irrelevance_7", "bfcl", None),
              _trace("irrelevance_8", "bfcl", None)]
    right, wrong_slot = Guess("get_weather", {"city": "Paris"}), Guess("get_weather", {"city": "Rome"})
    answers = {"apibank-l1-1": (0.95, right), "simple_python_3": (0.05, None), "simple_python_4": (0.85, wrong_slot),
               "irrelevance_7": (0.15, None), "irrelevance_8": (0.9, right)}
    return traces, answers


def test_calibration_reliability_table_and_lowest_probability_where_the_teacher_called():
    from oospec.training.evaluate import agreement

    traces, answers = _scripted_set()
    r = agreement(Scripted(answers), traces, progress=False)
    assert (r["requests"], r["n"], r["no_call_requests"], r["missed_calls"]) == (5, 3, 2, 1)
    assert r["call_decision_accuracy"] == pytest.approx(3 / 5)  # two calls hinted, one plain answer said none
    assert r["full_call_agreement"] == pytest.approx(1 / 3) and r["answer_agreement"] == pytest.approx(2 / 5)
    c = r["calibration"]
    assert c["lowest_probability_where_called"] == pytest.approx(0.05) and c["called_below_0.2"] == 1
    assert [(b["from"], b["count"], b["observed_call_rate"]) for b in c["bins"]] == [
        (0.0, 1, 1.0), (0.1, 1, 0.0), (0.8, 1, 1.0), (0.9, 2, 0.5)]
    assert c["bins"][-1]["mean_predicted"] == pytest.approx(0.925)
    assert c["expected_calibration_error"] == pytest.approx((0.95 + 0.15 + 0.15 + 2 * 0.425) / 5)
    assert sorted(r["by_source"]) == ["apibank", "bfcl:irrelevance", "bfcl:simple_python"]
    simple = r["by_source"]["bfcl:simple_python"]
    assert simple["n"] == 2 and simple["function_accuracy"] == 0.5 and simple["missed_calls"] == 1
    assert r["by_source"]["bfcl:irrelevance"]["call_decision_accuracy"] == 0.5


def test_markdown_report_has_agreement_calibration_and_per_source_tables():
    from oospec.training.evaluate import agreement, format_report

    traces, answers = _scripted_set()
    md = format_report({"A": agreement(Scripted(answers), traces, progress=False)})
    assert "| A | 5 (2) | 60.0% | 1 | 66.7% | 33.3% | 33.3% | 33.3% (3) | 0.00 s |" in md
    assert "| A | 0.0–0.1 | 1 | 0.05 | 100.0% |" in md
    assert "| A | 0.05 | 1 of 3 | 0.42 |" in md
    assert "| A | bfcl:simple_python | 2 (0) | 50.0% | 50.0% | 0.0% | 0.05 |" in md
