"""Real vLLM: speculation with oospec's proposer, and with an adversarial one, changes no token at temperature 0.

Run by `make test-vllm` (in .venv-vllm). The file's name does not match `test_*.py`, so `make test` (the
main venv, no vLLM) never collects it; pytest collects it when it is named on the command line. Run there
without vLLM, it skips with the reason (so does no other path: in .venv-vllm every failure is a failure).

Qwen2.5-Coder-0.5B in float32, 11 API-Bank level-1 and 11 BFCL simple chats, one request at a time, each
setting in its own process (oospec.integrations.vllm.run).
"""

import json
import os
import subprocess
import sys
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


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    if not MODEL.is_dir():
        pytest.fail(f"{MODEL} is missing: `oospec models pull qwen2.5-coder-0.5b` first", pytrace=False)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    out = {}
    for spec in ("none", "oospec", "adversarial"):
        path = tmp_path_factory.mktemp("vllm") / f"{spec}.json"
        cmd = [sys.executable, "-m", "oospec.integrations.vllm.run", "--setting", spec, "--model", str(MODEL),
               "--limit", str(PER_DATASET), "--max-tokens", "96", "--enforce-eager", "--out", str(path)]
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


# -- through `vllm serve` and the openai client -----------------------------------------------------------
SPEC = {"method": "custom_class", "model": "oospec.integrations.vllm.proposer.OospecProposer",
        "num_speculative_tokens": 8}


@pytest.fixture(scope="module")
def server():
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", str(MODEL), "--dtype", "float32", "--port", str(port),
           "--max-model-len", "4096", "--speculative-config", json.dumps(SPEC), "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes", "--no-enable-prefix-caching", "--enforce-eager"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 1200
    try:
        while True:
            try:
                urllib.request.urlopen(f"{base}/v1/models", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"vllm serve did not come up:\n{proc.stderr.read()[-4000:]}", pytrace=False)
                time.sleep(5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def test_served_tool_calls_are_the_same_streamed_and_not(server):
    from openai import OpenAI

    from oospec.integrations.vllm.context import context_json
    from oospec.integrations.vllm.run import load_chats

    client = OpenAI(base_url=f"{server}/v1", api_key="none")
    chats = [(s, ctx) for s, ctx in load_chats(["bfcl:simple_python"], 4)]
    assert chats
    for i, (sample, _) in enumerate(chats):
        tools = sample.chat_tools()
        # Half the requests carry the context as `vllm_xargs`, half leave it to the rendered prompt.
        extra = {"vllm_xargs": {"oospec": context_json(tools, sample.messages)}} if i % 2 == 0 else {}
        kwargs = dict(model=str(MODEL), messages=sample.messages, tools=tools, temperature=0, max_tokens=96,
                      extra_body=extra)
        whole = client.chat.completions.create(**kwargs).choices[0].message
        calls: dict[int, dict] = {}
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
        assert whole.tool_calls, f"{sample.id}: no tool call: {whole.content!r}"
        got = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in whole.tool_calls]
        streamed = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())]
        assert streamed == got, sample.id
