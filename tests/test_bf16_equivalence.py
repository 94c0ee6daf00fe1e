"""bfloat16: speculative greedy output is plain greedy output of the same model in the same dtype, whatever the
drafter, on every CPU: the invariant forward (oospec.engine.invariant) gives each verification row the bits of a
1-row forward. Asking for bfloat16 without it on a CPU with native bfloat16 warns (stock kernels are not
batch-invariant there); `--dtype auto` for a target is decided by oospec.engine.precision's probe."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from adversarial import DecoyOracleDrafter, EmptyDrafter, HugeTreeDrafter, RandomTreeDrafter, RepeatDrafter
from helpers import VOCAB, decode_request, greedy_reference, tiny_model

from oospec.drafters import make_drafter
from oospec.engine.decode import generate
from oospec.engine.invariant import install
from oospec.engine.target import TargetBackend
from oospec.models.cpu_features import auto_dtype, cpu_flags, drafter_dtype, native_bf16

MAX_NEW = 24

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny_bf16(request):
    model = tiny_model(request.param).to(torch.bfloat16)
    assert install(model)["applied"]
    return model


def drafters(reference, seed):
    return [make_drafter("ar"), make_drafter("pld"), EmptyDrafter(), RandomTreeDrafter(VOCAB, seed),
            HugeTreeDrafter(VOCAB, seed), DecoyOracleDrafter(reference, VOCAB, seed), RepeatDrafter()]


@pytest.mark.parametrize("budget", [4, 48])
def test_bf16_all_drafters_match_bf16_greedy(tiny_bf16, budget):
    target = TargetBackend(tiny_bf16, prefill_chunk=16)
    assert target.dtype == torch.bfloat16
    rng = np.random.default_rng(budget)
    for i in range(4):
        prompt = rng.integers(2, VOCAB, int(rng.integers(2, 50)))
        reference = greedy_reference(tiny_bf16, prompt, MAX_NEW)
        for drafter in drafters(reference, i):
            out = generate(target, drafter, decode_request(prompt, MAX_NEW, budget))
            assert np.array_equal(out.tokens, reference), f"{drafter.name} diverged on prompt {i}"


def test_bf16_decoy_oracle_is_accepted_deep(tiny_bf16):
    """The oracle must really be accepted many tokens a forward in bfloat16 too, or the test above proves little."""
    target = TargetBackend(tiny_bf16)
    prompt = np.random.default_rng(9).integers(2, VOCAB, 30)
    reference = greedy_reference(tiny_bf16, prompt, MAX_NEW)
    out = generate(target, DecoyOracleDrafter(reference, VOCAB, 1), decode_request(prompt, MAX_NEW, 48))
    assert np.array_equal(out.tokens, reference) and out.stats.tau > 4


def test_smollm2_bf16_matches_bf16_greedy_on_tool_prompts(smollm2_path, smollm2_tokenizer):
    from oospec.datasets import load_dataset
    from oospec.engine.engine import Engine
    from oospec.models.loading import load_model

    model, _ = load_model(smollm2_path, dtype="bfloat16")
    assert install(model)["applied"]
    # One prefill forward, as transformers' generate does: prompts this long take the prefill's stock GEMM,
    # whose rounding depends on the chunking (every method shares the engine's; the reference has its own).
    engine = Engine(model, smollm2_tokenizer, prefill_chunk=0)
    for i, sample in enumerate(load_dataset("apibank", split="1", limit=2)):
        prompt = engine.encode(sample.messages, sample.chat_tools())
        reference = greedy_reference(model, prompt, 32, engine.eos_ids)
        for drafter in (make_drafter("toolspec"), make_drafter("pld"), DecoyOracleDrafter(reference, 49152, i),
                        RandomTreeDrafter(49152, i, max_nodes=24)):
            out = engine.generate(sample.request(prompt_ids=prompt, max_new_tokens=32), drafter=drafter)
            assert np.array_equal(out.tokens, reference), f"{drafter.name} diverged on sample {i}: {out.text!r}"


CPUINFO_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
CPUINFO_AVX512 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512bw avx512_vnni\n"
CPUINFO_BF16 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\nprocessor\t: 1\nflags\t\t: avx2\n"
CPUINFO_AMX = "processor\t: 0\nflags\t\t: avx512f amx_bf16 amx_tile avx512_bf16\n"


def test_native_bf16_is_read_off_the_flags_and_unprobed_auto_stays_float32_on_cpus():
    assert native_bf16(cpu_flags(CPUINFO_AVX2)) is None
    assert native_bf16(cpu_flags(CPUINFO_AVX512)) is None  # AVX-512 without BF16 only emulates it
    assert native_bf16(cpu_flags(CPUINFO_BF16)) == "avx512_bf16"  # the first processor's flags
    assert native_bf16(cpu_flags(CPUINFO_AMX)) == "amx_bf16"
    assert native_bf16(cpu_flags("")) is None  # no /proc/cpuinfo (macOS, Windows)
    # Without a probe (tools, peers) auto is float32 on a CPU; a target's auto is probed (test_invariant.py).
    assert auto_dtype("cpu") == auto_dtype("mps") == "float32"
    assert auto_dtype("cuda:0") == "bfloat16"
    # A drafter's model (the sidecar) takes native bfloat16 wherever the CPU has it, exact or not (where int8 does
    # not measure faster: test_int8_sidecar.py).
    no_faster_int8 = lambda dtype: 1.0  # noqa: E731
    assert [drafter_dtype("cpu", cpu_flags(c), no_faster_int8)
            for c in (CPUINFO_AVX2, CPUINFO_AVX512, CPUINFO_BF16, CPUINFO_AMX)] \
        == ["float32", "float32", "bfloat16", "bfloat16"]
    assert drafter_dtype("cuda", cpu_flags(CPUINFO_AVX2)) == "bfloat16"


def test_auto_dtype_of_this_machine_reaches_load_model(smollm2_path):
    from oospec.models.loading import load_model

    model, _ = load_model(smollm2_path, dtype="auto")
    assert next(model.parameters()).dtype == torch.float32


def test_bf16_without_the_invariant_kernels_on_a_native_bf16_cpu_warns(smollm2_path, monkeypatch):
    from oospec.engine.precision import load_target
    from oospec.models import cpu_features
    from oospec.models.loading import BatchVarianceWarning

    monkeypatch.setattr(cpu_features, "this_cpu_flags", lambda: cpu_flags(CPUINFO_AMX))
    with pytest.warns(BatchVarianceWarning, match="invariant kernels"):
        load_target(smollm2_path, dtype="bfloat16", optimize=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchVarianceWarning)
        model, _, _ = load_target(smollm2_path, dtype="bfloat16")  # the invariant kernels: no warning
        assert model.oospec_invariant["applied"]
    monkeypatch.setattr(cpu_features, "this_cpu_flags", lambda: cpu_flags(CPUINFO_AVX2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchVarianceWarning)
        load_target(smollm2_path, dtype="bfloat16", optimize=False)  # emulated bfloat16: stock kernels, no warning
