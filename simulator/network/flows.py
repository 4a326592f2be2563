"""Flow-level network model inside SimPy.

A flow carries some bytes along a route (a list of directed links). All active flows
share each directed link max-min fairly; rates are recomputed whenever flows start or
end, and each flow's completion is rescheduled. A flow's last byte leaves the sender
when its bytes have been transmitted at its (changing) rate: it is then *sent*, and its
links are free of it. It is *delivered* one route latency later.

Scale: flows are kept in flat numpy arrays (a pool of slots) and the active flow-link
incidence in two parallel arrays. Flows are added and completed in batches (all flows
of a collective step that start together are one call), and a change recomputes rates
only in the part of the network it touches: the connected component, in the flow-link
incidence, of the links whose flows changed. Work per event is numpy passes over that
component, not a Python loop over flows.

Most events touch a handful of flows, and there numpy's fixed cost per call, not the
length of the passes, is the price. With ``scalar_events`` (the default), such events'
rate recomputation (up to ``SMALL_ENTRIES`` incidence entries) and the rating of new
flows alone on their routes run in Python floats, the same operations in the same order,
so the results are the array path's to the bit (tests/test_flows_scalar.py). Tried and
dropped, both bit-identical: per-link flow counts in Python (slower: index arrays built
from lists cost what the passes did) and a heap of finish times instead of the two passes
over the slot pool per event (slower: a push per finish written). Also tried and dropped
(commit 3eccf6f, bit-identical): each link's flows kept as Python sets and each flow's
place in an incidence store, so that an event's search follows the flows it touches: the
sets cost a Python step per entry added or removed, and it ran 5-10% slower.

At two 1,024-GPU jobs on a 2:1 leaf-spine (``ccsim bench jobs-2x1024-leaf-spine``) the
incidence holds ~3,200 entries and the pool ~15,700 slots in a typical event, and most
events end one or two flows: passes over those arrays, not the max-min, are the price.
Hence (``cut_entries``, bit-identical: tests/test_flows_cut.py) a few finished flows'
entries are cut out of the incidence as slices rather than masked copies, entry sets
travel as positions, a small component's slots are read off its entries rather than the
pool, and the component of a few links whose flows each cross one link only (bundles'
link loads) is found by comparisons; and, with ``scalar_events``, a few distinct links'
flow counts are updated element by element. Measured interleaved (each event or call
picks the old or the new way at random, in one process): 250 against 254 us per network
event, 11.6 against 16.7 us per count update. Tried and dropped: a heap of finish times
above 4,096 slots (the passes over the pool cost ~4% of that run, but the heap's pushes
cost more: 49.3 against 42.6 s of CPU in network events) and element-by-element reads
and writes in the small rate recomputation (52.5 against 53.3 us a call, within noise).
Also tried and dropped (bit-identical, the row at DP 8, each event timed both ways in one
process): a lower bound on the finish times of each block of 256 slots, so that the next
completion and the flows finishing then read a block or two rather than the pool (the
bounds go stale as recomputations raise finish times: 23-28 us an event to find the least
against 9 us for the pass, 34 against 12 us for the finished slots); a few deliveries of
several delays grouped in Python (3x faster a call, but 19 such calls a row); capacities
kept as a Python list for the scalar path (1.6 us a call); and ``small_rates_list``
re-summing only the links a round changes (no faster at 7-9 entries). A pass over the
~3,500-entry incidence costs 2-5 us here and one over the pool 5-7 us; an event's cost is
its Python steps, in the network, its owners' callbacks and SimPy, more than its passes.

Fewer events, looked for on the same row at DP 8 (two 64-GPU-a-stage jobs, 52,593
network events): concurrent events hardly coincide (49 instants of two settles, the rest
one), so merging their recomputations saves nothing; half the recomputations (19,296 of
38,467) leave every rate as it was (bundles' flows held by their caps), but skipping them
would keep each flow's old finish time, ``last + left / rate``, where the recomputation
writes ``now + (left - rate * elapsed) / rate``, a last bit apart, so they are kept (the
max-min of such problems is cheap now: :func:`~.maxmin.small_rates_list`); 16% of wake-up
schedules repeat the pending wake-up's time (a new SimPy event each, the old one stale),
worth about 0.2% of the run. What was a whole event for nothing: a delivery per bundle
wake-up whose callback did nothing; owners with ``delivers = False`` get none.

Index sets are read as ``mask.nonzero()[0]`` rather than ``np.flatnonzero(mask)`` (the
same array: the masks are 1-D), which goes through three Python wrappers first: about 3 us
a call on this machine, several calls an event.

Time is SimPy's: the network schedules a single wake-up (a SimPy timeout) at the next
completion; a newer schedule makes older wake-ups stale (a generation counter), since
SimPy events cannot be cancelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import networkx as nx
import numpy as np
import simpy

from .maxmin import INF, SMALL_ENTRIES, max_min_rates, small_rates_list
from .routing import LinkTable, Router, path_class

#: No holders (see FlowNetwork.holders); never written to.
_NO_HOLDERS = np.zeros(0, dtype=np.int64)
_NO_HOLDERS.flags.writeable = False
_count_nonzero = np.count_nonzero
_fmax = np.fmax.reduce

# Completions within this relative distance of the wake-up time happen at the wake-up:
# floating-point finish times of flows that finish together may differ in the last bit.
_SAME_TIME = 1e-12
# Per-link arrays other than capacity, and the value a new (reducer) link starts with.
_PER_LINK = (
    ("link_bytes", 0.0),
    ("link_busy", 0.0),
    ("_link_flows", 0),
    ("_link_since", 0.0),
    ("link_idle_at", 0.0),
    ("_held_until", -np.inf),
    ("_held_by", -1),
    ("link_flow_s", 0.0),
    ("_link_changed", 0.0),
    ("_link_mark", False),
)
# Beyond this many rounds of growing the affected component, recompute everything:
# the component is then most of the network anyway.
_MAX_COMPONENT_ROUNDS = 6
# Up to this many incidence entries, link sets are built in Python rather than sorted.
_SMALL = 32
# Up to this many entries leave the incidence at once, it is cut around them (a copy of
# the slices between) rather than compressed by a mask: at 1,024 GPUs a job the incidence
# holds ~3,200 entries and most events end 1 or 2 flows, where numpy's masked copy of each
# of its arrays cost several times the slices' (one pass over a mask per array).
_FEW_GONE = 16
# Up to this many seed links, a component search first looks for the flows on them by
# comparisons: where each of those flows crosses one link only (a call's traffic on one
# link, as bundles carry it), they are the component, found without the search's
# gathers over the incidence.
_FEW_SEEDS = 4


class FlowOwner(Protocol):
    """What a network calls back when flows it was given are sent and delivered.

    An owner may also define ``wants_delivery(ops) -> bool array``: the ops whose
    delivery it is told of (default all), when it times the others itself; or set
    ``delivers = False`` where nothing waits for its flows to arrive (a bundle's): the
    network then schedules no delivery for them and never calls ``on_delivered``."""

    def on_sent(self, ops: np.ndarray) -> None: ...

    def on_delivered(self, ops: np.ndarray) -> None: ...


@dataclass
class NetworkStats:
    """Counters for benchmarks: flows carried and rate recomputations."""

    flows: int = 0
    recomputes: int = 0
    recomputed_flows: int = 0
    #: Flows the simulated ones stand for (equal to ``flows`` unless flows are aggregated
    #: over symmetric ranks, see :meth:`FlowNetwork.set_link_classes`).
    represented_flows: float = 0.0


@dataclass
class FlowState:
    """Flows in flight, as :meth:`FlowNetwork.flow_state` sees them now: their slots,
    owners and op ids, routes (ids, and each one's link ids), the links they load (with
    link classes: representatives), the bytes each has left and its weight."""

    slots: np.ndarray
    owners: np.ndarray
    ops: np.ndarray
    routes: np.ndarray
    route_links: list[np.ndarray]
    links: np.ndarray
    left: np.ndarray
    weight: np.ndarray


def network_tables(graph: nx.Graph) -> tuple[LinkTable, Router]:
    """``graph``'s link table and a router, to be given to every
    :class:`FlowNetwork` of ``graph`` (``tables=``): each copies the table and shares
    what the router read from the graph instead of reading the graph again. Never
    used for flows themselves, so they stay as the graph made them."""
    links = LinkTable(graph)
    return links, Router(graph, links)


class FlowNetwork:
    """Max-min fair, flow-level model of a topology's directed links.

    Flows are identified to their owner by an op id; owners register with
    :meth:`register` and hand flows over with :meth:`add_flows`.
    """

    #: Events that touch a few flows are handled in Python floats (the same bits as the
    #: array path, which False selects for every event: tests hold them equal).
    scalar_events: bool = True
    #: A few finished flows' entries leave the incidence by cutting it around them, and
    #: a small component's slots are read off its entries (False: a masked copy and a
    #: pass over the pool, as before; tests hold the two equal).
    cut_entries: bool = True

    def __init__(
        self,
        env: simpy.Environment,
        graph: nx.Graph,
        *,
        link_efficiency: Mapping[str, float] | None = None,
        flow_seconds: bool = False,
        tables: tuple[LinkTable, Router] | None = None,
    ):
        self.env = env
        self.graph = graph
        if tables is not None and tables[1].graph is graph:
            # Read from the graph once for many networks (see network_tables).
            self.links = tables[0].copy()
            self.router = Router(graph, self.links, like=tables[1])
        else:
            self.links = LinkTable(graph)
            self.router = Router(graph, self.links)
        n_links = len(self.links)
        # Usable capacity: line rate times the efficiency of the link's type (calibrated
        # runs only; records keep reporting line rate).
        self.capacity = self.links.capacity.copy()
        self.link_efficiency = dict(link_efficiency or {})
        if link_efficiency:
            scale = [float(link_efficiency.get(kind, 1.0)) for kind in self.links.kind]
            self.capacity *= np.array(scale)
        # Capacity before faults scale it (see scale_links).
        self._base_capacity = self.capacity.copy()
        self._route_class: list[str] = []
        self._reducers: dict[int, int] = {}
        self.stats = NetworkStats()
        # Per-link records.
        self.link_bytes = np.zeros(n_links)
        self.link_busy = np.zeros(n_links)
        self._link_flows = np.zeros(n_links, dtype=np.int64)
        self._link_since = np.zeros(n_links)
        # When each link last became idle (for calls timed in isolation: when they let go).
        self.link_idle_at = np.zeros(n_links)
        # Scratch marks per link for component searches (all False between searches).
        self._link_mark = np.zeros(n_links, dtype=bool)
        # Flow-seconds per link (the integral of its flow count over time), kept when
        # asked for: a call's mean flows on a link while busy (workload bundles).
        self.flow_seconds = flow_seconds
        self.link_flow_s = np.zeros(n_links)
        self._link_changed = np.zeros(n_links)
        # Links held by calls replayed from an isolated run (see hold): until when, and
        # by which holder (-1: none). A flow started on a held link is a *conflict*: the
        # replay that holds it was not alone there after all, and on_conflict(holders)
        # says so, so that the caller can simulate those calls' flows instead.
        self._held_until = np.full(n_links, -np.inf)
        self._held_by = np.full(n_links, -1, dtype=np.int64)
        self.on_conflict: Callable[[np.ndarray], None] | None = None
        # Aggregation over symmetric ranks (None: every flow is one flow on its own links).
        self._link_class: np.ndarray | None = None
        self._class_size: np.ndarray | None = None
        self._inc_coef: np.ndarray | None = None
        # Flow pool (slots are reused once their flow is sent).
        self._cap = 0
        self._alloc(1024)
        self._free: list[np.ndarray] = []
        self._top = 0
        # Active incidence: flow slot and link, one entry per (flow, link) pair.
        self._inc_flow = np.zeros(0, dtype=np.int64)
        self._inc_link = np.zeros(0, dtype=np.int64)
        self._owners: list[FlowOwner | None] = []
        self._pending: list[np.ndarray] = []
        self._settle_scheduled = False
        self._in_wake = False
        self._generation = 0
        # Links whose capacity changed since the last rate computation (faults).
        self._seed_links = np.zeros(0, dtype=np.int64)
        # Flows with a rate cap ever added (none: max-min needs no caps).
        self._capped = 0
        # Scratch for _recompute (-1 per slot between calls) and _entries_of (False).
        self._local = np.zeros(0, dtype=np.int64)
        self._dead = np.zeros(0, dtype=bool)
        # Scratch for _wake's pass over the pool (any content between calls).
        self._due = np.zeros(0, dtype=bool)
        # The route over each link alone, once made (-1: not yet; see add_link_loads).
        self._link_route = np.full(n_links, -1, dtype=np.int64)

    # -- pool -----------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> None:
        def grow(name: str, dtype, fill) -> None:
            new = np.full(capacity, fill, dtype=dtype)
            if self._cap:
                new[: self._cap] = getattr(self, name)
            setattr(self, name, new)

        grow("_f_op", np.int64, -1)
        grow("_f_owner", np.int32, -1)
        grow("_f_route", np.int64, -1)
        grow("_f_links", np.int64, 0)  # links on the route (set as the flow is taken in)
        grow("_f_bytes", float, 0.0)
        grow("_f_left", float, 0.0)
        grow("_f_rate", float, 0.0)
        grow("_f_last", float, 0.0)
        grow("_f_finish", float, np.inf)
        grow("_f_weight", float, 1.0)
        grow("_f_cap", float, np.inf)
        self._cap = capacity

    def _take_slots(self, count: int) -> np.ndarray:
        taken = []
        while count and self._free:
            block = self._free.pop()
            use, rest = block[:count], block[count:]
            if len(rest):
                self._free.append(rest)
            taken.append(use)
            count -= len(use)
        if count:
            if self._top + count > self._cap:
                self._alloc(max(2 * self._cap, self._top + count))
            taken.append(np.arange(self._top, self._top + count))
            self._top += count
        return np.concatenate(taken) if len(taken) > 1 else taken[0]

    # -- public API -------------------------------------------------------------------------
    def register(self, owner: FlowOwner) -> int:
        """Register a flow owner; returns the id to pass to :meth:`add_flows`."""
        self._owners.append(owner)
        return len(self._owners) - 1

    def release(self, owner: int) -> None:
        """Forget a registered owner that will add no more flows and has none left (a
        finished collective), so that a long replay does not keep every one alive."""
        self._owners[owner] = None

    def route_ids(
        self, src_ranks: np.ndarray, dst_ranks: np.ndarray, labels: np.ndarray | None = None
    ) -> np.ndarray:
        """Route ids between ranks (see :class:`~simulator.network.routing.Router`).

        ``labels`` name the connection each flow belongs to (a schedule's channel): where
        several equal-cost paths exist, the router hashes (src, dst, label) to pick one,
        as ECMP hashes a connection's 5-tuple.
        """
        return self.router.route_ids(src_ranks, dst_ranks, labels)

    def set_link_classes(self, link_class: np.ndarray, class_size: np.ndarray) -> None:
        """Aggregate flows over classes of equivalent links (symmetric ranks).

        ``link_class[l]`` is the representative link of link ``l``'s class and
        ``class_size[l]`` the number of links in that class. From then on a flow added
        with weight k stands for k identical flows whose copies load each link of a class
        equally: its load on the representative of class L is k x (its links in L) / |L|.
        Max-min rates on the representatives are then those of the full network, when the
        caller has checked that the flows really are symmetric (see
        :mod:`simulator.collective.symmetry`). Call before any flow is added.
        """
        if self.stats.flows:
            raise RuntimeError("set_link_classes must come before the first flow")
        self._link_class = np.asarray(link_class, dtype=np.int64).copy()
        self._class_size = np.asarray(class_size, dtype=float).copy()
        self._inc_coef = np.zeros(0)

    def reducer_route(self, rank: int, bandwidth: float, class_size: int = 1) -> int:
        """Route over rank's reducer: a virtual link of the GPU's reduce bandwidth that
        its concurrent reductions share (created on first use; reported as link type
        ``reduce`` from and to ``reduce@<gpu>``). With aggregated flows, the reducer stands
        for the ``class_size`` reducers of the ranks symmetric to ``rank``."""
        route = self._reducers.get(rank)
        if route is None:
            name = f"reduce@{self.router.nodes[rank]}"
            links = self.links
            links.src_node.append(name)
            links.dst_node.append(name)
            links.kind.append("reduce")
            links.capacity = np.append(links.capacity, float(bandwidth))
            links.latency = np.append(links.latency, 0.0)
            links.message_cost = np.append(links.message_cost, 0.0)
            self.capacity = np.append(self.capacity, float(bandwidth))
            self._base_capacity = np.append(self._base_capacity, float(bandwidth))
            for attribute, fill in _PER_LINK:
                setattr(self, attribute, np.append(getattr(self, attribute), fill))
            if self._link_class is not None:
                self._link_class = np.append(self._link_class, len(links) - 1)
                self._class_size = np.append(self._class_size, float(class_size))
            route = self._reducers[rank] = self.router.add_link_route([len(links) - 1])
        return route

    # -- calls replayed from an isolated run (simulator.workload.isolated) ----------------
    def holders(self, links: np.ndarray) -> tuple[bool, np.ndarray]:
        """Whether flows are on any of ``links`` now, and the holders (see :meth:`hold`)
        of those still held."""
        links = np.asarray(links, dtype=np.int64)
        now = self.env.now
        # (count_nonzero and fmax.reduce: the same answers as .any() on the masks, at
        # half the cost on the few dozen links of a call; this runs once per call
        # replayed from its timing, ~100,000 times a 405B step. fmax skips NaN as the
        # comparison does.)
        busy = _count_nonzero(self._link_flows[links]) > 0
        until = self._held_until[links]
        if not _fmax(until, initial=-np.inf) > now:  # the usual case, without np.unique's
            return busy, _NO_HOLDERS
        return busy, np.unique(self._held_by[links[until > now]])

    def hold(self, links: np.ndarray, until: np.ndarray, holder: int) -> None:
        """Hold ``links`` for ``holder`` until the times ``until`` (absolute seconds): a
        call whose flows the network does not carry (its timing comes from an isolated
        run) uses them then, and a flow started on them before is a conflict."""
        self._held_until[links] = until
        self._held_by[links] = holder

    def unhold(self, links: np.ndarray, holder: int) -> None:
        """Let go now of those of ``links`` that ``holder`` holds (a replayed call that
        goes on as flows)."""
        links = np.asarray(links, dtype=np.int64)
        mine = links[self._held_by[links] == holder]
        self._held_until[mine] = -np.inf
        self._held_by[mine] = -1

    def account(
        self,
        links: np.ndarray,
        nbytes: np.ndarray,
        busy_s: np.ndarray,
        flows: int,
        represented: float | None = None,
    ) -> None:
        """Add a call replayed from an isolated run to the records: bytes and busy time
        on its links, the flows it carried and those they stood for (default: as many;
        more with link classes)."""
        self.link_bytes[links] += nbytes
        self.link_busy[links] += busy_s
        self.stats.flows += flows
        self.stats.represented_flows += flows if represented is None else represented

    def flows_on(self, links: np.ndarray) -> np.ndarray:
        """Slots of the flows in flight on any of ``links`` (with link classes: their
        representatives), sorted; flows started at this instant and not yet taken in are
        not among them."""
        if len(self._inc_link) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.unique(self._inc_flow[np.isin(self._inc_link, links)])

    def flow_state(self, slots: np.ndarray) -> FlowState:
        """What the flows in ``slots`` still have to do from now (see :class:`FlowState`)."""
        slots = np.asarray(slots, dtype=np.int64)
        elapsed = self.env.now - self._f_last[slots]
        left = np.maximum(self._f_left[slots] - self._f_rate[slots] * elapsed, 0.0)
        ptr, flat, _ = self.router.arrays()
        routes = self._f_route[slots]
        on = np.isin(self._inc_flow, slots)
        return FlowState(
            slots=slots,
            owners=self._f_owner[slots].copy(),
            ops=self._f_op[slots].copy(),
            routes=routes.copy(),
            route_links=[flat[ptr[r] : ptr[r + 1]].copy() for r in routes.tolist()],
            links=np.unique(self._inc_link[on]),
            left=left,
            weight=self._f_weight[slots].copy(),
        )

    def withdraw(self, state: FlowState) -> None:
        """Take the flows of ``state`` out of the network now, without telling their
        owners: whoever withdrew them (a call timed together with them, see
        :mod:`simulator.workload.isolated`) sends and delivers them. Their links keep the
        bytes carried so far and their busy time up to now; no other flow may share a
        link with them (their rates would change)."""
        slots = state.slots
        now = self.env.now
        dead = np.zeros(self._cap, dtype=bool)
        dead[slots] = True
        gone = dead[self._inc_flow]
        carried_by = np.zeros(self._cap)
        carried_by[slots] = self._f_bytes[slots] - state.left
        carried = carried_by[self._inc_flow[gone]]
        if self._inc_coef is not None:
            carried = carried * self._inc_coef[gone]
            self._inc_coef = self._inc_coef[~gone]
        np.add.at(self.link_bytes, self._inc_link[gone], carried)
        gone_links = self._inc_link[gone]
        self._inc_flow = self._inc_flow[~gone]
        self._inc_link = self._inc_link[~gone]
        self._count_link_flows(gone_links, -1, now)
        self._f_finish[slots] = np.inf
        self._f_op[slots] = -1
        self._free.append(slots)
        self._schedule_wake()  # the next completion may have been one of these

    def deliver(self, owner: int, ops: np.ndarray, routes: np.ndarray) -> None:
        """Tell ``owner`` that its withdrawn flows ``ops`` are sent now, and deliver them
        one route latency later, as the network does for the flows it carries."""
        target = self._owners[owner]
        target.on_sent(ops)
        self._deliver_later(target.on_delivered, ops, self.route_latency(routes))

    def reset_clock(self, env: simpy.Environment) -> None:
        """Start over on a new clock with zeroed records; no flow may be in flight. (For
        a scratch network that times calls alone, one after another.)"""
        if len(self._inc_flow) or self._pending or np.isfinite(self._f_finish[: self._top]).any():
            raise RuntimeError("reset_clock with flows in flight")
        self.env = env
        self._generation += 1
        self._settle_scheduled = False
        self.link_bytes[:] = 0.0
        self.link_busy[:] = 0.0
        self.link_idle_at[:] = 0.0
        self.link_flow_s[:] = 0.0
        self._link_changed[:] = 0.0
        self.stats = NetworkStats()

    def network_route_ids(self, src_ranks: np.ndarray, dst_ranks: np.ndarray) -> np.ndarray:
        """Routes that leave the server through the NICs (see Router.network_route_ids)."""
        return self.router.network_route_ids(src_ranks, dst_ranks)

    def switch_route_ids(self, ranks: np.ndarray, *, down: bool) -> np.ndarray:
        """Routes into (or out of) each rank's NVLS switch (see Router.switch_route_ids)."""
        return self.router.switch_route_ids(ranks, down=down)

    def route_classes(self, routes: np.ndarray) -> list[str]:
        """Path class (nvlink, pcie, network) of each route, for protocol latencies."""
        ptr, flat, _ = self.router.arrays()
        while len(self._route_class) < len(ptr) - 1:
            r = len(self._route_class)
            kinds = [self.links.kind[i] for i in flat[ptr[r] : ptr[r + 1]]]
            self._route_class.append(path_class(kinds))
        return [self._route_class[r] for r in routes.tolist()]

    def route_latency(self, routes: np.ndarray) -> np.ndarray:
        """Latency in seconds of each route."""
        return self.router.arrays()[2][routes]

    def add_flows(
        self,
        owner: int,
        ops: np.ndarray,
        routes: np.ndarray,
        nbytes: np.ndarray,
        weight: np.ndarray | None = None,
        cap: np.ndarray | None = None,
    ) -> None:
        """Start one flow per op now, along ``routes``, carrying ``nbytes`` each; with
        link classes set, flow i stands for ``weight[i]`` identical flows. ``cap``: the
        most bytes/s each may take (default: no limit but its links)."""
        if len(ops) == 0:
            return
        slots = self._take_slots(len(ops))
        self._f_op[slots] = ops
        self._f_owner[slots] = owner
        self._f_route[slots] = routes
        self._f_bytes[slots] = nbytes
        self._f_left[slots] = nbytes
        self._f_rate[slots] = 0.0
        self._f_last[slots] = self.env.now
        if cap is None:
            self._f_cap[slots] = np.inf
        else:
            self._f_cap[slots] = cap
            self._capped += int(np.isfinite(cap).sum())
        if weight is None:
            self._f_weight[slots] = 1.0
            self.stats.represented_flows += len(ops)
        else:
            self._f_weight[slots] = weight
            self.stats.represented_flows += float(np.sum(weight))
        self.stats.flows += len(ops)
        self._pending.append(slots)
        if not self._settle_scheduled and not self._in_wake:
            # Flows started at the same instant by different callbacks share one rate
            # computation: settle after everything already queued for this instant.
            self._settle_scheduled = True
            self.env.timeout(0).callbacks.append(self._settle_event)

    def weigh_flows(self) -> None:
        """From now on, without link classes too, a flow of weight k loads each link of
        its route k times its rate and counts k times its bytes: it stands for k identical
        flows side by side (a merged schedule's ops, see
        :class:`~simulator.algorithms.schedule.Merged`). Unweighted flows are unchanged."""
        if self._inc_coef is None:
            self._inc_coef = np.ones(len(self._inc_flow))

    def add_link_loads(
        self,
        owner: int,
        links: np.ndarray,
        nbytes: np.ndarray,
        cap: np.ndarray,
        represented: float,
        copies: np.ndarray | None = None,
    ) -> None:
        """Start one flow per link now, each over that link alone, carrying ``nbytes``
        at no more than ``cap`` bytes/s (ops are positions in ``links``): a call's
        traffic on each of its links, as a bundle (:mod:`simulator.workload.bundles`).
        ``copies[i]``: the flow stands for that many equal flows on its link (each with
        its share of the bytes and the cap), as many as the call kept there alone, so
        that it takes as many shares of the link. With link classes, ``links`` are
        representatives and each flow loads its link as the representative's own figures
        say (every link of the class alike). They stand for ``represented`` flows in the
        stats."""
        links = np.asarray(links, dtype=np.int64)
        routes = self._single_link_routes(links)
        copies = np.ones(len(links)) if copies is None else np.asarray(copies, dtype=float)
        if self._link_class is not None:
            weight = copies * self._class_size[links]
        else:
            weight = copies
            if self._inc_coef is None:
                # From now on every incidence entry carries its load per unit of rate.
                self._inc_coef = np.ones(len(self._inc_flow))
        before = self.stats.represented_flows
        self.add_flows(owner, np.arange(len(links)), routes, nbytes / copies, weight, cap / copies)
        self.stats.represented_flows = before + represented

    def _single_link_routes(self, links: np.ndarray) -> np.ndarray:
        """The route over each of ``links`` alone (``Router.route_over((link,))``, made on
        first use in the links' order, so numbered as that call makes them), looked up
        in one pass: a bundle's thousands of links, at each of its starts."""
        known = self._link_route
        if len(known) < len(self.links):  # reducer links made since
            known = self._link_route = np.concatenate(
                [known, np.full(len(self.links) - len(known), -1, dtype=np.int64)]
            )
        routes = known[links]
        missing = (routes < 0).nonzero()[0]
        if len(missing):
            for link in links[missing].tolist():
                if known[link] < 0:
                    known[link] = self.router.route_over((link,))
            routes = known[links]
        return routes

    def scale_links(self, links: np.ndarray, factor: float | np.ndarray) -> None:
        """Set ``links``' usable capacity to ``factor`` times their healthy capacity, now
        (a fault starting or ending): flows in flight on them take new rates from this
        instant, and their completions are rescheduled."""
        links = np.asarray(links, dtype=np.int64)
        if len(links) == 0:
            return
        self.capacity[links] = self._base_capacity[links] * np.asarray(factor, dtype=float)
        self._seed_links = np.union1d(self._seed_links, links)
        if not self._settle_scheduled and not self._in_wake:
            self._settle_scheduled = True
            self.env.timeout(0).callbacks.append(self._settle_event)

    # -- rate computation -------------------------------------------------------------------
    def _settle_event(self, _event) -> None:
        self._settle_scheduled = False
        self._settle(np.zeros(0, dtype=np.int64))

    def _settle(self, finished: np.ndarray, entries: tuple | None = None) -> None:
        """Take in pending flows, drop ``finished`` ones, recompute affected rates.
        ``entries``: (incidence array, positions) of the finished flows' entries, as
        :meth:`_wake` found them; used only if the incidence is still that array (a call
        launched from the owners' callbacks may have withdrawn flows since)."""
        now = self.env.now
        new = np.concatenate(self._pending) if self._pending else np.zeros(0, dtype=np.int64)
        self._pending = []
        ptr, route_links, _ = self.router.arrays()
        # Links whose flows changed (ids; work per event must not grow with the network).
        seeds = [self._seed_links]
        self._seed_links = np.zeros(0, dtype=np.int64)

        if len(finished):
            if entries is not None and entries[0] is self._inc_flow:
                gone = entries[1]
            else:
                gone = self._entries_of(finished)
            gone_links = self._inc_link[gone]
            seeds.append(gone_links)
            self._drop_entries(gone)
            self._count_link_flows(gone_links, -1, now)
        if len(new):
            rows = self._f_route[new]
            lengths = ptr[rows + 1] - ptr[rows]
            self._f_links[new] = lengths
            new_flow = np.repeat(new, lengths)
            offsets = np.repeat(ptr[rows] - (np.cumsum(lengths) - lengths), lengths)
            new_link = route_links[offsets + np.arange(int(lengths.sum()))]
            if self._link_class is not None:
                # Each copy of the flow loads one link of a class; together they load
                # every link of it weight / |class| times per link crossed.
                coef = self._f_weight[new_flow] / self._class_size[new_link]
                new_link = self._link_class[new_link]
                self._inc_coef = np.concatenate([self._inc_coef, coef])
            elif self._inc_coef is not None:
                # Weighted flows without link classes (bundles): k copies on each link.
                self._inc_coef = np.concatenate([self._inc_coef, self._f_weight[new_flow]])
            seeds.append(new_link)
            if self.on_conflict is not None:
                until = self._held_until[new_link]
                if _fmax(until, initial=-np.inf) > now:  # (as in holders)
                    self.on_conflict(np.unique(self._held_by[new_link[until > now]]))
            self._inc_flow = np.concatenate([self._inc_flow, new_flow])
            self._inc_link = np.concatenate([self._inc_link, new_link])
            self._count_link_flows(new_link, +1, now)
            # Flows with no link (both ends on one node) are sent at once.
            self._f_rate[new[lengths == 0]] = np.inf

        if len(finished):
            # Links the ended flows leave with nobody on them change nobody's rate.
            seeds[1] = gone_links[self._link_flows[gone_links] > 0]
        if len(new):
            left = self._rate_alone(new, lengths, new_link)
            if left is None:  # every new flow is alone: none changes another's rate
                seeds[-1], new = new_link[:0], new[:0]
            elif not left.all():
                seeds[-1], new = new_link[np.repeat(left, lengths)], new[left]
        seeds = [links for links in seeds if len(links)]
        if seeds:
            affected, entries = self._component(np.concatenate(seeds))
            if entries is not None and len(entries) <= SMALL_ENTRIES and self.cut_entries:
                # A few entries: their flows (every flow the search found has one) and
                # the new ones, sorted, without a pass over the pool's slots.
                found = set(self._inc_flow[entries].tolist())
                found.update(new.tolist())
                self._recompute(np.array(sorted(found), dtype=np.int64), now, entries)
            else:
                if affected is None:  # (found as entries only: the mask made now)
                    affected = np.zeros(self._cap, dtype=bool)
                    affected[self._inc_flow[entries]] = True
                if len(new):
                    # (Already among them: their links are seeds. A flow over no link
                    # has no entry, so the entries stay those of the slots.)
                    affected[new] = True
                self._recompute(affected[: self._top].nonzero()[0], now, entries)
        elif len(new):
            self._recompute(new, now)
        self._schedule_wake()

    def _drop_entries(self, gone: np.ndarray) -> None:
        """Take the incidence entries at positions ``gone`` (sorted) out, keeping the
        others in their order (the order max-min sums each link's loads in)."""
        if len(gone) > _FEW_GONE or not self.cut_entries:
            kept = np.ones(len(self._inc_flow), dtype=bool)
            kept[gone] = False
            self._inc_flow = self._inc_flow[kept]
            self._inc_link = self._inc_link[kept]
            if self._inc_coef is not None:
                self._inc_coef = self._inc_coef[kept]
            return
        # The slices between the entries that go (a flow's entries are side by side:
        # added together, and kept in order since).
        cuts, start = [], 0
        for position in gone.tolist():
            if position > start:
                cuts.append((start, position))
            start = position + 1
        cuts.append((start, len(self._inc_flow)))

        def cut(values: np.ndarray) -> np.ndarray:
            return np.concatenate([values[a:b] for a, b in cuts])

        self._inc_flow = cut(self._inc_flow)
        self._inc_link = cut(self._inc_link)
        if self._inc_coef is not None:
            self._inc_coef = cut(self._inc_coef)

    def _entries_of(self, slots: np.ndarray) -> np.ndarray:
        """Positions (sorted) of the incidence entries of the flows in ``slots``."""
        if len(slots) == 1:  # one flow ends (a drifting ring's hop): one comparison
            return (self._inc_flow == slots[0]).nonzero()[0]
        # A scratch mask over slots, all False between calls (not allocated per call).
        dead = self._dead
        if len(dead) != self._cap:
            dead = self._dead = np.zeros(self._cap, dtype=bool)
        dead[slots] = True
        entries = dead[self._inc_flow].nonzero()[0]
        dead[slots] = False
        return entries

    def _rate_alone(
        self, new: np.ndarray, lengths: np.ndarray, new_link: np.ndarray
    ) -> np.ndarray | None:
        """Rate the new flows that are alone on every link of their route (the common
        case in a chain of steps) without a component search or max-min: such a flow runs
        at its slowest link (with link classes, that link's capacity over the flow's load
        on it) and changes no other flow's rate. Returns which of ``new`` are not (None:
        none)."""
        if self.scalar_events and len(new_link) <= _SMALL:
            return self._rate_alone_small(new, lengths, new_link)
        return self._rate_alone_arrays(new, lengths, new_link)

    def _rate_alone_arrays(
        self, new: np.ndarray, lengths: np.ndarray, new_link: np.ndarray
    ) -> np.ndarray | None:
        """:meth:`_rate_alone` in numpy passes (any number of flows)."""
        alone_entry = self._link_flows[new_link] == 1
        crossing = lengths > 0
        alone = np.ones(len(new), dtype=bool)
        firsts = np.cumsum(lengths) - lengths
        if crossing.any():
            alone[crossing] = np.minimum.reduceat(alone_entry, firsts[crossing])
        rated = alone & crossing
        picked = rated.nonzero()[0]
        if len(picked) == 0:
            return np.ones(len(new), dtype=bool)
        now = self.env.now
        share = self.capacity[new_link]
        if self._inc_coef is not None:
            share = share / self._inc_coef[len(self._inc_coef) - len(new_link) :]
        rate = np.minimum.reduceat(share, firsts[crossing])[np.cumsum(crossing)[picked] - 1]
        flows = new[picked]
        if self._capped:
            rate = np.minimum(rate, self._f_cap[flows])
        self._f_rate[flows] = rate
        self._f_last[flows] = now
        left = self._f_left[flows]
        with np.errstate(divide="ignore", invalid="ignore"):
            self._f_finish[flows] = now + np.where(left > 0, left / rate, 0.0)
        self.stats.recomputed_flows += len(flows)
        return None if rated.all() else ~rated

    def _rate_alone_small(
        self, new: np.ndarray, lengths: np.ndarray, new_link: np.ndarray
    ) -> np.ndarray | None:
        """:meth:`_rate_alone` of a few entries in Python floats: each flow's least share
        over its route (a minimum: no rounding), then its cap and finish time, as the
        array path computes them."""
        alone_entry = (self._link_flows[new_link] == 1).tolist()
        share = self.capacity[new_link]
        if self._inc_coef is not None:
            share = share / self._inc_coef[len(self._inc_coef) - len(new_link) :]
        shares = share.tolist()
        if any(value != value for value in shares):
            return self._rate_alone_arrays(new, lengths, new_link)  # NaN: numpy's minimum
        caps = self._f_cap[new].tolist() if self._capped else None
        picked, rates, rated = [], [], []
        first = 0
        for index, length in enumerate(lengths.tolist()):
            end = first + length
            if length and all(alone_entry[first:end]):
                rate = min(shares[first:end])
                if caps is not None and not caps[index] >= rate:
                    rate = caps[index]  # np.minimum: the cap when below (or NaN)
                picked.append(index)
                rates.append(rate)
                rated.append(True)
            else:
                rated.append(False)
            first = end
        if not picked:
            return np.ones(len(new), dtype=bool)
        now = self.env.now
        flows = new[picked]
        left = self._f_left[flows].tolist()
        finish = []
        for remains, rate in zip(left, rates, strict=True):
            if remains > 0:
                finish.append(now + (remains / rate if rate != 0.0 else INF))
            else:
                finish.append(now + 0.0)
        self._f_rate[flows] = rates
        self._f_last[flows] = now
        self._f_finish[flows] = finish
        self.stats.recomputed_flows += len(picked)
        return None if len(picked) == len(new) else ~np.array(rated)

    def _count_link_flows(self, links: np.ndarray, sign: int, now: float) -> None:
        """Update per-link active-flow counts and busy time."""
        if len(links) == 0:
            return
        if self.scalar_events and len(links) <= _FEW_SEEDS:
            few = links.tolist()
            if len(set(few)) == len(few):
                self._count_few_link_flows(few, sign, now)
                return
        if self.flow_seconds:
            touched = np.unique(links)
            count = self._link_flows[touched]
            self.link_flow_s[touched] += count * (now - self._link_changed[touched])
            self._link_changed[touched] = now
        before = self._link_flows[links]
        np.add.at(self._link_flows, links, sign)
        if sign > 0:
            starting = links[before == 0]
            self._link_since[starting] = now
        else:
            after = self._link_flows[links]
            idle = links[(after == 0) & (before > 0)]
            self.link_busy[idle] += now - self._link_since[idle]
            self.link_idle_at[idle] = now

    def _count_few_link_flows(self, links: list[int], sign: int, now: float) -> None:
        """:meth:`_count_link_flows` of a few distinct links, one element at a time (the
        same operations on the same numbers as the passes, without their calls)."""
        counts = self._link_flows
        for link in links:
            before = int(counts[link])
            if self.flow_seconds:
                changed = self._link_changed
                self.link_flow_s[link] += before * (now - float(changed[link]))
                changed[link] = now
            counts[link] = before + sign
            if sign > 0:
                if before == 0:
                    self._link_since[link] = now
            elif before + sign == 0 and before > 0:
                self.link_busy[link] += now - float(self._link_since[link])
                self.link_idle_at[link] = now

    def _component(self, seeds: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Flow slots connected (through shared links) to the ``seeds`` links (ids), as a
        mask over slots, and the positions of their incidence entries where the search
        found them (None: :meth:`_recompute` finds them). Where the component is a few
        links' one-link flows (:meth:`_one_link_flows_on`) the mask is None: the entries
        say it, and most callers need no mask over the pool."""
        if self.cut_entries and 0 < len(seeds) <= _FEW_SEEDS and len(self._inc_link) > _SMALL:
            entries = self._one_link_flows_on(seeds)
            if entries is not None:
                return None, entries
        flows = np.zeros(self._cap, dtype=bool)
        if len(seeds) == 0 or len(self._inc_link) == 0:
            return flows, None
        if 8 * len(self._inc_link) > len(self.links):
            # Much of the network is busy: masks over all links are cheapest.
            links = np.zeros(len(self.links), dtype=bool)
            links[seeds] = True
            for _ in range(_MAX_COMPONENT_ROUNDS):
                hit = links[self._inc_link]
                flows[self._inc_flow[hit]] = True
                # The links the flows found cross: done when all were reached already.
                entries = flows[self._inc_flow]
                reached = self._inc_link[entries]
                if links[reached].all():
                    return flows, entries.nonzero()[0]
                links[reached] = True
        elif len(self._inc_link) <= _SMALL:
            # A handful of flows (a quotient's step): plain Python sets.
            pairs = list(zip(self._inc_flow.tolist(), self._inc_link.tolist(), strict=True))
            reached, found = set(seeds.tolist()), set()
            grew = True
            while grew:
                grew = False
                for flow, link in pairs:
                    if link in reached and flow not in found:
                        found.add(flow)
                        grew = True
                for flow, link in pairs:
                    if flow in found and link not in reached:
                        reached.add(link)
                        grew = True
            flows[list(found)] = True
            return flows, None
        else:
            # Few flows in a large network: the links reached, marked in a scratch array
            # cleared again before returning (no sort per round, as set operations take).
            mark = self._link_mark
            links = np.unique(seeds)
            mark[links] = True
            try:
                for _ in range(_MAX_COMPONENT_ROUNDS):
                    flows[self._inc_flow[mark[self._inc_link]]] = True
                    entries = flows[self._inc_flow]
                    grown = self._inc_link[entries]
                    new = grown[~mark[grown]]
                    if len(new) == 0:
                        return flows, entries.nonzero()[0]
                    new = np.unique(new)
                    mark[new] = True
                    links = np.concatenate([links, new])
            finally:
                mark[links] = False
        flows[self._inc_flow] = True  # the change reaches most of the network
        return flows, None

    def _one_link_flows_on(self, seeds: np.ndarray) -> np.ndarray | None:
        """Positions of the incidence entries on the ``seeds`` links, where every flow
        they belong to crosses one link only (None otherwise): those flows are then the
        component of the seeds, and these entries all of theirs (a flow has one entry per
        link of its route)."""
        inc_link = self._inc_link
        first, *rest = seeds.tolist()
        hit = inc_link == first
        for link in rest:
            hit |= inc_link == link
        entries = hit.nonzero()[0]
        # (Each flow's link count, kept per slot as it is taken in: no route lookups.)
        if (self._f_links[self._inc_flow[entries]] != 1).any():
            return None
        return entries

    def _recompute(self, slots: np.ndarray, now: float, in_set: np.ndarray | None = None) -> None:
        """New rates and finish times of the flows in ``slots`` (sorted, or in the order
        they were added), from ``now``. ``in_set``: the positions of their incidence
        entries, where the caller has them."""
        if len(slots) == 0:
            return
        if self.scalar_events and len(slots) <= SMALL_ENTRIES:
            if in_set is None:
                in_set = self._entries_of(slots)
            # (Counted first: a few flows over long routes are the array path's, and
            # finding that out after reading the entries out cost more than it saved.)
            small = len(in_set) <= SMALL_ENTRIES
            if small and self._recompute_small(slots, now, in_set):
                return
        self.stats.recomputes += 1
        self.stats.recomputed_flows += len(slots)
        # Bring the bytes left up to now at the old rates.
        elapsed = now - self._f_last[slots]
        moving = (elapsed > 0) & (self._f_rate[slots] > 0)
        if moving.any():
            moved = slots[moving]
            self._f_left[moved] = np.maximum(
                self._f_left[moved] - self._f_rate[moved] * elapsed[moving], 0.0
            )
        self._f_last[slots] = now
        # Each slot's number among ``slots`` (-1: not among them), in a scratch array
        # that is all -1 between calls (allocating one per call cost more than the rest).
        local = self._local
        if len(local) != self._cap:
            local = self._local = np.full(self._cap, -1, dtype=np.int64)
        local[slots] = np.arange(len(slots))
        if in_set is None:
            in_set = local[self._inc_flow] >= 0
        inc_flow = local[self._inc_flow[in_set]]
        local[slots] = -1
        used = self._inc_link[in_set]
        if len(used) <= _SMALL:
            # A few entries (a quotient's step, a small collective): Python beats numpy's
            # sort-based unique here, with the same sorted result.
            links = np.array(sorted(set(used.tolist())), dtype=np.int64)
            inc_link = np.searchsorted(links, used)
        else:
            # The links used, marked in the scratch array (cleared again) and read off in
            # one pass: cheaper than numpy's sort-based unique of the entries (a 1,440-GPU
            # NVLS-tree all-reduce 28 -> 19 s), with the same sorted result.
            mark = self._link_mark
            mark[used] = True
            links = mark.nonzero()[0]
            mark[links] = False
            inc_link = np.searchsorted(links, used)
        coef = None if self._inc_coef is None else self._inc_coef[in_set]
        cap = self._f_cap[slots] if self._capped else None
        rate = max_min_rates(inc_flow, inc_link, len(slots), self.capacity[links], coef, cap)
        self._f_rate[slots] = rate
        left = self._f_left[slots]
        if rate.all():
            # No zero rate (the rule): the quotients taken only where bytes are left,
            # which np.where below takes too, without its warnings' switch.
            duration = np.divide(left, rate, out=np.zeros(len(left)), where=left > 0)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                duration = np.where(left > 0, left / rate, 0.0)
        self._f_finish[slots] = now + duration

    def _recompute_small(self, slots: np.ndarray, now: float, in_set: np.ndarray) -> bool:
        """:meth:`_recompute` of a few flows in Python floats, to the same bits: the same
        operations on the same doubles in the same order (bytes left brought up to now,
        the local link numbering in sorted link order, :func:`small_rates_list` for the
        max-min, ``left / rate`` where bytes are left), read and written back in a few
        numpy calls rather than the dozens of passes the array path makes. False (nothing
        changed) where a share is NaN: the array path then does it all. ``in_set``: the
        positions of the flows' incidence entries, at most :data:`SMALL_ENTRIES` of them."""
        entry_flow = self._inc_flow[in_set].tolist()
        entry_link = self._inc_link[in_set].tolist()
        ids = slots.tolist()
        where = {slot: index for index, slot in enumerate(ids)}
        flows = [where[slot] for slot in entry_flow]
        links = sorted(set(entry_link))
        number = {link: index for index, link in enumerate(links)}
        capacity = self.capacity[links].tolist() if links else []
        coef = None if self._inc_coef is None else self._inc_coef[in_set].tolist()
        cap = self._f_cap[slots].tolist() if self._capped else None
        rate = small_rates_list(
            flows, [number[link] for link in entry_link], len(ids), capacity, coef, cap
        )
        if rate is None:
            return False
        self.stats.recomputes += 1
        self.stats.recomputed_flows += len(ids)
        # Bytes left up to now at the old rates (np.maximum's choice kept: x when x >= 0).
        last = self._f_last[slots].tolist()
        old = self._f_rate[slots].tolist()
        left = self._f_left[slots].tolist()
        finish = []
        for index, rate_now in enumerate(rate):
            elapsed = now - last[index]
            if elapsed > 0 and old[index] > 0:
                value = left[index] - old[index] * elapsed
                left[index] = value if value >= 0.0 or value != value else 0.0
            remains = left[index]
            if remains > 0:
                duration = remains / rate_now if rate_now != 0.0 else INF
            else:
                duration = 0.0
            finish.append(now + duration)
        self._f_left[slots] = left
        self._f_last[slots] = now
        self._f_rate[slots] = rate
        self._f_finish[slots] = finish
        return True

    def _schedule_wake(self) -> None:
        self._generation += 1
        if self._top == 0:
            return
        target = float(self._f_finish[: self._top].min())
        if not math.isfinite(target):  # (on a Python float: no numpy call per event)
            return
        generation = self._generation
        wake = self.env.timeout(max(target - self.env.now, 0.0))
        wake.callbacks.append(lambda _event: self._wake(generation, target))

    # -- completions ------------------------------------------------------------------------
    def _wake(self, generation: int, target: float) -> None:
        if generation != self._generation:
            return  # rates changed since this wake-up was scheduled
        finish = self._f_finish[: self._top]
        # The pass over the pool into a scratch mask (overwritten each time), not a new
        # one: at two 1,024-GPU jobs the pool holds ~15,700 slots, and allocating the mask
        # cost about as much as comparing.
        due = self._due
        if len(due) != self._cap:
            due = self._due = np.empty(self._cap, dtype=bool)
        due = due[: self._top]
        np.less_equal(finish, target + _SAME_TIME * abs(target), out=due)
        done = due.nonzero()[0]
        # Record bytes per link before the incidence forgets these flows.
        on = self._entries_of(done)
        incidence = self._inc_flow
        carried = self._f_bytes[self._inc_flow[on]]
        if self._inc_coef is not None:
            carried = carried * self._inc_coef[on]
        np.add.at(self.link_bytes, self._inc_link[on], carried)
        ops, owners, routes = self._f_op[done], self._f_owner[done], self._f_route[done]
        self._f_finish[done] = np.inf
        self._f_op[done] = -1
        latency = None
        self._in_wake = True
        try:
            if len(done) == 1 or _all_equal(owners):
                # One owner (a collective's step): its flows as they are, no sort.
                split = [(int(owners[0]), None)]
            else:
                split = [(owner, owners == owner) for owner in np.unique(owners).tolist()]
            for owner, mine in split:
                target = self._owners[owner]  # on_sent may finish and release it
                if not getattr(target, "delivers", True):
                    # Nothing waits for these to arrive: no SimPy event that would call a
                    # no-op (it changed nothing: events keep their order without it).
                    target.on_sent(ops if mine is None else ops[mine])
                    continue
                if latency is None:
                    latency = self.route_latency(routes)
                if mine is None:
                    # A copy for each, as the masks give: on_sent may keep its array.
                    delivered, delay = ops.copy(), latency
                    target.on_sent(ops)
                else:
                    target.on_sent(ops[mine])
                    delivered, delay = ops[mine], latency[mine]
                wanted = getattr(target, "wants_delivery", None)
                if wanted is not None:  # the owner times some deliveries itself
                    keep = wanted(delivered)
                    delivered, delay = delivered[keep], delay[keep]
                if len(delivered):
                    self._deliver_later(target.on_delivered, delivered, delay)
        finally:
            self._in_wake = False
        self._settle(done, (incidence, on))
        self._free.append(done)  # only now: the settle above still names these slots

    def _deliver_later(
        self, callback: Callable[[np.ndarray], None], ops: np.ndarray, delay: np.ndarray
    ) -> None:
        """Call ``callback(ops)`` after each op's delay, one SimPy event per distinct delay."""
        if len(ops) == 1:
            event = self.env.timeout(float(delay[0]))
            event.callbacks.append(lambda _event: callback(ops))
            return
        if _all_equal(delay):  # one route latency for all: no sort
            delays, group = delay[:1], np.zeros(len(delay), dtype=np.int64)
        else:
            delays, group = np.unique(delay, return_inverse=True)
        for index, value in enumerate(delays.tolist()):
            members = ops if len(delays) == 1 else ops[group == index]
            event = self.env.timeout(value)
            event.callbacks.append(lambda _event, members=members: callback(members))

    # -- records ----------------------------------------------------------------------------
    def close_link_records(self) -> None:
        """Account busy time of links still carrying flows (call when a run ends)."""
        busy = (self._link_flows > 0).nonzero()[0]
        self.link_busy[busy] += self.env.now - self._link_since[busy]
        self._link_since[busy] = self.env.now

    def link_records(self) -> dict[str, list]:
        """Per-link records as plain data: endpoints, type, capacity, bytes, busy time.

        With aggregated flows every link of a class reports its representative's figures
        (they carried the same bytes over the same times)."""
        carried, busy = self.link_bytes, self.link_busy
        if self._link_class is not None:
            carried, busy = carried[self._link_class], busy[self._link_class]
        return {
            "src": [str(node) for node in self.links.src_node],
            "dst": [str(node) for node in self.links.dst_node],
            "link": list(self.links.kind),
            "bandwidth": self.links.capacity.tolist(),
            "bytes": carried.tolist(),
            "busy_s": busy.tolist(),
        }


def _all_equal(values: np.ndarray) -> bool:
    """Whether every one of ``values`` (not empty) equals the first, as
    ``values.min() == values.max()`` says (False where one is NaN): in Python for a few
    (two numpy reductions cost more than the comparisons), in numpy for more.

    >>> _all_equal(np.array([2.0, 2.0])), _all_equal(np.array([2.0, np.nan]))
    (True, False)
    """
    if len(values) > 16:
        return bool(values.min() == values.max())
    first, *rest = values.tolist()
    return first == first and all(value == first for value in rest)


def run_env(
    env: simpy.Environment,
    until: simpy.Event | None = None,
    progress: Callable[[float], None] | None = None,
) -> None:
    """``env.run(until)``, calling ``progress(env.now)`` each time simulated time advances.

    Without ``progress`` this is ``env.run(until)`` itself. With it, the same events run
    in the same order (SimPy's ``run`` is a loop over ``step`` too); like ``env.run``, a
    :class:`RuntimeError` says the events ran out before ``until`` was triggered.

    >>> env = simpy.Environment()
    >>> done = env.timeout(3)
    >>> _ = env.timeout(1), env.timeout(2)
    >>> seen = []
    >>> run_env(env, done, seen.append)
    >>> seen
    [1, 2, 3]
    """
    if progress is None:
        env.run(until=until)
        return
    shown = env.now
    try:
        while until is None or not until.processed:
            env.step()
            if env.now != shown:
                shown = env.now
                progress(shown)
    except simpy.core.EmptySchedule:
        if until is not None and not until.triggered:
            raise RuntimeError(
                f'No scheduled events left but "until" event was not triggered: {until}'
            ) from None
