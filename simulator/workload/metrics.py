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
from operator import attrgetter

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
    """Compute the breakdown of a finished replay.

    Vectorized over the ops (numpy over the records, no loop per op): every interval's
    ends, keyed by rank, are sorted once; coverage counts per category (compute,
    communication, waiting for peers) between consecutive ends are prefix sums of +1/-1
    events; a union's intervals are the maximal runs of covered pieces. The figures are
    those of :func:`union`, :func:`intersect` and :func:`measure` rank by rank, summed
    in the same order (so equal to the last bit)."""
    workload, records = run.workload, run.records
    step = float(np.nanmax(records.end_s))
    ops = workload.ops
    n = len(ops)
    # A workload given by one replica (which stood for all) has the first replica's
    # ranks only: their figures are every replica's.
    ranks = range(workload.ranks) if workload.replicas is None else sorted(workload.replicas.first)
    if workload.shadows is not None:
        # One rank per TP group stood for the group (the replay checked that its shadows
        # ended with it): the masters' figures are every TP rank's, and the shadows,
        # which hold no ops, are not idle.
        ranks = [rank for rank in ranks if rank in workload.shadows.masters]
    chosen = np.asarray(list(ranks), dtype=np.int64)
    # Row of each rank (-1: a rank whose figures are not reported).
    row_of = np.full(max(workload.ranks, int(chosen.max(initial=-1)) + 1), -1, dtype=np.int64)
    row_of[chosen] = np.arange(len(chosen))
    index = np.fromiter(map(attrgetter("index"), ops), dtype=np.int64, count=n)
    rank = np.fromiter(map(attrgetter("rank"), ops), dtype=np.int64, count=n)
    compute = np.fromiter(map("compute".__eq__, map(attrgetter("kind"), ops)), dtype=bool, count=n)
    row = row_of[rank]
    issue, start, end = records.issue_s[index], records.start_s[index], records.end_s[index]
    mine = row >= 0
    is_comp, is_comm = mine & compute, mine & ~compute
    intervals = Intervals.of(
        [
            (row[is_comp], start[is_comp], end[is_comp]),
            (row[is_comm], start[is_comm], end[is_comm]),
            (row[is_comm], issue[is_comm], start[is_comm]),
        ]
    )
    rows = len(chosen)
    busy_compute, busy_comm, waiting = (intervals.covered(c) for c in range(3))
    runs = {
        "compute": intervals.runs(busy_compute),
        "comm": intervals.runs(busy_comm),
        "overlapped": intervals.runs(busy_compute & busy_comm),
        "anything": intervals.runs(busy_compute | busy_comm),
        "occupied": intervals.runs(busy_compute | busy_comm | waiting),
    }
    measured = {name: _measure_by_row(found, rows) for name, found in runs.items()}
    # Each rank's end: the last end of what ran on it (0.0 when nothing did).
    rank_end = np.zeros(rows)
    run_rows, _, run_ends = runs["anything"]
    if len(run_rows):
        # Runs are sorted by row and time: each row's last.
        last = np.flatnonzero(np.append(run_rows[1:] != run_rows[:-1], True))
        rank_end[run_rows[last]] = run_ends[last]
    table = []
    for i, rank_number in enumerate(chosen.tolist()):
        compute_s, comm_s = float(measured["compute"][i]), float(measured["comm"][i])
        overlapped = float(measured["overlapped"][i])
        anything, occupied = float(measured["anything"][i]), float(measured["occupied"][i])
        table.append(
            RankBreakdown(
                rank=rank_number,
                step_s=float(rank_end[i]),
                compute_s=compute_s,
                comm_s=comm_s,
                overlapped_s=overlapped,
                exposed_s=comm_s - overlapped,
                waiting_s=occupied - anything,
                bubble_s=step - occupied,
            )
        )
    by_kind: dict[str, float] = defaultdict(float)
    by_call: dict[str, float] = defaultdict(float)
    # Communication ops by row, then in op order (the per-rank computation's order).
    comm_at = np.flatnonzero(is_comm)
    comm_at = comm_at[np.argsort(row[comm_at], kind="stable")]
    owed = _owed(row[comm_at], start[comm_at], end[comm_at], runs["compute"])
    labels: dict[tuple, tuple[str, str]] = {}
    # Summed op by op in the order of the per-rank computation (rank, then op order).
    for k in np.flatnonzero(owed > 0.0).tolist():
        op = ops[int(comm_at[k])]
        key = (op.kind, op.group, op.op)
        label = labels.get(key)
        if label is None:
            label = labels[key] = _labels(op, workload)
        value = float(owed[k])
        by_kind[label[0]] += value
        by_call[label[1]] += value
    return Breakdown(
        step_s=step,
        ranks=table,
        exposed_by_kind={k: v / rows for k, v in sorted(by_kind.items())},
        exposed_by_call={k: v / rows for k, v in sorted(by_call.items())},
    )


