"""llama.cpp as a benchmark peer (oospec/bench/llamacpp.py): the server's command line per mode, where the binaries
are looked for, the /completion request and its reply, llama-bench's JSON and the records' fields, all without
llama.cpp (a fake server in a thread answers HTTP). One slow test starts the real llama-server on SmolLM2's GGUF;
it fails, never skips, when the binary is missing."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from oospec.bench import llamacpp
from oospec.bench.llamacpp import LlamaCppError

GGUF, DRAFT, BIN = Path("/m/target.gguf"), Path("/m/draft.gguf"), Path("/b/llama-server")

# A /completion reply of this llama-server (0.5.0-dev, commit 0c1e570) to 38 prompt ids, n_predict 8, trimmed.
AR_REPLY = {
    "index": 0, "content": "La France, la France. This is", "tokens": [15319, 4649, 28, 2618, 4649, 30, 669, 314],
    "id_slot": 0, "stop": True, "tokens_predicted": 8, "tokens_evaluated": 38, "truncated": False,
    "stop_type": "limit", "stopping_word": "", "tokens_cached": 45,
    "timings": {"cache_n": 0, "prompt_n": 38, "prompt_ms": 180.444, "prompt_per_token_ms": 4.7485,
                "prompt_per_second": 210.5917, "predicted_n": 8, "predicted_ms": 68.194,
                "predicted_per_token_ms": 9.742, "predicted_per_second": 102.6483}}
# With a draft model: 33 tokens, 24 of them accepted drafts (timings only, the tokens made up).
DRAFT_REPLY = {**AR_REPLY, "tokens": list(range(33)), "stop_type": "eos",
               "timings": {**AR_REPLY["timings"], "predicted_n": 33, "predicted_ms": 586.18,
                           "predicted_per_second": 56.3, "draft_n": 24, "draft_n_accepted": 24}}

# llama-bench -p 16 -n 4 -r 1 -o json on SmolLM2, the fields read (the rest trimmed).
BENCH_ROW = {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "Intel(R) Xeon(R) Processor",
             "backends": "CPU", "model_type": "llama 256M Q4_1", "n_threads": 1, "n_prompt": 0, "n_gen": 0,
             "avg_ts": 0.0, "stddev_ts": 0.0, "samples_ts": [0.0]}
BENCH_OUTPUT = json.dumps([{**BENCH_ROW, "n_prompt": 16, "avg_ts": 201.72, "samples_ts": [201.72]},
                           {**BENCH_ROW, "n_gen": 4, "avg_ts": 126.97, "samples_ts": [126.97]}])


# -- the command lines -------------------------------------------------------------------------------------------
def command(mode: str, draft=None) -> list[str]:
    return llamacpp.server_command(BIN, GGUF, mode, threads=2, ctx_size=700, port=8123, draft=draft)


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_every_mode_runs_one_slot_on_the_given_threads_context_and_port_with_llamas_warmup():
    for mode, draft in (("ar", None), ("ngram", None), ("draft", DRAFT)):
        cmd = command(mode, draft)
        assert cmd[0] == str(BIN) and flag(cmd, "-m") == str(GGUF)
        assert flag(cmd, "-t") == flag(cmd, "-tb") == "2"
        assert flag(cmd, "--ctx-size") == "700" and flag(cmd, "--parallel") == "1" and flag(cmd, "--port") == "8123"
        assert flag(cmd, "--host") == "127.0.0.1" and "--no-warmup" not in cmd


def test_each_mode_adds_only_its_own_speculation():
    assert not {"--spec-default", "--spec-type", "--model-draft"} & set(command("ar"))
    ngram = command("ngram")
    assert "--spec-default" in ngram and "--spec-type" not in ngram and "--model-draft" not in ngram
    draft = command("draft", DRAFT)
    assert flag(draft, "--spec-type") == "draft-simple" and flag(draft, "--model-draft") == str(DRAFT)
    assert "--spec-default" not in draft and "--draft-max" not in draft  # removed in this llama.cpp: defaults


def test_modes_default_to_ar_and_ngram_and_draft_with_a_draft_model():
    assert llamacpp.parse_modes(None, None) == ["ar", "ngram"]
    assert llamacpp.parse_modes(None, "d.gguf") == ["ar", "ngram", "draft"]
    assert llamacpp.parse_modes("llamacpp-ngram,ngram", None) == ["ar", "ngram"]  # ar first, always, once
    with pytest.raises(LlamaCppError, match="unknown llama.cpp mode.*lookup"):
        llamacpp.parse_modes("ar,lookup", None)
    with pytest.raises(LlamaCppError, match="--draft"):
        llamacpp.parse_modes("ar,draft", None)


def test_llama_bench_runs_the_asked_threads_lengths_and_repeats_as_json():
    cmd = llamacpp.llama_bench_command(Path("/b/llama-bench"), GGUF, 2, 580, 128, 3)
    assert cmd == ["/b/llama-bench", "-m", str(GGUF), "-t", "2", "-p", "580", "-n", "128", "-r", "3", "-o", "json"]


# -- the binaries ------------------------------------------------------------------------------------------------
def test_binaries_come_from_the_option_else_the_environment_else_the_cache(home, monkeypatch, tmp_path):
    monkeypatch.delenv(llamacpp.DIR_ENV, raising=False)
    assert llamacpp.binary_dir() == home / "llamacpp" / "build" / "bin"
    monkeypatch.setenv(llamacpp.DIR_ENV, str(tmp_path / "env"))
    assert llamacpp.binary_dir() == tmp_path / "env"
    assert llamacpp.binary_dir(tmp_path / "given") == tmp_path / "given"


def test_a_missing_binary_names_where_it_looked_and_the_build_script(home, monkeypatch, tmp_path):
    monkeypatch.delenv(llamacpp.DIR_ENV, raising=False)
    with pytest.raises(LlamaCppError) as exc:
        llamacpp.find_binary("llama-server")
    message = str(exc.value)
    assert "\n" not in message and llamacpp.BUILD_SCRIPT in message and llamacpp.DIR_ENV in message
    assert str(home / "llamacpp" / "build" / "bin" / "llama-server") in message
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    with pytest.raises(LlamaCppError, match="not found"):  # there, but not executable
        llamacpp.find_binary("llama-server", tmp_path)
    binary.chmod(0o755)
    assert llamacpp.find_binary("llama-server", tmp_path) == binary


# -- requests and replies ----------------------------------------------------------------------------------------
def test_the_request_is_greedy_token_ids_without_the_prompt_cache():
    body = llamacpp.completion_body(np.array([1, 9690, 198], dtype=np.int64), 8)
    assert json.loads(json.dumps(body)) == {"prompt": [1, 9690, 198], "n_predict": 8, "temperature": 0, "top_k": 1,
                                            "cache_prompt": False, "return_tokens": True}


def test_a_plain_reply_gives_the_ids_and_the_servers_times():
    stats = llamacpp.completion_stats(AR_REPLY, wall_s=0.3)
    assert stats["tokens"] == AR_REPLY["tokens"] and stats["new_tokens"] == 8
    assert stats["target_forwards"] == 8 and stats["tau"] == 1.0 and stats["draft_tokens"] == 0
    assert stats["prompt_tokens"] == 38 and stats["prefill_s"] == pytest.approx(0.180444)
    assert stats["decode_s"] == pytest.approx(0.068194) and stats["e2e_s"] == 0.3
    assert stats["prompt_tok_s"] == pytest.approx(210.5917) and stats["decode_tok_s"] == pytest.approx(102.6483)


def test_accepted_drafts_are_tokens_without_a_forward_of_their_own():
    stats = llamacpp.completion_stats(DRAFT_REPLY, wall_s=1.0)
    assert stats["target_forwards"] == 33 - 24 and stats["tau"] == pytest.approx(33 / 9)
    assert (stats["draft_tokens"], stats["draft_accepted"], stats["stop_type"]) == (24, 24, "eos")


def test_a_reply_without_ids_or_with_a_truncated_prompt_is_refused():
    with pytest.raises(LlamaCppError, match="return_tokens"):
        llamacpp.completion_stats({**AR_REPLY, "tokens": []}, 0.1)
    with pytest.raises(LlamaCppError, match="--ctx-size"):
        llamacpp.completion_stats({**AR_REPLY, "truncated": True}, 0.1)
    with pytest.raises(LlamaCppError, match="unexpected"):
        llamacpp.completion_stats([AR_REPLY], 0.1)  # what a list of prompts would get


def test_llama_bench_json_gives_prompt_and_generation_speed_and_the_build():
    got = llamacpp.parse_llama_bench(BENCH_OUTPUT)
    assert (got["pp_tok_s"], got["prompt_tokens"], got["tg_tok_s"], got["new_tokens"]) == (201.72, 16, 126.97, 4)
    assert got["threads"] == 1 and got["repeats"] == 1 and got["model_type"] == "llama 256M Q4_1"
    assert got["build"] == {"build_commit": "0c1e570", "build_number": 1, "backends": "CPU",
                            "cpu_info": "Intel(R) Xeon(R) Processor"}


class FakeServer(BaseHTTPRequestHandler):
    """/completion as llama-server answers it (AR_REPLY), or 400 for an empty prompt; the bodies kept."""

    bodies: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeServer.bodies.append(body)
        status, reply = (400, {"error": {"message": "empty prompt"}}) if not body["prompt"] else (200, AR_REPLY)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    FakeServer.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_mode_warms_up_once_untimed_then_sends_every_prompt_in_order(fake_server):
    prompts = [np.arange(40), np.arange(5)]
    stats = llamacpp.run_mode(fake_server, prompts, 16)
    assert len(stats) == 2 and all(s["tokens"] == AR_REPLY["tokens"] and s["e2e_s"] > 0 for s in stats)
    warmup, *timed = FakeServer.bodies
    assert warmup["prompt"] == list(range(llamacpp.WARMUP_PROMPT_TOKENS))
    assert warmup["n_predict"] == llamacpp.WARMUP_NEW_TOKENS
    assert [b["prompt"] for b in timed] == [list(range(40)), list(range(5))] and timed[0]["n_predict"] == 16


def test_a_refused_request_says_what_the_server_answered(fake_server):
    with pytest.raises(LlamaCppError, match="400.*empty prompt"):
        llamacpp.post_completion(fake_server, [], 4)


# -- records, beside `bench run`'s ----------------------------------------------------------------------------
class Sample:
    id, gold, dataset = "item-0", None, "apibank"


def llamacpp_records(tokenizer) -> list[dict]:
    reference = AR_REPLY["tokens"]
    plain = llamacpp.completion_stats(AR_REPLY, 0.4)
    sped = {**plain, "tokens": reference[:4] + [0, 0, 0, 0], "target_forwards": 4, "e2e_s": 0.2, "decode_s": 0.034}
    return [llamacpp.record("apibank", Sample(), mode, stats, reference, tokenizer, threads=2)
            for mode, stats in (("ar", plain), ("ngram", sped))]


class Tokenizer:
    def decode(self, ids, skip_special_tokens):
        return " ".join(map(str, ids))


def test_records_compare_with_llamacpp_ar_and_summarize_against_it(monkeypatch):
    monkeypatch.setattr("oospec.bench.run.scored_call", lambda sample, text: (None, "no gold call"))
    ar, ngram = llamacpp_records(Tokenizer())
    assert (ar["method"], ar["identical"], ngram["identical"], ngram["first_diff"]) == \
        ("llamacpp-ar", True, False, 4)
    assert ngram["reference"] == "llamacpp-ar" and ngram["cores"] == "2" and ngram["cpu_threads"] == 2
    assert ngram["accurate"] is None and ngram["accuracy_note"] == "no gold call"
    row = llamacpp.summarize([ar, ngram])["apibank"]["llamacpp-ngram"]
    assert row["e2e_speedup"] == pytest.approx(2.0) and row["tau"] == pytest.approx(2.0)
    assert row["identical_rate"] == 0.0 and row["decode_speedup"] == pytest.approx(0.068194 / 0.034)


def test_records_sit_beside_a_bench_run_in_its_report(monkeypatch):
    """report.summarize pairs them with `bench run`'s `ar` on as many CPU threads."""
    from oospec.bench.report import summarize

    monkeypatch.setattr("oospec.bench.run.scored_call", lambda sample, text: (None, "no gold call"))
    ours = {"dataset": "apibank", "sample_id": "item-0", "method": "ar", "cores": "2", "cpu_threads": 2,
            "prefill_s": 0.5, "decode_s": 0.3, "e2e_s": 0.8, "new_tokens": 8, "target_forwards": 8,
            "identical": True, "accurate": None}
    methods = ["ar", "llamacpp-ar", "llamacpp-ngram"]
    rows = summarize([ours, *llamacpp_records(Tokenizer())], methods)["apibank"]
    assert list(rows) == methods and rows["llamacpp-ar"]["baseline"] == "ar"
    assert rows["llamacpp-ar"]["e2e_speedup"] == pytest.approx(0.8 / 0.4)


