"""The real server (SmolLM2-135M on loopback) under hostile input (issue 18): every finding as a regression
test, then a bounded property-based fuzz from the server's own OpenAPI schema (Schemathesis). Nothing a client
sends may get a 5xx or a reset connection; /health stays fast while a 20 MB request is refused."""

import http.client as httpclient
import json
import random
import socket
import threading
import time

import psutil
import pytest
from test_server import KEY, MODEL, TIME, TWO_SHOT, WEATHER, Server, http

from oospec.server.guard import json_depth
from oospec.server.reply import ToolCallStream
from oospec.server.worker import Worker
from oospec.tools.dialects import get_dialect

CHAT = [{"role": "user", "content": "Say hi."}]
FUZZ_EXAMPLES = 150  # per generation mode; the whole fuzz stays well under a minute
RELIABILITY: dict = {}  # measured figures, printed at the end of the module (run with -s to see them)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("hostile"), "--max-queue", "4", "--max-new-tokens", "4",
                 "--max-body-mb", "24", "--header-timeout", "2", "--body-timeout", "2",
                 "--log-level", "info")
    yield srv
    print("\nRELIABILITY", json.dumps(RELIABILITY))
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output(), srv.output()


class Connection:
    """One keep-alive connection: a reset or a closed socket between requests fails the test."""

    def __init__(self, server):
        self.conn = httpclient.HTTPConnection("127.0.0.1", server.port, timeout=120)

    def post(self, raw: bytes, headers: dict | None = None, path="/v1/chat/completions"):
        hdrs = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}", **(headers or {})}
        self.conn.request("POST", path, body=raw, headers=hdrs)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data.startswith(b"{") else data), resp


def post(server, body=None, raw=None, **headers):
    conn = Connection(server)
    status, reply, _ = conn.post(raw if raw is not None else json.dumps(body).encode(), headers)
    assert status < 500, reply
    return status, reply


def refused(server, status, body=None, raw=None, param=None, **headers):
    got, reply = post(server, body, raw, **headers)
    assert got == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"} and reply["error"]["message"]
    if param is not None:
        assert reply["error"]["param"] == param, reply
    return reply["error"]


# --------------------------------------------------------------------------------------------------
# The findings, one by one
# --------------------------------------------------------------------------------------------------


def test_deep_json_is_refused_and_the_connection_lives_on(server):
    conn = Connection(server)
    deep_messages = b'{"messages": ' + b"[" * 10000 + b"]" * 10000 + b"}"
    deep_schema = '{"type": "object", "properties": {"x": ' * 700 + "{}" + "}}" * 700
    tool = '{"type": "function", "function": {"name": "f", "parameters": ' + deep_schema + "}}"
    deep_tools = ('{"messages": [{"role": "user", "content": "hi"}], "tools": [' + tool + "]}").encode()
    deep_unknown = b'{"messages": [{"role": "user", "content": "hi"}], "extra": ' + b"{\"a\": " * 5000 + b"1" + \
        b"}" * 5000 + b"}"
    for raw in (deep_messages, deep_tools, deep_unknown):
        status, reply, _ = conn.post(raw)
        assert status == 400 and reply["error"]["code"] == "json_too_deep", reply
    shallow = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    node = shallow["properties"]["a"]
    for _ in range(20):  # deeper than tool schemas may nest (two containers a level), within the body's limit
        node["properties"]["x"] = {"type": "object", "properties": {}}
        node = node["properties"]["x"]
    tool = {"type": "function", "function": {"name": "f", "parameters": shallow}}
    status, reply, _ = conn.post(json.dumps({"messages": CHAT, "tools": [tool]}).encode())
    assert status == 400 and reply["error"]["param"] == "tools[0].function.parameters", reply
    status, reply, _ = conn.post(json.dumps({"messages": CHAT, "model": MODEL}).encode())  # same socket
    assert status == 200, reply


