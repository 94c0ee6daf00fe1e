"""How a sidecar's guesses compare with the call the target (or the teacher) actually wrote.

One comparison for the two places that score a sidecar: `oospec bench run` (payload vs the target's call, per
sample) and `oospec sidecar eval` (prediction vs the teacher's call, on held-out requests). `compare_calls`
scores a whole turn of several calls (the payload's `calls` against every call written).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oospec.sidecar.protocol import Guess
from oospec.tools.dialects import ToolCall


def same_value(a: Any, b: Any) -> bool:
    """Exact JSON equality (key order aside): a slot value is right only when it is the value written."""
    return json.dumps(a, sort_keys=True, ensure_ascii=False) == json.dumps(b, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Agreement:
    function_match: bool  # the best guess names the called function
    function_in_payload: bool  # some guess (the best or an alternative) names it
    slots_total: int  # the call's arguments
    slots_matched: int  # of those, equal in the guess for the called function
    full_match: bool  # that guess has every slot right and no extra slot


def compare_call(guesses: Sequence[Guess], call: ToolCall) -> Agreement:
    """Guesses best first (none: the sidecar gave no usable guess). Slots are compared with the guess for the
    function the target chose, the best or an alternative branch."""
    guess = next((g for g in guesses if g.function == call.name), None)
    hinted = guess.arguments if guess is not None else {}
    args = call.arguments if isinstance(call.arguments, Mapping) else {}
    matched = sum(1 for k, v in args.items() if k in hinted and same_value(hinted[k], v))
    return Agreement(function_match=bool(guesses) and guesses[0].function == call.name,
                     function_in_payload=guess is not None, slots_total=len(args), slots_matched=matched,
                     full_match=guess is not None and matched == len(args) and set(hinted) == set(args))


@dataclass(frozen=True)
class TurnAgreement:
    """A predicted turn of calls against the calls written, in any order (as BFCL scores parallel calls)."""

    calls_predicted: int
    calls_written: int
    functions_matched: int  # written calls paired with a predicted call of the same function
    slots_total: int  # arguments over all written calls
    slots_matched: int  # of those, equal in the paired predicted call
    calls_full: int  # written calls paired with an identical predicted call (every slot, no extra one)

    @property
    def full_match(self) -> bool:
        """The whole turn: as many calls as written, each one identical to one written."""
        return self.calls_full == self.calls_written == self.calls_predicted

    @property
    def function_match(self) -> bool:
        """As many calls as written, and the same functions as a multiset."""
        return self.functions_matched == self.calls_written == self.calls_predicted


def _slots(args: Any) -> dict:
    return dict(args) if isinstance(args, Mapping) else {}


def compare_calls(predicted: Sequence[Guess], written: Sequence[ToolCall]) -> TurnAgreement:
    """Pairs each written call with at most one predicted call of the same function, order aside: identical
    calls first, then, of what is left, the pair with the most equal slots first (greedy: turns are short)."""
    def agree(g: Guess, c: ToolCall) -> tuple[int, bool]:
        args, hint = _slots(c.arguments), _slots(g.arguments)
        matched = sum(1 for k, v in args.items() if k in hint and same_value(hint[k], v))
        return matched, matched == len(args) and set(hint) == set(args)

    pairs = sorted(((agree(g, c), -i, -j, i, j) for i, g in enumerate(predicted) for j, c in enumerate(written)
                    if g.function == c.name), key=lambda p: (p[0][1], p[0][0], p[1], p[2]), reverse=True)
    used_g, used_c = set(), set()
    functions = slots = full = 0
    for (matched, identical), _, _, i, j in pairs:
        if i in used_g or j in used_c:
            continue
        used_g.add(i)
        used_c.add(j)
        functions += 1
        slots += matched
        full += identical
    return TurnAgreement(len(predicted), len(written), functions, sum(len(_slots(c.arguments)) for c in written),
                         slots, full)
