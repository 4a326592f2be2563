"""Timing a call alone on the links that can limit its flows, checked against the rest.

A call timed alone (:mod:`simulator.workload.isolated`) is run flow by flow on a scratch
network, once per *signature*: its routes up to renaming the links. On a fabric that
hashes routes (ECMP on a leaf-spine or fat-tree) nearly every data-parallel group's call
has a signature of its own, because its channels land on other spines, so each one is
simulated again, although the spines it crosses seldom limit anything: every flow of a
ring leaves through its GPU's NIC, and the four or sixteen channels sharing that NIC
are what sets their rates.

Max-min fair rates do not change when a constraint that the others imply is dropped:
if every flow on link L also crosses one of the links A_1..A_k that stay, the flows on
L together get at most cap(A_1) + ... + cap(A_k); when that is no more than cap(L), L
can never be the bottleneck of anything, the feasible rates with and without L are the
same, and so is the (unique) max-min allocation at every instant. Here each flow keeps
its *anchor*, the first link of least capacity on its route, and every other link is
dropped; the call is run on the anchors alone (flows delivered after their whole
route's latency, with their whole route's protocol class), and then every dropped link
is *checked*: at every instant, the anchors of the flows on it then (each counted once)
must add up to no more than its capacity. A link that fails joins the kept links and
the call runs again; at worst every link is kept, the reference itself.

What is shared is that run: calls whose kept routes are the same up to renaming (the
same schedule, protocol, reducers, per-transfer route latency and path class) share
it, and each call's records on its own links (bytes, busy time, last use, flow-seconds)
follow from its flows' intervals, [start, sent) on every link of each route. Ring calls
of a hashed fabric fall into a few such classes instead of one per group.

Scope: every rank simulated (no link classes), no flows taken over, no timed faults (as
for every timing alone).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..algorithms.schedule import csr_gather
from ..collective.mixed import _previous_max
from ..collective.replay import ScheduleReplay
from ..network.flows import FlowNetwork

#: A dropped link may carry its flows' anchors' capacities up to this relative excess
#: (rounding of equal capacities, e.g. a 400 Gb/s NIC into a 400 Gb/s leaf port).
_SLACK = 1e-9
#: Intervals overlapping by less than this (relative to the time, at least 1 s) touch,
#: as in the contention-free pass: one flow sent at the instant another starts.
_TOUCH = 1e-12
#: Rounds of adding links that failed the check before the caller simulates every flow.
MAX_ROUNDS = 4


@dataclass
class RouteShape:
    """A call's routes on the real network: ``routes`` the distinct ones (ids), each
    op's index into them, and per distinct route its links, latency (message cost
    included), path class and anchor (the first link of least capacity; -1: no link)."""

    routes: np.ndarray
    op_route: np.ndarray
    links: list[np.ndarray]
    latency: np.ndarray
    classes: list[str]
    anchor: np.ndarray


def route_shape(network: FlowNetwork, routes: np.ndarray) -> RouteShape:
    """The shape of a call whose op ``i`` takes route ``routes[i]`` on ``network``."""
    unique, op_route = np.unique(routes, return_inverse=True)
    ptr, flat, latency = network.router.arrays()
    links = [flat[ptr[r] : ptr[r + 1]] for r in unique.tolist()]
    capacity = network.capacity
    anchor = np.array(
        [int(chain[np.argmin(capacity[chain])]) if len(chain) else -1 for chain in links],
        dtype=np.int64,
    )
    return RouteShape(
        unique,
        op_route.reshape(-1),
        links,
        latency[unique].copy(),
        network.route_classes(unique),
        anchor,
    )


def kept_routes(shape: RouteShape, kept: set[int]) -> list[tuple[int, ...]]:
    """Each distinct route's links that are kept, in route order."""
    return [tuple(link for link in chain.tolist() if link in kept) for chain in shape.links]


