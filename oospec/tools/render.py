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
    """Whitespace the target writes around JSON punctuation, by nesting depth (1: the call object).

    Two ways to know it: what the target wrote at each (punctuation, depth) so far, and, once it is seen to
    pretty-print (a newline and `k * depth` spaces after an opening brace or a comma, as `json.dumps(indent=k)`
    writes), the indentation rule, which also covers depths and closing braces not seen yet. The newest
    observation decides which applies, so a target whose last request was compact and whose new one is
    pretty-printed (another client's prompt) is followed from its first indented line."""

    after: dict[tuple[str, int], str] = field(default_factory=dict)  # (punctuation, depth) -> whitespace
    before_close: dict[int, str] = field(default_factory=dict)
    indent: int | None = None  # spaces a level while the target pretty-prints; None: it writes inline

    def learn_after(self, punct: str, depth: int, ws: str, in_object: bool = True) -> None:
        """`ws` came after `punct` at `depth`; `in_object`: a key follows (inline arrays inside a pretty-printed
        call are common, so only objects decide whether the target pretty-prints)."""
        self.after[(punct, depth)] = ws
        if punct in "{," and depth > 0 and in_object:
            spaces = ws[1:] if ws.startswith("\n") else None
            pretty = spaces is not None and spaces.strip(" ") == "" and len(spaces) > 0 and len(spaces) % depth == 0
            self.indent = len(spaces) // depth if pretty else None

    def learn_close(self, depth: int, ws: str) -> None:
        self.before_close[depth] = ws

    def ws(self, punct: str, depth: int) -> str:
        if self.indent and punct in "{[,":
            return "\n" + " " * (self.indent * depth)
        default = " " if punct in ",:" else ""
        return self.after.get((punct, depth), self.after.get((punct, 0), default))

    def close(self, depth: int) -> str:
        if self.indent:
            return "\n" + " " * (self.indent * (depth - 1))
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

    def value(self, v: Any, depth: int = 2) -> str:
        """A whole value inside an object at `depth` (2: the arguments)."""
        if self.style.indent:
            # json.dumps(indent=k) indents nested lines from column 0; the value's own lines start `depth` levels in.
            text = json.dumps(v, ensure_ascii=False, indent=self.style.indent)
            return text.replace("\n", "\n" + " " * (self.style.indent * depth))
        ws = self.style.ws
        return json.dumps(v, ensure_ascii=False, separators=("," + ws(",", depth + 1), ":" + ws(":", depth + 1)))

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
