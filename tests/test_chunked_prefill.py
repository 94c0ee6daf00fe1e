"""Chunked prefill and the sidecar's threads given back: the same keys, values and logits as one prefill
forward up to float rounding, the same tokens as plain greedy whatever the drafter, and never more threads
than the target's own plus an idle sidecar's."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from adversarial import DecoyOracleDrafter, HugeTreeDrafter, RandomTreeDrafter
from helpers import VOCAB, conversation, decode_request, greedy_reference

from oospec.drafters import make_drafter
from oospec.engine.decode import generate
from oospec.engine.drafting import Drafter
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.target import TargetBackend
from oospec.sidecar import SidecarClient
from oospec.sidecar.protocol import Job

MAX_NEW = 24


def prefill_state(model, prompt: np.ndarray, chunk: int, start_with: int = 0):
    """(logits after the prompt, [(keys, values)] of every layer) from a prefill in `chunk`-token forwards;
    start_with > 0: that many tokens are prefilled first in one forward (as a restored prefix would be)."""
    target = TargetBackend(model, prefill_chunk=chunk)
    target.reset(prompt.size + 8)
    if start_with:
        TargetBackend.prefill_logits(target, prompt[: start_with + 1])  # writes start_with + 1 slots
        for layer in target._layers:
            layer.length = start_with  # keep only the first start_with of them, as load_prefix leaves it
    logits = target.prefill_logits(prompt, start=start_with)
    n = prompt.size
    return logits.clone(), [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in target._layers]


@pytest.mark.parametrize("chunk", [1, 7, 32, 100])
def test_chunks_give_the_kv_and_logits_of_one_forward(tiny, chunk):
    prompt = np.random.default_rng(chunk).integers(2, VOCAB, 100)
    whole_logits, whole_kv = prefill_state(tiny, prompt, 0)
    logits, kv = prefill_state(tiny, prompt, chunk)
    torch.testing.assert_close(logits, whole_logits, rtol=1e-4, atol=1e-4)
    for (k, v), (k0, v0) in zip(kv, whole_kv):
        torch.testing.assert_close(k, k0, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v, v0, rtol=1e-4, atol=1e-4)
    # a chunk size that does not divide the rest of a partly cached prompt
    logits, kv = prefill_state(tiny, prompt, chunk, start_with=13)
    torch.testing.assert_close(logits, whole_logits, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_calls_back_between_chunks_only(tiny):
    target = TargetBackend(tiny, prefill_chunk=10)
    prompt = np.arange(2, 47)
    target.reset(64)
    calls = []
    target.prefill(prompt, between_chunks=lambda: calls.append(target.length))
    assert calls == [10, 20, 30, 40]  # before chunks 2..5, each after the previous one is committed
    assert target.length == prompt.size


def test_prefill_chunk_must_not_be_negative(tiny):
    with pytest.raises(ValueError, match="prefill_chunk"):
        TargetBackend(tiny, prefill_chunk=-1)


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_prefill_with_adversarial_drafters_matches_greedy(tiny, chunk):
    target = TargetBackend(tiny, prefill_chunk=chunk)
    rng = np.random.default_rng(chunk)
    for i in range(4):
        prompt = rng.integers(2, VOCAB, int(rng.integers(2, 70)))
        reference = greedy_reference(tiny, prompt, MAX_NEW)
        for drafter in (make_drafter("ar"), make_drafter("pld"), RandomTreeDrafter(VOCAB, i),
                        HugeTreeDrafter(VOCAB, i), DecoyOracleDrafter(reference, VOCAB, i)):
            out = generate(target, drafter, decode_request(prompt, MAX_NEW, 32))
            assert np.array_equal(out.tokens, reference), f"{drafter.name}, prompt {i}, chunk {chunk}"


def test_chunked_prefill_after_a_restored_prefix_matches_greedy(tiny):
    target = TargetBackend(tiny, prefill_chunk=6)
    cache = PrefixCache(max_bytes=64 << 20, min_tokens=4)
    for i, prompt in enumerate(conversation()):
        out = generate(target, DecoyOracleDrafter(greedy_reference(tiny, prompt, MAX_NEW), VOCAB, i),
                       decode_request(prompt, MAX_NEW), prefix_cache=cache)
        assert np.array_equal(out.tokens, greedy_reference(tiny, prompt, MAX_NEW)), f"turn {i}"


class LendingDrafter(RandomTreeDrafter):
    """Random trees; says its helper is idle (lends `threads`) from its `lend_from`-th question on, and busy
    again from its `busy_from`-th on: as a sidecar whose answer arrives mid-prefill, then gets a follow-up."""

    def __init__(self, threads: int, lend_from: int, busy_from: int = 1 << 30):
        super().__init__(VOCAB, seed=lend_from)
        self.threads, self.lend_from, self.busy_from, self.asked = threads, lend_from, busy_from, 0

    def idle_threads(self) -> int:
        self.asked += 1
        return self.threads if self.lend_from <= self.asked < self.busy_from else 0


def forward_threads(model) -> tuple[list[int], object]:
    """A list that gets torch's thread count at every forward of `model`, and the hook's handle."""
    seen: list[int] = []
    return seen, model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))


def test_threads_are_borrowed_while_the_helper_is_idle_and_given_back(tiny):
    target = TargetBackend(tiny, prefill_chunk=8)
    prompt = np.random.default_rng(5).integers(2, VOCAB, 40)  # 5 chunks
    reference = greedy_reference(tiny, prompt, MAX_NEW)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seen, hook = forward_threads(tiny)
    try:
        # asked once for the cost curve (the threads it will verify on), before chunk 1, then before chunks
        # 2..5: idle from the 4th question, busy again at the 8th
        out = generate(target, LendingDrafter(1, lend_from=4, busy_from=8), decode_request(prompt, MAX_NEW))
        after = torch.get_num_threads()
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert np.array_equal(out.tokens, reference)
    assert seen[:7] == [1, 1, 2, 2, 2, 2, 1]  # chunks 1-2 alone, 3-5 and the first verification borrowed
    assert set(seen[7:]) == {1} and after == 1  # given back while the helper works, and at the end
    assert out.stats.threads_borrowed == 1


def test_drafters_lend_nothing_by_default(tiny):
    target = TargetBackend(tiny, prefill_chunk=8)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seen, hook = forward_threads(tiny)
    try:
        out = generate(target, make_drafter("pld"), decode_request(np.arange(2, 42), MAX_NEW))
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert set(seen) == {1} and out.stats.threads_borrowed == 0
    assert Drafter().idle_threads() == 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks (100 per second)


def test_sidecar_lends_its_threads_only_while_idle_and_does_not_spin():
    job = Job("idle-probe", [{"role": "user", "content": "hi"}],
              [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}])
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good", "delay_s": 0.5},
                       threads=1, ready_timeout_s=120) as client:
        assert client.idle_threads() == 1  # loaded, no job yet
        ticket = client.submit(job, [])
        assert client.idle_threads() == 0  # working on the job
        deadline = time.monotonic() + 30
        while client.idle_threads() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.idle_threads() == 1 and ticket.received_at is not None  # lent once the answer is in
        spent = cpu_seconds(client.pid)
        time.sleep(1.0)
        assert cpu_seconds(client.pid) - spent < 0.05  # the idle worker blocks on its socket: no spinning
    elsewhere = SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good"}, device="cuda:1",
                              ready_timeout_s=120)
    try:
        assert elsewhere.idle_threads() == 0  # a sidecar on another device never held the target's cores
    finally:
        elsewhere.close()


def test_smollm2_chunked_prefill_with_a_real_sidecar_process(smollm2_engine):
    """SmolLM2 with its CPU kernels, prefilled in 32-token chunks, `oospec` drafting with a sidecar process
    that answers in 0.3 s: the target borrows its thread once it is idle, and the tokens are plain greedy's."""
    from oospec.datasets import load_dataset

    engine = smollm2_engine
    sample = load_dataset("apibank", split="1", limit=2)[1]
    prompt = engine.encode(sample.messages, sample.chat_tools())
    assert prompt.size > 4 * 32
    whole = engine.generate(prompt_ids=prompt, max_new_tokens=48)  # plain greedy, one prefill forward
    before, chunk = torch.get_num_threads(), engine.target.prefill_chunk
    torch.set_num_threads(1)
    engine.target.prefill_chunk = 32
    try:
        with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good", "delay_s": 0.3},
                           threads=1, ready_timeout_s=120) as client:
            for _ in range(2):  # the second request: the thread is given back to the sidecar for its new job
                out = engine.generate(sample.request(prompt_ids=prompt, max_new_tokens=48),
                                      drafter=make_drafter("oospec", sidecar=client))
                assert np.array_equal(out.tokens, whole.tokens)
                assert out.stats.threads_borrowed == 1 and torch.get_num_threads() == 1
    finally:
        engine.target.prefill_chunk = chunk
        torch.set_num_threads(before)


