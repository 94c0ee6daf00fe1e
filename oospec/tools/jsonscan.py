"""Where JSON strings, brackets and values begin and end, read a character at a time.

The one scanner behind every reader of tool-call text: the call scanner (`tools/callscan.py`), the end of a
streamed call's arguments (`server/reply.py`), the end of a slot value the sidecar decodes, and the bracket
groups the lenient call extractors cut out of free text (`tools/dialects.py`).

It is incremental (`push` one character, or `feed` a piece) and never re-reads. It knows only strings and
brackets, not the grammar: a closer pops whatever bracket is open (a mismatch is noted in `mismatched`, for
callers that want it, and otherwise ignored, so a model's `[1, 2}` still ends its value).

`python=True` reads Python literals too (model output often is one): single-quoted and triple-quoted strings,
and parentheses as brackets.
"""

from __future__ import annotations

# What `push` says a character was.
OPEN = "open"  # a bracket that opens
CLOSE = "close"  # a bracket that closes
STRING_START = "string_start"  # the quote that opens a string
STRING = "string"  # a character inside a string (escapes included, as written)
STRING_END = "string_end"  # the quote that ends a string (a triple quote: its last character)
OTHER = "other"  # anything else outside strings: whitespace, `:`, `,`, a scalar's characters

_PAIRS = {"{": "}", "[": "]"}
_PYTHON_PAIRS = {**_PAIRS, "(": ")"}
_SCALAR_ENDS = ",}]\n\r\t "  # a bare number, true, false or null ends at the first of these


class JsonScanner:
    """Strings and brackets of text fed a character at a time, and where its first value ends."""

    def __init__(self, python: bool = False):
        self.python = python
        self.pairs = _PYTHON_PAIRS if python else _PAIRS
        self.quotes = "\"'" if python else '"'
        self.stack: list[str] = []  # the closers the open brackets want, innermost last
        self.quote: str | None = None  # inside a string: the quote that ends it (", ', or a triple quote)
        self.escape = False  # the previous character inside a string was an unescaped backslash
        self.mismatched = False  # a closer did not match the bracket it closed
        self.position = 0  # characters pushed so far
        self.value_end: int | None = None  # where the first value ended (exclusive), once it has
        self._value = ""  # the first value's kind once it has begun: "string", "brackets" or "scalar"
        self._string_opened_at = -1  # where the string being read opened
        self._quote_run = 0  # quote characters just read inside a triple-quoted string
        self._just_emptied: str | None = None  # Python: the quote of an empty string that just closed

    @property
    def in_string(self) -> bool:
        return self.quote is not None

    @property
    def depth(self) -> int:
        return len(self.stack)

    def feed(self, text: str) -> int | None:
        """Push `text`; the index in it just past the end of the first value if the value ends in it, else None.
        Once the value has ended, nothing more is read."""
        for i, ch in enumerate(text):
            if self.value_end is not None:
                return None
            self.push(ch)
            if self.value_end is not None:
                return self.value_end - (self.position - i - 1)
        return None

    def push(self, ch: str) -> str:
        """Take one character; what it was (OPEN, CLOSE, STRING_START, STRING, STRING_END or OTHER)."""
        kind = self._read_string(ch) if self.quote is not None else self._read_outside(ch)
        self.position += 1
        return kind

    def _read_string(self, ch: str) -> str:
        quote = self.quote
        if self.escape or ch == "\\":
            self.escape = not self.escape
            self._quote_run = 0
            return STRING
        if len(quote) == 3:
            self._quote_run = self._quote_run + 1 if ch == quote[0] else 0
            if self._quote_run < 3:
                return STRING
        elif ch != quote:
            return STRING
        self.quote, self._quote_run = None, 0
        if self.python and len(quote) == 1 and self._string_opened_at == self.position - 1:
            self._just_emptied = quote
        if not self.stack:
            self._ended(self.position + 1)
        return STRING_END

    def _read_outside(self, ch: str) -> str:
        emptied, self._just_emptied = self._just_emptied, None
        if emptied is not None and ch == emptied and self.stack:
            # Python: an empty string then a third quote is the start of a triple-quoted string.
            self.quote, self._quote_run = emptied * 3, 0
            return STRING_START
        if not self.stack:
            if self._value == "scalar":
                if ch in _SCALAR_ENDS:
                    self._ended(self.position)
                return OTHER
            if not self._value and not ch.isspace() and ch not in self.quotes and ch not in self.pairs:
                self._value = "scalar"  # whatever it is, it ends where a scalar would
                return OTHER
        if ch in self.quotes:
            self._value = self._value or "string"
            self.quote, self._string_opened_at = ch, self.position
            return STRING_START
        if ch in self.pairs:
            self._value = self._value or "brackets"
            self.stack.append(self.pairs[ch])
            return OPEN
        if ch in self.pairs.values():
            if not self.stack or self.stack.pop() != ch:
                self.mismatched = True
            if not self.stack:
                self._ended(self.position + 1)
            return CLOSE
        return OTHER

    def _ended(self, end: int) -> None:
        if self.value_end is None:
            self.value_end = end


def value_end(text: str) -> int | None:
    """Where the first JSON value in `text` ends (exclusive), or None while it is incomplete. A bare scalar
    (number, true, false, null) is complete only once a character that cannot continue it follows."""
    return JsonScanner().feed(text)


def bracket_end(text: str, start: int) -> int | None:
    """Exclusive end of the bracket group (JSON or Python literal) opening at `text[start]`, skipping string
    literals; None if it does not close, or closes a bracket with another kind."""
    scanner = JsonScanner(python=True)
    end = scanner.feed(text[start:])
    return None if end is None or scanner.mismatched else start + end
