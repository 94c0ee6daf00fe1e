"""oospec: lossless speculative decoding for tool calls."""

__version__ = "0.1.0"


def __getattr__(name):  # keep `import oospec` light: torch loads only when the engine is used
    if name == "Engine":
        from oospec.engine.engine import Engine

        return Engine
    raise AttributeError(name)
