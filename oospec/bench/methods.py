"""The methods `oospec bench run` compares, one small class per kind, all with one interface:

    start()                                       a fresh state for a dataset (one drafter serves its samples
                                                  in order: drafters that learn, learn as in service)
    run(sample, prompt_ids, reference, n) -> Run  one generation of at most n new tokens
    close()

Each method also says which CPU threads it gets (`threads` for the target, `cores` as reported), decided
once by `Cores`. A new method is one class and one line in `METHODS`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oospec.bench.config import BenchConfig, Cores, item_seed
from oospec.bench.items import BenchError
from oospec.bench.hf_peers import AssistedPeer, HFPeer, PromptLookupPeer, optimize_like_target
from oospec.errors import did_you_mean

REFERENCE = "ar"
TOOL_CHOICES = ("auto", "required")


@dataclass
class Run:
    tokens: np.ndarray  # (new tokens,) int64
    stats: dict  # new_tokens, target_forwards, tau, accepted_per_step, prefill_s, decode_s, e2e_s, draft_s
    extra: dict = field(default_factory=dict)  # fields only this kind of method records (its sidecar report)


@dataclass
class Reference:
    """What `ar`'s run of the current sample gives the methods after it."""

    tokens: np.ndarray
    prefill_s: float


@dataclass
class Shared:
    """What the methods of one run share: the models, the options, the cores, the sidecar."""

    engine: Any
    cfg: BenchConfig
    cores: Cores
    sidecar: Any = None  # a SidecarClient when a sidecar method runs
    assistant_model: Any = None
    assistant_tokenizer: Any = None
    sidecar_last_item: tuple | None = None  # (dataset, sample id) of the sidecar's last job


def generate(engine, sample, prompt_ids, drafter, max_new_tokens: int, cfg: BenchConfig, prefix_cache=None) -> Run:
    """The one call of Engine.generate in the benchmark: greedy, or sampled with the item's seed."""
    t0 = time.perf_counter()
    constraint = None
    if cfg.tool_choice == "required":  # the grammar's cost is the method's: built inside the timed call
        forced, constraint = engine.forced_call(sample.openai_tools(), sample.dialect)
        prompt_ids = np.concatenate([prompt_ids, forced])
    request = sample.request(prompt_ids=prompt_ids, max_new_tokens=max_new_tokens, budget=cfg.budget,
                             temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                             seed=item_seed(cfg, sample.dataset, sample.id), constraint=constraint)
    result = engine.generate(request, drafter=drafter, prefix_cache=prefix_cache)
    e2e = time.perf_counter() - t0
    st = result.stats
    return Run(result.tokens.astype(np.int64), {
        "new_tokens": st.new_tokens,
        "target_forwards": st.target_forwards,
        "tau": st.tau,
        "accepted_per_step": list(map(int, st.accepted_per_step)),
        "tree_sizes": list(map(int, st.tree_sizes)),  # nodes each verification forward held (its price: c(1 + n))
        "slot_rows": list(map(int, st.slot_rows)),  # slot rows beside them (its price then: c(1 + n + rows))
        "prompt_tokens": int(prompt_ids.size),
        "prefill_s": st.prefill_s,
        "prompt_tokens_reused": st.prompt_tokens_reused,  # restored from the session's prefix cache
        "decode_s": st.decode_s,
        "e2e_s": e2e,
        "draft_s": st.draft_s,
        "sampling": st.sampling,
        "threads_borrowed": st.threads_borrowed,  # the idle sidecar's threads the target used (equal cores)
    })


