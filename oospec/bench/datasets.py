"""Tool-calling benchmarks as chat samples: API-Bank (ToolSpec's preprocessing), BFCL v4 and ToolAlpaca.

Every loader returns ``Sample``s whose ``messages`` go straight into
``tokenizer.apply_chat_template(messages, tools=sample.chat_tools(), add_generation_prompt=True)``; the
target's reply is a tool call in ``sample.dialect``. ``call_accuracy`` scores parsed calls the way each
benchmark does. The data ship inside the package (``oospec/data``, see its README for provenance and
licenses); ``load_path`` reads any other file in one of these formats.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from oospec.errors import OospecError, SchemaError
from oospec.tools.dialects import ToolCall, get_dialect
from oospec.tools.schema import Tool, to_openai, tools_from_apibank_prompt, tools_from_openai, tools_from_toolalpaca

APIBANK_LEVELS = (1, 2, 3)
BFCL_SPLITS = ("simple_python", "multiple", "parallel", "parallel_multiple")
_BFCL_ALIASES = {"simple": "simple_python"}


class DatasetError(OospecError):
    """A benchmark file or name that cannot be loaded."""


@dataclass
class Sample:
    id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[Tool]
    gold: list[ToolCall] | None
    dialect: str
    meta: dict[str, Any] = field(default_factory=dict)

    def chat_tools(self) -> list[dict] | None:
        """Tools for ``apply_chat_template(tools=...)``; None when the prompt already describes them
        (API-Bank's prose system prompt, BFCL's prompting mode)."""
        if self.meta.get("tools_in_prompt") or not self.tools:
            return None
        return [to_openai(t) for t in self.tools]

    def prompt_text(self, tokenizer, **kwargs) -> str:
        """The prompt string, generation header included."""
        tools = self.chat_tools()
        extra = {"tools": tools} if tools is not None else {}
        return tokenizer.apply_chat_template(self.messages, add_generation_prompt=True, tokenize=False,
                                             **extra, **kwargs)

    def gold_text(self) -> str | None:
        """The gold call(s) written the way the target writes them (a perfect draft)."""
        if not self.gold:
            return None
        return get_dialect(self.dialect).render(self.gold)

    def parse(self, text: str) -> list[ToolCall]:
        return get_dialect(self.dialect).parse(text)


# --------------------------------------------------------------------------------------------------
# File access
# --------------------------------------------------------------------------------------------------


def data_path(*parts: str):
    """A file under the packaged ``oospec/data`` (its gzipped twin ``name.gz`` when only that exists)."""
    base = resources.files("oospec").joinpath("data")
    for part in parts[:-1]:
        base = base.joinpath(part)
    p = base.joinpath(parts[-1])
    if not p.is_file() and base.joinpath(parts[-1] + ".gz").is_file():
        return base.joinpath(parts[-1] + ".gz")
    return p


def _read_text(path) -> str:
    """Text of a file (str, Path or importlib Traversable); ``*.gz`` is decompressed, and ``path.gz`` is read
    when only the gzipped copy of a plain path exists."""
    p = Path(path) if isinstance(path, str) else path
    if isinstance(p, Path) and not p.exists() and Path(str(p) + ".gz").exists():
        p = Path(str(p) + ".gz")
    try:
        raw = p.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise DatasetError(f"data file not found: {path}") from None
    if str(p.name).endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def _read_records(path) -> list[Any]:
    """A JSON document (list or object) or JSON Lines."""
    text = _read_text(path).lstrip("\ufeff")
    try:
        data = json.loads(text)
    except ValueError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise DatasetError(f"{path}: neither JSON nor JSON Lines ({e})") from None
    return data if isinstance(data, list) else [data]


# --------------------------------------------------------------------------------------------------
# API-Bank (ToolSpec)
# --------------------------------------------------------------------------------------------------


def _apibank_samples(records: Sequence[Mapping], *, level: Any, source: str) -> list[Sample]:
    samples = []
    for i, rec in enumerate(records):
        try:
            system, user = rec["system"], rec["user"]
        except (KeyError, TypeError):
            raise DatasetError(f"{source} item {i}: API-Bank items need 'system' and 'user'") from None
        try:
            tools = tools_from_apibank_prompt(system)
        except SchemaError as e:
            raise DatasetError(f"{source} item {i}: {e}") from None
        answer = rec.get("answer")
        gold = None
        if answer is not None:
            answers = answer if isinstance(answer, list) else [answer]
            gold = [ToolCall.from_dict(a) for a in answers]
        samples.append(Sample(
            id=f"apibank-l{level}-{i}",
            dataset="apibank",
            # Exactly ToolSpec's evaluation/eval.py: [system, user], tools described in the system prose.
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            tools=tools,
            gold=gold,
            dialect="apibank",
            meta={"level": level, "index": i, "source": source, "other": rec.get("other"), "tools_in_prompt": True},
        ))
    return samples


def load_apibank(level: int | str = "all", path: str | Path | None = None) -> list[Sample]:
    """API-Bank as preprocessed by ToolSpec: level 1 (399), 2 (67), 3 (131) or "all" (597, in that order)."""
    if path is not None:
        return _apibank_samples(_read_records(path), level=level, source=str(path))
    if str(level).lower() == "all":
        return [s for lv in APIBANK_LEVELS for s in load_apibank(lv)]
    try:
        lv = int(str(level).removeprefix("level-").removeprefix("level"))
    except ValueError:
        lv = None
    if lv not in APIBANK_LEVELS:
        raise DatasetError(f"API-Bank level must be 1, 2, 3 or 'all', got {level!r}")
    name = f"level-{lv}-api_processed.json"
    return _apibank_samples(_read_records(data_path("apibank", name)), level=lv, source=f"apibank/{name}")


# --------------------------------------------------------------------------------------------------
# BFCL
# --------------------------------------------------------------------------------------------------

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
    if s not in BFCL_SPLITS:
        raise DatasetError(f"BFCL split must be one of {', '.join(BFCL_SPLITS)} or 'all', got {split!r}")
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


def _bfcl_samples(questions: Sequence[Mapping], answers: Mapping[str, Any] | None, *, split: str,
                  dialect: str, source: str) -> list[Sample]:
    if dialect not in ("hermes", "llama3_json", "pythonic"):
        raise DatasetError(f"BFCL dialect must be hermes, llama3_json or pythonic, got {dialect!r}")
    samples = []
    for i, q in enumerate(questions):
        try:
            qid, turns, functions = q["id"], q["question"], q["function"]
        except (KeyError, TypeError):
            raise DatasetError(f"{source} item {i}: BFCL items need 'id', 'question' and 'function'") from None
        if isinstance(functions, Mapping):
            functions = [functions]
        try:
            tools = tools_from_openai(functions)
        except SchemaError as e:
            raise DatasetError(f"{source} {qid}: {e}") from None
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
        gold = None
        pa = answers.get(qid) if answers is not None else q.get("ground_truth")
        if pa is not None:
            meta["possible_answer"] = pa
            gold = bfcl_gold(functions, pa)
        samples.append(Sample(id=qid, dataset="bfcl", messages=messages, tools=tools, gold=gold,
                              dialect=dialect, meta=meta))
    return samples


def load_bfcl(split: str = "simple_python", dialect: str = "hermes", path: str | Path | None = None,
              answers_path: str | Path | None = None) -> list[Sample]:
    """BFCL v4 non-live AST categories: simple_python (400), multiple (200), parallel (200),
    parallel_multiple (200), or "all".

    ``dialect="hermes"`` (Qwen) or ``"llama3_json"`` passes the functions through the chat template
    (``sample.chat_tools()``); ``"pythonic"`` is BFCL's prompting mode (functions in the system prompt,
    calls written as ``[f(a=1)]``). Possible answers are kept in ``meta["possible_answer"]``; ``gold`` takes
    the first acceptable value of each argument."""
    if path is not None:
        path = Path(path)
        if answers_path is None:
            guess = path.parent / "possible_answer" / path.name
            answers_path = guess if guess.exists() or Path(str(guess) + ".gz").exists() else None
        answers = _answers_by_id(_read_records(answers_path)) if answers_path else None
        return _bfcl_samples(_read_records(path), answers, split=split, dialect=dialect, source=str(path))
    if split == "all":
        return [s for sp in BFCL_SPLITS for s in load_bfcl(sp, dialect=dialect)]
    split = _bfcl_split(split)
    name = f"BFCL_v4_{split}.json"
    answers = _answers_by_id(_read_records(data_path("bfcl", "possible_answer", name)))
    return _bfcl_samples(_read_records(data_path("bfcl", name)), answers, split=split, dialect=dialect,
                         source=f"bfcl/{name}")


def _answers_by_id(records: Iterable[Mapping]) -> dict[str, Any]:
    return {r["id"]: r["ground_truth"] for r in records}


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


# --------------------------------------------------------------------------------------------------
# ToolAlpaca
# --------------------------------------------------------------------------------------------------

GET_DETAILS = Tool(
    name="getDetails",
    description="Ask the user for information that is needed to call a function but missing from the request.",
    parameters=tools_from_openai([{"name": "_", "parameters": {"type": "object", "properties": {
        "Question": {"type": "string", "description": "The question to ask the user."}}}}])[0].parameters,
    required=("Question",),
)
_PLACEHOLDER_RE = re.compile(r'"?\$\{([^},"$]*)\}?"?')
_PLACEHOLDER_VALUE = re.compile(r"^\$?\{[^{}\"]*\}$")


def is_placeholder(value: Any) -> bool:
    """ToolAlpaca gold values standing for an earlier result or user detail, e.g. ``${animeId from searchAnime}``."""
    return isinstance(value, str) and bool(_PLACEHOLDER_VALUE.match(value.strip()))


def parse_toolalpaca_input(raw: Any) -> dict:
    """A golden ``Action_Input``: JSON, possibly with unquoted ``${...}`` placeholders (kept as strings)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if raw is None or not str(raw).strip():
        return {}
    text = str(raw)
    for candidate in (text, _PLACEHOLDER_RE.sub(lambda m: json.dumps("${" + m.group(1).strip() + "}"), text)):
        try:
            value = json.loads(candidate)
        except ValueError:
            try:
                value = ast.literal_eval(candidate)
            except (ValueError, SyntaxError):
                continue
        if isinstance(value, Mapping):
            return dict(value)
    raise DatasetError(f"cannot read ToolAlpaca Action_Input {text[:120]!r}")


