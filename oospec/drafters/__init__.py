"""Drafters, one module each, looked up by method name (the contract they implement: oospec.engine.drafting)."""

from __future__ import annotations

from collections.abc import Callable

from oospec.drafters.inline import SlotRowsDrafter
from oospec.drafters.pld import PromptLookupDrafter
from oospec.drafters.retrieval import RetrievalDrafter
from oospec.drafters.schema import SchemaDrafter
from oospec.drafters.sidecar import OoOSpecDrafter, SidecarDrafter
from oospec.drafters.toolspec import ToolSpecDrafter
from oospec.engine.drafting import Drafter
from oospec.errors import did_you_mean

DRAFTERS: dict[str, Callable[..., Drafter]] = {
    "ar": Drafter,  # no drafts: plain greedy decoding through the same loop, the baseline of every method
    "pld": PromptLookupDrafter,
    "schema": SchemaDrafter,
    "retrieval": RetrievalDrafter,
    "toolspec": ToolSpecDrafter,
    "sidecar": SidecarDrafter,  # sidecar=SidecarClient(...): hints only
    "oospec": OoOSpecDrafter,  # sidecar=SidecarClient(...): toolspec plus hints (toolspec alone without one)
    "oospec-rows": SlotRowsDrafter,  # toolspec plus hints from slot rows in the target's own forwards
}


def uses_sidecar(method: str) -> bool:
    """Whether `method`'s drafter drafts with a sidecar process (its class says so: Drafter.uses_sidecar)."""
    return bool(getattr(DRAFTERS.get(method), "uses_sidecar", False))


SIDECAR_DRAFTERS = frozenset(m for m in DRAFTERS if uses_sidecar(m))  # the methods whose drafter takes sidecar=


def make_drafter(method: str, **options) -> Drafter:
    try:
        factory = DRAFTERS[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}{did_you_mean(method, DRAFTERS)}; "
                         f"choose one of: {', '.join(DRAFTERS)}") from None
    return factory(**options)


__all__ = ["DRAFTERS", "SIDECAR_DRAFTERS", "make_drafter", "uses_sidecar"]
