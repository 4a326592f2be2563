"""The mixed timing (simulator.collective.mixed): flows that meet others simulated event
by event, the rest timed from their dependencies, against the event-by-event replay of
every flow (issue 35's acceptance: op times, per-link bytes and busy time to 1e-9)."""

import numpy as np
import pytest
from test_contention_free import SERVER, assert_same, both

from simulator.algorithms.schedule import Schedule
from simulator.collective.mixed import _overlaps, _previous_max
from simulator.collective.run import run_schedule
from simulator.network.faults import apply_faults
from simulator.topology import cluster_graph, load_topology, ring_graph
from tests.test_routing import ecmp


def test_hierarchical_on_a_fat_tree_with_ecmp_equals_the_event_replay():
    """128 GPUs (16 DGX H100) on a fat-tree: ECMP puts two rails' rings on one uplink,
    the pass gives up, and only the flows of the routes that meet are simulated."""
    graph = ecmp(load_topology("dgx-h100", 16, fabric="fat-tree"))
    fast, exact = both(graph, "hierarchical", size=64 * 2**20)
    assert fast.params.get("timing") == "mixed"
    assert_same(fast, exact)
    # Most flows were timed, not simulated: far fewer flows went through max-min.
    assert fast.stats.recomputed_flows < exact.stats.recomputed_flows / 2


def test_hierarchical_on_a_small_server_fat_tree_with_a_slow_nic_equals_the_event_replay():
    """192 ranks (48 servers of 4 GPUs) on a fat-tree whose uplinks ECMP spreads the
    rings over, one NIC at half its bandwidth."""
    graph = apply_faults(
        ecmp(cluster_graph(SERVER, 48, fabric="fat-tree")), "link=s3/nic1-pod0/edge2:0.5"
    )
    fast, exact = both(graph, "hierarchical", size=8 * 2**20)
    assert fast.ranks == 192
    assert fast.params.get("timing") == "mixed"
    assert_same(fast, exact)


@pytest.mark.parametrize(
    "fault", ["fail=pod0/edge0-pod0/agg0", "random:q=0.2,fraction=0.5,seed=3,kind=rdma"]
)
def test_faults_on_a_fat_tree_equal_the_event_replay(fault):
    """A failed uplink (routes avoid it, more of them meet on the others), and random
    slow fabric links."""
    graph = apply_faults(ecmp(load_topology("dgx-h100", 8, fabric="fat-tree")), fault)
    fast, exact = both(graph, "hierarchical", size=16 * 2**20)
    assert fast.params.get("timing") == "mixed"
    assert_same(fast, exact)


def test_reductions_on_a_finite_reducer_equal_the_event_replay():
    graph = ecmp(load_topology("dgx-h100", 8, fabric="fat-tree"))
    for _, data in graph.nodes(data=True):
        if data.get("kind") == "gpu":
            data["reduce_bandwidth"] = 400e9
    fast, exact = both(graph, "hierarchical", size=16 * 2**20)
    assert fast.params.get("timing") == "mixed"
    assert any(kind == "reduce" for kind in fast.links["link"])
    assert_same(fast, exact)


def test_identical_twins_are_timed_together_by_hand():
    """Two identical 1,000 B transfers 0 -> 1 start together on a 1 GB/s link (1 us
    per hop), and a 10,000 B transfer 1 -> 0 runs alone. The pair shares the link:
    each at 0.5 GB/s, both sent at 2 us and done at 3 us; the other is sent at 10 us and
    done at 11 us. A third transfer 0 -> 1 of 500 B waits for the pair and starts at
    3 us, alone: sent at 3.5 us, done at 4.5 us. Nothing meets anything else, so every
    op is timed (no event, no max-min)."""
    schedule = Schedule(
        op="all_gather",
        algorithm="hand",
        ranks=2,
        size_bytes=12500.0,
        src=[0, 0, 1, 0],
        dst=[1, 1, 0, 1],
        nbytes=[1000, 1000, 10000, 500],
        segment=[0, 1, 2, 3],
        reduce=[False] * 4,
        dep_ptr=[0, 0, 0, 0, 2],
        dep_idx=[0, 1],
        dep_sent=[False, False],
        segment_owner=[0, 0, 1, 0],
        step=[0, 0, 0, 1],
    )
    graph = ring_graph(2, 1e9, 1e-6)
    result = run_schedule(graph, schedule, symmetry="off")
    assert result.flows["sent_s"] == pytest.approx([2e-6, 2e-6, 10e-6, 3.5e-6], rel=1e-12)
    assert result.flows["end_s"] == pytest.approx([3e-6, 3e-6, 11e-6, 4.5e-6], rel=1e-12)
    assert result.time_s == pytest.approx(11e-6, rel=1e-12)
    exact = run_schedule(graph, schedule, symmetry="off", events=True)
    assert_same(result, exact)


