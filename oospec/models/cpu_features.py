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
from collections.abc import Callable
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


# What a drafter's model may run in: "auto" is `drafter_dtype`'s rule; int8 (oospec.models.int8) only on a CPU.
DRAFTER_DTYPES = ("auto", "float32", "bfloat16", "int8")


def drafter_dtype(device: str, flags: frozenset[str] | None = None,
                  job_seconds: Callable[[str], float] | None = None) -> str:
    """The precision `auto` means for a drafter's model on `device`. CUDA: bfloat16. A CPU: its float precision
    (native bfloat16 where the flags have it, else float32: emulated bfloat16 is slower than float32), or int8
    (oospec.models.int8) where a sidecar-shaped job of products measures at least INT8_MARGIN times faster in
    int8 than in that float precision. `job_seconds(dtype)`: that measurement (default: timed on this CPU once
    per process; where torch cannot multiply int8 there, the float precision without timing)."""
    if str(device).startswith("cuda"):
        return "bfloat16"
    float_dtype = "bfloat16" if native_bf16(flags) else "float32"
    if not str(device).startswith("cpu"):
        return float_dtype
    from oospec.models.int8 import INT8_MARGIN, int8_available, measured_job_seconds

    if job_seconds is None:
        if not int8_available():
            return float_dtype
        import torch

        threads = torch.get_num_threads()
        job_seconds = lambda dtype: measured_job_seconds(dtype, threads)  # noqa: E731
    return "int8" if job_seconds(float_dtype) >= INT8_MARGIN * job_seconds("int8") else float_dtype


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
