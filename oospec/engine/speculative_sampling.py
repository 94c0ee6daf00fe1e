"""Speculative sampling over a token tree: acceptance at temperature > 0 that preserves the target's distribution.

Glossary as in oospec.engine.acceptance. Drafts carry no probabilities: each drafted token is a point mass.

The rule (SpecInfer's multi-step speculative sampling, arXiv 2305.09781, Alg. 2, with point-mass drafts; vLLM
uses it for chains without draft probabilities): at a node, with the target's processed distribution p after
it (oospec.engine.distribution), visit the node's children in tree order, skipping a token already tried
there; accept child token x with probability r(x), where the *residual* r starts as p; on rejection set
r(x) = 0 and renormalise r. An accepted child becomes the next node. If no child is accepted, the *recovered
token* is drawn from r and the step ends; at an accepted leaf the *bonus token* is drawn from its p.

How the draws are made. All of the rule's draws at a node are realised by ONE token y drawn from p with the
uniform number of the output position the node's next token fills: child x is accepted iff y == x, and if
no child is, the recovered token is y. This is the rule exactly, not an approximation: P(y = x1) = p(x1);
given y != x1, y is distributed as the renormalised residual, so P(y = x2 | rejected x1) = r(x2); and given
every child rejected, y is distributed as the final r. What it adds: the token at each output position is
the inverse-CDF draw of that position's uniform, whatever the drafts were, so with the same seed speculative
sampling returns exactly the tokens plain sampling (oospec.engine.decode with no drafter) returns, with any
drafter, as greedy speculation returns plain greedy's. Temperature 0 never comes here: greedy_accept is that case.
"""

from __future__ import annotations

import numpy as np
import torch

from oospec.engine.budget import SampledAcceptance
from oospec.engine.distribution import SamplingParams, inverse_cdf, target_distribution
from oospec.engine.tree import ROOT, TokenTree


def speculative_accept(
    tree: TokenTree, logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor,
    meter: SampledAcceptance | None = None,
) -> tuple[np.ndarray, int]:
    """Return (accepted node indices from the top of the tree down, the token emitted after them).

    logits: (len(tree)+1, vocab) the verification forward's logits; row 0 after the pending token, row k+1
    after node k. Only the rows along the accepted path are turned into distributions.
    uniforms: (>= tree.max_depth+1,) float64 in [0, 1), the draws of the output positions this step can fill:
    entry d for the token after a node at depth d (entry 0: the token after the pending one).
    meter: told the largest probability of each distribution drawn from (the next trees' discount).
    """
    children = _children(tree)
    tokens = tree.tokens.tolist()
    path: list[int] = []
    node = ROOT
    while True:
        probs = target_distribution(logits[node + 1].cpu(), params)
        if meter is not None:
            meter.observe(float(probs.max()))
        y = inverse_cdf(probs, float(uniforms[len(path)]))
        # The first child drafting y is accepted; later siblings with the same token are the skipped duplicates.
        accepted = next((child for child in children[node] if tokens[child] == y), None)
        if accepted is None:
            return np.asarray(path, dtype=np.int64), y
        path.append(accepted)
        node = accepted


def _children(tree: TokenTree) -> dict[int, list[int]]:
    """Each node's children in tree order (ROOT's too); nodes without children map to []."""
    children: dict[int, list[int]] = {ROOT: []}
    for i, parent in enumerate(tree.parents.tolist()):
        children[i] = []
        children[parent].append(i)
    return children
