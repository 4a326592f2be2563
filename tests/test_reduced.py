"""Calls timed alone on their binding links (simulator.workload.reduced): every call's
timing equals the one that simulates every flow on every link (to 1e-9), calls that
differ only in links that never limit them share one run, and a dropped link that does
limit its flows is found and kept."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology import cluster_graph, load_topology
from simulator.workload import WorkloadReplay, load_workload
from simulator.workload import isolated as iso
from simulator.workload.generators import megatron
from simulator.workload.jobs import Job, run_jobs
from simulator.workload.reduced import _peak


class Compare:
    """Wraps IsolatedCalls._time_alone: each call is timed both ways (on its binding
    links and flow by flow) and the flow-by-flow timing is used; notes the largest
    differences and how many calls the reduced path settled."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.settled = 0
        self.calls = 0
        self.runs: set[int] = set()  # ids of the IsolatedCalls seen
        self.reduced_runs = 0
        self.worst = 0.0
        flows = iso.IsolatedCalls._time_flows
        compare = self

        def both(self, schedule, protocol, ranks, footprint, period, adopted=None):
            full = flows(self, schedule, protocol, ranks, footprint, period, adopted)
            compare.calls += 1
            if adopted is None and self.replicas is None and period is None:
                before = self.reduced_runs
                reduced = self._time_reduced(schedule, protocol, ranks, footprint)
                compare.reduced_runs += self.reduced_runs - before
                if reduced is not iso._UNSETTLED:
                    compare.settled += 1
                    compare.check(reduced, full, schedule.ranks)
            return full

        monkeypatch.setattr(iso.IsolatedCalls, "_time_alone", both)

    def check(self, reduced: iso.Timing, full: iso.Timing, ranks: int) -> None:
        """The same timing to 1e-9 of the call's duration: each rank's end, and per link
        its last use, bytes, busy time and flow-seconds; the same flows."""

        def ends(timing):
            out = np.full(ranks, np.nan)
            for offset, positions in timing.done:
                out[positions] = offset
            return out

        a, b = ends(reduced), ends(full)
        assert not np.isnan(a).any() and not np.isnan(b).any()
        span = float(b.max())
        self.worst = max(self.worst, float(np.abs(a - b).max()) / span)
        assert np.allclose(a, b, rtol=0, atol=1e-9 * span)
        for name, scale in (("release_s", span), ("busy_s", span), ("flow_s", span)):
            x, y = getattr(reduced, name), getattr(full, name)
            assert np.allclose(x, y, rtol=0, atol=1e-9 * scale * max(1.0, y.max() / span))
        assert np.allclose(reduced.nbytes, full.nbytes, rtol=1e-12, atol=0)
        assert (reduced.flows, reduced.represented) == (full.flows, full.represented)


def test_nccl_calls_on_a_hashed_leaf_spine_equal_every_flow(monkeypatch):
    """Two Megatron jobs (TP 8, two data-parallel replicas a server apart) scattered on
    a 2:1 leaf-spine of DGX H100 with one server a leaf and four spines: every call
    timed alone has NCCL's protocol (proxies, per-hop latencies, efficiencies) and its
    data-parallel calls cross hashed spines. Each equals its flow-by-flow timing, and
    the data-parallel groups (one per TP rank and stage) share a few runs."""
    compare = Compare(monkeypatch)
    step = megatron("llama3-8b", tp=8, pp=1, dp=2, micro_batch=1, global_batch=4)
    fabric = {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 1, "routing": "ecmp"}
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    run_jobs([Job("A", step, "scattered"), Job("B", step, "scattered")], graph)
    assert compare.settled == compare.calls > 0
    # Groups alike but for their spines: fewer runs than calls.
    assert compare.reduced_runs < compare.settled


