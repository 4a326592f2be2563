"""The scalar replay's max-min filling by route (``_Net._fill``, kept incrementally:
only the links of the routes a round freezes get a new share) against the network's
own filling flow by flow (:func:`simulator.network.maxmin.small_rates_list`, which
recounts every link's load each round): the same rate for every flow, to the bit, on
random routes with dyadic loads (as :func:`~simulator.collective.scalar_replay.
replay_scalar` admits them), ties and near-ties (within the filling's 1e-12) included."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from simulator.collective.scalar_replay import _INF, _Net
from simulator.network.maxmin import small_rates_list

# Loads per unit of rate a route puts on a link: weight / class size, short dyadic
# numbers (1 unweighted; 8 replicas over classes of 8, 16, 4 links: 1, 0.5, 2).
LOADS = (1.0, 0.5, 0.25, 2.0, 0.125)


def _by_route(route_load: list[dict[int, float]], capacity: dict[int, float], groups):
    """Each route's level from ``_Net._fill``."""
    net = SimpleNamespace(route_load=route_load, capacity=capacity)
    level_of = dict.fromkeys(groups, _INF)
    _Net._fill(net, groups, level_of)  # type: ignore[arg-type]
    return level_of


def _by_flow(route_load: list[dict[int, float]], capacity: dict[int, float], groups):
    """Each route's flows' rates from the network's flow-by-flow filling (every flow of
    a route on its links, one incidence entry per link and flow)."""
    links = sorted(capacity)
    index = {link: i for i, link in enumerate(links)}
    flows, entries, weights, owner = [], [], [], []
    for route, count in groups.items():
        for _ in range(count):
            flow = len(owner)
            owner.append(route)
            for link, load in route_load[route].items():
                flows.append(flow)
                entries.append(index[link])
                weights.append(load)
    remaining = [capacity[link] for link in links]
    rates = small_rates_list(flows, entries, len(owner), remaining, weights, None)
    assert rates is not None
    found: dict[int, list[float]] = {}
    for flow, rate in enumerate(rates):
        found.setdefault(owner[flow], []).append(rate)
    return found


def _instance(seed: int):
    """Random routes over a few links: capacities from a small set (equal shares on
    several links) with some nudged by less than the filling's tie (1e-12 relative)."""
    rng = random.Random(seed)
    n_links = rng.randint(1, 14)
    capacity = {}
    for link in range(n_links):
        value = rng.choice((100.0, 200.0, 400.0, 300.0, 50.0 * rng.randint(1, 9)))
        if rng.random() < 0.2:
            value *= 1 + rng.choice((3e-13, -3e-13, 5e-12))
        capacity[10 * link + 3] = value  # (link ids need not be dense)
    ids = sorted(capacity)
    route_load = []
    for _ in range(rng.randint(1, 12)):
        chosen = rng.sample(ids, rng.randint(1, min(4, len(ids))))
        route_load.append({link: rng.choice(LOADS) for link in chosen})
    routes = rng.sample(range(len(route_load)), rng.randint(1, len(route_load)))
    groups = {route: rng.randint(1, 6) for route in routes}
    used = {link for route in groups for link in route_load[route]}
    return route_load, {link: capacity[link] for link in used}, groups


@pytest.mark.parametrize("seed", range(400))
def test_fill_by_route_is_the_flow_by_flow_filling(seed):
    route_load, capacity, groups = _instance(seed)
    levels = _by_route(route_load, capacity, groups)
    rates = _by_flow(route_load, capacity, groups)
    assert list(levels) == list(groups)  # every route, in the order given
    for route, level in levels.items():
        assert rates[route] == [level] * groups[route]  # the same double


def test_fill_hand_computed():
    # Link 0 (capacity 12) carries route 0 (2 flows, load 1) and route 1 (1 flow, load
    # 2): share 12 / 4 = 3; link 1 (capacity 10) carries route 0 and route 2 (1 flow):
    # share 10 / 3. Routes 0 and 1 freeze at 3; link 1 keeps 10 - 2 x 3 = 4 for route 2.
    route_load = [{0: 1.0, 1: 1.0}, {0: 2.0}, {1: 1.0}]
    levels = _by_route(route_load, {0: 12.0, 1: 10.0}, {0: 2, 1: 1, 2: 1})
    assert levels == {0: 3.0, 1: 3.0, 2: 4.0}


def test_fill_ties_freeze_together():
    # Two links whose shares differ by less than 1e-12 relative are both bottlenecks of
    # the first round: their routes freeze at the lesser share.
    low = 100.0
    high = low * (1 + 5e-13)
    levels = _by_route([{0: 1.0}, {1: 1.0}], {0: low, 1: high}, {0: 1, 1: 1})
    assert levels == {0: low, 1: low}
