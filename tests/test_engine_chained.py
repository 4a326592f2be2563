"""Compute ends on a reused event per stream, and compute ops started straight from the
end of the one before them (``WorkloadReplay(chained=True)``, the default): the same
replay to the bit as the general path (``chained=False``), which every op takes there.

The reference here is the general path itself, run on the same workload: every op's
issue, start and end time, the links' records and the breakdown must be equal (not
close), on hand-made timelines, random workloads with ties in time (the order of
same-time events must not change) and generated pipeline steps.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from simulator.topology import load_topology, ring_graph
from simulator.workload import load_workload
from simulator.workload.engine import WorkloadReplay
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown


def _finished(replay: WorkloadReplay) -> list[int]:
    """Spy on the general path's ends: the op indices it finishes, in order."""
    seen: list[int] = []
    general = replay._finish

    def finish(index: int) -> None:
        seen.append(index)
        general(index)

    replay._finish = finish  # type: ignore[method-assign]
    return seen


def _launches(replay: WorkloadReplay) -> list[tuple]:
    """Spy on the launches of collectives and sends: (time, "call" or "pair", k), in
    the order they happen (same-time events taken in another order would launch calls
    at the same times in another order)."""
    seen: list[tuple] = []
    for kind, name in (("call", "_launch_collective"), ("pair", "_launch_pair")):
        launch = getattr(replay, name)

        def spy(k: int, launch=launch, kind=kind) -> None:
            seen.append((replay.env.now, kind, k))
            launch(k)

        setattr(replay, name, spy)
    return seen


def _same_run(workload, graph, **options) -> tuple:
    """Run ``workload`` chained and by the general path; assert every record is equal,
    and the calls launched in the same order, and return both runs."""
    ours = WorkloadReplay(workload, graph, **options)
    theirs = WorkloadReplay(workload, graph, chained=False, **options)
    order, reference = _launches(ours), _launches(theirs)
    chained, general = ours.run(), theirs.run()
    assert order == reference
    for name in ("issue_s", "start_s", "end_s"):
        ours, theirs = getattr(chained.records, name), getattr(general.records, name)
        assert np.array_equal(ours, theirs, equal_nan=True), name
    assert chained.links.keys() == general.links.keys()
    for key, values in general.links.items():
        assert np.array_equal(np.asarray(chained.links[key]), np.asarray(values)), key
    assert breakdown(chained) == breakdown(general)
    assert chained.choices == general.choices
    return chained, general


def test_a_chain_ends_at_its_durations_added_in_order():
    """Rank 0 runs compute ops of 0.1, 0.2 and 0.3 s one after another, then an
    all-reduce with rank 1 (which computes 1 s first). The third ends at
    ((0.1 + 0.2) + 0.3) s, 0.6000000000000001 in doubles (0.1 + (0.2 + 0.3) would be
    0.6): the durations are added in order, at each op's start. The second and third
    start straight from their predecessor's end (the general path never finishes the
    first two), and the all-reduce starts when rank 1 is done, at 1 s."""
    ops = [
        {"id": "a", "rank": 0, "kind": "compute", "duration": 0.1},
        {"id": "b", "rank": 0, "kind": "compute", "duration": 0.2, "deps": ["a"]},
        {"id": "c", "rank": 0, "kind": "compute", "duration": 0.3},
        {"id": "x", "rank": 1, "kind": "compute", "duration": 1.0},
    ]
    ops += [
        {"id": f"ar{r}", "rank": r, "kind": "collective", "op": "all_reduce", "group": "g",
         "bytes": 1e6, "deps": [last]}
        for r, last in ((0, "c"), (1, "x"))
    ]  # fmt: skip
    trace = {"format": "ccsim-workload/1", "name": "chain", "ranks": 2, "ops": ops,
             "groups": {"g": {"kind": "DP", "ranks": [0, 1]}}}  # fmt: skip
    workload = load_workload(trace)
    graph = ring_graph(2, 100e9, 0.0)
    replay = WorkloadReplay(workload, graph, algorithm="ring")
    finished = _finished(replay)
    run = replay.run()
    assert run.records.end_s[:3].tolist() == [0.1, 0.1 + 0.2, (0.1 + 0.2) + 0.3]
    assert run.records.end_s[2] == 0.6000000000000001
    assert run.records.start_s[1:3].tolist() == run.records.end_s[:2].tolist()
    assert run.records.issue_s[1:3].tolist() == run.records.end_s[:2].tolist()
    assert run.records.start_s[4] == 1.0  # the all-reduce, once rank 1 issues it
    assert 0 not in finished and 1 not in finished and 2 in finished
    general = WorkloadReplay(workload, graph, algorithm="ring", chained=False)
    every = _finished(general)
    general.run()
    assert sorted(every) == list(range(len(workload.ops)))