@pytest.mark.parametrize("stream", [False, True])
def test_tiny_temperature_is_greedy_and_tiny_top_p_keeps_the_top_token(server, stream):
    client = server.client()
    greedy = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    for extra in ({"temperature": 1e-300}, {"temperature": 0.7, "top_p": 1e-300}):
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=6, stream=True, **extra) if c.choices)
        else:
            text = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, **extra) \
                .choices[0].message.content
        assert text == greedy.choices[0].message.content  # one token kept, or greedy: the same text


def test_seed_range(server):
    refused(server, 400, {"messages": CHAT, "seed": 2**64}, param="seed")
    refused(server, 400, {"messages": CHAT, "seed": -1}, param="seed")
    status, _ = post(server, {"messages": CHAT, "seed": 2**64 - 1, "temperature": 0.5})
    assert status == 200


@pytest.mark.parametrize("dialect", [["hermes"], {"name": "hermes"}, 7, None])
def test_non_string_dialect(server, dialect):
    refused(server, 400, {"messages": CHAT, "oospec": {"dialect": dialect}}, param="oospec.dialect")


def test_auth_content_type_and_timeout_values(server):
    assert refused(server, 401, {"messages": CHAT}, Authorization=KEY)["code"] == "invalid_api_key"
    assert post(server, {"messages": CHAT}, Authorization=f"bearer {KEY}")[0] == 200  # the scheme is any case
    assert refused(server, 415, raw=json.dumps({"messages": CHAT}).encode(), **{"Content-Type": "text/plain"})
    for value in (b"NaN", b"Infinity", b"-Infinity", b"0", b"1e400"):
        raw = b'{"messages": [{"role": "user", "content": "hi"}], "oospec": {"timeout_s": ' + value + b"}}"
        refused(server, 400, raw=raw, param="oospec.timeout_s")


def test_model_not_served_is_404(server):
    error = refused(server, 404, {"messages": CHAT, "model": "gpt-4o"}, param="model")
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"


def test_limits_on_messages_tools_and_body_size(server):
    many = [{"role": "user", "content": "x"}] * 16000
    refused(server, 400, {"messages": many}, param="messages")
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(200)]
    refused(server, 400, {"messages": CHAT, "tools": tools}, param="tools")
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (25 * 2**20) + b'"}]}'
    assert refused(server, 413, raw=big)["code"] == "request_too_large"


def test_a_20_mb_prompt_is_refused_without_stalling_health(server):
    proc = psutil.Process(server.proc.pid)
    baseline = proc.memory_info().rss
    raw = json.dumps({"messages": [{"role": "user", "content": "word " * (4 * 2**20)}]}).encode()  # 20 MB
    result, peak, health_s = {}, [baseline], []

    def send():
        result["reply"] = post(server, raw=raw)

    sender = threading.Thread(target=send)
    sender.start()
    while sender.is_alive():
        peak.append(proc.memory_info().rss)
        t0 = time.perf_counter()
        status, _, _ = http("GET", server.url + "/health", timeout=10)
        health_s.append(time.perf_counter() - t0)
        assert status == 200
        time.sleep(0.01)
    sender.join()
    status, reply = result["reply"]
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    time.sleep(0.5)
    after = proc.memory_info().rss
    RELIABILITY.update(health_checks=len(health_s), slowest_health_s=round(max(health_s), 4),
                       baseline_rss_mb=round(baseline / 2**20), peak_rss_mb=round(max(peak) / 2**20),
                       rss_after_mb=round(after / 2**20))
    assert max(health_s) < 0.5
    assert max(peak) - baseline < 1024 * 2**20


def test_idle_sockets_are_closed_after_the_header_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        t0 = time.monotonic()
        assert s.recv(100) == b""  # closed by the server
        assert time.monotonic() - t0 < 5


