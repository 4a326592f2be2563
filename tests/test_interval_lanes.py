"""interval_lanes and Timeline.lanes: each interval, taken in order, goes to the lowest
lane whose last interval has ended by its start (an end equal to the start counts as
ended), a new lane when none has. Checked against hand-worked cases, against that rule
written out directly (every lane scanned for every interval), and against the most
intervals open at one time (a sweep), which greedy partitioning in start order meets.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import CcsimError
from simulator.viz.records import Timeline, interval_lanes


def reference_lanes(start: list[float], end: list[float]) -> tuple[list[int], int]:
    """The documented rule, literally: the lowest lane whose last end <= start."""
    last_end: list[float] = []
    lanes = []
    for a, b in zip(start, end, strict=True):
        free = [k for k, e in enumerate(last_end) if e <= a]
        k = min(free) if free else len(last_end)
        if k == len(last_end):
            last_end.append(b)
        last_end[k] = b
        lanes.append(k)
    return lanes, len(last_end)


def most_open(start: np.ndarray, end: np.ndarray) -> int:
    """Lanes needed by intervals in (start, end) order, by a sweep over the times.

    At each time t, after the intervals ending at t close: a zero-length interval at t
    needs one lane beyond those still open (it comes before the longer intervals starting
    at t, and they may then reuse its lane); then the intervals starting at t open.
    """
    times = np.unique(np.concatenate([start, end]))
    best = 0
    for t in times:
        open_now = int(np.sum((start < t) & (end > t)))
        if np.any((start == t) & (end == t)):
            best = max(best, open_now + 1)
        best = max(best, open_now + int(np.sum((start == t) & (end > t))))
    return best


def test_hand_worked_overlapping_chain():
    # [0,2) lane 0; [1,3): lane 0 busy until 2 -> lane 1; [2,4): lane 0 ended at 2 -> 0;
    # [3,5): lane 0 busy until 4, lane 1 ended at 3 -> 1. Two lanes.
    lane, count = interval_lanes(np.array([0.0, 1.0, 2.0, 3.0]), np.array([2.0, 3.0, 4.0, 5.0]))
    assert lane.tolist() == [0, 1, 0, 1] and count == 2
    assert lane.dtype == np.int64


def test_hand_worked_lowest_free_lane_touching_and_zero_length():
    start = np.array([0, 0, 3, 3, 4, 5, 5, 5], dtype=float)
    end = np.array([3, 2, 9, 4, 5, 5, 6, 7], dtype=float)
    # [0,3) -> 0; [0,2) -> 1; [3,9): lanes 0 (ended 3) and 1 (ended 2) both free: the
    # lowest, 0, though 1 ended first; [3,4) -> 1; [4,5) -> 1 (touches); [5,5) -> 1
    # (zero length, touches); [5,6) -> 1 (starts as [5,5) ends); [5,7): lane 0 busy
    # until 9, lane 1 until 6 -> new lane 2.
    lane, count = interval_lanes(start, end)
    assert lane.tolist() == [0, 1, 0, 1, 1, 1, 1, 2] and count == 3


def test_timeline_orders_equal_starts_by_end():
    # Track "a" in (start, end) order: (0,1) -> 0, (0,3) -> 1, (1,2) -> 0 (lane 0 ended
    # at 1). Track "b" never overlaps: one lane.
    t = Timeline.from_spans(
        [("a", 0, 3, "x"), ("a", 0, 1, "x"), ("b", 0, 1, "x"), ("a", 1, 2, "x"), ("b", 1, 2, "x")]
    )
    lane, count = t.lanes()
    assert lane.tolist() == [1, 0, 0, 0, 0] and count.tolist() == [2, 1]


def test_empty_and_mismatched():
    lane, count = interval_lanes(np.array([]), np.array([]))
    assert lane.tolist() == [] and count == 0
    with pytest.raises(CcsimError, match="2 starts but 1 ends"):
        interval_lanes(np.array([0.0, 1.0]), np.array([1.0]))


def _random_spans(rng: np.random.Generator, n: int, tracks: int, grid: int, longest: int):
    """Integer times on a small grid (many equal starts, touching and zero-length spans)."""
    start = rng.integers(0, grid, n).astype(float)
    end = start + rng.integers(0, longest + 1, n)
    track = rng.integers(0, tracks, n)
    return start, end, track


def _timeline(start: np.ndarray, end: np.ndarray, track: np.ndarray) -> Timeline:
    names = [f"t{k}" for k in track]
    return Timeline.from_spans(zip(names, start, end, ["x"] * len(start), strict=True))


def _track_rows(t: Timeline):
    """Each track's span indices, in (start, end) order."""
    order = np.lexsort((t.end_s, t.start_s))
    return [order[t.track[order] == k] for k in range(len(t.tracks))]


