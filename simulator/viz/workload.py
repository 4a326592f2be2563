"""A workload replay as a :class:`~simulator.viz.records.Timeline`.

Rows (tracks): one per stream of each rank, ``"rank r <stream>"`` — the rank's
``compute`` stream first, then its communication streams in the order the trace first
names them. A track belongs to the rank's server (``"server s"``, one Perfetto process
each; rank r runs on the topology's rank r). When a plot has too many rows, tracks merge
by category ``"server s <stream>"`` (ranks of a server that run the same stream, e.g. the
8 tensor-parallel ranks of a Megatron stage, usually move in lockstep) and, beyond that,
:func:`workload_figure` bins servers stream by stream.

Spans, one per op from ``start_s`` to ``end_s``, coloured by kind:

* ``"compute"``;
* ``"<dim> collective"`` with ``<dim>`` the group's parallel dimension (TP, PP, DP, EP,
  or the group's ``kind`` as written; ``"collective"`` when the group has none);
* ``"send"`` and ``"recv"``;
* ``"waiting"``: a communication op issued but not started because its peers have
  not issued theirs yet (``issue_s`` to ``start_s``), on the op's own stream.

Kinds are listed in the fixed order :data:`KINDS` (others after them), so that a kind
gets the same colour in every workload's picture. Args: the op's ``id``, ``bytes``,
``group``, collective ``op`` and ``peer`` where they apply, ``flops`` of compute ops
timed by the device model. A workload has no phases worth drawing: 1F1B warm-up and
drain are visible as the spans themselves.

Examples
--------
>>> import simulator
>>> from simulator.workload import run_workload
>>> ops = [{"id": f"c{r}", "rank": r, "kind": "compute", "duration": "1ms"} for r in (0, 1)]
>>> ops += [{"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce",
...          "group": "dp", "bytes": 1e8, "deps": [f"c{r}"]} for r in (0, 1)]
>>> trace = {"format": "ccsim-workload/1", "name": "toy", "ranks": 2, "ops": ops,
...          "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}}}
>>> graph = simulator.ring_graph(2, 100e9, 0.0)
>>> run, _ = run_workload(trace, graph, algorithm="ring")
>>> t = workload_timeline(run, graph)
>>> [track.name for track in t.tracks]
['rank 0 compute', 'rank 0 comm', 'rank 1 compute', 'rank 1 comm']
>>> [(s.track, s.kind, round(s.start_s * 1e3, 6), round(s.end_s * 1e3, 6))
...  for s in t.spans() if s.track.startswith("rank 0")]
[('rank 0 compute', 'compute', 0.0, 1.0), ('rank 0 comm', 'DP collective', 1.0, 2.0)]
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

from ..network.faults import fault_plan, rank_marks
from ..topology.graph import gpu_nodes
from ..workload.engine import WorkloadRun
from ..workload.trace import Op, Workload
from .collective import _time_text
from .records import Timeline, Track

if TYPE_CHECKING:  # matplotlib is imported only when a figure is drawn
    from matplotlib.figure import Figure

#: Span kinds in colour order: :func:`~simulator.viz.timeline.kind_colors` gives
#: ``compute`` its fixed colour and the rest palette colours in this order, so the
#: order is what keeps TP pink and DP gold in every workload's picture.
KINDS = (
    "compute",
    "TP collective",
    "PP collective",
    "DP collective",
    "EP collective",
    "waiting",
    "send",
    "recv",
)

#: Ranks per category when the topology names no servers (a plot row per block).
RANK_BLOCK = 8

#: Stream rows' header in :func:`workload_figure`, replacing timeline.py's (which
#: describes a collective's transfers).
STREAMS_HEADER = "GPU streams: ops by kind (waiting = issued, peers not ready yet)"


def workload_title(run: WorkloadRun, graph: nx.Graph | None = None) -> str:
    """One-line description used as plot title: workload, ranks, topology, step time."""
    where = f" on {graph.graph['name']}" if graph is not None and graph.graph.get("name") else ""
    step = float(np.nanmax(run.records.end_s)) if len(run.records.end_s) else 0.0
    # One data-parallel replica simulated for all: its ranks are the rows.
    simulated = run.replicas.get("simulated", "all")
    shown = (
        f" (DP replicas shown: {simulated} of {run.replicas['count']}; the others are alike)"
        if simulated != "all"
        else ""
    )
    return (
        f"{run.workload.name} · {run.workload.ranks} ranks{shown}{where} · step {_time_text(step)}"
    )


def _servers(graph: nx.Graph | None, ranks: int) -> list[int] | None:
    """The server of each of the first ``ranks`` topology ranks, or None if unnamed."""
    if graph is None:
        return None
    nodes = gpu_nodes(graph)[:ranks]
    servers = [graph.nodes[node].get("server") for node in nodes]
    if len(nodes) < ranks or any(s is None for s in servers):
        return None
    return [int(s) for s in servers]


def _kind(workload: Workload, op: Op) -> str:
    if op.kind == "compute":
        return "compute"
    if op.kind == "collective":
        dim = workload.groups[op.group].kind
        return f"{dim} collective" if dim else "collective"
    return op.kind


def _label(op: Op) -> str:
    """What a trace viewer shows as the span's name: the trace's label, else the op."""
    if op.label:
        return op.label
    if op.kind == "collective":
        return f"{op.op} {op.group}"
    if op.kind == "send":
        return f"send to rank {op.peer}"
    if op.kind == "recv":
        return f"recv from rank {op.peer}"
    return op.id


def workload_timeline(
    run: WorkloadRun, graph: nx.Graph | None = None, *, title: str | None = None
) -> Timeline:
    """The timeline of one workload replay (rows and kinds: see the module docstring).

    Parameters
    ----------
    run : WorkloadRun
        From :meth:`simulator.workload.WorkloadReplay.run` or
        :func:`simulator.workload.run_workload`.
    graph : networkx graph, optional
        The topology it ran on: gives each rank's server (the track groups).
    title : str, optional
        Defaults to :func:`workload_title`.

    Returns
    -------
    Timeline
        Times in seconds from the start of the step; ``meta`` holds the workload name,
        ranks and step time.
    """
    workload, records = run.workload, run.records
    ranks = workload.ranks
    servers = _servers(graph, ranks)

    # Tracks: per rank, compute first, then the other streams in trace order.
    streams: dict[int, dict[str, None]] = {r: {"compute": None} for r in range(ranks)}
    for op in workload.ops:
        streams[op.rank].setdefault(op.stream, None)
    used = {(op.rank, op.stream) for op in workload.ops}
    marks = rank_marks(graph)  # " [compute 2x]" on a straggler's rows (faults)
    tracks: list[Track] = []
    index: dict[tuple[int, str], int] = {}
    for rank in range(ranks):
        for stream in streams[rank]:
            if (rank, stream) not in used:
                continue  # a rank without compute ops gets no empty compute row
            if servers is None:
                first = rank - rank % RANK_BLOCK
                last = min(first + RANK_BLOCK, ranks) - 1
                group, category = "", f"ranks {first}-{last} {stream}"
            else:
                group = f"server {servers[rank]}"
                category = f"{group} {stream}"
            index[(rank, stream)] = len(tracks)
            mark = marks[rank] if rank < len(marks) else ""
            tracks.append(Track(f"rank {rank} {stream}{mark}", group, "streams", category, rank))

    kinds: dict[str, int] = {kind: i for i, kind in enumerate(KINDS)}
    labels: dict[str, int] = {}
    columns: dict[str, list[Any]] = {
        key: [] for key in ("track", "start_s", "end_s", "kind", "label")
    }
    args: dict[str, list[Any]] = {
        key: [] for key in ("id", "bytes", "flops", "group", "op", "peer")
    }

    def add(op: Op, start: float, end: float, kind: str, label: str) -> None:
        columns["track"].append(index[(op.rank, op.stream)])
        columns["start_s"].append(start)
        columns["end_s"].append(end)
        columns["kind"].append(kinds.setdefault(kind, len(kinds)))
        columns["label"].append(labels.setdefault(label, len(labels)))
        comm = op.kind != "compute"
        args["id"].append(op.id)
        args["bytes"].append(op.nbytes if comm else np.nan)
        args["flops"].append(op.total_flops if not comm and op.duration is None else np.nan)
        args["group"].append(op.group if op.kind == "collective" else None)
        args["op"].append(op.op if op.kind == "collective" else None)
        args["peer"].append(op.peer if op.kind in ("send", "recv") else np.nan)

    issue, start, end = records.issue_s.tolist(), records.start_s.tolist(), records.end_s.tolist()
    for op in workload.ops:
        i = op.index
        if math.isnan(end[i]):  # never ran (hand-built runs; a replay raises instead)
            continue
        label = _label(op)
        # Time a communication op waits for its peers, on its own stream (compute
        # starts when issued, so it never waits here).
        if start[i] > issue[i]:
            add(op, issue[i], start[i], "waiting", f"wait: {label}")
        add(op, start[i], end[i], _kind(workload, op), label)

    object_keys = ("id", "group", "op")
    arg_columns = {
        key: np.array(values, dtype=object if key in object_keys else float)
        for key, values in args.items()
    }
    step = float(np.nanmax(records.end_s)) if len(records.end_s) else 0.0
    plan = fault_plan(graph)
    return Timeline(
        tracks=tracks,
        track=np.array(columns["track"], dtype=np.int64),
        start_s=np.array(columns["start_s"], dtype=float),
        end_s=np.array(columns["end_s"], dtype=float),
        kinds=list(kinds),
        kind=np.array(columns["kind"], dtype=np.int64),
        labels=list(labels),
        label=np.array(columns["label"], dtype=np.int64),
        args=arg_columns,
        title=workload_title(run, graph) if title is None else title,
        meta={
            "workload": workload.name,
            "ranks": ranks,
            "step_s": step,
            "notes": [f"faults: {plan.spec}"] if plan is not None else [],
            **({"faults": plan.spec} if plan is not None else {}),
        },
    )


def coarsen(timeline: Timeline, max_rows: int) -> Timeline:
    """The timeline with categories that give at most ``max_rows`` rows per plot.

    Tracks merge first by ``"<unit> <stream>"`` (a unit is a server, or a block of
    :data:`RANK_BLOCK` ranks), which :func:`workload_timeline` sets. When there are more
    such categories than ``max_rows``, consecutive units are binned, with the same bins
    for every stream, so that a row never mixes a compute stream with a communication
    stream (timeline.py's own binning joins consecutive categories whatever they are).
    Returns ``timeline`` itself when no binning is needed.

    Examples
    --------
    >>> from simulator.viz.records import Track
    >>> tracks = [Track(f"rank {r} {s}", f"server {r // 8}", "streams", f"server {r // 8} {s}")
    ...           for r in range(64) for s in ("compute", "comm")]
    >>> t = coarsen(Timeline.from_spans([], tracks=tracks), 4)
    >>> sorted({track.category for track in t.tracks})[:2]
    ['server 0 … server 3 comm', 'server 0 … server 3 compute']
    """
    categories = {t.category or t.name for t in timeline.tracks}
    if len(timeline.tracks) <= max_rows or len(categories) <= max_rows:
        return timeline
    streams = [t.name.split(" ", 2)[2] for t in timeline.tracks]  # "rank r <stream>"
    units = [
        t.category[: -len(stream) - 1] for t, stream in zip(timeline.tracks, streams, strict=True)
    ]
    order = list(dict.fromkeys(units))
    bins = max(1, max_rows // len(set(streams)))
    size = math.ceil(len(order) / bins)
    name_of_unit = {}
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        name = chunk[0] if len(chunk) == 1 else f"{chunk[0]} … {chunk[-1]}"
        name_of_unit.update(dict.fromkeys(chunk, name))
    tracks = [
        t._replace(category=f"{name_of_unit[unit]} {stream}")
        for t, unit, stream in zip(timeline.tracks, units, streams, strict=True)
    ]
    return dataclasses.replace(timeline, tracks=tracks)


def workload_figure(
    timeline: Timeline,
    *,
    width: int = 1600,
    height: int | None = None,
    dpi: int = 100,
    max_rows: int = 64,
) -> Figure:
    """Draw a workload timeline as a Gantt chart.

    Up to ``max_rows`` tracks get a row each; beyond, tracks merge into
    ``"server s <stream>"`` rows and, beyond that, into rows of several servers per
    stream (:func:`coarsen`). A merged row shows, per pixel column, the share of its
    tracks busy with each kind (drawn by :func:`~simulator.viz.timeline.timeline_figure`).

    Parameters
    ----------
    timeline : Timeline
        From :func:`workload_timeline`.
    width, height, dpi : int
        Image size in pixels (``height=None`` fits the rows) and resolution.
    max_rows : int
        Rows beyond which tracks merge.

    Returns
    -------
    matplotlib.figure.Figure
        Not attached to pyplot; render it with
        :func:`~simulator.viz.timeline.figure_bytes`.
    """
    from .timeline import MERGED_NOTE, timeline_figure

    fig = timeline_figure(
        coarsen(timeline, max_rows), width=width, height=height, dpi=dpi, max_rows=max_rows
    )
    # timeline_figure names the stream rows for collectives ("transfers each sends");
    # here they hold ops of every kind, so say that instead.
    for ax in fig.axes:
        for text in ax.texts:
            if text.get_text().startswith("GPU streams"):
                merged = text.get_text().endswith(MERGED_NOTE)
                text.set_text(STREAMS_HEADER + (f"; {MERGED_NOTE}" if merged else ""))
    return fig
