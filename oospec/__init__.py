"""oospec: lossless speculative decoding for tool calls."""

__version__ = "0.1.0"
