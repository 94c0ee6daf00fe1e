"""How a sidecar's guesses compare with the call the target (or the teacher) actually wrote.

One comparison for the two places that score a sidecar: `oospec bench run` (payload vs the target's call, per
sample) and `oospec sidecar eval` (prediction vs the teacher's call, on held-out requests).
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
