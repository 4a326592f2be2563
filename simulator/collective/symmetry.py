"""Simulating symmetric ranks once: quotient schedules and link classes.

A ring all-reduce on a 1-D ring, or a hierarchical one on identical servers joined by a
rail, does the same thing on every rank (or every server) at the same times. Let sigma
move every rank ``b`` places on (``r -> r + b mod P``). When sigma maps the schedule onto
itself (each op onto an op with the same bytes, flags and dependencies) and the network
onto itself (the route of each image is the image of the route), every op and its images
start and finish together. Then it is enough to simulate one op per *orbit*, the
*representative* whose sender is in ``0..b-1``, and to let each of its flows stand for
its ``P / b`` images:

* **Quotient schedule** (:class:`Quotient`): the representatives, each depending on the
  representatives of its dependencies (same times, so the same start).
* **Link classes** (:class:`LinkSymmetry`): links joined by sigma's action on routes.
  The max-min rates of the full network are those of a network of class
  representatives where a flow of orbit F loads its class L with ``c(L, F)`` times its
  rate, ``c(L, F)`` being the number of F's flows on each link of L (it must be the same
  on every link of L, and the links of a class must have equal capacity: then
  progressive filling raises and freezes whole classes together). Both conditions are
  *checked* on the actual routes, so ECMP hashing, a slow link or an odd server breaks
  the symmetry and the caller falls back to simulating every flow.

Rank-local resources follow the same rule: the proxy and reducer of rank ``r`` behave as
those of ``r mod b``.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from ..algorithms.schedule import Schedule
from ..network.flows import FlowNetwork
from ..topology import servers_of_ranks
from ..topology.symmetry import server_shift
from .replay import route_pairs

#: At most this many rank shifts are tried before simulating every flow.
MAX_PERIODS_TRIED = 8


@dataclass
class Quotient:
    """One representative op per orbit of a schedule under a rank shift of ``period``.

    ``schedule`` holds the representatives (senders in ``0..period-1``) with
    dependencies among them; each op stands for ``ranks / period`` ops (its images) times
    ``multiplicity`` (identical side-by-side ops of one rank, None for 1). ``rep_of``
    and ``shift_of`` give, for each op of the full schedule when there is one, its
    representative and how many periods it is shifted from it (to expand records).
    """

    schedule: Schedule
    ranks: int
    period: int
    multiplicity: np.ndarray | None = None
    rep_of: np.ndarray | None = None
    shift_of: np.ndarray | None = None

    @property
    def orbit(self) -> int:
        """How many ops each representative stands for (per unit of multiplicity)."""
        return self.ranks // self.period

    def weights(self, ops: np.ndarray) -> np.ndarray:
        """Flows each of ``ops``' flows stands for."""
        if self.multiplicity is None:
            return np.full(len(ops), float(self.orbit))
        return self.orbit * self.multiplicity[ops].astype(float)

    def fold(self, ranks: np.ndarray) -> np.ndarray:
        """The rank in ``0..period-1`` that stands for each rank."""
        return np.asarray(ranks) % self.period


@dataclass
class LinkSymmetry:
    """Classes of equivalent links: ``link_class[l]`` is the representative of link
    ``l``'s class and ``class_size[l]`` the size of that class."""

    link_class: np.ndarray
    class_size: np.ndarray


def candidate_periods(ranks: int, ranks_per_server: int | None) -> list[int]:
    """Rank shifts worth trying, smallest first: proper divisors of ``ranks``, only whole
    servers when there are several (a shift inside a server would move GPUs to other
    local indices, which rarely maps a multi-server network onto itself). The checks
    decide; this only orders and bounds the tries.

    >>> candidate_periods(16, 4), candidate_periods(6, None), candidate_periods(8, 8)
    ([4, 8], [1, 2, 3], [1, 2, 4])
    """
    g = ranks_per_server if ranks_per_server and ranks_per_server < ranks else 1
    periods = [b for b in range(g, ranks, g) if ranks % b == 0]
    return periods[:MAX_PERIODS_TRIED]


#: Neighbours with more links than this (a fabric switch) are not looked through by
#: :func:`neighbourhoods`: every GPU would see the same switch, at quadratic cost.
_LOOK_THROUGH = 64


