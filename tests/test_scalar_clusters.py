"""The scalar replay's shortcuts by the shape of its routes (simulator.collective.
scalar_replay): routes joined through shared links (clusters) filled apart and, where
every two routes of a cluster share a link, found without the search; links crossed by
the same routes (twins) counted once; the next finishes by a scan where routes are few.
Each is held to an independent source: the clusters and twins of hand-made routes, the
filling over every route at once (itself held to the network's flow-by-flow filling in
tests/test_scalar_fill.py), and the reference replay bit for bit on rings that take
each path (the paths taken are checked, so that the comparison covers them)."""

from __future__ import annotations

import random
from itertools import pairwise
from types import SimpleNamespace

import pytest
from test_scalar_replay import _compare

from simulator.algorithms import build_schedule
from simulator.collective import scalar_replay as sr
from simulator.collective.run import rank_layout
from simulator.topology import load_topology


def test_clusters_and_twins_of_hand_made_routes():
    # Routes 0 and 1 share link 4 (a hop inside a server and a PXN hop through the same
    # NVLink port); route 2 shares link 7 with route 1; route 3 is alone. Links 4 and 5
    # are crossed by routes 0 and 1 once each (twins); 8 and 9 by route 2 alone.
    entries = [{4: 1, 5: 1}, {4: 1, 5: 1, 6: 1, 7: 1}, {7: 1, 8: 1, 9: 1}, {10: 2}]
    cluster_of, routes, cliques = sr._clusters(entries)
    assert routes == [[0, 1, 2], [3]]
    assert cluster_of == [0, 0, 0, 1]
    assert not cliques  # routes 0 and 2 share no link
    assert sr._clusters(entries[:2] + entries[3:])[2]  # without route 2: cliques
    twins, kept = sr._twins(entries)
    assert twins == {4: [4, 5], 6: [6], 7: [7], 8: [8, 9], 10: [10]}
    assert kept == [{4: 1}, {4: 1, 6: 1, 7: 1}, {7: 1, 8: 1}, {10: 2}]


def _net(route_load, capacity):
    """What _fill and _fill_by_cluster read of a _Net."""
    entries = [dict.fromkeys(load, 1) for load in route_load]
    cluster_of, _, _ = sr._clusters(entries)
    net = SimpleNamespace(
        route_load=route_load, capacity=capacity, cluster_of=cluster_of, cluster_fills={}
    )
    net._fill = lambda groups, level_of: sr._Net._fill(net, groups, level_of)
    return net


def _clustered(seed: int, nudge: float):
    """Three to five independent groups of routes on disjoint links, equal capacities
    across groups (equal levels), one group's capacities moved by ``nudge`` relative."""
    rng = random.Random(seed)
    route_load, capacity = [], {}
    for group in range(rng.randint(3, 5)):
        base = 100 * group
        links = [base + i for i in range(rng.randint(1, 4))]
        for link in links:
            capacity[link] = rng.choice((100.0, 200.0, 400.0))
            if group == 0:
                capacity[link] *= 1 + nudge
        for _ in range(rng.randint(1, 3)):
            chosen = rng.sample(links, rng.randint(1, len(links)))
            route_load.append({link: rng.choice((1.0, 0.5, 2.0)) for link in chosen})
    groups = {route: rng.randint(1, 5) for route in range(len(route_load))}
    return route_load, capacity, groups


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("nudge", [0.0, 3e-13, 1e-6])
def test_filling_by_cluster_is_the_filling_over_every_route(seed, nudge):
    """Equal or distinct levels (the nudge is 0, within the 1e-12 tie, or beyond it):
    where the clusters' own fillings are taken, every level is the whole filling's;
    where two different levels lie within the tie they are refused."""
    route_load, capacity, groups = _clustered(seed, nudge)
    net = _net(route_load, capacity)
    whole = dict.fromkeys(groups, sr._INF)
    sr._Net._fill(net, groups, whole)
    parts = sr._Net._fill_by_cluster(net, groups)
    levels = sorted(set(whole.values()))
    near = any(b <= a * (1 + sr._TIE) for a, b in pairwise(levels))
    if parts is None:
        # Refused only where some levels of the clusters lie within the tie.
        assert nudge == 3e-13 or near
    else:
        assert parts == whole  # the same double for every route
        assert list(parts) == list(groups)


def test_a_near_tie_between_clusters_is_refused():
    # Two single-link clusters 3e-13 apart: the whole filling freezes both at the lesser
    # level (one round), each cluster's own at its own; the shortcut refuses.
    net = _net([{0: 1.0}, {1: 1.0}], {0: 100.0, 1: 100.0 * (1 + 3e-13)})
    whole = dict.fromkeys({0: 1, 1: 1}, sr._INF)
    sr._Net._fill(net, {0: 1, 1: 1}, whole)
    assert whole[0] == whole[1] == 100.0
    assert sr._Net._fill_by_cluster(net, {0: 1, 1: 1}) is None


def _watch(monkeypatch) -> list:
    """The _Net made by each replay."""
    made = []
    init = sr._Net.__init__

    def watched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(sr._Net, "__init__", watched)
    return made


@pytest.mark.parametrize("protocol", ["LL128", "Simple"])
def test_pxn_rings_take_the_clique_path_and_equal_the_reference(monkeypatch, protocol):
    """On two DGX H100 each channel's hop between servers goes through the next GPU's
    NVLink port to its NIC (PXN), sharing that port with the hop inside the server: the
    clusters are such pairs, cliques, with twin links (the port's two directions, the
    NIC's), and the replay is the reference's to the bit."""
    made = _watch(monkeypatch)
    graph = load_topology("dgx-h100", 2)
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 2e7, chunks=2, channels=4)
    _compare(graph, schedule, protocol)
    (net,) = made
    assert net.cliques and net.scan
    assert len(net.cluster_routes) > 1
    assert any(len(group) > 1 for group in net.twins.values())


def test_a_quotient_takes_the_paths_on_link_classes_and_equals_the_reference(monkeypatch):
    """The quotient of four servers on link classes (as the workload's data-parallel
    rings run): the same paths, loads weight / class size, the reference's bits."""
    made = _watch(monkeypatch)
    graph = load_topology("dgx-h100", 4)
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), 3e7, chunks=2, channels=4)
    _compare(graph, schedule, "LL128", symmetric=True)
    (net,) = made
    assert net.cliques and net.weighted


def test_the_heap_and_the_search_still_equal_the_reference(monkeypatch):
    """With the scan and the clique path shut (as for many routes, or clusters that are
    not cliques), the heap of finishes and the search run, and agree with the
    reference as before."""
    monkeypatch.setattr(sr, "_SCAN_ROUTES", 0)
    clusters = sr._clusters
    monkeypatch.setattr(sr, "_clusters", lambda entries: (*clusters(entries)[:2], False))
    made = _watch(monkeypatch)
    graph = load_topology("dgx-h100", 2)
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 2e7, chunks=2, channels=4)
    _compare(graph, schedule, "Simple")
    (net,) = made
    assert not net.cliques and not net.scan