class BenchMethod:
    uses_sidecar = False
    greedy_only = False  # cannot sample with the run's per-item seed (so cannot match `ar` when sampling)
    # False: a peer decoding with transformers' own generate, where neither a session's prefix cache nor the call
    # grammar applies (refused in such runs)
    through_engine = True
    prefix_cache = None  # a session's PrefixCache: the KV of this method's own earlier turns

    def __init__(self, name: str, shared: Shared):
        self.name = name
        self.shared = shared
        self.threads = shared.cores.total  # the target's torch threads while this method runs

    @property
    def cores(self) -> str:
        return str(self.threads)

    @property
    def cpu_threads(self) -> int:
        """Every CPU thread this method uses (the target's, and its sidecar's)."""
        return self.threads

    def start(self) -> None:
        pass

    def start_session(self, reuse_prefixes: bool) -> None:
        """Before a unit of work (one cold item, or one agent session's turns): a fresh prefix cache for a
        session, none for a cold item."""
        from oospec.engine.prefix_cache import PrefixCache
        from oospec.models.registry import DEFAULT_PREFIX_CACHE_MB

        self.prefix_cache = PrefixCache(int(DEFAULT_PREFIX_CACHE_MB * 2**20)) if reuse_prefixes else None

    def run(self, sample, prompt_ids: np.ndarray, reference: Reference | None, max_new_tokens: int) -> Run:
        raise NotImplementedError

    def settle(self) -> float:
        """After each run, its clock stopped: wait for work the method left running (a sidecar's job), so that
        none of it runs into the next run's clock. Returns the seconds waited."""
        return 0.0

    def close(self) -> None:
        pass


class EngineMethod(BenchMethod):
    """One of our drafters (`oospec.drafters.DRAFTERS`) through the engine; `ar` is the engine without one
    (plain greedy decoding, or plain sampling, one forward per token)."""

    def make_drafter(self):
        from oospec.drafters import make_drafter

        return None if self.name == REFERENCE else make_drafter(self.name)

    def start(self) -> None:
        self.drafter = self.make_drafter()

    def run(self, sample, prompt_ids, reference, max_new_tokens) -> Run:
        return generate(self.shared.engine, sample, prompt_ids, self.drafter, max_new_tokens, self.shared.cfg,
                        self.prefix_cache)


class ArAtThreadsMethod(EngineMethod):
    """`ar` with another number of cores than the run's total (`threads_of`)."""

    def __init__(self, name: str, shared: Shared):
        super().__init__(name, shared)
        self.threads = self.threads_of(shared.cores)

    def threads_of(self, cores: Cores) -> int:
        raise NotImplementedError

    def make_drafter(self):
        return None  # `ar`


class AllCoresMethod(ArAtThreadsMethod):
    """`ar` with every core of the machine, for reference."""

    def threads_of(self, cores: Cores) -> int:
        return cores.machine


class TargetThreadsMethod(ArAtThreadsMethod):
    """`ar` with the target's share of the cores only: the baseline of the secondary (target threads) column."""

    def threads_of(self, cores: Cores) -> int:
        return cores.target


class OracleMethod(EngineMethod):
    """Proposes `ar`'s own tokens as one chain of `budget` tokens: the ceiling of any drafter here."""

    def make_drafter(self):
        from oospec.drafters.oracle import OracleDrafter

        return OracleDrafter()

    def run(self, sample, prompt_ids, reference, max_new_tokens) -> Run:
        self.drafter.set_reference(reference.tokens)
        return super().run(sample, prompt_ids, reference, max_new_tokens)


