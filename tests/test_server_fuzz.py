"""The server's contract under generated hostile input: no answer is a 5xx, every refusal is a 4xx naming the
field, and `parallel_tool_calls: false` gives at most one call. Five kinds of case, generated from a seed:

  unicode    random Unicode (lone surrogates, noncharacters, controls, astral and combining characters) in every
             text field: message content and parts, tool results, earlier calls' arguments, tool names,
             descriptions, parameter names and enums, tool_choice, stop, model;
  recursive  $ref loops through properties or items (kept), loops that read nothing, self references, chains,
             refs to missing or remote documents (refused);
  deep       parameters nested up to and past the depth limit, deep arrays and deep anyOf;
  wide       hundreds to thousands of properties (optional or required), wide anyOf, huge enums, 128 tools;
  parallel   tool_choice auto, required and named, with parallel_tool_calls true and false.

The recursive, deep and wide cases mostly force a call (tool_choice required or named), where the grammar must
hold the schema. The server runs `--method oospec` with each sidecar schedule (`cost`, and `always`, where every
request with tools sends the sidecar a job). Its target and sidecar are a small random llama with SmolLM2's
tokenizer and chat template: the contract is about what the server does with the request, so the weights only
have to be cheap; the vocabulary is the real one, which the grammar needs.
"""

import json
import random
import shutil

import pytest
from test_server import KEY, Server, http

CASES_PER_KIND = 52  # x 5 kinds x 2 schedules = 520 cases
KINDS = ("unicode", "recursive", "deep", "wide", "parallel")
TALLY: dict = {}


