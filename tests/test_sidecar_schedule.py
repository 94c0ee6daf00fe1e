"""The sidecar's cost model: a job runs only where the saving it is expected to bring exceeds what it costs the
target on the cores they share; every quantity measured as requests are served."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sidecar_fakes import InstantSidecar

from oospec.drafters.sidecar import OoOSpecDrafter, SidecarDrafter
from oospec.drafters.sidecar_schedule import PRIORS, JobCost, SidecarSchedule
from oospec.sidecar.protocol import Guess


def _prompt(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def test_job_cost_fit_recovers_the_measured_line_and_starts_at_the_priors():
    cost = JobCost(PRIORS)
    assert cost.coefficients() == (PRIORS.job_fixed_s, PRIORS.job_s_per_token)
    for n in (50, 200, 400, 650, 900, 120, 700, 300) * 8:  # 64 jobs against priors worth 2
        cost.add(n, 0.4 + 0.003 * n)
    a, b = cost.coefficients()
    assert a == pytest.approx(0.4, abs=0.06) and b == pytest.approx(0.003, rel=0.1)
    assert cost.seconds(500) == pytest.approx(1.9, rel=0.05)


def test_a_cold_long_prompt_on_shared_cores_is_not_worth_a_job_after_the_exploring_ones():
    plan = SidecarSchedule(explore=2)
    first = plan.decide(_prompt(650), target_threads=1, sidecar_threads=1)
    assert first.run and first.why == "exploring" and first.new_tokens == 650
    for _ in range(2):
        plan.job_done(650, 4.0)  # a 0.5B sidecar reading 650 tokens on one core
    for _ in range(5):
        plan.step(0.14)  # a 1.5B target's decode step
    cold = plan.decide(_prompt(650, start=10_000), target_threads=1, sidecar_threads=1)
    assert not cold.run and cold.why == "costs more than it saves"
    assert cold.cost_s == pytest.approx(cold.job_s / 2) and cold.gain_s < cold.cost_s
    # On its own device the same job costs the target nothing.
    own = plan.decide(_prompt(650, start=10_000), target_threads=2, sidecar_threads=0)
    assert own.run and own.why == "own device" and own.cost_s == 0.0


def test_a_slow_target_or_a_cached_prompt_makes_the_job_pay():
    plan = SidecarSchedule(explore=0)
    for n, s in ((650, 4.0), (80, 0.9), (400, 2.8), (60, 0.8)):
        plan.job_done(n, s)
    for _ in range(20):
        plan.step(0.9)  # a 7B-sized target on this CPU
    assert plan.decide(_prompt(650), 1, 1).run
    fast = SidecarSchedule(explore=0)
    for n, s in ((650, 4.0), (80, 0.5), (400, 2.5), (60, 0.45)):
        fast.job_done(n, s)
    fast.submitted(_prompt(700))  # the session's last turn: the sidecar holds its prompt
    turn = np.concatenate([_prompt(700), _prompt(30, start=5000)])
    assert fast.new_tokens(turn) == 30
    for _ in range(20):
        fast.step(0.25)
    assert fast.decide(turn, 1, 1).run and not fast.decide(_prompt(730, start=9000), 1, 1).run


def test_taus_and_reply_length_are_learned_from_requests():
    plan = SidecarSchedule()
    plan.request_done(new_tokens=60, forwards=5, hints_in_time=True)
    plan.request_done(new_tokens=60, forwards=20, hints_in_time=False)
    plan.request_done(new_tokens=0, forwards=0, hints_in_time=False)  # nothing written: ignored
    assert plan.tau_with.value == pytest.approx((PRIORS.tau_with * PRIORS.weight + 12) / (PRIORS.weight + 1))
    assert plan.tau_without.value == pytest.approx((PRIORS.tau_without * PRIORS.weight + 3) / (PRIORS.weight + 1))
    assert plan.call_tokens.value > PRIORS.call_tokens


class CpuSidecar(InstantSidecar):
    """A test double that says it shares the target's CPU, one thread."""

    device, threads = "cpu", 1


def _serve(drafter: SidecarDrafter, n_prompt: int, start: int) -> None:
    from test_sidecar import TOOLS, CharTokenizer

    from oospec.engine.drafting import Request

    req = Request(prompt_ids=_prompt(n_prompt, start), eos_ids=frozenset({0}), tokenizer=CharTokenizer(),
                  messages=[{"role": "user", "content": "weather in Paris"}], tools=TOOLS, dialect="hermes")
    drafter.start(req)
    drafter.finish()


