"""Running one collective's schedule on a topology: :func:`run_schedule` and its result.

Bandwidth figures follow nccl-tests (PERFORMANCE.md): algbw = S / t with GB = 1e9
bytes, busbw = algbw x 2(p-1)/p for all-reduce, x (p-1)/p for all-gather and
reduce-scatter (S is then the whole gathered buffer), x 1 for broadcast and reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import simpy

from ..algorithms import build_quotient, build_schedule, get_algorithm
from ..algorithms.base import RankLayout
from ..algorithms.multipath import split
from ..algorithms.schedule import OPS, PATH_DOWN, PATH_UP, Merged, Schedule
from ..errors import CcsimError, unknown_choice
from ..library.protocol import PROTOCOLS, Protocol, calibration_of
from ..network.faults import fault_plan, schedule_link_faults
from ..network.flows import FlowNetwork, NetworkStats, network_tables, run_env
from ..network.routing import LinkTable, Router
from ..topology import servers_of_ranks
from ..topology.graph import gpu_nodes
from .contention_free import time_contention_free
from .merged import expand_merged, members_hold
from .mixed import time_mixed
from .replay import ScheduleReplay, reduce_bandwidths, route_ops
from .ring_pass import time_ring
from .symmetry import (
    LinkSymmetry,
    Quotient,
    candidate_periods,
    link_symmetry,
    neighbourhoods,
    periodic,
    reduce_bandwidth_symmetric,
    schedule_quotient,
)

#: Values of ``run_schedule(symmetry=...)``.
SYMMETRY_MODES = ("auto", "off")

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
    schedule: Schedule | Quotient,
    *,
    reduce_bandwidth: float | None = None,
    protocol: str | Protocol | None = None,
    progress: Callable[[float], None] | None = None,
    symmetry: str = "auto",
    events: bool = False,
    refused: Collection[int] = (),
    tables: tuple[LinkTable, Router] | None = None,
) -> CollectiveResult:
    """Replay ``schedule`` on ``graph`` in a fresh SimPy environment.

    ``protocol`` None runs the ideal model (line rate, propagation latency only);
    ``"LL"``, ``"LL128"`` or ``"Simple"`` adds the calibrated protocol model of
    :mod:`simulator.library.protocol` with the topology's constants; ``"auto"`` runs all three
    and returns the fastest, as NCCL's tuner picks the protocol with the lowest time; a
    :class:`~simulator.library.protocol.Protocol` runs with those constants instead of
    the topology's. ``progress``, if given, is called with the simulated time (seconds)
    as it advances (the command line passes a progress bar's callback).

    ``symmetry="auto"`` simulates one rank per class of symmetric ranks when the
    schedule and the network are found symmetric (:mod:`simulator.collective.symmetry`),
    with the same times and records as simulating every flow; ``"off"`` always
    simulates every flow. ``schedule`` may also be a :class:`Quotient` an algorithm built
    directly (:func:`simulator.algorithms.build_quotient`): it runs when the network is
    symmetric for it, and :class:`AsymmetricNetwork` is raised otherwise. Its flow
    records are expanded to every rank up to :data:`EXPAND_FLOWS` flows; beyond that
    they list the representatives only (``params["flows"] == "representatives"``).

    Without symmetry, in the ideal model (no protocol), a schedule whose flows never
    share a link is timed by a longest-path pass over its DAG instead of event by event
    (:mod:`simulator.collective.contention_free`: checked, with the same times and
    records; ``params["timing"] == "contention-free"``); ``events=True`` always
    simulates every flow event by event (the reference). ``refused`` lists rank shifts
    already found asymmetric (a quotient the network refused), not tried again.
    ``tables``: ``graph``'s :func:`~simulator.network.flows.network_tables`, when
    several runs on one graph share what is read from it (its shortest paths).
    """
    if symmetry not in SYMMETRY_MODES:
        raise unknown_choice("symmetry mode", symmetry, SYMMETRY_MODES)
    direct = schedule if isinstance(schedule, Quotient) else None
    if direct is not None:
        schedule = direct.schedule
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
                direct or schedule,
                reduce_bandwidth=reduce_bandwidth,
                protocol=name,
                progress=progress,
                symmetry=symmetry,
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
        env,
        graph,
        link_efficiency=None if proto is None else calibration.efficiency,
        tables=tables,
    )
    schedule_link_faults(network)  # issue 16: a faulted graph's timed link degradations
    reduce_bw = reduce_bandwidths(graph, reduce_bandwidth)
    # Links that change capacity during the run break any symmetry found at its start.
    plan = fault_plan(graph)
    timed = plan is not None and bool(plan.timed_links)
    if timed:
        symmetry = "off"
    if direct is not None:
        classes = None
        if (
            symmetry == "auto"
            and reduce_bandwidth_symmetric(reduce_bw, direct.period)
            and len(reduce_bw) == p
        ):
            classes = link_symmetry(network, direct)
        if classes is None:
            raise AsymmetricNetwork(
                f"{schedule.algorithm}: the network is not symmetric under a shift of "
                f"{direct.period} ranks; simulate the full schedule"
            )
        found = direct, classes
    else:
        found = find_symmetry(network, schedule, reduce_bw, refused) if symmetry == "auto" else None
    if found is None and proto is None and not (events or timed) and len(reduce_bw) == p:
        timing = "contention-free"
        routes = route_ops(network.router, schedule, np.arange(schedule.n_ops))
        timeline = time_contention_free(network, schedule, reduce_bw, routes)
        if timeline is None:
            timing = "mixed"
            timeline = time_mixed(network, schedule, reduce_bw, routes=routes)
        if timeline is not None:
            if progress is not None:
                progress(timeline.time_s)
            return _result(
                schedule,
                timeline.time_s,
                (timeline.start_s, timeline.sent_s, timeline.end_s),
                network,
                {**schedule.params, "protocol": None, "timing": timing},
            )
        # Not settled (or a deadlock, which the full replay reports): start afresh.
        env = simpy.Environment()
        network = FlowNetwork(env, graph, tables=tables)
        schedule_link_faults(network)
    if found is None:
        quotient = None
        replay = ScheduleReplay(network, schedule, reduce_bandwidth=reduce_bw, protocol=proto)
    else:
        quotient, classes = found
        network.set_link_classes(classes.link_class, classes.class_size)
        replay = ScheduleReplay(
            network,
            quotient.schedule,
            reduce_bandwidth=reduce_bw,
            protocol=proto,
            weight=quotient.weights(np.arange(quotient.schedule.n_ops)),
            period=quotient.period,
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
    times = replay.start_s, replay.sent_s, replay.end_s
    params = {**schedule.params, "protocol": proto.name if proto else None}
    if quotient is not None and quotient.rep_of is not None:
        # Every op happened when its representative did.
        times = tuple(values[quotient.rep_of] for values in times)
    if direct is not None and direct.orbit * schedule.n_ops > EXPAND_FLOWS:
        params["flows"] = "representatives"
        params["symmetry_period"] = direct.period
    return _result(schedule, float(elapsed), times, network, params, direct)


def _result(
    schedule: Schedule,
    elapsed: float,
    times: tuple[np.ndarray, np.ndarray, np.ndarray],
    network: FlowNetwork,
    params: dict[str, Any],
    direct: Quotient | None = None,
) -> CollectiveResult:
    """The result of a run: per-op records (every rank's, from a directly built
    quotient's up to :data:`EXPAND_FLOWS`), the network's link records and stats."""
    flows = {
        "op_index": np.arange(schedule.n_ops),
        "src": schedule.src,
        "dst": schedule.dst,
        "bytes": schedule.nbytes,
        "channel": schedule.channel,
        "step": schedule.step,
        "chunk": schedule.chunk,
        "reduce": schedule.reduce,
        "start_s": times[0],
        "sent_s": times[1],
        "end_s": times[2],
    }
    if schedule.path.any():  # routes other than the shortest (PXN, NVLS, the NICs)
        flows["path"] = schedule.path
    if direct is not None and direct.orbit * schedule.n_ops <= EXPAND_FLOWS:
        flows = expand_flows(direct, flows)
    return CollectiveResult(
        op=schedule.op,
        algorithm=schedule.algorithm,
        ranks=schedule.ranks,
        size_bytes=schedule.size_bytes,
        time_s=elapsed,
        flows=flows,
        links=network.link_records(),
        stats=network.stats,
        params=params,
    )


#: Flow records of a directly built quotient are expanded to every rank up to this many.
EXPAND_FLOWS = 4_000_000
#: A schedule whose quotient the network refused is built whole up to this many ops.
FULL_AFTER_REFUSAL = 50_000_000
#: A schedule whose quotient the network refused is built merged
#: (:meth:`~simulator.algorithms.base.Algorithm.merged`) up to this many ops (whole: a
#: merged hierarchical all-reduce holds about a tenth of them, 8 GPUs per server).
MERGED_AFTER_REFUSAL = 10 * FULL_AFTER_REFUSAL
#: The mixed timing of a merged schedule goes on up to this share of its ops simulated
#: (the whole schedule's share is lower: merging shrinks the in-server ops, which are
#: timed). Measured on hier-h100x128-fat-tree (58% of the merged ops simulated): 19 s of
#: CPU mixed, 74 s replaying every merged op event by event.
MERGED_MAX_SIMULATED = 0.75
#: Schedules of fewer ops are built whole (symmetry is then found on them, with records
#: in the schedule's own op order); larger ones are built as quotients where possible.
DIRECT_QUOTIENT_OPS = 1_000_000


def ring_ops(op: str, ranks: int, chunks: int = 1, channels: int = 1) -> int:
    """Transfers of a ring ``op`` (all-reduce: reduce-scatter then all-gather) on
    ``ranks`` ranks: p - 1 steps a phase, a transfer per rank, chunk and channel."""
    phases = 2 if op == "all_reduce" else 1
    return phases * (ranks - 1) * chunks * channels * ranks


def build_and_run(
    graph: nx.Graph,
    algorithm: str,
    op: str,
    size_bytes: float,
    *,
    reduce_bandwidth: float | None = None,
    protocol: str | Protocol | None = None,
    progress: Callable[[float], None] | None = None,
    **options: Any,
) -> CollectiveResult:
    """Build ``algorithm``'s schedule for ``op`` on ``graph`` and run it.

    A large schedule that repeats itself every few ranks on a network symmetric for it
    is never built whole: its algorithm builds the representatives directly
    (:func:`simulator.algorithms.build_quotient`) and they run as :func:`run_schedule`
    runs any quotient, with the same result. Otherwise the full schedule is built.
    """
    layout = rank_layout(graph)
    p = layout.ranks
    servers = servers_of_ranks(graph)
    per_server = None if servers is None else int(np.bincount(np.asarray(servers)).max())
    refused = 0  # ops of the full schedule, when its quotient was refused
    refused_periods: list[int] = []
    # After a refusal, each further run on the graph routes the same pairs: one set of
    # tables for all of them, so that their shortest paths are searched once (not made
    # before: a symmetric run needs one network, and at 131,072 GPUs a second copy of
    # the link table costs 100 MB).
    tables = None
    signatures = None
    for period in candidate_periods(p, per_server):
        if refused and signatures is None:
            signatures = neighbourhoods(graph, gpu_nodes(graph))
        if signatures is not None and not periodic(signatures, period):
            # Refused at once: ranks this far apart see different links (the check
            # find_symmetry makes first), so the network cannot be symmetric for the
            # quotient; building it (up to a quarter of the schedule) only costs memory.
            refused_periods.append(period)
            continue
        reps = build_quotient(algorithm, op, layout, size_bytes, period, **options)
        if reps is None:
            continue
        if reps.n_ops * (p // period) < DIRECT_QUOTIENT_OPS:
            break
        try:
            return run_schedule(
                graph,
                Quotient(reps, p, period),
                reduce_bandwidth=reduce_bandwidth,
                protocol=protocol,
                progress=progress,
                tables=tables,
            )
        except AsymmetricNetwork:
            refused = reps.n_ops * (p // period)
            refused_periods.append(period)
            if tables is None:
                tables = network_tables(graph)
    merged = None
    if refused <= MERGED_AFTER_REFUSAL:
        merged = _build_merged(algorithm, op, layout, size_bytes, **options)
    if merged is not None and merged.full_ops >= DIRECT_QUOTIENT_OPS:
        # No quotient ran (the network is not symmetric for one): the side-by-side
        # transfers merged, unless that would change a time (then the full schedule).
        result = run_merged(
            graph,
            merged,
            reduce_bandwidth=reduce_bandwidth,
            protocol=protocol,
            progress=progress,
            tables=tables,
        )
        if result is not None:
            return result
    if (
        algorithm == "ring"
        and protocol is None
        and op in ("all_reduce", "reduce_scatter", "all_gather")
        and set(options) <= {"chunks", "channels"}
        and ring_ops(op, p, options.get("chunks") or 1, options.get("channels") or 1) > EXPAND_FLOWS
    ):
        # A large ring is timed step by step where its flows never meet, its schedule
        # built only where they may (simulator.collective.ring_pass, checked there);
        # the result then lists a row per rank, not per op, as a quotient's does.
        return run_ring(
            graph, op, size_bytes, reduce_bandwidth=reduce_bandwidth, **options
        )  # fmt: skip
    if refused > FULL_AFTER_REFUSAL:
        # The run was sized (ccsim's --max-flows guard) for its quotient.
        raise CcsimError(
            f"{algorithm} {op} on {p:,} ranks: the network is not symmetric for this "
            f"schedule (a slow or failed part, ECMP, uneven servers), and simulating each of "
            f"its {refused:,} transfers is past {FULL_AFTER_REFUSAL:,}; use fewer nodes, "
            "or a topology whose servers are alike"
        )
    schedule = build_schedule(algorithm, op, layout, size_bytes, **options)
    return run_schedule(
        graph,
        schedule,
        reduce_bandwidth=reduce_bandwidth,
        protocol=protocol,
        progress=progress,
        refused=refused_periods,
        tables=tables,
    )


def _build_merged(
    algorithm: str, op: str, layout: RankLayout, size_bytes: float, **options: Any
) -> Merged | None:
    """``algorithm``'s schedule with side-by-side transfers merged, where it builds one."""
    algo = get_algorithm(algorithm)
    if algo.unsupported(op, layout) is not None or not size_bytes > 0:
        return None
    return algo.merged(op, layout, size_bytes, **options)


def run_merged(
    graph: nx.Graph,
    merged: Merged,
    *,
    reduce_bandwidth: float | None = None,
    protocol: str | Protocol | None = None,
    progress: Callable[[float], None] | None = None,
    events: bool = False,
    tables: tuple[LinkTable, Router] | None = None,
) -> CollectiveResult | None:
    """Run a merged schedule (:mod:`simulator.collective.merged`) in the ideal model, as
    :func:`run_schedule` runs the full one without symmetry: the contention-free pass,
    else the mixed timing, else (or with ``events``) every merged op's flow event by
    event; each op's flow stands for its weight's identical flows. None when that could
    change a time (a member that would have started earlier than its op, or a
    protocol, whose per-transfer proxies and latencies a merged op does not follow):
    the caller then runs the full schedule. Records are the full schedule's, op by op,
    up to :data:`EXPAND_FLOWS` ops; beyond, the merged ops' with their ``weight``
    (``params["flows"] == "merged"``). ``tables``: as for :func:`run_schedule`.

    A protocol (a name or a :class:`~simulator.library.protocol.Protocol`, not "auto")
    is followed where every op of weight above 1 moves into or out of an NVLS switch
    (nvls-tree's merged copies and totals): its members share one route inside the
    server, hence one step latency, and no network proxy; the call is then replayed
    event by event after the launch and base latency, as :func:`run_schedule` does.
    Members of such ops differ in the rank at the switch's end, which only a GPU reducer
    of finite bandwidth would use: with one, None; and their records are the merged
    ops'."""
    schedule = merged.schedule
    p = len(gpu_nodes(graph))
    if schedule.ranks > p:
        raise CcsimError(f"the schedule needs {schedule.ranks} ranks; the topology has {p} GPUs")
    heavy = merged.weight > 1
    in_switch = bool(heavy.any()) and bool(
        np.isin(schedule.path[heavy], (PATH_UP, PATH_DOWN)).all()
    )
    if protocol is not None and (not in_switch or str(protocol).lower() == "auto"):
        return None
    weight = merged.weight.astype(float)
    reduce_bw = reduce_bandwidths(graph, reduce_bandwidth)
    if in_switch and np.isfinite(reduce_bw).any():
        return None
    calibration = calibration_of(graph)
    proto = None
    if isinstance(protocol, Protocol):
        proto = protocol
    elif protocol is not None:
        proto = calibration.protocol(str(protocol))
    allowed = schedule.params.get("protocols") or PROTOCOLS
    if proto is not None and proto.name.lower() not in {name.lower() for name in allowed}:
        return None  # run_schedule names the protocols this algorithm runs with
    plan = fault_plan(graph)
    timed = plan is not None and bool(plan.timed_links)
    env = simpy.Environment()
    network = FlowNetwork(
        env, graph, link_efficiency=None if proto is None else calibration.efficiency,
        tables=tables,
    )  # fmt: skip
    schedule_link_faults(network)
    timeline = None
    if proto is None and not (events or timed) and len(reduce_bw) == p:
        timing = "contention-free"
        routes = route_ops(network.router, schedule, np.arange(schedule.n_ops))
        timeline = time_contention_free(network, schedule, reduce_bw, routes, weight)
        if timeline is None:
            timing = "mixed"
            timeline = time_mixed(
                network,
                schedule,
                reduce_bw,
                routes=routes,
                weight=weight,
                max_simulated=MERGED_MAX_SIMULATED,
            )
        if timeline is None:
            env = simpy.Environment()
            network = FlowNetwork(env, graph, tables=tables)
            schedule_link_faults(network)
    if timeline is not None:
        elapsed = timeline.time_s
        times = timeline.start_s, timeline.sent_s, timeline.end_s
    else:
        timing = "events"
        network.weigh_flows()
        replay = ScheduleReplay(
            network, schedule, reduce_bandwidth=reduce_bw, weight=weight, protocol=proto
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
        except RuntimeError:  # a deadlock: the full schedule's replay reports it
            return None
        network.close_link_records()
        elapsed = float(env.now)
        times = replay.start_s, replay.sent_s, replay.end_s
    if not members_hold(merged, *times):
        return None
    if progress is not None and timeline is not None:
        progress(elapsed)
    params = {**schedule.params, "protocol": None if proto is None else proto.name}
    params["timing"] = timing
    result = _result(schedule, elapsed, times, network, params)
    if merged.full_ops <= EXPAND_FLOWS and not in_switch:
        result.flows = expand_merged(merged, result.flows)
    else:
        result.flows["weight"] = merged.weight
        result.params["flows"] = "merged"
    return result


class AsymmetricNetwork(CcsimError):
    """A quotient schedule was given for a network that is not symmetric for it."""


def expand_flows(quotient: Quotient, flows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-op records of every image of the representatives: the same times and labels,
    ranks shifted by whole periods (image k of every representative, k = 0, 1, ...)."""
    orbit, n = quotient.orbit, quotient.schedule.n_ops
    shift = np.repeat(np.arange(orbit, dtype=np.int64) * quotient.period, n)
    expanded = {name: np.tile(values, orbit) for name, values in flows.items()}
    expanded["op_index"] = np.arange(orbit * n)
    for name in ("src", "dst"):
        expanded[name] = ((expanded[name] + shift) % quotient.ranks).astype(flows[name].dtype)
    return expanded


def find_symmetry(
    network: FlowNetwork,
    schedule: Schedule,
    reduce_bandwidth: np.ndarray,
    skip: Collection[int] = (),
) -> tuple[Quotient, LinkSymmetry] | None:
    """The smallest rank shift under which ``schedule`` on ``network`` is symmetric, as
    its quotient and link classes; None when none of the candidates is (then every flow
    is simulated). Shifts are whole servers; cheap counts of each rank's ops and bytes,
    and of what each rank sees of the network (:func:`neighbourhoods`), rule most
    candidates out before the full check. Shifts in ``skip`` were already refused."""
    p = schedule.ranks
    if p != len(reduce_bandwidth) or p < 2 or schedule.n_ops == 0:
        return None
    servers = servers_of_ranks(network.graph)
    per_server = None if servers is None else int(np.bincount(np.asarray(servers)).max())
    profile = np.stack(
        [
            np.bincount(schedule.src, minlength=p),
            np.bincount(schedule.dst, minlength=p),
            np.bincount(schedule.src, weights=schedule.nbytes, minlength=p),
        ]
    )
    signatures = None
    for period in candidate_periods(p, per_server):
        if period in skip:
            continue
        folded = profile.reshape(3, p // period, period)
        if not (folded == folded[:, :1]).all():
            continue
        if not reduce_bandwidth_symmetric(reduce_bandwidth, period):
            continue
        if signatures is None:
            signatures = neighbourhoods(network.graph, network.router.nodes[:p])
        if not periodic(signatures, period):
            continue
        quotient = schedule_quotient(schedule, period)
        if quotient is None:
            continue
        classes = link_symmetry(network, quotient)
        if classes is not None:
            return quotient, classes
    return None


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


def run_ring(
    graph: nx.Graph,
    op: str,
    size_bytes: float,
    *,
    chunks: int = 1,
    channels: int = 1,
    reduce_bandwidth: float | None = None,
) -> CollectiveResult:
    """Ring ``op`` on ``graph`` with every rank simulated (no symmetry), timed by
    :func:`time_ring` where its flows never meet, else built and run as
    :func:`~simulator.collective.run.run_schedule` runs it with ``symmetry="off"``.

    Records: every op's up to :data:`~simulator.collective.run.EXPAND_FLOWS` ops (as
    ``run_schedule`` lists them); beyond, one row per rank (``params["flows"] ==
    "ranks"``: its first start and last done), with the links' records in full.
    """
    layout = rank_layout(graph)  # every GPU of the graph, a rank each
    reduce_bw = reduce_bandwidths(graph, reduce_bandwidth)
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    schedule_link_faults(network)
    plan = fault_plan(graph)
    options = {"chunks": chunks, "channels": channels}
    n_ops = ring_ops(op, layout.ranks, chunks, channels)
    times = None
    if not (plan is not None and plan.timed_links):
        times = time_ring(
            network, layout, op, size_bytes, reduce_bw, keep_ops=n_ops <= EXPAND_FLOWS, **options
        )
    if times is None:
        schedule = build_schedule("ring", op, layout, size_bytes, **options)
        return run_schedule(graph, schedule, reduce_bandwidth=reduce_bandwidth, symmetry="off")
    params = {"chunks": chunks, "channels": channels, "protocol": None, "timing": "ring steps"}
    if times.start_s is not None:
        schedule = build_schedule("ring", op, layout, size_bytes, **options)
        return _result(
            schedule, times.time_s, (times.start_s, times.sent_s, times.end_s), network, params
        )
    return CollectiveResult(
        op=op,
        algorithm="ring",
        ranks=layout.ranks,
        size_bytes=float(size_bytes),
        time_s=times.time_s,
        flows={
            "rank": np.arange(layout.ranks),
            "start_s": times.rank_start_s,
            "end_s": times.rank_end_s,
        },
        links=network.link_records(),
        stats=network.stats,
        params={**params, "flows": "ranks"},
    )
