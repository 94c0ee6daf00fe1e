"""Offline agreement of a sidecar with the teacher (`oospec sidecar eval`), and how well its "call or none"
belief is calibrated.

Every trace is scored: a request the teacher answered with a call by the sidecar's best guess (function, slots,
whole call), and every request by the sidecar's call probability against whether the teacher called. Results
are given overall and per source (API-Bank, ToolAlpaca, each BFCL category), as JSON and as markdown tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from oospec.sidecar.agreement import compare_call
from oospec.sidecar.protocol import Guess, PayloadError, parse_payload
from oospec.tools.dialects import ToolCall, validate
from oospec.tools.schema import tools_from_openai
from oospec.training.rows import job_for

# Reliability table bins of the call probability (upper edges; the first bin starts at 0).
CALIBRATION_EDGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# Where the teacher called a tool, the sidecar's call probability must not fall below this: a sidecar sure
# that no call comes would withhold its hints from a request that needs them.
CONFIDENT_NO_CALL = 0.2


def predictable(call: dict, tools) -> bool:
    """Whether the teacher's call is one a sidecar could agree with: an offered tool, its own arguments, values of
    the declared types. Leaving out a slot the schema calls required is allowed: the sidecar predicts what the
    teacher writes (API-Bank marks every slot required, and its descriptions say when one is not needed)."""
    relaxed = [replace(t, required=()) for t in tools]
    return not validate(ToolCall(call["name"], call.get("arguments") or {}), relaxed)


def source_of(trace: dict) -> str:
    """Where a request comes from, for per-source figures: the dataset, and a BFCL item's category (from its
    id: simple_python_12 -> bfcl:simple_python)."""
    dataset = trace.get("dataset") or "?"
    if dataset == "bfcl":
        return "bfcl:" + trace["id"].rsplit("_", 1)[0]
    return dataset


def score_answer(trace: dict, tools, guess: Guess | None, no_call: bool, call_probability: float | None,
                 latency_s: float) -> dict:
    """One request's record: the sidecar's answer (its best guess, or "no call") against the teacher's."""
    call = trace.get("call")
    item = {"id": trace["id"], "source": source_of(trace), "teacher_called": call is not None,
            "said_no_call": no_call, "call_probability": call_probability, "latency_s": round(latency_s, 3)}
    if call is None:
        return item
    # The best guess only: offline agreement scores the sidecar's one answer, not its alternatives.
    agree = compare_call([guess] if guess is not None else [], ToolCall(call["name"], call.get("arguments") or {}))
    return {**item, "function": agree.function_match, "slots": agree.slots_total,
            "slots_matched": agree.slots_matched, "full": agree.full_match, "predictable": predictable(call, tools),
            "predicted": None if guess is None else {"function": guess.function, "arguments": guess.arguments},
            "teacher": call}


def _ratio(part: float, whole: int) -> float | None:
    return part / whole if whole else None


def summarize(items: Sequence[dict]) -> dict:
    """The agreement figures of a set of scored requests (`score_answer`)."""
    calls = [i for i in items if i["teacher_called"]]
    plain = [i for i in items if not i["teacher_called"]]
    n, slots = len(calls), sum(i["slots"] for i in calls)
    fair = [i for i in calls if i["predictable"]]
    missed = sum(i["said_no_call"] for i in calls)
    right_none = sum(i["said_no_call"] for i in plain)
    return {"requests": len(items), "n": n, "no_call_requests": len(plain),
            "call_decision_accuracy": _ratio(n - missed + right_none, len(items)),
            "missed_calls": missed,  # the teacher called, the sidecar said "no call"
            "function_accuracy": _ratio(sum(i["function"] for i in calls), n),
            "slot_exact_match": _ratio(sum(i["slots_matched"] for i in calls), slots),
            "full_call_agreement": _ratio(sum(i["full"] for i in calls), n),
            # The same, over the teacher's calls a sidecar could agree with (`predictable`).
            "predictable_calls": len(fair),
            "full_call_agreement_predictable": _ratio(sum(i["full"] for i in fair), len(fair)),
            # The whole answer as the teacher wrote it: the call exactly, or "no call" to a plain answer.
            "answer_agreement": _ratio(sum(i["full"] for i in calls) + right_none, len(items)),
            "mean_latency_s": _ratio(sum(i["latency_s"] for i in calls), n)}


def calibration(items: Sequence[dict], edges: Sequence[float] = CALIBRATION_EDGES) -> dict:
    """The reliability of the call probability: per bin, how many requests, the mean probability and how often
    the teacher did call; the expected calibration error; and the lowest probability given where the teacher
    called (it should never be below `CONFIDENT_NO_CALL`)."""
    scored = [i for i in items if i["call_probability"] is not None]
    bins, lower = [], 0.0
    for k, upper in enumerate(edges):
        last = k == len(edges) - 1
        inside = [i for i in scored if lower <= i["call_probability"] < upper or (last and i["call_probability"] >= upper)]
        if inside:
            bins.append({"from": lower, "to": upper, "count": len(inside),
                         "mean_predicted": sum(i["call_probability"] for i in inside) / len(inside),
                         "observed_call_rate": sum(i["teacher_called"] for i in inside) / len(inside)})
        lower = upper
    called = [i["call_probability"] for i in scored if i["teacher_called"]]
    return {"scored": len(scored), "bins": bins,
            "expected_calibration_error": _ratio(sum(b["count"] * abs(b["mean_predicted"] - b["observed_call_rate"])
                                                     for b in bins), len(scored)),
            "lowest_probability_where_called": min(called) if called else None,
            f"called_below_{CONFIDENT_NO_CALL}": sum(p < CONFIDENT_NO_CALL for p in called)}


