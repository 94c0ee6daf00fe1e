"""oospec's drafting for a batch of vLLM rows, free of vLLM itself (the glue is proposer.py).

Per request: schema drafting from its own tools and dialect, retrieval across requests (one memory shared
by every request of the engine), prompt lookup, and optionally the sidecar's hints; per step, the merged
candidates' best chain, at most K tokens and never past the model's context. A row whose drafting raises
gets an empty draft from then on, and the error is logged once per kind: drafting never fails the engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oospec.drafters.retrieval import CallMemory
from oospec.drafters.sidecar import OoOSpecDrafter
from oospec.drafters.toolspec import ToolSpecDrafter
from oospec.engine.budget import CostModel, default_cost_model
from oospec.engine.drafting import Drafter, Request
from oospec.integrations.vllm.chain import best_chain
from oospec.integrations.vllm.context import context_from_extra_args, context_from_prompt, template_default_system
from oospec.integrations.vllm.request_state import RequestState, RequestStates, Row, log_once
from oospec.tools.callscan import Habits


@dataclass(frozen=True)
class DraftingSettings:
    """How the proposer drafts; read from the environment of vLLM's worker (vLLM passes the proposer only
    its VllmConfig, which has no field for them)."""

    memory_path: str | None = None  # OOSPEC_VLLM_MEMORY: a JSONL store that keeps retrieval's past calls
    # OOSPEC_VLLM_COST_CURVE: `oospec bench cost-curve --out` of this machine; default: oospec's measured CPU
    # curve for the worker's torch thread count (vLLM's CPU worker keeps a core for itself: often one thread)
    cost_curve: str | None = None
    sidecar: bool = False  # OOSPEC_VLLM_SIDECAR=1: start the sidecar process and draft with its hints
    sidecar_cores: tuple[int, ...] | None = None  # OOSPEC_VLLM_SIDECAR_CORES=2,3: where the sidecar runs
    # OOSPEC_VLLM_CONTEXT_LOG: a JSONL file that gets, per request, where its context came from and what it
    # was (a check that the client's tools reach the proposer), and at its end what became of its sidecar job
    # (when, what it predicted); off unless set
    context_log: str | None = None

    @classmethod
    def from_env(cls, env=os.environ) -> DraftingSettings:
        cores = env.get("OOSPEC_VLLM_SIDECAR_CORES")
        return cls(memory_path=env.get("OOSPEC_VLLM_MEMORY") or None,
                   cost_curve=env.get("OOSPEC_VLLM_COST_CURVE") or None,
                   sidecar=env.get("OOSPEC_VLLM_SIDECAR", "0") not in ("", "0", "false", "no"),
                   sidecar_cores=tuple(int(c) for c in cores.split(",")) if cores else None,
                   context_log=env.get("OOSPEC_VLLM_CONTEXT_LOG") or None)

    def cost_model(self) -> CostModel:
        return CostModel.from_json(self.cost_curve) if self.cost_curve else default_cost_model()


class BatchDrafter:
    """Drafts for the rows of one engine: one started oospec drafter per request (see request_state.py).

    tokenizer: the target's (Hugging Face) tokenizer. eos_ids: the model's end-of-turn tokens. k: the most
    draft tokens per row (vLLM's num_speculative_tokens). sidecar: a SidecarClient or None."""

    def __init__(self, tokenizer: Any, eos_ids: frozenset[int], k: int, settings: DraftingSettings = DraftingSettings(),
                 sidecar: Any = None):
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.k = k
        self.settings = settings
        self.cost = settings.cost_model()
        self.sidecar = sidecar
        self.memory = CallMemory(settings.memory_path)
        # What every request's schema drafter learns about the target (habits) and the tokenizer's byte table
        # (costly to build) are shared, as oospec's own engine shares them by keeping one drafter.
        self.habits = Habits()
        self.encoders: dict = {}
        self.default_system = template_default_system(tokenizer)  # what a prompt's turns may hold beside the client's
        self.states = RequestStates(self._start, on_end=self._log_end if settings.context_log else None)

    def propose(self, rows: Sequence[Row | None]) -> list[list[int]]:
        """One draft per row, each at most `k` Python ints; a None row (not decoding this step) gets []."""
        return [self._propose_row(row) if row is not None else [] for row in rows]

    def start(self, row: Row) -> None:
        """Start the row's drafter now (before its prefill): the sidecar's job goes out while the target reads."""
        try:
            self.states.synced(row)
        except Exception as exc:
            self._fail(row, exc)

    def _propose_row(self, row: Row) -> list[int]:
        try:
            state = self.states.synced(row)
            if state.failed:
                return []
            max_len = min(self.k, row.room)
            if max_len <= 0:
                return []
            context = np.asarray(row.tokens, dtype=np.int64)
            return best_chain(state.drafter.candidates(context), max_len, self.cost)
        except Exception as exc:
            self._fail(row, exc)
            return []

    def _fail(self, row: Row, exc: Exception) -> None:
        """The row is decoded without drafts from now on; the error is logged once per kind."""
        log_once(f"propose:{type(exc).__name__}", "oospec drafting failed for request %s; it is decoded "
                 "without drafts from now on (logged once per kind of error): %r", row.req_id, exc)
        state = self.states.states.get(row.req_id)
        if state is None:
            prompt = np.asarray(row.tokens[: row.prompt_len], dtype=np.int64).copy()
            state = RequestState(Drafter(), prompt, int(row.tokens.size), row.owner)
            self.states.states[row.req_id] = state
        state.failed = True

    def _start(self, row: Row) -> Drafter:
        if self.sidecar is not None:
            # The sidecar has cores vLLM's worker does not use (sidecar.py): its jobs take nothing from the target.
            drafter = OoOSpecDrafter(self.sidecar, memory=self.memory, cost=self.cost, schedule="always")
        else:
            drafter = ToolSpecDrafter(memory=self.memory, cost=self.cost)
        schema = drafter.parts[0]
        schema.habits, schema._encoders = self.habits, self.encoders
        drafter.start(self._request(row))
        return drafter

    def _log_end(self, req_id: str, drafter: Drafter) -> None:
        """The context log's second line per request: what became of its sidecar job (when it had one)."""
        report = getattr(drafter, "report", None)
        if report is not None:
            with open(self.settings.context_log, "a") as f:
                f.write(json.dumps({"req_id": req_id, "sidecar": report.as_dict()}, ensure_ascii=False,
                                   default=str) + "\n")

    def _request(self, row: Row) -> Request:
        prompt = np.asarray(row.tokens[: row.prompt_len], dtype=np.int64).copy()
        context, source = context_from_extra_args(row.extra_args), "extra_args"
        if context is None or context.tools is None:
            context, source = context_from_prompt(self.tokenizer.decode(prompt.tolist(), skip_special_tokens=False),
                                                  self.default_system), "prompt"
        if self.settings.context_log:
            with open(self.settings.context_log, "a") as f:
                f.write(json.dumps({"req_id": row.req_id, "source": source,
                                    "tools": [t.name for t in context.tools or ()], "messages": context.messages,
                                    "tool_choice": context.tool_choice}, ensure_ascii=False, default=str) + "\n")
        return Request(prompt_ids=prompt, eos_ids=self.eos_ids | row.stop_ids, tokenizer=self.tokenizer,
                       messages=context.messages, tools=context.tools, dialect=context.dialect,
                       tools_in_prompt=context.tools_in_prompt)

    def close(self) -> None:
        self.states.end_all()
