"""Calls timed alone once and replayed from that timing (simulator.workload.isolated):
the same step, to rounding, as simulating every call's flows, and a fallback that is
detected when a call was not alone after all."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology import load_topology, ring_graph
from simulator.workload import WorkloadReplay, parse_workload
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown

MiB = 2**20


def both(workload, graph, **options):
    """The replay with calls timed alone (those that are not alone flow by flow, not as
    bundles: exact) and the one simulating every flow."""
    fast = WorkloadReplay(workload, graph, bundles=False, **options).run()
    slow = WorkloadReplay(workload, graph, isolated=False, **options).run()
    return fast, slow


def assert_same_run(fast, slow):
    """Every op at the same times and every link with the same bytes and busy time, to
    1e-9 of the step; the same flows counted."""
    step = float(np.nanmax(slow.records.end_s))
    for name in ("issue_s", "start_s", "end_s"):
        a, b = getattr(fast.records, name), getattr(slow.records, name)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nanmax(np.abs(a - b)) <= 1e-9 * step
    for name in ("bytes", "busy_s"):
        a, b = np.array(fast.links[name]), np.array(slow.links[name])
        assert np.allclose(a, b, rtol=1e-9, atol=1e-9 * max(1.0, float(b.max())))
    assert fast.stats.flows == slow.stats.flows


def test_a_ring_all_reduce_repeated_takes_the_closed_form_each_time():
    """Three ring all-reduces after 1 ms of compute on a 4-GPU ring: 1 ms plus three
    times 2(p-1)(n/(pB) + alpha); the call is timed alone once and replayed three times."""
    p, n, bandwidth, alpha = 4, 8 * MiB, 100e9, 2e-6
    graph = ring_graph(p, bandwidth, alpha)
    ops = []
    for rank in range(p):
        ops.append({"id": f"c{rank}", "rank": rank, "kind": "compute", "duration": "1ms"})
        for i in range(3):
            ops.append({"id": f"a{rank}.{i}", "rank": rank, "kind": "collective",
                        "op": "all_reduce", "group": "all", "bytes": n,
                        "deps": [f"c{rank}"]})  # fmt: skip
    workload = parse_workload(
        {
            "format": "ccsim-workload/1",
            "ranks": p,
            "groups": {"all": {"ranks": list(range(p))}},
            "ops": ops,
        }
    )
    run = WorkloadReplay(workload, graph, algorithm="ring").run()
    one = 2 * (p - 1) * (n / p / bandwidth + alpha)
    assert breakdown(run).step_s == pytest.approx(1e-3 + 3 * one, rel=1e-12)
    assert run.isolated == {
        "replayed": 3,
        "timed": 1,
        "joint": 0,
        "bundled": 0,
        "met": 0,
        "passive": 0,
        "passive_met": 0,
        "attempts": 1,
        "flow_by_flow": [],
        "calls_flow_by_flow": 0,
        "no_take_over": [],
    }
    # Bytes conservation on the links: each all-reduce moves 2(p-1)/p n per link.
    assert sum(run.links["bytes"]) == pytest.approx(3 * p * 2 * (p - 1) / p * n, rel=1e-12)


@pytest.mark.parametrize(
    ("preset", "options", "joint"),
    [
        ("dgx-h100", {"tp": 4, "pp": 2, "dp": 2, "defaults": "sc21"}, None),
        (
            "dgx-a100",
            {"tp": 8, "pp": 2, "dp": 1, "sequence_parallel": True, "defaults": "sc21"},
            None,
        ),
        # Each stage's 8 data-parallel all-reduces start while its last pipeline send is
        # still on their NICs: every stage but the first (24 calls) is timed with it.
        ("dgx-a100", {"tp": 8, "pp": 4, "dp": 2, "defaults": "sc21"}, 24),
        # Megatron-Core's defaults: the reduce-scatters overlapped bucket by bucket, the
        # parameter gathers at the start, TP collectives beside the GEMMs.
        ("dgx-h100", {"tp": 8, "pp": 4, "dp": 2}, 24),
    ],
)
def test_a_megatron_step_is_the_flow_by_flow_step(preset, options, joint):
    """A pipelined, tensor- and data-parallel step under NCCL's choices: every op at the
    same time as when every call's flows are simulated, with most calls replayed from a
    few timings (some together with the sends in flight they met)."""
    ranks = options["tp"] * options["pp"] * options["dp"]
    workload = megatron(model="llama3-8b", micro_batch=1, global_batch=4 * options["dp"], **options)
    graph = load_topology(preset, max(1, ranks // 8))
    fast, slow = both(workload, graph)
    assert_same_run(fast, slow)
    assert fast.isolated["replayed"] > 2 * fast.isolated["timed"] > 0
    if joint is not None:
        assert fast.isolated["joint"] == joint
        assert fast.isolated["attempts"] == 1
    assert slow.isolated == {}


def on_one_server(sends: list[dict]):
    """8 ranks of one server: a 256 MiB all-reduce over all of them (group "g") on stream
    "comm" after 10 us of compute, and the ops ``sends`` beside it."""
    ops = []
    for rank in range(8):
        ops.append({"id": f"c{rank}", "rank": rank, "kind": "compute", "duration": "10us"})
        ops.append({"id": f"a{rank}", "rank": rank, "kind": "collective", "stream": "comm",
                    "op": "all_reduce", "group": "g", "bytes": 256 * MiB,
                    "deps": [f"c{rank}"]})  # fmt: skip
    return parse_workload(
        {
            "format": "ccsim-workload/1",
            "ranks": 8,
            "groups": {"g": {"ranks": list(range(8))}},
            "ops": ops + sends,
        }
    )


def conflicting(p2p_after: str):
    """:func:`on_one_server`, with rank 0 sending 64 MiB to rank 1 on another stream
    ``p2p_after`` into the step (over the same NVLink links)."""
    sends = [
        {"id": "w0", "rank": 0, "kind": "compute", "duration": p2p_after, "stream": "x"},
        {"id": "w1", "rank": 1, "kind": "compute", "duration": p2p_after, "stream": "x"},
        {"id": "s", "rank": 0, "kind": "send", "peer": 1, "bytes": 64 * MiB,
         "stream": "x", "deps": ["w0"]},
        {"id": "r", "rank": 1, "kind": "recv", "peer": 0, "bytes": 64 * MiB,
         "stream": "x", "deps": ["w1"]},
    ]  # fmt: skip
    return on_one_server(sends)


def test_a_call_that_was_not_alone_is_simulated_again_flow_by_flow():
    """A send that starts on the all-reduce's links while it runs makes the replay from
    its isolated timing wrong: the replay notices, runs again with that call simulated
    flow by flow (the group's other call, alone, still replayed), and ends as the
    flow-by-flow replay does. The send slows the all-reduce, so the shortcut would have
    been visibly wrong."""
    graph = load_topology("dgx-a100", 1)
    fast, slow = both(conflicting("100us"), graph, algorithm="ring")
    assert_same_run(fast, slow)
    assert fast.isolated["attempts"] == 2
    assert fast.isolated["flow_by_flow"] == []
    assert fast.isolated["calls_flow_by_flow"] == 1
    assert fast.isolated["replayed"] == 0
    alone = WorkloadReplay(conflicting("100s"), graph, algorithm="ring").run()
    index = [op.id for op in slow.workload.ops].index("a0")
    assert slow.records.end_s[index] > alone.records.end_s[index] * 1.01
    assert alone.isolated["attempts"] == 1  # a send long after the call: no conflict


def test_only_the_call_that_met_a_send_goes_flow_by_flow():
    """Two all-reduces of one group in a row, a send meeting the first: the second,
    alone, is still replayed from the timing (one call of the group flow by flow, not the
    group), and the step is the flow-by-flow one."""
    second = [
        {"id": f"b{rank}", "rank": rank, "kind": "collective", "stream": "comm",
         "op": "all_reduce", "group": "g", "bytes": 256 * MiB, "deps": [f"a{rank}"]}
        for rank in range(8)
    ]  # fmt: skip
    sends = [
        {"id": "w0", "rank": 0, "kind": "compute", "duration": "100us", "stream": "x"},
        {"id": "w1", "rank": 1, "kind": "compute", "duration": "100us", "stream": "x"},
        {"id": "s", "rank": 0, "kind": "send", "peer": 1, "bytes": 64 * MiB,
         "stream": "x", "deps": ["w0"]},
        {"id": "r", "rank": 1, "kind": "recv", "peer": 0, "bytes": 64 * MiB,
         "stream": "x", "deps": ["w1"]},
    ]  # fmt: skip
    workload = on_one_server(sends + second)
    fast, slow = both(workload, load_topology("dgx-a100", 1), algorithm="ring")
    assert_same_run(fast, slow)
    assert fast.isolated["attempts"] == 2
    assert fast.isolated["calls_flow_by_flow"] == 1
    assert fast.isolated["replayed"] == 1
    assert fast.isolated["flow_by_flow"] == []


def test_a_call_meeting_a_send_in_flight_is_timed_with_it():
    """A send already on the all-reduce's links when the all-reduce starts: the call is
    timed together with what the send has left and takes it over, in one attempt, and
    the step is the flow-by-flow one (the send and the all-reduce both slowed by sharing,
    as the replay of the call alone would not show)."""
    graph = load_topology("dgx-a100", 1)
    fast, slow = both(conflicting("0us"), graph, algorithm="ring")
    assert_same_run(fast, slow)
    assert fast.isolated["joint"] == 1
    assert fast.isolated["attempts"] == 1
    assert fast.isolated["flow_by_flow"] == []
    alone = WorkloadReplay(conflicting("100s"), graph, algorithm="ring").run()
    ids = [op.id for op in slow.workload.ops]
    for op in ("a0", "a1"):
        assert fast.records.end_s[ids.index(op)] > alone.records.end_s[ids.index(op)] * 1.01
    # The send ends when its flow-by-flow twin does, slowed by the all-reduce beside it.
    send_alone = 64 * MiB / float(graph.edges["s0/gpu0", "s0/nvswitch"]["bandwidth"])
    assert fast.records.end_s[ids.index("s")] > send_alone * 1.01


def test_a_call_that_took_a_send_over_and_then_met_another_stops_taking_over():
    """Rank 0 sends 64 MiB to rank 1 twice in a row while the all-reduce runs: the
    all-reduce takes the first send over, and the second starts on links the joint timing
    holds. The replay runs again with that group's calls no longer taking sends over (so
    this one runs flow by flow, as it is not alone), and ends as the flow-by-flow replay."""
    sends = []
    for i in (1, 2):
        after = [] if i == 1 else [f"s{i - 1}"]
        sends.append({"id": f"s{i}", "rank": 0, "kind": "send", "peer": 1, "bytes": 64 * MiB,
                      "stream": "x", "deps": after})  # fmt: skip
        after = [] if i == 1 else [f"r{i - 1}"]
        sends.append({"id": f"r{i}", "rank": 1, "kind": "recv", "peer": 0, "bytes": 64 * MiB,
                      "stream": "x", "deps": after})  # fmt: skip
    workload = on_one_server(sends)
    fast, slow = both(workload, load_topology("dgx-a100", 1), algorithm="ring")
    assert_same_run(fast, slow)
    assert fast.isolated["attempts"] == 2
    assert fast.isolated["no_take_over"] == ["g"]
    assert fast.isolated["flow_by_flow"] == []
    assert fast.isolated["joint"] == 0  # in the attempt reported


def test_timed_faults_turn_it_off():
    """A link degraded for part of the step changes rates mid-call: no call is replayed
    from an isolated timing, and the step is the flow-by-flow one."""
    from simulator.network.faults import apply_faults

    fault = "link=s0/gpu0-s0/nvswitch:0.5,t0=0ms,t1=0.05ms"
    graph = apply_faults(load_topology("dgx-a100", 1), fault)
    fast, slow = both(conflicting("100s"), graph, algorithm="ring")
    assert fast.isolated["replayed"] == 0
    assert_same_run(fast, slow)


def test_where_conflicts_are_the_rule_every_call_goes_flow_by_flow_at_once():
    """Ten all-reduces of one group, each after 50 us of compute, and a 4 MiB send from
    rank 0 to rank 1 starting 60 us after each compute, in the middle of each call: each
    call replayed from its timing is met by a send. With conflicts in that many calls
    (more than EVERY_CALL_SHARE of those launched), the next attempt simulates every call
    flow by flow instead of excluding them attempt by attempt: two attempts, and the
    step of the flow-by-flow replay."""
    ops = []
    for rank in range(8):
        for k in range(10):
            after = [f"a{k - 1}_{rank}"] if k else []
            ops.append({"id": f"c{k}_{rank}", "rank": rank, "kind": "compute",
                        "duration": "50us", "deps": after})  # fmt: skip
            ops.append({"id": f"a{k}_{rank}", "rank": rank, "kind": "collective",
                        "stream": "comm", "op": "all_reduce", "group": "g",
                        "bytes": 64 * MiB, "deps": [f"c{k}_{rank}"]})  # fmt: skip
            if rank < 2:
                ops.append({"id": f"d{k}_{rank}", "rank": rank, "kind": "compute",
                            "duration": "60us", "stream": "x",
                            "deps": [f"c{k}_{rank}"]})  # fmt: skip
                kind, peer = ("send", 1) if rank == 0 else ("recv", 0)
                ops.append({"id": f"s{k}_{rank}", "rank": rank, "kind": kind, "peer": peer,
                            "bytes": 4 * MiB, "stream": "x",
                            "deps": [f"d{k}_{rank}"]})  # fmt: skip
    workload = parse_workload(
        {
            "format": "ccsim-workload/1",
            "ranks": 8,
            "groups": {"g": {"ranks": list(range(8))}},
            "ops": ops,
        }
    )
    fast, slow = both(workload, load_topology("dgx-a100", 1), algorithm="ring")
    assert_same_run(fast, slow)
    assert fast.isolated["attempts"] == 2
    assert fast.isolated["flow_by_flow"] == ["every call"]
    assert fast.isolated["replayed"] == 0