def _toolalpaca_samples(apis: Sequence[Mapping], *, source: str) -> list[Sample]:
    samples = []
    for a, api in enumerate(apis):
        name = api.get("Name", f"api{a}")
        try:
            tools = tools_from_toolalpaca(api)
        except SchemaError as e:
            raise DatasetError(f"{source} API {name!r}: {e}") from None
        if not any(t.name == GET_DETAILS.name for t in tools):
            tools = tools + [GET_DETAILS]
        intro = str(api.get("Introduction") or api.get("Description") or "").strip()
        system = (f"You are a helpful assistant that can use the {name} API to fulfil the user's request. {intro}\n"
                  "If the request lacks information that a function needs, call getDetails to ask the user.")
        instructions = api.get("Instructions") or []
        answers = api.get("Golden_Answers")
        for i, instruction in enumerate(instructions):
            gold = None
            meta: dict[str, Any] = {"api": name, "api_index": a, "index": i, "source": source,
                                    "category": api.get("Category")}
            if answers is not None and i < len(answers) and answers[i] is not None:
                steps = answers[i]
                gold, optional = [], []
                for s, step in enumerate(steps):
                    action = str(step.get("Action", "")).strip()
                    if action.lower().startswith("[optional]"):
                        action = action[len("[optional]"):].strip()
                        optional.append(s)
                    try:
                        args = parse_toolalpaca_input(step.get("Action_Input"))
                    except DatasetError as e:
                        raise DatasetError(f"{source} API {name!r} instruction {i} step {s}: {e}") from None
                    # "" marks an argument the golden answer leaves unset: drop it, as a model would.
                    gold.append(ToolCall(action, {k: v for k, v in args.items() if v != ""}))
                meta.update(optional_steps=optional, golden_raw=steps,
                            placeholders=[(s, k) for s, c in enumerate(gold) for k, v in c.arguments.items()
                                          if is_placeholder(v)])
            samples.append(Sample(
                id=f"toolalpaca-{a}-{i}",
                dataset="toolalpaca",
                messages=[{"role": "system", "content": system}, {"role": "user", "content": str(instruction)}],
                tools=tools,
                gold=gold,
                dialect="hermes",
                meta=meta,
            ))
    return samples


