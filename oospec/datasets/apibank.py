"""API-Bank as preprocessed by ToolSpec: the prose tool list of its system prompts, and its samples."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oospec.datasets.prose import literal_dict
from oospec.datasets.sample import DatasetError, Sample, Samples, build_samples, data_path, read_records
from oospec.errors import SchemaError
from oospec.tools.dialects import ToolCall
from oospec.tools.schema import Param, Tool, check_unique_names, normalize_type

APIBANK_LEVELS = (1, 2, 3)

# "1. Name: ToolName\nDescription: ...\nParameters: {...}"   (ToolSpec levels 1 and 2)
_APIBANK_NAMED = re.compile(r"^(?:\d+\.\s*)?Name:\s*(?P<name>[^\n]+?)\s*\n(?P<body>.*?)(?=^(?:\d+\.\s*)?Name:|\Z)",
                            re.M | re.S)
# "1. ToolName: description\nParameters: {...}"               (ToolSpec level 3)
_APIBANK_INLINE = re.compile(r"^\d+\.\s*(?P<name>[A-Za-z_][\w.\-]*):\s*(?P<desc>[^\n]*)\n\s*Parameters:", re.M)
_OPTIONAL_RE = re.compile(r"^\s*\[?\s*optional\b", re.I)


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
            tools.append(_apibank_tool(name, desc, literal_dict(body[pm.end():], where), where))
    else:
        for m in _APIBANK_INLINE.finditer(text):
            name = m.group("name")
            where = f"tool {name!r}"
            tools.append(_apibank_tool(name, m.group("desc").strip(), literal_dict(text[m.end():], where), where))
    check_unique_names([t.name for t in tools])
    return tools


def _apibank_tool(name: str, desc: str, params: dict, where: str) -> Tool:
    ps = tuple(_apibank_param(k, v, f"{where} parameter {k!r}") for k, v in params.items())
    required = tuple(p.name for p in ps if not _OPTIONAL_RE.match(p.description))
    return Tool(name=name, description=desc, parameters=ps, required=required)


def apibank_samples(records: Sequence[Any], *, level: Any, source: str) -> Samples:
    def make(i: int, rec: Any, _samples: Samples) -> list[Sample]:
        try:
            system, user = rec["system"], rec["user"]
        except (KeyError, TypeError):
            raise DatasetError("API-Bank items need 'system' and 'user'") from None
        tools = tools_from_apibank_prompt(system)
        answer = rec.get("answer")
        gold = None
        if answer is not None:
            answers = answer if isinstance(answer, list) else [answer]
            gold = [ToolCall.from_dict(a) for a in answers]
        other = rec.get("other") if isinstance(rec.get("other"), dict) else {}
        # Level-1 items from one dialogue file are the successive turns of one agent session.
        session = {"session": f"{source}:{other['file']}", "turn": other.get("id", i)} if "file" in other else {}
        return [Sample(
            id=f"apibank-l{level}-{i}",
            dataset="apibank",
            # Exactly ToolSpec's evaluation/eval.py: [system, user], tools described in the system prose.
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            tools=tools,
            gold=gold,
            dialect="apibank",
            meta={"level": level, "index": i, "source": source, "other": rec.get("other"), "tools_in_prompt": True,
                  **session},
        )]

    return build_samples(records, source, make)


def load_apibank(level: int | str = "all", path: str | Path | None = None) -> Samples:
    """API-Bank as preprocessed by ToolSpec: level 1 (399), 2 (67), 3 (131) or "all" (597, in that order)."""
    if path is not None:
        return apibank_samples(read_records(path), level=level, source=str(path))
    if str(level).lower() == "all":
        return Samples.concat(load_apibank(lv) for lv in APIBANK_LEVELS)
    try:
        lv = int(str(level).removeprefix("level-").removeprefix("level"))
    except ValueError:
        lv = None
    if lv not in APIBANK_LEVELS:
        raise DatasetError(f"API-Bank level must be 1, 2, 3 or 'all', got {level!r}")
    name = f"level-{lv}-api_processed.json"
    return apibank_samples(read_records(data_path("apibank", name)), level=lv, source=f"apibank/{name}")


__all__ = ["APIBANK_LEVELS", "apibank_samples", "load_apibank", "tools_from_apibank_prompt"]
