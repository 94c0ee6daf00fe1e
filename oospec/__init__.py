"""oospec: lossless speculative decoding for tool calls.

    import oospec
    with oospec.load("qwen2.5-coder-1.5b") as pipe:  # method oospec: the shipped sidecar and its adapter
        print(pipe.generate(messages, tools=tools).text)

`oospec.load` (oospec.pipeline) starts the target, its drafter and the sidecar; `oospec.Engine` is the engine alone.
"""

import os
from importlib.metadata import PackageNotFoundError, version

# OpenMP threads that finish a product first sleep at once instead of spinning: on a machine shared with other
# programs a spinning thread takes the core a paused one needs, and plain decoding beside one busy process went
# from 1.9x to 4.8x its quiet time per token (the quiet cost of sleeping: about 3%). Read by the OpenMP runtime
# when torch loads it, so it holds when oospec is imported before torch; a value already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    __version__ = version("oospec")  # written once, in pyproject.toml; read from the installed package
except PackageNotFoundError:  # a source tree that was never installed: no version to report
    __version__ = "0+unknown"


def __getattr__(name):  # keep `import oospec` light: torch loads only when the engine is used
    if name == "Engine":
        from oospec.engine.engine import Engine

        return Engine
    if name in ("load", "Pipeline"):
        from oospec import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
