"""Provenance by content: a benchmark item is checked against the sidecar adapter's training data by its request
(and every earlier state of a trained dialogue), whatever its id or the file it comes from."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest

from oospec.bench import items as bench_items
from oospec.bench import serve
from oospec.bench.config import BenchConfig
from oospec.bench.items import BenchError, Selection, load_datasets, select
from oospec.bench.vllm_run import sidecar_adapter
from oospec.datasets import load_dataset
from oospec.sidecar.process import SLOT_ROW_ADAPTERS, SidecarSettings, resolve_adapter
from oospec.sidecar.provenance import (ADAPTERS_DIR, ProvenanceRequest, content_section, not_held_out, request_hashes,
                                       training_manifest)
from oospec.tools.schema import to_openai
from oospec.training.content import project_items, rehash_adapter, split_content, trace_request
from oospec.training.split import split_traces, write_trace_split
from oospec.training.traces import read_traces

DATA = ADAPTERS_DIR.parents[1] / "data"
SHIPPED = ADAPTERS_DIR / "qwen2.5-coder-0.5b-toolcalls-v3"
# The teacher's traces the shipped adapter was split from are not installed with the package: they are the first
# SHIPPED_TRACES lines of the whole pool traced, kept with the repository's results.
POOL_TRACES = Path(__file__).resolve().parents[1] / "experiments" / "results" / "sidecar-traces-v3" / "traces.jsonl.gz"
SHIPPED_TRACES = 318


def shipped_traces() -> list[dict]:
    return read_traces(POOL_TRACES)[:SHIPPED_TRACES]


def _adapter(folder, used, held_out=(), train_ids=(), train_tools=()):
    """A version-2 manifest with content hashes of `used` (Samples) and `held_out`; `train_ids`: more ids it
    lists as trained (what an id check would refuse)."""
    folder.mkdir(parents=True)
    content = content_section([s.provenance_request() for s in used], [s.provenance_request() for s in held_out])
    (folder / "data_manifest.json").write_text(json.dumps({
        "version": 2, "seed": 0, "pool": {}, "rule": "by tool", "dropped": {}, "init_adapter": None,
        "items": {"train": [s.id for s in used] + list(train_ids), "validation": [], "test": [s.id for s in held_out]},
        "tools": {"train": sorted(train_tools), "validation": [], "test": []}, "content": content}))
    return str(folder)


def test_request_hash_ignores_whitespace_key_order_tool_order_and_tool_form():
    (sample,) = load_dataset("bfcl", split="multiple", limit=1)
    full, _ = request_hashes(sample.messages, sample.tools)
    spaced = [{**m, "content": "  " + m["content"].replace(" ", " \n\t ") + "\n"} for m in sample.messages]
    reordered = [dict(reversed(list(m.items()))) for m in sample.messages]
    as_dicts = [to_openai(t) for t in reversed(sample.tools)]
    assert request_hashes(spaced, sample.tools)[0] == full
    assert request_hashes(reordered, as_dicts)[0] == full
    assert request_hashes(sample.messages, sample.tools[1:])[0] != full  # other tools offered: another request
    changed = [{**m, "content": m["content"] + " Thanks."} for m in sample.messages]
    assert request_hashes(changed, sample.tools)[0] != full


def test_an_earlier_turn_of_a_dialogue_is_among_the_hashes_of_a_later_one():
    by_id = {s.id: s for s in load_dataset("apibank", split="1", limit=30)}
    first, second, third = by_id["apibank-l1-23"], by_id["apibank-l1-24"], by_id["apibank-l1-25"]  # one dialogue
    _, inside = request_hashes(third.messages, third.tools)
    assert {request_hashes(s.messages, s.tools)[0] for s in (first, second)} <= set(inside)
    _, inside_first = request_hashes(first.messages, first.tools)
    assert request_hashes(third.messages, third.tools)[0] not in inside_first  # a later turn is not inside


def _write_apibank(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return str(path)


def test_an_external_file_is_checked_by_content_not_by_its_colliding_ids(tmp_path):
    records = json.loads((DATA / "apibank" / "level-1-api_processed.json").read_text())
    own = {s.id: s for s in load_dataset("apibank", split="1")}
    trained = own["apibank-l1-25"]  # its context holds items 23 and 24, earlier turns of its dialogue
    adapter = _adapter(tmp_path / "adapter", [trained], train_ids=["apibank-l1-0", "apibank-l1-1"],
                       train_tools=[c.name for c in trained.gold])
    fresh = [records[i] for i in (3, 4)]  # never trained on, their gold tools neither
    assert not {c.name for i in (3, 4) for c in own[f"apibank-l1-{i}"].gold} & {c.name for c in trained.gold}
    # The file's items are apibank-l1-0 and -1: ids the adapter lists as trained, requests it never saw.
    cfg = BenchConfig(data=[_write_apibank(tmp_path / "ext" / "level-1-api_processed.json", fresh)])
    datasets = load_datasets(cfg)
    assert [s.id for _, items in datasets for s in items] == ["apibank-l1-0", "apibank-l1-1"]
    assert bench_items.check_trained_items(datasets, adapter, allow=False) == []
    # An earlier turn of the trained dialogue, under a fresh id (apibank-l1-1 of this file): refused, naming it.
    cfg = BenchConfig(data=[_write_apibank(tmp_path / "ext2" / "level-1-api_processed.json",
                                           [records[3], records[23]])])
    datasets = load_datasets(cfg)
    with pytest.raises(BenchError, match=r"1 benchmark item.*apibank-l1-1 \(its request is an earlier part of "
                                         r"the dialogue of training item apibank-l1-25\)"):
        bench_items.check_trained_items(datasets, adapter, allow=False)
    (_, kept), = load_datasets(cfg, exclude=bench_items.trained_item_filter(adapter))  # --held-out-only
    assert [s.id for s in kept] == ["apibank-l1-0"]


def test_an_external_toolalpaca_file_with_colliding_ids_is_not_refused_whole(tmp_path):
    entries = json.loads((DATA / "toolalpaca" / "eval_simulated.json").read_text())[:1]
    own = list(load_dataset("toolalpaca"))
    trained = [s for s in own if s.id.startswith("toolalpaca-0-")][:2]
    adapter = _adapter(tmp_path / "adapter", trained)
    asked = entries[0]["Instructions"]
    # The same API, other requests (ids toolalpaca-0-0, -1, ... again), and one trained request moved to the end.
    entries[0]["Instructions"] = [f"{text} Please answer quickly." for text in asked] + [asked[1]]
    entries[0]["Golden_Answers"] = entries[0]["Golden_Answers"] + [entries[0]["Golden_Answers"][1]]
    path = tmp_path / "ext" / "toolalpaca.json"
    path.parent.mkdir()
    path.write_text(json.dumps(entries))
    datasets = load_datasets(BenchConfig(data=[str(path)]))
    ids = [s.id for _, items in datasets for s in items]
    assert ids[:2] == [s.id for s in trained] and len(ids) == len(asked) + 1
    found = bench_items.check_trained_items(datasets, adapter, allow=True)
    assert [(t["sample_id"], t["why"]) for t in found] == [
        (ids[-1], [f"its request is training item {trained[1].id}"])]


# The target's slot-row adapter was trained on the same split as the default sidecar's: its manifest is that split's.
@pytest.mark.parametrize("adapter", [SHIPPED.name, *SLOT_ROW_ADAPTERS.values()])
def test_the_shipped_manifest_covers_its_training_items(adapter):
    manifest = training_manifest(ADAPTERS_DIR / adapter)
    doc = json.loads((ADAPTERS_DIR / adapter / "data_manifest.json").read_text())
    traces = {t["id"]: t for t in shipped_traces()}
    used = doc["items"]["train"] + doc["items"]["validation"]
    rng = random.Random(0)
    own = project_items()
    for item in rng.sample(used, 25):  # from the shipped traces, and from the project's data as loaded today
        assert manifest.overlap(trace_request(traces[item])) == [f"its request is training item {item}"]
        assert manifest.overlap(own[item].provenance_request()) == [f"its request is training item {item}"]
    inherited = doc["content"]["inherited"]
    for item in rng.sample([i for i in inherited["items"] if i in own], 25):  # what the adapter it started from used
        assert manifest.overlap(own[item].provenance_request())
    fresh = [i for i in doc["items"]["test"] if i in doc["content"]["held_out"]]
    assert len(fresh) >= 50 and all(manifest.overlap(trace_request(traces[i])) == [] for i in fresh)
    # Under any other id, a training request is still recognized.
    item = used[0]
    renamed = ProvenanceRequest("external-0", traces[item]["messages"], traces[item]["tools"], frozenset())
    assert manifest.overlap(renamed) == [f"its request is training item {item}"]


def test_rehash_reproduces_the_shipped_content(tmp_path, monkeypatch):
    """`oospec sidecar rehash` on a copy of the shipped manifest and traces writes the same hashes back, also once
    the adapter it started from is no longer shipped (the manifest then needs nothing from that adapter's folder)."""
    folder = tmp_path / "adapters" / "v3"
    folder.mkdir(parents=True)
    shutil.copy(SHIPPED / "data_manifest.json", folder / "data_manifest.json")
    with gzip.open(POOL_TRACES, "rt") as pool, gzip.open(folder / "traces.jsonl.gz", "wt") as out:
        out.writelines(line for _, line in zip(range(SHIPPED_TRACES), pool))
    shipped = json.loads((SHIPPED / "data_manifest.json").read_text())["content"]
    assert rehash_adapter(folder) == shipped
    assert json.loads((folder / "data_manifest.json").read_text())["content"] == shipped
    import oospec.sidecar.provenance
    import oospec.training.content

    for module in (oospec.sidecar.provenance, oospec.training.content):  # no shipped adapter but this copy
        monkeypatch.setattr(module, "ADAPTERS_DIR", tmp_path / "adapters")
    assert training_manifest(folder).items == training_manifest(SHIPPED).items
    assert rehash_adapter(folder) == shipped


def test_a_new_split_writes_the_content_hashes_of_its_parts(tmp_path):
    """`oospec sidecar split` writes `content` into the manifest that `oospec sidecar train` copies to the adapter."""
    traces = shipped_traces()[:60]
    split = split_traces(traces, seed=0, fractions=(0.6, 0.2, 0.2))
    assert all(split.traces[p] for p in ("train", "validation", "test"))
    paths = write_trace_split(split, tmp_path / "split", content=split_content(split, None))
    folder = tmp_path / "adapter"
    folder.mkdir()
    shutil.copy(paths["manifest"], folder / "data_manifest.json")
    manifest = training_manifest(folder)
    used = split.traces["train"] + split.traces["validation"]
    same = {}  # hash -> the used items with that request (the data holds a few requests twice)
    for trace in used:
        same.setdefault(request_hashes(trace["messages"], trace["tools"])[0], set()).add(trace["id"])
    for trace in used:
        (why,) = manifest.overlap(ProvenanceRequest("other-id", trace["messages"], trace["tools"], frozenset()))
        assert why.removeprefix("its request is training item ") in same[request_hashes(trace["messages"],
                                                                                         trace["tools"])[0]]
    assert all(manifest.overlap(trace_request(t)) == [] for t in split.traces["test"])
    # Started from the shipped adapter: the new manifest carries what that one used (and its own inheritance).
    content = split_content(split, SHIPPED)
    assert content["inherited"]["adapter"] == SHIPPED.name
    (folder / "data_manifest.json").write_text(json.dumps({**json.loads(paths["manifest"].read_text()),
                                                           "content": content}))
    by_id = {t["id"]: t for t in shipped_traces()}
    item = next(i for i in json.loads((SHIPPED / "data_manifest.json").read_text())["items"]["train"]
                if i not in {t["id"] for t in traces})  # trained on by the shipped adapter only
    renamed = ProvenanceRequest("x", by_id[item]["messages"], by_id[item]["tools"], frozenset())
    expected = f"its request is training item {item} of adapter {SHIPPED.name}"
    assert training_manifest(folder).overlap(renamed) == [expected]


def test_serve_and_vllm_benchmarks_check_the_items_as_bench_run_does():
    """`bench serve` and `bench vllm` choose and check their items with bench run's functions (oospec.bench.items):
    with the sidecar, the shipped adapter's training items are refused unless allowed, then listed (the default
    serve dialogue is all training items)."""
    _, turns = serve.pick_dialogue(load_dataset("apibank", split="1"), None)
    adapter = resolve_adapter(SidecarSettings().model, "auto")
    assert sidecar_adapter() == adapter  # the adapter the oospec-sidecar setting of `bench vllm` runs
    trained = not_held_out(adapter, [s.provenance_request() for s in turns])
    assert [t["sample_id"] for t in trained] == [s.id for s in turns]
    chats = Selection(datasets=["apibank:1"], limit=4, offset=21)  # items 21-24
    with pytest.raises(BenchError, match="4 benchmark item"):
        select(chats, adapter)
    _, trained_chats = select(Selection(datasets=["apibank:1"], limit=4, offset=21, allow_trained_items=True), adapter)
    assert [t["sample_id"] for t in trained_chats] == ["apibank-l1-21", "apibank-l1-22", "apibank-l1-23",
                                                       "apibank-l1-24"]
    assert "an earlier part of the dialogue of training item apibank-l1-25" in trained_chats[2]["why"][0]
    assert select(chats, None)[1] == []  # no sidecar: nothing to check
    row = {"turn": 0, "prompt_tokens": 9, "latency_s": 1.0, "cached_tokens": 0,
           "stats": {"prefill_s": 0.5, "decode_s": 0.5, "tau": 1.0, "drafter": None}}
    report = {"dialogue": "d", "target": "t", "max_tokens": 8, "threads": 1, "configs": ["ar"],
              "identical_to_first": {"ar": True}, "turns": {"ar": [row]}, "trained_turns": trained}
    assert f"WARNING: {len(trained)} turn(s) the sidecar adapter used in training" in serve.markdown(report)
    assert "WARNING" not in serve.markdown({**report, "trained_turns": []})
