"""The HTTP side of contract_fuzz.py: the client (streamed replies put together), /health watched throughout, the
error cases (raw sockets for bodies and headers that stall), and starting `oospec serve`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import requests

INF_SENTINEL = 1.2345e300  # written as 1e400 in the body (Python's json cannot write a number it cannot hold)


class Client:
    def __init__(self, url: str, key: str):
        self.url, self.key = url.rstrip("/"), key
        self.http = requests.Session()

    def chat(self, body: dict, timeout: float = 300) -> tuple[int, dict]:
        """(status, reply); a streamed reply is put together as the non-streamed one would read."""
        data = json.dumps(body).replace(json.dumps(INF_SENTINEL), "1e400").replace(json.dumps(-INF_SENTINEL), "-1e400")
        r = self.http.post(self.url + "/v1/chat/completions", data=data, timeout=timeout, stream=bool(body.get("stream")),
                           headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        if not body.get("stream") or r.status_code != 200:
            try:
                return r.status_code, r.json()
            except ValueError:
                return r.status_code, {"raw": r.text[:2000]}
        message, calls, finish, errors = {"content": None}, {}, None, []
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                errors.append(chunk["error"])
                continue
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if delta.get("content"):
                    message["content"] = (message["content"] or "") + delta["content"]
                for c in delta.get("tool_calls") or []:
                    slot = calls.setdefault(c["index"], {"id": None, "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                    slot["id"] = slot["id"] or c.get("id")
                    slot["function"]["name"] += c.get("function", {}).get("name") or ""
                    slot["function"]["arguments"] += c.get("function", {}).get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        reply = {"choices": [{"message": message, "finish_reason": finish}], "stream_errors": errors}
        return (500 if any(e.get("type") == "server_error" for e in errors) else 200), reply

    def health(self) -> tuple[float, dict]:
        start = time.monotonic()
        r = self.http.get(self.url + "/health", timeout=30)
        return time.monotonic() - start, r.json()


class HealthWatch(threading.Thread):
    """/health polled throughout, on its own connection: the slowest answer and any that failed."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.worst, self.failures, self.stop = url, 0.0, [], threading.Event()

    def run(self):
        http = requests.Session()
        while not self.stop.wait(0.5):
            start = time.monotonic()
            try:
                ok = http.get(self.url + "/health", timeout=30).status_code == 200
            except requests.RequestException as exc:
                ok = str(exc)
            self.worst = max(self.worst, time.monotonic() - start)
            if ok is not True:
                self.failures.append(ok)


def raw_exchange(url: str, head: bytes, body: bytes, wait_s: float) -> tuple[float, bytes]:
    """Send `head` and part of a body, then stall: (seconds until the server answered or closed, what it sent)."""
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port or 80), timeout=wait_s)
    start, got = time.monotonic(), b""
    try:
        s.sendall(head + body)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    finally:
        s.close()
    return time.monotonic() - start, got


def error_cases(c: Client, body_timeout: float, header_timeout: float) -> list:
    ok_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    auth = {"Authorization": f"Bearer {c.key}"}
    post = lambda data, headers: c.http.post(c.url + "/v1/chat/completions", data=data, headers=headers, timeout=60)
    out = []

    def expect(what, r, status, needle, max_len=4000):
        text = r.text
        ok = r.status_code == status and needle.lower() in text.lower() and len(text) <= max_len
        detail = f"{what}: {r.status_code}, {len(text)} bytes (want {status} naming {needle!r})"
        out.append((what, r.status_code, text[:600], ("pass" if ok else "fail", detail)))

    expect("no content-type", post(json.dumps(ok_body).encode(), auth), 415, "Content-Type")
    expect("text/plain", post(json.dumps(ok_body), {**auth, "Content-Type": "text/plain"}), 415, "text/plain")
    json_h = {**auth, "Content-Type": "application/json"}
    for part in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                 {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}):
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]}
        expect(part["type"] + " part", post(json.dumps(body), json_h), 400, part["type"])
    expect("200 KB model", post(json.dumps({**ok_body, "model": "m" * 200_000}), json_h), 404, "model_not_found")
    expect("200 KB model id", c.http.get(c.url + "/v1/models/" + "m" * 20_000, headers=auth, timeout=60), 404, "not served")
    expect("bad JSON", post('{"messages": [', json_h), 400, "")
    expect("deep nesting", post("[" * 100_000 + "]" * 100_000, json_h), 400, "deeper")
    expect("wrong key", post(json.dumps(ok_body), {"Authorization": "Bearer nope", "Content-Type": "application/json"}),
           401, "API key")
    u = urlparse(c.url)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\nAuthorization: Bearer {c.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    took, got = raw_exchange(c.url, head, b'{"messages": [', body_timeout + 20)
    ok = took <= body_timeout + 3 and (not got or b" 408 " in got.split(b"\r\n", 1)[0])
    out.append(("slow body", 408, got[:300].decode("latin-1"),
                ("pass" if ok else "fail", f"slow body: closed after {took:.1f} s (body timeout {body_timeout:g} s)")))
    took, got = raw_exchange(c.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", b"", header_timeout + 20)
    out.append(("slow headers", 0, got[:300].decode("latin-1"), ("pass" if took <= header_timeout + 3 else "fail",
                                                                   f"slow headers: closed after {took:.1f} s (header timeout {header_timeout:g} s)")))
    return out


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = args.port or free_port()
    cmd = [sys.executable, "-m", "oospec", "serve", "--model", args.model, "--method", args.method, "--api-key",
           args.api_key, "--port", str(port), "--body-timeout", str(args.body_timeout),
           "--header-timeout", str(args.header_timeout)]
    if args.method in ("oospec", "sidecar"):
        cmd += ["--sidecar-schedule", args.sidecar_schedule]
    env = {**os.environ, "OOSPEC_SIDECAR_MEMORY": args.sidecar_memory}
    log = open(Path(args.out).with_suffix(".server.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode}); see {log.name}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(1)
    proc.kill()
    sys.exit("the server did not start within 15 minutes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
