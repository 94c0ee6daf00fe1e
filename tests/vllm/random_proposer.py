"""Proposers that test vLLM's verification, not oospec's drafting: any draft, however wrong, must leave the
greedy output unchanged.

RandomProposer drafts K random tokens on every row every step, including rows a token from the end of the
model's context and rows whose request ends after this step (drafts longer than the request can use).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RandomProposer:
    def __init__(self, vllm_config: Any):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        self.rng = np.random.default_rng(0)

    def load_model(self, model: Any = None) -> None:
        pass

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        out = []
        for i, sampled in enumerate(sampled_token_ids):
            # Half the time the draft repeats the row's own last tokens (often right for a while, then wrong).
            if sampled and self.rng.random() < 0.5:
                n = int(num_tokens_no_spec[i])
                draft = token_ids_cpu[i, max(0, n - self.k):n].tolist()
            else:
                draft = self.rng.integers(0, self.vocab, self.k).tolist()
            out.append([int(t) for t in draft][: self.k])
        return out
