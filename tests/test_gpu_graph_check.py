"""The prepared GPU check (tests/gpu_graph_check.py) runs to the end on the CPU with tiny shapes, writes every
figure with its verdict, and keeps to its time budget: a lent GPU's run is then only its numbers."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_graph_check  # noqa: E402


def test_dry_run_measures_every_figure(tmp_path):
    report = gpu_graph_check.main(["--device", "cpu", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_graph_check.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["dry_run"] and saved["skipped"] == []
    for shape in gpu_graph_check.TARGETS:
        entry = saved["shapes"][shape]
        assert entry["install"]["applied"], entry["install"]
        assert entry["probe"]["invariant"] is True
        assert entry["eager_cost"]["c1_ms"] > 0 and entry["eager_cost"]["c16_over_c1"] > 0
    ar = saved["shapes"][gpu_graph_check.AR_SHAPE]["ar"]
    assert ar["new_tokens"] == 24 and ar["ms_per_token"] > 0
    assert saved["sidecar"]["job_s"] > 0 and saved["sidecar"]["prompt_tokens"] == 120
    verdicts = saved["verdicts"]
    assert verdicts["qwen2.5-7b bitwise probe"] is True
    assert any(k.startswith("sidecar job <=") for k in verdicts)
    assert any(k.startswith("ar per token <=") for k in verdicts)
    # a CPU has no bound for c(1): named, not judged
    assert all(v is None for k, v in verdicts.items() if "no bound for" in k)
    assert saved["graph_path"].startswith("present")
    for shape in gpu_graph_check.TARGETS:  # on a CPU: the static forward run eagerly, compared bitwise
        graph = saved["shapes"][shape]["graph_cost"]
        assert graph["uses_graphs"] is False and graph["why_not"].startswith("device is cpu")
        assert graph["bitwise_equal_trees"] == [True] * 4 and graph["c1_ms"] > 0
        assert verdicts[f"{shape} graph path bitwise equal to the padded forward"] is True
    assert saved["shapes"][gpu_graph_check.AR_SHAPE]["ar_graph"]["new_tokens"] == 24
    assert "ar per token <= 1.2 x c(1) (graph)" in verdicts


def test_out_of_time_steps_are_recorded_as_skipped(tmp_path):
    saved = gpu_graph_check.main(["--device", "cpu", "--out", str(tmp_path), "--budget-s", "0"])
    assert "probe" in saved["skipped"] and "sidecar" in saved["skipped"]
    assert "sidecar" not in saved and json.loads((tmp_path / "gpu_graph_check.json").read_text())["skipped"]


def test_sidecar_job_through_the_real_predictor(smollm2_path):
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(smollm2_path))
    model = gpu_graph_check.build("qwen2.5-0.5b", torch.float32, "cpu", tiny=True, vocab=vocab)
    job = gpu_graph_check.sidecar_job(model, 200, str(smollm2_path), repeats=1)
    assert job["how"].startswith("SidecarPredictor.predict") and job["prompt_tokens"] >= 200 and job["job_s"] > 0


def test_card_bounds():
    assert gpu_graph_check.card("NVIDIA H200") == "H200"
    assert gpu_graph_check.card("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_graph_check.card("AMD EPYC") is None
    report = {"device": "NVIDIA H100 80GB HBM3", "shapes": {
        "qwen2.5-7b": {"eager_cost": {"c1_ms": 8.0, "c16_over_c1": 1.05}, "ar": {"ms_per_token": 10.0}}}}
    verdicts = gpu_graph_check.verdicts(report)
    assert verdicts["qwen2.5-7b eager c(1) <= 9.0 ms"] is True
    assert verdicts["ar per token <= 1.2 x c(1) (eager)"] is False  # 10 > 1.2 x 8