def load_toolalpaca(path: str | Path | None = None) -> list[Sample]:
    """ToolAlpaca eval_simulated: 10 APIs, 100 instructions; gold is the golden action sequence."""
    if path is not None:
        return _toolalpaca_samples(_read_records(path), source=str(path))
    return _toolalpaca_samples(_read_records(data_path("toolalpaca", "eval_simulated.json")),
                               source="toolalpaca/eval_simulated.json")


# --------------------------------------------------------------------------------------------------
# Generic files and dispatch
# --------------------------------------------------------------------------------------------------


def _generic_samples(records: Sequence[Mapping], *, source: str, dialect: str | None) -> list[Sample]:
    samples = []
    for i, rec in enumerate(records):
        messages = rec.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) and "role" in m for m in messages):
            raise DatasetError(f"{source} item {i}: 'messages' must be a list of {{role, content}} objects")
        try:
            tools = tools_from_openai(rec.get("tools") or [])
        except SchemaError as e:
            raise DatasetError(f"{source} item {i}: {e}") from None
        raw_gold = next((rec[k] for k in ("gold", "tool_calls", "answer") if rec.get(k) is not None), None)
        gold = None
        if raw_gold is not None:
            raw_gold = raw_gold if isinstance(raw_gold, list) else [raw_gold]
            gold = [ToolCall.from_dict(c) for c in raw_gold]
        meta = dict(rec.get("meta") or {})
        samples.append(Sample(id=str(rec.get("id", f"{Path(source).stem}-{i}")),
                              dataset=str(rec.get("dataset", Path(source).stem)),
                              messages=[dict(m) for m in messages], tools=tools, gold=gold,
                              dialect=str(rec.get("dialect") or dialect or "hermes"), meta=meta))
    return samples


