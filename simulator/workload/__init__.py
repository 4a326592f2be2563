"""Workloads: per-rank traces of compute and communication, replayed to measure how much
communication compute hides (see :mod:`simulator.workload.trace` for the format)."""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from ..library.nccl_env import CommConfig, NcclEnv
from ..topology import load_topology
from .collection import fewer_collections
from .devices import DEVICES, Device, device_for
from .engine import WorkloadReplay, WorkloadRun
from .isolated import TimingStore
from .metrics import Breakdown, breakdown
from .presets import resolve_workload
from .trace import Workload, WorkloadError, load_workload, parse_workload


def run_workload(
    workload: Workload | str | Path | dict,
    topology: str | Path | nx.Graph,
    *,
    nodes: int | None = None,
    algorithm: str | None = None,
    comm_slowdown: float = 0.0,
    reduce_bandwidth: float | None = None,
    protocol: str | None = None,
    nccl: NcclEnv | str | None = None,
    bundles: bool = True,
    timings: TimingStore | None = None,
    communicators: dict[str, CommConfig] | None = None,
    sm_contention: bool = False,
) -> tuple[WorkloadRun, Breakdown]:
    """Replay a workload on a topology; return the raw run and its breakdown.

    ``algorithm`` None (the default) runs each collective as the topology's library
    (NCCL, or HCCL on the Ascend presets) would for its group, operation and size;
    "nccl" or "hccl" names one; a registered algorithm runs every collective as given
    and "auto" the fastest ccsim finds (see :class:`WorkloadReplay`).
    ``comm_slowdown`` is the fraction by which compute slows while communication that
    uses GPU cores overlaps it on the same rank. ``protocol`` (LL, LL128, Simple or
    auto) forces NCCL's protocol, or, with an algorithm run as given, turns on the
    calibrated protocol model for its collectives (None: ideal). ``nccl`` holds NCCL's
    environment settings (:mod:`simulator.library.nccl_env`) for the calls NCCL chooses.
    ``bundles`` False simulates calls that share links flow by flow (the per-flow
    reference) instead of as bundles (:mod:`simulator.workload.bundles`). ``timings``
    (a :class:`~simulator.workload.isolated.TimingStore` of ``topology``'s graph) shares
    calls' timings alone with other runs given the same store (the same results).
    ``communicators`` holds NCCL's configuration per Megatron-Core process group
    (:mod:`simulator.workload.communicators`). ``sm_contention`` slows each rank's
    compute by the multiprocessors its calls in flight hold, one CTA per channel
    (instead of ``comm_slowdown``'s fixed fraction; see :class:`WorkloadReplay`).
    """
    if isinstance(workload, dict):
        workload = load_workload(workload)
    elif not isinstance(workload, Workload):  # a preset name or a file, as ccsim run takes
        workload = resolve_workload(workload)
    graph = load_topology(topology, nodes)
    with fewer_collections():
        replay = WorkloadReplay(
            workload,
            graph,
            algorithm=algorithm,
            comm_slowdown=comm_slowdown,
            reduce_bandwidth=reduce_bandwidth,
            protocol=protocol,
            nccl=nccl,
            bundles=bundles,
            timings=timings,
            communicators=communicators,
            sm_contention=sm_contention,
        )
        run = replay.run()
        replay.close()
    return run, breakdown(run)


__all__ = [
    "DEVICES",
    "Breakdown",
    "Device",
    "TimingStore",
    "Workload",
    "WorkloadError",
    "WorkloadReplay",
    "WorkloadRun",
    "breakdown",
    "device_for",
    "load_workload",
    "parse_workload",
    "run_workload",
]
