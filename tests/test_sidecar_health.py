"""The sidecar's state, told honestly (issue 33): a killed worker is reaped at once and reported dead (by the
client and by the server's /health), and a client that failed too often rests, then starts the worker again
instead of giving up for the life of the server. The worker is the scripted fake of sidecar_fakes.py in its
own process."""

from __future__ import annotations

import os
import signal
import time

import psutil
from helpers import tiny_model

from oospec.sidecar import SidecarClient
from oospec.sidecar.protocol import Job

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def fake_client(**kwargs) -> SidecarClient:
    options = {"mode": "good", "answer": {"function": "get_weather", "arguments": {"city": "Paris"}}}
    return SidecarClient(factory="sidecar_fakes:make_fake", factory_options=options, hang_timeout_s=5,
                         ready_timeout_s=120, **kwargs)


def job(i: int) -> Job:
    return Job(f"r{i}", [{"role": "user", "content": "Weather in Paris?"}], TOOLS)


def answer(client: SidecarClient, i: int, timeout_s: float = 60.0):
    from oospec.tools.schema import tools_from_openai

    ticket = client.submit(job(i), tools_from_openai(TOOLS))
    if ticket is None:
        return None
    deadline = time.monotonic() + timeout_s
    while client.poll(ticket) is None and ticket.fault is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return ticket.payload


def gone_or_zombie(pid: int) -> str:
    try:
        return "zombie" if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else "running"
    except psutil.NoSuchProcess:
        return "gone"


def test_a_killed_sidecar_is_reaped_at_once_and_reported_dead():
    with fake_client() as client:
        assert client.state == "alive" and client.health()["pid"] == client.pid
        pid = client.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while gone_or_zombie(pid) != "gone" and time.monotonic() < deadline:
            time.sleep(0.05)  # (the client is not touched: no request polls it)
        assert gone_or_zombie(pid) == "gone"
        health = client.health()
        assert health["state"] == "dead" and health["pid"] is None
        assert answer(client, 1) is not None  # the next request restarts it
        assert client.state == "alive" and client.stats.restarts == 1 and client.pid != pid
    assert client.state == "disabled"


def test_a_killed_sidecar_counts_one_crash_and_is_restarted_without_a_job():
    """Issue 33's fuzz: after a kill, every decode step's drain read the closed pipe as another crash (286 for one
    kill) and, the cost model sending no job, the worker was never restarted. One death is one fault; `check`
    (each request's start) restarts it with no job sent."""
    with fake_client() as client:
        pid = client.pid
        os.kill(pid, signal.SIGKILL)
        while gone_or_zombie(pid) != "gone":
            time.sleep(0.05)
        for _ in range(50):  # the decode loop asks every step whether the sidecar's threads are free
            client.idle_threads()
            client.poll(None)
        assert client.stats.faults == {"crashed": 1} and client.stats.restarts == 1 and client.pid != pid
        assert client.state in ("restarting", "alive") and client.stats.submitted == 0
        assert client.wait_ready(120) and client.check() and client.stats.faults == {"crashed": 1}
        os.kill(client.pid, signal.SIGKILL)
        while client.state != "dead":
            time.sleep(0.05)
        assert client.check() and client.stats.restarts == 2 and client.stats.submitted == 0


def test_a_sidecar_that_fails_too_often_rests_then_comes_back():
    with fake_client(max_restarts=1, quiet_period_s=1.5) as client:
        for i in range(2):  # two deaths: one restart, then rest
            os.kill(client.pid, signal.SIGKILL)
            time.sleep(0.3)
            result = answer(client, i)
        assert result is None and client.state == "resting" and client.stats.faults.get("gave-up") == 1
        assert client.health()["retry_in_s"] <= 1.5
        assert answer(client, 3) is None  # while resting: no worker, no waiting
        time.sleep(1.6)
        assert answer(client, 4) is not None  # after the quiet period: started again, answering
        assert client.state == "alive" and client.stats.restarts == 2


def test_health_reports_the_sidecars_real_state(smollm2_tokenizer):
    from oospec.engine.engine import Engine
    from oospec.server.service import ModelService, ServerConfig

    client = fake_client()
    service = ModelService(Engine(tiny_model("qwen2"), smollm2_tokenizer),
                           ServerConfig(model_name="tiny", method="oospec"), sidecar=client)
    try:
        assert service.health()["sidecar"]["state"] == "alive"
        os.kill(client.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while service.health()["sidecar"]["state"] != "dead" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.health()["sidecar"]["state"] == "dead"
    finally:
        service.close()
    assert service.health()["sidecar"]["state"] == "disabled"


def test_a_sidecar_that_cannot_load_is_disabled_not_retried():
    client = SidecarClient(factory="sidecar_fakes:make_broken", factory_options={}, quiet_period_s=0.1)
    try:
        assert client.state == "disabled"
        time.sleep(0.2)
        assert answer(client, 1) is None and client.state == "disabled" and client.stats.restarts == 0
    finally:
        client.close()


def test_without_a_sidecar_health_says_null_and_stand_ins_are_alive():
    from oospec.server.service import sidecar_health

    assert sidecar_health(None) is None
    assert sidecar_health(object()) == {"state": "alive"}
