"""oospec: lossless speculative decoding for tool calls.

    import oospec
    with oospec.load("qwen2.5-coder-1.5b") as pipe:  # method oospec: the shipped sidecar and its adapter
        print(pipe.generate(messages, tools=tools).text)

`oospec.load` (oospec.pipeline) starts the target, its drafter and the sidecar; `oospec.Engine` is the engine alone.
"""

__version__ = "0.1.0"


def __getattr__(name):  # keep `import oospec` light: torch loads only when the engine is used
    if name == "Engine":
        from oospec.engine.engine import Engine

        return Engine
    if name in ("load", "Pipeline"):
        from oospec import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
