"""The drafter contract: what a drafter may know about a request, what it proposes, how that becomes a tree.

A drafter has ONE extension point, `candidates(context)`: continuations of the context, each with a rough
acceptance model. The engine turns them into the token tree it verifies with one function, `build_tree`,
so drafters compose by concatenating their candidates (see oospec.drafters.toolspec.MergedDrafter) and a
drafter that proposes one chain (the oracle) merges as well as one that proposes many branches.

How the tree is built is the drafter's `cost` (an attribute, not a method):
- None: candidates rank by their order, earliest first; the trie keeps nodes in that order until the
  budget is full (a single drafter knows its own best guess);
- a CostModel: nodes rank by their acceptance weight (the best over the candidates sharing them), and the
  tree keeps as many as pay for the wider verification forward (see oospec.engine.budget).

Drafters carry no probabilities the verifier uses: it treats their tokens as guesses to be matched against
the target's greedy choices, so any drafter, however wrong, leaves the output unchanged.

Beside the tree a drafter may run slot rows in the same forwards (`slot_rows`, `slot_feed`, `slot_logits`;
oospec.engine.slot_rows): rows no committed token ever sees, whose logits only the drafter reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from oospec.engine.budget import CostModel
from oospec.engine.distribution import SamplingParams
from oospec.engine.slot_rows import SlotFeed
from oospec.engine.tree import ROOT, TokenTree


@dataclass
class Request:
    """One request, stated once by whoever received it (the library, CLI, server, benchmark, vLLM): the engine
    decodes this same object and its drafters read it. The engine fills `eos_ids`, `tokenizer` and `budget`, fits
    `max_new_tokens` to the context and renders `prompt_ids` from `messages` and `chat_tools` when they are not
    given, in place (Engine.prepare)."""

    prompt_ids: np.ndarray | None = None  # (p,) int64 token ids of the rendered prompt
    eos_ids: frozenset[int] = frozenset()  # tokens that end the turn
    tokenizer: Any = None  # the target's tokenizer (drafters that render text into target tokens)
    messages: list[dict] | None = None  # the chat messages the prompt was rendered from
    tools: list[Any] | None = None  # the tools offered to the model (oospec.tools.schema.Tool or OpenAI dicts)
    dialect: str | None = None  # how the target writes calls (oospec.tools.dialects), None: guess from the tools
    # The tools as the chat template got them (OpenAI dicts): the engine renders the prompt with them, a sidecar
    # renders the same prompt; None: not through the template (see tools_in_prompt), or not known.
    chat_tools: list[dict] | None = None
    # True: the messages themselves describe the tools (no template tools); None: guess from the dialect.
    tools_in_prompt: bool | None = None
    # (r,) int64 the greedy output, known in advance: only the oracle drafter of benchmarks reads it.
    reference_tokens: np.ndarray | None = None
    max_new_tokens: int = 256  # the most tokens of the reply (the engine lowers it to what the context holds)
    budget: int | None = None  # the most draft nodes verified per forward; None: the engine's
    # c(k)/c(1) of the target's verification forwards, which sizes cost-aware trees; None: decode.generate fills
    # in the measured curve of the target's device, dtype and thread count for that decode (oospec.engine.budget).
    cost: CostModel | None = None
    # 0: greedy; > 0: sampled from the target's distribution after temperature, top_k (0: all) and top_p, seeded
    # by `seed` (speculatively with a drafter: the same distribution in fewer forwards).
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    # A grammar the reply follows (oospec.engine.constraint.GrammarConstraint, Engine.constraint), with any
    # drafter and at any temperature; single use: it follows this one reply.
    constraint: Any = None

    @classmethod
    def chat(cls, messages: list[dict], tools: list[dict] | None = None, **fields) -> Request:
        """A request for chat `messages` offering `tools` (OpenAI dicts) through the chat template; drafters see
        the same tools unless `fields` give them their own (`tools=`, e.g. oospec.tools.schema.Tool)."""
        fields.setdefault("tools", tools)
        return cls(messages=messages, chat_tools=tools, **fields)

    @property
    def sampling(self) -> SamplingParams | None:
        """How tokens are drawn; None: greedy."""
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed) if self.temperature > 0 else None


@dataclass(frozen=True)
class Candidate:
    """One proposed continuation with a rough acceptance model: the first token is right with probability
    `confidence`, each further token with probability `persistence` given the ones before."""

    tokens: np.ndarray  # (m,) int64
    confidence: float = 0.5
    persistence: float = 0.8

    def weights(self) -> np.ndarray:
        """(m,) probability that the target accepts this candidate at least up to each position."""
        return self.confidence * self.persistence ** np.arange(self.tokens.size)


class Drafter:
    """Base drafter: proposes nothing (plain greedy decoding through the same loop).

    Subclasses override `candidates` and, where they keep state, the lifecycle methods `start`, `observe`
    and `finish`. `cost` says how the engine ranks their candidates' nodes (see the module docstring)."""

    name = "ar"
    cost: CostModel | None = None
    # True: the drafter takes `sidecar=` (a sidecar process's client) and its method starts one; the cores are
    # then split between the target and the sidecar (oospec.engine.threads.split_cores).
    uses_sidecar = False

    def start(self, request: Request) -> None:
        """Called once per request before the first proposal."""

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        """Continuations of `context` ((n,) int64: prompt, then every token produced so far, the last being
        the pending token), best first; [] proposes nothing."""
        return []

    def observe(self, produced: np.ndarray) -> None:
        """The tokens the last step produced (accepted draft tokens, then the bonus token)."""

    def finish(self) -> None:
        """Called once when the request ends (also on errors)."""

    # Slot rows (oospec.engine.slot_rows): rows beyond the tree, at most `slot_rows` per forward, that read the
    # prompt and grow token chains of their own (a slot's value, one token per forward), through the target's slot
    # LoRA where it has one; `slot_store`: the most of their nodes the target holds at once. The output is the
    # same whatever they hold. 0: none. (The untrained version, the target's own guesses behind "value ends, next
    # key" as tree nodes, saved no more than it cost: docs/results-history.md.)
    slot_rows = 0
    slot_store = 0

    def slot_feed(self, context: np.ndarray, rows: int, beside: int = 1) -> SlotFeed | None:
        """The slot rows of the next forward, at most `rows` of them, their parents among the target's slot forest
        as the last `slot_logits` left it (None: none this forward). `beside`: the rows the forward verifies
        anyway (the pending token and the tree), which the slot rows' cost is added to."""
        return None

    def slot_offer(self) -> tuple[int, float]:
        """(rows wanted, forwards each is expected to save) for the next forward's slot rows: the engine sizes the
        tree beside them (oospec.engine.budget.beside_slot_rows); (0, 0.0): none."""
        return 0, 0.0

    def slot_logits(self, feed: SlotFeed, logits: torch.Tensor) -> None:
        """The (len(feed), vocab) logits after each row of the feed just verified (its rows are in the forest now);
        called only for drafters with slot_rows."""

    def idle_threads(self) -> int:
        """CPU threads this drafter's helper process owns on the target's CPU but is not using right now (a
        sidecar whose answer is in): the target may use them until this says 0 again (oospec.engine.threads)."""
        return 0


