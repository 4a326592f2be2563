"""The runs of several jobs alone and together share their calls' footprints through the
timing store (simulator.workload.isolated.TimingStore.footprints): the run together finds
the footprints of the runs alone instead of routing each call again, and every result is
bit for bit that of runs that route every call themselves."""

from __future__ import annotations

import numpy as np

from simulator.topology import load_topology
from simulator.workload.generators import megatron
from simulator.workload.isolated import TimingStore
from simulator.workload.jobs import Job, run_jobs


class Counting(dict):
    """A footprint table that counts the look-ups it answers."""

    hits = 0

    def get(self, key, default=None):
        found = super().get(key, default)
        if found is not None:
            Counting.hits += 1
        return found


class Forgetful(dict):
    """A footprint table that keeps nothing: every call is routed again."""

    def __setitem__(self, key, value):
        pass


def run(table: dict):
    step = megatron("llama3-8b", tp=4, pp=2, dp=2, micro_batch=1, global_batch=8)
    # Two spines a leaf pair, 2:1: ECMP hashes the jobs' flows, and they meet.
    fabric = {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2}
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    store = TimingStore(graph)
    store.footprints = table
    # GPUs reduce at a finite rate: calls' footprints hold reducers, which each run's
    # network numbers as it creates them.
    jobs = [Job("A", step, "scattered"), Job("B", step, "scattered")]
    return run_jobs(jobs, graph, timings=store, reduce_bandwidth=400e9)


def test_shared_footprints_change_nothing():
    Counting.hits = 0
    shared = run(Counting())
    routed = run(Forgetful())
    # The run together found its calls' footprints in the store (the runs alone had
    # put them there: the same calls on the same GPUs).
    assert Counting.hits > 0
    assert shared.shared and max(job.slowdown for job in shared.jobs) > 1.0  # they meet
    for a, b in zip([*shared.alone, shared.together], [*routed.alone, routed.together],
                    strict=True):  # fmt: skip
        for name in ("issue_s", "start_s", "end_s"):
            assert getattr(a.records, name).tobytes() == getattr(b.records, name).tobytes()
        assert a.links == b.links  # the same links (reducers numbered alike), bytes, times
        assert a.stats == b.stats
        assert a.isolated == b.isolated
        assert "reduce" in a.links["link"]
    for a, b in zip(shared.jobs, routed.jobs, strict=True):
        assert (a.step_alone_s, a.step_together_s) == (b.step_alone_s, b.step_together_s)
    assert np.isfinite([job.step_together_s for job in shared.jobs]).all()
