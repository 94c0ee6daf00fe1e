"""`oospec bench run` end to end on a tiny random model with SmolLM2's tokenizer (fast, CPU)."""

import hashlib
import json

import numpy as np
import pytest
import torch
from helpers import request_by_id

from oospec.bench import run as bench_run
from oospec.bench.config import BenchConfig
from oospec.bench import items as bench_items
from oospec.bench.items import BenchError, load_datasets
from oospec.bench.hf_peers import ForwardCounter
from oospec.bench.methods import parse_methods
from oospec.bench.records import first_difference
from oospec.errors import OospecError
from oospec.sidecar.provenance import training_manifest, weights_sha256


def _tiny_llama(vocab: int, seed: int, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, initializer_range=0.3)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tiny_engine(smollm2_tokenizer):
    from oospec.engine.engine import Engine

    tok = smollm2_tokenizer
    return Engine(_tiny_llama(len(tok), seed=0, layers=1), tok)


@pytest.fixture(scope="module")
def bench_result(tiny_engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "pld", "toolspec", "oracle", "hf-pld", "hf-assisted"],
                      target="tiny-random", limit=2, max_new_tokens=30, budget=8, out=out, progress=False,
                      echo=False)
    assistant = _tiny_llama(len(tiny_engine.tokenizer), seed=1, layers=1)
    return bench_run.run_benchmark(cfg, engine=tiny_engine, assistant_model=assistant)


