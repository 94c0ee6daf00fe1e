"""The target's CPU threads during one request: its own share, plus the threads a drafter's helper lends.

A sidecar on the same CPU owns some threads (its own process), but needs them only until its payload is in
(seconds); after that it waits idle for the next job. `ThreadShare` gives the target those threads for as
long as the helper is idle, and takes them back as soon as it works again (a follow-up job): the request
never uses more CPU threads than the target's share and the helper's together.
"""

from __future__ import annotations

import torch

from oospec.engine.drafting import Drafter


def split_cores(available: int, threads: int | None, sidecar_threads: int | None,
                sidecar_device: str | None) -> tuple[int, int]:
    """(the target's torch threads, the sidecar's CPU threads): the one rule of every command, oospec.load and
    the benchmark. A sidecar on the CPU (`sidecar_device` "cpu") owns `sidecar_threads` (at least 1) and the
    target gets `threads` when given, else the `available` cores less the sidecar's, so the two processes never
    fight over a core; a sidecar on an accelerator, or none (None), takes no CPU thread."""
    sidecar = max(1, sidecar_threads or 1) if sidecar_device == "cpu" else 0
    return threads or max(1, available - sidecar), sidecar


class ThreadShare:
    """Torch threads of the target during one request: `own` (the count when the request starts) plus what
    `drafter.idle_threads()` says may be borrowed now. `update` between forwards; `restore` at the end."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.own = torch.get_num_threads()
        self.current = self.own
        self.borrowed_max = 0  # the most threads borrowed at once in this request (reported in the stats)

    def update(self) -> None:
        lent = self.drafter.idle_threads()
        if self.own + lent != self.current:  # set_num_threads only on a change: it resizes the OpenMP pool
            self.current = self.own + lent
            torch.set_num_threads(self.current)
            self.borrowed_max = max(self.borrowed_max, lent)

    def restore(self) -> None:
        if self.current != self.own:
            torch.set_num_threads(self.own)
            self.current = self.own


class torch_threads:
    """Run a block with this many torch threads (None: unchanged); the count before is restored after."""

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)
