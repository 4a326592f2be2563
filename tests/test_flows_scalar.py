"""The flow network's scalar path for small events (``FlowNetwork.scalar_events``) gives
the array path's results bit for bit: every flow's send time and every link's bytes, busy
time, last idle instant and flow-seconds, on random flows over hashed fabrics (several
seeds, weights, rate caps, link classes, capacities changed mid-run as timed faults do,
links held by replayed calls), on collectives with timed faults, and on the jobs cases of
tests/test_flows_shortcuts.py."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_flows_shortcuts import CASES, records, run

from simulator.collective.simulate import simulate_collective
from simulator.network.faults import apply_faults
from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology

FABRICS = {
    "leaf-spine": {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2},
    "fat-tree": {"type": "fat-tree", "k": 6},
}


class Log:
    """An owner that notes when each of its ops is sent and delivered."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.sent: list[tuple[int, float]] = []
        self.delivered: list[tuple[int, float]] = []

    def on_sent(self, ops: np.ndarray) -> None:
        self.sent += [(op, self.env.now) for op in ops.tolist()]

    def on_delivered(self, ops: np.ndarray) -> None:
        self.delivered += [(op, self.env.now) for op in ops.tolist()]


def random_run(scalar: bool, fabric: str, seed: int, kind: str) -> tuple:
    """Waves of random flows (a few at a time, and now and then a large batch) on 4 dgx-h100
    servers over ``fabric``; ``kind`` adds weights, caps, link classes or timed capacity
    changes. Returns every op's send and delivery times, the link records, the stats,
    the conflicts with held links and the number of ops."""
    graph = load_topology("dgx-h100", 4, fabric=FABRICS[fabric])
    env = simpy.Environment()
    network = FlowNetwork(env, graph, flow_seconds=True)
    network.scalar_events = scalar
    rng = np.random.default_rng(seed)
    n_links = len(network.links)
    if kind == "classes":
        # Links paired into classes of two (any map will do for equality of the two paths:
        # each flow's loads are its weight over the class size, a non-trivial coefficient).
        network.set_link_classes(np.arange(n_links), np.where(np.arange(n_links) % 3, 1, 2))
    if kind == "weights":
        network.weigh_flows()
    conflicts: list[list[int]] = []
    if kind == "holds":
        network.on_conflict = lambda holders: conflicts.append(holders.tolist())
    logs = [Log(env), Log(env)]
    owners = [network.register(log) for log in logs]
    next_op = [0]

    def wave(count: int) -> None:
        src = rng.integers(0, 32, count)
        dst = (src + rng.integers(1, 32, count)) % 32
        routes = network.route_ids(src, dst, rng.integers(0, 4, count))
        nbytes = rng.choice([0.0, 1e5, 3e6, 2.5e7], count) * rng.uniform(0.5, 1.5, count)
        ops = np.arange(next_op[0], next_op[0] + count)
        next_op[0] += count
        weight = rng.choice([1.0, 2.0, 3.0], count) if kind in ("weights", "classes") else None
        cap = None
        if kind == "caps":
            cap = np.where(rng.random(count) < 0.5, rng.uniform(1e9, 3e10, count), np.inf)
        network.add_flows(owners[int(rng.integers(0, 2))], ops, routes, nbytes, weight, cap)

    def source():
        for index in range(60):
            wave(int(rng.integers(40, 120)) if index % 15 == 7 else int(rng.integers(1, 5)))
            if kind == "faults" and index % 10 == 3:
                links = rng.integers(0, n_links, 3)
                network.scale_links(links, float(rng.choice([0.25, 0.5, 1.0])))
            if kind == "holds" and index % 10 == 5:
                links = rng.integers(0, n_links, 20)
                network.hold(links, np.full(20, env.now + 1e-4), index)
            yield env.timeout(float(rng.choice([0.0, 1e-6, 3e-5, 2e-4])))

    env.process(source())
    env.run()
    network.close_link_records()
    return (
        [log.sent for log in logs],
        [log.delivered for log in logs],
        network.link_bytes.tobytes(),
        network.link_busy.tobytes(),
        network.link_idle_at.tobytes(),
        network.link_flow_s.tobytes(),
        network.stats,
        conflicts,
        next_op[0],
    )


@pytest.mark.parametrize("kind", ["plain", "weights", "caps", "classes", "faults", "holds"])
@pytest.mark.parametrize("fabric", sorted(FABRICS))
@pytest.mark.parametrize("seed", [0, 1])
def test_scalar_events_equal_the_array_path(kind, fabric, seed):
    scalar = random_run(True, fabric, seed, kind)
    arrays = random_run(False, fabric, seed, kind)
    assert scalar == arrays
    sent = sorted(op for log in scalar[0] for op, _ in log)
    assert sent == list(range(scalar[-1]))  # every flow sent, once
    if kind == "holds":
        assert scalar[-2]  # flows did start on held links


#: The flow network's shortcut switches, each held to the path it replaces: small events
#: in Python floats (``scalar_events``) and finished entries cut out as slices
#: (``cut_entries``, also tests/test_flows_cut.py).
SWITCHES = ("scalar_events", "cut_entries")


@pytest.mark.parametrize("switch", SWITCHES)
def test_shortcuts_equal_the_reference_under_timed_faults(switch, monkeypatch):
    """A ring and a hierarchical all-reduce on a leaf-spine whose links slow down and
    recover mid-collective: the same end time and link records with the shortcut on and
    off."""
    graph = load_topology("dgx-h100", 4, fabric=FABRICS["leaf-spine"])
    faulted = apply_faults(
        graph, ["link=leaf0-spine0:0.5,t0=20us,t1=300us", "node=s1/nic0:0.25,t0=50us"]
    )
    results = {}
    for on in (True, False):
        monkeypatch.setattr(FlowNetwork, switch, on)
        results[on] = [
            simulate_collective(faulted, "all_reduce", 64e6, algorithm, chunks=4)
            for algorithm in ("ring", "hierarchical")
        ]
    for fast, plain in zip(results[True], results[False], strict=True):
        assert fast.time_s == plain.time_s
        assert fast.links == plain.links


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_shortcuts_change_no_job_record(case, switch, monkeypatch):
    fast = run(case)
    monkeypatch.setattr(FlowNetwork, switch, False)
    plain = run(case)
    assert records(fast) == records(plain)
    assert [job.step_together_s for job in fast.jobs] == [job.step_together_s for job in plain.jobs]
