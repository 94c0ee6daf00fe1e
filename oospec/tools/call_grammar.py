"""The grammar of a reply that must call tools (tool_choice "required" or a named function), in the target's dialect.

The grammar is Lark text as llguidance reads it (oospec.engine.constraint decodes under it). It accepts exactly:
the dialect's text before a call, one call object (or several, joined as the dialect joins them), the text after
the last call, and then nothing but the end of the turn. A call object is

    {"name": <one of the allowed names>, "<args key>": <a JSON object following that function's parameters>}

with JSON written as chat templates' ``tojson`` writes it (``", "`` and ``": "``, no other whitespace), so the
constrained reply is the text the target was trained to write. Every layout fact comes from the dialect itself
(`Dialect.render` and `render_json`, the one renderer): nothing here restates how a dialect writes calls.

Parameters schemas are the tools' own; where a schema (or any object in it) names its properties but says nothing
about others, the grammar allows only the named ones (as OpenAI's strict mode does): a call cannot carry arguments
nobody declared.
Dialects whose calls are not JSON objects (pythonic) have no grammar here (`CallGrammarUnavailable`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from oospec.errors import OospecError
from oospec.tools.dialects import Dialect, ToolCall
from oospec.tools.schema_limits import UnsupportedSchema, check_schema

# How tojson writes JSON; llguidance's JSON options (x-guidance) say the same, and nothing else is allowed.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
               "lenient": True}  # lenient: schema keywords llguidance cannot enforce are ignored, not fatal
_PLACEHOLDER = "\x00call\x00"  # a name no tool has, to find where the dialect puts the call object


class CallGrammarUnavailable(OospecError):
    """A dialect whose calls no JSON grammar describes (pythonic)."""


def call_layout(dialect: Dialect) -> tuple[str, str, str]:
    """(before, between, after): the text the dialect writes before the first call object, between two, and
    after the last, read off its own renderer."""
    if not dialect.openers:
        raise CallGrammarUnavailable(f"dialect {dialect.name!r} does not write calls as JSON objects")
    call = ToolCall(_PLACEHOLDER, {})
    obj = dialect.render_json(call)
    before, after = dialect.render(call).split(obj)
    two = dialect.render([call, call])
    between = two[len(before) + len(obj): len(two) - len(after) - len(obj)]
    return before, between, after


def forced_call_start(dialect: Dialect, function: str | None) -> str:
    """The start of a reply that must call `function` (None: any tool), which the prompt forces: the dialect's
    call prefix, and with a function named, its name and the arguments key too."""
    if function is None:
        return dialect.call_prefix
    if dialect.name == "pythonic":
        return f"[{function}("
    return dialect.opener + dialect.render_json(ToolCall(function, {})).rsplit("{}", 1)[0]


def call_grammar(tools: Sequence[Mapping[str, Any]], names: Sequence[str], dialect: Dialect, *,
                 parallel: bool = True, special_tokens: Mapping[str, int] | None = None) -> str:
    """Lark grammar of a reply made of calls to `names` (a subset of the OpenAI-style `tools`).

    parallel: several calls may follow each other; False: exactly one.
    special_tokens: text -> token id of markers the tokenizer holds as one special token (Qwen2.5's
    ``<tool_call>``): the grammar accepts either the token or the same text written out.
    UnsupportedSchema (oospec.tools.schema_limits) for parameters no grammar can follow."""
    before, between, after = call_layout(dialect)
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    missing = [n for n in names if n not in schemas]
    if missing or not names:
        raise ValueError(f"cannot build a call grammar for {missing or 'no'} functions (offered: {list(schemas)})")
    markers = dict(special_tokens or {})
    rules = []
    for i, name in enumerate(dict.fromkeys(names)):
        try:
            check_schema(schemas[name])
        except UnsupportedSchema as exc:
            raise UnsupportedSchema(exc.reason, exc.pointer, function=name) from None
        head, tail = dialect.render_json(ToolCall(name, {})).rsplit("{}", 1)
        schema = json.dumps(arguments_schema(schemas[name]), ensure_ascii=False)
        rules.append(f"args_{i}: %json {schema}")
        rules.append(f"call_{i}: {_literal(head, markers)} args_{i} {_literal(tail, markers)}")
    calls = " | ".join(f"call_{i}" for i in range(len(dict.fromkeys(names))))
    more = f" ({_literal(between, markers)} call)*" if parallel else ""
    start = f"start: {_literal(before, markers)} call{more} {_literal(after, markers)}"
    return "\n".join([start, f"call: {calls}", *rules]) + "\n"


def arguments_schema(parameters: Any) -> dict:
    """The JSON schema the arguments object follows: the tool's parameters, always an object (whatever type a
    schema claims), closed to undeclared properties (`closed`), written in tojson's layout."""
    schema = closed(finite(dict(parameters))) if isinstance(parameters, Mapping) else {}
    schema["type"] = "object"
    schema["x-guidance"] = JSON_LAYOUT  # the client's own x-guidance (if any) does not change the layout
    return schema


_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("$defs", "definitions", "patternProperties", "dependentSchemas")


def closed(schema: Any) -> Any:
    """`schema` with every object that names its properties, at any depth, closed to others unless it says
    otherwise: a nested object was left open, and a model wrote the parameter's schema ({"type": ..., "enum":
    ...}) as its value. allOf members are left as they are: closing each would refuse the
    properties the others declare."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), Mapping):
        out["properties"] = {k: closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), Mapping):
            out[key] = closed(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(v) for v in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    return out


def finite(value: Any) -> Any:
    """`value` without the numbers JSON cannot write: a client's `minimum: 1e400` is parsed as infinity, which
    the grammar's JSON text cannot hold (llguidance refused the whole grammar). A bound no float can
    reach says nothing a call could break, so a key holding one is left out, and so is such an item of a list."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items() if not (isinstance(v, float) and not math.isfinite(v))}
    if isinstance(value, list):
        return [finite(v) for v in value if not (isinstance(v, float) and not math.isfinite(v))]
    return value


def _literal(text: str, markers: Mapping[str, int]) -> str:
    """`text` as a sequence of Lark items: string literals, and for each special-token marker in it the token
    or its text."""
    if not text:
        return ""
    pieces = re.split("(" + "|".join(re.escape(m) for m in markers) + ")", text) if markers else [text]
    items = []
    for piece in pieces:
        if not piece:
            continue
        literal = json.dumps(piece, ensure_ascii=False)
        items.append(f"({literal} | <[{markers[piece]}]>)" if piece in markers else literal)
    return " ".join(items)
