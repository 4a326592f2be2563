"""Data-parallel replicas simulated once: one replica's ranks stand for all of them.

A Megatron step of ``dp`` replicas does the same thing in every replica at the same
times when the cluster looks the same from each: the step's generator then builds the
first replica's ops only (:class:`~simulator.workload.trace.Replicas`), and the replay
simulates those, each flow standing for its ``dp`` images. Let sigma move every rank to
the rank that does its work in the next replica. This module checks, before and during a
replay, that sigma really is a symmetry of the run, so that the result is that of the
full workload (to rounding), and says why not when it is not:

* **The cluster.** sigma moves whole servers, and the server permutation it induces maps
  the graph onto itself with every node and link attribute
  (:func:`~simulator.topology.symmetry.server_permutation`); or, where no few replicas
  together move whole servers (a GB200 NVL72 rack holding a pipeline stage of ``dp``
  replicas side by side), sigma's map of the GPUs extends to such a map of the whole
  graph, each NIC going with its GPU and each rail's leaf with its NICs
  (:func:`~simulator.topology.symmetry.gpu_permutation`; refused up front where a
  pipeline send or a group crosses servers over paths ECMP hashes, see
  :func:`_gpu_maps`; issue 31: DGX Cloud's Llama 3.1 405B on 512 GB200, 35 s -> 6-8 s
  of CPU, the same step). The links then fall into *classes*, the orbits of the link
  map, on which
  :meth:`~simulator.network.flows.FlowNetwork.set_link_classes` aggregates flows: a flow
  of weight ``dp`` loads each link of its class ``dp / |class|`` times per link it
  crosses, which is exactly how its ``dp`` images load them (the images of a route are
  spread evenly over each orbit, since the set of images is itself invariant).
* **The routes.** The only shortest path between two GPUs is mapped onto the only
  shortest path between their images; ECMP-hashed and special routes (through NICs, into
  switches) are routed image by image and must be the images of the route
  (:meth:`ReplicaSymmetry.check_routes`, once per distinct call as the replay goes).
* **The groups.** A group either lies inside the first replica, or *spans* the replicas
  (a data-parallel group) listing its ranks in sigma's order, the first replica's
  ``period = len / dp`` first. A spanning group's call runs as its schedule's quotient
  under a shift of ``period`` positions
  (:func:`~simulator.collective.symmetry.schedule_quotient`): when the library's
  schedule has no such symmetry (a tree), the replay stops and the caller builds the
  full workload.
* **Nothing else breaks it**: no faults (stragglers, jitter and degraded links are
  placed on particular ranks), and no per-rank compute scaling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..algorithms.schedule import PATH_PXN, Schedule
from ..collective.replay import route_pairs
from ..collective.symmetry import Quotient, schedule_quotient
from ..network.faults import fault_plan
from ..network.flows import FlowNetwork
from ..network.routing import Router
from ..topology.graph import gpu_nodes, servers_of_ranks
from ..topology.symmetry import gpu_permutation, server_permutation
from .shadows import HASHED_SENDS, crosses_hashed, sends_hash
from .trace import Workload


class Asymmetric(Exception):
    """The replay met a call that breaks the replicas' symmetry (its message says how);
    the caller replays the full workload instead, or, where ``together`` says that the
    call repeats every so many replicas, takes that many at a time."""

    def __init__(self, message: str, together: int | None = None):
        super().__init__(message)
        self.together = together


@dataclass
class ReplicaSymmetry:
    """How one replica stands for ``count``: ``shift[r]`` is rank r's image in the next
    replica (identity on GPUs the workload does not use); ``link_class`` and
    ``class_size`` the orbits of the link map; ``period`` the positions of each spanning
    group (by name) that the first replica holds."""

    count: int
    shift: np.ndarray
    psi: np.ndarray
    link_class: np.ndarray
    class_size: np.ndarray
    period: dict[str, int]
    _checked: dict = field(default_factory=dict, repr=False)
    #: Per schedule (by id) its distinct (position, position, channel, path) rows; the
    #: distinct (rank, rank, channel, path) rows already checked (as bytes).
    _positions: dict = field(default_factory=dict, repr=False)
    _pairs_checked: set = field(default_factory=set, repr=False)
    _quotients: dict = field(default_factory=dict, repr=False)
    #: Whether the shift keeps every rank's position in its server (found on first use).
    _positions_kept: bool | None = field(default=None, repr=False)

    def quotient(self, schedule: Schedule, group: str) -> Quotient:
        """The quotient a spanning group's call runs (cached per schedule); raises
        :class:`Asymmetric` when the schedule does not repeat every ``period`` ranks."""
        period = self.period[group]
        key = (id(schedule), period)
        found = self._quotients.get(key)
        if found is None:
            quotient = schedule_quotient(schedule, period)
            if quotient is None or quotient.multiplicity is not None:
                # How many replicas it does repeat over (a ring alternating its direction
                # from server to server: two), if any.
                together = next(
                    (
                        k
                        for k in range(2, self.count)
                        if self.count % k == 0 and _plain(schedule_quotient(schedule, period * k))
                    ),
                    None,
                )
                raise Asymmetric(
                    f"the {schedule.algorithm} {schedule.op} of group {group!r} does not "
                    f"repeat from one replica to the next",
                    together,
                )
            found = self._quotients[key] = (quotient, schedule)  # keeps the id valid
        return found[0]

    def check_routes(self, network: FlowNetwork, schedule: Schedule, ranks: np.ndarray) -> None:
        """Check that the images of a call's routes under every power of the shift are
        the routes of its images (once per schedule and ranks); raises
        :class:`Asymmetric` when one is not. ``ranks`` 2-D: several calls of the same
        schedule, one a row, checked together (a send's images on the shadows)."""
        many = ranks.reshape(-1, ranks.shape[-1])
        keys = [(id(schedule), row.tobytes()) for row in many]
        todo = [i for i, key in enumerate(keys) if key not in self._checked]
        if not todo:
            return
        router = network.router
        # The schedule's distinct (position, position, channel, path) rows, once per
        # schedule, then the ranks': the distinct rows of the ranks' are those of the
        # positions' mapped (a call's ops are thousands, its distinct pairs a few dozen).
        found = self._positions.get(id(schedule))
        if found is None:
            path = schedule.path if schedule.path.any() else np.zeros(schedule.n_ops, np.int8)
            fields = np.stack([schedule.src, schedule.dst, schedule.channel, path], axis=1)
            found = self._positions[id(schedule)] = (
                _unique_rows(fields.astype(np.int64)),
                schedule,  # keeps the id valid
            )
        rows = found[0]
        calls = many[todo]
        mapped = [
            calls[:, rows[:, 0]].ravel(),
            calls[:, rows[:, 1]].ravel(),
            np.tile(rows[:, 2], len(todo)),
            np.tile(rows[:, 3], len(todo)),
        ]
        pairs = _unique_rows(np.stack(mapped, axis=1).astype(np.int64))
        # What follows depends on the pairs alone (each pair is checked on its own):
        # calls of other sizes over the same ranks (a bucket's, a layer's) have been
        # checked with them.
        pair_key = pairs.tobytes()
        if pair_key in self._pairs_checked:
            for i in todo:
                self._checked[keys[i]] = schedule
            return
        # Pairs with a special path code are never asked for their shortest route here:
        # a PXN pair's direct route between rails is an ECMP search over the spines.
        special = pairs[:, 3] != 0
        plain = np.flatnonzero(~special)
        special[plain] = ~router.single_path(pairs[plain, 0], pairs[plain, 1])
        special &= ~self._images_follow(router, pairs)
        if special.any():
            these = pairs[special]
            labels = these[:, 2]
            codes = these[:, 3].astype(np.int8)
            routes = route_pairs(router, these[:, 0], these[:, 1], labels, codes)
            a, b = these[:, 0].copy(), these[:, 1].copy()
            images = [self._links(network, r) for r in routes.tolist()]
            for _ in range(1, self.count):
                a, b = self.shift[a], self.shift[b]
                images = [self.psi[links] for links in images]
                routed = route_pairs(router, a, b, labels, codes)
                for i, route in enumerate(routed.tolist()):
                    if not np.array_equal(self._links(network, route), images[i]):
                        raise Asymmetric(
                            f"the route from {router.nodes[int(these[i, 0])]} to "
                            f"{router.nodes[int(these[i, 1])]} (ECMP or a special path) is "
                            "not the same in every replica"
                        )
        for i in todo:
            self._checked[keys[i]] = schedule  # keeps the id in the key valid
        self._pairs_checked.add(pair_key)

    def _images_follow(self, router: Router, pairs: np.ndarray) -> np.ndarray:
        """Which (src, dst, channel, path) rows' routes are the images of each other in
        every replica by construction, so need no search image by image: PXN routes
        whose legs (sender to the GPU on the receiver's rail, over NVLink; that GPU to
        the receiver) are each the only shortest path, when the shift keeps every
        rank's position in its server. The shift's server map is a graph automorphism
        (every attribute; :func:`replica_symmetry`), which maps the only shortest path
        between two nodes onto the only one between their images, and PXN's choice of
        the GPU in between goes by server and position, which the shift keeps. ECMP
        hashes ranks, so multipath legs are still checked image by image."""
        follow = np.zeros(len(pairs), dtype=bool)
        pxn = np.flatnonzero(pairs[:, 3] == PATH_PXN)
        if len(pxn) == 0:
            return follow
        if self._positions_kept is None:
            positions = router.local_positions()
            self._positions_kept = bool(np.array_equal(positions[self.shift], positions))
        if not self._positions_kept:
            return follow
        for i in pxn.tolist():
            s, d, label = int(pairs[i, 0]), int(pairs[i, 1]), int(pairs[i, 2])
            via = router.pxn_via(s, d, label)
            legs = [(s, d)] if via is None else [(s, via), (via, d)]
            a = np.array([leg[0] for leg in legs])
            b = np.array([leg[1] for leg in legs])
            follow[i] = bool(router.single_path(a, b).all())
        return follow

    @staticmethod
    def _links(network: FlowNetwork, route: int) -> np.ndarray:
        ptr, flat, _ = network.router.arrays()
        return flat[ptr[route] : ptr[route + 1]].astype(np.int64)


def _unique_rows(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows, axis=0)`` for rows of non-negative (rank, rank, channel, path)
    ints (:func:`unique_rows`).

    >>> _unique_rows(np.array([[3, 1, 0, 0], [0, 2, 1, 1], [3, 1, 0, 0]])).tolist()
    [[0, 2, 1, 1], [3, 1, 0, 0]]
    """
    return unique_rows(rows)[0]


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_index=True, return_inverse=True)`` for an int64
    array of rows of non-negative (rank, rank, channel, path) ints, packed into one int64
    each where they fit: sorting 1-D keys rather than rows (a row view sorts some 20
    times slower, and a call of 128 replicas has hundreds of thousands of transfers).

    >>> rows, first, inverse = unique_rows(np.array([[3, 1, 0, 0], [0, 2, 1, 1], [3, 1, 0, 0]]))
    >>> rows.tolist(), first.tolist(), inverse.tolist()
    ([[0, 2, 1, 1], [3, 1, 0, 0]], [1, 0], [1, 0, 1])
    """
    bits = (20, 20, 12, 8)  # 60 bits in all
    if (
        len(rows) == 0
        or rows.min() < 0
        or any(int(rows[:, i].max()) >= 1 << b for i, b in enumerate(bits))
    ):
        unique, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return unique, first, inverse.reshape(-1)
    key = rows[:, 0]
    for i, b in enumerate(bits[1:], 1):
        key = (key << b) | rows[:, i]
    key, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    out = np.empty((len(key), 4), dtype=np.int64)
    for i in range(3, -1, -1):
        out[:, i] = key & ((1 << bits[i]) - 1)
        key = key >> bits[i]
    return out, first, inverse.reshape(-1)


def _plain(quotient: Quotient | None) -> bool:
    """Whether a quotient exists and has no side-by-side multiplicity."""
    return quotient is not None and quotient.multiplicity is None


def _maps(
    graph: nx.Graph, network: FlowNetwork, perm: list[int], derived: dict
) -> tuple[dict | None, np.ndarray | None]:
    """The node map of server permutation ``perm`` and the link map it induces on the
    graph's links (None, None if it maps the graph elsewhere); kept in ``derived``."""
    links = network.links
    # Link ids are the graph's, in its order, for every network of the graph (reducers,
    # added later and per network, come after them: none yet here).
    key = ("server permutation", tuple(perm), len(links))
    if key not in derived:
        phi = server_permutation(graph, perm)
        derived[key] = (phi, _link_map(links, phi))
    return derived[key]


def _link_map(links, phi: dict | None) -> np.ndarray | None:
    """Each link's id's image under the node map ``phi`` (None where ``phi`` is)."""
    if phi is None:
        return None
    index = links.index
    pairs = zip(links.src_node, links.dst_node, strict=True)
    return np.array([index[(phi[a], phi[b])] for a, b in pairs], dtype=np.int64)


def _gpu_maps(
    workload: Workload, network: FlowNetwork, shift: np.ndarray, derived: dict
) -> tuple[dict | None, np.ndarray | None, str]:
    """The node and link maps of moving every GPU to its rank's image in the next
    replica where that moves GPUs inside their servers (data-parallel ranks side by
    side in one NVL72 rack), or None, None and why not. Kept in ``derived``.

    Refused before the run, as a guess about CPU time (the run would find it at the
    first such call and start again, every replica built): a pipeline send, or two
    ranks of a group, on servers that several shortest paths join, which ECMP hashes
    per pair of GPUs, so that the images of a route are not the routes of the images
    (:func:`~simulator.workload.shadows.crosses_hashed`). A map of whole servers keeps
    each GPU's position, and with it, on the published clusters, the hashed routes'
    images; this one moves GPUs to other rails."""
    graph = network.graph
    links = network.links
    key = ("gpu permutation", shift.tobytes(), len(links))
    if key not in derived:
        gpus = gpu_nodes(graph)
        phi = gpu_permutation(graph, {gpus[r]: gpus[t] for r, t in enumerate(shift.tolist())})
        derived[key] = (phi, _link_map(links, phi))
    phi, psi = derived[key]
    if phi is None:
        return None, None, "moving the GPUs so maps the topology elsewhere"
    ops = workload.ops
    servers = servers_of_ranks(graph)
    ends = sorted({(ops[send].rank, ops[receive].rank) for send, receive in workload.pairs})
    if crosses_hashed(ends, servers, network.router):
        return None, None, "a pipeline send crosses servers over several shortest paths"
    if crosses_hashed(_cross_server_pairs(workload, servers), servers, network.router):
        return None, None, "a group's ranks are on servers joined by several shortest paths"
    return phi, psi, ""


def _cross_server_pairs(workload: Workload, servers: list[int] | None) -> list[tuple[int, int]]:
    """Every (rank, rank) pair of a group of ``workload`` on two servers, once."""
    if servers is None:
        return []
    where = np.asarray(servers, dtype=np.int64)
    found: set[tuple[int, int]] = set()
    for group in workload.groups.values():
        ranks = np.asarray(group.ranks, dtype=np.int64)
        if len(ranks) < 2 or len(np.unique(where[ranks])) < 2:
            continue
        a, b = np.meshgrid(ranks, ranks, indexing="ij")
        apart = where[a] != where[b]
        found.update(zip(a[apart].tolist(), b[apart].tolist(), strict=True))
    return sorted(found)


def replica_symmetry(
    workload: Workload, network: FlowNetwork, derived: dict | None = None
) -> tuple[ReplicaSymmetry | None, str]:
    """The symmetry that lets ``workload``'s first replica stand for all, on
    ``network`` (before any flow), or None and why not. ``derived`` (a
    :class:`~simulator.workload.isolated.TimingStore`'s, for ``network``'s graph) keeps
    the server map and link map of each server permutation for later calls."""
    replicas = workload.replicas
    if replicas is None or replicas.count < 2:
        return None, "the workload is not given by one replica"
    graph = network.graph
    if fault_plan(graph) is not None:
        return None, "the topology has faults, which single out particular ranks"
    count = replicas.count
    gpus = gpu_nodes(graph)
    shift = np.arange(len(gpus), dtype=np.int64)
    shift[: workload.ranks] = replicas.shift
    servers = servers_of_ranks(graph)
    if servers is None:
        return None, "the topology's GPUs have no servers"
    image: dict[int, int] = {}
    inside = ""
    for rank, target in enumerate(shift.tolist()):
        moved_inside = target != rank and servers[target] == servers[rank]
        if moved_inside or image.setdefault(servers[rank], servers[target]) != servers[target]:
            inside = (
                f"moving every rank to the next replica splits server {servers[rank]} "
                "(a replica's ranks must fill whole servers)"
            )
            break
    if not inside:
        n = len(set(servers))
        perm = [image.get(s, s) for s in range(n)]
        phi, psi = _maps(graph, network, perm, {} if derived is None else derived)
        if phi is None or any(phi[gpus[r]] != gpus[t] for r, t in enumerate(shift.tolist())):
            return None, "the topology does not look the same from every replica"
    elif replicas_per_server(workload, graph) is not None:
        # A few replicas together move whole servers: the caller takes them together.
        return None, inside
    else:
        phi, psi, why = _gpu_maps(workload, network, shift, {} if derived is None else derived)
        if phi is None:
            return None, f"{inside}, and {why}"
    assert psi is not None
    # Orbits of the link map: the smallest id reached, and after how many steps each
    # link comes back (its orbit's size; the map to the power ``count`` is the identity).
    ids = np.arange(len(psi), dtype=np.int64)
    label, size, current = ids.copy(), np.zeros(len(psi), dtype=np.int64), ids
    for k in range(1, count + 1):
        current = psi[current]
        np.minimum(label, current, out=label)
        size[(size == 0) & (current == ids)] = k
    if not np.array_equal(current, ids) or (size == 0).any():
        return None, "moving every rank to the next replica does not come back after all"
    period: dict[str, int] = {}
    first = replicas.first
    for name, group in workload.groups.items():
        ranks = group.ranks
        if replicas.spans(ranks):
            if len(ranks) % count:
                return None, f"group {name!r} spans the replicas unevenly"
            step = len(ranks) // count
            ordered = all(shift[ranks[i]] == ranks[i + step] for i in range(len(ranks) - step))
            if not ordered or not set(ranks[:step]) <= first:
                return None, f"group {name!r} does not list its ranks replica by replica"
            period[name] = step
        elif any(r in first for r in ranks) and not set(ranks) <= first:
            return None, f"group {name!r} has ranks in the first replica and beyond"
    return (
        ReplicaSymmetry(count, shift, psi, label, size.astype(float), period),
        "",
    )


def replicas_per_server(workload: Workload, graph: nx.Graph) -> int | None:
    """The fewest replicas k (more than one, dividing the count) that, moved on
    together, move whole servers (a replica of TP 4 on 8-GPU servers: k = 2), or None.

    >>> from simulator.workload.generators import megatron
    >>> from simulator.topology import load_topology
    >>> step = megatron("gpt3-175b", tp=4, pp=2, dp=4, global_batch=4, replicas=True)
    >>> replicas_per_server(step, load_topology("dgx-a100", 4))
    2
    """
    replicas = workload.replicas
    servers = servers_of_ranks(graph)
    if replicas is None or servers is None:
        return None
    shift = np.asarray(replicas.shift, dtype=np.int64)
    ids = np.arange(len(shift))
    server = np.asarray(servers, dtype=np.int64)[: len(shift)]
    power = ids
    for k in range(1, replicas.count):
        power = shift[power]
        if k == 1 or replicas.count % k:
            continue
        if ((power != ids) & (server[power] == server)).any():
            continue  # some rank moves inside its server
        pairs = np.unique(np.stack([server, server[power]], axis=1), axis=0)
        if len(pairs) == len(np.unique(server)):  # each server goes to one server
            return k
    return None


def neither_stands_in(
    workload: Workload, network: FlowNetwork, derived: dict | None = None
) -> tuple[str, str] | None:
    """Why neither ``workload``'s TP masters nor its first replica (a workload given by
    both) would stand in on ``network``, as the replay finds before its run: the
    shadows' reason and the replicas', or None where either might (or the workload is
    not given by both). Asked on the masters' build, it answers for the build of every
    TP rank that the replay makes next, so a caller can build every rank at once and
    skip that intermediate build (issue 31: 4.6 s of CPU on a 405B step on 128 GB200).

    Why the answer carries over: the shadows are refused by
    :func:`~simulator.workload.shadows.sends_hash`, the replay's own test on this very
    build. Building every TP rank (the same generator call without shadows) keeps the
    groups and the replicas' shift and only adds the shadows' sends, so each refusal of
    :func:`replica_symmetry` that looks at the workload (a pipeline send or a group
    crossing hashed paths, a group spanning the replicas unevenly) still holds there;
    the others look at the shift and the cluster alone
    (``tests/test_steady_every_rank.py`` holds the refusal on both builds). Where some replicas
    together move whole servers (:func:`replicas_per_server`) the replay would try
    them, so None. A wrong None costs only CPU: the replay then decides as usual."""
    if workload.shadows is None or workload.replicas is None or workload.replicas.build is None:
        return None
    graph = network.graph
    if fault_plan(graph) is not None:
        return None  # (the replay refuses both for the faults, with its own words)
    if not sends_hash(workload, servers_of_ranks(graph), network.router):
        return None
    symmetry, why = replica_symmetry(workload, network, derived)
    if symmetry is not None or replicas_per_server(workload, graph) is not None:
        return None
    return HASHED_SENDS, why
