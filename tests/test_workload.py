"""Workload replay against hand-computed timelines.

Unless said otherwise the topology is two GPUs joined by one full-duplex 100 GB/s link
with no latency: a ring all-reduce of n bytes on 2 ranks moves n/2 bytes each way twice,
taking 2 x (n/2) / 100e9 = n / 1e11 s; 1e8 bytes take exactly 1 ms. Collectives run as
ring on the ideal model (algorithm="ring"); tests/test_workload_policy.py covers the
default, the topology's library.
"""

from collections import defaultdict

import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import WorkloadError, load_workload, parse_workload, run_workload
from simulator.workload.presets import describe_presets

MS = 1e-3


def two_gpus(**attrs):
    graph = ring_graph(2, 100e9, 0.0)
    for node in graph.nodes:
        graph.nodes[node].update(attrs)
    return graph


def workload(ops, ranks=2, groups=None):
    return {
        "format": "ccsim-workload/1",
        "name": "test",
        "ranks": ranks,
        "groups": groups or {"dp": {"kind": "DP", "ranks": list(range(ranks))}},
        "ops": ops,
    }


def ddp_ops(durations_ms, bucket_bytes):
    """Backward layers back to back on the compute stream; after layer i, an all-reduce
    of bucket i on the comm stream (waits for the layer, and for the bucket before it
    because they share the stream)."""
    ops = []
    for rank in range(2):
        for i, (ms, nbytes) in enumerate(zip(durations_ms, bucket_bytes, strict=True)):
            ops.append(
                {
                    "id": f"r{rank}.bwd{i}",
                    "rank": rank,
                    "kind": "compute",
                    "duration": f"{ms}ms",
                    **({"deps": [f"r{rank}.bwd{i - 1}"]} if i else {}),
                }
            )
            ops.append(
                {
                    "id": f"r{rank}.ar{i}",
                    "rank": rank,
                    "kind": "collective",
                    "op": "all_reduce",
                    "group": "dp",
                    "bytes": nbytes,
                    "deps": [f"r{rank}.bwd{i}"],
                }
            )
    return ops


def test_bucketed_backward_exposed_communication():
    """Backward of 3 layers taking 3, 2 and 1 ms; gradient buckets of 2e8, 1e8 and 3e8
    bytes (all-reduces of 2, 1 and 3 ms).

    Compute runs 0-3, 3-5, 5-6 ms. AR0 starts at 3 and ends at 5; AR1 is ready at 5 (its
    layer ends at 5, the stream frees at 5) and ends at 6; AR2 is ready at 6, ends at 9.
    Communication busy: 3-9 = 6 ms; overlapped with compute: 3-6 = 3 ms; exposed: 3 ms;
    step 9 ms."""
    _run, result = run_workload(
        workload(ddp_ops([3, 2, 1], [2e8, 1e8, 3e8])), two_gpus(), algorithm="ring"
    )
    assert result.step_s == pytest.approx(9 * MS, rel=1e-9)
    for rank in result.ranks:
        assert rank.compute_s == pytest.approx(6 * MS, rel=1e-9)
        assert rank.comm_s == pytest.approx(6 * MS, rel=1e-9)
        assert rank.overlapped_s == pytest.approx(3 * MS, rel=1e-9)
        assert rank.exposed_s == pytest.approx(3 * MS, rel=1e-9)
        assert rank.bubble_s == pytest.approx(0.0, abs=1e-12)
    assert result.exposed_by_kind == {"DP": pytest.approx(3 * MS, rel=1e-9)}


