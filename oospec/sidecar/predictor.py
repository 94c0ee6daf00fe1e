"""The sidecar predictor: a small model that guesses the whole call in one parallel job.

Not a free-running generation of the call. The prompt is encoded once; then
1. the function: every tool name is scored as a continuation of `{"name": "` in one batch (one row per
   name, the prompt's cache shared by all rows); the choice follows the sidecar's own greedy path through
   the names, and the runner-up is kept when it is close;
2. the slots: one row per argument of the chosen function(s), each primed with its own key
   (`{"name": "F", "arguments": {"key": `) and the value's opening by type, all decoded greedily as one
   batch, each row stopping when its JSON value is complete. Latency grows with the longest slot, not
   with the number of slots;
3. the calls after it (a turn of several calls): the call just guessed is written after the prompt as the
   task format writes calls, and the sidecar decodes what follows, greedily: its end of turn ends the list,
   the opening of another call (`NEXT_CALL`) asks 1 and 2 again for that call, primed with every call before
   it. Sequential, as each call's rows depend on the calls guessed before it.

The task format (how a request is rendered, what each row is primed with) is `TaskFormat`; training
(`oospec sidecar train`) writes its rows through the same class, so the trained adapter sees exactly the
queries it was trained on.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oospec.engine.prefix_cache import common_prefix_length
from oospec.models.int8 import Int8Linear, quantize_int8
from oospec.sidecar.protocol import MAX_CALLS, Guess, Job, encode_payload
from oospec.sidecar.rowrunner import RowRunner
from oospec.sidecar.slot_values import FirstTokens, closed_options, read_slot
from oospec.tools.chat_text import ClientText
from oospec.tools.dialects import CALL_OPENERS
from oospec.tools.jsonscan import value_end
from oospec.tools.render import VALUE_OPENERS
from oospec.tools.schema import Param, Tool, tools_from_openai
from oospec.tools.tokens import TokenBytes

NEXT_CALL = '{"name": "'  # what opens every call object in the task format, after its opener


class TaskFormat:
    """How the sidecar is queried: the prompt, then one primed assistant prefix per row."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # The client's control-token strings are text here too: the prompt holds them marked, `encode` reads them.
        self.client = ClientText(tokenizer)

    def prompt(self, job: Job) -> str:
        return self.client.render(self.client.mark(job.messages), self.client.mark(job.chat_tools))

    def function_prefix(self, job: Job) -> str:
        return job.opener + NEXT_CALL

    def function_row(self, job: Job, name: str) -> str:
        # Through the arguments key: every row ends the same natural way, so no name is penalised for an
        # unnatural token split at its closing quote.
        return self.function_prefix(job) + name + f'", "{job.args_key}":'

    def slot_prefix(self, job: Job, function: str, param: Param) -> str:
        return (self.function_prefix(job) + function + f'", "{job.args_key}": {{"{param.name}": '
                + VALUE_OPENERS.get(param.type, ""))

    def call_text(self, job: Job, function: str, arguments: dict) -> str:
        """A whole call as the rows write it (compact JSON after the job's opener): the text a later call's
        rows see before them."""
        return self.function_row(job, function) + " " + json.dumps(arguments, ensure_ascii=False) + "}"

    def after_calls(self, job: Job, calls_text: str) -> Job:
        """The job for the next call of a turn: everything the assistant wrote before that call's object (the
        opener, the earlier calls, what joins them) becomes its opener, so every row primer above applies."""
        return replace(job, opener=calls_text)

    @property
    def end_of_turn(self) -> str:
        """The text of the token that ends the assistant's turn ("" when the tokenizer has none)."""
        return getattr(self.tokenizer, "eos_token", None) or ""

    def encode(self, text: str) -> list[int]:
        return self.client.encode(text)


# Predictor settings an adapter was trained for, saved beside it by `oospec sidecar train`.
SIDECAR_SETTINGS = "sidecar.json"


@dataclass(frozen=True)
class NameScores:
    """A request's scores before the function is chosen (`SidecarPredictor.name_scores`)."""

    prompt: str
    call_probability: float
    rows: list[list[int]]  # per offered tool: the prompt and its name row, token ids
    shared: int  # leading tokens all rows share (encoded once)
    logprobs: list[np.ndarray]  # per row: (len(row) - shared,) log-probabilities; [] with one tool
    prior: np.ndarray | None  # (tools,) each name's log-probability without the conversation; None with one tool


