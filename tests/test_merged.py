"""Merged schedules (issue 35): side-by-side transfers as one op of their count's weight.

The hierarchical all-reduce's in-server steps move the N blocks of a buffer row side by
side; :func:`two_level_merged` builds them as one op each. Held here to independent
references: expanded, the merged schedule is the full schedule op for op (ranks, bytes,
labels, and each op's dependencies mapped to merged ops); timed, it gives the full
schedule's event-by-event replay to 1e-9 (every op's start, sent and done, each link's
bytes and busy time) on asymmetric clusters of 64-256 ranks; and where merging would
change a time (a member whose own dependencies are met earlier than its op's), the
runner refuses it, which the full replay's own differing start times confirm.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.algorithms import build_schedule, get_algorithm
from simulator.algorithms.base import RankLayout
from simulator.cli.bench import TWO_D_SERVER
from simulator.collective.run import rank_layout, run_merged, run_schedule
from simulator.network.faults import apply_faults
from simulator.topology import cluster_graph, load_topology
from tests.test_routing import ecmp


def _dep_sets(ptr, idx, sent, row, mapping=None):
    """One op's dependencies as a set of (op, waits-for-sent) pairs."""
    ops = idx[ptr[row] : ptr[row + 1]]
    if mapping is not None:
        ops = mapping[ops]
    return set(zip(ops.tolist(), sent[ptr[row] : ptr[row + 1]].tolist(), strict=True))


@pytest.mark.parametrize(
    "servers, gpus, options",
    [(3, 2, {}), (4, 4, {"chunks": 2}), (5, 3, {"channels": 2}), (2, 4, {"chunks": 3})],
)
def test_merged_schedule_expands_to_the_full_schedule(servers, gpus, options):
    """Every op of the full schedule is a member of one merged op with its ranks, bytes
    and labels; its dependencies, mapped to merged ops, are its op's (the union of the
    members') or, for a listed member, exactly its own list."""
    layout = RankLayout(servers * gpus, tuple(np.repeat(np.arange(servers), gpus).tolist()))
    full = build_schedule("hierarchical", "all_reduce", layout, 1e6, **options)
    merged = get_algorithm("hierarchical").merged("all_reduce", layout, 1e6, **options)
    m = merged.schedule
    op_of = merged.op_of()
    assert merged.full_ops == full.n_ops
    # The in-server steps' N blocks per op: (g - 1) K g N ops per phase instead of x N.
    chunks, channels = options.get("chunks", 1), options.get("channels", 1)
    intra = 2 * (gpus - 1) * chunks * gpus * servers * channels
    assert m.n_ops == full.n_ops - intra * (servers - 1)
    for name in ("src", "dst", "nbytes", "reduce", "step", "chunk", "channel", "path"):
        assert np.array_equal(getattr(full, name), getattr(m, name)[op_of]), name
    listed = {}
    for position, op in enumerate(merged.member_op.tolist()):
        listed.setdefault(op, []).append(position)
    first = np.cumsum(merged.weight) - merged.weight
    union: dict[int, set] = {}
    for o in range(full.n_ops):
        op = int(op_of[o])
        own = _dep_sets(full.dep_ptr, full.dep_idx, full.dep_sent, o, op_of)
        union.setdefault(op, set()).update(own)
        if op in listed:
            member = listed[op][o - first[op]]
            mine = _dep_sets(merged.member_ptr, merged.member_idx, merged.member_sent, member)
            assert mine == own
        else:
            assert own == _dep_sets(m.dep_ptr, m.dep_idx, m.dep_sent, op)
    for op, deps in union.items():
        assert deps == _dep_sets(m.dep_ptr, m.dep_idx, m.dep_sent, op)


def _assert_same_run(reference, result):
    """Op times, per-link bytes and busy time equal to 1e-9 (relative, 1 ns absolute
    floor for times)."""
    assert result.time_s == pytest.approx(reference.time_s, rel=1e-9)
    for key in ("start_s", "sent_s", "end_s"):
        np.testing.assert_allclose(result.flows[key], reference.flows[key], rtol=1e-9, atol=1e-18)
    for key in ("bytes", "busy_s"):
        np.testing.assert_allclose(result.links[key], reference.links[key], rtol=1e-9, atol=1e-18)
    assert np.array_equal(result.flows["src"], reference.flows["src"])
    assert np.array_equal(result.flows["dst"], reference.flows["dst"])
    assert result.stats.represented_flows == pytest.approx(reference.stats.represented_flows)


