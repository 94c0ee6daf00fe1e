"""`oospec-rows`: `oospec` on one device. The sidecar's job is done by slot rows inside the target's own
verification forwards (oospec.sidecar.inline) instead of a second model in its own process; its payload becomes
hints through the same SidecarDrafter, beside toolspec's drafters, in one token tree."""

from __future__ import annotations

import numpy as np

from oospec.drafters.pld import PromptLookupDrafter
from oospec.drafters.retrieval import CallMemory, RetrievalDrafter
from oospec.drafters.schema import SchemaDrafter
from oospec.drafters.sidecar import SidecarDrafter, SidecarReport
from oospec.drafters.toolspec import MergedDrafter
from oospec.engine.budget import CostModel
from oospec.engine.drafting import Request
from oospec.sidecar.inline import SlotRowSidecar
from oospec.tools.callscan import CallPosition, CallScanner


class SlotRowsDrafter(MergedDrafter):
    """toolspec's drafters plus the slot rows' hints. The target's slot rows read a slot LoRA where it has one
    (oospec.engine.slot_rows.add_slot_lora); without, the target's own weights guess."""

    name = "oospec-rows"

    def __init__(self, memory: CallMemory | None = None, cost: CostModel | None = None, **rows):
        schema = SchemaDrafter()
        self.source = SlotRowSidecar(**rows)
        # Every job runs: its rows ride on forwards the target runs anyway (the schedule weighs a process's cores).
        self.sidecar_drafter = SidecarDrafter(self.source, schema=schema, schedule="always")
        # The source first: it starts (forgets the last request) before the sidecar drafter submits this one's job.
        super().__init__([self.source, schema, self.sidecar_drafter, RetrievalDrafter(memory), PromptLookupDrafter()],
                         cost)

    def start(self, request: Request) -> None:
        super().start(request)
        self.source.cost = self.cost  # the rows ride on the target's forwards: its curve says what they cost

    def observe(self, produced: np.ndarray) -> None:
        """Tell the rows what the target has written: no row grows a value it has written already."""
        super().observe(produced)
        if not self.sidecar_drafter.schema.active:
            return
        scan = self.sidecar_drafter.schema.scanner
        finished = written_arguments(scan)
        for ticket in (self.sidecar_drafter.ticket, self.sidecar_drafter.followup):
            if ticket is not None:
                self.source.written(ticket, scan.name, finished, scan.calls_done > 0)

    @property
    def report(self) -> SidecarReport:
        return self.sidecar_drafter.report


def written_arguments(scan: CallScanner) -> set[str]:
    """The arguments of the call being written whose values the target has finished."""
    where = scan.position
    if not where.in_arguments:
        return set()
    keys = list(scan.stack[1].keys)
    if keys and where not in (CallPosition.ARG_VALUE_DONE, CallPosition.ARG_KEY_NEXT, CallPosition.ARG_KEY):
        keys.pop()  # its value is being written
    return set(keys)
