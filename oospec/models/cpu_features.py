"""What this CPU computes natively in bfloat16 (AVX512_BF16 or AMX), and what an unprobed `--dtype auto` means.

`auto_dtype` is the rule for models loaded without a probe (tools, HF peers): bfloat16 on CUDA, float32 on a
CPU. `drafter_dtype` is the rule for a drafter's own model (the sidecar): it only proposes, the target decides what
is kept, so it needs no exactness and takes the fastest precision the device computes natively. A *target*'s `--dtype auto` on a CPU is decided by `oospec.engine.precision`: bfloat16 only where the CPU
has it natively (`native_bf16`) and the invariant forward (`oospec.engine.invariant`) passes the bitwise probe.
Stock bfloat16 is not that: oneDNN's native bfloat16 GEMM gives a row a result that depends on how many rows
are multiplied with it (a Xeon with AMX, torch 2.13), and on an AMD EPYC with AVX512_BF16 a verification
forward ranked a token differently from the 1-token forward (a changed BFCL argument). Where bfloat16 is only
emulated (AVX2, AVX-512 without BF16) it converts to float32 inside and is slower than float32 itself.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

# /proc/cpuinfo flags of native bfloat16 arithmetic, the faster first.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of the first processor in `cpuinfo` (default: this machine's /proc/cpuinfo; empty
    where there is none, as on macOS or Windows)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str] | None = None) -> str | None:
    """The flag that gives this CPU native bfloat16 arithmetic ('amx_bf16', 'avx512_bf16'), or None."""
    flags = this_cpu_flags() if flags is None else flags
    return next((flag for flag in BF16_FLAGS if flag in flags), None)


def auto_dtype(device: str) -> str:
    """The dtype `--dtype auto` means on `device`: 'bfloat16' or 'float32' (see the module docstring)."""
    if str(device).startswith("cuda"):
        return "bfloat16"
    return "float32"  # every CPU: see the module docstring for why not bfloat16 where it is native


def drafter_dtype(device: str, flags: frozenset[str] | None = None) -> str:
    """The dtype `auto` means for a drafter's model on `device`: bfloat16 on CUDA and on CPUs with native bfloat16
    (about twice the float32 speed there), float32 on other CPUs (where bfloat16 is emulated and slower)."""
    if str(device).startswith("cuda") or native_bf16(flags):
        return "bfloat16"
    return "float32"


@lru_cache(maxsize=1)
def this_cpu_flags() -> frozenset[str]:
    return cpu_flags()


def cpu_model() -> str:
    """The processor's name (/proc/cpuinfo's "model name"), else what the platform module says."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