def test_communication_slows_overlapping_compute():
    """A 4 ms compute op and a 1 ms all-reduce start together; with a slowdown of 0.5 the
    compute advances 0.5 ms during the all-reduce, then runs its last 3.5 ms at full
    speed: it ends at 1 + 3.5 = 4.5 ms. Without slowdown it ends at 4 ms."""
    ops = []
    for rank in range(2):
        ops.append({"id": f"c{rank}", "rank": rank, "kind": "compute", "duration": "4ms"})
        ops.append(
            {
                "id": f"a{rank}",
                "rank": rank,
                "kind": "collective",
                "op": "all_reduce",
                "group": "dp",
                "bytes": 1e8,
            }
        )
    slow, result = run_workload(workload(ops), two_gpus(), comm_slowdown=0.5, algorithm="ring")
    assert slow.records.end_s[0] == pytest.approx(4.5 * MS, rel=1e-9)
    assert result.step_s == pytest.approx(4.5 * MS, rel=1e-9)
    fast, _ = run_workload(workload(ops), two_gpus(), comm_slowdown=0.0, algorithm="ring")
    assert fast.records.end_s[0] == pytest.approx(4 * MS, rel=1e-9)
    # Copy-engine transports do not slow compute.
    graph = two_gpus()
    graph.graph["comm_engine"] = "sdma"
    sdma, _ = run_workload(workload(ops), graph, comm_slowdown=0.5, algorithm="ring")
    assert sdma.records.end_s[0] == pytest.approx(4 * MS, rel=1e-9)


def test_members_arriving_at_different_times():
    """Rank 0 computes 1 ms, rank 1 computes 3 ms, then both all-reduce 1e8 bytes: the
    collective starts at 3 ms and ends at 4 ms; rank 0 waited 2 ms."""
    ops = [
        {"id": "c0", "rank": 0, "kind": "compute", "duration": "1ms"},
        {"id": "c1", "rank": 1, "kind": "compute", "duration": "3ms"},
        {
            "id": "a0",
            "rank": 0,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 1e8,
            "deps": ["c0"],
        },
        {
            "id": "a1",
            "rank": 1,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 1e8,
            "deps": ["c1"],
        },
    ]
    run, result = run_workload(workload(ops), two_gpus(), algorithm="ring")
    assert run.records.issue_s.tolist() == pytest.approx([0, 0, 1 * MS, 3 * MS])
    assert run.records.start_s[2] == pytest.approx(3 * MS)
    assert run.records.end_s[2:].tolist() == pytest.approx([4 * MS, 4 * MS], rel=1e-9)
    assert result.ranks[0].waiting_s == pytest.approx(2 * MS, rel=1e-9)
    assert result.ranks[1].waiting_s == pytest.approx(0.0, abs=1e-12)


def test_concurrent_collectives_share_the_network():
    """Two 1e8-byte all-reduces issued together on two streams share the link: each gets
    half the bandwidth, both end at 2 ms."""
    ops = []
    for rank in range(2):
        for stream in ("s1", "s2"):
            ops.append(
                {
                    "id": f"{stream}.{rank}",
                    "rank": rank,
                    "kind": "collective",
                    "op": "all_reduce",
                    "group": stream,
                    "bytes": 1e8,
                    "stream": stream,
                }
            )
    groups = {"s1": {"kind": "DP", "ranks": [0, 1]}, "s2": {"kind": "TP", "ranks": [0, 1]}}
    run, result = run_workload(workload(ops, groups=groups), two_gpus(), algorithm="ring")
    assert run.records.end_s.tolist() == pytest.approx([2 * MS] * 4, rel=1e-9)
    # Exposed time (2 ms per rank) is split equally between the two dimensions.
    assert result.exposed_by_kind == {"DP": pytest.approx(MS), "TP": pytest.approx(MS)}


def test_pipeline_send_recv_and_bubble():
    """Rank 0 computes 1 ms then sends 1e8 bytes (1 ms at 100 GB/s) to rank 1, which then
    computes 1 ms. Step 3 ms; rank 1 waits 1 ms for the send (waiting, not bubble: the
    categories are disjoint); rank 0 idles 1 ms at the end (bubble)."""
    ops = [
        {"id": "f0", "rank": 0, "kind": "compute", "duration": "1ms"},
        {"id": "s0", "rank": 0, "kind": "send", "peer": 1, "bytes": 1e8, "deps": ["f0"]},
        {"id": "r1", "rank": 1, "kind": "recv", "peer": 0, "bytes": 1e8},
        {"id": "f1", "rank": 1, "kind": "compute", "duration": "1ms", "deps": ["r1"]},
    ]
    _, result = run_workload(workload(ops, groups={}), two_gpus(), algorithm="ring")
    assert result.step_s == pytest.approx(3 * MS, rel=1e-9)
    assert result.ranks[1].waiting_s == pytest.approx(1 * MS, rel=1e-9)
    assert [r.bubble_s for r in result.ranks] == pytest.approx([1 * MS, 0.0], abs=1e-12)
    for r in result.ranks:
        assert r.compute_s + r.exposed_s + r.waiting_s + r.bubble_s == pytest.approx(3 * MS)
    assert result.exposed_by_kind == {"P2P": pytest.approx(1 * MS, rel=1e-9)}


