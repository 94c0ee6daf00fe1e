"""The ceiling of any proposer in vLLM: draft exactly what vLLM without speculation wrote (benchmarks only).

OOSPEC_VLLM_ORACLE names the `none` setting's output of oospec.bench.vllm_run; a request is matched by
its prompt token ids. Its rows are read from the runner exactly as OospecProposer reads them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from oospec.integrations.vllm.proposer import OospecProposer
from oospec.integrations.vllm.request_state import Row


class OracleBatch:
    def __init__(self, reference_path: str, k: int):
        items = json.loads(open(reference_path, encoding="utf-8").read())["items"].values()
        self.reference = {tuple(it["prompt_ids"]): it["tokens"] for it in items}
        self.k = k
        self.states = _NoStates()

    def start(self, row: Row) -> None:
        """Nothing to start early: the reference is read at each propose."""

    def propose(self, rows: Sequence[Row | None]) -> list[list[int]]:
        out = []
        for row in rows:
            ref = self.reference.get(tuple(row.tokens[: row.prompt_len].tolist())) if row is not None else None
            if ref is None:
                out.append([])
                continue
            written = row.tokens.size - row.prompt_len
            out.append([int(t) for t in ref[written: written + min(self.k, row.room)]])
        return out


class _NoStates:
    def keep_only(self, live) -> None:
        pass


class OracleProposer(OospecProposer):
    def load_model(self, model: Any = None, runner: Any = None) -> None:
        super().load_model(model, runner)
        self.batch = OracleBatch(os.environ["OOSPEC_VLLM_ORACLE"], self.k)
