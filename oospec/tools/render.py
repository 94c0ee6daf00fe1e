"""A tool call's JSON text as the target writes it: its dialect's arguments key, in its learned whitespace.

The one renderer of a call object. Dialects render with the default `Style` (what chat templates' `tojson`
writes: `", "` and `": "`, nothing inside braces); the schema and sidecar drafters render pieces of a call, or
the rest of one, in the whitespace the call scanner has learned from the target.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oospec.tools.schema import Param, Tool

# What a value of each JSON type starts with, written before the value itself is known.
VALUE_OPENERS = {"string": '"', "array": "[", "object": "{"}


def to_json(value: Any) -> str:
    """JSON as chat templates' ``tojson`` filter writes it."""
    return json.dumps(value, ensure_ascii=False)


@dataclass
class Style:
    """Whitespace the target writes around JSON punctuation, by nesting depth (1: the call object)."""

    after: dict[tuple[str, int], str] = field(default_factory=dict)  # (punctuation, depth) -> whitespace
    before_close: dict[int, str] = field(default_factory=dict)

    def ws(self, punct: str, depth: int) -> str:
        default = " " if punct in ",:" else ""
        return self.after.get((punct, depth), self.after.get((punct, 0), default))

    def close(self, depth: int) -> str:
        return self.before_close.get(depth, "")


class CallRenderer:
    """`{"name": ..., "<args key>": {...}}` and its pieces, in a `Style`."""

    def __init__(self, style: Style | None = None, args_key: str = "arguments"):
        self.style = style if style is not None else Style()
        self.args_key = args_key

    def call(self, name: str, arguments: Mapping[str, Any], tool: Tool | None = None) -> str:
        """The whole call: arguments in their own order, or, given the tool, in its schema order (see `slots`)."""
        return self.head(name) + self.slots(arguments, tool, first_sep=self.style.ws("{", 2))

    def start(self) -> str:
        """Up to the function name's opening quote."""
        ws = self.style.ws
        return "{" + ws("{", 1) + '"name":' + ws(":", 1) + '"'

    def args_open(self) -> str:
        """From after the function name's closing quote through the arguments object's `{`."""
        ws = self.style.ws
        return "," + ws(",", 1) + to_json(self.args_key) + ":" + ws(":", 1) + "{"

    def head(self, name: str) -> str:
        return self.start() + to_json(name)[1:-1] + '"' + self.args_open()

    def key(self, name: str, depth: int = 2) -> str:
        return to_json(name) + ":" + self.style.ws(":", depth)

    def value(self, v: Any) -> str:
        ws = self.style.ws
        return json.dumps(v, ensure_ascii=False, separators=("," + ws(",", 3), ":" + ws(":", 3)))

    def item(self, key: str, v: Any) -> str:
        return self.key(key) + self.value(v)

    @staticmethod
    def value_open(param: Param | None) -> str:
        return "" if param is None else VALUE_OPENERS.get(param.type, "")

    def close(self) -> str:
        """The arguments' and the call's closing braces."""
        return self.style.close(2) + "}" + self.style.close(1) + "}"

    def slots(self, arguments: Mapping[str, Any], tool: Tool | None = None, written=frozenset(),
              first_sep: str | None = None) -> str:
        """The argument items not yet `written`, then the closing braces. Given the tool, in its schema order,
        and a required slot without a value ends the text after its key: the value is the target's to write."""
        order = [p.name for p in tool.parameters] if tool is not None else list(arguments)
        required = tool.required if tool is not None else ()
        out = []
        for key in order:
            if key in written:
                continue
            sep = first_sep if first_sep is not None and not out else "," + self.style.ws(",", 2)
            if key in arguments:
                out.append(sep + self.item(key, arguments[key]))
            elif key in required:
                out.append(sep + self.key(key))
                return "".join(out)
        return "".join(out) + self.close()
