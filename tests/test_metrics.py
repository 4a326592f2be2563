"""The step-time breakdown (simulator.workload.metrics): a timeline worked by hand, and
the vectorized computation equal, to the last bit, to the per-rank one it replaced
(unions, intersections and the attribution of exposed time rank by rank)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from simulator.workload.engine import OpRecord
from simulator.workload.metrics import breakdown, intersect, measure, union
from simulator.workload.trace import Op

GROUPS = {"dp": SimpleNamespace(kind="DP"), "tp": SimpleNamespace(kind="TP")}


def fake_run(spans, ranks: int, masters=None):
    """A finished replay made of ``spans``: (rank, kind, group, issue, start, end), kind
    ``compute``, ``collective`` (an all-reduce of ``group``) or ``send``."""
    ops = [
        Op(
            i,
            f"o{i}",
            rank,
            kind,
            "s",
            op="all_reduce" if kind == "collective" else "",
            group=group,
        )
        for i, (rank, kind, group, *_) in enumerate(spans)
    ]
    times = np.array([span[3:] for span in spans], dtype=float).reshape(-1, 3)
    shadows = None if masters is None else SimpleNamespace(masters=frozenset(masters))
    workload = SimpleNamespace(ops=ops, ranks=ranks, replicas=None, shadows=shadows, groups=GROUPS)
    return SimpleNamespace(
        workload=workload, records=OpRecord(times[:, 0], times[:, 1], times[:, 2])
    )


#: Rank 0: compute [0, 2] and [1, 3] (one span [0, 3]) and [5, 6]; a DP all-reduce issued
#: at 2, started at 2.5 (its peers) and ended at 4.5; an empty TP call at 6; a send
#: issued at 6 whose peer comes at 7, ended at 8. Rank 1: compute [0, 1] and [9, 10]; a
#: TP all-reduce over [1, 2] and a DP one over [1.5, 3], both started as issued.
TIMELINE = [
    (0, "compute", "", 0.0, 0.0, 2.0),
    (0, "compute", "", 1.0, 1.0, 3.0),
    (0, "compute", "", 5.0, 5.0, 6.0),
    (0, "collective", "dp", 2.0, 2.5, 4.5),
    (0, "collective", "tp", 6.0, 6.0, 6.0),
    (0, "send", "", 6.0, 7.0, 8.0),
    (1, "compute", "", 0.0, 0.0, 1.0),
    (1, "collective", "tp", 1.0, 1.0, 2.0),
    (1, "collective", "dp", 1.5, 1.5, 3.0),
    (1, "compute", "", 9.0, 9.0, 10.0),
]


def test_a_timeline_worked_by_hand():
    """Rank 0: compute busy [0, 3] + [5, 6] = 4 s; communication [2.5, 4.5] + [7, 8]
    = 3 s (the empty call counts nothing), 0.5 s of it under compute, so 2.5 s exposed;
    running [0, 4.5], [5, 6], [7, 8] = 6.5 s; waiting for the send's peer [6, 7] = 1 s
    (the DP call's wait [2, 2.5] is under compute); bubble 10 - 7.5 = 2.5 s; it ends at
    8. Exposed: [3, 4.5] DP, [7, 8] the send. Rank 1: compute 2 s, communication [1, 3]
    = 2 s all exposed, no wait, bubble 6 s; [1, 1.5] TP alone, [1.5, 2] TP and DP half
    each, [2, 3] DP alone. Per rank (mean of 2): DP (1.5 + 1.25) / 2, TP 0.75 / 2, P2P
    1 / 2."""
    result = breakdown(fake_run(TIMELINE, ranks=2))
    assert result.step_s == 10.0
    rows = [
        (r.rank, r.step_s, r.compute_s, r.comm_s, r.overlapped_s, r.exposed_s, r.waiting_s)
        for r in result.ranks
    ]
    assert rows == [(0, 8.0, 4.0, 3.0, 0.5, 2.5, 1.0), (1, 10.0, 2.0, 2.0, 0.0, 2.0, 0.0)]
    assert [r.bubble_s for r in result.ranks] == [2.5, 6.0]
    assert result.exposed_by_kind == {"DP": 1.375, "P2P": 0.5, "TP": 0.375}
    assert result.exposed_by_call == {
        "DP all_reduce": 1.375,
        "P2P send": 0.5,
        "TP all_reduce": 0.375,
    }
    parts = result.step_parts()
    assert parts == {
        "compute": 3.0,
        "exposed DP": 1.375,
        "exposed P2P": 0.5,
        "exposed TP": 0.375,
        "waiting for peers": 0.5,
        "bubble": 4.25,
    }
    assert sum(parts.values()) == result.step_s


def test_only_the_ranks_that_stood_for_others_are_reported():
    """With rank 0 the only TP master, its figures alone make the breakdown (the step is
    still the last end of any op)."""
    result = breakdown(fake_run(TIMELINE, ranks=2, masters={0}))
    assert [r.rank for r in result.ranks] == [0]
    assert result.step_s == 10.0
    assert result.exposed_by_kind == {"DP": 1.5, "P2P": 1.0}


def attribute_before(comm, busy_compute, workload, by_kind, by_call) -> None:
    """metrics._attribute as it was before breakdown was vectorized (commit d1b5e23):
    one rank's exposed instants split equally among its ops in flight."""
    if not comm:
        return
    starts = np.array([s for s, _, _ in comm], dtype=float)
    ends = np.array([e for _, e, _ in comm], dtype=float)
    cuts = np.unique(
        np.concatenate([starts, ends, np.array([t for span in busy_compute for t in span])])
    )
    if len(cuts) < 2:
        return
    middle = 0.5 * (cuts[:-1] + cuts[1:])
    width = np.diff(cuts)
    exposed = width > 0
    if busy_compute:
        compute_starts = np.array([s for s, _ in busy_compute])
        compute_ends = np.array([e for _, e in busy_compute])
        at = np.searchsorted(compute_starts, middle, side="right") - 1
        covered = (at >= 0) & (middle < compute_ends[np.maximum(at, 0)])
        exposed &= ~covered
    first = np.searchsorted(middle, starts, side="left")
    last = np.searchsorted(middle, ends, side="left")
    count = np.zeros(len(middle) + 1, dtype=np.int64)
    np.add.at(count, first, 1)
    np.add.at(count, last, -1)
    active = np.cumsum(count[:-1])
    share = np.where(exposed & (active > 0), width / np.maximum(active, 1), 0.0)
    total = np.concatenate([[0.0], np.cumsum(share)])
    owed = total[last] - total[first]
    for (_, _, op), value in zip(comm, owed.tolist(), strict=True):
        if value <= 0.0:
            continue
        kind = workload.groups[op.group].kind if op.kind == "collective" else "P2P"
        kind = kind or op.group
        by_kind[kind] += value
        by_call[f"{kind} {op.op if op.kind == 'collective' else op.kind}"] += value


def per_rank(run):
    """The breakdown computed rank by rank with union, intersect, measure and the
    attribution before (the computation before it was vectorized), as tuples and dicts."""
    workload, records = run.workload, run.records
    step = float(np.nanmax(records.end_s))
    compute, comm, waits = defaultdict(list), defaultdict(list), defaultdict(list)
    for op in workload.ops:
        i = op.index
        start, end, issue = records.start_s[i], records.end_s[i], records.issue_s[i]
        if op.kind == "compute":
            compute[op.rank].append((start, end))
        else:
            comm[op.rank].append((start, end, op))
            waits[op.rank].append((issue, start))
    by_kind, by_call, rows = defaultdict(float), defaultdict(float), []
    for rank in range(workload.ranks):
        busy_compute = union(compute[rank])
        busy_comm = union([(s, e) for s, e, _ in comm[rank]])
        overlapped = measure(intersect(busy_compute, busy_comm))
        anything = union(busy_compute + busy_comm)
        occupied = union(anything + union(waits[rank]))
        rows.append(
            (
                rank,
                max((e for _, e in anything), default=0.0),
                measure(busy_compute),
                measure(busy_comm),
                overlapped,
                measure(busy_comm) - overlapped,
                measure(occupied) - measure(anything),
                step - measure(occupied),
            )
        )
        attribute_before(comm[rank], busy_compute, workload, by_kind, by_call)
    n = len(rows)
    return (
        step,
        rows,
        {k: v / n for k, v in sorted(by_kind.items())},
        {k: v / n for k, v in sorted(by_call.items())},
    )


@pytest.mark.parametrize("seed", range(6))
def test_equal_to_the_rank_by_rank_computation_to_the_last_bit(seed):
    """Random timelines on 5 ranks (some on a grid of 1/4 s, so that intervals touch,
    coincide and are empty; some on arbitrary floats, so that sums round): every figure
    equal, with ==, to the rank-by-rank computation."""
    rng = np.random.default_rng(seed)
    spans = []
    for _ in range(300):
        rank = int(rng.integers(0, 5))
        kind = str(rng.choice(["compute", "compute", "collective", "send"]))
        group = str(rng.choice(["dp", "tp"])) if kind == "collective" else ""
        if seed % 2:
            issue, wait, length = rng.uniform(0, 10), rng.exponential(0.3), rng.exponential(0.5)
        else:
            issue, wait, length = (float(rng.integers(0, 5)) / 4 for _ in range(3))
            issue *= 10
        if kind == "compute":
            wait = 0.0
        spans.append((rank, kind, group, issue, issue + wait, issue + wait + length))
    run = fake_run(spans, ranks=6)  # rank 5 has no op: all bubble
    step, rows, by_kind, by_call = per_rank(run)
    result = breakdown(run)
    assert result.step_s == step
    got = [
        (
            r.rank,
            r.step_s,
            r.compute_s,
            r.comm_s,
            r.overlapped_s,
            r.exposed_s,
            r.waiting_s,
            r.bubble_s,
        )
        for r in result.ranks
    ]
    assert got == rows
    assert rows[5][1:] == (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, step)
    assert result.exposed_by_kind == by_kind
    assert result.exposed_by_call == by_call
    assert list(result.exposed_by_kind) == list(by_kind)
