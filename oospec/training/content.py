"""The content hashes of an adapter's training data (`content` in its data manifest; see
oospec.sidecar.provenance): written by `oospec sidecar split`, and rewritten from an adapter's shipped traces by
`oospec sidecar rehash`, so a benchmark item is recognized by its request, whatever its id or file."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from oospec.datasets import Sample
from oospec.errors import OospecError
from oospec.sidecar.provenance import ADAPTERS_DIR, ProvenanceRequest, content_section, training_manifest, used_hashes
from oospec.training.split import PARTS, TraceSplit, teacher_calls
from oospec.training.traces import read_traces


def trace_request(trace: Mapping) -> ProvenanceRequest:
    return ProvenanceRequest(trace["id"], trace["messages"], trace["tools"],
                   frozenset(c["name"] for c in teacher_calls(trace)))


def project_items() -> dict[str, Sample]:
    """Every item of the project's own data the training pool draws from, by id (an earlier adapter's manifest
    names its items by these ids)."""
    from oospec.datasets import load_dataset
    from oospec.training.pool import pool_sources

    return {s.id: s for src in pool_sources() for s in load_dataset(src.dataset, split=src.split)}


def inherited_content(init_adapter: str | Path | None, previous: Mapping | None = None) -> dict | None:
    """What the adapter training starts from used, for the new manifest's `content`: its used items and tools,
    and their hashes. From its own `content` where it has one; else its items are loaded by id from the
    project's data (its synthetic requests, which have no such id, are listed as not hashed). `previous`: the
    `inherited` part of a manifest being rehashed, read when that adapter's folder is no longer there."""
    if not init_adapter:
        return None
    name = Path(init_adapter).name
    folder = next((p for p in (Path(init_adapter), ADAPTERS_DIR / str(init_adapter)) if p.is_dir()), None)
    if folder is not None:
        manifest = training_manifest(folder)
        if manifest is None:
            raise OospecError(f"{folder}: no data manifest, so what that adapter was trained on is unknown")
        section = json.loads(Path(manifest.path).read_text()).get("content")
        if section:
            parent = section.get("inherited") or {}
            return {"adapter": name, "items": sorted(manifest.items), "tools": sorted(manifest.tools),
                    "used": {**(parent.get("used") or {}), **section["used"]},
                    "not_hashed": parent.get("not_hashed", [])}
        items, tools = manifest.items, manifest.tools
    elif previous and previous.get("adapter") == name:
        items, tools = previous["items"], previous["tools"]
    else:
        raise OospecError(f"adapter {init_adapter!r} (the one training started from) is not there: what it used "
                          "cannot be hashed")
    known = project_items()
    used = used_hashes([known[i].provenance_request() for i in sorted(items) if i in known], set())
    return {"adapter": name, "items": sorted(items), "tools": sorted(tools), "used": used,
            "not_hashed": sorted(i for i in items if i not in known)}


def split_content(split: TraceSplit, init_adapter: str | Path | None) -> dict:
    """The `content` section of a new split's manifest."""
    return content_section([trace_request(t) for p in ("train", "validation") for t in split.traces[p]],
                           [trace_request(t) for t in split.traces["test"]], inherited_content(init_adapter))


def rehash_adapter(adapter: str | Path, traces: str | Path | None = None) -> dict:
    """Rewrite the `content` of an adapter's data manifest (version 2) from the traces it was split from (default:
    the `traces.jsonl.gz` in its folder): the parts are the manifest's own item lists. Returns the new section."""
    folder = Path(adapter)
    path = folder / "data_manifest.json"
    if not path.is_file():
        raise OospecError(f"{folder}: no data_manifest.json to rehash")
    doc = json.loads(path.read_text())
    if doc.get("version") != 2:
        raise OospecError(f"{path}: only a version 2 manifest (oospec sidecar split) can be rehashed")
    by_id = {t["id"]: t for t in read_traces(traces or folder / "traces.jsonl.gz")}
    parts: dict[str, Sequence[dict]] = {}
    for part in PARTS:
        missing = [i for i in doc["items"][part] if i not in by_id]
        if missing:
            raise OospecError(f"{path}: {len(missing)} {part} item(s) have no trace (e.g. {missing[0]}): pass the "
                              "traces the adapter was split from")
        parts[part] = [by_id[i] for i in doc["items"][part]]
    previous = (doc.get("content") or {}).get("inherited")
    doc["content"] = content_section([trace_request(t) for p in ("train", "validation") for t in parts[p]],
                                     [trace_request(t) for t in parts["test"]],
                                     inherited_content(doc.get("init_adapter"), previous))
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc["content"]
