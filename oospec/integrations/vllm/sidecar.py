"""The sidecar process beside vLLM's CPU worker, on cores the worker does not use.

vLLM's CPU worker pins its OpenMP threads (environment variables and the process's CPU mask). A child would
inherit both and fight the target for its cores, so the sidecar starts with those variables removed and is
moved to the spare cores (OOSPEC_VLLM_SIDECAR_CORES, else every core outside the worker's mask) before torch
starts in it. With no spare core it shares the worker's, which is logged once.
"""

from __future__ import annotations

import os

from oospec.integrations.vllm.batch import DraftingSettings
from oospec.integrations.vllm.request_state import log_once
from oospec.sidecar.process import SidecarClient, SidecarSettings, resolve_adapter

# Variables through which the worker's thread placement would reach the sidecar.
AFFINITY_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_NUM_THREADS",
                 "MKL_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")


def spare_cores(settings: DraftingSettings) -> set[int]:
    if settings.sidecar_cores:
        return set(settings.sidecar_cores)
    return set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)


class PinnedSidecarClient(SidecarClient):
    """A SidecarClient whose worker (and each restart of it) runs on `cores`, free of the worker's pinning."""

    def __init__(self, *args, cores: set[int], **kwargs):
        self.cores = cores
        super().__init__(*args, **kwargs)

    def _start(self) -> None:
        saved = {k: os.environ.pop(k) for k in AFFINITY_VARS if k in os.environ}
        try:
            super()._start()
        finally:
            os.environ.update(saved)
        if self.cores and self._proc is not None:
            try:
                os.sched_setaffinity(self._proc.pid, self.cores)
            except OSError as exc:  # the child already gone: the client notices and restarts it
                log_once("sidecar-affinity", "oospec sidecar: could not pin to cores %s: %r", sorted(self.cores), exc)


def start_sidecar(settings: DraftingSettings, sidecar: SidecarSettings = SidecarSettings()) -> SidecarClient:
    cores = spare_cores(settings)
    if not cores:
        log_once("sidecar-cores", "oospec sidecar: no core outside vLLM's worker; it shares the worker's cores")
    return PinnedSidecarClient(sidecar.model, threads=max(1, len(cores)) if cores else sidecar.threads,
                               device=sidecar.device, dtype=sidecar.dtype,
                               adapter=resolve_adapter(sidecar.model, sidecar.adapter), cores=cores,
                               wait_ready=False)