# -- the command -------------------------------------------------------------------------------------------------
def test_the_command_line_reaches_run_with_its_defaults(monkeypatch):
    from oospec.cli import build_parser
    from oospec.cli.options import default_of

    args = build_parser().parse_args(["bench", "llamacpp", "--dataset", "bfcl:simple_python", "--threads", "2",
                                      "--draft", "d.gguf", "--modes", "ar,draft", "--llamacpp-dir", "/x"])
    run, called = llamacpp.run, {}
    monkeypatch.setattr(llamacpp, "run", lambda selection, **kw: called.update(kw, selection=selection))
    args.func(args)
    assert called["threads"] == 2 and called["draft"] == "d.gguf" and called["modes"] == "ar,draft"
    assert called["llamacpp_dir"] == "/x" and called["gguf"] is None and called["ctx_size"] is None
    assert called["bench_repeats"] == default_of(run, "bench_repeats")
    assert called["selection"].datasets == ["bfcl:simple_python"]


# -- the real llama-server ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_llama_server_returns_greedy_ids_for_a_prompt_of_ids(smollm2_tokenizer, tmp_path):
    from oospec.engine.engine import encode_chat
    from oospec.models.provision import pull_gguf

    try:
        server = llamacpp.find_binary(llamacpp.SERVER)
    except LlamaCppError as exc:
        missing = str(exc)
    else:
        missing = None
    if missing:  # outside the except: one message, not a chained traceback
        pytest.fail(f"this test needs llama.cpp's server: {missing}", pytrace=False)
    prompt = encode_chat(smollm2_tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    port = llamacpp.free_port()
    cmd = llamacpp.server_command(server, pull_gguf("smollm2-135m"), "ar", threads=1, ctx_size=256, port=port)
    with llamacpp.running_server(cmd, port, tmp_path / "server.log") as url:
        stats = llamacpp.completion_stats(*llamacpp.post_completion(url, prompt, 8))
        again = llamacpp.completion_stats(*llamacpp.post_completion(url, prompt, 8))
    assert stats["new_tokens"] == len(stats["tokens"]) == 8 and stats["stop_type"] == "limit"
    assert stats["prompt_tokens"] == prompt.size  # the ids as given: no BOS added
    assert all(0 <= t < len(smollm2_tokenizer) for t in stats["tokens"]) and again["tokens"] == stats["tokens"]
    assert smollm2_tokenizer.decode(stats["tokens"]).strip()
