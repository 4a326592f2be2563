"""Directed links of a topology graph, and routes between GPUs.

Links
    Every undirected edge becomes two directed links (full duplex: each direction has
    the edge's bandwidth to itself); every edge of a DiGraph becomes one.

Routes
    A route is a shortest path by latency, plus 1 ps per hop so that among paths of
    equal latency the one with fewer hops wins (and zero-latency graphs still route
    sensibly). Costs are counted in integer picoseconds, so that paths of equal cost
    compare equal exactly, whatever order their latencies are added in. Two policies,
    as NCCL and HCCL route: GPUs do not forward traffic for others, and traffic between
    two GPUs of one server (same ``server`` attribute) stays inside the server. Each is
    a cost of one second per GPU passed through, or per node outside the server entered,
    in the search only: such paths are taken only where nothing else connects the two
    GPUs (a 1-D ring of GPUs; a server without internal links).

Equal-cost paths
    Where several paths tie, a flow's path is chosen hop by hop, as switches do, in one
    of two ways (the graph's ``routing``, :func:`~simulator.topology.stacks.routing_of`:
    ``fabric.routing``, else the NICs' network stack's).

    ``ecmp`` (Ethernet: RoCE, eRDMA, TCPX/TCPXO): at a node with several equal-cost next
    hops, a hash of (seed, source rank, destination rank, label, node) picks one.
    ``label`` is the flow's connection, a schedule's channel: every flow of one channel
    between two ranks follows one path, as the packets of one queue pair do, while other
    channels may take other paths. The seed is the graph attribute ``ecmp_seed``
    (default 0), so the same graph and seed always give the same routes.

    ``per_destination`` (InfiniBand): a switch forwards everything addressed to one
    port (LID) through the same up-port, whoever sends it and on whichever queue pair,
    as the forwarding tables a subnet manager programs. The tables are OpenSM's
    fat-tree engine's (``osm_ucast_ftree.c``; :data:`~simulator.topology.stacks.ROUTINGS`):
    destination NICs are taken leaf by leaf (graph order), each leaf's NICs in graph
    order, and from the destination's leaf upward each switch sends the destination to
    its next up-neighbour in turn (round robin over its up-links, the engine's
    least-loaded choice); the switches reached so form the destination's *chain*. A
    route then climbs to the lowest switch of that chain it can reach and comes down
    it: at a node with several next hops, the one on the chain, else the first (graph
    order) from which the chain can be reached. So every NIC of a rail-optimized leaf
    gets its own spine (server s on spine s mod spines, whatever its rail), and a shift
    of the destinations is routed without two routes sharing an up-link where the
    fabric has the up-links for it (the engine's design goal). Channels (labels) do not
    change the path (NCCL_IB_QPS_PER_CONNECTION's queue pairs all go to one LID).

    Pairs with a single shortest path keep a dense (source, destination) -> route
    table, so large rings route as fast as before.

Message cost
    A link may carry ``message_rate`` (messages/s; a NIC's limit, on its fabric-facing
    link). Each message crossing the link costs 1/message_rate seconds. A flow is one
    message, so a route's per-message cost is the sum of 1/message_rate over its links;
    it is included in the route latency that :meth:`Router.arrays` returns, and the
    engine adds that latency to each flow's delivery time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import pairwise

import networkx as nx
import numpy as np

from ..errors import CcsimError
from ..topology.graph import gpu_nodes
from ..topology.stacks import routing_of

#: Path classes, by the slowest kind of link a path crosses (NCCL's own split of
#: per-hop latencies: NVLink, PCIe, network).
PATH_CLASSES = ("nvlink", "pcie", "network")
#: Link types (edge ``link`` attribute) by path class; anything else counts as nvlink.
NETWORK_LINKS = frozenset({"rdma", "roce", "erdma", "ethernet", "ib", "infiniband", "network"})
PCIE_LINKS = frozenset({"pcie", "xgmi", "upi", "qpi", "cpu"})


def path_class(link_types: list[str]) -> str:
    """Class of a path from the link types it crosses: network > pcie > nvlink.

    >>> path_class(["pcie", "rdma", "pcie"]), path_class(["nvlink", "nvlink"])
    ('network', 'nvlink')
    """
    kinds = {kind.lower() for kind in link_types}
    if kinds & NETWORK_LINKS:
        return "network"
    if kinds & PCIE_LINKS:
        return "pcie"
    return "nvlink"


#: Link types of a server's GPU interconnect, which network routes avoid.
INTRA_LINKS = frozenset({"nvlink", "hccs", "sdma", "nvswitch"})

# Route costs are integers in picoseconds: per hop, its latency plus 1 ps (fewer hops win
# ties), plus one second for entering a GPU other than the destination, and one second
# for leaving the server when both ends are on it - more than any real difference in
# latency, so such paths lose whenever another path exists.
_PS_PER_S = 1e12
_HOP = 1
_DETOUR = 10**12

# Up to this many ranks the (src, dst) -> route cache is a dense p x p table.
_DENSE_LIMIT = 4096

# Nodes with more neighbours than this (switches) are expanded by the shortest-path search
# only toward the neighbours that can still be on a shortest path (Router._predecessors).
_WIDE = 64

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(x: int) -> int:
    """SplitMix64's finalizer: a bijection on 64-bit integers that mixes all bits."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def ecmp_hash(seed: int, *values: int) -> int:
    """Deterministic 64-bit hash of ``seed`` and integer ``values`` (platform independent).

    >>> ecmp_hash(0, 1, 2) == ecmp_hash(0, 1, 2) != ecmp_hash(1, 1, 2)
    True
    """
    h = _mix64((seed + _GOLDEN) & _MASK)
    for value in values:
        h = _mix64((h ^ (value & _MASK)) + _GOLDEN & _MASK)
    return h