def reduced_signature(
    base: bytes,
    shape: RouteShape,
    reduced: list[tuple[int, ...]],
    attributes: Callable[[np.ndarray], np.ndarray],
    kinds: Callable[[np.ndarray], list[str]],
) -> bytes:
    """A digest of what sets the reduced run besides link names: ``base`` (the
    schedule, protocol, reducers, ...), each op's kept route (numbered by first use,
    its links numbered by first use), latency and path class, and the kept links'
    ``attributes(links)`` and ``kinds`` (functions of link ids)."""
    # Distinct (kept route, latency, class), numbered by first use over the ops, so
    # that calls alike up to renaming links number them alike (their whole routes,
    # which may differ where the dropped links do, do not count).
    keys = [(reduced[r], shape.latency[r].item(), shape.classes[r]) for r in range(len(reduced))]
    index: dict[tuple, int] = {}
    route_key = np.array([index.setdefault(key, len(index)) for key in keys], dtype=np.int64)
    op_key = route_key[shape.op_route]
    first = np.full(len(index), len(op_key), dtype=np.int64)
    np.minimum.at(first, op_key, np.arange(len(op_key)))
    by_use = np.argsort(first, kind="stable")
    renumber = np.empty(len(index), dtype=np.int64)
    renumber[by_use] = np.arange(len(index))
    distinct = list(index)
    number: dict[int, int] = {}
    order: list[int] = []
    shapes = []
    for k in by_use.tolist():
        links, latency, cls = distinct[k]
        chain = []
        for link in links:
            if link not in number:
                number[link] = len(order)
                order.append(link)
            chain.append(number[link])
        shapes.append((tuple(chain), latency, cls))
    digest = hashlib.blake2b(base, digest_size=20)
    digest.update(renumber[op_key].tobytes())
    digest.update(repr(shapes).encode())
    links = np.array(order, dtype=np.int64)
    digest.update(np.ascontiguousarray(attributes(links)).tobytes())
    digest.update("|".join(kinds(links)).encode())
    return digest.digest()


