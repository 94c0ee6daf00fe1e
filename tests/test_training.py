"""The sidecar's training pipeline: split by tool, task rows, LoRA steps, and the adapter in the predictor."""

from __future__ import annotations

import json

import pytest

from oospec.bench.datasets import load_dataset
from oospec.sidecar.predictor import TaskFormat
from oospec.tools.dialects import validate
from oospec.training.rows import job_for, rows_for, value_completion
from oospec.training.split import split_by_tool, synthetic_requests
from oospec.training.traces import trace_record


def test_split_keeps_heldout_tools_out_of_training():
    samples = load_dataset("apibank", split="1") + load_dataset("toolalpaca")
    bench = {c.name for s in load_dataset("apibank", split="1", limit=8) for c in s.gold}
    split = split_by_tool(samples, 0.3, seed=1, always_heldout=sorted(bench))
    called = lambda ss: {c.name for s in ss for c in s.gold or []}  # noqa: E731
    assert bench <= set(split.heldout_tools)
    assert not called(split.train) & set(split.heldout_tools)
    assert called(split.heldout) <= set(split.heldout_tools) | called(split.heldout)
    assert all(called([s]) & set(split.heldout_tools) for s in split.heldout)
    assert split.train and split.heldout
    again = split_by_tool(samples, 0.3, seed=1, always_heldout=sorted(bench))
    assert again.heldout_tools == split.heldout_tools  # deterministic given the seed
    manifest = split.manifest(1, {})
    assert set(manifest["train_tools"]).isdisjoint(manifest["heldout_tools"])


def test_synthetic_requests_are_valid_calls_of_training_tools():
    tools = [t for s in load_dataset("toolalpaca", limit=10) for t in s.tools]
    tools = list({t.name: t for t in tools}.values())
    synth = synthetic_requests(tools, per_tool=2, seed=0)
    assert len(synth) == 2 * len(tools)
    for s in synth:
        call = s.gold[0]
        assert call.name in {t.name for t in s.tools}
        assert validate(call, s.tools) == [], (call, s.tools)
        assert s.chat_tools() and s.messages[-1]["role"] == "user"


def test_value_completion_follows_the_predictor_primer():
    assert value_completion("Paris", "string", last=False) == 'Paris",'
    assert value_completion(3, "integer", last=True) == "3}"
    assert value_completion([1, 2], "array", last=True) == "1, 2]}"
    assert value_completion(None, "integer", last=False) == "null,"
    assert value_completion("[1, 2]", "array", last=True) is None  # a string where an array is primed


@pytest.fixture(scope="module")
def smol():
    from oospec.models.loading import load_model

    return load_model("smollm2-135m", dtype="float32")


def _trace():
    sample = synthetic_requests([t for t in load_dataset("toolalpaca", limit=3)[0].tools][:2], per_tool=1, seed=3)[0]
    text = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (
        sample.gold[0].name, json.dumps(sample.gold[0].arguments))
    return trace_record(sample, text)


def test_rows_are_the_predictor_queries(smol):
    _, tok = smol
    trace = _trace()
    fmt = TaskFormat(tok)
    rows = rows_for(trace, fmt)
    job = job_for(trace)
    assert job.opener == "<tool_call>\n" and job.args_key == "arguments"
    # Whether a call comes at all (its opening), which function, then one row per slot.
    assert rows.prefixes[0] == "" and rows.completions[0] == fmt.function_prefix(job)
    assert rows.prefixes[1] == fmt.function_prefix(job)
    assert rows.completions[1].startswith(trace["call"]["name"] + '", "arguments":')
    assert len(rows.prefixes) == 2 + len([p for p in trace["tools"] if p["function"]["name"] == trace["call"]["name"]
                                          for _ in p["function"]["parameters"]["properties"]])


def test_a_plain_answer_is_a_no_call_row(smol):
    _, tok = smol
    trace = {**_trace(), "call": None, "text": "To convert 3000 CHF to USD, you can use the convertCurrency function."}
    rows = rows_for(trace, TaskFormat(tok))
    assert rows.prefixes == [""] and rows.completions == ["To convert 3000 CHF to U"]
    assert rows_for({**trace, "text": ""}, TaskFormat(tok)) is None


def test_lora_learns_a_call_and_the_predictor_uses_it(smol, tmp_path):
    """A few steps on one request: the loss falls, and the adapter (merged by the predictor) predicts that call."""
    import copy

    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.sidecar.protocol import parse_payload
    from oospec.tools.schema import tools_from_openai
    from oospec.training.lora import TrainConfig, train

    model, tok = smol
    trace = _trace()
    chat = {**trace, "id": "chat-1", "call": None, "text": "Why did the cat sit on the keyboard?",
            "messages": [trace["messages"][0], {"role": "user", "content": "Tell me a joke about cats."}]}
    cfg = TrainConfig(base="smollm2-135m", r=8, alpha=16, lr=3e-3, epochs=12, batch_requests=1, warmup_steps=1, seed=0)
    summary = train([trace, chat], tmp_path / "adapter", cfg, model=copy.deepcopy(model), tokenizer=tok,
                    progress=False)
    assert summary["last_loss"] < 0.3 * summary["first_loss"]
    for name in ("adapter_config.json", "adapter_model.safetensors", "train_config.json", "loss.png"):
        assert (tmp_path / "adapter" / name).is_file()
    predictor = SidecarPredictor(model, tok)  # base model, then the adapter merged into a copy
    trained = SidecarPredictor.from_pretrained("smollm2-135m", adapter=str(tmp_path / "adapter"))
    job = job_for(trace)
    tools = tools_from_openai(trace["tools"])
    payload = parse_payload(trained.predict(job), job.request_id, tools)
    got = payload.best
    assert got.function == trace["call"]["name"] and got.arguments == trace["call"]["arguments"]
    assert payload.call_probability > 0.5
    # The plain-answer request: the payload says no call, and no slot was decoded for it.
    payload = parse_payload(trained.predict(job_for(chat)), "chat-1", tools)
    assert payload.best is None and payload.guesses == () and payload.call_probability < 0.5
    assert predictor.model is model  # the base model object was not changed by training a copy


def test_traces_are_the_teachers_greedy_calls_and_resume(tmp_path):
    """Traces equal plain greedy decoding (shared prompt prefixes reused), and a rerun records nothing twice."""
    import numpy as np

    from oospec.engine.engine import Engine
    from oospec.training.traces import read_traces, record_traces

    engine = Engine.from_pretrained("smollm2-135m")
    samples = load_dataset("apibank", split="1", limit=2)
    path = tmp_path / "traces.jsonl"
    record_traces(engine, samples[:1], path, max_new_tokens=12, progress=False)
    traces = record_traces(engine, samples, path, max_new_tokens=12, progress=False)
    assert sorted(t["id"] for t in traces) == sorted(s.id for s in samples)
    for sample in samples:
        ar = engine.generate(sample.messages, tools=sample.chat_tools(), tool_schemas=sample.tools,
                             dialect=sample.dialect, method="ar", max_new_tokens=12)
        assert next(t for t in traces if t["id"] == sample.id)["text"] == ar.text
    assert len(read_traces(path)) == 2 and np.all([t["messages"] for t in traces])
