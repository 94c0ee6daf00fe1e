"""The parts of oospec.integrations.vllm around the proposer: the pinned sidecar, the oracle, the bench summary.
No vLLM needed (runs in `make test`)."""

import json
import os
import time

import numpy as np
import pytest

from fake_runner import FakeRunner, SilentSidecar, tool_script, vllm_config
from helpers import WEATHER
from oospec.bench.records import first_difference
from oospec.bench.vllm import summarize
from oospec.integrations.vllm.batch import DraftingSettings
from oospec.integrations.vllm.calls import json_calls, may_be_json_call
from oospec.integrations.vllm.context import context_from_extra_args, context_json, xargs_with_context
from oospec.integrations.vllm.oracle import OracleBatch
from oospec.integrations.vllm.proposer import OospecProposer
from oospec.integrations.vllm.request_state import Row
from oospec.integrations.vllm.sidecar import PinnedSidecarClient, spare_cores


def test_the_sidecar_leaves_the_workers_pinning_behind(monkeypatch):
    monkeypatch.setenv("OMP_PROC_BIND", "true")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    core = sorted(os.sched_getaffinity(0))[-1]
    client = PinnedSidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good"},
                                 cores={core}, wait_ready=True, ready_timeout_s=120)
    try:
        assert client.ready and os.sched_getaffinity(client.pid) == {core}
        env = dict(line.split("=", 1) for line in
                   open(f"/proc/{client.pid}/environ", "rb").read().decode().split("\0") if "=" in line)
        assert "OMP_PROC_BIND" not in env and env["OMP_NUM_THREADS"] == "1"  # the client's own thread budget
    finally:
        client.close()
    assert os.environ["OMP_PROC_BIND"] == "true"  # the worker's own settings are back as they were


def test_spare_cores():
    assert spare_cores(DraftingSettings(sidecar_cores=(3, 5))) == {3, 5}
    assert spare_cores(DraftingSettings()) == set(range(os.cpu_count())) - os.sched_getaffinity(0)
    assert DraftingSettings.from_env({"OOSPEC_VLLM_SIDECAR": "1", "OOSPEC_VLLM_SIDECAR_CORES": "2,3"}) == \
        DraftingSettings(sidecar=True, sidecar_cores=(2, 3))


def test_drafting_with_a_sidecar_keeps_the_output(smollm2_path, tok_module):
    script = tool_script(tok_module)
    client = PinnedSidecarClient(factory="sidecar_fakes:make_fake", cores=set(),
                                 factory_options={"mode": "good", "answer": {"function": "get_weather",
                                                                             "arguments": {"city": "Paris"}}},
                                 wait_ready=True, ready_timeout_s=120)
    try:
        proposer = OospecProposer(vllm_config(str(smollm2_path)))
        runner = FakeRunner(proposer)
        runner.load_model()
        from oospec.integrations.vllm.batch import BatchDrafter

        proposer.batch = BatchDrafter(proposer.batch.tokenizer, proposer.batch.eos_ids, proposer.k, sidecar=client)
        runner.add("a", script)
        time.sleep(0.5)  # the hint arrives while the target is still prefilling
        for _ in range(200):
            if runner.done("a"):
                break
            runner.step()
        assert runner.tokens("a") == script.prompt + script.output
        assert runner.accepted["a"] >= len(script.output) // 2
    finally:
        client.close()


def test_the_real_sidecar_predicts_under_this_environments_transformers(smollm2_path):
    """vLLM's environment pins an older transformers than the main one (another name for the forward's KV
    cache): the sidecar, which runs there beside vLLM, must still answer, not fail every job."""
    from oospec.sidecar.predictor import SidecarPredictor
    from oospec.sidecar.protocol import Job

    predictor = SidecarPredictor.from_pretrained(str(smollm2_path), dtype="float32")
    job = Job(request_id="r", messages=[{"role": "user", "content": "What is the weather in Paris in celsius?"}],
              tools=[WEATHER], opener="<tool_call>\n")
    answer = json.loads(predictor.predict(job))
    assert answer["id"] == "r" and 0.0 <= answer["call_p"] <= 1.0
    assert answer.get("function") in (None, "get_weather")


