"""How long one collective takes: replay a schedule on a topology, choose a
configuration, compare algorithms.

Modules, bottom up: :mod:`~.replay` (a schedule's ops as SimPy processes on the flow
network), :mod:`~.symmetry` (symmetric ranks simulated once),
:mod:`~.contention_free` and :mod:`~.mixed` (flows alone on their links timed without
events; only those that meet simulated), :mod:`~.run`
(:func:`run_schedule`, :func:`build_and_run` and :class:`CollectiveResult`),
:mod:`~.tuner` (:class:`AutoTuner`, the best-found search), :mod:`~.simulate`
(:func:`simulate_collective`) and :mod:`~.compare` (algorithms side by side, as rows).
"""

from .compare import compare
from .policy import POLICIES, HcclPolicy, NcclPolicy, library_of, library_policy
from .run import (
    COLLECTIVE_OPS,
    CollectiveResult,
    auto_fraction,
    build_and_run,
    bus_factor,
    rank_layout,
    run_schedule,
)
from .simulate import simulate_collective
from .tuner import AutoTuner, Choice, size_bucket, topology_key

__all__ = [
    "COLLECTIVE_OPS",
    "POLICIES",
    "AutoTuner",
    "Choice",
    "CollectiveResult",
    "HcclPolicy",
    "NcclPolicy",
    "auto_fraction",
    "build_and_run",
    "bus_factor",
    "compare",
    "library_of",
    "library_policy",
    "rank_layout",
    "run_schedule",
    "simulate_collective",
    "size_bucket",
    "topology_key",
]