def _two_d(servers: int, fault: str | None = None):
    graph = cluster_graph(TWO_D_SERVER, servers, fabric="single-switch")
    return apply_faults(graph, fault) if fault else graph


CASES = {
    # One NIC link at half bandwidth (bench hier-8x512-slow's fault), 256 ranks.
    "slow-nic": (lambda: _two_d(32, "link=s3/nic0-switch0:0.5"), {}, None, "contention-free"),
    # Chunks, channels and finite reducers that the in-server steps share.
    "slow-nic-chunks-reducers": (
        lambda: _two_d(8, "link=s5/nic2-switch0:0.3"),
        {"chunks": 2, "channels": 2},
        400e9,
        "contention-free",
    ),
    # A fat-tree with ECMP: uplinks shared by some rings' flows (the mixed timing).
    "fat-tree-ecmp": (
        lambda: ecmp(load_topology("dgx-h100", 16, fabric="fat-tree")),
        {},
        None,
        "mixed",
    ),
    # A failed edge uplink on the fat-tree (rerouted over the others), and random slow
    # NIC links.
    "fat-tree-failed-uplink": (
        lambda: apply_faults(
            ecmp(load_topology("dgx-h100", 8, fabric="fat-tree")), "fail=pod0/edge0-pod0/agg0"
        ),
        {},
        None,
        None,
    ),
    "fat-tree-random-slow": (
        lambda: apply_faults(
            ecmp(load_topology("dgx-h100", 8, fabric="fat-tree")),
            "random:q=0.2,fraction=0.5,seed=3,kind=rdma",
        ),
        {"chunks": 2},
        None,
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_merged_run_equals_the_full_event_replay(case):
    """Timed merged, the all-reduce has the full schedule's event-by-event times and link
    records, by each path the runner takes (the pass or the mix; events)."""
    make, options, reduce_bw, timing = CASES[case]
    graph = make()
    layout = rank_layout(graph)
    full = build_schedule("hierarchical", "all_reduce", layout, 8e6, **options)
    reference = run_schedule(graph, full, symmetry="off", events=True, reduce_bandwidth=reduce_bw)
    merged = get_algorithm("hierarchical").merged("all_reduce", layout, 8e6, **options)
    for events in (False, True):
        result = run_merged(graph, merged, events=events, reduce_bandwidth=reduce_bw)
        assert result is not None
        if not events and timing is not None:
            assert result.params["timing"] == timing
        assert result.stats.flows < reference.stats.flows  # fewer flows simulated
        _assert_same_run(reference, result)


def test_merged_run_refused_where_a_member_would_start_earlier():
    """One GPU reducing slowly (1e8 B/s) on 2 servers: its own column's reduce-scatter
    ends after the all-gather that every other column waits for, so in the full
    schedule the members of its in-server all-gather's first step start at different
    times. Merged, they could not: the runner refuses (the caller runs the full
    schedule); with every GPU alike it accepts."""
    graph = _two_d(2)
    graph.nodes["s1/gpu0"]["reduce_bandwidth"] = 1e8
    layout = rank_layout(graph)
    merged = get_algorithm("hierarchical").merged("all_reduce", layout, 8e6)
    full = build_schedule("hierarchical", "all_reduce", layout, 8e6)
    reference = run_schedule(graph, full, symmetry="off", events=True)
    op_of = merged.op_of()
    starts = {}
    for o, op in enumerate(op_of.tolist()):
        starts.setdefault(op, set()).add(float(reference.flows["start_s"][o]))
    assert any(len(times) > 1 for times in starts.values())  # the reference disagrees
    assert run_merged(graph, merged) is None
    assert run_merged(graph, merged, events=True) is None
    assert run_merged(_two_d(2), merged) is not None


def test_merged_with_a_protocol_is_left_to_the_full_schedule():
    """A protocol's per-transfer proxies and step latencies are not a merged op's: the
    runner declines."""
    graph = _two_d(2)
    merged = get_algorithm("hierarchical").merged("all_reduce", rank_layout(graph), 8e6)
    assert run_merged(graph, merged, protocol="Simple") is None
    # Not built where the in-server phases are not rings of side-by-side blocks.
    assert get_algorithm("hierarchical").merged("all_gather", rank_layout(graph), 8e6) is None
    assert get_algorithm("pipelined").merged("all_reduce", rank_layout(graph), 8e6) is None