class SidecarMethod(EngineMethod):
    """A drafter with hints from the sidecar process: the target gets its share of the cores, the sidecar the rest.

    The sidecar's caches (the encoded prompt, the name priors) are cleared before a run of an item it has just
    served (for another method, or the warm-up): no method reuses the work another did on the same item."""

    uses_sidecar = True
    drafter_name = "sidecar"
    schedule = "cost"  # whether each request's job runs: the cost model's call (oospec.drafters.sidecar_schedule)

    def __init__(self, name: str, shared: Shared):
        super().__init__(name, shared)
        self.threads = shared.cores.target
        self._plan = None

    @property
    def plan(self):
        """One schedule for the whole run, warm-up included, as a server keeps one for its life: what it measured
        on the first requests, or earlier runs with this sidecar on this machine, decides the later ones. Made
        on first use: the sidecar (its speed key) starts after the methods are built."""
        if self._plan is None:
            from oospec.drafters.sidecar import speed_key
            from oospec.drafters.sidecar_schedule import SidecarSchedule

            self._plan = SidecarSchedule(speed_key=speed_key(self.shared.sidecar))
        return self._plan

    @property
    def cores(self) -> str:
        return self.shared.cores.sidecar_label()

    @property
    def cpu_threads(self) -> int:
        return self.shared.cores.total

    def make_drafter(self):
        from oospec.drafters import make_drafter

        return make_drafter(self.drafter_name, sidecar=self.shared.sidecar, schedule=self.schedule, plan=self.plan)

    def settle(self) -> float:
        # The warm-up's job is this schedule's first (exploring) one: timed here, it is not explored again.
        return getattr(self.drafter, "sidecar_drafter", self.drafter).settle()

    def start_session(self, reuse_prefixes: bool) -> None:
        super().start_session(reuse_prefixes)
        if reuse_prefixes:  # the sidecar's cache holds another method's turns of this session: start it cold
            self.shared.sidecar.clear_cache()
            self.plan.cache_cleared()
            self.shared.sidecar_last_item = None

    def run(self, sample, prompt_ids, reference, max_new_tokens) -> Run:
        item = (sample.dataset, sample.id)
        if self.shared.sidecar_last_item == item:
            self.shared.sidecar.clear_cache()
            self.plan.cache_cleared()
        self.shared.sidecar_last_item = item
        return record_sidecar(super().run(sample, prompt_ids, reference, max_new_tokens), self, sample)


def record_sidecar(run: Run, method: EngineMethod, sample) -> Run:
    """The method's sidecar report (its drafter's) and how it agrees with the call written, in the run's record."""
    report = method.drafter.report.as_dict()
    text = method.shared.engine.tokenizer.decode(run.tokens, skip_special_tokens=True)
    run.extra["sidecar"] = {**report, **sidecar_agreement(report, sample, text)}
    return run


class SlotRowsMethod(EngineMethod):
    """`oospec-rows`: no sidecar process (its rows ride on the target's forwards, on the target's cores); its job
    is recorded as a sidecar's."""

    def run(self, sample, prompt_ids, reference, max_new_tokens) -> Run:
        return record_sidecar(super().run(sample, prompt_ids, reference, max_new_tokens), self, sample)


class OoOSpecMethod(SidecarMethod):
    drafter_name = "oospec"


class OoOSpecAlwaysMethod(SidecarMethod):
    """`oospec` that sends every request's job, whatever the cost model expects (the method before the schedule)."""

    drafter_name = "oospec"
    schedule = "always"


class OoOSpecOwnCoresMethod(SidecarMethod):
    """`oospec` whose target never borrows the idle sidecar's threads: the method before the give-back."""

    drafter_name = "oospec"
    schedule = "always"

    def make_drafter(self):
        from oospec.drafters.sidecar import OoOSpecDrafter

        class OwnCoresDrafter(OoOSpecDrafter):
            def idle_threads(self) -> int:
                return 0  # the target keeps its own share of the cores even while the sidecar is idle

        return OwnCoresDrafter(sidecar=self.shared.sidecar, schedule=self.schedule, plan=self.plan)


