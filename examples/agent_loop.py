"""An agent loop: the model calls a tool, the tool's result goes back into the conversation, and the model goes on
until it answers in text. The same loop runs on the library (`oospec.load`) or on a running `oospec serve`.

    python examples/agent_loop.py                                   # oospec.load("qwen2.5-coder-1.5b", "toolspec")
    python examples/agent_loop.py --method oospec                   # with the sidecar's hints
    python examples/agent_loop.py --server http://127.0.0.1:8000/v1 --api-key KEY   # through the server

Every turn resends the whole conversation, as agents do: the library and the server reuse the KV cache of the
prefix they saw last turn, and the drafters remember the calls already written.
"""

from __future__ import annotations

import argparse
import json

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
TASK = "What is the weather in Paris and in Oslo right now, and what time is it in Oslo?"


def run_tool(name: str, arguments: dict) -> str:
    """The tools themselves (made up here): what an agent framework would call."""
    city = arguments.get("city", "?")
    if name == "get_weather":
        return json.dumps({"city": city, "temperature_c": 11 if city == "Paris" else 3, "sky": "clouds"})
    if name == "get_time":
        return json.dumps({"city": city, "time": "14:05"})
    return json.dumps({"error": f"no tool {name}"})


def agent(step, max_turns: int = 6) -> list[dict]:
    """Call `step(messages) -> (text, [(call id, name, arguments)])` until the model answers without a call;
    returns the conversation."""
    messages = [{"role": "user", "content": TASK}]
    for _ in range(max_turns):
        text, calls = step(messages)
        if not calls:
            messages.append({"role": "assistant", "content": text})
            break
        # Arguments as an object: what chat templates render (Qwen2.5's writes them with `tojson`); an OpenAI
        # client sends them as JSON text (server_step).
        messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls]})
        for cid, name, args in calls:
            messages.append({"role": "tool", "tool_call_id": cid, "content": run_tool(name, args)})
    return messages


def library_step(model: str, method: str):
    import oospec

    pipe = oospec.load(model, method)

    def step(messages):
        result = pipe.generate(messages, tools=TOOLS, max_new_tokens=128)
        calls = [(f"call_{i}", c.name, c.arguments) for i, c in enumerate(pipe.tool_calls(result))]
        s = result.stats
        print(f"  {s.new_tokens} tokens, {s.target_forwards} forwards (tau {s.tau:.2f}), "
              f"prefill {s.prefill_s:.2f} s ({s.prompt_tokens_reused} prompt tokens reused), decode {s.decode_s:.2f} s")
        return ("" if calls else result.text), calls

    return step, pipe


def server_step(base_url: str, api_key: str, model: str):
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key)

    def as_openai(m: dict) -> dict:
        if not m.get("tool_calls"):
            return m
        return {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                                    for c in m["tool_calls"]]}

    def step(messages):
        reply = client.chat.completions.create(model=model, messages=[as_openai(m) for m in messages], tools=TOOLS,
                                               temperature=0)
        message = reply.choices[0].message
        calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]
        return message.content or "", calls

    return step, None


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--method", default="toolspec", help="decoding method of the library loop")
    parser.add_argument("--server", help="a running `oospec serve`'s base URL: the loop goes through it")
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args(argv)
    step, pipe = (server_step(args.server, args.api_key, args.model) if args.server
                  else library_step(args.model, args.method))
    try:
        conversation = agent(step)
    finally:
        if pipe is not None:
            pipe.close()
    for m in conversation:
        calls = [c["function"] for c in m.get("tool_calls") or ()]
        print(f"{m['role']:9}", json.dumps(calls) if calls else repr(m.get("content") or ""))
    return conversation


if __name__ == "__main__":
    main()
