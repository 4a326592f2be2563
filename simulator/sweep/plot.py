"""Plot of a metric against a swept axis, one line per group, the knee marked.

Figures are built without pyplot (no global state; the Agg canvas), and written through
a temporary file and an atomic rename, so an interrupted run never leaves half a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from ..viz.plots import set_byte_axis
from .knee import Knee
from .point import METRIC_NAMES
from .spec import SweepError, axis_unit, bandwidth_unit, format_value

_COLORS = ("#1f78b4", "#d95f02", "#33a02c", "#7570b3", "#e7298a", "#a6761d", "#666666")
_FORMATS = ("png", "svg", "pdf")


def _axis_scale(axis: str) -> tuple[float, str]:
    """(factor, label unit) to show an axis's canonical values in readable units."""
    if axis_unit(axis) == "B/s":
        return bandwidth_unit(axis)
    return {"s": (1e6, "us"), "B": (1.0, "bytes")}.get(axis_unit(axis), (1.0, ""))


def metric_scale(metric: str, values: Sequence[float] = ()) -> tuple[float, str]:
    """(factor, axis label) to show ``metric``'s values: its name in words
    (:data:`~.point.METRIC_NAMES`) and a unit that suits the values (times in us, ms or
    s; shares in percent of the step).

    >>> metric_scale("step_s", [0.012, 0.020])
    (1000.0, 'step time (ms)')
    >>> metric_scale("time_s", [3e-5]), metric_scale("busbw_GBps")
    ((1000000.0, 'collective time (us)'), (1.0, 'bus bandwidth (GB/s)'))
    >>> metric_scale("exposed_share")
    (100.0, 'exposed communication (% of step time)')
    >>> metric_scale("my_metric")
    (1.0, 'my_metric')
    """
    name = METRIC_NAMES.get(metric, metric)
    if metric.endswith("_s"):
        largest = max((abs(v) for v in values), default=1e-3)
        factor, unit = (1.0, "s") if largest >= 1 else (1e3, "ms")
        if largest < 1e-3:
            factor, unit = 1e6, "us"
        return factor, f"{name} ({unit})"
    if metric.endswith("_us"):
        return 1.0, f"{name} (us)"
    if metric.endswith("_GBps"):
        return 1.0, f"{name} (GB/s)"
    if metric.endswith("_share"):
        return 100.0, f"{name} (% of step time)"
    return 1.0, name


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
    y_scale, y_label = metric_scale(metric, [m for knee in knees for _, m in knee.curve])
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    xs_all = [x for knee in knees for x, _ in knee.curve]
    for i, knee in enumerate(knees):
        color = _COLORS[i % len(_COLORS)]
        xs = [x * x_scale for x, _ in knee.curve]
        ys = [m * y_scale for _, m in knee.curve]
        name = ", ".join(f"{k}={format_value(k, v)}" for k, v in knee.group.items())
        ax.plot(xs, ys, marker="o", color=color, label=name or y_label)
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
    spread = bool(positive) and len(positive) == len(xs_all) and max(positive) / min(positive) >= 10
    if spread and axis_unit(axis) == "B":  # sizes: 1 KiB, 1 MiB ... rather than 2^n
        set_byte_axis(ax, positive, label=axis)
    else:
        if spread:
            ax.set_xscale("log", base=2)
            ticks = sorted({x * x_scale for x in xs_all})
            ax.set_xticks(ticks, [f"{t:.4g}" for t in ticks])
            ax.minorticks_off()
        ax.set_xlabel(f"{axis} ({x_unit})" if x_unit else axis)
    ax.set_ylabel(y_label)
    tolerance = knees[0].tolerance
    ax.set_title(
        title
        or f"{METRIC_NAMES.get(metric, metric)} against {axis}: knee = smallest value "
        f"within {tolerance:.0%} of the largest setting's"
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
