"""The sidecar's job done by slot rows: rows inside the target's own verification forwards (oospec.engine.slot_rows)
instead of a second model in a process of its own. The prompt is read once, by the target; the rows read its
cache through the slot LoRA where the target has one (trained on these very rows: TaskFormat's).

The rows are the predictor's (oospec.sidecar.predictor), as a forest below the prompt whose shared starts are
fed once:
1. the function (a job that does not name one, offering several): every tool's name row (`function_row`), fed
   over as many forwards as the rows allowed per forward need; each name scored by the log-probabilities of its
   tokens after the start all rows share, the choice greedy decoding's path through them (`greedy_path`);
2. the slots: one chain per argument of the chosen function, primed with `slot_prefix` less its last token (the
   sidecar's token healing: the first value token is the likeliest that begins with the text left out), then
   one greedy token per forward, every slot at once, until its JSON value ends or `max_value_tokens`; an
   enum's or a boolean's slot is chosen as the predictor chooses it (each option written out as a row, the
   likeliest whole row).
The answer is a payload as the process sidecar writes it, checked the same way (`parse_payload`), polled by the
SidecarDrafter that submitted the job (`submit` / `poll` / `cancel`, a sidecar client's interface), so hints
are built by the one machinery. It is published early and grows: the function as soon as the name rows choose
it (every slot pending), then again as each slot's value ends, so the drafter proposes the call's opening and
the values known while the others still grow (a hint is worth something only before the target writes it).
To start values a forward sooner, the primers of every offered function's slots ride with the name rows (up to
`max_speculative` of them); the chosen function's slots grow from their primers' kept logits at once.

What the rows cost: each forward takes only as many rows as pay for the wider forward under the target's cost
curve (`rows_worth`); a slot whose value the target has written already (or a job whose call it has closed,
or whose function it did not choose) gets no more rows (`written`).

Left to the process sidecar: the belief that a call comes at all, the runners-up's slots, the calls after the
first.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from oospec.engine.budget import CostModel, PriorMean, paying_rows
from oospec.engine.drafting import Drafter, Request
from oospec.engine.prefix_cache import common_prefix_length
from oospec.engine.slot_rows import PROMPT, SlotFeed
from oospec.sidecar.predictor import TaskFormat, greedy_path
from oospec.sidecar.protocol import Guess, Job, Payload, PayloadError, encode_payload, parse_payload
from oospec.sidecar.slot_values import FirstTokens, closed_options, read_slot
from oospec.tools.jsonscan import value_end
from oospec.tools.render import VALUE_OPENERS
from oospec.tools.schema import Param, Tool
from oospec.tools.tokens import TokenBytes

Path = tuple[int, ...]  # a node of the forest: its tokens below the prompt, its own last

# What a row is worth (rows_worth). The untrained 1.5B rows agree with the teacher on 72% of whole calls. A hinted
# token saves what it costs the target without the hint, 1/tau (tau: the tokens per forward the target reaches
# with the other drafters, measured as it decodes), less what it costs with a right hint in the tree, about
# 1/HINTED_TAU (a tree of 16 nodes accepted in part): where toolspec alone writes calls at tau 6 to 8 (API-Bank,
# BFCL validation items), a hinted token saves a tenth of a forward, and the rows must be cheap to pay. A value
# runs about 6 tokens.
ROW_AGREEMENT = 0.7
HINTED_TAU = 12.0
TYPICAL_VALUE_TOKENS = 6


@dataclass
class _Scored:
    """Rows scored by the log-probabilities of their tokens after the start they all share."""

    rows: list[Path]
    shared: int

    def logprobs(self, logp: dict[Path, float]) -> list[np.ndarray] | None:
        """Per row, (len(row) - shared,) log-probabilities; None until every one is known."""
        keys = [[row[: k + 1] for k in range(self.shared, len(row))] for row in self.rows]
        if not all(key in logp for row in keys for key in row):
            return None
        return [np.array([logp[key] for key in row]) for row in keys]


@dataclass
class _Slot:
    """One argument's value: grown a token per forward below its primer, or one of its few options, scored."""

    param: Param
    required: bool
    primer: Path = ()  # the slot's prefix less its last token
    healed: bytes = b""  # the bytes of the token left out, which the value's first token begins with
    allowed: np.ndarray | None = None  # the tokens the value may start with (None: any)
    options: list = field(default_factory=list)  # an enum's or a boolean's values (closed_options)
    scored: _Scored | None = None  # their rows
    value: list[int] = field(default_factory=list)
    text: str | None = None  # the value's JSON text, once it ended
    done: bool = False  # its value ended, or the target wrote it first (no text then)


