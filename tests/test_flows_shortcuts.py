"""The flow network's shortcuts change no record: a recomputation handed its flows'
incidence entries by the component search (instead of finding them again), and a
bundle's single-link routes read from a per-network table (instead of one
``Router.route_over`` call per link), each held bit for bit to the plain computation,
every op's times and every link's records: jobs on hashed fabrics (a 2:1 leaf-spine,
where they meet; a fat-tree) and jobs that meet nowhere (rail placement on a
rail-optimized fabric)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology
from simulator.workload.generators import megatron
from simulator.workload.jobs import Job, run_jobs

CASES = {
    # Two spines a leaf pair, 2:1: ECMP hashes the jobs' flows and they meet.
    "leaf-spine-scattered": (
        {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2},
        "scattered",
    ),
    # The jobs on local GPUs 0-3 and 4-7 of every server of a rail-optimized fabric:
    # on different rails, they share no switch.
    "rail-optimized-rail": ({"type": "rail-optimized"}, "rail"),
    "fat-tree-packed": ({"type": "fat-tree", "k": 6}, "packed"),
}


def run(case: str):
    fabric, placement = CASES[case]
    step = megatron("llama3-8b", tp=4, pp=2, dp=2, micro_batch=1, global_batch=8)
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    return run_jobs([Job("A", step, placement), Job("B", step, placement)], graph)


def plain_component(self, seeds):
    """The component search without its entries: _recompute finds them itself."""
    flows, _ = COMPONENT(self, seeds)
    return flows, None


def plain_single_link_routes(self, links):
    """One Router.route_over call per link, as before the table."""
    return np.array([self.router.route_over((link,)) for link in links.tolist()], dtype=np.int64)


COMPONENT = FlowNetwork._component


def records(result):
    runs = [*result.alone, result.together]
    out = []
    for one in runs:
        out.append(tuple(getattr(one.records, name).tobytes() for name in
                         ("issue_s", "start_s", "end_s")))  # fmt: skip
        out.append(one.links)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_shortcuts_change_no_record(case, monkeypatch):
    fast = run(case)
    monkeypatch.setattr(FlowNetwork, "_component", plain_component)
    monkeypatch.setattr(FlowNetwork, "_single_link_routes", plain_single_link_routes)
    plain = run(case)
    assert records(fast) == records(plain)
    assert [job.step_together_s for job in fast.jobs] == [job.step_together_s for job in plain.jobs]
    if case == "leaf-spine-scattered":
        assert fast.shared and max(job.slowdown for job in fast.jobs) > 1.0  # they meet
    if case == "rail-optimized-rail":
        assert not fast.shared  # they share no link


def test_entries_of_the_component_are_those_of_its_slots():
    """Where the search hands entries over, they are exactly the incidence entries of
    the slots it found (what _recompute would compute)."""
    import simpy

    graph = load_topology("dgx-h100", 4, fabric=CASES["fat-tree-packed"][0])
    env = simpy.Environment()
    network = FlowNetwork(env, graph)

    class Owner:
        def on_sent(self, ops):
            pass

        def on_delivered(self, ops):
            pass

    owner = network.register(Owner())
    rng = np.random.default_rng(0)
    src = rng.integers(0, 32, 60)
    dst = (src + rng.integers(1, 31, 60)) % 32
    routes = network.route_ids(src, dst, np.arange(60))
    network.add_flows(owner, np.arange(60), routes, rng.uniform(1e6, 1e8, 60))
    env.run(until=env.now + 1e-9)  # the flows taken in
    checked = 0
    for seed in range(40):
        seeds = network._inc_link[rng.integers(0, len(network._inc_link), 1 + seed % 3)]
        flows, entries = network._component(seeds)
        if entries is not None:
            # (positions of the entries, in incidence order)
            assert entries.tolist() == np.flatnonzero(flows[network._inc_flow]).tolist()
            checked += 1
    assert checked > 0