def detect_format(records: Sequence[Any]) -> str:
    first = next((r for r in records if isinstance(r, Mapping)), None)
    if first is None:
        raise DatasetError("empty file or no JSON objects in it")
    if {"system", "user"} <= first.keys():
        return "apibank"
    if {"question", "function"} <= first.keys():
        return "bfcl"
    if "Instructions" in first or "Documentation" in first or "Functions" in first:
        return "toolalpaca"
    if "messages" in first:
        return "generic"
    raise DatasetError(f"unknown dataset format (keys: {sorted(first)[:8]}); "
                       "expected API-Bank, BFCL, ToolAlpaca or {messages, tools, gold} records")


def load_path(path: str | Path, format: str = "auto", *, dialect: str | None = None) -> list[Sample]:
    """Any file in one of the supported formats (JSON, JSON Lines, optionally gzipped):
    ``apibank`` (ToolSpec items), ``bfcl`` (answers from a sibling ``possible_answer/`` file of the same name,
    or inline ``ground_truth``), ``toolalpaca`` (API entries), ``generic`` (``{"messages", "tools", "gold"}``)."""
    path = Path(path)
    records = _read_records(path)
    fmt = detect_format(records) if format == "auto" else format
    if fmt == "apibank":
        m = re.search(r"level-(\d)", path.name)
        return _apibank_samples(records, level=int(m.group(1)) if m else path.stem, source=str(path))
    if fmt == "bfcl":
        guess = path.parent / "possible_answer" / path.name
        answers = None
        if guess.exists() or Path(str(guess) + ".gz").exists():
            answers = _answers_by_id(_read_records(guess))
        split = re.sub(r"^BFCL_v\d+_", "", path.name.split(".")[0])
        return _bfcl_samples(records, answers, split=split, dialect=dialect or "hermes", source=str(path))
    if fmt == "toolalpaca":
        return _toolalpaca_samples(records, source=str(path))
    if fmt == "generic":
        return _generic_samples(records, source=str(path), dialect=dialect)
    raise DatasetError(f"unknown format {format!r}; choose auto, apibank, bfcl, toolalpaca or generic")


DATASETS: dict[str, tuple[str, ...]] = {
    "apibank": ("1", "2", "3", "all"),
    "bfcl": (*BFCL_SPLITS, "all"),
    "toolalpaca": ("eval_simulated",),
}
_NAME_ALIASES = {"api-bank": "apibank", "api_bank": "apibank", "tool-alpaca": "toolalpaca",
                 "tool_alpaca": "toolalpaca"}


def load_dataset(name: str, split: str | int | None = None, limit: int | None = None, **kwargs) -> list[Sample]:
    """``apibank`` (split 1/2/3/all, default all), ``bfcl`` (split simple_python/multiple/parallel/
    parallel_multiple/all, default all), ``toolalpaca``; ``name:split`` works too, and so does a file path."""
    key = name.strip()
    if split is None and ":" in key and not Path(key).exists():
        key, split = key.split(":", 1)
    key = _NAME_ALIASES.get(key.lower(), key.lower())
    if key == "apibank":
        samples = load_apibank("all" if split is None else split, **kwargs)
    elif key == "bfcl":
        samples = load_bfcl("all" if split is None else str(split), **kwargs)
    elif key == "toolalpaca":
        if split not in (None, "eval_simulated", "all"):
            raise DatasetError(f"toolalpaca has one split, eval_simulated; got {split!r}")
        samples = load_toolalpaca(**kwargs)
    elif Path(name).exists():
        samples = load_path(name, **kwargs)
    else:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)} or give a file path")
    if limit is not None:
        samples = samples[: max(0, int(limit))]
    return samples


# --------------------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------------------

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


__all__ = [
    "APIBANK_LEVELS",
    "BFCL_SPLITS",
    "BFCL_SYSTEM_PROMPT",
    "DATASETS",
    "DatasetError",
    "Sample",
    "bfcl_check",
    "bfcl_gold",
    "call_accuracy",
    "calls_match",
    "data_path",
    "detect_format",
    "is_placeholder",
    "load_apibank",
    "load_bfcl",
    "load_dataset",
    "load_path",
    "load_toolalpaca",
    "normalize_value",
    "parse_toolalpaca_input",
]