def test_files_and_summary(bench_result):
    out = bench_result["out"]
    for name in ("samples.jsonl", "report.md", "summary.json", "speedup.png", "run.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["apibank"]
    methods = ["ar", "pld", "toolspec", "oracle", "hf-pld", "hf-assisted"]
    assert list(summary["apibank"]) == methods
    for m in methods:
        row = summary["apibank"][m]
        assert {"n", "tau", "decode_speedup", "e2e_speedup", "oracle_fraction", "identical_rate",
                "accuracy"} <= set(row)
        assert row["n"] == 2
    rows = summary["apibank"]
    for m in ("ar", "pld", "toolspec", "oracle"):
        assert rows[m]["identical_rate"] == 1.0, m
    assert rows["ar"]["tau"] == pytest.approx(1.0)
    assert rows["ar"]["decode_speedup"] == pytest.approx(1.0)
    assert rows["oracle"]["tau"] >= rows["toolspec"]["tau"] >= 1.0
    # 30 tokens, chains of 8 accepted + 1 bonus per forward after the prefill: 1 + ceil(29 / 9) = 5 forwards.
    assert rows["oracle"]["tau"] == pytest.approx(30 / 5)
    assert rows["oracle"]["oracle_fraction"] in (None, pytest.approx(1.0))


def test_samples_jsonl(bench_result):
    lines = [json.loads(line) for line in (bench_result["out"] / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 6
    assert [r["method"] for r in lines[:6]] == ["ar", "pld", "toolspec", "oracle", "hf-pld", "hf-assisted"]
    keys = {"dataset", "sample_id", "method", "new_tokens", "target_forwards", "tau", "accepted_per_step",
            "prefill_s", "decode_s", "e2e_s", "draft_s", "identical", "accurate", "text"}
    for r in lines:
        assert keys <= set(r)
        assert 1 <= r["target_forwards"] <= r["new_tokens"] or r["new_tokens"] == 1
        assert r["e2e_s"] > 0 and r["decode_s"] >= 0
        assert r["accurate"] in (True, False)
    by = {(r["sample_id"], r["method"]): r for r in lines}
    for sid in {r["sample_id"] for r in lines}:
        assert by[(sid, "ar")]["target_forwards"] == by[(sid, "ar")]["new_tokens"]
        assert by[(sid, "oracle")]["text"] == by[(sid, "ar")]["text"]
        # The hook counts the target's forwards only: the assistant's draft forwards are not in there.
        assert by[(sid, "hf-assisted")]["target_forwards"] <= by[(sid, "hf-assisted")]["new_tokens"]


def test_report_table(bench_result):
    report = (bench_result["out"] / "report.md").read_text()
    assert "| method | cores | n | tau | decode speed-up | e2e speed-up | mean e2e ratio | of oracle's speed-up | oracle fraction" in report
    assert "## apibank" in report and "| oracle | 2 |" in report and "| toolspec | 2 |" in report
    assert "torch threads" in report and "command:" in report and "float32" in report


def test_forward_counter_counts_hf_greedy_steps():
    model = _tiny_llama(300, seed=3)
    ids = torch.randint(3, 300, (1, 12))
    with ForwardCounter(model) as c:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=7,
                             eos_token_id=[299], pad_token_id=2, min_new_tokens=7)
    assert out.shape[1] - 12 == 7 and c.count == 7


def test_errors_and_helpers():
    with pytest.raises(BenchError, match="unknown method"):
        parse_methods("ar,warp-drive")
    assert parse_methods("pld,oracle") == ["ar", "pld", "oracle"]  # ar always runs first
    assert issubclass(BenchError, OospecError)
    with pytest.raises(OospecError, match="unknown dataset"):
        load_datasets(BenchConfig(datasets=["nosuchbench"], limit=1))
    with pytest.raises(BenchError, match="no dataset"):
        load_datasets(BenchConfig(datasets=[]))
    assert first_difference(np.array([1, 2, 3]), np.array([1, 2, 3])) is None
    assert first_difference(np.array([1, 2, 3]), np.array([1, 5, 3])) == 1
    assert first_difference(np.array([1, 2, 3]), np.array([1, 2])) == 2


def test_cli_rejects_unknown_method(capsys):
    from oospec.cli import main

    assert main(["bench", "run", "--dataset", "apibank", "--methods", "ar,nope", "--limit", "1"]) == 2
    assert "unknown method" in capsys.readouterr().err


def always_send_sidecar_jobs(monkeypatch):
    """A tiny model's decode steps take milliseconds, so the cost model (rightly) sends no job to a CPU sidecar:
    tests of the sidecar's path through the benchmark have `oospec` send every one."""
    from oospec.bench.methods import OoOSpecMethod

    monkeypatch.setattr(OoOSpecMethod, "schedule", "always")


def test_oospec_with_a_sidecar_process(tiny_engine, tmp_path, monkeypatch):
    """`oospec` in the benchmark: a sidecar process (a scripted one here), cores per method, sidecar table."""
    from oospec.sidecar import SidecarClient

    always_send_sidecar_jobs(monkeypatch)
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "toolspec", "oospec", "oospec-wait", "ar-all-cores"],
                      target="tiny-random", limit=2, max_new_tokens=24, budget=8, out=tmp_path, progress=False,
                      echo=False, threads=1)
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good"}) as client:
        result = bench_run.run_benchmark(cfg, engine=tiny_engine, sidecar=client)
    rows = result["summary"]["apibank"]
    assert rows["oospec"]["identical_rate"] == 1.0 and rows["ar-all-cores"]["identical_rate"] == 1.0
    # Equal cores: the 1+1 sidecar methods against ar (and toolspec) with 2 threads; ar with the target's 1 thread
    # is the secondary baseline.
    assert rows["ar"]["cores"] == "2" and rows["toolspec"]["cores"] == "2" and rows["oospec"]["cores"] == "1+1"
    assert rows["oospec"]["baseline"] == "ar" and rows["oospec"]["cpu_threads"] == 2
    assert rows["ar-target-threads"]["cores"] == "1" and rows["ar-target-threads"]["identical_rate"] == 1.0
    assert rows["ar"]["decode_speedup"] == pytest.approx(1.0)
    assert rows["ar-target-threads"]["decode_speedup_target_threads"] == pytest.approx(1.0)
    assert rows["ar-all-cores"]["cores"] == str(__import__("os").cpu_count())
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["cores"]["total"] == 2 and run["cores"]["methods"]["oospec"] == {"cores": "1+1", "target_threads": 1,
                                                                                 "cpu_threads": 2}
    sc = rows["oospec"]["sidecar"]
    assert sc["n"] == 2 and sc["answered"] == 1.0 and sc["payload_bytes"] > 20
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    oospec = [r for r in records if r["method"] == "oospec"]
    assert all("function_match" in r["sidecar"] and "latency_s" in r["sidecar"] for r in oospec)
    # oospec-wait: the target waited for the payload at its first draft, so the hints were always in time.
    waited = [r for r in records if r["method"] == "oospec-wait"]
    assert rows["oospec-wait"]["identical_rate"] == 1.0 and rows["oospec-wait"]["cores"] == "1+1"
    assert all(r["sidecar"]["waited_s"] >= 0 and r["sidecar"]["arrived"] for r in waited)
    report = (tmp_path / "report.md").read_text()
    assert "Sidecar:" in report and "| oospec | 2 | 100% | 100% |" in report


