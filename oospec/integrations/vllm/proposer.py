"""The vLLM glue: `speculative_config={"method": "custom_class",
"model": "oospec.integrations.vllm.proposer.OospecProposer", "num_speculative_tokens": K}`.

vLLM 0.32 builds the proposer with the VllmConfig alone, calls `load_model(model)` from its model runner once,
then each step `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` with one row
per request of the runner's persistent batch, and expects one list of at most K ints per row. Request ids, the
prompt lengths and the sampling parameters (the request context in `extra_args`) live on the runner, which is
therefore taken from the caller of `load_model`. Everything else is oospec's (batch.py); this module only
reads vLLM's structures, so it is the one place that changes with vLLM's internals.

A request's drafter starts when the runner first takes the request in (its `_update_states`, before the
prefill forward), not at its first propose call (after the prefill): the sidecar's job is then submitted while
the target reads the prompt, which is what makes its hints arrive in time.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from oospec.integrations.vllm.batch import BatchDrafter, DraftingSettings
from oospec.integrations.vllm.request_state import Row, log_once


class OospecProposer:
    def __init__(self, vllm_config: Any):
        self.vllm_config = vllm_config
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.settings = DraftingSettings.from_env()
        self.runner: Any = None
        self.batch: BatchDrafter | None = None

    def load_model(self, model: Any = None, runner: Any = None) -> None:
        """Called by the model runner (CPU and GPU runners both do); binds that runner."""
        self.runner = runner if runner is not None else _calling_runner()
        if self.runner is None:
            log_once("no-runner", "oospec proposer: no model runner found; proposing nothing")
        from transformers import AutoTokenizer

        cfg = self.vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer, trust_remote_code=cfg.trust_remote_code)
        sidecar = None
        if self.settings.sidecar:
            from oospec.integrations.vllm.sidecar import start_sidecar

            sidecar = start_sidecar(self.settings)
        self.batch = BatchDrafter(tokenizer, _eos_ids(tokenizer, cfg), self.k, self.settings, sidecar)
        if self.runner is not None:
            self._watch_new_requests(self.runner)

    def _watch_new_requests(self, runner: Any) -> None:
        """Wrap the runner's `_update_states(scheduler_output)` so that each newly scheduled request's drafter
        starts before its prefill runs. Without that method (another vLLM) drafters start at the first propose."""
        update = getattr(runner, "_update_states", None)
        if update is None:
            log_once("no-update-states", "oospec proposer: the runner has no _update_states; drafters (and the "
                     "sidecar's jobs) start after each prefill")
            return

        def update_states(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            out = update(scheduler_output, *args, **kwargs)
            try:
                self._start_new(scheduler_output)
            except Exception as exc:  # never fail the engine: the drafter then starts at its first propose
                log_once(f"early-start:{type(exc).__name__}", "oospec proposer: early start failed: %r", exc)
            return out

        runner._update_states = update_states

    def _start_new(self, scheduler_output: Any) -> None:
        # The requests this update finished are gone from the runner already: end them first, so that
        # retrieval has learnt their calls before the new requests' drafters start.
        self.batch.states.keep_only(self.runner.requests.keys())
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            prompt, state = new.prompt_token_ids, self.runner.requests.get(new.req_id)
            params = new.sampling_params
            if prompt is None or state is None or params is None:  # prompt embeddings, pooling: nothing to draft
                continue
            tokens = np.asarray(prompt, dtype=np.int64)
            self.batch.start(self._row(new.req_id, tokens, int(tokens.size), params, state))

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        n_rows = len(sampled_token_ids)
        if self.batch is None or self.runner is None:
            return [[] for _ in range(n_rows)]
        runner = self.runner
        batch = runner.input_batch
        req_ids = batch.req_ids
        self.batch.states.keep_only(runner.requests.keys())  # finished requests leave runner.requests
        rows: list[Row | None] = []
        for i, sampled in enumerate(sampled_token_ids):
            req_id = req_ids[i] if i < len(req_ids) else None
            state = runner.requests.get(req_id) if req_id is not None else None
            if not sampled or state is None:  # not decoding this step (chunked prefill, discarded sample)
                rows.append(None)
                continue
            n = int(num_tokens_no_spec[i])
            rows.append(self._row(req_id, token_ids_cpu[i, :n], int(batch.num_prompt_tokens[i]),
                                  state.sampling_params, state))
        return self.batch.propose(rows)

    def _row(self, req_id: str, tokens: np.ndarray, prompt_len: int, params: Any, owner: Any) -> Row:
        """A request as oospec sees it: its buffer, its context (`extra_args`) and stop tokens, its runner object."""
        return Row(req_id, tokens, prompt_len, self.max_model_len - int(tokens.size),
                   getattr(params, "extra_args", None), frozenset(getattr(params, "all_stop_token_ids", ()) or ()),
                   owner)


def _calling_runner() -> Any:
    """The model runner whose `load_model` is calling ours: the first caller frame whose `self` has the
    persistent batch and the request table."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "input_batch") and hasattr(owner, "requests"):
            return owner
        frame = frame.f_back
    return None


def _eos_ids(tokenizer: Any, model_config: Any) -> frozenset[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        gen = model_config.try_get_generation_config() or {}
    except Exception:  # no generation_config.json: the tokenizer's end of sequence alone
        gen = {}
    eos = gen.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return frozenset(int(i) for i in ids)
