"""The contention-free pass (simulator.collective.contention_free) against the event by
event replay and against hand-worked timelines."""

import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.algorithms.schedule import Schedule
from simulator.collective.run import rank_layout, run_schedule
from simulator.network.faults import apply_faults
from simulator.topology import cluster_graph, ring_graph

SERVER = {
    "gpus": 4,
    "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "300GB/s", "latency": "0.5us"},
    "nic": {"gpus_per_nic": 1, "bandwidth": "25GB/s", "link": "rdma"},
}


def both(graph, algorithm, op="all_reduce", size=16 * 2**20, **options):
    """The pass's result (symmetry off, so that it runs) and the event replay's."""
    schedule = build_schedule(algorithm, op, rank_layout(graph), size, **options)
    fast = run_schedule(graph, schedule, symmetry="off")
    exact = run_schedule(graph, schedule, symmetry="off", events=True)
    return fast, exact


def assert_same(fast, exact):
    """Times of every op, per-link bytes and busy time equal to 1e-9 (relative)."""
    assert fast.time_s == pytest.approx(exact.time_s, rel=1e-9)
    scale = exact.time_s
    for key in ("start_s", "sent_s", "end_s"):
        assert np.max(np.abs(fast.flows[key] - exact.flows[key])) <= 1e-9 * scale
    assert fast.links["bytes"] == pytest.approx(exact.links["bytes"], rel=1e-9)
    busy = np.abs(np.array(fast.links["busy_s"]) - np.array(exact.links["busy_s"]))
    assert busy.max() <= 1e-9 * scale
    assert fast.stats.flows == exact.stats.flows


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_ring_with_one_slow_link_equals_the_event_replay(op):
    graph = apply_faults(ring_graph(48, 150e9, 500e-9), "link=gpu5-gpu6:0.5")
    fast, exact = both(graph, "ring", op, chunks=3)
    assert fast.params.get("timing") == "contention-free"
    assert "timing" not in exact.params
    assert_same(fast, exact)


def test_ring_all_gather_follows_the_hand_worked_recurrence():
    """One chunk, one channel: rank i sends block (i - s) at step s once it has received
    step s - 1 from rank i - 1 and sent its own step s - 1; the link i -> i + 1 carries
    it at that link's rate and one hop's latency later it is there."""
    p, bandwidth, latency, size = 6, 100e9, 1e-6, 6e6
    graph = apply_faults(ring_graph(p, bandwidth, latency), "link=gpu2-gpu3:0.25")
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), size)
    result = run_schedule(graph, schedule, symmetry="off")
    assert result.params.get("timing") == "contention-free"
    rate = [bandwidth * (0.25 if i == 2 else 1.0) for i in range(p)]
    block = size / p
    sent = np.zeros((p - 1, p))
    done = np.zeros((p - 1, p))
    for s in range(p - 1):
        for i in range(p):
            start = 0.0 if s == 0 else max(done[s - 1, (i - 1) % p], sent[s - 1, i])
            sent[s, i] = start + block / rate[i]
            done[s, i] = sent[s, i] + latency
    assert result.time_s == pytest.approx(done.max(), rel=1e-12)
    # Bytes conserved: every link carried p - 1 blocks.
    assert sum(result.links["bytes"]) == pytest.approx(p * (p - 1) * block)


def test_reductions_on_a_finite_reducer_equal_the_event_replay():
    graph = apply_faults(ring_graph(16, 150e9, 500e-9), "link=gpu3-gpu4:0.5")
    for node in graph.nodes:
        graph.nodes[node]["reduce_bandwidth"] = 200e9
    fast, exact = both(graph, "ring", "all_reduce", chunks=2)
    assert fast.params.get("timing") == "contention-free"
    assert_same(fast, exact)
    assert any(kind == "reduce" for kind in fast.links["link"])


def test_identical_flows_of_two_channels_run_as_one_and_equal_the_event_replay():
    # Two channels of one ring share every link: each pair of identical flows is timed
    # as one of twice the bytes.
    graph = apply_faults(ring_graph(16, 150e9, 500e-9), "link=gpu3-gpu4:0.5")
    fast, exact = both(graph, "ring", "all_reduce", chunks=2, channels=2)
    assert fast.params.get("timing") == "contention-free"
    assert_same(fast, exact)


def test_flows_sharing_a_link_within_a_level_are_max_min_shared():
    # Hierarchical: each GPU sends to its 3 server peers at once over its NVSwitch link.
    graph = apply_faults(cluster_graph(SERVER, 4), "link=s1/nic2-leaf2:0.5")
    fast, exact = both(graph, "hierarchical", "all_reduce")
    assert fast.params.get("timing") == "contention-free"
    assert_same(fast, exact)


def test_a_flow_meeting_one_of_an_earlier_level_is_simulated_with_the_one_it_meets():
    """op0 sends 10,000 B on a -> b; op2 (1,000 B, same link) waits for op1 (10 B on
    another link) and starts while op0 is in flight. By hand, at 1 GB/s and 1 us per
    hop: op1 is done at 0.01 + 1 = 1.01 us; op0 has sent 1,010 B; both then share the
    link at 0.5 GB/s until op2's 1,000 B are through at 3.01 us (op0: 2,010 B); op0's
    last 7,990 B take 7.99 us: sent at 11.0 us, done at 12.0 us."""
    schedule = Schedule(
        op="all_gather",
        algorithm="hand",
        ranks=3,
        size_bytes=11010.0,
        src=[0, 2, 0],
        dst=[1, 0, 1],
        nbytes=[10000, 10, 1000],
        segment=[0, 1, 2],
        reduce=[False] * 3,
        dep_ptr=[0, 0, 0, 1],
        dep_idx=[1],
        dep_sent=[False],
        segment_owner=[0, 2, 0],
        step=[0, 0, 1],
    )
    result = run_schedule(ring_graph(3, 1e9, 1e-6), schedule, symmetry="off")
    # The pass gives up; the mixed timing simulates op0 and op2 and times op1 alone.
    assert result.params.get("timing") == "mixed"
    assert result.stats.recomputes > 0
    assert result.time_s == pytest.approx(12.0e-6, rel=1e-9)
    assert result.flows["sent_s"][2] == pytest.approx(3.01e-6, rel=1e-9)
    assert result.flows["end_s"][1] == pytest.approx(1.01e-6, rel=1e-9)
    assert result.links["bytes"] == pytest.approx(
        run_schedule(ring_graph(3, 1e9, 1e-6), schedule, symmetry="off", events=True).links["bytes"]
    )


def test_servers_with_a_slow_nic_equal_the_event_replay():
    graph = apply_faults(cluster_graph(SERVER, 6), "link=s2/nic1-leaf1:0.5")
    fast, exact = both(graph, "ring", "all_gather", chunks=2)
    assert fast.params.get("timing") == "contention-free"
    assert_same(fast, exact)


@pytest.mark.parametrize(
    "graph, algorithm",
    [
        (lambda: apply_faults(cluster_graph(SERVER, 64), "link=s5/nic2-leaf2:0.5"), "hierarchical"),
        (lambda: apply_faults(ring_graph(256, 150e9, 5e-7), "link=gpu9-gpu10:0.5"), "ring"),
    ],
    ids=["hierarchical-4x64", "ring-256"],
)
def test_a_few_hundred_asymmetric_ranks_equal_the_event_replay(graph, algorithm):
    """Issue 35's acceptance: asymmetric cases of a few hundred ranks (256 here)."""
    fast, exact = both(graph(), algorithm, "all_reduce")
    assert fast.ranks == 256
    assert fast.params.get("timing") == "contention-free"
    assert_same(fast, exact)