class StandInReplay(ScheduleReplay):
    """A :class:`ScheduleReplay` whose flows take stand-in routes (``stand_in[op]``: a
    route over the kept links with the whole route's latency); its protocol latencies
    and proxies follow the whole routes, as the reference's do."""

    def __init__(self, *args, stand_in: np.ndarray, **kwargs):
        super().__init__(*args, **kwargs)
        self._stand_in = stand_in

    def _send(self, ops: np.ndarray, routes: np.ndarray) -> None:
        super()._send(ops, self._stand_in[ops])

    def intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per op, when its flow started and when it was sent (from the call's start),
        and the bytes it carried (its protocol's wire bytes)."""
        wire = np.broadcast_to(np.asarray(self._wire, dtype=float), (self.schedule.n_ops,))
        return self._flow_start - self.t0, self.sent_s - self.t0, wire.copy()


@dataclass
class ReducedRun:
    """A reduced call run alone: per op, when its flow started and was sent (from the
    call's start); per position of the group, when it was done; per reducer (in the
    order of the call's footprint) its bytes, busy time, last idle instant and
    flow-seconds; the bytes each op's flow carried; the flows simulated."""

    flow_start: np.ndarray
    sent: np.ndarray
    done_at: np.ndarray
    reducers: np.ndarray
    wire: np.ndarray
    flows: int
    represented: float


def incidence(shape: RouteShape) -> tuple[np.ndarray, np.ndarray]:
    """Each op's links as (op, link) entries."""
    lengths = np.array([len(chain) for chain in shape.links], dtype=np.int64)
    ptr = np.zeros(len(shape.links) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    flat = np.concatenate(shape.links) if shape.links else np.zeros(0, dtype=np.int64)
    op_len = lengths[shape.op_route]
    inc_op = np.repeat(np.arange(len(shape.op_route), dtype=np.int64), op_len)
    inc_link = csr_gather(ptr, flat.astype(np.int64), shape.op_route)
    return inc_op, inc_link


def suspect_links(shape: RouteShape, kept: set[int], capacity: np.ndarray) -> list[int]:
    """Dropped links whose flows' anchors, all at once, add up to more than its
    capacity: the only ones :func:`binding_links` may find (most links pass here)."""
    anchors: dict[int, set[int]] = {}
    for chain, anchor in zip(shape.links, shape.anchor.tolist(), strict=True):
        for link in chain.tolist():
            if link not in kept:
                anchors.setdefault(link, set()).add(anchor)
    return [
        link
        for link, mine in anchors.items()
        if sum(float(capacity[a]) for a in mine) > capacity[link] * (1 + _SLACK)
    ]


def binding_links(
    shape: RouteShape,
    kept: set[int],
    run: ReducedRun,
    capacity: np.ndarray,
    entries: tuple[np.ndarray, np.ndarray],
) -> set[int]:
    """Dropped links on which, at some instant, the anchors of the flows then on it
    (each once) add up to more than its capacity: those that may have limited a flow.
    A run stopped early (its flows not started then starting and ending there, those
    not sent ending there) gives some of them: its intervals are the full run's cut
    there, and an instant's load only grows as intervals grow or are added."""
    suspects = suspect_links(shape, kept, capacity)
    if not suspects:
        return set()
    # Then over time, for the links that could be over.
    inc_op, inc_link = entries
    anchor = shape.anchor[shape.op_route][inc_op]
    bad: set[int] = set()
    for suspect in suspects:
        on = inc_link == suspect
        lo, hi = run.flow_start[inc_op[on]], run.sent[inc_op[on]]
        if _peak(lo, hi, anchor[on], capacity) > capacity[suspect] * (1 + _SLACK):
            bad.add(suspect)
    return bad


def _peak(lo: np.ndarray, hi: np.ndarray, anchor: np.ndarray, capacity: np.ndarray) -> float:
    """The most, over time, that the anchors of the intervals [lo, hi) open at once add
    up to, each anchor counted once (intervals that only touch do not meet)."""
    tol = _TOUCH * np.maximum(np.abs(lo), 1.0)
    live = hi - lo > tol
    events: list[tuple[float, int, int]] = []
    # Per anchor, its intervals merged: while any is open, its capacity counts once.
    for a in np.unique(anchor[live]).tolist():
        mine = live & (anchor == a)
        starts, ends = lo[mine], hi[mine]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        block_lo, block_hi = float(starts[0]), float(ends[0])
        for s, e in zip(starts[1:].tolist(), ends[1:].tolist(), strict=True):
            if s + _TOUCH * max(abs(s), 1.0) < block_hi:
                block_hi = max(block_hi, e)
            else:
                events += [(block_lo, 1, a), (block_hi, 0, a)]
                block_lo, block_hi = s, e
        events += [(block_lo, 1, a), (block_hi, 0, a)]
    # Ends before starts at the same instant (and within rounding of it).
    events.sort(key=lambda event: (event[0] * (1 + _TOUCH) if event[1] else event[0], event[1]))
    level = peak = 0.0
    for _, opening, a in events:
        level += float(capacity[a]) if opening else -float(capacity[a])
        peak = max(peak, level)
    return peak


def link_records(
    run: ReducedRun, entries: tuple[np.ndarray, np.ndarray], links: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bytes, busy time, last idle instant and flow-seconds on each of ``links`` (graph
    links of the call's routes), from its flows' intervals [start, sent): what the
    network records for a link while flows are on it."""
    inc_op, inc_link = entries
    position = np.full(int(max(links.max(initial=-1), inc_link.max(initial=-1))) + 1, -1)
    position[links] = np.arange(len(links))
    where = position[inc_link]
    lo, hi = run.flow_start[inc_op], run.sent[inc_op]
    m = len(links)
    nbytes = np.bincount(where, weights=run.wire[inc_op], minlength=m)
    flow_s = np.bincount(where, weights=hi - lo, minlength=m)
    idle = np.full(m, -np.inf)
    np.maximum.at(idle, where, hi)
    # Busy: the union of each link's intervals (sorted by start, the part of each
    # beyond the latest end before it).
    order = np.lexsort((lo, where))
    w, lo, hi = where[order], lo[order], hi[order]
    before = _previous_max(w, hi)
    covered = np.maximum(hi - np.maximum(lo, before), 0.0)
    busy = np.bincount(w, weights=covered, minlength=m)
    return nbytes, busy, np.where(np.isfinite(idle), idle, 0.0), flow_s
