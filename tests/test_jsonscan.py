"""The one incremental JSON scanner: strings with escapes, brackets, where a value ends, pieces fed in any cut."""

from __future__ import annotations

import pytest

from oospec.tools.jsonscan import (CLOSE, OPEN, OTHER, STRING, STRING_END, STRING_START, JsonScanner, bracket_end,
                                   value_end)


def test_value_end_of_strings_scalars_and_containers():
    assert value_end('"Paris", "x"') == 7
    assert value_end('"a \\" b"}') == 8  # an escaped quote does not end the string
    assert value_end('"a \\\\"}') == 6  # an escaped backslash does not escape the quote after it
    assert value_end('"unfinished') is None
    assert value_end(" 42}") == 3  # a scalar ends at the brace after it, leading whitespace skipped
    assert value_end("42") is None  # a number is complete only once something follows it
    assert value_end("true,") == 4  # ... a comma
    assert value_end("3.5\n") == 3  # ... or whitespace
    assert value_end('[1, {"a": "]"}], ') == 15  # brackets inside strings do not count
    assert value_end('{"a": "}{", "b": [[]]}') == 22
    assert value_end('{"a": [1, 2') is None  # incomplete
    assert value_end("") is None and value_end("   ") is None


def test_a_closer_of_another_kind_still_ends_a_value():
    # A model's `[1, 2}` ends where its brackets balance; a caller that cares asks `mismatched`.
    scanner = JsonScanner()
    assert scanner.feed("[1, 2}, ") == 6 and scanner.mismatched
    assert bracket_end("[1, 2}", 0) is None


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 100])
def test_feeding_in_pieces_finds_the_same_end(cut):
    text = '{"q": "say \\"}\\" twice", "n": [1, {"x": "]"}]}, "rest"'
    whole = value_end(text)
    scanner, offset = JsonScanner(), 0
    for start in range(0, len(text), cut):
        end = scanner.feed(text[start:start + cut])
        if end is not None:
            offset = start + end
            break
    assert offset == whole == text.index(', "rest"')
    assert scanner.feed("more") is None  # once the value has ended nothing more is read


def test_push_says_what_each_character_was():
    scanner = JsonScanner()
    kinds = [scanner.push(ch) for ch in '{"a\\"": [1]}']
    assert kinds == [OPEN, STRING_START, STRING, STRING, STRING, STRING_END, OTHER, OTHER, OPEN, OTHER, CLOSE, CLOSE]
    assert scanner.depth == 0 and not scanner.in_string and scanner.value_end == 12


def test_bracket_end_reads_python_literals():
    assert bracket_end("x = {'a': '}', \"b\": (1, ']')} tail", 4) == 29
    assert bracket_end("[f(a='''it's ]'''), g()] and more", 0) == 24  # triple-quoted strings hold lone quotes
    assert bracket_end("[f(a=''), g()]", 0) == 14  # an empty string is not a triple quote
    assert bracket_end("(a, [b)]", 0) is None  # closed with another kind of bracket
    assert bracket_end("{'open': [1, 2}", 0) is None
    assert bracket_end("{'never closed'", 0) is None
    # JSON mode knows neither single quotes nor parentheses.
    assert value_end("{'}': 1}") == 3
