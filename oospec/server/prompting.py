"""Chat messages and tools in, prompt token ids out, as the target's chat template renders them.

Templates that know tools (Qwen2.5's) get the tools and the assistant `tool_calls` as they are. Templates that
do not (SmolLM2's renders only role and content) get the same information as text, the way Qwen2.5's template
writes it: a "# Tools" block with the function signatures and the `<tool_call>` instruction appended to the
system message, earlier calls written in the dialect inside the assistant message, and tool results as a user
message of `<tool_response>` blocks.

tool_choice is honoured by what the prompt contains, by forcing the start of the assistant's reply, and by
decoding the rest under a grammar:
  none       the tools are left out of the prompt, and the reply is not parsed for calls;
  auto       the tools are in the prompt and the model decides;
  required   the reply starts with the dialect's call opener (`<tool_call>\\n` for hermes);
  function   the reply starts with the opener and `{"name": "<function>", "arguments": ` .
The forced text is appended to the prompt after the generation header, so the generated tokens are the
target's greedy continuation of it; it is part of the reply's text (and of `usage.prompt_tokens`). For required
and function, what follows is decoded under the call grammar (oospec.tools.call_grammar, `call_constraint`):
only offered (or the named) functions, arguments an object following the function's parameters, then the end
of the turn. A named function is called once (what naming it asks for, as vLLM's named tool_choice does);
required allows further calls unless `parallel_tool_calls` is false. Pythonic calls have no grammar, so for that dialect required and named tool_choice are refused (400):
a forced `[f(` start alone could still end as text, which a client that asked for a call cannot tell from one.
"""

from __future__ import annotations

from functools import lru_cache

from oospec.engine.constraint import GrammarConstraint, GrammarError, GrammarVocabulary, probe
from oospec.engine.drafting import Request
from oospec.engine.engine import fit_context, render_chat, validate_messages
from oospec.errors import ContextLengthError, InvalidMessagesError
from oospec.server.errors import bad_request, clip
from oospec.server.schemas import ChatRequest
from oospec.tools.call_grammar import call_grammar, forced_call_start
from oospec.tools.chat_text import ClientText
from oospec.tools.dialects import Dialect, ToolCall, get_dialect
from oospec.tools.render import to_json
from oospec.tools.schema_limits import UnsupportedSchema

DEFAULT_SYSTEM = "You are a helpful assistant."


def template_knows_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "tools" in template and "tool_calls" in template


def build_request(engine, req: ChatRequest, *, default_max_tokens: int, budget: int) -> tuple[Request, str]:
    """The engine's Request for a validated chat request (the one place the server states it), and the start of
    the reply the prompt forces ("" when tool_choice is none or auto); a 400 when the messages cannot be rendered,
    the prompt leaves no room in the context, or tool_choice's tools make no grammar."""
    tokenizer = engine.tokenizer
    dialect = get_dialect(req.options.dialect)
    constraint = call_constraint(engine, req, dialect)  # first: a schema no grammar holds is refused as such
    offer_tools = bool(req.tools) and req.tool_choice != "none" and not req.options.tools_in_prompt
    # The client's strings are marked before anything of the server's joins them, so that control-token strings
    # in them are tokenized as text and the server's markup (dialect, tools block) as the tokenizer reads it.
    client = ClientText(tokenizer)
    client_messages, client_tools = client.mark(req.messages), client.mark(req.tools)
    if template_knows_tools(tokenizer):
        messages, template_tools = client_messages, (client_tools if offer_tools else None)
    else:
        messages, template_tools = as_plain_messages(client_messages, dialect), None
        if offer_tools:
            messages = with_tools_in_system(messages, client_tools, dialect)
    forced = forced_reply_start(req, dialect)
    try:
        validate_messages(messages)
        ids = client.encode_array(render_chat(client, messages, template_tools) + forced)
    except InvalidMessagesError as exc:
        raise bad_request(str(exc), "messages") from None
    wanted = req.max_tokens if req.max_tokens is not None else default_max_tokens
    try:
        max_new_tokens = fit_context(ids.size, wanted, engine.target.max_context)
    except ContextLengthError as exc:
        what = "messages and tools" if offer_tools else "messages"
        raise bad_request(f"{exc} (from the {what})", "messages", code="context_length_exceeded") from None
    parse_calls = req.tool_schemas is not None and req.tool_choice != "none"
    request = Request(
        prompt_ids=ids,
        messages=client.unmark(messages),  # as the chat template got them (drafters read the user's words here)
        tools=req.tool_schemas if parse_calls else None,
        dialect=dialect.name,
        # the sidecar renders its prompt from the messages and the tools as the template got them ([]: none, or
        # written into the messages)
        chat_tools=client.unmark(template_tools) or [],
        max_new_tokens=max_new_tokens,
        budget=budget,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        constraint=constraint,
    )
    return request, forced


