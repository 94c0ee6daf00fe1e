"""Training rows in the sidecar's own task format, exactly as the predictor queries it.

Per request: the prompt once, then one row for whether a call comes at all (the call's opening, or the start
of the teacher's plain answer), one row per function choice (which tool the teacher called) and one row per
argument slot of that tool (its value, or null where the teacher left an optional slot out), each with the
same assistant prefix `SidecarPredictor` primes it with (`TaskFormat`). Loss is on the completions only.

A turn with several calls (BFCL parallel) adds, after each call, a row for what the teacher wrote next: the
opening of another call, or the end of the turn (`later_call_rows`); and the function and slot rows of every
later call, primed with the calls before it written as the task format writes calls (`TaskFormat.call_text`)
and joined as the teacher joined them: exactly what the predictor, having guessed those calls, asks next.

The function choice is also given as a ranking: one unsupervised row per other offered tool, scored exactly as
the predictor scores names, so training can ask for the teacher's tool to outrank the others (`choices`). Its
cross-entropy alone rests on the one token where the names part, among dozens of slot tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from oospec.sidecar.agreement import same_value
from oospec.sidecar.predictor import NEXT_CALL, VALUE_OPENERS, TaskFormat
from oospec.sidecar.protocol import Job
from oospec.tools.dialects import DIALECTS, ToolCall, extract_json_calls
from oospec.tools.jsonscan import bracket_end
from oospec.tools.schema import Tool, tools_from_openai


@dataclass
class RequestRows:
    request_id: str
    prompt: str
    prefixes: list[str]  # per row: assistant text the predictor primes the row with
    completions: list[str]  # per row: what the sidecar should write next
    supervised: list[bool] = field(default_factory=list)  # per row: cross-entropy on it ([]: every row)
    choices: list[int] = field(default_factory=list)  # rows scoring each offered tool's name, in tool order
    chosen: int = -1  # the teacher's tool, as an index into `choices`


def job_for(trace: dict) -> Job:
    """The predictor's job for a traced request, with the opener and arguments key the teacher used (for a
    request the teacher answered without a call, those its dialect expects, as the sidecar drafter sends)."""
    text, call = trace.get("text") or "", trace.get("call")
    dialect = DIALECTS.get(trace.get("dialect"))
    opener = dialect.opener if dialect else ""
    args_key = dialect.args_key if dialect else "arguments"
    if call:
        brace = text.find("{")
        opener = text[:brace] if brace >= 0 else opener
        args_key = "parameters" if '"parameters"' in text else "arguments"
    return Job(trace["id"], trace["messages"], trace["tools"], trace.get("chat_tools"), opener, args_key)


def value_completion(value, param_type: str, last: bool) -> str | None:
    """The row's completion for a value: its JSON after the type's opener (already in the prefix), then the
    character that ends it. None when the value cannot be written after that opener (wrong type)."""
    text = "null" if value is None else json.dumps(value, ensure_ascii=False)
    opener = VALUE_OPENERS.get(param_type, "")
    if value is not None and opener:
        if not text.startswith(opener):
            return None
        text = text[len(opener):]
    elif value is None and opener:
        return None  # the predictor primes a string/array/object row: null cannot follow
    return text + ("}" if last else ",")


NO_CALL_CHARS = 24  # of a plain answer: enough for its first few tokens, which decide "no call"


def call_rows(job: Job, tool: Tool, call: dict, fmt: TaskFormat) -> tuple[list[str], list[str]]:
    """The function row and one row per argument slot of `call` (prefixes, completions)."""
    prefixes = [fmt.function_prefix(job)]
    completions = [call["name"] + f'", "{job.args_key}":']
    args = call.get("arguments") or {}
    for i, p in enumerate(tool.parameters):
        value = args.get(p.name)
        if p.name not in args and p.name in tool.required:
            continue  # the teacher broke the schema: nothing to learn from this slot
        completion = value_completion(value, p.type, i == len(tool.parameters) - 1)
        if completion is None:
            continue
        prefixes.append(fmt.slot_prefix(job, tool.name, p))
        completions.append(completion)
    return prefixes, completions


def call_spans(text: str) -> list[tuple[int, int, ToolCall]]:
    """Each JSON call object in `text`, in order: (start, exclusive end, the call)."""
    spans = []
    i = text.find("{")
    while i >= 0:
        end = bracket_end(text, i)
        found = extract_json_calls(text[i:end]) if end else []
        if len(found) == 1:
            spans.append((i, end, found[0]))
            i = text.find("{", end)
        else:  # not a call, or a wrapper holding several: look inside
            i = text.find("{", i + 1)
    return spans


def later_call_rows(trace: dict, job: Job, tools: dict[str, Tool], fmt: TaskFormat) -> tuple[list[str], list[str]]:
    """For a turn with several calls: after each call, what comes next (`NEXT_CALL` after the teacher's joining
    text, or the rest of the teacher's text and the end of the turn), and every later call's own rows. Empty
    for one call, or when the calls cannot be found in the text as the trace lists them."""
    calls, text = trace.get("calls") or [], trace.get("text") or ""
    spans = call_spans(text)
    if len(calls) < 2 or len(spans) != len(calls) or spans[0][0] != len(job.opener) or not all(
            s[2].name == c["name"] and same_value(s[2].arguments, c.get("arguments") or {})
            for s, c in zip(spans, calls)):
        return [], []
    prefixes, completions = [], []
    current = job
    for k, (call, (_, end, _)) in enumerate(zip(calls, spans)):
        written = fmt.call_text(current, call["name"], call.get("arguments") or {})
        if k + 1 < len(calls):
            joint = text[end:spans[k + 1][0]]
            prefixes.append(written)
            completions.append(joint + NEXT_CALL)
            current = fmt.after_calls(job, written + joint)
            tool = tools.get(calls[k + 1]["name"])
            if tool is not None:
                p, c = call_rows(current, tool, calls[k + 1], fmt)
                prefixes += p
                completions += c
        elif fmt.end_of_turn:
            prefixes.append(written)
            completions.append(text[end:] + fmt.end_of_turn)
    return prefixes, completions


def rows_for(trace: dict, fmt: TaskFormat) -> RequestRows | None:
    call = trace.get("call")
    job = job_for(trace)
    if not call:
        answer = (trace.get("text") or "")[:NO_CALL_CHARS]
        return RequestRows(trace["id"], fmt.prompt(job), [""], [answer]) if answer.strip() else None
    tools = {t.name: t for t in tools_from_openai(trace["tools"])}
    tool = tools.get(call["name"])
    if tool is None:
        return None
    first_prefixes, first_completions = call_rows(job, tool, call, fmt)
    later_prefixes, later_completions = later_call_rows(trace, job, tools, fmt)
    prefixes = ["", *first_prefixes, *later_prefixes]
    completions = [fmt.function_prefix(job), *first_completions, *later_completions]
    supervised = [True] * len(prefixes)
    choices = []
    for name in tools:
        if name == tool.name:
            choices.append(1)
            continue
        choices.append(len(prefixes))
        prefixes.append(fmt.function_prefix(job))
        completions.append(name + f'", "{job.args_key}":')
        supervised.append(False)
    if len(choices) < 2:
        choices = []
    return RequestRows(trace["id"], fmt.prompt(job), prefixes, completions, supervised, choices,
                       choices.index(1) if choices else -1)
