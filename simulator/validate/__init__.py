"""How close ccsim is to measurements: nccl-tests runs read and simulated
(:mod:`~.nccl_tests`: sidecar folders; :mod:`~.log_cases`: raw nccl-tests output, read
by :mod:`~.nccl_output`), and constants fitted to them (:mod:`~.calibrate`)."""

from .log_cases import case_loaders, guess_preset, log_case
from .nccl_output import NcclTestsOutput, read_nccl_output
from .nccl_tests import (
    BUNDLED,
    Case,
    CaseResult,
    case_graph,
    load_case,
    run_case,
    run_cases,
    sidecars,
    validate_folder,
)

__all__ = [
    "BUNDLED",
    "Case",
    "CaseResult",
    "NcclTestsOutput",
    "case_graph",
    "case_loaders",
    "guess_preset",
    "load_case",
    "log_case",
    "read_nccl_output",
    "run_case",
    "run_cases",
    "sidecars",
    "validate_folder",
]
