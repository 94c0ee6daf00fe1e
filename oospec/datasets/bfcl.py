"""BFCL v4 (non-live AST categories): samples with gold calls, and BFCL's AST checker re-implemented."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oospec.datasets.sample import DatasetError, Sample, Samples, Unreadable, build_samples, data_path, read_records
from oospec.errors import SchemaError
from oospec.tools.dialects import DEFAULT_DIALECT, ToolCall
from oospec.tools.schema import tools_from_openai

BFCL_SPLITS = ("simple_python", "multiple", "parallel", "parallel_multiple")
# More tool families for the sidecar's training data (not benchmark sets, so not in "all"). irrelevance's
# requests fit none of the offered functions: the right answer is no call, and it has no possible_answer.
BFCL_TRAINING_SPLITS = ("simple_java", "simple_javascript", "irrelevance")
_BFCL_NO_CALL_SPLITS = ("irrelevance",)
_BFCL_ALIASES = {"simple": "simple_python"}

# BFCL's prompting-mode system prompt (bfcl_eval/constants/default_prompts.py), used with dialect "pythonic".
BFCL_SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out. If the given question lacks the parameters required "
    "by the function, also point it out.\nYou should only return the function calls in your response.\n\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n"
    "You SHOULD NOT include any other text in the response.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within the current "
    "turn. Continue to output functions to call until you have fulfilled the user's request to the best of "
    "your ability. Once you have no more functions to call, the system will consider the current turn "
    "complete and proceed to the next turn or task.\n"
    "\nHere is a list of functions in JSON format that you can invoke.\n{functions}\n\n"
)
_BFCL_PYTHON_HINT = " Note that the provided function is in Python 3 syntax."


def _bfcl_split(split: str) -> str:
    s = _BFCL_ALIASES.get(split, split)
    if s not in BFCL_SPLITS + BFCL_TRAINING_SPLITS:
        raise DatasetError(f"BFCL split must be one of {', '.join(BFCL_SPLITS + BFCL_TRAINING_SPLITS)} or 'all', "
                           f"got {split!r}")
    return s


def _schema_type(schema: Any) -> str | None:
    return schema.get("type") if isinstance(schema, Mapping) else None


def _pick_answer(options: Any, schema: Any, required: bool = False) -> tuple[bool, Any]:
    """One concrete value from a BFCL option list; (False, None) when the argument may be left out
    ("" among the options and the schema does not require it)."""
    if not isinstance(options, list) or not options:
        return True, options
    concrete = [o for o in options if o != ""]
    if len(concrete) < len(options) and (not required or not concrete):
        return False, None
    first = concrete[0]
    t = _schema_type(schema)
    if t == "dict" and isinstance(first, Mapping):
        return True, _pick_dict(first, schema)
    items = schema.get("items") if isinstance(schema, Mapping) else None
    if t in ("array", "tuple") and _schema_type(items) == "dict" and isinstance(first, list):
        return True, [_pick_dict(d, items) if isinstance(d, Mapping) else d for d in first]
    return True, first


def _pick_dict(option: Mapping, schema: Any) -> dict:
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    required = schema.get("required", []) if isinstance(schema, Mapping) else []
    out = {}
    for k, opts in option.items():
        if isinstance(opts, list):
            keep, v = _pick_answer(opts, props.get(k), k in required)
            if keep:
                out[k] = v
        else:
            out[k] = opts
    return out


def bfcl_gold(functions: Sequence[Mapping], possible_answer: Sequence[Mapping]) -> list[ToolCall]:
    """A concrete gold call list from BFCL possible answers: the first listed value of each argument;
    arguments whose options include "" (optional) are left out unless the schema requires them."""
    by_name = {f["name"]: f for f in functions}
    calls = []
    for entry in possible_answer:
        (name, args), = entry.items()
        params = by_name.get(name, {}).get("parameters", {})
        props, required = params.get("properties", {}), params.get("required", [])
        chosen = {}
        for k, opts in args.items():
            keep, v = _pick_answer(opts, props.get(k), k in required)
            if keep:
                chosen[k] = v
        calls.append(ToolCall(name, chosen))
    return calls


def bfcl_samples(questions: Sequence[Any], answers: Mapping[str, Any] | None, *, split: str,
                 dialect: str, source: str) -> Samples:
    if dialect not in ("hermes", "llama3_json", "pythonic"):
        raise DatasetError(f"BFCL dialect must be hermes, llama3_json or pythonic, got {dialect!r}")

    def make(i: int, q: Any, _samples: Samples) -> list[Sample]:
        try:
            qid, turns, functions = q["id"], q["question"], q["function"]
        except (KeyError, TypeError):
            raise DatasetError("BFCL items need 'id', 'question' and 'function'") from None
        if isinstance(functions, Mapping):
            functions = [functions]
        try:
            tools = tools_from_openai(functions)
        except SchemaError as e:
            raise DatasetError(f"{qid}: {e}") from None
        # Single-turn categories hold one turn; a multi-turn record contributes its first turn.
        if turns and isinstance(turns[0], list):
            messages = [dict(m) for m in turns[0]]
        else:
            messages = [dict(m) for m in turns]
        meta: dict[str, Any] = {"split": split, "category": qid.rsplit("_", 1)[0] if "_" in qid else split,
                                "functions": functions, "source": source, "n_turns": len(turns)}
        if dialect == "pythonic":
            docs = [dict(f, description=str(f.get("description", "")) + _BFCL_PYTHON_HINT) for f in functions]
            system = BFCL_SYSTEM_PROMPT.format(functions=docs)
            if messages and messages[0].get("role") == "system":
                messages[0] = {"role": "system", "content": system + "\n\n" + str(messages[0].get("content", ""))}
            else:
                messages.insert(0, {"role": "system", "content": system})
            meta["tools_in_prompt"] = True
        gold = [] if split in _BFCL_NO_CALL_SPLITS else None
        pa = answers.get(qid) if answers is not None else q.get("ground_truth")
        if pa is not None:
            meta["possible_answer"] = pa
            gold = bfcl_gold(functions, pa)
        return [Sample(id=qid, dataset="bfcl", messages=messages, tools=tools, gold=gold, dialect=dialect, meta=meta)]

    return build_samples(questions, source, make)


def _answers_by_id(path) -> tuple[dict[str, Any], Samples]:
    """BFCL possible answers by question id, and (as skipped, no samples) the answer records left out."""
    notes = Samples()
    answers = {}
    for i, rec in enumerate(read_records(path)):
        if isinstance(rec, Unreadable):
            notes.skip(f"{path} line {rec.line}", f"not JSON ({rec.error})")
        elif not isinstance(rec, Mapping) or "id" not in rec or "ground_truth" not in rec:
            notes.skip(f"{path} item {i}", "BFCL answers need 'id' and 'ground_truth'")
        else:
            answers[rec["id"]] = rec["ground_truth"]
    return answers, notes


def bfcl_file(path: str | Path, *, split: str | None = None, dialect: str = DEFAULT_DIALECT,
              answers_path: str | Path | None = None, records: Sequence[Any] | None = None) -> Samples:
    """A BFCL questions file (its ``records`` when already read); answers from ``answers_path``, else from a
    sibling ``possible_answer/`` file of the same name, else inline ``ground_truth``. ``split`` defaults to the
    file name without ``BFCL_v4_``."""
    path = Path(path)
    if answers_path is None:
        guess = path.parent / "possible_answer" / path.name
        answers_path = guess if guess.exists() or Path(str(guess) + ".gz").exists() else None
    if split is None:
        split = re.sub(r"^BFCL_v\d+_", "", path.name.split(".")[0])
    answers, notes = _answers_by_id(answers_path) if answers_path else (None, Samples())
    if records is None:
        records = read_records(path)
    samples = bfcl_samples(records, answers, split=split, dialect=dialect, source=str(path))
    return Samples.concat([notes, samples])


def load_bfcl(split: str = "simple_python", dialect: str = DEFAULT_DIALECT, path: str | Path | None = None,
              answers_path: str | Path | None = None) -> Samples:
    """BFCL v4 non-live AST categories: simple_python (400), multiple (200), parallel (200),
    parallel_multiple (200), or "all"; for training also simple_java (100), simple_javascript (50) and
    irrelevance (240, no call is right).

    ``dialect="hermes"`` (Qwen) or ``"llama3_json"`` passes the functions through the chat template
    (``sample.chat_tools()``); ``"pythonic"`` is BFCL's prompting mode (functions in the system prompt,
    calls written as ``[f(a=1)]``). Possible answers are kept in ``meta["possible_answer"]``; ``gold`` takes
    the first acceptable value of each argument."""
    if path is not None:
        return bfcl_file(path, split=split, dialect=dialect, answers_path=answers_path)
    if split == "all":
        return Samples.concat(load_bfcl(sp, dialect=dialect) for sp in BFCL_SPLITS)
    split = _bfcl_split(split)
    name = f"BFCL_v4_{split}.json"
    if split in _BFCL_NO_CALL_SPLITS:
        answers, notes = None, Samples()
    else:
        answers, notes = _answers_by_id(data_path("bfcl", "possible_answer", name))
    samples = bfcl_samples(read_records(data_path("bfcl", name)), answers, split=split, dialect=dialect,
                           source=f"bfcl/{name}")
    return Samples.concat([notes, samples])


# BFCL's AST checker (bfcl_eval/eval_checker/ast_eval/ast_checker.py), Python flavour, re-implemented.

_BFCL_PY_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "number": float, "boolean": bool,
                                   "array": list, "tuple": list, "dict": dict, "object": dict, "any": str}


def _std(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _pa_type(options: list) -> type | None:
    for o in options:
        if o != "":
            return type(o)
    return None


def _bfcl_type_ok(value: Any, options: list, expected: type, nested: type | None) -> tuple[bool, bool]:
    """(valid, is_variable), following BFCL's type_checker."""
    pa_type = _pa_type(options)
    is_variable = pa_type is not None and pa_type != expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for opt in options:
            if type(opt) is list and all(_bfcl_type_ok(v, opt, nested, None)[0] for v in value):
                return True, is_variable
    if pa_type is not None and type(value) is pa_type:
        return True, True
    return False, False


