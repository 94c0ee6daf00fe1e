"""`slots`: the out-of-order sidecar fused into the target. Every argument value is predicted by the target
itself, all of them at once and before it reaches them, in rows of the forwards it runs anyway.

While the target writes one argument, each tree it verifies also carries a *probe* per argument not written
yet: the path "this value ends here, then `"<key>": "` and the value guessed so far". The target's choice after
each probe node is its own next token of that value in that context; a guess grows by one token per forward
(more where the guess already held) and is cut where the target departs from it. When the target reaches the
argument, the guess is drafted as the value, then the value's end and the next argument's guess.

No second model, no core taken, no training: the probes cost rows of the verification forward (probe_nodes
beyond the budget, a few percent of a forward each on CPU) and the output is whatever the target verifies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oospec.drafters.priors import ACCEPTANCE
from oospec.drafters.schema import SchemaDrafter
from oospec.engine.budget import cheap_rows, default_cost_model
from oospec.engine.drafting import Candidate, Drafter, Request
from oospec.engine.tree import TokenTree
from oospec.models.registry import DEFAULT_BUDGET
from oospec.tools.callscan import CallPosition

PROBE_OVERHEAD = 0.03  # what all probe rows together may add to a forward's cost
MAX_GUESS_TOKENS = 24  # a value guess stops growing here (a long free-text value is not worth the rows)


@dataclass
class SlotGuess:
    """The target's own running guess of one argument's value, as its token ids and text."""

    ids: list[int] = field(default_factory=list)
    text: str = ""  # the value's text (without its closing quote)
    done: bool = False  # the target closed the value after `ids`


@dataclass
class Probe:
    name: str  # the argument
    quoted: bool
    jump: int  # tokens of the jump before the guess's
    tokens: np.ndarray  # (jump + len(guess),) int64 the chain below the pending token


class SlotDrafter(Drafter):
    """Predicts the arguments still to come with the target's own forwards; shares the schema drafter's scanner
    (the merged drafter that owns both starts and feeds it)."""

    name = "slots"

    def __init__(self, schema: SchemaDrafter, max_probe_nodes: int = 16, max_probes: int = 3):
        self.schema = schema
        self.max_probe_nodes = max_probe_nodes
        self.max_probes = max_probes
        self.probe_nodes = 0
        self.guesses: dict[tuple[int, str], SlotGuess] = {}
        self.sent: list[Probe] = []

    def start(self, request: Request) -> None:
        self.guesses = {}
        self.sent = []
        # Probe only with rows that cost almost nothing next to the forward they join. Measured on 2 CPU cores
        # (bfloat16, each row beyond 12 adds ~5% of a forward), 16 probe nodes raised tau by 3% on API-Bank and
        # 8% on BFCL validation items yet cost as much time as they saved, so on CPU curves this is 0.
        rows = (request.budget or DEFAULT_BUDGET) + 1
        cost = request.cost if request.cost is not None else default_cost_model()
        self.probe_nodes = min(self.max_probe_nodes, cheap_rows(cost, rows, PROBE_OVERHEAD))

    # -- the guesses as drafts ---------------------------------------------------------------------------------
    def candidates(self, context: np.ndarray) -> list[Candidate]:
        schema = self.schema
        if not schema.active:
            return []
        scan = schema.scanner
        if scan.position is CallPosition.ARG_STRING:
            guess = self.guesses.get((scan.calls_done, scan.stack[-1].keys[-1]))
            prefix = "".join(scan.buf)
            if guess is None or not guess.text.startswith(prefix):
                return []
            text = guess.text[len(prefix):]
            if guess.done:
                text += schema.value_end() + self._next_guess_text(exclude=scan.stack[-1].keys)
            if not text:
                return []
            return [self._candidate(context, text, guess.done)]
        jumps = schema.slot_jumps()
        if not jumps:
            return []
        jump = jumps[0]
        guess = self.guesses.get((scan.calls_done, jump.name))
        if guess is None or not guess.text:
            return []
        text = jump.text + guess.text + (jump.after if guess.done else "")
        return [self._candidate(context, text, guess.done)]

    def _next_guess_text(self, exclude: list[str]) -> str:
        """The guess of the argument written next (schema order), if the target has one done for it."""
        scan = self.schema.scanner
        tool = self.schema.tools and next((t for t in self.schema.tools if t.name == scan.name), None)
        if tool is None:
            return ""
        for p in tool.parameters:
            if p.name not in exclude:
                guess = self.guesses.get((scan.calls_done, p.name))
                return guess.text if guess is not None and guess.done else ""
        return ""

    def _candidate(self, context: np.ndarray, text: str, done: bool) -> Candidate:
        ids = self.schema.encoder.continue_after(context, text)
        confidence = ACCEPTANCE.hint_confidence if done else ACCEPTANCE.alternative_hint_confidence
        return Candidate(ids, confidence, ACCEPTANCE.hint_persistence)

    # -- probes: where the target's own next token of each value is read --------------------------------------
    def probes(self, context: np.ndarray) -> list[np.ndarray]:
        self.sent = []
        schema = self.schema
        if not schema.active:
            return []
        calls_done = schema.scanner.calls_done
        for jump in schema.slot_jumps():
            guess = self.guesses.get((calls_done, jump.name))
            if guess is not None and (guess.done or len(guess.ids) >= MAX_GUESS_TOKENS):
                continue
            head = schema.encoder.continue_after(context, jump.text)
            ids = guess.ids if guess is not None else []
            tokens = np.concatenate([head, np.asarray(ids, dtype=np.int64)]) if ids else head
            self.sent.append(Probe(jump.name, jump.quoted, int(head.size), tokens))
            if len(self.sent) >= self.max_probes:
                break
        return [p.tokens for p in self.sent]

    def verified(self, tree: TokenTree, choices: np.ndarray) -> None:
        if not self.sent:
            return
        calls_done = self.schema.scanner.calls_done
        for probe in self.sent:
            nodes = tree.find(probe.tokens.tolist())
            if nodes.size < probe.jump or probe.jump == 0:
                continue  # the tree had no room for the jump
            guess = self.guesses.setdefault((calls_done, probe.name), SlotGuess())
            for i in range(len(guess.ids) + 1):
                at = probe.jump - 1 + i  # the node just before the guess's i-th token
                if at >= nodes.size:
                    break  # the node limit cut the probe here: the rest of the guess stays unchecked
                choice = int(choices[nodes[at] + 1])
                if i < len(guess.ids) and guess.ids[i] == choice:
                    continue
                self._update(guess, guess.ids[:i], choice, probe.quoted)
                break

    def _update(self, guess: SlotGuess, kept: list[int], choice: int | None, quoted: bool) -> None:
        """The guess is `kept`, then the target's `choice` after it: its end if that token closes the value."""
        text = self._text(kept)
        done = False
        if choice is not None:
            piece = self._text([choice])
            end = _value_end(piece, quoted)
            if end is None:
                kept = kept + [choice]
                text += piece
            else:
                text += piece[:end]
                done = True
        guess.ids, guess.text, guess.done = kept, text, done

    def _text(self, ids: list[int]) -> str:
        token_bytes = self.schema.encoder.token_bytes
        return b"".join(token_bytes(t) for t in ids).decode("utf-8", errors="ignore")


def _value_end(piece: str, quoted: bool) -> int | None:
    """Where in a token's text the value it continues ends (an unescaped `"` for a string; `,`, `}`, `]` or
    whitespace otherwise); None when it does not."""
    for i, ch in enumerate(piece):
        if quoted and ch == '"' and (i == 0 or piece[i - 1] != "\\"):
            return i
        if not quoted and (ch in ",}]" or ch.isspace()):
            return i
    return None
