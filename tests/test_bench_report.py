"""What `bench run` writes and prints, rendered from made-up records (no model): the short table on stdout, the
sample-size warning, footnotes only for the methods that ran, and the two-panel PNG."""

import json

import pytest

from oospec.bench import run as bench_run
from oospec.bench.report import (FEW_ITEMS, footnotes, format_report, format_stdout, plot_speedup, plural,
                                 small_sample_warning, summarize)

# Per method: (cores, cpu threads, decode s, e2e s, new tokens, target forwards) of every item.
METHODS = {
    "ar": ("2", 2, 4.0, 10.0, 40, 40),
    "toolspec": ("2", 2, 1.0, 7.0, 40, 10),
    "oospec": ("1+1", 2, 0.5, 6.0, 40, 5),
}


def _records(n: int, methods=METHODS, dataset="apibank") -> list[dict]:
    return [{"dataset": dataset, "sample_id": f"item-{i}", "method": m, "cores": cores, "cpu_threads": threads,
             "prefill_s": e2e - decode, "decode_s": decode, "e2e_s": e2e, "new_tokens": tok, "target_forwards": fwd, "identical": True,
             "accurate": True}
            for i in range(n) for m, (cores, threads, decode, e2e, tok, fwd) in methods.items()]


def _header() -> dict:
    return {"command": "oospec bench run --dataset apibank --limit 2", "target": "smollm2-135m", "dtype": "float32",
            "device": "cpu", "kernels": "oospec.engine.onednn", "target_threads": 1, "max_new_tokens": 128,
            "budget": 16, "started": "2026-12-01T04:00:00", "elapsed_s": 12.0,
            "machine": {"cpu": "AMD EPYC", "cores": 2, "torch_threads": 2, "torch": "2.x", "transformers": "4.x",
                        "python": "3.12"},
            "sidecar": {"model": "qwen2.5-coder-0.5b", "adapter": None, "threads": 1, "device": "cpu"}}


def test_summary_of_the_fake_run_is_what_the_tables_show():
    rows = summarize(_records(2), list(METHODS))["apibank"]
    assert rows["toolspec"]["decode_speedup"] == pytest.approx(4.0)
    assert rows["oospec"]["e2e_speedup"] == pytest.approx(10 / 6)
    assert rows["oospec"]["tau"] == pytest.approx(8.0)
    assert rows["oospec"]["prefill_s"] == pytest.approx(2 * 5.5) and rows["ar"]["e2e_s"] == pytest.approx(20.0)


def test_stdout_is_a_short_table_with_the_report_path_and_a_small_sample_warning(tmp_path):
    text = format_stdout(summarize(_records(2), list(METHODS)), tmp_path)
    lines = text.splitlines()
    assert lines[0] == "apibank (speed-ups vs ar on equal cores)"
    assert lines[1].split() == ["method", "cores", "n", "tau", "decode", "e2e", "identical"]
    oospec = next(line for line in lines if line.startswith("oospec"))
    assert oospec.split() == ["oospec", "1+1", "2", "8.00", "8.00x", "1.67x", "100%"]
    assert "WARNING: few items (apibank: 2 items)" in text
    assert f"report: {tmp_path / 'report.md'}" in text and str(tmp_path / "speedup.png") in text
    # short: no footnotes, no glossary, no sidecar table
    assert "oracle" not in text and "tau:" not in text and len(lines) < 12


def test_no_warning_from_five_items_on():
    assert small_sample_warning(summarize(_records(FEW_ITEMS), list(METHODS))) is None
    one = small_sample_warning(summarize(_records(1), list(METHODS)))
    assert "1 item)" in one and f"fewer than {FEW_ITEMS}" in one


def test_report_footnotes_only_for_methods_that_ran():
    summary = summarize(_records(2, {k: METHODS[k] for k in ("ar", "toolspec")}), ["ar", "toolspec"])
    report = format_report(summary, {**_header(), "sidecar": None}, [])
    assert "tau: new tokens / target forwards" in report and "identical: generated token ids" in report
    for absent in ("oospec-wait", "ar-all-cores", "hf-* peers", "sidecar table", "ar-target-threads"):
        assert absent not in report, absent
    assert "**WARNING: few items" in report
    with_sidecar = footnotes(["ar", "oospec", "oospec-wait", "hf-pld"])
    assert "sidecar table" in with_sidecar and "oospec-wait: oospec whose target waits" in with_sidecar
    assert "hf-* peers" in with_sidecar and "ar-all-cores" not in with_sidecar


def test_report_header_says_thread_in_the_singular():
    summary = summarize(_records(5), list(METHODS))
    report = format_report(summary, _header(), [])
    assert "1 thread, own process" in report and "thread(s)" not in report and "WARNING" not in report
    assert plural(1, "thread") == "1 thread" and plural(2, "core") == "2 cores"