def test_a_chain_keeps_the_order_of_events_at_its_end():
    """Rank 1's op x (1 ms) is issued first, then rank 0's chain a, b (1 ms each). At
    1 ms x's end comes first (it was scheduled first) and starts d (1 ms), then a's
    end starts b: d's end is scheduled before b's, so at 2 ms d ends first, and its
    send to rank 2 is launched before b's. Were b's end scheduled when a started (one
    event for the chain, at the same 2 ms), b's send would go first."""
    ops = [
        {"id": "x", "rank": 1, "kind": "compute", "duration": 1e-3},
        {"id": "d", "rank": 1, "kind": "compute", "duration": 1e-3, "stream": "other",
         "deps": ["x"]},
        {"id": "a", "rank": 0, "kind": "compute", "duration": 1e-3},
        {"id": "b", "rank": 0, "kind": "compute", "duration": 1e-3, "deps": ["a"]},
        {"id": "sb", "rank": 0, "kind": "send", "peer": 2, "bytes": 1e6, "deps": ["b"]},
        {"id": "sd", "rank": 1, "kind": "send", "peer": 2, "bytes": 2e6, "deps": ["d"]},
        {"id": "rb", "rank": 2, "kind": "recv", "peer": 0, "bytes": 1e6, "stream": "r0"},
        {"id": "rd", "rank": 2, "kind": "recv", "peer": 1, "bytes": 2e6, "stream": "r1"},
    ]  # fmt: skip
    trace = {"format": "ccsim-workload/1", "name": "tie", "ranks": 3, "ops": ops}
    workload = load_workload(trace)
    replay = WorkloadReplay(workload, ring_graph(3, 100e9, 0.0), algorithm="ring")
    launches = _launches(replay)
    replay.run()
    sd, sb = workload.pairs.index((5, 7)), workload.pairs.index((4, 6))
    assert [(kind, k) for _, kind, k in launches] == [("pair", sd), ("pair", sb)]
    assert launches[0][0] == launches[1][0] == 1e-3 + 1e-3
    _same_run(workload, ring_graph(3, 100e9, 0.0), algorithm="ring")


def _random_trace(seed: int) -> dict:
    """A random workload that cannot deadlock: ops are made in one global order, every
    dep points to an earlier op, each stream runs its ops in that order, and a
    collective's or a send's ops are made together. Durations are drawn from a few
    round values (so that ends on different ranks tie) and from random doubles."""
    rng = random.Random(seed)
    ranks = rng.randint(2, 5)
    ops: list[dict] = []
    last: dict[int, list[str]] = {r: [] for r in range(ranks)}  # each rank's ops so far
    groups = {"all": {"kind": "DP", "ranks": list(range(ranks))}}
    for r in range(0, ranks - 1, 2):
        groups[f"pair{r}"] = {"kind": "TP", "ranks": [r, r + 1]}
    count = 0

    def new(rank: int, before: int, **fields) -> dict:
        """An op of ``rank``; its deps among the first ``before`` ops (not its call's)."""
        nonlocal count
        op = {"id": f"o{count}", "rank": rank, **fields}
        count += 1
        deps = set()
        mine = [name for name in last[rank] if int(name[1:]) < before]
        if mine and rng.random() < 0.5:
            deps.add(rng.choice(mine[-3:]))
        other = [name for name in last[rng.randrange(ranks)] if int(name[1:]) < before]
        if other and rng.random() < 0.2:  # a dep on another rank's op
            deps.add(rng.choice(other))
        op["deps"] = sorted(deps)
        ops.append(op)
        last[rank].append(op["id"])
        return op

    for _ in range(rng.randint(8, 20)):
        what = rng.random()
        if what < 0.55:
            for rank in range(ranks):
                stream = rng.choice(["compute", "compute", "aux"])
                for _ in range(rng.randint(1, 4)):
                    duration = rng.choice([1e-3, 2e-3, 5e-4, rng.uniform(1e-4, 3e-3)])
                    new(rank, count, kind="compute", stream=stream, duration=duration)
        elif what < 0.85:
            name = rng.choice(sorted(groups))
            nbytes = rng.choice([1e6, 8e6, 3.3e7])
            stream = rng.choice(["comm", "compute"])
            start = count
            for rank in groups[name]["ranks"]:
                new(rank, start, kind="collective", op="all_reduce", group=name, bytes=nbytes,
                    stream=stream)  # fmt: skip
        else:
            src, dst = rng.sample(range(ranks), 2)
            nbytes = rng.choice([1e6, 4e7])
            start = count
            new(src, start, kind="send", peer=dst, bytes=nbytes, stream="send")
            new(dst, start, kind="recv", peer=src, bytes=nbytes, stream="recv")
    return {"format": "ccsim-workload/1", "name": f"random{seed}", "ranks": ranks,
            "ops": ops, "groups": groups}  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_run_alike(seed):
    """Random workloads (several streams, collectives and sends among compute, deps
    across ranks, tied durations) on a ring of GPUs and on a DGX H100 server under
    NCCL's choices: the chained replay is the general one's to the bit."""
    workload = load_workload(_random_trace(seed))
    _same_run(workload, ring_graph(workload.ranks, 50e9, 1e-6), algorithm="ring")
    _same_run(workload, load_topology("dgx-h100", 1))


