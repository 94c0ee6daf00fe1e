"""Where a sidecar adapter comes from: the digest of its weights and the data it was trained on.

An adapter folder holds its weights (`adapter_model.safetensors`) and, when `oospec sidecar traces` made its
data, the split manifest (`data_manifest.json`, written as `manifest.json` next to the traces; see
oospec.training.split): the items used (trained on, or used to choose settings), and the tools they call. A
benchmark item that is one of those requests, or an earlier part of one's dialogue, or that calls such a tool
(unless the split held it out as a test item), measures recall of training data, not prediction.

Items are matched by content, not by id: ids of another file collide with the project's own. The manifest's
`content` section holds a hash of every used request and of every earlier state of its dialogue
(`request_hashes`), so a request is recognized whatever its id, file or whitespace. A manifest without that
section (one written before it existed) can only be checked by id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from oospec.errors import OospecError
from oospec.tools.schema import Tool, to_openai, tools_from_openai

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


# -- requests by content -----------------------------------------------------------------------------------
HASH_CHARS = 16  # hex characters of sha256 kept: 64 bits, no collision among a few thousand requests
CONTENT_RULE = (
    f"sha256 (first {HASH_CHARS} hex) of the offered tools (OpenAI form, keys sorted, whitespace runs as one space, "
    "sorted) and the request's turns (each message, its text cut before every line that opens a dialogue tag such "
    "as <user> or <obs>, whitespace normalized); `used` lists, per item, its request's hash and then those of the "
    "earlier states of its dialogue it contains (every run of its first turns, alone and followed by its last "
    "turn) not listed before: oospec.sidecar.provenance.request_hashes")
_TURN_START = re.compile(r"(?m)^(?=[ \t]*<[A-Za-z_][\w-]*>)")  # a dialogue flattened into one message
_SPACE = re.compile(r"\s+")


def _canonical(value):
    """Strings with their whitespace runs as one space; containers alike, recursively."""
    if isinstance(value, str):
        return _SPACE.sub(" ", value).strip()
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def request_turns(messages: Sequence[Mapping]) -> list[str]:
    """The request's turns, canonical: a message per turn, or, for a dialogue written into one message's text (as
    API-Bank does), a turn per tagged part, so that an earlier state of that dialogue is a run of these turns."""
    turns = []
    for m in messages:
        content = m.get("content")
        rest = _canonical({k: v for k, v in m.items() if k not in ("role", "content")})
        pieces = [p for p in _TURN_START.split(content) if p.strip()] if isinstance(content, str) else [content]
        pieces = pieces or [""]
        for k, piece in enumerate(pieces):
            turns.append(_dumps([m.get("role"), _canonical(piece), rest if k == len(pieces) - 1 else {}]))
    return turns


def _tools_text(tools: Sequence[Tool | Mapping]) -> str:
    dicts = [t for t in tools if not isinstance(t, Tool)]
    as_tools = [t for t in tools if isinstance(t, Tool)] + (tools_from_openai(dicts) if dicts else [])
    return _dumps(sorted(_dumps(_canonical(to_openai(t))) for t in as_tools)) + "\n"


def request_hashes(messages: Sequence[Mapping], tools: Sequence[Tool | Mapping]) -> tuple[str, list[str]]:
    """The request's content hash, and those of the earlier states of its dialogue that it contains: every run of
    its first turns, alone (a chat cut before a later turn) and followed by its last turn (a dialogue in one
    message, closed by the same instruction). `tools`: Tool objects or OpenAI-form dicts (the same hash)."""
    turns = [t + "\n" for t in request_turns(messages)]
    digest = hashlib.sha256(_tools_text(tools).encode())
    inside: dict[str, None] = {}
    for turn in turns[:-1]:
        digest.update(turn.encode())
        closed = digest.copy()
        closed.update(turns[-1].encode())
        inside.update({digest.hexdigest()[:HASH_CHARS]: None, closed.hexdigest()[:HASH_CHARS]: None})
    for turn in turns[-1:]:
        digest.update(turn.encode())
    full = digest.hexdigest()[:HASH_CHARS]
    return full, [h for h in inside if h != full]


@dataclass(frozen=True)
class ProvenanceRequest:
    """A request as provenance sees it: its id names it in messages, its content identifies it."""

    id: str
    messages: Sequence[Mapping]
    tools: Sequence[Tool | Mapping]
    called: frozenset[str]  # the tools its reference (gold or teacher) calls


def used_hashes(requests: Iterable[ProvenanceRequest], seen: set[str]) -> dict[str, str]:
    """id -> its request's hash, then those of the earlier states of its dialogue not in `seen` (which grows):
    each hash is listed once, under the first request that contains it."""
    out = {}
    for r in requests:
        full, inside = request_hashes(r.messages, r.tools)
        out[r.id] = " ".join([full, *(h for h in inside if h not in seen)])
        seen.update([full, *inside])
    return out


def content_section(used: Iterable[ProvenanceRequest], held_out: Iterable[ProvenanceRequest], inherited: Mapping | None = None) -> dict:
    """The manifest's `content`: the hashes of the used requests (each item's own first, then those of earlier
    states of its dialogue not listed before), the held-out (test) requests' hashes, the first used item that
    calls each tool, and what an adapter training started from used (`inherited`: adapter, items, tools and the
    hashes of its requests, or None)."""
    inherited = dict(inherited or {})
    seen = set(h for hashes in (inherited.get("used") or {}).values() for h in hashes.split())
    used = sorted(used, key=lambda r: r.id)
    out_used = used_hashes(used, seen)
    tool_items = {}
    for r in used:
        for name in sorted(r.called):
            tool_items.setdefault(name, r.id)
    tests = {r.id: request_hashes(r.messages, r.tools)[0] for r in sorted(held_out, key=lambda r: r.id)}
    return {"rule": CONTENT_RULE, "inherited": inherited or None, "used": out_used,
            "held_out": {i: h for i, h in tests.items() if h not in seen}, "tool_items": tool_items}


@dataclass(frozen=True)
class ContentIndex:
    """A manifest's `content` section, read for lookups: hash -> the item it came from."""

    requests: dict[str, str]  # a used request's own hash -> its id
    inside: dict[str, str]  # the hash of an earlier state of a used request's dialogue -> that request's id
    held_out: frozenset[str]  # the test requests' hashes
    tool_sources: dict[str, str]  # tool -> where it was called: the first used item that calls it, or an adapter

    @classmethod
    def read(cls, section: Mapping) -> ContentIndex:
        requests, inside, tool_sources = {}, {}, {}
        inherited = section.get("inherited") or {}
        for where, used in ((None, section["used"]), (inherited.get("adapter"), inherited.get("used") or {})):
            for item, hashes in used.items():
                own, *earlier = hashes.split()
                label = f"{item} of adapter {where}" if where else item
                requests.setdefault(own, label)
                inside.update({h: label for h in earlier if h not in inside})
        for name in inherited.get("tools") or []:
            tool_sources[name] = f"the training data of adapter {inherited['adapter']}"
        tool_sources.update({name: f"training item {item}" for name, item in (section.get("tool_items") or {}).items()})
        return cls(requests, inside, frozenset(section.get("held_out", {}).values()), tool_sources)