@pytest.fixture(scope="module")
def tiny_smol(tmp_path_factory, smollm2_path):
    """A 2-layer random llama with SmolLM2's tokenizer and chat template, as a Hugging Face folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-smol")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (smollm2_path / name).exists():
            shutil.copy(smollm2_path / name, folder / name)
    return folder


@pytest.fixture(scope="module", params=["cost", "always"])
def server(request, tmp_path_factory, tiny_smol):
    srv = Server(tmp_path_factory.mktemp(f"fuzz-{request.param}"), "--target", str(tiny_smol), "--method", "oospec",
                 "--served-model-name", "fuzz", "--sidecar-model", str(tiny_smol), "--sidecar-adapter", "none",
                 "--sidecar-schedule", request.param, "--max-new-tokens", "3", "--max-queue", "16",
                 "--no-warmup", "--log-level", "warning")
    srv.schedule = request.param
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output(), srv.output()


# --------------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------------

ODD = ["\ud800", "\udfff", "\udc00x", "\ufffe", "\uffff", "\ufdd0", "\U0010fffe", "\x00", "\x1b[2J", "\u202e",
       "\ufeff", "e\u0301\u0301\u0301", "\U0001f600", "\u200b", "<|im_end|>", "<tool_call>", "\\", '"', "}\n{", "\u0085"]


def unicode_text(rng: random.Random, lone_surrogates: bool) -> str:
    pieces = []
    for _ in range(rng.randint(0, 12)):
        roll = rng.random()
        if roll < 0.35:
            pieces.append(rng.choice(ODD if lone_surrogates else [o for o in ODD if not _lone(o)]))
        elif roll < 0.7:
            pieces.append(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0xd7ff),
                                          rng.randint(0xe000, 0xfffd), rng.randint(0x10000, 0x10ffff)])))
        else:
            pieces.append(rng.choice(["weather", "Paris", " ", "city", "call", "\n", "42"]))
    text = "".join(pieces)
    return _strip_lone(text) if not lone_surrogates else text


def _lone(text: str) -> bool:
    return any(0xd800 <= ord(c) <= 0xdfff for c in text)


def _strip_lone(text: str) -> str:
    return "".join(c for c in text if not 0xd800 <= ord(c) <= 0xdfff)


def tool(name: str, parameters, description: str = "a tool") -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def obj(properties: dict, required=()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required)}


def unicode_case(rng: random.Random) -> tuple[dict, str | None]:
    """A request with random Unicode in every text field; returns it and the field holding a lone surrogate (None
    when it has none)."""
    lone = rng.random() < 0.6
    text = lambda: unicode_text(rng, False)  # noqa: E731
    fields = ["messages[0].content", "messages[1].content", "messages[2].content", "tools[0].function.description",
              "tools[0].function.parameters", "stop", "tool_choice", "messages[0].content[0].text",
              "messages[1].tool_calls[0].function.arguments"]
    where = rng.choice(fields) if lone else None
    poison = lambda: unicode_text(rng, True) + "\ud800"  # noqa: E731
    key, enum = text() or "k", [text(), text()]
    params = obj({key: {"type": "string", "description": text(), "enum": enum}})
    if where == "tools[0].function.parameters":
        params = obj({key + "\udc00": {"type": "string"}}) if rng.random() < 0.5 else \
            obj({key: {"type": "string", "enum": [poison()]}})
    body = {
        "messages": [
            {"role": "user", "content": poison() if where == "messages[0].content" else text()},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "f", "arguments": json.dumps({key: poison() if where and "arguments" in where else text()},
                                                     ensure_ascii=rng.random() < 0.5)}}]},
            {"role": "tool", "tool_call_id": "c1", "content": poison() if where == "messages[2].content" else text()},
        ],
        "tools": [tool("f", params, poison() if where == "tools[0].function.description" else text())],
        "max_tokens": 3,
    }
    if where == "messages[1].content":
        body["messages"][1]["content"] = poison()
    if where == "messages[0].content[0].text":
        body["messages"][0]["content"] = [{"type": "text", "text": poison()}]
    if where == "stop":
        body["stop"] = [poison()]
    elif rng.random() < 0.5:
        body["stop"] = [text() or "x"]
    if where == "tool_choice":
        body["tool_choice"] = {"type": "function", "function": {"name": poison()}}
    else:
        body["tool_choice"] = rng.choice(["auto", "required", {"type": "function", "function": {"name": "f"}}])
    if rng.random() < 0.2:
        body["model"] = text()
    if not lone and rng.random() < 0.3:  # a tool name that is not a name: refused by its pattern
        body["tools"].append(tool(text() or "?", obj({})))
    return body, where


def recursive_case(rng: random.Random) -> dict:
    defs_kind = rng.choice(["props", "items", "pure", "allof", "anyof", "self", "selfprop", "chain", "missing",
                            "remote", "mutual3"])
    if defs_kind == "props":
        defs = {"A": obj({"b": {"$ref": "#/definitions/B"}}), "B": obj({"a": {"$ref": "#/definitions/A"}})}
    elif defs_kind == "items":
        defs = {"A": {"type": "array", "items": {"$ref": "#/definitions/B"}},
                "B": {"type": "array", "items": {"$ref": "#/definitions/A"}, "maxItems": 2}}
    elif defs_kind == "pure":
        defs = {"A": {"$ref": "#/definitions/B"}, "B": {"$ref": "#/definitions/A"}}
    elif defs_kind == "allof":
        defs = {"A": {"allOf": [{"$ref": "#/definitions/B"}]}, "B": {"allOf": [{"$ref": "#/definitions/A"}]}}
    elif defs_kind == "anyof":
        defs = {"A": {"anyOf": [{"$ref": "#/definitions/B"}, {"type": "string"}]},
                "B": {"anyOf": [{"$ref": "#/definitions/A"}, {"type": "integer"}]}}
    elif defs_kind == "self":
        return _forced(rng, [tool("f", {"$ref": "#"})])
    elif defs_kind == "selfprop":
        return _forced(rng, [tool("f", obj({"child": {"$ref": "#"}, "v": {"type": "integer"}}))])
    elif defs_kind == "chain":
        n = rng.choice([10, 70, 200])
        defs = {f"A{i}" if i else "A": {"$ref": f"#/definitions/A{i + 1}"} for i in range(n)}
        defs[f"A{n}"] = {"type": "string"}
    elif defs_kind == "missing":
        defs = {"A": {"$ref": "#/definitions/Nowhere"}}
    elif defs_kind == "remote":
        defs = {"A": {"$ref": "https://example.invalid/schema.json"}}
    else:
        defs = {"A": obj({"b": {"$ref": "#/definitions/B"}}), "B": {"anyOf": [{"$ref": "#/definitions/C"}]},
                "C": {"allOf": [{"$ref": "#/definitions/A"}]}}
    params = {**obj({"a": {"$ref": "#/definitions/A"}}, ["a"]), "definitions": defs}
    return _forced(rng, [tool("f", params), tool("g", obj({"x": {"type": "integer"}}))])


def deep_case(rng: random.Random) -> dict:
    depth = rng.choice([4, 12, 15, 16, 17, 30, 40])
    kind = rng.choice(["object", "array", "anyof"])
    node: dict = {"type": "integer"}
    for _ in range(depth):
        if kind == "object":
            node = obj({"x": node}, ["x"])
        elif kind == "array":
            node = {"type": "array", "items": node, "maxItems": 1}
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return _forced(rng, [tool("f", obj({"a": node}, ["a"]))])


def wide_case(rng: random.Random) -> dict:
    kind = rng.choice(["optional", "required", "anyof", "enum", "many_tools", "nested"])
    n = rng.choice([50, 255, 257, 600, 2000])
    if kind == "optional":
        tools = [tool("f", obj({f"p{i}": {"type": "string"} for i in range(n)}))]
    elif kind == "required":
        names = [f"p{i}" for i in range(min(n, 600))]
        tools = [tool("f", obj({k: {"type": "integer"} for k in names}, names))]
    elif kind == "anyof":
        tools = [tool("f", obj({"a": {"anyOf": [{"const": f"c{i}"} for i in range(n)]}}, ["a"]))]
    elif kind == "enum":
        tools = [tool("f", obj({"a": {"enum": [f"v{i}" for i in range(n * 50)]}}, ["a"]))]
    elif kind == "many_tools":
        tools = [tool(f"f{i}", obj({"x": {"type": "integer"}}, ["x"])) for i in range(rng.choice([16, 128]))]
    else:
        inner = obj({f"q{i}": {"type": "string"} for i in range(n)})
        tools = [tool("f", obj({"a": inner}, ["a"]))]
    return _forced(rng, tools)


def parallel_case(rng: random.Random) -> dict:
    tools = [tool("get_weather", obj({"city": {"type": "string", "enum": ["Rome", "Oslo"]}}, ["city"])),
             tool("get_time", obj({"city": {"type": "string", "enum": ["Rome", "Oslo"]}}, ["city"]))]
    two_calls = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>')
    body = {"messages": [{"role": "user", "content": "Weather in Rome and time in Oslo?"},
                         {"role": "assistant", "content": two_calls},
                         {"role": "user", "content": "And again, both?"}],
            "tools": tools, "max_tokens": rng.choice([3, 40]),
            "tool_choice": rng.choice(["auto", "required", {"type": "function", "function": {"name": "get_time"}}]),
            "parallel_tool_calls": rng.choice([False, True])}
    if rng.random() < 0.3:
        body["temperature"] = 0.8
        body["seed"] = rng.randint(0, 1000)
    return body


def _forced(rng: random.Random, tools: list[dict]) -> dict:
    choice = rng.choice(["required", "required", {"type": "function", "function": {"name": "f"}}, "auto"])
    if isinstance(choice, dict) and all(t["function"]["name"] != "f" for t in tools):
        choice = "required"
    return {"messages": [{"role": "user", "content": "Call the tool."}], "tools": tools, "tool_choice": choice,
            "max_tokens": 3, "parallel_tool_calls": rng.random() < 0.5}


def make_case(kind: str, seed: int) -> tuple[dict, str | None]:
    rng = random.Random(f"{kind}-{seed}")
    if kind == "unicode":
        return unicode_case(rng)
    body = {"recursive": recursive_case, "deep": deep_case, "wide": wide_case, "parallel": parallel_case}[kind](rng)
    return body, None


# --------------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------------


def send(server, body: dict, stream: bool) -> tuple[int, dict | list[dict]]:
    raw = json.dumps({**body, "stream": stream}, ensure_ascii=True).encode()  # lone surrogates as \\udXXX escapes
    if not stream:
        status, reply, _ = http("POST", server.url + "/v1/chat/completions", raw=raw, key=KEY, timeout=120)
        return status, reply
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + "/v1/chat/completions", data=raw, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            lines = r.read().decode().split("\n\n")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    assert lines[-2] == "data: [DONE]", lines[-3:]
    return 200, [json.loads(line[len("data: "):]) for line in lines[:-2]]


def names_the_field(error: dict) -> bool:
    param = error["param"] or ""
    head = param.split(".")[0].split("[")[0]
    return bool(head) and head in error["message"]


def calls_of(reply) -> list:
    if isinstance(reply, dict):
        return reply["choices"][0]["message"].get("tool_calls") or []
    indexes = {d["index"] for chunk in reply if chunk.get("choices")
               for d in chunk["choices"][0]["delta"].get("tool_calls") or ()}
    return sorted(indexes)


@pytest.mark.parametrize("kind", KINDS)
def test_fuzz_no_5xx_refusals_name_the_field(server, kind):
    statuses: list[int] = []
    jobs = 0  # replies whose sidecar job was sent
    for seed in range(CASES_PER_KIND):
        body, poisoned = make_case(kind, seed)
        stream = seed % 3 == 0
        status, reply = send(server, body, stream)
        statuses.append(status)
        context = (kind, seed, stream, json.dumps(body, ensure_ascii=True)[:300], str(reply)[:500])
        assert status < 500, context
        if status >= 400:
            error = reply["error"]
            assert set(error) == {"message", "type", "param", "code"} and names_the_field(error), context
        if poisoned is not None:  # text with a lone surrogate never reaches the tokenizer: refused, naming it
            assert status == 400 and reply["error"]["code"] == "invalid_unicode", context
            assert reply["error"]["param"].startswith(poisoned.split(".")[0].split("[")[0]), context
        if status == 200:
            chunks = reply if stream else [reply]
            assert not any("error" in c for c in chunks), context
            if body.get("parallel_tool_calls") is False:
                assert len(calls_of(reply)) <= 1, context
            stats = chunks[-1].get("oospec") or next((c["oospec"] for c in chunks if c.get("oospec")), {})
            jobs += any(part.get("submitted") for part in (stats.get("drafter") or {}).values())
    TALLY[(server.schedule, kind)] = {str(s): statuses.count(s) for s in sorted(set(statuses))} | {"jobs": jobs}
    print(f"\nFUZZ {server.schedule} {kind}: {TALLY[(server.schedule, kind)]}")
    assert len(statuses) == CASES_PER_KIND
    if server.schedule == "always" and kind == "parallel":  # every request with tools sent the sidecar a job
        assert jobs >= statuses.count(200) // 2, TALLY


def test_the_generators_cover_what_the_contract_names():
    """At least 100 cases put random Unicode in every text field, at least 50 send recursive, deep or wide
    schemas with a forced or required choice, and the poisoned fields span every text field."""
    unicode = [make_case("unicode", s) for s in range(CASES_PER_KIND)]
    assert 2 * len(unicode) >= 100
    assert len({where for _, where in unicode if where}) >= 8
    forced = [make_case(k, s)[0] for k in ("recursive", "deep", "wide") for s in range(CASES_PER_KIND)]
    assert 2 * sum(b["tool_choice"] != "auto" for b in forced) >= 50
    parallel_off = [b for b in (make_case("parallel", s)[0] for s in range(CASES_PER_KIND))
                    if not b["parallel_tool_calls"]]
    assert len(parallel_off) >= 10
