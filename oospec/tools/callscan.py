"""Follow a JSON tool call as the target writes it.

`CallScanner` consumes the target's output text a character at a time (incrementally, never re-reading) and
tracks where it is: outside a call, in the function name, in a key, in a value, between arguments. Where strings
and brackets open and close it takes from the one JSON scanner (`tools/jsonscan.py`). What the schema makes
likely next from there is `oospec.tools.continuations`.

Whitespace is learned, not assumed: the scanner records what the target writes after `{`, `,`, `:` and
before `}` at each depth, so a target that pretty-prints gets pretty-printed drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from oospec.tools.dialects import ARGS_KEYS, CLOSERS
from oospec.tools.jsonscan import CLOSE, OPEN, STRING, STRING_END, STRING_START, JsonScanner
from oospec.tools.render import Style


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
CALL_EXPECT = {"key": CallPosition.CALL_KEY_NEXT, "colon": CallPosition.CALL_COLON,
                "value": CallPosition.CALL_VALUE_NEXT, "comma": CallPosition.CALL_VALUE_DONE}
ARGS_EXPECT = {"key": CallPosition.ARG_KEY_NEXT, "colon": CallPosition.ARG_COLON,
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
                return CALL_EXPECT[stack[0].expect]
            return _CALL_STRINGS.get(self.string_role, CallPosition.OTHER)
        if stack[1].role != "args":
            return CallPosition.OTHER
        if len(stack) > 2:
            return CallPosition.ARG_NESTED
        if self.in_string:
            return CallPosition.ARG_KEY if self.string_role == "key" else CallPosition.ARG_STRING
        return ARGS_EXPECT[stack[1].expect]

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
