"""`sidecar` and `oospec`: hints from the out-of-order sidecar, aligned with the call the target is writing.

The sidecar's payload (function and slot values) arrives whenever it arrives; until then this drafter
proposes nothing and `oospec` drafts exactly as `toolspec`. Once it is there, the payload is rendered in
the target's own dialect and whitespace (learned by the schema drafter's scanner) and aligned with what the
target has written:

- while the written call is a prefix of the rendered hint, the rest of the hint is proposed, through the
  closing braces, the learned closer and end of turn;
- after a mismatch, alignment resumes at the next key or value boundary: once the target starts a key the
  hint knows, its value and the remaining slots are proposed; once a value is finished, the remaining slots
  in the hint's order.
Alternative functions in the payload become extra branches of the same token tree.

A turn of several calls (the payload's `following`) is followed call by call: each call the target closes is
matched to a predicted call (by function name, then by how many slots agree; a name no prediction has takes
the next prediction in order), and the next call's drafts come from the first prediction not yet matched,
the other unmatched ones as branches. A draft that reaches the end of a call runs on through the text that
joins two calls (as this target wrote it before, or as its dialect writes it) into the next predicted call;
after the last, through the closer to end of turn.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import numpy as np
import torch

from oospec.engine.drafting import Candidate, Drafter, Request
from oospec.drafters.pld import PromptLookupDrafter
from oospec.drafters.priors import ACCEPTANCE
from oospec.drafters.retrieval import CallMemory, RetrievalDrafter
from oospec.drafters.schema import SchemaDrafter
from oospec.drafters.sidecar_report import FollowUpReport, SidecarReport
from oospec.drafters.sidecar_schedule import SidecarSchedule
from oospec.drafters.toolspec import MergedDrafter
from oospec.engine.budget import CostModel
from oospec.sidecar.agreement import same_value
from oospec.sidecar.protocol import Guess, Job, Payload
from oospec.tools.callscan import CallPosition, CallScanner
from oospec.tools.dialects import Dialect, ToolCall, extract_json_calls
from oospec.tools.render import CallRenderer
from oospec.tools.schema import Tool, to_openai


class SidecarDrafter(Drafter):
    """Proposes the rest of the call from the sidecar's payload. Shares the schema drafter's scanner."""

    name = "sidecar"
    uses_sidecar = True

    SCHEDULES = ("cost", "always")

    def __init__(self, sidecar=None, schema: SchemaDrafter | None = None, max_tokens: int = 96,
                 confidence: float = ACCEPTANCE.hint_confidence,
                 alternative_confidence: float = ACCEPTANCE.alternative_hint_confidence,
                 schedule: str = "cost", plan: SidecarSchedule | None = None):
        if schedule not in self.SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(self.SCHEDULES)}, got {schedule!r}")
        self.sidecar = sidecar  # a SidecarClient (or anything with submit/poll)
        # "cost": a request's job runs only where the cost model expects it to pay (sidecar_schedule);
        # "always": every request's (what a benchmark compares against).
        self.schedule = schedule
        # What this machine measured, kept across requests (and the sidecar's speed across processes).
        self.plan = plan if plan is not None else SidecarSchedule(speed_key=speed_key(sidecar))
        self.schema = schema
        self._owns_schema = schema is None
        if schema is None:
            self.schema = SchemaDrafter()
        self.max_tokens = max_tokens
        self.confidence = confidence
        self.alternative_confidence = alternative_confidence
        self.max_branches = 2  # for a later call: the unmatched predicted calls drafted beside the likeliest
        self.ticket = self.followup = None
        self.payload: Payload | None = None
        self.report = SidecarReport()

    # -- request lifecycle ---------------------------------------------------------------------------------
    def start(self, request: Request) -> None:
        if self._owns_schema:
            self.schema.start(request)
        self.request = request
        self.prompt_len = int(np.asarray(request.prompt_ids).size)
        self.payload = None
        self.ticket = None
        self.followup = None  # the ticket asking for the slots of the function the target chose instead
        self.guesses: list[Guess] = []  # for the turn's first call: the best guess, alternatives, the follow-up's
        self.turn: list[Guess] = []  # the predicted calls of the turn, in order
        self.matched: list[bool] = []  # per predicted call: a call the target closed was matched to it
        self.report = SidecarReport()
        self._steps, self._written, self._last_step_at = 0, 0, None  # forwards, tokens, time: the cost model's
        self._job_tokens = 0  # prompt tokens the sidecar had not cached when the job was sent
        self.hinted: dict[str, Tool] = {}  # the guessed functions, each once
        self._closed_seen = 0  # calls the target closed that were matched against the turn
        self.tool_names = frozenset(t.name for t in self.schema.tools) if self.schema.active else frozenset()
        if self.sidecar is None or not self.schema.active:
            return
        check = getattr(self.sidecar, "check", None)  # a dead worker is restarted whether or not a job is sent
        if check is not None:
            check()
        dialect = self.schema.dialect
        habits = self.schema.habits
        tools = self.schema.tools
        # Hints are rendered in the target's learned whitespace (the style the schema drafter's scanner learns).
        self.render = CallRenderer(habits.style, habits.args_key or dialect.args_key)
        opener = habits.openers[0] if habits.openers else dialect.opener
        chat_tools = request.chat_tools
        in_prompt = request.tools_in_prompt if request.tools_in_prompt is not None \
            else self.schema.profile.tools_in_prompt
        if chat_tools is None and not in_prompt:  # the tools went through the chat template: so for the sidecar
            chat_tools = [to_openai(t) for t in tools]
        self.job = Job(request_id=uuid.uuid4().hex, messages=list(request.messages or []),
                       tools=[to_openai(t) for t in tools], chat_tools=chat_tools or None, opener=opener,
                       args_key=self.render.args_key,
                       openers=list(dict.fromkeys(habits.openers + list(dialect.openers))))
        prompt = np.asarray(request.prompt_ids)
        decision = self.plan.decide(prompt, torch.get_num_threads(), self.sidecar_cpu_threads())
        if self.schedule == "always":
            decision = replace(decision, run=True, why="always")
        self.report.schedule = decision.as_dict()
        if not decision.run:
            return  # drafts as toolspec: the target keeps every core
        self.submitted_at = time.time()
        self.ticket = self.sidecar.submit(self.job, tools)
        self.report.submitted = self.ticket is not None
        if self.ticket is not None:
            self.plan.submitted(prompt)
            self._job_tokens = decision.new_tokens

    def sidecar_cpu_threads(self) -> int:
        """The CPU threads the sidecar takes from the target while it works: 0 on its own device (or for a test
        double that does not say)."""
        if getattr(self.sidecar, "device", "cpu") != "cpu":
            return 0
        return int(getattr(self.sidecar, "threads", 0) or 0)

    def observe(self, produced: np.ndarray) -> None:
        if self._owns_schema:
            self.schema.observe(produced)
        now = time.perf_counter()
        if self._last_step_at is not None:  # the first interval ends the prefill: not a decode step
            self.plan.step(now - self._last_step_at)
        self._last_step_at = now
        self._steps += 1
        self._written += int(produced.size)

    def finish(self) -> None:
        if self._owns_schema:
            self.schema.finish()
        if self.sidecar is not None and self.schema.active:
            self.plan.request_done(self._written, self._steps, bool(self.report.arrived))
        if self.ticket is not None and (self.payload is None or not self.payload.complete):
            payload = self.sidecar.poll(self.ticket)  # an answer that came too late is still reported
            self.report.fault = getattr(self.ticket, "fault", None)
            if payload is not None and payload is not self.payload:
                self._record_arrival(payload, tokens_written=None)
        cancel = getattr(self.sidecar, "cancel", None)  # a test double may have submit/poll only
        if cancel is not None:  # jobs not yet started are dropped: the sidecar goes on to live requests
            cancel(self.ticket)
            cancel(self.followup)

    def settle(self, timeout_s: float = 60.0) -> float:
        """Wait (at most `timeout_s`, then cancel it) for the last request's job to be answered and time it, once;
        returns the seconds waited. For a benchmark, between two timed runs: a job still running when its request
        ends would run into the next method's clock (and, at the warm-up, go untimed, so that the measured items
        explore again). A server never waits."""
        ticket = self.ticket
        if ticket is None or self.sidecar is None or self.report.compute_s is not None:
            return 0.0
        started = time.monotonic()
        while (payload := self.sidecar.poll(ticket)) is None:
            if getattr(ticket, "fault", None) is not None:
                break
            if time.monotonic() - started >= timeout_s:
                cancel = getattr(self.sidecar, "cancel", None)
                if cancel is not None:
                    cancel(ticket)
                break
            time.sleep(0.02)
        else:
            self._record_arrival(payload, tokens_written=None)  # as finish() records an answer that came too late
        return time.monotonic() - started

    def idle_threads(self) -> int:
        # A client that cannot say (a test double with submit/poll only) lends nothing.
        idle = getattr(self.sidecar, "idle_threads", None)
        return idle() if idle is not None else 0

    def _record_arrival(self, payload: Payload, tokens_written: int | None) -> None:
        """Report `payload`, the first or a fuller one (tokens_written None: it came after the reply)."""
        report = self.report
        if report.arrived is None:
            report.arrived, report.tokens_written_at_arrival = tokens_written is not None, tokens_written
        if payload.best is not None:
            arrivals = report.slot_arrivals if report.slot_arrivals is not None else {}
            for name in payload.best.arguments:
                arrivals.setdefault(name, tokens_written)
            report.slot_arrivals = arrivals or None
        if payload.complete:
            report.tokens_written_at_complete = tokens_written
        report.latency_s = round(payload.finished_at - self.submitted_at, 4) if payload.finished_at else None
        report.compute_s, report.payload_bytes = payload.compute_s, payload.size_bytes
        if payload.compute_s is not None:
            self.plan.job_done(self._job_tokens, payload.compute_s)
        report.function = payload.best.function if payload.best else None
        report.arguments = payload.best.arguments if payload.best else None
        report.no_call, report.call_probability = payload.best is None, payload.call_probability
        # With each alternative, its log-odds against the best guess under the sidecar: how close it came.
        report.alternatives = [{"function": g.function, "arguments": g.arguments,
                                "log_odds": round(g.score - payload.best.score, 3)} for g in payload.alternatives]
        if payload.following:
            report.following = [{"function": g.function, "arguments": g.arguments} for g in payload.following]
        report.dropped = list(payload.dropped)

    def _poll(self, context: np.ndarray) -> Payload | None:
        """The latest payload: polled until it is whole (an early one, slots pending, is replaced by fuller ones)."""
        if self.ticket is not None and (self.payload is None or not self.payload.complete):
            payload = self.sidecar.poll(self.ticket)
            if payload is not None and payload is not self.payload:
                self.payload = payload
                self._record_arrival(payload, int(context.size) - self.prompt_len)
                self._add_guesses(payload.guesses)
                self._add_turn(payload.calls)
        if self.payload is not None:
            self._follow_up(context)
        return self.payload

    def _add_guesses(self, guesses) -> None:
        """New functions join the guesses; a fuller guess of one still pending replaces it where it stands."""
        tools = {t.name: t for t in self.schema.tools}
        for g in guesses:
            if g.function not in self.hinted:
                self.hinted[g.function] = tools[g.function]
                self.guesses.append(g)
                continue
            at = next((i for i, old in enumerate(self.guesses) if old.function == g.function), None)
            if at is not None and self.guesses[at].pending:
                self.guesses[at] = g

    def _add_turn(self, calls) -> None:
        tools = {t.name: t for t in self.schema.tools}
        for g in calls:
            self.hinted.setdefault(g.function, tools[g.function])
        if len(calls) != len(self.turn):  # a fuller payload of the same turn keeps what was matched
            self.matched = [False] * len(calls)
        self.turn = list(calls)

    def _match_finished(self) -> None:
        """Match each call the target has closed since the last draft to a predicted call of the turn."""
        scan = self.schema.scanner
        while self._closed_seen < len(scan.finished):
            found = extract_json_calls(scan.finished[self._closed_seen])
            self._closed_seen += 1
            open_ = [i for i, used in enumerate(self.matched) if not used]
            if not open_:
                continue
            written = found[0] if found else ToolCall("", {})
            same = [i for i in open_ if self.turn[i].function == written.name]
            self.matched[max(same, key=lambda i: (slots_agreeing(self.turn[i], written), -i)) if same else open_[0]] = True

    def _pending(self) -> list[tuple[Guess, int]]:
        """[(guess, its index in the turn)] for the call the target writes now or next, the likeliest first;
        a first call's alternatives count as index 0 (they stand for the first predicted call)."""
        self._match_finished()
        open_ = [(self.turn[i], i) for i, used in enumerate(self.matched) if not used]
        if self.schema.scanner.calls_done == 0:
            firsts = [(g, 0) for g in self.guesses]
            return firsts + [(g, i) for g, i in open_ if i > 0]
        return open_[:1 + self.max_branches]

    def _joint(self) -> str | None:
        """What this target writes between two calls of a turn: as in this request, as it did before, or as
        its dialect writes it when it opened the turn the dialect's way."""
        scan, habits = self.schema.scanner, self.schema.habits
        if scan.joint is not None:
            return scan.joint
        if habits.joints:
            return habits.joints[0]
        dialect = self.schema.dialect
        opener = scan.opener if scan.opener is not None else self.job.opener  # before the target opens, the hint's
        return dialect_joint(dialect) if opener == dialect.opener else None

    def _follow_up(self, context: np.ndarray) -> None:
        """Once the target has named a function none of the guesses has, ask the sidecar for that function's
        slots alone: they arrive while the target is still writing the arguments."""
        name = self.schema.scanner.name
        if self.followup is None:
            if name is None or name in self.hinted or name not in self.tool_names or self.schema.scanner.calls_done:
                return
            job = replace(self.job, request_id=f"{self.job.request_id}/{name}", function=name)
            self.followup = self.sidecar.submit(job, self.schema.tools)
            self.report.followup = FollowUpReport(name, self.followup is not None,
                                                  int(context.size) - self.prompt_len)
            return
        info = self.report.followup
        if info.arrived or self.followup is None:
            return
        payload = self.sidecar.poll(self.followup)
        if payload is not None:
            info.arrived, info.tokens_written_at_arrival = True, int(context.size) - self.prompt_len
            info.arguments = payload.best.arguments if payload.best else None
            info.compute_s = payload.compute_s
            self._add_guesses(payload.guesses[:1])

    # -- drafting ------------------------------------------------------------------------------------------
    def candidates(self, context: np.ndarray) -> list[Candidate]:
        payload = self._poll(context)
        if payload is None or not self.schema.active:
            return []
        schema = self.schema
        habits = schema.habits
        eos = habits.eos_id if habits.eos_id is not None else min(schema.eos_ids, default=None)
        opener = schema.scanner.opener
        closers = habits.closers_after(opener if opener is not None else self.job.opener)
        closer = closers[0][0] if closers else None
        pending = self._pending()
        out = []
        for rank, (guess, index) in enumerate(pending):
            text, whole = self._hint_rest(schema.scanner, guess)
            if not text:
                continue
            after = next((g for g, i in pending if i > index), None) if whole else None
            joint = self._joint() if after is not None and not after.pending else None
            end_of_turn = whole and closer is not None and after is None
            if joint is not None:
                text += joint + self.render.call(after.function, after.arguments, self.hinted[after.function])
            elif end_of_turn:
                text += closer
            ids = schema.encoder.continue_after(context, text)[: self.max_tokens]
            if end_of_turn and eos is not None and ids.size < self.max_tokens:
                ids = np.append(ids, eos)
            conf = self.confidence if rank == 0 or guess.function == schema.scanner.name else self.alternative_confidence
            if schema.scanner.name is not None and schema.scanner.name not in self.tool_names:
                conf *= ACCEPTANCE.misnamed_call_factor
            out.append(Candidate(ids, conf, ACCEPTANCE.hint_persistence))
        return out

    def rest_of_call(self, scan: CallScanner, guess: Guess) -> str | None:
        """The text from the current position to the end of the call if `guess` is right, or None where
        the hint cannot be aligned (another function, a value that already differs). A guess with slots pending
        stops where the first of them would begin, its key and the value's opener written."""
        return self._hint_rest(scan, guess)[0]

    def _hint_rest(self, scan: CallScanner, guess: Guess) -> tuple[str | None, bool]:
        """(rest_of_call, whether it runs to the call's end: no pending slot cut it short)."""
        tool = self.hinted.get(guess.function)
        if tool is None:
            return None, False
        if not guess.pending:
            return self._aligned(scan, guess, tool, guess.arguments), True
        # Each pending slot stands in as a marker value no real one contains; the text is cut at the first.
        hint = dict(guess.arguments) | {name: PENDING for name in guess.pending}
        text = self._aligned(scan, guess, tool, hint)
        if text is None:
            return None, False
        marker = self.render.value(PENDING)
        cut = text.find(marker)
        if cut < 0:
            return text, True
        before = text[:cut]  # through the pending slot's key, where the text gives it: its value's opener too
        name = next((p for p in guess.pending if before.endswith(self.render.key(p))), None)
        return before + self.render.value_open(tool.param(name) if name else None), False

    def _aligned(self, scan: CallScanner, guess: Guess, tool: Tool, hint: dict) -> str | None:
        """rest_of_call for the arguments `hint` (pending slots as markers)."""
        render = self.render
        full = render.call(guess.function, hint, tool)
        where = scan.position
        if where is CallPosition.OUTSIDE:
            written = scan.outside
            joint = self._joint() if scan.calls_done else None
            openers = [joint] if joint is not None else [] if scan.calls_done else (
                self.schema.habits.openers + list(self.schema.dialect.openers))
            for opener in openers:
                text = opener + full
                if text.startswith(written) and len(text) > len(written):
                    return text[len(written):]
            return None
        # A name that is no tool at all (the target misnamed the call) may still carry a guess's arguments.
        unknown = scan.name is not None and scan.name not in self.tool_names
        if scan.name is not None and scan.name != guess.function and not unknown:
            return None
        written = "".join(scan.call_chars)
        if full.startswith(written):
            return full[len(written):]
        # Re-align at the next key or value boundary of the arguments object.
        if not where.in_arguments or (scan.name != guess.function and not unknown):
            return None
        args = scan.stack[1]
        keys = set(args.keys)
        if where not in (CallPosition.ARG_KEY, CallPosition.ARG_KEY_NEXT, CallPosition.ARG_VALUE_DONE) and \
                args.keys and args.keys[-1] in guess.pending:  # at a value still being predicted
            return None
        if where is CallPosition.ARG_KEY:
            prefix = "".join(scan.buf)
            for p in tool.parameters:
                if p.name not in keys and p.name in hint and p.name.startswith(prefix):
                    item = render.item(p.name, hint[p.name])
                    return item[1 + len(prefix):] + render.slots(hint, tool, keys | {p.name})
            return None
        if where is CallPosition.ARG_KEY_NEXT:  # after `{` or `,`, and perhaps some whitespace
            want = render.style.ws("{" if not keys else ",", 2)
            return render.slots(hint, tool, keys, first_sep=want[len(scan.ws):] if want.startswith(scan.ws) else "")
        if where is CallPosition.ARG_VALUE_DONE:
            return render.slots(hint, tool, keys)
        if where is CallPosition.ARG_COLON:
            key = args.keys[-1] if args.keys else None
            if key not in hint:
                return None
            return ":" + render.style.ws(":", 2) + render.value(hint[key]) + render.slots(hint, tool, keys)
        # Inside a value: continue it only if what is written so far is the start of the hinted value.
        key = args.keys[-1] if args.keys else None
        if key not in hint:
            return None
        value = render.value(hint[key])
        if scan.arg_value_start is None:
            return render.style.ws(":", 2)[len(scan.ws):] + value + render.slots(hint, tool, keys)
        so_far = "".join(scan.call_chars[scan.arg_value_start:])
        if value.startswith(so_far) and len(value) > len(so_far):
            return value[len(so_far):] + render.slots(hint, tool, keys)
        return None


