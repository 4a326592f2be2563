"""Routing: shortest paths, policies, ECMP hashing and the per-message NIC cost."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import simulator
from simulator.network.routing import LinkTable, Router
from simulator.topology import gpu_nodes, load_topology, ring_graph


def router_of(graph: nx.Graph, **kwargs) -> Router:
    return Router(graph, LinkTable(graph), **kwargs)


def ecmp(graph: nx.Graph) -> nx.Graph:
    """``graph`` routed by the ECMP hash (its presets' InfiniBand would route per
    destination), for the tests of the hash."""
    graph.graph["routing"] = "ecmp"
    return graph


def path(router: Router, src: int, dst: int, label: int = 0) -> list:
    route = router.route_ids(np.array([src]), np.array([dst]), np.array([label]))
    return router.path_nodes(int(route[0]))


def two_nodes(rates: tuple[float | None, float | None]) -> nx.Graph:
    """gpu0 - nic0 - switch - nic1 - gpu1: 10 GB/s everywhere, 1 us per link."""
    graph = nx.Graph()
    graph.add_node("gpu0", kind="gpu", rank=0, server=0)
    graph.add_node("gpu1", kind="gpu", rank=1, server=1)
    for i in (0, 1):
        graph.add_node(f"nic{i}", kind="nic", server=i)
    graph.add_node("sw", kind="switch")
    link = {"bandwidth": 10e9, "latency": 1e-6, "link": "rdma"}
    graph.add_edge("gpu0", "nic0", **link)
    graph.add_edge("gpu1", "nic1", **link)
    for i, rate in enumerate(rates):
        extra = {} if rate is None else {"message_rate": rate}
        graph.add_edge(f"nic{i}", "sw", **link, **extra)
    return graph


def test_message_rate_adds_one_over_rate_per_nic_crossed():
    """All-gather of 2 kB on 2 ranks: each sends 1 kB over 4 links of 1 us, 10 GB/s:
    4 us + 0.1 us. A NIC limited to 1 M msg/s adds 1/1e6 = 1 us per message crossing
    it: +1 us with one such NIC, +2 us with both."""
    times = [
        simulator.simulate_collective(two_nodes(rates), "all_gather", 2000).time_s
        for rates in ((None, None), (1e6, None), (1e6, 1e6))
    ]
    assert times[0] == pytest.approx(4.1e-6, rel=1e-9)
    assert times[1] - times[0] == pytest.approx(1e-6, rel=1e-9)
    assert times[2] - times[0] == pytest.approx(2e-6, rel=1e-9)


def test_route_latency_includes_the_message_cost():
    """Router.arrays() latency = 4 links x 1 us + 2 x 1/(4 M msg/s) = 4.5 us."""
    router = router_of(two_nodes((4e6, 4e6)))
    route = int(router.route_ids(np.array([0]), np.array([1]))[0])
    assert router.arrays()[2][route] == pytest.approx(4.5e-6)
    assert router.message_costs()[route] == pytest.approx(0.5e-6)


def test_alibaba_nic_message_rate_is_charged_on_the_network_only():
    """30 M msg/s per eRDMA NIC: 1/30e6 s per NIC on routes between servers (two NICs),
    none inside a server."""
    graph = load_topology("alibaba-ebmgn7ex", nodes=2)
    router = router_of(graph)
    routes = router.route_ids(np.array([0, 0]), np.array([1, 8]))
    costs = router.message_costs()[routes]
    assert costs[0] == 0
    assert costs[1] == pytest.approx(2 / 30e6)


def test_fewer_hops_win_a_latency_tie():
    """a-b direct (2 us) against a-x-b (1 us + 1 us): same latency, the direct link wins."""
    graph = nx.Graph()
    graph.add_node("a", kind="gpu", rank=0)
    graph.add_node("b", kind="gpu", rank=1)
    graph.add_node("x", kind="switch")
    graph.add_edge("a", "b", bandwidth=1e9, latency=2e-6)
    graph.add_edge("a", "x", bandwidth=1e9, latency=1e-6)
    graph.add_edge("x", "b", bandwidth=1e9, latency=1e-6)
    assert path(router_of(graph), 0, 1) == ["a", "b"]


def two_paths(first: tuple[float, ...], second: tuple[float, ...]) -> nx.Graph:
    """a-x1-x2-b and a-y1-y2-b with the given per-link latencies."""
    graph = nx.Graph()
    graph.add_node("a", kind="gpu", rank=0)
    graph.add_node("b", kind="gpu", rank=1)
    for stem, latencies in (("x", first), ("y", second)):
        nodes = ["a", f"{stem}1", f"{stem}2", "b"]
        for node in nodes[1:3]:
            graph.add_node(node, kind="switch")
        for u, v, latency in zip(nodes[:-1], nodes[1:], latencies, strict=True):
            graph.add_edge(u, v, bandwidth=1e9, latency=latency)
    return graph


def test_equal_cost_paths_tie_exactly_whatever_the_float_order():
    """0.1 + 0.2 + 0.35 us and 0.35 + 0.2 + 0.1 us differ in the last bit when added in
    path order as floats; they are the same cost, so over 64 labels both paths carry
    flows. A path 1 ps longer never does."""
    forward, backward = (0.1e-6, 0.2e-6, 0.35e-6), (0.35e-6, 0.2e-6, 0.1e-6)
    assert sum(forward) != sum(backward)
    router = router_of(two_paths(forward, backward))
    assert {path(router, 0, 1, label)[1] for label in range(64)} == {"x1", "y1"}
    router = router_of(two_paths(forward, (0.35e-6, 0.2e-6, 0.1e-6 + 1e-12)))
    assert {path(router, 0, 1, label)[1] for label in range(64)} == {"x1"}


def test_one_connection_keeps_its_path_and_routes_are_reproducible():
    """Same graph and seed: same route per (src, dst, label), call after call and router
    after router. Another seed moves some connections."""
    graph = ecmp(load_topology("dgx-h100", nodes=4))
    src = np.repeat(np.arange(0, 32, 8) + 7, 16)  # local GPU 7 of each server
    dst = (src + 1) % 32  # local GPU 0 of the next: another rail, via a spine
    labels = np.tile(np.arange(16), 4)
    first = router_of(graph)
    routes = first.route_ids(src, dst, labels)
    again = first.route_ids(src[::-1], dst[::-1], labels[::-1])[::-1]
    assert np.array_equal(routes, again)
    spines = [
        [path(r, s, d, c)[3] for s, d, c in zip(src, dst, labels, strict=True)]
        for r in (router_of(graph), router_of(graph))
    ]
    assert spines[0] == spines[1]
    other = router_of(graph, seed=7)
    moved = [path(other, s, d, c)[3] for s, d, c in zip(src, dst, labels, strict=True)]
    assert moved != spines[0]


def test_ecmp_spreads_connections_evenly_over_spines():
    """4 x dgx-h100, rail-optimized: every ordered pair of GPUs on different servers and
    different rails (4 x 3 x 8 x 7 = 672 pairs), one connection each, picks one of the 4
    spines. With a fair hash each spine's count is Binomial(672, 1/4): mean 168, standard
    deviation sqrt(672 x 3/16) = 11.2; all four lie within 4 deviations (124..212)."""
    graph = load_topology("dgx-h100", nodes=4)
    router = router_of(graph)
    pairs = [(s, d) for s in range(32) for d in range(32) if s // 8 != d // 8 and s % 8 != d % 8]
    src, dst = (np.array(x) for x in zip(*pairs, strict=True))
    counts: dict[str, int] = {}
    for route in router.route_ids(src, dst, np.zeros(len(src), dtype=int)):
        nodes = router.path_nodes(int(route))
        (spine,) = [n for n in nodes if str(n).startswith("spine")]
        counts[spine] = counts.get(spine, 0) + 1
    assert len(pairs) == 672
    assert sorted(counts) == ["spine0", "spine1", "spine2", "spine3"]
    assert all(124 <= count <= 212 for count in counts.values()), counts


def test_gpus_do_not_forward_and_servers_keep_their_traffic():
    """Rail-optimized: GPU 7 of server 0 to GPU 0 of server 1 goes up to a spine rather
    than through GPU 0 of server 0 (which would keep it on one rail). Inside a server,
    traffic never takes the network even where that is faster: ascend-910's NPU 0 to
    NPU 4 crosses the host over PCIe (2 us) although the RoCE ports would take 1 us."""
    graph = load_topology("dgx-h100", nodes=2)
    nodes = path(router_of(graph), 7, 8)
    kinds = [graph.nodes[n].get("tier", graph.nodes[n]["kind"]) for n in nodes]
    assert kinds == ["gpu", "nic", "leaf", "spine", "leaf", "nic", "gpu"]
    graph = load_topology("ascend-910", nodes=2)
    assert path(router_of(graph), 0, 4) == ["s0/gpu0", "s0/host", "s0/gpu4"]


def test_a_gpu_ring_forwards_when_nothing_else_connects():
    """On a 1-D ring graph the only way from GPU 0 to GPU 3 of 8 is through 1 and 2."""
    router = router_of(ring_graph(8, 1e9, 1e-6))
    assert path(router, 0, 3) == ["gpu0", "gpu1", "gpu2", "gpu3"]


def test_directed_graph_routes_along_its_arcs():
    """A one-way ring of 4 (DiGraph: each edge is one direction): 3 -> 0 is one hop,
    0 -> 3 has to go round, 0 -> 1 -> 2 -> 3."""
    graph = nx.DiGraph()
    for rank in range(4):
        graph.add_node(rank, kind="gpu", rank=rank)
    for rank in range(4):
        graph.add_edge(rank, (rank + 1) % 4, bandwidth=1e9, latency=1e-6)
    router = router_of(graph)
    assert path(router, 3, 0) == [3, 0]
    assert path(router, 0, 3) == [0, 1, 2, 3]


def test_large_ring_routes_neighbours_in_one_hop():
    """1024 GPUs on a ring: the 1024 neighbour routes (one hop each) come from the dense
    single-path table. (Its speed is ccsim bench's ring-1024, not a timed test: CI
    machines are shared.)"""
    graph = ring_graph(1024, 150e9, 500e-9)
    router = router_of(graph)
    src = np.arange(1024)
    routes = router.route_ids(src, (src + 1) % 1024, np.zeros(1024, dtype=int))
    ptr = router.arrays()[0]
    assert np.all(ptr[routes + 1] - ptr[routes] == 1)


def test_router_reads_the_seed_from_the_graph():
    """load_topology(seed=) stores ecmp_seed; the router uses it unless told otherwise."""
    graph = load_topology("dgx-h100", nodes=2, seed=5)
    assert graph.graph["ecmp_seed"] == 5
    assert router_of(graph).seed == 5
    assert router_of(graph, seed=1).seed == 1
    assert len(gpu_nodes(graph)) == 16


def shortest_paths_by_networkx(graph: nx.Graph, first, last) -> set[tuple]:
    """Every shortest path between two GPUs by the cost the module docstring states:
    integer picoseconds of latency plus 1 per hop, plus 10^12 per GPU passed through and
    per node outside the server entered when both GPUs share one (networkx's own
    Dijkstra, not the router's search)."""
    gpus = set(gpu_nodes(graph))
    server = dict(graph.nodes(data="server"))
    home = server[first] if server[first] == server[last] else None

    def weight(u, v, data) -> int:
        cost = round(float(data.get("latency", 0.0)) * 1e12) + 1
        if v in gpus and v != last:
            cost += 10**12
        if home is not None and server[v] != home:
            cost += 10**12
        return cost

    return set(map(tuple, nx.all_shortest_paths(graph, first, last, weight=weight)))


@pytest.mark.parametrize(
    ("graph", "pairs"),
    [
        # Rail-optimized fat-tree with 16 spines: cross-rail pairs have 16 equal paths.
        (
            ecmp(load_topology("dgx-h100", nodes=16)),
            [(0, 9), (7, 120), (5, 5 + 64), (3, 2), (127, 0)],
        ),
        (ecmp(load_topology("dgx-a100", nodes=40)), [(0, 319), (17, 300), (8, 16), (1, 2)]),
        (ecmp(load_topology("gb200-nvl72", nodes=2)), [(0, 71), (3, 100), (143, 1)]),
        (ring_graph(9, 1e9, 1e-6), [(0, 4), (0, 5), (2, 1)]),
    ],
    ids=["dgx-h100x16", "dgx-a100x40", "gb200-nvl72x2", "ring-9"],
)
def test_routes_are_the_shortest_paths_networkx_finds(graph, pairs):
    """The router's search skips nodes that cannot be on a shortest path (bounds from a
    bidirectional search); every route it gives is one of networkx's shortest paths, and
    over 256 connections each pair uses every one of them (up to 16 here; a fair hash
    misses one of 16 with probability 16 x (15/16)^256 < 2e-6, and the hash is fixed)."""
    router = router_of(graph)
    nodes = gpu_nodes(graph)
    for src, dst in pairs:
        expected = shortest_paths_by_networkx(graph, nodes[src], nodes[dst])
        assert len(expected) <= 16
        seen = {tuple(path(router, src, dst, label)) for label in range(256)}
        assert seen == expected, (src, dst)


def test_wide_switches_are_searched_only_toward_the_target(monkeypatch):
    # A rail's leaf has a port per server: the search skips the neighbours that cannot
    # be on a shortest path. Every route (ECMP picks included) must be the full search's.
    import simpy

    from simulator.network import routing
    from simulator.network.flows import FlowNetwork
    from simulator.topology import load_topology

    graph = load_topology("dgx-h100", 48, fabric="rail-optimized")
    # A rail's leaf has 48 ports down and 48 up: the shortcut is exercised.
    assert max(d for _, d in graph.degree()) > routing._WIDE
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 384, 600), rng.integers(0, 384, 600)
    src, dst = src[src != dst], dst[src != dst]
    labels = rng.integers(0, 4, len(src))
    links = []
    for wide in (routing._WIDE, 10**9):
        monkeypatch.setattr(routing, "_WIDE", wide)
        router = FlowNetwork(simpy.Environment(), graph).router
        ids = router.route_ids(src, dst, labels)
        ptr, flat, _ = router.arrays()
        links.append([flat[ptr[i] : ptr[i + 1]].tolist() for i in ids.tolist()])
    assert links[0] == links[1]