@dataclass
class _Ticket:
    """One job, from submit to payload."""

    job: Job
    tools: list[Tool]  # those it may choose from
    prompt: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    names: _Scored | None = None  # the name rows (None: one function to choose from)
    chosen: Tool | None = None
    score: float = 0.0
    slots: list[_Slot] = field(default_factory=list)
    payload: Payload | None = None  # early (slots pending) until every slot is done
    published: int = -1  # how many slots were done when the payload was last published
    fault: str | None = None  # why no payload comes (a PayloadError's kind)
    compute_s: float = 0.0  # host time spent on it between forwards


class SlotRowSidecar(Drafter):
    """A drafter part that proposes no tokens: its slot rows predict the call, its payload goes to whoever
    submitted the job (module docstring)."""

    name = "slot-rows"

    def __init__(self, slot_rows: int = 32, slot_store: int = 1024, max_value_tokens: int = 64,
                 max_slot_rows: int = 24, max_speculative: int = 16, cost: CostModel | None = None):
        self.slot_rows, self.slot_store = slot_rows, slot_store  # per forward; held at once (Drafter)
        self.max_value_tokens, self.max_slot_rows = max_value_tokens, max_slot_rows
        self.max_speculative = max_speculative  # primers fed before the function is chosen, over all functions
        self.cost = cost  # the target's cost curve (None: every row allowed rides); the drafter sets it per request
        self.tokenizer = None
        # Tokens per forward the target reaches, kept across requests (the first forwards of a request are where
        # the rows are wanted most and say least); a prior of plain decoding's pace, worth a few forwards.
        self.tau = PriorMean(2.0, 4.0)
        self.start_state()

    def start_state(self) -> None:
        self.tickets: list[_Ticket] = []  # the jobs still under way
        self.nodes: dict[Path, int] = {}  # the forest's nodes (ids as the target numbers them)
        self.queue: deque[Path] = deque()  # nodes to feed, parents first
        self.want: dict[Path, set[int]] = {}  # after this node: the tokens whose log-probability a name needs
        self.logp: dict[Path, float] = {}  # a name token's log-probability, keyed by its own node
        self.growing: dict[Path, list[_Slot]] = {}  # the slots whose next token this node's logits choose
        self.speculative: set[Path] = set()  # primers fed before their function is chosen
        self.kept: dict[Path, torch.Tensor] = {}  # their logits, until the choice
        self.drops: list[int] = []  # nodes the next feed forgets
        self.next_id = 0
        self._fed: list[Path] = []

    def start(self, request: Request) -> None:
        if request.tokenizer is not self.tokenizer:
            self.tokenizer = request.tokenizer
            self.format = TaskFormat(request.tokenizer)
            self.token_bytes = TokenBytes(request.tokenizer)
            self.first_tokens = FirstTokens(self.token_bytes)
            eos = getattr(request.tokenizer, "eos_token_id", None)
            self.stop_ids = set(getattr(request.tokenizer, "all_special_ids", []) or []) | (
                {eos} if eos is not None else set())
        self.start_state()

    # -- the sidecar client's interface ----------------------------------------------------------------------
    def submit(self, job: Job, tools: list[Tool]) -> _Ticket:
        t0 = time.perf_counter()
        ticket = _Ticket(job, [t for t in tools if job.function is None or t.name == job.function])
        if not ticket.tools:
            ticket.fault = "unknown-function"
            return ticket
        ticket.prompt = self.format.prompt(job)
        ticket.prompt_ids = self.format.encode(ticket.prompt)
        self.tickets.append(ticket)
        if len(ticket.tools) == 1:
            self._choose(ticket, ticket.tools[0], 0.0)
        else:
            self._score_names(ticket)
            self._prime_all(ticket)
        self._advance(ticket)
        ticket.compute_s += time.perf_counter() - t0
        return ticket

    def observe(self, produced: np.ndarray) -> None:
        self.tau.add(float(produced.size))

    def poll(self, ticket: _Ticket) -> Payload | None:
        return ticket.payload

    def cancel(self, ticket: _Ticket | None) -> None:
        if ticket in self.tickets:
            self._close(ticket)

    def written(self, ticket: _Ticket, function: str | None, finished: set[str], closed: bool) -> None:
        """What the target has written of the call this job predicts: its rows stop where hints come too late.
        `function`: the name it wrote (None: not yet); `finished`: the arguments whose values it has written;
        `closed`: it has closed the call."""
        if ticket not in self.tickets:
            return
        if closed or (function is not None and ticket.chosen is not None and function != ticket.chosen.name):
            self._close(ticket)
            return
        for slot in ticket.slots:
            if slot.param.name in finished and not slot.done:
                slot.done = True
                self._stop_growing(slot)
        self._advance(ticket)

    # -- the slot rows (Drafter) -----------------------------------------------------------------------------
    def slot_feed(self, context: np.ndarray, rows: int, beside: int = 1) -> SlotFeed | None:
        room = min(rows, self.slot_store - len(self.nodes), self.rows_worth(beside, len(self.queue)))
        take = [self.queue.popleft() for _ in range(min(room, len(self.queue)))]
        if not take and not self.drops:
            return None
        fed_at = {path: self.next_id + j for j, path in enumerate(take)}
        parents = [PROMPT if len(p) == 1 else self.nodes.get(p[:-1], fed_at.get(p[:-1])) for p in take]
        feed = SlotFeed(np.array([p[-1] for p in take], dtype=np.int64), np.array(parents, dtype=np.int64),
                        self.next_id, self.drops)
        self.drops, self._fed = [], take
        return feed

    def slot_logits(self, feed: SlotFeed, logits: torch.Tensor) -> None:
        t0 = time.perf_counter()
        for j, path in enumerate(self._fed):
            self.nodes[path] = feed.first_id + j
            wanted, slots = self.want.pop(path, None), self.growing.pop(path, ())
            row = logits[j].float() if wanted or slots or path in self.speculative else None
            if path in self.speculative:
                self.kept[path] = row.clone()
            if wanted:
                logp = torch.log_softmax(row, -1)
                for token in wanted:
                    self.logp[path + (token,)] = float(logp[token])
            for slot in slots:
                self._grow(slot, path, row)
        self.next_id += len(feed)
        self._fed = []
        for ticket in list(self.tickets):
            self._advance(ticket)
        spent = (time.perf_counter() - t0) / max(1, len(self.tickets))
        for ticket in self.tickets:
            ticket.compute_s += spent

    def rows_worth(self, beside: int, wanted: int) -> int:
        """How many of `wanted` rows pay for themselves beside `beside` rows the forward holds anyway (the most r
        whose added cost is within what they are expected to save: oospec.engine.budget.paying_rows), each row
        worth `row_credit` forwards."""
        if self.cost is None or wanted <= 0:
            return wanted
        return paying_rows(self.cost, beside, wanted, self.row_credit())

    def row_credit(self) -> float:
        """Forwards a row is expected to save: an equal share of what the open jobs' hints save
        (`expected_saving`) over the rows they still need (`rows_needed`)."""
        need = self.rows_needed()
        return self.expected_saving() / need if need else 0.0

    def slot_offer(self) -> tuple[int, float]:
        return min(len(self.queue), self.slot_store - len(self.nodes)), self.row_credit()

    def expected_saving(self) -> float:
        """Forwards the open jobs' hints are expected to save: per slot not yet done, its value's tokens (at least
        a typical value's), each right with the rows' agreement and worth saved_per_token."""
        tokens = sum(max(len(slot.value) + 1, TYPICAL_VALUE_TOKENS) for t in self.tickets for slot in t.slots
                     if not slot.done)
        slots_unknown = sum(len(t.tools[0].parameters) for t in self.tickets if t.chosen is None)
        tokens += TYPICAL_VALUE_TOKENS * slots_unknown
        return ROW_AGREEMENT * self.saved_per_token() * tokens

    def saved_per_token(self) -> float:
        """Forwards a right hint saves per token it holds (see HINTED_TAU)."""
        return max(0.0, 1.0 / self.tau.value - 1.0 / HINTED_TAU)

    def rows_needed(self) -> int:
        """Rows still to feed until every open slot ends: those queued, and a growing value's tokens to come."""
        growing = sum(max(TYPICAL_VALUE_TOKENS - len(slot.value), 1) for t in self.tickets for slot in t.slots
                      if not slot.done and slot.scored is None)
        return len(self.queue) + growing

    # -- the job ---------------------------------------------------------------------------------------------
    def _row(self, ticket: _Ticket, text: str) -> Path:
        """The tokens of `text` after the prompt, encoded with it as training encodes its rows."""
        ids = self.format.encode(ticket.prompt + text)
        n = len(ticket.prompt_ids)
        return tuple(ids[n:]) if ids[:n] == ticket.prompt_ids else tuple(self.format.encode(text))

    def _score_names(self, ticket: _Ticket) -> None:
        ticket.names = self._score([self._row(ticket, self.format.function_row(ticket.job, t.name))
                                    for t in ticket.tools])

    def _score(self, rows: list[Path]) -> _Scored:
        """Feed `rows` (their last tokens need no row) and ask for their tokens' log-probabilities. A first token
        would be predicted by the prompt's last (the target's own row, not a slot row): rows are told apart from
        the second token they do not share on."""
        scored = _Scored(rows, max(1, min(common_prefix_length(list(rows)), min(map(len, rows)) - 1)))
        for row in rows:
            for k in range(scored.shared, len(row)):
                if row[:k] in self.nodes and row[: k + 1] not in self.logp:  # fed already, its logits gone
                    self._forget(row[:k])
            self._need(row[:-1])
            for k in range(scored.shared, len(row)):
                self.want.setdefault(row[:k], set()).add(row[k])
        return scored

    def _free_primer(self, ticket: _Ticket, tool: Tool, p: Param) -> tuple[Path, Path]:
        """(the slot's whole prefix, its primer: the prefix less its last token) for a slot decoded freely."""
        full = self._row(ticket, self.format.slot_prefix(ticket.job, tool.name, p))
        return full, full[:-1]

    def _prime_all(self, ticket: _Ticket) -> None:
        """Queue, after the name rows, the primers of every function's free slots (at most max_speculative in all,
        the first parameters of each function first): the chosen function's values then start a forward sooner."""
        per_tool = [[p for p in t.parameters[: self.max_slot_rows] if not closed_options(p)] for t in ticket.tools]
        room = self.max_speculative - len(self.speculative)
        for depth in range(max(map(len, per_tool), default=0)):
            for tool, params in zip(ticket.tools, per_tool):
                if depth < len(params) and room > 0:
                    primer = self._free_primer(ticket, tool, params[depth])[1]
                    if primer not in self.nodes:
                        self.speculative.add(primer)
                        self._need(primer)
                        room -= 1

    def _choose(self, ticket: _Ticket, tool: Tool, score: float) -> None:
        ticket.chosen, ticket.score = tool, score
        for p in tool.parameters[: self.max_slot_rows]:
            prefix = self.format.slot_prefix(ticket.job, tool.name, p)
            options = closed_options(p)
            if options:  # each option written out and closed, as the predictor scores them (choose_closed)
                key = prefix[: len(prefix) - len(VALUE_OPENERS.get(p.type, ""))]
                rows = [self._row(ticket, key + json.dumps(o, ensure_ascii=False) + "}") for o in options]
                ticket.slots.append(_Slot(p, p.name in tool.required, options=options, scored=self._score(rows)))
                continue
            full, primer = self._free_primer(ticket, tool, p)
            healed = self.token_bytes(full[-1])
            slot = _Slot(p, p.name in tool.required, primer, healed, self.first_tokens(healed, p))
            ticket.slots.append(slot)
            self.speculative.discard(primer)
            kept = self.kept.pop(primer, None)
            if kept is not None:  # fed with the name rows: its first value token now
                self._grow(slot, primer, kept)
                continue
            if slot.primer in self.nodes:  # fed already, its logits gone: feed it again
                self._forget(slot.primer)
            self._need(slot.primer)
            self.growing.setdefault(slot.primer, []).append(slot)

    def _grow(self, slot: _Slot, path: Path, row: torch.Tensor) -> None:
        """The slot's next token from its last node's logits; fed next forward unless its value is complete."""
        if not slot.value and slot.allowed is not None and slot.allowed.size:
            token = int(slot.allowed[int(row[torch.from_numpy(slot.allowed)].argmax())])
        else:
            token = int(row.argmax())
        slot.value.append(token)
        if token in self.stop_ids:
            slot.done = True
        else:
            opener = VALUE_OPENERS.get(slot.param.type, "")
            text = opener + self.token_bytes.join(slot.value)[len(slot.healed):].decode("utf-8", errors="ignore")
            end = value_end(text)
            if end is not None:
                slot.text, slot.done = text[:end], True
            slot.done |= len(slot.value) > self.max_value_tokens
        if slot.done:
            self._stop_growing(slot)
            return
        self._need(path + (token,))
        self.growing.setdefault(path + (token,), []).append(slot)

    def _stop_growing(self, slot: _Slot) -> None:
        """No row grows `slot` any more: its chain below the primer is forgotten, the primer kept (shared)."""
        for path in [p for p, slots in self.growing.items() if slot in slots]:
            self.growing[path] = [s for s in self.growing[path] if s is not slot]
            if not self.growing[path]:
                del self.growing[path]
        if slot.value:  # its value's nodes: no row reads them again
            self._forget(slot.primer + (slot.value[0],))

    def _advance(self, ticket: _Ticket) -> None:
        """Choose the function once every name is scored; the payload once every slot is done."""
        if ticket.chosen is None:
            logprobs = ticket.names.logprobs(self.logp)
            if logprobs is None:
                return
            rows, shared = ticket.names.rows, ticket.names.shared
            best = greedy_path(rows, shared, logprobs)
            for i, row in enumerate(rows):  # the other names' own nodes
                if i != best:
                    apart = common_prefix_length([row, rows[best]])
                    if apart < len(row) - 1:
                        self._forget(row[: apart + 1])
            for primer in list(self.speculative):  # the other functions' primers
                apart = common_prefix_length([primer, rows[best]])
                if apart < min(len(primer), len(rows[best]) - 1):
                    self._forget(primer[: apart + 1])
            self._choose(ticket, ticket.tools[best], float(logprobs[best].sum()))
        for slot in ticket.slots:
            logprobs = slot.scored.logprobs(self.logp) if slot.scored is not None and not slot.done else None
            if logprobs is not None:
                slot.text = json.dumps(slot.options[int(np.argmax([lp.sum() for lp in logprobs]))])
                slot.done = True
        done = sum(slot.done for slot in ticket.slots)
        if done > ticket.published:
            ticket.published = done
            self._publish(ticket)

    def _publish(self, ticket: _Ticket) -> None:
        """The payload as it stands: the chosen function, the values ended, the other slots pending; the job is
        closed once none is."""
        values, pending = {}, []
        for slot in ticket.slots:
            if not slot.done:
                pending.append(slot.param.name)
                continue
            ok, value = read_slot(slot.text, slot.param, slot.required)
            if ok:
                values[slot.param.name] = value
        job = ticket.job
        raw = encode_payload(job.request_id, [Guess(ticket.chosen.name, values, ticket.score, tuple(pending))],
                             ticket.compute_s, time.time())
        try:
            ticket.payload = parse_payload(raw, job.request_id, ticket.tools)
        except PayloadError as exc:  # an early payload's fault may pass with the values still to come
            if not pending:
                ticket.fault = exc.kind
        if not pending:
            self._close(ticket)

    def _close(self, ticket: _Ticket) -> None:
        self.tickets.remove(ticket)
        if not self.tickets:  # nothing reads the forest any more
            for path in [p for p in self.nodes if len(p) == 1]:
                self._forget(path)
            self.queue.clear()
            self.want.clear()
            self.growing.clear()
            self.speculative.clear()
            self.kept.clear()

    # -- the forest ------------------------------------------------------------------------------------------
    def _need(self, path: Path) -> None:
        """Queue `path` to be fed, after whichever of its ancestors are not in the forest or queued yet."""
        missing = []
        while path and path not in self.nodes and path not in self.queue:
            missing.append(path)
            path = path[:-1]
        self.queue.extend(reversed(missing))

    def _forget(self, path: Path) -> None:
        """Drop a node and its descendants (with the next feed), fed or still queued."""
        node = self.nodes.get(path)
        if node is not None:
            self.drops.append(node)
        n = len(path)
        for other in [p for p in self.nodes if p[:n] == path]:
            del self.nodes[other]
        self.queue = deque(p for p in self.queue if p[:n] != path)
        for table in (self.growing, self.kept):
            for other in [p for p in table if p[:n] == path]:
                del table[other]
        self.speculative = {p for p in self.speculative if p[:n] != path}
