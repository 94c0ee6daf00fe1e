"""Issue 14's evaluation side: which benchmark items are fresh for an adapter (data manifest version 2), the
calibration of "call or none", and settings chosen on validation traces (`oospec sidecar tune`)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from helpers import request_by_id

from oospec.bench import items as bench_items
from oospec.bench.config import BenchConfig
from oospec.bench.items import load_datasets
from oospec.errors import OospecError
from oospec.sidecar.provenance import ADAPTERS_DIR, training_manifest


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
    assert m.overlap(request_by_id("a-1")) == ["item a-1 is a training item"]
    # validation chose settings: not fresh
    assert m.overlap(request_by_id("v-1", {"Fresh"})) == ["item v-1 is a training item"]
    assert m.overlap(request_by_id("x", {"Tune", "Other"})) == ["calls training tool Tune"]
    assert m.overlap(request_by_id("x", {"Add"})) == ["calls training tool Add"]
    assert m.overlap(request_by_id("x", {"Fresh", "Other"})) == []  # never traced, gold tools not used: fresh
    assert m.overlap(request_by_id("d-1", {"Other"})) == []  # traced but dropped: never trained on
    # A test item is fresh even if its gold call names a used tool: the split placed it by the teacher's call.
    assert m.overlap(request_by_id("t-1", {"Add"})) == []


def test_v2_manifest_carries_what_the_adapter_it_started_from_used(tmp_path):
    old = tmp_path / "adapters" / "old"
    old.mkdir(parents=True)
    (old / "data_manifest.json").write_text(json.dumps({"seed": 0, "sources": {"used_train_items": ["u-1"]},
                                                        "train_tools": ["OldTool"], "train_items": ["o-1"]}))
    items = {"train": ["a-1"], "validation": [], "test": ["o-1", "t-1"]}
    new = _v2_adapter(tmp_path / "adapters" / "new", items, {"train": ["Add"], "validation": [], "test": []},
                      init_adapter="old")  # a sibling folder's name, as `oospec sidecar split --init-adapter` writes
    m = training_manifest(new)
    assert m.overlap(request_by_id("o-1")) == ["item o-1 is a training item"]  # the old adapter trained on it
    assert m.overlap(request_by_id("u-1"))
    assert m.overlap(request_by_id("x", {"OldTool"})) == ["calls training tool OldTool"]
    assert m.overlap(request_by_id("t-1", {"OldTool"})) == []
    same = _v2_adapter(tmp_path / "self", items, {"train": [], "validation": [], "test": []}, init_adapter="self")
    assert training_manifest(same).overlap(request_by_id("t-1")) == []  # replaced in place: no loop
    # Trained elsewhere (a run folder) from a shipped adapter, named as the split records it: that adapter's data.
    shipped = "qwen2.5-coder-0.5b-toolcalls-v3"
    elsewhere = _v2_adapter(tmp_path / "runs" / "v4", items, {"train": [], "validation": [], "test": []},
                            init_adapter=shipped)
    assert training_manifest(elsewhere).items == training_manifest(ADAPTERS_DIR / shipped).items | {"a-1"}
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
    (_, kept), = load_datasets(cfg, exclude=bench_items.trained_item_filter(str(folder)))
    assert [s.id for s in kept[:3]] == [items[i].id for i in (3, 4, 5)] and len(kept) == 6  # --limit counts after
    assert bench_items.check_trained_items([("apibank", kept)], str(folder), allow=False) == []
    with pytest.raises(bench_items.BenchError, match="3 benchmark item.*not held out.*calls training tool "
                                                    "CancelRegistration"):
        bench_items.check_trained_items([("apibank", items)], str(folder), allow=False)


# -- calibration of call or none ------------------------------------------------------------------------------
def _tool(name, *params):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params)}}}


def _trace(tid, dataset, call, tools=None):
    tools = tools or [_tool("get_weather", "city"), _tool("get_time", "zone")]
    text = "" if call is None else f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
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


# -- settings chosen on validation traces ---------------------------------------------------------------------
def _toolalpaca_traces():
    """Requests offering several real tools (ToolAlpaca's), one answered with a call and one plain."""
    from oospec.datasets import load_dataset
    from oospec.training.traces import trace_record

    samples = load_dataset("toolalpaca", limit=1)
    traces = []
    for s in samples:
        call = s.gold[0]
        text = f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n</tool_call>"
        traces.append(trace_record(s, text))
    plain = trace_record(samples[0], "You're welcome!")
    plain["messages"] = [*plain["messages"][:-1], {"role": "user", "content": "Thanks, that is all I needed."}]
    traces.append({**plain, "id": "plain-1"})
    return traces


def test_tune_scores_every_setting_as_predict_would(smollm2_model, smollm2_tokenizer, one_thread):
    """The grid re-scored from one pass per request equals running `predict` with each setting."""
    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.training.evaluate import agreement
    from oospec.training.tune import Setting, answers_for, score_setting

    traces = _toolalpaca_traces()
    assert all(len(t["tools"]) > 1 for t in traces)
    rankings = (("total", 1.0), ("total", 0.0), ("greedy", 0.0))
    cached = SidecarPredictor(smollm2_model, smollm2_tokenizer, max_value_tokens=12)
    answers = [answers_for(cached, t, rankings) for t in traces]
    ps = sorted(a.call_probability for a in answers)
    assert ps[1] > 1.1 * ps[0]  # apart: the threshold between them is far beyond rounding of either
    middle = (ps[0] * ps[1]) ** 0.5
    for s in [Setting(0.0, r, w) for r, w in rankings] + [Setting(middle, "total", 1.0)]:
        fresh = SidecarPredictor(smollm2_model, smollm2_tokenizer, max_value_tokens=12, **asdict(s))
        expected = agreement(fresh, traces, progress=False)["items"]
        for e, g in zip(expected, score_setting(answers, s)):
            assert g["call_probability"] == pytest.approx(e["call_probability"], rel=1e-3)
            assert (g["said_no_call"], g.get("predicted")) == (e["said_no_call"], e.get("predicted")), s
    assert sum(a.call_probability < middle for a in answers) == 1  # the threshold did bite


def _figures(full, decision, missed, n=50):
    return {"full_call_agreement": full, "call_decision_accuracy": decision, "missed_calls": missed, "n": n}


def test_choose_takes_the_best_full_call_agreement_within_the_missed_call_limit():
    from oospec.training.tune import Setting, choose

    a, b, c = Setting(0.5, "total", 1.0), Setting(0.2, "total", 1.0), Setting(0.0, "total", 1.0)
    results = [(a, _figures(0.80, 0.9, 5)), (b, _figures(0.78, 0.88, 1)), (c, _figures(0.78, 0.70, 0))]
    assert choose(results, 0.02)[:1] == (b,) and choose(results, 0.02)[2]  # a misses too many; b ties c, sorts better
    assert choose(results, 0.2)[0] == a
    setting, _, met = choose([(a, _figures(0.8, 0.9, 5)), (b, _figures(0.7, 0.9, 3))], 0.0)
    assert setting == b and not met  # none meets the limit: the fewest missed calls, and it says so


def test_tune_writes_settings_the_predictor_reads_and_the_record_of_the_choice(tmp_path, monkeypatch):
    import oospec.training.tune as tune_module
    from oospec.sidecar.predictor import SidecarPredictor

    traces, answers = _scripted_set()

    def scripted_answers(_predictor, trace, rankings):  # the grid scored from scripted answers, not a model
        p, guess = answers[trace["id"]]
        return tune_module.Answers(trace, [], p, {r: guess for r in rankings}, 0.0)

    monkeypatch.setattr(tune_module, "answers_for", scripted_answers)
    result = tune_module.tune(None, traces, progress=False)
    # Calls at p 0.95 (right), 0.05 and 0.85; plain answers at 0.15 and 0.9. Any threshold above 0.05 says
    # "no call" to a call (1 of 3: over the limit); 0.05 and 0.0 tie, and the higher comes first.
    assert result["chosen"] == {"min_call_probability": 0.05, "rank_by": "total", "prior_weight": 1.0}
    assert result["constraint_met"] and result["figures"]["missed_calls"] == 0
    assert len(result["grid"]) == len(tune_module.grid())
    (tmp_path / "sidecar.json").write_text(json.dumps({"min_call_probability": 0.5, "max_value_tokens": 48}))
    traces_file = tmp_path / "validation.jsonl"
    traces_file.write_text("".join(json.dumps(t) + "\n" for t in traces))
    settings = tune_module.write_tuning(tmp_path, result, traces_file)
    assert settings == {**result["chosen"], "max_value_tokens": 48}
    assert json.loads((tmp_path / "sidecar.json").read_text()) == settings
    record = json.loads((tmp_path / tune_module.TUNING_FILE).read_text())
    assert record["chosen"] == result["chosen"] and len(record["traces_sha256"]) == 64
    # from_pretrained passes every key of sidecar.json to the constructor.
    assert set(settings) <= set(SidecarPredictor.__init__.__code__.co_varnames)
    assert "| 0.05 | total | 1.0 | 33.3% | 66.7% | 60.0% | 0 of 3 | chosen |" in tune_module.format_grid(result)


# -- the commands ----------------------------------------------------------------------------------------------
def _untrained_adapter(model, folder, tools_used, items):
    """A LoRA adapter that changes nothing yet (its B matrices start at zero), with a version-2 manifest."""
    import copy

    from peft import LoraConfig, get_peft_model

    get_peft_model(copy.deepcopy(model), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])).save_pretrained(
        str(folder))
    (folder / "sidecar.json").write_text(json.dumps({"min_call_probability": 0.5, "rank_by": "total",
                                                     "prior_weight": 1.0}))
    (folder / "data_manifest.json").write_text(json.dumps({
        "version": 2, "tools": {"train": tools_used, "validation": [], "test": []}, "items": items, "dropped": {}}))
    return folder


