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
from ..network.maxmin import max_min_rates
from .replay import route_ops

#: Intervals that overlap by less than this (seconds, relative to the time) touch: a flow
#: that starts when another is sent, computed by a different sum, may differ in the
#: last bits.
_TOUCH = 1e-12
#: Flows ending within this relative distance of the first end end with it (as the
#: network's wake-up does, simulator.network.flows).
_SAME_TIME = 1e-12
#: One, as the dependency counters' type (int32: millions of ops).
_ONE = np.int32(1)


@dataclass
class Timeline:
    """Each op's start, sent and done times (seconds from the call's start), and the
    network records the replay would have left (bytes and busy time per link)."""

    start_s: np.ndarray
    sent_s: np.ndarray
    end_s: np.ndarray
    #: Flows simulated (the transfers, and one per reduction).
    flows: int

    @classmethod
    def empty(cls) -> Timeline:
        """The timeline of a schedule without ops."""
        return cls(np.zeros(0), np.zeros(0), np.zeros(0), 0)

    @property
    def time_s(self) -> float:
        """When the last op is done (0 for an empty schedule)."""
        return float(self.end_s.max()) if len(self.end_s) else 0.0


def time_contention_free(
    network: FlowNetwork,
    schedule: Schedule,
    reduce_bandwidth: np.ndarray,
    routes: np.ndarray | None = None,
    weight: np.ndarray | None = None,
) -> Timeline | None:
    """Time ``schedule`` on ``network`` as a longest-path pass when no two of its flows
    ever share a link (see the module docstring); None when they would, or when the
    dependencies hold a cycle (the replay then reports the deadlock).

    On success the network's per-link records (bytes, busy time, when idle) hold what
    replaying every flow would have left there, and its stats count the flows.
    ``routes``: each op's route (:func:`~simulator.collective.replay.route_ops`), when
    the caller already has them. ``weight[i]``: op i stands for that many identical
    transfers side by side (a :class:`~simulator.algorithms.schedule.Merged` schedule's
    ops; default one each), timed as that many identical flows.
    """
    n = schedule.n_ops
    if n == 0:
        return Timeline.empty()
    # The successor lists first: their sort is the pass's largest transient, best taken
    # before the per-op arrays below exist (memory is the limit at scale).
    (dptr, didx), (sptr, sidx) = successors(schedule)
    router = network.router
    routes = op_routes(network, schedule, routes)
    # Weights per level (ones where none are given: no array of n ones held).
    weight = None if weight is None else np.asarray(weight, dtype=float)
    wire = schedule.nbytes

    reducer, _ = op_reducers(network, schedule, reduce_bandwidth)
    ptr, route_links, route_latency = router.arrays()  # with the reducers' routes
    capacity = network.capacity  # reducer links were appended

    n_links = len(capacity)
    books = _Books(
        busy_until=np.full(n_links, -np.inf),
        bytes=np.zeros(n_links),
        busy=np.zeros(n_links),
        idle_at=np.zeros(n_links),
    )
    start = np.zeros(n)
    sent = np.zeros(n)
    done = np.zeros(n)
    lengths = np.diff(ptr)
    pending = np.diff(schedule.dep_ptr).astype(np.int32)
    level = np.flatnonzero(pending == 0)
    timed = 0
    while len(level):
        timed += len(level)
        ready = _ready(schedule, level, sent, done)
        start[level] = ready
        rows = routes[level]
        counts = lengths[rows]
        links = csr_gather(ptr, route_links, rows)
        copies = np.ones(len(level)) if weight is None else weight[level]
        ends = _level_flows(ready, wire[level], rows, counts, links, capacity, books, copies)
        if ends is None:
            return None
        sent[level] = ends
        arrived = ends + route_latency[rows]
        done[level] = arrived
        red = reducer[level] >= 0
        if red.any():
            # Reductions start on arrival; those on one GPU at once share its reducer.
            on = reducer[level][red]
            ends = _level_flows(
                arrived[red], schedule.nbytes[level][red], on, np.ones(len(on), np.int64),
                on, capacity, books, copies[red],
            )  # fmt: skip
            if ends is None:
                return None
            done[level[red]] = ends
        succ = np.concatenate([csr_gather(dptr, didx, level), csr_gather(sptr, sidx, level)])
        if len(succ) == 0:
            break
        # One of pending's own type: a Python int sends ufunc.at down its slow casting
        # path (numpy 2.4: 50x slower on int32, most of this pass's time on a ring).
        np.subtract.at(pending, succ, _ONE)
        level = np.sort(succ[pending[succ] == 0])
        if len(level) > 1:  # an op whose last two dependencies were in this level
            level = level[np.r_[True, level[1:] != level[:-1]]]
    if timed < n:
        return None  # a cycle: the replay reports which ops are stuck

    network.link_bytes += books.bytes
    network.link_busy += books.busy
    network.link_idle_at[:] = np.maximum(network.link_idle_at, books.idle_at)
    flows = n + int((reducer >= 0).sum())
    network.stats.flows += flows
    if weight is None:
        network.stats.represented_flows += flows
    else:
        network.stats.represented_flows += float(weight.sum() + weight[reducer >= 0].sum())
    return Timeline(start, sent, done, flows)


