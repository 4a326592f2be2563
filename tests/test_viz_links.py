"""Link load over time, rebuilt from flow records: hand-worked rates, and agreement
with the network's own per-link totals."""

import networkx as nx
import numpy as np
import pytest

import simulator
from simulator.algorithms.schedule import Schedule
from simulator.topology import load_topology, ring_graph
from simulator.viz import collective_timeline, link_load
from simulator.viz.links import LinkLoadTooLarge


def star():
    """GPU a reaches GPUs c and d through switch b: a-b 2 GB/s, b-c 1 GB/s, b-d 2 GB/s."""
    graph = nx.Graph()
    for name, rank in (("a", 0), ("c", 1), ("d", 2)):
        graph.add_node(name, kind="gpu", rank=rank, server=0)
    graph.add_node("b", kind="switch")
    graph.add_edge("a", "b", bandwidth=2e9, latency=0.0, link="x")
    graph.add_edge("b", "c", bandwidth=1e9, latency=0.0, link="x")
    graph.add_edge("b", "d", bandwidth=2e9, latency=0.0, link="x")
    return graph


def two_flows():
    """a->c 1000 B and a->d 3000 B, both at time 0."""
    return Schedule(
        op="all_gather",
        algorithm="hand",
        ranks=3,
        size_bytes=3000.0,
        src=[0, 0],
        dst=[1, 2],
        nbytes=[1000, 3000],
        segment=[0, 0],
        reduce=[False, False],
        dep_ptr=[0, 0, 0],
        dep_idx=[],
        dep_sent=[],
        segment_owner=[0, 0, 0],
    )


def test_rates_follow_max_min_sharing_worked_by_hand():
    """Max-min: b->c caps a->c at 1 GB/s, so a->d gets the other 1 GB/s of a->b. a->c is
    sent at 1 us; a->d, 1000 B sent by then, has a->b and b->d to itself (2 GB/s) for
    its last 2000 B: sent at 2 us."""
    graph = star()
    result = simulator.run_schedule(graph, two_flows())
    assert result.flows["sent_s"].tolist() == pytest.approx([1e-6, 2e-6])
    load = link_load(graph, result.flows)
    by_name = {
        (load.table.src_node[link], load.table.dst_node[link]): j
        for j, link in enumerate(load.links)
    }
    assert sorted(by_name) == [("a", "b"), ("b", "c"), ("b", "d")]

    def steps(a, b):
        j = by_name[(a, b)]
        # Flat [t0, r0, t1, r1, ...]: pytest.approx compares flat sequences only.
        return [
            x
            for pair in zip(load.time_s[j].tolist(), load.rate[j].tolist(), strict=True)
            for x in pair
        ]

    assert steps("a", "b") == pytest.approx([0.0, 2e9, 2e-6, 0.0])
    assert steps("b", "c") == pytest.approx([0.0, 1e9, 1e-6, 0.0])
    assert steps("b", "d") == pytest.approx([0.0, 1e9, 1e-6, 2e9, 2e-6, 0.0])
    j = by_name[("b", "d")]
    assert load.utilisation(j).tolist() == pytest.approx([0.5, 1.0, 0.0])
    assert load.bytes(j) == pytest.approx(3000) and load.busy_s(j) == pytest.approx(2e-6)
    assert load.flows.tolist() == [2, 1, 1]


@pytest.mark.parametrize(
    ("topology", "nodes", "options"),
    [
        ("dgx-a100", 2, {"channels": 4, "chunks": 2}),
        ("dgx-a100", 1, {"chunks": 3}),
        (ring_graph(16, 150e9, 5e-7), None, {"chunks": 4}),
    ],
)
def test_link_load_matches_the_networks_own_totals(topology, nodes, options):
    """Integrated rate = bytes the network counted per link; time with a positive rate
    = the network's busy time. Two independent computations of the same quantities."""
    graph = load_topology(topology, nodes)
    result = simulator.simulate_collective(graph, "all_reduce", 2**22, **options)
    load = link_load(graph, result.flows)
    carried = np.array(result.links["bytes"])
    busy = np.array(result.links["busy_s"])
    assert sorted(load.links.tolist()) == np.flatnonzero(carried > 0).tolist()
    for j, link in enumerate(load.links):
        assert load.bytes(j) == pytest.approx(carried[link], rel=1e-9)
        assert load.busy_s(j) == pytest.approx(busy[link], rel=1e-9)
        assert load.utilisation(j).max() <= 1 + 1e-9


def test_too_much_work_leaves_link_rows_out_with_a_note():
    graph = load_topology("dgx-a100", 1)
    result = simulator.simulate_collective(graph, "all_reduce", 2**20)
    with pytest.raises(LinkLoadTooLarge):
        link_load(graph, result.flows, max_work=10)
    timeline = collective_timeline(result, graph, max_link_work=10)
    assert not [t for t in timeline.tracks if t.section == "links"]
    assert "link rows omitted" in timeline.meta["notes"][0]
