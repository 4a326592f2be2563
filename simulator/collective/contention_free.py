"""Timing a schedule whose transfers never share a link: a longest-path pass, checked.

When no two flows are ever on the same directed link at the same time, max-min sharing
never happens: each flow runs at its route's bottleneck capacity from start to end, and
every op's times follow from its dependencies alone:

* start = the latest of its dependencies' *sent* (``dep_sent``) or *done* times (0 for
  none), as the replay starts an op when its last dependency is satisfied;
* sent = start + wire bytes / the slowest link of its route (at once for no bytes);
* delivered = sent + the route's latency;
* done = delivered, plus bytes / reduce bandwidth when the receiver reduces it (its
  reduction is a flow on the receiver's reducer link, see
  :meth:`~simulator.network.flows.FlowNetwork.reducer_route`).

That is a longest-path computation over the schedule's DAG, done here level by level
(Kahn's algorithm: every op whose dependencies are all timed, at once), with no event
per flow: a 1,024-rank ring whose flows all finish at different times (one slow link)
is ~8,000 numpy passes instead of 8 million events. The premise is then *checked* as
the levels are timed: every flow's interval [start, sent) on each link of its route,
and every reduction's [delivered, done) on its reducer, must begin no earlier than the
last interval already timed on that link ends. The check is conservative (it also
refuses a flow timed after a later one on the same link, in another level, even where
the two do not overlap); when it fails, :func:`time_contention_free` returns None and
the caller simulates every flow (:class:`~simulator.collective.replay.ScheduleReplay`),
which is the reference these times are tested against.

The idea of skipping the events of a network state that cannot change the outcome is
the one of steady-state fast-forwarding (Wormhole, NSDI'26); this is its simplest case,
a state where no flow ever meets another.

Scope: the ideal model only (no protocol: its proxies, per-hop latencies and channel
rates queue transfers in ways a level pass does not follow), no timed link faults, and
no link classes (a quotient's aggregated flows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algorithms.schedule import Schedule, csr_gather, successors
from ..network.flows import FlowNetwork
from .replay import route_ops

#: Intervals that overlap by less than this (seconds, relative to the time) touch: a flow
#: that starts when another is sent, computed by a different sum, may differ in the
#: last bits.
_TOUCH = 1e-12


@dataclass
class Timeline:
    """Each op's start, sent and done times (seconds from the call's start), and the
    network records the replay would have left (bytes and busy time per link)."""

    start_s: np.ndarray
    sent_s: np.ndarray
    end_s: np.ndarray
    #: Flows simulated (the transfers, and one per reduction).
    flows: int

    @property
    def time_s(self) -> float:
        """When the last op is done (0 for an empty schedule)."""
        return float(self.end_s.max()) if len(self.end_s) else 0.0


def time_contention_free(
    network: FlowNetwork,
    schedule: Schedule,
    reduce_bandwidth: np.ndarray,
) -> Timeline | None:
    """Time ``schedule`` on ``network`` as a longest-path pass when no two of its flows
    ever share a link (see the module docstring); None when they would, or when the
    dependencies hold a cycle (the replay then reports the deadlock).

    On success the network's per-link records (bytes, busy time, when idle) hold what
    replaying every flow would have left there, and its stats count the flows.
    """
    n = schedule.n_ops
    if n == 0:
        return Timeline(np.zeros(0), np.zeros(0), np.zeros(0), 0)
    router = network.router
    routes = route_ops(router, schedule, np.arange(n))
    ptr, route_links, route_latency = router.arrays()
    capacity = network.capacity
    # Each route's bottleneck: the minimum capacity over its links (inf for none).
    lengths = np.diff(ptr)
    bottleneck = np.full(len(lengths), np.inf)
    has = lengths > 0
    if has.any():
        bottleneck[has] = np.minimum.reduceat(capacity[route_links], ptr[:-1][has])
    wire = schedule.nbytes
    with np.errstate(divide="ignore", invalid="ignore"):
        duration = np.where(wire > 0, wire / bottleneck[routes], 0.0)
    latency = route_latency[routes]

    # Reductions: on the receiver's reducer link, where its GPU has a finite bandwidth.
    reducer = np.full(n, -1, dtype=np.int64)
    reduce_time = np.zeros(n)
    if schedule.reduce.any() and np.isfinite(reduce_bandwidth).any():
        by_rank = np.full(len(reduce_bandwidth), -1, dtype=np.int64)
        for rank in np.unique(schedule.dst[schedule.reduce]).tolist():
            if np.isfinite(reduce_bandwidth[rank]):
                by_rank[rank] = network.reducer_route(rank, reduce_bandwidth[rank])
        ptr, route_links, route_latency = router.arrays()  # with the reducers' routes
        reducer = np.where(schedule.reduce, by_rank[schedule.dst], -1)
        reducer[reducer >= 0] = route_links[ptr[reducer[reducer >= 0]]]  # route -> link
        reducing = reducer >= 0
        bandwidth = reduce_bandwidth[schedule.dst[reducing]]
        reduce_time[reducing] = np.where(
            wire[reducing] > 0, schedule.nbytes[reducing] / bandwidth, 0.0
        )
        capacity = network.capacity  # reducer links were appended

    n_links = len(capacity)
    busy_until = np.full(n_links, -np.inf)
    link_bytes = np.zeros(n_links)
    link_busy = np.zeros(n_links)
    idle_at = np.zeros(n_links)

    start = np.zeros(n)
    sent = np.zeros(n)
    done = np.zeros(n)
    pending = np.diff(schedule.dep_ptr).astype(np.int64)
    (dptr, didx), (sptr, sidx) = successors(schedule)
    level = np.flatnonzero(pending == 0)
    timed = 0
    while len(level):
        timed += len(level)
        ready = _ready(schedule, level, sent, done)
        start[level] = ready
        sent[level] = ready + duration[level]
        arrived = sent[level] + latency[level]
        done[level] = arrived + reduce_time[level]
        # The flows' intervals on their links, then the reductions' on their reducers.
        rows = routes[level]
        counts = lengths[rows]
        links = csr_gather(ptr, route_links, rows)
        begin = np.repeat(start[level], counts)
        end = np.repeat(sent[level], counts)
        carried = np.repeat(wire[level], counts)
        red = reducer[level] >= 0
        if red.any():
            links = np.concatenate([links, reducer[level][red]])
            begin = np.concatenate([begin, arrived[red]])
            end = np.concatenate([end, done[level][red]])
            carried = np.concatenate([carried, schedule.nbytes[level][red]])
        if not _claim(links, begin, end, busy_until):
            return None
        np.add.at(link_bytes, links, carried)
        np.add.at(link_busy, links, end - begin)
        np.maximum.at(idle_at, links, end)
        succ = np.concatenate([csr_gather(dptr, didx, level), csr_gather(sptr, sidx, level)])
        if len(succ) == 0:
            break
        np.subtract.at(pending, succ, 1)
        level = np.unique(succ[pending[succ] == 0])
    if timed < n:
        return None  # a cycle: the replay reports which ops are stuck

    network.link_bytes += link_bytes
    network.link_busy += link_busy
    network.link_idle_at[:] = np.maximum(network.link_idle_at, idle_at)
    flows = n + int((reducer >= 0).sum())
    network.stats.flows += flows
    network.stats.represented_flows += flows
    return Timeline(start, sent, done, flows)


def _ready(schedule: Schedule, ops: np.ndarray, sent: np.ndarray, done: np.ndarray) -> np.ndarray:
    """When each op's last dependency is satisfied (0 for none)."""
    ptr = schedule.dep_ptr
    counts = ptr[ops + 1] - ptr[ops]
    ready = np.zeros(len(ops))
    if not counts.any():
        return ready
    positions = _positions(ptr[ops], counts)
    deps = schedule.dep_idx[positions]
    times = np.where(schedule.dep_sent[positions], sent[deps], done[deps])
    some = counts > 0
    first = np.cumsum(counts[some]) - counts[some]
    ready[some] = np.maximum.reduceat(times, first)
    return ready


def _positions(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] .. starts[i] + counts[i] - 1`` for every ``i``, concatenated."""
    total = int(counts.sum())
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)


def _claim(links: np.ndarray, begin: np.ndarray, end: np.ndarray, busy_until: np.ndarray) -> bool:
    """Whether intervals [begin, end) on ``links`` (one level's) overlap neither each
    other nor anything already claimed (``busy_until``: when each link's last claimed
    interval ends); claims them if not. Empty intervals claim nothing."""
    live = end > begin
    if not live.all():
        links, begin, end = links[live], begin[live], end[live]
    if len(links) == 0:
        return True
    tol = _TOUCH * np.maximum(np.abs(begin), 1.0)
    if (begin + tol < busy_until[links]).any():
        return False
    if len(links) > 1:
        order = np.lexsort((begin, links))
        links, begin, end, tol = links[order], begin[order], end[order], tol[order]
        same = links[1:] == links[:-1]
        if same.any() and (begin[1:][same] + tol[1:][same] < end[:-1][same]).any():
            return False
        # Sorted by start and not overlapping: each link's last interval ends last.
        last = np.r_[~same, True]
        busy_until[links[last]] = end[last]
    else:
        busy_until[links] = end
    return True
