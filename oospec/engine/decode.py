"""The decode loop: prefill, then draft -> verify -> commit until done; one loop for every path.

Greedy and sampled decoding differ only in the verify step (`verify_greedy`, `verify_sampled`); a grammar is a
mask that step applies to the target's logits, after `constrain` has cut the draft to it; plain decoding is the
same loop with a drafter that proposes nothing. Per-request state lives in a `DecodeState` built once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from oospec.engine.acceptance import greedy_accept
from oospec.engine.budget import SampledAcceptance, beside_slot_rows
from oospec.engine.constraint import GrammarConstraint
from oospec.engine.distribution import SamplingParams, inverse_cdf, target_distribution
from oospec.engine.drafting import Drafter, Request, build_tree
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.slot_rows import SlotFeed
from oospec.engine.speculative_sampling import speculative_accept
from oospec.engine.target import TargetBackend, greedy_choices
from oospec.engine.threads import ThreadShare
from oospec.engine.tree import TokenTree
from oospec.models.registry import DEFAULT_BUDGET

# Called with the tokens each step produced ((k,) int64, the first call with the prefill's token); returning
# True ends generation after those tokens (a stop string, a cancelled or timed-out request).
OnTokens = Callable[[np.ndarray], bool | None]


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_forwards: int = 0  # prefill included: it produces the first token
    accepted_per_step: list[int] = field(default_factory=list)  # draft tokens accepted by each verify forward
    tree_sizes: list[int] = field(default_factory=list)  # nodes verified by each verify forward
    slot_rows: list[int] = field(default_factory=list)  # slot rows beside them (Drafter.slot_feed), per forward
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0  # time inside drafters (part of decode_s)
    prompt_tokens_reused: int = 0  # prompt tokens restored from a prefix cache instead of prefilled
    threads_borrowed: int = 0  # the most CPU threads the target borrowed from an idle sidecar (ThreadShare)
    # Which path ran: "greedy" (lossless, speculative with a drafter), "speculative sample(temperature=..., ...)"
    # (distribution-preserving) or "sample(temperature=..., ...)" (plain sampling, no drafter).
    sampling: str = "greedy"

    @property
    def tau(self) -> float:
        """Mean tokens produced per target forward (1.0 for autoregressive decoding)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def mean_accepted(self) -> float:
        return float(np.mean(self.accepted_per_step)) if self.accepted_per_step else 0.0

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "tau": round(self.tau, 4),
            "mean_accepted_per_step": round(self.mean_accepted, 4),
            "accepted_per_step": self.accepted_per_step,
            "tree_sizes": self.tree_sizes,
            "slot_rows": self.slot_rows,
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "draft_s": round(self.draft_s, 4),
            "prompt_tokens_reused": self.prompt_tokens_reused,
            "threads_borrowed": self.threads_borrowed,
            "sampling": self.sampling,
        }


@dataclass
class Generation:
    tokens: np.ndarray  # (new_tokens,) int64 generated ids, the end-of-turn token included if produced
    stats: GenerationStats
    # "stop": an end-of-turn token, "length": max_new_tokens, "callback": on_tokens asked to stop
    finish_reason: str = "length"


@dataclass
class DecodeState:
    """What one request's decode derives from its Request once, and where the loop stands."""

    seq: np.ndarray  # (capacity,) int64: the prompt, then every produced token, written in place
    prompt_len: int
    max_new: int  # the most tokens produced (the request's, already fitted to the context by the engine)
    budget: int  # the most draft nodes verified per forward (the request's, capped by the forward's limit)
    slot_rows: int  # the most slot rows per forward, past the budget (Drafter.slot_rows)
    eos: np.ndarray  # (e,) int64 tokens that end the turn
    sampling: SamplingParams | None  # None: greedy
    # (max_new,) float64: the draw of each output position, as plain sampling makes them (speculative_sampling).
    uniforms: torch.Tensor | None
    meter: SampledAcceptance | None  # sampling: the acceptance seen so far, which shrinks later trees
    constraint: GrammarConstraint | None
    n: int = 0  # tokens in seq: prompt plus produced
    pending: int = -1  # the last produced token, not yet in the KV cache
    finish_reason: str | None = None  # set when generation ends (see Generation)

    @property
    def produced(self) -> int:
        return self.n - self.prompt_len


