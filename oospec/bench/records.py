"""The files every benchmark command writes, written by one set of functions (`bench run`, `bench serve`,
`bench vllm`): the output folder (default `runs/<timestamp>[-<command>]-<datasets>`), `samples.jsonl` (one
record per item and method, with `identical` and, when not, `first_diff` against the run's reference) and
the JSON files (`summary.json`, `run.json`...), floats rounded alike.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def first_difference(reference, tokens) -> int | None:
    """The first position where two token sequences (lists or arrays) differ, a length difference counting at
    the shorter one's end; None if they are equal."""
    a, b = np.asarray(reference).ravel(), np.asarray(tokens).ravel()
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    if differ.size:
        return int(differ[0])
    return None if a.size == b.size else n


def compared(reference, tokens) -> dict:
    """A record's comparison with the reference: {"identical": True} or {"identical": False, "first_diff": i}."""
    diff = first_difference(reference, tokens)
    return {"identical": True} if diff is None else {"identical": False, "first_diff": diff}


def to_json(value):
    """Floats rounded to 6 digits, inside dicts and lists (numpy scalars as Python numbers)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def output_folder(out: str | Path | None, datasets: Sequence[str], command: str | None = None) -> Path:
    """`out`, or runs/<timestamp>[-<command>]-<datasets>; created."""
    if out:
        folder = Path(out)
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        names = "+".join(re.sub(r"[^A-Za-z0-9._-]+", "_", Path(d).stem if Path(d).exists() else d) for d in datasets)
        folder = Path("runs") / "-".join([stamp, *([command] if command else []), names or "data"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(to_json(value), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


class RecordLog:
    """samples.jsonl in `folder`: one line per record, flushed as it comes (an interrupted run keeps its lines)."""

    def __init__(self, folder: Path, name: str = "samples.jsonl"):
        self.path = Path(folder) / name
        self._file = open(self.path, "w", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(to_json(record), ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
