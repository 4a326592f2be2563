"""How close ccsim is to measurements: nccl-tests runs read and simulated
(:mod:`~.nccl_tests`), and constants fitted to them (:mod:`~.calibrate`)."""

from .nccl_tests import (
    BUNDLED,
    Case,
    CaseResult,
    case_graph,
    load_case,
    run_case,
    sidecars,
    validate_folder,
)

__all__ = [
    "BUNDLED",
    "Case",
    "CaseResult",
    "case_graph",
    "load_case",
    "run_case",
    "sidecars",
    "validate_folder",
]