def _write(path, traces):
    path.write_text("".join(json.dumps(t) + "\n" for t in traces))
    return str(path)


def test_tune_and_eval_commands(smollm2_model, tmp_path, capsys, one_thread):
    from oospec.cli import main
    from oospec.training.tune import TUNING_FILE

    traces, _ = _scripted_set()
    validation, test = [traces[i] for i in (0, 1, 3)], [traces[i] for i in (2, 4)]
    items = {"train": [], "validation": [t["id"] for t in validation], "test": [t["id"] for t in test]}
    adapter = _untrained_adapter(smollm2_model, tmp_path / "adapter", ["get_time"], items)
    val_file, test_file = _write(tmp_path / "validation.jsonl", validation), _write(tmp_path / "test.jsonl", test)
    # Settings are chosen on validation only: test traces are refused before any model loads.
    assert main(["sidecar", "tune", "--traces", test_file, "--adapter", str(adapter), "--base", "smollm2-135m"]) == 2
    assert "are not validation items" in capsys.readouterr().err
    # A checkpoint of the same run (no manifest of its own: its run's is found) compared with the final adapter.
    checkpoint = adapter / "epoch-1"
    checkpoint.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", "sidecar.json"):
        (checkpoint / name).write_bytes((adapter / name).read_bytes())
    assert main(["sidecar", "tune", "--traces", val_file, "--adapter", str(adapter), "--adapter", str(checkpoint),
                 "--base", "smollm2-135m", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("all 3 traces are validation items") == 2 and "| chosen |" in out
    assert f"best on validation: {adapter} (" in out  # the two are equal: the first given wins the tie
    record = json.loads((adapter / TUNING_FILE).read_text())
    assert json.loads((adapter / "sidecar.json").read_text()) == record["chosen"]
    assert len(record["grid"]) == 24 and record["figures"]["requests"] == 3
    report = tmp_path / "eval" / "test.json"
    assert main(["sidecar", "eval", "--traces", test_file, "--adapter", str(adapter), "--base", "smollm2-135m",
                 "--threads", "1", "--out", str(report)]) == 0
    results = json.loads(report.read_text())
    assert list(results) == ["base smollm2-135m", str(adapter)]
    assert results[str(adapter)]["requests"] == 2 and results[str(adapter)]["not_held_out"] == []
    md = report.with_suffix(".md").read_text()
    assert "### Calibration of call or none" in md and f"| {adapter} | bfcl:irrelevance | 1 (1) |" in md
    # A request whose teacher called a tool the adapter was trained on is flagged in the report.
    time_call = _trace("multiple_9", "bfcl", {"name": "get_time", "arguments": {"zone": "UTC"}})
    assert main(["sidecar", "eval", "--traces", _write(tmp_path / "t2.jsonl", [time_call]), "--adapter", str(adapter),
                 "--base", "smollm2-135m", "--skip-base", "--threads", "1"]) == 0
    assert "1 of 1 requests are not held out from its training data (e.g. multiple_9)" in capsys.readouterr().out