def test_png_has_two_panels_with_n_and_cores(tmp_path, monkeypatch):
    import matplotlib.figure

    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: saved.append(fig) or open(path, "wb").write(b"\x89PNG"))
    summary = summarize(_records(3) + _records(7, dataset="bfcl"), list(METHODS))
    plot_speedup(summary, list(METHODS), tmp_path / "speedup.png", title="smollm2-135m, 1 core per method")
    assert (tmp_path / "speedup.png").read_bytes().startswith(b"\x89PNG")
    (fig,) = saved
    decode, e2e = fig.axes
    assert decode.get_title().startswith("decode speed-up") and e2e.get_title().startswith("end-to-end speed-up")
    assert [t.get_text() for t in decode.get_xticklabels()] == ["apibank\nn=3", "bfcl\nn=7"]
    legend = [t.get_text() for t in e2e.get_legend().get_texts()]
    assert legend == ["toolspec (2 cores)", "oospec (1+1 cores)"]
    heights = sorted(round(b.get_height(), 3) for b in e2e.patches)
    assert heights == sorted([round(10 / 7, 3)] * 2 + [round(10 / 6, 3)] * 2)
    assert fig._suptitle.get_text() == "smollm2-135m, 1 core per method"


def test_png_is_written_for_real(tmp_path):
    summary = summarize(_records(2), list(METHODS))
    plot_speedup(summary, list(METHODS), tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_results_prints_the_short_summary(tmp_path, capsys):
    """run.py's last step on the fake records: every file written, stdout the short form."""
    from oospec.bench.config import BenchConfig, Cores

    cfg = BenchConfig(datasets=["apibank"], target="smollm2-135m", out=tmp_path)
    cores = Cores(target=1, sidecar=0, sidecar_device=None, machine=2)
    header = {**_header(), "sidecar": None}
    bench_run._write_results(cfg, tmp_path, _records(1, {k: METHODS[k] for k in ("ar", "toolspec")}), [], header,
                             ["ar", "toolspec"], cores)
    out = capsys.readouterr().out
    assert "WARNING: few items (apibank: 1 item)" in out and "report: " in out and "## apibank" not in out
    assert json.loads((tmp_path / "summary.json").read_text())["apibank"]["toolspec"]["n"] == 1
    assert (tmp_path / "speedup.png").is_file() and "| toolspec |" in (tmp_path / "report.md").read_text()


def test_bench_serve_writes_the_records_every_bench_writes(tmp_path):
    """bench serve's files come from oospec.bench.records as bench run's do: samples.jsonl with each turn's
    comparison against the first configuration, and the JSON report."""
    from oospec.bench import serve

    def turn(i, tokens):
        return {"turn": i, "latency_s": 1.0, "prompt_tokens": 9, "cached_tokens": 0, "completion_tokens": 2,
                "finish_reason": "stop", "stats": {"prefill_s": 0.5, "decode_s": 0.5, "tau": 1.0, "drafter": None},
                "token_ids": tokens, "tool_calls": []}

    report = {"dialogue": "d", "dataset": "apibank:1", "turn_ids": ["t1", "t2"], "target": "t", "max_tokens": 8,
              "threads": 1, "configs": ["ar cold", "ar reuse"], "identical_to_first": {"ar cold": True, "ar reuse": False},
              "trained_turns": [], "turns": {"ar cold": [turn(1, [1, 2]), turn(2, [3, 4])],
                                             "ar reuse": [turn(1, [1, 2]), turn(2, [3, 5])]}}
    out = serve.write(report, tmp_path / "out", ["apibank:1"])
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["method"], r["sample_id"], r["identical"], r.get("first_diff")) for r in records] == [
        ("ar cold", "t1", True, None), ("ar cold", "t2", True, None), ("ar reuse", "t1", True, None),
        ("ar reuse", "t2", False, 1)]
    assert json.loads((out / "serve.json").read_text())["dialogue"] == "d" and (out / "serve.md").is_file()


def test_bench_serve_picks_its_dialogue_among_the_selected_sessions():
    from oospec.bench.items import BenchError, Selection, load_datasets
    from oospec.bench.serve import pick_dialogue

    (_, two), = load_datasets(Selection(datasets=["apibank:1"], sessions=True, limit=2))
    name, turns = pick_dialogue(two, None)
    assert turns and all(s in two for s in turns) and len({s.id for s in turns}) == len(turns)
    (_, first), = load_datasets(Selection(datasets=["apibank:1"], sessions=True, limit=1))
    assert [s.id for s in pick_dialogue(two, pick_dialogue(first, None)[0])[1]] == [s.id for s in first]
    with pytest.raises(BenchError, match="no dialogue"):
        pick_dialogue(two, "nope")
