"""A schedule replayed under the protocol model in Python scalars: the same events as
:class:`~simulator.collective.replay.ScheduleReplay` on a
:class:`~simulator.network.flows.FlowNetwork`, without their numpy passes.

Why not without events. The exact event-free passes (:mod:`.ring_pass`,
:mod:`.contention_free`) need flows that never meet, and the data-parallel rings of a
training step do meet: NCCL's channels leave a server through the same NICs and NVLink
ports (on the MLPerf GPT-3 175B fp8 run's DP reduce-scatter, 8 channels over 2 NVLink
link classes, 4 on each NIC), and the protocol's proxies, one host thread per GPU
(NCCL's proxy.cc), post their messages one after another, so the flows sharing a link
start a proxy slot apart and change each other's max-min rates as they come and go.
Their times are those of the events; only the cost per event can go.

What the reference pays per event is fixed numpy work (a few dozen small array calls
in the network's settle and wake, the replay's launch, release and delivery), about
300 us per op on that call, for groups of a dozen flows. Here the same steps run on
Python lists and floats, with a heap of (time, sequence) in place of SimPy's queue
(the same order: SimPy's timeouts are keyed by time, then creation):

* the replay (:class:`~simulator.collective.replay.ScheduleReplay`): an op is launched
  when its last dependency is met (all ready at once, in op order); a transfer that
  crosses the network waits for its sender's proxy (:func:`.replay.proxy_queue`, both
  its branches' arithmetic) less one message's handling; on delivery (the route's
  latency after its last byte) it waits for the protocol's step latency beyond the
  route's, the channel rate, and with Simple for its receiver's proxy;
* the network (:class:`~simulator.network.flows.FlowNetwork`): flows added at one
  instant are rated together after everything queued for it (inside a completion, at
  its end); a flow alone on every link of its route runs at its slowest link's share;
  otherwise the flows connected to the links that changed (the same search, with its
  six-round cut-off) get max-min rates by progressive filling (:mod:`~simulator.network
  .maxmin`'s arithmetic and 1e-12 ties, filled by route: see :class:`_Net`), the bytes
  they have left brought up to date first; flows ending within a relative 1e-12 of the
  earliest end with it; flow slots are reused as the network reuses them (which sets the
  order of a completion's ops, and so of its receivers' proxy queue); per-link bytes,
  busy time, last idle instant and flow-seconds are kept as it keeps them, on link
  classes' representatives when flows are aggregated.

The same replay runs calls timed on their binding links (``stand_in``: each flow on its
kept links, :class:`~simulator.workload.reduced.StandInReplay`), and can stop once a
number of flows have been sent (``sent_limit``), a look at a run's beginning. A wide ring
keeps thousands of flows in flight, rated a few dozen at a time: the next ends come
from a heap of each route's earliest, not from a scan of every flow at each event. A
route's flows (a ring's channels on one hop: 62 on the Llama 3.1 405B FSDP GB200 row's
DP all-gather) are always rated together, so they keep one rate and instant per route,
each flow only its bytes left (one subtraction a flow an event, its finish worked out
where it is read); while they joined in order of bytes left they stay in it, so the
flows done at an instant are the route's first ones; and each distinct filling (flows
per route) is made once. Same doubles: that call, 250,000 transfers in 121,000 events,
took 11.0-11.7 s of CPU before these and 7.1-8.0 s after (load 8 on 2 cores).

The shape of a data-parallel ring's routes spares more (issue 31; the same doubles). Its
routes fall into clusters joined through shared links (on a GB200 rack, each GPU's hop to
the next and its PXN hop through the same NVLink port: 32 clusters of 2 routes on the
MLPerf v5.1 Llama 3.1 8B 512-GPU row's quotient). Clusters share no link, so a filling
is each cluster's own filling (made once per cluster and flows per route) unless two
different levels fall within the filling's tie (checked; then the whole filling); where
every two routes of a cluster share a link, the search for connected flows finds every
route with flows of each cluster reached, without its rounds. Links crossed by the same
routes as often (the port's two directions, a NIC's links) carry the same flows, so
their counts and records are kept once and copied at the end; a link's bytes are summed
at the end, in the order the flows were done (numpy's running sum adds one value after
another); with few routes the next finishes come from a scan, not a heap; a ring's
one successor per op is kept as such. Tested in tests/test_scalar_clusters.py. That
row's four 261,120-transfer rings: 13.2 -> 7.6 s of CPU (load 8-11), the row 13.8-14.6
-> 7.8-7.9 s, the same step and op times to the bit.

Tested against the reference replay on fresh networks (tests/test_scalar_replay.py;
on binding links, tests/test_reduced_scalar.py):
every op's start, sent and done time and every link record the same double. (Inside a
workload the reference's scratch network is shared by the calls timed alone, so its
slot pool, and with it the order of simultaneous completions, depends on the calls
before; the scalar replay always starts from an empty pool.) Scope, else
:func:`replay_scalar` returns None and the caller runs the reference: no reducer with a
finite bandwidth (reductions are flows of their own), no NVLS switch or SHARP paths,
no flow over no link, link-class loads that are short dyadic numbers (weight / class
size: 8/8, 8/16, ...), no rate caps, holds or faults (a scratch network's state).
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ..algorithms.schedule import (
    PATH_DOWN,
    PATH_SHARP_DOWN,
    PATH_SHARP_UP,
    PATH_UP,
    Schedule,
    csr_gather,
    successors,
)
from ..library.protocol import Protocol
from ..network.flows import FlowNetwork
from .replay import NET_OVERHEAD_S, route_ops

# As in simulator.network.flows (_SAME_TIME, _SMALL, _MAX_COMPONENT_ROUNDS),
# simulator.network.maxmin (_TIE) and simulator.collective.replay (_FEW, the proxy wait's
# 1e-12): the reference's constants, so that its events come out the same.
_SAME_TIME = 1e-12
_SMALL = 32
_ROUNDS = 6
_TIE = 1e-12
_FEW = 16
_WAIT = 1e-12
_INF = float("inf")
#: Routes' levels kept per replay from fillings made (:meth:`_Net._recompute`), all
#: dropped when more would be kept (some 200 bytes each: at most ~50 MiB): the Llama
#: 3.1 405B FSDP GB200 row's 250,000-transfer DP all-gather makes 7,347 distinct
#: fillings of a few routes each for 121,409 events.
_FILLS = 1 << 18
#: Routes up to which the next finishes are found by a scan of every route's earliest
#: rather than from a heap (see _Net.scan): equal results, cheaper for few routes.
_SCAN_ROUTES = 128


@dataclass
class ScalarTimes:
    """What :func:`replay_scalar` found: every op's start, sent and done time (seconds from
    the start), when each rank (``0..period-1`` with a period) was done, the flows run
    and those they stand for, and the per-link records the network would hold on the
    links used (``links``, ids; with link classes, the representatives): bytes, busy
    time, last idle instant and flow-seconds (see :meth:`records`)."""

    start_s: np.ndarray
    sent_s: np.ndarray
    end_s: np.ndarray
    rank_done_s: np.ndarray
    flows: int
    represented: float
    links: np.ndarray
    link_bytes: np.ndarray
    link_busy: np.ndarray
    link_idle_at: np.ndarray
    link_flow_s: np.ndarray
    #: When each op's flow started (its start, plus any wait for its proxy).
    flow_start_s: np.ndarray | None = None
    #: With ``sent_limit``: when the replay stopped (None: it ran to its end). Times
    #: not reached by then are NaN.
    stopped_s: float | None = None

    def records(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Bytes, busy time, last idle instant and flow-seconds of links ``ids`` (0 for
        a link the replay did not use), as the network's arrays would give them."""
        ids = np.asarray(ids, dtype=np.int64)
        where = np.minimum(np.searchsorted(self.links, ids), max(len(self.links) - 1, 0))
        hit = self.links[where] == ids if len(self.links) else np.zeros(len(ids), dtype=bool)
        values = (self.link_bytes, self.link_busy, self.link_idle_at, self.link_flow_s)
        return tuple(np.where(hit, v[where], 0.0) if len(v) else np.zeros(len(ids)) for v in values)


