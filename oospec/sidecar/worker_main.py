"""The sidecar's own process: `python -m oospec.sidecar.worker_main --fd N ...`, started by SidecarClient.

It loads the predictor once, then answers jobs one at a time, oldest first, over the socket it was given
(requests run side by side in vLLM: each gets its own answer); a job whose request ended before the worker
got to it is dropped (CANCEL). Nothing here may take the engine down: errors become
messages, and a dead worker is the client's to notice.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections import deque
from multiprocessing.connection import Connection

from oospec.sidecar.memory import WorkingSetTooLarge
from oospec.sidecar.protocol import CANCEL, CLEAR_CACHE, Job


def load_factory(spec: str):
    """'package.module:callable' -> the callable (importable in the child process)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr or "make_predictor")


def _worker_main(conn: Connection, factory: str, options: dict, threads: int | None) -> None:
    """The child process: load once, then answer jobs until the pipe closes."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    try:
        predictor = load_factory(factory)(**options)
    except Exception as exc:  # reported to the client, which falls back to drafting without hints
        conn.send(("load-failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", {"precision": getattr(predictor, "precision", None)}))  # what "auto" became here
    queue: deque[dict] = deque()  # jobs in the order they came: each request's own job, none superseded
    while True:
        try:
            while not queue or conn.poll():  # read all that came; block only with nothing to compute
                message = conn.recv()
                if message is None:
                    return
                if message == CLEAR_CACHE:  # the jobs still queued belong to the run it ended
                    queue.clear()
                    getattr(predictor, "clear_cache", lambda: None)()
                elif isinstance(message, tuple) and message[0] == CANCEL:
                    kept = deque(job for job in queue if job["request_id"] != message[1])
                    if len(kept) < len(queue):  # not started yet: dropped, and the client told
                        conn.send(("dropped", (message[1], None)))
                    queue = kept
                else:
                    queue.append(message)
        except (EOFError, OSError):
            return
        job = Job.from_dict(queue.popleft())
        try:
            raw = predictor.predict(job)
            conn.send(("payload", (job.request_id, raw if isinstance(raw, bytes) else str(raw).encode())))
        except WorkingSetTooLarge as exc:  # refused, not failed: the worker is as healthy as before
            conn.send(("refused", (job.request_id, str(exc))))
        except Exception as exc:
            conn.send(("error", (job.request_id, f"{type(exc).__name__}: {exc}")))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="oospec sidecar worker (started by SidecarClient)")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--factory", required=True)
    ap.add_argument("--options", default="{}")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    _worker_main(Connection(args.fd), args.factory, json.loads(args.options), args.threads or None)


if __name__ == "__main__":
    main()
