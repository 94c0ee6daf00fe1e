"""The GPU projection (oospec.bench.projection): a replay priced by hand, the fallbacks named, a committed run's
steps reproduced, the check against the GPU's own measured runs, and the command's labels."""

import json
import re
from pathlib import Path

import pytest

from oospec.bench.projection import ASSUMPTIONS, LABEL, GpuCosts, ProjectionConfig, load_costs, project, replay
from oospec.bench.projection_report import check_measured, markdown, oracle_tree_sizes, write
from oospec.cli import main

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "experiments/results/gpu-h200/gpu_check.json"

# c(1) = 10 ms, c(17) = 20 ms (linear between); prefill measured at 100 tokens: 50 ms.
CURVE = {"prompt_len": 100, "prefill_s": 0.05, "device_name": "Fake GPU", "seconds": {"1": 0.01, "17": 0.02}}


def _record(method, sample, accepted, tree_sizes=None, prompt=200, draft_s=0.0, **extra):
    rec = {"dataset": "synthetic", "sample_id": sample, "method": method,
           "new_tokens": 1 + len(accepted) + sum(accepted), "target_forwards": 1 + len(accepted),
           "accepted_per_step": accepted, "prompt_tokens": prompt, "prompt_tokens_reused": 0, "draft_s": draft_s,
           "e2e_s": 1.0, **extra}
    if tree_sizes is not None:
        rec["tree_sizes"] = tree_sizes
    return rec


def _run_folder(tmp_path, records, budget=16) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"command": "oospec bench run (synthetic)", "target": "none",
                                                 "dtype": "bfloat16", "budget": budget}))
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def _costs_file(tmp_path) -> Path:
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(CURVE))
    return path


def test_synthetic_replay_matches_the_hand_computed_answer(tmp_path):
    records = [
        # ar: 5 steps of c(1) = 0.05, prefill of 200 tokens = 2 x 0.05 = 0.10 -> 0.15 s
        _record("ar", "a", [0] * 5, tree_sizes=[0] * 5),
        # 2 steps: c(17) = 0.02 and c(9) = 0.015; prefill 0.10; host 0.005 -> 0.14 s
        _record("toolspec", "a", [3, 4], tree_sizes=[16, 8], draft_s=0.005),
        # 1 step of c(17): 0.02 + prefill 0.10 -> 0.12 s
        _record("oracle", "a", [8], tree_sizes=[16]),
    ]
    report = project(ProjectionConfig(runs=[str(_run_folder(tmp_path, records))], costs=str(_costs_file(tmp_path))))
    table = report["summary"]["synthetic"]
    assert table["ar"]["projected_e2e_s"] == pytest.approx(0.15)
    assert table["toolspec"]["projected_e2e_s"] == pytest.approx(0.14)
    assert table["toolspec"]["projected_host_s"] == pytest.approx(0.005)
    assert table["oracle"]["projected_e2e_s"] == pytest.approx(0.12)
    assert table["toolspec"]["projected_e2e_speedup"] == pytest.approx(0.15 / 0.14)
    assert table["toolspec"]["projected_decode_speedup"] == pytest.approx(0.05 / 0.04)
    assert table["toolspec"]["projected_oracle_fraction"] == pytest.approx((0.15 / 0.14 - 1) / (0.15 / 0.12 - 1))
    assert table["oracle"]["projected_vs_toolspec"] == pytest.approx(0.14 / 0.12)
    assert report["assumptions"] == {}  # every field the replay needs is in these records
    assert report["device"] == "Fake GPU"


