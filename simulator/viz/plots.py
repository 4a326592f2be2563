"""Plots of result tables: time and bus bandwidth against message size.

Rows are the summary rows of :meth:`simulator.CollectiveResult.row` (``--format json``
objects): ``op, algorithm, ranks, size_bytes, time_us, algbw_GBps, busbw_GBps``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from ..errors import CcsimError
from ..files import write_with

if TYPE_CHECKING:  # types only: plots draw these results, they never run them
    from ..validate.nccl_tests import CaseResult

_COLORS = ("#1f78b4", "#d95f02", "#33a02c", "#7570b3", "#e7298a", "#a6761d", "#666666")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def size_label(size: float, _position: Any = None) -> str:
    """A byte count the way nccl-tests' users write it: 8B, 64K, 1M, 4G (binary).

    >>> size_label(8), size_label(65536), size_label(3 * 2**30)
    ('8B', '64K', '3G')
    """
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g}{unit}"
    return f"{size:.3g}B"


def bandwidth_figure(
    rows: Sequence[Mapping[str, Any]],
    *,
    by: str = "algorithm",
    width: int = 1200,
    height: int = 450,
    dpi: int = 100,
    title: str = "",
) -> Figure:
    """Time (log-log) and bus bandwidth against size, one line per value of ``by``.

    Parameters
    ----------
    rows : sequence of mappings
        Result rows with ``size_bytes``, ``time_us``, ``busbw_GBps`` and the ``by`` key.
    by : str
        Row key whose values make the lines (``"algorithm"``, ``"op"``...).
    width, height, dpi : int
        Image size in pixels and resolution.

    Examples
    --------
    >>> rows = [{"algorithm": "ring", "size_bytes": s, "time_us": s / 1e3, "busbw_GBps": 1.0}
    ...         for s in (1024, 2048)]
    >>> [round(v) for v in bandwidth_figure(rows).get_size_inches() * 100]
    [1200, 450]
    """
    if not rows:
        raise CcsimError("no rows to plot")
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        lines.setdefault(str(row[by]), []).append(row)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.patch.set_facecolor("white")
    left = fig.add_axes((0.07, 0.14, 0.39, 0.74))
    right = fig.add_axes((0.57, 0.14, 0.39, 0.74))
    for i, (name, members) in enumerate(lines.items()):
        members = sorted(members, key=lambda r: r["size_bytes"])
        sizes = [r["size_bytes"] for r in members]
        style = {
            "color": _COLORS[i % len(_COLORS)],
            "marker": _MARKERS[i % len(_MARKERS)],
            "ms": 4,
            "lw": 1.5,
            "label": name,
        }
        left.plot(sizes, [r["time_us"] for r in members], **style)
        right.plot(sizes, [r["busbw_GBps"] for r in members], **style)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(FuncFormatter(size_label))
        ax.set_xlabel("message size (bytes, binary units)", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(color="#dddddd", lw=0.5)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    left.set_yscale("log")
    left.set_ylabel("time (us)", fontsize=9)
    right.set_ylabel("bus bandwidth (GB/s, 1e9 B/s)", fontsize=9)
    right.set_ylim(bottom=0)
    right.legend(fontsize=8, frameon=False, loc="upper left")
    if title:
        fig.text(0.07, 0.97, title, ha="left", va="top", fontsize=10, fontweight="bold")
    return fig


def save_plot(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> None:
    """Bus bandwidth against size (log x), one line per algorithm, written atomically."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    path = Path(path)
    suffix = path.suffix.lower().lstrip(".") or "png"
    figure = Figure(figsize=(8, 5), dpi=100)
    axes = figure.add_subplot()
    for name in dict.fromkeys(row["algorithm"] for row in rows):
        mine = [row for row in rows if row["algorithm"] == name]
        axes.plot(
            [row["size_bytes"] for row in mine],
            [row["busbw_GBps"] for row in mine],
            marker="o",
            markersize=3,
            label=name,
        )
    axes.set_xscale("log", base=2)
    sizes = [row["size_bytes"] for row in rows]
    low, high = math.floor(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    step = max(1, (high - low + 11) // 12)  # at most about 12 labelled ticks
    axes.set_xticks([2.0**e for e in range(low, high + 1, step)])
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: _binary(x)))
    axes.xaxis.set_minor_formatter(FuncFormatter(lambda _x, _pos: ""))
    axes.set_xlabel("message size (bytes; K, M, G = 2^10, 2^20, 2^30)")
    axes.set_ylabel("bus bandwidth (GB/s, 1e9 B/s)")
    axes.set_title(title, fontsize=9)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    write_with(path, lambda stream: figure.savefig(stream, format=suffix))


