"""The GGUF kernel tests (test_gguf_weights.py) on every instruction-set path this CPU can run, not only its
best: each lower level is built ($OOSPEC_KERNEL_ISA caps the build) and the whole file runs in a process of
its own, as on a CPU that has only that level. The first run builds each level once (about a minute each);
later runs load the builds. On an AMX machine bfloat16 also runs on VDPBF16PS (OOSPEC_NO_AMX), as on a CPU
with AVX512_BF16 and no tiles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oospec.engine.kernels import ISA_NAMES, isa_flags, native

TESTS = Path(__file__).resolve().parent


def levels_here() -> list[str]:
    """The levels below this CPU's best (the best is what the suite's own process tests)."""
    below = []
    for name in ISA_NAMES:
        try:
            isa_flags(cap=name)
        except ValueError:  # more than this CPU has
            continue
        below.append(name)
    return below[1:]


def run_file(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OOSPEC_KERNEL_ISA", "OOSPEC_NO_AMX")} | env_extra
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           str(TESTS / "test_gguf_weights.py")],
                          env=env, cwd=TESTS.parent, capture_output=True, text=True, timeout=1200)


def variants() -> list[dict[str, str]]:
    """Each lower level, and on an AMX build its VDPBF16PS path too."""
    out = [{"OOSPEC_KERNEL_ISA": level} for level in levels_here()]
    if native() is not None and native().isa() == "amx_bf16":
        out.append({"OOSPEC_NO_AMX": "1"})
    return out


@pytest.mark.parametrize("env_extra", variants(), ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()))
def test_gguf_kernels_hold_on_every_lower_instruction_set(env_extra):
    result = run_file(env_extra)
    assert result.returncode == 0, f"{env_extra}:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
