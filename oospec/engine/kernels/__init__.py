"""The row-invariant C++ kernels (`invariant.cpp`): built once per processor and torch, loaded on demand.

`native()` returns the compiled module, or None when it cannot be built here (no C++ compiler, say): callers
then use the pure-torch kernels of `oospec.engine.invariant`, which keep the same guarantee at lower speed.
`make venv` builds it (`python -m oospec.engine.kernels`), so no request ever waits for the compiler.

The build is keyed by the sources, the instruction-set flags and the torch version, and kept under
`$OOSPEC_KERNELS_DIR` (default `~/.cache/oospec-kernels`, apart from `$OOSPEC_HOME`, which tests point at
temporary folders).

`$OOSPEC_KERNEL_ISA` (one of `ISA_NAMES`) caps the instruction set a process builds for, so that one machine can
run every lower path's tests (an AMX Xeon checks the AVX-512, AVX2 and scalar kernels too); a level above what
the CPU has is refused, never silently lowered.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

from oospec.models.cpu_features import this_cpu_flags

SOURCE = Path(__file__).with_name("invariant.cpp")
SOURCES = (SOURCE, SOURCE.with_name("linear.cpp"), SOURCE.with_name("gguf_linear.cpp"))
HEADERS = tuple(SOURCE.with_name(h) for h in (
    "lanes.h", "vector_tiles.h", "amx.h", "linear.h", "quants.h", "repack.h", "repack_avx2.h", "transpose.h"))
log = logging.getLogger(__name__)

# Instruction sets the kernels use, the best first: (name, cpuinfo flags required, compiler flags). The names
# are what the built module's isa() reports for that build.
_ISA_LEVELS = (
    ("amx_bf16", ("amx_tile", "amx_bf16", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma", "avx2"),
     ("-mamx-tile", "-mamx-bf16", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx2", "-mfma",
      "-mf16c")),
    ("avx512_bf16", ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma", "avx2"),
     ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx2", "-mfma", "-mf16c")),
    ("avx512f", ("avx512f", "avx512bw", "avx512vl", "fma", "avx2"), ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c")),
    ("avx2", ("avx2", "fma"), ("-mavx2", "-mfma", "-mf16c")),
)
ISA_NAMES = tuple(name for name, _, _ in _ISA_LEVELS) + ("scalar",)
FORCE_ISA_ENV = "OOSPEC_KERNEL_ISA"
# -ffp-contract=off: the compiler may not fuse a multiply and an add the source wrote apart (the order of
# every reduction is the source's, see invariant.cpp).
# -fopenmp: at::parallel_for is inline OpenMP in the headers; without it every kernel runs on one thread.
_BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fopenmp")


def isa_flags(flags: frozenset[str] | None = None, cap: str | None = None) -> tuple[str, ...]:
    """Compiler flags for the best instruction set this CPU has (empty: portable scalar code), at most `cap`
    (default: `$OOSPEC_KERNEL_ISA`, else no cap)."""
    flags = this_cpu_flags() if flags is None else flags
    cap = os.environ.get(FORCE_ISA_ENV) or None if cap is None else cap
    if cap is not None and cap not in ISA_NAMES:
        raise ValueError(f"{FORCE_ISA_ENV}={cap!r}: use one of {', '.join(ISA_NAMES)}")
    allowed = ISA_NAMES[ISA_NAMES.index(cap):] if cap else ISA_NAMES
    best = next((name for name, needed, _ in _ISA_LEVELS if all(f in flags for f in needed)), "scalar")
    if cap and ISA_NAMES.index(cap) < ISA_NAMES.index(best):
        raise ValueError(f"{FORCE_ISA_ENV}={cap!r} asks for more than this CPU has (at best {best!r})")
    return next((cflags for name, needed, cflags in _ISA_LEVELS
                 if name in allowed and all(f in flags for f in needed)), ())


def build_dir() -> Path:
    env = os.environ.get("OOSPEC_KERNELS_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "oospec-kernels"


def build_key() -> str:
    import torch

    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        h.update(path.read_bytes())
    h.update(" ".join(_BASE_FLAGS + isa_flags()).encode())
    h.update(f"{torch.__version__} {sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def native():
    """The compiled kernels module, or None (the reason is logged once) where they cannot be built."""
    if os.environ.get("OOSPEC_PURE_TORCH_KERNELS"):
        return None
    try:
        from torch.utils.cpp_extension import load

        # pip's ninja (a dependency) lives beside this interpreter, which need not be on PATH (.venv/bin/python)
        scripts = str(Path(sys.executable).parent)
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
        key = build_key()
        folder = build_dir() / key
        name = f"oospec_invariant_{key}"
        built = _load_built(folder / f"{name}.so", name)
        if built is not None:
            return built
        folder.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(folder / "lock")
        return load(name=name, sources=[str(p) for p in SOURCES], build_directory=str(folder),
                    extra_cflags=list(_BASE_FLAGS + isa_flags()), extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # no compiler, no ninja, a read-only cache: the pure-torch kernels take over
        log.warning("oospec: the C++ invariant kernels could not be built (%s: %s); using the slower "
                    "pure-torch kernels, which give the same guarantee", type(exc).__name__, str(exc)[:300])
        return None


# A build takes ~1 min; a lock older than this was left by a process killed while it held it.
STALE_LOCK_S = 600


def _load_built(path: Path, name: str):
    """The module of a finished build, imported directly (None: not built, or not loadable here).

    Why not always `cpp_extension.load`: it takes the build folder's lock even to find nothing to rebuild, and a
    process killed while holding it (a Ctrl-C during loading) would leave every later load waiting forever.
    The key names the sources, flags and torch version, so a finished build is the right one."""
    if not path.is_file():
        return None
    import importlib.util

    __import__("torch")  # the module links against libtorch, which this import loads

    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError as exc:  # a partial or foreign file: rebuild over it
        log.warning("oospec: rebuilding the invariant kernels (%s could not be loaded: %s)", path.name, exc)
        return None


def _clear_stale_lock(lock: Path) -> None:
    """Remove a build lock no live build can hold any more (see STALE_LOCK_S), saying so."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        log.warning("oospec: removing a kernel build lock left %.0f s ago by a build that did not finish (%s)",
                    age, lock)
        lock.unlink(missing_ok=True)