def test_the_drafter_skips_the_job_the_model_rejects_and_says_why_and_always_runs_every_job():
    guesses = [Guess("get_weather", {"city": "Paris", "days": 3})]
    drafter = OoOSpecDrafter(CpuSidecar(guesses))
    inner = drafter.sidecar_drafter
    inner.plan.explore = 1
    _serve(drafter, 650, 0)
    assert inner.report.submitted and inner.report.schedule["why"] == "exploring"
    for _ in range(10):
        inner.plan.step(0.01)  # a tiny target: a step saved is worth nothing next to a job
    _serve(drafter, 650, 5000)
    assert not inner.report.submitted and inner.report.schedule == {**inner.report.schedule, "run": False}
    assert len(drafter.sidecar_drafter.sidecar.jobs) == 1
    always = OoOSpecDrafter(CpuSidecar(guesses), schedule="always")
    always.sidecar_drafter.plan.explore = 0
    for start in (0, 5000):
        _serve(always, 650, start)
        assert always.sidecar_drafter.report.submitted and always.sidecar_drafter.report.schedule["run"]
    with pytest.raises(ValueError, match="schedule must be one of cost, always"):
        SidecarDrafter(CpuSidecar(guesses), schedule="sometimes")


def test_in_a_session_the_job_that_brings_the_sidecar_up_to_date_counts_the_next_turns():
    """A session's turn the sidecar missed costs it the whole gap once; after that each turn costs only its new
    tokens. The schedule runs the catching-up job when the next turns' savings pay for it, and only in a session."""
    def plan_with_steps(step_s):
        plan = SidecarSchedule(explore=0)
        for n, s in ((650, 4.0), (80, 0.9), (400, 2.8), (60, 0.8)):
            plan.job_done(n, s)
        for _ in range(30):
            plan.step(step_s)
        return plan

    turn1, turn2 = _prompt(650), np.concatenate([_prompt(650), _prompt(60, start=7000)])
    plan = plan_with_steps(0.35)
    first = plan.decide(turn1, 1, 1)  # a cold request: no session yet
    assert not first.run
    second = plan.decide(turn2, 1, 1)  # continues turn 1, which the sidecar never saw: 710 tokens to read
    assert second.run and second.why == "pays over the session's next turns" and second.new_tokens == 710
    plan.submitted(turn2)
    third = plan.decide(np.concatenate([turn2, _prompt(50, start=9000)]), 1, 1)
    assert third.run and third.why == "pays" and third.new_tokens == 50
    # The same turn after an unrelated request is not a session: no next turns to count.
    other = plan_with_steps(0.35)
    other.decide(_prompt(650, start=20_000), 1, 1)
    assert not other.decide(turn2, 1, 1).run


def test_a_cleared_sidecar_cache_is_read_whole_again():
    plan = SidecarSchedule()
    plan.submitted(_prompt(600))
    assert plan.new_tokens(_prompt(600)) == 0
    plan.cache_cleared()
    assert plan.new_tokens(_prompt(600)) == 600


def test_a_request_the_schedule_sends_no_job_still_checks_the_worker():
    """Issue 33's fuzz: a killed sidecar was restarted only by a job, and the cost model sent none, so it stayed
    dead. Every request's start asks the client to check its worker (and restart a dead one), job or not."""
    class Checked(CpuSidecar):
        checks = 0

        def check(self):
            Checked.checks += 1
            return True

    drafter = OoOSpecDrafter(Checked([Guess("get_weather", {"city": "Paris"})]))
    inner = drafter.sidecar_drafter
    inner.plan.explore = 0
    for _ in range(10):
        inner.plan.step(0.01)  # a tiny target: the job is not worth sending
    _serve(drafter, 650, 0)
    assert not inner.report.submitted and Checked.checks == 1


def test_job_times_outlive_the_process_so_a_fresh_one_does_not_explore_again(tmp_path, monkeypatch):
    """A one-shot command is a fresh process: the sidecar's speed measured by an earlier one on this machine
    (same key) is read back, so its first request is decided by the cost model, not spent exploring."""
    from oospec.drafters import sidecar_schedule

    record = tmp_path / "speed.json"
    monkeypatch.setattr(sidecar_schedule, "SPEED_RECORD", str(record))
    prompt = np.arange(600)
    first = SidecarSchedule(speed_key="cpu A | sidecar x")
    assert first.decide(prompt, 1, 1).why == "exploring"
    first.job_done(600, 8.0)  # a slow sidecar: it cannot pay on a shared core
    again = SidecarSchedule(speed_key="cpu A | sidecar x")
    assert again.job.obs == [(600.0, 8.0)]
    assert again.decide(prompt, 1, 1).why == "costs more than it saves"
    other = SidecarSchedule(speed_key="cpu B | sidecar x")  # another machine or sidecar: measured afresh
    assert other.decide(prompt, 1, 1).why == "exploring"
    assert SidecarSchedule().decide(prompt, 1, 1).why == "exploring"  # no key: nothing kept
    # A damaged record loses only its bad entries.
    record.write_text('{"cpu A | sidecar x": [[600, 8.0], [1, "x"], [-1, 2], null, [5, 1e400]]}')
    assert SidecarSchedule(speed_key="cpu A | sidecar x").job.obs == [(600.0, 8.0)]
    record.write_text("not json")
    assert SidecarSchedule(speed_key="cpu A | sidecar x").job.obs == []