def test_flops_use_the_device_roofline():
    """1e12 FLOPs on an A100 (312 TFLOP/s peak at 70% GEMM efficiency): 4.579 ms;
    a memory-bound op of 2.039e9 bytes takes 1 ms at 2.039 TB/s."""
    ops = [
        {"id": "g", "rank": 0, "kind": "compute", "flops": 1e12},
        {"id": "m", "rank": 1, "kind": "compute", "flops": 1e6, "bytes": 2.039e9},
    ]
    run, _ = run_workload(
        workload(ops, groups={}), two_gpus(model="A100-SXM4-80GB"), algorithm="ring"
    )
    assert run.records.end_s.tolist() == pytest.approx([1e12 / (312e12 * 0.7), 1 * MS], rel=1e-9)
    with pytest.raises(WorkloadError, match="device model"):
        run_workload(workload(ops, groups={}), two_gpus(), algorithm="ring")


def test_a_member_that_never_issues_is_a_deadlock():
    ops = [
        {
            "id": "lonely",
            "rank": 0,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 1e6,
        }
    ]
    with pytest.raises(WorkloadError, match=r"lonely.*never issued by ranks \[1\]"):
        parse_workload(workload(ops))


def test_calls_match_by_their_order_on_each_rank_and_the_first_one_short_is_named():
    """Three ranks on "dp": ranks 0 and 1 issue two calls, rank 2 one. Call #0 matches
    across all three; call #1 is the first that a member never issues, and the error
    names it by rank 0's op and lists rank 2 alone as missing."""

    def call(rank, k):
        return {"id": f"a{rank}.{k}", "rank": rank, "kind": "collective",
                "op": "all_reduce", "group": "dp", "bytes": 1e6}  # fmt: skip

    ops = [call(0, 0), call(0, 1), call(1, 0), call(1, 1), call(2, 0)]
    with pytest.raises(
        WorkloadError, match=r"all_reduce #1 .*'a0\.1'.*never issued by ranks \[2\]"
    ):
        parse_workload(workload(ops, ranks=3))
    matched = parse_workload(workload(ops[:2] + ops[2:4] + [ops[4], call(2, 1)], ranks=3))
    assert matched.instances == [[0, 2, 4], [1, 3, 5]]


def test_crossed_collectives_are_a_deadlock():
    """Rank 0 calls A then B on its comm stream, rank 1 calls B then A: each waits for
    the other forever."""
    groups = {"a": {"kind": "DP", "ranks": [0, 1]}, "b": {"kind": "TP", "ranks": [0, 1]}}
    ops = [
        {"id": "0a", "rank": 0, "kind": "collective", "op": "all_reduce", "group": "a", "bytes": 8},
        {"id": "0b", "rank": 0, "kind": "collective", "op": "all_reduce", "group": "b", "bytes": 8},
        {"id": "1b", "rank": 1, "kind": "collective", "op": "all_reduce", "group": "b", "bytes": 8},
        {"id": "1a", "rank": 1, "kind": "collective", "op": "all_reduce", "group": "a", "bytes": 8},
    ]
    with pytest.raises(WorkloadError, match="cycle.*'0a' \\(rank 0\\)"):
        parse_workload(workload(ops, groups=groups))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank": 5}, "unknown rank 5"),
        ({"group": "nope"}, "unknown group 'nope'"),
        ({"deps": ["ghost"]}, "unknown op 'ghost'"),
        ({"bytes": "12 parsecs"}, "bytes"),
        ({"colour": "red"}, "unknown field 'colour'"),
    ],
)
def test_bad_ops_name_the_op_and_field(change, message):
    ops = [
        {
            "id": f"a{r}",
            "rank": r,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 8,
        }
        for r in range(2)
    ]
    ops[0].update(change)
    with pytest.raises(WorkloadError, match=message):
        parse_workload(workload(ops))