def test_large_clusters_cache_routes_by_pair_as_small_ones_do(monkeypatch):
    # Above _DENSE_LIMIT ranks the pair -> route cache is a dict looked up once per
    # distinct pair; its routes (repeated pairs, ECMP picks) equal the dense table's.
    import simpy

    from simulator.network import routing
    from simulator.network.flows import FlowNetwork

    graph = load_topology("dgx-h100", 8, fabric="fat-tree")
    rng = np.random.default_rng(2)
    src, dst = rng.integers(0, 64, 500), rng.integers(0, 64, 500)
    src, dst = np.r_[src, src[:50]], np.r_[dst, dst[:50]]  # repeated pairs
    labels = rng.integers(0, 4, len(src))
    found = []
    for limit in (routing._DENSE_LIMIT, 0):
        monkeypatch.setattr(routing, "_DENSE_LIMIT", limit)
        router = FlowNetwork(simpy.Environment(), graph).router
        assert (router._dense is None) == (limit == 0)
        ids = np.r_[router.route_ids(src[:300], dst[:300], labels[:300]),
                    router.route_ids(src[300:], dst[300:], labels[300:])]  # fmt: skip
        ptr, flat, _ = router.arrays()
        found.append([flat[ptr[i] : ptr[i + 1]].tolist() for i in ids.tolist()])
    assert found[0] == found[1]
