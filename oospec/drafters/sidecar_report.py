"""What became of a request's sidecar job: the SidecarDrafter's report (oospec.drafters.sidecar), kept in
benchmark records and server stats."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass


@dataclass
class FollowUpReport:
    """The second job of a request: the slots of the function the target chose when no guess had it."""

    function: str
    submitted: bool
    tokens_written_at_submit: int
    arrived: bool | None = None  # True once its payload came back while the target was writing
    tokens_written_at_arrival: int | None = None
    arguments: dict | None = None
    compute_s: float | None = None


@dataclass
class SidecarReport:
    """What became of one request's sidecar job. Fields left None were never recorded (e.g. `arrived` is None
    when no payload came back at all, False when it came only after the target had finished)."""

    submitted: bool = False
    fault: str | None = None  # why no payload came (a SidecarClient fault kind)
    arrived: bool | None = None  # of the first payload, early (slots pending) or whole
    tokens_written_at_arrival: int | None = None
    # An early payload's slots arrive one by one (oospec.sidecar.inline): per slot, the tokens written when its
    # value came (None: after the reply); and when the payload became whole.
    slot_arrivals: dict | None = None
    tokens_written_at_complete: int | None = None
    latency_s: float | None = None  # from submit to the sidecar's finish
    compute_s: float | None = None  # the sidecar's own time
    payload_bytes: int | None = None
    function: str | None = None  # the best guess; None with no_call True: the sidecar expects no call
    arguments: dict | None = None
    no_call: bool | None = None
    call_probability: float | None = None
    alternatives: list[dict] | None = None  # [{"function", "arguments", "log_odds"}] of the other guesses
    following: list[dict] | None = None  # [{"function", "arguments"}] of the calls expected after the best
    dropped: list[str] | None = None  # slots the payload check removed
    followup: FollowUpReport | None = None
    schedule: dict | None = None  # the cost model's decision for this request (sidecar_schedule.Decision)

    def as_dict(self) -> dict:
        """The recorded fields as plain JSON-ready data (benchmark records, server stats)."""
        return _recorded(self)


def _recorded(report) -> dict:
    out = {}
    for f in fields(report):
        value = getattr(report, f.name)
        if value is not None:
            out[f.name] = _recorded(value) if is_dataclass(value) else value
    return out