@pytest.fixture(scope="module")
def tok_module(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def test_the_oracle_drafts_the_reference_from_where_the_row_is(tmp_path):
    ref = tmp_path / "none.json"
    ref.write_text(json.dumps({"items": {"x": {"prompt_ids": [1, 2, 3], "tokens": [7, 8, 9, 10, 11]}}}))
    oracle = OracleBatch(str(ref), k=3)
    rows = [Row("a", np.array([1, 2, 3, 7]), 3, room=10), Row("b", np.array([4, 5]), 2, room=10), None,
            Row("c", np.array([1, 2, 3, 7, 8, 9, 10]), 3, room=1)]
    assert oracle.propose(rows) == [[8, 9, 10], [], [], [11]]


def test_summary_against_no_speculation_in_the_same_run():
    def run(e2e, decode, tokens, tau=1.0):
        return {"wall_s": 2 * e2e,
                "items": {"q": {"dataset": "d", "e2e_s": e2e, "decode_s": decode, "tokens": tokens, "tau": tau}}}

    runs = {("none", 1): run(10.0, 8.0, [1, 2, 3]), ("oracle", 1): run(4.0, 2.0, [1, 2, 3], 3.0),
            ("oospec", 1): run(5.0, 4.0, [1, 2, 3], 2.0), ("ngram", 1): run(8.0, 6.0, [1, 2, 4], 1.5)}
    s = summarize(runs)["d"]
    assert s["oospec"] == {"n": 1, "tau": 2.0, "e2e_speedup": 2.0, "decode_speedup": 2.0, "oracle_fraction": 0.833,
                           "identical_rate": 1.0, "diverged_at": {}, "throughput_tok_s": 0.3}
    assert s["ngram"]["identical_rate"] == 0.0 and s["ngram"]["diverged_at"] == {"q": 2}
    assert s["none"]["e2e_speedup"] == 1.0
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([5], [1]) == 0
    assert first_difference([1, 2], [1, 2]) is None


def test_json_calls_bare_or_fenced_complete_and_of_the_requests_tools():
    names = {"get_weather", "math.pow"}
    fenced = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```'
    assert json_calls(fenced, names) == [("get_weather", {"city": "Paris"})]
    two = '{"name": "math.pow", "parameters": {"base": 2}}\n{"name": "get_weather", "arguments": {}}'
    assert json_calls(two, names) == [("math.pow", {"base": 2}), ("get_weather", {})]
    assert json_calls(fenced[:40], names) == []  # half an object is not a call yet
    assert json_calls('{"name": "rm_rf", "arguments": {}}', names) == []  # not one of the request's tools
    assert json_calls('{"name": "get_weather", "arguments": "x"}', names) == []
    assert json_calls("It is sunny.", names) == []
    assert may_be_json_call("  ``") and may_be_json_call("{") and not may_be_json_call("Sure") \
        and not may_be_json_call(" ")


def test_the_tool_parser_route_puts_the_clients_context_into_extra_args():
    class Model:  # stands in for vLLM's pydantic request parts
        def model_dump(self, mode, exclude_none):
            return {"type": "function", "function": WEATHER["function"]}

    one_shot = iter([{"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}])
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "tool_calls": one_shot}]
    xargs = xargs_with_context({"keep": 1}, [Model()], messages, "auto")
    ctx = context_from_extra_args(xargs)
    assert xargs["keep"] == 1 and [t.name for t in ctx.tools] == ["get_weather"] and ctx.tool_choice == "auto"
    assert ctx.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert xargs_with_context(None, None, messages) == {}  # no tools: nothing to draft from, nothing sent
    own = {"oospec": context_json([WEATHER], None, dialect="apibank")}
    assert xargs_with_context(own, [Model()], messages) == own  # what the client sent itself is kept


def test_the_context_log_says_where_each_requests_context_came_from(smollm2_path, tok_module, tmp_path):
    log = tmp_path / "context.jsonl"
    proposer = OospecProposer(vllm_config(str(smollm2_path)))
    proposer.settings = DraftingSettings.from_env({"OOSPEC_VLLM_CONTEXT_LOG": str(log)})
    runner = FakeRunner(proposer)
    runner.load_model()
    runner.drafter.batch.sidecar = SilentSidecar()
    runner.add("sent", tool_script(tok_module))
    runner.add("read", tool_script(tok_module, city="Oslo", with_context=False))
    runner.step()
    lines = {d["req_id"]: d for d in map(json.loads, log.read_text().splitlines())}
    assert lines["sent"]["source"] == "extra_args" and lines["read"]["source"] == "prompt"
    assert lines["sent"]["tools"] == lines["read"]["tools"] == ["get_weather"]
    assert lines["sent"]["messages"] == [{"role": "user", "content": "What is the weather in Paris in celsius?"}]
    runner.finish("sent")
    runner.step()
    end = [d for d in map(json.loads, log.read_text().splitlines()) if "sidecar" in d]
    assert [d["req_id"] for d in end] == ["sent"]
    sidecar = end[0]["sidecar"]  # its job went out (vLLM's sidecar has its own cores: always), no answer came
    assert sidecar["submitted"] and sidecar["schedule"]["run"] and set(sidecar) == {"submitted", "schedule"}


def test_bench_vllm_runs_none_first_and_the_concurrent_subset(monkeypatch, tmp_path):
    """Which settings run at which concurrency, and in which order (none first: the oracle reads its output)."""
    from types import SimpleNamespace

    from oospec.bench import vllm as bench
    from oospec.bench.items import BenchError, Selection

    ran = []

    def fake_run(setting, conc, args, out, reference, held_out_only):
        ran.append((setting, conc, reference.name if reference else None))
        path = out / f"{setting}@{conc}.json"
        item = {"dataset": "apibank", "tokens": [1, 2] if setting != "ngram" else [1, 3], "e2e_s": 1.0,
                "decode_s": 0.5, "tau": 1.0}
        path.write_text(json.dumps({"wall_s": 1.0, "items": {"a": item}}))
        return path

    monkeypatch.setattr(bench, "run_setting", fake_run)
    monkeypatch.setattr(bench, "plot", lambda summary, path: None)
    args = SimpleNamespace(settings="oracle,ngram,none", concurrent_settings="ngram", concurrency=8, out=str(tmp_path))
    bench.run(args, Selection(datasets=["apibank:1"], limit=1))
    assert ran == [("none", 1, None), ("oracle", 1, "none@1.json"), ("ngram", 1, "none@1.json"),
                   ("none", 8, None), ("ngram", 8, "none@8.json")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["apibank"]) == {"none", "oracle", "ngram", "none@8", "ngram@8"}
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {(r["method"], r["identical"], r.get("first_diff")) for r in records} == {
        ("none", True, None), ("oracle", True, None), ("ngram", False, 1), ("none@8", True, None),
        ("ngram@8", False, 1)}  # the records of every benchmark (oospec.bench.records)
    with pytest.raises(BenchError, match="unknown setting"):
        bench.parse_settings("none,eagle")
    with pytest.raises(BenchError, match="no dataset given"):  # the item options of every bench, checked first
        bench.run(args, Selection())


def test_a_settings_process_parses_the_options_it_is_given_as_the_bench_did(tmp_path):
    """One parser for `bench vllm` and each setting's process: the options come back the same."""
    from oospec.bench import vllm as bench
    from oospec.cli import build_parser

    argv = ["bench", "vllm", "--model", "m", "--dataset", "apibank:1", "--dataset", "bfcl:simple_python",
            "--data", "x.jsonl", "--items", "a,b", "--offset", "3", "--limit", "4", "--dtype", "bfloat16", "--k", "5",
            "--max-new-tokens", "9", "--max-model-len", "2048", "--enforce-eager"]
    parent = build_parser().parse_args(argv)
    cmd = bench.setting_command("oracle", 8, parent, tmp_path / "o.json", tmp_path / "none.json", held_out_only=True)
    assert cmd[1:5] == ["-m", "oospec", "bench", "vllm"]
    child = build_parser().parse_args(cmd[3:])
    for name, _ in bench.PASSED_ON:
        assert getattr(child, name) == getattr(parent, name), name
    assert (child.setting, child.concurrency, child.held_out_only, child.reference) == \
        ("oracle", 8, True, str(tmp_path / "none.json"))
    defaults = build_parser().parse_args(["bench", "vllm", "--model", "m"])
    assert (defaults.dtype, defaults.concurrency, defaults.limit, defaults.offset) == ("float32", 8, None, 0)


def test_bench_vllm_resume_reuses_only_a_run_made_the_same_way(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from oospec.bench import vllm as bench
    from oospec.bench.vllm_run import run_identity

    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, check: calls.append(cmd))
    args = SimpleNamespace(model="m", dataset=["apibank:1"], limit=20, offset=8, dtype="float32", k=8, max_new_tokens=128,
                           enforce_eager=True, resume=True, concurrency=8)
    same = {**run_identity(SimpleNamespace(**{**vars(args), "setting": "none", "concurrency": 1})), "items": {}}
    (tmp_path / "none@1.json").write_text(json.dumps(same))
    assert bench.run_setting("none", 1, args, tmp_path, None) == tmp_path / "none@1.json" and not calls
    (tmp_path / "none@1.json").write_text(json.dumps({**same, "limit": 5}))  # another run: not reused
    bench.run_setting("none", 1, args, tmp_path, None)
    assert len(calls) == 1 and "--offset" in calls[0]
    (tmp_path / "none@1.json").write_text(json.dumps(same))
    bench.run_setting("none", 1, args, tmp_path, None, held_out_only=True)  # other items: not reused
    assert len(calls) == 2 and "--held-out-only" in calls[1]
    args.resume = False  # without --resume nothing is reused
    bench.run_setting("none", 1, args, tmp_path, None)
    assert len(calls) == 3


def test_a_custom_proposer_is_named_by_module_path_and_stays_out_of_the_bench(tmp_path, capsys):
    """The real-vLLM tests run their hostile proposer (random_proposer.py, beside this file) as one setting."""
    from oospec.bench import vllm as bench
    from oospec.bench import vllm_run as run
    from oospec.bench.items import BenchError
    from oospec.cli import main

    spec = run.speculative_config(run.CUSTOM, 8, "random_proposer.RandomProposer")
    assert spec == {"method": "custom_class", "model": "random_proposer.RandomProposer", "num_speculative_tokens": 8}
    from random_proposer import RandomProposer  # what vLLM's worker imports by that name

    assert RandomProposer.__module__ == "random_proposer"
    for argv in (["--setting", "custom"], ["--setting", "none", "--proposer", "random_proposer.RandomProposer"]):
        assert main(["bench", "vllm", *argv, "--model", "m", "--dataset", "apibank:1",
                     "--out", str(tmp_path / "x.json")]) == 2
        assert "--proposer goes with --setting custom" in capsys.readouterr().err
    with pytest.raises(BenchError, match="unknown setting"):
        bench.parse_settings("none,custom")