def test_bench_oospec_borrows_the_idle_sidecar_thread_and_oospec_own_cores_does_not(smollm2_tokenizer, tmp_path):
    """In `bench run`, `oospec` (1+1 cores) takes the sidecar's thread once the sidecar is idle and still counts
    2 CPU threads; `oospec-own-cores`, the method before the give-back, never takes it. Both stay identical."""
    import json

    from helpers import tiny_model

    from oospec.bench import run as bench_run
    from oospec.bench.config import BenchConfig
    from oospec.engine.engine import Engine

    engine = Engine(tiny_model("llama", vocab=len(smollm2_tokenizer)), smollm2_tokenizer)
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "oospec", "oospec-own-cores"], target="tiny-random",
                      limit=2, max_new_tokens=32, budget=8, out=tmp_path, progress=False, echo=False, threads=1)
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good"}) as client:
        result = bench_run.run_benchmark(cfg, engine=engine, sidecar=client)
    rows = result["summary"]["apibank"]
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    for name in ("oospec", "oospec-own-cores"):
        assert rows[name]["identical_rate"] == 1.0 and rows[name]["cpu_threads"] == 2 and rows[name]["cores"] == "1+1"
    assert all(r["threads_borrowed"] == 0 for r in records if r["method"] == "oospec-own-cores")
    assert any(r["threads_borrowed"] == 1 for r in records if r["method"] == "oospec")
    assert all(r["threads_borrowed"] == 0 for r in records if r["method"] == "ar")
