"""Real vLLM: speculation with oospec's proposer, and with an adversarial one, changes no token at temperature 0.

Run by `make test-vllm` (in .venv-vllm). The file's name does not match `test_*.py`, so `make test` (the
main venv, no vLLM) never collects it; pytest collects it when it is named on the command line. Run there
without vLLM, it skips with the reason (so does no other path: in .venv-vllm every failure is a failure).

Qwen2.5-Coder-0.5B in float32, 11 API-Bank level-1 and 11 BFCL simple chats, one request at a time, each
setting in its own process (`oospec bench vllm --setting`, oospec.bench.vllm_run). Then the OpenAI server (no speculation, then
oospec's proposer, with oospec's tool-parser plugin) and the openai client on 4 BFCL chats: the same tool
calls streamed and not, with and without speculation, and the proposer saw the client's tools.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

try:
    import vllm  # noqa: F401
except ImportError:
    pytest.skip("vLLM is not installed in this interpreter; these checks run in .venv-vllm: `make test-vllm`",
                allow_module_level=True)

MODEL = Path.home() / ".cache/oospec/models/qwen2.5-coder-0.5b"
PER_DATASET = 11
DATASETS = ("apibank:1", "bfcl:simple_python")
SETTINGS = {  # name -> `oospec bench vllm`'s arguments for it
    "none": ["--setting", "none"],
    "oospec": ["--setting", "oospec"],
    "adversarial": ["--setting", "custom", "--proposer", "random_proposer.RandomProposer"],
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    if not MODEL.is_dir():
        pytest.fail(f"{MODEL} is missing: `oospec models pull qwen2.5-coder-0.5b` first", pytrace=False)
    # The hostile proposer lives with the tests: vLLM's worker imports it by name from this folder.
    path_with_tests = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
               PYTHONPATH=path_with_tests)
    out = {}
    for spec, setting in SETTINGS.items():
        path = tmp_path_factory.mktemp("vllm") / f"{spec}.json"
        cmd = [sys.executable, "-m", "oospec", "bench", "vllm", *setting, "--model", str(MODEL), "--limit",
               str(PER_DATASET), "--max-new-tokens", "96", "--concurrency", "1", "--enforce-eager", "--out", str(path)]
        for name in DATASETS:
            cmd += ["--dataset", name]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"{spec}: vLLM run failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        out[spec] = json.loads(path.read_text())
    return out


def test_the_chats_ran(outputs):
    base = outputs["none"]["items"]
    assert len(base) == PER_DATASET * len(DATASETS) and all(it["tokens"] for it in base.values())


@pytest.mark.parametrize("spec", ["oospec", "adversarial"])
def test_identical_token_ids_to_no_speculation(outputs, spec):
    base, got = outputs["none"]["items"], outputs[spec]["items"]
    differ = [k for k in base if k not in got or base[k]["tokens"] != got[k]["tokens"]]
    assert not differ, f"{spec}: {len(differ)}/{len(base)} chats differ: {differ[:5]}"


def test_oospec_drafts_are_accepted(outputs):
    """Not a speed figure (that is `oospec bench vllm`): the proposer does draft in real vLLM, and vLLM accepts."""
    taus = [it["tau"] for it in outputs["oospec"]["items"].values()]
    assert sum(taus) / len(taus) > 1.5, taus


# -- through the OpenAI server and the openai client ---------------------------------------------------------
SERVED_CHATS = 4
SPEC = {"method": "custom_class", "model": "oospec.integrations.vllm.proposer.OospecProposer",
        "num_speculative_tokens": 8}


def serve_command(port: int, spec: dict | None) -> list[str]:
    """The server as the README starts it. Not the `vllm` command: vllm-cpu 0.32.0's asks for the version of
    a package named `vllm` and stops (PackageNotFoundError); the module entry point has no such lookup.
    Both servers read calls with oospec's parser: vLLM's own hermes parser finds none in Qwen2.5-Coder's
    replies (it writes fenced JSON, not `<tool_call>` tags)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL), "--dtype", "float32",
           "--port", str(port), "--max-model-len", "4096", "--enable-auto-tool-choice",
           "--tool-parser-plugin", "oospec.integrations.vllm.tool_parser", "--tool-call-parser", "oospec_hermes",
           "--no-enable-prefix-caching", "--enforce-eager"]
    return cmd + (["--speculative-config", json.dumps(SPEC)] if spec else [])


