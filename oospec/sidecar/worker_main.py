"""The sidecar's own process: `python -m oospec.sidecar.worker_main --fd N ...`, started by SidecarClient.

It loads the predictor once, then answers jobs one at a time over the socket it was given; a job that a
newer one has superseded while it waited is skipped. Nothing here may take the engine down: errors become
messages, and a dead worker is the client's to notice.
"""

from __future__ import annotations

import argparse
import importlib
import json
from multiprocessing.connection import Connection

from oospec.sidecar.protocol import CLEAR_CACHE, Job


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
    conn.send(("ready", None))
    while True:
        try:
            queued = [conn.recv()]
            while conn.poll():  # a newer job supersedes any older one still queued
                queued.append(conn.recv())
        except (EOFError, OSError):
            return
        if None in queued:
            return
        if CLEAR_CACHE in queued:  # jobs queued before the clear belong to the run it ended
            queued = queued[len(queued) - queued[::-1].index(CLEAR_CACHE):]
            getattr(predictor, "clear_cache", lambda: None)()
        if not queued:
            continue
        job = Job.from_dict(queued[-1])
        try:
            raw = predictor.predict(job)
            conn.send(("payload", (job.request_id, raw if isinstance(raw, bytes) else str(raw).encode())))
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
