"""Chrome trace-event JSON of a :class:`~simulator.viz.records.Timeline`, for Perfetto.

Open the file at https://ui.perfetto.dev (or chrome://tracing). Layout:

* one process per track group (a server; ``"fabric"`` for links between servers), and
  a ``"phases"`` process first when the timeline has phases;
* one thread per track (a GPU stream, a link), in the timeline's order. Spans of one
  track that overlap in time go to extra threads named ``"<track> #2"``, ``#3``...,
  because trace viewers require the slices of one thread to nest;
* each span is a complete event (``ph: "X"``) named by its label, with its kind as
  category, ``ts`` and ``dur`` in microseconds (the format's unit) and its args (bytes,
  bandwidth in GB/s...);
* each counter is a counter event series (``ph: "C"``) named ``"<track> utilisation"``
  with the value in percent (or ``"<track> <unit>"`` with the raw value);
* ``process_name``, ``process_sort_index``, ``thread_name`` and ``thread_sort_index``
  metadata events (``ph: "M"``) name and order everything.

Times are rounded to 1e-6 us (a picosecond), below what the viewers resolve, so that the
text is short and reproducible.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..files import atomic_open
from .records import Timeline

_DIGITS = 6  # decimals of a microsecond kept in ts and dur


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, _DIGITS)


def trace_events(timeline: Timeline) -> Iterator[dict[str, Any]]:
    """The trace events of ``timeline``, metadata first (see the module docstring).

    Examples
    --------
    >>> t = Timeline.from_spans([("rank 0", 1e-6, 3e-6, "copy", "step 0", {"bytes": 64})])
    >>> [(e["pid"], e["tid"], e["ts"], e["dur"], e["args"]) for e in trace_events(t)
    ...  if e["ph"] == "X"]
    [(1, 1, 1.0, 2.0, {'bytes': 64})]
    """
    groups: dict[str, int] = {}
    first_pid = 2 if timeline.phases else 1
    for track in timeline.tracks:
        groups.setdefault(track.group, first_pid + len(groups))

    # Thread ids: per process, one per (track, lane), in track order.
    order = np.lexsort((timeline.start_s, timeline.track)) if len(timeline) else np.zeros(0, int)
    lane, lanes_of_track = timeline.lanes()
    next_tid = dict.fromkeys(groups.values(), 1)
    tid_of: list[list[int]] = []
    threads: list[tuple[int, int, str]] = []
    for t, track in enumerate(timeline.tracks):
        pid = groups[track.group]
        tids = []
        for k in range(int(lanes_of_track[t])):
            tid = next_tid[pid]
            next_tid[pid] += 1
            tids.append(tid)
            threads.append((pid, tid, track.name if k == 0 else f"{track.name} #{k + 1}"))
        tid_of.append(tids)

    if timeline.phases:
        yield _meta("process_name", 1, None, "phases")
        yield _meta("process_sort_index", 1, None, 0, key="sort_index")
    for name, pid in groups.items():
        yield _meta("process_name", pid, None, name or "ccsim")
        yield _meta("process_sort_index", pid, None, pid, key="sort_index")
    if timeline.phases:
        yield _meta("thread_name", 1, 1, "phases")
    for pid, tid, name in threads:
        yield _meta("thread_name", pid, tid, name)
        yield _meta("thread_sort_index", pid, tid, tid, key="sort_index")

    for phase in timeline.phases:
        ts = _us(phase.start_s)
        yield {
            "ph": "X",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": round(_us(phase.end_s) - ts, _DIGITS),
            "name": phase.name,
            "cat": "phase",
            "args": {},
        }
    pid_of_track = [groups[track.group] for track in timeline.tracks]
    starts = np.round(timeline.start_s[order] * 1e6, _DIGITS)
    durations = np.round(np.round(timeline.end_s[order] * 1e6, _DIGITS) - starts, _DIGITS)
    columns = zip(
        timeline.track[order].tolist(),
        lane[order].tolist(),
        starts.tolist(),
        durations.tolist(),
        timeline.label[order].tolist(),
        timeline.kind[order].tolist(),
        timeline.iter_args(order),
        strict=True,
    )
    for t, k, ts, dur, label, kind, args in columns:
        yield {
            "ph": "X",
            "pid": pid_of_track[t],
            "tid": tid_of[t][k],
            "ts": ts,
            "dur": dur,
            "name": timeline.labels[label] or timeline.kinds[kind],
            "cat": timeline.kinds[kind],
            # JSON has no infinity (an instantaneous transfer's bandwidth): leave it out.
            "args": {key: v for key, v in args.items() if not _infinite(v)},
        }
    group_of = {track.name: track.group for track in timeline.tracks}
    for counter in timeline.counters:
        pid = groups[group_of[counter.track]]
        if counter.unit == "fraction":
            name, key, factor = f"{counter.track} utilisation", "%", 100.0
        else:
            name, key, factor = f"{counter.track} {counter.unit}", counter.unit, 1.0
        for t, v in zip(counter.time_s.tolist(), counter.value.tolist(), strict=True):
            yield {"ph": "C", "pid": pid, "ts": _us(t), "name": name, "args": {key: v * factor}}


def _infinite(value: Any) -> bool:
    return type(value) is float and (value == np.inf or value == -np.inf)


def _meta(name: str, pid: int, tid: int | None, value, *, key: str = "name") -> dict:
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def write_trace(timeline: Timeline, stream: TextIO) -> None:
    """Write the trace JSON object to ``stream``, one event per line."""
    encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=_plain).encode
    stream.write('{"traceEvents": [\n')
    first = True
    for event in trace_events(timeline):
        if not first:
            stream.write(",\n")
        stream.write(encode(event))
        first = False
    other = {"title": timeline.title, **{k: v for k, v in timeline.meta.items() if k != "notes"}}
    stream.write('\n],\n"displayTimeUnit": "ns",\n"otherData": ')
    stream.write(encode(other))
    stream.write("}\n")


def trace_json(timeline: Timeline) -> str:
    """The trace as one JSON string (for small timelines; files: :func:`save_trace`)."""
    import io

    buffer = io.StringIO()
    write_trace(timeline, buffer)
    return buffer.getvalue()


def save_trace(timeline: Timeline, path: str | Path) -> None:
    """Write the trace to ``path`` atomically (temporary file in the folder, then rename).

    Events are streamed to the file, so a trace of millions of transfers never exists
    as one string in memory.
    """
    with atomic_open(path, "w", encoding="utf-8") as stream:
        write_trace(timeline, stream)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to a trace")