def _bfcl_dict_ok(value: Mapping, options: list) -> bool:
    for opt in options:
        if opt == "" or not isinstance(opt, Mapping):
            continue
        ok = True
        for k, v in value.items():
            if k not in opt:
                ok = False
                break
            sv = _std(v) if isinstance(v, str) else v
            if sv not in [_std(o) if isinstance(o, str) else o for o in opt[k]]:
                ok = False
                break
        if ok and all(k in value or "" in opts for k, opts in opt.items()):
            return True
    return False


def _bfcl_list_ok(value: list, options: list) -> bool:
    sv = [_std(v) if isinstance(v, str) else v for v in value]
    return any(isinstance(o, list) and sv == [_std(x) if isinstance(x, str) else x for x in o] for o in options)


def _bfcl_list_dict_ok(value: list, options: list) -> bool:
    for opt in options:
        if not isinstance(opt, list) or len(opt) != len(value):
            continue
        if all(isinstance(v, Mapping) and _bfcl_dict_ok(v, [o]) for v, o in zip(value, opt, strict=True)):
            return True
    return False


def _bfcl_simple_ok(func: Mapping | None, call: ToolCall, answer: Mapping) -> bool:
    if func is None:
        return False
    (name, pa), = answer.items()
    if call.name != name:
        return False
    params = func.get("parameters", {})
    props = params.get("properties", {})
    args = call.arguments
    if any(r not in args for r in params.get("required", [])):
        return False
    for k, value in args.items():
        if k not in props or k not in pa:
            return False
        declared = props[k].get("type", "any")
        expected = _BFCL_PY_TYPES.get(declared, str)
        nested = None
        if declared in ("array", "tuple"):
            nested = _BFCL_PY_TYPES.get(_schema_type(props[k].get("items")) or "", None)
        if declared == "tuple" and type(value) is tuple:
            value = list(value)
        if declared in ("float", "number") and type(value) is int:
            value = float(value)
        ok, is_variable = _bfcl_type_ok(value, pa[k], expected, nested)
        if not ok:
            return False
        if not is_variable:
            if expected is dict:
                if not _bfcl_dict_ok(value, pa[k]):
                    return False
                continue
            if expected is list and nested is dict:
                if not _bfcl_list_dict_ok(value, pa[k]):
                    return False
                continue
            if expected is str:
                if _std(value) not in [_std(o) for o in pa[k] if isinstance(o, str)]:
                    return False
                continue
            if expected is list:
                if not _bfcl_list_ok(value, pa[k]):
                    return False
                continue
        if value not in pa[k]:
            return False
    return all(k in args or "" in opts for k, opts in pa.items())


def bfcl_check(functions: Sequence[Mapping], possible_answer: Sequence[Mapping], calls: Sequence[ToolCall],
               category: str) -> bool:
    """BFCL AST accuracy: simple needs exactly one matching call, multiple picks the right function,
    parallel categories match every expected call in any order."""
    by_name = {f["name"]: f for f in functions}
    if len(calls) != len(possible_answer):
        return False
    if "parallel" in category:
        used: set[int] = set()
        for ans in possible_answer:
            func = by_name.get(next(iter(ans)))
            hit = next((i for i, c in enumerate(calls) if i not in used and _bfcl_simple_ok(func, c, ans)), None)
            if hit is None:
                return False
            used.add(hit)
        return True
    if "multiple" in category:
        return _bfcl_simple_ok(by_name.get(next(iter(possible_answer[0]))), calls[0], possible_answer[0])
    return _bfcl_simple_ok(functions[0] if functions else None, calls[0], possible_answer[0])


__all__ = ["BFCL_SPLITS", "BFCL_SYSTEM_PROMPT", "bfcl_check", "bfcl_file", "bfcl_gold", "bfcl_samples", "load_bfcl"]
