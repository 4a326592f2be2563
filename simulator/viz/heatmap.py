"""Heat-maps of a collective's traffic at scale: utilisation per server and per rail.

At thousands of ranks a row per GPU stream is unreadable; a heat-map of rows ×
time bins is not. A :class:`Heatmap` holds, for each row and time bin, the bytes the
row's GPUs *sent* (egress only: each transfer counts once, at its sender) during the
bin, divided by the bin's length and by the row's capacity — a utilisation, 0 to 1:

* rows ``by="server"``: the GPUs of one server; ``by="rail"``: the GPUs of one local
  index across every server (rail i is every server's GPU i, the NIC plane it uses);
* ``traffic="scale-out"``: transfers to another server, against the row's NIC
  capacity (each NIC's fabric-facing bandwidth, shared equally by the GPUs nearest to
  it); ``"scale-up"``: transfers inside the server, against the capacity of the GPUs'
  links to the rest of their server (NVLink, HCCS...) that are not NICs; ``"all"``:
  both, against the sum.

A transfer's bytes are spread evenly over ``[start_s, sent_s]`` (from its first byte
leaving until its last has left; delivery latency and the reduction come after), so
``sum(values * capacity * bin_s)`` is every byte sent, exactly as arithmetic allows.
Time bins are 1, 2 or 5 × 10^k seconds long, chosen so that a run has 200 to 500 of
them (:func:`heatmap_bins`).

When a run simulated one representative per class of symmetric ranks and kept only
their records (``result.params["flows"] == "representatives"``, period P: rank r does
what rank r mod P does, at the same times), the representatives' bytes per bin are
binned once and each row adds those of the representatives of its ranks: the work
grows with ranks × bins, never ranks × transfers.

Above :data:`HEATMAP_RANKS` ranks, ``ccsim collective --timeline`` draws
:func:`heatmap_figure` instead of the Gantt chart, and ``--trace`` carries the rows
as counter tracks (:func:`with_heatmap_counters`) instead of every rank's slices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from matplotlib.figure import Figure

from ..collective.run import CollectiveResult
from ..errors import CcsimError, unknown_choice
from ..topology.graph import gpu_nodes
from .collective import collective_title
from .perfetto import HEATMAP_CATEGORY
from .records import Counter, Timeline, Track

#: Above this many ranks, ``--timeline`` draws the heat-map instead of a row per rank,
#: and ``--trace`` carries heat-map counters instead of every rank's slices.
HEATMAP_RANKS = 256
#: Row groupings: a server's GPUs, or one local GPU index across servers.
BYS = ("server", "rail")
#: Which transfers count: inside servers, between servers, or both.
TRAFFIC = ("scale-up", "scale-out", "all")
#: A time bin is one of these × 10^k seconds long.
_STEPS = (1.0, 2.0, 5.0)
#: Longest run of bins wanted; the shortest is this / 2.5 (the widest gap of _STEPS).
MAX_BINS = 500
#: Utilisations in a trace are rounded to this (a counter sample repeats otherwise).
_COUNTER_DIGITS = 6
#: (row, representative) pairs summed at once when symmetric rows are expanded.
_PAIRS_AT_ONCE = 16_384


@dataclass
class Heatmap:
    """Utilisation of rows (servers or rails) over time bins.

    ``values[i, j]`` is the bytes row ``rows[i]`` sent in bin ``j`` (from
    ``t0_s + j * bin_s``), divided by ``bin_s`` and by ``capacity_Bps[i]``. ``copies``
    is None, or the number of rows that differ when the run was symmetric: row i is then
    row ``i mod copies`` (servers), which a figure says.
    """

    values: np.ndarray
    rows: np.ndarray
    capacity_Bps: np.ndarray
    t0_s: float
    bin_s: float
    by: str
    traffic: str
    copies: int | None = None

    @property
    def edges_s(self) -> np.ndarray:
        """Bin edges in seconds (one more than bins)."""
        return self.t0_s + self.bin_s * np.arange(self.values.shape[1] + 1)

    @property
    def bytes(self) -> float:
        """Bytes the heat-map accounts for (every byte sent by the traffic it counts)."""
        return float((self.values * self.capacity_Bps[:, None]).sum() * self.bin_s)

    @property
    def label(self) -> str:
        """What a row shows, e.g. ``"per server: scale-out"``."""
        return f"per {self.by}: {self.traffic}"


def heatmap_bins(t_end_s: float, t_start_s: float = 0.0) -> tuple[float, int]:
    """Bin length (1, 2 or 5 × 10^k s) and count covering ``[t_start_s, t_end_s]``: the
    shortest such length giving at most :data:`MAX_BINS` bins, hence at least 200.

    >>> heatmap_bins(15.69e-3)  # 50 us bins
    (5e-05, 314)
    >>> heatmap_bins(100e-6)
    (2e-07, 500)
    """
    extent = float(t_end_s) - float(t_start_s)
    if not extent > 0:
        return 1e-9, 1
    exponent = int(np.floor(np.log10(extent / MAX_BINS)))
    for k in (exponent, exponent + 1):
        for step in _STEPS:
            length = float(f"{step}e{k}")  # exact decimal, not step * 10.0**k
            if extent / length <= MAX_BINS * (1 + 1e-12):
                return length, max(int(np.ceil(extent / length * (1 - 1e-12))), 1)
    raise AssertionError("unreachable: 10^(k+1) >= extent / MAX_BINS")


def rank_capacities(graph: nx.Graph) -> dict[str, np.ndarray]:
    """Each rank's capacity (bytes/s) for ``"scale-up"`` and ``"scale-out"`` traffic.

    Scale-up: the GPU's links to nodes of its own server that are not NICs. Scale-out:
    each NIC's fabric-facing bandwidth (its links to nodes that are neither GPUs nor of
    its server), shared equally by the GPUs nearest to it (fewest hops through their
    server's switches; usually the GPU it is wired to); in a graph without NICs, the
    GPU's links out of its server. A GPU without a ``server`` is a server of its own.
    A link's bandwidth counts per direction (an undirected edge: both ends may send).

    >>> from simulator.topology import load_topology
    >>> c = rank_capacities(load_topology("dgx-h100", 2))
    >>> float(c["scale-up"][0]) / 1e9, float(c["scale-out"][0]) / 1e9
    (450.0, 50.0)
    """
    gpus = gpu_nodes(graph)
    rank_of = {node: rank for rank, node in enumerate(gpus)}
    kind = dict(graph.nodes(data="kind", default=""))
    # A node without a server is a server of its own (a fabric switch, a lone GPU).
    server = {node: ("own", node) for node in graph}
    server.update({node: ("server", s) for node, s in graph.nodes(data="server") if s is not None})
    up = np.zeros(len(gpus))
    out = np.zeros(len(gpus))
    nic_out: dict = {}
    has_nic = "nic" in kind.values()
    pairs = graph.edges(data="bandwidth")
    directions = (
        pairs
        if graph.is_directed()
        else ((a, b, w) for u, v, w in pairs for a, b in ((u, v), (v, u)))
    )
    for a, b, bandwidth in directions:
        same = server[a] == server[b]
        if kind[a] == "gpu":
            if same and kind[b] != "nic":
                up[rank_of[a]] += bandwidth
            elif not has_nic and not same:
                out[rank_of[a]] += bandwidth
        elif kind[a] == "nic" and kind[b] != "gpu" and not same:
            nic_out[a] = nic_out.get(a, 0.0) + bandwidth
    if has_nic:
        nearest = {node: _nearest_nics(graph, node, kind, server) for node in gpus}
        sharing: dict = {}
        for nics in nearest.values():
            for nic in nics:
                sharing[nic] = sharing.get(nic, 0) + 1
        for node, nics in nearest.items():
            out[rank_of[node]] = sum(nic_out.get(nic, 0.0) / sharing[nic] for nic in nics)
    return {"scale-up": up, "scale-out": out}


def _nearest_nics(graph: nx.Graph, gpu, kind: dict, server: dict) -> list:
    """The NICs fewest hops from ``gpu`` through non-GPU nodes of its server."""
    neighbours = graph.successors if graph.is_directed() else graph.neighbors
    seen, frontier = {gpu}, [gpu]
    while frontier:
        found, following = [], []
        for node in frontier:
            for nxt in neighbours(node):
                if nxt in seen or server[nxt] != server[gpu] or kind[nxt] == "gpu":
                    continue
                seen.add(nxt)
                (found if kind[nxt] == "nic" else following).append(nxt)
        if found:
            return found
        frontier = following
    return []


def rank_rows(graph: nx.Graph, by: str) -> np.ndarray:
    """The row (0, 1, ...) of each rank: its server's, or its rail's (local index).

    Servers are numbered in the order of their ``server`` attribute; a GPU without one
    is a server of its own. A rail is the GPU's ``local_rank`` when every GPU has one,
    else its position among its server's GPUs in rank order.

    >>> from simulator.topology import load_topology
    >>> g = load_topology("dgx-h100", 2)
    >>> rank_rows(g, "server")[[0, 7, 8]].tolist(), rank_rows(g, "rail")[[0, 7, 8]].tolist()
    ([0, 0, 1], [0, 7, 0])
    """
    if by not in BYS:
        raise unknown_choice("heat-map rows", by, BYS)
    gpus = gpu_nodes(graph)
    servers = np.array(
        [graph.nodes[node].get("server", -1 - i) for i, node in enumerate(gpus)], dtype=np.int64
    )
    server_row = np.unique(servers, return_inverse=True)[1].reshape(-1)
    if by == "server":
        return server_row
    local = [graph.nodes[node].get("local_rank") for node in gpus]
    if all(value is not None for value in local):
        return np.unique(np.array(local, dtype=np.int64), return_inverse=True)[1].reshape(-1)
    order = np.argsort(server_row, kind="stable")
    first = np.searchsorted(server_row[order], server_row[order])
    position = np.empty(len(gpus), dtype=np.int64)
    position[order] = np.arange(len(gpus)) - first
    return position


def traffic_heatmap(
    result: CollectiveResult,
    graph: nx.Graph,
    *,
    by: str = "server",
    traffic: str = "all",
    bins: tuple[float, int] | None = None,
) -> Heatmap:
    """The heat-map of ``result``'s traffic on ``graph`` (see the module docstring).

    Parameters
    ----------
    result : CollectiveResult
        From :func:`simulator.simulate_collective`, :func:`simulator.run_schedule` or
        :func:`~simulator.collective.run.build_and_run` (records of representatives are
        expanded by symmetry).
    graph : networkx graph
        The topology it ran on: servers, rails and capacities.
    by : {"server", "rail"}
        What a row is.
    traffic : {"scale-out", "scale-up", "all"}
        Which transfers count, and the capacity they are divided by.
    bins : (bin_s, count), optional
        The time bins from 0; default :func:`heatmap_bins` of the run's time.

    Examples
    --------
    Ring all-reduce on 4 GPUs of one server (a ring graph: each GPU has two 100 GB/s
    links, 200 GB/s out, and sends on one of them, so the server is half busy); 66 us
    in 0.2 us bins:

    >>> import simulator
    >>> g = simulator.ring_graph(4, 100e9, 1e-6)
    >>> h = traffic_heatmap(simulator.simulate_collective(g, "all_reduce", 4e6), g)
    >>> h.values.shape, float(h.capacity_Bps[0]) / 1e9, round(float(h.values.max()), 6)
    ((1, 330), 800.0, 0.5)
    >>> round(h.bytes)  # 6 steps x 4 ranks x 1 MB
    24000000
    """
    if by not in BYS:
        raise unknown_choice("heat-map rows", by, BYS)
    if traffic not in TRAFFIC:
        raise unknown_choice("heat-map traffic", traffic, TRAFFIC)
    return _heatmap(result, _RankFacts.of(graph, result.ranks), by, traffic, bins)


@dataclass
class _RankFacts:
    """What the heat-maps need to know of each rank: its server and rail rows, and its
    capacities (:func:`rank_capacities`); read from the graph once for all maps."""

    server: np.ndarray
    rail: np.ndarray
    capacity: dict[str, np.ndarray]

    @classmethod
    def of(cls, graph: nx.Graph, ranks: int) -> _RankFacts:
        gpus = len(gpu_nodes(graph))
        if gpus != ranks:
            raise CcsimError(
                f"the heat-map's graph has {gpus} GPUs but the run had {ranks} ranks; pass "
                "the topology the collective ran on"
            )
        return cls(rank_rows(graph, "server"), rank_rows(graph, "rail"), rank_capacities(graph))


def _heatmap(
    result: CollectiveResult,
    facts: _RankFacts,
    by: str,
    traffic: str,
    bins: tuple[float, int] | None,
) -> Heatmap:
    """:func:`traffic_heatmap` with the graph's facts already read."""
    flows = result.flows
    src = np.asarray(flows["src"], dtype=np.int64)
    dst = np.asarray(flows["dst"], dtype=np.int64)
    nbytes = np.asarray(flows["bytes"], dtype=float)
    start = np.asarray(flows["start_s"], dtype=float)
    sent = np.asarray(flows["sent_s"], dtype=float)
    if bins is None:
        bins = heatmap_bins(max(float(result.time_s), float(sent.max(initial=0.0))))
    bin_s, n_bins = bins
    server = facts.server
    row_of_rank = server if by == "server" else facts.rail
    n_rows = int(row_of_rank.max()) + 1
    cross = server[src] != server[dst]
    keep = {"scale-out": cross, "scale-up": ~cross, "all": np.ones(len(src), dtype=bool)}[traffic]
    period = _period(result)
    if period is None:
        cells = _bin_bytes(
            row_of_rank[src[keep]], nbytes[keep], start[keep], sent[keep], n_rows, bin_s, n_bins
        )
        copies = None
    else:
        _check_server_shift(server, period)
        rep = src[keep]  # each representative is its own row, then rows add theirs
        per_rep = _bin_bytes(rep, nbytes[keep], start[keep], sent[keep], period, bin_s, n_bins)
        cells = _expand(per_rep, row_of_rank, period, n_rows)
        copies = _row_period(row_of_rank, period) if by == "server" else None
    capacities = facts.capacity
    per_rank = (
        capacities["scale-out"] + capacities["scale-up"]
        if traffic == "all"
        else capacities[traffic]
    )
    capacity = np.bincount(row_of_rank, weights=per_rank, minlength=n_rows)
    busy = cells.sum(axis=1) > 0
    if (busy & ~(capacity > 0)).any():
        row = int(np.flatnonzero(busy & ~(capacity > 0))[0])
        raise CcsimError(
            f"{by} {row} sends {traffic} traffic but its GPUs have no {traffic} links in "
            "the topology; check its NICs and links"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(capacity[:, None] > 0, cells / (bin_s * capacity[:, None]), 0.0)
    return Heatmap(
        values=values,
        rows=np.arange(n_rows),
        capacity_Bps=capacity,
        t0_s=0.0,
        bin_s=float(bin_s),
        by=by,
        traffic=traffic,
        copies=copies,
    )


def traffic_heatmaps(
    result: CollectiveResult, graph: nx.Graph, *, bins: tuple[float, int] | None = None
) -> list[Heatmap]:
    """The heat-maps a figure shows: per server, then per rail, each for scale-up and
    scale-out traffic, leaving out a kind of traffic the run has none of (a single
    server sends none between servers). All share one time grid."""
    if bins is None:
        sent = np.asarray(result.flows["sent_s"], dtype=float)
        bins = heatmap_bins(max(float(result.time_s), float(sent.max(initial=0.0))))
    facts = _RankFacts.of(graph, result.ranks)
    maps = [
        _heatmap(result, facts, by, traffic, bins)
        for by in BYS
        for traffic in ("scale-up", "scale-out")
    ]
    used = {m.traffic for m in maps if m.values.any()} or {"scale-up"}
    return [m for m in maps if m.traffic in used]


def _period(result: CollectiveResult) -> int | None:
    """The symmetry period P when the records are one period's ranks only."""
    if result.params.get("flows") != "representatives":
        return None
    period = int(result.params["symmetry_period"])
    if period <= 0 or result.ranks % period:
        raise CcsimError(
            f"the run's symmetry period {period} does not divide its {result.ranks} ranks"
        )
    return period


def _check_server_shift(server: np.ndarray, period: int) -> None:
    """Whether moving every rank ``period`` on moves every server the same number of
    servers on (then a transfer and its images all stay in, or all leave, their
    servers, and the representatives' traffic kinds are their images')."""
    p = len(server)
    servers = int(server.max()) + 1
    moved = server[(np.arange(p) + period) % p]
    if not ((moved - server) % servers == (moved[0] - server[0]) % servers).all():
        raise CcsimError(
            f"cannot expand the representatives' records: a shift of {period} ranks does "
            "not move whole servers; rerun with symmetry off"
        )


def _row_period(row_of_rank: np.ndarray, period: int) -> int | None:
    """Rows that differ when ranks ``period`` apart do the same: rows are then copies of
    the first ``k`` (when a period is whole rows, in order)."""
    rows = int(row_of_rank.max()) + 1
    k = len(np.unique(row_of_rank[:period]))
    shifted = (row_of_rank[: len(row_of_rank) - period] + k) % rows
    if rows % k or not np.array_equal(row_of_rank[period:], shifted):
        return None
    return k if k < rows else None


def _bin_bytes(
    row: np.ndarray,
    nbytes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    n_rows: int,
    bin_s: float,
    n_bins: int,
) -> np.ndarray:
    """Bytes per (row, bin), each transfer's spread evenly over ``[start, end]``.

    A transfer inside one bin adds its bytes there; otherwise its first and last bins
    get the parts of it they overlap, and the bins between get ``rate * bin_s`` each,
    through a difference array (so the work is per transfer, not per bin covered).
    """
    first = np.clip(np.floor(start / bin_s).astype(np.int64), 0, n_bins - 1)
    last = np.clip(np.floor(end / bin_s).astype(np.int64), 0, n_bins - 1)
    one = (first == last) | ~(end > start)
    size = n_rows * n_bins
    cells = np.zeros(size)  # (bincount of no entries gives integers)
    cells += np.bincount(row[one] * n_bins + first[one], weights=nbytes[one], minlength=size)
    many = ~one
    if many.any():
        r, a, b = row[many], first[many], last[many]
        s, e = start[many], end[many]
        rate = nbytes[many] / (e - s)
        head = rate * ((a + 1) * bin_s - s)
        tail = rate * (e - b * bin_s)
        cells += np.bincount(r * n_bins + a, weights=head, minlength=size)
        cells += np.bincount(r * n_bins + b, weights=tail, minlength=size)
        # Full bins a+1 .. b-1: + rate from a+1, - rate from b (a difference array).
        width = n_bins + 1
        full = np.bincount(r * width + a + 1, weights=rate * bin_s, minlength=n_rows * width)
        full -= np.bincount(r * width + b, weights=rate * bin_s, minlength=n_rows * width)
        cells += np.cumsum(full.reshape(n_rows, width), axis=1)[:, :n_bins].ravel()
    return cells.reshape(n_rows, n_bins)


def _expand(per_rep: np.ndarray, row_of_rank: np.ndarray, period: int, n_rows: int) -> np.ndarray:
    """Rows from the representatives' bytes: row ``row_of_rank[r]`` adds ``per_rep[r %
    period]`` for every rank r, as (row, representative) pairs with their counts."""
    p = len(row_of_rank)
    pairs, count = np.unique(row_of_rank * period + np.arange(p) % period, return_counts=True)
    row, rep = pairs // period, pairs % period
    out = np.zeros((n_rows, per_rep.shape[1]))
    for first in range(0, len(pairs), _PAIRS_AT_ONCE):  # bounded memory: pairs x bins
        part = slice(first, first + _PAIRS_AT_ONCE)
        r = row[part]
        heads = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])  # pairs are sorted by row
        sums = np.add.reduceat(per_rep[rep[part]] * count[part, None], heads, axis=0)
        out[r[heads]] += sums
    return out


