"""A stand-in for vLLM 0.32's model runner, as far as OospecProposer reads it, a tiny scheduler loop, and the
scripted tool-call request the tests run through it.

The runner keeps what vLLM's does: `requests` (req_id -> state with `sampling_params`, kept while a request is
preempted, dropped when it finishes), the persistent batch (`input_batch.req_ids`, `num_prompt_tokens`) and
the token buffer `token_ids_cpu` with `num_tokens_no_spec`. `step` plays one engine step: every scheduled
row takes the longest prefix of its draft that matches its scripted output, plus one token (the bonus).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from helpers import WEATHER

from oospec.tools.dialects import DIALECTS, ToolCall

MAX_LEN = 512


@dataclass
class Script:
    prompt: list[int]
    output: list[int]  # what the "target" writes, token by token
    extra_args: dict | None = None
    stop_ids: frozenset[int] = frozenset()


@dataclass
class FakeBatch:
    req_ids: list[str] = field(default_factory=list)
    num_prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(16, dtype=np.int32))


class FakeRunner:
    def __init__(self, proposer, max_len: int = MAX_LEN):
        self.drafter = proposer
        self.requests: dict[str, SimpleNamespace] = {}
        self.input_batch = FakeBatch()
        self.token_ids_cpu = np.zeros((16, max_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(16, dtype=np.int32)
        self.scripts: dict[str, Script] = {}
        self.drafts: dict[str, list[int]] = {}
        self.accepted: dict[str, int] = {}

    def load_model(self) -> None:
        self.drafter.load_model(None)  # as vLLM's runner calls it: the proposer finds this runner itself

    # -- what vLLM's scheduler and runner do to the persistent batch -------------------------------------
    def add(self, req_id: str, script: Script) -> None:
        """A new request scheduled: vLLM's runner takes it in through `_update_states`, before its prefill."""
        self._update_states(self.scheduled(req_id, script))

    def scheduled(self, req_id: str, script: Script) -> SimpleNamespace:
        """The scheduler's output that brings in one new request."""
        self.scripts[req_id] = script
        params = SimpleNamespace(extra_args=script.extra_args, all_stop_token_ids=set(script.stop_ids))
        new = SimpleNamespace(req_id=req_id, prompt_token_ids=list(script.prompt), sampling_params=params)
        return SimpleNamespace(scheduled_new_reqs=[new])

    def _update_states(self, scheduler_output) -> None:
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = SimpleNamespace(sampling_params=new.sampling_params)
            self._place(new.req_id, new.prompt_token_ids)

    def _place(self, req_id: str, tokens: list[int]) -> None:
        i = len(self.input_batch.req_ids)
        self.input_batch.req_ids.append(req_id)
        self.input_batch.num_prompt_tokens[i] = len(self.scripts[req_id].prompt)
        self.token_ids_cpu[i, : len(tokens)] = tokens
        self.num_tokens_no_spec[i] = len(tokens)

    def _row(self, req_id: str) -> int:
        return self.input_batch.req_ids.index(req_id)

    def tokens(self, req_id: str) -> list[int]:
        i = self._row(req_id)
        return self.token_ids_cpu[i, : self.num_tokens_no_spec[i]].tolist()

    def preempt(self, req_id: str) -> list[int]:
        """Out of the batch, its state kept (vLLM keeps `requests[req_id]` of a preempted request)."""
        tokens = self.tokens(req_id)
        self._remove_row(req_id)
        return tokens

    def resume(self, req_id: str, tokens: list[int]) -> None:
        self._place(req_id, tokens)

    def finish(self, req_id: str) -> None:
        self._remove_row(req_id)
        del self.requests[req_id]

    def _remove_row(self, req_id: str) -> None:
        i = self._row(req_id)
        last = len(self.input_batch.req_ids) - 1
        # vLLM condenses the batch: the last row moves into the hole.
        self.token_ids_cpu[i] = self.token_ids_cpu[last]
        self.num_tokens_no_spec[i] = self.num_tokens_no_spec[last]
        self.input_batch.num_prompt_tokens[i] = self.input_batch.num_prompt_tokens[last]
        self.input_batch.req_ids[i] = self.input_batch.req_ids[last]
        self.input_batch.req_ids.pop()

    def step(self, decoding: set[str] | None = None, propose: bool = True) -> list[list[int]]:
        """One engine step. decoding: the rows that sample this step (default all); propose False: vLLM skips
        the proposer this step (its tokens must still reach the drafter later)."""
        sampled: list[list[int]] = []
        for i, req_id in enumerate(self.input_batch.req_ids):
            if decoding is not None and req_id not in decoding:
                sampled.append([])
                continue
            script, n = self.scripts[req_id], int(self.num_tokens_no_spec[i])
            written = n - len(script.prompt)
            rest = script.output[written:]
            draft = self.drafts.get(req_id, [])
            hits = 0
            while hits < len(draft) and hits < len(rest) - 1 and draft[hits] == rest[hits]:
                hits += 1
            new = rest[: hits + 1]
            self.accepted[req_id] = self.accepted.get(req_id, 0) + hits
            self.token_ids_cpu[i, n : n + len(new)] = new
            self.num_tokens_no_spec[i] = n + len(new)
            sampled.append(new)
        self.drafts = {}
        if not propose:
            return []
        out = self.drafter.propose(sampled, self.num_tokens_no_spec, self.token_ids_cpu, slot_mappings=None)
        self.drafts = dict(zip(self.input_batch.req_ids, out))
        return out

    def done(self, req_id: str) -> bool:
        script = self.scripts[req_id]
        return len(self.tokens(req_id)) >= len(script.prompt) + len(script.output)


def vllm_config(tokenizer_path: str, k: int = 8, max_model_len: int = MAX_LEN) -> SimpleNamespace:
    """The parts of VllmConfig the proposer reads."""
    model_config = SimpleNamespace(tokenizer=tokenizer_path, trust_remote_code=False, max_model_len=max_model_len,
                                   try_get_generation_config=lambda: {})
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model_config)


def tool_script(tok, city: str = "Paris", with_context: bool = True) -> Script:
    """A Qwen-style prompt offering get_weather; the target writes the hermes call for `city`, then end of turn."""
    tools = [WEATHER]
    messages = [{"role": "user", "content": f"What is the weather in {city} in celsius?"}]
    tools_block = "\n".join(json.dumps(t) for t in tools)
    prompt = (f"<|im_start|>system\n# Tools\n<tools>\n{tools_block}\n</tools><|im_end|>\n"
              f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n")
    call = ToolCall("get_weather", {"city": city, "unit": "celsius"})
    output = tok.encode(DIALECTS["hermes"].render(call), add_special_tokens=False) + [tok.eos_token_id]
    extra = {"oospec": {"tools": tools, "messages": messages, "dialect": "hermes"}} if with_context else None
    return Script(tok.encode(prompt, add_special_tokens=False), output, extra, frozenset({tok.eos_token_id}))


class SilentSidecar:
    """Takes jobs and never answers: for tests that ask only when and what a request's job sent."""

    def __init__(self):
        self.jobs = []

    def submit(self, job, tools):
        self.jobs.append(job)
        return object()

    def poll(self, ticket):
        return None
