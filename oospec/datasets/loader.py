"""Datasets by name (``apibank``, ``bfcl``, ``toolalpaca``, ``name:split``) or by file, format detected."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oospec.datasets.apibank import apibank_samples, load_apibank
from oospec.datasets.bfcl import BFCL_SPLITS, bfcl_file, load_bfcl
from oospec.datasets.generic import generic_samples
from oospec.datasets.sample import DatasetError, Samples, read_records
from oospec.datasets.toolalpaca import load_toolalpaca, toolalpaca_samples
from oospec.errors import did_you_mean
from oospec.tools.dialects import DEFAULT_DIALECT


def detect_format(records: Sequence[Any]) -> str:
    first = next((r for r in records if isinstance(r, Mapping)), None)
    if first is None:
        raise DatasetError("empty file or no JSON objects in it")
    if {"system", "user"} <= first.keys():
        return "apibank"
    if {"question", "function"} <= first.keys():
        return "bfcl"
    if "Instructions" in first or "Documentation" in first or "Functions" in first:
        return "toolalpaca"
    if "messages" in first:
        return "generic"
    raise DatasetError(f"unknown dataset format (keys: {sorted(first)[:8]}); "
                       "expected API-Bank, BFCL, ToolAlpaca or {messages, tools, gold} records")


def load_path(path: str | Path, format: str = "auto", *, dialect: str | None = None) -> Samples:
    """Any file in one of the supported formats (JSON, JSON Lines, optionally gzipped):
    ``apibank`` (ToolSpec items), ``bfcl`` (answers from a sibling ``possible_answer/`` file of the same name,
    or inline ``ground_truth``), ``toolalpaca`` (API entries), ``generic`` (``{"messages", "tools", "gold"}``).
    Malformed records are skipped with a warning and counted in ``.skipped``."""
    path = Path(path)
    records = read_records(path)
    fmt = detect_format(records) if format == "auto" else format
    if fmt == "apibank":
        m = re.search(r"level-(\d)", path.name)
        return apibank_samples(records, level=int(m.group(1)) if m else path.stem, source=str(path))
    if fmt == "bfcl":
        return bfcl_file(path, dialect=dialect or DEFAULT_DIALECT, records=records)
    if fmt == "toolalpaca":
        return toolalpaca_samples(records, source=str(path))
    if fmt == "generic":
        return generic_samples(records, source=str(path), dialect=dialect)
    raise DatasetError(f"unknown format {format!r}; choose auto, apibank, bfcl, toolalpaca or generic")


DATASETS: dict[str, tuple[str, ...]] = {
    "apibank": ("1", "2", "3", "all"),
    "bfcl": (*BFCL_SPLITS, "all"),
    "toolalpaca": ("eval_simulated",),
}
_NAME_ALIASES = {"api-bank": "apibank", "api_bank": "apibank", "tool-alpaca": "toolalpaca",
                 "tool_alpaca": "toolalpaca"}


def load_dataset(name: str, split: str | int | None = None, limit: int | None = None, **kwargs) -> Samples:
    """``apibank`` (split 1/2/3/all, default all), ``bfcl`` (split simple_python/multiple/parallel/
    parallel_multiple/all, default all), ``toolalpaca``; ``name:split`` works too, and so does a file path."""
    key = name.strip()
    if split is None and ":" in key and not Path(key).exists():
        key, split = key.split(":", 1)
    key = _NAME_ALIASES.get(key.lower(), key.lower())
    if key == "apibank":
        samples = load_apibank("all" if split is None else split, **kwargs)
    elif key == "bfcl":
        samples = load_bfcl("all" if split is None else str(split), **kwargs)
    elif key == "toolalpaca":
        if split not in (None, "eval_simulated", "all"):
            raise DatasetError(f"toolalpaca has one split, eval_simulated; got {split!r}")
        samples = load_toolalpaca(**kwargs)
    elif Path(name).exists():
        samples = load_path(name, **kwargs)
    else:
        raise DatasetError(f"unknown dataset {name!r}{did_you_mean(key, DATASETS)}; choose one of {', '.join(DATASETS)} or give a file path")
    if limit is not None:
        samples = samples.head(limit)
    return samples


__all__ = ["DATASETS", "detect_format", "load_dataset", "load_path"]
