"""One oospec drafter per vLLM request, kept in step with the request's token buffer.

vLLM schedules, preempts, resumes, finishes and (for aborted-and-resubmitted requests) reuses request ids, and
skips the proposer on some steps. The drafter therefore never counts steps: each call it reads the row's
buffer (prompt, then every output token so far) and observes whatever it has not seen yet. A state is started
again from the buffer whenever the row no longer continues what it saw (another runner object, another prompt
under the same id, or fewer tokens than it has observed); restarting costs speed only, never output tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from oospec.engine.drafting import Drafter

log = logging.getLogger("oospec.vllm")


@dataclass
class Row:
    """One row of vLLM's persistent batch at a propose call."""

    req_id: str
    tokens: np.ndarray  # (n,) int the row's buffer: prompt, then every output token so far (last: pending)
    prompt_len: int
    room: int  # draft tokens that still fit before the model's context ends
    extra_args: dict | None = None  # SamplingParams.extra_args (the request context, see context.py)
    stop_ids: frozenset[int] = frozenset()  # the request's own stop tokens, beside the model's end of turn
    # The runner's object for this request: a new one means a new request, even under an old id and prompt
    # (vLLM keeps the object of a preempted request and makes one per request it is given).
    owner: Any = None


@dataclass
class RequestState:
    drafter: Drafter
    prompt: np.ndarray  # (p,) the prompt it started on: a reused id with another prompt is another request
    seen: int  # tokens of the buffer observed (the prompt counts as seen)
    owner: Any = None  # Row.owner of the request it started on
    failed: bool = False  # drafting raised: no more drafts for this request


class RequestStates:
    """req_id -> RequestState. `start(row)` builds a started drafter for a new request."""

    def __init__(self, start: Callable[[Row], Drafter], on_end: Callable[[str, Drafter], None] | None = None):
        self._start = start
        self._on_end = on_end  # called with each ended request's id and finished drafter
        self.states: dict[str, RequestState] = {}

    def synced(self, row: Row) -> RequestState:
        """The row's state after observing every new token of its buffer."""
        state = self.states.get(row.req_id)
        if state is not None and not _continues(state, row):
            self.end(row.req_id)
            state = None
        if state is None:
            tokens = np.asarray(row.tokens, dtype=np.int64)
            state = RequestState(self._start(row), tokens[: row.prompt_len].copy(), row.prompt_len, row.owner)
            self.states[row.req_id] = state
        if row.tokens.size > state.seen and not state.failed:
            state.drafter.observe(np.asarray(row.tokens[state.seen:], dtype=np.int64))
            state.seen = int(row.tokens.size)
        return state

    def end(self, req_id: str) -> None:
        """The request is gone (finished, aborted, or its id now names another request)."""
        state = self.states.pop(req_id, None)
        if state is None:
            return
        try:
            state.drafter.finish()  # retrieval learns the finished output here
            if self._on_end is not None:
                self._on_end(req_id, state.drafter)
        except Exception as exc:  # a drafter's end-of-request bookkeeping must never fail the engine
            log_once(f"finish:{type(exc).__name__}", "oospec drafter finish failed: %r", exc)

    def keep_only(self, live: Iterable[str]) -> None:
        """End every request not in `live` (the runner's unfinished requests, preempted ones included)."""
        live = set(live)
        for req_id in [r for r in self.states if r not in live]:
            self.end(req_id)

    def end_all(self) -> None:
        for req_id in list(self.states):
            self.end(req_id)


def _continues(state: RequestState, row: Row) -> bool:
    p = state.prompt.size
    return (state.owner is row.owner and row.prompt_len == p and row.tokens.size >= state.seen
            and np.array_equal(np.asarray(row.tokens[:p]), state.prompt))


_logged: set[str] = set()


def log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning(msg, *args)