class LinkTable:
    """Directed links of ``graph`` as arrays: endpoints, capacity, latency, link type.

    ``message_cost[i]`` is 1/message_rate of link i (0 where the link has no limit).
    """

    def __init__(self, graph: nx.Graph):
        src, dst, capacity, latency, kind, cost = [], [], [], [], [], []
        # Each edge's values read once, then its directions (both for a Graph: the
        # edge's own first, then the reverse), as rows of the table.
        both = not graph.is_directed()
        for u, v, data in graph.edges(data=True):
            rate = data.get("message_rate")
            c, t = float(data["bandwidth"]), float(data.get("latency", 0.0))
            k, m = str(data.get("link", "")), 0.0 if rate is None else 1.0 / float(rate)
            src.append(u)
            dst.append(v)
            capacity.append(c)
            latency.append(t)
            kind.append(k)
            cost.append(m)
            if both:
                src.append(v)
                dst.append(u)
                capacity.append(c)
                latency.append(t)
                kind.append(k)
                cost.append(m)
        self.src_node = src
        self.dst_node = dst
        self.capacity = np.array(capacity, dtype=float)
        self.latency = np.array(latency, dtype=float)
        self.message_cost = np.array(cost, dtype=float)
        self.kind = kind
        self.index = dict(zip(zip(src, dst, strict=True), range(len(src)), strict=False))

    def __len__(self) -> int:
        return len(self.capacity)

    def copy(self) -> LinkTable:
        """A table of the same links that may grow apart from this one (a network adds
        its reducers to its own)."""
        other = copy.copy(self)
        other.src_node, other.dst_node = list(self.src_node), list(self.dst_node)
        other.capacity, other.latency = self.capacity.copy(), self.latency.copy()
        other.message_cost, other.kind = self.message_cost.copy(), list(self.kind)
        other.index = dict(self.index)
        return other


@dataclass
class _Multipath:
    """A (src, dst) pair with several equal-cost paths: their next-hop DAG."""

    src: int
    dst: int
    first: object
    last: object
    next_hops: dict
    routes: dict[int, int] = field(default_factory=dict)  # label -> route id


def _grown(buffer: np.ndarray, size: int) -> np.ndarray:
    """``buffer`` itself if it holds ``size`` entries, else a copy of it with room for at
    least twice as many (amortized appends)."""
    if len(buffer) >= size:
        return buffer
    grown = np.zeros(max(size, 2 * len(buffer)), dtype=buffer.dtype)
    grown[: len(buffer)] = buffer
    return grown


def subnet_manager_chains(graph: nx.Graph, order: dict | None = None) -> dict:
    """Each NIC's chain: the switches, from the leaf it is cabled to upward, that route
    traffic down to it, as OpenSM's fat-tree engine assigns them (linux-rdma/opensm
    3.3.24-2-gfa74b98c, opensm/osm_ucast_ftree.c, ``fabric_route_to_cns`` lines 2789-2800
    and ``fabric_route_downgoing_by_going_up`` lines 2480-2482).

    A switch's level is its distance, over switch-to-switch links, from the nearest
    switch with a NIC (a leaf: 0); its up-links go to the switches one level higher, in
    graph order. Leaves in graph order, each leaf's NICs in graph order: each NIC climbs
    from its leaf, every switch passing it to its least-used up-link, the first among
    equals (the engine's least-loaded group, lowest index; with every up-link counted
    alike this is round robin). ``order`` is the graph's node order (computed if None).

    >>> from simulator.topology import load_topology
    >>> g = load_topology("dgx-h100", 4, fabric={"type": "rail-optimized", "spines": 2})
    >>> chains = subnet_manager_chains(g)
    >>> [chains[f"s{s}/nic3"] for s in range(4)]
    [('leaf3', 'spine0'), ('leaf3', 'spine1'), ('leaf3', 'spine0'), ('leaf3', 'spine1')]
    """
    if order is None:
        order = {node: i for i, node in enumerate(graph.nodes)}
    kind = graph.nodes(data="kind")
    switches = [node for node in graph.nodes if kind[node] == "switch"]
    level: dict = {}
    frontier = [s for s in switches if any(kind[v] == "nic" for v in graph.neighbors(s))]
    for s in frontier:
        level[s] = 0
    while frontier:
        following = []
        for u in frontier:
            for v in graph.neighbors(u):
                if kind[v] == "switch" and v not in level:
                    level[v] = level[u] + 1
                    following.append(v)
        frontier = following
    ups: dict = {}
    used: dict = {}
    chains: dict = {}
    for leaf in sorted((s for s in level if level[s] == 0), key=order.__getitem__):
        nics = sorted((v for v in graph.neighbors(leaf) if kind[v] == "nic"), key=order.__getitem__)
        for nic in nics:
            if nic in chains:
                continue  # cabled to two leaves: the first routes it
            chain, u = [leaf], leaf
            while True:
                up = ups.get(u)
                if up is None:
                    up = ups[u] = sorted(
                        (v for v in graph.neighbors(u) if level.get(v) == level[u] + 1),
                        key=order.__getitem__,
                    )
                if not up:
                    break
                turn = used.get(u, 0)
                used[u] = turn + 1
                u = up[turn % len(up)]
                chain.append(u)
            chains[nic] = tuple(chain)
    return chains


