"""Whether a request's sidecar job pays for itself: one cost model per request, from what this machine measured.

The sidecar's hints save target forwards (a higher tau), but on a CPU it shares with the target its job takes
cores while the target prefills. With the target on T threads and the sidecar on S, a job of W seconds slows the
target's prefill by about W * S / (T + S) (while it runs the target has T threads instead of T + S; once it is
idle the target borrows them back, see oospec.engine.threads). The saving is the forwards the hints spare,
L * (1 / tau_without - 1 / tau_with), each worth one decode step of s seconds. The job runs when the saving
exceeds the cost; a sidecar on its own device costs the target nothing and always runs.

Every quantity is measured as the drafter serves requests: W = a + b * n from the jobs' compute times (n: the
prompt tokens the sidecar has not cached, which an agent's next turn keeps small), L from the calls written,
s from the decode steps, the two taus from requests with and without hints in time. Until measured, each takes
its value from PRIORS (measured once on a 2-core AMD EPYC, Qwen2.5-Coder-1.5B target, 0.5B sidecar). The first
`explore` jobs always run, so that the sidecar's own speed on this machine is measured, and after them one
request in EXPLORE_EVERY that the model declines sends its job anyway, so that it keeps learning what hints are
worth; the schedule lives as long as whoever serves the requests (a drafter, a server, a benchmark's method),
not one request. Given a `speed_key` (the sidecar, its precision, threads and this processor:
SidecarClient.speed_key), the job times and the learned means are also kept in oospec's cache, so a fresh process
(a one-shot `oospec generate`) starts from them instead of the priors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oospec.engine.budget import PriorMean
from oospec.engine.prefix_cache import common_prefix_length
from oospec.models.provision import read_record, write_record


@dataclass(frozen=True)
class Priors:
    """What the model assumes before this machine has measured it (and how many observations that is worth)."""

    job_fixed_s: float = 1.5  # a: the sidecar's decoding (names, slots, the calls after), per job
    job_s_per_token: float = 0.006  # b: its prefill, per prompt token not cached (one thread)
    call_tokens: float = 40.0  # L: tokens of the reply
    step_s: float = 0.15  # s: one decode step of the target
    tau_without: float = 4.3  # toolspec's drafts alone
    tau_with: float = 9.0  # with the hints in time
    turns_ahead: float = 2.0  # the further turns an agent session is expected to have
    weight: float = 2.0  # pseudo-observations each prior counts for


PRIORS = Priors()
SPEED_RECORD = "sidecar-speed.json"  # {speed_key: [[prompt tokens read, seconds], ...]} in oospec's cache
LEARNED_RECORD = "sidecar-learned.json"  # {speed_key: {mean name: [total, count]}}: what requests showed
# The most observations a mean read back from an earlier process counts for: this machine's recent requests still
# move it (a new target, a new adapter) rather than a long history holding it in place.
LEARNED_WEIGHT_CAP = 32.0
# After the first `explore` jobs, one request in EXPLORE_EVERY that the model would not send a job for sends one
# anyway: tau with hints is learned only from requests whose hints arrived, so a schedule that stopped sending
# jobs would otherwise never see that it has become worth it (longer calls, a cached session prompt). Only a job
# expected to end before the target would have written the call explores: one that cannot arrive in time teaches
# nothing about tau with hints and only takes a core from its request (on 2 cores, 4-7% of a benchmark's time
# for one job in 8). The job's speed and the calls' length are learned from every request, so a longer call or a
# cheaper (cached) prompt lets exploring resume.
EXPLORE_EVERY = 8
TYPICAL_PROMPT_TOKENS = 600.0  # where the prior line is anchored besides n = 0 (a prompt listing a few tools)


class JobCost:
    """W = a + b * n, fitted by least squares to the jobs seen, pulled towards the priors (ridge)."""

    MAX_OBS = 64

    def __init__(self, priors: Priors):
        self.priors = priors
        self.obs: list[tuple[float, float]] = []  # (n, seconds), the most recent MAX_OBS

    def add(self, new_tokens: int, seconds: float) -> None:
        self.obs = [*self.obs, (float(new_tokens), float(seconds))][-self.MAX_OBS:]

    def coefficients(self) -> tuple[float, float]:
        """(a, b): the least-squares line through the jobs seen and the priors' line at two prompt lengths (no
        prompt, a typical one), those two points weighing `weight` observations together."""
        p = self.priors
        if not self.obs:
            return p.job_fixed_s, p.job_s_per_token
        prior_n = (0.0, TYPICAL_PROMPT_TOKENS)
        w = np.sqrt(p.weight / len(prior_n))
        x = np.array([[1.0, n / 1000] for n, _ in self.obs] + [[w, w * n / 1000] for n in prior_n])
        y = np.array([s for _, s in self.obs] + [w * (p.job_fixed_s + p.job_s_per_token * n) for n in prior_n])
        a, b = np.linalg.lstsq(x, y, rcond=None)[0]
        return max(0.0, float(a)), max(0.0, float(b)) / 1000

    def seconds(self, new_tokens: int) -> float:
        a, b = self.coefficients()
        return a + b * new_tokens


@dataclass
class Decision:
    run: bool
    why: str  # "own device", "exploring", "pays", "pays over the session's next turns", "costs more than it
    # saves"; "always" where the drafter sends every job
    new_tokens: int  # prompt tokens the sidecar would read that it has not cached
    job_s: float  # W
    cost_s: float  # the target's expected slow-down
    gain_s: float  # the expected saving (with the session's next turns, when the job brings the sidecar up to date)

    def as_dict(self) -> dict:
        return {"run": self.run, "why": self.why, "new_tokens": self.new_tokens, "job_s": round(self.job_s, 3),
                "cost_s": round(self.cost_s, 3), "gain_s": round(self.gain_s, 3)}


class SidecarSchedule:
    """Decides per request whether the sidecar's job runs (`decide`), and learns from what each request shows."""

    def __init__(self, priors: Priors = PRIORS, explore: int = 1, speed_key: str | None = None,
                 explore_every: int = EXPLORE_EVERY):
        self.priors = priors
        self.explore = explore
        self.explore_every = explore_every  # 0: never explore again after the first jobs
        self._declined = 0  # requests the model declined since its last exploring job
        self.job = JobCost(priors)
        self.speed_key = speed_key
        if speed_key is not None:  # what earlier processes measured of this sidecar on this machine
            for obs in read_record(SPEED_RECORD).get(speed_key, ()):
                if _valid_job(obs):
                    self.job.add(*obs)
        self.call_tokens = PriorMean(priors.call_tokens, priors.weight)
        self.step_s = PriorMean(priors.step_s, priors.weight)
        self.tau_without = PriorMean(priors.tau_without, priors.weight)
        self.tau_with = PriorMean(priors.tau_with, priors.weight)
        if speed_key is not None:
            self._read_learned(read_record(LEARNED_RECORD).get(speed_key))
        self._last_prompt: np.ndarray | None = None  # the prompt of the sidecar's last job (its cache holds it)
        self._last_request: np.ndarray | None = None  # the prompt of the last request, job or not

    def new_tokens(self, prompt_ids: np.ndarray) -> int:
        """The prompt tokens the sidecar would have to read: those after what it shares with the last job's."""
        if self._last_prompt is None:
            return int(prompt_ids.size)
        return int(prompt_ids.size) - common_prefix_length([prompt_ids, self._last_prompt])

    def decide(self, prompt_ids: np.ndarray, target_threads: int, sidecar_threads: int) -> Decision:
        """`sidecar_threads`: the CPU threads the sidecar takes from the target while it works (0: its own device).

        In an agent session (this prompt continues the last request's) a job also brings the sidecar's cache up to
        date, so that the session's next turns cost it only their new tokens: their net saving counts too."""
        n = self.new_tokens(prompt_ids)
        share = sidecar_threads / max(1, target_threads + sidecar_threads)
        job_s = self.job.seconds(n)
        cost = job_s * share
        spared = self.call_tokens.value * max(0.0, 1 / self.tau_without.value - 1 / self.tau_with.value)
        gain = spared * self.step_s.value
        turn_tokens = self.turn_tokens(prompt_ids)  # what a turn adds, when this one continues the last request
        self._last_request = np.asarray(prompt_ids)
        ahead = 0.0
        if turn_tokens is not None and n > turn_tokens:  # a session whose earlier turns the sidecar missed
            ahead = self.priors.turns_ahead * max(0.0, gain - self.job.seconds(turn_tokens) * share)
        if sidecar_threads == 0:
            why, run = "own device", True
        elif len(self.job.obs) < self.explore:
            why, run = "exploring", True
        else:
            run = gain + ahead > cost
            why = ("pays" if gain > cost else "pays over the session's next turns") if run \
                else "costs more than it saves"
            if not run and self.explore_every:
                self._declined += 1
                decode_s = self.call_tokens.value / self.tau_without.value * self.step_s.value
                if self._declined >= self.explore_every and job_s <= decode_s:
                    self._declined = 0
                    why, run = f"exploring (1 in {self.explore_every} declined)", True
        return Decision(run, why, n, job_s, cost, gain + ahead)

    def turn_tokens(self, prompt_ids: np.ndarray) -> int | None:
        """The tokens this prompt adds to the last request's, when it continues it (shares at least half of it:
        an agent's next turn); None otherwise."""
        last = self._last_request
        if last is None:
            return None
        shared = common_prefix_length([prompt_ids, last])
        return int(prompt_ids.size) - shared if shared >= max(1, last.size // 2) else None

    # -- learning --------------------------------------------------------------------------------------------
    def submitted(self, prompt_ids: np.ndarray) -> None:
        self._last_prompt = np.asarray(prompt_ids)

    def cache_cleared(self) -> None:
        """The sidecar dropped its cache (SidecarClient.clear_cache): its next job reads its whole prompt."""
        self._last_prompt = None

    def job_done(self, new_tokens: int, compute_s: float) -> None:
        self.job.add(new_tokens, compute_s)
        if self.speed_key is not None:
            write_record(SPEED_RECORD, self.speed_key, [list(obs) for obs in self.job.obs])

    def step(self, seconds: float) -> None:
        self.step_s.add(seconds)

    def request_done(self, new_tokens: int, forwards: int, hints_in_time: bool) -> None:
        """One finished request: its reply's length and tau, with or without hints in time."""
        if new_tokens <= 0 or forwards <= 0:
            return
        self.call_tokens.add(new_tokens)
        (self.tau_with if hints_in_time else self.tau_without).add(new_tokens / forwards)
        if self.speed_key is not None:
            write_record(LEARNED_RECORD, self.speed_key, {name: [mean.total, mean.count]
                                                         for name, mean in self._means().items()})

    def _means(self) -> dict[str, PriorMean]:
        return {"call_tokens": self.call_tokens, "step_s": self.step_s, "tau_without": self.tau_without,
                "tau_with": self.tau_with}

    def _read_learned(self, stored) -> None:
        """Start each mean from what an earlier process learned with this sidecar on this machine (its weight
        capped at LEARNED_WEIGHT_CAP); a damaged entry is skipped and leaves that mean at its prior."""
        if not isinstance(stored, dict):
            return
        for name, mean in self._means().items():
            pair = stored.get(name)
            if not (isinstance(pair, list) and len(pair) == 2 and _valid_job(pair) and pair[1] > 0):
                continue
            total, count = float(pair[0]), float(pair[1])
            scale = min(1.0, LEARNED_WEIGHT_CAP / count)
            mean.total, mean.count = total * scale, count * scale

    def as_dict(self) -> dict:
        a, b = self.job.coefficients()
        return {"job_fixed_s": round(a, 3), "job_s_per_token": round(b, 6), "jobs_measured": len(self.job.obs),
                "call_tokens": round(self.call_tokens.value, 1), "step_s": round(self.step_s.value, 4),
                "tau_without": round(self.tau_without.value, 2), "tau_with": round(self.tau_with.value, 2)}


def _valid_job(obs) -> bool:
    """A stored (prompt tokens, seconds) pair that can be trusted: a hand-edited or damaged record is skipped."""
    return (isinstance(obs, (list, tuple)) and len(obs) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) and x >= 0 for x in obs))