def op_routes(network: FlowNetwork, schedule: Schedule, routes: np.ndarray | None) -> np.ndarray:
    """Each op's route: ``routes`` where the caller already has them, else found now
    (:func:`~simulator.collective.replay.route_ops`)."""
    if routes is None:
        routes = route_ops(network.router, schedule, np.arange(schedule.n_ops))
    return routes


def route_bottlenecks(ptr: np.ndarray, route_links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Each route's bottleneck: the least capacity over its links (inf for none); routes
    as the router's CSR arrays (``route_links[ptr[r]:ptr[r + 1]]``)."""
    lengths = np.diff(ptr)
    bottleneck = np.full(len(lengths), np.inf)
    has = lengths > 0
    if has.any():
        bottleneck[has] = np.minimum.reduceat(capacity[route_links], ptr[:-1][has])
    return bottleneck


def op_reducers(
    network: FlowNetwork, schedule: Schedule, reduce_bandwidth: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each op's reducer link (-1: none) and its reduction's time alone on it: reducing
    ops reduce on the receiver's reducer link where its GPU has a finite bandwidth (the
    network's reducer routes, created here as the replay creates them)."""
    n = schedule.n_ops
    reducer = np.full(n, -1, dtype=np.int32)  # link ids; millions of ops
    reduce_time = np.zeros(n)
    if schedule.reduce.any() and np.isfinite(reduce_bandwidth).any():
        by_rank = np.full(len(reduce_bandwidth), -1, dtype=np.int64)
        for rank in np.unique(schedule.dst[schedule.reduce]).tolist():
            if np.isfinite(reduce_bandwidth[rank]):
                by_rank[rank] = network.reducer_route(rank, reduce_bandwidth[rank])
        ptr, route_links, _ = network.router.arrays()
        reducer = np.where(schedule.reduce, by_rank[schedule.dst], -1)
        reducer[reducer >= 0] = route_links[ptr[reducer[reducer >= 0]]]  # route -> link
        reducing = reducer >= 0
        bandwidth = reduce_bandwidth[schedule.dst[reducing]]
        reduce_time[reducing] = np.where(
            schedule.nbytes[reducing] > 0, schedule.nbytes[reducing] / bandwidth, 0.0
        )
    return reducer, reduce_time


@dataclass
class _Books:
    """Per-link records kept by the pass: when the last claimed interval ends, and the
    bytes, busy time and last idle instant the replay would record."""

    busy_until: np.ndarray
    bytes: np.ndarray
    busy: np.ndarray
    idle_at: np.ndarray


def _level_flows(
    begin: np.ndarray,
    size: np.ndarray,
    key: np.ndarray,
    counts: np.ndarray,
    links: np.ndarray,
    capacity: np.ndarray,
    books: _Books,
    copies: np.ndarray,
) -> np.ndarray | None:
    """When each of one level's flows is sent: flow ``i`` starts at ``begin[i]`` with
    ``size[i]`` bytes on links ``links[sum(counts[:i]):][:counts[i]]`` (``key``: its
    route; equal keys, starts and sizes make identical flows), standing for ``copies[i]``
    identical flows. None when a flow would meet one of an earlier level on a link (that
    level's timing assumed it alone).

    Flows alone on their links within the level run at their bottleneck; flows that
    share a link with others of the level are simulated together, exactly, as the
    network does (max-min rates recomputed at every start and end, :func:`_share`),
    identical flows as one of their weight.
    """
    m = len(begin)
    owner = np.repeat(np.arange(m), counts)
    end = np.empty(m)
    alone = np.ones(m, dtype=bool)
    if len(links) > 1:
        ordered = np.sort(links)
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(twice):
            alone[owner[np.isin(links, twice)]] = False
    rep = np.arange(m)  # the flow each one is timed as (itself, or its identical twin's)
    weight = np.asarray(copies, dtype=float).copy()
    if not alone.all():
        # Identical flows (same route, start and bytes) become one of their weight.
        shared = np.flatnonzero(~alone)
        order = shared[np.lexsort((size[shared], begin[shared], key[shared]))]
        first = np.r_[
            True,
            (key[order][1:] != key[order][:-1])
            | (begin[order][1:] != begin[order][:-1])
            | (size[order][1:] != size[order][:-1]),
        ]
        group = np.cumsum(first) - 1
        heads = order[first]
        rep[order] = heads[group]
        weight[heads] = np.bincount(group, weights=weight[order])
        # Heads whose links no other head uses are alone after all.
        mine = np.isin(owner, heads)
        head_links = links[mine]
        ordered = np.sort(head_links)
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        still = np.zeros(m, dtype=bool)
        if len(twice):
            still[owner[mine][np.isin(head_links, twice)]] = True
        alone[heads[~still[heads]]] = True
        together = heads[still[heads]]
    else:
        together = np.zeros(0, dtype=np.int64)
    # Alone (or one of identical twins): the bottleneck, weight times the bytes.
    solo = np.flatnonzero(alone)
    if len(solo):
        bottleneck = np.full(m, np.inf)
        has = counts > 0
        if has.any():
            firsts = np.cumsum(counts) - counts
            bottleneck[has] = np.minimum.reduceat(capacity[links], firsts[has])
        with np.errstate(divide="ignore", invalid="ignore"):
            load = size[solo] * weight[solo]
            end[solo] = begin[solo] + np.where(load > 0, load / bottleneck[solo], 0.0)
    busy = None
    if len(together):
        busy = _share_components(begin, size, weight, together, owner, links, capacity, end)
    end[:] = end[rep]
    # Claims against earlier levels, and the records.
    lo, hi = begin[owner], end[owner]
    live = hi > lo
    if live.any():
        tol = _TOUCH * np.maximum(np.abs(lo[live]), 1.0)
        if (lo[live] + tol < books.busy_until[links[live]]).any():
            return None
    np.maximum.at(books.busy_until, links, hi)
    np.add.at(books.bytes, links, (size * copies)[owner])
    np.maximum.at(books.idle_at, links, hi)
    # Busy time: one interval per distinct flow alone on its links; the union of those
    # simulated together, as the network counts it.
    single = alone[rep][owner] & (rep[owner] == owner)
    np.add.at(books.busy, links[single], (hi - lo)[single])
    if busy is not None:
        ids, seconds = busy
        np.add.at(books.busy, ids, seconds)
    return end


def _share_components(
    begin: np.ndarray,
    size: np.ndarray,
    weight: np.ndarray,
    flows: np.ndarray,
    owner: np.ndarray,
    links: np.ndarray,
    capacity: np.ndarray,
    end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Simulate ``flows`` (which share links) together, each connected set of them on
    its own; writes their ends into ``end`` and returns (link ids, busy seconds)."""
    mine = np.isin(owner, flows)
    inc_flow, inc_link = owner[mine], links[mine]
    # Connected sets: labels spread through shared links until they settle.
    label = np.full(len(end), np.iinfo(np.int64).max)
    label[flows] = flows
    n_links = len(capacity)
    while True:
        on_link = np.full(n_links, np.iinfo(np.int64).max)
        np.minimum.at(on_link, inc_link, label[inc_flow])
        spread = label.copy()
        np.minimum.at(spread, inc_flow, on_link[inc_link])
        if np.array_equal(spread, label):
            break
        label = spread
    order = np.argsort(label[inc_flow], kind="stable")
    inc_flow, inc_link = inc_flow[order], inc_link[order]
    cut = np.flatnonzero(np.r_[True, label[inc_flow][1:] != label[inc_flow][:-1], True])
    all_ids, all_busy = [], []
    for a, b in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True):
        members, local = np.unique(inc_flow[a:b], return_inverse=True)
        ids, on = np.unique(inc_link[a:b], return_inverse=True)
        finish, busy = _share(
            begin[members], size[members], weight[members], local, on, capacity[ids]
        )
        end[members] = finish
        all_ids.append(ids)
        all_busy.append(busy)
    return np.concatenate(all_ids), np.concatenate(all_busy)


def _share(
    begin: np.ndarray,
    size: np.ndarray,
    weight: np.ndarray,
    inc_flow: np.ndarray,
    inc_link: np.ndarray,
    capacity: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Flows that start at ``begin`` on links they share with each other only, simulated
    as the network does: at every start and end, max-min fair rates (a flow of weight k
    stands for k identical ones); a flow ends when its bytes are through, flows ending
    within the network's tolerance of the first end with it. Returns each flow's end
    and each link's busy time (while at least one flow is on it)."""
    m, n_links = len(begin), len(capacity)
    left = size.astype(float).copy()
    rate = np.zeros(m)
    finish = np.full(m, np.inf)
    end = np.full(m, np.nan)
    active = np.zeros(m, dtype=bool)
    order = np.argsort(begin, kind="stable")
    starts = begin[order]
    arrived = 0
    on_link = np.zeros(n_links, dtype=np.int64)
    since = np.zeros(n_links)
    busy = np.zeros(n_links)
    coef = weight[inc_flow]
    t = float(starts[0])
    last = t
    while True:
        left[active] = np.maximum(left[active] - rate[active] * (t - last), 0.0)
        last = t
        # Ends first (their links are free for what starts now), then starts.
        done = np.flatnonzero(active & (finish <= t + _SAME_TIME * abs(t)))
        if len(done):
            end[done] = t
            active[done] = False
            gone = np.isin(inc_flow, done)
            before = on_link.copy()
            np.subtract.at(on_link, inc_link[gone], 1)
            idle = (before > 0) & (on_link == 0)
            busy[idle] += t - since[idle]
        upto = int(np.searchsorted(starts, t, side="right"))
        if upto > arrived:
            new = order[arrived:upto]
            arrived = upto
            active[new] = True
            came = np.isin(inc_flow, new)
            before = on_link.copy()
            np.add.at(on_link, inc_link[came], 1)
            since[(before == 0) & (on_link > 0)] = t
        if not active.any() and arrived == m:
            break
        live = np.flatnonzero(active)
        if len(live):
            local = np.full(m, -1)
            local[live] = np.arange(len(live))
            keep = local[inc_flow] >= 0
            rate[live] = max_min_rates(
                local[inc_flow[keep]], inc_link[keep], len(live), capacity, coef[keep]
            )
            with np.errstate(divide="ignore", invalid="ignore"):
                finish[live] = t + np.where(left[live] > 0, left[live] / rate[live], 0.0)
        following = float(finish[live].min()) if len(live) else np.inf
        if arrived < m:
            following = min(following, float(starts[arrived]))
        t = following
    return end, busy


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