class Router:
    """Routes between ranks, computed on first use and cached.

    ``route_ids(src_ranks, dst_ranks, labels)`` returns one route id per flow; the links
    of route ``r`` are ``links[ptr[r]:ptr[r + 1]]`` and its latency ``latency[r]`` (see
    :meth:`arrays`). ``seed`` overrides the graph's ``ecmp_seed``.

    >>> from simulator.topology import ring_graph
    >>> g = ring_graph(4, 1e9, 1e-6)
    >>> router = Router(g, LinkTable(g))
    >>> r = router.route_ids(np.array([0]), np.array([1]))
    >>> router.path_nodes(int(r[0])), float(router.arrays()[2][r[0]])
    (['gpu0', 'gpu1'], 1e-06)
    """

    def __init__(
        self,
        graph: nx.Graph,
        links: LinkTable,
        *,
        seed: int | None = None,
        like: Router | None = None,
    ):
        self.graph = graph
        self.links = links
        self.seed = int(graph.graph.get("ecmp_seed", 0) if seed is None else seed)
        #: ``ecmp`` or ``per_destination`` (see the module docstring).
        self.routing = routing_of(graph)
        self._cheapest: dict = {}
        self._wide_costs: dict = {}
        if like is not None and like.graph is graph:
            # What is read from the graph alone, never changed afterwards: shared with
            # ``like`` rather than read again (a 16,384-GPU graph's take 0.4 s).
            self.nodes = like.nodes
            self._order, self._gpus, self._server = like._order, like._gpus, like._server
            self._adj, self._radj = like._adj, like._radj
            # Shortest paths are the graph's too (the ECMP hash picks among them later,
            # per router): one search per pair for every network built like ``like``.
            self._paths = like._paths
            # So are the subnet manager's chains (filled on first use).
            self._chains = like._chains
        else:
            self._read_graph(graph)
            self._paths: dict[tuple[int, int], tuple[int, ...] | dict] = {}
            self._chains: dict = {}
        p = len(self.nodes)
        # Codes: route id >= 0 (one path), -1 unknown, -2 - g multipath group g.
        # Dense: code + 1, 0 where unknown, so that the table starts as zero pages the
        # system gives lazily (a router made only to share what it read from the graph
        # never touches its 64 MB at 4,096 ranks).
        self._dense = np.zeros((p, p), dtype=np.int32) if p <= _DENSE_LIMIT else None
        self._sparse: dict[int, int] = {}  # src * ranks + dst -> code
        self._groups: list[_Multipath] = []
        self._network_routes: dict[tuple[int, int], int] = {}
        self._switch_routes: dict[tuple, int] = {}
        self._pxn_routes: dict[tuple[int, int, int], int] = {}
        self._local: dict[int, tuple[object, int]] | None = None
        self._sharp_switches: dict[int, object] = {}
        self._sharp_paths: dict[int, list] = {}
        self._network_view: nx.Graph | None = None
        self._route_links: list[np.ndarray] = []
        self._route_of: dict[tuple[int, ...], int] = {}
        self._latency: list[float] = []
        self._message: list[float] = []
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # Flat route arrays grown in place (capacity doubling): routes added one at a
        # time between lookups (replica route checks add thousands) cost what they add.
        self._built = 0
        self._ptr_buf = np.zeros(1, dtype=np.int64)
        self._flat_buf = np.zeros(0, dtype=np.int64)
        self._lat_buf = np.zeros(0)

    def _read_graph(self, graph: nx.Graph) -> None:
        """The GPUs, node order, servers and hop costs of ``graph``."""
        self.nodes = gpu_nodes(graph)
        self._gpus = set(self.nodes)
        # (One pass over the nodes and one over the edges: 16,384 GPUs' graph.)
        self._order: dict = {}
        self._server: dict = {}
        # Out-neighbours with the integer cost of each hop (both ways for a Graph).
        self._adj: dict = {}
        # In-neighbours, for searches backward from a destination.
        self._radj: dict = {}
        order, server, adj, radj = self._order, self._server, self._adj, self._radj
        for i, (node, where) in enumerate(graph.nodes(data="server")):
            order[node] = i
            server[node] = where
            adj[node] = []
            radj[node] = []
        directed = graph.is_directed()
        for u, v, latency in graph.edges(data="latency", default=0.0):
            cost = round(float(latency) * _PS_PER_S) + _HOP
            adj[u].append((v, cost))
            radj[v].append((u, cost))
            if not directed:
                adj[v].append((u, cost))
                radj[u].append((v, cost))

    def _predecessors(self, first, last) -> dict:
        """Dijkstra from ``first`` until ``last`` is settled; all equal-cost predecessors
        of the nodes on shortest paths to ``last`` (other nodes may be missing).

        Every node on a shortest path to ``last`` costs less than ``last`` itself, so it
        is settled, with all its predecessors, before the search stops there. A first,
        bidirectional search (:meth:`_bounds`) finds the shortest cost and a lower bound
        on each node's cost to ``last``, and this search skips nodes whose cost from
        ``first`` plus that bound exceeds the shortest: they are on no shortest path.
        Without it, a search between two servers of a large fabric settles nearly every
        node of the cluster; with it, about those within half the distance of either end.
        Skipped nodes are never predecessors of nodes on shortest paths, and the others
        are settled in the same order (by cost, then graph order), so the result is the
        full search's on every shortest path.
        """
        order, gpus, adj, server = self._order, self._gpus, self._adj, self._server
        home = server[first] if server[first] == server[last] else None
        shortest, bound, settled, floor = self._bounds(first, last, home)
        dist = {first: 0}
        pred: dict = {first: []}
        heap = [(0, order[first], first)]
        while heap:
            du, _, u = heappop(heap)
            if du > dist[u]:
                continue  # a stale entry: u was reached more cheaply since
            if u == last:
                break
            neighbours = adj[u]
            if (
                len(neighbours) > _WIDE
                and shortest is not None
                and du + self._cheapest_hop(u) + floor > shortest
            ):
                # A switch with thousands of ports (a rail's leaf): every neighbour the
                # backward search did not settle has the bound ``floor``, and even its
                # cheapest hop from here exceeds the shortest cost with it, so only the
                # settled ones can pass the test below. Skipping the others visits the
                # same nodes with the same costs, so the result does not change.
                costs = self._hop_costs(u)
                neighbours = [(v, costs[v]) for v in settled if v in costs]
            for v, cost in neighbours:
                dv = du + cost
                if v in gpus and v != last:
                    dv += _DETOUR
                if home is not None and server[v] != home:
                    dv += _DETOUR
                if shortest is not None and dv + bound(v) > shortest:
                    continue  # on no shortest path to ``last``
                old = dist.get(v)
                if old is None or dv < old:
                    dist[v] = dv
                    pred[v] = [u]
                    heappush(heap, (dv, order[v], v))
                elif dv == old:
                    pred[v].append(u)
        return pred

    def _bounds(
        self, first, last, home
    ) -> tuple[int | None, Callable[[object], float], set, float]:
        """Bidirectional Dijkstra between ``first`` and ``last`` (costs as in
        :meth:`_predecessors`): the shortest cost, and a lower bound on each node's cost
        to ``last`` (exact where the backward search settled it, else the smallest cost
        it had not settled). The shortest cost is None if ``last`` cannot be reached.
        Also the nodes the backward search settled and that smallest unsettled cost.

        It stops once the two frontiers' smallest costs add up to the best path met or
        more (no path through an unsettled node can be shorter). Where it stops changes
        only how tight the bounds are: every bound is a lower bound, and the search that
        uses them finds every path of the shortest cost itself."""
        order, gpus, adj, radj = self._order, self._gpus, self._adj, self._radj
        server = self._server
        inf = float("inf")

        def entry(v) -> int:
            # The search cost of entering v (the routing policies), on top of the link's.
            extra = _DETOUR if v in gpus and v != last else 0
            if home is not None and server[v] != home:
                extra += _DETOUR
            return extra

        forward, backward = {first: 0}, {last: 0}
        done_f, done_b = set(), set()
        deferred: set = set()  # settled backward, their expansion queued (see below)
        heap_f, heap_b = [(0, order[first], first)], [(0, order[last], last)]
        best = inf
        while heap_f and heap_b and heap_f[0][0] + heap_b[0][0] < best:
            if heap_f[0][0] <= heap_b[0][0]:
                du, _, u = heappop(heap_f)
                if u in done_f:
                    continue
                done_f.add(u)
                for v, cost in adj[u]:
                    dv = du + cost + entry(v)
                    if dv < forward.get(v, inf):
                        forward[v] = dv
                        heappush(heap_f, (dv, order[v], v))
                    if v in backward:
                        best = min(best, dv + backward[v])
            else:
                dv, _, v = heappop(heap_b)
                if v in deferred:
                    # Its expansion, due now: its in-neighbours at the cost of entering it.
                    deferred.discard(v)
                    into = dv
                elif v in done_b:
                    continue
                else:
                    done_b.add(v)  # dv is its exact cost to ``last``
                    into = dv + entry(v)
                    if into > dv:
                        # Entering v costs a detour (another GPU, outside the server): its
                        # in-neighbours cost at least ``into``, so they wait in the queue
                        # under that key instead of being pushed now. A switch with
                        # thousands of ports outside the server would otherwise push them
                        # all for every route inside a server; the bounds stay lower
                        # bounds (everything still queued costs at least the smallest key).
                        deferred.add(v)
                        heappush(heap_b, (into, order[v], v))
                        continue
                for u, cost in radj[v]:
                    du = into + cost
                    if du < backward.get(u, inf):
                        backward[u] = du
                        heappush(heap_b, (du, order[u], u))
                    if u in forward:
                        best = min(best, forward[u] + du)
        if best == inf:
            return None, lambda node: 0, done_b, 0
        floor = heap_b[0][0] if heap_b else inf

        def bound(node) -> float:
            return backward[node] if node in done_b else floor

        return int(best), bound, done_b, floor

    def _cheapest_hop(self, node) -> int:
        """The least cost of a hop out of ``node`` (cached)."""
        found = self._cheapest.get(node)
        if found is None:
            found = self._cheapest[node] = min((cost for _, cost in self._adj[node]), default=0)
        return found

    def _hop_costs(self, node) -> dict:
        """The cost of the hop to each neighbour of ``node`` (cached; wide nodes only)."""
        found = self._wide_costs.get(node)
        if found is None:
            found = self._wide_costs[node] = dict(self._adj[node])
        return found

    def add_link_route(self, links: list[int]) -> int:
        """A route over explicit link ids (virtual links such as a GPU's reducer)."""
        array = np.array(links, dtype=np.int64)
        self._route_links.append(array)
        self._latency.append(0.0)
        self._message.append(0.0)
        self._arrays = None
        return len(self._route_links) - 1

    def _add_route(self, path: list) -> int:
        """The id of the route along ``path`` (a node list), adding it if new."""
        return self.route_over(tuple(self.links.index[pair] for pair in pairwise(path)))

    def route_over(self, links: tuple[int, ...]) -> int:
        """The id of the route over the graph's ``links`` (ids, in order), adding it if
        new: another router's route on the same graph, carried over by its links."""
        route = self._route_of.get(links)
        if route is None:
            array = np.array(links, dtype=np.int64)
            self._route_links.append(array)
            self._latency.append(float(self.links.latency[array].sum()))
            self._message.append(float(self.links.message_cost[array].sum()))
            route = self._route_of[links] = len(self._route_links) - 1
            self._arrays = None
        return route

    def _code(self, s: int, d: int) -> int:
        """Route id of the pair's only shortest path, or -2 - g for multipath group g."""
        paths = self._paths.get((s, d))
        if paths is None:
            paths = self._shortest_paths(s, d)
        if isinstance(paths, tuple):
            return self.route_over(paths)
        self._groups.append(_Multipath(s, d, self.nodes[s], self.nodes[d], paths))
        return -1 - len(self._groups)

    def _shortest_paths(self, s: int, d: int) -> tuple[int, ...] | dict:
        """The pair's only shortest path as link ids, or, where there are several, their
        next-hop DAG (node -> next nodes in graph order); read from the graph alone, so
        kept in ``_paths`` shared by routers built ``like`` one another.

        In a Graph (not a DiGraph) every hop costs the same both ways and the routing
        policies' costs are the nodes entered between the two ends, the same nodes
        either way: the shortest paths from ``d`` to ``s`` are these reversed. Their
        entry is kept too, read off this search (each node's next hops towards ``s``
        are its predecessors here): a pipeline's sends and their gradients' come back
        over the same pair (tests/test_routing_mirror.py holds it to the search)."""
        first, last = self.nodes[s], self.nodes[d]
        pred = self._predecessors(first, last)
        on_path, stack = {last}, [last]
        while stack:
            for before in pred.get(stack.pop(), ()):
                if before not in on_path:
                    on_path.add(before)
                    stack.append(before)
        mirror = not self.graph.is_directed() and (d, s) not in self._paths
        index = self.links.index
        if all(len(pred.get(node, ())) <= 1 for node in on_path):
            path = [last]
            while path[-1] != first:
                path.append(pred[path[-1]][0])
            if mirror:
                # (The path from ``d`` back to ``s`` is unique too.)
                self._paths[(d, s)] = tuple(index[pair] for pair in pairwise(path))
            found = self._paths[(s, d)] = tuple(index[pair] for pair in pairwise(path[::-1]))
            return found
        next_hops: dict = {}
        back: dict = {}
        for node in on_path:
            before = pred.get(node, ())
            for hop in before:
                next_hops.setdefault(hop, []).append(node)
            if mirror and before:
                back[node] = sorted(before, key=self._order.__getitem__)
        for options in next_hops.values():
            options.sort(key=self._order.__getitem__)
        if mirror:
            self._paths[(d, s)] = back
        self._paths[(s, d)] = next_hops
        return next_hops

    @property
    def hashes_connections(self) -> bool:
        """Whether equal-cost paths are picked per connection (ECMP): then a pair's
        route depends on its ranks and channel, not on where its destination is alone."""
        return self.routing == "ecmp"

    def _pick(self, group: int, label: int) -> int:
        """The route of one (src, dst, label) in a multipath group, hop by hop: hashed
        (``ecmp``), or by the destination's chain (``per_destination``, every label)."""
        paths = self._groups[group]
        per_destination = self.routing == "per_destination"
        key = -1 if per_destination else label
        route = paths.routes.get(key)
        if route is None:
            choose = self._chooser(paths) if per_destination else None
            node, path = paths.first, [paths.first]
            while node != paths.last:
                options = paths.next_hops[node]
                if len(options) > 1:
                    if choose is not None:
                        node = choose(options)
                    else:
                        h = ecmp_hash(self.seed, paths.src, paths.dst, label, self._order[node])
                        node = options[h % len(options)]
                else:
                    node = options[0]
                path.append(node)
            route = paths.routes[key] = self._add_route(path)
        return route

    def _chooser(self, paths: _Multipath) -> Callable[[list], object]:
        """Picks a next hop towards ``paths.dst`` as the subnet manager's tables do (see
        the module docstring): the option on the destination's chain, else the first
        from which the chain can be reached, else (no chain: a destination the fabric
        engine does not see) the destination rank's turn among the options."""
        nodes = self.graph.nodes
        next_hops = paths.next_hops
        # The destination's port: the NIC on the paths whose next hops lead into the
        # server, not to a switch (the first in graph order where there are several).
        ports = [
            node
            for node, after in next_hops.items()
            if nodes[node].get("kind") == "nic"
            and not any(nodes[v].get("kind") == "switch" for v in after)
        ]
        chain = self._chain(min(ports, key=self._order.__getitem__)) if ports else ()
        above = frozenset(chain[1:])  # (every route to the port passes its leaf)
        reaches: dict = {}

        def reach(node) -> bool:
            # Whether a path of the DAG from ``node`` passes a switch of the chain above
            # the leaf (memoized; iterative, the DAG is a few levels deep).
            stack = [node]
            while stack:
                top = stack[-1]
                if top in reaches:
                    stack.pop()
                    continue
                if top in above:
                    reaches[top] = True
                    stack.pop()
                    continue
                pending = [v for v in next_hops.get(top, ()) if v not in reaches]
                if pending:
                    stack.extend(pending)
                    continue
                reaches[top] = any(reaches[v] for v in next_hops.get(top, ()))
                stack.pop()
            return reaches[node]

        def choose(options: list) -> object:
            for option in options:
                if option in above:
                    return option
            for option in options:
                if reach(option):
                    return option
            return options[paths.dst % len(options)]

        return choose

    def _chain(self, nic) -> tuple:
        """The switches from ``nic``'s leaf up that the subnet manager's fat-tree engine
        routes ``nic`` through (see the module docstring); () for a NIC on no switch.
        Computed for every NIC at once on first use (the engine's order is global)."""
        if not self._chains:
            self._chains.update(subnet_manager_chains(self.graph, self._order))
            self._chains.setdefault(None, ())  # marks the table built
        return self._chains.get(nic, ())

    def _codes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        if self._dense is not None:
            codes = self._dense[src, dst]
            missing = codes == 0
            if missing.any():
                # One int64 key per pair (numpy's unique over rows sorts a structured
                # view); more keys than table entries are marked in a p x p table
                # instead, which gives the distinct ones in order without a sort
                # (sorting the 8 M transfers of a 1,024-rank ring took most of a
                # second) and holds no more bytes than an eighth of the keys.
                p = self._dense.shape[0]
                keys = src[missing].astype(np.int64) * p + dst[missing]
                if len(keys) >= p * p:
                    seen = np.zeros(p * p, dtype=bool)
                    seen[keys] = True
                    pairs = np.flatnonzero(seen)
                else:
                    pairs = np.unique(keys)
                for s, d in zip((pairs // p).tolist(), (pairs % p).tolist(), strict=True):
                    self._dense[s, d] = self._code(s, d) + 1
                codes = self._dense[src, dst]
            return codes - 1
        # One int64 key per pair, looked up once per distinct pair (a call's schedule
        # repeats its pairs over channels, chunks and steps).
        p = len(self.nodes)
        keys, inverse = np.unique(
            np.asarray(src, dtype=np.int64) * p + np.asarray(dst, dtype=np.int64),
            return_inverse=True,
        )
        sparse = self._sparse
        found = np.empty(len(keys), dtype=np.int32)
        for n, key in enumerate(keys.tolist()):
            code = sparse.get(key)
            if code is None:
                code = sparse[key] = self._code(key // p, key % p)
            found[n] = code
        return found[inverse.reshape(-1)]

    def single_path(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Whether each (src, dst) rank pair has one shortest path (no ECMP choice)."""
        return self._codes(np.asarray(src), np.asarray(dst)) >= 0

    def route_ids(
        self, src: np.ndarray, dst: np.ndarray, labels: np.ndarray | None = None
    ) -> np.ndarray:
        """Route id for each (src rank, dst rank) pair.

        ``labels`` (one per pair, e.g. the schedule channel; default all 0) name the
        connection a flow belongs to; where a pair has several equal-cost paths, the
        ECMP hash of (seed, src, dst, label) picks the path (see the module docstring).
        """
        src, dst = np.asarray(src), np.asarray(dst)
        codes = self._codes(src, dst)
        multi = codes <= -2
        if not multi.any():
            return codes
        label = (
            np.zeros(int(multi.sum()), dtype=np.int64)
            if labels is None
            else np.asarray(labels)[multi].astype(np.int64)
        )
        keys = np.stack([codes[multi].astype(np.int64), label], axis=1)
        # Distinct (group, label) pairs and each key's, by one lexsort (numpy's unique
        # over rows sorts a row view, several times slower on millions of keys).
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        ordered = keys[order]
        first = np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]
        unique = ordered[first]
        inverse = np.empty(len(keys), dtype=np.int64)
        inverse[order] = np.cumsum(first) - 1
        picked = np.array(
            [self._pick(-2 - int(code), int(lab)) for code, lab in unique], dtype=codes.dtype
        )
        out = codes.copy()
        out[multi] = picked[inverse.reshape(-1)]
        return out

    def network_route_ids(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Routes between ranks that avoid the server's GPU interconnect (NVLink, HCCS,
        SDMA, NVSwitch): out through the sender's NIC, the fabric, and in through the
        receiver's. Shortest by latency among such paths; cached per pair."""
        out = np.empty(len(src), dtype=np.int64)
        for n, (s, d) in enumerate(
            zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True)
        ):
            route = self._network_routes.get((s, d))
            if route is None:
                if self._network_view is None:
                    self._network_view = self._without_interconnect()
                try:
                    path = nx.shortest_path(
                        self._network_view,
                        self.nodes[s],
                        self.nodes[d],
                        weight=lambda u, v, data: data.get("latency", 0.0) + 1e-12,
                    )
                except nx.NetworkXNoPath:
                    raise CcsimError(
                        f"no path from {self.nodes[s]!r} to {self.nodes[d]!r} that avoids the "
                        "server's GPU interconnect: a network path needs NICs on both GPUs "
                        "and a fabric between them (one server gets one with --fabric, or "
                        "with single_server: true in its preset's fabric section)"
                    ) from None
                route = self._network_routes[(s, d)] = self._add_route(path)
            out[n] = route
        return out

    def pxn_route_ids(
        self, src: np.ndarray, dst: np.ndarray, labels: np.ndarray | None = None
    ) -> np.ndarray:
        """Routes of transfers between servers as NCCL's PXN sends them: first over the
        server's GPU interconnect to the sender's peer GPU of the same local index as
        the receiver, then from that peer through its NIC and the fabric to the receiver
        (NCCL moves data over NVLink to the GPU whose NIC is on the destination's rail,
        NCCL_PXN_DISABLE=0, its default since 2.12). Where the sender is that peer, its
        server has no such GPU, or the first leg is not NVLink, the shortest route.
        ``labels`` pick among equal-cost paths as :meth:`route_ids`'s do."""
        src, dst = np.asarray(src), np.asarray(dst)
        labels = np.zeros(len(src), dtype=np.int64) if labels is None else np.asarray(labels)
        self._index_servers()
        out = np.empty(len(src), dtype=np.int64)
        for n, (s, d, label) in enumerate(
            zip(src.tolist(), dst.tolist(), labels.tolist(), strict=True)
        ):
            key = (s, d, label)
            route = self._pxn_routes.get(key)
            if route is None:
                route = self._pxn_route(s, d, label)
                self._pxn_routes[key] = route
            out[n] = route
        return out

    def _index_servers(self) -> None:
        # Each rank's server and position in it (ranks in order), built on first use.
        if self._local is None:
            by_server: dict[object, list[int]] = {}
            for rank, node in enumerate(self.nodes):
                by_server.setdefault(self._server.get(node), []).append(rank)
            self._local = {
                rank: (server, position)
                for server, ranks in by_server.items()
                for position, rank in enumerate(ranks)
            }
            self._by_server = by_server

    def local_positions(self) -> np.ndarray:
        """Each rank's position among its server's ranks (in rank order): the local
        index PXN matches rails by."""
        self._index_servers()
        assert self._local is not None
        return np.array([self._local[r][1] for r in range(len(self.nodes))], dtype=np.int64)

    def pxn_via(self, s: int, d: int, label: int = 0) -> int | None:
        """The GPU rank a PXN transfer from ``s`` to ``d`` goes through (the sender's
        server's GPU at the receiver's local position, reached over NVLink), or None
        where :meth:`pxn_route_ids` takes the shortest route instead."""
        self._index_servers()
        assert self._local is not None
        server, _ = self._local[s]
        other, position = self._local[d]
        peers = self._by_server[server]
        if server == other or position >= len(peers) or peers[position] == s:
            return None
        via = peers[position]
        return via if self.over_nvlink(s, via, label) else None

    def over_nvlink(self, a: int, b: int, label: int = 0) -> bool:
        """Whether the route from rank ``a`` to rank ``b`` crosses NVLink links only."""
        route = int(self.route_ids(np.array([a]), np.array([b]), np.array([label]))[0])
        return {self.links.kind[i] for i in self._route_links[route].tolist()} == {"nvlink"}

    def hosts(self) -> tuple[list[tuple], list[int]]:
        """Each rank's operating-system host, as (server, host), and its device index
        there (its position among the host's GPUs in rank order). A GPU's ``host``
        attribute splits a server spanning several hosts (a GB200 NVL72 rack's compute
        trays: ``server.host_gpus`` of a preset); without it the server is one host."""
        keys = [(self._server.get(node), self.graph.nodes[node].get("host")) for node in self.nodes]
        seen: dict[tuple, int] = {}
        devices = []
        for key in keys:
            devices.append(seen.get(key, 0))
            seen[key] = devices[-1] + 1
        return keys, devices

    def can_relay(self, a: int, g: int) -> bool:
        """Whether GPU rank ``g`` can carry rank ``a``'s traffic out to the network as
        NCCL's PXN does: joined to ``a`` over NVLink, with a NIC next to it (over PCIe or
        C2C) that ``a`` does not share (a shared NIC is reached without the detour)."""

        def nics(rank: int) -> set:
            node = self.nodes[rank]
            return {
                n for n in self.graph.neighbors(node) if self.graph.nodes[n].get("kind") == "nic"
            }

        theirs = nics(g)
        return bool(theirs) and not theirs & nics(a) and self.over_nvlink(a, g)

    def relay_route_ids(
        self, src: np.ndarray, via: np.ndarray, dst: np.ndarray, labels: np.ndarray | None = None
    ) -> np.ndarray:
        """Routes from ``src`` to ``dst`` through GPU ``via`` (ranks, one each per
        transfer): the route to ``via``, then ``via``'s route to ``dst`` (a PXN send:
        over NVLink to the GPU whose NIC it leaves by). The direct route is never searched:
        between rails of a large fabric it is an ECMP search over the spines, the
        costliest route to find. ``labels`` pick among equal-cost legs."""
        src, via, dst = np.asarray(src), np.asarray(via), np.asarray(dst)
        labels = np.zeros(len(src), dtype=np.int64) if labels is None else np.asarray(labels)
        first = self.route_ids(src, via, labels)
        second = self.route_ids(via, dst, labels)
        return np.array(
            [
                self.route_over(
                    tuple(np.concatenate([self._route_links[a], self._route_links[b]]).tolist())
                )
                for a, b in zip(first.tolist(), second.tolist(), strict=True)
            ],
            dtype=np.int64,
        )

    def _pxn_route(self, s: int, d: int, label: int) -> int:
        via = self.pxn_via(s, d, label)
        if via is None:
            return int(self.route_ids(np.array([s]), np.array([d]), np.array([label]))[0])
        return int(self.relay_route_ids([s], [via], [d], [label])[0])

    def switch_route_ids(self, ranks: np.ndarray, *, down: bool) -> np.ndarray:
        """Routes between each rank's GPU and the NVSwitch that reduces and multicasts
        for it (a neighbour of kind ``nvswitch`` with ``nvls`` set): into the switch, or
        out of it when ``down``. Cached per rank."""
        out = np.empty(len(ranks), dtype=np.int64)
        for n, rank in enumerate(np.asarray(ranks).tolist()):
            route = self._switch_routes.get((rank, down))
            if route is None:
                gpu = self.nodes[rank]
                switches = [
                    node
                    for node in sorted(self.graph.neighbors(gpu), key=str)
                    if self.graph.nodes[node].get("kind") == "nvswitch"
                    and self.graph.nodes[node].get("nvls")
                ]
                if not switches:
                    raise CcsimError(
                        f"GPU {gpu!r} has no NVSwitch with in-switch reduction (NVLink SHARP) "
                        "next to it, which nvls needs: NVSwitch generations from H100 on have "
                        "it (presets: 'nvls: true' under server.intra, as in dgx-h100)"
                    )
                path = [switches[0], gpu] if down else [gpu, switches[0]]
                route = self._switch_routes[(rank, down)] = self._add_route(path)
            out[n] = route
        return out

    def sharp_switch(self, rank: int) -> object:
        """The fabric switch that reduces in the network for ``rank`` (SHARP): the nearest
        switch marked ``sharp`` on a path out through the rank's NIC (least latency, then
        fewest hops, then graph order). Cached; an error says how to mark one."""
        switch = self._sharp_switches.get(rank)
        if switch is not None:
            return switch
        if self._network_view is None:
            self._network_view = self._without_interconnect()
        view, gpu = self._network_view, self.nodes[rank]
        order, gpus = self._order, self._gpus
        dist, pred = {gpu: 0}, {gpu: None}
        heap = [(0, order[gpu], gpu)]
        while heap:
            du, _, u = heappop(heap)
            if du > dist[u]:
                continue
            data = self.graph.nodes[u]
            if data.get("kind") == "switch" and data.get("sharp"):
                switch = u
                break
            if u in gpus and u != gpu:
                continue  # GPUs do not forward traffic
            for v in sorted(view.neighbors(u), key=order.__getitem__):
                cost = round(float(view.edges[u, v].get("latency", 0.0)) * _PS_PER_S) + _HOP
                if v not in dist or du + cost < dist[v]:
                    dist[v], pred[v] = du + cost, u
                    heappush(heap, (du + cost, order[v], v))
        if switch is None:
            raise CcsimError(
                f"GPU {gpu!r} reaches no fabric switch with in-network reduction (SHARP) "
                "through its NIC, which collnet needs: set 'sharp: true' in the topology's "
                "fabric section"
            )
        path = [switch]
        while pred[path[-1]] is not None:
            path.append(pred[path[-1]])
        self._sharp_paths[rank] = path[::-1]
        self._sharp_switches[rank] = switch
        return switch

    def sharp_route_ids(
        self, ranks: np.ndarray, *, down: bool, partners: np.ndarray | None = None
    ) -> np.ndarray:
        """Routes between each rank's GPU and its SHARP switch (:meth:`sharp_switch`): out
        through the NIC into the switch, or back when ``down``. ``partners[i]`` (the other
        rank of op i) must reduce in the same switch: a group reduces in one switch."""
        ranks = np.asarray(ranks).tolist()
        out = np.empty(len(ranks), dtype=np.int64)
        for n, rank in enumerate(ranks):
            switch = self.sharp_switch(rank)
            if partners is not None:
                other = int(partners[n])
                if self.sharp_switch(other) != switch:
                    raise CcsimError(
                        f"GPUs {self.nodes[rank]!r} and {self.nodes[other]!r} reach different "
                        f"SHARP switches ({switch!r}, {self.sharp_switch(other)!r}); ccsim "
                        "reduces a group in one switch: use a rail-optimized or single-switch "
                        "fabric, or put the servers under one leaf"
                    )
            route = self._switch_routes.get((rank, down, "sharp"))
            if route is None:
                path = self._sharp_paths[rank]
                route = self._add_route(path[::-1] if down else path)
                self._switch_routes[(rank, down, "sharp")] = route
            out[n] = route
        return out

    def _without_interconnect(self) -> nx.Graph:
        """A view of the graph without the servers' GPU interconnect links and switches."""
        graph = self.graph

        def keep_edge(u, v, *_) -> bool:
            return str(graph.edges[u, v].get("link", "")).lower() not in INTRA_LINKS

        def keep_node(node) -> bool:
            return graph.nodes[node].get("kind") != "nvswitch"

        return nx.subgraph_view(graph, filter_node=keep_node, filter_edge=keep_edge)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ptr, links, latency)`` over all routes computed so far.

        ``latency[r]`` is route r's link latencies plus its per-message cost (a flow is
        one message; see :meth:`message_costs`), in seconds.
        """
        n = len(self._route_links)
        if self._arrays is None or self._built < n:
            new = self._route_links[self._built :]
            lengths = np.fromiter((len(links) for links in new), dtype=np.int64, count=len(new))
            start = int(self._ptr_buf[self._built])
            end = start + int(lengths.sum())
            self._ptr_buf = _grown(self._ptr_buf, n + 1)
            self._flat_buf = _grown(self._flat_buf, end)
            self._lat_buf = _grown(self._lat_buf, n)
            self._ptr_buf[self._built + 1 : n + 1] = start + np.cumsum(lengths)
            if len(new):
                self._flat_buf[start:end] = np.concatenate(new)
            self._lat_buf[self._built : n] = np.add(
                self._latency[self._built :], self._message[self._built :]
            )
            self._built = n
            self._arrays = (self._ptr_buf[: n + 1], self._flat_buf[:end], self._lat_buf[:n])
        return self._arrays

    def message_costs(self) -> np.ndarray:
        """Per-message cost (s) of each route: the sum of 1/message_rate over its links."""
        return np.array(self._message, dtype=float)

    def path_nodes(self, route: int) -> list:
        """The nodes a route visits, for reports."""
        ptr, flat, _ = self.arrays()
        links = flat[ptr[route] : ptr[route + 1]]
        if len(links) == 0:
            return []
        return [self.links.src_node[links[0]]] + [self.links.dst_node[i] for i in links]


def add_stand_in_route(router: Router, links: list[int], latency_s: float) -> int:
    """A new route over ``links`` (ids) with latency ``latency_s`` (its message cost
    included) instead of theirs: a flow that keeps only the links that may limit its
    rate but is delivered when its whole route would deliver it (a call timed alone on
    its binding links, :mod:`simulator.workload.reduced`). Route lookups never return it.

    >>> from simulator.topology import ring_graph
    >>> g = ring_graph(4, 1e9, 1e-6)
    >>> router = Router(g, LinkTable(g))
    >>> r = add_stand_in_route(router, [0], 5e-6)
    >>> float(router.arrays()[2][r]), router.arrays()[1][router.arrays()[0][r]].item()
    (5e-06, 0)
    """
    router._route_links.append(np.array(links, dtype=np.int64))
    router._latency.append(float(latency_s))
    router._message.append(0.0)
    router._arrays = None
    return len(router._route_links) - 1
