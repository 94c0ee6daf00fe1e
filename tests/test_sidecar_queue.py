"""The sidecar client with several requests in flight (vLLM's batch): each job gets its own answer, oldest
first, never another request's; the job of a request that ended before the worker started it is dropped, and
the worker goes on to the live ones."""

from __future__ import annotations

import time

from oospec.sidecar import SidecarClient
from oospec.sidecar.protocol import Job
from oospec.tools.schema import Param, Tool, to_openai

TOOLS = [Tool("get_weather", "", (Param("city"),), ("city",))]


def job(i: int) -> Job:
    return Job(f"request-{i}", [{"role": "user", "content": f"weather {i}"}], [to_openai(t) for t in TOOLS])


def wait_until(done, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert done()


def settled(client: SidecarClient, *tickets) -> bool:
    return all(client.poll(t) is not None or t.fault is not None for t in tickets)


def slow_client(delay_s: float, **options) -> SidecarClient:
    return SidecarClient(factory="sidecar_fakes:make_fake",
                         factory_options={"mode": "good", "delay_s": delay_s, **options}, threads=1, ready_timeout_s=120)


def test_every_request_in_flight_gets_its_own_answer_oldest_first():
    with slow_client(0.2) as client:
        tickets = [client.submit(job(i), TOOLS) for i in range(5)]
        assert client.idle_threads() == 0
        wait_until(lambda: settled(client, *tickets))
        assert [t.payload.request_id for t in tickets] == [t.request_id for t in tickets]
        arrivals = [t.received_at for t in tickets]
        assert arrivals == sorted(arrivals)
        assert client.stats.answered == 5 and "late" not in client.stats.faults
        assert client.idle_threads() == 1  # nothing outstanding: the thread may be lent again


def test_a_job_whose_request_ended_first_is_dropped_and_the_others_are_answered(tmp_path):
    gate = tmp_path / "go"
    with slow_client(0.0, gate=str(gate), started_dir=str(tmp_path)) as client:
        first, ended, live = (client.submit(job(i), TOOLS) for i in range(3))
        client.cancel(ended)  # its request is over while the worker is still on the first job
        gate.touch()
        wait_until(lambda: settled(client, first, ended, live))
        assert ended.payload is None and ended.fault == "cancelled"
        assert first.payload.request_id == first.request_id and live.payload.request_id == live.request_id
        assert client.stats.answered == 2
        started = client.submit(job(3), TOOLS)
        wait_until(lambda: (tmp_path / started.request_id).exists())  # the worker has taken it up: too late to
        client.cancel(started)                                         # drop, its answer is still recorded
        wait_until(lambda: settled(client, started))
        assert started.payload is not None and started.cancelled
        assert client.idle_threads() == 1


def test_a_reused_request_id_gets_a_ticket_of_its_own():
    with slow_client(0.0) as client:
        a, b = client.submit(job(7), TOOLS), client.submit(job(7), TOOLS)
        assert a.request_id != b.request_id
        wait_until(lambda: settled(client, a, b))
        assert a.payload.request_id == a.request_id and b.payload.request_id == b.request_id
