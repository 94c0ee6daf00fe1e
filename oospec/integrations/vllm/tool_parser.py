"""`--tool-parser-plugin oospec.integrations.vllm.tool_parser --tool-call-parser oospec_hermes`.

vLLM 0.32's hermes parser, plus two things:
- `adjust_request` (called once per chat request, before its SamplingParams are built) puts the request's
  tools, messages and tool_choice into `vllm_xargs`, which vLLM copies into `SamplingParams.extra_args`: the
  proposer then drafts from what the client sent instead of reading the rendered prompt (context.py);
- replies written as bare or fenced JSON call objects, as Qwen2.5-Coder writes them, are read as tool calls
  (calls.py): each call is sent whole once its object is complete, streamed or not.
Runs in vLLM's API server process. Chat completions only; other requests pass through as hermes leaves them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

from oospec.integrations.vllm.calls import json_calls, may_be_json_call
from oospec.integrations.vllm.context import xargs_with_context

PARSER_NAME = "oospec_hermes"


@ToolParserManager.register_module(PARSER_NAME)
class OospecHermesToolParser(Hermes2ProToolParser):
    def adjust_request(self, request):
        request = super().adjust_request(request)
        if isinstance(request, ChatCompletionRequest):
            request.vllm_xargs = xargs_with_context(request.vllm_xargs, request.tools, request.messages,
                                                    request.tool_choice) or None
        return request

    def extract_tool_calls(self, model_output: str, request: ChatCompletionRequest) -> ExtractedToolCallInformation:
        if self.tool_call_start_token in model_output or not may_be_json_call(model_output):
            return super().extract_tool_calls(model_output, request)
        calls = json_calls(model_output, _tool_names(request))
        if not calls:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        return ExtractedToolCallInformation(tools_called=True, content=None, tool_calls=[
            ToolCall(type="function", function=FunctionCall(name=name, arguments=json.dumps(args, ensure_ascii=False)))
            for name, args in calls])

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                     delta_token_ids: Sequence[int], request: ChatCompletionRequest):
        if self.tool_call_start_token in current_text or not may_be_json_call(current_text):
            return super().extract_tool_calls_streaming(previous_text, current_text, delta_text, previous_token_ids,
                                                        current_token_ids, delta_token_ids, request)
        calls = json_calls(current_text, _tool_names(request))
        deltas = []
        for i in range(len(self.prev_tool_call_arr), len(calls)):
            name, args = calls[i]
            text = json.dumps(args, ensure_ascii=False)
            # The serving layer reads these to finish the stream (nothing of the arguments left unsent).
            self.prev_tool_call_arr.append({"name": name, "arguments": args})
            self.streamed_args_for_tool.append(text)
            deltas.append(DeltaToolCall(index=i, type="function", id=make_tool_call_id(),
                                        function=DeltaFunctionCall(name=name, arguments=text).model_dump(
                                            exclude_none=True)))
        return DeltaMessage(tool_calls=deltas) if deltas else None


def _tool_names(request) -> set[str]:
    return {t.function.name for t in request.tools or () if getattr(t, "function", None) is not None}
