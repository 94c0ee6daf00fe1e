"""oospec: lossless speculative decoding for tool calls.

    import oospec
    with oospec.load("qwen2.5-coder-1.5b") as pipe:  # method oospec: the shipped sidecar and its adapter
        print(pipe.generate(messages, tools=tools).text)

`oospec.load` (oospec.pipeline) starts the target, its drafter and the sidecar; `oospec.Engine` is the engine alone.
"""

from importlib.metadata import PackageNotFoundError, version

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
