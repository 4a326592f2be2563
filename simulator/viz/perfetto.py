"""Chrome trace-event JSON of a :class:`~simulator.viz.records.Timeline`, for Perfetto.

Open the file at https://ui.perfetto.dev (or chrome://tracing). Layout:

* one process per track group (a server; ``"fabric"`` for links between servers), and
  a ``"phases"`` process first when the timeline has phases;
* one thread per track (a GPU stream, a link), in the timeline's order. Spans of one
  track that overlap in time go to extra threads named ``"<track> #2"``, ``#3``...,
  because trace viewers require the slices of one thread to nest; a track that would
  need more than :data:`MAX_LANES` of them (a rank sending to thousands of peers at
  once) has its overlapping spans merged instead, one slice per overlap and label with
  the count and bytes in its args (:func:`cap_lanes`). Phases that overlap
  (a pipelined all-reduce's reduce and copy phases) go to threads ``"phases #2"``... the
  same way: each slice to the first thread whose last slice has ended;
* each span is a complete event (``ph: "X"``) named by its label, with its kind as
  category, ``ts`` and ``dur`` in microseconds (the format's unit) and its args (bytes,
  bandwidth in GB/s...);
* each counter is a counter event series (``ph: "C"``) named ``"<track> utilisation"``
  with the value in percent (or ``"<track> <unit>"`` with the raw value);
* ``process_name``, ``process_sort_index``, ``thread_name`` and ``thread_sort_index``
  metadata events (``ph: "M"``) name and order everything; the first process's
  ``process_labels`` say what a reader needs to read the rows (ranks shown once for all
  ranks alike, the ranks kept, lanes merged: :data:`LABELLED_NOTES`).

What a trace holds (``detail``, the command line's ``--trace-detail``) is any of
:data:`DETAILS`: ``phases``, ``ranks`` (the GPU streams' spans), ``links`` (the links'
busy spans) and ``counters`` (link utilisation); a large collective's heat-map rows
(utilisation per server and per rail, on tracks of category :data:`HEATMAP_CATEGORY`:
:mod:`simulator.viz.heatmap`) go with ``ranks``, as what the ranks do in aggregate;
``ranks`` (``--trace-ranks``) keeps the
rows of a few ranks only (:func:`select`). A 1024-rank collective with every detail is
millions of events, most of them counters, more than the Perfetto UI opens;
:data:`DEFAULT_DETAIL` keeps it small. A path ending in ``.gz`` is written gzipped.

Events are formatted in batches from the timeline's columns and streamed to the file,
so a trace of millions of transfers never exists as one string; :func:`save_trace`
estimates the size first and warns past :data:`WARN_BYTES`. Times are rounded to 1e-6 us
(a picosecond), below what the viewers resolve, so that the text is short and
reproducible.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TextIO

import numpy as np

from ..errors import CcsimError
from ..files import write_with
from .progress import progress_bar
from .records import Timeline

#: What a trace can hold (``--trace-detail``).
DETAILS = ("phases", "ranks", "links", "counters")
#: The command line's default: phases and every rank's streams, no link rows. A 1024-rank
#: all-reduce (2 M transfers) is then about 60 MB as ``.json.gz``.
DEFAULT_DETAIL = ("phases", "ranks")
#: Category of the tracks holding heat-map rows (per server, per rail): their counters
#: are part of the ``ranks`` detail, not ``counters``, and they stay with
#: ``--trace-ranks``.
HEATMAP_CATEGORY = "heatmap"
#: Estimated file size past which :func:`save_trace` warns (Perfetto's UI struggles
#: with traces past a few hundred MB).
WARN_BYTES = 500_000_000
#: Notes of ``Timeline.meta`` shown as the first process's label (besides otherData).
LABELLED_NOTES = ("symmetry", "heatmap", "lanes")
#: Most threads a track gets for its overlapping spans (:func:`cap_lanes` merges past it).
MAX_LANES = 16
#: gzip level of ``.gz`` traces: level 1 is 2x faster than 6 and 25% larger.
GZIP_LEVEL = 1

_DIGITS = 6  # decimals of a microsecond kept in ts and dur
_BATCH = 50_000  # events formatted at once
_SAMPLE = 500  # events per sampled block when estimating the size
_dump = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=lambda v: _plain(v)
).encode

RankRanges = Sequence[tuple[int, int]]


def select(
    timeline: Timeline,
    detail: Sequence[str] | None = None,
    ranks: RankRanges | None = None,
) -> Timeline:
    """The part of ``timeline`` a trace with ``detail`` (default: every one of
    :data:`DETAILS`) and ``ranks`` (``(first, last)`` ranges, inclusive; default: every
    rank) holds. With ``ranks``, only tracks of those ranks stay (a link out of or into
    one of their GPUs counts; links between switches go), and the heat-map rows.

    >>> t = Timeline.from_spans([], tracks=[("rank 0", "", "streams", "", 0),
    ...                                     ("rank 1", "", "streams", "", 1)])
    >>> t = Timeline.from_spans([("rank 0", 0, 1, "copy"), ("rank 1", 0, 1, "copy")],
    ...                         tracks=t.tracks, phases=[("copy", 0, 1)])
    >>> part = select(t, ["ranks"], [(1, 1)])
    >>> [track.name for track in part.tracks], part.phases
    (['rank 1'], [])
    """
    detail = DETAILS if detail is None else tuple(detail)
    unknown = [name for name in detail if name not in DETAILS]
    if unknown:
        raise CcsimError(
            f"unknown trace detail {unknown[0]!r}; use a comma list of {', '.join(DETAILS)}"
        )
    if set(detail) == set(DETAILS) and ranks is None:
        return timeline
    tracks = timeline.tracks
    keep = np.ones(len(tracks), dtype=bool)
    if ranks is not None:
        rank = np.array([-1 if t.rank is None else t.rank for t in tracks], dtype=np.int64)
        keep = np.zeros(len(tracks), dtype=bool)
        for first, last in ranks:
            keep |= (rank >= first) & (rank <= last)
        if not keep.any():
            known = rank[rank >= 0]
            have = f"ranks {known.min()}-{known.max()}" if len(known) else "no ranks"
            wanted = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranks)
            raise CcsimError(f"trace ranks {wanted} name no rank of this run (it has {have})")
    # A stream's spans are "ranks", a link's "links"; heat-map rows (counters only) are
    # aggregates of every rank, kept whichever ranks are.
    shown = np.array(
        [("ranks" if t.section == "streams" else t.section) in detail for t in tracks], dtype=bool
    )
    heat = np.array([t.category == HEATMAP_CATEGORY for t in tracks], dtype=bool)
    keep |= heat
    index = {track.name: t for t, track in enumerate(tracks)}
    counters = [
        ("ranks" if heat[index[c.track]] else "counters") in detail and keep[index[c.track]]
        for c in timeline.counters
    ]
    spans = (keep & shown)[timeline.track] if len(tracks) else np.zeros(0, dtype=bool)
    return timeline.restrict(spans, counters, phases="phases" in detail)


def cap_lanes(timeline: Timeline, most: int = MAX_LANES) -> Timeline:
    """``timeline`` with no track needing more than ``most`` lanes (trace threads).

    A track whose spans overlap more than ``most`` deep (a rank of a 16,384-rank
    all-reduce sends to 2,047 peers at once: 2,048 threads) has its overlapping spans
    of the same kind and label merged into one slice each, from the first start to the
    last end, with args ``spans`` (how many) and ``bytes`` (their sum); if that is not
    enough, its overlapping spans whatever their label. Tracks within ``most`` lanes,
    and so every small trace, are left as they are. ``meta["lanes"]`` says what was
    merged.

    >>> t = Timeline.from_spans([("r", 0, 2, "copy", "step 0", {"bytes": 10}),
    ...                          ("r", 1, 3, "copy", "step 0", {"bytes": 20}),
    ...                          ("r", 3, 4, "copy", "step 1", {"bytes": 5})])
    >>> merged = cap_lanes(t, most=1)
    >>> [(s.start_s, s.end_s, s.label, s.args) for s in merged.spans()]
    [(0.0, 3.0, 'step 0', {'bytes': 30, 'spans': 2}), (3.0, 4.0, 'step 1', {'bytes': 5})]
    >>> cap_lanes(t, most=2) is t
    True
    """
    _, count = timeline.lanes()
    wide = np.flatnonzero(count > most)
    if not len(wide):
        return timeline
    merged = _merge_overlaps(timeline, np.isin(timeline.track, wide), by_label=True)
    _, count = merged.lanes()
    wider = np.flatnonzero(count > most)
    if len(wider):
        merged = _merge_overlaps(merged, np.isin(merged.track, wider), by_label=False)
    names = [timeline.tracks[t].name for t in wide[:3].tolist()]
    shown = ", ".join(names) + (f" and {len(wide) - 3} more" if len(wide) > 3 else "")
    note = (
        f"{shown}: spans overlapping more than {most} deep merged into one slice per "
        "overlap" + (" and label" if not len(wider) else "") + " (args: spans, bytes summed)"
    )
    merged.meta = {**timeline.meta, "lanes": note}
    return merged


#: Args a merged slice gives as the sum over its spans (the others it leaves out).
_SUMMED = ("bytes",)


def _merge_overlaps(timeline: Timeline, chosen: np.ndarray, *, by_label: bool) -> Timeline:
    """Merge the ``chosen`` spans that overlap on one track (and, ``by_label``, share
    kind and label) into one span each; the others stay."""
    rows = np.flatnonzero(chosen)
    label = timeline.label[rows] if by_label else np.zeros(len(rows), dtype=np.int64)
    kind = timeline.kind[rows] if by_label else np.zeros(len(rows), dtype=np.int64)
    order = rows[np.lexsort((timeline.start_s[rows], label, kind, timeline.track[rows]))]
    columns = [timeline.track[order]]
    if by_label:
        columns += [timeline.kind[order], timeline.label[order]]
    keys = list(zip(*(column.tolist() for column in columns), strict=True))
    starts, ends = timeline.start_s[order].tolist(), timeline.end_s[order].tolist()
    # Clusters: a span joins the previous cluster when it has the same key and starts
    # before the cluster's latest end.
    cluster = np.zeros(len(order), dtype=np.int64)
    latest = -math.inf
    for i in range(len(order)):
        if i and keys[i] == keys[i - 1] and starts[i] < latest:
            cluster[i] = cluster[i - 1]
            latest = max(latest, ends[i])
        else:
            cluster[i] = cluster[i - 1] + 1 if i else 0
            latest = ends[i]
    n = int(cluster[-1]) + 1 if len(order) else 0
    sizes = np.bincount(cluster, minlength=n)
    first = np.searchsorted(cluster, np.arange(n))
    start = np.minimum.reduceat(timeline.start_s[order], first) if n else np.zeros(0)
    end = np.maximum.reduceat(timeline.end_s[order], first) if n else np.zeros(0)
    head = order[first]  # the first span of each cluster gives track, kind and label
    keep = ~chosen
    args: dict[str, np.ndarray] = {}
    for key, column in timeline.args.items():
        if column.dtype.kind in "iub" or key in _SUMMED:  # numbers: float, NaN for none
            column = np.array([np.nan if v is None else float(v) for v in column.tolist()])
        mine = column[head].copy()
        if column.dtype.kind == "f":
            several = sizes > 1
            mine[several] = np.nan
            if key in _SUMMED and n:
                mine[several] = np.add.reduceat(np.nan_to_num(column[order]), first)[several]
        else:
            mine[sizes > 1] = None
        args[key] = np.concatenate([column[keep], mine])
    # How many original spans each slice stands for (a slice merged before counts its own).
    before = np.array(
        [
            np.nan if v is None else float(v)
            for v in timeline.args.get("spans", [None] * len(timeline))
        ]
    )
    weight = np.where(np.isnan(before), 1.0, before)
    total = np.add.reduceat(weight[order], first) if n else np.zeros(0)
    args["spans"] = np.concatenate([before[keep], np.where(sizes > 1, total, before[head])])
    labels = list(timeline.labels)
    new_label = timeline.label[head].copy()
    if not by_label:  # several labels in one slice: say how many spans it holds
        index = {text: i for i, text in enumerate(labels)}
        for c in np.flatnonzero(sizes > 1).tolist():
            text = f"{sizes[c]} overlapping spans"
            new_label[c] = index.setdefault(text, len(labels))
            if new_label[c] == len(labels):
                labels.append(text)
    return dataclasses.replace(
        timeline,
        track=np.concatenate([timeline.track[keep], timeline.track[head]]),
        start_s=np.concatenate([timeline.start_s[keep], start]),
        end_s=np.concatenate([timeline.end_s[keep], end]),
        kind=np.concatenate([timeline.kind[keep], timeline.kind[head]]),
        labels=labels,
        label=np.concatenate([timeline.label[keep], new_label]),
        args=args,
    )


class _Layout:
    """Process and thread ids of a timeline's rows, and the fixed text of their events."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        groups: dict[str, int] = {}
        first_pid = 2 if timeline.phases else 1
        for track in timeline.tracks:
            groups.setdefault(track.group, first_pid + len(groups))
        self.groups = groups
        self.pid_of_track = [groups[track.group] for track in timeline.tracks]
        # Spans in track order, then time order; each (track, lane) is one thread.
        n = len(timeline)
        self.order = np.lexsort((timeline.start_s, timeline.track)) if n else np.zeros(0, int)
        lane, lanes_of_track = timeline.lanes()
        has_spans = np.bincount(timeline.track, minlength=len(timeline.tracks)) > 0
        next_tid = dict.fromkeys(groups.values(), 1)
        first_head = np.zeros(len(timeline.tracks), dtype=np.int64)
        heads: list[str] = []
        self.threads: list[tuple[int, int, str]] = []
        for t, track in enumerate(timeline.tracks):
            pid = self.pid_of_track[t]
            first_head[t] = len(heads)
            for k in range(int(lanes_of_track[t]) if has_spans[t] else 0):
                tid = next_tid[pid]
                next_tid[pid] += 1
                heads.append(f'{{"ph":"X","pid":{pid},"tid":{tid},"ts":')
                self.threads.append((pid, tid, track.name if k == 0 else f"{track.name} #{k + 1}"))
        self.heads = np.array(heads, dtype=object)
        self.head_of_span = first_head[timeline.track] + lane if n else np.zeros(0, int)
        self.phase_lane, self.phase_lanes = timeline.phase_lanes()
        # The name and category of each (label, kind) that occurs: a span is named by its
        # label, or by its kind when it has none.
        kinds = len(timeline.kinds)
        pairs, self.name_of_span = np.unique(
            timeline.label * kinds + timeline.kind, return_inverse=True
        )
        names = []
        for pair in pairs.tolist():
            label, kind = timeline.labels[pair // kinds], timeline.kinds[pair % kinds]
            names.append(f',"name":{_dump(label or kind)},"cat":{_dump(kind)}')
        self.names = np.array(names, dtype=object)
        track_of = {track.name: t for t, track in enumerate(timeline.tracks)}
        self.counter_pids = [self.pid_of_track[track_of[c.track]] for c in timeline.counters]

    @property
    def events(self) -> int:
        """Events in the trace, metadata included."""
        return (
            len(self.metadata())
            + len(self.timeline.phases)
            + len(self.timeline)
            + sum(len(c.time_s) for c in self.timeline.counters)
        )

    def metadata(self) -> list[str]:
        timeline = self.timeline
        lines = []
        if timeline.phases:
            lines += [_meta("process_name", 1, None, "phases")]
            lines += [_meta("process_sort_index", 1, None, 0, key="sort_index")]
        # What a reader must know to read the rows (ranks shown once for all alike,
        # merged lanes) as the first process's label, where Perfetto shows it.
        notes = "; ".join(str(timeline.meta[k]) for k in LABELLED_NOTES if timeline.meta.get(k))
        for name, pid in self.groups.items():
            lines += [_meta("process_name", pid, None, name or "ccsim")]
            lines += [_meta("process_sort_index", pid, None, pid, key="sort_index")]
            if notes:
                lines += [_meta("process_labels", pid, None, notes, key="labels")]
                notes = ""
        threads = [
            (1, k + 1, "phases" if k == 0 else f"phases #{k + 1}") for k in range(self.phase_lanes)
        ]
        for pid, tid, name in threads + self.threads:
            lines += [_meta("thread_name", pid, tid, name)]
            lines += [_meta("thread_sort_index", pid, tid, tid, key="sort_index")]
        return lines

    def phase_lines(self) -> list[str]:
        lines = []
        for phase, lane in zip(self.timeline.phases, self.phase_lane.tolist(), strict=True):
            ts = _us(phase.start_s)
            dur = round(_us(phase.end_s) - ts, _DIGITS)
            lines.append(
                f'{{"ph":"X","pid":1,"tid":{lane + 1},"ts":{ts!r},"dur":{dur!r},'
                f'"name":{_dump(phase.name)},"cat":"phase","args":{{}}}}'
            )
        return lines

    def span_lines(self, rows: np.ndarray) -> list[str]:
        """The events of spans ``rows`` (storage indices), in that order."""
        t = self.timeline
        starts = np.round(t.start_s[rows] * 1e6, _DIGITS)
        durations = np.round(np.round(t.end_s[rows] * 1e6, _DIGITS) - starts, _DIGITS)
        names = self.names[self.name_of_span[rows]]
        # Args: each present value after a comma, but the first of its span.
        args = np.full(len(rows), "", dtype=object)
        started = np.zeros(len(rows), dtype=bool)
        for key, column in t.args.items():
            table, index = _table(column[rows], prefix=f"{_dump(key)}:")
            present = (table != "")[index]
            after = np.array([f",{text}" if text else "" for text in table.tolist()], dtype=object)
            args += np.where(started, after[index], table[index])
            started |= present
        return [
            f'{head}{ts},"dur":{dur}{name},"args":{{{arg}}}}}'
            for head, ts, dur, name, arg in zip(
                self.heads[self.head_of_span[rows]].tolist(),
                _texts(starts, whole=False).tolist(),
                _texts(durations, whole=False).tolist(),
                names.tolist(),
                args.tolist(),
                strict=True,
            )
        ]

    def counter_lines(self, c: int, first: int = 0, last: int | None = None) -> list[str]:
        """The events of counter ``c``'s samples ``first`` to ``last``."""
        counter = self.timeline.counters[c]
        if counter.unit == "fraction":
            name, key, factor = f"{counter.track} utilisation", "%", 100.0
        else:
            name, key, factor = f"{counter.track} {counter.unit}", counter.unit, 1.0
        head = f'{{"ph":"C","pid":{self.counter_pids[c]},"ts":'
        middle = f',"name":{_dump(name)},"args":{{{_dump(key)}:'
        times = np.round(np.asarray(counter.time_s[first:last], dtype=float) * 1e6, _DIGITS)
        values = np.asarray(counter.value[first:last], dtype=float) * factor
        return [
            f"{head}{ts}{middle}{value}}}}}"
            for ts, value in zip(
                _texts(times, whole=False).tolist(),
                _texts(values, whole=False).tolist(),
                strict=True,
            )
        ]

    def batches(self) -> Iterator[list[str]]:
        """Every event's text, in file order, a batch at a time."""
        yield self.metadata() + self.phase_lines()
        for first in range(0, len(self.order), _BATCH):
            yield self.span_lines(self.order[first : first + _BATCH])
        for c, counter in enumerate(self.timeline.counters):
            for first in range(0, len(counter.time_s), _BATCH):
                yield self.counter_lines(c, first, first + _BATCH)


def _estimate(layout: _Layout, *, compressed: bool) -> int:
    """Bytes the trace will take: the metadata and phases exactly, spans and counter
    samples from a few blocks of each spread over the trace (and for ``compressed``,
    gzip's ratio on those blocks)."""
    timeline = layout.timeline
    sample = layout.metadata() + layout.phase_lines()
    total = float(sum(len(line.encode()) + 2 for line in sample))
    blocks = []
    n = len(layout.order)
    if n:
        lines = []
        for first in sorted({n * k // 4 for k in range(4)}):
            lines += layout.span_lines(layout.order[first : first + _SAMPLE])
        blocks.append((lines, n))
    counters = timeline.counters
    samples = sum(len(counter.time_s) for counter in counters)
    if samples:
        lines = []
        for c in sorted({len(counters) * k // 4 for k in range(4)}):
            lines += layout.counter_lines(c, 0, _SAMPLE)
        blocks.append((lines, samples))
    for lines, count in blocks:
        if lines:
            total += count * sum(len(line.encode()) + 2 for line in lines) / len(lines)
        sample += lines
    if compressed:
        text = ",\n".join(sample).encode()
        total *= len(gzip.compress(text, GZIP_LEVEL)) / max(len(text), 1)
    return int(total)


def trace_events(
    timeline: Timeline,
    *,
    detail: Sequence[str] | None = None,
    ranks: RankRanges | None = None,
) -> Iterator[dict[str, Any]]:
    """The trace events of ``timeline`` as dicts, metadata first (see the module
    docstring; ``detail`` and ``ranks`` as :func:`select`'s). For tests and small
    timelines: files are written by :func:`save_trace` from the same text.

    Examples
    --------
    >>> t = Timeline.from_spans([("rank 0", 1e-6, 3e-6, "copy", "step 0", {"bytes": 64})])
    >>> [(e["pid"], e["tid"], e["ts"], e["dur"], e["args"]) for e in trace_events(t)
    ...  if e["ph"] == "X"]
    [(1, 1, 1.0, 2.0, {'bytes': 64})]
    """
    for batch in _Layout(cap_lanes(select(timeline, detail, ranks))).batches():
        for line in batch:
            yield json.loads(line)


def _write(
    layout: _Layout, write: Callable[[str], Any], progress: Callable[[int], Any] | None = None
) -> None:
    """Write the trace JSON object, one event per line; ``progress(n)`` after each batch
    of ``n`` events."""
    write('{"traceEvents":[\n')
    first = True
    for batch in layout.batches():
        if not batch:
            continue
        write(("" if first else ",\n") + ",\n".join(batch))
        first = False
        if progress is not None:
            progress(len(batch))
    timeline = layout.timeline
    other = {"title": timeline.title, **{k: v for k, v in timeline.meta.items() if k != "notes"}}
    write(f'\n],\n"displayTimeUnit":"ns",\n"otherData":{_dump(other)}}}\n')


def write_trace(
    timeline: Timeline,
    stream: TextIO,
    *,
    detail: Sequence[str] | None = None,
    ranks: RankRanges | None = None,
) -> None:
    """Write the trace JSON object to the text ``stream``, one event per line."""
    _write(_Layout(cap_lanes(select(timeline, detail, ranks))), stream.write)


def trace_json(timeline: Timeline, **options: Any) -> str:
    """The trace as one JSON string (for small timelines; files: :func:`save_trace`)."""
    buffer = io.StringIO()
    write_trace(timeline, buffer, **options)
    return buffer.getvalue()


def save_trace(
    timeline: Timeline,
    path: str | Path,
    *,
    detail: Sequence[str] | None = None,
    ranks: RankRanges | None = None,
    progress: bool | None = None,
) -> int:
    """Write the trace to ``path`` (gzipped if its name ends in ``.gz``); return the
    number of events.

    ``detail`` and ``ranks`` choose what it holds (:func:`select`). Before writing, the
    size is estimated; past :data:`WARN_BYTES` a warning with the estimate goes to
    stderr. Events are streamed to the file through :func:`simulator.files.write_with`
    (a regular file is replaced atomically), with a progress bar where a person watches
    (``progress``: default :func:`~simulator.viz.progress.watched`).
    """
    layout = _Layout(cap_lanes(select(timeline, detail, ranks)))
    compressed = str(path).endswith(".gz")
    events = layout.events
    estimate = _estimate(layout, compressed=compressed)
    if estimate > WARN_BYTES:
        print(
            f"ccsim: warning: the trace {str(path)!r} will be about {estimate / 1e6:,.0f} MB "
            f"({events:,} events), more than Perfetto's UI opens comfortably; keep less with "
            "--trace-detail (phases,ranks), --trace-ranks (e.g. 0-7) or a .json.gz name",
            file=sys.stderr,
        )

    def write(stream: IO[bytes]) -> None:
        with progress_bar(
            events, desc=f"writing {Path(path).name}", unit="ev", unit_scale=True, enabled=progress
        ) as bar:
            if not compressed:
                _write(layout, lambda text: stream.write(text.encode()), bar.update)
                return
            # No file name or time in the gzip header: the same trace, the same bytes.
            with gzip.GzipFile("", "wb", GZIP_LEVEL, stream, mtime=0) as packed:
                _write(layout, lambda text: packed.write(text.encode()), bar.update)

    write_with(path, write)
    return events


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, _DIGITS)


def _meta(name: str, pid: int, tid: int | None, value, *, key: str = "name") -> str:
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return _dump(event)


def _texts(values: np.ndarray, *, prefix: str = "", whole: bool = True) -> np.ndarray:
    """The JSON text of each value, after ``prefix``; ``""`` where there is none (None,
    NaN) or JSON cannot say it (infinity, as an instantaneous transfer's bandwidth).
    With ``whole``, floats holding whole numbers are written as ints (byte counts, ranks
    in float columns).

    >>> _texts(np.array([2.0, 0.5, np.nan, np.inf, 2.0]), prefix=",").tolist()
    [',2', ',0.5', '', '', ',2']
    """
    table, index = _table(values, prefix=prefix, whole=whole)
    return table[index]


def _table(
    values: np.ndarray, *, prefix: str = "", whole: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_texts` as ``(table, index)``: the text of value ``i`` is
    ``table[index[i]]``. Each distinct value is formatted once: a trace's times are a few
    thousand event times, its ranks, steps and sizes fewer, so this is what makes
    writing millions of events fast."""
    values = np.asarray(values)
    if values.dtype.kind == "O":
        table = [_text(prefix, v, whole) for v in values.tolist()]
        return np.array(table, dtype=object), np.arange(len(values))
    unique, inverse = np.unique(values, return_inverse=True)
    table = [_text(prefix, v, whole) for v in unique.tolist()]
    return np.array(table, dtype=object), inverse.reshape(-1)


def _text(prefix: str, value: Any, whole: bool) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (type(value) is float and not math.isfinite(value)):
        return ""
    if whole and type(value) is float and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return prefix + _dump(value)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to a trace")