def test_calls_on_a_fat_tree_with_ecmp_equal_every_flow(monkeypatch):
    """A pipeline-parallel Megatron step on the smallest fat-tree of four DGX H100
    (k = 6): calls and sends hashed over aggregation and core switches; each call alone
    as flow by flow."""
    compare = Compare(monkeypatch)
    step = megatron("llama3-8b", tp=8, pp=2, dp=2, micro_batch=1, global_batch=4)
    graph = load_topology("dgx-h100", 4, fabric="fat-tree")
    WorkloadReplay(step, graph).run()
    assert compare.settled == compare.calls > 0


def one_gpu_servers(count: int = 4, spines: int = 1):
    """One-GPU servers with 100 Gb/s NICs, 2 under each leaf, 2:1 leaf-spine, no
    latency."""
    server = {
        "gpus": 1,
        "nic": {"bandwidth": "100Gbps", "latency": 0, "pcie": {"bandwidth": "1TB/s", "latency": 0}},
    }
    fabric = {"type": "leaf-spine", "servers_per_leaf": 2, "oversubscription": 2,
              "spines": spines, "latency": 0}  # fmt: skip
    return cluster_graph(server, count, fabric=fabric)


def ring_step(order: list[int], nbytes: float = 64e6):
    """An all-reduce over four ranks in ring ``order``."""
    ops = [
        {"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce", "group": "g",
         "bytes": nbytes}
        for r in range(4)
    ]  # fmt: skip
    return load_workload(
        {"format": "ccsim-workload/1", "ranks": 4, "ops": ops,
         "groups": {"g": {"kind": "DP", "ranks": order}}}
    )  # fmt: skip


def test_an_uplink_two_nics_fill_is_kept_and_the_timing_holds(monkeypatch):
    """Ring 0 -> 2 -> 1 -> 3 under two leaves of two one-GPU servers, one spine: GPUs 0
    and 1 (leaf 0) both send up at once, 2 x 12.5 GB/s into leaf 0's 12.5 GB/s uplink.
    Run on the NICs alone, the check finds that uplink (and leaf 1's) over its capacity,
    keeps them and runs again: two runs for one call, and the timing of every flow."""
    compare = Compare(monkeypatch)
    run = WorkloadReplay(ring_step([0, 2, 1, 3]), one_gpu_servers(), algorithm="ring").run()
    assert compare.settled == compare.calls == 1
    assert compare.reduced_runs == 2
    # Each of the 2 (p - 1) = 6 ring steps: two flows of S/4 share each uplink.
    assert float(np.nanmax(run.records.end_s)) == pytest.approx(6 * 16e6 / 6.25e9, rel=1e-12)


def test_a_ring_that_keeps_to_its_nics_runs_once(monkeypatch):
    """Ring 0 -> 1 -> 2 -> 3: one GPU of each leaf sends up at a time, so no uplink
    carries more than one NIC's flows: one run on the NICs settles it, with the
    closed-form time 2 (p - 1) (S / p) / 12.5 GB/s."""
    compare = Compare(monkeypatch)
    run = WorkloadReplay(ring_step([0, 1, 2, 3]), one_gpu_servers(), algorithm="ring").run()
    assert compare.settled == compare.calls == 1
    assert compare.reduced_runs == 1
    assert float(np.nanmax(run.records.end_s)) == pytest.approx(6 * 16e6 / 12.5e9, rel=1e-12)


def test_peak_counts_each_anchor_once_and_touching_intervals_apart():
    capacity = np.array([10.0, 20.0, 40.0])
    # Anchor 0 twice at once counts 10; anchor 1 starts when anchor 0's end: apart.
    lo, hi, anchor = np.array([0.0, 0.5, 2.0]), np.array([2.0, 1.5, 3.0]), np.array([0, 0, 1])
    assert _peak(lo, hi, anchor, capacity) == 20.0
    # Anchor 2 overlapping anchor 0: 10 + 40.
    lo, hi, anchor = np.array([0.0, 1.0]), np.array([2.0, 3.0]), np.array([0, 2])
    assert _peak(lo, hi, anchor, capacity) == 50.0
