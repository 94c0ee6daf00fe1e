"""`oospec-rows`: `oospec` on one device. The sidecar's job is done by slot rows inside the target's own
verification forwards (oospec.sidecar.inline) instead of a second model in its own process; its payload becomes
hints through the same SidecarDrafter, beside toolspec's drafters, in one token tree."""

from __future__ import annotations

from oospec.drafters.pld import PromptLookupDrafter
from oospec.drafters.retrieval import CallMemory, RetrievalDrafter
from oospec.drafters.schema import SchemaDrafter
from oospec.drafters.sidecar import SidecarDrafter, SidecarReport
from oospec.drafters.toolspec import MergedDrafter
from oospec.engine.budget import CostModel
from oospec.sidecar.inline import SlotRowSidecar


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

    @property
    def report(self) -> SidecarReport:
        return self.sidecar_drafter.report
