"""The flow-level network: exact timelines worked out by hand (SimPy style: a log of
(event, op, time) compared with the expected list)."""

import networkx as nx
import numpy as np
import pytest
import simpy

from simulator.network.flows import FlowNetwork


class Log:
    """A flow owner that logs when its flows are sent and delivered."""

    def __init__(self, env):
        self.env = env
        self.events = []

    def on_sent(self, ops):
        self.events += [("sent", int(op), self.env.now) for op in ops]

    def on_delivered(self, ops):
        self.events += [("delivered", int(op), self.env.now) for op in ops]


def two_gpus(bandwidth=1.0, latency=0.5):
    graph = nx.Graph()
    graph.add_node("a", kind="gpu", rank=0)
    graph.add_node("b", kind="gpu", rank=1)
    graph.add_edge("a", "b", bandwidth=bandwidth, latency=latency, link="nvlink")
    return graph


def start(network, owner_id, ops, src, dst, nbytes, at=0.0):
    """Start flows at time ``at`` (a SimPy process, so later starts are real events)."""

    def process(env):
        yield env.timeout(at)
        routes = network.route_ids(np.array(src), np.array(dst))
        network.add_flows(owner_id, np.array(ops), routes, np.array(nbytes, dtype=float))

    network.env.process(process(network.env))


def setup(graph):
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    log = Log(env)
    return env, network, log, network.register(log)


def test_two_flows_share_one_direction():
    """Two 10-byte flows a->b on a 1 B/s link: 0.5 B/s each, sent at 20, delivered at 20.5."""
    env, network, log, me = setup(two_gpus())
    start(network, me, [0, 1], [0, 0], [1, 1], [10, 10])
    env.run()
    assert sorted(log.events) == [
        ("delivered", 0, 20.5),
        ("delivered", 1, 20.5),
        ("sent", 0, 20.0),
        ("sent", 1, 20.0),
    ]


def test_full_duplex_directions_do_not_share():
    """a->b and b->a each get the full 1 B/s: sent at 10, delivered at 10.5."""
    env, network, log, me = setup(two_gpus())
    start(network, me, [0, 1], [0, 1], [1, 0], [10, 10])
    env.run()
    assert sorted(log.events) == [
        ("delivered", 0, 10.5),
        ("delivered", 1, 10.5),
        ("sent", 0, 10.0),
        ("sent", 1, 10.0),
    ]


def test_rates_are_recomputed_when_a_flow_joins_and_leaves():
    """Flow 0 (10 B) starts at 0 alone at 1 B/s; flow 1 (10 B) joins at 4. Flow 0 then
    has 6 B left at 0.5 B/s: sent at 4 + 12 = 16, when flow 1 has sent 6 B; alone again,
    flow 1 sends its last 4 B at 1 B/s: sent at 20. Both delivered 0.5 s later. The link
    was busy from 0 to 20 and carried 20 bytes."""
    env, network, log, me = setup(two_gpus())
    start(network, me, [0], [0], [1], [10])
    start(network, me, [1], [0], [1], [10], at=4.0)
    env.run()
    assert log.events == [
        ("sent", 0, 16.0),
        ("delivered", 0, 16.5),
        ("sent", 1, 20.0),
        ("delivered", 1, 20.5),
    ]
    network.close_link_records()
    records = network.link_records()
    forward = next(
        i
        for i, (s, d) in enumerate(zip(records["src"], records["dst"], strict=True))
        if (s, d) == ("a", "b")
    )
    assert records["busy_s"][forward] == pytest.approx(20.0, rel=1e-12)
    assert records["bytes"][forward] == pytest.approx(20.0, rel=1e-12)
    assert sum(records["bytes"]) == pytest.approx(20.0, rel=1e-12)


def test_upstream_bottleneck_in_the_engine():
    """gpu0 -(2 B/s)- sw -(10 B/s)- gpu2, gpu1 -(10 B/s)- sw; no latency. Flow 0 (gpu0->gpu2,
    20 B) is held to 2 B/s by its first link; flows 1 and 2 (gpu1->gpu2, 40 B each) share
    sw->gpu2's remaining 8 B/s: 4 B/s each. All three finish at 10 s (20/2 = 40/4)."""
    graph = nx.Graph()
    for rank in range(3):
        graph.add_node(f"gpu{rank}", kind="gpu", rank=rank)
    graph.add_node("sw", kind="switch")
    graph.add_edge("gpu0", "sw", bandwidth=2.0, latency=0.0, link="pcie")
    graph.add_edge("gpu1", "sw", bandwidth=10.0, latency=0.0, link="pcie")
    graph.add_edge("gpu2", "sw", bandwidth=10.0, latency=0.0, link="pcie")
    env, network, log, me = setup(graph)
    start(network, me, [0, 1, 2], [0, 1, 1], [2, 2, 2], [20, 40, 40])
    env.run(until=1.0)
    slots = np.flatnonzero(network._f_op[: network._top] >= 0)
    by_op = dict(zip(network._f_op[slots].tolist(), network._f_rate[slots].tolist(), strict=True))
    assert by_op == {0: 2.0, 1: 4.0, 2: 4.0}
    env.run()
    assert [t for kind, _, t in log.events if kind == "sent"] == [10.0, 10.0, 10.0]
    # Bytes are conserved: each flow counted once on each of its two links.
    assert sum(network.link_records()["bytes"]) == pytest.approx(2 * 100.0)


def test_zero_byte_flow_takes_only_the_latency():
    env, network, log, me = setup(two_gpus(latency=3e-6))
    start(network, me, [7], [0], [1], [0])
    env.run()
    assert log.events == [("sent", 7, 0.0), ("delivered", 7, 3e-6)]


def test_path_latency_is_the_sum_of_hops():
    """gpu0 - sw - gpu1 with 1 us and 2 us hops, 100 B/s: 50 B sent at 0.5 s, delivered
    3 us later."""
    graph = nx.Graph()
    graph.add_node("g0", kind="gpu", rank=0)
    graph.add_node("g1", kind="gpu", rank=1)
    graph.add_node("sw", kind="nvswitch")
    graph.add_edge("g0", "sw", bandwidth=100.0, latency=1e-6, link="nvlink")
    graph.add_edge("sw", "g1", bandwidth=100.0, latency=2e-6, link="nvlink")
    env, network, log, me = setup(graph)
    start(network, me, [0], [0], [1], [50])
    env.run()
    assert log.events[0] == ("sent", 0, 0.5)
    assert log.events[1][2] == pytest.approx(0.5 + 3e-6, rel=1e-15)


def test_two_networks_in_one_process_do_not_interfere():
    """No global state: interleaving two environments changes neither timeline."""
    results = []
    for _ in range(2):
        env_a, net_a, log_a, me_a = setup(two_gpus())
        env_b, net_b, log_b, me_b = setup(two_gpus(bandwidth=2.0))
        start(net_a, me_a, [0, 1], [0, 0], [1, 1], [10, 10])
        start(net_b, me_b, [0], [0], [1], [10])
        env_a.run(until=5)
        env_b.run()
        env_a.run()
        results.append((log_a.events, log_b.events))
    assert results[0] == results[1]
    assert results[0][1] == [("sent", 0, 5.0), ("delivered", 0, 5.5)]
    assert results[0][0][0] == ("sent", 0, 20.0)
