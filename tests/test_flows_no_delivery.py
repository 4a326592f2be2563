"""Owners that need no delivery (``delivers = False``: bundles, whose ranks' offsets
after their last link use are added where they end) get no delivery events, and that
changes no record: every op's times and every link's records of the jobs cases of
tests/test_flows_shortcuts.py are those of the network scheduling a no-op delivery
per bundle wake-up, as before, bit for bit; and a plain owner is still told of each
delivery one route latency after its send."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_flows_shortcuts import records, run

from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology
from simulator.workload.bundles import Bundle


@pytest.mark.parametrize("case", ["leaf-spine-scattered", "fat-tree-packed"])
def test_no_delivery_events_change_no_record(case, monkeypatch):
    told = []
    monkeypatch.setattr(Bundle, "on_delivered", lambda self, ops: told.append(len(ops)))
    fast = run(case)
    assert not told  # no delivery scheduled for a bundle
    monkeypatch.setattr(Bundle, "delivers", True)
    plain = run(case)
    assert told  # the case has bundles, each of whose wake-ups scheduled a delivery
    assert records(fast) == records(plain)
    assert [job.step_together_s for job in fast.jobs] == [job.step_together_s for job in plain.jobs]


class Owner:
    """Notes when its ops are sent and delivered."""

    def __init__(self, env: simpy.Environment, delivers: bool):
        self.env, self.sent, self.delivered = env, [], []
        self.delivers = delivers

    def on_sent(self, ops: np.ndarray) -> None:
        self.sent.append((ops.tolist(), self.env.now))

    def on_delivered(self, ops: np.ndarray) -> None:
        self.delivered.append((ops.tolist(), self.env.now))


@pytest.mark.parametrize("delivers", [True, False])
def test_an_owner_is_told_of_deliveries_unless_it_needs_none(delivers):
    """One 1 MB flow between two servers of a leaf-spine at the NIC's rate: sent after
    1 MB / (its route's least capacity), delivered one route latency later; with
    ``delivers = False``, sent at the same instant and never delivered."""
    graph = load_topology("dgx-h100", 2, fabric={"type": "leaf-spine"})
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    owner = Owner(env, delivers)
    route = network.route_ids(np.array([0]), np.array([8]))
    network.add_flows(network.register(owner), np.array([5]), route, np.array([1e6]))
    env.run()
    links = network.router.arrays()[1][
        network.router.arrays()[0][route[0]] : network.router.arrays()[0][route[0] + 1]
    ]
    sent = 1e6 / network.capacity[links].min()
    assert owner.sent == [([5], pytest.approx(sent, rel=1e-12))]
    latency = float(network.route_latency(route)[0])
    assert latency > 0
    if delivers:
        assert owner.delivered == [([5], pytest.approx(sent + latency, rel=1e-12))]
    else:
        assert owner.delivered == []
