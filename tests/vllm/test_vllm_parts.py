"""The parts of oospec.integrations.vllm around the proposer: the pinned sidecar, the oracle, the bench summary.
No vLLM needed (runs in `make test`)."""

import json
import os
import time

import numpy as np
import pytest

from fake_runner import FakeRunner, tool_script, vllm_config
from oospec.integrations.vllm.batch import DraftingSettings
from oospec.integrations.vllm.bench import summarize
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
                           "identical_rate": 1.0, "throughput_tok_s": 0.3}
    assert s["ngram"]["identical_rate"] == 0.0 and s["none"]["e2e_speedup"] == 1.0