def copies_note(maps: Sequence[Heatmap], period: int | None) -> str:
    """The note a figure or trace carries when rows were expanded by symmetry."""
    if period is None:
        return ""
    copies = next((m.copies for m in maps if m.copies), None)
    text = f"symmetric ranks simulated once: rank r does what rank r mod {period} does"
    if copies == 1:
        text += ", so every server's row is server 0's"
    elif copies:
        text += f", so server s's row is server (s mod {copies})'s"
    return text


def heatmap_figure(
    maps: Sequence[Heatmap],
    *,
    title: str = "",
    notes: Sequence[str] = (),
    width: int = 1600,
    height: int = 1000,
    dpi: int = 100,
) -> Figure:
    """Draw heat-maps one above the other in pairs (scale-up left, scale-out right),
    time in microseconds across, rows (server or rail index) down, utilisation 0-1 in
    one colour scale.

    >>> import simulator
    >>> g = simulator.ring_graph(4, 100e9, 1e-6)
    >>> fig = heatmap_figure(traffic_heatmaps(simulator.simulate_collective(g, "all_reduce",
    ...                      4e6), g), width=800, height=400)
    >>> [round(x) for x in fig.get_size_inches() * fig.dpi], len(fig.axes)  # 2 panels + bar
    ([800, 400], 3)
    """
    if not maps:
        raise CcsimError("no heat-map to draw")
    if width < 300 or height < 200:
        raise CcsimError(f"heat-map size {width}x{height} px is too small; use at least 300x200")
    bys = [by for by in BYS if any(m.by == by for m in maps)]
    kinds = [t for t in TRAFFIC if any(m.traffic == t for m in maps)]
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.patch.set_facecolor("white")
    ratios = [3 if by == "server" else 1 for by in bys]
    # Title, the bins line and the notes, then room for the panels' own titles.
    top = 1 - (28 + 12 * (1 + len(notes)) + 20) / height
    grid = fig.add_gridspec(
        len(bys),
        len(kinds),
        height_ratios=ratios,
        left=0.06,
        right=0.92,
        top=top,
        bottom=60 / height,
        hspace=0.3,
        wspace=0.16,
    )
    image = None
    for i, by in enumerate(bys):
        for j, kind in enumerate(kinds):
            ax = fig.add_subplot(grid[i, j])
            heat = next((m for m in maps if m.by == by and m.traffic == kind), None)
            if heat is None:
                ax.set_axis_off()
                continue
            edges_us = heat.edges_s * 1e6
            n = len(heat.rows)
            image = ax.imshow(
                heat.values,
                aspect="auto",
                interpolation="antialiased",
                cmap="viridis",
                vmin=0.0,
                vmax=1.0,
                origin="upper",
                extent=(edges_us[0], edges_us[-1], n - 0.5, -0.5),
            )
            low, high = heat.capacity_Bps.min(), heat.capacity_Bps.max()
            what = _rate_text(low) + (f" to {_rate_text(high)}" if high > low else "")
            ax.set_title(
                f"{heat.label} (bytes sent / {what} per {by})",
                fontsize=9,
                loc="left",
            )
            ax.set_ylabel(f"{by} index", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.yaxis.get_major_locator().set_params(integer=True)
            if i == len(bys) - 1:
                ax.set_xlabel("time (µs)", fontsize=8)
    if image is not None:
        bar = fig.colorbar(image, cax=fig.add_axes((0.935, 60 / height, 0.012, top - 60 / height)))
        bar.set_label("utilisation (bytes sent per second / capacity)", fontsize=8)
        bar.ax.tick_params(labelsize=7)
    fig.text(0.06, 1 - 10 / height, title, ha="left", va="top", fontsize=10, fontweight="bold")
    bin_us = maps[0].bin_s * 1e6
    lines = [f"time bins of {bin_us:g} µs; each transfer's bytes spread over its sending time"]
    for k, line in enumerate([*lines, *notes]):
        fig.text(
            0.06,
            1 - (28 + 12 * k) / height,
            line,
            ha="left",
            va="top",
            fontsize=7,
            color="#aa0000" if k else "#444444",
        )
    return fig


def _rate_text(bytes_per_s: float) -> str:
    """``3600 GB/s``, ``102.4 TB/s``: a capacity in GB/s or TB/s (1e9, 1e12 bytes/s).

    >>> _rate_text(3.6e12), _rate_text(4e11)
    ('3.6 TB/s', '400 GB/s')
    """
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.4g} TB/s"
    return f"{bytes_per_s / 1e9:.4g} GB/s"


