"""Step-time breakdown of a workload replay: where each rank's time went.

Per rank, from the op records:

* *compute busy*: time some compute op runs (union of intervals);
* *communication busy*: time some collective or transfer the rank takes part in is in
  flight (from its start, when all members have issued it, to the rank's completion);
* *overlapped*: communication busy while compute is busy;
* *exposed communication*: communication busy while compute is not, i.e. time the
  compute stream is idle and communication is the reason the step is not over;
* *waiting*: a communication op has been issued but its peers have not yet issued
  theirs, and nothing else runs;
* *bubble*: step time minus the time anything runs or the rank waits for peers: what a
  pipeline schedule leaves idle.

Compute busy, exposed communication, waiting and bubble are disjoint and add up to the
step time (overlapped communication is part of compute busy).

Exposed time is attributed to the communication ops in flight at each instant (split
equally among them) and summed per parallel dimension (the group's ``kind``: TP, PP,
DP, EP; transfers are ``P2P``) and per (kind, operation).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .engine import WorkloadRun


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted intervals covering the same time.

    >>> union([(0, 2), (1, 3), (5, 6)])
    [(0, 3), (5, 6)]
    """
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def measure(intervals: list[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return float(sum(end - start for start, end in intervals))


def intersect(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Intersection of two disjoint sorted interval lists.

    >>> intersect([(0, 3), (5, 8)], [(2, 6)])
    [(2, 3), (5, 6)]
    """
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass
class RankBreakdown:
    """Seconds spent per category on one rank (see the module docstring)."""

    rank: int
    step_s: float
    compute_s: float
    comm_s: float
    overlapped_s: float
    exposed_s: float
    waiting_s: float
    bubble_s: float


@dataclass
class Breakdown:
    """Per-rank breakdowns, the step time, and exposed communication per dimension."""

    step_s: float
    ranks: list[RankBreakdown]
    exposed_by_kind: dict[str, float] = field(default_factory=dict)
    exposed_by_call: dict[str, float] = field(default_factory=dict)

    def mean(self, name: str) -> float:
        """Mean over ranks of one field (e.g. ``"exposed_s"``)."""
        return float(np.mean([getattr(r, name) for r in self.ranks]))

    def max(self, name: str) -> float:
        """Largest value over ranks of one field."""
        return float(np.max([getattr(r, name) for r in self.ranks]))

    def step_parts(self) -> dict[str, float]:
        """The step time as disjoint parts that add up to it: means over ranks, in
        seconds, of compute busy, exposed communication per parallel dimension
        (``"exposed TP"``, ``"exposed DP"``, ``"exposed P2P"``...), waiting for peers and
        the pipeline bubble (see the module docstring).

        A stacked bar of these parts reaches the step time: waiting for peers is a part
        of its own, not hidden in a gap.

        Two ranks, compute of 3 ms and 1 ms, then a 1 ms all-reduce: rank 1 waits 2 ms.

        >>> import simulator
        >>> from simulator.workload import run_workload
        >>> ops = [{"id": f"c{r}", "rank": r, "kind": "compute", "duration": f"{3 - 2 * r}ms"}
        ...        for r in (0, 1)]
        >>> ops += [{"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce",
        ...          "group": "dp", "bytes": 1e8, "deps": [f"c{r}"]} for r in (0, 1)]
        >>> trace = {"format": "ccsim-workload/1", "name": "toy", "ranks": 2, "ops": ops,
        ...          "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}}}
        >>> graph = simulator.ring_graph(2, 100e9, 0.0)
        >>> _, result = run_workload(trace, graph, algorithm="ring")
        >>> {name: round(value * 1e3, 6) for name, value in result.step_parts().items()}
        {'compute': 2.0, 'exposed DP': 1.0, 'waiting for peers': 1.0, 'bubble': 0.0}
        >>> parts = result.step_parts()
        >>> abs(sum(parts.values()) - result.step_s) < 1e-12
        True
        """
        parts = {"compute": self.mean("compute_s")}
        parts.update({f"exposed {kind}": value for kind, value in self.exposed_by_kind.items()})
        parts["waiting for peers"] = self.mean("waiting_s")
        parts["bubble"] = self.mean("bubble_s")
        return parts

    def summary(self) -> dict[str, float]:
        """Step time and per-rank means, in seconds, plus shares of the step time."""
        row = {"step_s": self.step_s}
        for name in ("compute_s", "comm_s", "overlapped_s", "exposed_s", "waiting_s", "bubble_s"):
            row[name] = self.mean(name)
        row["exposed_share"] = row["exposed_s"] / self.step_s if self.step_s else 0.0
        row["comm_share"] = row["comm_s"] / self.step_s if self.step_s else 0.0
        return row


def breakdown(run: WorkloadRun) -> Breakdown:
    """Compute the breakdown of a finished replay."""
    workload, records = run.workload, run.records
    step = float(np.nanmax(records.end_s))
    compute: dict[int, list] = defaultdict(list)
    comm: dict[int, list] = defaultdict(list)
    waits: dict[int, list] = defaultdict(list)
    for op in workload.ops:
        start, end, issue = (
            records.start_s[op.index],
            records.end_s[op.index],
            records.issue_s[op.index],
        )
        if op.kind == "compute":
            compute[op.rank].append((start, end))
        else:
            comm[op.rank].append((start, end, op))
            waits[op.rank].append((issue, start))
    by_kind: dict[str, float] = defaultdict(float)
    by_call: dict[str, float] = defaultdict(float)
    rows = []
    # A workload given by one replica (which stood for all) has the first replica's
    # ranks only: their figures are every replica's.
    ranks = range(workload.ranks) if workload.replicas is None else sorted(workload.replicas.first)
    if workload.shadows is not None:
        # One rank per TP group stood for the group (the replay checked that its shadows
        # ended with it): the masters' figures are every TP rank's, and the shadows,
        # which hold no ops, are not idle.
        ranks = [rank for rank in ranks if rank in workload.shadows.masters]
    for rank in ranks:
        busy_compute = union(compute[rank])
        busy_comm = union([(s, e) for s, e, _ in comm[rank]])
        overlapped = measure(intersect(busy_compute, busy_comm))
        anything = union(busy_compute + busy_comm)
        waiting = union(waits[rank])
        occupied = union(anything + waiting)  # running, or waiting for peers
        idle_wait = measure(occupied) - measure(anything)
        rank_end = max((e for _, e in anything), default=0.0)
        rows.append(
            RankBreakdown(
                rank=rank,
                step_s=rank_end,
                compute_s=measure(busy_compute),
                comm_s=measure(busy_comm),
                overlapped_s=overlapped,
                exposed_s=measure(busy_comm) - overlapped,
                waiting_s=idle_wait,
                bubble_s=step - measure(occupied),
            )
        )
        _attribute(comm[rank], busy_compute, workload, by_kind, by_call)
    ranks = len(rows)
    return Breakdown(
        step_s=step,
        ranks=rows,
        exposed_by_kind={k: v / ranks for k, v in sorted(by_kind.items())},
        exposed_by_call={k: v / ranks for k, v in sorted(by_call.items())},
    )


def _attribute(comm, busy_compute, workload, by_kind, by_call) -> None:
    """Split each exposed instant of one rank equally among the ops in flight.

    The rank's op and compute boundaries cut time into pieces; a piece is exposed when no
    compute covers it, and each communication op in flight over it gets an equal share.
    Counting ops per piece and summing shares per op are prefix sums over the pieces
    (one pass, not one scan of the ops per piece)."""
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
        # busy_compute is a union: sorted, disjoint spans.
        compute_starts = np.array([s for s, _ in busy_compute])
        compute_ends = np.array([e for _, e in busy_compute])
        at = np.searchsorted(compute_starts, middle, side="right") - 1
        covered = (at >= 0) & (middle < compute_ends[np.maximum(at, 0)])
        exposed &= ~covered
    # Op i is in flight over the pieces [first[i], last[i]) (s <= middle < e).
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
