"""Offline agreement of a sidecar with the teacher on held-out requests (`oospec sidecar eval`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from oospec.sidecar.agreement import compare_call
from oospec.sidecar.protocol import PayloadError, parse_payload
from oospec.tools.dialects import ToolCall, validate
from oospec.tools.schema import tools_from_openai
from oospec.training.rows import job_for


def predictable(call: dict, tools) -> bool:
    """Whether the teacher's call is one a sidecar could agree with: an offered tool, its own arguments, values of
    the declared types. Leaving out a slot the schema calls required is allowed: the sidecar predicts what the
    teacher writes (API-Bank marks every slot required, and its descriptions say when one is not needed)."""
    relaxed = [replace(t, required=()) for t in tools]
    return not validate(ToolCall(call["name"], call.get("arguments") or {}), relaxed)


def agreement(predictor, traces: Sequence[dict], progress: bool = True) -> dict:
    """Function accuracy, per-slot exact match and full-call agreement of `predictor` with the teacher's calls."""
    from tqdm.auto import tqdm

    items, decisions = [], []
    for trace in tqdm(list(traces), desc="eval", unit="req", disable=not progress):
        job = job_for(trace)
        tools = tools_from_openai(trace["tools"])
        t0 = time.perf_counter()
        try:
            payload = parse_payload(predictor.predict(job), job.request_id, tools)
            guess, no_call = payload.best, payload.best is None
        except (PayloadError, ValueError):
            guess, no_call = None, False
        latency = time.perf_counter() - t0
        call = trace.get("call")
        decisions.append(no_call == (call is None))  # "call or none" decided as the teacher did
        if call is None:
            continue
        # The best guess only: offline agreement scores the sidecar's one answer, not its alternatives.
        agree = compare_call([guess] if guess is not None else [], ToolCall(call["name"], call.get("arguments") or {}))
        items.append({"id": trace["id"], "function": agree.function_match, "slots": agree.slots_total,
                      "slots_matched": agree.slots_matched, "full": agree.full_match,
                      "predictable": predictable(call, tools),
                      "latency_s": round(latency, 3), "predicted": None if guess is None else
                      {"function": guess.function, "arguments": guess.arguments}, "teacher": call})
    n = len(items)
    slots = sum(i["slots"] for i in items)
    fair = [i for i in items if i["predictable"]]
    return {"n": n, "no_call_requests": len(decisions) - n,
            "call_decision_accuracy": sum(decisions) / len(decisions) if decisions else None,
            "function_accuracy": sum(i["function"] for i in items) / n if n else None,
            "slot_exact_match": sum(i["slots_matched"] for i in items) / slots if slots else None,
            "full_call_agreement": sum(i["full"] for i in items) / n if n else None,
            # The same, over the teacher's calls a sidecar could agree with (`predictable`).
            "predictable_calls": len(fair),
            "full_call_agreement_predictable": sum(i["full"] for i in fair) / len(fair) if fair else None,
            "mean_latency_s": sum(i["latency_s"] for i in items) / n if n else None,
            "items": items}


def format_table(results: dict[str, dict]) -> str:
    lines = ["| sidecar | held-out requests (no call) | call or none | function accuracy | slot exact match "
             "| full-call agreement | on predictable calls | latency |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    pct = lambda x: "–" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    for name, r in results.items():
        lines.append(f"| {name} | {r['n'] + r.get('no_call_requests', 0)} ({r.get('no_call_requests', 0)}) "
                     f"| {pct(r.get('call_decision_accuracy'))} | {pct(r['function_accuracy'])} | {pct(r['slot_exact_match'])} "
                     f"| {pct(r['full_call_agreement'])} | {pct(r.get('full_call_agreement_predictable'))} "
                     f"({r.get('predictable_calls', '–')}) | {r['mean_latency_s']:.2f} s |")
    return "\n".join(lines)
