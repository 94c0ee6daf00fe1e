"""A parameter dictionary written inside prose, as API-Bank and ToolAlpaca describe their tools."""

from __future__ import annotations

import ast
import json

from oospec.errors import SchemaError
from oospec.tools.jsonscan import bracket_end


def literal_dict(text: str, where: str) -> dict:
    """The first ``{...}`` in ``text``, read as JSON or else as a Python literal."""
    start = text.find("{")
    if start < 0:
        raise SchemaError(f"{where}: no parameter dictionary found")
    end = bracket_end(text, start)
    if end is None:
        raise SchemaError(f"{where}: unbalanced parameter dictionary {text[start:start + 80]!r}")
    raw = text[start:end]
    try:
        value = json.loads(raw)
    except ValueError:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError) as e:
            raise SchemaError(f"{where}: cannot read parameter dictionary {raw[:80]!r}: {e}") from None
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: parameters must be a dictionary, got {type(value).__name__}")
    return value


__all__ = ["literal_dict"]