def test_missing_fields_are_named_not_guessed():
    costs = GpuCosts("Fake GPU", "test", {1: 0.01, 17: 0.02}, {100: 0.05})
    rec = _record("toolspec", "a", [3, 4])
    del rec["prompt_tokens"]
    rep = replay(rec, costs, budget=16, prompt_tokens=None)
    assert rep.assumed == {"tree_sizes", "prompt_tokens"}
    assert rep.decode_s == pytest.approx(2 * 0.02)  # both steps at c(1 + budget), the upper bound
    assert rep.prefill_s == pytest.approx(0.05)  # the curve's own prompt length
    assert replay(_record("ar", "a", [0, 0]), costs, 16, 100).assumed == set()  # plain decoding: no tree
    sampled = dict(_record("ar", "a", []), target_forwards=4)  # plain sampling records no steps
    assert replay(sampled, costs, 16, 100).decode_s == pytest.approx(3 * 0.01)
    with pytest.raises(ValueError, match="not 1 \\(prefill\\) \\+ 2 steps"):
        replay(dict(rec, target_forwards=5), costs, 16, 100)


def test_sidecar_hints_free_or_waited_for():
    hinted = {"submitted": True, "arrived": True, "tokens_written_at_arrival": 1}
    rec = _record("oospec-always", "a", [5], tree_sizes=[16], prompt=100, sidecar=hinted)
    free = GpuCosts("Fake GPU", "test", {1: 0.01, 17: 0.02}, {100: 0.05})
    assert replay(rec, free, 16, 100).assumed == {"hints_free"}
    slow = GpuCosts("Fake GPU", "test", {1: 0.01, 17: 0.02}, {100: 0.05}, sidecar_job_s=0.08)
    rep = replay(rec, slow, 16, 100)
    assert rep.assumed == {"hints_wait"} and rep.wait_s == pytest.approx(0.03)
    assert rep.e2e_s == pytest.approx(0.05 + 0.03 + 0.02)
    late = dict(rec, sidecar=dict(hinted, tokens_written_at_arrival=7))
    assert replay(late, slow, 16, 100).assumed == {"hints_late"}
    assert all(k in ASSUMPTIONS for k in ("hints_free", "hints_wait", "hints_late"))


def test_curve_is_not_extrapolated_and_prefill_interpolates():
    costs = GpuCosts("Fake GPU", "test", {1: 0.01, 17: 0.02}, {100: 0.05, 300: 0.07})
    with pytest.raises(ValueError, match="outside the measured widths"):
        costs.forward(18)
    assert costs.prefill(200) == pytest.approx(0.06)
    assert costs.prefill(500) == pytest.approx(0.09)  # beyond: the last segment's slope


def _committed_run(kind: str) -> Path:
    """The newest committed held-out cold run of `kind` (folders are pruned over time, so found, not named)."""
    folders = [f for f in (REPO / "experiments/results").glob(f"cold-{kind}-bf16*")
               if (f / "samples.jsonl").exists() and (f / "run.json").exists()]
    assert folders, f"no committed cold-{kind}-bf16* run with samples.jsonl under experiments/results"
    folders.sort(key=lambda f: int(f.name.rsplit("-v", 1)[1]) if re.search(r"-v\d+$", f.name) else 0)
    return folders[-1]


def test_committed_run_reproduces_each_methods_step_count():
    folder = _committed_run("bfcl")
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    report = project(ProjectionConfig(runs=[str(folder)], costs=str(H200), count_prompts=False))
    for ds, table in report["summary"].items():
        for method, row in table.items():
            recs = [r for r in records if r["dataset"] == ds and r["method"] == method]
            assert row["n"] == len(recs)
            assert row["target_forwards"] == sum(r["target_forwards"] for r in recs)
            assert row["new_tokens"] == sum(r["new_tokens"] for r in recs)
        assert table["ar"]["projected_e2e_speedup"] == 1.0
        assert table["oracle"]["projected_e2e_speedup"] > table["ar"]["projected_e2e_speedup"]
    assert "prompt_tokens" in report["assumptions"]  # not counted here, and so named


