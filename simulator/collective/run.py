"""Running one collective's schedule on a topology: :func:`run_schedule` and its result.

Bandwidth figures follow nccl-tests (PERFORMANCE.md): algbw = S / t with GB = 1e9
bytes, busbw = algbw x 2(p-1)/p for all-reduce, x (p-1)/p for all-gather and
reduce-scatter (S is then the whole gathered buffer), x 1 for broadcast and reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import simpy

from ..algorithms import build_schedule
from ..algorithms.base import RankLayout
from ..algorithms.multipath import split
from ..algorithms.schedule import OPS, Schedule
from ..errors import CcsimError, unknown_choice
from ..library.protocol import PROTOCOLS, Protocol, calibration_of
from ..network.faults import schedule_link_faults
from ..network.flows import FlowNetwork, NetworkStats, run_env
from ..topology import servers_of_ranks
from ..topology.graph import gpu_nodes
from .replay import ScheduleReplay, reduce_bandwidths

COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth.

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 8)
    (1.75, 0.875)
    """
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    if op in ("broadcast", "reduce"):
        return 1.0
    raise unknown_choice("operation", op, OPS)


@dataclass
class CollectiveResult:
    """Outcome of one simulated collective.

    ``flows`` and ``links`` are plain data (dicts of equal-length lists or arrays), ready
    for ``pandas.DataFrame(result.flows)``. Times are in seconds, sizes in bytes.
    """

    op: str
    algorithm: str
    ranks: int
    size_bytes: float
    time_s: float
    flows: dict[str, Any] = field(repr=False)
    links: dict[str, list] = field(repr=False)
    stats: NetworkStats = field(repr=False, default_factory=NetworkStats)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def algbw_GBps(self) -> float:
        """Algorithm bandwidth, size / time, in GB/s (1e9 bytes)."""
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else float("inf")

    @property
    def busbw_GBps(self) -> float:
        """Bus bandwidth in GB/s, comparable across rank counts (nccl-tests)."""
        return self.algbw_GBps * bus_factor(self.op, self.ranks)

    @property
    def time_us(self) -> float:
        """Time in microseconds."""
        return self.time_s * 1e6

    def row(self) -> dict[str, Any]:
        """The summary row used by reports (keys as in ``--format json``)."""
        return {
            "op": self.op,
            "algorithm": self.algorithm,
            "ranks": self.ranks,
            "size_bytes": round(self.size_bytes),
            "time_us": self.time_us,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
        }


def rank_layout(graph: nx.Graph) -> RankLayout:
    """The :class:`RankLayout` an algorithm sees for ``graph``."""
    servers = servers_of_ranks(graph)
    return RankLayout(len(gpu_nodes(graph)), None if servers is None else tuple(servers))


def run_schedule(
    graph: nx.Graph,
    schedule: Schedule,
    *,
    reduce_bandwidth: float | None = None,
    protocol: str | Protocol | None = None,
    progress: Callable[[float], None] | None = None,
) -> CollectiveResult:
    """Replay ``schedule`` on ``graph`` in a fresh SimPy environment.

    ``protocol`` None runs the ideal model (line rate, propagation latency only);
    ``"LL"``, ``"LL128"`` or ``"Simple"`` adds the calibrated protocol model of
    :mod:`simulator.library.protocol` with the topology's constants; ``"auto"`` runs all three
    and returns the fastest, as NCCL's tuner picks the protocol with the lowest time; a
    :class:`~simulator.library.protocol.Protocol` runs with those constants instead of
    the topology's. ``progress``, if given, is called with the simulated time (seconds)
    as it advances (the command line passes a progress bar's callback).
    """
    p = len(gpu_nodes(graph))
    if schedule.ranks > p:
        raise CcsimError(f"the schedule needs {schedule.ranks} ranks; the topology has {p} GPUs")
    allowed = schedule.params.get("protocols") or PROTOCOLS
    given = protocol if isinstance(protocol, Protocol) else None
    if given is not None:
        protocol = given.name
    if protocol is not None and str(protocol).lower() == "auto":
        # As NCCL's tuner: the fastest of the protocols enabled on this machine (all the
        # algorithm's own, should the machine enable none of them).
        enabled = [name for name in allowed if name in calibration_of(graph).enabled()]
        results = [
            run_schedule(
                graph,
                schedule,
                reduce_bandwidth=reduce_bandwidth,
                protocol=name,
                progress=progress,
            )
            for name in enabled or allowed
        ]
        return min(results, key=lambda result: result.time_s)
    if protocol is not None and str(protocol).lower() not in {name.lower() for name in allowed}:
        raise CcsimError(
            f"{schedule.algorithm} runs with the {', '.join(allowed)} protocol only, not "
            f"{protocol!r}; use --proto {allowed[0]} or auto"
        )
    env = simpy.Environment()
    calibration = calibration_of(graph)
    proto = given or (None if protocol is None else calibration.protocol(protocol))
    network = FlowNetwork(
        env, graph, link_efficiency=None if proto is None else calibration.efficiency
    )
    schedule_link_faults(network)  # issue 16: a faulted graph's timed link degradations
    replay = ScheduleReplay(
        network,
        schedule,
        reduce_bandwidth=reduce_bandwidths(graph, reduce_bandwidth),
        protocol=proto,
    )
    finished = replay.finished
    if proto is None:
        replay.start()
    else:
        # Launch overhead and the protocol's base latency come once per call, first.
        overhead = env.timeout(calibration.launch_s + proto.base_s)
        overhead.callbacks.append(lambda _event: replay.start())
    try:
        run_env(env, finished, progress)
    except RuntimeError as error:  # SimPy: no events left but `finished` never fired
        if finished.triggered:
            raise
        raise replay.deadlock_error() from error
    network.close_link_records()
    elapsed = env.now  # from the call: includes the launch overhead, if any
    flows = {
        "op_index": np.arange(schedule.n_ops),
        "src": schedule.src,
        "dst": schedule.dst,
        "bytes": schedule.nbytes,
        "channel": schedule.channel,
        "step": schedule.step,
        "chunk": schedule.chunk,
        "reduce": schedule.reduce,
        "start_s": replay.start_s,
        "sent_s": replay.sent_s,
        "end_s": replay.end_s,
    }
    return CollectiveResult(
        op=schedule.op,
        algorithm=schedule.algorithm,
        ranks=schedule.ranks,
        size_bytes=schedule.size_bytes,
        time_s=float(elapsed),
        flows=flows,
        links=network.link_records(),
        stats=network.stats,
        params={**schedule.params, "protocol": proto.name if proto else None},
    )


def auto_fraction(
    graph: nx.Graph,
    op: str,
    size_bytes: float,
    *,
    chunks: int = 1,
    channels: int = 1,
    protocol: str | None = None,
) -> float:
    """Multipath split from simulating each path alone with all the data (see
    :func:`simulator.algorithms.multipath.split`)."""
    layout = rank_layout(graph)
    times = []
    for share in (1.0, 0.0):  # everything on the intra-server links, then on the NICs
        schedule = build_schedule(
            "multipath", op, layout, size_bytes, chunks=chunks, channels=channels, fraction=share
        )
        times.append(run_schedule(graph, schedule, protocol=protocol).time_s)
    return split(*times)
