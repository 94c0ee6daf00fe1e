"""The sidecar in its own OS process, and the engine's non-blocking client for it.

The worker loads the predictor once, then answers jobs one at a time. It has its own thread budget (set
before torch starts in the child) or its own device. The client never blocks the decode loop: `submit`
writes a job to a pipe, `poll` reads an answer only if one is already there. Jobs are answered oldest first,
each with its own ticket (vLLM runs requests side by side); `cancel` drops the job of a request that ended
before the worker got to it.

Faults are contained here: a worker that dies is reaped at once (a thread waits on it, so it never lingers as
a zombie), noticed at the next request's start (`check`) or poll and restarted then; one that hangs past
`hang_timeout_s` is killed and restarted. More than `max_restarts` failures within `restart_window_s` and the
client rests: decoding goes on without hints until `quiet_period_s` have passed, then the worker is started
again (a few crashes do not cost the sidecar for the life of the server). A worker that cannot
load its model is not retried. A job whose working set would exceed the worker's memory budget
(oospec.sidecar.memory) is refused, fault "too-large": that request drafts without hints. Answers are checked
by `parse_payload` before anything is built from them. Each kind of fault is logged once per client; `state`
and `health` say honestly where the worker stands.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from oospec.models.registry import DEFAULT_SIDECAR
from oospec.sidecar.memory import WorkingSetTooLarge
from oospec.sidecar.protocol import CANCEL, CLEAR_CACHE, Job, Payload, PayloadError, parse_payload
from oospec.sidecar.provenance import ADAPTERS_DIR
from oospec.tools.schema import Tool

log = logging.getLogger("oospec.sidecar")


# The LoRA adapter trained by `oospec sidecar train` and shipped with the package (in ADAPTERS_DIR), per base model.
SHIPPED_ADAPTERS = {DEFAULT_SIDECAR: "qwen2.5-coder-0.5b-toolcalls-v3"}
# By target: the LoRA of the target's own slot rows, on the rows only (its sidecar.json says so); not a
# sidecar's default, as it is trained over the target's reading of the prompt, not its own.
SLOT_ROW_ADAPTERS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-slotrows"}


def resolve_adapter(model: str, adapter: str | None) -> str | None:
    """'auto': the shipped adapter for this base model if there is one; 'none'/None: no adapter; the name of a
    shipped adapter (a folder of oospec/sidecar/adapters) that folder; else a folder."""
    if adapter in (None, "", "none"):
        return None
    if adapter == "auto":
        name = SHIPPED_ADAPTERS.get(model)
        path = ADAPTERS_DIR / name if name else None
        return str(path) if path is not None and (path / "adapter_config.json").is_file() else None
    shipped = ADAPTERS_DIR / adapter
    if not Path(adapter).exists() and "/" not in adapter and (shipped / "adapter_config.json").is_file():
        return str(shipped)
    return adapter


def make_predictor(model: str = DEFAULT_SIDECAR, dtype: str = "auto", device: str = "cpu", adapter: str | None = "auto",
                   **kwargs):
    from oospec.sidecar.predictor import SidecarPredictor

    return SidecarPredictor.from_pretrained(model, dtype=dtype, device=device, adapter=resolve_adapter(model, adapter),
                                            **kwargs)


@dataclass
class Ticket:
    """One submitted job, and what became of it."""

    request_id: str
    tools: Sequence[Tool]
    submitted_at: float  # time.time()
    payload: Payload | None = None
    fault: str | None = None
    received_at: float | None = None
    cancelled: bool = False  # its request ended first; an answer already on its way is still recorded


@dataclass
class SidecarStats:
    submitted: int = 0
    answered: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    restarts: int = 0


class SidecarClient:
    """Runs a sidecar predictor in a child process; `submit` and `poll` never wait for it.

    model: a model name or folder (default: the registry's DEFAULT_SIDECAR). threads: torch threads of the child.
    device: its device ("cpu", "cuda:1", ...). factory: 'module:callable' building the predictor in the
    child (default: SidecarPredictor.from_pretrained), for custom or test predictors.
    """

    def __init__(self, model: str = DEFAULT_SIDECAR, *, threads: int | None = 1, device: str = "cpu",
                 dtype: str = "auto", adapter: str | None = "auto", factory: str = "oospec.sidecar.process:make_predictor",
                 factory_options: dict | None = None, hang_timeout_s: float = 120.0, max_restarts: int = 3,
                 restart_window_s: float = 600.0, quiet_period_s: float = 60.0, wait_ready: bool = True,
                 ready_timeout_s: float = 600.0):
        self.model = model
        self.threads = threads
        self.device = device
        self.factory = factory
        options = {"model": model, "dtype": dtype, "device": device, "adapter": adapter}
        self.options = factory_options if factory_options is not None else options
        self.hang_timeout_s = hang_timeout_s
        self.max_restarts = max_restarts  # restarts allowed within restart_window_s before resting
        self.restart_window_s = restart_window_s
        self.quiet_period_s = quiet_period_s
        self._failures: list[float] = []  # monotonic times of the failures within the window
        self._resting_until: float | None = None  # too many failures: no worker (and no hints) until then
        self.stats = SidecarStats()
        self._logged: set[str] = set()
        self._proc: subprocess.Popen | None = None
        self._conn = None
        self._ready = False
        self._busy_since: float | None = None  # since the worker last answered, while jobs are outstanding
        self._outstanding: dict[str, Ticket] = {}  # sent, neither answered nor dropped by the worker yet
        self._closed = False
        self.precision: str | None = None  # what the worker runs in ("auto" resolved there), once it is ready
        self._start()
        if wait_ready:
            self.wait_ready(ready_timeout_s)

    # -- process lifecycle ---------------------------------------------------------------------------------
    def _start(self) -> None:
        # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's main module and so
        # needs an `if __name__ == "__main__"` guard in every user script), joined by a socket pair.
        parent, child = socket.socketpair()
        env = dict(os.environ)
        if self.threads:
            # The child's OpenMP pool is sized at import: set it before the child starts.
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # an idle sidecar must not spin on the target's cores
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the same imports as this process
        cmd = [sys.executable, "-m", "oospec.sidecar.worker_main", "--fd", str(child.fileno()), "--factory", self.factory,
               "--options", json.dumps(self.options), "--threads", str(self.threads or 0)]
        self._proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL)
        # Reap the worker the moment it exits (a killed one would otherwise stay a zombie until the next request
        # polls it); Popen's own lock keeps this wait and the client's poll/kill from racing.
        threading.Thread(target=_reap, args=(self._proc,), name="oospec-sidecar-reaper", daemon=True).start()
        child.close()
        self._conn, self._ready, self._busy_since = Connection(parent.detach()), False, None

    def wait_ready(self, timeout_s: float = 600.0) -> bool:
        """Block until the worker has loaded its model (start-up only, never inside a request)."""
        deadline = time.monotonic() + timeout_s
        while not self._ready and not self._closed:
            if not self._alive():
                self._fault("crashed", "the sidecar process exited while loading")
                return False
            if self._conn.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                self._drain()
            if time.monotonic() > deadline:
                self._fault("load-timeout", f"the sidecar did not load within {timeout_s:.0f} s")
                return False
        return self._ready

    @property
    def ready(self) -> bool:
        return self._ready

    def speed_key(self) -> str:
        """What its job times depend on: this processor, torch, the sidecar's model, adapter, precision, device
        and threads (the key under which SidecarSchedule keeps them across processes)."""
        import torch

        from oospec.models.cpu_features import cpu_model

        # The precision the worker resolved, not "auto": the drafter rule may choose otherwise on another day.
        resolved = dict(self.options)
        if self.precision and "dtype" in resolved:
            resolved["dtype"] = self.precision
        options = json.dumps(resolved, sort_keys=True, default=str)
        return f"{cpu_model()} | torch {torch.__version__} | {self.factory} {options} | threads {self.threads}"

    @property
    def state(self) -> str:
        """Where the worker stands: "alive" (loaded, answering), "loading" (first start), "restarting" (loading
        after a restart), "dead" (exited: restarted when the next request with tools starts), "resting" (failed too often: started
        again after the quiet period), "disabled" (closed, or it cannot load its model). Only reads: safe to call
        from another thread (/health) while the decode loop uses the client."""
        if self._closed:
            return "disabled"
        if self._resting_until is not None:
            return "resting"
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return "dead"
        if not self._ready:
            return "restarting" if self.stats.restarts else "loading"
        return "alive"

    def health(self) -> dict:
        """`state` with the process id, restarts and fault counts, for /health."""
        state, resting_until = self.state, self._resting_until
        out = {"state": state, "pid": self.pid if state in ("alive", "loading", "restarting") else None,
               "restarts": self.stats.restarts, "faults": dict(self.stats.faults)}
        if state == "resting" and resting_until is not None:
            out["retry_in_s"] = round(max(0.0, resting_until - time.monotonic()), 1)
        return out

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _restart(self, why: str) -> bool:
        now = time.monotonic()
        self._failures = [t for t in self._failures if now - t < self.restart_window_s] + [now]
        self._abandon(why)
        self._kill()
        if len(self._failures) > self.max_restarts:
            self._fault("gave-up", f"the sidecar failed {len(self._failures)} times within "
                                   f"{self.restart_window_s:.0f} s ({why}); running without it for "
                                   f"{self.quiet_period_s:.0f} s, then starting it again")
            self._resting_until = now + self.quiet_period_s
            return False
        self.stats.restarts += 1
        self._start()
        return True

    def _wake(self) -> bool:
        """Whether the worker may be used now: a resting client starts it again once the quiet period is over."""
        if self._resting_until is None:
            return True
        if time.monotonic() < self._resting_until:
            return False
        self._resting_until, self._failures = None, []
        self.stats.restarts += 1
        log.warning("starting the sidecar again after %.0f s without it", self.quiet_period_s)
        self._start()
        return True

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        if self._closed and self._proc is None:
            return
        self._closed = True
        if self._conn is not None and self._alive():
            try:
                self._conn.send(None)
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def idle_threads(self) -> int:
        """The worker's CPU threads while it has nothing to compute (no job unanswered, or no worker at all):
        the target may use them until the next `submit`. 0 while it works or loads, and for a sidecar on
        another device (it never held the target's cores). Reads answers already sent; never waits."""
        if self.device != "cpu" or not self.threads:
            return 0
        if not self._closed:
            self._drain()
            if not self._ready or self._busy_since is not None:
                return 0
        return self.threads

    def clear_cache(self) -> None:
        """Have the worker drop its predictor's caches before the next job (never waits; jobs sent before are
        dropped unstarted: their request is over)."""
        if self._conn is not None and not self._closed:
            try:
                self._conn.send(CLEAR_CACHE)
                self._abandon("cleared")  # the worker drops them: a hang counts from the next job
            except (OSError, BrokenPipeError) as exc:
                self._fault("crashed", f"cannot reach the sidecar: {exc}")

    # -- requests ------------------------------------------------------------------------------------------
    def check(self) -> bool:
        """Whether a worker is there to take a job, starting the next one if the last died (never waits). The
        sidecar drafter calls it at every request's start: a worker killed while the cost model sent no jobs
        stayed dead for good, and /health said so on every later request."""
        if self._closed or not self._wake():
            return False
        self._drain()  # answers already sent count before judging the worker; a closed pipe restarts it
        if self._proc is not None and not self._alive():
            self._fault("crashed", f"the sidecar process exited (code {self._proc.returncode}); restarting it")
            return self._restart("crashed")
        return self._proc is not None

    def submit(self, job: Job | dict, tools: Sequence[Tool]) -> Ticket | None:
        """Send a job (never waits). Returns its ticket, or None when the sidecar is unavailable."""
        job = job if isinstance(job, Job) else Job(**job)
        if not self.check():
            return None
        if self._busy_since is not None and time.monotonic() - self._busy_since > self.hang_timeout_s:
            self._fault("hang", f"the sidecar has not answered for {self.hang_timeout_s:.0f} s; restarting it")
            if not self._restart("hang"):
                return None
        if not job.request_id or job.request_id in self._outstanding:
            job = replace(job, request_id=uuid.uuid4().hex)  # answers are matched to tickets by this id
        ticket = Ticket(job.request_id, tools, time.time())
        try:
            self._conn.send(job.to_dict())
        except (OSError, BrokenPipeError) as exc:
            self._fault("crashed", f"cannot reach the sidecar: {exc}")
            return None
        self.stats.submitted += 1
        if self._busy_since is None:  # no answer for hang_timeout_s while jobs wait: that is what a hang looks like
            self._busy_since = time.monotonic()
        self._outstanding[ticket.request_id] = ticket
        return ticket

    def cancel(self, ticket: Ticket | None) -> None:
        """The ticket's request has ended: the worker drops its job if it has not started it (never waits)."""
        if ticket is None or ticket.cancelled or self._outstanding.get(ticket.request_id) is not ticket \
                or self._conn is None:
            return
        ticket.cancelled = True
        try:
            self._conn.send((CANCEL, ticket.request_id))
        except (OSError, BrokenPipeError) as exc:
            self._fault("crashed", f"cannot reach the sidecar: {exc}")

    def poll(self, ticket: Ticket | None) -> Payload | None:
        """The ticket's payload if it has arrived (checked), else None. Never waits."""
        if ticket is None or self._conn is None:
            return None
        if ticket.payload is None and ticket.fault is None:
            self._drain()
        return ticket.payload

    def _drain(self) -> None:
        try:
            while self._conn is not None and not self._closed and self._conn.poll():
                kind, body = self._conn.recv()
                self._handle(kind, body)
        except (EOFError, OSError):
            if self._closed:  # a worker that could not load exits after saying so: not a crash, not restarted
                return
            # One fault per death, and the next worker started now (`_restart` closes this pipe): a closed pipe
            # left in place reads as closed again at every poll, so each poll would count another crash while
            # the worker stayed dead.
            self._fault("crashed", "the sidecar process died mid-request")
            self._restart("crashed")

    def _abandon(self, fault: str) -> None:
        """Every outstanding job is lost (the worker died, was restarted or cleared): its ticket ends with `fault`."""
        for ticket in self._outstanding.values():
            ticket.fault = fault
        self._outstanding.clear()
        self._busy_since = None

    def _handle(self, kind: str, body: Any) -> None:
        if kind == "ready":
            self._ready = True
            self.precision = (body or {}).get("precision") if isinstance(body, dict) else None
            return
        if kind == "load-failed":  # not retried: the same model will not load the next time either
            self._fault("load-failed", f"the sidecar could not load its model: {body}")
            self._closed = True
            return
        request_id, detail = body
        ticket = self._outstanding.pop(request_id, None)
        self._busy_since = time.monotonic() if self._outstanding else None
        if ticket is None:
            # An answer to a job abandoned by clear_cache or a restart: useless, harmless.
            self.stats.faults["late"] = self.stats.faults.get("late", 0) + 1
            return
        if kind == "dropped":
            ticket.fault = "cancelled"
            return
        ticket.received_at = time.time()
        if kind == "refused":  # a job over the worker's memory budget: that job goes without hints, nothing else
            ticket.fault = WorkingSetTooLarge.kind
            self._fault(WorkingSetTooLarge.kind, f"the sidecar refused request {request_id}: {detail}")
            return
        if kind == "error":
            ticket.fault = "predictor-error"
            self._fault("predictor-error", f"the sidecar failed on request {request_id}: {detail}")
            return
        try:
            ticket.payload = parse_payload(detail, ticket.request_id, ticket.tools)
            self.stats.answered += 1
        except PayloadError as exc:
            ticket.fault = exc.kind
            self._fault(exc.kind, f"sidecar payload rejected: {exc}")
            return
        if ticket.payload.dropped:
            self._fault("bad-slots", f"sidecar slots dropped: {'; '.join(ticket.payload.dropped[:3])}")

    def _fault(self, kind: str, message: str) -> None:
        self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s (decoding continues without sidecar hints; logged once)", message)




def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait()
    except Exception:  # (interpreter shutdown): the child is reaped by init then
        pass


@dataclass(frozen=True)
class SidecarSettings:
    """How a command starts its sidecar: the meaning of every command's sidecar options, with their defaults."""

    model: str = DEFAULT_SIDECAR  # a known model name or a local Hugging Face folder
    adapter: str | None = "auto"  # 'auto': the adapter shipped for `model`; 'none'/None: the base model; or a folder
    threads: int | None = 1  # torch threads of the sidecar's own process
    device: str = "cpu"
    dtype: str = "auto"  # 'auto': the drafter rule (oospec.models.cpu_features.drafter_dtype), whatever the target's


def make_sidecar(settings: SidecarSettings = SidecarSettings()) -> SidecarClient:
    """The sidecar process of every command (generate, demo, serve, bench); the adapter is resolved here, so
    'auto' means the shipped adapter everywhere."""
    return SidecarClient(settings.model, threads=settings.threads, device=settings.device, dtype=settings.dtype,
                         adapter=resolve_adapter(settings.model, settings.adapter))
