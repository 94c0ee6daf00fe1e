"""One internal tool schema (Tool, Param), read from and written to OpenAI / JSON-Schema tools.

Formats that describe tools otherwise (prose listings, OpenAPI documents) are read in oospec.datasets, on
top of ``param_from_json_schema``.

Parameter order is preserved everywhere: a model writes arguments in schema order, so drafting
relies on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oospec.errors import SchemaError

PARAM_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null", "any")


class _NoDefault:
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_DEFAULT"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return (_NoDefault, ())


NO_DEFAULT: Any = _NoDefault()
"""Marker for a parameter without a default (``None`` is a legitimate default)."""

# Type names seen in JSON Schema, in Python, Java and JavaScript flavoured function lists, and in prose listings.
_TYPE_ALIASES = {
    "string": "string", "str": "string", "text": "string", "char": "string", "character": "string",
    "date": "string", "datetime": "string", "time": "string", "url": "string", "uri": "string",
    "email": "string", "enum": "string",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer", "byte": "integer",
    "bigint": "integer", "int32": "integer", "int64": "integer",
    "number": "number", "float": "number", "double": "number", "decimal": "number", "numeric": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array", "set": "array", "arraylist": "array",
    "queue": "array", "stack": "array", "sequence": "array",
    "object": "object", "dict": "object", "dictionary": "object", "map": "object", "hashmap": "object",
    "hashtable": "object", "mapping": "object", "json": "object",
    "null": "null", "none": "null", "nonetype": "null",
    "any": "any", "anytype": "any", "mixed": "any",
}
_KNOWN_PARAM_KEYS = {"type", "description", "enum", "items", "properties", "required", "default"}


def normalize_type(raw: Any, *, where: str = "") -> tuple[str, str | None]:
    """Map a type name to (one of PARAM_TYPES, item type or None).

    Accepts ``list(str)`` / ``list[str]`` / ``Array[string]`` / ``Array of Integers`` forms, whose item
    type comes back as the second element. Raises SchemaError for names it does not know."""
    if not isinstance(raw, str) or not raw.strip():
        raise SchemaError(f"{where}: type must be a non-empty string, got {raw!r}")
    name = raw.strip()
    m = re.fullmatch(r"(\w+)\s*(?:\((.+)\)|\[(.+)\]|<(.+)>|\s+of\s+(.+))", name)
    if m:
        outer = _TYPE_ALIASES.get(m.group(1).lower())
        inner_raw = next(g for g in m.groups()[1:] if g)
        if outer == "array":
            inner_name = inner_raw.strip()
            for candidate in (inner_name, inner_name.rstrip("sS")):
                try:
                    return "array", normalize_type(candidate, where=where)[0]
                except SchemaError:
                    pass
            raise SchemaError(f"{where}: unknown item type {inner_raw!r} in {raw!r}")
        if outer is not None:
            return outer, None
    t = _TYPE_ALIASES.get(name.lower())
    if t is None:
        raise SchemaError(f"{where}: unknown type {raw!r} (known: {', '.join(PARAM_TYPES)})")
    return t, None


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


@dataclass(frozen=True)
class Param:
    """One parameter (or a nested property / array item, whose ``name`` is then the key or ``""``)."""

    name: str
    type: str = "string"
    description: str = ""
    enum: tuple | None = None
    items: Param | None = None
    properties: tuple[Param, ...] = ()
    required: tuple[str, ...] = ()
    default: Any = field(default=NO_DEFAULT, hash=False)
    nullable: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        if self.type not in PARAM_TYPES:
            raise SchemaError(f"parameter {self.name!r}: type {self.type!r} is not one of {PARAM_TYPES}")
        if self.items is not None and self.type != "array":
            raise SchemaError(f"parameter {self.name!r}: 'items' given for type {self.type!r}")
        if self.properties and self.type != "object":
            raise SchemaError(f"parameter {self.name!r}: 'properties' given for type {self.type!r}")
        names = [p.name for p in self.properties]
        if len(set(names)) != len(names):
            raise SchemaError(f"parameter {self.name!r}: duplicate property names {names}")
        if self.properties:
            unknown = [r for r in self.required if r not in names]
            if unknown:
                raise SchemaError(f"parameter {self.name!r}: required {unknown} not among properties {names}")

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    def property(self, name: str) -> Param | None:
        return next((p for p in self.properties if p.name == name), None)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: tuple[Param, ...] = ()
    required: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise SchemaError(f"tool name must be a non-empty string, got {self.name!r}")
        names = [p.name for p in self.parameters]
        if len(set(names)) != len(names):
            raise SchemaError(f"tool {self.name!r}: duplicate parameter names {names}")
        unknown = [r for r in self.required if r not in names]
        if unknown:
            raise SchemaError(f"tool {self.name!r}: required parameters {unknown} are not defined (have {names})")

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.parameters if p.name == name), None)

    def is_required(self, name: str) -> bool:
        return name in self.required


# --------------------------------------------------------------------------------------------------
# JSON Schema / OpenAI tools
# --------------------------------------------------------------------------------------------------


def param_from_json_schema(name: str, schema: Any, where: str) -> Param:
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{where}: schema must be an object, got {type(schema).__name__}")
    raw_type = schema.get("type")
    nullable = False
    item_hint = None
    extra = {k: v for k, v in schema.items() if k not in _KNOWN_PARAM_KEYS}
    if isinstance(raw_type, list):
        kinds = [normalize_type(t, where=where)[0] for t in raw_type]
        nullable = "null" in kinds
        kinds = [k for k in kinds if k != "null"]
        ptype = kinds[0] if len(kinds) == 1 else ("null" if not kinds else "any")
        if len(kinds) > 1:
            extra["type"] = list(raw_type)  # keep the union for to_openai
    elif raw_type is None or (isinstance(raw_type, str) and not raw_type.strip()):
        # A blank type says as little as a missing one (function lists do write `"type": ""`), so
        # both are inferred from the rest of the schema rather than failing the whole tool list.
        union = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(union, list) and union and all(isinstance(u, Mapping) for u in union):
            kinds = [normalize_type(u["type"], where=where)[0] if isinstance(u.get("type"), str) else "any"
                     for u in union]
            nullable = "null" in kinds
            kinds = [k for k in kinds if k != "null"]
            ptype = kinds[0] if len(set(kinds)) == 1 and len(kinds) == 1 else "any"
        elif "properties" in schema:
            ptype = "object"
        elif "items" in schema:
            ptype = "array"
        elif isinstance(schema.get("enum"), list) and schema["enum"]:
            vals = schema["enum"]
            ptype = ("boolean" if all(isinstance(v, bool) for v in vals) else
                     "integer" if all(isinstance(v, int) and not isinstance(v, bool) for v in vals) else
                     "number" if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals) else
                     "string" if all(isinstance(v, str) for v in vals) else "any")
        else:
            ptype = "any"
    else:
        ptype, item_hint = normalize_type(raw_type, where=where)

    description = schema.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise SchemaError(f"{where}: description must be a string, got {type(description).__name__}")

    enum = schema.get("enum")
    if enum is not None:
        if not isinstance(enum, list | tuple):
            raise SchemaError(f"{where}: enum must be a list, got {type(enum).__name__}")
        enum = _freeze(enum)

    items = None
    if ptype == "array":
        if "items" in schema:
            raw_items = schema["items"]
            if isinstance(raw_items, list):  # tuple-typing: [{"type": ..}, ..]
                extra["items"] = raw_items
                raw_items = raw_items[0] if len(raw_items) == 1 else {}
            items = param_from_json_schema("", raw_items, f"{where}.items")
        elif item_hint:
            items = Param("", item_hint)
    elif "items" in schema and ptype != "any":
        raise SchemaError(f"{where}: 'items' given for type {ptype!r}")

    properties: tuple[Param, ...] = ()
    required: tuple[str, ...] = ()
    if ptype == "object":
        props = schema.get("properties")
        if props is not None:
            if not isinstance(props, Mapping):
                raise SchemaError(f"{where}: properties must be an object, got {type(props).__name__}")
            properties = tuple(param_from_json_schema(k, v, f"{where}.{k}") for k, v in props.items())
        required = required_names(schema.get("required"), where)
        if properties:
            unknown = [r for r in required if r not in props]
            if unknown:
                raise SchemaError(f"{where}: required {unknown} not among properties {list(props)}")
    elif "properties" in schema and ptype != "any":
        raise SchemaError(f"{where}: 'properties' given for type {ptype!r}")
    elif isinstance(schema.get("required"), list) and schema["required"]:
        extra["required"] = schema["required"]  # misplaced, kept verbatim for to_openai

    default = schema.get("default", NO_DEFAULT)
    try:
        return Param(name=name, type=ptype, description=description, enum=enum, items=items,
                     properties=properties, required=required, default=default, nullable=nullable, extra=extra)
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None


def required_names(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None or isinstance(raw, bool):
        return ()
    if not isinstance(raw, list | tuple) or not all(isinstance(r, str) for r in raw):
        raise SchemaError(f"{where}: 'required' must be a list of names, got {raw!r}")
    return tuple(dict.fromkeys(raw))


def tool_from_openai(spec: Mapping[str, Any]) -> Tool:
    """One tool from ``{"type": "function", "function": {...}}`` or a bare ``{"name", "description", "parameters"}``."""
    if not isinstance(spec, Mapping):
        raise SchemaError(f"tool definition must be an object, got {type(spec).__name__}: {spec!r:.80}")
    if "function" in spec and isinstance(spec["function"], Mapping):
        if spec.get("type", "function") != "function":
            raise SchemaError(f"tool of type {spec.get('type')!r} is not a function tool")
        spec = spec["function"]
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SchemaError(f"tool definition has no name: {json.dumps(spec, default=str)[:120]}")
    where = f"tool {name!r}"
    description = spec.get("description") or ""
    if not isinstance(description, str):
        raise SchemaError(f"{where}: description must be a string, got {type(description).__name__}")
    params_schema = spec.get("parameters", spec.get("input_schema"))  # input_schema: Anthropic style
    if params_schema is None:
        return Tool(name=name, description=description)
    if not isinstance(params_schema, Mapping):
        raise SchemaError(f"{where}: parameters must be an object schema, got {type(params_schema).__name__}")
    top_type = params_schema.get("type", "object")
    if not isinstance(top_type, str) or _TYPE_ALIASES.get(top_type.lower()) != "object":
        raise SchemaError(f"{where}: parameters must have type 'object' (or 'dict'), got {top_type!r}")
    props = params_schema.get("properties", {})
    if props is None:
        props = {}
    if not isinstance(props, Mapping):
        raise SchemaError(f"{where}: parameters.properties must be an object, got {type(props).__name__}")
    params = tuple(param_from_json_schema(k, v, f"{where} parameter {k!r}") for k, v in props.items())
    required = required_names(params_schema.get("required"), where)
    missing = [r for r in required if r not in props]
    if missing:
        raise SchemaError(f"{where}: required parameters {missing} are not defined (have {list(props)})")
    return Tool(name=name, description=description, parameters=params, required=required)


def tools_from_openai(specs: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> list[Tool]:
    """Tools from a list of OpenAI / Python-typed ('dict') / bare JSON-Schema function definitions (or a single one)."""
    if isinstance(specs, Mapping):
        specs = [specs]
    if isinstance(specs, str | bytes):
        raise SchemaError("tools must be a list of objects, got a string (parse the JSON first)")
    tools = [tool_from_openai(s) for s in specs]
    check_unique_names([t.name for t in tools])
    return tools


def check_unique_names(names: Sequence[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise SchemaError(f"tool {n!r} is defined twice")
        seen.add(n)


def param_to_json_schema(p: Param) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if p.type != "any":
        out["type"] = [p.type, "null"] if p.nullable and p.type != "null" else p.type
    if p.description:
        out["description"] = p.description
    if p.enum is not None:
        out["enum"] = [_thaw(v) for v in p.enum]
    if p.items is not None:
        out["items"] = param_to_json_schema(p.items)
    if p.type == "object" and (p.properties or p.required):
        if p.properties:
            out["properties"] = {q.name: param_to_json_schema(q) for q in p.properties}
        if p.required:
            out["required"] = list(p.required)
    if p.has_default:
        out["default"] = p.default
    for k, v in p.extra.items():
        if k == "type":  # a union the internal type could not express
            out["type"] = v
        else:
            out.setdefault(k, v)
    return out


def _thaw(v: Any) -> Any:
    return [_thaw(x) for x in v] if isinstance(v, tuple) else v


def to_openai(tool: Tool) -> dict[str, Any]:
    """``{"type": "function", "function": {...}}`` with a standard JSON Schema, ready for
    ``apply_chat_template(tools=...)``."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": {
                "type": "object",
                "properties": {p.name: param_to_json_schema(p) for p in tool.parameters},
                "required": list(tool.required),
            },
        },
    }


__all__ = [
    "NO_DEFAULT",
    "PARAM_TYPES",
    "Param",
    "Tool",
    "check_unique_names",
    "normalize_type",
    "param_from_json_schema",
    "param_to_json_schema",
    "required_names",
    "to_openai",
    "tool_from_openai",
    "tools_from_openai",
]