def test_check_replays_the_gpus_own_runs():
    assert oracle_tree_sizes(10, 3) == [3, 3, 0]
    assert len(oracle_tree_sizes(128, 6)) + 1 == round(128 / 6.4)  # the recorded tau of that run
    rows = check_measured(H200, forwards=("padded",))
    assert {r["shape"] for r in rows} == {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"}
    assert {r["method"] for r in rows} == {"ar", "oracle b=6", "oracle b=16", "oracle b=63"}
    costs = load_costs(H200, "qwen2.5-7b", "padded")
    ar = next(r for r in rows if r["shape"] == "qwen2.5-7b" and r["method"] == "ar")
    assert ar["steps"] == 127 and ar["projected_decode_s"] == pytest.approx(127 * costs.forward(1))
    assert ar["error"] == pytest.approx(ar["projected_decode_s"] / ar["measured_decode_s"] - 1)


def test_command_labels_its_output_as_projected(tmp_path, capsys):
    records = [_record("ar", "a", [0] * 3, tree_sizes=[0] * 3), _record("toolspec", "a", [2], tree_sizes=[4])]
    folder = _run_folder(tmp_path, records)
    out = tmp_path / "projection"
    argv = ["bench", "project", str(folder), "--costs", str(_costs_file(tmp_path)), "--out", str(out)]
    assert main(argv) in (0, None)
    printed = capsys.readouterr().out
    assert printed.startswith(f"# {LABEL}")
    saved = json.loads((out / "projection.json").read_text())
    assert saved["label"] == LABEL and "not a measurement" in saved["label"]
    row = saved["summary"]["synthetic"]["toolspec"]
    assert {k for k in row if k.endswith("_s")} <= {k for k in row if k.startswith("projected_")}
    assert (out / "projection.md").read_text() == markdown(saved)
    write(saved, tmp_path / "again")  # a saved report writes again unchanged
    assert json.loads((tmp_path / "again/projection.json").read_text()) == saved


def test_costs_of_the_prepared_gpu_check(tmp_path):
    """tests/gpu_graph_check.py's JSON prices a replay: the graph path's widths, the eager prefill, the sidecar job."""
    check = {"device": "NVIDIA H100 80GB HBM3", "sidecar": {"job_s": 0.03}, "shapes": {"qwen2.5-1.5b": {
        "eager_cost": {"c1_ms": 30.0, "c16_ms": 31.0, "c64_ms": 40.0, "c16_over_c1": 1.03, "prefill_s": 0.07,
                       "prompt_len": 650},
        "graph_cost": {"c1_ms": 2.0, "c16_ms": 2.1, "c64_ms": 3.0, "c16_over_c1": 1.05,
                       "bitwise_equal_trees": [True]}}}}
    path = tmp_path / "gpu_graph_check.json"
    path.write_text(json.dumps(check))
    costs = load_costs(path, "qwen2.5-1.5b", "graph")
    assert costs.forward_s == pytest.approx({1: 0.002, 16: 0.0021, 64: 0.003})
    assert costs.prefill_s == {650: 0.07}
    assert costs.sidecar_job_s == 0.03 and costs.device.startswith("NVIDIA H100")
    assert load_costs(path, "qwen2.5-1.5b", "eager").forward(16) == pytest.approx(0.031)
    with pytest.raises(ValueError, match="no measured graph costs"):
        load_costs(path, "qwen2.5-7b", "graph")


def test_slot_rows_are_priced_in_their_forwards():
    costs = GpuCosts("Fake GPU", "test", {1: 0.01, 17: 0.02}, {100: 0.05})
    rec = _record("oospec-rows", "a", [3, 4], tree_sizes=[8, 0], slot_rows=[8, 0])
    assert replay(rec, costs, 16, 100).decode_s == pytest.approx(0.02 + 0.01)  # c(1 + 8 + 8), c(1)
    rec["slot_rows"] = [8]  # not one per step: not trusted
    assert replay(rec, costs, 16, 100).decode_s == pytest.approx(0.015 + 0.01)