def build_tree(candidates: Sequence[Candidate], budget: int, cost: CostModel | None = None,
               discount: float = 1.0) -> TokenTree:
    """Merge candidates into one trie of at most `budget` nodes (shared prefixes cost one node).

    cost None: earlier candidates have priority, a candidate is cut where the budget runs out. Otherwise the
    nodes most likely to be accepted are kept, as many as pay off under `cost`; `discount` < 1 scales a node
    at depth d by discount^(d+1) (sampling: see oospec.engine.budget.SampledAcceptance)."""
    tokens: list[int] = []
    parents: list[int] = []
    weights: list[float] = []
    index: dict[tuple[int, int], int] = {}
    for cand in candidates:
        if cost is None and len(tokens) >= budget:
            break
        parent = ROOT
        if cost is None:
            chain = [0.0] * cand.tokens.size
        elif discount < 1.0:
            chain = (cand.weights() * discount ** np.arange(1, cand.tokens.size + 1)).tolist()
        else:
            chain = cand.weights().tolist()
        for tok, w in zip(cand.tokens.tolist(), chain):
            node = index.get((parent, tok))
            if node is None:
                if cost is None and len(tokens) >= budget:
                    break
                node = index[(parent, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(parent)
                weights.append(w)
            elif w > weights[node]:
                weights[node] = w
            parent = node
    if not tokens:
        return TokenTree.empty()
    if cost is None:
        return TokenTree(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int32))
    return _best_nodes(np.asarray(tokens, dtype=np.int64), np.asarray(parents), np.asarray(weights), budget, cost)


def _best_nodes(tokens: np.ndarray, par: np.ndarray, w: np.ndarray, budget: int, cost: CostModel) -> TokenTree:
    """The subtree of the heaviest nodes whose expected tokens per unit of forward cost is largest."""
    # A child never outweighs its parent along one candidate, but a child seen in a stronger candidate can
    # outweigh a parent shared with weaker ones: cap each weight by its parent's so ranking stays a tree.
    for i in range(w.size):
        if par[i] != ROOT and w[i] > w[par[i]]:
            w[i] = w[par[i]]
    order = np.lexsort((np.arange(w.size), -w))  # heaviest first, parents before children on ties
    n_max = min(budget, w.size)
    gain = 1.0 + np.concatenate([[0.0], np.cumsum(w[order[:n_max]])])
    n = int(np.argmax(gain / cost.cost(np.arange(1, n_max + 2))))
    keep = np.sort(order[:n])
    remap = np.full(w.size, ROOT, dtype=np.int64)
    remap[keep] = np.arange(keep.size)
    kept_parents = par[keep]
    new_parents = np.where(kept_parents == ROOT, ROOT, remap[np.maximum(kept_parents, 0)])
    return TokenTree(tokens[keep], new_parents)
