"""Argument values are often copied from the request: the spans and numbers of what the user said that a value
being written may be completing (the schema drafter's value guesses, oospec.tools.continuations), and the dates
and times it names written as APIs take them ("April 15th at 2 PM" as `2023-04-15 14:00:00`).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from functools import cached_property

from oospec.tools.schema import Tool
from oospec.tools.toolprior import tool_weights

_MONTHS = {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                           "nov", "dec"))}
_MONTH = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(\d{4}))?"
_MONTH_DAY = re.compile(rf"\b{_MONTH}\s+{_DAY}\b{_YEAR}", re.IGNORECASE)  # April 15th, 2023
_DAY_MONTH = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}{_YEAR}", re.IGNORECASE)  # 15th of April 2023
_CLOCK = re.compile(r"\b(\d{1,2})(?::(\d{2}))?(?::(\d{2}))?\s*([ap])\.?m\b\.?|\b(\d{1,2}):(\d{2})(?::(\d{2}))?\b",
                    re.IGNORECASE)  # 2 PM, 2:30pm, 14:00, 14:00:00
_ISO_YEAR = re.compile(r"^\d{4}(?=-|$)")
_WHOLE_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(?!\d)")
_ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2}(?::\d{2})?)?\b")
# "my password is pass123", "the meeting topic is Sales Meeting", "account identifier: user4", 'titled "Q3"':
# up to two words between the argument's word and the verb; then a quoted value, or a word and the capitalized
# words after it.
_NAMED = r"\b{word}(?:\s+[a-z]+){{0,2}}?\s*(?:\bis\b|\bwas\b|\bare\b|:|=|\bcalled\b|\btitled\b|\bnamed\b)\s*"
_WORD = r'[^\s,;?!()"<>.]+(?:\.[^\s,;?!()"<>.]+)*'  # dots only inside (an email, 1.5), not a sentence's end
_CAPITALIZED = r'[A-Z0-9][^\s,;?!()"<>.]*(?:\.[^\s,;?!()"<>.]+)*'  # Sales Meeting, Room A
_NAMED_VALUE = re.compile(rf'"([^"\n]{{1,80}})"|({_WORD}(?:[ ]+{_CAPITALIZED})*)')
# The argument as a key of an earlier call or a tool's result in the dialogue ({'token': 'a9s8'}, "username":
# "JohnDoe"): agents pass such values on to the next call.
_KEYED = r"""(?<![\w'"])['"]{key}['"]\s*:\s*(?:"([^"\n]{{1,80}})"|'([^'\n]{{1,80}})')"""
_CALL_NAME = re.compile(r"""\s*,\s*['"](?:parameters|arguments)['"]""")
# A value the user quoted (add "Meeting with clients"; the sequence 'AGTC'); ValueSource.quoted leaves out the
# keys and values of the dicts and calls the dialogue shows.
_QUOTED = re.compile(r"""(?<![\w'"])(?:"([^"\n{}]{2,80})"|'([^'\n{}]{2,80})')(?![\w'"])""")


