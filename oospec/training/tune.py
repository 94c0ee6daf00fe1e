"""Choosing an adapter's predictor settings on validation traces (`oospec sidecar tune`).

The settings (`sidecar.json`): `min_call_probability` (below it the payload says "no call"), `rank_by` and
`prior_weight` (how the function is chosen). Each request is scored by the model once
(`SidecarPredictor.name_scores`); every ranking of the grid then chooses from those scores, the slots of each
distinct choice are decoded once, and every threshold is applied to the one call probability. So the whole grid
costs about one prediction per request, not one per setting.

The choice: the highest full-call agreement with the teacher's calls, among the settings that answer "no call"
to at most `max_missed_calls` of them (a missed call costs the whole hint; a hint on a plain answer costs one
rejected draft); ties go to the better call-or-none accuracy, then to the earlier setting of the grid.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from oospec.sidecar.protocol import Guess, PayloadError, encode_payload, parse_payload
from oospec.tools.schema import tools_from_openai
from oospec.training.config import MAX_MISSED_CALLS
from oospec.training.evaluate import calibration, format_percent, score_answer, summarize
from oospec.training.rows import job_for

# Highest first: among settings that tie, the higher threshold (more plain answers spared a hint) comes first.
THRESHOLDS = (0.5, 0.3, 0.2, 0.1, 0.05, 0.0)
RANKINGS = (("total", 1.0), ("total", 0.5), ("total", 0.0), ("greedy", 0.0))  # (rank_by, prior_weight)
TUNING_FILE = "tuning.json"  # beside sidecar.json: what was tried, on which traces, and why this was chosen


@dataclass(frozen=True)
class Setting:
    min_call_probability: float
    rank_by: str
    prior_weight: float


def grid(thresholds: Sequence[float] = THRESHOLDS, rankings=RANKINGS) -> list[Setting]:
    return [Setting(t, r, w) for r, w in rankings for t in thresholds]


@dataclass
class Answers:
    """One request, scored once: its call probability and the best guess under each ranking."""

    trace: dict
    tools: list
    call_probability: float | None  # None: the predictor could not score the request
    best: dict[tuple[str, float], Guess | None]  # (rank_by, prior_weight) -> best guess (None: none usable)
    compute_s: float


def _choose(predictor, scores, rank_by: str, prior_weight: float) -> list[tuple[int, float]]:
    """`rank_functions` as the predictor runs it with these settings."""
    if not scores.logprobs:
        return [(0, 0.0)]
    before = predictor.rank_by, predictor.prior_weight
    predictor.rank_by, predictor.prior_weight = rank_by, prior_weight
    try:
        return predictor.rank_functions(scores.rows, scores.shared, scores.logprobs,
                                        scores.prior if prior_weight else None)
    finally:
        predictor.rank_by, predictor.prior_weight = before


def answers_for(predictor, trace: dict, rankings=RANKINGS) -> Answers:
    job = job_for(trace)
    tools = tools_from_openai(trace["tools"])
    t0 = time.perf_counter()
    try:
        if not tools:
            raise ValueError("the request offers no tools to predict")
        scores = predictor.name_scores(job, tools)
    except ValueError:  # as `predict` fails on it: scored as no usable answer
        return Answers(trace, tools, None, {r: None for r in rankings}, time.perf_counter() - t0)
    filled: dict[tuple[int, ...], Guess | None] = {}
    best = {}
    for rank_by, weight in rankings:
        chosen = _choose(predictor, scores, rank_by, weight)
        key = tuple(i for i, _ in chosen)
        if key not in filled:
            # The best guess and its alternatives in one batch, as `predict` decodes them, read back through the
            # payload as a drafter would.
            guesses = predictor.fill_slots(job, scores.prompt, [(tools[i], s) for i, s in chosen])
            try:
                filled[key] = parse_payload(encode_payload(job.request_id, guesses, 0.0, 0.0), job.request_id,
                                            tools).best
            except PayloadError:
                filled[key] = None
        best[(rank_by, weight)] = filled[key]
    return Answers(trace, tools, scores.call_probability, best, time.perf_counter() - t0)


def score_setting(answers: Sequence[Answers], s: Setting) -> list[dict]:
    """Each request as `oospec sidecar eval` would score the predictor run with setting `s`."""
    items = []
    for a in answers:
        p = a.call_probability
        no_call = p is not None and p < s.min_call_probability
        guess = None if no_call else a.best[(s.rank_by, s.prior_weight)]
        items.append(score_answer(a.trace, a.tools, guess, no_call, p, a.compute_s))
    return items


def choose(results: list[tuple[Setting, dict]], max_missed_calls: float) -> tuple[Setting, dict, bool]:
    """(the chosen setting, its figures, whether it meets the missed-call limit; see the module docstring)."""
    def meets(r: dict) -> bool:
        return r["missed_calls"] <= max_missed_calls * r["n"]

    pool = [x for x in results if meets(x[1])]
    if not pool:  # none meets it: the fewest missed calls, and say so
        fewest = min(r["missed_calls"] for _, r in results)
        pool = [x for x in results if x[1]["missed_calls"] == fewest]
    setting, figures = max(pool, key=lambda x: (x[1]["full_call_agreement"] or 0.0,
                                                 x[1]["call_decision_accuracy"] or 0.0))
    return setting, figures, meets(figures)


def tune(predictor, traces: Sequence[dict], settings: Sequence[Setting] | None = None,
         max_missed_calls: float = MAX_MISSED_CALLS, progress: bool = True) -> dict:
    """Score every setting on `traces` and choose one: {"chosen", "constraint_met", "figures", "grid"}."""
    from tqdm.auto import tqdm

    settings = list(settings or grid())
    rankings = tuple(dict.fromkeys((s.rank_by, s.prior_weight) for s in settings))
    answers = [answers_for(predictor, t, rankings) for t in tqdm(list(traces), desc="tune", unit="req",
                                                                  disable=not progress)]
    results = []
    for s in settings:
        items = score_setting(answers, s)
        results.append((s, {**summarize(items), "calibration": calibration(items)}))
    chosen, figures, met = choose(results, max_missed_calls)
    return {"chosen": asdict(chosen), "constraint_met": met, "max_missed_calls": max_missed_calls,
            "figures": figures, "grid": [{**asdict(s), **{k: v for k, v in r.items() if k != "calibration"}}
                                         for s, r in results]}


def check_validation_traces(manifest_path: str | Path | None, traces: Sequence[dict]) -> str:
    """Refuses traces that are not the split's validation items (settings are chosen on validation only; test is
    reported once). Returns what was checked, for the record."""
    from oospec.errors import OospecError

    if manifest_path is None or not Path(manifest_path).is_file():
        return "not checked: no data manifest of the split"
    doc = json.loads(Path(manifest_path).read_text())
    if doc.get("version") != 2:
        return f"not checked: {manifest_path} has no validation split (manifest version 1)"
    validation = set(doc["items"]["validation"])
    stray = [t["id"] for t in traces if t["id"] not in validation]
    if stray:
        raise OospecError(f"{len(stray)} of {len(traces)} traces (e.g. {stray[0]}) are not validation items of "
                          f"{manifest_path}: settings are chosen on the validation split only")
    return f"all {len(traces)} traces are validation items of {manifest_path}"


def write_tuning(adapter: str | Path, result: dict, traces_path: str | Path, checked: str = "") -> dict:
    """The chosen settings into the adapter's sidecar.json (other settings there kept), and the record of the
    choice (the traces' digest, every setting's figures) into tuning.json. Returns the new sidecar.json."""
    from oospec.sidecar.predictor import SIDECAR_SETTINGS

    folder = Path(adapter)
    path = folder / SIDECAR_SETTINGS
    settings = {**(json.loads(path.read_text()) if path.is_file() else {}), **result["chosen"]}
    path.write_text(json.dumps(settings) + "\n")
    digest = hashlib.sha256(Path(traces_path).read_bytes()).hexdigest()
    (folder / TUNING_FILE).write_text(json.dumps({"traces": str(traces_path), "traces_sha256": digest,
                                                 "validation_check": checked, **result},
                                                 indent=1, ensure_ascii=False) + "\n")
    return settings


def format_grid(result: dict) -> str:
    lines = [("| min_call_probability | rank_by | prior_weight | full-call agreement | function accuracy "
              "| call or none | missed calls | |"), "|---:|---|---:|---:|---:|---:|---:|---|"]
    for g in result["grid"]:
        mark = "chosen" if all(g[k] == v for k, v in result["chosen"].items()) else ""
        lines.append(f"| {g['min_call_probability']} | {g['rank_by']} | {g['prior_weight']} "
                     f"| {format_percent(g['full_call_agreement'])} | {format_percent(g['function_accuracy'])} "
                     f"| {format_percent(g['call_decision_accuracy'])} | {g['missed_calls']} of {g['n']} | {mark} |")
    return "\n".join(lines)
