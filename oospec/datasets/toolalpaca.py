"""ToolAlpaca (eval_simulated): tools read from each API's OpenAPI document (or its prose), and samples whose
gold is the golden action sequence."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oospec.datasets.prose import literal_dict
from oospec.datasets.sample import DatasetError, Sample, Samples, build_samples, data_path, read_records
from oospec.errors import SchemaError
from oospec.tools.dialects import DEFAULT_DIALECT, ToolCall
from oospec.tools.schema import (
    Param,
    Tool,
    check_unique_names,
    normalize_type,
    param_from_json_schema,
    required_names,
    tools_from_openai,
)

# --------------------------------------------------------------------------------------------------
# Tools: the OpenAPI document, or the Functions prose
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
                params[pname] = param_from_json_schema(pname, schema, f"{tw} parameter {pname!r}")
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
                            params[pname] = param_from_json_schema(pname, pschema, f"{tw} body {pname!r}")
                        required += [r for r in required_names(schema.get("required"), tw)
                                     if r in params and r not in required]
                    elif "body" not in params:
                        params["body"] = param_from_json_schema("body", schema, f"{tw} body")
                        if body.get("required"):
                            required.append("body")
            desc = op.get("description") or op.get("summary") or ""
            order = list(params)
            tools.append(Tool(name=name, description=desc, parameters=tuple(params.values()),
                              required=tuple(sorted(dict.fromkeys(required), key=order.index))))
    check_unique_names([t.name for t in tools])
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
            raw = literal_dict(rest.split("\nOutput:")[0], where)
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


# --------------------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------------------


GET_DETAILS = Tool(
    name="getDetails",
    description="Ask the user for information that is needed to call a function but missing from the request.",
    parameters=tools_from_openai([{"name": "_", "parameters": {"type": "object", "properties": {
        "Question": {"type": "string", "description": "The question to ask the user."}}}}])[0].parameters,
    required=("Question",),
)
_PLACEHOLDER_RE = re.compile(r'"?\$\{([^},"$]*)\}?"?')
_PLACEHOLDER_VALUE = re.compile(r"^\$?\{[^{}\"]*\}$")


def is_placeholder(value: Any) -> bool:
    """ToolAlpaca gold values standing for an earlier result or user detail, e.g. ``${animeId from searchAnime}``."""
    return isinstance(value, str) and bool(_PLACEHOLDER_VALUE.match(value.strip()))


def parse_toolalpaca_input(raw: Any) -> dict:
    """A golden ``Action_Input``: JSON, possibly with unquoted ``${...}`` placeholders (kept as strings)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if raw is None or not str(raw).strip():
        return {}
    text = str(raw)
    for candidate in (text, _PLACEHOLDER_RE.sub(lambda m: json.dumps("${" + m.group(1).strip() + "}"), text)):
        try:
            value = json.loads(candidate)
        except ValueError:
            try:
                value = ast.literal_eval(candidate)
            except (ValueError, SyntaxError):
                continue
        if isinstance(value, Mapping):
            return dict(value)
    raise DatasetError(f"cannot read ToolAlpaca Action_Input {text[:120]!r}")


def toolalpaca_samples(apis: Sequence[Any], *, source: str) -> Samples:
    """One sample per instruction. An API whose tools cannot be read is skipped whole; an instruction whose
    golden answer cannot be read is skipped alone (the others keep their ids)."""

    def make(a: int, api: Any, samples: Samples) -> list[Sample]:
        name = api.get("Name", f"api{a}")
        try:
            tools = tools_from_toolalpaca(api)
        except SchemaError as e:
            raise DatasetError(f"API {name!r}: {e}") from None
        if not any(t.name == GET_DETAILS.name for t in tools):
            tools = tools + [GET_DETAILS]
        intro = str(api.get("Introduction") or api.get("Description") or "").strip()
        system = (f"You are a helpful assistant that can use the {name} API to fulfil the user's request. {intro}\n"
                  "If the request lacks information that a function needs, call getDetails to ask the user.")
        answers = api.get("Golden_Answers")
        made = []
        for i, instruction in enumerate(api.get("Instructions") or []):
            meta: dict[str, Any] = {"api": name, "api_index": a, "index": i, "source": source,
                                    "category": api.get("Category")}
            try:
                gold = _golden_calls(answers[i], meta) if answers is not None and i < len(answers) else None
            except (DatasetError, AttributeError, TypeError) as e:
                samples.skip(f"{source} API {name!r} instruction {i}", e)
                continue
            made.append(Sample(
                id=f"toolalpaca-{a}-{i}",
                dataset="toolalpaca",
                messages=[{"role": "system", "content": system}, {"role": "user", "content": str(instruction)}],
                tools=tools,
                gold=gold,
                dialect=DEFAULT_DIALECT,
                meta=meta,
            ))
        return made

    return build_samples(apis, source, make, what="API")


def _golden_calls(steps: Any, meta: dict[str, Any]) -> list[ToolCall] | None:
    """The golden action sequence of one instruction; records its optional steps and placeholders in ``meta``."""
    if steps is None:
        return None
    gold, optional = [], []
    for s, step in enumerate(steps):
        action = str(step.get("Action", "")).strip()
        if action.lower().startswith("[optional]"):
            action = action[len("[optional]"):].strip()
            optional.append(s)
        try:
            args = parse_toolalpaca_input(step.get("Action_Input"))
        except DatasetError as e:
            raise DatasetError(f"step {s}: {e}") from None
        # "" marks an argument the golden answer leaves unset: drop it, as a model would.
        gold.append(ToolCall(action, {k: v for k, v in args.items() if v != ""}))
    meta.update(optional_steps=optional, golden_raw=steps,
                placeholders=[(s, k) for s, c in enumerate(gold) for k, v in c.arguments.items()
                              if is_placeholder(v)])
    return gold


def load_toolalpaca(path: str | Path | None = None) -> Samples:
    """ToolAlpaca eval_simulated: 10 APIs, 100 instructions; gold is the golden action sequence."""
    if path is not None:
        return toolalpaca_samples(read_records(path), source=str(path))
    return toolalpaca_samples(read_records(data_path("toolalpaca", "eval_simulated.json")),
                              source="toolalpaca/eval_simulated.json")


__all__ = ["GET_DETAILS", "is_placeholder", "load_toolalpaca", "parse_toolalpaca_input", "toolalpaca_samples",
           "tools_from_toolalpaca"]
