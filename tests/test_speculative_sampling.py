"""Speculative sampling preserves the target's distribution: statistical tests that can fail.

The target here is a pure function of the last two tokens (a random logits table over a 4-token vocabulary),
so the exact joint distribution of the first tokens is known. For each drafter (the likely token, unlikely
tokens, tokens outside top-p/top-k, duplicate siblings, random trees, empty trees) we draw N generations,
and the joint distribution of their first tokens must pass a chi-square goodness-of-fit test against the
exact one (p > 0.001, cells with expected count < 5 pooled) and lie within total-variation distance
TV_BOUND of it. A verifier that accepts with p(x) but never renormalises the residual must fail the same
test. End to end, decode.generate (speculative) and sampling.sample (plain) are checked against the same
exact distribution, and against each other on a tiny random transformer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from adversarial import RandomTreeDrafter, tree_candidates
from helpers import decode_request, tiny_model

from oospec.engine.acceptance import greedy_accept
from oospec.engine.decode import generate
from oospec.engine.distribution import SamplingParams, inverse_cdf, target_distribution
from oospec.engine.drafting import Candidate, Drafter, build_tree
from oospec.drafters.toolspec import MergedDrafter
from oospec.engine.budget import CPU_CURVES, CostModel
from oospec.engine.speculative_sampling import speculative_accept
from oospec.engine.target import TargetBackend
from oospec.engine.tree import ROOT, TokenTree

VOCAB = 4
N_TOKENS = 3  # the joint distribution of the first 3 generated tokens: 64 cells
N_SAMPLES = 3000
# E[TV] of N multinomial samples is about sum_i sqrt(p_i / (2 pi N)), about 0.04 here; 0.08 is several standard
# deviations above it and far below the bias of a wrong verifier (see test_a_verifier_that_does_not_renormalise_fails).
TV_BOUND = 0.08
P_MIN = 1e-3
PROMPT = np.array([1, 2], dtype=np.int64)


class TableTarget:
    """A target whose logits after a context are a fixed random function of its last two tokens.

    Implements the parts of TargetBackend the decode loops use; the 'cache' is the list of committed tokens."""

    max_context = 1 << 20

    def __init__(self, seed: int = 0, scale: float = 1.5):
        gen = torch.Generator().manual_seed(seed)
        table = torch.randn(VOCAB, VOCAB, VOCAB, generator=gen, dtype=torch.float64) * scale
        self.rows = [[table[a, b] for b in range(VOCAB)] for a in range(VOCAB)]  # indexed once: tests draw a lot
        self.committed: list[int] = []
        self._ranked: dict = {}

    def logits_after(self, context) -> torch.Tensor:
        return self.rows[int(context[-2])][int(context[-1])]

    @property
    def length(self) -> int:
        return len(self.committed)

    def reset(self, capacity: int) -> None:
        self.committed = []

    def cost_model(self, threads: int | None = None) -> CostModel:
        return CostModel.flat()

    def prefill_logits(self, prompt_ids, start: int = 0, between_chunks=None) -> torch.Tensor:
        self.committed = [int(t) for t in prompt_ids]
        return self.logits_after(self.committed)

    def prefill(self, prompt_ids, start: int = 0, between_chunks=None) -> int:
        return int(self.prefill_logits(prompt_ids, start).argmax())

    def verify_logits(self, pending: int, tree: TokenTree) -> torch.Tensor:
        self._pending, self._tree = pending, tree
        base = self.committed + [pending]
        rows = [self.logits_after(base)]
        for i in range(len(tree)):
            rows.append(self.logits_after(base + tree.tokens[tree.path_to(i)].tolist()))
        return torch.stack(rows)

    def verify(self, pending: int, tree: TokenTree) -> np.ndarray:
        return self.verify_logits(pending, tree).argmax(-1).numpy()

    def commit(self, accepted: np.ndarray) -> None:
        self.committed += [self._pending] + self._tree.tokens[accepted].tolist()


def exact_joint(target: TableTarget, params: SamplingParams) -> np.ndarray:
    """(VOCAB**N_TOKENS,) the exact probability of every sequence of first tokens, row-major."""
    out = np.zeros(VOCAB**N_TOKENS)
    for k, seq in enumerate(itertools.product(range(VOCAB), repeat=N_TOKENS)):
        prob, context = 1.0, list(PROMPT)
        for tok in seq:
            prob *= float(target_distribution(target.logits_after(context), params)[tok])
            context.append(tok)
        out[k] = prob
    return out


def cell(tokens) -> int:
    return int(np.ravel_multi_index(tuple(int(t) for t in tokens[:N_TOKENS]), (VOCAB,) * N_TOKENS))


def chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Goodness-of-fit p-value of `counts` under `expected_probs`; cells expecting < 5 are pooled into one."""
    n = counts.sum()
    expected = expected_probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    if np.any(obs[~keep] > 0):
        return 0.0  # a sequence of probability 0 was generated
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.size - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def total_variation(counts: np.ndarray, probs: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - probs).sum())


