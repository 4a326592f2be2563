"""The flow network's local search (per-link sets, each flow's entries read from its place
in the incidence store) gives every flow the same rates, to the bit, as the reference
path that finds each event's component and entries by passes over the whole incidence
(``FlowNetwork._local_search = False``): every flow's send time and every link's bytes
and busy time, on several topologies, with flows that meet and flows that do not, starts
and ends interleaved, weighted flows, link classes and a timed capacity change (a
fault)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology

FABRICS = {
    "fat-tree": {"type": "fat-tree", "k": 6},
    "leaf-spine": {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2},
    "rail-optimized": {"type": "rail-optimized"},
}


class Log:
    """An owner that records when each op is sent."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.sent: list[tuple[int, float]] = []

    def on_sent(self, ops: np.ndarray) -> None:
        self.sent.extend((int(op), self.env.now) for op in ops.tolist())

    def on_delivered(self, ops: np.ndarray) -> None:
        pass


def run(fabric: str, seed: int, *, local: bool, weighted: bool = False, fault: bool = False):
    """Waves of random flows between the GPUs of 4 DGX-H100 servers, some started while
    others are in flight, one at a time or in batches; returns what every op and link
    saw."""
    FlowNetwork._local_search = local
    try:
        graph = load_topology("dgx-h100", 4, fabric=FABRICS[fabric])
        env = simpy.Environment()
        network = FlowNetwork(env, graph)
        if weighted:
            network.weigh_flows()
        log = Log(env)
        owner = network.register(log)
        rng = np.random.default_rng(seed)
        ranks = 32
        next_op = 0

        def wave(count: int) -> None:
            nonlocal next_op
            src = rng.integers(0, ranks, count)
            dst = (src + rng.integers(1, ranks, count)) % ranks
            routes = network.route_ids(src, dst, rng.integers(0, 4, count))
            ops = np.arange(next_op, next_op + count)
            next_op += count
            weight = rng.integers(1, 4, count).astype(float) if weighted else None
            network.add_flows(owner, ops, routes, rng.uniform(1e5, 5e7, count), weight)

        # Batches and single flows at staggered times: they meet, leave, and meet again.
        for step in range(40):
            count = int(rng.choice([1, 1, 2, 3, 40, 120]))
            env.timeout(float(step) * 2e-4).callbacks.append(lambda _e, c=count: wave(c))
        if fault:
            links = np.flatnonzero(np.array(network.links.kind) == "rdma")[:6]
            env.timeout(1.3e-3).callbacks.append(lambda _e: network.scale_links(links, 0.25))
            env.timeout(4.1e-3).callbacks.append(lambda _e: network.scale_links(links, 1.0))
        env.run()
        network.close_link_records()
        return sorted(log.sent), network.link_records(), next_op
    finally:
        FlowNetwork._local_search = True


@pytest.mark.parametrize("fabric", sorted(FABRICS))
@pytest.mark.parametrize("seed", [0, 1])
def test_local_search_equals_the_whole_incidence(fabric, seed):
    local = run(fabric, seed, local=True)
    whole = run(fabric, seed, local=False)
    assert local == whole
    assert len(local[0]) == local[2]  # every op sent


def test_weighted_flows_and_a_fault_agree():
    local = run("leaf-spine", 3, local=True, weighted=True, fault=True)
    whole = run("leaf-spine", 3, local=False, weighted=True, fault=True)
    assert local == whole
    # The fault changed the run (so the comparison covers a capacity change in flight).
    healthy = run("leaf-spine", 3, local=True, weighted=True)
    assert healthy[0] != local[0]


def test_link_classes_agree():
    """Aggregated flows (link classes): each entry's load on its representative."""

    def classed(local: bool):
        FlowNetwork._local_search = local
        try:
            graph = load_topology("dgx-h100", 2)
            env = simpy.Environment()
            network = FlowNetwork(env, graph)
            n = len(network.links)
            # Pair links 2i and 2i+1 into one class (its representative: 2i).
            link_class = np.arange(n) - np.arange(n) % 2
            size = np.where(np.arange(n) + 1 < n, 2.0, 1.0)
            size[link_class + 1 >= n] = 1.0
            network.set_link_classes(link_class, size)
            log = Log(env)
            owner = network.register(log)
            rng = np.random.default_rng(5)
            for step in range(12):
                count = int(rng.choice([1, 3, 20]))
                src = rng.integers(0, 16, count)
                dst = (src + rng.integers(1, 16, count)) % 16
                routes = network.route_ids(src, dst)
                ops = np.arange(step * 100, step * 100 + count)
                args = (owner, ops, routes, rng.uniform(1e6, 1e8, count), np.full(count, 2.0))
                env.timeout(step * 1e-4).callbacks.append(lambda _e, a=args: network.add_flows(*a))
            env.run()
            network.close_link_records()
            return sorted(log.sent), network.link_records()
        finally:
            FlowNetwork._local_search = True

    assert classed(True) == classed(False)
