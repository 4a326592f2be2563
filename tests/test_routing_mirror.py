"""A search from ``s`` to ``d`` in a Graph also gives the paths from ``d`` back to ``s``
(:meth:`simulator.network.routing.Router._shortest_paths`): each must be what a search
of its own from ``d`` finds, and the routes (ECMP picks included) the same."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from simulator.network.routing import LinkTable, Router
from simulator.topology import load_topology, ring_graph


def _router(graph: nx.Graph) -> Router:
    return Router(graph, LinkTable(graph))


TOPOLOGIES = [
    ("hgx-b200", 8, {"type": "leaf-spine", "oversubscription": 2}),
    ("hgx-b200", 3, {"type": "rail-optimized"}),
    ("dgx-h100", 2, None),
    ("ascend-910", 2, None),
]


@pytest.mark.parametrize(("preset", "nodes", "fabric"), TOPOLOGIES)
def test_the_mirrored_paths_are_the_searched_ones(preset, nodes, fabric):
    """For every ordered pair of GPUs (one sample of servers' pairs on the larger
    graphs): the entry kept for (d, s) by the search from s is the search from d's own,
    a tuple of the same link ids or the same next hops in the same order."""
    graph = load_topology(preset, nodes, fabric=fabric)
    ranks = len([n for n, data in graph.nodes(data=True) if data.get("kind") == "gpu"])
    pairs = [(s, d) for s, d in itertools.combinations(range(ranks), 2) if (s * 7 + d) % 5 == 0]
    assert pairs
    mirrored = _router(graph)
    for s, d in pairs:
        mirrored._code(s, d)
        assert (d, s) in mirrored._paths
    searched = _router(graph)
    for s, d in pairs:
        alone = searched._shortest_paths(d, s)
        assert mirrored._paths[(d, s)] == alone, (s, d)
        assert not isinstance(alone, dict) or any(len(v) > 1 for v in alone.values())


def test_routes_are_the_same_whichever_way_first():
    """Route ids and paths of GPUs under the two leaves of a 2:1 leaf-spine of 8 HGX B200
    (16 spines), each connection label 0..3 (ECMP hashes (seed, src, dst, label) at each
    choice): a router asked for d -> s after s -> d (mirrored) and one asked for d -> s
    first give the same paths."""
    fabric = {"type": "leaf-spine", "oversubscription": 2, "routing": "ecmp"}
    graph = load_topology("hgx-b200", 8, fabric=fabric)
    pairs = [(s, d) for s in range(32) for d in range(32, 64) if (s + 3 * d) % 4 == 0]
    src = np.array([s for s, _ in pairs for _ in range(4)])
    dst = np.array([d for _, d in pairs for _ in range(4)])
    labels = np.array([c for _ in pairs for c in range(4)])
    forward = _router(graph)
    forward.route_ids(src, dst, labels)  # searches s -> d, keeps d -> s
    back = forward.route_ids(dst, src, labels)
    fresh = _router(graph)
    alone = fresh.route_ids(dst, src, labels)
    paths = [forward.path_nodes(int(r)) for r in back]
    assert paths == [fresh.path_nodes(int(r)) for r in alone]
    assert len({tuple(p) for p in paths}) > len(pairs)  # labels took different spines


def test_a_digraph_is_not_mirrored():
    """A DiGraph's ways back may differ: nothing is kept for them."""
    graph = nx.DiGraph(ring_graph(4, 1e9, 1e-6))
    router = _router(graph)
    router._code(0, 1)
    assert (1, 0) not in router._paths
