"""The out-of-order sidecar: a small model that predicts the whole call in parallel with the target."""

from oospec.sidecar.predictor import Job, SidecarPredictor, TaskFormat
from oospec.sidecar.process import DEFAULT_SIDECAR, SidecarClient
from oospec.sidecar.protocol import Guess, Payload, PayloadError, parse_payload

__all__ = ["DEFAULT_SIDECAR", "Guess", "Job", "Payload", "PayloadError", "SidecarClient", "SidecarPredictor",
           "TaskFormat", "parse_payload"]