def test_overlaps_flag_only_links_where_a_timed_interval_meets_another():
    # Link 0: two simulated intervals overlapping (fine) and a timed one after them.
    # Link 1: a timed interval overlapped by a simulated one (a clash).
    # Link 2: a long simulated interval holding a timed one that its neighbour does not
    # reach (a clash found through the running maximum, not the neighbour).
    link = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    lo = np.array([0.0, 1.0, 3.0, 0.0, 1.0, 0.0, 1.0, 3.0])
    hi = np.array([2.0, 3.0, 4.0, 2.0, 3.0, 10.0, 2.0, 4.0])
    timed = np.array([False, False, True, True, False, False, False, True])
    assert _overlaps(link, lo, hi, timed, 3).tolist() == [False, True, True]


def test_previous_max_is_the_running_maximum_within_each_segment():
    segment = np.array([0, 0, 0, 0, 1, 1])
    values = np.array([5.0, 1.0, 7.0, 2.0, 3.0, 1.0])
    expected = [-np.inf, 5.0, 5.0, 7.0, -np.inf, 3.0]
    assert _previous_max(segment, values).tolist() == expected


def test_too_many_simulated_ops_fall_back_to_the_event_replay(monkeypatch):
    """When the flows that meet are most of the schedule, the rounds would cost more
    than the reference: the run replays every flow instead (same result, no timing)."""
    import simulator.collective.mixed as mixed

    monkeypatch.setattr(mixed, "MAX_SIMULATED", 0.0)
    monkeypatch.setattr(mixed, "FEW_SIMULATED", 0)
    graph = ecmp(load_topology("dgx-h100", 8, fabric="fat-tree"))
    fast, exact = both(graph, "hierarchical", size=16 * 2**20)
    assert "timing" not in fast.params
    assert_same(fast, exact)


def test_two_flows_sharing_a_link_by_hand():
    """On a 1 GB/s link each way (1 us per hop): op0 sends 2,000 B 0 -> 1; op1 sends
    500 B 1 -> 0 (sent at 0.5 us, done at 1.5 us); op2 (1,000 B 0 -> 1) waits for op1.
    By hand: op0 has sent 1,500 B when op2 joins at 1.5 us; both then run at 0.5 GB/s,
    so op0's last 500 B are sent at 2.5 us (done 3.5 us) and op2, with 500 B left, runs
    alone: sent at 3.0 us, done at 4.0 us. Round one times op0 and op2 alone and finds
    them overlapping; round two simulates them (the Python max-min model,
    simulator.network.lean) and times op1."""
    schedule = Schedule(
        op="all_gather",
        algorithm="hand",
        ranks=2,
        size_bytes=3500.0,
        src=[0, 1, 0],
        dst=[1, 0, 1],
        nbytes=[2000, 500, 1000],
        segment=[0, 1, 2],
        reduce=[False] * 3,
        dep_ptr=[0, 0, 0, 1],
        dep_idx=[1],
        dep_sent=[False],
        segment_owner=[0, 1, 0],
    )
    result = run_schedule(ring_graph(2, 1e9, 1e-6), schedule, symmetry="off")
    assert result.params.get("timing") == "mixed"
    assert result.flows["sent_s"] == pytest.approx([2.5e-6, 0.5e-6, 3.0e-6], rel=1e-12)
    assert result.flows["end_s"] == pytest.approx([3.5e-6, 1.5e-6, 4.0e-6], rel=1e-12)
    assert result.stats.recomputes >= 1
    assert sorted(result.links["bytes"]) == pytest.approx([500.0, 3000.0])
    assert sorted(result.links["busy_s"]) == pytest.approx([0.5e-6, 3e-6], rel=1e-12)
