"""`python -m oospec.engine.kernels`: build the invariant kernels now (make venv does), and say which."""

from oospec.engine.kernels import build_dir, native

module = native()
if module is None:
    raise SystemExit("the invariant C++ kernels could not be built here: the pure-torch kernels will be used")
print(f"invariant kernels ready ({module.isa()}) in {build_dir()}")