# The value a pending slot is rendered with, to find where its hint stops (private-use characters: no real value).
PENDING = "\ue000pending\ue001"


def slots_agreeing(guess: Guess, call: ToolCall) -> int:
    return sum(1 for k, v in guess.arguments.items() if k in call.arguments and same_value(v, call.arguments[k]))


def dialect_joint(dialect: Dialect) -> str | None:
    """The text `dialect` writes between two calls of one turn (None: it does not write them apart)."""
    call = ToolCall("f", {})
    one, two = dialect.render_json(call), dialect.render([call, call])
    start, end = two.find(one), two.rfind(one)
    return two[start + len(one):end] if 0 <= start < end else None


def speed_key(sidecar) -> str | None:
    """The key its job times are kept under across processes (None: a sidecar that has none, as tests' fakes)."""
    key = getattr(sidecar, "speed_key", None)
    return key() if callable(key) else None


class OoOSpecDrafter(MergedDrafter):
    """`oospec`: toolspec's drafters plus the out-of-order sidecar's hints, in one token tree."""

    name = "oospec"
    uses_sidecar = True  # without one it drafts as toolspec

    def __init__(self, sidecar=None, memory: CallMemory | None = None, cost: CostModel | None = None,
                 schedule: str = "cost", plan: SidecarSchedule | None = None):
        schema = SchemaDrafter()
        self.sidecar_drafter = SidecarDrafter(sidecar, schema=schema, schedule=schedule, plan=plan)
        super().__init__([schema, self.sidecar_drafter, RetrievalDrafter(memory), PromptLookupDrafter()], cost)

    @property
    def report(self) -> SidecarReport:
        return self.sidecar_drafter.report

    def idle_threads(self) -> int:
        return self.sidecar_drafter.idle_threads()
