"""Speculative sampling over a token tree: acceptance at temperature > 0 that preserves the target's distribution.

Glossary as in oospec.engine.acceptance. Drafts carry no probabilities: each drafted token is a point mass.
At a node, with the target's processed distribution p after it (oospec.engine.distribution), the verifier
visits the node's children in tree order (fixed before any random draw), skipping a token already tried
there, and accepts child token x with probability r(x), where the *residual* r starts as p; on rejection
r(x) = 0 and r is renormalised. An accepted child becomes the next node. If no child is accepted, the
*recovered token* is drawn from r and the step ends; at an accepted leaf the *bonus token* is drawn from the
leaf's own p (a node with no children rejects nothing, so r = p: one rule covers both).

This is SpecInfer's multi-step speculative sampling (arXiv 2305.09781, Alg. 2) with point-mass drafts: the
token emitted at each node has exactly distribution p, whatever the drafts, so a step's output is distributed
as plain sampling's would be, token by token. Temperature 0 never comes here: greedy_accept is that case.
"""

from __future__ import annotations

import numpy as np
import torch

from oospec.engine.distribution import SamplingParams, draw, target_distribution
from oospec.engine.tree import ROOT, TokenTree


def speculative_accept(
    tree: TokenTree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[np.ndarray, int]:
    """Return (accepted node indices from the top of the tree down, the token emitted after them).

    logits: (len(tree)+1, vocab) the verification forward's logits; row 0 after the pending token, row k+1
    after node k. Only the rows along the accepted path are turned into distributions.
    """
    children = _children(tree)
    tokens = tree.tokens.tolist()
    path: list[int] = []
    node = ROOT
    while True:
        residual = target_distribution(logits[node + 1].cpu(), params)
        accepted = None
        mass = 1.0  # residual's total before renormalising: accept x with probability residual[x] / mass
        tried: set[int] = set()
        for child in children[node]:
            token = tokens[child]
            if token in tried:  # a duplicate sibling: its token already had its chance at this node
                continue
            tried.add(token)
            p_token = float(residual[token])
            if p_token > 0 and float(torch.rand((), generator=generator, dtype=torch.float64)) * mass < p_token:
                accepted = child
                break
            residual[token] = 0.0
            mass -= p_token
        if accepted is None:
            if not bool(residual.any()):  # rounding rejected a token of probability ~1: p itself, to within 1e-15
                residual = target_distribution(logits[node + 1].cpu(), params)
            return np.asarray(path, dtype=np.int64), draw(residual, generator)
        path.append(accepted)
        node = accepted


def _children(tree: TokenTree) -> dict[int, list[int]]:
    """Each node's children in tree order (ROOT's too); nodes without children map to []."""
    children: dict[int, list[int]] = {ROOT: []}
    for i, parent in enumerate(tree.parents.tolist()):
        children[i] = []
        children[parent].append(i)
    return children