def generate(target: TargetBackend, drafter: Drafter | None, request: Request, *,
             prefix_cache: PrefixCache | None = None, on_tokens: OnTokens | None = None) -> Generation:
    """Decode `request` (prompt, max_new_tokens, budget, sampling, constraint), accelerated by `drafter`.

    Lossless whatever the drafter: greedy output is token-identical to plain greedy; sampled output is exactly
    the tokens plain sampling draws with the same seed (oospec.engine.speculative_sampling); under a grammar
    (oospec.engine.constraint) the constrained greedy or sampled output.
    drafter: None decodes plainly, one forward per token (its stats say "sample(...)" when sampling).
    request: as Engine.prepare leaves it: prompt ids set and fitting the context with max_new_tokens.
    prefix_cache: start from the longest cached prefix of the prompt, and keep this request's cache there.
    on_tokens: told the tokens of every step as they are accepted; may end generation (see OnTokens).
    """
    plain = drafter is None
    drafter = Drafter() if plain else drafter
    sampling = request.sampling
    stats = GenerationStats(sampling="greedy" if sampling is None else
                            f"{'sample' if plain else 'speculative sample'}({sampling.describe()})")
    # The target takes the threads of a sidecar on its CPU while that sidecar is idle (checked between
    # prefill chunks and before every verification); they are given back when it works again, and at the end.
    threads = ThreadShare(drafter)
    derived_cost = request.cost is None
    if derived_cost:  # the curve of the threads it will verify with: its own and those an idle sidecar lends
        request.cost = target.cost_model(threads.own + drafter.idle_threads())
    drafter.start(request)
    state = start_state(target, drafter, request)
    verify = verify_greedy if sampling is None else verify_sampled
    try:
        prefill(target, state, prefix_cache, threads, stats)
        drafter.observe(state.seq[state.n - 1 : state.n])
        tell(on_tokens, state, state.seq[state.n - 1 : state.n])
        t_decode = time.perf_counter()
        while state.finish_reason is None:
            tree, feed = draft(drafter, state, stats)
            tree, mask = constrain(state, tree)
            threads.update()
            path, bonus, slot_logits = verify(target, state, tree, mask, feed)
            produced = commit(target, state, tree, path, bonus, stats)
            stats.slot_rows.append(0 if feed is None else len(feed))
            if slot_logits is not None:
                drafter.slot_logits(feed, slot_logits)
            t_observe = time.perf_counter()
            drafter.observe(produced)
            stats.draft_s += time.perf_counter() - t_observe
            tell(on_tokens, state, produced)
        stats.decode_s = time.perf_counter() - t_decode
        if prefix_cache is not None:
            prefix_cache.store(target, state.seq[: min(state.n, target.length)])
    finally:
        threads.restore()
        drafter.finish()
        if derived_cost:  # derived for this decode: a request decoded again gets the curve of its threads then
            request.cost = None
    stats.threads_borrowed = threads.borrowed_max
    stats.new_tokens = state.produced
    return Generation(tokens=state.seq[state.prompt_len : state.n].copy(), stats=stats,
                      finish_reason=state.finish_reason)