@dataclass(frozen=True)
class TrainingManifest:
    path: str
    items: frozenset[str]  # ids of the requests that shaped the adapter: trained on, or used to choose its settings
    tools: frozenset[str]  # the tools those requests call
    # Items the split itself held out (version 2: its test items). They are fresh whatever tool their gold call
    # names: the split placed them by what the teacher, the target model, called, and no such tool was trained on.
    held_out: frozenset[str] = frozenset()
    content: ContentIndex | None = None  # None: a manifest from before content hashes (checked by id)

    def overlap(self, request: ProvenanceRequest) -> list[str]:
        """Why a request is not held out from this adapter (empty: it is): by its content where the manifest has
        content hashes, else by its id."""
        if self.content is None:
            return self._overlap_by_id(request.id, request.called)
        full, _ = request_hashes(request.messages, request.tools)
        if full in self.content.requests:
            return [f"its request is training item {self.content.requests[full]}"]
        if full in self.content.inside:
            return [f"its request is an earlier part of the dialogue of training item {self.content.inside[full]}"]
        if full in self.content.held_out:
            return []
        return [f"calls training tool {name}" + (f" (called in {self.content.tool_sources[name]})"
                                                  if name in self.content.tool_sources else "")
                for name in sorted(request.called & self.tools)]

    def _overlap_by_id(self, item_id: str, called: frozenset[str]) -> list[str]:
        if item_id in self.items:
            return [f"item {item_id} is a training item"]
        if item_id in self.held_out:
            return []
        return [f"calls training tool {name}" for name in sorted(called & self.tools)]


def training_manifest(adapter: str | Path | None, _seen: frozenset[str] = frozenset()) -> TrainingManifest | None:
    """The adapter's training manifest, or None when it has none (then nothing can be checked).

    Version 2 (`split.split_traces`): train and validation items and tools count as used (validation chose the
    settings and the checkpoint, so it is not fresh either); test items are held out. An adapter trained on top
    of another (`init_adapter`) also carries everything that one used: from its `content` section where there is
    one (then the other adapter's folder is not needed), else from that adapter's manifest. The first format: its
    train items and tools, and the items traced for it."""
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
    if doc.get("content"):
        inherited = doc["content"].get("inherited") or {}
        items, tools = items | frozenset(inherited.get("items", ())), tools | frozenset(inherited.get("tools", ()))
        return TrainingManifest(str(path), items, tools, held_out - items, ContentIndex.read(doc["content"]))
    parent = _init_manifest(adapter, doc.get("init_adapter"), _seen | {str(Path(adapter).resolve())})
    if parent is not None:
        items, tools, held_out = items | parent.items, tools | parent.tools, held_out - parent.items
    return TrainingManifest(str(path), items, tools, held_out)


def not_held_out(adapter: str | Path | None, requests: Iterable[ProvenanceRequest]) -> list[dict]:
    """{"sample_id", "why"} for each request the adapter's training manifest does not hold out (every command
    that runs benchmark items with a sidecar checks them here); empty when the adapter has no manifest."""
    manifest = training_manifest(adapter)
    if manifest is None:
        return []
    found = ((r.id, manifest.overlap(r)) for r in requests)
    return [{"sample_id": item, "why": why} for item, why in found if why]


def describe(found: Sequence[dict], shown: int = 5) -> str:
    """The first few of `not_held_out`'s answer, for a one-line message."""
    listed = "; ".join(f"{t['sample_id']} ({', '.join(t['why'])})" for t in found[:shown])
    return listed + (f" and {len(found) - shown} more" if len(found) > shown else "")


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
