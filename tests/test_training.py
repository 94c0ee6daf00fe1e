"""The sidecar's training pipeline: split by tool, task rows, LoRA steps, and the adapter in the predictor."""

from __future__ import annotations

import json

import pytest

from oospec.datasets import load_dataset
from oospec.sidecar.predictor import TaskFormat
from oospec.tools.dialects import validate
from oospec.training.rows import job_for, rows_for, value_completion
from oospec.training.traces import trace_record
from synthetic import synthetic_requests


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
def smol(smollm2_model, smollm2_tokenizer):
    return smollm2_model, smollm2_tokenizer


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
    names = [t["function"]["name"] for t in trace["tools"]]
    slots = len(next(t for t in trace["tools"] if t["function"]["name"] == trace["call"]["name"])
                ["function"]["parameters"]["properties"])
    # Then the other offered tools' name rows, unsupervised: the function choice as a ranking.
    assert len(rows.prefixes) == 2 + slots + len(names) - 1
    assert rows.supervised == [True] * (2 + slots) + [False] * (len(names) - 1)
    assert [rows.completions[i].split('"')[0] for i in rows.choices] == names
    assert names[rows.chosen] == trace["call"]["name"] and rows.choices[rows.chosen] == 1
    assert all(rows.prefixes[i] == fmt.function_prefix(job) for i in rows.choices)
    one_tool = {**trace, "tools": [t for t in trace["tools"] if t["function"]["name"] == trace["call"]["name"]]}
    assert rows_for(one_tool, fmt).choices == [] and rows_for(one_tool, fmt).chosen == -1


def test_ranking_loss_scores_names_as_the_predictor_does(smol):
    """The training loss ranks the offered tools by the very scores the predictor ranks them by."""
    import numpy as np
    import torch

    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.tools.schema import tools_from_openai
    from oospec.training.lora import encode_rows, request_loss, supervised_tokens

    model, tok = smol
    trace = _trace()
    fmt = TaskFormat(tok)
    enc = encode_rows(rows_for(trace, fmt), fmt, 4096)
    with torch.no_grad():
        loss = request_loss(model, enc)
    predictor = SidecarPredictor(model, tok)
    job = job_for(trace)
    tools = tools_from_openai(trace["tools"])
    prompt = fmt.prompt(job)
    rows = [fmt.encode(prompt + fmt.function_row(job, t.name)) for t in tools]
    from oospec.engine.prefix_cache import common_prefix_length

    shared = common_prefix_length(rows)
    predictor.runner.encode_prefix(rows[0][:shared])
    logprobs, _ = predictor.runner.run([r[shared:] for r in rows], keep_all_logits=True)
    totals = np.array([lp.sum() for lp in logprobs])
    want = -(totals[enc.chosen] - np.log(np.exp(totals).sum()))
    assert float(loss.rank) == pytest.approx(want, abs=2e-3)
    assert loss.ranked_first == (int(np.argmax(totals)) == enc.chosen)
    # The token loss covers the supervised rows only: the other tools' name rows are there to be ranked.
    sup = [i for i, ok in enumerate(enc.supervised) if ok]
    assert supervised_tokens(enc) == sum(len(enc.rows[i]) - enc.label_from[i] for i in sup) < sum(
        len(r) - f for r, f in zip(enc.rows, enc.label_from))


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
    log = json.loads((tmp_path / "adapter" / "loss.json").read_text())
    ranked = [x for x in log if x["ranked"]]
    assert len(ranked) == cfg.epochs and ranked[-1]["rank_loss"] < ranked[0]["rank_loss"]
    assert summary["function_ranked_first"][-1] == 1.0
    # The predictor queries this adapter as it was trained: whole names ranked, their prior taken out.
    assert json.loads((tmp_path / "adapter" / "sidecar.json").read_text()) == {
        "min_call_probability": 0.5, "rank_by": "total", "prior_weight": 1.0}
    for name in ("adapter_config.json", "adapter_model.safetensors", "train_config.json", "loss.png"):
        assert (tmp_path / "adapter" / name).is_file()
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "smollm2-135m"  # a name any machine resolves, not a cache path
    predictor = SidecarPredictor(model, tok)  # base model, then the adapter merged into a copy
    trained = SidecarPredictor.from_pretrained("smollm2-135m", adapter=str(tmp_path / "adapter"), dtype="float32")
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


def test_traces_are_the_teachers_greedy_calls_and_resume(smollm2_engine, tmp_path):
    """Traces equal plain greedy decoding (shared prompt prefixes reused), and a rerun records nothing twice."""
    import numpy as np

    from oospec.training.traces import read_traces, record_traces

    engine = smollm2_engine
    samples = load_dataset("apibank", split="1", limit=2)
    path = tmp_path / "traces.jsonl"
    record_traces(engine, samples[:1], path, max_new_tokens=12, progress=False)
    traces = record_traces(engine, samples, path, max_new_tokens=12, progress=False)
    assert sorted(t["id"] for t in traces) == sorted(s.id for s in samples)
    for sample in samples:
        ar = engine.generate(sample.request(max_new_tokens=12))
        assert next(t for t in traces if t["id"] == sample.id)["text"] == ar.text
    assert len(read_traces(path)) == 2 and np.all([t["messages"] for t in traces])


