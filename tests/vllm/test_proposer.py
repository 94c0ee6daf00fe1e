"""OospecProposer against a fake vLLM runner (fake_runner.py): no vLLM needed, runs in `make test`.

What vLLM requires of a custom_class proposer (one list per row, at most K Python ints, empty allowed), and
what oospec's per-request state must survive: rows that do not decode, skipped steps, preemption, finishing,
id reuse, the end of the model's context, and a drafter that raises in one row.
"""

import json
import logging

import numpy as np
import pytest

from fake_runner import FakeRunner, SilentSidecar, tool_script, vllm_config
from oospec.engine.budget import CPU_CURVES, CostModel
from oospec.engine.drafting import Candidate
from oospec.integrations.vllm.chain import best_chain
from oospec.integrations.vllm.context import (context_from_extra_args, context_from_prompt, context_json,
                                              template_default_system)
from oospec.integrations.vllm.proposer import OospecProposer
from helpers import WEATHER

K = 8


@pytest.fixture(scope="module")
def tok(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture
def runner(smollm2_path):
    proposer = OospecProposer(vllm_config(str(smollm2_path), k=K))
    r = FakeRunner(proposer)
    r.load_model()
    return r


def run_to_end(runner: FakeRunner, req_id: str, max_steps: int = 500) -> int:
    steps = 0
    while not runner.done(req_id) and steps < max_steps:
        runner.step()
        steps += 1
    return steps


def check_shape(drafts, n_rows):
    assert len(drafts) == n_rows
    for d in drafts:
        assert isinstance(d, list) and len(d) <= K and all(type(t) is int for t in d)


def test_one_list_of_at_most_k_ints_per_row_and_empty_rows(runner, tok):
    for i in range(3):
        runner.add(f"r{i}", tool_script(tok, city=["Paris", "Oslo", "Lima"][i]))
    for _ in range(6):
        drafts = runner.step(decoding={"r0", "r2"})  # r1 is not decoding (e.g. a prefill chunk): no draft
        check_shape(drafts, 3)
        assert drafts[1] == []


def test_schema_drafts_are_accepted_and_the_output_is_the_script(runner, tok):
    script = tool_script(tok)
    runner.add("a", script)
    steps = run_to_end(runner, "a")
    assert runner.tokens("a") == script.prompt + script.output
    # The call's structure and the city copied from the prompt are drafted: far fewer steps than tokens.
    assert runner.accepted["a"] >= len(script.output) // 2
    assert steps < len(script.output) / 2


def test_tools_read_from_the_rendered_prompt_when_the_request_sent_none(runner, tok):
    script = tool_script(tok, with_context=False)
    runner.add("a", script)
    run_to_end(runner, "a")
    assert runner.accepted["a"] >= len(script.output) // 2


def test_context_routes():
    sent = context_from_extra_args({"oospec": {"tools": [WEATHER], "messages": [{"role": "user", "content": "hi"}],
                                               "dialect": "apibank"}})
    assert [t.name for t in sent.tools] == ["get_weather"] and sent.tools_in_prompt
    as_text = context_from_extra_args({"oospec": context_json([WEATHER], None, "auto", "hermes")})
    assert [t.name for t in as_text.tools] == ["get_weather"] and as_text.tool_choice == "auto"
    assert context_from_extra_args({"oospec": "{not json"}) is None
    assert context_from_extra_args(None) is None and context_from_extra_args({"other": 1}) is None
    assert context_from_extra_args({"oospec": {"tools": "not a list", "dialect": "nope"}}).tools is None
    prompt = ("<|im_start|>user\nbook it<|im_end|>\n1. Name: Book\nDescription: d\n"
              "Parameters: {'when': {'type': 'str', 'description': 'x'}}\n")
    ctx = context_from_prompt(prompt)
    assert ctx.dialect == "apibank" and [t.name for t in ctx.tools] == ["Book"]
    assert ctx.messages == [{"role": "user", "content": "book it"}]
    assert context_from_prompt("no tools here").tools is None


def test_the_prompt_route_reads_every_turn_and_leaves_out_what_the_template_added(tok):
    sent = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And the weather in Paris?"}]
    assert context_from_prompt(tok.apply_chat_template(sent, tokenize=False, add_generation_prompt=True),
                               template_default_system(tok)).messages == sent
    default = template_default_system(tok)  # SmolLM2's template writes its own system turn when none is sent
    assert default and default.startswith("You are a helpful AI assistant")
    text = tok.apply_chat_template(sent[1:], tokenize=False, add_generation_prompt=True)
    assert f"<|im_start|>system\n{default}" in text
    assert context_from_prompt(text, default).messages == sent[1:]
    # Qwen's template appends the tool list to the system turn: the tools are read as tools, not as a message.
    qwen = ("<|im_start|>system\nYou are Qwen.\n\n# Tools\n\nYou may call one or more functions.\n<tools>\n"
            + json.dumps(WEATHER) + "\n</tools>\n\nFor each function call, ...<|im_end|>\n"
            "<|im_start|>user\nweather in Oslo?<|im_end|>\n<|im_start|>assistant\n")
    ctx = context_from_prompt(qwen, "You are Qwen.")
    assert [t.name for t in ctx.tools] == ["get_weather"] and ctx.dialect == "hermes"
    assert ctx.messages == [{"role": "user", "content": "weather in Oslo?"}]
    assert context_from_prompt(qwen).messages[0] == {"role": "system", "content": "You are Qwen."}


def test_skipped_steps_and_preemption_keep_the_drafter_in_step(runner, tok):
    script = tool_script(tok)
    runner.add("a", script)
    runner.add("b", tool_script(tok, city="Oslo"))
    runner.step()
    drafter = runner.drafter.batch.states.states["a"].drafter
    runner.step(propose=False)  # vLLM skipped the proposer: the tokens are in the buffer only
    runner.step(propose=False)
    tokens = runner.preempt("a")  # out of the batch, still in runner.requests
    runner.step()  # "b" moved into row 0
    assert "a" in runner.drafter.batch.states.states
    runner.resume("a", tokens)
    runner.step()
    state = runner.drafter.batch.states.states["a"]
    assert state.drafter is drafter and state.seen == len(runner.tokens("a"))
    run_to_end(runner, "a")
    assert runner.tokens("a") == script.prompt + script.output


def test_finish_ends_the_drafter_and_retrieval_learns_the_output(runner, tok):
    runner.add("a", tool_script(tok))
    run_to_end(runner, "a")
    runner.finish("a")
    runner.add("b", tool_script(tok, city="Oslo"))
    runner.step()
    batch = runner.drafter.batch
    assert "a" not in batch.states.states and len(batch.memory.items) == 1


def test_a_reused_id_starts_a_new_drafter(runner, tok):
    runner.add("a", tool_script(tok))
    runner.step()
    first = runner.drafter.batch.states.states["a"].drafter
    runner.finish("a")  # aborted and resubmitted under the same id in the same step: never proposed between
    runner.add("a", tool_script(tok, city="Oslo"))
    runner.step()
    assert runner.drafter.batch.states.states["a"].drafter is not first
    second = runner.drafter.batch.states.states["a"].drafter
    runner.finish("a")  # the same prompt again: its buffer restarts shorter than what the drafter saw
    runner.add("a", tool_script(tok, city="Oslo"))
    runner.step()
    assert runner.drafter.batch.states.states["a"].drafter is not second


def test_no_draft_past_the_models_context(smollm2_path, tok):
    script = tool_script(tok)
    for room in (0, 1, 3):
        proposer = OospecProposer(vllm_config(str(smollm2_path), k=K, max_model_len=len(script.prompt) + 1 + room))
        r = FakeRunner(proposer)
        r.load_model()
        r.add("a", script)
        drafts = r.step()
        check_shape(drafts, 1)
        assert len(drafts[0]) <= room


def test_an_exception_in_one_row_empties_that_row_only_and_is_logged_once(runner, tok, caplog):
    runner.add("good", tool_script(tok))
    runner.add("bad", tool_script(tok, city="Oslo"))
    runner.step()

    def boom(context):
        raise RuntimeError("drafter bug")

    runner.drafter.batch.states.states["bad"].drafter.candidates = boom
    with caplog.at_level(logging.WARNING, logger="oospec.vllm"):
        for _ in range(3):
            drafts = runner.step()
            check_shape(drafts, 2)
            assert drafts[runner.input_batch.req_ids.index("bad")] == []
    assert sum("drafter bug" in r.getMessage() for r in caplog.records) == 1
    run_to_end(runner, "good")
    assert runner.accepted["good"] > 0


def test_a_drafter_starts_when_the_runner_takes_its_request_in_before_the_prefill(runner, tok):
    runner.drafter.batch.sidecar = sidecar = SilentSidecar()
    script = tool_script(tok)
    runner.add("a", script)  # scheduled: no forward and no propose call yet
    state = runner.drafter.batch.states.states["a"]
    assert state.prompt.tolist() == script.prompt and state.seen == len(script.prompt)
    assert [m["content"] for m in sidecar.jobs[0].messages] == ["What is the weather in Paris in celsius?"]
    runner.step()
    assert runner.drafter.batch.states.states["a"] is state  # the first propose continues it
    run_to_end(runner, "a")
    assert runner.tokens("a") == script.prompt + script.output and len(sidecar.jobs) == 1


class RunnerWithoutUpdateStates(FakeRunner):
    """A runner that takes requests in some other way: drafters start at their first propose."""

    _update_states = None

    def add(self, req_id, script):
        FakeRunner._update_states(self, self.scheduled(req_id, script))  # taken in, the proposer not told


def test_without_the_runners_update_hook_drafters_start_at_the_first_propose(smollm2_path, tok, caplog):
    with caplog.at_level(logging.WARNING, logger="oospec.vllm"):
        r = RunnerWithoutUpdateStates(OospecProposer(vllm_config(str(smollm2_path), k=K)))
        r.load_model()
    assert any("no _update_states" in rec.getMessage() for rec in caplog.records)
    script = tool_script(tok)
    r.add("a", script)
    assert "a" not in r.drafter.batch.states.states
    run_to_end(r, "a")
    assert r.tokens("a") == script.prompt + script.output and r.accepted["a"] >= len(script.output) // 2


def test_a_failing_early_start_gives_empty_drafts_and_the_same_output(runner, tok):
    def boom(row):
        raise RuntimeError("start bug")

    runner.drafter.batch.states._start = boom
    script = tool_script(tok)
    runner.add("a", script)
    assert runner.drafter.batch.states.states["a"].failed
    assert all(d == [] for _ in range(3) for d in runner.step())
    run_to_end(runner, "a")
    assert runner.tokens("a") == script.prompt + script.output


def test_best_chain_takes_the_heavier_path_and_cuts_where_it_stops_paying():
    cost = CostModel.from_curve(CPU_CURVES["float32", 2])
    weak = Candidate(np.array([1, 2, 3]), 0.3, 0.8)
    strong = Candidate(np.array([1, 5, 6, 7]), 0.9, 0.97)
    assert best_chain([weak, strong], 8, cost) == [1, 5, 6, 7]
    assert best_chain([weak, strong], 2, cost) == [1, 5]
    assert best_chain([], 8, cost) == [] and best_chain([strong], 0, cost) == []
    # A long, unlikely candidate is cut where its next tokens no longer pay for a wider forward.
    steep = CostModel.from_curve({1: 1.0, 2: 1.5, 64: 40.0})
    assert best_chain([Candidate(np.arange(10, 30), 0.2, 0.5)], 16, steep) == []
    chain = best_chain([Candidate(np.arange(10, 30), 0.99, 0.99)], 16, cost)
    assert 0 < len(chain) <= 16 and all(type(t) is int for t in chain)


def test_the_oracle_proposer_drafts_the_reference_and_logs_nothing(smollm2_path, tok, tmp_path, monkeypatch, caplog):
    """The benchmark's ceiling through the same runner hooks as oospec's proposer (its early start included)."""
    from oospec.integrations.vllm.oracle import OracleProposer

    script = tool_script(tok)
    reference = tmp_path / "none@1.json"
    reference.write_text(json.dumps({"items": {"a": {"prompt_ids": script.prompt, "tokens": script.output}}}))
    monkeypatch.setenv("OOSPEC_VLLM_ORACLE", str(reference))
    with caplog.at_level(logging.WARNING, logger="oospec.vllm"):
        r = FakeRunner(OracleProposer(vllm_config(str(smollm2_path), k=K)))
        r.load_model()
        r.add("a", script)
        steps = run_to_end(r, "a")
    assert r.tokens("a") == script.prompt + script.output
    assert steps <= 2 + len(script.output) // (K + 1)  # K drafted and one bonus token a step
    assert [rec.getMessage() for rec in caplog.records] == []