def start_state(target: TargetBackend, drafter: Drafter, request: Request) -> DecodeState:
    """The request's decode state, and the target's cache reset to hold the prompt, the output and a tree."""
    prompt = np.asarray(request.prompt_ids, dtype=np.int64)
    max_new = request.max_new_tokens
    budget = request.budget if request.budget is not None else DEFAULT_BUDGET
    # The most nodes one forward takes (the invariant forward's limit, TargetBackend.max_tree_nodes): the tree's
    # budget first, slot rows in what is left. The drafter's slot rows are known once it has seen the request.
    step_nodes = getattr(target, "max_tree_nodes", None)
    # The padded forward (accelerators) has no slot rows: its attention sees every row's prefix whole.
    slot_rows = 0 if getattr(target, "step_rows", None) else max(0, int(drafter.slot_rows))
    if step_nodes is not None:
        budget = min(budget, step_nodes)
        slot_rows = min(slot_rows, step_nodes - budget)
    slot_store = max(0, int(drafter.slot_store)) if slot_rows else 0
    sampling = request.sampling
    capacity = prompt.size + max_new + budget + 1
    state = DecodeState(
        seq=np.empty(capacity, dtype=np.int64), prompt_len=prompt.size, max_new=max_new, budget=budget,
        slot_rows=slot_rows, eos=np.fromiter(request.eos_ids, dtype=np.int64), sampling=sampling,
        # Trees are pruned to the tokens still wanted, so no node reaches past the last uniform.
        uniforms=sampling.uniforms(max(max_new, 1)) if sampling is not None else None,
        meter=SampledAcceptance() if sampling is not None else None,
        constraint=request.constraint, n=prompt.size)
    state.seq[: prompt.size] = prompt
    target.reset(capacity + slot_rows + slot_store)  # a forward's slot rows past the store, the store kept
    return state


def prefill(target: TargetBackend, state: DecodeState, prefix_cache: PrefixCache | None, threads: ThreadShare,
            stats: GenerationStats) -> None:
    """1. Prefill: the prompt into the KV cache; its last logits give the first produced token, the pending one."""
    t0 = time.perf_counter()
    prompt = state.seq[: state.prompt_len]
    reused = prefix_cache.restore(target, prompt) if prefix_cache is not None else 0
    threads.update()
    if state.sampling is None and state.constraint is None:
        token = target.prefill(prompt, start=reused, between_chunks=threads.update)
    else:
        logits = target.prefill_logits(prompt, start=reused, between_chunks=threads.update)
        if state.constraint is not None:
            logits = state.constraint.mask_next(logits)
        token = int(greedy_choices(logits.reshape(-1))) if state.sampling is None else inverse_cdf(
            target_distribution(logits.cpu(), state.sampling), float(state.uniforms[0]))
        if state.constraint is not None:
            state.constraint.advance([token])
    stats.prefill_s = time.perf_counter() - t0
    stats.prompt_tokens_reused = reused
    stats.target_forwards = 1
    state.seq[state.n] = state.pending = token
    state.n += 1
    if token in state.eos:
        state.finish_reason = "stop"
    elif state.max_new <= 1:
        state.finish_reason = "length"


def draft(drafter: Drafter, state: DecodeState, stats: GenerationStats) -> tuple[TokenTree, SlotFeed | None]:
    """2. Draft: a tree below the pending token of at most `budget` nodes, no deeper than the tokens still wanted
    after the bonus token; and the drafter's slot rows for the same forward (None: none)."""
    remaining = state.max_new - state.produced
    if remaining <= 1:
        return TokenTree.empty(), None
    t0 = time.perf_counter()
    context = state.seq[: state.n]  # a view: drafters read the prompt and output as written, never re-tokenized
    discount = state.meter.discount if state.meter is not None else 1.0
    cost = drafter.cost
    if state.slot_rows and cost is not None:  # the tree sized beside the slot rows that pay (the drafter's offer)
        wanted, credit = drafter.slot_offer()
        if wanted > 0 and credit > 0.0:
            cost = beside_slot_rows(cost, state.budget + 1, min(wanted, state.slot_rows), credit)
    tree = build_tree(drafter.candidates(context), state.budget, cost, discount).pruned(state.budget, remaining - 1)
    # Slot rows ride beside the tree's rows only where they pay for the wider forward (the drafter weighs that
    # with the same rule: it knows what its rows save).
    feed = drafter.slot_feed(context, state.slot_rows, len(tree) + 1) if state.slot_rows else None
    if feed is not None and len(feed) > state.slot_rows:
        raise ValueError(f"{drafter.name} fed {len(feed)} slot rows, more than the {state.slot_rows} it was given")
    stats.draft_s += time.perf_counter() - t0
    return tree, feed


