"""run_jobs and Python's cycle collector (issue 34's speed): each replay is closed once
read, so that it is freed by reference counting rather than left as cyclic garbage for
a full collection to find (which walks every op alive: 2.2 s of CPU at two 1,024-GPU
jobs), and reading the figures off sets off no collection. Only memory and time may
change, never a figure (tests/test_jobs.py holds those)."""

from __future__ import annotations

import gc

import pytest
from test_jobs import MS, NIC, all_reduce_step, interleaved_pair, oversubscribed

from simulator.workload import WorkloadReplay
from simulator.workload.jobs import Job, run_jobs


@pytest.fixture
def collector_off():
    """Automatic collection off during the test, garbage kept for inspection after."""
    gc.collect()
    was, flags = gc.isenabled(), gc.get_debug()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        if was:
            gc.enable()


def test_replays_leave_no_cyclic_garbage(collector_off):
    size = 125e6
    result = interleaved_pair(size)
    # The figures are those worked by hand (as in tests/test_jobs.py): the jobs share
    # each 12.5 GB/s leaf-spine link, 11 ms alone, 21 ms together.
    for job in result.jobs:
        assert job.step_alone_s == pytest.approx(1 * MS + size / NIC, rel=1e-12)
        assert job.step_together_s == pytest.approx(1 * MS + 2 * size / NIC, rel=1e-12)
    del result
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    # No replay (nor its network) was left for the cycle collector: each was closed.
    kinds = {type(thing).__name__ for thing in gc.garbage}
    assert not any(isinstance(thing, WorkloadReplay) for thing in gc.garbage), kinds
    assert "FlowNetwork" not in kinds


def test_reading_the_figures_sets_off_no_collection():
    # Count the collections made inside run_jobs after the last replay: none while its
    # figures are read off (the replays' own garbage was freed as they were closed; a
    # collection of the oldest generation there would walk every op alive).
    seen: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.collect()
    # A collection after every allocation: without the pause, reading the figures off
    # would set off many.
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(note)
    try:
        import simulator.workload.jobs as jobs

        original = jobs._jobs_run

        def watched(*args, **kwargs):
            seen.clear()
            out = original(*args, **kwargs)
            watched.during = list(seen)
            return out

        jobs._jobs_run = watched
        try:
            run_jobs(
                [Job("A", all_reduce_step(1e6), "ranks=0,2"), Job("B", all_reduce_step(1e6))],
                oversubscribed(),
                algorithm="ring",
            )
        finally:
            jobs._jobs_run = original
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
    assert watched.during == []