class SidecarPredictor:
    """Predicts a tool call's function and slot values with a small causal LM (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_value_tokens: int = 64,
                 alternative_margin: float = 3.0, max_alternatives: int = 3, max_slot_rows: int = 24,
                 min_call_probability: float = 0.0, rank_by: str = "greedy", prior_weight: float = 0.0,
                 max_calls: int = 4, max_joint_tokens: int = 24, memory_budget: int | None = None,
                 prompt_without_adapter: bool = False):
        if rank_by not in ("greedy", "total"):
            raise ValueError(f"rank_by must be 'greedy' or 'total', got {rank_by!r}")
        self.model = model.eval()
        # What it computes in: "int8" where its linear layers are quantized (from_pretrained), else its dtype.
        self.precision = "int8" if any(isinstance(m, Int8Linear) for m in model.modules()) \
            else str(next(model.parameters()).dtype).removeprefix("torch.")
        self.tokenizer = tokenizer
        self.format = TaskFormat(tokenizer)
        self.memory_budget = memory_budget  # bytes of working set (None: oospec.sidecar.memory's default)
        # In-target slot rows: the model's LoRA applies to the rows only, the prompt is read without it
        # (RowRunner); an adapter trained with `--prompt-without-adapter` says so in its SIDECAR_SETTINGS.
        self.prompt_without_adapter = prompt_without_adapter
        self.runner = RowRunner(model, memory_budget, prompt_without_adapter=prompt_without_adapter)
        self.token_bytes = TokenBytes(tokenizer)
        self.max_value_tokens = max_value_tokens
        self.alternative_margin = alternative_margin  # keep the runner-up within this many nats of the best
        self.max_slot_rows = max_slot_rows
        self.max_alternatives = max_alternatives
        self.max_calls = min(max_calls, MAX_CALLS)  # calls of one turn predicted (1: the first only)
        self.max_joint_tokens = max_joint_tokens  # decoded after a call before "another call" or "turn ends"
        # Below this belief that the target writes a call at all, the payload says "no call" and no slot is
        # decoded. 0 for a base model, whose belief in one exact opener is not calibrated; trained adapters
        # carry their own (SIDECAR_SETTINGS).
        self.min_call_probability = min_call_probability
        self.call_probability: float | None = None  # of the last job
        # How the function is chosen: "greedy" follows the model's own greedy path through the names (what free
        # generation would write; right for a base model), "total" takes the likeliest whole name (what an adapter
        # trained with the ranking loss was trained to get right).
        self.rank_by = rank_by
        # > 0: rank names by log P(name | request) - prior_weight * log P(name | the same tools, no conversation)
        # (pointwise mutual information). An adapter leans towards the names it was trained on whatever the
        # conversation says; the prior measures that lean, so it can be taken out. Implies "total".
        self.prior_weight = prior_weight
        self._priors: dict[str, np.ndarray] = {}  # per tool list and system turn: agents reuse them
        self.first_tokens = FirstTokens(self.token_bytes)  # the tokens a healed row may start with
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_ids = set(getattr(tokenizer, "all_special_ids", []) or []) | ({eos} if eos is not None else set())

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: str = "auto", device: str = "cpu", adapter: str | None = None,
                        optimize: bool = True, **kwargs) -> SidecarPredictor:
        from oospec.models.loading import load_model

        from oospec.models.cpu_features import drafter_dtype

        gguf = _own_gguf(name_or_path, dtype, device)
        if gguf is not None:  # its own quantized file on the invariant kernels: the fastest the CPU has
            return cls(*_load_gguf_sidecar(gguf, adapter), **_adapter_settings(adapter, kwargs))
        kwargs = _adapter_settings(adapter, kwargs)
        rows_only = kwargs.get("prompt_without_adapter", False)  # the LoRA is switched per forward: never merged
        dtype = drafter_dtype(device) if dtype == "auto" else dtype  # a drafter: the fastest precision here
        int8 = dtype == "int8"
        if int8 and rows_only:
            raise ValueError("dtype 'int8' merges the adapter into the weights: not for an adapter on the rows only")
        if int8 and not str(device).startswith("cpu"):
            raise ValueError(f"dtype 'int8' is a CPU precision for the sidecar, not one for {device!r}")
        model, tokenizer = load_model(name_or_path, dtype="float32" if int8 else dtype, device=device)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
            if not rows_only:
                model = model.merge_and_unload()
        if int8:  # after the merge: the adapter's factors belong to the weights they are added to
            quantize_int8(model)
        if optimize and str(device).startswith("cpu") and not rows_only:  # packs nn.Linear: peft's layers stay
            from oospec.engine.onednn import optimize_for_cpu

            optimize_for_cpu(model)
        return cls(model, tokenizer, **kwargs)

    def read_prompt(self, job: Job) -> str:
        """The job's prompt text; with the adapter on the rows only, also what the runner reads without it."""
        prompt = self.format.prompt(job)
        if self.prompt_without_adapter:
            self.runner.prompt_ids = self.format.encode(prompt)
        return prompt

    def clear_cache(self) -> None:
        """Forget the encoded prompt and the name priors: the next job starts cold (a benchmark's fresh run)."""
        self.runner = RowRunner(self.model, self.memory_budget, prompt_without_adapter=self.prompt_without_adapter)
        self._priors.clear()

    # -- the job -------------------------------------------------------------------------------------------
    def predict(self, job: Job) -> bytes:
        """The compact JSON payload for `job`. Raises WorkingSetTooLarge (oospec.sidecar.memory) for a job over
        the memory budget, before its prompt is encoded."""
        t0 = time.perf_counter()
        tools = tools_from_openai(job.tools) if job.tools else []
        if not tools:
            raise ValueError("the request offers no tools to predict")
        guesses = self.guess(job, tools)
        following = self.following_calls(job, tools, guesses[0]) if guesses and job.function is None else []
        return encode_payload(job.request_id, guesses, time.perf_counter() - t0, time.time(),
                              self.call_probability, following)

    def following_calls(self, job: Job, tools: Sequence[Tool], first: Guess) -> list[Guess]:
        """The calls the sidecar expects after `first` in the same turn, each guessed with the calls before it
        written out; the list ends where the sidecar ends the turn, writes anything but another call, or
        repeats a call (a loop, not a turn)."""
        prompt = self.read_prompt(job)
        out: list[Guess] = []
        current, call = job, first
        while len(out) + 1 < self.max_calls:
            written = self.format.call_text(current, call.function, call.arguments)
            joint = self.next_call_opening(prompt + written)
            if joint is None:
                break
            current = self.format.after_calls(job, written + joint)
            call = self.guess(current, tools, later=True)[0]
            if any(c.function == call.function and c.arguments == call.arguments for c in (first, *out)):
                break
            out.append(call)
        return out

    def next_call_opening(self, text: str) -> str | None:
        """What the sidecar writes after `text` (a call) before another call's `NEXT_CALL`; None where it ends
        the turn instead (or writes `max_joint_tokens` tokens of anything else). The last token of `text` is
        decoded again, as training encodes the row: a call's closing brace often merges with what follows."""
        ids = self.format.encode(text)
        if len(ids) < 3:
            return None
        last = self.token_bytes.join(ids[-1:]).decode("utf-8", errors="ignore")
        self.runner.encode_prefix(ids[:-2])
        found: list[str | None] = [None]

        def stop(_: int, gen: np.ndarray) -> bool:
            if int(gen[-1]) in self.stop_ids:
                return True
            written = self.token_bytes.join(gen).decode("utf-8", errors="ignore")
            if not written.startswith(last[: len(written)]):
                return True  # it would not write the call as guessed: nothing after it is ours to read
            at = written.find(NEXT_CALL, len(last))
            if at >= 0:
                found[0] = written[len(last):at]
            return at >= 0

        self.runner.run([ids[-2:-1]], steps=self.max_joint_tokens, stop=stop)
        return found[0]

    def guess(self, job: Job, tools: Sequence[Tool], later: bool = False) -> list[Guess]:
        """The guesses for one call, best first. `later`: a call after the turn's first (its job's opener holds
        the calls before it): the call is known to come and only the best guess is kept."""
        if job.function is not None:
            tools = [t for t in tools if t.name == job.function]
            if not tools:
                raise ValueError(f"the job names function {job.function!r}, which the request does not offer")
        prompt = self.read_prompt(job)
        if not later:
            self.call_probability = None
        # First, while the runner's cache holds no conversation: the prior shares the system turn with the prompt.
        first = job.function is None and not later
        prior = self.name_prior(job, tools) if self.prior_weight and first and len(tools) > 1 else None
        if first:
            self.call_probability = self.call_likelihood(job, prompt)
            if self.call_probability < self.min_call_probability:
                return []
        rows = [self.format.encode(prompt + self.format.function_row(job, t.name)) for t in tools]
        probe = [self.format.encode(prompt + self.format.slot_prefix(job, t.name, t.parameters[0]))
                 for t in tools if t.parameters]
        if len(tools) == 1:
            self.runner.encode_prefix(rows[0][: min(common_prefix_length(rows + probe), len(rows[0]) - 1)])
            chosen = [(0, 0.0)]
        else:
            shared, logprobs = self.score_rows(rows, share_with=probe)
            chosen = self.rank_functions(rows, shared, logprobs, prior)[: 1 if later else None]
        return self.fill_slots(job, prompt, [(tools[i], score) for i, score in chosen])

    def score_rows(self, rows: list[list[int]], share_with: Sequence[Sequence[int]] = ()) -> tuple[int, list[np.ndarray]]:
        """Encode once what `rows` share (with `share_with` too: rows run next, which then find it cached), then
        score the rest of every row in one batch: (shared length, per row its tokens' log-probabilities)."""
        shared = min(common_prefix_length([*rows, *share_with]), min(map(len, rows)) - 1)
        self.runner.encode_prefix(rows[0][:shared])
        logprobs, _ = self.runner.run([r[shared:] for r in rows], keep_all_logits=True)
        return shared, logprobs

    def call_likelihood(self, job: Job, prompt: str) -> float:
        """The sidecar's belief that the answer opens a call, in whatever wrapper: the job's openers and every
        other one a target is known to write (`CALL_OPENERS`). A drafter's first request of a dialect sends the
        dialect's opener, which need not be what this target writes (Qwen2.5-Coder fences its calls in
        ```json even where its template asks for <tool_call>): "a call comes" must not hinge on that guess.
        The openings are scored as continuations of the prompt in one batch (none is a prefix of another, so
        their probabilities add up)."""
        openers = list(dict.fromkeys([job.opener, *(job.openers or ()), *CALL_OPENERS]))
        rows = [self.format.encode(prompt + self.format.function_prefix(replace(job, opener=o))) for o in openers]
        _, logprobs = self.score_rows(rows, share_with=[self.format.encode(prompt)])
        return float(min(1.0, sum(np.exp(lp.sum()) for lp in logprobs)))

    def name_prior(self, job: Job, tools: Sequence[Tool]) -> np.ndarray:
        """Each name's log-probability with the conversation taken out (system turn and tools kept, one neutral
        user turn): what the sidecar would call whatever was asked. Cached per tool list and system turn."""
        system = [m for m in job.messages if m.get("role") == "system"]
        key = json.dumps([system, job.tools, job.chat_tools, job.opener, job.args_key], sort_keys=True)
        prior = self._priors.get(key)
        if prior is None:
            neutral = replace(job, messages=system + [{"role": "user", "content": "N/A"}])
            request_prompt = self.runner.prompt_ids
            prompt = self.read_prompt(neutral)
            _, logprobs = self.score_rows([self.format.encode(prompt + self.format.function_row(neutral, t.name))
                                           for t in tools])
            self.runner.prompt_ids = request_prompt  # the request's own rows come next
            prior = np.array([lp.sum() for lp in logprobs])
            if len(self._priors) >= 256:
                self._priors.pop(next(iter(self._priors)))
            self._priors[key] = prior
        return prior

    def rank_functions(self, rows: list[list[int]], shared: int, logprobs: list[np.ndarray],
                       prior: np.ndarray | None = None) -> list[tuple[int, float]]:
        """[(tool index, ranking score)]: the chosen name (`rank_by`, `prior_weight`), then the runners-up within
        the margin. The score is what the names were ranked by (the name's log-probability less `prior_weight`
        times its prior), so the difference between two is how far apart the ranking put them."""
        totals = np.array([lp.sum() for lp in logprobs])
        scores = totals if prior is None else totals - self.prior_weight * prior
        if self.rank_by == "total" or prior is not None:
            best = int(np.argmax(scores))
        else:
            best = greedy_path(rows, shared, logprobs)
        floor = max(scores[best], scores.max()) - self.alternative_margin
        others = [int(i) for i in np.argsort(-scores) if i != best and scores[i] >= floor]
        return [(best, float(scores[best]))] + [(i, float(scores[i])) for i in others[: self.max_alternatives]]

    def fill_slots(self, job: Job, prompt: str, chosen: list[tuple[Tool, float]]) -> list[Guess]:
        slots = [(tool, p) for tool, _ in chosen for p in tool.parameters][: self.max_slot_rows]
        closed = [(t, p) for t, p in slots if closed_options(p)]
        free = [(t, p) for t, p in slots if not closed_options(p)]
        values = {**self.decode_free(job, prompt, free), **self.choose_closed(job, prompt, closed)}
        return [Guess(tool.name, {p.name: values[(tool.name, p.name)] for p in tool.parameters
                                  if (tool.name, p.name) in values}, score if math.isfinite(score) else 0.0)
                for tool, score in chosen]

    def _rows_after_prefix(self, rows: list[list[int]]) -> list[list[int]]:
        prefix = self.runner.prefix_ids
        if any(r[: len(prefix)] != prefix or len(r) <= len(prefix) for r in rows):
            # Tokenization merged across the cached boundary: share what these rows do share.
            self.runner.encode_prefix(rows[0][: min(common_prefix_length(rows), min(map(len, rows)) - 1)])
            prefix = self.runner.prefix_ids
        return [r[len(prefix):] for r in rows]

    def decode_free(self, job: Job, prompt: str, slots: list[tuple[Tool, Param]]) -> dict:
        """Strings, numbers, arrays, objects: one row each, decoded greedily together until each value ends."""
        if not slots:
            return {}
        # Token healing: a value's first characters merge with the opener before them (` "(`, ` ["`, ` {"`, ` -`
        # are single tokens), so a row ending on the opener alone asks for a split the model never saw, in
        # pretraining or in training (rows are encoded whole): it then writes `(5+6)*3` as `5 + 6 * 3`. Each row
        # stops one token short instead, and its first token is one that begins with the text left out.
        full = [self.format.encode(prompt + self.format.slot_prefix(job, t.name, p)) for t, p in slots]
        healed = [self.token_bytes(row[-1]) for row in full]
        rows = self._rows_after_prefix([row[:-1] for row in full])
        openers = [VALUE_OPENERS.get(p.type, "") for _, p in slots]
        texts: list[str | None] = [None] * len(slots)

        def stop(i: int, ids: np.ndarray) -> bool:
            if int(ids[-1]) in self.stop_ids:
                return True
            text = openers[i] + self.token_bytes.join(ids)[len(healed[i]):].decode("utf-8", errors="ignore")
            end = value_end(text)
            if end is not None:
                texts[i] = text[:end]
            return end is not None

        self.runner.run(rows, steps=self.max_value_tokens + 1, stop=stop,
                        first=[self.first_tokens(b, p) for b, (_, p) in zip(healed, slots)])
        values = {}
        for (tool, p), text in zip(slots, texts):
            ok, value = read_slot(text, p, p.name in tool.required)
            if ok:
                values[(tool.name, p.name)] = value
        return values

    def choose_closed(self, job: Job, prompt: str, slots: list[tuple[Tool, Param]]) -> dict:
        """Booleans and enums: every option scored as a row, in one batch; the likeliest wins."""
        if not slots:
            return {}
        owners, texts = [], []
        for i, (tool, p) in enumerate(slots):
            base = self.format.slot_prefix(job, tool.name, p)
            base = base[: len(base) - len(VALUE_OPENERS.get(p.type, ""))]
            for option in closed_options(p):
                owners.append((i, option))
                texts.append(prompt + base + json.dumps(option, ensure_ascii=False) + "}")
        rows = self._rows_after_prefix([self.format.encode(t) for t in texts])
        logprobs, _ = self.runner.run(rows, keep_all_logits=True)
        best: dict[int, tuple[float, Any]] = {}
        for (i, option), lp in zip(owners, logprobs):
            score = float(lp.sum())
            if i not in best or score > best[i][0]:
                best[i] = (score, option)
        return {(slots[i][0].name, slots[i][1].name): option for i, (_, option) in best.items()}

    # -- for choosing settings (`oospec sidecar tune`) ------------------------------------------------------
    def name_scores(self, job: Job, tools: Sequence[Tool]) -> NameScores:
        """What `guess` weighs before it chooses a function, computed under every setting at once: the call
        probability, each name's log-probabilities and their prior. `rank_functions` then chooses under any
        `rank_by` / `prior_weight` and `fill_slots` decodes the choice, with nothing scored twice."""
        prompt = self.read_prompt(job)
        prior = self.name_prior(job, tools) if len(tools) > 1 else None
        call_probability = self.call_likelihood(job, prompt)
        rows = [self.format.encode(prompt + self.format.function_row(job, t.name)) for t in tools]
        probe = [self.format.encode(prompt + self.format.slot_prefix(job, t.name, t.parameters[0]))
                 for t in tools if t.parameters]
        if len(tools) == 1:
            self.runner.encode_prefix(rows[0][: min(common_prefix_length(rows + probe), len(rows[0]) - 1)])
            return NameScores(prompt, call_probability, rows, 0, [], None)
        shared, logprobs = self.score_rows(rows, share_with=probe)
        return NameScores(prompt, call_probability, rows, shared, logprobs, prior)