@pytest.mark.parametrize("rounds_max", [4096, 50])
def test_random_against_the_rule_written_out(monkeypatch, rounds_max):
    """A few thousand spans on several tracks: Timeline.lanes (tracks all at once, or one
    by one through interval_lanes past _ROUNDS_MAX spans) and interval_lanes itself give
    each track's spans, in (start, end) order, the lanes of the rule written out."""
    monkeypatch.setattr("simulator.viz.records._ROUNDS_MAX", rounds_max)
    rng = np.random.default_rng(20240611)
    for grid, longest in ((40, 6), (400, 40), (3000, 3)):
        start, end, track = _random_spans(rng, 3000, 5, grid, longest)
        t = _timeline(start, end, track)
        lane, count = t.lanes()
        for k, rows in enumerate(_track_rows(t)):
            expected, lanes = reference_lanes(t.start_s[rows].tolist(), t.end_s[rows].tolist())
            assert lane[rows].tolist() == expected and count[k] == lanes
            got, got_count = interval_lanes(t.start_s[rows], t.end_s[rows])
            assert got.tolist() == expected and got_count == lanes


def test_random_continuous_times_and_equal_starts_in_given_order():
    """Continuous times; and equal starts left in the order given (ends not sorted):
    interval_lanes takes intervals as given."""
    rng = np.random.default_rng(5)
    start = np.sort(rng.random(2000))
    end = start + rng.exponential(0.01, 2000)
    expected = reference_lanes(start.tolist(), end.tolist())
    lane, count = interval_lanes(start, end)
    assert (lane.tolist(), count) == expected and count > 5
    start = np.sort(rng.integers(0, 100, 2000)).astype(float)
    end = start + rng.integers(0, 8, 2000)
    lane, count = interval_lanes(start, end)
    assert (lane.tolist(), count) == reference_lanes(start.tolist(), end.tolist())


def test_out_of_start_order_follows_the_rule():
    """Out of start order, a lane ended by one start may not be by the next; each interval
    still gets the lowest lane ended by its own start."""
    lane, count = interval_lanes(np.array([5.0, 0.0, 1.0]), np.array([6.0, 1.0, 2.0]))
    assert lane.tolist() == [0, 1, 1] and count == 2  # [0,1) cannot go in lane 0 (busy to 6)
    rng = np.random.default_rng(11)
    start = rng.integers(0, 50, 1000).astype(float)
    end = start + rng.integers(0, 6, 1000)
    lane, count = interval_lanes(start, end)
    assert (lane.tolist(), count) == reference_lanes(start.tolist(), end.tolist())


def test_lanes_equal_the_most_intervals_open_at_once():
    """Greedy partitioning in (start, end) order uses as many lanes as the sweep's most
    intervals open at one time, and no two spans of a lane overlap."""
    rng = np.random.default_rng(3)
    for grid, longest in ((30, 5), (200, 30), (50, 0)):
        start, end, track = _random_spans(rng, 1500, 4, grid, longest)
        t = _timeline(start, end, track)
        lane, count = t.lanes()
        for k, rows in enumerate(_track_rows(t)):
            assert count[k] == max(most_open(t.start_s[rows], t.end_s[rows]), 1)
            for j in range(count[k]):  # within a lane, in order: each starts after the last ends
                mine = rows[lane[rows] == j]
                assert np.all(t.start_s[mine][1:] >= t.end_s[mine][:-1])