def test_errors_say_what_is_wrong_in_one_bounded_line(server):
    """Issue 33: a missing Content-Type is named as such, an image part by its type, a huge model name is not
    sent back whole."""
    conn = httpclient.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"messages": CHAT}).encode(),
                 headers={"Authorization": f"Bearer {KEY}"})  # a valid body, no Content-Type
    resp = conn.getresponse()
    error = json.loads(resp.read())["error"]
    assert resp.status == 415 and "no Content-Type" in error["message"], error
    error = refused(server, 415, raw=b"{}", **{"Content-Type": "text/plain; charset=utf-8"})
    assert "'text/plain; charset=utf-8'" in error["message"]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    error = refused(server, 400, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]},
                    param="messages[0].content[1]")
    assert "'image_url'" in error["message"] and "\n" not in error["message"] and len(error["message"]) < 200
    error = refused(server, 404, {"messages": CHAT, "model": "m" * 200_000}, param="model")
    assert len(error["message"]) < 300 and "…" in error["message"]
    status, reply, _ = http("GET", server.url + "/v1/models/" + "m" * 5000, key=KEY)
    assert status == 404 and len(reply["error"]["message"]) < 300


def test_a_body_that_stops_arriving_gets_408_and_the_connection_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"messages\": [")
        t0 = time.monotonic()
        answer = b""
        while chunk := s.recv(4096):  # read until the server closes the connection
            answer += chunk
        assert time.monotonic() - t0 < 10  # the body timeout is 2 s
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer[:300]


def test_streamed_and_final_arguments_are_the_same_text(server):
    client = server.client()
    kwargs = dict(model=MODEL, messages=TWO_SHOT, tools=[WEATHER], max_tokens=30)
    final = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    streamed: dict = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for d in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            streamed[d.index] = streamed.get(d.index, "") + (d.function.arguments or "")
    assert final and [c.function.arguments for c in final] == [streamed[i] for i in sorted(streamed)]


def test_duplicated_keys_are_sent_as_written_in_both_modes():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "city":  "Oslo"}}\n</tool_call>'
    stream = ToolCallStream(["get_weather"], get_dialect("hermes"))
    events = [ev for i in range(0, len(text), 3) for ev in stream.feed(text[i:i + 3])]
    _, calls, _, final = stream.finish()
    streamed = "".join(ev[2] for ev in events + final if ev[0] == "args")
    assert streamed == calls[0].arguments == '{"city": "Rome", "city":  "Oslo"}'


def test_retry_after_counts_the_queue():
    worker = Worker(lambda job: None, max_queue=4)
    try:
        worker.recent_s.extend([3.0] * 5)
        worker._queue.put_nowait(object())  # (waiting jobs, never run: the worker thread is not fed them)
        assert worker.retry_after_s() >= 3
    finally:
        worker._queue.get_nowait()
        worker.close(1)


def test_json_depth_scan_is_linear_on_unterminated_strings():
    t0 = time.perf_counter()
    assert json_depth(b'"' + b'\\"' * 2**20) == 0  # one string that never ends, full of escaped quotes
    assert json_depth(b'[{"a": "]]]"}, [[]]]') == 3
    assert time.perf_counter() - t0 < 1


def _depth_char_by_char(text: str) -> int:
    depth = peak = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            peak = max(peak, depth)
        elif c in "]}":
            depth -= 1
    return peak


def test_json_depth_agrees_with_a_char_by_char_scan_across_chunk_boundaries():
    """Random JSON-like text: brackets, strings holding brackets, escaped quotes and backslashes, sometimes a
    string left open (ending on a lone backslash); scanned in chunks as small as one byte, so that every
    backslash run and string crosses a chunk boundary somewhere."""
    rng = random.Random(0)
    inner = ["a", "[", "]", "{", "\\\\", '\\"']
    for _ in range(2000):
        parts = [rng.choice("[]{},:") if rng.random() < 0.5 else
                 '"' + "".join(rng.choices(inner, k=rng.randint(0, 6))) + '"' for _ in range(rng.randint(0, 30))]
        if rng.random() < 0.3:
            parts.append('"' + "".join(rng.choices(inner, k=rng.randint(0, 6))) + rng.choice(["", "\\"]))
        text = "".join(parts)
        for chunk_bytes in (1, 2, 3, 7, 2**20):
            assert json_depth(text.encode(), chunk_bytes) == _depth_char_by_char(text), (text, chunk_bytes)