def collective_heatmap_figure(
    result: CollectiveResult,
    graph: nx.Graph,
    *,
    title: str | None = None,
    maps: Sequence[Heatmap] | None = None,
    **options,
) -> Figure:
    """:func:`heatmap_figure` of ``maps`` (default :func:`traffic_heatmaps`), titled as
    the collective's timeline and noting rows copied by symmetry; ``options`` go to
    :func:`heatmap_figure`."""
    maps = traffic_heatmaps(result, graph) if maps is None else maps
    note = copies_note(maps, _period(result))
    name = str(graph.graph.get("name", ""))
    return heatmap_figure(
        maps,
        title=collective_title(result, name) if title is None else title,
        notes=[note] if note else [],
        **options,
    )


def with_heatmap_counters(
    timeline: Timeline, maps: Sequence[Heatmap], *, note: str = ""
) -> Timeline:
    """``timeline`` with each heat-map row as a counter track (utilisation per bin) in a
    process per map grouping (``"heat-map: servers"``, ``"heat-map: rails"``).

    Rows that are copies by symmetry (:attr:`Heatmap.copies`) are left out: only the
    rows that differ are written, and ``meta["heatmap"]`` says so. A counter sample is
    written where the value changes (rounded to 1e-6), and the counter returns to 0 at
    the end.

    >>> import simulator
    >>> g = simulator.ring_graph(4, 100e9, 1e-6)
    >>> r = simulator.simulate_collective(g, "all_reduce", 4e6)
    >>> from simulator.viz.collective import collective_timeline
    >>> t = with_heatmap_counters(collective_timeline(r, g, links=False),
    ...                           traffic_heatmaps(r, g))
    >>> [c.track for c in t.counters][:3], len(t.counters)  # a server, 4 rails
    (['server 0 scale-up', 'rail 0 scale-up', 'rail 1 scale-up'], 5)
    """
    tracks = list(timeline.tracks)
    counters = list(timeline.counters)
    for heat in maps:
        shown = heat.copies or len(heat.rows)
        edges = heat.edges_s
        for i in range(shown):
            values = np.round(heat.values[i], _COUNTER_DIGITS)
            change = np.r_[True, values[1:] != values[:-1]]
            name = f"{heat.by} {int(heat.rows[i])} {heat.traffic}"
            tracks.append(
                Track(name, f"heat-map: {heat.by}s", "links", HEATMAP_CATEGORY, rank=None)
            )
            counters.append(
                Counter(name, np.r_[edges[:-1][change], edges[-1]], np.r_[values[change], 0.0])
            )
    copies = next((m.copies for m in maps if m.copies), None)
    text = (
        f"heat-map counters: utilisation (bytes sent / capacity) per {maps[0].bin_s * 1e6:g} us "
        "bin, per server and per rail, scale-up and scale-out"
        if maps
        else ""
    )
    if copies == 1:
        text += "; server 0 only: every server's counters are server 0's"
    elif copies:
        text += f"; servers 0-{copies - 1} only: server s's counters are server (s mod {copies})'s"
    if note:
        text += f"; {note}"
    return Timeline(
        tracks=tracks,
        track=timeline.track,
        start_s=timeline.start_s,
        end_s=timeline.end_s,
        kinds=timeline.kinds,
        kind=timeline.kind,
        labels=timeline.labels,
        label=timeline.label,
        args=timeline.args,
        counters=counters,
        phases=timeline.phases,
        title=timeline.title,
        meta={**timeline.meta, **({"heatmap": text} if text else {})},
    )
