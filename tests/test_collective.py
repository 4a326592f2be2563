"""The Python API: results, records, user graphs, determinism, bad input."""

import networkx as nx
import numpy as np
import pytest

from simulator import CcsimError, bus_factor, simulate_collective
from simulator.errors import TopologyError
from simulator.topology import ring_graph


def test_result_bandwidths_follow_nccl_tests():
    """algbw = S/t in GB/s (1e9); busbw = algbw x 2(p-1)/p for all-reduce."""
    result = simulate_collective(ring_graph(4, 100e9, 1e-6), "all_reduce", 4e8)
    assert result.algbw_GBps == pytest.approx(4e8 / result.time_s / 1e9, rel=1e-12)
    assert result.busbw_GBps == pytest.approx(result.algbw_GBps * 1.5, rel=1e-12)
    assert bus_factor("all_gather", 4) == 0.75 and bus_factor("broadcast", 4) == 1.0


def test_flow_and_link_records_conserve_bytes():
    """Ring all-reduce, p = 5, n bytes: 2(p-1) steps x p flows of n/p bytes; every flow
    crosses one link of the 1-D ring, so the links carry 2(p-1) n bytes in total, each
    directed forward link 2(p-1) n / p, each backward link nothing."""
    p, n = 5, 1e6
    result = simulate_collective(ring_graph(p, 50e9, 1e-6), "all_reduce", n)
    flows = result.flows
    assert len(flows["src"]) == 2 * (p - 1) * p
    assert np.sum(flows["bytes"]) == pytest.approx(2 * (p - 1) * n)
    assert np.all(flows["start_s"] <= flows["sent_s"]) and np.all(flows["sent_s"] <= flows["end_s"])
    assert max(flows["end_s"]) == pytest.approx(result.time_s)
    carried = sorted(result.links["bytes"])
    assert carried[:p] == [0.0] * p
    assert carried[p:] == pytest.approx([2 * (p - 1) * n / p] * p)
    # Each forward link is busy exactly while its flows transmit: 2(p-1) x n/(pB).
    busy = sorted(result.links["busy_s"])[p:]
    assert busy == pytest.approx([2 * (p - 1) * n / (p * 50e9)] * p, rel=1e-9)


def test_user_graph_without_server_attributes():
    """A star of 4 GPUs on one switch (links 10 GB/s, 1 us): ring steps cross two hops,
    a = 2 us, each flow alone on its uplink and downlink."""
    graph = nx.Graph()
    graph.add_node("sw", kind="switch")
    for rank in range(4):
        graph.add_node(f"g{rank}", kind="gpu", rank=rank)
        graph.add_edge(f"g{rank}", "sw", bandwidth=10e9, latency=1e-6, link="ethernet")
    result = simulate_collective(graph, "all_gather", 4e6)
    assert result.time_s == pytest.approx(3 * (2e-6 + 1e6 / 10e9), rel=1e-9)


def test_same_inputs_give_identical_records():
    first = simulate_collective("dgx-a100", "all_reduce", 3e6, nodes=2, channels=4, chunks=3)
    second = simulate_collective("dgx-a100", "all_reduce", 3e6, nodes=2, channels=4, chunks=3)
    assert first.time_s == second.time_s
    for key in first.flows:
        assert np.array_equal(first.flows[key], second.flows[key])
    assert first.links == second.links


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"op": "all_to_everyone"}, "valid choices"),
        ({"algorithm": "magic"}, "valid choices: .*ring"),
        ({"size_bytes": 0}, "positive"),
        ({"size_bytes": -1}, "positive"),
        ({"topology": "dgx-z900"}, "dgx-a100"),
        ({"chunks": 0}, "chunks"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"topology": "dgx-a100", "op": "all_reduce", "size_bytes": 1e6, **kwargs}
    with pytest.raises(CcsimError, match=message):
        simulate_collective(**args)


def test_bad_graphs_name_the_node_or_edge():
    graph = ring_graph(3, 1e9, 1e-6)
    graph.edges["gpu0", "gpu1"]["bandwidth"] = 0
    with pytest.raises(TopologyError, match="gpu0.*gpu1.*bandwidth"):
        simulate_collective(graph, "all_reduce", 1e3)
    graph = ring_graph(3, 1e9, 1e-6)
    graph.add_node("gpu9", kind="gpu", rank=3)
    with pytest.raises(TopologyError, match="gpu9.*disconnected|disconnected.*gpu9"):
        simulate_collective(graph, "all_reduce", 1e3)
    graph = ring_graph(3, 1e9, 1e-6)
    graph.nodes["gpu2"]["rank"] = 0
    with pytest.raises(TopologyError, match="rank 0"):
        simulate_collective(graph, "all_reduce", 1e3)
