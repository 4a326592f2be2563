"""A simulated collective as a :class:`~simulator.viz.records.Timeline`.

Rows (tracks):

* one per GPU stream: ``"rank r"``, or ``"rank r ch c"`` when the schedule uses several
  channels, holding the transfers that rank *sends* on that channel, from the moment
  the transfer starts to the moment its last byte has left (``start_s`` to ``sent_s``;
  delivery latency and the receiver's reduction come after and are in the span's
  ``args``). Kind ``"reduce"`` when the receiver reduces the data, ``"copy"`` when it
  overwrites. Grouped by server (one Perfetto process each), merged per rank (category
  ``"rank r"``) when a plot has too many rows.
* with the graph: one per directed link that carried data, ``"src→dst"``, with its busy
  intervals as spans and its utilisation (rate / capacity, from
  :func:`~simulator.viz.links.link_load`) as a counter. Links inside a server belong to
  it, the others to ``"fabric"``; they merge by link type and endpoint kinds
  (``"nvlink gpu→nvswitch"``). A link out of or into a GPU has that GPU's rank.

Phases: consecutive steps whose transfers all reduce, or all copy, form one phase (a
ring all-reduce: p-1 reduce steps, then p-1 copy steps). Phases are named from
:data:`PHASE_NAMES` for known algorithms (the ring's are reduce-scatter and all-gather),
otherwise ``"reduce"``, ``"copy"`` or ``"mixed"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np

from ..collective.run import CollectiveResult
from ..network.faults import fault_plan, link_mark, rank_marks
from ..topology.graph import gpu_nodes
from .links import MAX_WORK, LinkLoadTooLarge, link_load
from .records import Counter, Phase, Timeline, Track

#: Phase names by (algorithm, op), in time order; the number of names must match the
#: reduce/copy phases the schedule has, else the generic names are used.
PHASE_NAMES: dict[tuple[str, str], tuple[str, ...]] = {
    ("ring", "all_reduce"): ("reduce-scatter", "all-gather"),
    ("ring", "reduce_scatter"): ("reduce-scatter",),
    ("ring", "all_gather"): ("all-gather",),
}

#: Group of links that join servers (or leave every server).
FABRIC = "fabric"


def _size_text(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{size:g} B"


def _time_text(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.4g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} us"


def collective_title(result: CollectiveResult, topology: str = "") -> str:
    """One-line description used as plot title: algorithm, op, ranks, size, time."""
    where = f" on {topology}" if topology else ""
    return (
        f"{result.algorithm} {result.op} · {result.ranks} ranks{where} · "
        f"{_size_text(result.size_bytes)} · {_time_text(result.time_s)}"
    )


def collective_timeline(
    result: CollectiveResult,
    graph: nx.Graph | None = None,
    *,
    links: bool = True,
    max_link_work: int = MAX_WORK,
    phase_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Timeline:
    """The timeline of one simulated collective (rows: see the module docstring).

    Parameters
    ----------
    result : CollectiveResult
        From :func:`simulator.simulate_collective` or :func:`simulator.run_schedule`.
    graph : networkx graph, optional
        The topology it ran on: gives servers (groups) and link rows.
    links : bool
        Add link rows (needs ``graph``). Skipped, with a note in ``meta["notes"]``, when
        rebuilding the link load needs more than ``max_link_work`` (flow, link) visits
        (see :func:`~simulator.viz.links.link_load`).
    phase_names : sequence of str, optional
        Names of the phases in time order, overriding :data:`PHASE_NAMES`.
    title : str, optional
        Defaults to :func:`collective_title`.

    Examples
    --------
    >>> import simulator
    >>> g = simulator.ring_graph(4, 100e9, 1e-6)
    >>> t = collective_timeline(simulator.simulate_collective(g, "all_reduce", 4e6), g)
    >>> [p.name for p in t.phases], t.tracks[0].name, t.tracks[4].name
    (['reduce-scatter', 'all-gather'], 'rank 0', 'gpu0→gpu1')

    6 steps x 4 ranks = 24 transfers; each of the 4 used links is busy 6 times (the 1 us
    hop latency separates the steps):

    >>> len(t), int((t.kind == t.kinds.index("link")).sum()), len(t.counters)
    (48, 24, 4)
    """
    flows = result.flows
    src = np.asarray(flows["src"], dtype=np.int64)
    dst = np.asarray(flows["dst"], dtype=np.int64)
    channel = np.asarray(flows["channel"], dtype=np.int64)
    step = np.asarray(flows["step"], dtype=np.int64)
    chunk = np.asarray(flows["chunk"], dtype=np.int64)
    reduce = np.asarray(flows["reduce"], dtype=bool)
    nbytes = np.asarray(flows["bytes"], dtype=float)
    start = np.asarray(flows["start_s"], dtype=float)
    sent = np.asarray(flows["sent_s"], dtype=float)
    end = np.asarray(flows["end_s"], dtype=float)
    p = int(result.ranks)
    channels = int(channel.max()) + 1 if len(channel) else 1
    chunked = len(chunk) and int(chunk.max()) > 0

    servers = _servers(graph, p)
    marks = rank_marks(graph)  # " [compute 2x]" on a slowed GPU's rows (faults)
    tracks: list[Track] = []
    for rank in range(p):
        group = "" if servers is None else f"server {servers[rank]}"
        mark = marks[rank] if rank < len(marks) else ""
        for c in range(channels):
            name = f"rank {rank}" if channels == 1 else f"rank {rank} ch {c}"
            tracks.append(Track(name + mark, group, "streams", f"rank {rank}", rank))
    track = src * channels + channel

    phases, phase_of_step = _phases(result, step, reduce, start, sent, end, phase_names)
    # One label per distinct (step, chunk): the phase, step and chunk.
    key = step * (int(chunk.max()) + 1 if chunked else 1) + (chunk if chunked else 0)
    keys, label = np.unique(key, return_inverse=True)
    width = int(chunk.max()) + 1 if chunked else 1
    labels = []
    for value in keys.tolist():
        s, k = divmod(value, width)
        text = f"{phase_of_step.get(s, 'step')} step {s}"
        labels.append(f"{text} chunk {k}" if chunked else text)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(sent > start, nbytes / (sent - start), np.inf)
    args = {
        "bytes": nbytes,
        "src": src,
        "dst": dst,
        "channel": channel,
        "step": step,
        "chunk": chunk,
        "avg_GBps": rate / 1e9,
        "done_us": end * 1e6,
    }
    kinds = ["copy", "reduce"]
    kind = reduce.astype(np.int64)
    columns = {
        "track": track,
        "start_s": start,
        "end_s": sent,
        "kind": kind,
        "label": label,
    }
    counters: list[Counter] = []
    plan = fault_plan(graph)
    notes: list[str] = [f"faults: {plan.spec}"] if plan is not None else []
    symmetry = {}
    if result.params.get("flows") == "representatives":
        # Too many flows to list: the run kept those of one class of symmetric ranks.
        period = result.params.get("symmetry_period")
        symmetry["symmetry"] = (
            f"symmetric ranks simulated once: rows show ranks 0-{period - 1}; rank r does "
            f"what rank r mod {period} does, at the same times, and links carry what their "
            "images among the rows' links carry"
        )
        notes.append(symmetry["symmetry"])
    if links and graph is not None:
        try:
            columns, args, counters = _add_links(
                graph,
                flows,
                tracks,
                columns,
                args,
                kinds,
                busy_label=len(labels),
                max_work=max_link_work,
            )
        except LinkLoadTooLarge as error:
            notes.append(f"link rows omitted: {error}")
    return Timeline(
        tracks=tracks,
        track=columns["track"],
        start_s=columns["start_s"],
        end_s=columns["end_s"],
        kinds=kinds,
        kind=columns["kind"],
        labels=labels + (["busy"] if counters else []),
        label=columns["label"],
        args=args,
        counters=counters,
        phases=phases,
        title=collective_title(result, _graph_name(graph)) if title is None else title,
        meta={
            "op": result.op,
            "algorithm": result.algorithm,
            "ranks": p,
            "size_bytes": result.size_bytes,
            "time_s": result.time_s,
            "notes": notes,
            **({"faults": plan.spec} if plan is not None else {}),
            **symmetry,
        },
    )


def _graph_name(graph: nx.Graph | None) -> str:
    return "" if graph is None else str(graph.graph.get("name", ""))


def _servers(graph: nx.Graph | None, p: int) -> list[int] | None:
    if graph is None:
        return None
    nodes = gpu_nodes(graph)
    if len(nodes) < p:
        return None
    servers = [graph.nodes[node].get("server") for node in nodes[:p]]
    return None if any(s is None for s in servers) else [int(s) for s in servers]


def _phases(result, step, reduce, start, sent, end, names):
    """Phases as runs of steps of one kind, and the phase name of each step."""
    if len(step) == 0:
        return [], {}
    steps = np.unique(step)
    index = np.searchsorted(steps, step)
    reducing = np.bincount(index, weights=reduce, minlength=len(steps))
    total = np.bincount(index, minlength=len(steps))
    kind = np.where(reducing == total, "reduce", np.where(reducing == 0, "copy", "mixed"))
    t0 = np.full(len(steps), np.inf)
    t1 = np.full(len(steps), -np.inf)
    np.minimum.at(t0, index, start)
    np.maximum.at(t1, index, np.fmax(end, sent))
    runs = []  # (kind, first step index, last step index)
    for i, k in enumerate(kind.tolist()):
        if runs and runs[-1][0] == k:
            runs[-1][2] = i
        else:
            runs.append([k, i, i])
    if names is None:
        names = PHASE_NAMES.get((result.algorithm, result.op))
    if names is None or len(names) != len(runs):
        names = [k for k, _, _ in runs]
    phases, of_step = [], {}
    for name, (_, a, b) in zip(names, runs, strict=True):
        phases.append(Phase(name, float(t0[a : b + 1].min()), float(t1[a : b + 1].max())))
        of_step.update(dict.fromkeys(steps[a : b + 1].tolist(), name))
    return phases, of_step


def _add_links(graph, flows, tracks, columns, args, kinds, *, busy_label, max_work):
    """Append link rows: busy spans and utilisation counters."""
    load = link_load(graph, flows, max_work=max_work)
    table = load.table
    kind_of = {node: str(data.get("kind", "")) for node, data in graph.nodes(data=True)}
    rank_of = {node: rank for rank, node in enumerate(gpu_nodes(graph))}

    def group(node_a, node_b) -> str:
        a = graph.nodes[node_a].get("server")
        b = graph.nodes[node_b].get("server")
        return f"server {a}" if a is not None and a == b else FABRIC

    rows = []
    for j, link in enumerate(load.links.tolist()):
        a, b = table.src_node[link], table.dst_node[link]
        rows.append((group(a, b), table.kind[link], kind_of[a], kind_of[b], j))
    # Servers in number order, the fabric last; within a group by link type, then
    # endpoint kinds, then link number (the graph's order).
    servers = sorted({r[0] for r in rows if r[0] != FABRIC}, key=lambda g: int(g.split()[1]))
    rank = {g: i for i, g in enumerate([*servers, FABRIC])}
    rows.sort(key=lambda r: (rank[r[0]], r[1], r[2], r[3], load.links[r[4]]))

    kinds.append("link")
    counters = []
    parts: dict[str, list[np.ndarray]] = {"track": [], "start_s": [], "end_s": [], "bytes": []}
    for grp, link_type, kind_a, kind_b, j in rows:
        link = int(load.links[j])
        a, b = table.src_node[link], table.dst_node[link]
        name = f"{a}→{b}" + link_mark(graph, a, b)  # " [degraded 0.5x]" (faults)
        # A link out of or into a GPU belongs to that GPU's rank (for --trace-ranks).
        rank = rank_of.get(a, rank_of.get(b))
        tracks.append(Track(name, grp, "links", f"{link_type} {kind_a}→{kind_b}".strip(), rank))
        t, rate = load.time_s[j], load.rate[j]
        counters.append(Counter(name, t, rate / table.capacity[link], "fraction"))
        # Busy intervals: maximal runs of samples with a positive rate; bytes carried are
        # the integral of the rate over each.
        edges = np.diff(np.concatenate([[0], (rate[:-1] > 0).astype(np.int8), [0]]))
        first, last = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        carried = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(t))])
        parts["track"].append(np.full(len(first), len(tracks) - 1))
        parts["start_s"].append(t[first])
        parts["end_s"].append(t[last])
        parts["bytes"].append(carried[last] - carried[first])
    new = {key: np.concatenate(value) for key, value in parts.items()}
    n_new = len(new["track"])
    columns = {
        "track": np.concatenate([columns["track"], new["track"]]),
        "start_s": np.concatenate([columns["start_s"], new["start_s"]]),
        "end_s": np.concatenate([columns["end_s"], new["end_s"]]),
        "kind": np.concatenate([columns["kind"], np.full(n_new, len(kinds) - 1)]),
        "label": np.concatenate([columns["label"], np.full(n_new, busy_label)]),
    }
    # Link spans have bytes and an average bandwidth; the transfer-only args are NaN
    # there (left out when written).
    fill = {
        "bytes": new["bytes"],
        "avg_GBps": new["bytes"] / (new["end_s"] - new["start_s"]) / 1e9,
    }
    out = {
        key: np.concatenate([column.astype(float), fill.get(key, np.full(n_new, np.nan))])
        for key, column in args.items()
    }
    return columns, out, counters
