"""One model, one request at a time: a bounded queue in front of a single worker thread.

The HTTP side submits jobs and waits on their futures; a full queue is answered at once (429), never
buffered. A job carries its deadline and a cancel flag, which the worker checks before it starts the job and
the generation checks after every step (a request that timed out, a client that went away, shutdown).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oospec.server.errors import APIError

if TYPE_CHECKING:
    from oospec.engine.drafting import Request
    from oospec.server.schemas import ChatRequest

log = logging.getLogger("oospec.server")
MAX_RETRY_AFTER_S = 60  # the longest Retry-After a 429 carries


class Cancelled(Exception):
    """The job was cancelled before or while it ran; nobody is waiting for its result."""


def timeout_error(timeout_s: float) -> APIError:
    return APIError(504, f"the request did not finish within the server's {timeout_s:g} s timeout; retry with a "
                    "smaller max_tokens or when the server is less busy", type="timeout_error", code="timeout")


@dataclass
class Work:
    """One request from admission to its reply, the worker queue's item: the client's request and the engine's,
    built once from it, and the request's place in the queue."""

    req: ChatRequest  # what the reply needs: stops, streaming, tool_choice, the tools' names
    request: Request  # what the engine decodes (the call grammar of tool_choice required/function: single use)
    forced_text: str  # the start of the reply the prompt forces ("" when tool_choice is none or auto)
    timeout_s: float  # from submission, queueing included
    emit: Callable[[list[tuple]], None] | None = None  # stream events, called from the worker thread
    id: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    cancel: threading.Event = field(default_factory=threading.Event)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    submitted_at: float = field(default_factory=time.monotonic)  # set again by Worker.submit
    started_at: float | None = None

    @property
    def deadline(self) -> float:
        return self.submitted_at + self.timeout_s

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def should_stop(self) -> bool:
        return self.cancel.is_set() or self.expired()


_STOP = object()


class Worker:
    def __init__(self, execute: Callable[[Work], Any], max_queue: int):
        self.execute = execute
        self.max_queue = max_queue
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, max_queue))
        self._accepting = True
        self.running: Work | None = None
        self.recent_s: collections.deque[float] = collections.deque([1.0], maxlen=20)  # jobs' times, for Retry-After
        self.served = 0
        self.rejected = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._loop, name="oospec-worker", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Work) -> None:
        if not self._accepting:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        try:
            if self.max_queue <= 0:
                raise queue.Full
            job.submitted_at = time.monotonic()
            self._queue.put_nowait(job)
        except queue.Full:
            self.rejected += 1
            retry = self.retry_after_s()
            raise APIError(429, f"the server is busy ({self.waiting} requests waiting, at most {self.max_queue}); "
                           f"retry after {retry} s", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(retry)}) from None

    def retry_after_s(self) -> int:
        """When the queue has room again if jobs take what they typically took lately: the running job's remaining
        time plus that of the jobs waiting (a retry then starts at the back). The typical time is the median of
        recent jobs, so one slow request does not stretch every answer, and the result is at most
        MAX_RETRY_AFTER_S: a client is never sent away for longer than it takes to look again."""
        per_job = statistics.median(self.recent_s)
        running = self.running
        left = per_job - (time.monotonic() - running.started_at) if running and running.started_at else 0.0
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(max(left, 0.0) + per_job * self.waiting)))

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            self._run(job)

    def _run(self, job: Work) -> None:
        # A future the waiting side cancelled (timeout, client gone) is not run.
        if job.cancel.is_set() or not job.future.set_running_or_notify_cancel():
            _settle(job.future, exc=Cancelled())
            return
        if job.expired():
            _settle(job.future, exc=timeout_error(job.timeout_s))
            return
        self.running = job
        job.started_at = time.monotonic()
        try:
            _settle(job.future, result=self.execute(job))
        except (APIError, Cancelled) as exc:
            _settle(job.future, exc=exc)
        except Exception as exc:  # a bug, not a bad request: log it, answer 500 in OpenAI's shape
            self.failed += 1
            log.exception("request failed")
            _settle(job.future, exc=APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                             type="server_error", code="internal_error"))
        finally:
            elapsed = time.monotonic() - job.started_at
            self.recent_s.append(elapsed)
            self.served += 1
            self.running = None

    def drain(self) -> None:
        """Refuse new jobs and answer the waiting ones 503."""
        self._accepting = False
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP:
                job.cancel.set()
                _settle(job.future, exc=APIError(503, "the server is shutting down", type="server_error",
                                                 code="shutting_down"))

    def cancel_running(self) -> None:
        """Stop the running job after its current step."""
        running = self.running
        if running is not None:
            running.cancel.set()

    def close(self, grace_s: float) -> None:
        """Drain, let the running job finish for up to `grace_s`, then cancel it and stop the thread."""
        self.drain()
        self._queue.put(_STOP)
        self._thread.join(grace_s)
        self.cancel_running()
        self._thread.join(30)


def _settle(future: concurrent.futures.Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Give the future its outcome unless it already has one (cancelled by the side that stopped waiting)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