def _labels(op, workload) -> tuple[str, str]:
    """The parallel dimension (``"DP"``, ``"P2P"``...) and call (``"DP all_reduce"``)
    that exposed time of a communication op counts towards."""
    kind = workload.groups[op.group].kind if op.kind == "collective" else "P2P"
    kind = kind or op.group
    return kind, f"{kind} {op.op if op.kind == 'collective' else op.kind}"


@dataclass
class Intervals:
    """Intervals of several categories on several rows (ranks), cut at their ends.

    ``times`` are the distinct ends of each row, sorted by row and then time (the
    *cuts*); piece ``k`` runs from cut ``k`` to cut ``k + 1`` when both are of one row
    (``width[k] > 0``) and is empty otherwise; ``count[c][k]`` is how many intervals of
    category ``c`` cover piece ``k``. Intervals whose end is not after their start are
    left out, as :func:`union` leaves them out.

    >>> cut = Intervals.of([(np.array([0, 0, 1]), np.array([0.0, 1.0, 2.0]),
    ...                      np.array([2.0, 3.0, 4.0]))])
    >>> cut.times.tolist(), cut.width.tolist(), cut.count[0].tolist()
    ([0.0, 1.0, 2.0, 3.0, 2.0, 4.0], [1.0, 1.0, 1.0, 0.0, 2.0, 0.0], [1, 2, 1, 0, 1, 0])
    """

    rows: np.ndarray
    times: np.ndarray
    width: np.ndarray
    count: list[np.ndarray]

    @classmethod
    def of(cls, categories: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Intervals:
        """Cut ``(row, start, end)`` arrays, one triple per category."""
        rows, times, deltas = [], [], []
        for c, (row, start, end) in enumerate(categories):
            keep = end > start  # also leaves out NaN (never ran)
            row, start, end = row[keep], start[keep], end[keep]
            m = len(row)
            delta = np.zeros((2 * m, len(categories)), dtype=np.int64)
            delta[:m, c], delta[m:, c] = 1, -1
            rows += [row, row]
            times += [start, end]
            deltas.append(delta)
        row = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        time = np.concatenate(times) if times else np.zeros(0)
        delta = np.concatenate(deltas) if deltas else np.zeros((0, 0), dtype=np.int64)
        order = np.lexsort((time, row))
        row, time, delta = row[order], time[order], delta[order]
        # One cut per distinct (row, time); its events' changes summed.
        new = np.ones(len(row), dtype=bool)
        new[1:] = (row[1:] != row[:-1]) | (time[1:] != time[:-1])
        first = np.flatnonzero(new)
        row, time = row[first], time[first]
        change = np.add.reduceat(delta, first, axis=0) if len(first) else delta
        # Each row's changes add up to 0: one running sum over all rows is each row's.
        count = np.cumsum(change, axis=0)
        width = np.zeros(len(time))
        same = row[1:] == row[:-1]
        width[:-1] = np.where(same, time[1:] - time[:-1], 0.0)
        return cls(row, time, width, [count[:, c] for c in range(len(categories))])

    def covered(self, category: int) -> np.ndarray:
        """Whether each piece is covered by some interval of ``category``."""
        return (self.count[category] > 0) & (self.width > 0)

    def runs(self, covered: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The union of the covered pieces, row by row: (row, start, end) of each
        maximal run of covered pieces, sorted by row and time (what :func:`union`
        gives)."""
        before = np.zeros(len(covered), dtype=bool)
        before[1:] = covered[:-1]
        after = np.zeros(len(covered), dtype=bool)
        after[:-1] = covered[1:]
        # A run ends where the next piece is not covered; an uncovered or empty piece
        # (the last of every row) lies between any two runs.
        starts = np.flatnonzero(covered & ~before)
        ends = np.flatnonzero(covered & ~after) + 1
        return self.rows[starts], self.times[starts], self.times[ends]


def _measure_by_row(runs: tuple[np.ndarray, np.ndarray, np.ndarray], rows: int) -> np.ndarray:
    """Total length of each row's runs, summed in time order as :func:`measure` sums
    (``np.bincount`` adds its weights in order)."""
    row, start, end = runs
    return np.bincount(row, weights=end - start, minlength=rows)


def _owed(
    row: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    compute: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> np.ndarray:
    """Exposed seconds owed to each communication op (``row``, ``start``, ``end``;
    sorted by row, then in op order) given each row's compute union (``compute``: its
    runs, sorted by row and time): :func:`_owed_on_rank` on each row's slices."""
    owed = np.zeros(len(row))
    c_row, c_start, c_end = compute
    rows = np.unique(row)
    op_bounds = np.searchsorted(row, np.append(rows, rows[-1] + 1) if len(rows) else rows)
    c_bounds = np.searchsorted(c_row, rows), np.searchsorted(c_row, rows, side="right")
    for k in range(len(rows)):
        a, b = op_bounds[k], op_bounds[k + 1]
        ca, cb = c_bounds[0][k], c_bounds[1][k]
        owed[a:b] = _owed_on_rank(start[a:b], end[a:b], c_start[ca:cb], c_end[ca:cb])
    return owed


def _owed_on_rank(
    starts: np.ndarray, ends: np.ndarray, compute_starts: np.ndarray, compute_ends: np.ndarray
) -> np.ndarray:
    """Exposed seconds owed to each communication op of one rank (``starts``,
    ``ends``), the rank's compute union being ``compute_starts``, ``compute_ends``
    (sorted, disjoint): see :func:`_attribute`.

    The op and compute boundaries cut time into pieces; a piece is exposed when no
    compute covers it, and each op in flight over it gets an equal share. Counting ops
    per piece and summing shares per op are prefix sums over the pieces (one pass, not
    one scan of the ops per piece)."""
    owed = np.zeros(len(starts))
    cuts = np.unique(
        np.concatenate([starts, ends, np.column_stack([compute_starts, compute_ends]).ravel()])
    )
    if len(cuts) < 2:
        return owed
    middle = 0.5 * (cuts[:-1] + cuts[1:])
    width = np.diff(cuts)
    exposed = width > 0
    if len(compute_starts):
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
    return total[last] - total[first]


def _attribute(comm, busy_compute, workload, by_kind, by_call) -> None:
    """Split each exposed instant of one rank equally among the ops in flight: ``comm``
    holds the rank's (start, end, op), ``busy_compute`` its compute union; each op's
    share (:func:`_owed_on_rank`) is added to its dimension and call in ``by_kind`` and
    ``by_call``. The rank-by-rank form of what :func:`breakdown` does for every rank at
    once."""
    if not comm:
        return
    owed = _owed_on_rank(
        np.array([s for s, _, _ in comm], dtype=float),
        np.array([e for _, e, _ in comm], dtype=float),
        np.array([s for s, _ in busy_compute], dtype=float),
        np.array([e for _, e in busy_compute], dtype=float),
    )
    for (_, _, op), value in zip(comm, owed.tolist(), strict=True):
        if value <= 0.0:
            continue
        kind, call = _labels(op, workload)
        by_kind[kind] += value
        by_call[call] += value
