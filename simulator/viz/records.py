"""Timeline records: the plain data every plot and trace writer draws from.

A timeline is what happened on which track and when, independent of what produced it
(a collective replay today, a workload replay later):

* :class:`Span` — one interval of activity on a track: ``(track, start_s, end_s, kind,
  label, args)``. ``track`` names a row (a GPU stream such as ``"rank 3"``, a link),
  ``kind`` picks the colour (``"reduce"``, ``"copy"``, ``"compute"``...), ``label`` is the
  text a trace viewer shows, ``args`` extra numbers (bytes, bandwidth) shown on click.
* :class:`Track` — a row's metadata: the ``group`` it belongs to (a server: one process
  in Perfetto), the ``section`` of the plot it goes in (``"streams"`` or ``"links"``)
  and the ``category`` rows are merged by when there are too many to draw one by one.
* :class:`Counter` — a value over time on a track, as a step function (link
  utilisation, a queue length): ``value[i]`` holds from ``time_s[i]`` until
  ``time_s[i + 1]``.
* :class:`Phase` — a named stretch of time (reduce-scatter, all-gather; forward,
  backward) drawn as a labelled band.

:class:`Timeline` holds spans as columns (numpy arrays; strings as codes into a list),
so a million transfers cost a few arrays rather than a million objects. Build one from
plain tuples with :meth:`Timeline.from_spans`; read it back with :meth:`Timeline.spans`.
Times are in seconds throughout; writers convert (Perfetto wants microseconds).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..errors import CcsimError

#: Plot sections, top to bottom.
SECTIONS = ("streams", "links")

#: Tracks with more spans than this get their lanes one span at a time (in Python);
#: the others all together, a round per position in their track (numpy).
_ROUNDS_MAX = 4096


class Span(NamedTuple):
    """One interval of activity on a track (times in seconds)."""

    track: str
    start_s: float
    end_s: float
    kind: str
    label: str = ""
    args: Mapping[str, Any] | None = None


class Track(NamedTuple):
    """A row of the timeline.

    ``group`` is the machine it belongs to (a Perfetto process; ``""`` for none),
    ``section`` one of :data:`SECTIONS`, ``category`` what rows merge into when a plot
    has too many (``""``: the track's own name), ``rank`` the rank whose row it is (a
    GPU's stream; a link out of or into a GPU), None for rows of no rank (links between
    switches), so that a trace can keep a few ranks only.
    """

    name: str
    group: str = ""
    section: str = "streams"
    category: str = ""
    rank: int | None = None


class Counter(NamedTuple):
    """A step function on a track: ``value[i]`` from ``time_s[i]`` to ``time_s[i + 1]``.

    ``unit`` names the value (``"fraction"`` for utilisation: 0 to 1).
    """

    track: str
    time_s: np.ndarray
    value: np.ndarray
    unit: str = "fraction"


class Phase(NamedTuple):
    """A named stretch of time, e.g. the reduce-scatter half of a ring all-reduce."""

    name: str
    start_s: float
    end_s: float


@dataclass
class Timeline:
    """Spans in columns, with their tracks, counters and phases.

    Span ``i`` is on ``tracks[track[i]]``, from ``start_s[i]`` to ``end_s[i]``, of kind
    ``kinds[kind[i]]`` with label ``labels[label[i]]``; ``args[key][i]`` are its extra
    values (NaN or None where a span has none). Build with :meth:`from_spans` unless you
    already hold columns.

    Examples
    --------
    >>> t = Timeline.from_spans([("rank 0", 0.0, 1e-6, "copy", "step 0", {"bytes": 100})])
    >>> [s.track for s in t.spans()], t.end_s.tolist(), t.args["bytes"].tolist()
    (['rank 0'], [1e-06], [100])
    """

    tracks: list[Track]
    track: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    kinds: list[str]
    kind: np.ndarray
    labels: list[str]
    label: np.ndarray
    args: dict[str, np.ndarray] = field(default_factory=dict)
    counters: list[Counter] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    title: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.start_s)
        self.track = np.asarray(self.track, dtype=np.int64)
        self.start_s = np.asarray(self.start_s, dtype=float)
        self.end_s = np.asarray(self.end_s, dtype=float)
        self.kind = np.asarray(self.kind, dtype=np.int64)
        self.label = np.asarray(self.label, dtype=np.int64)
        for name in ("track", "end_s", "kind", "label"):
            if len(getattr(self, name)) != n:
                raise CcsimError(
                    f"timeline column {name!r} has {len(getattr(self, name))} "
                    f"entries; expected one per span ({n})"
                )
        for key, column in self.args.items():
            if len(column) != n:
                raise CcsimError(f"timeline args[{key!r}] has {len(column)} entries; expected {n}")
        if n and (self.track.min() < 0 or self.track.max() >= len(self.tracks)):
            raise CcsimError("timeline span names a track index outside 'tracks'")
        bad = np.flatnonzero(~(self.end_s >= self.start_s))
        if len(bad):
            raise CcsimError(
                f"timeline span {bad[0]} on {self.tracks[self.track[bad[0]]].name!r} ends "
                f"before it starts ({self.start_s[bad[0]]} s > {self.end_s[bad[0]]} s)"
            )
        for track in self.tracks:
            if track.section not in SECTIONS:
                raise CcsimError(
                    f"track {track.name!r} has section {track.section!r}; use one of "
                    + ", ".join(SECTIONS)
                )
        known = {track.name for track in self.tracks}
        for counter in self.counters:
            if counter.track not in known:
                raise CcsimError(f"counter on unknown track {counter.track!r}; add it to tracks")

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_spans(
        cls,
        spans: Iterable[Span | Sequence[Any]],
        *,
        tracks: Sequence[Track | str] = (),
        counters: Sequence[Counter] = (),
        phases: Sequence[Phase] = (),
        title: str = "",
        meta: Mapping[str, Any] | None = None,
    ) -> Timeline:
        """A timeline from plain records ``(track, start_s, end_s, kind, label, args)``.

        ``label`` and ``args`` may be left out. Tracks not listed in ``tracks`` are added
        in order of first appearance (group ``""``, section ``"streams"``).
        """
        spans = [Span(*record) for record in spans]
        track_list = [Track(t) if isinstance(t, str) else Track(*t) for t in tracks]
        index = {t.name: i for i, t in enumerate(track_list)}
        for span in spans:
            if span.track not in index:
                index[span.track] = len(track_list)
                track_list.append(Track(span.track))
        for counter in counters:
            if counter.track not in index:
                index[counter.track] = len(track_list)
                track_list.append(Track(counter.track, section="links"))
        kinds: dict[str, int] = {}
        labels: dict[str, int] = {}
        keys: dict[str, None] = {}
        for span in spans:
            kinds.setdefault(span.kind, len(kinds))
            labels.setdefault(span.label, len(labels))
            keys.update(dict.fromkeys(span.args or ()))
        args = {}
        for key in keys:
            values = [None if not s.args or key not in s.args else s.args[key] for s in spans]
            column = np.array(values, dtype=object)
            if all(
                isinstance(v, int | float | np.number) and not isinstance(v, bool) for v in values
            ):
                column = np.array(values)
            args[key] = column
        return cls(
            tracks=track_list,
            track=np.array([index[s.track] for s in spans], dtype=np.int64),
            start_s=np.array([s.start_s for s in spans], dtype=float),
            end_s=np.array([s.end_s for s in spans], dtype=float),
            kinds=list(kinds),
            kind=np.array([kinds[s.kind] for s in spans], dtype=np.int64),
            labels=list(labels),
            label=np.array([labels[s.label] for s in spans], dtype=np.int64),
            args=args,
            counters=list(counters),
            phases=[Phase(*p) for p in phases],
            title=title,
            meta=dict(meta or {}),
        )

    # -- reading ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.start_s)

    def span_args(self, i: int) -> dict[str, Any]:
        """The args of span ``i`` as plain Python values (absent ones left out)."""
        return next(self.iter_args([i]))

    def iter_args(self, indices: Sequence[int] | np.ndarray) -> Iterator[dict[str, Any]]:
        """The args of each span in ``indices`` as plain Python values.

        Values that are None or NaN are left out; floats holding whole numbers (byte
        counts, ranks stored in float columns) come out as ints.
        """
        indices = np.asarray(indices, dtype=np.int64)
        columns = [(key, column[indices].tolist()) for key, column in self.args.items()]
        for position in range(len(indices)):
            out = {}
            for key, values in columns:
                value = values[position]
                if value is None or value != value:  # None or NaN
                    continue
                if type(value) is float and value.is_integer() and abs(value) < 2**53:
                    value = int(value)
                out[key] = value
            yield out

    def spans(self) -> Iterator[Span]:
        """The spans as :class:`Span` records, in storage order."""
        for i in range(len(self)):
            yield Span(
                self.tracks[self.track[i]].name,
                float(self.start_s[i]),
                float(self.end_s[i]),
                self.kinds[self.kind[i]],
                self.labels[self.label[i]],
                self.span_args(i),
            )

    def lanes(self) -> tuple[np.ndarray, np.ndarray]:
        """Lanes that keep the spans of each track from overlapping.

        Returns ``(lane, count)``: span ``i`` goes in lane ``lane[i]`` of its track, and
        track ``t`` needs ``count[t]`` lanes (1 when its spans follow one another, the
        usual case; a span may start exactly when the one before it ends). Trace viewers
        need this (slices of one thread must nest), and so do Gantt rows. Each track is
        partitioned as :func:`interval_lanes` does, in (start, end) order.

        >>> t = Timeline.from_spans([("a", 0, 2, "x"), ("a", 1, 3, "x"), ("a", 2, 4, "x"),
        ...                          ("b", 0, 1, "x"), ("b", 1, 2, "x")])
        >>> [k.tolist() for k in t.lanes()]
        [[0, 1, 0, 0, 0], [2, 1]]
        """
        n = len(self)
        lane = np.zeros(n, dtype=np.int64)
        count = np.ones(len(self.tracks), dtype=np.int64)
        if n == 0:
            return lane, count
        order = np.lexsort((self.end_s, self.start_s, self.track))
        track, start, end = self.track[order], self.start_s[order], self.end_s[order]
        # A span that starts before an earlier span of its track has ended: the running
        # maximum of the ends within each track, on integer keys (track-major, so that
        # the maximum starts afresh at each track). start < end exactly when the number
        # of ends <= start is at most the number of ends < end.
        ends = np.sort(end)
        key_start = track * (n + 1) + np.searchsorted(ends, start, side="right")
        latest_end = np.maximum.accumulate(track * (n + 1) + np.searchsorted(ends, end))
        overlaps = np.zeros(n, dtype=bool)
        overlaps[1:] = (track[1:] == track[:-1]) & (key_start[1:] <= latest_end[:-1])
        busy = np.unique(track[overlaps])
        if len(busy) == 0:
            return lane, count
        first = np.searchsorted(track, np.arange(len(self.tracks) + 1))
        sizes = first[busy + 1] - first[busy]
        in_order = np.zeros(n, dtype=np.int64)
        # Tracks with many spans one by one; the others together, their k-th spans at once.
        for t in busy[sizes > _ROUNDS_MAX].tolist():
            rows = slice(first[t], first[t + 1])
            in_order[rows], count[t] = interval_lanes(start[rows], end[rows])
        together = busy[sizes <= _ROUNDS_MAX]
        if len(together):
            row_of = np.full(len(self.tracks), -1, dtype=np.int64)
            row_of[together] = np.arange(len(together))
            rows = np.flatnonzero(row_of[track] >= 0)  # whole tracks, one after another
            in_order[rows] = _lanes_together(
                row_of[track[rows]], rows - first[track[rows]], start[rows], end[rows]
            )
            # The lanes of a track: its largest lane + 1 (its rows are contiguous).
            heads = np.flatnonzero(np.diff(track[rows], prepend=-1))
            count[together] = np.maximum.reduceat(in_order[rows], heads) + 1
        lane[order] = in_order
        return lane, count

    def phase_lanes(self) -> tuple[np.ndarray, int]:
        """Lanes that keep phases from overlapping (a pipelined all-reduce's reduce and
        copy phases do): ``(lane, count)`` as :func:`interval_lanes`, in phase order.

        >>> t = Timeline.from_spans([], phases=[("reduce", 0, 2), ("copy", 1, 3), ("x", 2, 4)])
        >>> [int(k) for k in t.phase_lanes()[0]], t.phase_lanes()[1]
        ([0, 1, 0], 2)
        """
        start = np.array([p.start_s for p in self.phases], dtype=float)
        end = np.array([p.end_s for p in self.phases], dtype=float)
        order = np.lexsort((end, start))
        lane = np.zeros(len(order), dtype=np.int64)
        lane[order], count = interval_lanes(start[order], end[order])
        return lane, count

    def restrict(self, spans: np.ndarray, counters: Sequence[bool], *, phases: bool) -> Timeline:
        """The timeline with only the spans and counters marked True (boolean masks), and
        its phases if ``phases``. Tracks left with neither spans nor counters are dropped;
        the others keep their order.

        >>> t = Timeline.from_spans([("a", 0, 1, "copy"), ("b", 0, 1, "copy")],
        ...                         phases=[("p", 0, 1)])
        >>> part = t.restrict(np.array([False, True]), [], phases=False)
        >>> [track.name for track in part.tracks], part.track.tolist(), part.phases
        (['b'], [0], [])
        """
        spans = np.asarray(spans, dtype=bool)
        counters = [c for c, keep in zip(self.counters, counters, strict=True) if keep]
        used = np.zeros(len(self.tracks), dtype=bool)
        used[self.track[spans]] = True
        index = {track.name: t for t, track in enumerate(self.tracks)}
        used[[index[c.track] for c in counters]] = True
        new_index = np.cumsum(used) - 1
        return Timeline(
            tracks=[track for track, keep in zip(self.tracks, used, strict=True) if keep],
            track=new_index[self.track[spans]],
            start_s=self.start_s[spans],
            end_s=self.end_s[spans],
            kinds=self.kinds,
            kind=self.kind[spans],
            labels=self.labels,
            label=self.label[spans],
            args={key: column[spans] for key, column in self.args.items()},
            counters=counters,
            phases=list(self.phases) if phases else [],
            title=self.title,
            meta=self.meta,
        )

    @property
    def t_end(self) -> float:
        """Last time anything happens (0 for an empty timeline)."""
        ends = [float(self.end_s.max())] if len(self) else []
        ends += [float(c.time_s[-1]) for c in self.counters if len(c.time_s)]
        ends += [p.end_s for p in self.phases]
        return max(ends, default=0.0)

    @property
    def t_start(self) -> float:
        """First time anything happens (0 for an empty timeline)."""
        starts = [float(self.start_s.min())] if len(self) else []
        starts += [float(c.time_s[0]) for c in self.counters if len(c.time_s)]
        starts += [p.start_s for p in self.phases]
        return min(starts, default=0.0)


def interval_lanes(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, int]:
    """Lanes for intervals in start order, such that the intervals of a lane follow one
    another: each goes to the first lane whose last interval has ended (greedy interval
    partitioning, which uses as few lanes as the most intervals open at one time).

    Returns ``(lane, count)``. An interval may start exactly when the one before it ends.
    Intervals are taken in the order given (equal starts too: callers sort by (start, end));
    given out of start order, each still goes to the first lane ended by its start.

    >>> lane, count = interval_lanes(np.array([0.0, 1.0, 2.0, 3.0]), np.array([2.0, 3.0, 4.0, 5.0]))
    >>> lane.tolist(), count
    ([0, 1, 0, 1], 2)
    """
    start, end = np.asarray(start), np.asarray(end)
    if len(start) != len(end):
        raise CcsimError(f"interval_lanes got {len(start)} starts but {len(end)} ends")
    if len(start) > 1 and not np.all(start[1:] >= start[:-1]):  # out of order, or NaN
        return _first_free_scan(start.tolist(), end.tolist())
    if np.all(start[1:] >= np.maximum.accumulate(end)[:-1]):  # one after another (NaN: no)
        return np.zeros(len(start), dtype=np.int64), min(len(start), 1)
    # Starts never decrease, so a lane whose last interval has ended by one start has ended
    # by every later one: lanes move once from `busy` (a heap by end) to `free` (a heap by
    # lane), and the first free lane is free's smallest. O(n log lanes), where scanning
    # the lanes costs O(n lanes): minutes for a 131,072-rank all-reduce's 16,384 lanes.
    busy: list[tuple[float, int]] = []  # (end of its last interval, lane) of open lanes
    free: list[int] = []
    lanes: list[int] = []
    count = 0
    for a, b in zip(start.tolist(), end.tolist(), strict=True):
        while busy and busy[0][0] <= a:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            k = heapq.heappop(free)
        else:
            k, count = count, count + 1
        lanes.append(k)
        if b == b:  # an interval ending at NaN never ends (NaN <= a is False): lane kept
            heapq.heappush(busy, (b, k))
    return np.array(lanes, dtype=np.int64), count


def _first_free_scan(start: list[float], end: list[float]) -> tuple[np.ndarray, int]:
    """:func:`interval_lanes` of intervals out of start order: a lane that has ended by one
    start may not have by the next, so every lane is scanned (O(n lanes); no caller)."""
    lane = np.zeros(len(start), dtype=np.int64)
    ends: list[float] = []  # the end of each lane's last interval
    for position, (a, b) in enumerate(zip(start, end, strict=True)):
        for k, last in enumerate(ends):
            if last <= a:
                ends[k] = b
                lane[position] = k
                break
        else:
            lane[position] = len(ends)
            ends.append(b)
    return lane, len(ends)


def _lanes_together(
    row: np.ndarray, position: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """:func:`interval_lanes` of several tracks at once: span ``i`` is the
    ``position[i]``-th, in start order, of track row ``row[i]``. Round ``j``
    places the ``j``-th span of every track, each to the first lane whose last span has
    ended (unused lanes have ended at minus infinity, and come after the used ones)."""
    lane = np.zeros(len(row), dtype=np.int64)
    by_position = np.argsort(position, kind="stable")
    bounds = np.searchsorted(position[by_position], np.arange(int(position.max()) + 2))
    ends = np.full((int(row.max()) + 1, 4), -np.inf)
    for j in range(len(bounds) - 1):
        spans = by_position[bounds[j] : bounds[j + 1]]
        r = row[spans]
        free = ends[r] <= start[spans][:, None]
        if not free.any(axis=1).all():  # every lane of some track busy: add lanes
            ends = np.concatenate([ends, np.full_like(ends, -np.inf)], axis=1)
            free = ends[r] <= start[spans][:, None]
        k = free.argmax(axis=1)
        lane[spans] = k
        ends[r, k] = end[spans]
    return lane