def constrain(state: DecodeState, tree: TokenTree) -> tuple[TokenTree, torch.Tensor | None]:
    """(the tree without the nodes the grammar forbids, (len(tree)+1, words) int32 the allowed tokens after the
    pending token and after each node); (tree, None) without a grammar."""
    if state.constraint is None:
        return tree, None
    return state.constraint.prune(tree)


def verify_greedy(target: TargetBackend, state: DecodeState, tree: TokenTree, mask: torch.Tensor | None,
                  feed: SlotFeed | None) -> tuple[np.ndarray, int, torch.Tensor | None]:
    """3. Verify, greedy: one forward over the pending token, every node and the slot rows; accepted the longest
    path the target agrees with, then its own next token (oospec.engine.acceptance). (path, bonus, the slot rows'
    logits or None)."""
    if mask is None and feed is None:
        choices, slot_logits = target.verify(state.pending, tree), None
    else:
        logits, slot_logits = target.verify_rows(state.pending, tree, feed)
        if mask is not None:
            logits = state.constraint.apply(logits, mask)
        choices = greedy_choices(logits)
    path, bonus = greedy_accept(tree, choices)
    return path, bonus, slot_logits


def verify_sampled(target: TargetBackend, state: DecodeState, tree: TokenTree, mask: torch.Tensor | None,
                   feed: SlotFeed | None) -> tuple[np.ndarray, int, torch.Tensor | None]:
    """3. Verify, sampled: one forward; accepted the path speculative sampling accepts, then the token it draws
    after it (oospec.engine.speculative_sampling). (path, bonus, the slot rows' logits or None)."""
    if feed is None:
        logits, slot_logits = target.verify_logits(state.pending, tree), None
    else:
        logits, slot_logits = target.verify_rows(state.pending, tree, feed)
    if mask is not None:
        logits = state.constraint.apply(logits, mask)
    path, bonus = speculative_accept(tree, logits, state.sampling, state.uniforms[state.produced :], state.meter)
    return path, bonus, slot_logits


def commit(target: TargetBackend, state: DecodeState, tree: TokenTree, path: np.ndarray, bonus: int,
           stats: GenerationStats) -> np.ndarray:
    """4. Commit: the KV cache keeps the pending token and the accepted nodes; the produced tokens (accepted, then
    the bonus, cut after an end-of-turn token) join the sequence, the bonus becomes pending. Returns them."""
    target.commit(path)
    stats.target_forwards += 1
    stats.accepted_per_step.append(int(path.size))
    stats.tree_sizes.append(len(tree))
    first, k = state.n, path.size
    state.seq[first : first + k] = tree.tokens[path]
    state.seq[first + k] = bonus
    produced = state.seq[first : first + k + 1]
    stop = np.flatnonzero(np.isin(produced, state.eos))
    if stop.size:
        produced = produced[: stop[0] + 1]
        state.finish_reason = "stop"
    if state.constraint is not None:  # the end-of-turn too: a reply that a grammar failure ended records it
        state.constraint.advance(produced)
    state.n = min(first + produced.size, state.prompt_len + state.max_new)
    if state.finish_reason is None and state.produced >= state.max_new:
        state.finish_reason = "length"
    state.pending = bonus
    return state.seq[first : state.n]


def tell(on_tokens: OnTokens | None, state: DecodeState, tokens: np.ndarray) -> None:
    """Hand a step's tokens to `on_tokens`; its True ends generation unless it has ended already."""
    if on_tokens is not None and on_tokens(tokens) and state.finish_reason is None:
        state.finish_reason = "callback"
