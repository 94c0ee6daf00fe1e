"""What a target copies from the prompt's listing of the tools instead of writing the call it means.

The schema pasted as the argument values. Where the prompt shows each tool's parameters as text
(`Parameters: {'token': {'type': 'str', 'description': "User's token."}, ...}` in the system turn), a target may
answer by pasting that schema as the values, `"token": {"type": "str", "description": "User's token."}`, and once
it has pasted the first it pastes every argument. A drafter that offers the paste as a branch at the first value,
and follows it through once it has begun, drafts those calls as fast as any other; `schema_entries` reads the
entries the target would paste from the prompt.

The listing's label written as the function name. Where each tool is listed as `1. Name: DeleteAgenda`, a
target may name its call `"Name"` (with the arguments of the tool it means) or `"Name: DeleteAgenda"`;
`name_label` finds such a label.

Whether a target does either, and how often, is its dialect's profile's to say (oospec.tools.profile).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oospec.tools.schema import Tool

# A tool's parameters are looked for this far after its name (a few parameters with their descriptions).
WINDOW = 4000
LABEL_JOINT = ": "  # between the listing's label and a tool's name, as the target writes them in a name


def _object_at(text: str, start: int) -> str | None:
    """The balanced `{...}` that begins at text[start] (quotes of either kind respected), or None."""
    depth, quote, escaped = 0, "", False
    for i in range(start, min(len(text), start + WINDOW)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def _literal(text: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def name_label(text: str, tools: Sequence[Tool]) -> str | None:
    """The word the prompt writes before every tool's name as `<word>: <name>` ("Name"), or None."""
    labels = set()
    for tool in tools:
        found = re.search(r"(\w+):[ \t]*" + re.escape(tool.name) + r"\b", text)
        if found is None:
            return None
        labels.add(found.group(1))
    return labels.pop() if len(labels) == 1 else None


@dataclass(frozen=True)
class ShownTools:
    """What the prompt's own turns show of the tools, that the target may copy (see the module docstring)."""

    entries: Mapping[str, Mapping[str, Mapping[str, Any]]]  # tool -> parameter -> its schema entry
    label: str | None = None  # the word before each tool's name in the listing ("Name")

    @classmethod
    def from_prompt(cls, text: str, tools: Sequence[Tool]) -> ShownTools:
        return cls(schema_entries(text, tools), name_label(text, tools))


def schema_entries(text: str, tools: Sequence[Tool]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """{tool name: {parameter: its schema entry as the prompt shows it}} for the tools whose every parameter
    `text` (the prompt's own turns) shows as a `'name': {...}` entry with a type or a description after the
    tool's name. Tools shown otherwise (or only through a chat template's tool block) are left out."""
    out: dict[str, dict[str, Mapping[str, Any]]] = {}
    for tool in tools:
        at = text.find(tool.name)
        if at < 0 or not tool.parameters:
            continue
        window = text[at : at + WINDOW]
        entries = {}
        for param in tool.parameters:
            found = re.search(r"""(['"])""" + re.escape(param.name) + r"""\1\s*:\s*(?=\{)""", window)
            raw = _object_at(window, found.end()) if found else None
            entry = _literal(raw) if raw else None
            if not isinstance(entry, dict) or not ({"type", "description"} & set(entry)):
                break
            entries[param.name] = entry
        else:
            out[tool.name] = entries
    return out


__all__ = ["LABEL_JOINT", "ShownTools", "name_label", "schema_entries"]
