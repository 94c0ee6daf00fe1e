"""`schema`: draft the structure of a tool call that the schema and the dialect leave (almost) no choice about.

Braces, quotes, `"name"`, the arguments key and the key names in schema order cost a forward pass each in
plain decoding, yet are known in advance. Where a few continuations are legal (which tool, which key next)
each becomes a branch of the token tree. Values are left to the value drafters.
"""

from __future__ import annotations

import codecs

import numpy as np

from oospec.drafters.priors import ACCEPTANCE
from oospec.engine.drafting import Candidate, Drafter, Request
from oospec.tools.callscan import CallScanner, Habits
from oospec.tools.continuations import Continuation, structure_continuations
from oospec.tools.dialects import DEFAULT_DIALECT, DIALECTS
from oospec.tools.pasted import ShownTools
from oospec.tools.profile import profile_for
from oospec.tools.schema import Tool, tools_from_openai
from oospec.tools.tokens import ContinuationEncoder, TokenBytes
from oospec.tools.valuesource import ValueSource


def as_tools(tools) -> list[Tool]:
    if not tools:
        return []
    if all(isinstance(t, Tool) for t in tools):
        return list(tools)
    return tools_from_openai(tools)


class SchemaDrafter(Drafter):
    name = "schema"

    def __init__(self, max_tokens: int = 32):
        self.max_tokens = max_tokens
        self.habits = Habits()  # survives requests: the target's habits are the same next time
        self._encoders: dict[int, ContinuationEncoder] = {}
        self.scanner: CallScanner | None = None

    def start(self, request: Request) -> None:
        self.tools = as_tools(request.tools)
        # Only dialects whose calls are JSON objects (they have openers) are followed; None: not a dialect.
        self.dialect = DIALECTS.get(request.dialect or DEFAULT_DIALECT)
        self.eos_ids = request.eos_ids
        tok = request.tokenizer
        self.active = bool(self.tools) and tok is not None and self.dialect is not None and bool(self.dialect.openers)
        if not self.active:
            return
        encoder = self._encoders.get(id(tok))
        if encoder is None:
            encoder = self._encoders[id(tok)] = ContinuationEncoder(tok, TokenBytes(tok))
        self.encoder = encoder
        self.scanner = CallScanner(self.habits.style)
        # Values are copied from what the user said, not from the system prompt (tool docs, examples).
        self.values = ValueSource("\n".join(m["content"] for m in request.messages or ()
                                             if m.get("role") != "system" and isinstance(m.get("content"), str)))
        # What the target copies from the prompt's listing of the tools, where its dialect's profile says it does.
        self.profile = profile_for(self.dialect.name)
        self.shown = ShownTools.from_prompt("\n".join(m["content"] for m in request.messages or ()
                                                if isinstance(m.get("content"), str)), self.tools) \
            if self.profile.reads_listing else None
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.reply: list[int] = []  # this request's ids: how the target spells added tokens (learn_spelling)
        self.spelled = False  # spelling learned from this request's opener already

    def observe(self, produced: np.ndarray) -> None:
        if not self.active:
            return
        ids = produced.tolist()
        self.reply.extend(ids)
        for tok in ids:
            if tok in self.eos_ids:
                self.encoder.learn_spelling(self.reply)
                self._learn_from_finished(tok)
                continue
            self.scanner.feed(self.utf8.decode(self.encoder.token_bytes(tok)))
        if not self.spelled and self.scanner.opener is not None:
            # The first call has begun: how its opener was spelled says how its closer will be, in this request.
            self.spelled = True
            self.encoder.learn_spelling(self.reply)

    def _learn_from_finished(self, eos_id: int) -> None:
        scan = self.scanner
        if scan.calls_done == 0:
            return
        self.habits.eos_id = eos_id
        if scan.opener is not None:
            self.habits.remember(self.habits.openers, scan.opener)
        self.habits.remember(self.habits.closers, scan.outside)
        if scan.joint is not None:
            self.habits.remember(self.habits.joints, scan.joint)
        if scan.args_key:
            self.habits.args_key = scan.args_key

    def continuations(self) -> list[Continuation]:
        if not self.active:
            return []
        return structure_continuations(self.scanner, self.tools, self.habits, self.dialect.args_key,
                                       self.dialect.openers, self.values, self.shown, self.profile)

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        out = []
        eos = self.habits.eos_id if self.habits.eos_id is not None else min(self.eos_ids, default=None)
        for cont in self.continuations():
            ids = self.encoder.continue_after(context, cont.text)[: self.max_tokens]
            if cont.end_of_turn and eos is not None and ids.size < self.max_tokens:
                ids = np.append(ids, eos)
            if ids.size:
                out.append(Candidate(ids, cont.confidence, ACCEPTANCE.structure_persistence))
        return out