def test_random_workloads_with_a_straggler_run_alike():
    """A compute scale that depends on the start time (a GPU slowed after 2 ms): the
    chained path asks for it at the same times."""

    def scale(rank: int, index: int, now: float) -> float:
        return 1.5 if rank == 1 and now >= 2e-3 else 1.0

    for seed in range(4):
        workload = load_workload(_random_trace(seed))
        _same_run(workload, ring_graph(workload.ranks, 50e9, 1e-6), algorithm="ring",
                  compute_scale=scale)  # fmt: skip


def test_comm_slowdown_keeps_the_general_path():
    """Where communication slows compute, a compute op's end can move: no chaining."""
    workload = load_workload(_random_trace(0))
    replay = WorkloadReplay(workload, ring_graph(workload.ranks, 50e9), comm_slowdown=0.2)
    assert not replay._chained
    assert WorkloadReplay(workload, ring_graph(workload.ranks, 50e9))._chained


@pytest.mark.parametrize(
    "options",
    [
        {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8},
        {"tp": 2, "pp": 2, "dp": 1, "virtual_stages": 2, "global_batch": 8},
        {"tp": 1, "pp": 4, "dp": 2, "global_batch": 16, "recompute": "selective"},
    ],
)
def test_pipeline_steps_run_alike(options):
    """Megatron steps of Llama 3 8B with 1F1B and interleaved pipelines on one or two
    DGX H100 servers: every op's times, the links and the breakdown are the general
    path's, and the chained path did start ops from their predecessor's end."""
    workload = megatron(model="llama3-8b", micro_batch=1, **options)
    graph = load_topology("dgx-h100", max(1, workload.ranks // 8))
    _same_run(workload, graph)
    replay = WorkloadReplay(workload, graph)
    finished = _finished(replay)
    replay.run()
    assert len(finished) < len(workload.ops)  # some compute ops started from the last


@pytest.mark.parametrize("chained", [True, False])
def test_an_op_waits_for_its_stream_and_each_of_its_deps_however_listed(chained):
    """Hand-worked timeline (durations 1, 2, 3 ms: sums exact enough to compare with
    ``==`` after the same additions). Rank 0's "main" stream runs c0 (1 ms), then c1,
    which depends on c0 (also its stream predecessor) and twice on s0 (3 ms, on the
    "side" stream): c1 is issued when s0 ends, at 3 ms, not at c0's end nor after s0's
    first listing; c2, which waits for its stream only, follows c1 at 5 ms. s1 waits
    for c0 (done at 1 ms) and for s0 before it on "side": issued at 3 ms too, before
    c1 (an op's end issues the next op on its stream first, then its dependants)."""
    ms = 1e-3
    ops = [
        {"id": "c0", "rank": 0, "kind": "compute", "duration": 1 * ms, "stream": "main"},
        {"id": "s0", "rank": 0, "kind": "compute", "duration": 3 * ms, "stream": "side"},
        {"id": "c1", "rank": 0, "kind": "compute", "duration": 2 * ms, "stream": "main",
         "deps": ["c0", "s0", "s0"]},
        {"id": "c2", "rank": 0, "kind": "compute", "duration": 1 * ms, "stream": "main"},
        {"id": "s1", "rank": 0, "kind": "compute", "duration": 1 * ms, "stream": "side",
         "deps": ["c0"]},
    ]  # fmt: skip
    workload = load_workload({"format": "ccsim-workload/1", "name": "waits", "ranks": 1,
                              "ops": ops})  # fmt: skip
    replay = WorkloadReplay(workload, ring_graph(2, 100e9, 0.0), chained=chained)
    issued: list[str] = []
    general = replay._start_compute

    def start(op) -> None:
        issued.append(op.id)
        general(op)

    replay._start_compute = start  # type: ignore[method-assign]
    run = replay.run()
    assert run.records.issue_s.tolist() == [0.0, 0.0, 3 * ms, 3 * ms + 2 * ms, 3 * ms]
    assert run.records.end_s.tolist() == [
        1 * ms, 3 * ms, 3 * ms + 2 * ms, (3 * ms + 2 * ms) + 1 * ms, 3 * ms + 1 * ms,
    ]  # fmt: skip
    # At 3 ms s0's end issues its stream's next (s1) before its dependants (c1).
    assert issued == ["c0", "s0", "s1", "c1", "c2"]
