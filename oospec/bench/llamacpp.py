"""llama.cpp as a peer of the benchmark (`oospec bench llamacpp`): what a CPU user would otherwise run.

A speed-up over our own `ar` says little if plain llama.cpp decodes faster on the same cores, so its server is
timed on the same prompt token ids as `bench run` (built with the project's chat template code from the same
items) in three modes, each in its own llama-server, started, warmed up and stopped before the next:
`llamacpp-ar` (plain greedy), `llamacpp-ngram` (its documented default speculation) and `llamacpp-draft` (a
draft model). llama-bench adds the GGUF's prompt and generation speed. llama.cpp stays a peer: nothing in the
engine imports this module, and its binaries are built apart (experiments/llamacpp/build.sh).

Each request is greedy, one at a time, without the prompt cache; its wall time is timed here end to end, its
prefill and decode come from the server's `timings`. target_forwards is predicted_n - draft_n_accepted (each
forward gives one token more than it accepts), so tau reads as in `bench run`. `identical` compares with
llamacpp-ar's tokens: whether llama.cpp's speculation is lossless. Our `ar` runs the same GGUF dequantized, so
llama.cpp's quantized arithmetic may give other tokens than ours (compare the records' text). Records have the
fields report.summarize reads, so they can sit beside a `bench run`'s (`cpu_threads` pairs them with its `ar`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from oospec.bench.items import BenchError

BUILD_SCRIPT = "experiments/llamacpp/build.sh"
DIR_ENV = "OOSPEC_LLAMACPP_DIR"
SERVER, BENCH = "llama-server", "llama-bench"
HOST = "127.0.0.1"
METHOD_PREFIX = "llamacpp-"
REFERENCE_MODE = "ar"  # every mode's tokens are compared with this one's
# The speculation flags of each mode; the rest of the command is every mode's. ngram: --spec-default, the
# speculation llama.cpp documents as its default (docs/speculative.md: ngram-mod, a 24-token match, drafts of 48
# to 64 tokens). draft: --model-draft run as draft-simple (this version no longer infers the type from a draft
# model), with its default draft lengths (--spec-draft-n-max 3, --spec-draft-n-min 0; --draft-max and
# --draft-min are removed in this version).
SPECULATION = {"ar": (), "ngram": ("--spec-default",), "draft": ("--spec-type", "draft-simple")}
DRAFT_ROOM = 64  # context kept beyond the reply for drafts (ngram-mod's longest)
START_TIMEOUT_S = 300.0  # a 1.5B GGUF loads and warms up in seconds; a busy machine takes longer
REQUEST_TIMEOUT_S = 900.0
WARMUP_PROMPT_TOKENS, WARMUP_NEW_TOKENS = 32, 4


class LlamaCppError(BenchError):
    """llama.cpp missing, failing to start or answering unexpectedly."""


# -- the binaries -----------------------------------------------------------------------------------------------
def binary_dir(explicit: str | os.PathLike | None = None) -> Path:
    """--llamacpp-dir, else $OOSPEC_LLAMACPP_DIR, else where build.sh puts them (under oospec's cache)."""
    from oospec.models.provision import oospec_home

    chosen = explicit or os.environ.get(DIR_ENV)
    return Path(chosen).expanduser() if chosen else oospec_home() / "llamacpp" / "build" / "bin"


def find_binary(name: str, explicit: str | os.PathLike | None = None) -> Path:
    path = binary_dir(explicit) / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LlamaCppError(f"llama.cpp's {name} not found at {path}: build it with {BUILD_SCRIPT} (or pass "
                            f"--llamacpp-dir / set ${DIR_ENV} to the folder that holds it)")
    return path


def binary_version(binary: Path) -> str:
    """What `binary --version` says (version, build and commit), one line."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    return " ".join((done.stdout + done.stderr).split())


# -- llama-server -----------------------------------------------------------------------------------------------
def server_command(binary: Path, gguf: Path, mode: str, threads: int, ctx_size: int, port: int,
                   draft: Path | None = None) -> list[str]:
    """One slot (one request at a time, the whole context), its own warm-up left on, the mode's speculation
    (`draft`: the draft mode's model; modes are checked by parse_modes)."""
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "--ctx-size", str(ctx_size),
           "--parallel", "1", "--host", HOST, "--port", str(port), *SPECULATION[mode]]
    return cmd + (["--model-draft", str(draft)] if draft is not None else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _log_tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else ""


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until /health answers 200 (the model loaded and warmed up); LlamaCppError with the log's end otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LlamaCppError(f"llama-server exited with {process.returncode} while starting:\n{_log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 while loading
            pass
        time.sleep(0.2)
    raise LlamaCppError(f"llama-server not healthy after {timeout_s:.0f} s:\n{_log_tail(log)}")


@contextmanager
def running_server(command: list[str], port: int, log: Path):
    """The base URL of llama-server started with `command` (listening on `port`), stopped on exit."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{HOST}:{port}"
    try:
        wait_healthy(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def completion_body(prompt_ids, n_predict: int) -> dict:
    """/completion's request: the prompt as token ids, greedy, no prompt cache, the generated ids returned."""
    return {"prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict), "temperature": 0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True}


def post_completion(url: str, prompt_ids, n_predict: int) -> tuple[dict, float]:
    """(the server's JSON reply, the request's wall seconds)."""
    data = json.dumps(completion_body(prompt_ids, n_predict)).encode()
    request = urllib.request.Request(f"{url}/completion", data, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
            body = reply.read()
    except urllib.error.HTTPError as exc:
        raise LlamaCppError(f"llama-server refused a completion ({exc.code}): {exc.read()[:500]!r}") from None
    except urllib.error.URLError as exc:  # it stopped (crashed, killed): its log in the output folder says why
        raise LlamaCppError(f"llama-server did not answer a completion: {exc.reason}") from None
    return json.loads(body), time.perf_counter() - t0


def completion_stats(reply: dict, wall_s: float) -> dict:
    """A record's fields from one /completion reply (the ids, the times, the drafts)."""
    if not isinstance(reply, dict) or "timings" not in reply:
        raise LlamaCppError(f"unexpected /completion reply: {str(reply)[:300]}")
    if reply.get("truncated"):
        raise LlamaCppError("llama-server truncated a prompt: raise --ctx-size")
    tokens = [int(t) for t in reply.get("tokens") or []]
    timings = reply["timings"]
    if len(tokens) != timings["predicted_n"]:
        raise LlamaCppError(f"llama-server returned {len(tokens)} token ids for {timings['predicted_n']} tokens "
                            f"(this version may not know return_tokens)")
    accepted = int(timings.get("draft_n_accepted", 0))
    forwards = max(1, len(tokens) - accepted)
    return {"tokens": tokens, "new_tokens": len(tokens), "target_forwards": forwards, "tau": len(tokens) / forwards,
            "prompt_tokens": timings["prompt_n"] + timings["cache_n"], "prefill_s": timings["prompt_ms"] / 1e3,
            "decode_s": timings["predicted_ms"] / 1e3, "e2e_s": wall_s,
            "prompt_tok_s": timings["prompt_per_second"], "decode_tok_s": timings["predicted_per_second"],
            "draft_tokens": int(timings.get("draft_n", 0)), "draft_accepted": accepted,
            "stop_type": reply.get("stop_type")}


def run_mode(url: str, prompts, max_new_tokens: int) -> list[dict]:
    """[completion_stats] of each prompt in order, after one untimed request (a short prefix of the first
    prompt: first-request costs paid, nothing item-specific learnt beyond the chat template's header)."""
    post_completion(url, prompts[0][:WARMUP_PROMPT_TOKENS], WARMUP_NEW_TOKENS)
    return [completion_stats(*post_completion(url, ids, max_new_tokens)) for ids in prompts]


# -- llama-bench ------------------------------------------------------------------------------------------------
def llama_bench_command(binary: Path, gguf: Path, threads: int, prompt_tokens: int, new_tokens: int,
                        repeats: int) -> list[str]:
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt_tokens), "-n", str(new_tokens),
            "-r", str(repeats), "-o", "json"]


def parse_llama_bench(output: str) -> dict:
    """Prompt (pp) and generation (tg) tokens/s from llama-bench's JSON, with the binary's build."""
    rows = json.loads(output)
    pp = next(r for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return {"pp_tok_s": pp["avg_ts"], "pp_stddev": pp["stddev_ts"], "prompt_tokens": pp["n_prompt"],
            "tg_tok_s": tg["avg_ts"], "tg_stddev": tg["stddev_ts"], "new_tokens": tg["n_gen"],
            "repeats": len(pp["samples_ts"]), "threads": pp["n_threads"], "model_type": pp["model_type"],
            "build": {k: pp.get(k) for k in ("build_commit", "build_number", "backends", "cpu_info")}}


def run_llama_bench(binary: Path, gguf: Path, threads: int, prompt_tokens: int, new_tokens: int,
                    repeats: int) -> dict:
    cmd = llama_bench_command(binary, gguf, threads, prompt_tokens, new_tokens, repeats)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise LlamaCppError(f"llama-bench failed ({done.returncode}): {done.stderr[-800:]}")
    return {"command": cmd, **parse_llama_bench(done.stdout)}


# -- the benchmark ------------------------------------------------------------------------------------------------
def parse_modes(text: str | None, draft) -> list[str]:
    """A comma list of modes (default: ar and ngram, and draft with a draft model), `ar` first."""
    text = text or ",".join(m for m in SPECULATION if m != "draft" or draft is not None)
    modes = [m.strip().removeprefix(METHOD_PREFIX) for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in SPECULATION]
    if unknown:
        raise LlamaCppError(f"unknown llama.cpp mode(s) {unknown}; choose from {', '.join(SPECULATION)}")
    if "draft" in modes and draft is None:
        raise LlamaCppError("the draft mode needs --draft DRAFT.gguf (a small model with the target's vocabulary)")
    return [REFERENCE_MODE] + [m for m in dict.fromkeys(modes) if m != REFERENCE_MODE]


def item_prompts(selection, tokenizer) -> list[tuple]:
    """[(dataset label, sample, prompt ids)]: the items `bench run` would run, with the ids its methods get."""
    from oospec.bench.items import select
    from oospec.bench.vllm_run import sidecar_adapter
    from oospec.engine.engine import encode_chat

    # --held-out-only drops the shipped sidecar's training items, as `bench run` does with a sidecar method.
    datasets, _ = select(selection, sidecar_adapter() if selection.held_out_only else None)
    return [(label, s, encode_chat(tokenizer, s.messages, s.chat_tools())) for label, samples in datasets
            for s in samples]


def record(label: str, sample, mode: str, stats: dict, reference: list[int], tokenizer, threads: int) -> dict:
    """samples.jsonl's line of one item and mode, with the fields `bench run`'s records have."""
    from oospec.bench.records import compared
    from oospec.bench.run import scored_call

    text = tokenizer.decode(stats["tokens"], skip_special_tokens=True)
    accurate, note = scored_call(sample, text)
    return {"dataset": label, "sample_id": sample.id, "method": METHOD_PREFIX + mode, "cores": str(threads),
            "cpu_threads": threads, "target_threads": threads, **stats, **compared(reference, stats["tokens"]),
            "reference": METHOD_PREFIX + REFERENCE_MODE, "accurate": accurate, "text": text,
            **({"accuracy_note": note} if note else {})}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(records: list[dict]) -> dict:
    """{dataset: {method: {n, tau, e2e_s, e2e_speedup, decode_speedup, identical_rate, accuracy, prompt_tok_s,
    decode_tok_s}}}: sums over the items, speed-ups against llamacpp-ar on the same items."""
    summary: dict = {}
    for label, method in dict.fromkeys((r["dataset"], r["method"]) for r in records):
        rows = [r for r in records if (r["dataset"], r["method"]) == (label, method)]
        base = [r for r in records if (r["dataset"], r["method"]) == (label, METHOD_PREFIX + REFERENCE_MODE)]

        def total(rs, key):
            return sum(r[key] for r in rs)

        scored = [r["accurate"] for r in rows if r["accurate"] is not None]
        summary.setdefault(label, {})[method] = {
            "n": len(rows), "tau": _ratio(total(rows, "new_tokens"), total(rows, "target_forwards")),
            "e2e_s": total(rows, "e2e_s"), "e2e_speedup": _ratio(total(base, "e2e_s"), total(rows, "e2e_s")),
            "decode_speedup": _ratio(total(base, "decode_s"), total(rows, "decode_s")),
            "identical_rate": sum(r["identical"] for r in rows) / len(rows),
            "accuracy": sum(scored) / len(scored) if scored else None,
            "prompt_tok_s": _ratio(total(rows, "prompt_tokens"), total(rows, "prefill_s")),
            "decode_tok_s": _ratio(total(rows, "new_tokens"), total(rows, "decode_s"))}
    return summary


def target_gguf(gguf: str | None, model: str) -> Path:
    """`gguf`, else the GGUF a known `model` is converted from (the weights our engine runs)."""
    from oospec.models.provision import pull_gguf
    from oospec.models.registry import get_spec

    if gguf:
        return Path(gguf)
    if get_spec(model) is None:
        raise LlamaCppError(f"{model} is not a known model with a GGUF: pass --gguf PATH")
    return pull_gguf(model)


def run(selection, *, gguf: str | None = None, model: str, threads: int, max_new_tokens: int,
        modes: str | None = None, draft: str | None = None, ctx_size: int | None = None,
        llamacpp_dir: str | None = None, bench_repeats: int = 3, out: str | None = None) -> Path:
    """Every mode on every selected item, then llama-bench; the files written to the output folder, returned.
    `gguf`: the target's weights (default: `model`'s own GGUF); `model`: whose tokenizer builds the prompts."""
    import datetime as _dt

    from oospec.bench.records import RecordLog, output_folder, write_json
    from oospec.bench.run import invoked_command, machine_info
    from oospec.models.loading import load_tokenizer

    server = find_binary(SERVER, llamacpp_dir)
    bench = find_binary(BENCH, llamacpp_dir) if bench_repeats else None
    mode_list = parse_modes(modes, draft)
    tokenizer = load_tokenizer(model)
    gguf_path = target_gguf(gguf, model)
    items = item_prompts(selection, tokenizer)
    ctx_size = ctx_size or max(ids.size for _, _, ids in items) + max_new_tokens + DRAFT_ROOM
    folder = output_folder(out, [*selection.datasets, *selection.data], command="llamacpp")
    header = {"command": invoked_command(), "machine": machine_info(), "threads": threads, "gguf": str(gguf_path),
              "draft": draft, "tokenizer": model, "llama_server": binary_version(server), "ctx_size": ctx_size,
              "max_new_tokens": max_new_tokens, "methods": [METHOD_PREFIX + m for m in mode_list],
              "decoding": "greedy (temperature 0, top_k 1), prompt as token ids, no prompt cache, one at a time",
              "items": {}, "server_commands": {}, "started": _dt.datetime.now().isoformat(timespec="seconds")}
    for label, sample, _ in items:
        header["items"].setdefault(label, []).append(sample.id)
    records, reference = [], []
    with RecordLog(folder) as log:
        for mode in mode_list:
            port = free_port()
            command = server_command(server, gguf_path, mode, threads, ctx_size, port,
                                     Path(draft) if mode == "draft" else None)
            header["server_commands"][mode] = command
            print(f"[bench llamacpp] {METHOD_PREFIX + mode}: {len(items)} items", file=sys.stderr, flush=True)
            with running_server(command, port, folder / f"llama-server-{mode}.log") as url:
                stats = run_mode(url, [ids for _, _, ids in items], max_new_tokens)
            reference = reference or [s["tokens"] for s in stats]
            for (label, sample, _), one, ref in zip(items, stats, reference):
                records.append(record(label, sample, mode, one, ref, tokenizer, threads))
                log.write(records[-1])
    if bench is not None:
        mean_prompt = round(sum(ids.size for _, _, ids in items) / len(items))
        write_json(folder / "llama-bench.json", {"machine": header["machine"], **run_llama_bench(
            bench, gguf_path, threads, mean_prompt, max_new_tokens, bench_repeats)})
    summary = summarize(records)
    write_json(folder / "summary.json", summary)
    write_json(folder / "run.json", header)
    print(json.dumps(summary, indent=1))
    print(f"written to {folder}: samples.jsonl, summary.json, run.json" + (", llama-bench.json" if bench else ""),
          file=sys.stderr)
    return folder
