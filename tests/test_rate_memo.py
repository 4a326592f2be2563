"""Max-min problems answered from a memo (simulator.network.maxmin.RateMemo) get the
rates a fresh solve gives, to the bit, and change nothing in a replay: two jobs that meet
on a hashed leaf-spine and jobs that do not meet give every record equal with the memo
and without it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.network import maxmin
from simulator.network.maxmin import RateMemo, max_min_rates
from simulator.topology import load_topology
from simulator.workload.generators import megatron
from simulator.workload.isolated import TimingStore
from simulator.workload.jobs import Job, run_jobs


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_memo_answers_each_problem_as_a_fresh_solve(data):
    memo = RateMemo()
    problems = []
    for _ in range(data.draw(st.integers(1, 4))):
        n_links = data.draw(st.integers(1, 5))
        n_flows = data.draw(st.integers(1, 6))
        real = st.floats(0.1, 1e11, allow_nan=False, allow_infinity=False)
        capacity = np.array(data.draw(st.lists(real, min_size=n_links, max_size=n_links)))
        paths = data.draw(
            st.lists(
                st.lists(st.integers(0, n_links - 1), min_size=1, max_size=n_links, unique=True),
                min_size=n_flows,
                max_size=n_flows,
            )
        )
        inc_flow = np.array([f for f, path in enumerate(paths) for _ in path], dtype=np.int64)
        inc_link = np.array([link for path in paths for link in path], dtype=np.int64)
        weight = None
        if data.draw(st.booleans()):
            weight = np.array(data.draw(st.lists(real, min_size=len(inc_flow),
                                                 max_size=len(inc_flow))))  # fmt: skip
        problems.append((inc_flow, inc_link, n_flows, capacity, weight))
    # Each problem twice, interleaved: the second answer comes from the memo.
    for args in problems + problems:
        assert memo.rates(*args).tobytes() == max_min_rates(*args).tobytes()
    assert memo.hits >= len(problems)


def test_memo_tells_problems_apart_by_every_input():
    memo = RateMemo()
    flows, links = np.array([0, 1]), np.array([0, 0])
    assert memo.rates(flows, links, 2, np.array([10.0])).tolist() == [5.0, 5.0]
    # One capacity a bit larger, a weight, a cap, a third flow that crosses no link:
    # each a problem of its own, none answered from the memo.
    wider = np.nextafter(10.0, 20.0)
    assert memo.rates(flows, links, 2, np.array([wider])).tolist() == [wider / 2] * 2
    assert memo.rates(flows, links, 2, np.array([10.0]), np.array([3.0, 1.0])).tolist() == [
        2.5,
        2.5,
    ]
    capped = memo.rates(flows, links, 2, np.array([10.0]), None, np.array([1.0, np.inf]))
    assert capped.tolist() == [1.0, 9.0]
    assert memo.rates(flows, links, 3, np.array([10.0])).tolist() == [5.0, 5.0, np.inf]
    assert memo.hits == 0
    # Answers are read-only: a caller cannot change what the next one is told.
    with pytest.raises(ValueError):
        memo.rates(flows, links, 2, np.array([10.0]))[0] = 1.0
    assert memo.hits == 1


def test_memo_stops_learning_at_its_budget(monkeypatch):
    monkeypatch.setattr(maxmin, "MEMO_BYTES", 0)
    memo = RateMemo()
    args = (np.array([0]), np.array([0]), 1, np.array([4.0]))
    assert memo.rates(*args).tolist() == memo.rates(*args).tolist() == [4.0]
    assert memo.hits == 0


def run(placement: str, memo: bool, monkeypatch):
    # No problem learnt (a budget of 0) solves every problem afresh.
    monkeypatch.setattr(maxmin, "MEMO_BYTES", maxmin.MEMO_BYTES if memo else 0)
    step = megatron("llama3-8b", tp=4, pp=2, dp=2, micro_batch=1, global_batch=8)
    # Two spines a leaf pair, 2:1: ECMP hashes the jobs' flows.
    fabric = {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2}
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    store = TimingStore(graph)
    jobs = [Job("A", step, placement), Job("B", step, placement)]
    result = run_jobs(jobs, graph, timings=store)
    return result, store.tables()[1].rate_memo.hits


@pytest.mark.parametrize("placement", ["scattered", "rail"])
def test_memo_changes_no_record_of_jobs(placement, monkeypatch):
    remembered, hits = run(placement, True, monkeypatch)
    solved, none = run(placement, False, monkeypatch)
    assert none == 0
    if placement == "scattered":
        assert hits > 0  # the traffic repeats: problems met again
        assert max(job.slowdown for job in remembered.jobs) > 1.0  # the jobs meet
    runs = [*remembered.alone, remembered.together], [*solved.alone, solved.together]
    for a, b in zip(*runs, strict=True):
        for name in ("issue_s", "start_s", "end_s"):
            assert getattr(a.records, name).tobytes() == getattr(b.records, name).tobytes()
        assert a.links == b.links
