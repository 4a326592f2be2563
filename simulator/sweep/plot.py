"""Plot of a metric against a swept axis, one line per group, the knee marked.

Figures are built without pyplot (no global state; the Agg canvas), and written through
a temporary file and an atomic rename, so an interrupted run never leaves half a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from .knee import Knee
from .spec import SweepError, axis_unit, bandwidth_unit, format_value

_COLORS = ("#1f78b4", "#d95f02", "#33a02c", "#7570b3", "#e7298a", "#a6761d", "#666666")
_FORMATS = ("png", "svg", "pdf")


def _axis_scale(axis: str) -> tuple[float, str]:
    """(factor, label unit) to show an axis's canonical values in readable units."""
    if axis_unit(axis) == "B/s":
        return bandwidth_unit(axis)
    return {"s": (1e6, "us"), "B": (1.0, "bytes")}.get(axis_unit(axis), (1.0, ""))


def _metric_scale(metric: str) -> tuple[float, str]:
    if metric.endswith("_s"):
        return 1e3, "ms"
    if metric.endswith("_us"):
        return 1.0, "us"
    if metric.endswith("_GBps"):
        return 1.0, "GB/s"
    return 1.0, ""


def knee_figure(
    knees: Sequence[Knee],
    *,
    title: str = "",
    width: int = 900,
    height: int = 500,
    dpi: int = 100,
) -> Figure:
    """Draw each group's metric against the axis and mark its knee.

    The shaded band is the tolerance around each group's reference (the value at the
    largest setting); the knee is the first point from which the curve stays in it.

    Examples
    --------
    >>> from simulator.sweep.knee import find_knee
    >>> rows = [{"key": str(x), "server.nic.bandwidth": x * 1e9, "status": "ok",
    ...          "step_s": 1 + 8 / x} for x in (1, 2, 4, 8, 16, 32, 64)]
    >>> fig = knee_figure(find_knee(rows, "server.nic.bandwidth", "step_s", 0.1))
    >>> fig.axes[0].get_xlabel()
    'server.nic.bandwidth (Gb/s)'
    """
    if not knees:
        raise SweepError("no knees to plot")
    axis, metric = knees[0].axis, knees[0].metric
    x_scale, x_unit = _axis_scale(axis)
    y_scale, y_unit = _metric_scale(metric)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    xs_all = [x for knee in knees for x, _ in knee.curve]
    for i, knee in enumerate(knees):
        color = _COLORS[i % len(_COLORS)]
        xs = [x * x_scale for x, _ in knee.curve]
        ys = [m * y_scale for _, m in knee.curve]
        name = ", ".join(f"{k}={format_value(k, v)}" for k, v in knee.group.items())
        ax.plot(xs, ys, marker="o", color=color, label=name or metric)
        low = knee.reference_metric * (1 - knee.tolerance) * y_scale
        high = knee.reference_metric * (1 + knee.tolerance) * y_scale
        ax.axhspan(min(low, high), max(low, high), color=color, alpha=0.08, lw=0)
        ax.axvline(knee.knee * x_scale, color=color, ls="--", lw=1)
        ax.plot(
            [knee.knee * x_scale],
            [knee.knee_metric * y_scale],
            marker="*",
            markersize=16,
            color=color,
            markeredgecolor="black",
            zorder=5,
            label=f"knee {format_value(axis, knee.knee)}" + (f" ({name})" if name else ""),
        )
    positive = [x for x in xs_all if x > 0]
    if positive and len(positive) == len(xs_all) and max(positive) / min(positive) >= 10:
        ax.set_xscale("log", base=2)
        ticks = sorted({x * x_scale for x in xs_all})
        ax.set_xticks(ticks, [f"{t:.4g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(f"{axis} ({x_unit})" if x_unit else axis)
    ax.set_ylabel(f"{metric} ({y_unit})" if y_unit else metric)
    tolerance = knees[0].tolerance
    ax.set_title(
        title
        or f"{metric} against {axis}: knee = smallest value within {tolerance:.0%} of the "
        "largest setting's"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` to ``path`` (.png, .svg or .pdf, by suffix) atomically."""
    from ..files import write_file
    from ..viz.timeline import figure_bytes

    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in _FORMATS:
        raise SweepError(f"cannot draw {str(path)!r}: give a .png, .svg or .pdf file name")
    write_file(path, figure_bytes(fig, fmt))
