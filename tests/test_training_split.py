"""The sidecar's data: the pool of every tool family, the split of teacher traces by tool, resumable training."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from oospec.training.pool import pool_sources, training_pool
from oospec.training.split import PARTS, split_traces, teacher_calls


def _trace(i: str, called: list[str], offered: list[str] | None = None) -> dict:
    offered = offered if offered is not None else called + ["other_tool"]
    calls = [{"name": n, "arguments": {}} for n in called]
    return {"id": i, "dataset": "x", "messages": [], "tools": [{"type": "function", "function": {"name": n}}
                                                                for n in offered],
            "text": "", "call": calls[0] if calls else None, "calls": calls}


def test_split_by_the_teachers_tools_keeps_validation_and_test_tools_out_of_training():
    traces = [_trace(f"t{i}", [f"tool{i % 40}"]) for i in range(200)]
    traces += [_trace("pair", ["tool1", "tool2"]), _trace("none", []),
               _trace("stray", ["not_offered"], offered=["tool3"])]
    split = split_traces(traces, seed=0, always_test_tools=["tool5"], always_train_tools=["tool6", "tool5x"])
    assert split.dropped == {"stray": "the teacher called 'not_offered', which the request did not offer"}
    parts = {p: set(split.tools[p]) for p in PARTS}
    assert all(parts[a].isdisjoint(parts[b]) for a in PARTS for b in PARTS if a < b)
    assert "tool5" in parts["test"] and "tool6" in parts["train"]
    assert all(parts[p] for p in PARTS)  # 40 tools at 70/15/15: every part gets some
    for part, traces_in in split.traces.items():
        for t in traces_in:
            names = {c["name"] for c in teacher_calls(t)}
            if part == "train":  # a training trace calls training tools only
                assert names <= parts["train"]
            elif names:
                assert names & parts[part]
    assert sum(len(v) for v in split.traces.values()) == len(traces) - 1
    assert split_traces(traces, seed=0).tools == split_traces(traces, seed=0).tools
    assert split_traces(traces, seed=1).tools != split_traces(traces, seed=0).tools
    manifest = split.manifest(teacher="t")
    assert manifest["version"] == 2 and manifest["items"]["test"] and manifest["teacher"] == "t"
    with pytest.raises(ValueError, match="sum to 1"):
        split_traces(traces, fractions=(0.5, 0.1, 0.1))


def test_the_pool_leaves_benchmark_items_out_and_covers_every_source():
    sources = pool_sources(scale=0.1)
    parts = training_pool(sources, seed=0, rounds=2)
    ids = [s.id for part in parts for s in part]
    assert len(ids) == len(set(ids)) == sum(s.drawn for s in sources)
    assert "apibank-l1-0" not in ids and "simple_python_0" not in ids  # reserved benchmark items
    assert {s.dataset for part in parts for s in part} == {"apibank", "toolalpaca", "bfcl"}
    assert [s.id for p in training_pool(sources, seed=0, rounds=2) for s in p] == ids  # reproducible


@pytest.fixture(scope="module")
def smol(smollm2_model, smollm2_tokenizer):
    return smollm2_model, smollm2_tokenizer


def test_training_stopped_and_resumed_ends_where_an_uninterrupted_run_ends(smol, tmp_path):
    from safetensors.torch import load_file

    from oospec.datasets import load_dataset
    from oospec.training.lora import TrainConfig, train
    from oospec.training.traces import trace_record

    model, tok = smol
    sample = load_dataset("toolalpaca", limit=1)[0]
    traces = []
    for i, args in enumerate([{"q": "a"}, {"q": "bb"}, {"q": "ccc"}]):
        text = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (sample.tools[0].name, json.dumps(args))
        traces.append(dict(trace_record(sample, text), id=f"r{i}"))
    cfg = TrainConfig(base="smollm2-135m", r=4, alpha=8, lr=1e-3, epochs=2, batch_requests=2, warmup_steps=1,
                      checkpoint_every=1)
    whole = train(traces, tmp_path / "whole", cfg, model=copy.deepcopy(model), tokenizer=tok, progress=False)
    first = train(traces, tmp_path / "split", cfg, model=copy.deepcopy(model), tokenizer=tok, progress=False,
                  max_steps=3)
    assert first["finished"] is False and first["steps"] == 3
    record = json.loads((tmp_path / "split" / "train_config.json").read_text())  # the stopped run's record so far
    assert record["finished"] is False and len(json.loads((tmp_path / "split" / "loss.json").read_text())) == 3
    assert (tmp_path / "split" / "epoch-1").is_dir() and not (tmp_path / "split" / "epoch-2").exists()
    rest = train(traces, tmp_path / "split", cfg, model=copy.deepcopy(model), tokenizer=tok, progress=False)
    assert rest["finished"] and rest["steps"] == whole["steps"] == 4
    a = load_file(str(tmp_path / "whole" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "split" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    e1 = load_file(str(tmp_path / "whole" / "epoch-1" / "adapter_model.safetensors"))
    assert any(not torch.equal(a[k], e1[k]) for k in a)  # epoch 2 went on training
    # Another config is another run: it does not resume this one's state.
    other = train(traces, tmp_path / "split", TrainConfig(**{**cfg.__dict__, "lr": 2e-3}), model=copy.deepcopy(model),
                  tokenizer=tok, progress=False, max_steps=1)
    assert other["steps"] == 1


def test_shipped_gzipped_traces_read_as_plain_ones(tmp_path):
    import gzip

    from oospec.training.traces import read_traces

    lines = [json.dumps(_trace("a", ["t1"])), "{cut short", json.dumps(_trace("b", []))]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    plain, packed = read_traces(tmp_path / "t.jsonl"), read_traces(tmp_path / "t.jsonl.gz")
    assert plain == packed and [t["id"] for t in packed] == ["a", "b"]  # the cut line is skipped, not fatal


def test_a_shipped_adapter_is_found_by_its_name(tmp_path):
    from oospec.sidecar.process import ADAPTERS_DIR, resolve_adapter

    assert resolve_adapter("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-toolcalls-v3") == str(
        ADAPTERS_DIR / "qwen2.5-coder-0.5b-toolcalls-v3")
    assert resolve_adapter("qwen2.5-coder-0.5b", "none") is None
    assert resolve_adapter("qwen2.5-coder-0.5b", str(tmp_path)) == str(tmp_path)  # a folder stays itself
    assert resolve_adapter("qwen2.5-coder-0.5b", "no-such-adapter") == "no-such-adapter"  # refused by the caller


def test_the_package_ships_only_the_default_adapter_and_its_training_record_resolves():
    """Adapters with weights: the default sidecar's and the target's slot rows'; the one v3 started from keeps only
    its manifest, which v3's own manifest needs: without it, checking that benchmark items are held out would
    fail."""
    from oospec.sidecar.process import ADAPTERS_DIR, SHIPPED_ADAPTERS, SLOT_ROW_ADAPTERS
    from oospec.sidecar.provenance import training_manifest

    with_weights = sorted(p.parent.name for p in ADAPTERS_DIR.glob("*/adapter_model.safetensors"))
    assert with_weights == sorted([*SHIPPED_ADAPTERS.values(), *SLOT_ROW_ADAPTERS.values()])
    (default,) = SHIPPED_ADAPTERS.values()
    first = training_manifest(ADAPTERS_DIR / "qwen2.5-coder-0.5b-toolcalls")
    manifest = training_manifest(ADAPTERS_DIR / default)
    assert first.items and first.items <= manifest.items  # what the first adapter trained on counts as used