def test_work_a_run_leaves_running_is_waited_out_before_the_next_run_starts(tiny_engine, tmp_path, monkeypatch):
    """A sidecar job that outlives its request (answered 1.5 s after it was sent) is finished after the run's
    clock stops and before the next method's starts: recorded per run and said in the report."""
    from oospec.sidecar import SidecarClient

    always_send_sidecar_jobs(monkeypatch)
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "oospec", "toolspec"], target="tiny-random", limit=1,
                      max_new_tokens=8, budget=8, out=tmp_path, progress=False, echo=False, threads=1, warmup=False)
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good", "delay_s": 1.5}) as client:
        bench_run.run_benchmark(cfg, engine=tiny_engine, sidecar=client)
    records = {r["method"]: r for r in map(json.loads, (tmp_path / "samples.jsonl").read_text().splitlines())}
    assert records["oospec"]["e2e_s"] < 1.5, "the tiny target must finish before the job for this test to mean it"
    assert records["oospec"]["e2e_s"] + records["oospec"]["leftover_s"] >= 1.0
    assert records["ar"]["leftover_s"] == 0 and records["toolspec"]["leftover_s"] == 0
    report = (tmp_path / "report.md").read_text()
    assert "work left running after a run's clock stopped, waited out before the next run: oospec 1 run" in report


# -- the honest-benchmark guarantees: the adapter's digest and training data are recorded and checked, and no
# sidecar method reuses the sidecar cache another method warmed on the same item.
WEIGHTS = b"not really safetensors"


def _adapter(tmp_path, train_items=(), train_tools=()):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(WEIGHTS)
    (folder / "data_manifest.json").write_text(json.dumps({
        "seed": 0, "sources": {"used_train_items": list(train_items)}, "train_tools": list(train_tools),
        "heldout_tools": [], "train_items": [], "heldout_items": []}))
    return folder


def _apibank(limit=2):
    return load_datasets(BenchConfig(datasets=["apibank"], limit=limit))


def test_provenance_reads_digest_and_manifest(tmp_path):
    folder = _adapter(tmp_path, train_items=["x-1"], train_tools=["Calculator"])
    assert weights_sha256(folder) == hashlib.sha256(WEIGHTS).hexdigest()
    assert weights_sha256(None) is None and training_manifest(tmp_path) is None
    manifest = training_manifest(folder)
    assert manifest.overlap(request_by_id("x-1")) == ["item x-1 is a training item"]
    assert manifest.overlap(request_by_id("y", {"Calculator", "Other"})) == ["calls training tool Calculator"]
    assert manifest.overlap(request_by_id("y", {"Other"})) == []


def test_shipped_adapter_holds_out_the_default_benchmark_items():
    from oospec.sidecar.process import resolve_adapter

    adapter = resolve_adapter("qwen2.5-coder-0.5b", "auto")
    assert training_manifest(adapter) is not None
    datasets = load_datasets(BenchConfig(datasets=["apibank"], split="1", limit=8))
    assert bench_items.check_trained_items(datasets, adapter, allow=False) == []


def test_trained_items_are_refused_before_any_model_loads(tmp_path):
    (label, samples), = _apibank(1)
    folder = _adapter(tmp_path, train_tools=[c.name for c in samples[0].gold])
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "oospec"], target="no-such-model", limit=1,
                      sidecar_adapter=str(folder), out=tmp_path / "out", progress=False, echo=False)
    with pytest.raises(BenchError, match="not held out.*calls training tool.*--allow-trained-items"):
        bench_run.run_benchmark(cfg)
    # Without a sidecar method the adapter plays no part: nothing to check.
    assert bench_items.check_trained_items(_apibank(1), None, allow=False) == []


