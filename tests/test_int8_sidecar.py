"""The sidecar in int8 on a CPU: quantized linear layers, the drafter rule that picks it by measurement, and the
precision a running sidecar reports (the key its job times are kept under)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model
from sidecar_fakes import FakePredictor  # noqa: F401 (the factory module the client's child imports)
from test_bf16_equivalence import CPUINFO_AMX, CPUINFO_AVX2, CPUINFO_AVX512, CPUINFO_BF16

from oospec.models.cpu_features import DRAFTER_DTYPES, cpu_flags, drafter_dtype
from oospec.models.int8 import INT8_MARGIN, Int8Linear, int8_available, job_seconds, quantize_int8
from oospec.sidecar.predictor import SidecarPredictor
from oospec.sidecar.process import SidecarClient
from oospec.sidecar.protocol import Job, parse_payload
from oospec.tools.schema import tools_from_openai

needs_int8 = pytest.mark.skipif(not int8_available(), reason="this torch cannot multiply int8 on the CPU")

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}]


def test_int8_is_available_on_every_x86_cpu_this_project_runs_on():
    # AVX2, AVX-512 and AMX machines all multiply int8 in torch 2.13; a silent fallback would hide a slow sidecar.
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert int8_available()


@needs_int8
def test_quantized_model_keeps_its_predictions(tiny):
    model = tiny_model(tiny.config.model_type)  # a fresh copy: quantization is in place
    ids = torch.randint(1, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before = model(ids).logits
        quantize_int8(model)
        after = model(ids).logits
    assert not any(type(m) is torch.nn.Linear for m in model.modules())  # every linear layer, lm_head too
    # int8 rounds: close, not equal (a random model's near-flat logits make the argmax too fragile to compare;
    # the real model's tokens are compared below).
    assert not torch.equal(before, after)
    cos = torch.nn.functional.cosine_similarity(before.flatten(), after.flatten(), dim=0).item()
    assert cos > 0.98, cos
    with pytest.raises(RuntimeError, match="float32"):
        quantize_int8(tiny_model(tiny.config.model_type).to(torch.bfloat16))


@pytest.mark.parametrize("cpuinfo, float_dtype", [(CPUINFO_AVX2, "float32"), (CPUINFO_AVX512, "float32"),
                                                  (CPUINFO_BF16, "bfloat16"), (CPUINFO_AMX, "bfloat16")])
def test_drafter_rule_takes_int8_only_where_it_measures_faster(cpuinfo, float_dtype):
    flags = cpu_flags(cpuinfo)
    timed = []

    def times(int8_s: float, float_s: float):
        def job(dtype: str) -> float:
            timed.append(dtype)
            return int8_s if dtype == "int8" else float_s
        return job

    assert drafter_dtype("cpu", flags, times(1.0, 2.0)) == "int8"
    assert set(timed) == {"int8", float_dtype}  # compared with the float precision this CPU would take
    assert drafter_dtype("cpu", flags, times(1.0, INT8_MARGIN * 0.99)) == float_dtype  # a near tie: no change
    assert drafter_dtype("cpu", flags, times(2.0, 1.0)) == float_dtype  # AMX's bfloat16 may well win
    assert drafter_dtype("cuda:0", flags, times(1.0, 9.0)) == "bfloat16"  # int8 is a CPU precision here


@needs_int8
def test_job_timings_are_measured_in_each_precision():
    seconds = {d: job_seconds(d, repeats=1) for d in ("float32", "int8")}
    assert all(0 < s < 30 for s in seconds.values()), seconds
    assert drafter_dtype("cpu") in DRAFTER_DTYPES


@needs_int8
def test_int8_predictor_answers_a_job(smollm2_path):
    predictor = SidecarPredictor.from_pretrained(smollm2_path, dtype="int8")
    assert predictor.precision == "int8"
    job = Job("r1", [{"role": "user", "content": "What's the weather in Paris for the next 3 days?"}], WEATHER,
              chat_tools=WEATHER, opener="<tool_call>\n")
    payload = parse_payload(predictor.predict(job), "r1", tools_from_openai(WEATHER))
    # The quantized model reads text as the float32 one does: where float32 is confident of the next token
    # (p > 0.5), int8 names the same one (torch's per-tensor dynamic quantization: ~70% here, see the module).
    exact = SidecarPredictor.from_pretrained(smollm2_path, dtype="float32")
    ids = torch.tensor([exact.format.encode(exact.format.prompt(job) + '<tool_call>\n{"name": "get_weather", '
                                            '"arguments": {"city": "Paris", "days": 3}}\n</tool_call>')])
    with torch.inference_mode():
        ref, got = exact.model(ids).logits[0], predictor.model(ids).logits[0]
    confident = ref.softmax(-1).amax(-1) > 0.5
    agree = (ref.argmax(-1) == got.argmax(-1))[confident].float().mean().item()
    assert confident.sum() >= 10 and agree >= 0.95, (int(confident.sum()), agree)
    assert payload.best.function == "get_weather" and not payload.dropped
    assert set(payload.best.arguments) <= {"city", "days"}
    with pytest.raises(ValueError, match="CPU precision"):
        SidecarPredictor.from_pretrained(smollm2_path, dtype="int8", device="cuda:0")


def test_speed_key_names_the_precision_the_worker_resolved():
    """Job times measured in int8 must not be read back for a bfloat16 sidecar: "auto" is resolved in the
    worker, which reports it when ready."""
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good", "precision": "int8",
                                                                          "dtype": "auto"}) as client:
        assert client.precision == "int8"
        assert '"dtype": "int8"' in client.speed_key() and '"auto"' not in client.speed_key()
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good"}) as client:
        assert client.precision is None and "dtype" not in client.speed_key()


@needs_int8
def test_int8_linear_matches_the_float_product_and_takes_any_rows():
    linear = torch.nn.Linear(48, 40)
    q = Int8Linear(linear)
    x = torch.randn(3, 5, 48)
    exact = linear(x).detach()
    got = q(x)
    assert got.shape == exact.shape == (3, 5, 40)
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()  # ~1/127 of the scale, per operand
    assert q(torch.randn(0, 48)).shape == (0, 40)
    # One row's result does not depend on the rows beside it (each row has its own activation scale).
    assert torch.equal(q(x[:1, :1]), q(x)[:1, :1])
