"""Dialect profiles measured on the teacher's training traces, written where the drafters read them.

    python -m oospec.training.profiles [--traces FILE] [--adapter auto] [--out oospec/tools/profiles]

The traces are the whole traced pool (`experiments/results/sidecar-traces-v3/`), split as `oospec sidecar split
--init-adapter <the shipped adapter>` splits them, and only the train part is counted: the benchmark items'
tools are always test, so what the drafters expect of the target is never learned from a held-out item.

A trace whose call is the listing's label (`Name`, `Name: QueryStock`) names no offered tool, and the split
would drop it; it is split as the call of the tool it means (none, for the label alone: then by its id), so
that the habit is counted where its trace belongs.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from oospec.tools.pasted import LABEL_JOINT, ShownTools
from oospec.tools.profile import PROFILES, DialectProfile, Rate
from oospec.tools.schema import tools_from_openai
from oospec.training.split import teacher_calls

DEFAULT_TRACES = Path("experiments/results/sidecar-traces-v3/traces.jsonl.gz")


def shown_tools(trace: dict) -> ShownTools:
    """What the trace's prompt shows of its tools in its own turns (as the schema drafter reads it)."""
    text = "\n".join(m["content"] for m in trace["messages"] if isinstance(m.get("content"), str))
    return ShownTools.from_prompt(text, tools_from_openai(trace["tools"]))


def meant_calls(trace: dict) -> dict:
    """The trace with each call named by the listing's label renamed to the tool it means (dropped if none)."""
    label = shown_tools(trace).label
    if label is None:
        return trace
    calls = []
    for call in teacher_calls(trace):
        name = call["name"]
        if name == label:
            continue
        if name.startswith(label + LABEL_JOINT):
            call = {**call, "name": name[len(label + LABEL_JOINT) :]}
        calls.append(call)
    return {**trace, "calls": calls, "call": calls[0] if calls else None}


def measure(traces: Iterable[dict], dialect: str, target: str | None = None, **measured_on) -> DialectProfile:
    """The habits the target shows in `traces` of `dialect` (each trace counted whole: every call in it)."""
    count = Counter()
    in_prompt = []
    for trace in traces:
        if trace.get("dialect") != dialect:
            continue
        count["traces"] += 1
        in_prompt.append(not trace.get("chat_tools"))
        shown = shown_tools(trace)
        by_name = {t.name: t for t in tools_from_openai(trace["tools"])}
        for call in teacher_calls(trace):
            tool, args = by_name.get(call["name"]), call["arguments"]
            entries = shown.entries.get(tool.name) if tool is not None else None
            if entries:
                count["paste chances"] += 1
                if args.get(tool.parameters[0].name) == entries[tool.parameters[0].name]:
                    count["pasted first"] += 1
                    count["pasted all"] += all(entries.get(k) == v for k, v in args.items())
            if shown.label is not None:
                count["label chances"] += 1
                count["label alone"] += call["name"] == shown.label
                count["label named"] += call["name"].startswith(shown.label + LABEL_JOINT)
    labelled = count["label alone"] + count["label named"]
    return DialectProfile(
        dialect=dialect, target=target, tools_in_prompt=bool(in_prompt) and all(in_prompt),
        pasted_schema=Rate(count["pasted first"], count["paste chances"]),
        paste_continued=Rate(count["pasted all"], count["pasted first"]),
        listing_label=Rate(labelled, count["label chances"]), label_alone=Rate(count["label alone"], labelled),
        measured_on={**measured_on, "traces": count["traces"]})


def training_traces(traces: Sequence[dict], adapter_dir: str | Path) -> list[dict]:
    """The train part of `traces`, split as the project splits traces for an adapter that starts from
    `adapter_dir` (its seed and fractions; the benchmark items' tools always test)."""
    from oospec.training.pool import pool_sources
    from oospec.training.split import adapter_trained_tools, benchmark_tools, split_traces

    manifest = json.loads((Path(adapter_dir) / "data_manifest.json").read_text())
    split = split_traces([meant_calls(t) for t in traces], manifest["seed"], tuple(manifest["fractions"]),
                         always_test_tools=benchmark_tools([(s.dataset, s.split, s.reserved) for s in pool_sources()]),
                         always_train_tools=adapter_trained_tools(adapter_dir))
    train = {t["id"] for t in split.traces["train"]}
    return [t for t in traces if t["id"] in train]


def profiles_from_traces(traces_path: str | Path, adapter: str = "auto") -> list[DialectProfile]:
    """One profile per dialect of the training traces in `traces_path`."""
    from oospec.models.registry import DEFAULT_SIDECAR
    from oospec.sidecar.process import resolve_adapter
    from oospec.training.traces import read_traces

    adapter_dir = resolve_adapter(DEFAULT_SIDECAR, adapter)
    if adapter_dir is None:
        raise SystemExit(f"no sidecar adapter {adapter!r}: its data manifest says how traces are split")
    traces = read_traces(traces_path)
    if not traces:
        raise SystemExit(f"no traces in {traces_path}")
    manifest = json.loads((Path(adapter_dir) / "data_manifest.json").read_text())
    train = training_traces(traces, adapter_dir)
    record = {"file": Path(traces_path).name, "split": f"train, as for an adapter from {Path(adapter_dir).name}"}
    return [measure(train, dialect, manifest.get("teacher"), **record)
            for dialect in sorted({t["dialect"] for t in train})]


def write_profiles(profiles: Sequence[DialectProfile], out: str | Path = PROFILES) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for profile in profiles:
        path = out / f"{profile.dialect}.json"
        path.write_text(json.dumps(profile.to_json(), indent=1) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m oospec.training.profiles", description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(DEFAULT_TRACES), help="the traced pool (jsonl or jsonl.gz)")
    ap.add_argument("--adapter", default="auto", help="the sidecar adapter whose split the traces follow")
    ap.add_argument("--out", default=str(PROFILES), help="where the profiles are written")
    args = ap.parse_args(argv)
    profiles = profiles_from_traces(args.traces, args.adapter)
    for path, profile in zip(write_profiles(profiles, args.out), profiles):
        rates = {k: f"{v.hits}/{v.of}" for k, v in vars(profile).items() if isinstance(v, Rate)}
        print(f"{path}: tools in prompt {profile.tools_in_prompt}, {rates}")


if __name__ == "__main__":
    main()
