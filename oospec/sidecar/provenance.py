"""Where a sidecar adapter comes from: the digest of its weights and the data it was trained on.

An adapter folder holds its weights (`adapter_model.safetensors`) and, when `oospec sidecar traces` made its
data, the split manifest (`data_manifest.json`, written as `manifest.json` next to the traces; see
oospec.training.split): the training items, and the tools they call. A benchmark item listed there, or one
that calls a training tool, measures recall of training data, not prediction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

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
    items: frozenset[str]  # ids of the requests on the training side of the split (and those traced)
    tools: frozenset[str]  # the tools those requests call

    def overlap(self, item_id: str, called: set[str]) -> list[str]:
        """Why an item is not held out from this adapter (empty: it is)."""
        reasons = [f"item {item_id} is a training item"] if item_id in self.items else []
        reasons += [f"calls training tool {name}" for name in sorted(called & self.tools)]
        return reasons


def training_manifest(adapter: str | Path | None) -> TrainingManifest | None:
    """The adapter's training manifest, or None when it has none (then nothing can be checked)."""
    path = _first_file(adapter, MANIFEST_FILES)
    if path is None:
        return None
    doc = json.loads(path.read_text())
    used = (doc.get("sources") or {}).get("used_train_items") or []
    return TrainingManifest(str(path), frozenset(doc.get("train_items", [])) | frozenset(used),
                            frozenset(doc.get("train_tools", [])))