class WaitingSidecar:
    """A sidecar client whose first poll of a request's job waits (up to `wait_s`, or until the job faults) for
    its payload: the drafter then has the hints from its first draft on, as a sidecar on its own accelerator would
    give them. A follow-up job (one function's slots) is polled as it is. `waited_s`: how long the last request's
    first poll waited (None: no job polled yet)."""

    def __init__(self, client, wait_s: float):
        self.client, self.wait_s = client, wait_s
        self.waited_s: float | None = None
        self._first_poll = None  # the request job's ticket, until it is polled

    def __getattr__(self, name):
        return getattr(self.client, name)

    def submit(self, job, tools):
        ticket = self.client.submit(job, tools)
        function = job.get("function") if isinstance(job, dict) else job.function
        if function is None:  # the request's job, not a follow-up
            self._first_poll, self.waited_s = ticket, None
        return ticket

    def poll(self, ticket):
        payload = self.client.poll(ticket)
        if ticket is None or ticket is not self._first_poll:
            return payload
        self._first_poll = None
        t0 = time.perf_counter()
        while payload is None and getattr(ticket, "fault", None) is None and time.perf_counter() - t0 < self.wait_s:
            time.sleep(0.005)
            payload = self.client.poll(ticket)
        self.waited_s = round(time.perf_counter() - t0, 4)
        return payload


class OoOSpecWaitMethod(SidecarMethod):
    """`oospec` whose target waits for the payload before its first draft (the wait counts in decode time): the
    tau of hints always in time, as a sidecar on its own accelerator gives a target that outpaces a CPU one."""

    drafter_name = "oospec"
    wait_s = 120.0
    schedule = "always"

    def make_drafter(self):
        from oospec.drafters import make_drafter

        self.waiting = WaitingSidecar(self.shared.sidecar, self.wait_s)
        return make_drafter(self.drafter_name, sidecar=self.waiting, schedule=self.schedule, plan=self.plan)

    def run(self, sample, prompt_ids, reference, max_new_tokens) -> Run:
        self.waiting.waited_s = None
        run = super().run(sample, prompt_ids, reference, max_new_tokens)
        if self.waiting.waited_s is not None:
            run.extra["sidecar"]["waited_s"] = self.waiting.waited_s
        return run


class HFMethod(BenchMethod):
    """A Hugging Face peer, timed end to end; its decode time is that minus `ar`'s prefill on the sample."""

    greedy_only = True  # HF samples with its own generator: its tokens could not be compared with `ar`'s
    through_engine = False

    def __init__(self, name: str, shared: Shared):
        super().__init__(name, shared)
        self.peer = self.make_peer()  # one for the whole run: it keeps no state between samples

    def make_peer(self) -> HFPeer:
        return PromptLookupPeer(self.shared.engine)

    def run(self, sample, prompt_ids, reference, max_new_tokens) -> Run:
        tokens, forwards, e2e = self.peer.generate(prompt_ids, max_new_tokens)
        prefill = reference.prefill_s if reference is not None else 0.0
        return Run(tokens, {
            "new_tokens": int(tokens.size),
            "target_forwards": forwards,
            "tau": tokens.size / forwards if forwards else 0.0,
            "accepted_per_step": None,
            "prefill_s": prefill,  # ar's, on this sample (see the footnote)
            "decode_s": max(0.0, e2e - prefill),
            "e2e_s": e2e,
            "draft_s": None,
        })


class HFAssistedMethod(HFMethod):
    def make_peer(self) -> HFPeer:
        shared, cfg = self.shared, self.shared.cfg
        if shared.assistant_model is None:
            from oospec.models.loading import load_model

            shared.assistant_model, shared.assistant_tokenizer = load_model(cfg.assistant, dtype=cfg.dtype,
                                                                            device=cfg.device)
            optimize_like_target(shared.assistant_model, cfg.optimize)  # the target's CPU kernels
        if shared.assistant_model is shared.engine.model:
            raise BenchError("the assistant must be a separate model instance (its forwards would be counted "
                             "as the target's)")
        return AssistedPeer(shared.engine, shared.assistant_model, shared.assistant_tokenizer)


