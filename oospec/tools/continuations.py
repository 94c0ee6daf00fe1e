"""Which text the schema forces next in a tool call being written (`CallScanner`, oospec.tools.callscan).

`structure_continuations` lists the text that may come next where the schema leaves only a few choices
(openers, `"name"`, tool names, the arguments key, key names in schema order, quotes, braces, closers), each with
a confidence, and values the request makes likely (`ValueSource`: its spans, numbers, dates, values named for
an argument). Other values are left to the value drafters (prompt lookup, retrieval, sidecar hints).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from oospec.tools.callscan import ARGS_EXPECT, CALL_EXPECT, CallPosition, CallScanner, Frame, Habits
from oospec.tools.dialects import ARGS_KEYS, CALL_OPENERS
from oospec.tools.pasted import LABEL_JOINT, ShownTools
from oospec.tools.profile import DialectProfile
from oospec.tools.render import CallRenderer, to_json
from oospec.tools.schema import Param, Tool
from oospec.tools.valuesource import ValueSource


@dataclass(frozen=True)
class Continuation:
    text: str
    confidence: float  # rough chance the target writes all of it
    end_of_turn: bool = False  # the target's end-of-turn token follows the text


def structure_continuations(
    scan: CallScanner, tools: Sequence[Tool], habits: Habits, default_args_key: str, default_openers: Sequence[str],
    values: ValueSource | None = None, shown: ShownTools | None = None, profile: DialectProfile | None = None,
) -> list[Continuation]:
    """The text the schema makes likely next, most likely first; [] where only values can follow. `shown`: what
    the prompt's turns show of the tools, which the target may copy (oospec.tools.pasted), as often as the
    dialect's `profile` says (no copy is drafted without one)."""
    return _Continuations(scan, tools, habits, default_args_key, default_openers, values, shown,
                          profile).continuations()


# How often a whole value guessed before it begins is the value (the first guess, the second): measured against
# the gold calls of the items the sidecar trained on, every dataset together (1,231 string values;
# docs/results-history.md). Named for the argument: 81% / 30%; the request's dates for a date or time
# argument: 52% / 14%; the strings the user quoted: 15% / 9%.
NAMED_HITS = (0.8, 0.3)
DATE_HITS = (0.5, 0.15)
QUOTED_HITS = (0.15, 0.1)
NUMBER_HITS = (0.55, 0.2)  # see ValueSource.next_numbers
RUN_ON_VALUES = 2  # a guessed value's draft runs on through at most this many further named values


def _temporal(param: Param | None) -> bool:
    """The schema says this argument holds a date or time (by its name or description)."""
    return param is not None and re.search(r"date|time|\bday\b", f"{param.name} {param.description}", re.I) is not None


def likeliest(nexts: list[Continuation]) -> list[Continuation]:
    """The likeliest continuation, with the next ones that only lengthen it (the close, then the closer and the
    end of turn): one branch of the tree holds them all."""
    if not nexts:
        return []
    return [nexts[0]] + [c for c in nexts[1:] if c.text.startswith(nexts[0].text)]


