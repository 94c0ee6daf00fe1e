"""Behaviour fingerprint of the engine: a fixed set of requests decoded by every method, greedy and sampled, the
token ids, tau and sidecar decisions written to JSON. A refactor that preserves behaviour leaves it unchanged.

    PYTHONPATH=$PWD python experiments/fingerprint.py --out base.json
    PYTHONPATH=$PWD python experiments/fingerprint.py --compare base.json   # exit 1 on any difference

`experiments/fingerprint.json` is the reference of the current engine (on an Intel Xeon with AMX: the random
model's float32 runs depend on the CPU's kernels, so make a base on the machine that compares).

Targets: SmolLM2-135M (real weights, real tool-call prompts from API-Bank) and a random qwen2 with SmolLM2's
vocabulary (tests/helpers.py), whose unconstrained output is noise, so its grammar-constrained run exercises the
mask at every step. The sidecar is an in-process stand-in (tests/sidecar_fakes.py) that answers at submit time
and on its own device, so its hints and the cost schedule's decision do not depend on timing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import tiny_model  # noqa: E402
from sidecar_fakes import InstantSidecar  # noqa: E402

from oospec import Engine  # noqa: E402
from oospec.datasets import load_dataset  # noqa: E402
from oospec.drafters import make_drafter  # noqa: E402
from oospec.sidecar import Guess  # noqa: E402

METHODS = ("plain", "ar", "toolspec", "oospec")  # plain: no drafter (the engine's non-speculative path)
TEMPERATURES = (0.0, 0.7)
SEED = 1234
MAX_NEW = 48
CHAT = [{"role": "user", "content": "List three prime numbers and say why each is prime."}]
LIGHT = {"type": "function", "function": {"name": "set_light", "parameters": {
    "type": "object", "properties": {"room": {"type": "string", "enum": ["kitchen", "hall"]},
                                     "on": {"type": "boolean"}}, "required": ["room", "on"]}}}
ALARM = {"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object", "properties": {"hour": {"type": "integer", "enum": [6, 7, 8]}}, "required": ["hour"]}}}
TOOLS = [LIGHT, ALARM]
FORCED_MESSAGES = [{"role": "user", "content": "Turn on the kitchen light and wake me at seven."}]


def make_engines() -> dict[str, Engine]:
    smol = Engine.from_pretrained("smollm2-135m", dtype="float32")  # pulled into the oospec cache if missing
    tiny = Engine(tiny_model("qwen2", seed=3, vocab=len(smol.tokenizer)), smol.tokenizer)
    return {"smollm2": smol, "tiny-qwen2": tiny}


def requests(engine: Engine, name: str) -> list[tuple[str, Callable, list[Guess]]]:
    """(label, decode(drafter, **sampling fields) -> Result, the sidecar's guesses) of the fixed set for a target."""
    out = []
    if name == "smollm2":
        chat_ids = engine.encode(CHAT)
        out.append(("chat", lambda drafter, **f: engine.generate(CHAT, prompt_ids=chat_ids, drafter=drafter, **f),
                    []))
        for sample in load_dataset("apibank", split="1", limit=2):
            ids = engine.encode(sample.messages, sample.chat_tools())
            guesses = [Guess(c.name, dict(c.arguments)) for c in sample.gold or []]
            out.append((sample.id, lambda drafter, sample=sample, ids=ids, **f: engine.generate(
                sample.request(prompt_ids=ids, **f), drafter=drafter), guesses))
    forced, _ = engine.forced_call(TOOLS, "hermes")
    forced_ids = np.concatenate([engine.encode(FORCED_MESSAGES, TOOLS), forced])
    # A fresh grammar for every reply: a constraint follows one reply.
    out.append(("forced-call", lambda drafter, **f: engine.generate(
        FORCED_MESSAGES, tools=TOOLS, prompt_ids=forced_ids, dialect="hermes", drafter=drafter,
        constraint=engine.call_constraint(TOOLS, "hermes"), **f), [Guess("set_light", {"room": "kitchen", "on": True})]))
    return out


def run_one(decode: Callable, method: str, guesses: list[Guess], temperature: float) -> dict:
    sidecar = InstantSidecar(guesses) if method == "oospec" else None
    drafter = None if method == "plain" else make_drafter(method, **({"sidecar": sidecar} if sidecar else {}))
    result = decode(drafter, max_new_tokens=MAX_NEW, temperature=temperature, seed=SEED)
    stats = result.stats
    record = {"tokens": result.tokens.tolist(), "finish_reason": result.generation.finish_reason,
              "tau": round(stats.tau, 6), "target_forwards": stats.target_forwards,
              "accepted_per_step": stats.accepted_per_step, "tree_sizes": stats.tree_sizes,
              "sampling": stats.sampling}
    report = getattr(drafter, "report", None)
    if report is not None:
        record["sidecar"] = _untimed(report.as_dict())
    return record


def _untimed(value):
    """The sidecar report without its seconds (measured times and the schedule's estimates from them), which
    differ from run to run whatever the code."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not k.endswith("_s")}
    return value


def fingerprint() -> dict:
    torch.set_num_threads(1)  # one thread: the same reduction order whatever the machine's load
    out = {}
    for name, engine in make_engines().items():
        for label, decode, guesses in requests(engine, name):
            for temperature in TEMPERATURES:
                for method in METHODS:
                    key = f"{name}/{label}/T={temperature}/{method}"
                    out[key] = run_one(decode, method, guesses, temperature)
                    print(key, "tau", out[key]["tau"], "tokens", len(out[key]["tokens"]), flush=True)
    return out


def differences(base: dict, now: dict) -> list[str]:
    diffs = [f"{key}: missing now" for key in base if key not in now]
    diffs += [f"{key}: new" for key in now if key not in base]
    for key in base.keys() & now.keys():
        for field in sorted(base[key].keys() | now[key].keys()):
            if base[key].get(field) != now[key].get(field):
                diffs.append(f"{key}: {field} {base[key].get(field)!r} -> {now[key].get(field)!r}")
    return sorted(diffs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the fingerprint here")
    parser.add_argument("--compare", help="a fingerprint written before: exit 1 on any difference")
    args = parser.parse_args()
    if not args.out and not args.compare:
        parser.error("give --out PATH, --compare PATH, or both")
    now = fingerprint()
    if args.out:
        Path(args.out).write_text(json.dumps(now, indent=1) + "\n")
    if args.compare:
        diffs = differences(json.loads(Path(args.compare).read_text()), now)
        for line in diffs:
            print("DIFF", line)
        print(f"{len(diffs)} differences over {len(now)} runs")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
