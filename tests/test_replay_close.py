"""A replay's memory comes back when its result has been read (WorkloadReplay.close),
without waiting for the cyclic garbage collector, and the collector's thresholds that a
point runs with are put back after it."""

from __future__ import annotations

import gc
import weakref

import pytest

from simulator.topology import load_topology
from simulator.workload import WorkloadReplay, run_workload
from simulator.workload.collection import THRESHOLDS, fewer_collections
from simulator.workload.generators import megatron


@pytest.mark.parametrize(
    "options", [{"tp": 4, "pp": 2, "dp": 2}, {"tp": 2, "pp": 2, "dp": 2, "cp": 2}]
)
def test_a_closed_replay_and_its_workload_are_freed_by_reference_counts(options):
    graph = load_topology("dgx-h100", 2)
    was = gc.isenabled()
    gc.collect()
    gc.disable()  # only reference counts free anything now
    try:
        workload = megatron(
            model="llama3-8b", micro_batch=1, global_batch=8, shadows=True, **options
        )
        replay = WorkloadReplay(workload, graph)
        run = replay.run()
        assert run.workload is workload
        replay.close()
        refs = [weakref.ref(workload), weakref.ref(replay)]
        del replay, run, workload
        assert [ref() for ref in refs] == [None, None]
    finally:
        if was:
            gc.enable()


def test_fewer_collections_puts_the_thresholds_back():
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold() == THRESHOLDS
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a point that fails")
    assert gc.get_threshold() == before


def test_run_workload_gives_the_same_step_with_fewer_collections():
    """The collector's settings change no result (the same step to the bit as a replay
    run with the defaults)."""
    graph = load_topology("dgx-h100", 2)
    options = dict(model="llama3-8b", tp=4, pp=2, dp=2, micro_batch=1, global_batch=8)
    _, tuned = run_workload(megatron(**options), graph)
    plain = WorkloadReplay(megatron(**options), graph).run()
    assert tuned.step_s == float(plain.records.end_s.max())