class _Continuations:
    def __init__(self, scan, tools, habits, default_args_key, default_openers, values=None, shown=None,
                 profile=None):
        self.values = values
        profile = profile or DialectProfile("")
        # Each habit's share of the branch it leaves (0: not drafted).
        self.paste_hit = profile.pasted_schema.share if profile.pasted_schema else 0.0
        self.paste_on = profile.paste_continued.share if profile.paste_continued else 0.0
        self.label_hit = profile.listing_label.share if profile.listing_label else 0.0
        self.label_alone = profile.label_alone.share if profile.label_alone else 0.0
        self.pasted = shown.entries if shown is not None and self.paste_hit > 0 else {}
        self.label = shown.label if shown is not None and self.label_hit > 0 else None
        self.scan, self.tools, self.habits = scan, tools, habits
        self.style = habits.style
        self.args_key = scan.args_key or habits.args_key or default_args_key
        self.render = CallRenderer(self.style, self.args_key)
        self.openers = list(dict.fromkeys([*habits.openers, *default_openers, *CALL_OPENERS]))
        self.dialect_openers = default_openers
        self.by_name = {t.name: t for t in tools}

    # -- text pieces -------------------------------------------------------------------------------------------
    def key_value_open(self, param: Param, depth: int) -> str:
        return self.render.key(param.name, depth) + self.render.value_open(param)

    def args_body(self, tool: Tool) -> str:
        """From just after the arguments' `{`: the first key, or the closing braces if there are none."""
        if tool.parameters:
            return self.style.ws("{", 2) + self.key_value_open(tool.parameters[0], 2)
        return self.render.close()

    def args_rest(self, head: str, confidence: float) -> list[Continuation]:
        """`head`, which ends with the arguments' `{` of the named function, on to its first key and the values
        guessed for it (`head` alone while no name is known)."""
        tool = self.tool_named(self.scan.name)
        return self.opening(head + self.args_body(tool), tool, confidence) if tool is not None \
            else [Continuation(head, confidence)]

    def after_name(self, tool: Tool) -> str:
        return self.render.args_open() + self.args_body(tool)

    def guessed(self, text: str, param: Param | None, confidence: float, tool: Tool | None,
                done: Sequence[str] = ()) -> list[Continuation]:
        """`text`, which ends where `param`'s value begins, and the same run on through each whole value the
        request makes likely for it (`starts`) and on into what follows (`run_on`): one forward for key, value
        and the next key. `done`: the keys of `tool`'s call written before `param`."""
        out = [Continuation(text, confidence)]
        if not done and tool is not None and param is not None:
            out += self.paste_from_first(text, param, tool, confidence)
        starts = self.starts(param)
        if not starts:
            return out
        after = self.run_on(tool, (*done, param.name))
        return out + [Continuation(text + value + after, confidence * weight) for value, weight in starts]

    def starts(self, param: Param | None) -> list[tuple[str, float]]:
        """Whole values for `param` before it has begun (a string's with its closing quote), each with its chance
        relative to the text before. A string: the values the request gives it by name ("my password is
        pass123", {'token': 'a9s8'}), then the request's dates for a date or time argument, else the strings the
        user quoted. A number: the request's numbers after those the call has used (ValueSource.next_numbers)."""
        if param is None or self.values is None:
            return []
        opener = self.render.value_open(param)
        if param.type in ("number", "integer") and not opener:
            numbers = self.values.next_numbers("".join(self.scan.call_chars), limit=len(NUMBER_HITS))
            return list(zip(numbers, NUMBER_HITS))
        if opener != '"':
            return []
        named = self.values.named(param.name)[: len(NAMED_HITS)]
        temporal = _temporal(param)
        others = [v for v in (self.values.date_endings("") if temporal else self.values.quoted) if v not in named]
        hits = DATE_HITS if temporal else QUOTED_HITS
        return [(v + '"', w) for v, w in (*zip(named, NAMED_HITS), *zip(others, hits))]

    def tool_named(self, name: str | None) -> Tool | None:
        """The tool a call's name means: the tool of that name; for the listing's label written as the name, the
        tool after it ("Name: QueryStock"), or alone the tool the dialogue points to (oospec.tools.toolprior)."""
        tool = self.by_name.get(name or "")
        if tool is not None or not self.label or not name or not name.startswith(self.label):
            return tool
        rest = name[len(self.label) :]
        if not rest:
            return self.likeliest_tool()
        return self.by_name.get(rest[1:].strip()) if rest.startswith(":") else None

    def likeliest_tool(self) -> Tool | None:
        if self.values is None or not self.tools:
            return self.tools[0] if self.tools else None
        weights = self.values.tool_weights(self.tools)
        return max(self.tools, key=lambda t: weights.get(t.name, 0.0))

    def labelled_names(self, prefix: str) -> list[Continuation]:
        """The listing's label written as the name (`label_hit` where nothing is written yet): alone, with the
        arguments of the tool the dialogue points to, or followed by each tool's name."""
        label = self.label
        if not label or not (label.startswith(prefix) or prefix.startswith(label)):
            return []
        hit = self.label_hit if len(prefix) < len(label) else 1.0
        out = []
        if len(prefix) <= len(label):
            tool = self.likeliest_tool()
            if tool is not None:
                out += self.opening(label[len(prefix) :] + '"' + self.after_name(tool), tool,
                                    0.9 * hit * self.label_alone)
        written = prefix[len(label) :] if len(prefix) > len(label) else ""
        head = label[len(prefix) :] if len(prefix) < len(label) else ""
        prior = self.values.tool_weights(self.tools) if self.values is not None else {}
        for t in self.tools:
            full = LABEL_JOINT + t.name
            if full.startswith(written) and full != written:
                share = (1 - self.label_alone) * prior.get(t.name, 1.0 / len(self.tools))
                out += self.opening(head + full[len(written) :] + '"' + self.after_name(t), t, 0.9 * hit * share)
        return out

    # -- the schema pasted as the values ---------------------------------------------------------------------------
    def paste(self, tool: Tool) -> str | None:
        """`tool`'s arguments written as the prompt's schema entries, from just after the arguments' `{` through
        the call's closing braces; None where the prompt does not show them."""
        entries = self.pasted.get(tool.name)
        return self.render.slots(entries, tool, first_sep=self.style.ws("{", 2)) if entries else None

    def paste_from_first(self, text: str, param: Param, tool: Tool, confidence: float) -> list[Continuation]:
        """`text`, which ends at the first argument's value (its opener included), with the schema pasted from
        there instead: a side branch (`paste_hit`)."""
        pasted = self.paste(tool)
        opener = self.render.value_open(param)
        if pasted is None or param is not tool.parameters[0] or not text.endswith(opener):
            return []
        lead = self.style.ws("{", 2) + self.render.key(param.name, 2)
        return [Continuation(text[: len(text) - len(opener)] + pasted[len(lead) :], confidence * self.paste_hit)]

    def mid_paste(self) -> list[Continuation]:
        """Once the target has begun pasting the schema as the first value, the rest of the paste (`paste_on`)."""
        tool = self.tool_named(self.scan.name)
        pasted = self.paste(tool) if tool is not None and tool.parameters and self.scan.depth >= 2 else None
        if pasted is None:
            return []
        written = "".join(self.scan.call_chars)
        opened = re.search(re.escape(to_json(self.args_key)) + r":\s*\{", written)
        args = written[opened.end() :] if opened else ""
        lead = self.style.ws("{", 2) + self.render.key(tool.parameters[0].name, 2)
        if len(args) <= len(lead) or not pasted.startswith(args) or len(pasted) == len(args):
            return []
        rest = pasted[len(args) :]
        return [Continuation(rest, self.paste_on)] + [
            Continuation(rest + c.text, c.confidence * self.paste_on, True) for c in self.closings(1.0)]

    def run_on(self, tool: Tool | None, done: Sequence[str], depth: int = 0) -> str:
        """What follows a guessed value of `tool`'s call whose keys `done` are written: the next key in schema order,
        through the value the request names for it while there is one (up to RUN_ON_VALUES), or the close."""
        if tool is None:
            return ""
        remaining = [p for p in tool.parameters if p.name not in done]
        if not remaining:
            return self.render.close()
        param = remaining[0]
        text = "," + self.style.ws(",", 2) + self.key_value_open(param, 2)
        named = self.values.named(param.name) if self.values is not None and depth < RUN_ON_VALUES \
            and self.render.value_open(param) == '"' else []
        return text + named[0] + '"' + self.run_on(tool, (*done, param.name), depth + 1) if named else text

    def opening(self, text: str, tool: Tool, confidence: float) -> list[Continuation]:
        """`text`, which ends at `tool`'s first argument's value (`args_body`), with that value guessed."""
        return self.guessed(text, tool.parameters[0] if tool.parameters else None, confidence, tool)

    def closings(self, confidence: float) -> list[Continuation]:
        """After the last brace: the target's usual closer and end of turn, if it has shown one."""
        return [Continuation(closer, confidence * (0.8 if learned else 0.5), True)
                for closer, learned in self.habits.closers_after(self.scan.opener)]

    # -- states ------------------------------------------------------------------------------------------------
    def continuations(self) -> list[Continuation]:
        pasting = self.mid_paste()
        return pasting + self.by_position() if pasting else self.by_position()

    def by_position(self) -> list[Continuation]:
        scan = self.scan
        where = scan.position
        if where is CallPosition.OUTSIDE:
            return self.outside()
        frame = scan.stack[-1]
        if where in (CallPosition.NAME, CallPosition.CALL_KEY, CallPosition.ARG_KEY, CallPosition.ARG_STRING):
            return self.in_string(frame, where)
        if where in CALL_EXPECT.values():
            return self.in_call(frame, where)
        if where in ARGS_EXPECT.values():
            return self.in_args(frame, where)
        if where is CallPosition.ARG_NESTED:
            return self.in_list(frame)
        return []  # where the schema says nothing

    def outside(self) -> list[Continuation]:
        written = self.scan.outside
        out = []
        if self.scan.calls_done == 0:
            # What is written may be an opener begun, or one begun after a fence (Qwen2.5 writes ```<tool_call>).
            fence = written.rfind("```")
            begun = [(written, 1.0)] + ([(written[fence + 3 :], 0.5)] if fence >= 0 else [])
            seen = set()
            for opener in self.openers:
                full = opener + self.render.start()
                known = 0.9 if opener in self.habits.openers else 0.4 if opener in self.dialect_openers else 0.2
                for head, weight in begun:
                    rest = full[len(head) :]
                    if full.startswith(head) and rest and rest not in seen:
                        seen.add(rest)
                        out.append(Continuation(rest, known * weight))
                        out += [Continuation(rest + c.text, c.confidence * known * weight) for c in self.names("")]
            return out
        for closer, learned in self.habits.closers_after(self.scan.opener):
            if closer.startswith(written):
                out.append(Continuation(closer[len(written) :], 0.8 if learned else 0.5, True))
        return out

    def in_string(self, frame: Frame, where: CallPosition) -> list[Continuation]:
        prefix = "".join(self.scan.buf)
        if where is CallPosition.NAME:
            return self.names(prefix)
        if where is CallPosition.CALL_KEY:
            key = "name" if not frame.keys else self.args_key
            if not key.startswith(prefix):
                return []
            head = key[len(prefix) :] + '":' + self.style.ws(":", 1)
            return [Continuation(head + '"', 0.9)] if key == "name" else self.args_rest(head + "{", 0.9)
        tool = self.tool_named(self.scan.name)
        if tool is None:
            return []
        if where is CallPosition.ARG_KEY:
            remaining = [p for p in tool.parameters if p.name not in frame.keys and p.name.startswith(prefix)]
            return [c for i, p in enumerate(remaining) for c in self.guessed(
                p.name[len(prefix) :] + '":' + self.style.ws(":", 2) + self.render.value_open(p), p,
                0.9 if i == 0 else 0.3, tool, frame.keys)]
        param = self.param(tool, frame.keys[-1] if frame.keys else "")
        after = self.after_value(tool, frame, "")
        nexts = after[:2]
        first = likeliest(after) or [Continuation("", 1.0)]
        if param is not None and param.enum:
            options = [str(v) for v in param.enum if isinstance(v, str) and str(v).startswith(prefix)]
            return [Continuation(v[len(prefix) :] + '"' + nxt.text, 0.6 * nxt.confidence, nxt.end_of_turn)
                    for v in options for nxt in first]
        if not prefix:  # the value has not begun: what the request gives this argument by name
            return self.guessed("", param, 0.9, tool, frame.keys[:-1])[1:]
        out = []
        spans = self.values.endings(prefix) if self.values else []
        dates = self.values.date_endings(prefix) if self.values else []
        # A value begun with a digit, or one the schema calls a date or time, is likelier one of the request's
        # dates or times as an ISO value ("2023" on to "-12-15 14:00:00") than a span copied as written.
        rests = dates + spans if prefix[:1].isdigit() or _temporal(param) else spans + dates
        for i, rest in enumerate(dict.fromkeys(rests)):
            if rest:
                conf = 0.5 / (1 + i)
                out += [Continuation(rest + '"' + nxt.text, conf * nxt.confidence, nxt.end_of_turn) for nxt in first]
        # The value may also end right here: cheap as a side branch, right whenever the next token is `"`, and
        # likely where what is written is a whole span of the request (unless it begins one of its dates).
        end = 0.6 if self.values is not None and self.values.is_span(prefix) and not dates else 0.25
        out += [Continuation('"' + nxt.text, end * nxt.confidence, nxt.end_of_turn)
                for nxt in likeliest(after) + nexts[1:]]
        return out

    def names(self, prefix: str) -> list[Continuation]:
        """The rest of each tool name that starts with `prefix`, through to the first argument's key, each as likely
        as the dialogue makes it (oospec.tools.toolprior)."""
        names = [t for t in self.tools if t.name.startswith(prefix)]
        prior = self.values.tool_weights(self.tools) if self.values is not None else {}
        total = sum(prior.get(t.name, 1.0) for t in names)
        return [c for t in names for c in self.opening(t.name[len(prefix) :] + '"' + self.after_name(t), t,
                                                        0.9 * prior.get(t.name, 1.0) / total)] \
            + self.labelled_names(prefix)

    def in_call(self, frame: Frame, where: CallPosition) -> list[Continuation]:
        scan = self.scan
        if where is CallPosition.CALL_KEY_NEXT:
            if not frame.keys:
                head = self.pending_ws("{", 1) + '"name":' + self.style.ws(":", 1) + '"'
                return [Continuation(head, 0.9)] + [Continuation(head + c.text, c.confidence) for c in self.names("")]
            return self.args_rest(self.pending_ws(",", 1) + f'"{self.args_key}":' + self.style.ws(":", 1) + "{", 0.9)
        if where is CallPosition.CALL_COLON:
            key = frame.keys[-1] if frame.keys else ""
            head = ":" + self.style.ws(":", 1)
            return [Continuation(head + '"', 0.9)] if key == "name" else self.args_rest(head + "{", 0.9)
        if where is CallPosition.CALL_VALUE_NEXT:
            key = frame.keys[-1] if frame.keys else ""
            if key == "name":
                ws = self.pending_ws(":", 1) + '"'
                return [Continuation(ws, 0.9)] + [Continuation(ws + c.text, c.confidence) for c in self.names("")]
            tool = self.tool_named(scan.name)
            if key in ARGS_KEYS and tool is not None:
                return self.opening(self.pending_ws(":", 1) + "{" + self.args_body(tool), tool, 0.9)
            return []
        # CALL_VALUE_DONE: after the name, or after the arguments object
        tool = self.tool_named(scan.name)
        if frame.keys and frame.keys[-1] == "name" and tool is not None:
            return self.opening(self.after_name(tool), tool, 0.9)
        if frame.keys and frame.keys[-1] in ARGS_KEYS:
            close = self.pending_close(1) + "}"
            return [Continuation(close, 0.9)] + [Continuation(close + c.text, c.confidence, True)
                                                 for c in self.closings(0.9)]
        return []

    def in_args(self, frame: Frame, where: CallPosition) -> list[Continuation]:
        tool = self.tool_named(self.scan.name)
        if tool is None:
            return []
        if where is CallPosition.ARG_KEY_NEXT:
            remaining = [p for p in tool.parameters if p.name not in frame.keys]
            ws = self.pending_ws("{" if not frame.keys else ",", 2)
            return [c for i, p in enumerate(remaining[:3])
                    for c in self.guessed(ws + self.key_value_open(p, 2), p, 0.9 if i == 0 else 0.3, tool, frame.keys)]
        if where is CallPosition.ARG_COLON:
            param = self.param(tool, frame.keys[-1] if frame.keys else "")
            return self.guessed(":" + self.style.ws(":", 2) + self.render.value_open(param), param, 0.9, tool,
                                frame.keys[:-1])
        if where is CallPosition.ARG_VALUE:
            param = self.param(tool, frame.keys[-1] if frame.keys else "")
            if self.scan.scalar:
                if param is not None and param.type == "boolean":
                    return [Continuation(word[len(self.scan.scalar) :], 0.9) for word in ("true", "false")
                            if word.startswith(self.scan.scalar) and word != self.scan.scalar]
                return self.number_rest(tool, frame, self.scan.scalar)
            if param is not None and param.type == "boolean":
                return [Continuation(self.pending_ws(":", 2) + w, 0.45) for w in ("true", "false")]
            head = self.pending_ws(":", 2) + self.render.value_open(param)
            guesses = self.guessed(head, param, 0.9, tool, frame.keys[:-1])
            return guesses if head else guesses[1:]
        return self.after_value(tool, frame, self.scan.ws)

    def in_list(self, frame: Frame) -> list[Continuation]:
        """In an argument's array of strings (["John Smith", "Jane Doe"]) or numbers ([0.8, 0.7]): items copied from
        the request, then another item or the array's end and what follows the argument."""
        scan, args = self.scan, self.scan.stack[1]
        tool = self.tool_named(scan.name)
        param = self.param(tool, args.keys[-1]) if tool is not None and args.keys else None
        if len(scan.stack) != 3 or param is None or param.items is None:
            return []
        ends = [Continuation("]" + c.text, c.confidence, c.end_of_turn)
                for c in likeliest(self.after_value(tool, args, ""))]
        if param.items.type in ("number", "integer"):
            return self.number_items(frame, ends)
        if param.items.type != "string":
            return []
        nexts = [Continuation("," + self.style.after.get((",", 3), " ") + '"', 0.6)] + ends
        if not scan.in_string:
            return [] if scan.scalar else [Continuation('"', 0.9)] if frame.expect == "value" else nexts
        prefix = "".join(scan.buf)
        rests = self.values.endings(prefix) if self.values is not None and prefix else []
        out = [Continuation(rest + '"' + c.text, 0.5 / (1 + i) * c.confidence, c.end_of_turn)
               for i, rest in enumerate(rests) if rest for c in nexts[:2]]
        end = 0.6 if self.values is not None and self.values.is_span(prefix) else 0.25
        return out + [Continuation('"' + c.text, end * c.confidence, c.end_of_turn) for c in nexts[:2]]

    def number_items(self, frame: Frame, ends: list[Continuation]) -> list[Continuation]:
        """In an array of numbers: the rest of a request number an item begins, then the request's next number as
        the next item (ValueSource.next_numbers), another item, or the array's end (`ends`)."""
        scan = self.scan
        if scan.in_string or self.values is None or (not scan.scalar and frame.expect != "comma"):
            return []  # an item not begun: nothing says which
        sep = "," + self.style.after.get((",", 3), " ")
        call = "".join(scan.call_chars)
        before = call[: len(call) - len(scan.scalar)]  # the call up to the item being written

        def after(item: str) -> list[Continuation]:
            # The request names a number after this one: likely the next item; none: likely the list's end.
            following = self.values.next_numbers(before + item, limit=1)
            end = 0.4 if following else 0.6
            return [Continuation(sep + n, 0.5) for n in following] + [Continuation(sep, 0.25)] \
                + [Continuation(e.text, end * e.confidence, e.end_of_turn) for e in ends]

        written = scan.scalar
        rests = self.values.number_endings(written)[::-1] if written else []  # in the request's order
        out = [Continuation(rest + c.text, 0.5 / (1 + i) * c.confidence, c.end_of_turn)
               for i, rest in enumerate(rests) if rest for c in after(written + rest)[:2]]
        end = 0.6 if "" in rests or not written else 0.2
        return out + [Continuation(c.text, end * c.confidence, c.end_of_turn) for c in after(written)]

    def number_rest(self, tool: Tool, frame: Frame, written: str) -> list[Continuation]:
        """Inside a number (or literal): the rest of a request number it begins, then what follows the value;
        or the value ending here (likely where it is one of the request's numbers whole)."""
        after = self.after_value(tool, frame, "")
        first = likeliest(after)
        rests = self.values.number_endings(written) if self.values is not None else []
        out = [Continuation(rest + nxt.text, 0.5 / (1 + i) * nxt.confidence, nxt.end_of_turn)
               for i, rest in enumerate(rests) if rest for nxt in first]
        end = 0.6 if "" in rests else 0.2
        return out + [Continuation(c.text, end * c.confidence, c.end_of_turn) for c in first + after[1:2]]

    def after_value(self, tool: Tool, frame: Frame, written_ws: str) -> list[Continuation]:
        """After an argument's value: the next key in schema order, or the end of the call; last, each next key
        run on through the values guessed for it (see `guessed`), which `likeliest` keeps with their key."""
        remaining = [p for p in tool.parameters if p.name not in frame.keys]
        required_left = any(p.name in tool.required for p in remaining)
        keyed = [self.guessed("," + self.style.ws(",", 2) + self.key_value_open(p, 2), p, 0.8 if i == 0 else 0.25,
                              tool, frame.keys)
                 for i, p in enumerate(remaining[:2])]
        nexts = [k[0] for k in keyed]
        extra = [c for k in keyed for c in k[1:]]
        close_text = self.render.close()
        close_text = close_text[len(written_ws) :] if close_text.startswith(written_ws) else close_text
        close = [Continuation(close_text, 0.85)] + [Continuation(close_text + c.text, c.confidence, True)
                                                    for c in self.closings(0.85)]
        if not remaining:
            return close
        return (nexts + close if required_left or not tool.required else nexts[:1] + close + nexts[1:]) + extra

    # -- helpers -----------------------------------------------------------------------------------------------
    def pending_ws(self, punct: str, depth: int) -> str:
        """The learned whitespace after `punct`, less what the target has already written of it."""
        want, have = self.style.ws(punct, depth), self.scan.ws
        if not want.startswith(have) and have.startswith("\n") and not have.strip(" \n"):
            want = "\n" + "  " * depth  # a newline where none was learned: pretty-printed, likeliest by 2 spaces
        return want[len(have) :] if want.startswith(have) else ""

    def pending_close(self, depth: int) -> str:
        want, have = self.style.close(depth), self.scan.ws
        return want[len(have) :] if want.startswith(have) else ""

    @staticmethod
    def param(tool: Tool, name: str) -> Param | None:
        return next((p for p in tool.parameters if p.name == name), None)