def test_agreement_counts_only_whole_calls_and_says_which_calls_were_predictable():
    """Full-call agreement needs the function and exactly the teacher's arguments (an extra slot is a miss);
    calls of a tool that does not exist, or with values of the wrong type, are reported apart."""
    from oospec.sidecar.protocol import Guess, encode_payload
    from oospec.training.evaluate import agreement, format_table

    call = {"name": "searchAxolotlImages", "arguments": {"color": "albino", "page": 2}}
    trace = {**_trace(), "call": call}
    class Fixed:
        def __init__(self, arguments):
            self.arguments = arguments

        def predict(self, job):
            return encode_payload(job.request_id, [Guess(call["name"], self.arguments)], 0.1, 0.0)

    misnamed = {**trace, "id": "misnamed", "call": {"name": "Name", "arguments": call["arguments"]}}
    mistyped = {**trace, "id": "mistyped", "call": {"name": call["name"], "arguments": {"color": "albino", "page": {}}}}
    right = agreement(Fixed(call["arguments"]), [trace, misnamed, mistyped], progress=False)
    assert right["function_accuracy"] == pytest.approx(2 / 3) and right["full_call_agreement"] == pytest.approx(1 / 3)
    assert right["predictable_calls"] == 1 and right["full_call_agreement_predictable"] == 1.0
    assert [i["predictable"] for i in right["items"]] == [True, False, False]
    assert right["slot_exact_match"] == pytest.approx(3 / 6)  # misnamed: no slot counts without the function
    extra = agreement(Fixed({**call["arguments"], "size": "small"}), [trace], progress=False)
    assert extra["function_accuracy"] == 1.0 and extra["slot_exact_match"] == 1.0 and extra["full_call_agreement"] == 0.0
    left_out = agreement(Fixed({"color": "albino"}), [trace], progress=False)
    assert left_out["slot_exact_match"] == 0.5 and left_out["full_call_agreement"] == 0.0
    assert "| 33.3% | 100.0% (1) |" in format_table({"fixed": right})


def _parallel_trace():
    """Two calls in one turn, as Qwen's hermes template writes them: separate blocks joined by a newline."""
    sample = synthetic_requests([t for t in load_dataset("toolalpaca", limit=3)[0].tools][:2], per_tool=1, seed=3)[0]
    name = "searchAxolotlImages"
    assert name in [t.name for t in sample.tools]
    args1, args2 = {"color": "wild", "size": "small", "page": 1}, {"color": "albino", "page": 12}
    block = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
    text = "\n".join(block % (name, json.dumps(a)) for a in (args1, args2))
    return trace_record(sample, text), name, args1, args2


def test_a_parallel_trace_gives_rows_for_every_call_and_the_end_of_the_turn(smol):
    _, tok = smol
    fmt = TaskFormat(tok)
    trace, name, args1, args2 = _parallel_trace()
    assert len(trace["calls"]) == 2 and trace["call"] == trace["calls"][0]
    rows = rows_for(trace, fmt)
    single = rows_for({**trace, "calls": trace["calls"][:1]}, fmt)
    job = job_for(trace)
    # The first call's rows are a single call's, unchanged; the later rows come before the ranking rows.
    first = 2 + sum(1 for p in single.prefixes[2:] if p.startswith(fmt.function_prefix(job) + name))
    assert rows.prefixes[:first] == single.prefixes[:first] and rows.completions[:first] == single.completions[:first]
    assert rows.choices[rows.chosen] == 1 and all(rows.prefixes[i] == fmt.function_prefix(job) for i in rows.choices)
    later = [(p, c) for p, c, sup in zip(rows.prefixes[first:], rows.completions[first:], rows.supervised[first:]) if sup]
    call1 = fmt.call_text(job, name, args1)
    call2_job = fmt.after_calls(job, call1 + "\n</tool_call>\n<tool_call>\n")
    call2 = fmt.call_text(call2_job, name, args2)
    # After call 1: another call opens, as the teacher joined them.
    assert later[0] == (call1, '\n</tool_call>\n<tool_call>\n{"name": "')
    # The second call's function and slots, primed with the first call.
    assert later[1] == (call1 + '\n</tool_call>\n<tool_call>\n{"name": "', name + '", "arguments":')
    slot_rows = later[2:-1]
    assert slot_rows and all(p.startswith(call2_job.opener + '{"name": "' + name) for p, _ in slot_rows)
    # As for a first call: a left-out string slot has no row (its primer's quote cannot be followed by null).
    assert [c for _, c in slot_rows] == ['albino",', "12}"]
    # After call 2: the turn ends (the end-of-turn token, as the predictor's decoding stops at it).
    assert later[-1] == (call2, "\n</tool_call>" + tok.eos_token)
    # Every row's prefix ends where the predictor primes it: the encoded rows are the predictor's queries.
    from oospec.training.lora import encode_rows
    assert encode_rows(rows, fmt, 4096) is not None


def test_later_call_rows_need_the_calls_where_the_trace_lists_them(smol):
    _, tok = smol
    fmt = TaskFormat(tok)
    trace, *_ = _parallel_trace()
    reordered = {**trace, "calls": trace["calls"][::-1]}
    assert len(rows_for(reordered, fmt).prefixes) == len(rows_for({**trace, "calls": trace["calls"][:1]}, fmt).prefixes)