class LateCpuSidecar(CpuSidecar):
    """Answers only once the test says the job is done: after the request that sent it has ended."""

    answered = False

    def poll(self, ticket):
        payload = super().poll(ticket)
        return replace(payload, compute_s=2.5) if self.answered else None


def test_a_job_answered_after_its_request_is_timed_by_settle_so_the_next_request_does_not_explore_again():
    """A benchmark's warm-up sends the exploring job and ends before its answer; settle() waits for it and times it
    once, so the first measured item is decided by the cost model instead of exploring again."""
    sidecar = LateCpuSidecar([Guess("get_weather", {"city": "Paris", "days": 3})])
    drafter = OoOSpecDrafter(sidecar)
    inner = drafter.sidecar_drafter
    inner.plan.explore = 1
    _serve(drafter, 650, 0)
    assert inner.report.schedule["why"] == "exploring" and not inner.plan.job.obs
    inner.settle(timeout_s=0.05)  # no answer yet: it gives up, nothing timed
    assert not inner.plan.job.obs
    sidecar.answered = True
    inner.settle()
    inner.settle()  # timed once
    assert inner.plan.job.obs == [(650.0, 2.5)] and inner.report.compute_s == 2.5
    _serve(drafter, 650, 5000)
    assert inner.report.schedule["why"] != "exploring"


def _declined_plan(job_s: float, tau_with: float | None = None, explore_every: int = 8) -> SidecarSchedule:
    """A schedule whose measured jobs of 600 prompt tokens take `job_s` (of 100, half that), beside a target that writes a call in
    40 / 4.3 * 0.15 = 1.4 s (the priors); tau_with: what requests with hints in time showed (default: the prior)."""
    plan = SidecarSchedule(explore=0, explore_every=explore_every)
    for _ in range(8):
        plan.job.add(600, job_s)
        plan.job.add(100, job_s / 2)
    for _ in range(40 if tau_with else 0):
        plan.tau_with.add(tau_with)
    return plan


def test_a_declined_schedule_explores_one_request_in_eight_so_it_keeps_learning():
    """Once the model declines every job, tau with hints would never be measured again: one declined request in
    EXPLORE_EVERY sends its job anyway, if it can end before the call is written, and nothing else changes."""
    plan = _declined_plan(0.6, tau_with=5.0)  # in time (~1.1 s), but hints that barely help do not pay for its core
    whys = [plan.decide(np.arange(600 + i), 1, 1).why for i in range(24)]
    assert whys.count("exploring (1 in 8 declined)") == 3
    assert [i for i, w in enumerate(whys) if w.startswith("exploring")] == [7, 15, 23]
    assert set(whys) == {"costs more than it saves", "exploring (1 in 8 declined)"}
    never = _declined_plan(0.6, tau_with=5.0, explore_every=0)
    assert all(never.decide(np.arange(600), 1, 1).why == "costs more than it saves" for _ in range(24))


def test_a_job_that_cannot_arrive_in_time_is_not_sent_to_explore():
    """A job slower than the target writes its call teaches nothing about tau with hints: no exploring. The calls'
    length is learned from every request, so once calls are long enough the job is sent again."""
    plan = _declined_plan(3.0)
    decisions = [plan.decide(np.arange(600 + i), 1, 1) for i in range(24)]
    assert all(not d.run and d.why == "costs more than it saves" for d in decisions)
    for _ in range(40):
        plan.request_done(200, 200 // 4, hints_in_time=False)  # calls of 200 tokens at tau 4: ~7.5 s of decoding
    assert plan.decide(np.arange(700), 1, 1).run


def test_what_requests_taught_the_schedule_outlives_the_process():
    """tau with hints learned by one process is where the next one with the same sidecar key starts, its weight
    capped so that new requests still move it; another key starts from the priors; a damaged record is skipped."""
    from oospec.drafters import sidecar_schedule

    first = SidecarSchedule(speed_key="cpu A | sidecar x")
    for _ in range(100):
        first.request_done(new_tokens=60, forwards=4, hints_in_time=True)  # tau 15 with hints
    again = SidecarSchedule(speed_key="cpu A | sidecar x")
    assert again.tau_with.value == pytest.approx(first.tau_with.value)
    assert again.tau_with.count == sidecar_schedule.LEARNED_WEIGHT_CAP
    assert again.tau_without.value == pytest.approx(PRIORS.tau_without)
    assert SidecarSchedule(speed_key="cpu B | sidecar x").tau_with.value == pytest.approx(PRIORS.tau_with)
    again.request_done(new_tokens=60, forwards=60, hints_in_time=True)  # tau 1: it moves
    assert again.tau_with.value < first.tau_with.value
    Path(sidecar_schedule.LEARNED_RECORD).write_text('{"cpu A | sidecar x": {"tau_with": ["x", 3], "step_s": [1.0, -2]}}')
    damaged = SidecarSchedule(speed_key="cpu A | sidecar x")
    assert damaged.tau_with.value == pytest.approx(PRIORS.tau_with) and damaged.step_s.value == pytest.approx(PRIORS.step_s)
