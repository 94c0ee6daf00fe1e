"""Real vLLM: speculation with oospec's proposer, and with an adversarial one, changes no token at temperature 0.

Run by `make test-vllm` (in .venv-vllm). The file's name does not match `test_*.py`, so `make test` (the
main venv, no vLLM) never collects it; pytest collects it when it is named on the command line. Run there
without vLLM, it skips with the reason (so does no other path: in .venv-vllm every failure is a failure).

Qwen2.5-Coder-0.5B in float32, 11 API-Bank level-1 and 11 BFCL simple chats, one request at a time, each
setting in its own process (oospec.integrations.vllm.run).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import vllm  # noqa: F401
except ImportError:
    pytest.skip("vLLM is not installed in this interpreter; these checks run in .venv-vllm: `make test-vllm`",
                allow_module_level=True)

MODEL = Path.home() / ".cache/oospec/models/qwen2.5-coder-0.5b"
PER_DATASET = 11
DATASETS = ("apibank:1", "bfcl:simple_python")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    if not MODEL.is_dir():
        pytest.fail(f"{MODEL} is missing: `oospec models pull qwen2.5-coder-0.5b` first", pytrace=False)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    out = {}
    for spec in ("none", "oospec", "adversarial"):
        path = tmp_path_factory.mktemp("vllm") / f"{spec}.json"
        cmd = [sys.executable, "-m", "oospec.integrations.vllm.run", "--setting", spec, "--model", str(MODEL),
               "--limit", str(PER_DATASET), "--max-tokens", "96", "--out", str(path)]
        for name in DATASETS:
            cmd += ["--dataset", name]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"{spec}: vLLM run failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        out[spec] = json.loads(path.read_text())
    return out


def test_the_chats_ran(outputs):
    base = outputs["none"]["items"]
    assert len(base) == PER_DATASET * len(DATASETS) and all(it["tokens"] for it in base.values())


@pytest.mark.parametrize("spec", ["oospec", "adversarial"])
def test_identical_token_ids_to_no_speculation(outputs, spec):
    base, got = outputs["none"]["items"], outputs[spec]["items"]
    differ = [k for k in base if k not in got or base[k]["tokens"] != got[k]["tokens"]]
    assert not differ, f"{spec}: {len(differ)}/{len(base)} chats differ: {differ[:5]}"