def fits(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    return chi_square_p(counts, probs), total_variation(counts, probs)


# ----------------------------------------------------------------------------------------------------------
# Verifier-level sampling: the decode loop's steps over the table target, with any tree and any verifier
# ----------------------------------------------------------------------------------------------------------


def speculative_counts(target, params, make_tree, verifier=speculative_accept, n=N_SAMPLES, seed=0) -> np.ndarray:
    """Counts of the first N_TOKENS tokens over n generations, each step's tree from make_tree(context, rng)."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    counts = np.zeros(VOCAB**N_TOKENS, dtype=np.int64)
    for _ in range(n):
        context = list(PROMPT)
        uniforms = torch.rand(N_TOKENS + 16, generator=gen, dtype=torch.float64)  # trees here are < 16 deep
        out = [inverse_cdf(target_distribution(target.logits_after(context), params), float(uniforms[0]))]
        while len(out) < N_TOKENS:
            base = context + out
            tree = make_tree(base, rng)
            rows = [target.logits_after(base)]
            rows += [target.logits_after(base + tree.tokens[tree.path_to(i)].tolist()) for i in range(len(tree))]
            path, token = verifier(tree, torch.stack(rows), params, uniforms[len(out) :])
            out += tree.tokens[path].tolist() + [token]
        counts[cell(out)] += 1
    return counts


def ranked(target, params, context) -> list[int]:
    """Tokens from most to least likely after `context` (ties by id)."""
    key = (params, int(context[-2]), int(context[-1]))
    if key not in target._ranked:
        p = target_distribution(target.logits_after(context), params).numpy()
        target._ranked[key] = sorted(range(VOCAB), key=lambda t: (-p[t], t))
    return target._ranked[key]


def chain_of(pick):
    """A make_tree proposing a chain of N_TOKENS tokens, each chosen by pick(ranking) after the ones before."""

    def make(target, params):
        def make_tree(context, rng):
            tokens, ctx = [], list(context)
            for _ in range(N_TOKENS):
                tokens.append(pick(ranked(target, params, ctx)))
                ctx.append(tokens[-1])
            return TokenTree.chain(tokens)

        return make_tree

    return make


def top_two_tree(target, params):
    """At each of two levels, the two most likely tokens (the most likely first): a full binary tree."""

    def make_tree(context, rng):
        tokens, parents = [], []
        for first in ranked(target, params, context)[:2]:
            tokens.append(first)
            parents.append(ROOT)
            node = len(tokens) - 1
            for second in ranked(target, params, context + [first])[:2]:
                tokens.append(second)
                parents.append(node)
        return TokenTree(np.array(tokens), np.array(parents))

    return make_tree


def duplicate_siblings_tree(target, params):
    """The likely token three times among the root's children, each with a different subtree, then the unlikely one."""

    def make_tree(context, rng):
        r = ranked(target, params, context)
        tokens = [r[0], r[1], r[0], r[0], r[1], r[3], r[-1]]
        parents = [ROOT, 0, ROOT, ROOT, 2, 3, ROOT]
        return TokenTree(np.array(tokens), np.array(parents))

    return make_tree


def random_tree(target, params):
    def make_tree(context, rng):
        n = int(rng.integers(0, 9))
        parents = [int(rng.integers(ROOT, i)) if i else ROOT for i in range(n)]
        return TokenTree(rng.integers(0, VOCAB, n), np.array(parents, dtype=np.int32))

    return make_tree


def empty_tree(target, params):
    return lambda context, rng: TokenTree.empty()


HOT = SamplingParams(temperature=0.9)
CUT = SamplingParams(temperature=1.2, top_p=0.7, top_k=3)  # top-p and top-k each remove tokens here

SCENARIOS = {
    "likely chain": (chain_of(lambda r: r[0]), HOT),
    "unlikely chain": (chain_of(lambda r: r[-1]), HOT),
    "outside top-p chain": (chain_of(lambda r: r[-1]), CUT),
    "top-two tree, top-p": (top_two_tree, CUT),
    "top-two tree": (top_two_tree, HOT),
    "duplicate siblings": (duplicate_siblings_tree, HOT),
    "random trees": (random_tree, HOT),
    "empty trees": (empty_tree, HOT),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_speculative_sampling_matches_the_exact_distribution(name):
    make, params = SCENARIOS[name]
    target = TableTarget(seed=1)
    probs = exact_joint(target, params)
    counts = speculative_counts(target, params, make(target, params), seed=list(SCENARIOS).index(name))
    p_value, tv = fits(counts, probs)
    print(f"{name}: N={counts.sum()} chi2 p={p_value:.4f} TV={tv:.4f} (bound {TV_BOUND})")
    assert p_value > P_MIN and tv < TV_BOUND, (name, p_value, tv)


def procedural_accept(seed: int, renormalise: bool = True):
    """The rule as the issue writes it, one uniform per tried child: accept x with probability r(x), on rejection
    r(x) = 0 and renormalise, else draw from r. renormalise=False is the deliberately wrong verifier: it accepts
    with p(x) and never renormalises the residual (its draw from r at the end is still normalised)."""
    generator = torch.Generator().manual_seed(seed)

    def accept(tree, logits, params, uniforms):
        children = {ROOT: []} | {i: [] for i in range(len(tree))}
        for i, parent in enumerate(tree.parents.tolist()):
            children[parent].append(i)
        path, node = [], ROOT
        while True:
            p = target_distribution(logits[node + 1], params)
            residual = p.clone()
            accepted, tried = None, set()
            for child in children[node]:
                x = int(tree.tokens[child])
                if x in tried:
                    continue
                tried.add(x)
                u = float(torch.rand((), generator=generator, dtype=torch.float64))
                if u < float(residual[x] / residual.sum() if renormalise else p[x]):
                    accepted = child
                    break
                residual[x] = 0.0
            if accepted is None:
                u = float(torch.rand((), generator=generator, dtype=torch.float64))
                return np.asarray(path, dtype=np.int64), inverse_cdf(residual if residual.any() else p, u)
            path.append(accepted)
            node = accepted

    return accept


# On a chain the rule needs no renormalisation (one child per node), so the wrong verifier is wrong on trees.
@pytest.mark.parametrize("name", ["top-two tree", "top-two tree, top-p"])
def test_the_procedural_rule_passes_and_a_verifier_that_does_not_renormalise_fails(name):
    make, params = SCENARIOS[name]
    target = TableTarget(seed=1)
    probs = exact_joint(target, params)
    right = speculative_counts(target, params, make(target, params), verifier=procedural_accept(5), seed=5)
    wrong = speculative_counts(target, params, make(target, params), verifier=procedural_accept(5, False), seed=5)
    (p_right, tv_right), (p_wrong, tv_wrong) = fits(right, probs), fits(wrong, probs)
    print(f"procedural rule, {name}: N={right.sum()} chi2 p={p_right:.4f} TV={tv_right:.4f}")
    print(f"wrong verifier, {name}: N={wrong.sum()} chi2 p={p_wrong:.2e} TV={tv_wrong:.4f}")
    assert p_right > P_MIN and tv_right < TV_BOUND
    assert p_wrong < P_MIN and tv_wrong > TV_BOUND, (name, p_wrong, tv_wrong)


def test_verifier_unit_cases():
    params = SamplingParams(temperature=1.0)
    u = torch.full((4,), 0.5, dtype=torch.float64)
    # A token of probability 1 is always accepted; one of probability 0 never is, nor emitted.
    logits = torch.tensor([[0.0, -1e9, -1e9, -1e9]] * 4)
    path, token = speculative_accept(TokenTree.chain([0, 0]), logits[:3], params, u)
    assert path.tolist() == [0, 1] and token == 0
    path, token = speculative_accept(TokenTree(np.array([3, 2, 0]), np.array([ROOT, ROOT, ROOT])), logits, params, u)
    assert path.tolist() == [2] and token == 0
    path, token = speculative_accept(TokenTree.chain([1]), logits[:2], params, u)
    assert path.size == 0 and token == 0
    # Duplicate siblings: the first one drafting the token is followed, the later one's subtree is skipped.
    tree = TokenTree(np.array([0, 0, 0]), np.array([ROOT, ROOT, 1]))
    path, token = speculative_accept(tree, logits, params, u)
    assert path.tolist() == [0] and token == 0
    # Empty tree: the token at u from p; u sweeps the vocabulary in order, and a 0-probability token is skipped.
    flat = torch.log(torch.tensor([[0.25, 0.25, 0.0, 0.5]]))
    drawn = [speculative_accept(TokenTree.empty(), flat, params, torch.tensor([x]))[1] for x in (0.0, 0.3, 0.5, 0.99)]
    assert drawn == [0, 1, 3, 3]


def test_greedy_is_the_temperature_zero_limit():
    """At a tiny temperature p is one-hot: speculative sampling accepts exactly what greedy_accept does."""
    target = TableTarget(seed=3, scale=3.0)
    rng = np.random.default_rng(0)
    cold = SamplingParams(temperature=1e-6)
    for _ in range(200):
        # build_tree merges duplicate siblings: with them, greedy_accept may follow a later duplicate's
        # subtree where the sampler (which tries each token once per node) stops, both correct.
        tree = build_tree(tree_candidates(random_tree(target, cold)(list(PROMPT), rng)), 16)
        base = list(PROMPT) + [int(rng.integers(VOCAB))]
        rows = [target.logits_after(base)]
        rows += [target.logits_after(base + tree.tokens[tree.path_to(i)].tolist()) for i in range(len(tree))]
        logits = torch.stack(rows)
        path, token = speculative_accept(tree, logits, cold, torch.rand(tree.max_depth + 1, dtype=torch.float64))
        greedy_path, bonus = greedy_accept(tree, logits.argmax(-1).numpy())
        assert token == bonus and tree.tokens[path].tolist() == tree.tokens[greedy_path].tolist()


# ----------------------------------------------------------------------------------------------------------
# End to end: decode.generate (speculative) and sampling.sample (plain) through the real loops
# ----------------------------------------------------------------------------------------------------------


class LikelyChainDrafter(Drafter):
    """Proposes the target's most likely continuation (it reads the table target: a perfect drafter)."""

    name = "likely"

    def __init__(self, target: TableTarget, params: SamplingParams):
        self.target, self.params = target, params

    def candidates(self, context):
        tokens, ctx = [], context.tolist()
        for _ in range(N_TOKENS):
            tokens.append(ranked(self.target, self.params, ctx)[0])
            ctx.append(tokens[-1])
        return [Candidate(np.array(tokens)), Candidate(np.array([ranked(self.target, self.params, context)[1]]))]


def loop_counts(run, n: int) -> np.ndarray:
    counts = np.zeros(VOCAB**N_TOKENS, dtype=np.int64)
    for i in range(n):
        counts[cell(run(i).tokens)] += 1
    return counts


@pytest.mark.parametrize("drafter_kind", ["likely", "random"])
def test_generate_and_plain_sample_both_match_the_exact_distribution(drafter_kind):
    target = TableTarget(seed=2)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    probs = exact_joint(target, params)
    n = 2500
    drafter = LikelyChainDrafter(target, params) if drafter_kind == "likely" else RandomTreeDrafter(VOCAB, 0, 8)
    spec = loop_counts(lambda i: generate(target, drafter, decode_request(
        PROMPT, N_TOKENS, 16, sampling=SamplingParams(1.0, 0.9, seed=i))), n)
    plain = loop_counts(lambda i: generate(target, None, decode_request(
        PROMPT, N_TOKENS, sampling=SamplingParams(1.0, 0.9, seed=10**6 + i))), n)
    for label, counts in (("speculative", spec), ("plain", plain)):
        p_value, tv = fits(counts, probs)
        print(f"generate end to end, {drafter_kind}, {label}: N={n} chi2 p={p_value:.4f} TV={tv:.4f}")
        assert p_value > P_MIN and tv < 0.09, (label, p_value, tv)


def test_tiny_transformer_speculative_sampling_matches_the_exact_distribution():
    """A random qwen2 with a 4-token vocabulary through the real TargetBackend (tree masks, row order, commit):
    the first two tokens from speculative sampling over random trees follow the model's exact joint."""
    vocab, n = 4, 300
    model = tiny_model("qwen2", seed=4, vocab=vocab)
    target = TargetBackend(model)
    prompt = np.array([1, 3, 2, 0, 3])
    params = SamplingParams(temperature=1.0, top_k=3)
    with torch.inference_mode():
        first = target_distribution(model(torch.as_tensor(prompt).view(1, -1)).logits[0, -1], params)
        after = [target_distribution(model(torch.as_tensor(np.append(prompt, a)).view(1, -1)).logits[0, -1], params)
                 for a in range(vocab)]
    probs = torch.stack([first[a] * after[a] for a in range(vocab)]).reshape(-1).numpy()
    drafter = RandomTreeDrafter(vocab, seed=1, max_nodes=6)
    counts = np.zeros(vocab * vocab, dtype=np.int64)
    for i in range(n):
        request = decode_request(prompt, 2, 8, sampling=SamplingParams(1.0, top_k=3, seed=i))
        toks = generate(target, drafter, request).tokens
        counts[int(toks[0]) * vocab + int(toks[1])] += 1
    p_value, tv = fits(counts, probs)
    # E[TV] is about 0.06 at n=300 over these 16 cells (12 of them possible under top_k=3)
    print(f"tiny qwen2 speculative: N={n} chi2 p={p_value:.4f} TV={tv:.4f}")
    assert p_value > P_MIN and tv < 0.15


def test_same_seed_same_output_whatever_the_drafts_and_stats_say_which_path_ran():
    """Each output position's token is the inverse-CDF draw of that position's uniform: with the same seed,
    speculative sampling returns plain sampling's tokens exactly, with any drafter (as greedy speculation
    returns plain greedy's), and a different seed gives different tokens."""
    target = TableTarget(seed=2)
    for seed in range(5):
        params = SamplingParams(0.8, top_p=0.95, top_k=3, seed=seed)
        plain = generate(target, None, decode_request(PROMPT, 40, sampling=params))
        assert plain.stats.sampling == "sample(temperature=0.8, top_p=0.95, top_k=3)" and plain.stats.tau == 1.0
        # The merged one is cost-aware: its trees shrink as the request's sampled acceptance is learnt.
        merged = MergedDrafter([LikelyChainDrafter(target, params), RandomTreeDrafter(VOCAB, seed, 8)],
                               CostModel.from_curve(CPU_CURVES["float32", 1]))
        for drafter in (RandomTreeDrafter(VOCAB, seed, 8), LikelyChainDrafter(target, params), Drafter(), merged):
            spec = generate(target, drafter, decode_request(PROMPT, 40, 8, sampling=params))
            assert np.array_equal(spec.tokens, plain.tokens), (seed, drafter.name)
            assert spec.stats.sampling == "speculative sample(temperature=0.8, top_p=0.95, top_k=3)"
    other = generate(target, None, decode_request(PROMPT, 40, sampling=SamplingParams(0.8, top_p=0.95, top_k=3,
                                                                                      seed=99)))
    assert not np.array_equal(other.tokens, plain.tokens)
    likely = generate(target, LikelyChainDrafter(target, params), decode_request(PROMPT, 40, 8, sampling=params))
    assert likely.stats.tau > 1.5  # the likely chain is accepted often: fewer forwards than tokens
    assert generate(target, Drafter(), decode_request(PROMPT, 10, 8)).stats.sampling == "greedy"


def test_tiny_transformer_speculative_sampling_returns_plain_sampling_tokens(tiny):
    """Through the real TargetBackend (tree masks, row order, KV commit) on random qwen2 and llama models:
    the same seed gives plain sampling's tokens with random-tree drafts, also at top-p/top-k cuts."""
    target = TargetBackend(tiny)
    prompt = np.array([5, 17, 3, 99, 42, 7])
    vocab = tiny.config.vocab_size
    for seed, params in enumerate([SamplingParams(1.0, seed=0), SamplingParams(0.7, top_p=0.8, top_k=20, seed=1)]):
        plain = generate(target, None, decode_request(prompt, 24, sampling=params))
        spec = generate(target, RandomTreeDrafter(vocab, seed, 12), decode_request(prompt, 24, 12, sampling=params))
        assert np.array_equal(spec.tokens, plain.tokens)


def test_smollm2_engine_samples_speculatively_with_plain_sampling_tokens(smollm2_engine):
    """Engine.generate at temperature 0.7: with a drafter, speculative (fewer forwards than tokens on a
    repetitive prompt), with none, plain; the same seed gives the same tokens on both paths."""
    from oospec.drafters import make_drafter

    messages = [{"role": "user", "content": "Repeat exactly, five times: the quick brown fox jumps over the lazy dog."}]
    kwargs = dict(max_new_tokens=48, temperature=0.7, top_p=0.95, top_k=50, seed=11)
    plain = smollm2_engine.generate(messages, **kwargs)
    spec = smollm2_engine.generate(messages, drafter=make_drafter("pld"), **kwargs)
    assert plain.stats.sampling.startswith("sample(") and spec.stats.sampling.startswith("speculative sample(")
    assert np.array_equal(spec.tokens, plain.tokens) and spec.text == plain.text
    assert spec.stats.target_forwards < plain.stats.target_forwards


def test_cli_refuses_bad_sampling_options_before_loading_the_model():
    from argparse import Namespace

    from oospec.cli.generate import check_sampling_options
    from oospec.errors import OospecError

    check_sampling_options(Namespace(temperature=0.0, top_p=0.0, top_k=-1, seed=None))  # greedy: unused
    check_sampling_options(Namespace(temperature=0.7, top_p=0.9, top_k=40, seed=3))
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)):
        args = dict(temperature=0.7, top_p=1.0, top_k=0, seed=None) | bad
        with pytest.raises(OospecError):
            check_sampling_options(Namespace(**args))
