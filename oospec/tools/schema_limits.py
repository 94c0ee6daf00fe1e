"""What a call grammar can hold: the parameter schemas refused before a forced call is decoded.

A forced call (tool_choice "required" or a named function) is decoded under the tools' parameters as a grammar
(oospec.tools.call_grammar, followed by llguidance). Some schemas compile but cannot be followed, and would fail
only once decoding reaches them. Each class is refused here, by shape, when the request is admitted:

  wide       an object with more than MAX_ALTERNATIVES optional properties, or an anyOf/oneOf with more members:
             llguidance's Earley parser keeps about four items per optional property (any subset, in order) and
             one per member in a row that holds at most 2,000, so such a choice overflows it (600 optional
             properties did, 500 did not);
  idle loop  a cycle of $ref/allOf/anyOf/oneOf/not/if/then/else that reads no character on its way round (A is
             B, B is A): at best redundant, at worst a value no text can be (an allOf cycle made llguidance fail,
             NoExtensionBias). A cycle that passes through a property or an array item (a tree, a linked list) is
             a recursive value and is kept;
  deep refs  a chain of more than MAX_REF_HOPS references followed one after another.

What passes here may still fail to compile (a $ref to a missing or remote document, an integer range wider than
64 bits): the compiler says so at admission too. Anything that still fails while decoding ends the reply there
(oospec.engine.constraint: `failure`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from oospec.errors import OospecError

MAX_ALTERNATIVES = 256  # optional properties of one object, members of one anyOf/oneOf
MAX_REF_HOPS = 64  # $refs followed in a row without reading a character

# Keywords whose subschema describes the same value (reading no character on the way to it).
_SAME_VALUE = ("allOf", "anyOf", "oneOf")
_SAME_VALUE_ONE = ("not", "if", "then", "else")
# Keywords whose subschemas describe parts of the value (a property, an item): a cycle through them reads text.
_PART_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_PART_ONE = ("items", "additionalProperties", "contains", "propertyNames", "unevaluatedProperties",
             "unevaluatedItems")
_PART_LISTS = ("prefixItems", "items")


class UnsupportedSchema(OospecError):
    """A parameters schema no call grammar can follow: `reason` says why, `pointer` where (a JSON Pointer into the
    parameters), `function` whose."""

    def __init__(self, reason: str, pointer: str, function: str | None = None):
        where = f"at {pointer or '/'}" + (f" of function {function!r}'s parameters" if function else "")
        super().__init__(f"{reason} ({where})")
        self.reason, self.pointer, self.function = reason, pointer, function


def check_schema(schema: Any) -> None:
    """UnsupportedSchema for the first class above that `schema` (a tool's parameters) falls in."""
    if not isinstance(schema, Mapping):
        return
    nodes = _subschemas(schema)
    for pointer, node in nodes.items():
        _check_width(node, pointer)
    _check_idle_loops(schema, nodes)


def _subschemas(root: Mapping) -> dict[str, Mapping]:
    """Every schema object in `root` by its JSON Pointer ("" is the root)."""
    found: dict[str, Mapping] = {}
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        pointer, node = stack.pop()
        if not isinstance(node, Mapping) or pointer in found:
            continue
        found[pointer] = node
        for key in _SAME_VALUE_ONE + _PART_ONE:
            stack.append((f"{pointer}/{key}", node.get(key)))
        for key in _SAME_VALUE + _PART_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((f"{pointer}/{key}/{i}", item) for i, item in enumerate(node[key]))
        for key in _PART_MAPS:
            if isinstance(node.get(key), Mapping):
                stack.extend((f"{pointer}/{key}/{_escape(str(k))}", v) for k, v in node[key].items())
    return found


def _check_width(node: Mapping, pointer: str) -> None:
    properties = node.get("properties")
    if isinstance(properties, Mapping):
        required = node.get("required")
        required = set(required) if isinstance(required, list) and all(isinstance(r, str) for r in required) else set()
        optional = sum(1 for name in properties if name not in required)
        if optional > MAX_ALTERNATIVES:
            raise UnsupportedSchema(f"an object with {optional} optional properties (a forced call's grammar holds at "
                                    f"most {MAX_ALTERNATIVES}; mark more of them required, or use tool_choice auto)",
                                    pointer)
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and len(members) > MAX_ALTERNATIVES:
            raise UnsupportedSchema(f"{key} with {len(members)} members (a forced call's grammar holds at most "
                                    f"{MAX_ALTERNATIVES})", pointer)


def _check_idle_loops(root: Mapping, nodes: dict[str, Mapping]) -> None:
    """Follow, from every schema, the edges that read no character ($ref and the same-value keywords); a cycle
    among them, or a $ref chain longer than MAX_REF_HOPS, is refused."""
    @lru_cache(maxsize=None)  # each schema's edges are read when it is entered and again when it is done
    def idle_edges(pointer: str) -> list[str]:
        node = nodes[pointer]
        out = []
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            target = _resolve(root, ref)
            if target is not None:
                out.append(target)
        for key in _SAME_VALUE_ONE:
            if isinstance(node.get(key), Mapping):
                out.append(f"{pointer}/{key}")
        for key in _SAME_VALUE:
            if isinstance(node.get(key), list):
                out.extend(f"{pointer}/{key}/{i}" for i, item in enumerate(node[key]) if isinstance(item, Mapping))
        return [p for p in out if p in nodes]

    state: dict[str, int] = {}  # 1: on the current path, 2: done
    height: dict[str, int] = {}  # the longest chain of idle edges from a finished schema
    for start in nodes:
        if state.get(start):
            continue
        path, edges = [start], [iter(idle_edges(start))]
        state[start] = 1
        while path:
            nxt = next(edges[-1], None)
            if nxt is None:
                done = path.pop()
                edges.pop()
                state[done] = 2
                height[done] = max((height[c] + 1 for c in idle_edges(done)), default=0)
                if height[done] > MAX_REF_HOPS:
                    raise UnsupportedSchema(f"more than {MAX_REF_HOPS} references followed in a row", done)
                continue
            if state.get(nxt) == 1:
                loop = path[path.index(nxt):] + [nxt]
                route = " -> ".join(p or "/" for p in loop)
                raise UnsupportedSchema(f"a $ref cycle that reads no character on its way round ({route}); a "
                                        "recursion must pass through a property or an array item", nxt)
            if state.get(nxt) != 2:
                state[nxt] = 1
                path.append(nxt)
                edges.append(iter(idle_edges(nxt)))


def _resolve(root: Mapping, ref: str) -> str | None:
    """The JSON Pointer of a local `$ref` ("#", "#/definitions/A"), normalised to `_subschemas`' keys; None when
    it points at nothing (the compiler refuses that one itself)."""
    node: Any = root
    parts = [] if ref == "#" else [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]
    for part in parts:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return "".join(f"/{_escape(p)}" for p in parts)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