# --------------------------------------------------------------------------------------------------
# Fuzz from the server's own OpenAPI schema
# --------------------------------------------------------------------------------------------------


def test_fuzz_from_the_openapi_schema_gets_no_5xx(server):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.generation import GenerationMode

    auth = {"Authorization": f"Bearer {KEY}"}
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json", headers=auth)
    chat = schema["/v1/chat/completions"]["POST"]
    seen: list[int] = []
    deadline = time.monotonic() + 60

    def bounded(case):
        """Valid requests generate a few tokens at most, so the fuzz spends its time on the parser."""
        if isinstance(case.body, dict):
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(case.body.get(key), int) and case.body[key] > 4:
                    case.body[key] = 4
            options = case.body.get("oospec")
            if isinstance(options, dict) and isinstance(options.get("timeout_s"), int | float):
                options["timeout_s"] = max(options["timeout_s"], 60)
        return case

    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=chat.as_strategy(generation_mode=mode).map(bounded))
        def one(case):
            if time.monotonic() > deadline:
                return
            response = case.call(base_url=server.url, headers=auth, timeout=60)
            seen.append(response.status_code)
            assert response.status_code < 500, (case.body, response.text)
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        one()
    RELIABILITY.update(fuzz_cases=len(seen), fuzz_5xx=sum(s >= 500 for s in seen),
                       fuzz_statuses={str(s): seen.count(s) for s in sorted(set(seen))})
    assert len(seen) >= 50


# --------------------------------------------------------------------------------------------------
# The findings of the hostile-client run on forced calls and text (the fuzz in test_server_fuzz.py generalises them)
# --------------------------------------------------------------------------------------------------


def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(server):
    lone = b'"hi \\ud800"'
    raw = b'{"messages": [{"role": "user", "content": ' + lone + b'}]}'
    assert refused(server, 400, raw=raw, param="messages[0].content")["code"] == "invalid_unicode"
    tool = b'{"type": "function", "function": {"name": "f", "description": ' + lone + b'}}'
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "tools": [' + tool + b']}'
    refused(server, 400, raw=raw, param="tools[0].function.description")
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "model": ' + lone + b'}'
    refused(server, 400, raw=raw, param="model")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_schemas_a_forced_call_cannot_hold_are_refused_up_front(server, choice):
    looping = {"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}}, "definitions": {
        "A": {"allOf": [{"$ref": "#/definitions/B"}]}, "B": {"allOf": [{"$ref": "#/definitions/A"}]}}}
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    for parameters in (looping, wide):
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
        error = refused(server, 400, {"messages": CHAT, "tools": [tool, TIME], "tool_choice": choice},
                        param="tools[0].function.parameters")
        assert error["code"] == "unsupported_schema" and "'get_weather'" in error["message"], error


def test_forced_calls_are_never_repeated_and_parallel_off_gives_one(server):
    """SmolLM2 at temperature 0, made to call, wrote the same call again and again (46 of 80 replies)."""
    client = server.client()
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        for parallel in (True, False):
            reply = client.chat.completions.create(
                model=MODEL, messages=TWO_SHOT + [{"role": "user", "content": "And the time in Tokyo and Oslo?"}],
                tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=parallel, max_tokens=60, temperature=0)
            calls = [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls]
            assert calls and all(a != b for i, a in enumerate(calls) for b in calls[:i]), calls
            if not parallel or isinstance(choice, dict):
                assert len(calls) == 1, calls
