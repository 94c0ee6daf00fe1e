"""`toolspec`: schema structure, retrieval of past calls and prompt lookup, merged into one token tree.

Each part proposes candidates with a rough acceptance model; the merged trie keeps the nodes most likely to
be accepted, as many as the cost curve says are worth verifying this step.
"""

from __future__ import annotations

import numpy as np

from oospec.engine.drafting import Candidate, Drafter, Request
from oospec.drafters.pld import PromptLookupDrafter
from oospec.drafters.retrieval import CallMemory, RetrievalDrafter
from oospec.drafters.schema import SchemaDrafter
from oospec.engine.budget import CostModel, default_cost_model


class MergedDrafter(Drafter):
    """Several drafters proposing into one tree under a cost-aware budget: their candidates, concatenated,
    ranked by acceptance weight (`cost` set)."""

    name = "merged"

    def __init__(self, parts: list[Drafter], cost: CostModel | None = None):
        self.parts = parts
        self._fixed_cost = cost
        self.cost = cost

    def start(self, request: Request) -> None:
        # Without a curve of its own, the request's (the target's device, dtype and threads: decode.generate).
        cost = self._fixed_cost if self._fixed_cost is not None else request.cost
        self.cost = cost if cost is not None else default_cost_model()
        for part in self.parts:
            part.start(request)

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        return [c for part in self.parts for c in part.candidates(context)]

    def observe(self, produced: np.ndarray) -> None:
        for part in self.parts:
            part.observe(produced)

    @property
    def _slot_part(self) -> Drafter | None:
        """The part whose slot rows the target runs: node ids are one forest's, so one part at most has them."""
        parts = [part for part in self.parts if part.slot_rows]
        if len(parts) > 1:
            raise ValueError(f"slot rows from {len(parts)} parts of {self.name}: one forest, one part")
        return parts[0] if parts else None

    @property
    def slot_rows(self) -> int:
        part = self._slot_part
        return part.slot_rows if part else 0

    @property
    def slot_store(self) -> int:
        part = self._slot_part
        return part.slot_store if part else 0

    def slot_feed(self, context: np.ndarray, rows: int, beside: int = 1):
        return self._slot_part.slot_feed(context, rows, beside)

    def slot_offer(self) -> tuple[int, float]:
        return self._slot_part.slot_offer()

    def slot_logits(self, feed, logits) -> None:
        self._slot_part.slot_logits(feed, logits)

    def finish(self) -> None:
        for part in self.parts:
            part.finish()


class ToolSpecDrafter(MergedDrafter):
    name = "toolspec"

    def __init__(self, memory: CallMemory | None = None, cost: CostModel | None = None):
        super().__init__([SchemaDrafter(), RetrievalDrafter(memory), PromptLookupDrafter()], cost)
