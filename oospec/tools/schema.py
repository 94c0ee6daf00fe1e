"""One internal tool schema, built from OpenAI/JSON-Schema tools, API-Bank prompts and ToolAlpaca APIs.

Parameter order is preserved everywhere: a model writes arguments in schema order, so drafting
relies on it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oospec.errors import SchemaError
from oospec.tools.jsonscan import bracket_end

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

# Type names seen in JSON Schema, BFCL (python/java/js flavours), API-Bank and ToolAlpaca prose.
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


def _param_from_json_schema(name: str, schema: Any, where: str) -> Param:
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
    elif raw_type is None:
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
            items = _param_from_json_schema("", raw_items, f"{where}.items")
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
            properties = tuple(_param_from_json_schema(k, v, f"{where}.{k}") for k, v in props.items())
        required = _required_list(schema.get("required"), where)
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


def _required_list(raw: Any, where: str) -> tuple[str, ...]:
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
        raise SchemaError(f"{where}: parameters must have type 'object' (or BFCL's 'dict'), got {top_type!r}")
    props = params_schema.get("properties", {})
    if props is None:
        props = {}
    if not isinstance(props, Mapping):
        raise SchemaError(f"{where}: parameters.properties must be an object, got {type(props).__name__}")
    params = tuple(_param_from_json_schema(k, v, f"{where} parameter {k!r}") for k, v in props.items())
    required = _required_list(params_schema.get("required"), where)
    missing = [r for r in required if r not in props]
    if missing:
        raise SchemaError(f"{where}: required parameters {missing} are not defined (have {list(props)})")
    return Tool(name=name, description=description, parameters=params, required=required)


def tools_from_openai(specs: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> list[Tool]:
    """Tools from a list of OpenAI / BFCL / bare JSON-Schema function definitions (or a single one)."""
    if isinstance(specs, Mapping):
        specs = [specs]
    if isinstance(specs, str | bytes):
        raise SchemaError("tools must be a list of objects, got a string (parse the JSON first)")
    tools = [tool_from_openai(s) for s in specs]
    _check_unique([t.name for t in tools])
    return tools


def _check_unique(names: Sequence[str]) -> None:
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


# --------------------------------------------------------------------------------------------------
# API-Bank prose prompts
# --------------------------------------------------------------------------------------------------

# "1. Name: ToolName\nDescription: ...\nParameters: {...}"   (ToolSpec levels 1 and 2)
_APIBANK_NAMED = re.compile(r"^(?:\d+\.\s*)?Name:\s*(?P<name>[^\n]+?)\s*\n(?P<body>.*?)(?=^(?:\d+\.\s*)?Name:|\Z)",
                            re.M | re.S)
# "1. ToolName: description\nParameters: {...}"               (ToolSpec level 3)
_APIBANK_INLINE = re.compile(r"^\d+\.\s*(?P<name>[A-Za-z_][\w.\-]*):\s*(?P<desc>[^\n]*)\n\s*Parameters:", re.M)
_OPTIONAL_RE = re.compile(r"^\s*\[?\s*optional\b", re.I)


def _literal_dict(text: str, where: str) -> dict:
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


def _apibank_param(name: str, spec: Any, where: str) -> Param:
    if isinstance(spec, str):  # {"p": "str"} shorthand
        spec = {"type": spec}
    if not isinstance(spec, Mapping):
        raise SchemaError(f"{where}: parameter spec must be a dictionary, got {spec!r}")
    desc = spec.get("description", "") or ""
    raw_type = spec.get("type", "any")
    ptype, item = normalize_type(raw_type, where=where)
    items = Param("", item) if item else None
    extra = {k: v for k, v in spec.items() if k not in ("type", "description")}
    return Param(name=name, type=ptype, description=desc, items=items, extra=extra)


def tools_from_apibank_prompt(text: str) -> list[Tool]:
    """Parse the prose tool list of an API-Bank (ToolSpec) system prompt.

    Both layouts are read: ``N. Name: X / Description: ... / Parameters: {...}`` and
    ``N. X: description / Parameters: {...}``. The parameter dictionary is a Python literal whose values
    are ``{'type': 'str'|'int'|'float'|'bool'|'list'|'list(str)'|..., 'description': ...}``. A parameter is
    required unless its description starts with ``[Optional]``. Returns [] when the text lists no tools."""
    if not isinstance(text, str):
        raise SchemaError(f"API-Bank prompt must be a string, got {type(text).__name__}")
    tools: list[Tool] = []
    named = list(_APIBANK_NAMED.finditer(text))
    if named:
        for m in named:
            name, body = m.group("name").strip(), m.group("body")
            where = f"tool {name!r}"
            pm = re.search(r"Parameters:\s*", body)
            if pm is None:
                raise SchemaError(f"{where}: no 'Parameters:' line")
            dm = re.search(r"Description:\s*(.*?)\s*(?=Parameters:)", body, re.S)
            desc = dm.group(1).strip() if dm else ""
            tools.append(_apibank_tool(name, desc, _literal_dict(body[pm.end():], where), where))
    else:
        for m in _APIBANK_INLINE.finditer(text):
            name = m.group("name")
            where = f"tool {name!r}"
            tools.append(_apibank_tool(name, m.group("desc").strip(), _literal_dict(text[m.end():], where), where))
    _check_unique([t.name for t in tools])
    return tools


def _apibank_tool(name: str, desc: str, params: dict, where: str) -> Tool:
    ps = tuple(_apibank_param(k, v, f"{where} parameter {k!r}") for k, v in params.items())
    required = tuple(p.name for p in ps if not _OPTIONAL_RE.match(p.description))
    return Tool(name=name, description=desc, parameters=ps, required=required)


# --------------------------------------------------------------------------------------------------
# ToolAlpaca
# --------------------------------------------------------------------------------------------------


def tools_from_toolalpaca(api: Mapping[str, Any] | str) -> list[Tool]:
    """Tools of one ToolAlpaca API entry (an element of ``eval_simulated.json`` / ``train_data.json``).

    The OpenAPI ``Documentation`` is the source (path, query and header parameters first, then the
    JSON request-body properties, ``$ref``s resolved); when an entry has no usable OpenAPI document the
    ``Functions`` prose (``Input: {"p": "Required. String. ..."}``) is parsed instead. ``Required.``
    markers in that prose also mark body properties that the OpenAPI schema leaves unmarked. Functions
    are ordered as in ``Function_Projection`` when present. Also accepts an OpenAPI document (dict or
    JSON string) directly."""
    if isinstance(api, str):
        try:
            api = json.loads(api)
        except ValueError as e:
            raise SchemaError(f"ToolAlpaca API is not valid JSON: {e}") from None
    if not isinstance(api, Mapping):
        raise SchemaError(f"ToolAlpaca API must be an object, got {type(api).__name__}")
    if "paths" in api:  # a bare OpenAPI document
        return _tools_from_openapi(api, where=str(api.get("info", {}).get("title", "OpenAPI")))
    api_name = api.get("Name", "?")
    prose: dict[str, Tool] = {}
    prose_error: SchemaError | None = None
    if isinstance(api.get("Functions"), str):
        try:
            prose = _toolalpaca_prose(api["Functions"], api_name)
        except SchemaError as e:  # only fatal when there is no OpenAPI document to fall back on
            prose_error = e
    doc = api.get("Documentation")
    tools: list[Tool] | None = None
    if doc:
        if isinstance(doc, str):
            try:
                doc = json.loads(doc)
            except ValueError as e:
                if not prose:
                    raise SchemaError(f"ToolAlpaca API {api_name!r}: Documentation is not valid JSON: {e}") from None
                doc = None
        if isinstance(doc, Mapping) and isinstance(doc.get("paths"), Mapping):
            tools = _tools_from_openapi(doc, where=f"ToolAlpaca API {api_name!r}")
            if prose:
                tools = [_merge_required(t, prose.get(t.name)) for t in tools]
    if tools is None:
        if prose_error is not None:
            raise prose_error
        if not prose:
            raise SchemaError(f"ToolAlpaca API {api_name!r}: neither an OpenAPI Documentation nor a Functions list")
        tools = list(prose.values())
    order = api.get("Function_Projection")
    if isinstance(order, Mapping):
        rank = {n: i for i, n in enumerate(order)}
        tools.sort(key=lambda t: rank.get(t.name, len(rank)))
    return tools


def _merge_required(tool: Tool, prose_tool: Tool | None) -> Tool:
    if prose_tool is None:
        return tool
    extra = [r for r in prose_tool.required if r in tool.param_names and r not in tool.required]
    if not extra:
        return tool
    required = tuple(n for n in tool.param_names if n in tool.required or n in extra)
    return Tool(tool.name, tool.description, tool.parameters, required)


def _resolve_refs(node: Any, doc: Mapping, where: str, seen: tuple[str, ...] = ()) -> Any:
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in seen:
                return {"type": "object", "description": f"(recursive {ref})"}
            if not ref.startswith("#/"):
                raise SchemaError(f"{where}: only local $refs are supported, got {ref!r}")
            target: Any = doc
            for part in ref[2:].split("/"):
                if not isinstance(target, Mapping) or part not in target:
                    raise SchemaError(f"{where}: unresolvable $ref {ref!r}")
                target = target[part]
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve_refs(merged, doc, where, seen + (ref,))
        return {k: _resolve_refs(v, doc, where, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_refs(v, doc, where, seen) for v in node]
    return node


def _tools_from_openapi(doc: Mapping, where: str) -> list[Tool]:
    doc = _resolve_refs(doc, doc, where)
    tools = []
    for path, methods in doc["paths"].items():
        if not isinstance(methods, Mapping):
            raise SchemaError(f"{where}: path {path!r} must map methods to operations")
        shared = methods.get("parameters", [])
        for method, op in methods.items():
            if method.lower() not in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
                continue
            if not isinstance(op, Mapping):
                raise SchemaError(f"{where}: {method.upper()} {path} must be an object")
            name = op.get("operationId") or f"{method.lower()}_{re.sub(r'[^0-9A-Za-z]+', '_', path).strip('_')}"
            tw = f"{where} tool {name!r}"
            params: dict[str, Param] = {}
            required: list[str] = []
            for raw in list(shared) + list(op.get("parameters", [])):
                if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
                    raise SchemaError(f"{tw}: parameter without a name: {raw!r:.80}")
                schema = dict(raw.get("schema") or {})
                if raw.get("description") and not schema.get("description"):
                    schema["description"] = raw["description"]
                for k in ("enum", "items", "default"):
                    if k in raw and k not in schema:
                        schema[k] = raw[k]
                if "type" not in schema and "type" in raw:
                    schema["type"] = raw["type"]
                pname = raw["name"]
                if pname in params:
                    continue
                params[pname] = _param_from_json_schema(pname, schema, f"{tw} parameter {pname!r}")
                if raw.get("required") or raw.get("in") == "path":
                    required.append(pname)
            body = op.get("requestBody")
            if isinstance(body, Mapping):
                content = body.get("content") or {}
                schema = None
                for ctype in ("application/json", *content):
                    if isinstance(content.get(ctype), Mapping) and "schema" in content[ctype]:
                        schema = content[ctype]["schema"]
                        break
                if isinstance(schema, Mapping):
                    if "properties" in schema or schema.get("type") == "object":
                        for pname, pschema in (schema.get("properties") or {}).items():
                            if pname in params:
                                continue
                            params[pname] = _param_from_json_schema(pname, pschema, f"{tw} body {pname!r}")
                        required += [r for r in _required_list(schema.get("required"), tw)
                                     if r in params and r not in required]
                    elif "body" not in params:
                        params["body"] = _param_from_json_schema("body", schema, f"{tw} body")
                        if body.get("required"):
                            required.append("body")
            desc = op.get("description") or op.get("summary") or ""
            order = list(params)
            tools.append(Tool(name=name, description=desc, parameters=tuple(params.values()),
                              required=tuple(sorted(dict.fromkeys(required), key=order.index))))
    _check_unique([t.name for t in tools])
    return tools


_PROSE_BLOCK = re.compile(r"^\s*\d+\.\s*Name:\s*(?P<name>\S+)\s*\n(?P<body>.*?)(?=^\s*\d+\.\s*Name:|\Z)", re.M | re.S)
_PROSE_TYPE = re.compile(
    r"^\s*(?:(?P<req>Required|Optional)\.\s*)?(?P<type>[A-Za-z][\w\[\] ]*?)\.\s*(?P<desc>.*)$", re.S)


def _toolalpaca_prose(text: str, api_name: str) -> dict[str, Tool]:
    """``1. Name: f\\n Description: ...\\n Input: {"p": "Required. String. text"}`` blocks."""
    tools: dict[str, Tool] = {}
    for m in _PROSE_BLOCK.finditer(text):
        name, body = m.group("name"), m.group("body")
        where = f"ToolAlpaca API {api_name!r} tool {name!r}"
        dm = re.search(r"Description:\s*(.*?)\s*\n\s*(?:Input|Parameters):", body, re.S)
        im = re.search(r"(?:Input|Parameters):[ \t]*", body)
        if im is None:
            continue
        rest = body[im.end():]
        if re.match(r"(?:None|N/A|-|\{\s*\})?\s*(?:\n|$)", rest, re.I):
            raw = {}
        else:
            raw = _literal_dict(rest.split("\nOutput:")[0], where)
        params, required = [], []
        for pname, spec in raw.items():
            desc, ptype, item = str(spec), "string", None
            tm = _PROSE_TYPE.match(str(spec))
            if tm:
                try:
                    ptype, item = normalize_type(tm.group("type"), where=where)
                    desc = tm.group("desc").strip()
                except SchemaError:
                    pass  # a description that merely starts with a word: keep it whole, type string
                if tm.group("req") == "Required":
                    required.append(pname)
            params.append(Param(pname, ptype, desc, items=Param("", item) if item else None))
        tools[name] = Tool(name, dm.group(1).strip() if dm else "", tuple(params), tuple(required))
    return tools


__all__ = [
    "NO_DEFAULT",
    "PARAM_TYPES",
    "Param",
    "Tool",
    "normalize_type",
    "param_to_json_schema",
    "to_openai",
    "tool_from_openai",
    "tools_from_apibank_prompt",
    "tools_from_openai",
    "tools_from_toolalpaca",
]