def test_mismatched_sizes_are_reported():
    ops = [
        {
            "id": f"a{r}",
            "rank": r,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 8 * (r + 1),
        }
        for r in range(2)
    ]
    with pytest.raises(WorkloadError, match="does not match.*'a0'.*'a1'"):
        parse_workload(workload(ops))


def test_round_trip_through_a_file(tmp_path):
    data = workload(ddp_ops([3, 2, 1], [2e8, 1e8, 3e8]))
    first = parse_workload(data)
    path = tmp_path / "w.json"
    first.save(path)
    again = load_workload(path)
    assert again.to_dict() == first.to_dict()
    _, result = run_workload(again, two_gpus(), algorithm="ring")
    assert result.step_s == pytest.approx(9 * MS, rel=1e-9)


def test_auto_algorithm_per_collective():
    """algorithm="auto": a lone 64 MiB all-reduce over 2 dgx-a100 servers takes as long as
    at most the fastest (algorithm, chunks) a direct search finds (+1%, the tuner's rule),
    and much less than the flat ring, which is bound by one 25 GB/s NIC."""
    import simulator
    from simulator.topology import load_topology

    graph = load_topology("dgx-a100", nodes=2)
    n = 64 * 2**20
    ops = [
        {
            "id": f"a{r}",
            "rank": r,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": n,
        }
        for r in range(16)
    ]
    run, _ = run_workload(workload(ops, ranks=16), graph, algorithm="auto")
    best = min(
        simulator.simulate_collective(graph, "all_reduce", n, name, chunks=k).time_s
        for name in ("ring", "hierarchical", "pipelined", "tree", "halving-doubling")
        for k in (1, 2, 4, 8, 16, 32)
    )
    took = float(run.records.end_s.max())
    assert took <= best * 1.01
    ring = simulator.simulate_collective(graph, "all_reduce", n).time_s
    assert took < ring / 3


def test_protocol_model_applies_to_collectives():
    """With a protocol, each collective pays the launch and the protocol's base latency,
    then every ring step its hop latency, and LL sends 4 wire bytes per data byte
    (NCCL: 1/4 of the bandwidth). Two GPUs, 100 GB/s, launch 2 us, LL, 8 MB all-reduce
    after a 1 ms layer: 1 ms + 2 us + 6.6 us + 2 x (0.6 us + 4 MB / 25 GB/s)."""
    from simulator.library.protocol import Calibration

    graph = two_gpus()
    graph.graph["nccl"] = Calibration(launch_s=2e-6)
    run, _ = run_workload(workload(ddp_ops([1.0], [8e6])), graph, protocol="LL", algorithm="ring")
    expected = MS + 2e-6 + 6.6e-6 + 2 * (0.6e-6 + 4e6 / 25e9)
    assert run.records.end_s.max() == pytest.approx(expected, rel=1e-9)
    # auto: the fastest protocol for each collective alone (here Simple at 8 MB: 8.4 us
    # base + 2 x (3.4 us + 40 us), against LL's 2 x 160 us).
    run, _ = run_workload(workload(ddp_ops([1.0], [8e6])), graph, protocol="auto", algorithm="ring")
    expected = MS + 2e-6 + 8.4e-6 + 2 * (3.4e-6 + 4e6 / 100e9)
    assert run.records.end_s.max() == pytest.approx(expected, rel=1e-9)
    with pytest.raises(CcsimError, match="unknown protocol 'LL64'"):
        run_workload(workload(ddp_ops([1.0], [8e6])), graph, protocol="LL64", algorithm="ring")


def test_cli_run_takes_the_protocol_model(capsys):
    from simulator.cli import main

    assert main(["run", "ddp-gpt1.5b-16", "--topology", "dgx-a100", "--proto", "LL64"]) == 2
    assert "unknown protocol 'LL64'" in capsys.readouterr().err


@pytest.mark.parametrize("name", [name for name, _ in describe_presets()])
def test_breakdown_shares_of_the_presets_add_up_to_the_step(name, capsys):
    """Compute busy, exposed, waiting for peers and bubble are disjoint: their shares of
    each bundled preset's step add up to 100%, within the rounding of four shares
    printed to 0.1% (ddp-gpt1.5b-16 summed to 102.6% when the bubble also counted the
    waiting)."""
    assert main(["run", name]) == 0
    rows = {line[:28].strip(): line.split() for line in capsys.readouterr().out.splitlines()}
    labels = ("compute busy", "exposed", "waiting for peers", "bubble (nothing running)")
    shares = [float(rows[label][-1].rstrip("%")) for label in labels]
    assert sum(shares) == pytest.approx(100.0, abs=0.2)


