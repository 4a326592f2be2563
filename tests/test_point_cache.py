"""Graphs and calls' timings shared by the points one runner runs (``PointCache``,
``TimingStore``): every result equals the one found without sharing, bit for bit, and
the sharing is real (calls timed alone once for several candidates)."""

import dataclasses

import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.search import search, search_point
from simulator.search.space import Candidate
from simulator.sweep.point import PointCache, point_cache_scope, simulate_workload_point
from simulator.topology import load_topology
from simulator.workload import TimingStore, WorkloadReplay, breakdown
from simulator.workload.generators import megatron
from simulator.workload.isolated import schedule_digest


def _step(recompute: str, micro_batch: int = 1, **kwargs):
    """A Llama 3 8B step, TP 4 x PP 2 x DP 2 on two DGX H100: its pipeline and
    data-parallel calls cross servers."""
    return megatron(
        model="llama3-8b",
        tp=4,
        pp=2,
        dp=2,
        micro_batch=micro_batch,
        global_batch=16,
        recompute=recompute,
        **kwargs,
    )


def test_a_shared_store_times_each_call_once_and_changes_no_result():
    graph = load_topology("dgx-h100", nodes=2)
    alone = {}
    variants = ("none", "selective", "full")
    for recompute in variants:
        run = WorkloadReplay(_step(recompute), graph).run()
        alone[recompute] = (run, breakdown(run))
    store = TimingStore(graph)
    shared = {}
    for recompute in variants:
        run = WorkloadReplay(_step(recompute), graph, timings=store).run()
        shared[recompute] = (run, breakdown(run))
    for recompute in variants:
        (a, ba), (s, bs) = alone[recompute], shared[recompute]
        assert bs.step_s == ba.step_s  # bit for bit
        assert np.array_equal(s.records.end_s, a.records.end_s, equal_nan=True)
        assert s.stats.flows == a.stats.flows
    # Selective recomputation changes compute only: the second candidate's calls are
    # the first's, timed alone by the first (it times none of them again). Full
    # recomputation repeats the forward's calls, some beside other flows: it times
    # fewer than alone.
    first, second = shared["none"][0].isolated, shared["selective"][0].isolated
    assert first["timed"] == alone["none"][0].isolated["timed"] > 0
    assert second["timed"] == 0 and second["replayed"] == first["replayed"] > 0
    assert shared["full"][0].isolated["timed"] < alone["full"][0].isolated["timed"]


def test_a_store_of_another_graph_is_not_used():
    """A timing belongs to the graph it was found on (a signature names links only)."""
    store = TimingStore(load_topology("dgx-h100", nodes=2))
    other = load_topology("dgx-h100", nodes=2, fabric="leaf-spine")
    run = WorkloadReplay(_step("none"), other, timings=store).run()
    assert run.isolated["timed"] > 0 and store.timings == {}


def test_schedule_digest_tells_schedules_apart_by_content_only():
    a = build_schedule("ring", "all_reduce", 8, 2**20, chunks=2)
    b = build_schedule("ring", "all_reduce", 8, 2**20, chunks=2)
    assert a is not b and schedule_digest(a) == schedule_digest(b)
    assert schedule_digest(build_schedule("ring", "all_reduce", 8, 2**21, chunks=2)) != (
        schedule_digest(a)
    )
    moved = dataclasses.replace(a, dst=a.dst[::-1].copy())
    assert schedule_digest(moved) != schedule_digest(a)


def test_points_in_a_cache_scope_share_the_graph_and_equal_fresh_points():
    params = {
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
    variants = [
        {**params, "workload": {**params["workload"], "recompute": r}}
        for r in ("none", "selective", "full")
    ]
    fresh = [search_point(p) for p in variants]
    cache = PointCache()
    with point_cache_scope(cache):
        cached = [search_point(p) for p in variants]
        _, graph_a, _ = simulate_workload_point(variants[0])
        _, graph_b, _ = simulate_workload_point(variants[1])
    assert cached == fresh
    assert graph_a is graph_b and cache.misses == 1 and cache.hits == 4
    # Outside the scope nothing is shared.
    _, graph_c, _ = simulate_workload_point(variants[0])
    assert graph_c is not graph_a and cache.hits == 4


def test_a_search_ranks_the_same_with_its_workers_sharing():
    """The in-process runner shares graphs and timings among candidates; each row
    equals that candidate simulated on its own."""
    found = search(
        "llama3-8b",
        "dgx-h100",
        nodes=2,
        global_batch=16,
        simulate=3,
        micro_batches=[1],
        virtual_stages=[1],
        workers=1,
        progress=False,
    )
    assert found.ran == 3
    for row in found.rows:
        params = {
            "workload": {
                "generator": "megatron",
                "model": "llama3-8b",
                "global_batch": 16,
                # Every field a candidate has, as its row gives it.
                **{f.name: row[f.name] for f in dataclasses.fields(Candidate)},
            },
            "topology": {"name": "dgx-h100"},
            "nodes": 2,
            "algorithm": "library",
        }
        alone = search_point(params)
        assert alone["status"] == row["status"] == "ok"
        assert alone["step_s"] == row["step_s"] and alone["exposed_s"] == row["exposed_s"]


@pytest.mark.parametrize("graphs", [1, 2])
def test_the_cache_keeps_at_most_its_graphs(graphs):
    cache = PointCache(graphs=graphs)
    base = {"topology": {"name": "dgx-a100"}, "set": {}, "nodes": 1}
    first, _ = cache.graph(base)
    cache.graph({**base, "nodes": 2})
    again, _ = cache.graph(base)
    assert (again is first) == (graphs == 2)
