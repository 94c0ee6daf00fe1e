"""What travels between the engine and the sidecar process: a job out, a compact JSON payload back.

Plain data only (no torch, no transformers): the client in the engine's process imports this module alone.

The payload is the sidecar's whole answer: the function it expects and a value for every argument slot, with
optional alternative functions, and, for a turn of several calls (BFCL parallel), the calls it expects after
that one, in order (`"next"`; absent for one call, so a one-call payload reads as it always did). It is small (tens of bytes to a few hundred) and it is *untrusted*: the
sidecar may crash, lie or answer for another request, so `parse_payload` checks everything against the
request's tools before a hint is built from it. A payload that fails is dropped (or trimmed to its valid
slots); the engine then drafts as `toolspec` would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oospec.tools.dialects import ToolCall, validate
from oospec.tools.schema import Tool

MAX_PAYLOAD_BYTES = 64 * 1024  # a real payload is ~100 bytes; anything this large is a fault
MAX_VALUE_CHARS = 1024  # a rendered slot value longer than this is not a useful hint
MAX_ALTERNATIVES = 3
MAX_CALLS = 8  # calls of one turn a payload may carry; beyond, the list is cut
# Sent to the worker instead of a job: the predictor drops its caches before the next job, and the jobs still
# queued are dropped (they belong to the run that ended).
CLEAR_CACHE = "clear-cache"
# (CANCEL, request_id): the request ended; its job is dropped if the worker has not started it, which the
# worker confirms with ("dropped", (request_id, None)).
CANCEL = "cancel"


class PayloadError(ValueError):
    """A payload that cannot be used at all (not JSON, wrong request, unknown function, too large)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # short name of the fault, logged once per kind


@dataclass(frozen=True)
class Job:
    """One request as the sidecar sees it (plain data: it crosses a process boundary)."""

    request_id: str
    messages: list[dict]
    tools: list[dict]  # OpenAI-style tool specs (what the sidecar may predict)
    chat_tools: list[dict] | None = None  # tools as the request's chat template got them (None: in the prompt)
    opener: str = ""  # text the target writes before the call object (e.g. "<tool_call>\n")
    args_key: str = "arguments"
    function: str | None = None  # set: the target has already chosen it, predict only its slots
    openers: list[str] | None = None  # other openers the target may use (for "does a call come at all")

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> Job:
        return cls(**d)


@dataclass(frozen=True)
class Guess:
    """One predicted call: the function and the slot values the sidecar could fill."""

    function: str
    arguments: dict[str, Any]  # slot -> JSON value, in the order the target is expected to write them
    # What the sidecar ranked the function by: the name's log-probability, less `prior_weight` times its
    # log-probability without the conversation. The difference between two guesses of one call is their log-odds.
    score: float = 0.0
    # Slots still being predicted (an early payload, published while they grow): not in `arguments`, and not
    # absent either, so a hint stops before the first of them instead of closing the call without it.
    pending: tuple[str, ...] = ()


@dataclass(frozen=True)
class Payload:
    request_id: str
    best: Guess | None  # None: the sidecar expects the target to answer without a call
    alternatives: tuple[Guess, ...] = ()
    compute_s: float = 0.0  # the sidecar's own time for this request
    finished_at: float = 0.0  # time.time() when the sidecar finished (same clock as the engine's)
    size_bytes: int = 0
    dropped: tuple[str, ...] = field(default=())  # problems found and removed while parsing
    call_probability: float | None = None  # the sidecar's belief that the target calls a tool at all
    following: tuple[Guess, ...] = ()  # the calls expected after `best` in the same turn, in order

    @property
    def complete(self) -> bool:
        """No slot of any guess is still pending: no later payload for this job will change it."""
        return not any(g.pending for g in (*self.guesses, *self.following))

    @property
    def guesses(self) -> tuple[Guess, ...]:
        """The guesses for the turn's first call, best first."""
        return () if self.best is None else (self.best, *self.alternatives)

    @property
    def calls(self) -> tuple[Guess, ...]:
        """The whole turn as predicted: the best first call, then the calls expected after it."""
        return () if self.best is None else (self.best, *self.following)


def _guess_doc(g: Guess) -> dict:
    doc = {"function": g.function, "arguments": g.arguments, "score": round(g.score, 4)}
    if g.pending:
        doc["pending"] = list(g.pending)
    return doc