def test_exposed_time_is_split_among_the_ops_in_flight_outside_compute():
    """Hand-worked attribution on one rank: compute over [0, 2] ms, a DP all-reduce over
    [1, 4], a TP all-reduce over [3, 5], a send over [6, 7] and an empty call at 2 ms.
    Exposed: [2, 3] DP alone, [3, 4] shared, [4, 5] TP alone, [6, 7] the send; so DP and
    TP 1.5 ms each, P2P 1 ms, and the empty call nothing."""
    from types import SimpleNamespace

    from simulator.workload.metrics import _attribute

    groups = {"dp": SimpleNamespace(kind="DP"), "tp": SimpleNamespace(kind="TP")}
    work = SimpleNamespace(groups=groups)

    def call(group, kind="collective"):
        return SimpleNamespace(group=group, kind=kind, op="all_reduce")

    comm = [
        (1 * MS, 4 * MS, call("dp")),
        (3 * MS, 5 * MS, call("tp")),
        (6 * MS, 7 * MS, call(None, kind="send")),
        (2 * MS, 2 * MS, call("tp")),
    ]
    by_kind: dict = defaultdict(float)
    by_call: dict = defaultdict(float)
    _attribute(comm, [(0.0, 2 * MS)], work, by_kind, by_call)
    assert dict(by_kind) == {
        "DP": pytest.approx(1.5 * MS, rel=1e-12),
        "TP": pytest.approx(1.5 * MS, rel=1e-12),
        "P2P": pytest.approx(1 * MS, rel=1e-12),
    }
    assert dict(by_call) == {
        "DP all_reduce": pytest.approx(1.5 * MS, rel=1e-12),
        "TP all_reduce": pytest.approx(1.5 * MS, rel=1e-12),
        "P2P send": pytest.approx(1 * MS, rel=1e-12),
    }


def test_an_unknown_collective_op_is_named_with_the_valid_ones():
    """Issue 33: ``allreduce`` was taken, and the replay then said no algorithm can run
    it; the trace now says the op is unknown and which one was meant."""
    trace = {
        "format": "ccsim-workload/1",
        "name": "typo",
        "ranks": 2,
        "groups": {"pair": {"kind": "DP", "ranks": [0, 1]}},
        "ops": [
            {"rank": r, "kind": "collective", "op": "allreduce", "group": "pair", "bytes": "1M"}
            for r in (0, 1)
        ],
    }
    with pytest.raises(WorkloadError) as error:
        parse_workload(trace, origin="typo.json")
    assert "unknown op 'allreduce' (did you mean all_reduce?); valid ops: all_reduce, " in str(
        error.value
    )


def test_step_parts_add_up_to_the_step_with_waiting_as_a_part_of_its_own():
    """A pipelined step (TP 2 x PP 2 x DP 2): its parts, means over ranks, add up to the
    step time, and waiting for peers is one of them; each part is the mean of the
    per-rank figure of the same name."""
    from simulator.topology import load_topology
    from simulator.workload import run_workload
    from simulator.workload.generators import megatron

    step = megatron("llama3-8b", tp=2, pp=2, dp=2, micro_batch=1, global_batch=8)
    _, result = run_workload(step, load_topology("dgx-a100"))
    parts = result.step_parts()
    names = list(parts)
    assert names[0] == "compute" and names[-2:] == ["waiting for peers", "bubble"]
    assert {name for name in parts if name.startswith("exposed ")} == {
        "exposed DP",
        "exposed P2P",
    }
    assert sum(parts.values()) == pytest.approx(result.step_s, rel=1e-9)
    assert parts["waiting for peers"] > 0.05 * result.step_s  # what the notebook left out
    per_rank = result.ranks
    assert parts["waiting for peers"] == pytest.approx(
        sum(r.waiting_s for r in per_rank) / len(per_rank)
    )
    exposed = sum(v for name, v in parts.items() if name.startswith("exposed "))
    assert exposed == pytest.approx(sum(r.exposed_s for r in per_rank) / len(per_rank))
