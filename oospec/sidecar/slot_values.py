"""Slot values as the sidecar reads them: which values a slot can take, how a value's first token is healed, and a
decoded value as the schema types it."""

from __future__ import annotations

import ast
import json
from typing import Any

import numpy as np

from oospec.tools.schema import Param
from oospec.tools.tokens import TokenBytes

NUMBER_STARTS = {"integer": b"-0123456789", "number": b"-.0123456789"}  # bytes a JSON number can begin with


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


def read_slot(text: str | None, p: Param, required: bool) -> tuple[bool, Any]:
    """(True, value) for a decoded slot the payload can carry; (False, None) for none: nothing decoded, not a value
    of the slot's type, or null for an optional slot (the model says it is left out)."""
    if text is None:
        return False, None
    try:
        value = typed(parse_value(text), p)
    except ValueError:
        return False, None
    return (value is not None or required), value


class FirstTokens:
    """Token healing's first step: a value's first characters merge with the opener before them (` "(`, ` ["`,
    ` -` are single tokens), so a slot row stops one token short and its first value token is one of these."""

    def __init__(self, token_bytes: TokenBytes):
        self.token_bytes = token_bytes
        self._found: dict[tuple[bytes, str], np.ndarray] = {}  # (text left out, slot type) -> token ids

    def __call__(self, left_out: bytes, p: Param) -> np.ndarray | None:
        """The tokens a healed row of slot `p` may start with: those that begin with the text left out and go on
        the way a value of the slot's type can (a number slot's is no quote: without the opener in the row, the
        model would otherwise be free to write the slot as a string, which the payload drops). None: any."""
        if not left_out:
            return None
        key = (left_out, p.type)
        found = self._found.get(key)
        if found is None:
            found = self.token_bytes.starting_with(left_out)
            starts = NUMBER_STARTS.get(p.type)
            if starts is not None:  # the rest of the token: nothing, or a number's first byte
                rest = [self.token_bytes(t)[len(left_out):len(left_out) + 1] for t in found.tolist()]
                found = found[np.array([r in starts for r in rest], dtype=bool)]
            self._found[key] = found
        return found