def neighbourhoods(graph: nx.Graph, gpus: list) -> list[tuple]:
    """What each rank's GPU sees of the network within two links (each link's bandwidth
    and latency, by distance; not through fabric switches), as a sortable signature.

    A rank shift that maps the network onto itself maps each rank's neighbourhood onto
    its image's, so ranks ``b`` apart must have equal signatures: a necessary condition,
    cheap next to building a quotient of millions of ops (a slow NIC link or GPU link
    fails it at once; a slow link deeper in the fabric is left to the full check).
    """
    adj = graph.adj

    def link(a: object, b: object, depth: int) -> tuple:
        data = adj[a][b]
        return (depth, float(data.get("bandwidth", 0.0)), float(data.get("latency", 0.0)))

    signatures = []
    for gpu in gpus:
        seen = []
        for near in adj[gpu]:
            seen.append(link(gpu, near, 1))
            if len(adj[near]) <= _LOOK_THROUGH:
                seen.extend(link(near, far, 2) for far in adj[near] if far != gpu)
        signatures.append(tuple(sorted(seen)))
    return signatures


def periodic(signatures: list[tuple], period: int) -> bool:
    """Whether ``signatures[r] == signatures[r % period]`` for every rank ``r``."""
    return all(sig == signatures[r % period] for r, sig in enumerate(signatures))