class ValueSource:
    """Argument values are often copied from the request (ids, names, places): once a value has begun, the
    spans of the request text that start the same way are likely endings."""

    _STRONG_STOP = re.compile(r"[,;?!()\[\]{}<>\"\n]")
    _TRAILING = ".,;:?!)\"' "

    def __init__(self, text: str, max_spans: int = 4, max_words: int = 3):
        self.text = text
        self.max_spans = max_spans
        self.max_words = max_words
        self._named: dict[str, list[str]] = {}  # argument -> named(argument): asked at every step of a call
        self._tool_weights: dict[tuple[str, ...], dict[str, float]] = {}

    def endings(self, prefix: str) -> list[str]:
        """Rests of request spans that begin with `prefix` at a word start, latest mention first, ending after
        one, two or three words (never across strong punctuation)."""
        if not prefix or not self.text:
            return []
        found: list[tuple[int, str]] = []  # (0 if the prefix ends mid-word, else 1; ending)
        start = self.text.rfind(prefix)
        while start >= 0 and len(found) < 4 * self.max_spans:
            if start == 0 or not self.text[start - 1].isalnum():
                rest = self.text[start + len(prefix) : start + len(prefix) + 120]
                stop = self._STRONG_STOP.search(rest)
                rest = rest[: stop.start()] if stop else rest
                rank = 1 if rest[:1].isspace() else 0
                for i, word in enumerate(re.finditer(r"\S+", rest)):
                    if i >= self.max_words:
                        break
                    end = rest[: word.end()].rstrip(self._TRAILING)
                    if end and all(end != e for _, e in found):
                        found.append((rank, end))
            start = self.text.rfind(prefix, 0, start) if start > 0 else -1
        found.sort(key=lambda x: x[0])  # stable: latest mention first within a rank
        return [e for _, e in found[: self.max_spans]]

    def date_endings(self, prefix: str) -> list[str]:
        """Rests of the request's dates and times written as ISO values (`2023-04-15`, `2023-04-15 14:00:00`,
        `14:00:00`, `14:00`) that begin with `prefix`; a date's year is the one `prefix` starts with, else one the
        request names (none: nothing until the target has written its year). With no `prefix` (the value not
        begun), the dates whose year is known and the ISO dates the request writes itself."""
        if not prefix:
            return self.whole_dates
        if not (self.dates or self.times):
            return []
        year = _ISO_YEAR.match(prefix)
        years = [year.group()] if year else self.years
        # A whole date written (the request's, or one it implies: "tomorrow") is likeliest given a time it names.
        written = [prefix[:10]] if _WHOLE_DATE.match(prefix) else []
        values: list[str] = []
        for date in written + [d for y in years for d in self.iso_dates(y)]:
            values += [f"{date} {t}:00" for t in self.times] + [date] + [f"{date} {t}" for t in self.times]
        values += [f"{t}:00" for t in self.times] + list(self.times)
        out: list[str] = []
        for value in values:
            if value.startswith(prefix) and value[len(prefix):] and value[len(prefix):] not in out:
                out.append(value[len(prefix):])
        return out[: self.max_spans]

    def iso_dates(self, year: str) -> list[str]:
        """The request's dates as ISO dates, latest first: those it writes as ISO dates, then those in words (in
        `year` where they name none)."""
        return list(dict.fromkeys([*self.written_days,
                                   *(f"{y or year}-{month:02d}-{day:02d}" for y, month, day in self.dates)]))

    @cached_property
    def written_days(self) -> list[str]:
        """The dates the request writes as ISO dates (without their times), latest first."""
        return list(dict.fromkeys(found[:10] for found in reversed(_ISO_DATE.findall(self.text))))

    @cached_property
    def whole_dates(self) -> list[str]:
        """The ISO dates the request writes itself, then its dates in words whose year it names, as ISO values."""
        out = list(reversed(_ISO_DATE.findall(self.text)))
        for digit in dict.fromkeys(year[0] for year in self.years):
            out += [digit + rest for rest in self.date_endings(digit)]
        return list(dict.fromkeys(out))[: self.max_spans]

    @cached_property
    def dates(self) -> list[tuple[str | None, int, int]]:
        """(year or None, month, day) of every date the request names in words, latest first."""
        found = []
        for m in _MONTH_DAY.finditer(self.text):
            found.append((m.start(), m.group(3), _MONTHS[m.group(1).lower()], int(m.group(2))))
        for m in _DAY_MONTH.finditer(self.text):
            found.append((m.start(), m.group(3), _MONTHS[m.group(2).lower()], int(m.group(1))))
        found.sort(key=lambda f: -f[0])
        return [(y, mo, d) for _, y, mo, d in found if 1 <= d <= 31]

    @cached_property
    def times(self) -> list[str]:
        """HH:MM of every clock time the request names, 24-hour, latest first."""
        out = []
        for m in reversed(list(_CLOCK.finditer(self.text))):
            if m.group(4):
                hour, minute = int(m.group(1)), int(m.group(2) or 0)
                hour = hour % 12 + (12 if m.group(4).lower() == "p" else 0)
            else:
                hour, minute = int(m.group(5)), int(m.group(6))
            text = f"{hour:02d}:{minute:02d}"
            if hour < 24 and minute < 60 and text not in out:
                out.append(text)
        return out

    @cached_property
    def years(self) -> list[str]:
        return list(dict.fromkeys(reversed(re.findall(r"\b(?:19|20)\d{2}\b", self.text))))

    def tool_weights(self, tools: Sequence[Tool]) -> dict[str, float]:
        """Tool name -> the chance that the next call names it, from this text (oospec.tools.toolprior)."""
        key = tuple(t.name for t in tools)
        if key not in self._tool_weights:
            self._tool_weights[key] = dict(zip(key, tool_weights(tools, self.text)))
        return self._tool_weights[key]

    def named(self, argument: str) -> list[str]:
        """Values the request gives the argument by name ("my password is pass123" for `password`, "the meeting
        topic is Sales Meeting" for `meeting_topic`), latest mention first: guesses for a value not begun."""
        if argument not in self._named:
            self._named[argument] = self._find_named(argument)
        return self._named[argument]

    def _find_named(self, argument: str) -> list[str]:
        words = [w.lower() for w in re.findall(r"[A-Za-z][a-z]*|[A-Z]+(?![a-z])", argument) if len(w) >= 3]
        if not words or not self.text:
            return []
        found: list[tuple[int, str]] = []
        for word in dict.fromkeys([words[-1], words[0]]):
            for m in re.finditer(_NAMED.format(word=re.escape(word)), self.text, re.IGNORECASE):
                value = _NAMED_VALUE.match(self.text, m.end())
                if value is not None:
                    text = value.group(1) or value.group(2).rstrip(self._TRAILING)
                    if text:
                        found.append((m.start(), text))
        for m in re.finditer(_KEYED.format(key=re.escape(argument)), self.text):
            if not _CALL_NAME.match(self.text, m.end()):  # {"name": "GetUserToken", "parameters": ...} names a tool
                found.append((m.start(), m.group(1) or m.group(2)))
        found.sort(key=lambda f: -f[0])
        return list(dict.fromkeys(text for _, text in found))[: self.max_spans]

    @cached_property
    def quoted(self) -> list[str]:
        """The strings the request quotes as values, latest first (not the keys and values of dicts it shows)."""
        text = self.text
        found = [m.group(1) or m.group(2) for m in _QUOTED.finditer(text)  # a few characters around, never more
                 if not text[max(0, m.start() - 8) : m.start()].rstrip().endswith(":")
                 and not text[m.end() : m.end() + 8].lstrip().startswith(":")]
        return list(dict.fromkeys(reversed([q for q in found if q.strip()])))[: self.max_spans]

    def is_span(self, prefix: str) -> bool:
        """`prefix` is a whole span of the request: it starts a word there and a word ends with it."""
        return bool(prefix) and re.search(r"(?<!\w)" + re.escape(prefix) + r"(?!\w)", self.text) is not None

    _NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w|\.\d)")  # "0.7." ends a sentence

    @cached_property
    def numbers(self) -> list[tuple[int, str]]:
        """(position, text) of the request's numbers, in its order."""
        return [(m.start(), m.group()) for m in self._NUMBER.finditer(self.text)]

    def next_numbers(self, written: str, limit: int | None = None) -> list[str]:
        """The request's numbers, in its order, after the last of them that `written` (a call's text so far) uses,
        less those it uses (at most `limit`): an API's numeric arguments mostly come in the order the request gives
        them (the first of these is the value in 57% of the numeric arguments of the items the sidecar trained
        on, the second in 21%; docs/results-history.md)."""
        used = set(self._NUMBER.findall(written))
        first = self._first_positions
        last = max((first[n] for n in used if n in first), default=-1)
        out: list[str] = []
        for _, number in self.numbers[bisect_right(self._positions, last) :]:  # a drafting step reads no more
            if number not in used and number not in out:  # than it needs, however long the request
                out.append(number)
                if limit is not None and len(out) >= limit:
                    break
        return out

    @cached_property
    def _positions(self) -> list[int]:
        return [pos for pos, _ in self.numbers]

    @cached_property
    def _first_positions(self) -> dict[str, int]:
        first: dict[str, int] = {}
        for pos, number in self.numbers:
            first.setdefault(number, pos)
        return first

    def number_endings(self, prefix: str) -> list[str]:
        """Rests of the request's numbers that begin with `prefix` (a number being written), latest first; ""
        where `prefix` is one of them whole."""
        out: list[str] = []
        for _, number in reversed(self.numbers):
            if number.startswith(prefix) and number[len(prefix):] not in out:
                out.append(number[len(prefix):])
            if len(out) >= self.max_spans:
                break
        return out

