"""Simulating one collective call: ``simulate_collective``.

Bandwidth figures follow nccl-tests (PERFORMANCE.md): algbw = S / t with GB = 1e9
bytes, busbw = algbw x 2(p-1)/p for all-reduce, x (p-1)/p for all-gather and
reduce-scatter (S is then the whole gathered buffer), x 1 for broadcast and reduce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import simpy

from .algorithms import build_schedule
from .algorithms.base import RankLayout
from .algorithms.chain import ROOTED_OPS
from .algorithms.multipath import split
from .errors import CcsimError, unknown_choice
from .network import FlowNetwork, NetworkStats
from .protocol import PROTOCOLS, calibration_of
from .replay import ScheduleReplay, reduce_bandwidths
from .schedule import OPS, Schedule
from .topology import load_topology, servers_of_ranks
from .topology.graph import gpu_nodes

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
    protocol: str | None = None,
) -> CollectiveResult:
    """Replay ``schedule`` on ``graph`` in a fresh SimPy environment.

    ``protocol`` None runs the ideal model (line rate, propagation latency only);
    ``"LL"``, ``"LL128"`` or ``"Simple"`` adds the calibrated protocol model of
    :mod:`simulator.protocol` with the topology's constants; ``"auto"`` runs all three
    and returns the fastest, as NCCL's tuner picks the protocol with the lowest time.
    """
    p = len(gpu_nodes(graph))
    if schedule.ranks > p:
        raise CcsimError(f"the schedule needs {schedule.ranks} ranks; the topology has {p} GPUs")
    allowed = schedule.params.get("protocols") or PROTOCOLS
    if protocol is not None and str(protocol).lower() == "auto":
        # As NCCL's tuner: the fastest of the protocols enabled on this machine (all the
        # algorithm's own, should the machine enable none of them).
        enabled = [name for name in allowed if name in calibration_of(graph).enabled()]
        results = [
            run_schedule(graph, schedule, reduce_bandwidth=reduce_bandwidth, protocol=name)
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
    proto = None if protocol is None else calibration.protocol(protocol)
    network = FlowNetwork(
        env, graph, link_efficiency=None if proto is None else calibration.efficiency
    )
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
        env.run(until=finished)
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


def simulate_collective(
    topology: str | Path | nx.Graph,
    op: str,
    size_bytes: float,
    algorithm: str = "ring",
    *,
    nodes: int | None = None,
    chunks: int | str | None = None,
    channels: int | str = 1,
    reduce_bandwidth: float | None = None,
    root: int = 0,
    protocol: str | None = None,
    fraction: float | str | None = None,
    fabric: str | None = None,
    seed: int | None = None,
) -> CollectiveResult:
    """Simulate one collective on a topology.

    Parameters
    ----------
    topology : preset name, preset YAML path or networkx graph
        Where it runs; graphs follow :mod:`simulator.topology.graph`'s conventions.
    op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"}
    size_bytes : float
        Message size as nccl-tests counts it (for all-gather and reduce-scatter the whole
        gathered buffer; for all-to-all each rank's whole send buffer).
    algorithm : str
        A registered algorithm (see :func:`simulator.algorithms.algorithm_names`), or
        "auto" for the fastest at this size, found by simulation.
    nodes : int, optional
        Number of servers, for presets.
    fabric, seed : optional
        Fabric type and ECMP seed for presets (see :func:`simulator.topology.load_topology`).
    chunks, channels : int or "auto"
        Pipelining chunks per step (or slices, for pipelined) and parallel rings.
        "auto" searches the fastest count; chunks default to 1, or "auto" when
        ``algorithm="auto"``.
    reduce_bandwidth : float, optional
        Bytes/s of local reductions on every GPU, overriding the topology's
        ``reduce_bandwidth`` attributes (absent means infinitely fast).
    root : int
        Root rank of a broadcast or reduce (ignored by the other operations).
    protocol : {None, "LL", "LL128", "Simple", "auto"}
        None for the ideal model; otherwise the calibrated protocol model
        (:mod:`simulator.protocol`).
    fraction : float or "auto", optional
        For ``multipath``: the share of the data on the intra-server links (the rest
        goes through the NICs); "auto" (the default) sizes it by simulating each path.

    Examples
    --------
    >>> from simulator.topology import ring_graph
    >>> r = simulate_collective(ring_graph(4, 100e9, 1e-6), "all_gather", 4e6)
    >>> round(r.time_us, 6)  # (p-1)(a + n/(pB)) = 3 x (1 us + 10 us)
    33.0
    """
    if op not in COLLECTIVE_OPS:
        raise unknown_choice("operation", op, COLLECTIVE_OPS)
    graph = load_topology(topology, nodes, fabric=fabric, seed=seed)
    if chunks is None:  # 1, except that "auto" algorithms search the chunk count too
        chunks = "auto" if algorithm == "auto" else 1
    if "auto" in (algorithm, chunks, channels):
        # Imported here: the tuner builds on this module.
        from .compare import AutoTuner

        tuner = AutoTuner(channels=channels, reduce_bandwidth=reduce_bandwidth, protocol=protocol)
        return tuner.simulate(graph, op, size_bytes, algorithm=algorithm, chunks=chunks, root=root)
    layout = rank_layout(graph)
    options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
    if algorithm == "multipath":
        options["fraction"] = (
            auto_fraction(
                graph, op, size_bytes, chunks=chunks, channels=channels, protocol=protocol
            )
            if fraction in (None, "auto")
            else float(fraction)
        )
    elif fraction is not None:
        raise CcsimError(f"fraction applies to the multipath algorithm only, not {algorithm!r}")
    schedule = build_schedule(
        algorithm, op, layout, size_bytes, chunks=chunks, channels=channels, **options
    )
    return run_schedule(graph, schedule, reduce_bandwidth=reduce_bandwidth, protocol=protocol)


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
