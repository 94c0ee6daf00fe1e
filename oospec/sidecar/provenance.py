"""Where a sidecar adapter comes from: the digest of its weights and the data it was trained on.

An adapter folder holds its weights (`adapter_model.safetensors`) and, when `oospec sidecar traces` made its
data, the split manifest (`data_manifest.json`, written as `manifest.json` next to the traces; see
oospec.training.split): the items used (trained on, or used to choose settings), and the tools they call. A
benchmark item listed there, or one that calls such a tool (unless the split held it out as a test item), measures
recall of training data, not prediction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from oospec.errors import OospecError

ADAPTERS_DIR = Path(__file__).parent / "adapters"  # the adapters shipped with the package, a folder each
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")
MANIFEST_FILES = ("data_manifest.json", "manifest.json")


def _first_file(adapter: str | Path | None, names: tuple[str, ...]) -> Path | None:
    """The first of `names` that exists in the adapter folder (None: no adapter, or none of them)."""
    if not adapter:
        return None
    return next((Path(adapter) / n for n in names if (Path(adapter) / n).is_file()), None)


def weights_sha256(adapter: str | Path | None) -> str | None:
    """SHA-256 of the adapter's weights file (None: no adapter, or no weights file in it)."""
    path = _first_file(adapter, WEIGHTS_FILES)
    if path is None:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class TrainingManifest:
    path: str
    items: frozenset[str]  # ids of the requests that shaped the adapter: trained on, or used to choose its settings
    tools: frozenset[str]  # the tools those requests call
    # Items the split itself held out (version 2: its test items). They are fresh whatever tool their gold call
    # names: the split placed them by what the teacher, the target model, called, and no such tool was trained on.
    held_out: frozenset[str] = frozenset()

    def overlap(self, item_id: str, called: set[str]) -> list[str]:
        """Why an item is not held out from this adapter (empty: it is)."""
        if item_id in self.items:
            return [f"item {item_id} is a training item"]
        if item_id in self.held_out:
            return []
        return [f"calls training tool {name}" for name in sorted(called & self.tools)]


def training_manifest(adapter: str | Path | None, _seen: frozenset[str] = frozenset()) -> TrainingManifest | None:
    """The adapter's training manifest, or None when it has none (then nothing can be checked).

    Version 2 (`split.split_traces`): train and validation items and tools count as used (validation chose the
    settings and the checkpoint, so it is not fresh either); test items are held out. An adapter trained on top
    of another (`init_adapter`) also carries everything that one used. The first format: its train items and
    tools, and the items traced for it."""
    path = _first_file(adapter, MANIFEST_FILES)
    if path is None:
        return None
    doc = json.loads(path.read_text())
    if doc.get("version") != 2:
        used = (doc.get("sources") or {}).get("used_train_items") or []
        return TrainingManifest(str(path), frozenset(doc.get("train_items", [])) | frozenset(used),
                                frozenset(doc.get("train_tools", [])))
    used_parts = ("train", "validation")
    items = frozenset(i for part in used_parts for i in doc["items"][part])
    tools = frozenset(t for part in used_parts for t in doc["tools"][part])
    held_out = frozenset(doc["items"]["test"])
    parent = _init_manifest(adapter, doc.get("init_adapter"), _seen | {str(Path(adapter).resolve())})
    if parent is not None:
        items, tools, held_out = items | parent.items, tools | parent.tools, held_out - parent.items
    return TrainingManifest(str(path), items, tools, held_out)


def _init_manifest(adapter: str | Path, init: str | None, seen: frozenset[str]) -> TrainingManifest | None:
    """The manifest of the adapter this one started from: a folder path, or the name of a sibling folder or of
    a shipped adapter (how `oospec sidecar split --init-adapter` records one). One that cannot be found is an
    error: what it was trained on would go unchecked."""
    if not init:
        return None
    folder = next((p for p in (Path(init), Path(adapter).parent / init, ADAPTERS_DIR / init) if p.is_dir()), None)
    if folder is None:
        raise OospecError(f"{adapter}: its manifest says it started from adapter {init!r}, which is not there "
                                "(its training data could not be checked)")
    if str(folder.resolve()) in seen:
        return None  # an adapter that replaced the one it started from, in the same folder
    return training_manifest(folder, seen)
