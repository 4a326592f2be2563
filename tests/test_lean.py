"""The lean flow network (simulator.network.lean): the FlowNetwork's max-min model in
Python scalars, its links kept as each route's private link where one route alone
uses them, against hand-worked timelines and the FlowNetwork itself."""

import numpy as np
import pytest
import simpy

from simulator.network.flows import FlowNetwork
from simulator.network.lean import LeanFlowNetwork
from simulator.topology import cluster_graph


class _Sent:
    """A flow owner that notes when each op's last byte left."""

    def __init__(self, env):
        self.env = env
        self.sent: dict[int, float] = {}

    def on_sent(self, ops):
        for op in np.asarray(ops).tolist():
            self.sent[op] = self.env.now

    def on_delivered(self, ops):
        pass


def _two_flows_into_one_gpu(lean_network: bool):
    """One server of 3 GPUs on an NVSwitch, 1 GB/s links, no latency: op 0 sends 2,000 B
    0 -> 2 from 0 us; at 1 us op 1 sends 500 B 1 -> 2 over a route made only then, so
    that switch -> gpu2, until then only op 0's route's, is shared from then on."""
    server = {"gpus": 3, "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "1GB/s"}}
    graph = cluster_graph(server, 1)
    env = simpy.Environment()
    base = FlowNetwork(env, graph)
    network = LeanFlowNetwork(base) if lean_network else base
    owner = _Sent(env)
    key = network.register(owner)
    router = base.router
    first = router.route_ids(np.array([0]), np.array([2]))
    network.add_flows(key, np.array([0]), first, np.array([2000.0]))

    def later(_event):
        route = router.route_ids(np.array([1]), np.array([2]))
        network.add_flows(key, np.array([1]), route, np.array([500.0]))

    env.timeout(1e-6).callbacks.append(later)
    env.run()
    if lean_network:
        network.close_link_records()
    else:
        base.close_link_records()
    return owner.sent, base.link_records()


def test_lean_network_splits_a_private_link_a_later_route_shares_by_hand():
    """By hand: op 0 runs alone at 1 GB/s to 1 us (1,000 B sent); both then share
    switch -> gpu2 at 0.5 GB/s: op 1's 500 B are sent at 2 us, op 0's last 500 B alone
    at 1 GB/s by 2.5 us. switch -> gpu2 carried 2,500 B over 2.5 us, gpu0 -> switch
    2,000 B over 2.5 us, gpu1 -> switch 500 B over 1 us; the FlowNetwork agrees."""
    sent, links = _two_flows_into_one_gpu(lean_network=True)
    assert sent[0] == pytest.approx(2.5e-6, rel=1e-12)
    assert sent[1] == pytest.approx(2.0e-6, rel=1e-12)
    carried = {
        (src, dst): (nbytes, busy)
        for src, dst, nbytes, busy in zip(
            links["src"], links["dst"], links["bytes"], links["busy_s"], strict=True
        )
        if nbytes
    }
    by_hand = {
        ("s0/gpu0", "s0/nvswitch"): (2000.0, 2.5e-6),
        ("s0/gpu1", "s0/nvswitch"): (500.0, 1.0e-6),
        ("s0/nvswitch", "s0/gpu2"): (2500.0, 2.5e-6),
    }
    assert set(carried) == set(by_hand)
    for link, (nbytes, busy) in by_hand.items():
        assert carried[link][0] == pytest.approx(nbytes, rel=1e-12)
        assert carried[link][1] == pytest.approx(busy, rel=1e-12)
    reference_sent, reference_links = _two_flows_into_one_gpu(lean_network=False)
    assert sent == pytest.approx(reference_sent, rel=1e-12)
    assert links["bytes"] == pytest.approx(reference_links["bytes"], rel=1e-12)
    assert links["busy_s"] == pytest.approx(reference_links["busy_s"], rel=1e-12)