def encode_payload(request_id: str, guesses: Sequence[Guess], compute_s: float, finished_at: float,
                   call_probability: float | None = None, following: Sequence[Guess] = ()) -> bytes:
    """No guesses: the sidecar expects no call (`"function": null`). `following`: the calls expected after
    the best guess in the same turn."""
    best, *alts = guesses if guesses else (None,)
    doc = {"id": request_id, "function": best and best.function, "arguments": best and best.arguments,
           "score": best and round(best.score, 4), "pending": list(best.pending) if best is not None else [],
           "alternatives": [_guess_doc(g) for g in alts],
           "next": [_guess_doc(g) for g in following] if best is not None else [],
           "call_p": None if call_probability is None else float(f"{call_probability:.4g}"),
           "compute_s": round(compute_s, 4), "t": finished_at}
    for key in ("alternatives", "next", "call_p", "arguments", "score", "pending"):
        if doc[key] in (None, []):
            del doc[key]
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _guess(doc: Any, tools: Mapping[str, Tool], dropped: list[str]) -> Guess:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("function"), str):
        raise PayloadError("malformed", "payload has no function name")
    name = doc["function"]
    tool = tools.get(name)
    if tool is None:
        raise PayloadError("unknown-function", f"sidecar predicted unknown function {name!r}")
    args = doc.get("arguments") or {}
    if not isinstance(args, Mapping):
        raise PayloadError("malformed", f"arguments of {name!r} are a {type(args).__name__}, not an object")
    kept: dict[str, Any] = {}
    for key, value in args.items():
        if tool.param(key) is None:
            dropped.append(f"{name}.{key}: not a parameter")
            continue
        if len(json.dumps(value, ensure_ascii=False)) > MAX_VALUE_CHARS:
            dropped.append(f"{name}.{key}: value longer than {MAX_VALUE_CHARS} characters")
            continue
        problems = validate(ToolCall(name, {key: value}), {name: tool}, coerce_strings=False)
        problems = [p for p in problems if "missing required" not in p]
        if problems:
            dropped.append(problems[0])
            continue
        kept[key] = value
    if args and not kept:
        # Every slot it gave was unusable: the function guess is no more trustworthy than its slots.
        raise PayloadError("bad-slots", f"every slot of {name!r} was unusable ({'; '.join(dropped[-3:])})")
    pending = doc.get("pending") or []
    if not isinstance(pending, list):
        raise PayloadError("malformed", f"pending slots of {name!r} are not a list")
    for key in [k for k in pending if not isinstance(k, str) or tool.param(k) is None or k in kept]:
        dropped.append(f"{name}.{key}: pending but not a parameter, or given already")
    score = doc.get("score", 0.0)
    return Guess(name, kept, float(score) if isinstance(score, int | float) else 0.0,
                 tuple(k for k in pending if isinstance(k, str) and tool.param(k) is not None and k not in kept))


def parse_payload(raw: bytes, request_id: str, tools: Sequence[Tool]) -> Payload:
    """The payload for `request_id`, checked against `tools`, or PayloadError.

    Slots whose value has the wrong type, is far too long or names no parameter are dropped (listed in
    `dropped`); a payload for another request, one that is not JSON, one naming an unknown function, or one
    none of whose slots is usable is rejected whole."""
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise PayloadError("too-large", f"payload of {len(raw)} bytes (limit {MAX_PAYLOAD_BYTES})")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError("invalid-json", f"payload is not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise PayloadError("malformed", "payload is not a JSON object")
    if doc.get("id") != request_id:
        raise PayloadError("wrong-request", f"payload is for request {doc.get('id')!r}, not {request_id!r}")
    by_name = {t.name: t for t in tools}
    dropped: list[str] = []
    no_call = "function" in doc and doc["function"] is None
    best = None if no_call else _guess(doc, by_name, dropped)
    alternatives = []
    for alt in [] if no_call else (doc.get("alternatives") or [])[:MAX_ALTERNATIVES]:
        try:
            alternatives.append(_guess(alt, by_name, dropped))
        except PayloadError as exc:
            dropped.append(f"alternative: {exc}")
    following = [] if no_call else _following(doc.get("next"), by_name, dropped)
    num = lambda k: float(doc[k]) if isinstance(doc.get(k), int | float) else 0.0  # noqa: E731
    call_p = num("call_p") if "call_p" in doc else None
    if call_p is not None and not 0.0 <= call_p <= 1.0:
        dropped.append(f"call_p {call_p} is not a probability")
        call_p = None
    return Payload(request_id, best, tuple(alternatives), compute_s=num("compute_s"), finished_at=num("t"),
                   size_bytes=len(raw), dropped=tuple(dropped), call_probability=call_p,
                   following=tuple(following))


def _following(docs: Any, tools: Mapping[str, Tool], dropped: list[str]) -> list[Guess]:
    """The calls after the first, cut at the first unusable one: past it, the list's order no longer says
    which call the target writes when."""
    if docs is None:
        return []
    if not isinstance(docs, list):
        dropped.append("next: not a list of calls")
        return []
    out: list[Guess] = []
    for i, doc in enumerate(docs):
        if len(out) + 1 >= MAX_CALLS:
            dropped.append(f"next: more than {MAX_CALLS} calls in one turn, the rest cut")
            break
        try:
            out.append(_guess(doc, tools, dropped))
        except PayloadError as exc:
            dropped.append(f"call {i + 2}: {exc}; the calls from it on cut")
            break
    return out
