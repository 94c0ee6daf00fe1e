"""Training, validation and test requests, split by the teacher's tools (`split_traces`).

Tools used for training never appear as the called tool of a held-out item, so held-out agreement measures
how the sidecar does on tools it has never been trained on. The held-out tools always include those of the
benchmark items (`oospec bench run --dataset apibank --split 1 --limit N`), so the end-to-end evaluation
runs on items the sidecar never saw a call of.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def _rank(name: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


# -- the split of teacher traces (data manifest version 2) ---------------------------------------------------
PARTS = ("train", "validation", "test")
TRACE_SPLIT_RULE = (
    "by tool: each tool the teacher called is train, validation or test (by a seeded hash; tools an earlier "
    "adapter this one starts from was trained on always train; else the benchmark items' tools always test); a trace goes to test if the teacher called any test tool, else to validation if it "
    "called any validation tool, else to train; a trace without a call (a plain answer) goes where a seeded hash "
    "of its id sends it; a trace whose teacher call names a tool the request did not offer is dropped")


@dataclass
class TraceSplit:
    seed: int
    fractions: tuple[float, float, float]  # of the called tools: train, validation, test
    tools: dict[str, list[str]]  # part -> tool names
    traces: dict[str, list[dict]]  # part -> trace records
    dropped: dict[str, str]  # trace id -> why

    def manifest(self, **extra) -> dict:
        return {"version": 2, "seed": self.seed, "fractions": list(self.fractions), "rule": TRACE_SPLIT_RULE,
                **extra, "tools": {p: sorted(self.tools[p]) for p in PARTS},
                "items": {p: [t["id"] for t in self.traces[p]] for p in PARTS}, "dropped": self.dropped}


def teacher_calls(trace: dict) -> list[dict]:
    """Every call the teacher wrote (older traces record only the first)."""
    calls = trace.get("calls")
    if calls is None:
        calls = [trace["call"]] if trace.get("call") else []
    return calls


def _part_of(key: str, seed: int, fractions: tuple[float, float, float]) -> str:
    u = int(_rank(key, seed)[:12], 16) / 16**12
    if u < fractions[0]:
        return "train"
    return "validation" if u < fractions[0] + fractions[1] else "test"


def split_traces(traces: Sequence[dict], seed: int = 0, fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
                 always_test_tools: Sequence[str] = (), always_train_tools: Sequence[str] = ()) -> TraceSplit:
    """`always_test_tools`: the benchmark items' tools. `always_train_tools`: tools already trained on (those of
    an adapter training starts from); they are train whatever else is said, since they are not fresh."""
    if abs(sum(fractions) - 1) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"split fractions must be >= 0 and sum to 1, got {fractions}")
    forced = set(always_test_tools)
    trained = set(always_train_tools)
    part_of_tool: dict[str, str] = {}
    dropped: dict[str, str] = {}
    kept = []
    for t in traces:
        offered = {tool["function"]["name"] if "function" in tool else tool.get("name") for tool in t["tools"]}
        names = [c["name"] for c in teacher_calls(t)]
        stray = [n for n in names if n not in offered]
        if stray:
            dropped[t["id"]] = f"the teacher called {stray[0]!r}, which the request did not offer"
            continue
        kept.append((t, names))
        for n in names:
            part_of_tool.setdefault(n, "train" if n in trained else "test" if n in forced
                                    else _part_of("tool:" + n, seed, fractions))
    out = {p: [] for p in PARTS}
    for t, names in kept:
        parts = {part_of_tool[n] for n in names}
        part = next((p for p in ("test", "validation", "train") if p in parts), None)
        out[part or _part_of("item:" + t["id"], seed, fractions)].append(t)
    tools = {p: [n for n, q in part_of_tool.items() if q == p] for p in PARTS}
    return TraceSplit(seed, tuple(fractions), tools, out, dropped)


def write_trace_split(split: TraceSplit, out_dir: str | Path, **manifest_extra) -> dict[str, Path]:
    """train.jsonl, validation.jsonl, test.jsonl and manifest.json in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for p in PARTS:
        paths[p] = out / f"{p}.jsonl"
        paths[p].write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in split.traces[p]),
                            encoding="utf-8")
    paths["manifest"] = out / "manifest.json"
    paths["manifest"].write_text(json.dumps(split.manifest(**manifest_extra), indent=1) + "\n")
    return paths


def benchmark_tools(reserved: Sequence[tuple[str, str | None, int]]) -> list[str]:
    """The gold tools of the benchmark items each (dataset, split, first N) reserves: kept out of training."""
    from oospec.datasets import load_dataset

    return sorted({c.name for d, sp, n in reserved if n for s in load_dataset(d, split=sp, limit=n)
                   for c in s.gold or []})


def adapter_trained_tools(adapter_dir: str | Path) -> list[str]:
    """The tools an adapter was trained on, from its data_manifest.json (either manifest version)."""
    path = Path(adapter_dir) / "data_manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: an adapter to start from needs its data manifest (which tools it saw)")
    m = json.loads(path.read_text())
    return sorted(m["tools"]["train"] + m["tools"]["validation"]) if m.get("version") == 2 else sorted(m["train_tools"])
