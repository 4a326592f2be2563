"""Gantt charts of a :class:`~simulator.viz.records.Timeline` with matplotlib.

Layout, top to bottom: the title, a strip of labelled phases, one row per GPU stream
(spans coloured by kind), one row per link (utilisation as a filled area, 0 to 100 % of
the row's height), and a shared time axis. Spans of one track that overlap in time are
drawn in sub-lanes of its row. When a section has more tracks than its row
limit, tracks merge by category (a rank's channels; links of one type), then
consecutive categories into bins; a merged row is labelled with what it holds (``server
0 tp (8 ranks)``) and shows, per pixel column, the share of its member tracks' lanes
that were busy (streams; at least a sliver where any was) or their mean utilisation
(links), averaged exactly over the column's time span. GPU stream tracks with no span
get no row.

Output is deterministic: figures are built without pyplot (no global state, Agg for
PNG), with a fixed size in pixels and dpi, fixed colours, and file metadata without
dates, so the same timeline gives the same bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..errors import CcsimError
from ..files import write_file
from ..version import __version__
from .records import Counter, Timeline

#: Image formats :func:`save_timeline` writes, by file suffix.
IMAGE_FORMATS = ("png", "svg", "pdf")

#: Colours of well-known kinds; other kinds take :data:`_PALETTE` colours in order.
KIND_COLORS = {
    "reduce": "#d95f02",
    "copy": "#1f78b4",
    "compute": "#7570b3",
    "comm": "#1b9e77",
    "idle": "#bdbdbd",
    # Point-to-point ops are short: strong colours keep them visible (pale ones vanished).
    "send": "#2b8cbe",
    "recv": "#de2d26",
}
LINK_COLOR = "#33a02c"
_PALETTE = ("#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666", "#a6cee3", "#fb9a99")
_PHASE_COLORS = ("#fdd0a2", "#c6dbef", "#d9f0d3", "#e5d8bd", "#f2f2f2")

# Layout in pixels.
_TOP = 34
_PHASE_LANE = 16
_BOTTOM = 46
_GAP = 12
_HEADER = 15  # a section's name above its rows
_RIGHT = 20
_ROW_PX = 18
# Single-track rows draw each span as a rectangle up to this many spans in all;
# beyond, rows are drawn as per-pixel busy shares like merged rows.
_MAX_RECTANGLES = 50_000
# A track whose spans overlap more than this many deep is drawn as a busy share.
_MAX_LANES = 8
#: Least height (share of a row) drawn in a pixel column where a merged row is busy at
#: all, so that sparse work stays visible.
MIN_VISIBLE_SHARE = 0.25
#: What the stream section's heading adds when rows are merged.
MERGED_NOTE = "a row of several ranks or channels: the share of them busy"


@dataclass
class _Row:
    label: str
    members: list[int]  # track indices


def kind_colors(kinds: Sequence[str]) -> dict[str, str]:
    """The colour of each kind: :data:`KIND_COLORS`, then a fixed palette in order."""
    out, spare = {}, iter(_PALETTE * (1 + len(kinds) // len(_PALETTE)))
    for kind in kinds:
        out[kind] = KIND_COLORS.get(kind) or next(spare)
    return out


def _counted(timeline: Timeline, members: list[int]) -> str:
    """What a merged row's members are, in words: ``8 ranks``, ``2 channels``, ``8 links``.

    >>> from simulator.viz.records import Track
    >>> t = Timeline.from_spans([], tracks=[Track(f"rank {r} comm", rank=r) for r in range(8)])
    >>> _counted(t, list(range(8)))
    '8 ranks'
    """
    tracks = [timeline.tracks[i] for i in members]
    ranks = {track.rank for track in tracks}
    if all(track.section == "links" for track in tracks):
        return f"{len(tracks)} links"
    if None not in ranks and len(ranks) == len(tracks):
        return f"{len(tracks)} ranks"
    if len(ranks) == 1 and None not in ranks:
        what = "channels" if all(" ch " in track.name for track in tracks) else "streams"
        return f"{len(tracks)} {what}"
    return f"{len(tracks)} rows"


def _rows(timeline: Timeline, section: str, limit: int) -> list[_Row]:
    """Rows of one section: tracks, else categories, else bins of categories. A merged
    row's label says what it holds (``server 0 tp (8 ranks)``). GPU stream tracks with
    no span are left out: an empty row only pushes the others apart."""
    members = [i for i, t in enumerate(timeline.tracks) if t.section == section]
    if section == "streams":
        spans = np.bincount(timeline.track, minlength=len(timeline.tracks))
        members = [i for i in members if spans[i]]
    if len(members) <= limit:
        return [_Row(timeline.tracks[i].name, [i]) for i in members]
    categories: dict[str, list[int]] = {}
    for i in members:
        track = timeline.tracks[i]
        categories.setdefault(track.category or track.name, []).append(i)
    names = list(categories)
    if len(names) <= limit:
        return [
            _Row(timeline.tracks[categories[name][0]].name, categories[name])
            if len(categories[name]) == 1
            else _Row(f"{name} ({_counted(timeline, categories[name])})", categories[name])
            for name in names
        ]
    size = math.ceil(len(names) / limit)
    rows = []
    for start in range(0, len(names), size):
        chunk = names[start : start + size]
        tracks = [i for name in chunk for i in categories[name]]
        label = chunk[0] if len(chunk) == 1 else f"{chunk[0]} … {chunk[-1]}"
        rows.append(_Row(f"{label} ({_counted(timeline, tracks)})", tracks))
    return rows


def _time_unit(extent: float) -> tuple[str, float]:
    if extent >= 1:
        return "s", 1.0
    if extent >= 1e-3:
        return "ms", 1e3
    if extent >= 1e-6:
        return "us", 1e6
    return "ns", 1e9


def _busy_share(start: np.ndarray, end: np.ndarray, edges: np.ndarray, members: int) -> np.ndarray:
    """Mean number of the spans active in each bin, divided by ``members``.

    The count of active spans is a step function; its integral is piecewise linear, so
    interpolating the integral at the bin edges gives each bin's exact average.
    """
    if len(start) == 0:
        return np.zeros(len(edges) - 1)
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(delta[order])
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
    integral = np.interp(edges, times, area, left=0.0, right=float(area[-1]))
    return np.diff(integral) / np.diff(edges) / members


def _counter_mean(counters: list[Counter], edges: np.ndarray) -> np.ndarray:
    """Mean value of step-function counters over each bin, averaged over counters."""
    total = np.zeros(len(edges) - 1)
    for counter in counters:
        t, v = np.asarray(counter.time_s, float), np.asarray(counter.value, float)
        if len(t) == 0:
            continue
        area = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])
        integral = np.interp(edges, t, area, left=0.0, right=float(area[-1]))
        # After the last sample the value holds on (it is 0 for link utilisation).
        integral += np.clip(edges - t[-1], 0.0, None) * v[-1]
        total += np.diff(integral) / np.diff(edges)
    return total / max(len(counters), 1)


def timeline_figure(
    timeline: Timeline,
    *,
    width: int = 1600,
    height: int | None = None,
    dpi: int = 100,
    max_rows: int = 64,
    max_link_rows: int = 24,
    links: bool = True,
    title: str | None = None,
) -> Figure:
    """Draw ``timeline`` as a Gantt chart (see the module docstring).

    Parameters
    ----------
    timeline : Timeline
        What to draw.
    width, height : int
        Size of the image in pixels; ``height=None`` fits the number of rows (18 px
        each, between 300 and 2400 px).
    dpi : int
        Pixels per inch (text sizes are in points, so this scales the text).
    max_rows, max_link_rows : int
        Rows beyond which stream and link tracks are merged.
    links : bool
        Draw the link rows (if the timeline has any).
    title : str, optional
        Defaults to ``timeline.title``.

    Returns
    -------
    matplotlib.figure.Figure
        Not attached to pyplot: save it with :func:`save_timeline` or ``fig.savefig``,
        or show it in a notebook with ``display(fig)``.

    Examples
    --------
    >>> t = Timeline.from_spans([("rank 0", 0, 2e-6, "copy"), ("rank 1", 1e-6, 3e-6, "reduce")])
    >>> fig = timeline_figure(t, width=640, height=320)
    >>> [round(x) for x in fig.get_size_inches() * fig.dpi]
    [640, 320]
    """
    if width < 200 or (height is not None and height < 150):
        raise CcsimError(f"timeline size {width}x{height} px is too small; use at least 200x150")
    stream_rows = _rows(timeline, "streams", max_rows)
    link_rows = _rows(timeline, "links", max_link_rows) if links else []
    counters = {c.track: c for c in timeline.counters}
    phase_lanes, n_lanes = timeline.phase_lanes()
    n_rows = len(stream_rows) + len(link_rows)
    phase_px = n_lanes * _PHASE_LANE + (8 if n_lanes else 0)
    sections = bool(stream_rows) + bool(link_rows)
    fixed = _TOP + phase_px + _BOTTOM + sections * _HEADER + (_GAP if sections == 2 else 0)
    if height is None:
        height = int(min(max(fixed + _ROW_PX * max(n_rows, 1), 300), 2400))
    available = height - fixed
    if available < 20:
        raise CcsimError(f"timeline height {height} px leaves no room for {n_rows} rows")
    row_px = available / max(n_rows, 1)
    point = 72 / dpi  # points per pixel
    label_pt = float(np.clip(row_px * 0.62 * point, 4.0, 9.0))
    labels = [r.label for r in stream_rows + link_rows]
    longest = max((len(text) for text in labels), default=4)
    left_px = min(max(60.0, 14 + longest * label_pt / point * 0.58), 0.4 * width)

    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.patch.set_facecolor("white")
    plot_w = (width - left_px - _RIGHT) / width
    x0 = left_px / width
    t0, t1 = timeline.t_start, timeline.t_end
    if not t1 > t0:
        t1 = t0 + 1e-9
    unit, scale = _time_unit(t1 - t0)
    xlim = (t0 * scale, t1 * scale)
    n_bins = max(int(plot_w * width), 10)
    edges = np.linspace(t0, t1, n_bins + 1)

    def axes(top_px: float, height_px: float):
        ax = fig.add_axes((x0, (height - top_px - height_px) / height, plot_w, height_px / height))
        ax.set_xlim(*xlim)
        return ax

    top = _TOP
    all_axes = []
    if n_lanes:
        ax = axes(top, n_lanes * _PHASE_LANE)
        _draw_phases(ax, timeline, phase_lanes, n_lanes, scale, label_pt)
        all_axes.append(ax)
        top += phase_px
    colors = kind_colors(timeline.kinds)
    used_kinds: list[int] = []
    if stream_rows:
        top += _HEADER
        h = row_px * len(stream_rows)
        ax = axes(top, h)
        used_kinds = _draw_streams(ax, timeline, stream_rows, colors, scale, edges)
        heading = "GPU streams: transfers each sends"
        if any(len(row.members) > 1 for row in stream_rows):
            heading += f"; {MERGED_NOTE}"
        _style_rows(ax, stream_rows, label_pt, heading)
        all_axes.append(ax)
        top += h + (_GAP if link_rows else 0)
    if link_rows:
        top += _HEADER
        ax = axes(top, row_px * len(link_rows))
        _draw_links(ax, timeline, link_rows, counters, scale, edges)
        _style_rows(ax, link_rows, label_pt, "links: utilisation (row height = 100 %)")
        all_axes.append(ax)
    for ax in all_axes[:-1]:
        ax.tick_params(axis="x", labelbottom=False)
    for ax in all_axes:
        for phase in timeline.phases[1:]:
            ax.axvline(phase.start_s * scale, color="#555555", lw=0.6, ls=":", zorder=0)
    if all_axes:
        all_axes[-1].set_xlabel(f"time ({unit})", fontsize=9)
        all_axes[-1].tick_params(axis="x", labelsize=8)

    text = timeline.title if title is None else title
    fig.text(x0, 1 - 8 / height, text, ha="left", va="top", fontsize=10, fontweight="bold")
    notes = timeline.meta.get("notes") or []
    if notes:
        fig.text(
            x0, 1 - 22 / height, "; ".join(notes), ha="left", va="top", fontsize=7, color="#aa0000"
        )
    handles = [Patch(color=colors[timeline.kinds[k]], label=timeline.kinds[k]) for k in used_kinds]
    if link_rows:
        handles.append(Patch(color=LINK_COLOR, label="link utilisation"))
    if handles:
        fig.legend(
            handles=handles,
            loc="upper right",
            ncol=len(handles),
            fontsize=8,
            frameon=False,
            bbox_to_anchor=(1 - _RIGHT / width, 1 - 2 / height),
        )
    return fig


def _style_rows(ax, rows: list[_Row], label_pt: float, name: str) -> None:
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.label for r in rows], fontsize=label_pt)
    ax.tick_params(axis="y", length=0)
    ax.text(0, 1, name, transform=ax.transAxes, ha="left", va="bottom", fontsize=8, color="#333333")
    ax.grid(axis="x", color="#dddddd", lw=0.5)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_phases(ax, timeline: Timeline, lanes: list[int], n_lanes: int, scale, label_pt):
    ax.set_ylim(n_lanes, 0)
    ax.axis("off")
    for i, (phase, lane) in enumerate(zip(timeline.phases, lanes, strict=True)):
        a, b = phase.start_s * scale, phase.end_s * scale
        ax.add_patch(
            matplotlib.patches.Rectangle(
                (a, lane + 0.08),
                b - a,
                0.84,
                color=_PHASE_COLORS[i % len(_PHASE_COLORS)],
                lw=0,
            )
        )
        ax.text(
            (a + b) / 2,
            lane + 0.5,
            phase.name,
            ha="center",
            va="center",
            fontsize=max(label_pt, 7),
            clip_on=True,
        )


def _draw_streams(ax, timeline: Timeline, rows, colors, scale, edges) -> list[int]:
    """Draw stream rows; return the kinds drawn, in timeline order."""
    row_of_track = np.full(len(timeline.tracks), -1)
    for r, row in enumerate(rows):
        row_of_track[row.members] = r
    lane, lanes = timeline.lanes()
    span_row = row_of_track[timeline.track] if len(timeline) else np.zeros(0, dtype=int)
    span_lanes = lanes[timeline.track] if len(timeline) else np.zeros(0, dtype=int)
    on = span_row >= 0
    # A row of one track draws its spans as rectangles, overlapping ones in sub-lanes.
    single = np.array([len(row.members) == 1 for row in rows] + [False])
    rect = on & single[span_row] & (span_lanes <= _MAX_LANES)
    if rect.sum() > _MAX_RECTANGLES:
        rect[:] = False
    used = sorted(set(timeline.kind[on].tolist()))
    for k in used:
        mine = rect & (timeline.kind == k)
        if mine.any():
            x0 = timeline.start_s[mine] * scale
            x1 = timeline.end_s[mine] * scale
            height = 0.76 / span_lanes[mine]
            y0 = span_row[mine] - 0.38 + lane[mine] * height
            y1 = y0 + height
            verts = np.stack(
                [
                    np.stack([x0, y0], 1),
                    np.stack([x0, y1], 1),
                    np.stack([x1, y1], 1),
                    np.stack([x1, y0], 1),
                ],
                1,
            )
            ax.add_collection(
                PolyCollection(
                    verts, facecolors=colors[timeline.kinds[k]], edgecolors="white", linewidths=0.25
                )
            )
    # Other rows: the busy share per pixel column, out of the lanes of their tracks.
    x = edges * scale
    dense = on & ~rect
    for r, row in enumerate(rows):
        if not (dense & (span_row == r)).any():
            continue
        capacity = int(lanes[row.members].sum())
        base = np.zeros(len(edges) - 1)
        for k in used:
            mine = dense & (span_row == r) & (timeline.kind == k)
            if not mine.any():
                continue
            share = _busy_share(timeline.start_s[mine], timeline.end_s[mine], edges, capacity)
            # A short op among many ranks is a tiny share of a pixel column: lift any
            # busy column to a sliver, or a row with work on it would look empty.
            share = np.where(share > 0, np.maximum(share, MIN_VISIBLE_SHARE), 0.0)
            top = np.minimum(base + share, 1.0)
            ax.fill_between(
                x,
                _steps(r + 0.38 - 0.76 * base),
                _steps(r + 0.38 - 0.76 * top),
                step="post",
                color=colors[timeline.kinds[k]],
                lw=0,
            )
            base = top
    return used


def _steps(values: np.ndarray) -> np.ndarray:
    """Per-bin values extended to the bin edges, for ``fill_between(step="post")``."""
    return np.append(values, values[-1])


def _draw_links(ax, timeline: Timeline, rows, counters, scale, edges) -> None:
    x = edges * scale
    for r, row in enumerate(rows):
        mine = [
            counters[timeline.tracks[i].name]
            for i in row.members
            if timeline.tracks[i].name in counters
        ]
        if mine:
            value = np.clip(_counter_mean(mine, edges), 0.0, 1.0)
        else:  # no counter: busy share of the row's spans
            spans = np.isin(timeline.track, row.members)
            value = _busy_share(
                timeline.start_s[spans], timeline.end_s[spans], edges, len(row.members)
            )
        ax.fill_between(
            x, r + 0.42, _steps(r + 0.42 - 0.84 * value), step="post", color=LINK_COLOR, lw=0
        )
        ax.axhline(r - 0.42, color="#eeeeee", lw=0.5, zorder=0)


def save_timeline(
    timeline: Timeline,
    path: str | Path,
    *,
    width: int = 1600,
    height: int | None = None,
    dpi: int = 100,
    **options,
) -> None:
    """Write the Gantt chart of ``timeline`` to ``path`` (.png, .svg or .pdf).

    The file is written atomically (a temporary file in the same folder, then a rename)
    and is byte-identical for the same timeline, size and matplotlib version. Other
    keyword arguments go to :func:`timeline_figure`.
    """
    path = Path(path)
    fmt = image_format(path)
    fig = timeline_figure(timeline, width=width, height=height, dpi=dpi, **options)
    write_file(path, figure_bytes(fig, fmt))


def image_format(path: str | Path) -> str:
    """The image format named by ``path``'s suffix; an error lists the valid ones."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in IMAGE_FORMATS:
        raise CcsimError(
            f"cannot write an image to {str(path)!r}: the file name must end in "
            + ", ".join(f".{f}" for f in IMAGE_FORMATS)
        )
    return fmt


def figure_bytes(fig: Figure, fmt: str = "png") -> bytes:
    """Render ``fig`` to bytes with fixed metadata (no dates), so output is reproducible."""
    creator = f"ccsim {__version__}"
    metadata = {
        "png": {"Software": creator},
        "svg": {"Date": None, "Creator": creator},
        "pdf": {"CreationDate": None, "ModDate": None, "Creator": creator, "Producer": creator},
    }[fmt]
    buffer = io.BytesIO()
    # SVG element ids are hashes salted with a random value unless a salt is given.
    with matplotlib.rc_context({"svg.hashsalt": "ccsim", "svg.fonttype": "path"}):
        fig.savefig(buffer, format=fmt, dpi=fig.dpi, metadata=metadata)
    return buffer.getvalue()
