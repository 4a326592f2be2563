"""A ring collective timed step by step without building its schedule.

A ring all-reduce of p ranks in K chunks has 2(p-1)K ops per rank: 8.4 M at 1,024 ranks
with 4 chunks. Where its flows never meet, the contention-free pass
(:mod:`simulator.collective.contention_free`) times them without events, but it holds
the whole schedule, its successor lists and every op's times (close to 1 GB there), and
walks its 8,184 levels with a few dozen numpy calls each. A ring's dependencies are
closed-form (:class:`~simulator.algorithms.ring.Ring`): op (s, k) at position i, step s
and chunk k, waits for the block to be *done* at position i - 1 (op (s - 1, k) there)
and for its channel to have *sent* the chunk before it (op (s, k - 1), or (s - 1, K - 1)
for k = 0). So every position's op (s, k) is one vector of the recurrence

    start = max(done[s - 1, k][i - 1], sent[previous chunk][i])   (0 for the first)
    sent  = start + bytes / the slowest link of position i's route
    done  = sent + its route's latency (+ bytes / the receiver's reduce bandwidth)

the contention-free pass's arithmetic, op for op, with K + 1 vectors of p positions held
at a time and each link's records (bytes, busy time, last busy instant) summed as the
levels go: the memory of the ranks, not of the ops.

That arithmetic is exact only where no two flows ever share a link, which is checked
before anything is timed rather than assumed: every link of every position's route must
belong to that position alone (its own ops are sent one after another, FIFO, so they
never overlap), and every reducer must serve one position; reductions of one position
must not overlap either, which is checked as the steps are timed (a slow reducer). When
a check fails, :func:`time_ring` returns None and
:func:`~simulator.collective.run.run_ring` builds the schedule and runs it as
:func:`~simulator.collective.run.run_schedule` does. The result is tested
against the event-by-event replay of every flow (tests/test_ring_pass.py).

Scope: the ideal model (no protocol), no timed link faults, the ring's own ops
(all-reduce, reduce-scatter, all-gather).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algorithms.base import RankLayout, check_positive_int
from ..algorithms.ring import Ring, g_of, ring_orders
from ..algorithms.schedule import PATH_DEFAULT, PATH_PXN, csr_gather
from ..network.flows import FlowNetwork
from .contention_free import route_bottlenecks
from .replay import route_pairs

#: Intervals overlapping by less than this (relative to the time, at least 1 s) touch,
#: as in the contention-free pass.
_TOUCH = 1e-12


@dataclass
class RingTimes:
    """What :func:`time_ring` found: when the call ends, each rank's first start and last
    done (over the ops it sends or receives), the flows it stands for, and with
    ``keep_ops`` every op's times in :class:`~simulator.algorithms.ring.Ring`'s op order."""

    time_s: float
    rank_start_s: np.ndarray
    rank_end_s: np.ndarray
    flows: int
    start_s: np.ndarray | None = None
    sent_s: np.ndarray | None = None
    end_s: np.ndarray | None = None


def time_ring(
    network: FlowNetwork,
    layout: RankLayout,
    op: str,
    size_bytes: float,
    reduce_bandwidth: np.ndarray,
    *,
    chunks: int = 1,
    channels: int = 1,
    keep_ops: bool = False,
) -> RingTimes | None:
    """Time the ring's ``op`` on ``network`` step by step (see the module docstring);
    None when its flows could meet (the caller then runs the schedule).

    ``network`` must be fresh; on success its records (bytes, busy time and last busy
    instant per link) and stats are those the contention-free pass leaves. ``keep_ops``:
    also return every op's start, sent and done times (for tests and small rings).
    """
    p = layout.ranks
    K = check_positive_int(chunks, "chunks")
    C = check_positive_int(channels, "channels")
    if op not in Ring.ops or p < 2 or not size_bytes > 0 or len(reduce_bandwidth) != p:
        return None
    half = p - 1
    steps = 2 * half if op == "all_reduce" else half
    chunk_bytes = float(size_bytes) / (C * p * K)

    # Each position (channel c, ring position i, flattened c * p + i): its sender,
    # receiver and route, as Ring._build gives its ops.
    orders = ring_orders(layout, C)
    src = np.concatenate(orders).astype(np.int64)
    dst = np.concatenate([order[(np.arange(p) + 1) % p] for order in orders]).astype(np.int64)
    path = None
    if layout.servers is not None and g_of(layout) > 1:
        servers = np.asarray(layout.servers)
        path = np.where(servers[src] != servers[dst], PATH_PXN, PATH_DEFAULT).astype(np.int8)
    channel = np.repeat(np.arange(C, dtype=np.int64), p)
    router = network.router
    routes = route_pairs(router, src, dst, channel, path)
    ptr, route_links, route_latency = router.arrays()
    links = csr_gather(ptr, route_links, routes)
    if len(np.unique(links)) != len(links):
        return None  # two positions share a link (or a route visits one twice)
    lengths = ptr[routes + 1] - ptr[routes]
    owner = np.repeat(np.arange(C * p), lengths)

    # Reducers: the receiver's reducer link where it reduces at a finite bandwidth.
    reduces_in = {"all_reduce": half, "reduce_scatter": steps, "all_gather": 0}[op]
    reducer = np.full(C * p, -1, dtype=np.int64)
    if reduces_in and np.isfinite(reduce_bandwidth).any():
        finite = np.isfinite(reduce_bandwidth[dst])
        if len(np.unique(dst[finite])) != int(finite.sum()):
            return None  # one reducer would serve two positions
        # Made in rank order, as the contention-free pass makes them (link ids follow).
        by_rank = {}
        for rank in np.unique(dst[finite]).tolist():
            by_rank[rank] = network.reducer_route(rank, reduce_bandwidth[rank])
        ptr, route_links, _ = router.arrays()  # with the reducers' routes
        for position in np.flatnonzero(finite).tolist():
            reducer[position] = route_links[ptr[by_rank[int(dst[position])]]]
    has_reducer = reducer >= 0
    capacity = network.capacity
    bottleneck = route_bottlenecks(ptr, route_links, capacity)[routes]
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer = np.where(chunk_bytes > 0, chunk_bytes / bottleneck, 0.0)
        red_s = np.where(has_reducer, chunk_bytes / capacity[np.maximum(reducer, 0)], 0.0)
    latency = route_latency[routes]
    previous = (np.arange(C * p) - 1) % p + np.repeat(np.arange(C) * p, p)

    m = C * p
    busy = np.zeros(m)  # per position: the summed [start, sent) intervals
    red_busy = np.zeros(m)
    red_until = np.full(m, -np.inf)  # when each position's last reduction is done
    first_start = np.full(m, np.inf)
    last_done = np.full(m, -np.inf)
    n_ops = steps * K * m
    if keep_ops:
        kept = [np.empty((C, steps * K, p)) for _ in range(3)]
    done_before: list[np.ndarray] = []  # step s - 1's done times, chunk by chunk
    sent_last: np.ndarray | None = None
    # Bytes per route link (and reducer) so far, summed one flow at a time as the
    # contention-free pass adds them.
    carried = red_carried = 0.0
    for s in range(steps):
        reducing = s < reduces_in and bool(has_reducer.any())
        done_now = []
        for k in range(K):
            if s == 0:
                start = np.zeros(m) if sent_last is None else sent_last
            else:
                start = np.maximum(done_before[k][previous], sent_last)
            sent = start + transfer
            busy += sent - start
            done = sent + latency
            if reducing:
                arrived = done
                done = np.where(has_reducer, arrived + red_s, arrived)
                live = done > arrived
                tol = _TOUCH * np.maximum(np.abs(arrived), 1.0)
                if (live & (arrived + tol < red_until)).any():
                    return None  # a reduction would start before the last one is done
                red_busy += np.where(has_reducer, done - arrived, 0.0)
                red_until = np.where(has_reducer, np.maximum(red_until, done), red_until)
                red_carried += chunk_bytes
            carried += chunk_bytes
            if s == 0 and k == 0:
                first_start = start
            np.maximum(last_done, done, out=last_done)
            if keep_ops:
                level = s * K + k
                for values, times in zip(kept, (start, sent, done), strict=True):
                    values[:, level, :] = times.reshape(C, p)
            done_now.append(done)
            sent_last = sent
        done_before = done_now

    # Records, as the contention-free pass leaves them: bytes and busy time per link
    # (each link is one position's), the last busy instant (its last flow's end).
    np.add.at(network.link_bytes, links, carried)
    np.add.at(network.link_busy, links, busy[owner])
    np.maximum.at(network.link_idle_at, links, np.maximum(sent_last[owner], 0.0))
    reducing_ops = 0
    if has_reducer.any() and reduces_in:
        on = reducer[has_reducer]
        np.add.at(network.link_bytes, on, red_carried)
        np.add.at(network.link_busy, on, red_busy[has_reducer])
        np.maximum.at(network.link_idle_at, on, np.maximum(red_until[has_reducer], 0.0))
        reducing_ops = int(has_reducer.sum()) * reduces_in * K
    flows = n_ops + reducing_ops
    network.stats.flows += flows
    network.stats.represented_flows += flows

    rank_start = np.full(p, np.inf)
    rank_end = np.full(p, -np.inf)
    for ends in (src, dst):
        np.minimum.at(rank_start, ends, first_start)
        np.maximum.at(rank_end, ends, last_done)
    times = RingTimes(float(last_done.max()), rank_start, rank_end, flows)
    if keep_ops:
        times.start_s, times.sent_s, times.end_s = (values.ravel() for values in kept)
    return times
