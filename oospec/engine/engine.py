"""The user-facing engine: chat messages in, greedy or sampled text out, accelerated by a chosen drafter."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from oospec.engine.constraint import GrammarConstraint, GrammarVocabulary
from oospec.engine.decode import Generation, OnTokens, generate
from oospec.engine.drafting import Drafter, Request
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.target import PREFILL_CHUNK, TargetBackend
from oospec.errors import ContextLengthError, InvalidMessagesError
from oospec.models.registry import DEFAULT_BUDGET
from oospec.tools.call_grammar import call_grammar, forced_call_start
from oospec.tools.chat_text import ClientText
from oospec.tools.dialects import DEFAULT_DIALECT, Dialect, get_dialect

CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Result:
    text: str
    generation: Generation
    prompt_tokens: int

    @property
    def tokens(self) -> np.ndarray:
        return self.generation.tokens

    @property
    def stats(self):
        return self.generation.stats


def validate_messages(messages: Any) -> list[dict]:
    """Chat messages as the chat template expects them, or InvalidMessagesError saying what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise InvalidMessagesError("messages must be a non-empty JSON list of {\"role\", \"content\"} objects")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidMessagesError(f"message {i} is a {type(msg).__name__}, not an object with role and content")
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise InvalidMessagesError(f"message {i} has role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        content = msg.get("content")
        if content is None and not (role == "assistant" and msg.get("tool_calls")):
            raise InvalidMessagesError(f"message {i} ({role}) has no content")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidMessagesError(f"message {i} ({role}) content must be a string")
    return messages


def render_chat(client: ClientText, messages: list[dict], tools: list[dict] | None) -> str:
    """The chat template's text (generation prompt included), or InvalidMessagesError with the template's reason."""
    try:
        return client.render(messages, tools)
    except Exception as exc:  # the template's own checks (role order, missing fields) surface as clear errors
        raise InvalidMessagesError(f"the chat template rejected these messages: {exc}") from exc


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> np.ndarray:
    """Render chat messages (and tools) with the tokenizer's chat template into prompt token ids. Control-token
    strings in the messages and tools are tokenized as text: only the template's own markup is control
    tokens (oospec.tools.chat_text). Needs no model: a peer benchmark builds the same ids from the tokenizer."""
    validate_messages(messages)
    client = ClientText(tokenizer)
    return client.encode_array(render_chat(client, client.mark(messages), client.mark(tools)))


def fit_context(prompt_tokens: int, max_new_tokens: int, context: int) -> int:
    """max_new_tokens lowered to what the context holds after the prompt; the engine's one context check.
    ValueError for an empty prompt, ContextLengthError for one that leaves no room for a reply."""
    if prompt_tokens == 0:
        raise ValueError("empty prompt")
    if prompt_tokens >= context:
        raise ContextLengthError(f"the prompt has {prompt_tokens} tokens but the model's context is {context} tokens")
    return min(max_new_tokens, context - prompt_tokens)


class Engine:
    """One target model and its tokenizer; `generate` decodes with any drafter, losslessly: greedy output is
    token-identical to plain greedy, sampled output has plain sampling's distribution."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, budget: int = DEFAULT_BUDGET,
                 prefill_chunk: int = PREFILL_CHUNK):
        self.model = model
        self.tokenizer = tokenizer
        self.target = TargetBackend(model, prefill_chunk)
        self.budget = budget
        self.eos_ids = self._eos_ids()
        self.dtype_note = ""  # what `--dtype auto` chose and why (from_pretrained)
        self._grammar_vocabulary: GrammarVocabulary | None = None
        self._grammar_lock = threading.Lock()  # servers prepare requests on several threads

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: str = "auto", device: str = "cpu", optimize: bool = True,
                        **kwargs) -> Engine:
        """Load a target. optimize: the invariant CPU kernels (oospec.engine.invariant), which make every
        verification row bitwise the 1-row forward; dtype "auto": bfloat16 where the CPU has it natively and
        the probe shows the forward invariant, else float32 (oospec.engine.precision)."""
        from oospec.engine.precision import load_target

        model, tokenizer, note = load_target(name_or_path, dtype=dtype, device=device, optimize=optimize)
        engine = cls(model, tokenizer, **kwargs)
        engine.dtype_note = note
        return engine

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if value is None:
                continue
            ids.update([value] if isinstance(value, int) else value)
        return frozenset(int(i) for i in ids)

    def grammar_vocabulary(self) -> GrammarVocabulary:
        """The tokenizer as constrained decoding reads it (built on first use, about a second, then kept)."""
        with self._grammar_lock:
            if self._grammar_vocabulary is None:
                self._grammar_vocabulary = GrammarVocabulary(self.tokenizer, int(self.model.config.vocab_size),
                                                             self.eos_ids)
            return self._grammar_vocabulary

    def constraint(self, grammar: str, forced_text: str = "") -> GrammarConstraint:
        """One request's grammar (Lark text, e.g. oospec.tools.call_grammar), to pass to `generate`; the prompt
        already ends with `forced_text`, which the grammar must accept. GrammarError when it cannot be used."""
        return GrammarConstraint(self.grammar_vocabulary(), grammar, forced_text)

    def call_constraint(self, tools: list[dict], dialect: str | Dialect = DEFAULT_DIALECT, function: str | None = None,
                        parallel: bool = True) -> GrammarConstraint:
        """The grammar of a reply that must call `function` (None: any of `tools`, OpenAI tool specs), its forced
        start (`forced_call_start`) already in the prompt: what tool_choice "required" or a named function means,
        for the server, the library and benchmarks alike. GrammarError when the tools make no grammar."""
        spoken = get_dialect(dialect)
        names = [function] if function is not None else [t["function"]["name"] for t in tools]
        grammar = call_grammar(tools, names, spoken, parallel=parallel,
                               special_tokens=self.grammar_vocabulary().special_tokens)
        return self.constraint(grammar, forced_call_start(spoken, function))

    def forced_call(self, tools: list[dict], dialect: str | Dialect = DEFAULT_DIALECT, function: str | None = None,
                    parallel: bool = True) -> tuple[np.ndarray, GrammarConstraint]:
        """(the token ids of the forced start, to append to a prompt; `call_constraint`) of a reply that must call."""
        forced = forced_call_start(get_dialect(dialect), function)
        ids = np.asarray(self.tokenizer.encode(forced, add_special_tokens=False), dtype=np.int64)
        return ids, self.call_constraint(tools, dialect, function, parallel)

    def encode(self, messages: list[dict], tools: list[dict] | None = None) -> np.ndarray:
        """The prompt token ids of chat messages (and tools): `encode_chat` with this engine's tokenizer."""
        return encode_chat(self.tokenizer, messages, tools)

    def prepare(self, request: Request) -> Request:
        """`request` itself, made ready to decode: its prompt rendered from the messages and chat tools when it has
        no ids, max_new_tokens fitted to the context (`fit_context`), the engine's budget when it has none, and the
        engine's end-of-turn tokens and tokenizer filled in."""
        if request.prompt_ids is None:
            if request.messages is None:
                raise InvalidMessagesError("give either messages or prompt_ids")
            request.prompt_ids = self.encode(request.messages, request.chat_tools)
        request.prompt_ids = np.asarray(request.prompt_ids, dtype=np.int64).reshape(-1)
        request.max_new_tokens = fit_context(request.prompt_ids.size, request.max_new_tokens, self.target.max_context)
        request.eos_ids = self.eos_ids
        request.tokenizer = self.tokenizer
        request.budget = request.budget or self.budget
        return request

    def generate(self, request: Request | list[dict] | None = None, *, drafter: Drafter | None = None,
                 prefix_cache: PrefixCache | None = None, on_tokens: OnTokens | None = None,
                 tools: list[dict] | None = None, **fields) -> Result:
        """Greedy (temperature 0) or sampled reply to `request` (oospec.engine.drafting.Request: the prompt, tools,
        sampling, budget, grammar). For convenience `request` may be chat messages instead, with `tools` the
        OpenAI tools the chat template renders and `fields` any other Request fields (`Request.chat`).

        drafter: proposes the draft tokens (oospec.drafters.make_drafter); default: none, plain greedy decoding
            (plain sampling at temperature > 0).
        prefix_cache: reuse (and keep) the KV cache of shared prompt prefixes across requests.
        on_tokens: called with the tokens of each step as they are accepted; returning True stops generation.
        """
        if not isinstance(request, Request):
            request = Request.chat(request, tools, **fields)
        elif tools is not None or fields:
            raise TypeError("give a Request, or messages with Request fields as keywords, not both")
        gen = generate(self.target, drafter, self.prepare(request), prefix_cache=prefix_cache, on_tokens=on_tokens)
        text = self.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        return Result(text=text, generation=gen, prompt_tokens=int(request.prompt_ids.size))
