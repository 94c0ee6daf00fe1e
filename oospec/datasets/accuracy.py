"""Whether predicted tool calls are right, by each benchmark's own convention."""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from oospec.datasets.bfcl import bfcl_check
from oospec.datasets.sample import DatasetError, Sample
from oospec.datasets.toolalpaca import is_placeholder
from oospec.tools.dialects import ToolCall

_MISSING = object()


def normalize_value(value: Any, *, casefold: bool = False) -> Any:
    """A comparable form: strings that read as numbers/booleans/lists/dicts are parsed, numbers compare by
    value (1 == 1.0), tuples become lists, strings are stripped (and casefolded on request)."""
    if isinstance(value, str):
        s = value.strip()
        if s and (s[0] in "[{(" or re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", s)
                  or s in ("True", "False", "true", "false", "None", "null")):
            parsed = _MISSING
            for loader in (json.loads, ast.literal_eval):
                try:
                    parsed = loader(s)
                    break
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
            if parsed is not _MISSING and not isinstance(parsed, str):
                return normalize_value(parsed, casefold=casefold)
        return s.casefold() if casefold else s
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        f = float(value)
        return ("num", f if math.isfinite(f) else str(f))
    if isinstance(value, list | tuple):
        return ("list", tuple(normalize_value(v, casefold=casefold) for v in value))
    if isinstance(value, Mapping):
        return ("dict", tuple(sorted((str(k), normalize_value(v, casefold=casefold)) for k, v in value.items())))
    return value


def calls_match(gold: ToolCall, pred: ToolCall, *, casefold: bool = False) -> bool:
    """Same function name and the same arguments after ``normalize_value`` (key order ignored)."""
    if gold.name != pred.name or set(gold.arguments) != set(pred.arguments):
        return False
    return all(normalize_value(v, casefold=casefold) == normalize_value(pred.arguments[k], casefold=casefold)
               for k, v in gold.arguments.items())


def _toolalpaca_step_ok(gold: ToolCall, pred: ToolCall) -> bool:
    if gold.name != pred.name:
        return False
    for k in set(gold.arguments) | set(pred.arguments):
        g, p = gold.arguments.get(k, _MISSING), pred.arguments.get(k, _MISSING)
        if is_placeholder(g):
            if p is _MISSING or p in ("", None):
                return False
            continue
        g_empty = g is _MISSING or g in ("", None)
        p_empty = p is _MISSING or p in ("", None)
        if g_empty or p_empty:
            if g_empty != p_empty:
                return False
            continue
        if normalize_value(g, casefold=True) != normalize_value(p, casefold=True):
            return False
    return True


def call_accuracy(sample: Sample, predicted_calls: Sequence[ToolCall] | str) -> bool:
    """Whether the predicted calls are correct by the sample's benchmark convention.

    - BFCL: BFCL's AST checker against ``meta["possible_answer"]`` (any listed value; strings compared
      without case, spaces and ``,./-_*^``; int accepted for float; optional arguments may be omitted).
    - API-Bank: the same calls in order, exact function names and argument sets, values equal after
      ``normalize_value`` (the gold writes every value as a string, e.g. ``"2"`` or ``"['a', 'b']"``).
    - ToolAlpaca (single turn): the predicted calls are a non-empty prefix of the golden action sequence
      (``[Optional]`` steps may be skipped); placeholder values (``${id from search}``) accept any value,
      empty gold values match an omitted argument, strings compare without case.
    - Other datasets: exact match after normalisation, as for API-Bank.

    ``predicted_calls`` may also be the raw model text, parsed with the sample's dialect."""
    if isinstance(predicted_calls, str):
        predicted_calls = sample.parse(predicted_calls)
    pred = list(predicted_calls)
    if sample.dataset == "bfcl" and "possible_answer" in sample.meta:
        return bfcl_check(sample.meta["functions"], sample.meta["possible_answer"], pred,
                          sample.meta.get("category", sample.meta.get("split", "")))
    if sample.gold is None:
        raise DatasetError(f"sample {sample.id} has no gold answer to score against")
    if sample.dataset == "toolalpaca":
        if not pred:
            return False
        optional = set(sample.meta.get("optional_steps", ()))
        j = 0
        for s, g in enumerate(sample.gold):
            if j == len(pred):
                break
            if _toolalpaca_step_ok(g, pred[j]):
                j += 1
            elif s not in optional:
                return False
        return j == len(pred)
    return len(pred) == len(sample.gold) and all(calls_match(g, p) for g, p in zip(sample.gold, pred, strict=True))


__all__ = ["call_accuracy", "calls_match", "normalize_value"]
