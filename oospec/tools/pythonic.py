"""Tool calls in Python syntax (`[f(a=1), g(b="x")]`): values written as Python literals, calls read back with
`ast`, as evaluators of this format read them."""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from typing import Any


def py_literal(value: Any) -> str:
    """A Python literal for a JSON-like value, strings double-quoted as models write them."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return f'float("{value}")'
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(py_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as a Python literal")


def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _ast_value(node: ast.AST) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        if isinstance(node, ast.Call) and _dotted_name(node.func) == "float" and len(node.args) == 1:
            try:
                return float(ast.literal_eval(node.args[0]))
            except (ValueError, SyntaxError, TypeError):
                pass
        if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[node.id]
        return ast.unparse(node)  # a variable or expression: keep its source
    return detuple(value)


def detuple(v: Any) -> Any:
    if isinstance(v, tuple):
        return [detuple(x) for x in v]
    if isinstance(v, list):
        return [detuple(x) for x in v]
    if isinstance(v, dict):
        return {k: detuple(x) for k, x in v.items()}
    return v


def _call_from_ast(node: ast.AST) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(node, ast.Call):
        return None
    name = _dotted_name(node.func)
    if name is None:
        return None
    # Positional arguments are ignored, as evaluators of this format ignore them; only keywords carry names.
    return name, {kw.arg: _ast_value(kw.value) for kw in node.keywords if kw.arg is not None}


def parse_call_list(src: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a Python list (or tuple) of calls, or of a single call: [(name, keyword arguments)];
    [] unless every element is a call."""
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    body = tree.body
    elts = body.elts if isinstance(body, ast.List | ast.Tuple) else [body]
    calls = [_call_from_ast(e) for e in elts]
    if not calls or any(c is None for c in calls):
        return []
    return calls  # type: ignore[return-value]


def parse_call_expr(src: str, keywords_only: bool = False) -> tuple[str, dict[str, Any]] | None:
    """(name, keyword arguments) of one call expression; None if it is not one (with `keywords_only`: if it
    has positional arguments)."""
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if keywords_only and isinstance(tree.body, ast.Call) and tree.body.args:
        return None  # prose such as "see figure(2)" is not a call
    return _call_from_ast(tree.body)
