"""What this CPU computes natively in bfloat16 (AVX512_BF16 or AMX), and the dtype `--dtype auto` means.

`auto_dtype` is the one rule behind every `--dtype auto`: bfloat16 on CUDA, **float32 on every CPU**. bfloat16
on a CPU is used only when asked for (`--dtype bfloat16`), because there it is not lossless for speculative
decoding on the CPUs where it would pay: on a Xeon with AMX and AVX512_BF16 (torch 2.13, 2026-12-02) oneDNN's
bfloat16 GEMM gives a row a result that depends on how many rows are multiplied with it (2-21 of the 64 x N
outputs differ from the same rows multiplied one at a time, for Qwen2.5-0.5B's projection shapes), so a
k-token verification forward does not rank tokens as a 1-token forward does, and
`tests/test_bf16_equivalence.py` catches speculative output that differs from bfloat16 greedy decoding.
(With oneDNN off, torch's own bfloat16 GEMM is row-invariant but slower than float32, and attention still
differs.) Where bfloat16 is only emulated (AVX2, AVX-512 without BF16) it converts to float32 inside and is
slower than float32 itself. `native_bf16` still says what the CPU can do, for reports and for that warning.
"""

from __future__ import annotations

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


@lru_cache(maxsize=1)
def this_cpu_flags() -> frozenset[str]:
    return cpu_flags()