ALL_CORES = "ar-all-cores"
TARGET_THREADS = "ar-target-threads"
ORACLE = "oracle"
# Methods that are not a drafter of their own name; any other name in oospec.drafters.DRAFTERS is an EngineMethod.
METHODS: dict[str, type[BenchMethod]] = {
    ORACLE: OracleMethod,
    ALL_CORES: AllCoresMethod,
    TARGET_THREADS: TargetThreadsMethod,
    "sidecar": SidecarMethod,
    "oospec": OoOSpecMethod,
    "oospec-wait": OoOSpecWaitMethod,
    "oospec-always": OoOSpecAlwaysMethod,
    "oospec-own-cores": OoOSpecOwnCoresMethod,
    "oospec-rows": SlotRowsMethod,
    "hf-pld": HFMethod,
    "hf-assisted": HFAssistedMethod,
}
AR_BASELINES = (REFERENCE, TARGET_THREADS, ALL_CORES)  # ar at some number of cores: the speed-ups' baselines


def method_class(name: str) -> type[BenchMethod]:
    return METHODS.get(name, EngineMethod)


def known_methods() -> list[str]:
    from oospec.drafters import DRAFTERS

    return list(dict.fromkeys([REFERENCE, *DRAFTERS, *METHODS]))


def parse_methods(methods: str | list[str]) -> list[str]:
    """Method names in run order, `ar` first (added when missing: it is the reference)."""
    items = methods.split(",") if isinstance(methods, str) else list(methods)
    items = [m.strip() for m in items if m and m.strip()]
    known = known_methods()
    unknown = [m for m in items if m not in known]
    if unknown:
        raise BenchError(f"unknown method(s) {', '.join(repr(m) + did_you_mean(m, known) for m in unknown)}; "
                         f"choose from: {', '.join(known)}")
    return [REFERENCE] + [m for m in dict.fromkeys(items) if m != REFERENCE]


def uses_sidecar(name: str) -> bool:
    return method_class(name).uses_sidecar


def check_methods_sample(names: list[str], temperature: float) -> None:
    """Refuse, before any model loads, a method that cannot sample as `ar` does at this temperature."""
    greedy = [m for m in names if method_class(m).greedy_only]
    if temperature > 0 and greedy:
        raise BenchError(f"{', '.join(greedy)} decode(s) greedily only in this benchmark; drop them with "
                         f"--temperature {temperature:g}")


def check_engine_features(names: list[str], sessions: bool, tool_choice: str) -> None:
    """Refuse, before any model loads, an unknown tool choice, and peers in a run that needs what only our engine
    does (a session's prefix cache, the call grammar)."""
    if tool_choice not in TOOL_CHOICES:
        raise BenchError(f"--tool-choice must be one of {', '.join(TOOL_CHOICES)}, got {tool_choice!r}")
    peers = ", ".join(m for m in names if not method_class(m).through_engine)
    if peers and sessions:
        raise BenchError(f"{peers} cannot reuse a session's prefixes: leave them out of a --sessions run")
    if peers and tool_choice != "auto":
        raise BenchError(f"{peers} cannot decode under the call grammar: leave them out of a --tool-choice "
                         f"{tool_choice} run")


def build_methods(names: list[str], shared: Shared) -> list[BenchMethod]:
    return [method_class(name)(name, shared) for name in names]


def sidecar_agreement(report: dict, sample, text: str) -> dict:
    """How the sidecar's payload compares with the call the target actually wrote."""
    from oospec.sidecar.agreement import compare_call
    from oospec.sidecar.protocol import Guess

    no_call = bool(report.get("no_call"))
    if not report.get("function") and not no_call:
        return {}
    try:
        calls = sample.parse(text)
    except Exception:
        calls = []
    if not calls or no_call:  # "no call" agrees with a target that wrote none, and only with that
        agree = not calls and no_call
        return {"function_match": agree, "slots_total": 0, "slots_matched": 0, "full_match": agree}
    guesses = [Guess(report["function"], report.get("arguments") or {}),
               *[Guess(g["function"], g.get("arguments") or {}) for g in report.get("alternatives", [])
                 if isinstance(g, dict)]]
    a = compare_call(guesses, calls[0])
    return {"function_match": a.function_match, "function_in_payload": a.function_in_payload,
            "slots_total": a.slots_total, "slots_matched": a.slots_matched, "full_match": a.full_match}