def test_allowed_trained_items_digest_and_fresh_sidecar_cache(tiny_engine, tmp_path, capsys, monkeypatch):
    from oospec.sidecar import SidecarClient

    always_send_sidecar_jobs(monkeypatch)
    datasets = _apibank(2)
    first = datasets[0][1][0]
    folder = _adapter(tmp_path, train_items=[first.id])
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "oospec", "oospec-wait"], target="tiny-random", limit=2,
                      max_new_tokens=12, budget=8, out=tmp_path / "out", progress=False, echo=False, threads=1,
                      sidecar_adapter=str(folder), allow_trained_items=True)
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "cache-probe"}) as client:
        bench_run.run_benchmark(cfg, engine=tiny_engine, sidecar=client)
    assert "WARNING" in capsys.readouterr().err
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["sidecar"]["adapter"] == str(folder)
    assert run["sidecar"]["adapter_sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert [t["sample_id"] for t in run["trained_items"]] == [first.id]
    assert "--allow-trained-items" in run["command"]
    assert "WARNING" in (tmp_path / "out" / "report.md").read_text()
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    sidecar_runs = [r for r in records if r["method"] in ("oospec", "oospec-wait")]
    assert len(sidecar_runs) == 4
    # call_p 1.0: the sidecar met the conversation cold, though the warm-up and oospec had just sent it the item.
    assert all(r["sidecar"]["call_probability"] == 1.0 for r in sidecar_runs), sidecar_runs


def _sampled_run(engine, out, seed: int, methods=("ar", "pld", "toolspec", "oracle")):
    cfg = BenchConfig(datasets=["apibank"], methods=list(methods), target="tiny-random", limit=2, max_new_tokens=24,
                      budget=8, out=out, progress=False, echo=False, temperature=0.9, top_p=0.95, seed=seed)
    bench_run.run_benchmark(cfg, engine=engine)
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_sampled_bench_run_is_seeded_and_lossless(tiny_engine, bench_result, tmp_path):
    """--temperature: `ar` samples plainly and every method speculatively with the item's seed, so each returns
    exactly ar's tokens; the same --seed gives the same run, another seed another one."""
    first = _sampled_run(tiny_engine, tmp_path / "a", seed=7)
    again = _sampled_run(tiny_engine, tmp_path / "b", seed=7)
    other = _sampled_run(tiny_engine, tmp_path / "c", seed=8)
    assert all(r["identical"] for r in first), [(r["sample_id"], r["method"]) for r in first if not r["identical"]]
    assert [r["text"] for r in first] == [r["text"] for r in again]
    assert [r["text"] for r in first if r["method"] == "ar"] != [r["text"] for r in other if r["method"] == "ar"]
    greedy = [json.loads(line) for line in (bench_result["out"] / "samples.jsonl").read_text().splitlines()]
    assert [r["text"] for r in first if r["method"] == "ar"] != [r["text"] for r in greedy if r["method"] == "ar"]
    assert {r["sampling"].split("(")[0] for r in first if r["method"] == "ar"} == {"sample"}
    assert {r["sampling"].split("(")[0] for r in first if r["method"] != "ar"} == {"speculative sample"}
    oracle = [r for r in first if r["method"] == "oracle"]
    assert all(r["tau"] > 2 for r in oracle)  # ar's own sampled tokens, all accepted: the coupling at work
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["decoding"]["mode"] == "sampling" and run["decoding"]["temperature"] == 0.9
    assert "--temperature 0.9 --top-p 0.95 --top-k 0 --seed 7" in run["command"]
    assert "decoding: sampling, temperature 0.9" in (tmp_path / "a" / "report.md").read_text()


def test_sampled_bench_refuses_greedy_only_peers_and_bad_options(tmp_path):
    for extra, message in ((dict(methods=["ar", "hf-pld"], temperature=0.7), "greedily only"),
                           (dict(temperature=-1.0), "--temperature must be >= 0"),
                           (dict(temperature=0.7, top_p=0.0), "top_p")):
        cfg = BenchConfig(datasets=["apibank"], limit=1, out=tmp_path, progress=False, echo=False,
                          **{"methods": ["ar"], **extra})
        with pytest.raises(OospecError, match=message):
            bench_run.run_benchmark(cfg)  # refused before any model is loaded (none is given)


def test_offset_and_held_out_only_select_items(tmp_path):
    """--offset skips items, --held-out-only drops the adapter's training items before --limit counts."""
    (_, all_items), = load_datasets(BenchConfig(datasets=["apibank"], split="1", limit=12))
    (_, shifted), = load_datasets(BenchConfig(datasets=["apibank"], split="1", offset=3, limit=4))
    assert [s.id for s in shifted] == [s.id for s in all_items[3:7]]
    folder = _adapter(tmp_path, train_items=[all_items[4].id], train_tools=[all_items[5].gold[0].name])
    trained = bench_items.trained_item_filter(str(folder))
    (_, held), = load_datasets(BenchConfig(datasets=["apibank"], split="1", offset=3, limit=4), exclude=trained)
    assert all_items[4].id not in {s.id for s in held} and len(held) == 4
    assert not any(trained(s) for s in held)
    assert bench_items.trained_item_filter(None) is None
    for bad, message in ((dict(limit=0), "--limit must be at least 1"), (dict(offset=-1), "--offset must be >= 0")):
        with pytest.raises(BenchError, match=message):
            load_datasets(BenchConfig(datasets=["apibank"], **bad))


def test_items_selects_exactly_those_ids_in_dataset_order():
    """--items runs another run's items (e.g. one adapter's test items under another adapter)."""
    (_, all_items), = load_datasets(BenchConfig(datasets=["apibank"], split="1", limit=12))
    ids = [all_items[9].id, all_items[2].id]
    (_, chosen), = load_datasets(BenchConfig(datasets=["apibank"], split="1", items=ids))
    assert [s.id for s in chosen] == [all_items[2].id, all_items[9].id]
    with pytest.raises(BenchError, match="--items not in these datasets: nope"):
        load_datasets(BenchConfig(datasets=["apibank"], split="1", items=ids + ["nope"]))


def test_command_line_keeps_items_and_the_secondary_baseline_choice():
    from oospec.cli import build_parser

    cfg = BenchConfig(datasets=["apibank:1"], methods=["ar", "oospec"], items=["apibank-l1-2", "apibank-l1-9"],
                      secondary_baseline=False)
    line = bench_run.command_line(cfg)
    assert "--items apibank-l1-2,apibank-l1-9" in line and "--no-secondary-baseline" in line
    args = build_parser().parse_args(line.split()[1:])
    assert args.items == "apibank-l1-2,apibank-l1-9" and args.no_secondary_baseline
    assert "--no-secondary-baseline" not in bench_run.command_line(BenchConfig(datasets=["apibank:1"]))


def test_sessions_replay_each_dialogue_turn_by_turn_with_prefix_reuse(tiny_engine, tmp_path):
    """--sessions: a dialogue's turns run in order for every method, each method reusing its own prefixes from
    its earlier turns (the target's and the sidecar's), outputs still identical to `ar` on every turn."""
    from oospec.sidecar import SidecarClient

    cfg = BenchConfig(datasets=["apibank"], split="1", methods=["ar", "toolspec", "oospec"], target="tiny-random",
                      limit=1, sessions=True, max_new_tokens=12, budget=8, out=tmp_path, progress=False, echo=False,
                      threads=1, secondary_baseline=False)
    (_, turns), = load_datasets(cfg)
    assert len(turns) >= 2 and len({s.meta["session"] for s in turns}) == 1
    assert [s.meta["turn"] for s in turns] == sorted(s.meta["turn"] for s in turns)
    with SidecarClient(factory="sidecar_fakes:make_fake", factory_options={"mode": "good"}) as client:
        result = bench_run.run_benchmark(cfg, engine=tiny_engine, sidecar=client)
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    for method in ("ar", "toolspec", "oospec"):
        mine = [r for r in records if r["method"] == method]
        assert [r["turn"] for r in mine] == list(range(1, len(turns) + 1))
        assert [r["sample_id"] for r in mine] == [s.id for s in turns]
        assert mine[0]["prompt_tokens_reused"] == 0  # each method starts its session cold
        assert all(r["prompt_tokens_reused"] > 0 for r in mine[1:])  # then reuses its own earlier turns
    assert all(r["identical"] for r in records)
    (rows,) = result["summary"].values()
    assert rows["oospec"]["n"] == len(turns)
    report = (tmp_path / "report.md").read_text()
    assert "sessions (turn by turn" in report and "| turn | sessions |" in report


def test_sessions_refuse_sets_without_dialogues_and_peers_without_prefix_reuse(tmp_path):
    with pytest.raises(BenchError, match="not turns of multi-turn sessions"):
        load_datasets(BenchConfig(datasets=["bfcl"], split="simple_python", sessions=True))
    with pytest.raises(BenchError, match="hf-pld cannot reuse a session's prefixes"):
        bench_run.run_benchmark(BenchConfig(datasets=["apibank"], methods=["ar", "hf-pld"], sessions=True,
                                            out=tmp_path, progress=False, echo=False))
    (_, two), = load_datasets(BenchConfig(datasets=["apibank"], split="1", sessions=True, limit=2))
    (_, second), = load_datasets(BenchConfig(datasets=["apibank"], split="1", sessions=True, offset=1, limit=1))
    assert len({s.meta["session"] for s in two}) == 2 and {s.id for s in second} < {s.id for s in two}


def test_tool_choice_required_decodes_every_method_under_the_call_grammar(tiny_engine, tmp_path):
    """--tool-choice required: a random model still writes a call of an offered tool (the grammar), for `ar` and
    the speculative methods alike, token-identical; peers that cannot follow a grammar are refused."""
    cfg = BenchConfig(datasets=["bfcl"], split="simple_python", methods=["ar", "toolspec", "oracle"],
                      target="tiny-random", limit=2, max_new_tokens=40, budget=8, out=tmp_path, progress=False,
                      echo=False, tool_choice="required")
    bench_run.run_benchmark(cfg, engine=tiny_engine)
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    (_, samples), = load_datasets(cfg)
    offered = {s.id: {t.name for t in s.tools} for s in samples}
    assert all(r["identical"] for r in records) and len(records) == 6
    for r in records:
        assert '{"name": "' in r["text"] and r["text"].split('{"name": "')[1].split('"')[0] in offered[r["sample_id"]]
    assert "tool_choice required" in (tmp_path / "report.md").read_text()
    with pytest.raises(BenchError, match="hf-pld cannot decode under the call grammar"):
        bench_run.run_benchmark(BenchConfig(datasets=["apibank"], methods=["ar", "hf-pld"], tool_choice="required",
                                            out=tmp_path, progress=False, echo=False))
    with pytest.raises(BenchError, match="--tool-choice must be one of auto, required"):
        bench_run.run_benchmark(BenchConfig(datasets=["apibank"], tool_choice="none", out=tmp_path, progress=False,
                                            echo=False))


def test_oospec_rows_with_a_slot_adapter_is_identical_to_ar(smollm2_tokenizer, tmp_path):
    """`--methods ar,toolspec,oospec-rows --slot-adapter FOLDER`: the LoRA goes on the shared target, only slot rows
    read it; every method's output is ar's, and the run records the adapter."""
    from helpers import write_random_lora

    from oospec.engine.engine import Engine

    engine = Engine(_tiny_llama(len(smollm2_tokenizer), seed=0, layers=1), smollm2_tokenizer)  # its own: the LoRA
    adapter = write_random_lora(tmp_path / "slot-lora", engine.model, scale=1.0)
    cfg = BenchConfig(datasets=["apibank"], methods=["ar", "toolspec", "oospec-rows"], target="tiny-random", limit=2,
                      max_new_tokens=24, budget=8, out=tmp_path / "out", progress=False, echo=False, threads=1,
                      slot_adapter=str(adapter))
    rows = bench_run.run_benchmark(cfg, engine=engine)["summary"]["apibank"]
    assert rows["oospec-rows"]["identical_rate"] == 1.0 and rows["toolspec"]["identical_rate"] == 1.0
    assert rows["oospec-rows"]["cores"] == rows["ar"]["cores"]  # no process of its own: the target's cores
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    jobs = [r["sidecar"] for r in records if r["method"] == "oospec-rows"]
    assert len(jobs) == 2 and all(job["submitted"] and job["schedule"]["why"] == "always" for job in jobs)
    assert type(engine.model.model.layers[0].self_attn.q_proj).__name__ == "RowLoRALinear"
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["slot_adapter"] == str(adapter) and f"--slot-adapter {adapter}" in run["command"]