def replay_scalar(
    network: FlowNetwork,
    schedule: Schedule,
    *,
    rank_map: np.ndarray | None = None,
    reduce_bandwidth: np.ndarray | None = None,
    protocol: Protocol | None = None,
    weight: float | None = None,
    period: int | None = None,
    link_class: np.ndarray | None = None,
    class_size: np.ndarray | None = None,
    stand_in: np.ndarray | None = None,
    sent_limit: int | None = None,
) -> ScalarTimes | None:
    """Replay ``schedule`` on ``network`` as :class:`~.replay.ScheduleReplay` does (same
    arguments; ``weight``: every op's flow stands for that many, which needs
    ``link_class`` and ``class_size``, the network's link classes), without touching the
    network's state; None outside the module's scope (the caller runs the reference).

    ``stand_in`` (per op, a route id of ``network``) replays
    :class:`~simulator.workload.reduced.StandInReplay` instead: op ``i``'s flow takes
    route ``stand_in[i]`` (its kept links, delivered after that route's latency) while
    its own route still sets the protocol's path class and step latency.

    ``sent_limit``: stop after the event in which that many flows have been sent (a
    look at the run's beginning, which is the whole run's up to then); the result's
    ``stopped_s`` says when, its times not reached are NaN and it has no records."""
    n = schedule.n_ops
    if n == 0 or (weight is not None and link_class is None):
        return None
    if np.isin(schedule.path, (PATH_UP, PATH_DOWN, PATH_SHARP_UP, PATH_SHARP_DOWN)).any():
        return None
    rank_map = np.arange(schedule.ranks) if rank_map is None else np.asarray(rank_map)
    src, dst = rank_map[schedule.src], rank_map[schedule.dst]
    if schedule.reduce.any() and reduce_bandwidth is not None:
        receivers = dst if period is None else rank_map[schedule.dst % period]
        if np.isfinite(np.asarray(reduce_bandwidth, dtype=float)[receivers[schedule.reduce]]).any():
            return None  # reductions would be flows on reducer links
    routes = route_ops(network.router, schedule, np.arange(n), src, dst)
    flow_routes = routes if stand_in is None else np.asarray(stand_in, dtype=np.int64)
    ptr, flat, _ = network.router.arrays()
    if (ptr[flow_routes + 1] == ptr[flow_routes]).any():
        return None
    if period is None:
        local_dst, local_src = dst, src
    else:
        fold = rank_map[np.arange(schedule.ranks) % period]
        local_dst, local_src = fold[schedule.dst], fold[schedule.src]
    if link_class is not None:
        links = csr_gather(ptr, flat, np.unique(flow_routes))
        coefs = float(weight or 1.0) / np.asarray(class_size, dtype=float)[links]
        if not _dyadic(coefs):
            return None  # loads whose sums may round: the order of the sums would matter
    replay = _Replay(
        network,
        schedule,
        routes,
        protocol,
        weight,
        local_dst,
        local_src,
        link_class,
        class_size,
        flow_routes,
    )
    replay.run(sent_limit)
    # The network calls back into the replay and the clock's queue holds both: cut
    # those references, so that the replay's state goes when it returns rather than at
    # the next collection (which run_steady pauses: each call's lists stayed till its end).
    replay.net.on_sent = replay.net.on_delivered = None
    replay.clock.clear()
    end = np.array(replay.end_s)
    if replay.stopped:
        empty = np.zeros(0)
        return ScalarTimes(
            np.array(replay.start_s),
            np.array(replay.sent_s),
            end,
            np.full(schedule.ranks if period is None else period, np.nan),
            replay.net.flows,
            replay.net.represented,
            empty.astype(np.int64),
            empty, empty, empty, empty,
            flow_start_s=np.array(replay.flow_start),
            stopped_s=replay.clock.now,
        )  # fmt: skip
    if np.isnan(end).any():
        return None  # a deadlock: the reference reports it
    p = schedule.ranks if period is None else period
    done = np.full(p, -np.inf)
    np.maximum.at(done, schedule.src % p, end)
    np.maximum.at(done, schedule.dst % p, end)
    done[np.isinf(done)] = 0.0  # ranks with no transfer are done at the start
    net = replay.net
    links, *records = net.link_records()
    return ScalarTimes(
        np.array(replay.start_s),
        np.array(replay.sent_s),
        end,
        done,
        net.flows,
        net.represented,
        links,
        *records,
        flow_start_s=np.array(replay.flow_start),
    )


