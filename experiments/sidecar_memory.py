"""Peak memory of the real sidecar predicting one job as the number of offered tools grows.

    python experiments/sidecar_memory.py --tools 1 16 64 128
    python experiments/sidecar_memory.py --apibank 8     # latency of the common job, and a digest of the answers

Each point runs in its own process (a fresh interpreter: one point's peak cannot hide another's): the
predictor is built as the server builds it (`make_predictor`: qwen2.5-coder-0.5b, shipped adapter), the
kernel's peak-RSS mark is reset after loading (/proc/self/clear_refs), one job ("What's the weather in
Paris?", N one-parameter tools) is predicted, and the peak is read back (VmHWM). Prints one JSON line per
point: tools, prompt characters, RSS after loading, peak RSS while predicting, growth, seconds, the answer
(or the error). Runs with whatever `oospec` is on PYTHONPATH, so the same script measures two branches.

--apibank N: the first N API-Bank level-1 requests as the sidecar drafter sends them, each predicted cold
(`clear_cache` first) after one warm-up job: seconds per job and a digest of the payloads without their timing
fields (equal digests: the same answers, bit for bit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time


def tools(n: int) -> list[dict]:
    """`n` one-parameter tools, the weather one among them (last, so the name scoring sees them all)."""
    out = [{"type": "function", "function": {"name": f"lookup_record_{i}", "description": f"Look up record kind {i}.",
                                              "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                             "required": ["key"]}}} for i in range(n - 1)]
    out.append({"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}},
                                                                "required": ["city"]}}})
    return out


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def one_point(n: int) -> dict:
    """Load the sidecar, predict one job with `n` tools, report memory (in this process)."""
    from oospec.sidecar import Job, make_predictor

    predictor = make_predictor()
    spec = tools(n)
    job = Job("mem", [{"role": "user", "content": "What's the weather in Paris?"}], spec, chat_tools=spec,
              opener="<tool_call>\n")
    loaded = rss_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak RSS mark to the current RSS
        f.write("5")
    t0 = time.perf_counter()
    try:
        doc = json.loads(predictor.predict(job))
        answer = {key: doc.get(key) for key in ("function", "arguments", "call_p")}
    except Exception as exc:  # a refusal is a result here: say which
        answer = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    peak = rss_kb("VmHWM")
    return {"tools": n, "prompt_chars": len(predictor.format.prompt(job)), "rss_loaded_gb": round(loaded / 2**20, 3),
            "peak_gb": round(peak / 2**20, 3), "growth_gb": round((peak - loaded) / 2**20, 3),
            "seconds": round(seconds, 1), "maxrss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "answer": answer}


def apibank_latency(n: int) -> dict:
    from oospec.datasets import load_dataset
    from oospec.sidecar import make_predictor

    predictor = make_predictor()
    jobs = [s.sidecar_job() for s in load_dataset("apibank", split="1", limit=n)]
    predictor.predict(jobs[0])  # warm-up: first-call costs are no job's
    seconds, digest, answers = [], hashlib.sha256(), []
    for job in jobs:
        predictor.clear_cache()
        t0 = time.perf_counter()
        doc = json.loads(predictor.predict(job))
        seconds.append(round(time.perf_counter() - t0, 3))
        for key in ("compute_s", "t"):
            doc.pop(key, None)
        digest.update(json.dumps(doc, sort_keys=True).encode())
        answers.append(doc)
    return {"apibank_jobs": len(jobs), "mean_s": round(sum(seconds) / len(seconds), 3), "seconds": seconds,
            "tools": [len(j.tools) for j in jobs], "answers_sha256": digest.hexdigest()[:16], "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", type=int, nargs="+", default=[1, 16, 64, 128])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: measure one point
    ap.add_argument("--apibank", type=int, help="time N API-Bank jobs instead")
    args = ap.parse_args()
    if args.apibank:
        print(json.dumps(apibank_latency(args.apibank)), flush=True)
        return
    if args.one is not None:
        print(json.dumps(one_point(args.one)), flush=True)
        return
    for n in args.tools:
        done = subprocess.run([sys.executable, __file__, "--one", str(n)], env=dict(os.environ), capture_output=True,
                              text=True)
        lines = done.stdout.strip().splitlines()
        print(lines[-1] if done.returncode == 0 and lines else
              json.dumps({"tools": n, "exit": done.returncode, "stderr": done.stderr.strip()[-300:]}), flush=True)


if __name__ == "__main__":
    main()