@contextmanager
def served(spec: dict | None, log_path: Path, context_log: Path):
    """A running server's base URL; the server is stopped on exit. Its log goes to a file (a pipe nobody
    reads would fill and stall it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A starved CPU (a busy shared machine) can make one engine step outlast vLLM's 300 s RPC limit, which
    # kills the engine: a check of outputs, not of speed, waits longer.
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
               VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800"),
               OOSPEC_VLLM_CONTEXT_LOG=str(context_log))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_command(port, spec), env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 1200
    try:
        while True:
            try:
                urllib.request.urlopen(f"{base}/v1/models", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not come up:\n{log_path.read_text()[-4000:]}", pytrace=False)
                time.sleep(5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # a server stuck in shutdown must not outlive the test
            proc.kill()
            proc.wait(timeout=60)


def ask(base: str, sample) -> tuple[list[dict], list[dict]]:
    """(tool calls of the whole answer, tool calls put together from the streamed chunks)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    kwargs = dict(model=str(MODEL), messages=sample.messages, tools=sample.chat_tools(), temperature=0, max_tokens=96)
    whole = client.chat.completions.create(**kwargs).choices[0].message
    calls: dict[int, dict] = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
    got = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in whole.tool_calls or []]
    streamed = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())]
    return got, streamed


@pytest.fixture(scope="module")
def served_chats():
    from oospec.bench.items import Selection
    from oospec.bench.vllm_run import load_chats

    chats = [s for s, _ in load_chats(Selection(datasets=["bfcl:simple_python"], limit=SERVED_CHATS))]
    assert len(chats) == SERVED_CHATS and all(s.chat_tools() for s in chats)
    return chats


@pytest.fixture(scope="module")
def served_answers(tmp_path_factory, served_chats):
    """{setting: {chat id: (whole, streamed)}}, one server at a time (no speculation, then oospec's proposer),
    and "context": the proposer's context log (one line per request it drafted for)."""
    folder = tmp_path_factory.mktemp("serve")
    out = {}
    for setting, spec in (("none", None), ("oospec", SPEC)):
        with served(spec, folder / f"{setting}.log", folder / f"{setting}.context.jsonl") as base:
            out[setting] = {s.id: ask(base, s) for s in served_chats}
    log = folder / "oospec.context.jsonl"
    out["context"] = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return out


@pytest.mark.parametrize("setting", ["none", "oospec"])
def test_served_tool_calls_are_the_same_streamed_and_not(served_answers, setting):
    for chat_id, (whole, streamed) in served_answers[setting].items():
        assert whole, f"{setting} {chat_id}: no tool call"
        assert streamed == whole, f"{setting} {chat_id}"


def test_served_tool_calls_with_oospec_are_those_without_speculation(served_answers):
    assert served_answers["oospec"] == served_answers["none"]


def test_the_served_proposer_drafted_from_the_clients_tools_and_messages(served_answers, served_chats):
    """Every request reached the proposer with the context the client sent (the tool-parser plugin's
    extra_args), not the fallback that reads the rendered prompt (which keeps only the last user turn)."""
    seen = served_answers["context"]
    assert len(seen) == 2 * len(served_chats), seen  # each chat asked twice: whole, then streamed
    for sample in served_chats:
        mine = [c for c in seen if c["messages"] == sample.messages]
        assert len(mine) == 2, (sample.id, seen)
        for c in mine:
            assert c["source"] == "extra_args", c
            assert c["tools"] == [t["function"]["name"] for t in sample.chat_tools()] and c["tool_choice"] == "auto"


def test_the_tool_parser_plugin_fills_extra_args_from_a_chat_request():
    """The plugin's route without a server: vLLM's own request object through adjust_request and
    to_sampling_params, as the server takes it."""
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from oospec.integrations.vllm.context import context_from_extra_args
    from oospec.integrations.vllm.tool_parser import OospecHermesToolParser

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    request = ChatCompletionRequest(model="m", messages=messages, tools=tools, max_tokens=8)
    parser = OospecHermesToolParser(AutoTokenizer.from_pretrained(MODEL), request.tools)
    params = parser.adjust_request(request).to_sampling_params(8, {})
    ctx = context_from_extra_args(params.extra_args)
    assert [t.name for t in ctx.tools] == ["get_weather"] and ctx.messages == messages
    reply = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
    info = parser.extract_tool_calls(reply, request)
    assert info.tools_called and [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls] \
        == [("get_weather", {"city": "Paris"})]