def _binary(size: float) -> str:
    """A byte count as nccl-tests users write it: 512, 64K, 1M, 4G."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}"


def byte_label(size: float, _position: Any = None) -> str:
    """A byte count as an axis tick a newcomer reads at once: 512 B, 64 KiB, 1 GiB.

    >>> byte_label(512), byte_label(65536), byte_label(2**30), byte_label(3 * 2**19)
    ('512 B', '64 KiB', '1 GiB', '1.5 MiB')
    """
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size:.4g} B"


def byte_ticks(sizes: Sequence[float], most: int = 9) -> list[float]:
    """Tick positions for a log-2 axis of byte counts: 1 B, 1 KiB, 1 MiB, 1 GiB where
    the sizes span several of them, else powers of two a few apart (at most ``most``).

    >>> [byte_label(t) for t in byte_ticks([8, 8 * 2**30])]
    ['1 KiB', '1 MiB', '1 GiB']
    >>> [byte_label(t) for t in byte_ticks([2**20, 2**24])]
    ['1 MiB', '2 MiB', '4 MiB', '8 MiB', '16 MiB']
    """
    low = math.ceil(math.log2(min(sizes)) - 1e-9)
    high = math.floor(math.log2(max(sizes)) + 1e-9)
    for step in (1, 2, 10, 20):  # every power of two, every fourth, or 1 KiB, 1 MiB...
        ticks = [e for e in range(low, high + 1) if e % step == 0]
        if len(ticks) <= most and (step < 10 or len(ticks) >= 2):
            return [2.0**e for e in ticks]
    return [2.0**e for e in range(low, high + 1) if e % 10 == 0]


def set_byte_axis(ax: Any, sizes: Sequence[float], *, label: str = "message size") -> None:
    """Make the x axis of ``ax`` a log-2 axis of byte counts with :func:`byte_ticks`
    labelled by :func:`byte_label` (and no minor labels)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(byte_ticks(sizes), [byte_label(t) for t in byte_ticks(sizes)])
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda _x, _pos: ""))
    ax.set_xlabel(f"{label} (KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes)")


def validation_figure(results: Sequence[CaseResult]) -> Figure:
    """Measured vs simulated busbw against size, one panel per case (a grid of up to
    four columns), sizes on readable byte ticks (:func:`byte_ticks`)."""
    good = [r for r in results if not r.error]
    if not good:
        raise CcsimError("no case ran; nothing to plot")
    columns = min(4, len(good))  # a grid, so that many cases stay readable
    rows = -(-len(good) // columns)
    fig = Figure(figsize=(4.5 * columns, 3.6 * rows), layout="tight")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[len(good) :]:
        ax.set_visible(False)
    for ax, result in zip(axes.flat, good, strict=False):
        ax.plot(result.sizes, result.measured_busbw, "o-", label="measured", color="black")
        ax.plot(result.sizes, result.simulated_busbw, "s--", label="ccsim", color="tab:blue")
        set_byte_axis(ax, result.sizes)
        ax.set_xlabel("message size", fontsize=9)
        ax.tick_params(axis="x", labelsize=8, labelrotation=30)
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(result.name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def plot_validation(results: list[CaseResult], path: str | Path) -> None:
    """Write :func:`validation_figure` to ``path`` (format by suffix), atomically."""
    fig = validation_figure(results)
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".") or "png"
    write_with(
        path,
        lambda stream: fig.savefig(
            stream, format=fmt, metadata={"Software": None} if fmt == "png" else None
        ),
    )
