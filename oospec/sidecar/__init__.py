"""The out-of-order sidecar: a small model that predicts the whole call in parallel with the target.

This package imports without torch: the client (process.py) and the protocol are what the engine's process
needs; the predictor (predictor.py) runs in the sidecar's own process (worker_main.py).
"""

from oospec.sidecar.process import DEFAULT_SIDECAR, SidecarClient, make_predictor
from oospec.sidecar.protocol import Guess, Job, Payload, PayloadError, parse_payload

__all__ = ["DEFAULT_SIDECAR", "Guess", "Job", "Payload", "PayloadError", "SidecarClient", "make_predictor",
           "parse_payload"]
