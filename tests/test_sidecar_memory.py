"""The sidecar's memory: rows run in chunks (same results as one batch), its working set grows with the prompt
and not with rows x prompt, and a job over the budget is refused (the client side: test_sidecar_faults.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import tiny_model

from oospec.models.random_init import ARCH_PRESETS
from oospec.sidecar.memory import (CHUNK_BYTES, MEMORY_ENV, ForwardCost, WorkingSetTooLarge, default_memory_budget,
                                   parse_size, physical_memory)
from oospec.sidecar.predictor import SidecarPredictor
from oospec.sidecar.protocol import Job
from oospec.sidecar.rowrunner import RowRunner


def one_parameter_tools(n: int) -> list[dict]:
    out = [{"type": "function", "function": {"name": f"lookup_record_{i}", "description": f"Look up record kind {i}.",
                                              "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                             "required": ["key"]}}} for i in range(n - 1)]
    return out + [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def weather_job(n: int) -> Job:
    """The tools written in the system turn, as API-Bank does (SmolLM2's chat template has no place for them)."""
    tools = one_parameter_tools(n)
    system = "You can call these functions:\n" + "\n".join(json.dumps(t["function"]) for t in tools)
    return Job("m", [{"role": "system", "content": system}, {"role": "user", "content": "What's the weather in Paris?"}],
               tools, opener="<tool_call>\n")


def real_sidecar_chunk(runner: RowRunner) -> int:
    """CHUNK_BYTES scaled to a model's keys and values per token: the tiny model's chunk holds as many prompt
    tokens as the real sidecar's (Qwen2.5-0.5B, float32) does."""
    from transformers import AutoConfig

    spec = dict(ARCH_PRESETS["qwen2.5-0.5b"])
    real = ForwardCost.of(AutoConfig.for_model(spec.pop("model_type"), **spec), 4)
    return CHUNK_BYTES * runner.cost.kv_per_token // real.kv_per_token


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_rows_in_chunks_equal_one_batch_bitwise(arch):
    """Every row's log-probabilities and tokens are bitwise those of the whole batch, in chunks of any size; the
    rows' `stop` and `first` keep their batch indices; the keys and values held shrink with the chunk."""
    model = tiny_model(arch, seed=3)
    rng = np.random.default_rng(0)
    prefix = rng.integers(1, 300, 200).tolist()
    suffixes = [rng.integers(1, 300, int(rng.integers(1, 9))).tolist() for _ in range(11)]
    first = [None if i % 3 else np.arange(40 + i, 90, dtype=np.int64) for i in range(11)]
    stops: dict[int, list] = {}

    def run(chunk_rows: int | None):
        runner = RowRunner(model)
        runner.encode_prefix(prefix)
        if chunk_rows is not None:
            runner.chunk_bytes = runner.cost.row(len(prefix) + 16, 8, len(prefix) + 8, 8) * chunk_rows
        seen = stops.setdefault(chunk_rows, [])

        def stop(i, ids):
            seen.append((i, ids.tolist()))
            return len(ids) >= 2 + i % 5

        lp, gen = runner.run(suffixes, steps=8, keep_all_logits=True, stop=stop, first=first)
        return lp, gen, runner.kv_bytes_peak

    lp, gen, kv = run(None)
    for rows in (1, 3, 5):
        lp_c, gen_c, kv_c = run(rows)
        assert all(np.array_equal(a, b) for a, b in zip(lp, lp_c))
        for i in range(len(suffixes)):  # up to the token its stop accepted: what a row's ids mean
            n = 2 + i % 5
            assert np.array_equal(gen[i, :n], gen_c[i, :n])
        assert sorted(stops[rows]) == sorted(stops[None])
        assert kv_c < kv
    assert gen[0, 0] in first[0] and gen[3, 0] in first[3]


@pytest.fixture(scope="module")
def tiny_predictor(smollm2_tokenizer):
    """A tiny qwen2 with SmolLM2's tokenizer, its rows in chunks of the real sidecar's size (scaled to its keys
    and values per token)."""
    predictor = SidecarPredictor(tiny_model("qwen2", vocab=len(smollm2_tokenizer)), smollm2_tokenizer,
                                 max_value_tokens=8)
    predictor.runner.chunk_bytes = real_sidecar_chunk(predictor.runner)
    return predictor


# 128 (OpenAI's most): 21 s alone, 50 s on a busy machine, nearly all of it tokenizing 2 x 128 rows of a
# 6800-token prompt.
@pytest.mark.parametrize("tools", [1, 16, 64, pytest.param(128, marks=pytest.mark.slow)])
def test_working_set_grows_linearly_with_the_prompt(tiny_predictor, tools):
    """The keys and values held while predicting one job with one-parameter tools stay within twice the prompt
    (the prefix, and one row's copy of it or the previous prefix) plus one chunk. The old runner held a copy of
    the prompt per tool: 65 copies at 64 tools."""
    predictor = tiny_predictor
    chunk = predictor.runner.chunk_bytes
    predictor.clear_cache()
    runner = predictor.runner
    runner.chunk_bytes = chunk
    job = weather_job(tools)
    predictor.predict(job)
    tokens = len(predictor.format.encode(predictor.format.prompt(job))) + 64  # + the longest row
    copies = runner.kv_bytes_peak / (tokens * runner.cost.kv_per_token)
    assert runner.kv_bytes_peak <= 2 * tokens * runner.cost.kv_per_token + chunk, copies
    if tools >= 64:
        assert copies < tools / 4, copies  # a chunk holds a few rows over a long prompt, not one per tool


def test_a_job_over_the_memory_budget_is_refused(smollm2_tokenizer):
    """The budget refuses a long prompt before encoding it, and answers a short one; the message says how to
    change it."""
    model = tiny_model("qwen2", vocab=len(smollm2_tokenizer))
    probe = SidecarPredictor(model, smollm2_tokenizer, max_value_tokens=8)
    probe.predict(weather_job(1))
    budget = 3 * probe.runner.cost.prefix(2000, 2000)  # a prompt of 2000 tokens fits, one of 128 tools does not
    predictor = SidecarPredictor(model, smollm2_tokenizer, max_value_tokens=8, memory_budget=budget)
    assert b'"function":' in predictor.predict(weather_job(1))
    with pytest.raises(WorkingSetTooLarge, match=MEMORY_ENV) as e:
        predictor.predict(weather_job(128))
    assert e.value.kind == "too-large" and predictor.runner.kv_bytes_peak < budget
    predictor.clear_cache()  # the budget survives a fresh runner
    assert predictor.runner.memory_budget == budget


def test_the_memory_budget_setting(monkeypatch):
    assert parse_size("6G") == 6 << 30 and parse_size("512m") == 512 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("2000000") == 2_000_000
    for bad in ("", "-1G", "0", "lots", "6X"):
        with pytest.raises(ValueError, match=MEMORY_ENV):
            parse_size(bad)
    monkeypatch.setenv(MEMORY_ENV, "3G")
    assert default_memory_budget() == 3 << 30
    monkeypatch.delenv(MEMORY_ENV)
    assert 0 < default_memory_budget() < physical_memory()
