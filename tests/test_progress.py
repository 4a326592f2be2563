"""Progress bars: silent where nobody watches, and the engines' simulated-time callback."""

import io
from itertools import pairwise

import pytest

import simulator
from simulator.algorithms import build_schedule
from simulator.collective import rank_layout, run_schedule
from simulator.viz.progress import progress_bar, simulated_time, watched
from simulator.workload import WorkloadReplay, parse_workload


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_nothing_is_printed_to_a_stream_that_is_no_terminal():
    out = io.StringIO()
    assert not watched(out)
    with progress_bar(10, desc="points", file=out, delay=0) as bar:
        bar.update(10)
    with simulated_time("all_reduce", file=out, delay=0) as report:
        assert report is None  # the engines then run without a callback
    assert out.getvalue() == ""


def test_a_terminal_sees_the_simulated_time():
    out = Terminal()
    assert watched(out)
    with simulated_time("all_reduce", file=out, delay=0) as report:
        report(0.0025)
    assert "all_reduce: simulated 2.5 ms" in out.getvalue()


def test_a_quick_run_prints_nothing_even_on_a_terminal():
    out = Terminal()
    with simulated_time("all_reduce", file=out, delay=60) as report:
        report(1e-3)
    with progress_bar(3, file=out, delay=60) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def ring(ranks=8):
    graph = simulator.ring_graph(ranks, 100e9, 1e-6)
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 8e6, chunks=2)
    return graph, schedule


def test_run_schedule_reports_increasing_simulated_times():
    graph, schedule = ring()
    seen = []
    result = run_schedule(graph, schedule, progress=seen.append)
    assert len(seen) > 10
    assert all(a < b for a, b in pairwise(seen))
    assert seen[-1] == pytest.approx(result.time_s)
    # Watching changes nothing: the same run, to the last bit.
    plain = run_schedule(graph, schedule)
    assert plain.time_s == result.time_s
    assert (plain.flows["end_s"] == result.flows["end_s"]).all()


def test_protocol_auto_reports_each_protocol_run():
    graph = simulator.load_topology("dgx-a100", 1)
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 1e6)
    seen = []
    run_schedule(graph, schedule, protocol="auto", progress=seen.append)
    restarts = sum(b < a for a, b in pairwise(seen))
    assert restarts >= 1  # one simulation per protocol, each from time zero


def test_workload_replay_reports_increasing_simulated_times():
    ops = [{"id": f"c{r}", "rank": r, "kind": "compute", "duration": "1ms"} for r in (0, 1)]
    ops += [
        {"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce", "group": "dp",
         "bytes": 1e8, "deps": [f"c{r}"]}
        for r in (0, 1)
    ]  # fmt: skip
    trace = {"format": "ccsim-workload/1", "name": "toy", "ranks": 2, "ops": ops,
             "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}}}  # fmt: skip
    graph = simulator.ring_graph(2, 100e9, 0.0)
    workload = parse_workload(trace)
    seen = []
    run = WorkloadReplay(workload, graph).run(seen.append)
    assert seen[0] == pytest.approx(1e-3)  # the compute ops end first
    assert all(a < b for a, b in pairwise(seen))
    assert seen[-1] == pytest.approx(float(run.records.end_s.max()))


def test_a_replay_run_again_says_so_on_the_bar():
    """A send that intrudes on an all-reduce replayed from its timing alone makes the
    replay run again from time zero when such calls are simulated flow by flow
    (``bundles=False``; tests/test_isolated.py): the bar says why beside the simulated
    time, and the callback keeps the engine's result unchanged."""
    from test_isolated import conflicting

    graph = simulator.load_topology("dgx-a100", 1)
    out = Terminal()
    options = {"algorithm": "ring", "bundles": False}
    with simulated_time("ccsim run", file=out, delay=0) as report:
        watched_run = WorkloadReplay(conflicting("100us"), graph, **options).run(report)
    assert watched_run.isolated["attempts"] == 2
    assert "(again: calls that were not alone after all, run flow by flow)" in out.getvalue()
    plain = WorkloadReplay(conflicting("100us"), graph, **options).run()
    assert (plain.records.end_s == watched_run.records.end_s).all()
