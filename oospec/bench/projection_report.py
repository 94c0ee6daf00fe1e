"""The projection's check against what a GPU measured, and its files (projection.json, projection.md).

The check: tests/gpu_check.py decoded 128 tokens on the GPU plainly (`ar`) and with the oracle drafter at budgets
6, 16 and 63 (random-initialised real architectures). Those runs' steps follow from what they recorded (new
tokens, tau, budget: the oracle drafts the true continuation, min(budget, tokens left) nodes per step), so
they can be replayed against the same file's cost curve and the projected decode time set beside the measured
one: the error of the method, on the one kind of request where both exist.
"""

from __future__ import annotations

import json
from pathlib import Path

from oospec.bench.projection import LABEL, GpuCosts, load_costs
from oospec.bench.records import write_json


def oracle_tree_sizes(new_tokens: int, budget: int) -> list[int]:
    """The nodes of each verification forward of the oracle drafter at `budget` producing `new_tokens` tokens (the
    prefill gives the first; each step its accepted chain and one more token; the last chain stops where the
    reply does)."""
    sizes, produced = [], 1
    while produced < new_tokens:
        size = min(budget, new_tokens - produced - 1)
        sizes.append(size)
        produced += size + 1
    return sizes


def check_measured(gpu_check: str | Path, forwards: tuple[str, ...] = ("padded", "stock")) -> list[dict]:
    """For every preset and forward of a gpu_check.json: the measured decode seconds of `ar` and the oracle runs,
    their projection from the file's own cost curve, and the error (projected / measured - 1)."""
    data = json.loads(Path(gpu_check).read_text())
    rows = []
    for shape, entry in data["presets"].items():
        for forward in forwards:
            speed = entry.get(f"{forward}_speed")
            if not speed or f"{forward}_curve" not in entry:
                continue
            costs = load_costs(gpu_check, shape, forward)
            n = int(speed["new_tokens"])
            rows.append(_row(shape, forward, "ar", [0] * (n - 1), speed["ar_decode_s"], 0.0, costs))
            for key, run in speed.items():
                if not key.startswith("oracle_b"):
                    continue
                budget = int(key.removeprefix("oracle_b"))
                sizes = oracle_tree_sizes(n, budget)
                forwards_recorded = round(n / run["tau"])
                if forwards_recorded != len(sizes) + 1:
                    raise ValueError(f"{shape} {forward} {key}: tau {run['tau']} means {forwards_recorded} forwards, "
                                     f"the oracle's steps give {len(sizes) + 1}")
                rows.append(_row(shape, forward, f"oracle b={budget}", sizes, run["decode_s"], run["draft_s"], costs))
    return rows


def _row(shape: str, forward: str, method: str, sizes: list[int], measured: float, host: float,
         costs: GpuCosts) -> dict:
    projected = sum(costs.forward(1 + s) for s in sizes) + host
    return {"shape": shape, "forward": forward, "method": method, "steps": len(sizes),
            "measured_decode_s": measured, "projected_decode_s": projected, "error": projected / measured - 1}


def _f(x, digits: int = 3, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def markdown(report: dict) -> str:
    lines = [f"# {LABEL}", "", f"Device of the costs: **{report['device']}**. Every time below is projected unless "
             "its column says measured.", ""]
    if report.get("command"):
        lines += ["```bash", report["command"], "```", ""]
    costs = report["costs"]
    widths = ", ".join(f"c({k}) = {1000 * v:.1f} ms" for k, v in sorted(costs["forward_s"].items()))
    lines += [f"- costs: {costs['source']}: {widths}; {costs['prefill']}; sidecar job: "
              f"{_f(costs['sidecar_job_s'], 3, ' s') if costs['sidecar_job_s'] is not None else 'not measured'}",
              f"- host time: {report['host_time']}"]
    for run in report["runs"]:
        lines.append(f"- traces: `{run['folder']}` ({run['records']} records, target {run['target']} {run['dtype']}, "
                     f"budget {run['budget']}; prompt tokens {run['prompt_tokens']}): `{run['command']}`")
    if report["assumptions"]:
        lines += ["", "Assumptions (what the records lack, and how the replay fills it):"]
        lines += [f"- **{k}**: {v}" for k, v in report["assumptions"].items()]
    for ds, table in report["summary"].items():
        lines += ["", f"## {ds}", "",
                  "| method | n | forwards | tau | prefill s | hint wait s | forwards s | host s | **e2e s** | "
                  "**e2e speed-up vs ar** | decode speed-up | vs toolspec | share of oracle gain | "
                  "CPU e2e speed-up (measured) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m, r in table.items():
            lines.append(
                f"| {m} | {r['n']} | {r['target_forwards']} | {r['new_tokens'] / r['target_forwards']:.2f} "
                f"| {_f(r['projected_prefill_s'])} | {_f(r['projected_wait_s'])} | {_f(r['projected_forwards_s'])} "
                f"| {_f(r['projected_host_s'])} | **{_f(r['projected_e2e_s'])}** "
                f"| **{_f(r['projected_e2e_speedup'], 2, 'x')}** | {_f(r['projected_decode_speedup'], 2, 'x')} "
                f"| {_f(r['projected_vs_toolspec'], 2, 'x')} | {_pct(r['projected_oracle_fraction'])} "
                f"| {_f(r['cpu_e2e_speedup'], 2, 'x')} |")
    if report.get("check"):
        lines += ["", "## Check against GPU measurements", "",
                  f"`ar` and the oracle drafter decoding 128 tokens on the GPU ({report['check_source']}): their steps "
                  "replayed against the same file's cost curve, projected decode time vs measured.", "",
                  "| shape | forward | method | steps | measured decode s | projected decode s | error |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for r in report["check"]:
            lines.append(f"| {r['shape']} | {r['forward']} | {r['method']} | {r['steps']} | "
                         f"{r['measured_decode_s']:.4f} | {r['projected_decode_s']:.4f} | {100 * r['error']:+.1f}% |")
    return "\n".join(lines) + "\n"


def write(report: dict, out: str | Path) -> Path:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "projection.json", report)
    (folder / "projection.md").write_text(markdown(report), encoding="utf-8")
    return folder
