"""How a target model writes tool calls (so a drafter can propose the exact text) and how to read them back.

The table (`DIALECTS`) owns, per dialect, every fact about its calls' text: the openers a target writes before a
call object, the closer each opener asks for (`CLOSERS`), the arguments key, what a reply that must call starts
with, how calls are rendered (`render`, through the one call renderer, `tools/render.py`) and how they are read
back (`parse`, through the one extractor below). Dialects:

- ``hermes``: Qwen2.5 / Hermes ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, byte-for-byte
  what the Qwen2.5 chat template renders for an assistant message with ``tool_calls``; several calls are
  separate blocks joined by a newline.
- ``apibank``: ToolSpec's prompt format, ``<tool_call>\\n{"name": ..., "parameters": {...}}\\n</tool_call>``
  with several calls one JSON object per line inside a single block (as the prompt's output format asks and
  as earlier calls appear in the dialogue history).
- ``llama3_json``: Llama-3.1/3.2 JSON tool calls, ``{"name": ..., "parameters": {...}}`` (several joined by ``; ``).
- ``pythonic``: Python call syntax, ``[func(a=1, b="x"), other(c=[1, 2])]``, parsed with ``ast``.

JSON is written as chat templates' ``tojson`` writes it: ``json.dumps(..., ensure_ascii=False)`` with
``", "`` and ``": "`` separators, keys in insertion (schema) order. Parsers are lenient: they find calls
inside prose, code fences and ``<tool_call>`` wrappers, accept ``arguments``/``parameters`` either as an
object or a JSON string, and fall back to Python-literal dicts (single quotes).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from oospec.tools.jsonscan import bracket_end
from oospec.tools.pythonic import detuple, parse_call_expr, parse_call_list, py_literal
from oospec.tools.render import CallRenderer
from oospec.tools.schema import Param, Tool

# Wrappers a target may put around its calls, whatever its dialect: the opener and the closer it asks for.
CLOSERS = {"<tool_call>\n": "\n</tool_call>", "```json\n": "\n```", "```\n": "\n```"}
CALL_OPENERS = (*CLOSERS, "")  # every wrapper a target is known to put before a call object ("": none)
CALL_TAG = "<tool_call>"  # where a call region begins in a reply, in any dialect

# --------------------------------------------------------------------------------------------------
# ToolCall
# --------------------------------------------------------------------------------------------------


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    def to_openai(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of an assistant message, as chat templates expect it."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        """From ``{"name", "arguments"|"parameters"}``, OpenAI ``{"function": {...}}`` (arguments may be a JSON string)
        or ``{"func": {args}}`` (the function's name as the key)."""
        call = _call_from_obj(d)
        if call is None and isinstance(d, Mapping) and len(d) == 1:
            (name, args), = d.items()
            if isinstance(args, Mapping):
                call = ToolCall(str(name), dict(args))
        if call is None:
            raise ValueError(f"not a tool call: {d!r:.120}")
        return call


def _as_calls(call: ToolCall | Sequence[ToolCall]) -> list[ToolCall]:
    if isinstance(call, ToolCall):
        return [call]
    calls = list(call)
    for c in calls:
        if not isinstance(c, ToolCall):
            raise TypeError(f"expected ToolCall, got {type(c).__name__}")
    return calls


# --------------------------------------------------------------------------------------------------
# Lenient extraction helpers
# --------------------------------------------------------------------------------------------------

_DECODER = json.JSONDecoder()


def _loads_lenient(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    # JSON with Python-ish constants, or Python with JSON constants
    try:
        return ast.literal_eval(re.sub(r"\b(true|false|null)\b",
                                       lambda m: {"true": "True", "false": "False", "null": "None"}[m.group(1)], raw))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _iter_objects(text: str) -> Iterable[Any]:
    """Every top-level ``{...}`` or ``[...]`` literal in ``text`` that parses as JSON (or as a Python literal)."""
    i, n = 0, len(text)
    while i < n:
        m = re.compile(r"[\[{]").search(text, i)
        if m is None:
            return
        j = m.start()
        try:
            obj, end = _DECODER.raw_decode(text, j)
        except ValueError:
            end = bracket_end(text, j)
            obj = _loads_lenient(text[j:end]) if end else None
            if obj is None:
                i = j + 1
                continue
        yield obj
        i = end


def _call_from_obj(obj: Any) -> ToolCall | None:
    if not isinstance(obj, Mapping):
        return None
    if isinstance(obj.get("function"), Mapping) and "name" in obj["function"]:
        return _call_from_obj(obj["function"])
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    key = next((k for k in LENIENT_ARGS_KEYS if k in obj), None)
    if key is None:
        return None
    args = obj[key]
    if isinstance(args, str):
        parsed = _loads_lenient(args) if args.strip() else {}
        if not isinstance(parsed, Mapping):
            return None
        args = parsed
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        return None
    return ToolCall(name, dict(args))


def _calls_in(obj: Any) -> list[ToolCall]:
    call = _call_from_obj(obj)
    if call is not None:
        return [call]
    out: list[ToolCall] = []
    if isinstance(obj, Mapping):
        for v in obj.values():  # e.g. {"tool_calls": [...]}
            if isinstance(v, Mapping | list):
                out += _calls_in(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _calls_in(v)
    return out


def extract_json_calls(text: str) -> list[ToolCall]:
    """All ``{"name": ..., "arguments"|"parameters": {...}}`` objects in ``text``, in order."""
    calls: list[ToolCall] = []
    for obj in _iter_objects(text):
        calls += _calls_in(obj)
    return calls


# --------------------------------------------------------------------------------------------------
# Dialects
# --------------------------------------------------------------------------------------------------


class Dialect:
    """How one family of models writes tool calls.

    ``render`` returns the exact text the model writes for the call(s) (what follows the assistant header,
    before the end-of-turn token), so it can serve as a draft; ``parse`` reads calls back out of free text."""

    name: ClassVar[str] = ""
    #: text the target writes before a JSON call object, likeliest first ("": the bare object); empty for a
    #: dialect whose calls are not JSON objects (drafters that follow JSON calls stay out of its way)
    openers: ClassVar[tuple[str, ...]] = ()
    #: key holding the arguments in the JSON object
    args_key: ClassVar[str] = "arguments"
    #: what every reply that calls a tool starts with (what tool_choice "required" forces)
    call_prefix: ClassVar[str] = ""

    @property
    def opener(self) -> str:
        """The opener the target writes unless it has shown another."""
        return self.openers[0] if self.openers else ""

    @staticmethod
    def closer(opener: str) -> str | None:
        """What a call opened with `opener` is closed with (None: nothing, as for the bare object)."""
        return CLOSERS.get(opener)

    def render(self, call: ToolCall | Sequence[ToolCall]) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> list[ToolCall]:
        return extract_json_calls(text)

    def render_json(self, call: ToolCall) -> str:
        """One call as a JSON object, name first, then arguments in their own order."""
        return CallRenderer(args_key=self.args_key).call(call.name, call.arguments)

    def __repr__(self) -> str:
        return f"<Dialect {self.name}>"


class HermesDialect(Dialect):
    """Qwen2.5 (and Hermes-style) templates: one ``<tool_call>`` block per call."""

    name = "hermes"
    openers = ("<tool_call>\n",)
    args_key = "arguments"
    call_prefix = "<tool_call>\n"

    def render(self, call):
        return "\n".join(self.opener + self.render_json(c) + self.closer(self.opener) for c in _as_calls(call))


class ApiBankDialect(Dialect):
    """ToolSpec's prompt format: one ``<tool_call>`` block, one JSON object per line."""

    name = "apibank"
    # The prompt asks for a <tool_call> block; models also fence the JSON or write it bare.
    openers = ("<tool_call>\n", "```json\n", "")
    args_key = "parameters"
    call_prefix = "<tool_call>\n"

    def render(self, call):
        calls = _as_calls(call)
        if not calls:
            return ""
        return self.opener + "\n".join(self.render_json(c) for c in calls) + self.closer(self.opener)


class Llama3JsonDialect(Dialect):
    """Llama-3.1/3.2 JSON tool calling: the bare object, as the Llama-3.1 chat template renders tool_calls."""

    name = "llama3_json"
    openers = ("",)
    args_key = "parameters"
    call_prefix = '{"name": "'

    def render(self, call):
        return "; ".join(self.render_json(c) for c in _as_calls(call))


class PythonicDialect(Dialect):
    """Python call syntax ``[f(a=1), g(b="x")]``; also reads a bare ``f(a=1)``."""

    name = "pythonic"
    call_prefix = "["

    def render(self, call):
        return "[" + ", ".join(self.render_one(c) for c in _as_calls(call)) + "]"

    def render_one(self, call: ToolCall) -> str:
        args = ", ".join(f"{k}={py_literal(v)}" for k, v in call.arguments.items())
        return f"{call.name}({args})"

    def parse(self, text: str) -> list[ToolCall]:
        # Prefer a bracketed list of calls; otherwise take bare calls.
        for m in re.finditer(r"\[", text):
            end = bracket_end(text, m.start())
            if end is None:
                continue
            calls = parse_call_list(text[m.start():end])
            if calls:
                return [ToolCall(name, args) for name, args in calls]
        out: list[ToolCall] = []
        i = 0
        pattern = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\(")
        while True:
            m = pattern.search(text, i)
            if m is None:
                return out
            end = bracket_end(text, m.end() - 1)
            call = parse_call_expr(text[m.start():end], keywords_only=True) if end else None
            if call is not None:
                out.append(ToolCall(*call))
                i = end
            else:
                i = m.end()


DIALECTS: dict[str, Dialect] = {d.name: d for d in (HermesDialect(), ApiBankDialect(), Llama3JsonDialect(),
                                                   PythonicDialect())}
# How a request's calls are written when nothing says otherwise: Qwen2.5's (and Hermes') tags.
DEFAULT_DIALECT = HermesDialect.name
# The arguments keys of all dialects, which every reader of a call object accepts.
ARGS_KEYS = tuple(dict.fromkeys(d.args_key for d in DIALECTS.values()))
# Lenient extraction also takes what other tools' formats use.
LENIENT_ARGS_KEYS = (*ARGS_KEYS, "args", "input")
# The start of a call object, through its arguments key: what a reader follows a call by as it is written.
CALL_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:'
                         + "|".join(map(re.escape, ARGS_KEYS)) + r')"\s*:\s*')


def header_name(header: re.Match) -> str:
    """The function name a `CALL_HEADER` match holds, its JSON escapes read."""
    try:
        return json.loads(f'"{header.group(1)}"')
    except ValueError:
        return header.group(1)


def get_dialect(name: str | Dialect) -> Dialect:
    if isinstance(name, Dialect):
        return name
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call dialect {name!r}; choose one of: {', '.join(DIALECTS)}") from None


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def _type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(type(v), type(v).__name__)


def _coerce(value: str, ptype: str) -> tuple[bool, Any]:
    s = value.strip()
    try:
        if ptype == "integer" and re.fullmatch(r"[+-]?\d+", s):
            return True, int(s)
        if ptype == "number":
            return True, float(s)
        if ptype == "boolean" and s.lower() in ("true", "false"):
            return True, s.lower() == "true"
        if ptype in ("array", "object"):
            v = _loads_lenient(s)
            if isinstance(v, tuple):
                v = list(v)
            if (ptype == "array" and isinstance(v, list)) or (ptype == "object" and isinstance(v, dict)):
                return True, detuple(v)
        if ptype == "null" and s.lower() in ("null", "none"):
            return True, None
    except ValueError:
        pass
    return False, value


def _check_value(value: Any, p: Param, path: str, coerce_strings: bool, out: list[str]) -> None:
    if value is None:
        if p.nullable or p.type in ("null", "any"):
            return
        out.append(f"{path}: expected {p.type}, got null")
        return
    if p.type == "any":
        return
    if coerce_strings and isinstance(value, str) and p.type not in ("string", "any"):
        ok, converted = _coerce(value, p.type)
        if ok:
            value = converted
    ok = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list | tuple),
        "object": lambda v: isinstance(v, Mapping),
        "null": lambda v: v is None,
    }[p.type](value)
    if not ok:
        out.append(f"{path}: expected {p.type}, got {_type_name(value)} ({value!r:.60})")
        return
    if p.enum is not None and value not in p.enum and not (isinstance(value, list) and tuple(value) in p.enum):
        out.append(f"{path}: {value!r:.60} is not one of {list(p.enum)}")
    if p.type == "array" and p.items is not None:
        for i, v in enumerate(value):
            _check_value(v, p.items, f"{path}[{i}]", coerce_strings, out)
    if p.type == "object" and p.properties:
        known = {q.name: q for q in p.properties}
        for k, v in value.items():
            if k not in known:
                out.append(f"{path}: unknown key {k!r} (expected {list(known)})")
            else:
                _check_value(v, known[k], f"{path}.{k}", coerce_strings, out)
    if p.type == "object":
        for r in p.required:
            if r not in value:
                out.append(f"{path}: missing required key {r!r}")


def validate(call: ToolCall, tools: Sequence[Tool] | Mapping[str, Tool], *, coerce_strings: bool = False) -> list[str]:
    """Problems with ``call`` against ``tools``: unknown function, unknown or missing-required arguments,
    wrong types, values outside an enum (checked recursively). Empty when the call is valid.

    ``coerce_strings`` accepts strings that read as the declared type (``"3"`` for an integer, ``"[1, 2]"`` for
    an array), which is how some datasets write every gold value."""
    by_name = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    tool = by_name.get(call.name)
    if tool is None:
        return [f"unknown function {call.name!r} (available: {', '.join(by_name) or 'none'})"]
    if not isinstance(call.arguments, Mapping):
        return [f"{call.name}: arguments must be an object, got {_type_name(call.arguments)}"]
    problems: list[str] = []
    for k, v in call.arguments.items():
        p = tool.param(k)
        if p is None:
            problems.append(f"{call.name}: unknown argument {k!r} (expected {list(tool.param_names)})")
        else:
            _check_value(v, p, f"{call.name}.{k}", coerce_strings, problems)
    for r in tool.required:
        if r not in call.arguments:
            problems.append(f"{call.name}: missing required argument {r!r}")
    return problems


__all__ = [
    "ARGS_KEYS",
    "CALL_HEADER",
    "CALL_TAG",
    "CALL_OPENERS",
    "CLOSERS",
    "DEFAULT_DIALECT",
    "DIALECTS",
    "ApiBankDialect",
    "Dialect",
    "HermesDialect",
    "Llama3JsonDialect",
    "PythonicDialect",
    "ToolCall",
    "extract_json_calls",
    "get_dialect",
    "header_name",
    "validate",
]
