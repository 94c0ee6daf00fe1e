"""Sidecar predictors that misbehave on purpose, built in the sidecar's own process by SidecarClient(factory=...),
and InstantSidecar, a client stand-in that answers in the test's own process."""

from __future__ import annotations

import json
import os
import re
import time

from oospec.sidecar.memory import WorkingSetTooLarge
from oospec.sidecar.protocol import Guess, Payload, encode_payload


class FakePredictor:
    """Answers every job according to `mode`; `answer` is the best guess it reports when it answers well."""

    def __init__(self, mode: str = "good", answer: dict | None = None, delay_s: float = 0.0, gate: str | None = None,
                 started_dir: str | None = None, precision: str | None = None, dtype: str | None = None):
        self.mode = mode
        self.precision = precision  # what a real predictor reports it computes in ("auto" resolved)
        self.answer = answer or {}
        self.delay_s = delay_s
        self.gate = gate  # a file path: each job waits until the test creates it (an answer late on demand)
        self.started_dir = started_dir  # a folder: a file named after each job's request id once it is started
        self.cached: set[str] = set()  # conversations seen since the last clear_cache (the real one's prompt cache)

    def clear_cache(self) -> None:
        self.cached.clear()

    def predict(self, job) -> bytes:
        if self.started_dir:
            open(os.path.join(self.started_dir, job.request_id), "w").close()
        if self.delay_s:
            time.sleep(self.delay_s)
        while self.gate and not os.path.exists(self.gate):
            time.sleep(0.01)
        first = job.tools[0]["function"]
        name = self.answer.get("function", first["name"])
        args = self.answer.get("arguments", {})
        good = encode_payload(job.request_id, [Guess(name, args)], 0.01, time.time())
        mode = self.mode
        conversation = json.dumps(job.messages, sort_keys=True)
        warm = conversation in self.cached
        self.cached.add(conversation)
        if mode == "cache-probe":  # answers well, and tells in call_p whether the conversation was cached
            return encode_payload(job.request_id, [Guess(name, args)], 0.01, time.time(), 0.5 if warm else 1.0)
        if mode == "from-job":  # one process serves many faults: the test names each in the request
            mode = re.search(r"\[fault:([\w-]+)\]", job.messages[-1]["content"]).group(1)
        if mode == "good":
            return good
        if mode == "crash":
            os._exit(3)
        if mode == "hang":
            time.sleep(3600)
        if mode == "late":
            time.sleep(30)
            return good
        if mode == "invalid-json":
            return b'{"id": "' + job.request_id.encode() + b'", "function": '
        if mode == "unknown-function":
            return encode_payload(job.request_id, [Guess("no_such_tool", {})], 0.01, time.time())
        if mode == "wrong-types":
            bad = {p: [1, {"x": None}] if i % 2 else 12345 for i, p in enumerate(first["parameters"]["properties"])}
            return encode_payload(job.request_id, [Guess(first["name"], bad)], 0.01, time.time())
        if mode == "huge-values":
            huge = {p: "A" * 5000 for p in first["parameters"]["properties"]}
            return encode_payload(job.request_id, [Guess(first["name"], huge)], 0.01, time.time())
        if mode == "huge-payload":
            return json.dumps({"id": job.request_id, "function": first["name"], "arguments": {},
                               "pad": "x" * 200_000}).encode()
        if mode == "other-request":
            return encode_payload("not-" + job.request_id, [Guess(name, args)], 0.01, time.time())
        if mode == "raise":
            raise RuntimeError("the predictor failed")
        if mode == "too-large":  # what the real predictor raises for a job over its memory budget
            raise WorkingSetTooLarge("a 90000-token prompt needs about 30 GB, over the sidecar's memory budget")
        raise ValueError(mode)


def make_fake(**kwargs) -> FakePredictor:
    return FakePredictor(**kwargs)


def make_broken(**kwargs):
    raise OSError("weights are corrupt")


class InstantSidecar:
    """Answers at submit time with a fixed payload (or never, with payload=None); a job naming its function
    (the follow-up once the target has chosen one) gets `slots[function]`, if given. `following`: the calls
    the payload expects after the best guess (a turn of several calls)."""

    def __init__(self, guesses, slots: dict | None = None, following=()):
        self.guesses = guesses
        self.slots = slots or {}
        self.following = tuple(following)
        self.jobs = []

    def submit(self, job, tools):
        self.jobs.append(job)
        return {"id": job.request_id, "function": job.function}

    def poll(self, ticket):
        if ticket["function"] is not None:
            args = self.slots.get(ticket["function"])
            return None if args is None else Payload(ticket["id"], Guess(ticket["function"], args), (), size_bytes=60)
        if self.guesses is None:
            return None
        if not self.guesses:  # "no call expected"
            return Payload(ticket["id"], None, (), size_bytes=40, call_probability=0.1)
        return Payload(ticket["id"], self.guesses[0], tuple(self.guesses[1:]), size_bytes=80,
                       following=self.following)
