"""nvls-tree with each GPU's side-by-side switch transfers merged (issue 32's 1,440-GPU case).

On every chunk a GPU writes its copy of every row into the NVSwitch and takes every
row's total out of it: 2h transfers each way on one route (the GPU's own NVLink into or
out of the switch). :meth:`NvlsTree.merged` runs each such group as one op of that
weight. Held here to independent references: expanded, the merged ops are the full
schedule's ops (the GPU's end of every route, bytes, labels and dependencies); timed,
they give the full schedule's event-by-event replay to 1e-9 (every op's start, sent and
done, each link's bytes and busy time), in the ideal model and with a protocol, with
and without heads that own no row; and the runner refuses them where they would not
(a GPU reducer of finite bandwidth, the rank at the switch's end mattering there).
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.algorithms import build_schedule, get_algorithm
from simulator.algorithms.schedule import PATH_DOWN, PATH_UP
from simulator.collective.run import rank_layout, run_merged, run_schedule
from simulator.topology import load_topology


def _dep_sets(ptr, idx, sent, row, mapping=None):
    """One op's dependencies as a set of (op, waits-for-sent) pairs."""
    ops = idx[ptr[row] : ptr[row + 1]]
    if mapping is not None:
        ops = mapping[ops]
    return set(zip(ops.tolist(), sent[ptr[row] : ptr[row + 1]].tolist(), strict=True))


def _build(topology: str, servers: int, **options):
    graph = load_topology(topology, servers)
    layout = rank_layout(graph)
    full = build_schedule("nvls-tree", "all_reduce", layout, 64e6, **options)
    merged = get_algorithm("nvls-tree").merged("all_reduce", layout, 64e6, **options)
    return graph, full, merged


@pytest.mark.parametrize(
    "servers, options",
    [(3, {"chunks": 2}), (4, {"chunks": 3, "heads": 4}), (2, {"chunks": 2, "channels": 2})],
)
def test_merged_ops_are_the_full_schedules(servers, options):
    """Each full op belongs to one merged op with its bytes, labels, flag and the GPU end
    of its route (the sender into the switch, the receiver out of it, both ends
    elsewhere); its dependencies, mapped to merged ops, are its op's or (listed members)
    exactly its own."""
    _, full, merged = _build("dgx-h100", servers, **options)
    m = merged.schedule
    op_of = merged.op_of()
    assert merged.full_ops == full.n_ops
    for name in ("nbytes", "reduce", "step", "chunk", "channel", "path"):
        assert np.array_equal(getattr(full, name), getattr(m, name)[op_of]), name
    up, down = full.path == PATH_UP, full.path == PATH_DOWN
    assert np.array_equal(full.src[~down], m.src[op_of][~down])
    assert np.array_equal(full.dst[~up], m.dst[op_of][~up])
    # Only in-switch transfers are merged: a GPU's copies (2h per chunk) and totals.
    heavy = merged.weight > 1
    assert np.isin(m.path[heavy], (PATH_UP, PATH_DOWN)).all()
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
            assert own == _dep_sets(
                merged.member_ptr, merged.member_idx, merged.member_sent, member
            )
        else:
            assert own == _dep_sets(m.dep_ptr, m.dep_idx, m.dep_sent, op)
    for op, deps in union.items():
        assert deps == _dep_sets(m.dep_ptr, m.dep_idx, m.dep_sent, op)


def test_merged_ops_count():
    """On 3 servers of 8 GPUs with 4 heads and 2 chunks: the full schedule has, per
    chunk and server, 8 x 4 x 2 copies in and as many totals out; merged, each GPU has
    one op of the rows it does not own, the 4 heads one more for their own row, and two
    total ops (one per half): 8 + 4 + 16 in place of 128."""
    _, full, merged = _build("dgx-h100", 3, chunks=2, heads=4)
    per_chunk_server = 2 * 8 * 4 * 2 - (8 + 4 + 2 * 8)
    assert full.n_ops - merged.schedule.n_ops == 2 * 3 * per_chunk_server


