"""Follow a JSON tool call as the target writes it, and say which text the schema forces next.

`CallScanner` consumes the target's output text a character at a time (incrementally, never re-reading) and
tracks where it is: outside a call, in the function name, in a key, in a value, between arguments. Where strings
and brackets open and close it takes from the one JSON scanner (`tools/jsonscan.py`).
`structure_continuations` then lists the text that may come next when the schema leaves only a few
choices (openers, `"name"`, tool names, the arguments key, key names in schema order, quotes, braces,
closers), each with a confidence. Values are left to the value drafters (prompt lookup, retrieval,
sidecar hints).

Whitespace is learned, not assumed: the scanner records what the target writes after `{`, `,`, `:` and
before `}` at each depth, so a target that pretty-prints gets pretty-printed drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from oospec.tools.dialects import ARGS_KEYS, CALL_OPENERS, CLOSERS
from oospec.tools.jsonscan import CLOSE, OPEN, STRING, STRING_END, STRING_START, JsonScanner
from oospec.tools.render import CallRenderer, Style
from oospec.tools.schema import Param, Tool
from oospec.tools.valuesource import ValueSource


@dataclass
class Habits:
    """What this target tends to write around its calls, learned from finished requests."""

    style: Style = field(default_factory=Style)
    openers: list[str] = field(default_factory=list)  # text before the first call, most recent first
    closers: list[str] = field(default_factory=list)  # text after the last call, before end-of-turn
    joints: list[str] = field(default_factory=list)  # text between two calls of one turn, most recent first
    args_key: str | None = None
    eos_id: int | None = None

    def closers_after(self, opener: str | None) -> list[tuple[str, bool]]:
        """[(closer, learned)]: what this target writes after its last call, or, before it has finished a
        request, what the opener it wrote calls for."""
        if self.closers:
            return [(c, True) for c in self.closers[:2]]
        default = CLOSERS.get(opener or "")
        if default is None and opener and "```" in opener:  # a known opener inside a fence: both close
            inner = CLOSERS.get(opener.rpartition("```")[2])
            default = inner + "\n```" if inner is not None else None
        return [(default, False)] if default is not None else []

    def remember(self, items: list[str], value: str, keep: int = 3) -> None:
        if value in items:
            items.remove(value)
        items.insert(0, value)
        del items[keep:]


@dataclass
class Frame:
    role: str  # "call" (the call object), "args" (its arguments), "value" (anything nested in a value)
    bracket: str  # "{" or "["
    expect: str  # "key", "colon", "value" or "comma"
    keys: list[str] = field(default_factory=list)


class CallPosition(Enum):
    """Where the target is in the call it writes: the one reading of the scanner's stack that the drafters match
    on (the schema's continuations here, the sidecar's hint alignment in oospec.drafters.sidecar). A call is
    `{"name": "<function>", "<arguments key>": {"<key>": <value>, ...}}`; each state names what comes next."""

    OUTSIDE = "outside"  # no call open: before the first call, between two calls, after the last
    CALL_KEY_NEXT = "call key next"  # in the call object where a key begins (after `{` or `,`)
    CALL_KEY = "call key"  # inside a key string of the call object (`name`, the arguments key)
    CALL_COLON = "call colon"  # after a key of the call object
    CALL_VALUE_NEXT = "call value next"  # after the colon of a call key (the name's `"` or the arguments' `{`)
    NAME = "name"  # inside the function name
    CALL_VALUE_DONE = "call value done"  # after the name or the arguments object: `,` or `}` next
    ARG_KEY_NEXT = "argument key next"  # in the arguments where a key begins (after `{` or `,`)
    ARG_KEY = "argument key"  # inside an argument's key
    ARG_COLON = "argument colon"  # after an argument's key
    ARG_VALUE = "argument value"  # where an argument's value begins, or inside a number or literal
    ARG_STRING = "argument string"  # inside an argument's string value
    ARG_NESTED = "argument nested"  # inside an object or array of an argument's value
    ARG_VALUE_DONE = "argument value done"  # after an argument's value: `,` or `}` next
    OTHER = "other"  # where the schema says nothing: a string of another call key, an object not the arguments

    @property
    def in_arguments(self) -> bool:
        return self in _IN_ARGUMENTS


_IN_ARGUMENTS = frozenset({CallPosition.ARG_KEY_NEXT, CallPosition.ARG_KEY, CallPosition.ARG_COLON,
                           CallPosition.ARG_VALUE, CallPosition.ARG_STRING, CallPosition.ARG_NESTED,
                           CallPosition.ARG_VALUE_DONE})
# A frame's `expect` to the position it stands for, in the call object and at the top of its arguments.
_CALL_EXPECT = {"key": CallPosition.CALL_KEY_NEXT, "colon": CallPosition.CALL_COLON,
                "value": CallPosition.CALL_VALUE_NEXT, "comma": CallPosition.CALL_VALUE_DONE}
_ARGS_EXPECT = {"key": CallPosition.ARG_KEY_NEXT, "colon": CallPosition.ARG_COLON,
                "value": CallPosition.ARG_VALUE, "comma": CallPosition.ARG_VALUE_DONE}
_CALL_STRINGS = {"name": CallPosition.NAME, "key": CallPosition.CALL_KEY}  # a string's role in the call object


class CallScanner:
    def __init__(self, style: Style):
        self.style = style
        self.stack: list[Frame] = []
        self.calls_done = 0
        self.outside = ""  # text since the last call ended (or since the output began)
        self.opener: str | None = None  # text before the first call
        self.joint: str | None = None  # text between the last two calls (None: fewer than two so far)
        self.finished: list[str] = []  # each closed call object's text, in order
        self.name: str | None = None  # function name of the call being written
        self.args_key: str | None = None
        self.json = JsonScanner()  # strings and brackets of the call being written
        self.string_role = ""
        self.buf: list[str] = []
        self.scalar = ""
        self.ws = ""
        self.last_punct = ""
        self.call_chars: list[str] = []  # the call being written, from its `{` (what hints align against)
        self.arg_value_start: int | None = None  # index in call_chars where the current argument value began

    @property
    def depth(self) -> int:
        return len(self.stack)

    @property
    def in_string(self) -> bool:
        return self.json.in_string

    @property
    def position(self) -> CallPosition:
        """Where the target is in the call (see CallPosition)."""
        stack = self.stack
        if not stack:
            return CallPosition.OUTSIDE
        if len(stack) == 1:
            if not self.in_string:
                return _CALL_EXPECT[stack[0].expect]
            return _CALL_STRINGS.get(self.string_role, CallPosition.OTHER)
        if stack[1].role != "args":
            return CallPosition.OTHER
        if len(stack) > 2:
            return CallPosition.ARG_NESTED
        if self.in_string:
            return CallPosition.ARG_KEY if self.string_role == "key" else CallPosition.ARG_STRING
        return _ARGS_EXPECT[stack[1].expect]

    def feed(self, text: str) -> None:
        for ch in text:
            self._feed_char(ch)

    def _feed_char(self, ch: str) -> None:
        if not self.stack:
            if ch == "{":
                if self.calls_done == 0:
                    self.opener = self.outside
                else:
                    self.joint = self.outside
                self.outside = ""
                self.name = None
                self.call_chars = ["{"]
                self.arg_value_start = None
                self.json = JsonScanner()
                self.json.push(ch)
                self.stack.append(Frame("call", "{", "key"))
                self.last_punct, self.ws = "{", ""
            else:
                self.outside += ch
            return
        self.call_chars.append(ch)
        kind = self.json.push(ch)
        if kind == STRING:
            self.buf.append(ch)
            return
        if kind == STRING_END:
            self._end_string()
            return
        if ch in " \t\r\n":
            if self.scalar:
                self._end_scalar()
            self.ws += ch
            return
        frame = self.stack[-1]
        # First visible character after whitespace: learn what this target writes there.
        if kind == CLOSE:
            self.style.learn_close(self.depth, self.ws)
        elif self.last_punct:
            self.style.learn_after(self.last_punct, self.depth, self.ws, in_object=frame.bracket == "{")
        self.last_punct = ""
        self.ws = ""
        if frame.role == "args" and frame.expect == "value" and self.arg_value_start is None:
            self.arg_value_start = len(self.call_chars) - 1
        elif frame.role == "args" and frame.expect != "value":
            self.arg_value_start = None
        if self.scalar and ch in ",}]":
            self._end_scalar()
        if kind == STRING_START:
            if frame.expect == "key":
                self.string_role = "key"
            elif frame.expect == "value" and frame.role == "call" and frame.keys and frame.keys[-1] == "name":
                self.string_role = "name"
            else:
                self.string_role = "value"
            self.buf = []
        elif ch == ":":
            frame.expect = "value"
            self.last_punct = ":"
        elif ch == ",":
            frame.expect = "key" if frame.bracket == "{" else "value"
            self.last_punct = ","
        elif kind == OPEN:
            is_args = frame.role == "call" and frame.keys and frame.keys[-1] in ARGS_KEYS and ch == "{"
            if is_args:
                self.args_key = frame.keys[-1]
            self.stack.append(Frame("args" if is_args else "value", ch, "key" if ch == "{" else "value"))
            self.last_punct = "{" if ch == "{" else ""
        elif kind == CLOSE:
            self.stack.pop()
            if self.stack:
                self.stack[-1].expect = "comma"
            else:
                self.calls_done += 1
                self.finished.append("".join(self.call_chars))
                self.outside = ""
        else:
            self.scalar += ch

    def _end_string(self) -> None:
        frame = self.stack[-1]
        text = "".join(self.buf)
        if self.string_role == "key":
            frame.keys.append(text)
            frame.expect = "colon"
        else:
            if self.string_role == "name":
                self.name = text
            frame.expect = "comma"

    def _end_scalar(self) -> None:
        self.scalar = ""
        self.stack[-1].expect = "comma"


@dataclass(frozen=True)
class Continuation:
    text: str
    confidence: float  # rough chance the target writes all of it
    end_of_turn: bool = False  # the target's end-of-turn token follows the text


def structure_continuations(
    scan: CallScanner, tools: Sequence[Tool], habits: Habits, default_args_key: str, default_openers: Sequence[str],
    values: ValueSource | None = None,
) -> list[Continuation]:
    """The text the schema makes likely next, most likely first; [] where only values can follow."""
    return _Continuations(scan, tools, habits, default_args_key, default_openers, values).continuations()


def likeliest(nexts: list[Continuation]) -> list[Continuation]:
    """The likeliest continuation, with the next ones that only lengthen it (the close, then the closer and the
    end of turn): one branch of the tree holds them all."""
    if not nexts:
        return []
    return [nexts[0]] + [c for c in nexts[1:] if c.text.startswith(nexts[0].text)]


class _Continuations:
    def __init__(self, scan, tools, habits, default_args_key, default_openers, values=None):
        self.values = values
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

    def args_rest(self) -> str:
        """After the arguments' `{` of the named function: its first key (nothing while no name is known)."""
        tool = self.by_name.get(self.scan.name or "")
        return self.args_body(tool) if tool is not None else ""

    def after_name(self, tool: Tool) -> str:
        return self.render.args_open() + self.args_body(tool)

    def guessed(self, text: str, param: Param | None, confidence: float) -> list[Continuation]:
        """`text`, which ends where `param`'s string value begins, and the same run on through each value the
        request gives that argument by name ("my password is pass123"), closed: one forward for key and value."""
        out = [Continuation(text, confidence)]
        if param is None or self.values is None or self.render.value_open(param) != '"':
            return out
        return out + [Continuation(text + value + '"', confidence * 0.5 / (1 + i))
                      for i, value in enumerate(self.values.named(param.name)[:2])]

    def closings(self, confidence: float) -> list[Continuation]:
        """After the last brace: the target's usual closer and end of turn, if it has shown one."""
        return [Continuation(closer, confidence * (0.8 if learned else 0.5), True)
                for closer, learned in self.habits.closers_after(self.scan.opener)]

    # -- states ------------------------------------------------------------------------------------------------
    def continuations(self) -> list[Continuation]:
        scan = self.scan
        where = scan.position
        if where is CallPosition.OUTSIDE:
            return self.outside()
        frame = scan.stack[-1]
        if where in (CallPosition.NAME, CallPosition.CALL_KEY, CallPosition.ARG_KEY, CallPosition.ARG_STRING):
            return self.in_string(frame, where)
        if where in _CALL_EXPECT.values():
            return self.in_call(frame, where)
        if where in _ARGS_EXPECT.values():
            return self.in_args(frame, where)
        return []  # nested in a value, or where the schema says nothing

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
            keys = ["name"] if not frame.keys else [self.args_key]
            return [Continuation(k[len(prefix) :] + '":' + self.style.ws(":", 1)
                                 + ('"' if k == "name" else "{" + self.args_rest()), 0.9)
                    for k in keys if k.startswith(prefix)]
        tool = self.by_name.get(self.scan.name or "")
        if tool is None:
            return []
        if where is CallPosition.ARG_KEY:
            remaining = [p for p in tool.parameters if p.name not in frame.keys and p.name.startswith(prefix)]
            return [c for i, p in enumerate(remaining) for c in self.guessed(
                p.name[len(prefix) :] + '":' + self.style.ws(":", 2) + self.render.value_open(p), p,
                0.9 if i == 0 else 0.3)]
        param = self.param(tool, frame.keys[-1] if frame.keys else "")
        nexts = self.after_value(tool, frame, "")[:2]
        first = likeliest(nexts) or [Continuation("", 1.0)]
        if param is not None and param.enum:
            options = [str(v) for v in param.enum if isinstance(v, str) and str(v).startswith(prefix)]
            return [Continuation(v[len(prefix) :] + '"' + nxt.text, 0.6 * nxt.confidence, nxt.end_of_turn)
                    for v in options for nxt in first]
        if not prefix:  # the value has not begun: what the request gives this argument by name
            return self.guessed("", param, 0.9)[1:]
        out = []
        rests = self.values.endings(prefix) + self.values.date_endings(prefix) if self.values else []
        for i, rest in enumerate(dict.fromkeys(rests)):
            if rest:
                conf = 0.5 / (1 + i)
                out += [Continuation(rest + '"' + nxt.text, conf * nxt.confidence, nxt.end_of_turn) for nxt in first]
        # The value may also end right here: cheap as a side branch, right whenever the next token is `"`, and
        # likely where what is written is a whole span of the request.
        end = 0.6 if self.values is not None and self.values.is_span(prefix) else 0.25
        out += [Continuation('"' + nxt.text, end * nxt.confidence, nxt.end_of_turn) for nxt in nexts]
        return out

    def names(self, prefix: str) -> list[Continuation]:
        """The rest of each tool name that starts with `prefix`, through to the first argument's key."""
        names = [t for t in self.tools if t.name.startswith(prefix)]
        conf = 0.9 / max(1, len(names)) ** 0.5
        return [c for t in names for c in self.guessed(t.name[len(prefix) :] + '"' + self.after_name(t),
                                                        t.parameters[0] if t.parameters else None, conf)]

    def in_call(self, frame: Frame, where: CallPosition) -> list[Continuation]:
        scan = self.scan
        if where is CallPosition.CALL_KEY_NEXT:
            if not frame.keys:
                head = self.pending_ws("{", 1) + '"name":' + self.style.ws(":", 1) + '"'
                return [Continuation(head, 0.9)] + [Continuation(head + c.text, c.confidence) for c in self.names("")]
            return [Continuation(self.pending_ws(",", 1) + f'"{self.args_key}":' + self.style.ws(":", 1) + "{"
                                 + self.args_rest(), 0.9)]
        if where is CallPosition.CALL_COLON:
            key = frame.keys[-1] if frame.keys else ""
            return [Continuation(":" + self.style.ws(":", 1) + ('"' if key == "name" else "{" + self.args_rest()),
                                 0.9)]
        if where is CallPosition.CALL_VALUE_NEXT:
            key = frame.keys[-1] if frame.keys else ""
            if key == "name":
                ws = self.pending_ws(":", 1) + '"'
                return [Continuation(ws, 0.9)] + [Continuation(ws + c.text, c.confidence) for c in self.names("")]
            tool = self.by_name.get(scan.name or "")
            if key in ARGS_KEYS and tool is not None:
                return [Continuation(self.pending_ws(":", 1) + "{" + self.args_body(tool), 0.9)]
            return []
        # CALL_VALUE_DONE: after the name, or after the arguments object
        tool = self.by_name.get(scan.name or "")
        if frame.keys and frame.keys[-1] == "name" and tool is not None:
            return [Continuation(self.after_name(tool), 0.9)]
        if frame.keys and frame.keys[-1] in ARGS_KEYS:
            close = self.pending_close(1) + "}"
            return [Continuation(close, 0.9)] + [Continuation(close + c.text, c.confidence, True)
                                                 for c in self.closings(0.9)]
        return []

    def in_args(self, frame: Frame, where: CallPosition) -> list[Continuation]:
        tool = self.by_name.get(self.scan.name or "")
        if tool is None:
            return []
        if where is CallPosition.ARG_KEY_NEXT:
            remaining = [p for p in tool.parameters if p.name not in frame.keys]
            ws = self.pending_ws("{" if not frame.keys else ",", 2)
            return [c for i, p in enumerate(remaining[:3])
                    for c in self.guessed(ws + self.key_value_open(p, 2), p, 0.9 if i == 0 else 0.3)]
        if where is CallPosition.ARG_COLON:
            param = self.param(tool, frame.keys[-1] if frame.keys else "")
            return self.guessed(":" + self.style.ws(":", 2) + self.render.value_open(param), param, 0.9)
        if where is CallPosition.ARG_VALUE:
            param = self.param(tool, frame.keys[-1] if frame.keys else "")
            if self.scan.scalar:
                if param is not None and param.type == "boolean":
                    return [Continuation(word[len(self.scan.scalar) :], 0.9) for word in ("true", "false")
                            if word.startswith(self.scan.scalar) and word != self.scan.scalar]
                return self.number_rest(tool, frame, self.scan.scalar)
            opener = self.render.value_open(param)
            if param is not None and param.type == "boolean":
                return [Continuation(self.pending_ws(":", 2) + w, 0.45) for w in ("true", "false")]
            return [Continuation(self.pending_ws(":", 2) + opener, 0.9)] if opener else []
        return self.after_value(tool, frame, self.scan.ws, guesses=True)

    def number_rest(self, tool: Tool, frame: Frame, written: str) -> list[Continuation]:
        """Inside a number (or literal): the rest of a request number it begins, then what follows the value;
        or the value ending here (likely where it is one of the request's numbers whole)."""
        nexts = self.after_value(tool, frame, "")[:2]
        rests = self.values.number_endings(written) if self.values is not None else []
        out = [Continuation(rest + nxt.text, 0.5 / (1 + i) * nxt.confidence, nxt.end_of_turn)
               for i, rest in enumerate(rests) if rest for nxt in likeliest(nexts)]
        end = 0.6 if "" in rests else 0.2
        return out + [Continuation(c.text, end * c.confidence, c.end_of_turn) for c in nexts]

    def after_value(self, tool: Tool, frame: Frame, written_ws: str, guesses: bool = False) -> list[Continuation]:
        """After an argument's value: the next key in schema order, or the end of the call; with `guesses`, also
        each next key run on through the value the request gives it by name (see `guessed`), last."""
        remaining = [p for p in tool.parameters if p.name not in frame.keys]
        required_left = any(p.name in tool.required for p in remaining)
        keyed = [self.guessed("," + self.style.ws(",", 2) + self.key_value_open(p, 2), p, 0.8 if i == 0 else 0.25)
                 for i, p in enumerate(remaining[:2])]
        nexts = [k[0] for k in keyed]
        extra = [c for k in keyed for c in k[1:]] if guesses else []
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