def schedule_quotient(schedule: Schedule, period: int) -> Quotient | None:
    """The quotient of ``schedule`` under the shift of every rank by ``period``, or None
    when the shift does not map the schedule onto itself.

    An op's image must exist with the same channel, step, chunk, path, bytes and
    reduction flag, and its dependencies must be the images of the op's (the same
    representatives, shifted alike). Several ops with the same ranks and labels (blocks
    sent side by side) are matched in op order.

    >>> from simulator.algorithms import build_schedule
    >>> from simulator.algorithms.base import RankLayout
    >>> full = build_schedule("ring", "all_reduce", RankLayout(4), 4e6, chunks=2)
    >>> q = schedule_quotient(full, 1)
    >>> full.n_ops, q.schedule.n_ops, q.orbit
    (48, 12, 4)
    """
    p, n = schedule.ranks, schedule.n_ops
    if period <= 0 or period >= p or p % period or n == 0:
        return None
    orbit = p // period
    src = schedule.src.astype(np.int64)
    shift = src // period
    dst0 = (schedule.dst.astype(np.int64) - shift * period) % p
    # One integer per op: its ranks moved back by its shift, and its labels ...
    key = np.zeros(n, dtype=np.int64)
    for values in (src - shift * period, dst0, schedule.channel, schedule.step, schedule.chunk):
        values = values.astype(np.int64)
        span = int(values.max()) + 1 if len(values) else 1
        if values.min(initial=0) < 0 or (int(key.max()) + 1) * span * 6 * orbit > 2**62:
            return None  # labels too wide to pack: simulate every flow
        key = key * span + values
    key = key * 6 + schedule.path.astype(np.int64)
    # ... then sorted by key, shift and op id: ops with one key form a group.
    order = np.argsort(key * orbit + shift, kind="stable")
    sorted_key = key[order]
    new_key = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
    del key, sorted_key
    key_start = np.flatnonzero(new_key)
    key_size = np.diff(np.r_[key_start, n])
    if (key_size % orbit).any():
        return None
    # Within a key group, ops sorted by shift: m per shift when the group is symmetric.
    group = np.cumsum(new_key) - 1
    m = key_size // orbit
    position = np.arange(n) - key_start[group]
    if not np.array_equal(shift[order], position // m[group]):
        return None
    rep_of = np.empty(n, dtype=np.int64)
    rep_of[order] = order[key_start[group] + position % m[group]]
    del order, group, position
    # The same bytes, flags and number of dependencies as the representative ...
    for values in (schedule.nbytes, schedule.reduce, np.diff(schedule.dep_ptr)):
        if not np.array_equal(values, values[rep_of]):
            return None
    # ... and dependencies on the images of the representative's, shifted alike: each
    # op's dependencies (representative, relative shift, kind) as an unordered set, by
    # two independent 64-bit hashes summed over the set (a false match has odds of
    # about 2**-128).
    owner = np.repeat(np.arange(n), np.diff(schedule.dep_ptr))
    dep = schedule.dep_idx.astype(np.int64)
    code = ((rep_of[dep] * orbit + (shift[dep] - shift[owner]) % orbit) << 1) | (
        schedule.dep_sent.astype(np.int64)
    )
    del owner, dep
    starts = schedule.dep_ptr[:-1]
    has = np.diff(schedule.dep_ptr) > 0
    for salt in (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03):
        mixed = _mix(code.astype(np.uint64) ^ np.uint64(salt))
        row = np.zeros(n, dtype=np.uint64)
        if len(mixed):
            row[has] = np.add.reduceat(mixed, starts[has])
        if not np.array_equal(row, row[rep_of]):
            return None
    reps = np.flatnonzero(shift == 0)
    if (rep_of[reps] != reps).any():
        return None
    index = np.full(n, -1, dtype=np.int64)
    index[reps] = np.arange(len(reps))
    quotient = schedule.subset(reps, index[rep_of])
    return Quotient(
        schedule=quotient,
        ranks=p,
        period=period,
        rep_of=index[rep_of],
        shift_of=shift,
    )


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 arrays (wrapping arithmetic): a bijection that
    spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def link_symmetry(network: FlowNetwork, quotient: Quotient) -> LinkSymmetry | None:
    """Classes of links under the quotient's rank shift, or None when the network is not
    symmetric for this schedule's flows (see the module docstring for what is checked).

    Where the shift moves whole servers and maps the graph onto itself
    (:func:`simulator.topology.symmetry.server_shift`), the classes are the link map's
    orbits and each image of a route that is the only shortest path is the route's image,
    so only the representatives are routed; ECMP and special routes are routed image by
    image and must be the images. Otherwise every image is routed and links are joined by
    the shift's action on the routes.
    """
    graph = network.graph
    servers = servers_of_ranks(graph)
    g = None if servers is None else quotient.ranks // len(set(servers))
    phi = None
    if g and quotient.period % g == 0 and g < quotient.ranks:
        phi = server_shift(graph, quotient.period // g)
    if phi is None:
        return _symmetry_from_routes(network, quotient)
    links = network.links
    n_links = len(links)
    index = links.index
    psi = np.array(
        [index[(phi[a], phi[b])] for a, b in zip(links.src_node, links.dst_node, strict=True)],
        dtype=np.int64,
    )
    label = _components(np.arange(n_links, dtype=np.int64), np.arange(n_links), psi)
    q, p, b, orbit = quotient.schedule, quotient.ranks, quotient.period, quotient.orbit
    router = network.router
    pairs = unique_rows(np.stack([q.src, q.dst, q.channel, q.path.astype(np.int32)], axis=1))
    src, dst, channel, path = (pairs[:, i] for i in range(4))
    path = path.astype(np.int8)
    routes = route_pairs(router, src, dst, channel, path if path.any() else None)
    ptr, flat, _ = router.arrays()
    starts, lengths = ptr[routes], ptr[routes + 1] - ptr[routes]
    first = flat[np.repeat(starts, lengths) + _ragged_arange(lengths)]
    # Images of every representative route under the link map: image k in row k.
    images = np.empty((orbit, len(first)), dtype=np.int64)
    images[0] = first
    for k in range(1, orbit):
        images[k] = psi[images[k - 1]]
    # Routes that are not the only shortest path (ECMP) or not shortest paths at all
    # (through the NICs, into switches) are routed image by image: they must agree.
    special = (path != 0) | ~router.single_path(src, dst)
    if special.any():
        shifts = np.arange(orbit, dtype=np.int64) * b
        for i in np.flatnonzero(special).tolist():
            routed = route_pairs(
                router,
                (src[i] + shifts) % p,
                (dst[i] + shifts) % p,
                np.full(orbit, channel[i]),
                np.full(orbit, path[i], dtype=np.int8) if path[i] else None,
            )
            offset = int(np.sum(lengths[:i]))
            ptr, flat, _ = router.arrays()  # routing them may have added routes
            for k, route in enumerate(routed.tolist()):
                mine = flat[ptr[route] : ptr[route + 1]]
                if not np.array_equal(mine, images[k, offset : offset + lengths[i]]):
                    return None
    owner = np.repeat(np.arange(len(pairs)), lengths)
    kind = np.unique(np.array(links.kind, dtype=object), return_inverse=True)[1]
    checks = [network.capacity[:n_links], kind.astype(float)]
    checks += [
        np.bincount(images[:, owner == i].ravel(), minlength=n_links).astype(float)
        for i in range(len(pairs))
    ]
    if not _uniform(label, checks):
        return None
    size = np.bincount(label, minlength=n_links)
    return LinkSymmetry(link_class=label, class_size=size[label].astype(float))


def _ragged_arange(lengths: np.ndarray) -> np.ndarray:
    """``0..l-1`` for each length ``l``, concatenated."""
    total = int(np.sum(lengths))
    return np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _uniform(label: np.ndarray, checks: list[np.ndarray]) -> bool:
    """Whether each array of ``checks`` is constant on every class of ``label``."""
    for values in checks:
        low = np.full(len(label), np.inf)
        high = np.full(len(label), -np.inf)
        np.minimum.at(low, label, values)
        np.maximum.at(high, label, values)
        if (low[label] != high[label]).any():
            return False
    return True


def _symmetry_from_routes(network: FlowNetwork, quotient: Quotient) -> LinkSymmetry | None:
    """:func:`link_symmetry` without a graph automorphism: every image is routed."""
    q = quotient.schedule
    p, b, orbit = quotient.ranks, quotient.period, quotient.orbit
    router = network.router
    # Each distinct connection of the representatives, and its images.
    fields = np.stack([q.src, q.dst, q.channel, q.path.astype(np.int32)], axis=1)
    pairs = unique_rows(fields)
    shifts = np.arange(orbit, dtype=np.int64) * b
    src = ((pairs[:, 0][:, None] + shifts) % p).ravel()
    dst = ((pairs[:, 1][:, None] + shifts) % p).ravel()
    channel = np.repeat(pairs[:, 2], orbit)
    path = np.repeat(pairs[:, 3], orbit).astype(np.int8)
    routes = route_pairs(router, src, dst, channel, path if path.any() else None).reshape(
        len(pairs), orbit
    )
    ptr, flat, latency = router.arrays()
    lengths = ptr[routes + 1] - ptr[routes]
    if (lengths != lengths[:, :1]).any() or (latency[routes] != latency[routes[:, :1]]).any():
        return None
    n_links = len(network.links)
    label = np.arange(n_links, dtype=np.int64)
    columns: list[np.ndarray] = []  # per connection: link ids, shape (orbit, length)
    for row, length in zip(routes, lengths[:, 0].tolist(), strict=True):
        starts = ptr[row]
        columns.append(flat[starts[:, None] + np.arange(length)])
    # Join each link of a representative's route with the same hop of its images.
    a = np.concatenate([c.ravel() for c in columns])
    first = np.concatenate([np.broadcast_to(c[:1], c.shape).ravel() for c in columns])
    label = _components(label, a, first)
    size = np.bincount(label, minlength=n_links)
    # Equal capacity and kind inside a class; equal load of each connection's flows on
    # every link of a class.
    kind = np.unique(np.array(network.links.kind, dtype=object), return_inverse=True)[1]
    checks = [network.capacity[:n_links], kind.astype(float)]
    checks += [np.bincount(c.ravel(), minlength=n_links).astype(float) for c in columns]
    if not _uniform(label, checks):
        return None
    return LinkSymmetry(link_class=label, class_size=size[label].astype(float))


def _components(label: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected components of the graph with edges ``a[i] - b[i]`` over ``label``'s
    nodes, as the smallest node id of each component (label propagation with pointer
    jumping)."""
    label = label.copy()
    if len(a) == 0:
        return label
    while True:
        low = np.minimum(label[a], label[b])
        before = label.copy()
        np.minimum.at(label, a, low)
        np.minimum.at(label, b, low)
        while True:  # point every node at its label's label
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
        if np.array_equal(label, before):
            return label


def reduce_bandwidth_symmetric(reduce_bandwidth: np.ndarray, period: int) -> bool:
    """Whether ranks ``period`` apart reduce at the same bandwidth."""
    values = np.asarray(reduce_bandwidth, dtype=float)
    if len(values) % period:
        return False
    folded = values.reshape(-1, period)
    return bool((folded == folded[:1]).all())


def unique_rows(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows, axis=0)`` (the distinct rows, in lexicographic order) by one
    lexsort, without the row-view sort numpy uses for ``axis=0``, which is much slower
    on millions of rows.

    >>> unique_rows(np.array([[1, 2], [0, 5], [1, 2]])).tolist()
    [[0, 5], [1, 2]]
    """
    if len(rows) == 0:
        return rows
    ordered = rows[np.lexsort(rows.T[::-1])]
    keep = np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]
    return ordered[keep]