class _Clock:
    """SimPy's queue without its events: callbacks keyed by (time, creation order)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list = []
        self._seq = 0
        self.stop = False

    def timeout(self, delay: float, action, argument) -> None:
        """Call ``action(argument)`` at ``now + delay`` (SimPy's arithmetic)."""
        heapq.heappush(self._queue, (self.now + delay, self._seq, action, argument))
        self._seq += 1

    def clear(self) -> None:
        """Drop the callbacks left."""
        self._queue = []

    def run(self) -> None:
        """Process every callback in order (until ``stop`` is set)."""
        queue = self._queue
        self.stop = False
        while queue and not self.stop:
            time, _, action, argument = heapq.heappop(queue)
            self.now = time
            action(argument)


class _Net:
    """The flow network's model and records in Python scalars (see the module
    docstring); flows carry their owner's op ids and call ``on_sent`` and, one route
    latency later, ``on_delivered``.

    Flows on one route load the same links alike, so max-min fills by route: a route's
    flows freeze together, and a link's load is the route's load times its flow count.
    That is the FlowNetwork's sum entry by entry, to the bit, because every load is a
    dyadic number of a few bits (checked by :func:`replay_scalar`): every partial sum is
    exact, whatever its order."""

    def __init__(
        self,
        network: FlowNetwork,
        clock: _Clock,
        route_links: list[list[int]],
        route_coef: list[list[float]] | None,
        route_latency: list[float],
    ) -> None:
        self.clock = clock
        # The capacity of the links the routes load (not the whole network's: a
        # 16,384-GPU cluster has a million links).
        used = sorted({link for links in route_links for link in links})
        capacity = dict(zip(used, network.capacity[used].tolist(), strict=True))
        self.capacity = capacity
        self.n_links = len(network.links)
        self.weighted = route_coef is not None
        # Per route (by index into these lists): its entries (links it loads, in order,
        # and each one's load per unit of rate: 1 unweighted, else weight / class size),
        # per link its load and number of entries, and the rate of a flow alone on it.
        self.route_links = route_links
        self.route_coef = route_coef or [[1] * len(links) for links in route_links]
        # The same entries as (link, coef) pairs, made once (not zipped per done flow).
        self.route_pairs = [
            list(zip(links, coefs, strict=True))
            for links, coefs in zip(route_links, self.route_coef, strict=True)
        ]
        self.route_load: list[dict[int, float]] = []
        self.route_entries: list[dict[int, int]] = []
        self.route_alone: list[float] = []
        for links, coefs in zip(route_links, self.route_coef, strict=True):
            load: dict[int, float] = {}
            entries: dict[int, int] = {}
            rate = _INF
            for link, coef in zip(links, coefs, strict=True):
                load[link] = load.get(link, 0) + coef
                entries[link] = entries.get(link, 0) + 1
                share = capacity[link] / coef if self.weighted else capacity[link]
                if share < rate:
                    rate = share
            self.route_load.append(load)
            self.route_entries.append(entries)
            self.route_alone.append(rate)
        self.route_latency = route_latency
        # Routes joined through shared links (each cluster's flows rated apart from the
        # others': see _component and _fill_by_cluster), and whether every two routes of
        # each cluster share a link (then a cluster's routes with flows are connected
        # whenever one is reached).
        self.cluster_of, self.cluster_routes, cliques = _clusters(self.route_entries)
        # Links crossed by the same routes, each as many times (a route's own NIC and
        # switch links; the NVLink ports a hop and a PXN hop through them share) carry
        # the same flows at every instant, so their counts, flow-seconds, busy time and
        # idle instants are the same doubles: they are kept on one link of each such
        # set and copied to the others at the end (link_records). ``route_kept``: each
        # route's entries on those links; ``route_size``: its entries in all.
        self.twins, self.route_kept = _twins(self.route_entries)
        self.route_size = [sum(entries.values()) for entries in self.route_entries]
        # (The search closes within three rounds there: below its cut-off.)
        self.cliques = cliques and _ROUNDS >= 3
        self.cluster_fills: dict[frozenset, dict[int, float]] = {}
        self.on_sent = None
        self.on_delivered = None
        # Flow slots (reused as the FlowNetwork reuses its pool).
        self.f_op: list[int] = []
        self.f_route: list[int] = []
        self.f_bytes: list[float] = []
        self.f_seq: list[int] = []  # order in the incidence (its entries are contiguous)
        # A route's flows are always rated together (every flow of a route the search
        # finds is rated again), so they share one rate and one instant it was set:
        # kept per route, with each flow's bytes left as of that instant (in
        # ``route_slots``). A flow's finish is then ``last + left / rate`` (as the
        # network computes it when it rates the flow), worked out where it is read.
        self.route_rate: list[float] = [0.0] * len(route_links)
        self.route_last: list[float] = [0.0] * len(route_links)
        # Whether a route's flows are in order of bytes left (as they joined): they
        # stay so as they carry bytes (one subtraction from all, rounded monotonely),
        # while no flow joins with fewer bytes than the last has left (a ring's chunks
        # of one size on one route do not); its flows done at an instant are then
        # its first ones, and its earliest finish its first flow's (checked as flows
        # join; a route out of order is scanned whole).
        self.route_sorted: list[bool] = [True] * len(route_links)
        # Per route with rated flows, the earliest finish of its flows, and a heap of
        # (finish, route) of every value it took: the next ends are found from it
        # instead of a scan of every flow's finish at each event (thousands of flows in flight
        # on a wide ring, a few dozen routes rated at once). An entry is current while
        # ``route_end`` still holds its value for its route; others are dropped.
        self.route_end: dict[int, float] = {}
        self.ends: list[tuple[float, int]] = []
        # With few routes a scan of ``route_end`` finds the same earliest finish and the
        # same routes within a bound as the heap, without its stale entries (a DP ring
        # of 64 routes pushes one a route an event): no heap is kept.
        self.scan = len(route_links) <= _SCAN_ROUTES
        self.free: list[list[int]] = []
        self.top = 0
        # Incidence: per link its entry count; per route its flows' slots in the order
        # they joined and, beside them, each one's bytes left as of ``route_last``, and
        # per link the routes with flows on it (flows on one route cross the same links,
        # so the search for connected flows can go by route: see _component). Two
        # parallel lists, not a dict of slot -> bytes: bringing a route up to date is
        # then a list comprehension (no hashing, no dict built per route per event:
        # 626,000 of them on the Llama 3.1 405B FSDP GB200 row), same order, same values.
        self.link_n: dict[int, int] = {}
        self.route_slots: list[list[int]] = [[] for _ in route_links]
        self.route_left: list[list[float]] = [[] for _ in route_links]
        self.link_routes: dict[int, dict[int, None]] = {}
        self.active: dict[int, None] = {}  # the routes with flows
        self.entries = 0
        self.seq = 0
        self.pending: list[list[int]] = []
        self.settle_scheduled = False
        self.in_wake = False
        self.generation = 0
        self.flows = 0
        self.represented = 0.0
        # Records (link id -> value; absent: 0), bytes per link from the done flows'
        # routes and sizes in the order they were done (see link_bytes).
        self.done_routes = array("q")
        self.done_bytes = array("d")
        self.link_busy: dict[int, float] = {}
        self.link_idle_at: dict[int, float] = {}
        self.link_flow_s: dict[int, float] = {}
        self.changed: dict[int, float] = {}
        self.since: dict[int, float] = {}
        # Each route's level by the flows per route filled (see _recompute), and how
        # many routes' levels that holds.
        self.fills: dict[frozenset, dict[int, float]] = {}
        self.filled = 0

    @property
    def link_bytes(self) -> dict[int, float]:
        """Bytes per link (link id -> bytes; absent: 0): each done flow's bytes (times
        its load per link with link classes) added entry by entry in incidence order,
        flow after flow in the order they were done, as the network adds them. The
        same sums in the same order, made at the end: per link, numpy's running sum
        (``np.cumsum`` adds one after another) over its entries in that order."""
        if not self.done_routes:
            return {}
        routes = np.frombuffer(self.done_routes, dtype=np.int64)
        sizes = np.frombuffer(self.done_bytes, dtype=float)
        order = np.argsort(routes, kind="stable")
        bounds = np.searchsorted(routes[order], np.arange(len(self.route_pairs) + 1))
        # Per link, the (route, entry index, load) of its entries; then its additions
        # ordered by (position in the log, entry index), one link at a time.
        crossing: dict[int, list[tuple[int, int, float]]] = {}
        for route, pairs in enumerate(self.route_pairs):
            if bounds[route + 1] > bounds[route]:
                for entry, (link, coef) in enumerate(pairs):
                    crossing.setdefault(link, []).append((route, entry, coef))
        width = max(len(pairs) for pairs in self.route_pairs)
        totals: dict[int, float] = {}
        for link, entries in crossing.items():
            positions, values = [], []
            for route, entry, coef in entries:
                where = order[bounds[route] : bounds[route + 1]]
                positions.append(where * width + entry)
                values.append(sizes[where] * coef if self.weighted else sizes[where])
            position, value = np.concatenate(positions), np.concatenate(values)
            totals[link] = float(np.cumsum(value[np.argsort(position, kind="stable")])[-1])
        return totals

    def link_records(self) -> tuple[np.ndarray, ...]:
        """The links used (ids, in order) and their bytes, busy time, last idle instant
        and flow-seconds (each twin its kept link's: see ``twins``)."""
        twins = self.twins
        links = sorted(link for kept in self.link_n for link in twins[kept])
        kept = {link: top for top, group in twins.items() for link in group}
        of = [kept[link] for link in links]
        nbytes = self.link_bytes
        records = [np.array([nbytes.get(link, 0.0) for link in links], dtype=float)]
        for values in (self.link_busy, self.link_idle_at, self.link_flow_s):
            records.append(np.array([values.get(top, 0.0) for top in of], dtype=float))
        return (np.array(links, dtype=np.int64), *records)

    # -- flows --------------------------------------------------------------------------
    def _take(self, count: int) -> list[int]:
        taken: list[int] = []
        while count and self.free:
            block = self.free.pop()
            use, rest = block[:count], block[count:]
            if rest:
                self.free.append(rest)
            taken += use
            count -= len(use)
        if count:
            grow = self.top + count - len(self.f_op)
            if grow > 0:
                for values, fill in (
                    (self.f_op, -1),
                    (self.f_route, -1),
                    (self.f_bytes, 0.0),
                    (self.f_seq, 0),
                ):
                    values.extend([fill] * grow)
            taken += range(self.top, self.top + count)
            self.top += count
        return taken

    def add_flows(self, ops: list[int], routes: list[int], nbytes: list[float], weight) -> None:
        """FlowNetwork.add_flows: one flow per op from now."""
        slots = self._take(len(ops))
        f_op, f_route, f_bytes = self.f_op, self.f_route, self.f_bytes
        for slot, op, route, size in zip(slots, ops, routes, nbytes, strict=True):
            f_op[slot] = op
            f_route[slot] = route
            f_bytes[slot] = size
        self.flows += len(ops)
        self.represented += len(ops) if weight is None else weight * len(ops)
        self.pending.append(slots)
        if not self.settle_scheduled and not self.in_wake:
            self.settle_scheduled = True
            self.clock.timeout(0.0, self._settle_event, None)

    def _settle_event(self, _argument) -> None:
        self.settle_scheduled = False
        self._settle([])

    def _change(self, gone: dict[int, int], joined: dict[int, int], now: float) -> None:
        """FlowNetwork._count_link_flows for the entries of the flows leaving, then of
        those joining, at ``now`` (``gone`` and ``joined``: their count per route):
        flow-seconds, busy time and idle instants.

        One pass over the links for both (the network makes two): on a link both touch,
        the second pass adds its count times ``now - now``, +0.0, to flow-seconds that
        are never -0.0, which changes no bit; busy time still closes (leaving ones
        first) and opens (joining ones) at ``now`` where the count passes through 0.
        Counts are integers, so grouping by route changes none."""
        route_kept, route_size = self.route_kept, self.route_size
        minus: dict[int, int] = {}
        for route, flows in gone.items():
            for link, count in route_kept[route].items():
                minus[link] = minus.get(link, 0) + flows * count
        link_n, flow_s, changed = self.link_n, self.link_flow_s, self.changed
        since, busy, idle_at = self.since, self.link_busy, self.link_idle_at
        if not joined:
            # (The loop below with nothing joining: every link here loses flows.)
            for link, down in minus.items():
                before = link_n[link]
                flow_s[link] = flow_s.get(link, 0.0) + before * (now - changed.get(link, 0.0))
                changed[link] = now
                after = before - down
                if after == 0:
                    busy[link] = busy.get(link, 0.0) + (now - since[link])
                    idle_at[link] = now
                link_n[link] = after
            self.entries -= sum(flows * route_size[route] for route, flows in gone.items())
            return
        if gone == joined:
            # As many flows join each route as leave it (a ring's next chunk on the
            # route of the one done): every count is back where it was, and a link
            # whose count passes through 0 closes its busy time and opens the next.
            for link, down in minus.items():
                before = link_n[link]
                flow_s[link] = flow_s.get(link, 0.0) + before * (now - changed.get(link, 0.0))
                changed[link] = now
                if before == down:
                    busy[link] = busy.get(link, 0.0) + (now - since[link])
                    idle_at[link] = now
                    since[link] = now
            return
        plus: dict[int, int] = {}
        for route, flows in joined.items():
            for link, count in route_kept[route].items():
                plus[link] = plus.get(link, 0) + flows * count
        for link in minus.keys() | plus.keys() if minus and plus else minus or plus:
            before = link_n.get(link, 0)
            # Flow-seconds: the count so far times the time since it last changed.
            flow_s[link] = flow_s.get(link, 0.0) + before * (now - changed.get(link, 0.0))
            changed[link] = now
            down = minus.get(link, 0)
            after = before - down
            if down and after == 0:
                busy[link] = busy.get(link, 0.0) + (now - since[link])
                idle_at[link] = now
            up = plus.get(link, 0)
            if up and after == 0:
                since[link] = now
            link_n[link] = after + up
        self.entries += sum(flows * route_size[route] for route, flows in joined.items())
        self.entries -= sum(flows * route_size[route] for route, flows in gone.items())

    def _settle(self, finished: list[int], first: dict[int, int] | None = None) -> None:
        """FlowNetwork._settle: drop ``finished``, take in pending flows, rate them.
        ``first``: routes whose finished flows are their first ones, and how many
        (the others' are found slot by slot)."""
        now = self.clock.now
        new = [slot for slots in self.pending for slot in slots]
        self.pending = []
        f_route, route_slots, link_routes = self.f_route, self.route_slots, self.link_routes
        route_left, route_entries = self.route_left, self.route_kept
        gone: dict[int, int] = {}
        if finished:
            dead: dict[int, set[int]] = {}
            if first:
                for route, count in first.items():
                    if count:
                        gone[route] = count
                        route_slots[route] = route_slots[route][count:]
                        route_left[route] = route_left[route][count:]
            for slot in finished:
                route = f_route[slot]
                if first and route in first:
                    continue
                if route in dead:
                    dead[route].add(slot)
                else:
                    dead[route] = {slot}
            for route, slots in dead.items():
                count = gone[route] = len(slots)
                keys = route_slots[route]
                if count == len(keys):
                    route_slots[route] = []
                    route_left[route] = []
                elif all(slot in slots for slot in keys[:count]):
                    # (The route's first flows: the usual case, see route_sorted.)
                    route_slots[route] = keys[count:]
                    route_left[route] = route_left[route][count:]
                else:
                    keep = [i for i, slot in enumerate(keys) if slot not in slots]
                    route_slots[route] = [keys[i] for i in keep]
                    lefts = route_left[route]
                    route_left[route] = [lefts[i] for i in keep]
            for route in gone:
                if not route_slots[route]:
                    del self.active[route]
                    for link in route_entries[route]:
                        del link_routes[link][route]
        joined: dict[int, int] = {}
        if new:
            f_seq, seq = self.f_seq, self.seq
            for slot in new:
                f_seq[slot] = seq
                seq += 1
                route = f_route[slot]
                joined[route] = joined.get(route, 0) + 1
            self.seq = seq
            # A route's flows brought up to now before flows join it (they have
            # carried nothing yet): the route is rated again below (its new flows
            # share links with the others), which would bring the others up to now
            # from the same instant at the same rate. (A route without flows starts
            # from now.)
            route_sorted = self.route_sorted
            for route in joined:
                if route_slots[route]:
                    self._advance(route, now)
                else:
                    self.route_last[route] = now
                    route_sorted[route] = True
            f_bytes = self.f_bytes
            for slot in new:
                route = f_route[slot]
                lefts, size = route_left[route], f_bytes[slot]
                if lefts and route_sorted[route] and size < lefts[-1]:
                    route_sorted[route] = False
                route_slots[route].append(slot)
                lefts.append(size)
            for route in joined:
                self.active[route] = None
                for link in route_entries[route]:
                    link_routes.setdefault(link, {})[route] = None
        self._change(gone, joined, now)
        if self.cliques:
            self._settle_cliques(gone, new, now)
            return
        # The links the finished flows leave that still carry flows (the new ones
        # counted, as the FlowNetwork counts them before it looks).
        seeds: set[int] = set()
        link_n = self.link_n
        for route in gone:
            seeds.update(link for link in route_entries[route] if link_n[link])
        if new:
            new = self._rate_alone(new, now)
            for route in {f_route[slot] for slot in new}:
                seeds.update(route_entries[route])
        if seeds:
            # (The crowded new flows' routes are among those found: their links seed.)
            self._recompute(self._component(seeds), now)
        self._schedule_wake()

    def _settle_cliques(self, gone: dict[int, int], new: list[int], now: float) -> None:
        """The end of :meth:`_settle` where every cluster is a clique: the routes the
        search would find from its seeds are those with flows of the clusters a seed
        link is in (see :meth:`_clique_component`), and a link carries flows exactly
        when a route with flows crosses it, so the clusters are found without the
        seeds: a finished route's where one of its links still carries flows, a
        crowded new flow's."""
        link_n, route_entries, cluster_of = self.link_n, self.route_kept, self.cluster_of
        touched = set()
        for route in gone:
            cluster = cluster_of[route]
            if cluster in touched:
                continue
            for link in route_entries[route]:
                if link_n[link]:
                    touched.add(cluster)
                    break
        if new:
            f_route = self.f_route
            for slot in self._rate_alone(new, now):
                touched.add(cluster_of[f_route[slot]])
        if touched:
            self._recompute(self._routes_with_flows(touched), now)
        self._schedule_wake()

    def _rate_alone(self, new: list[int], now: float) -> list[int]:
        """Rate the new flows alone on every link (one entry on each) at their slowest
        link's share; the others are returned."""
        crowded = []
        link_n, f_route, route_entries = self.link_n, self.f_route, self.route_kept
        for slot in new:
            route = f_route[slot]
            shared = False  # (a loop, not any() over a generator: once per new flow)
            for link in route_entries[route]:
                if link_n[link] != 1:
                    shared = True
                    break
            if shared:
                crowded.append(slot)
                continue
            # (One entry on every link: the route's only flow.)
            rate = self.route_alone[route]
            self.route_rate[route] = rate
            self.route_last[route] = now
            left = self.route_left[route][self.route_slots[route].index(slot)]
            end = now + (left / rate if left > 0 else 0.0)
            if route not in self.route_end or end < self.route_end[route]:
                self._set_route_end(route, end)
        return crowded

    def _component(self, seeds: set[int]) -> set[int] | dict[int, None]:
        """The routes of the flows connected to ``seeds`` through shared links, as the
        FlowNetwork's search finds the flows (every flow when it has not closed in six
        rounds, unless the incidence is small against the network: its plain-Python
        branch goes on).

        It searches routes, not flows: a round reaches a flow exactly when it reaches
        the flow's route (the flows of a route are on the same links), so the rounds,
        and with them the cut-off, are the flow search's, and the flows found are
        every flow of the routes found."""
        if self.entries == 0:
            return set()
        if self.cliques:
            return self._clique_component(seeds)
        cut_off = 8 * self.entries > self.n_links or self.entries > _SMALL
        link_routes, route_entries = self.link_routes, self.route_kept
        reached = set(seeds)
        frontier = reached
        found: set[int] = set()
        rounds = 0
        while True:
            rounds += 1
            if cut_off and rounds > _ROUNDS:
                return self.active
            fresh = set()
            for link in frontier:
                routes = link_routes.get(link)
                if routes:
                    fresh.update(routes)
            fresh -= found
            found |= fresh
            grown = set()
            for route in fresh:
                grown.update(route_entries[route])
            frontier = grown - reached
            if not frontier:
                return found
            reached |= frontier

    def _clique_component(self, seeds: set[int]) -> set[int]:
        """:meth:`_component` where every cluster's routes pairwise share a link: the
        routes with flows of each cluster with one on a seed link. (The search reaches
        such a route in its first round and every other route of the cluster with
        flows in its second, since they share a link with it; it finds nothing new in
        its third, so it closes before its cut-off and finds just these.)"""
        link_routes, cluster_of = self.link_routes, self.cluster_of
        touched = set()
        for link in seeds:
            routes = link_routes.get(link)
            if routes:
                # (The routes on one link are of one cluster.)
                touched.add(cluster_of[next(iter(routes))])
        return self._routes_with_flows(touched)

    def _routes_with_flows(self, touched: set[int]) -> set[int]:
        """The routes of the ``touched`` clusters that carry flows (whose rates a change
        in those clusters may move)."""
        route_slots, cluster_routes = self.route_slots, self.cluster_routes
        found = set()
        for cluster in touched:
            for route in cluster_routes[cluster]:
                if route_slots[route]:
                    found.add(route)
        return found

    def _fill_by_cluster(self, groups: dict[int, int]) -> dict[int, float] | None:
        """Each route's level as :meth:`_fill` over ``groups`` would give it, from each
        cluster's own filling (made once per cluster and flows per route), or None
        where two different levels are within the filling's tie (1e-12 relative).

        Why that is exact: a round's level is the least share over every link, and its
        bottlenecks are the links within the tie of it; links of different clusters
        share no route, so a round changes only its own cluster's links. A cluster's
        next round level is its least share, so the rounds of the whole filling are
        each cluster's rounds in order of level, unless a cluster's next level lies
        within the tie above another's (it would freeze at the lesser one): ruled out
        by the check. Equal levels are the same round in either."""
        cluster_of, fills = self.cluster_of, self.cluster_fills
        parts: dict[int, dict[int, int]] = {}
        for route, flows in groups.items():
            cluster = cluster_of[route]
            part = parts.get(cluster)
            if part is None:
                parts[cluster] = {route: flows}
            else:
                part[route] = flows
        levels: dict[int, float] = {}
        values: set[float] = set()
        for part in parts.values():
            key = frozenset(part.items())
            level_of = fills.get(key)
            if level_of is None:
                level_of = dict.fromkeys(part, _INF)
                self._fill(part, level_of)
                if len(fills) >= _FILLS:
                    fills.clear()
                fills[key] = level_of
            levels.update(level_of)
            values.update(level_of.values())
        if len(values) > 1:
            ordered = sorted(values)
            tie = 1 + _TIE
            for lower, upper in pairwise(ordered):
                if upper <= lower * tie:
                    return None
        return {route: levels[route] for route in groups}

    def _recompute(self, routes, now: float) -> None:
        """FlowNetwork._recompute on every flow of ``routes``: bytes left brought up to
        now, max-min rates by progressive filling (maxmin's arithmetic, by route: see
        the class docstring), finish times. (Each flow's values are its own, so the
        order the flows are visited in changes none.)"""
        route_slots = self.route_slots
        groups = {route: len(route_slots[route]) for route in routes}
        # The filling is a function of the flows per route alone (the loads and
        # capacities are fixed, and its sums are exact whatever the routes' order: see
        # _fill), and a ring's events meet the same few again and again (the next
        # chunk on the route of the one done): each is filled once.
        key = frozenset(groups.items())
        level_of = self.fills.get(key)
        if level_of is None:
            level_of = self._fill_by_cluster(groups) if len(self.cluster_routes) > 1 else None
            if level_of is None:
                level_of = dict.fromkeys(groups, _INF)
                self._fill(groups, level_of)
            if self.filled + len(groups) > _FILLS:
                self.fills.clear()
                self.filled = 0
            self.fills[key] = level_of
            self.filled += len(groups)
        # The filling reads no flow's bytes: then every flow's bytes left brought up to
        # now at the rate it had, and the route's new rate. Each flow's finish, ``now +
        # left / value`` (``now`` for none left), rises with its bytes left (rounding is
        # monotone), so the route's earliest is that of its least bytes left.
        # (_advance and _set_route_end written out: this loop runs for 3.7 million routes
        # on the MLPerf Llama 3.1 8B GB200 row, some 60 per event, and the calls were a
        # tenth of its replay. Keep the arithmetic in step with _advance.)
        route_rate, route_last, route_left = self.route_rate, self.route_last, self.route_left
        route_sorted, route_end, ends = self.route_sorted, self.route_end, self.ends
        scan = self.scan
        for route in groups:
            value = level_of[route]
            lefts = route_left[route]
            rate = route_rate[route]
            elapsed = now - route_last[route]
            if elapsed > 0 and rate > 0:
                carried = rate * elapsed
                lefts = [left - carried for left in lefts]
                if (lefts[0] if route_sorted[route] else min(lefts)) < 0.0:
                    lefts = [left if left > 0.0 else 0.0 for left in lefts]
                route_left[route] = lefts
            route_rate[route] = value
            route_last[route] = now
            if not lefts:
                least = _INF
            elif route_sorted[route]:
                least = lefts[0]
            else:
                least = min(lefts)
            end = now + (least / value if least > 0 else 0.0)
            if route_end.get(route) != end:
                route_end[route] = end
                if not scan:
                    heapq.heappush(ends, (end, route))
        if not scan:
            self._compact_ends()

    def _advance(self, route: int, now: float) -> None:
        """Bring the bytes left of ``route``'s flows up to ``now`` at their rate, as the
        network does flow by flow (``left - rate * elapsed``, at least 0; nothing for
        no time or no rate)."""
        rate = self.route_rate[route]
        elapsed = now - self.route_last[route]
        if elapsed > 0 and rate > 0:
            carried = rate * elapsed
            moved = [left - carried for left in self.route_left[route]]
            if (moved[0] if self.route_sorted[route] else min(moved)) < 0.0:
                moved = [left if left > 0.0 else 0.0 for left in moved]
            self.route_left[route] = moved
        self.route_last[route] = now

    def _fill(self, groups: dict[int, int], level_of: dict[int, float]) -> None:
        """Progressive filling of ``groups`` (route -> its flow count): each route's
        level in ``level_of`` (left at infinity if no link bounds it).

        Each round, every link with routes still unfrozen has the share its capacity
        left gives them (capacity left / their load, at least 0); the least share is the
        round's level, the links within a relative 1e-12 of it are its bottlenecks, and
        the routes crossing a bottleneck freeze at that level, taking their load times
        the level off each of their links. Maxmin's rounds, to the same doubles, kept
        incrementally: a round changes the capacity left and the load only on the links
        of the routes it freezes, so only those links' shares are computed again (a
        heap holds every link's current share) and each route's links are visited twice
        (counted in, taken off), not once a round. A link's load is a sum of route loads
        times flow counts, exact whatever its order (the loads are short dyadic
        numbers, checked by :func:`replay_scalar`), so taking the frozen routes' loads
        off leaves exactly the sum over the routes still unfrozen that a round recounts;
        the capacity left takes off each round's total per link, as the rounds do."""
        route_load, capacity = self.route_load, self.capacity
        remaining: dict[int, float] = {}
        count: dict[int, float] = {}
        users: dict[int, list[int]] = {}
        for route, flows in groups.items():
            for link, load in route_load[route].items():
                if link in count:
                    count[link] += flows * load
                    users[link].append(route)
                else:
                    remaining[link] = capacity[link]
                    count[link] = flows * load
                    users[link] = [route]
        share: dict[int, float] = {}
        heap = []
        for link, total in count.items():
            if total > 0:
                left = remaining[link]
                value = share[link] = (left if left > 0.0 else 0.0) / total
                heap.append((value, link))
        heapq.heapify(heap)
        tie = 1 + _TIE
        frozen: set[int] = set()
        while heap:
            # The least current share (an entry is current while ``share`` holds it).
            level, link = heap[0]
            if share.get(link) != level:
                heapq.heappop(heap)
                continue
            bound = level * tie
            taken: dict[int, float] = {}
            while heap and heap[0][0] <= bound:
                value, link = heapq.heappop(heap)
                if share.get(link) != value:
                    continue
                for route in users[link]:
                    if route in frozen:
                        continue
                    frozen.add(route)
                    level_of[route] = level
                    flows = groups[route]
                    for other, load in route_load[route].items():
                        taken[other] = taken.get(other, 0) + flows * load
            for other, total in taken.items():
                remaining[other] -= total * level
                rest = count[other] - total
                count[other] = rest
                if rest > 0:
                    left = remaining[other]
                    value = share[other] = (left if left > 0.0 else 0.0) / rest
                    heapq.heappush(heap, (value, other))
                else:
                    share.pop(other, None)

    def _set_route_end(self, route: int, end: float) -> None:
        """Note ``end`` as the earliest finish of ``route``'s flows."""
        if self.route_end.get(route) == end:
            return
        self.route_end[route] = end
        if not self.scan:
            heapq.heappush(self.ends, (end, route))
            self._compact_ends()

    def _compact_ends(self) -> None:
        """Drop the heap of finishes' stale entries when they are most of it. (Which
        entries it holds beyond the current ones changes no event: every reader skips an
        entry ``route_end`` no longer holds, and a route's repeated current value only
        finds the route twice.)"""
        if len(self.ends) > 4 * len(self.route_end) + 1024:
            # Mostly entries no longer current: rebuilt from the current ones.
            self.ends = [(value, r) for r, value in self.route_end.items()]
            heapq.heapify(self.ends)

    def _schedule_wake(self) -> None:
        self.generation += 1
        if not self.route_end:
            return  # (no flow rated)
        # min(finish.values()): the first current entry.
        ends, route_end = self.ends, self.route_end
        if self.scan:
            target = min(route_end.values())
        else:
            while route_end.get(ends[0][1]) != ends[0][0]:
                heapq.heappop(ends)
            target = ends[0][0]
        if target == _INF:
            return
        now = self.clock.now
        self.clock.timeout(max(target - now, 0.0), self._wake, (self.generation, target))

    def _wake(self, argument: tuple[int, float]) -> None:
        generation, target = argument
        if generation != self.generation:
            return
        bound = target + _SAME_TIME * abs(target)
        # The slots whose finish is within ``bound``: on the routes whose earliest
        # finish is (every current entry up to it).
        ends, route_end = self.ends, self.route_end
        route_slots, route_rate, route_last = self.route_slots, self.route_rate, self.route_last
        route_left = self.route_left
        if self.scan:
            routes = [route for route, end in route_end.items() if end <= bound]
        else:
            routes = set()
            while ends and ends[0][0] <= bound:
                end, route = heapq.heappop(ends)
                if route_end.get(route) == end:
                    routes.add(route)
        done: list[int] = []
        # Per route, the least bytes left of its flows that go on (None: none do).
        rest: dict[int, float | None] = {}
        # Per route in order of bytes left, how many of its first flows are done.
        first: dict[int, int] = {}
        route_sorted = self.route_sorted
        for route in routes:
            rate, last = route_rate[route], route_last[route]
            least = None
            if route_sorted[route]:
                # Done flows first (a finish rises with bytes left): up to the first
                # that goes on, the least of those that do.
                count = len(done)
                for slot, left in zip(route_slots[route], route_left[route], strict=True):
                    if last + (left / rate if left > 0 else 0.0) <= bound:
                        done.append(slot)
                    else:
                        least = left
                        break
                first[route] = len(done) - count
            else:
                for slot, left in zip(route_slots[route], route_left[route], strict=True):
                    if last + (left / rate if left > 0 else 0.0) <= bound:
                        done.append(slot)
                    elif least is None or left < least:
                        least = left
            rest[route] = least
        done.sort()
        # Bytes per link, entry by entry in incidence order.
        f_route, f_bytes, f_op = self.f_route, self.f_bytes, self.f_op
        # (Logged in that order and summed at the end: see :meth:`link_bytes`.)
        in_order = sorted(done, key=self.f_seq.__getitem__) if len(done) > 1 else done
        self.done_routes.extend([f_route[slot] for slot in in_order])
        self.done_bytes.extend([f_bytes[slot] for slot in in_order])
        ops = [f_op[slot] for slot in done]
        route_latency = self.route_latency
        delays = [route_latency[f_route[slot]] for slot in done]
        for slot in done:
            f_op[slot] = -1
        for route, least in rest.items():
            # The earliest finish of the route's flows that go on (of their least
            # bytes left: see _recompute).
            if least is not None:
                route_end[route] = _INF  # (never current: the value below is pushed)
                rate = route_rate[route]
                self._set_route_end(route, route_last[route] + (least / rate if least > 0 else 0.0))
            else:
                del route_end[route]
        self.in_wake = True
        try:
            self.on_sent(ops)
            _deliver_later(self.clock, self.on_delivered, ops, delays)
        finally:
            self.in_wake = False
        self._settle(done, first)
        self.free.append(done)


def _deliver_later(clock: _Clock, action, ops: list[int], delays: list[float]) -> None:
    """FlowNetwork._deliver_later: one timeout per distinct delay (sorted), its ops in
    the order given."""
    if len(ops) == 1 or min(delays) == max(delays):
        clock.timeout(delays[0], action, ops)
        return
    for value in sorted(set(delays)):
        clock.timeout(value, action, [op for op, d in zip(ops, delays, strict=True) if d == value])


def _proxy_queue(free: dict, ranks: list[int], busy: list[float], now: float) -> list[float]:
    """:func:`~.replay.proxy_queue` on Python floats, each of its two branches' sums."""
    if len(ranks) <= _FEW:
        result = []
        for rank, value in zip(ranks, busy, strict=True):
            done = max(now, free.get(rank, 0.0)) + value
            free[rank] = done
            result.append(done)
        return result
    order = sorted(range(len(ranks)), key=ranks.__getitem__)  # stable
    result = [0.0] * len(ranks)
    running = 0.0
    previous = None
    start = before = 0.0
    for index in order:
        rank = ranks[index]
        if rank != previous:
            start = max(now, free.get(rank, 0.0))
            before = running
            previous = rank
        running += busy[index]
        done = start + running - before
        result[index] = done
        free[rank] = done
    return result


class _Replay:
    """:class:`~.replay.ScheduleReplay`'s launch, proxy, delivery and release steps on a
    :class:`_Net` (see the module docstring)."""

    def __init__(
        self,
        network: FlowNetwork,
        schedule: Schedule,
        routes: np.ndarray,
        protocol: Protocol | None,
        weight: float | None,
        local_dst: np.ndarray,
        local_src: np.ndarray,
        link_class: np.ndarray | None,
        class_size: np.ndarray | None,
        flow_routes: np.ndarray,
    ) -> None:
        n = schedule.n_ops
        self.clock = _Clock()
        ptr, flat, latency = network.router.arrays()
        # The distinct routes the flows take, renumbered 0..m-1 for the network's
        # per-route lists (the ops' own routes but with stand-ins).
        flow_unique, flow_inverse = _unique_ints(flow_routes)
        self.route = flow_inverse.tolist()
        route_links, route_coef = [], None if link_class is None else []
        for r in flow_unique.tolist():
            links = flat[ptr[r] : ptr[r + 1]]
            if link_class is None:
                route_links.append(links.tolist())
            else:
                # Each copy loads one link of a class: weight / |class| per link crossed.
                route_links.append(link_class[links].tolist())
                route_coef.append((float(weight or 1.0) / class_size[links]).tolist())
        self.net = _Net(network, self.clock, route_links, route_coef, latency[flow_unique].tolist())
        self.net.on_sent = self.on_sent
        self.net.on_delivered = self.on_delivered
        self.weight = weight
        self.protocol = protocol
        self.channel_steps, self.channel_scale = schedule.channel_span()
        self.nbytes = _shared(schedule.nbytes)
        wire = schedule.nbytes if protocol is None else schedule.nbytes / protocol.bandwidth
        self.wire = _shared(wire)
        self.local_dst = _shared(local_dst)
        self.local_src = _shared(local_src)
        self.proxy_free: dict[int, float] = {}
        if protocol is not None:
            # The protocol's path classes and latencies follow the ops' own routes.
            if flow_routes is routes:
                unique, inverse = flow_unique, flow_inverse
            else:
                unique, inverse = _unique_ints(routes)
            classes = network.route_classes(unique)
            overhead = 0.0
            if "network" in classes and protocol.net_floor:
                overhead = NET_OVERHEAD_S * (3 if protocol.name == "Simple" else 1)
            # Per distinct route, then one object a route handed to its ops (the same
            # values as per op, without np.unique's sort of every op's value: a 261,120-op
            # DP ring's routes are 64).
            hops = np.array([protocol.hop_s[cls] for cls in classes], dtype=float)
            wanted = np.maximum(hops, overhead)
            by_route = inverse.tolist()
            self.crosses = _by_route([cls == "network" for cls in classes], by_route)
            self.extra = _by_route(np.maximum(wanted - latency[unique], 0.0).tolist(), by_route)
            self.hop = _by_route(wanted.tolist(), by_route)
            messages = np.maximum(1.0, np.ceil(schedule.nbytes / protocol.message_bytes))
            self.busy = _shared(messages * protocol.proxy_s)
        (done_ptr, done_idx), (sent_ptr, sent_idx) = successors(schedule)
        # CSR in machine ints (8 bytes an entry, not a Python list and int per op), and
        # where no op has more than one successor (a ring's), each op's (-1: none).
        self.done_succ = _successors(done_ptr, done_idx)
        self.sent_succ = _successors(sent_ptr, sent_idx)
        self.pending = np.diff(schedule.dep_ptr).tolist()
        nan = float("nan")
        self.start_s = [nan] * n
        self.sent_s = [nan] * n
        self.end_s = [nan] * n
        self.flow_start = [nan] * n
        self.sent_left: int | None = None
        self.stopped = False

    def run(self, sent_limit: int | None = None) -> None:
        """Launch the ops without dependencies at 0 and run every event (or until
        ``sent_limit`` flows have been sent)."""
        self.sent_left = sent_limit
        self._launch([op for op, count in enumerate(self.pending) if count == 0])
        self.clock.run()

    def _launch(self, ops: list[int]) -> None:
        if not ops:
            return
        now = self.clock.now
        start_s = self.start_s
        for op in ops:
            start_s[op] = now
        proto = self.protocol
        if proto is not None and proto.proxy_s > 0:
            crosses = self.crosses
            crossing = [op for op in ops if crosses[op]]
            if crossing:
                self._send([op for op in ops if not crosses[op]])
                ready = _proxy_queue(
                    self.proxy_free,
                    [self.local_src[op] for op in crossing],
                    [self.busy[op] for op in crossing],
                    now,
                )
                self._at(self._proxy_wait(ready, now), self._send, crossing)
                return
        self._send(ops)

    def _proxy_wait(self, ready: list[float], now: float) -> list[float]:
        proxy = self.protocol.proxy_s
        waits = []
        for value in ready:
            wait = value - now - proxy
            waits.append(wait if wait > _WAIT else 0.0)
        return waits

    def _send(self, ops: list[int]) -> None:
        if ops:
            now = self.clock.now
            flow_start, route, wire = self.flow_start, self.route, self.wire
            for op in ops:
                flow_start[op] = now
            self.net.add_flows(
                ops, [route[op] for op in ops], [wire[op] for op in ops], self.weight
            )

    def _at(self, delays: list[float], action, ops: list[int]) -> None:
        """ScheduleReplay._at: ``action`` on the ops of equal delays, after that delay
        (at once for none)."""
        clock = self.clock
        if len(delays) == 1:
            if delays[0] <= 0.0:
                action(ops)
            else:
                clock.timeout(delays[0], action, ops)
            return
        delays = [d if d > 0.0 else 0.0 for d in delays]
        values = [delays[0]] if min(delays) == max(delays) else sorted(set(delays))
        for value in values:
            if len(values) == 1:
                pick = ops
            else:
                pick = [op for op, delay in zip(ops, delays, strict=True) if delay == value]
            if value == 0.0:
                action(pick)
            else:
                clock.timeout(value, action, pick)

    def on_sent(self, ops: list[int]) -> None:
        now = self.clock.now
        sent_s = self.sent_s
        for op in ops:
            sent_s[op] = now
        if self.sent_left is not None:
            self.sent_left -= len(ops)
            if self.sent_left <= 0:
                self.stopped = self.clock.stop = True
        self._release(ops, self.sent_succ)

    def on_delivered(self, ops: list[int]) -> None:
        proto = self.protocol
        if proto is None:
            self._complete(ops)
            return
        now = self.clock.now
        extra = self.extra
        delay = [extra[op] for op in ops]
        channel_rate = proto.channel_rate
        if channel_rate != _INF:
            # As ScheduleReplay.on_delivered: Schedule.channel_span's steps and rate.
            steps, rate = self.channel_steps, channel_rate * self.channel_scale
            flow_start, hop, nbytes = self.flow_start, self.hop, self.nbytes
            for j, op in enumerate(ops):
                copied = flow_start[op] + hop[op] * steps
                copied += nbytes[op] / rate
                if copied - now > delay[j]:
                    delay[j] = copied - now
        if proto.proxy_s > 0:
            network = [j for j, op in enumerate(ops) if self.crosses[op]]
            if network:
                ready = _proxy_queue(
                    self.proxy_free,
                    [self.local_dst[ops[j]] for j in network],
                    [self.busy[ops[j]] for j in network],
                    now,
                )
                if proto.name == "Simple":
                    for j, wait in zip(network, self._proxy_wait(ready, now), strict=True):
                        if wait > delay[j]:
                            delay[j] = wait
        if not any(delay):
            self._complete(ops)
            return
        self._at(delay, self._complete, ops)

    def _complete(self, ops: list[int]) -> None:
        if not ops:
            return
        now = self.clock.now
        end_s = self.end_s
        for op in ops:
            end_s[op] = now
        self._release(ops, self.done_succ)

    def _release(self, ops: list[int], csr: tuple[array, array, array | None]) -> None:
        ptr, idx, single = csr
        if single is not None:
            # (The same successors met in the same order, each made ready when its
            # count reaches 0; sorted as below.)
            pending = self.pending
            ready = []
            for op in ops:
                s = single[op]
                if s >= 0:
                    count = pending[s] - 1
                    pending[s] = count
                    if not count:
                        ready.append(s)
            if len(ready) > 1:
                ready.sort()
            self._launch(ready)
            return
        if len(ops) == 1:
            succ = idx[ptr[ops[0]] : ptr[ops[0] + 1]].tolist()
        else:
            succ = []
            for op in ops:
                succ += idx[ptr[op] : ptr[op + 1]].tolist()
        if not succ:
            return
        pending = self.pending
        for s in succ:
            pending[s] -= 1
        ready = [s for s in succ if pending[s] == 0]
        if len(ready) > 1:
            ready = sorted(set(ready))
        self._launch(ready)


def _dyadic(values: np.ndarray) -> bool:
    """Whether every value is a multiple of 2**-20 below 2**20: sums of thousands of
    them are then exact in doubles, whatever their order."""
    scaled = np.asarray(values, dtype=float) * 2.0**20
    return bool(np.all((scaled == np.floor(scaled)) & (np.abs(values) < 2.0**20)))


def _twins(
    route_entries: list[dict[int, int]],
) -> tuple[dict[int, list[int]], list[dict[int, int]]]:
    """Links crossed by the same routes each as many times, grouped under the first
    of them (kept link -> its group, itself first), and each route's entries on the
    kept links."""
    crossing: dict[int, list[tuple[int, int]]] = {}
    for route, entries in enumerate(route_entries):
        for link, count in entries.items():
            crossing.setdefault(link, []).append((route, count))
    first: dict[tuple, int] = {}
    twins: dict[int, list[int]] = {}
    for link, crossed in crossing.items():
        top = first.setdefault(tuple(crossed), link)
        twins.setdefault(top, []).append(link)
    kept = [
        {link: count for link, count in entries.items() if link in twins}
        for entries in route_entries
    ]
    return twins, kept


def _clusters(route_entries: list[dict[int, int]]) -> tuple[list[int], list[list[int]], bool]:
    """The routes joined through shared links: each route's cluster, each cluster's
    routes (in route order) and whether every two routes of each cluster share a
    link."""
    parent = list(range(len(route_entries)))

    def root(route: int) -> int:
        while parent[route] != route:
            parent[route] = parent[parent[route]]
            route = parent[route]
        return route

    first: dict[int, int] = {}  # link -> the first route on it
    for route, entries in enumerate(route_entries):
        for link in entries:
            other = first.setdefault(link, route)
            a, b = root(route), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    number: dict[int, int] = {}
    cluster_of = []
    cluster_routes: list[list[int]] = []
    for route in range(len(route_entries)):
        top = root(route)
        if top not in number:
            number[top] = len(cluster_routes)
            cluster_routes.append([])
        cluster_of.append(number[top])
        cluster_routes[number[top]].append(route)
    cliques = all(
        not route_entries[a].keys().isdisjoint(route_entries[b])
        for routes in cluster_routes
        for i, a in enumerate(routes)
        for b in routes[i + 1 :]
    )
    return cluster_of, cluster_routes, cliques


def _successors(ptr: np.ndarray, idx: np.ndarray) -> tuple[array, array, array | None]:
    """A CSR of successors in machine ints, with each op's one successor (-1: none)
    where no op has two."""
    counts = np.diff(ptr)
    single = None
    if len(counts) and counts.max() <= 1:
        one = np.full(len(counts), -1, dtype=np.int64)
        one[counts == 1] = idx
        single = array("q", one.tobytes())
    return _machine_ints(ptr), _machine_ints(idx), single


def _machine_ints(values: np.ndarray) -> array:
    """``array("q", values.tolist())`` without the Python ints."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out


def _unique_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` (flat) for ids: by a table over their
    range where it is small (no sort of every op's id), else np.unique."""
    flat = np.asarray(values).reshape(-1)
    if len(flat) and flat.dtype.kind in "iu":
        low, high = int(flat.min()), int(flat.max())
        if low >= 0 and high < 4 * len(flat) + 1024:
            seen = np.zeros(high + 1, dtype=bool)
            seen[flat] = True
            unique = np.flatnonzero(seen)
            number = np.cumsum(seen) - 1
            return unique.astype(flat.dtype), number[flat]
    unique, inverse = np.unique(flat, return_inverse=True)
    return unique, inverse.reshape(-1)


def _by_route(values: list, index: list[int]) -> list:
    """``values[index[i]]`` for every op ``i`` (one object a distinct route)."""
    return [values[i] for i in index]


def _shared(values: np.ndarray) -> list:
    """``values.tolist()`` with one Python object per distinct value: a ring's ops carry
    a handful of sizes, latencies and ranks, and tens of thousands of ops would
    otherwise hold a float or int object each (24 MiB on a 40,640-op call)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    if len(flat) > 1 and flat.dtype.kind in "biuf":
        # Every value the same to the bit (a ring's sizes, wire bytes and proxy times):
        # np.unique's one object without its sort (0.25 s of CPU over the FSDP GB200
        # row's 250,000-op all-gather and its probe).
        raw = flat.view(np.uint8).reshape(len(flat), flat.itemsize)
        if (raw == raw[0]).all():
            return [flat[0].item()] * len(flat)
    if flat.dtype.kind in "iu":
        distinct, inverse = _unique_ints(flat)
    else:
        distinct, inverse = np.unique(values, return_inverse=True)
    objects = distinct.tolist()
    return [objects[i] for i in inverse.ravel().tolist()]
