"""Calls timed alone share one timing when what a replay reads of their schedules is
equal (simulator.workload.isolated.timing_digest): a ring reduce-scatter and all-gather
of one size without reducers are timed once, and the step is still the one that
simulates every flow; with reducers they are timed apart."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.topology import ring_graph
from simulator.workload import WorkloadReplay, parse_workload
from simulator.workload.isolated import timing_digest
from simulator.workload.metrics import breakdown

MiB = 2**20


def rs_then_ag(p: int, n: float):
    """Per rank: 1 ms of compute, then a reduce-scatter and an all-gather of ``n`` bytes
    over every rank, one after the other."""
    ops = []
    for rank in range(p):
        ops.append({"id": f"c{rank}", "rank": rank, "kind": "compute", "duration": "1ms"})
        ops.append({"id": f"rs{rank}", "rank": rank, "kind": "collective",
                    "op": "reduce_scatter", "group": "all", "bytes": n,
                    "deps": [f"c{rank}"]})  # fmt: skip
        ops.append({"id": f"ag{rank}", "rank": rank, "kind": "collective",
                    "op": "all_gather", "group": "all", "bytes": n,
                    "deps": [f"rs{rank}"]})  # fmt: skip
    return parse_workload(
        {
            "format": "ccsim-workload/1",
            "ranks": p,
            "groups": {"all": {"ranks": list(range(p))}},
            "ops": ops,
        }
    )


def assert_same_step(fast, slow):
    """Every op at the same times (to 1e-9 of the step) and the same flows counted."""
    step = float(np.nanmax(slow.records.end_s))
    for name in ("issue_s", "start_s", "end_s"):
        a, b = getattr(fast.records, name), getattr(slow.records, name)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nanmax(np.abs(a - b)) <= 1e-9 * step
    assert fast.stats.flows == slow.stats.flows


def test_a_reduce_scatter_and_an_all_gather_without_reducers_share_a_timing():
    """A 4-GPU ring of 100 GB/s, 2 us links, no reduce bandwidth: each call is p - 1
    ring steps of n / p bytes, (p - 1)(n / (p B) + alpha), whichever it is; timed once
    and replayed twice, the same step as every flow simulated."""
    p, n, bandwidth, alpha = 4, 8 * MiB, 100e9, 2e-6
    graph = ring_graph(p, bandwidth, alpha)
    workload = rs_then_ag(p, n)
    fast = WorkloadReplay(workload, graph, algorithm="ring", bundles=False).run()
    slow = WorkloadReplay(workload, graph, algorithm="ring", isolated=False).run()
    assert fast.isolated["timed"] == 1
    assert fast.isolated["replayed"] == 2
    one = (p - 1) * (n / p / bandwidth + alpha)
    assert breakdown(fast).step_s == pytest.approx(1e-3 + 2 * one, rel=1e-12)
    assert_same_step(fast, slow)


def test_with_reducers_the_reduce_scatter_is_timed_apart():
    """The same calls on GPUs that reduce at 50 GB/s: the reduce-scatter's steps wait for
    their reductions, so it is timed apart from the all-gather (two timings), and the
    step is longer than without reducers and still the flow-by-flow step."""
    p, n, bandwidth, alpha = 4, 8 * MiB, 100e9, 2e-6
    graph = ring_graph(p, bandwidth, alpha)
    workload = rs_then_ag(p, n)
    options = {"algorithm": "ring", "reduce_bandwidth": 50e9}
    fast = WorkloadReplay(workload, graph, bundles=False, **options).run()
    slow = WorkloadReplay(workload, graph, isolated=False, **options).run()
    assert fast.isolated["timed"] == 2
    one = (p - 1) * (n / p / bandwidth + alpha)
    assert breakdown(fast).step_s > 1e-3 + 2 * one * (1 + 1e-6)
    assert_same_step(fast, slow)


def test_the_digest_reads_what_a_replay_reads_and_not_the_labels():
    """Relabelled (op, algorithm, segments, steps, chunks, parameters) a schedule has the
    same digest; another byte count, dependency, channel or rank count changes it; the
    reduce flags count only where some rank reduces on a reducer."""
    rs = build_schedule("ring", "reduce_scatter", 4, 8 * MiB, chunks=2, channels=2)
    ag = build_schedule("ring", "all_gather", 4, 8 * MiB, chunks=2, channels=2)
    assert rs.reduce.any() and not ag.reduce.any()
    # The two ring calls: the same transfers after the same ops, other labels.
    assert timing_digest(rs, False) == timing_digest(ag, False)
    assert timing_digest(rs, True) != timing_digest(ag, True)
    relabelled = dataclasses.replace(
        ag,
        op="broadcast",
        algorithm="other",
        segment=ag.segment[::-1].copy(),
        step=np.zeros_like(ag.step),
        chunk=np.zeros_like(ag.chunk),
        params={"label": 1},
    )
    assert timing_digest(relabelled, False) == timing_digest(ag, False)
    for name in ("nbytes", "dep_idx", "channel"):
        changed = getattr(ag, name).copy()
        changed[-1] = changed[0] if changed[-1] != changed[0] else changed[-1] + 1
        assert timing_digest(dataclasses.replace(ag, **{name: changed}), False) != (
            timing_digest(ag, False)
        )
    assert timing_digest(dataclasses.replace(ag, ranks=5), False) != timing_digest(ag, False)
