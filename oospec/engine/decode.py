"""The speculative decode loop: prefill, then propose -> verify -> accept -> commit until done."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from oospec.engine.acceptance import greedy_accept
from oospec.engine.budget import SampledAcceptance
from oospec.engine.constraint import GrammarConstraint
from oospec.engine.distribution import SamplingParams, inverse_cdf, target_distribution
from oospec.engine.drafting import Drafter, Request, build_tree
from oospec.engine.prefix_cache import PrefixCache
from oospec.engine.speculative_sampling import speculative_accept
from oospec.engine.target import TargetBackend
from oospec.engine.threads import ThreadShare
from oospec.engine.tree import TokenTree
from oospec.errors import ContextLengthError
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
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0  # time inside drafters (part of decode_s)
    prompt_tokens_reused: int = 0  # prompt tokens restored from a prefix cache instead of prefilled
    threads_borrowed: int = 0  # the most CPU threads the target borrowed from an idle sidecar (ThreadShare)
    # Which path ran: "greedy" (speculative, lossless), "speculative sample(temperature=..., ...)" (speculative,
    # distribution-preserving) or "sample(temperature=..., ...)" (plain sampling, one forward per token).
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


def generate(
    target: TargetBackend,
    drafter: Drafter,
    request: Request,
    max_new_tokens: int,
    budget: int = DEFAULT_BUDGET,
    *,
    prefix_cache: PrefixCache | None = None,
    on_tokens: OnTokens | None = None,
    sampling: SamplingParams | None = None,
    constraint: GrammarConstraint | None = None,
) -> Generation:
    """Greedy decoding of `request.prompt_ids`, accelerated by `drafter`; token-identical to plain greedy.

    budget: the most draft nodes verified per forward.
    sampling: sample instead (temperature > 0), verifying trees by speculative sampling: the output is exactly
    the tokens plain sampling (oospec.engine.sampling) draws with the same seed, whatever the drafts
    (oospec.engine.speculative_sampling).
    prefix_cache: start from the longest cached prefix of the prompt, and keep this request's cache there.
    on_tokens: told the tokens of every step as they are accepted; may end generation (see OnTokens).
    constraint: a grammar the output follows (oospec.engine.constraint): drafts are pruned to it and the target's
    logits masked by it at every node, so the output is the constrained greedy (or sampled) output.
    """
    prompt = np.asarray(request.prompt_ids, dtype=np.int64)
    p = prompt.size
    step_nodes = getattr(target, "max_tree_nodes", None)  # the invariant forward's limit (TargetBackend)
    if step_nodes is not None:
        budget = min(budget, step_nodes)
    eos = np.fromiter(request.eos_ids, dtype=np.int64)
    check_fits(p, max_new_tokens, target.max_context)
    stats = GenerationStats(sampling="greedy" if sampling is None else f"speculative sample({sampling.describe()})")
    # One uniform per output position, as plain sampling draws them (see oospec.engine.speculative_sampling);
    # trees are pruned to the tokens still wanted, so no node reaches past the last one.
    uniforms = sampling.uniforms(max(max_new_tokens, 1)) if sampling is not None else None
    meter = SampledAcceptance() if sampling is not None else None  # smaller trees where sampling is less sure
    finish_reason = "length"
    # The target takes the threads of a sidecar on its CPU while that sidecar is idle (checked between
    # prefill chunks and before every verification); they are given back when it works again, and at the end.
    threads = ThreadShare(drafter)
    if request.cost is None:
        # The curve of the threads it will verify with: its own and those the idle sidecar lends it.
        request = replace(request, cost=target.cost_model(threads.own + drafter.idle_threads()))
    drafter.start(request)
    # Nodes beyond the budget where the drafter reads the target's own predictions (Drafter.probes); known
    # once it has seen the request (its cost curve says how cheap extra rows are).
    probe_nodes = max(0, int(getattr(drafter, "probe_nodes", 0)))
    if step_nodes is not None:
        probe_nodes = min(probe_nodes, step_nodes - budget)
    # Prompt, then produced tokens, written in place: drafters read a view, nothing is re-tokenized.
    seq = np.empty(p + max_new_tokens + budget + probe_nodes + 1, dtype=np.int64)
    seq[:p] = prompt
    n = p
    target.reset(p + max_new_tokens + budget + probe_nodes + 1)
    try:
        # 1. Prefill: the prompt goes into the cache, its last logits give the first (pending) token.
        t0 = time.perf_counter()
        reused = prefix_cache.restore(target, prompt) if prefix_cache is not None else 0
        threads.update()
        if sampling is None and constraint is None:
            pending = target.prefill(prompt, start=reused, between_chunks=threads.update)
        else:
            logits = target.prefill_logits(prompt, start=reused, between_chunks=threads.update)
            if constraint is not None:
                logits = constraint.mask_next(logits)
            pending = int(logits.argmax()) if sampling is None else inverse_cdf(
                target_distribution(logits.cpu(), sampling), float(uniforms[0]))
            if constraint is not None:
                constraint.advance([pending])
        stats.prefill_s = time.perf_counter() - t0
        stats.prompt_tokens_reused = reused
        stats.target_forwards = 1
        seq[n] = pending
        n += 1
        done = max_new_tokens <= 1 or pending in request.eos_ids
        if pending in request.eos_ids:
            finish_reason = "stop"
        drafter.observe(seq[n - 1 : n])
        if on_tokens is not None and on_tokens(seq[n - 1 : n]) and not done:
            done, finish_reason = True, "callback"
        t_decode = time.perf_counter()
        while not done:
            remaining = max_new_tokens - (n - p)
            # 2. Propose: a tree below the pending token, no deeper than the tokens still wanted.
            t_draft = time.perf_counter()
            if remaining > 1:
                discount = meter.discount if meter is not None else 1.0
                tree = build_tree(drafter.candidates(seq[:n]), budget, drafter.cost, discount).pruned(budget,
                                                                                                    remaining - 1)
                if probe_nodes:
                    tree = tree.extended(drafter.probes(seq[:n]), len(tree) + probe_nodes, remaining - 1)
            else:
                tree = TokenTree.empty()
            stats.draft_s += time.perf_counter() - t_draft
            if constraint is not None:  # nodes the grammar forbids go; the allowed tokens after each node stay
                tree, allowed = constraint.prune(tree)
            threads.update()
            # 3. Verify: one target forward over the pending token and every node (under a grammar, the
            #    forbidden tokens' logits at -inf after each).
            # 4. Accept: greedy, the longest path the target agrees with, plus its own next token; sampling, the
            #    path speculative sampling accepts, plus the token it draws after it.
            choices = None
            if constraint is None and sampling is None:
                choices = target.verify(pending, tree)
                path, bonus = greedy_accept(tree, choices)
            else:
                logits = target.verify_logits(pending, tree)
                if constraint is not None:
                    logits = constraint.apply(logits, allowed)
                if sampling is None:
                    choices = logits.argmax(-1).cpu().numpy()
                    path, bonus = greedy_accept(tree, choices)
                else:
                    path, bonus = speculative_accept(tree, logits, sampling, uniforms[n - p :], meter)
                    if probe_nodes:  # the probes want the target's likeliest token, sampled or not
                        choices = logits.argmax(-1).cpu().numpy()
            if probe_nodes and len(tree):
                drafter.verified(tree, choices)
            # 5. Commit: keep exactly the pending token and the accepted nodes in the KV cache.
            target.commit(path)
            stats.target_forwards += 1
            stats.accepted_per_step.append(int(path.size))
            stats.tree_sizes.append(len(tree))
            k = path.size
            seq[n : n + k] = tree.tokens[path]
            seq[n + k] = bonus
            produced = seq[n : n + k + 1]
            stop = np.flatnonzero(np.isin(produced, eos))
            if stop.size:
                produced = produced[: stop[0] + 1]
                done, finish_reason = True, "stop"
            if constraint is not None:  # the end-of-turn too: a reply a grammar failure ended records it
                constraint.advance(produced)
            first = n
            n += produced.size
            if n - p >= max_new_tokens:
                n = p + max_new_tokens
                done = True
            t_obs = time.perf_counter()
            drafter.observe(produced)
            stats.draft_s += time.perf_counter() - t_obs
            pending = bonus
            if on_tokens is not None and on_tokens(seq[first:n]) and not done:
                done, finish_reason = True, "callback"
        stats.decode_s = time.perf_counter() - t_decode
        if prefix_cache is not None:
            prefix_cache.store(target, seq[: min(n, target.length)])
    finally:
        threads.restore()
        drafter.finish()
    stats.threads_borrowed = threads.borrowed_max
    stats.new_tokens = n - p
    return Generation(tokens=seq[p:n].copy(), stats=stats, finish_reason=finish_reason)


def check_fits(prompt_tokens: int, max_new_tokens: int, max_context: int) -> None:
    if prompt_tokens == 0:
        raise ValueError("empty prompt")
    if prompt_tokens + max_new_tokens > max_context:
        raise ContextLengthError(
            f"prompt of {prompt_tokens} tokens plus max_new_tokens={max_new_tokens} exceeds the model's context of "
            f"{max_context} tokens: shorten the prompt or lower max_new_tokens"
        )
