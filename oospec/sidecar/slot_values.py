"""Slot values as the sidecar reads them: which values a slot can take, and a decoded value as the schema types it."""

from __future__ import annotations

import ast
import json
from typing import Any

from oospec.tools.schema import Param


def closed_options(p: Param) -> list:
    """The few values a slot can take, when the schema says so (booleans, enums); [] otherwise."""
    if p.enum:
        return list(p.enum)[:16]
    if p.type == "boolean":
        return [True, False]
    return []


def parse_value(text: str) -> Any:
    """A decoded value: JSON, or the Python literal small models often write instead (single quotes, True,
    None), read as the JSON value it stands for; ValueError if it is neither."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"not a JSON value: {text[:60]!r}") from None

    def plain(v) -> bool:
        if isinstance(v, list):
            return all(plain(x) for x in v)
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        return v is None or isinstance(v, str | int | float | bool)

    if not plain(value):
        raise ValueError(f"not a JSON value: {text[:60]!r}")
    return value


def typed(value: Any, p: Param) -> Any:
    """A decoded value as the schema types it (an integral 3.0 for an integer slot is 3), or ValueError."""
    if value is None:
        return None
    if p.type == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    ok = {"string": str, "integer": int, "number": (int, float), "array": list, "object": dict}.get(p.type)
    if ok is not None and (not isinstance(value, ok) or isinstance(value, bool)):
        raise ValueError(f"{p.name}: {value!r} is not {p.type}")
    return value