@pytest.mark.parametrize(
    "topology, servers, options, protocol",
    [
        ("dgx-h100", 3, {"chunks": 3, "heads": 4}, "Simple"),
        ("dgx-h100", 5, {"chunks": 2}, None),
        ("gb200-nvl72", 3, {"chunks": 2, "heads": 32}, "Simple"),
    ],
)
def test_merged_run_equals_the_full_replay(topology, servers, options, protocol):
    """Every op's start, sent and done, each link's bytes and busy time: the merged run
    against the full schedule replayed flow by flow (no symmetry, no shortcut timing)."""
    graph, full, merged = _build(topology, servers, **options)
    reference = run_schedule(graph, full, protocol=protocol, symmetry="off", events=True)
    result = run_merged(graph, merged, protocol=protocol, events=protocol is None)
    assert result is not None
    assert result.params["protocol"] == reference.params["protocol"]
    assert result.time_s == pytest.approx(reference.time_s, rel=1e-9)
    op_of = merged.op_of()
    for key in ("start_s", "sent_s", "end_s"):
        np.testing.assert_allclose(
            np.asarray(result.flows[key])[op_of], reference.flows[key], rtol=1e-9, atol=1e-18
        )
    for key in ("bytes", "busy_s"):
        np.testing.assert_allclose(
            np.asarray(result.links[key], dtype=float),
            np.asarray(reference.links[key], dtype=float),
            rtol=1e-9,
            atol=1e-18,
        )
    # The merged records are the merged ops' (their switch-end ranks stand for many).
    assert result.params["flows"] == "merged"


def test_refused_with_a_gpu_reducer():
    """With a finite GPU reduce bandwidth each copy's reduction would run on its row's
    head, which the merged op does not name: the runner refuses (None)."""
    graph, _, merged = _build("dgx-h100", 3, chunks=2, heads=4)
    assert run_merged(graph, merged, reduce_bandwidth=100e9) is None
    assert run_merged(graph, merged, protocol="auto") is None


def test_refused_with_a_protocol_nvls_tree_does_not_run():
    """NCCL runs NVLSTree with Simple only: LL is refused here, so that the full run
    reports it as :func:`run_schedule` does."""
    graph, _, merged = _build("dgx-h100", 3, chunks=2, heads=4)
    assert run_merged(graph, merged, protocol="LL") is None


def _nic_uplink_bytes(result) -> dict[str, float]:
    links = result.links
    return {
        f"{a}->{b}": float(nbytes)
        for a, b, nbytes in zip(links["src"], links["dst"], links["bytes"], strict=True)
        if "nic" in str(a) and "leaf" in str(b)
    }


def test_heads_are_the_first_gpu_next_to_each_nic():
    """a3-high: 8 H100s a server, one NIC for every two GPUs. NCCL's heads are the GPUs
    next to each NIC (0, 2, 4, 6), so on 2 servers every NIC carries its head's row once
    each way, n / 4 = 250 MB of a 1 GB all-reduce; with heads 0-3 (two per NIC) two NICs
    would carry n / 2 and two nothing. NCCL's policy builds the former."""
    from simulator.collective.policy import NcclPolicy

    graph = load_topology("a3-high", 2)
    layout = rank_layout(graph)
    spread = build_schedule(
        "nvls-tree", "all_reduce", layout, 1e9, chunks=4, head_ranks=(0, 2, 4, 6)
    )
    first = build_schedule("nvls-tree", "all_reduce", layout, 1e9, chunks=4, heads=4)
    assert set(_nic_uplink_bytes(run_schedule(graph, spread)).values()) == {250e6}
    assert sorted(_nic_uplink_bytes(run_schedule(graph, first)).values()) == [0.0] * 4 + [500e6] * 4
    plan = NcclPolicy().plan(NcclPolicy().system(graph), "all_reduce", 2**30)
    assert plan.schedule == "nvls-tree" and plan.options["head_ranks"] == (0, 2, 4, 6)