def greedy_path(rows: list[list[int]], shared: int, logprobs: list[np.ndarray]) -> int:
    """The name greedy decoding would write: at each token where the names part, the likeliest. rows: token ids,
    their first `shared` alike; logprobs[i][d]: the log-probability of rows[i][shared + d]."""
    alive = list(range(len(rows)))
    depth = 0
    while len(alive) > 1:
        # Rows still tied diverge here: follow the likeliest next token, as greedy decoding would.
        at = [(rows[i][shared + depth] if shared + depth < len(rows[i]) else -1) for i in alive]
        if len(set(at)) == 1:
            depth += 1
            continue
        best_lp = max(logprobs[i][depth] for i, t in zip(alive, at) if t >= 0)
        alive = [i for i, t in zip(alive, at) if t >= 0 and logprobs[i][depth] == best_lp]
        depth += 1
    return alive[0]


def _adapter_settings(adapter: str | None, kwargs: dict) -> dict:
    """The predictor settings an adapter ships (SIDECAR_SETTINGS), under the caller's own."""
    settings = Path(adapter) / SIDECAR_SETTINGS if adapter else None
    return {**json.loads(settings.read_text()), **kwargs} if settings is not None and settings.is_file() else kwargs


def _own_gguf(name_or_path: str, dtype: str, device: str) -> Path | None:
    """The GGUF a CPU sidecar runs from (a known model's, or a .gguf path) where its dtype is a float one the
    quantized kernels compute ("auto": bfloat16 or float32, whichever the CPU runs natively); None: the folder path
    (int8, an accelerator, a Hugging Face folder, or no C++ kernels here)."""
    from oospec.engine.kernels import native
    from oospec.models.provision import resolve_target

    if not str(device).startswith("cpu") or dtype not in ("auto", "bfloat16", "float32") or native() is None:
        return None
    source = resolve_target(name_or_path)
    return source if source.suffix.lower() == ".gguf" else None


def _load_gguf_sidecar(gguf: Path, adapter: str | None):
    import torch

    from oospec.engine.quantized import add_lora, load_gguf_model
    from oospec.models.cpu_features import native_bf16

    model, tokenizer = load_gguf_model(gguf, dtype=torch.bfloat16 if native_bf16() else torch.float32)
    if adapter:
        add_lora(model, adapter)
    return model, tokenizer