def forced_reply_start(req: ChatRequest, dialect: Dialect) -> str:
    if req.tool_choice in ("required", "function"):
        return forced_call_start(dialect, req.forced_function if req.tool_choice == "function" else None)
    return ""


def call_constraint(engine, req: ChatRequest, dialect: Dialect) -> GrammarConstraint | None:
    """The grammar a reply that must call a tool is decoded under (None: tool_choice none or auto), or a 400 when
    there can be none: a dialect without a grammar (pythonic), or tools' parameters that no grammar can follow
    (`unsupported_schema`, naming the tool): each tool the reply may call is checked on its own when the request is
    admitted (oospec.tools.schema_limits, then a compile and a short walk: oospec.engine.constraint.probe), so that
    no schema fails once decoding has begun."""
    if req.tool_choice not in ("required", "function"):
        return None
    if not dialect.openers:
        choice = "required" if req.forced_function is None else f"naming function {req.forced_function!r}"
        raise bad_request(f"tool_choice {choice} cannot be honoured in the {dialect.name!r} dialect: its calls "
                          "have no grammar to hold the reply to a call; use tool_choice 'auto', or a JSON dialect "
                          "such as 'hermes'", "tool_choice", code="unsupported_tool_choice")
    function = req.forced_function if req.tool_choice == "function" else None
    vocabulary = engine.grammar_vocabulary()
    for i, tool in enumerate(req.tools or []):
        name = tool["function"]["name"]
        if function in (None, name):
            problem = tool_grammar_problem(vocabulary, tool, dialect)
            if problem is not None:
                raise bad_request(f"tools[{i}] ({name!r}) cannot be held to a forced call (tool_choice "
                                  f"{req.tool_choice!r}): {clip(problem, 300)}", f"tools[{i}].function.parameters",
                                  code="unsupported_schema")
    try:
        # one call for a named function (what naming it asks for); one or more for "required" unless the
        # client turned parallel calls off
        return engine.call_constraint(req.tools or [], dialect, function,
                                      parallel=req.parallel_tool_calls and function is None)
    except (GrammarError, UnsupportedSchema) as exc:
        raise bad_request(f"tool_choice {req.tool_choice!r} needs the tools' parameters as a grammar, and they do "
                          f"not make one: {clip(str(exc), 300)}", "tools", code="unsupported_schema") from None


@lru_cache(maxsize=4096)
def _grammar_problem(vocabulary: GrammarVocabulary, grammar: str, forced: str) -> str | None:
    return probe(vocabulary, grammar, forced)


def tool_grammar_problem(vocabulary: GrammarVocabulary, tool: dict, dialect: Dialect) -> str | None:
    """Why a forced call of `tool` (an OpenAI tool definition) could not be decoded, or None. Agents send the same
    tools with every turn: the verdict is kept per grammar."""
    name = tool["function"]["name"]
    try:
        grammar = call_grammar([tool], [name], dialect, parallel=False, special_tokens=vocabulary.special_tokens)
    except UnsupportedSchema as exc:
        return str(exc)
    return _grammar_problem(vocabulary, grammar, forced_call_start(dialect, name))


def tools_block(tools: list[dict], dialect: Dialect) -> str:
    """The tool signatures and the call format, worded as Qwen2.5's chat template words them."""
    signatures = "\n".join(to_json(t) for t in tools)
    example = "{" + f'"name": <function-name>, "{dialect.args_key}": <args-json-object>' + "}"
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{signatures}\n"
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        f"<tool_call></tool_call> XML tags:\n<tool_call>\n{example}\n</tool_call>"
    )


def with_tools_in_system(messages: list[dict], tools: list[dict], dialect: Dialect) -> list[dict]:
    block = tools_block(tools, dialect)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": f"{DEFAULT_SYSTEM}\n\n{block}"}, *messages]


def as_plain_messages(messages: list[dict], dialect: Dialect) -> list[dict]:
    """Messages with only role and string content: calls written out in `dialect`, tool results as user turns."""
    out: list[dict] = []
    for msg in messages:
        role, content = msg["role"], msg.get("content") or ""
        if role == "assistant" and msg.get("tool_calls"):
            calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
            content = (content + "\n" if content else "") + dialect.render(calls)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": role, "content": content})
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