def report(items: list[dict]) -> dict:
    """Figures overall, calibration, the same per source, and the scored requests."""
    sources = sorted({i["source"] for i in items})
    by_source = {s: summarize([i for i in items if i["source"] == s]) for s in sources}
    for s in sources:
        by_source[s]["calibration"] = calibration([i for i in items if i["source"] == s])
    return {**summarize(items), "calibration": calibration(items), "by_source": by_source, "items": items}


def agreement(predictor, traces: Sequence[dict], progress: bool = True) -> dict:
    """How `predictor`'s answers agree with the teacher's on `traces` (`report`)."""
    from tqdm.auto import tqdm

    items = []
    for trace in tqdm(list(traces), desc="eval", unit="req", disable=not progress):
        job = job_for(trace)
        tools = tools_from_openai(trace["tools"])
        t0 = time.perf_counter()
        try:
            payload = parse_payload(predictor.predict(job), job.request_id, tools)
            guess, no_call, p = payload.best, payload.best is None, payload.call_probability
        except (PayloadError, ValueError):
            guess, no_call, p = None, False, None
        items.append(score_answer(trace, tools, guess, no_call, p, time.perf_counter() - t0))
    return report(items)


def not_held_out(adapter: str | None, traces: Sequence[dict]) -> list[str]:
    """The traces an adapter's training manifest says it used, or whose teacher called a tool it used: its
    agreement on them measures recall, not prediction (empty: no adapter, or no manifest to tell)."""
    from oospec.sidecar.provenance import training_manifest
    from oospec.training.content import trace_request

    manifest = training_manifest(adapter)
    if manifest is None:
        return []
    return [t["id"] for t in traces if manifest.overlap(trace_request(t))]


# -- markdown ------------------------------------------------------------------------------------------------
def format_percent(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _p(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def format_table(results: dict[str, dict]) -> str:
    """One row per sidecar: agreement with the teacher."""
    lines = [("| sidecar | requests (no call) | call or none | missed calls | function accuracy | slot exact match "
              "| full-call agreement | on predictable calls | latency |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        latency = "–" if r["mean_latency_s"] is None else f"{r['mean_latency_s']:.2f} s"
        lines.append(f"| {name} | {r['requests']} ({r['no_call_requests']}) | {format_percent(r['call_decision_accuracy'])} "
                     f"| {r['missed_calls']} | {format_percent(r['function_accuracy'])} | {format_percent(r['slot_exact_match'])} "
                     f"| {format_percent(r['full_call_agreement'])} | {format_percent(r['full_call_agreement_predictable'])} "
                     f"({r['predictable_calls']}) | {latency} |")
    return "\n".join(lines)


def format_calibration(results: dict[str, dict]) -> str:
    """Per sidecar: the reliability table of its call probability, then its lowest probability where the teacher
    called."""
    below = f"called_below_{CONFIDENT_NO_CALL}"
    lines = ["| sidecar | call probability | requests | mean predicted | teacher called |", "|---|---|---:|---:|---:|"]
    for name, r in results.items():
        for b in r["calibration"]["bins"]:
            lines.append(f"| {name} | {b['from']:.1f}–{b['to']:.1f} | {b['count']} | {_p(b['mean_predicted'])} "
                         f"| {format_percent(b['observed_call_rate'])} |")
    lines += ["", (f"| sidecar | lowest probability where the teacher called | teacher calls below {CONFIDENT_NO_CALL} "
                   "| expected calibration error |"), "|---|---:|---:|---:|"]
    for name, r in results.items():
        c = r["calibration"]
        lines.append(f"| {name} | {_p(c['lowest_probability_where_called'])} | {c[below]} of {r['n']} "
                     f"| {_p(c['expected_calibration_error'])} |")
    return "\n".join(lines)


def format_by_source(results: dict[str, dict]) -> str:
    lines = [("| sidecar | source | requests (no call) | call or none | function accuracy | full-call agreement "
              "| lowest probability where called |"), "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        for source, s in r["by_source"].items():
            lines.append(f"| {name} | {source} | {s['requests']} ({s['no_call_requests']}) "
                         f"| {format_percent(s['call_decision_accuracy'])} | {format_percent(s['function_accuracy'])} "
                         f"| {format_percent(s['full_call_agreement'])} "
                         f"| {_p(s['calibration']['lowest_probability_where_called'])} |")
    return "\n".join(lines)


SECTIONS: tuple[tuple[str, Callable[[dict[str, dict]], str]], ...] = (
    ("Agreement with the teacher", format_table), ("Calibration of call or none", format_calibration),
    ("Per source", format_by_source))


def format_report(results: dict[str, dict]) -> str:
    """The markdown of `oospec sidecar eval` (what an adapter's evaluation.md holds)."""
    return "\n\n".join(f"### {title}\n\n{fmt(results)}" for title, fmt in SECTIONS)
