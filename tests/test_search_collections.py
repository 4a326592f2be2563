"""``ccsim search`` simulates each candidate with Python's cyclic collector paused
(:func:`~simulator.sweep.point.simulate_workload_point`): the same rows, bit for bit,
as with the collector running as CPython sets it, and the collector as it was after."""

from __future__ import annotations

import contextlib
import gc

import pytest

import simulator.workload as workload_package
from simulator.search import search
from simulator.workload import collection

#: A search small enough for a test: Llama 3 8B on two DGX H100, three candidates.
TINY = dict(
    nodes=2,
    global_batch=16,
    micro_batches=[1],
    recompute=["none"],
    virtual_stages=[1],
    simulate=3,
    workers=1,
    progress=False,
)


def _rows() -> list[dict]:
    found = search("llama3-8b", "dgx-h100", **TINY)
    assert len(found.rows) == 3 and all(r["status"] == "ok" for r in found.rows)
    return found.rows


def test_the_rows_are_the_same_with_the_collector_running(monkeypatch):
    """The reference: every point run with the collector on, at CPython's default
    thresholds, collecting as it allocates (nothing paused)."""
    paused = _rows()
    monkeypatch.setattr(collection, "collections_paused", contextlib.nullcontext)
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's defaults, whatever the process runs with
    try:
        assert gc.isenabled()
        running = _rows()
    finally:
        gc.set_threshold(*before)
    assert running == paused  # labels, order and every float to the bit


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_in_each_point_and_as_it_was_after(monkeypatch, enabled):
    seen: list[bool] = []
    breakdown = workload_package.breakdown

    def spy(run):  # the point reads its result here, its replay still alive
        seen.append(gc.isenabled())
        return breakdown(run)

    monkeypatch.setattr(workload_package, "breakdown", spy)
    was, thresholds = gc.isenabled(), gc.get_threshold()
    (gc.enable if enabled else gc.disable)()
    try:
        _rows()
        assert gc.isenabled() is enabled
        assert gc.get_threshold() == thresholds
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False, False]


def test_a_sweeps_workload_point_is_the_same_and_leaves_the_collector_on(monkeypatch):
    """A sweep's workload point (``run_point``) runs paused too: the same row as with
    the collector running at CPython's defaults, and the collector on after."""
    from simulator.sweep.point import run_point

    params = {
        "kind": "workload",
        "workload": {
            "generator": "megatron",
            "model": "llama3-8b",
            "global_batch": 16,
            "tp": 4,
            "pp": 2,
            "dp": 2,
            "micro_batch": 1,
        },
        "topology": {"name": "dgx-h100"},
        "nodes": 2,
        "algorithm": "library",
    }
    before = gc.get_threshold()
    assert gc.isenabled()
    paused = run_point(params)
    assert paused["status"] == "ok" and gc.isenabled() and gc.get_threshold() == before
    monkeypatch.setattr(collection, "collections_paused", contextlib.nullcontext)
    gc.set_threshold(700, 10, 10)
    try:
        running = run_point(params)
    finally:
        gc.set_threshold(*before)
    assert running == paused
