"""What this CPU computes natively that decides the dtype: bfloat16 dot products (AVX512_BF16 or AMX).

`auto_dtype` is the one rule behind every `--dtype auto`: bfloat16 on CUDA; on a CPU, bfloat16 only where
the processor multiplies bfloat16 natively (there it halves the bytes every forward streams and doubles the
arithmetic rate; measured in issue 17: `ar` 43.5 s in bfloat16 against 51.0 s in float32 on four requests),
float32 everywhere else (AVX2 and plain AVX-512 only emulate bfloat16, by converting to float32 first, which
is slower than float32 itself).
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


def auto_dtype(device: str, flags: frozenset[str] | None = None) -> str:
    """The dtype `--dtype auto` means on `device`: 'bfloat16' or 'float32' (see the module docstring)."""
    if str(device).startswith("cuda"):
        return "bfloat16"
    if str(device).startswith("cpu") and native_bf16(flags) is not None:
        return "bfloat16"
    return "float32"


@lru_cache(maxsize=1)
def this_cpu_flags() -> frozenset[str]:
    return cpu_flags()
