"""Parameter sweeps: size interconnects by simulating many variants of one scenario.

A sweep spec (YAML, :mod:`~simulator.sweep.spec`) names a base scenario, a collective
or a workload on a topology, and the axes to vary: topology parameters
(``server.nic.bandwidth``, ``fabric.oversubscription``...), algorithm, message size,
node count, workload parameters. :func:`run_sweep` runs every point on this machine's
cores or on a Dask cluster, appending each result to a CSV file as it completes and
skipping the points already there; :func:`find_knee` finds the smallest setting of an
axis that is within a tolerance of the largest; :func:`size` does both and draws it,
and with unit prices (or per watt) costs every point and names the cheapest that meets a
target (:mod:`~.cost`).

>>> frame = run_sweep({"scenario": {"collective": "all_reduce", "size": "64M"},
...                    "axes": {"server.intra.bandwidth": ["150GB/s", "300GB/s"]}},
...                   workers=1)
>>> list(frame["status"])
['ok', 'ok']

Modules: :mod:`~.spec` (parsing, validation, point keys), :mod:`~.point` (running one
point), :mod:`~.runners` (in-process, process pool, Dask), :mod:`~.store` (the results
file), :mod:`~.run` (the sweep loop), :mod:`~.knee`, :mod:`~.cost` and :mod:`~.plot`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cost import MEASURES, Choice, cheapest_meeting, cost_rows, point_costs
from .knee import Knee, find_knee, is_number, knee_of
from .plot import knee_figure, save_figure
from .point import METRIC_NAMES, METRICS, build_topology, run_point
from .run import SweepRun, execute_sweep, read_results, result_columns, run_sweep
from .spec import Axis, Point, SweepError, SweepSpec, format_value, load_spec, point_key


@dataclass
class SizeResult:
    """What :func:`size` found: the sweep, the knee of each group, the figure; with
    prices or per watt, every point's cost (:func:`~.cost.cost_rows`, spec order) and
    what it was ranked by (``per``); with a target, the :class:`~.cost.Choice`."""

    run: SweepRun
    knees: list[Knee]
    figure: Any = field(repr=False, default=None)
    points: list[dict[str, Any]] = field(repr=False, default_factory=list)
    per: str | None = None
    choice: Choice | None = None
    #: Items of the points' topologies whose power no cited figure gives (left out of
    #: ``network_kw``; ``watts`` fills them in).
    unpowered: list[str] = field(default_factory=list)

    def table(self) -> Any:
        """The knees as a pandas DataFrame (one row per group)."""
        import pandas as pd

        return pd.DataFrame([knee.row() for knee in self.knees])


def default_metric(spec: SweepSpec) -> str:
    """``step_s`` for workloads, ``busbw_GBps`` for collectives."""
    return "step_s" if spec.kind == "workload" else "busbw_GBps"


def size(
    spec: SweepSpec | str | Path | Mapping[str, Any],
    axis: str | None = None,
    metric: str | None = None,
    tolerance: float = 0.05,
    *,
    by: Sequence[str] | None = None,
    out: str | Path | None = None,
    plot: str | Path | None = None,
    prices: Mapping[str, float] | None = None,
    watts: Mapping[str, float] | None = None,
    per: str | None = None,
    target: float | None = None,
    prices_source: str = "prices",
    **options: Any,
) -> SizeResult:
    """Run a sweep and find the knee of ``metric`` against ``axis``; with ``prices`` (or
    ``per="watt"``) also cost every point and, with a ``target``, name the cheapest
    that meets it. A sweep of a named axis (``fabric: [leaf-spine, fat-tree]``) has no
    knee, and is only costed.

    Parameters
    ----------
    spec : SweepSpec, path or mapping
    axis : str, optional
        The axis to size (default: the spec's only axis).
    metric : str, optional
        Default ``step_s`` for workloads, ``busbw_GBps`` for collectives.
    tolerance : float
        Relative tolerance of the knee (0.05: within 5 % of the largest setting's).
    by : sequence of str, optional
        Axes that split the results into groups (default: the other varying axes).
    out : path, optional
        Results CSV (resumable), as for :func:`run_sweep`.
    plot : path, optional
        Also write the figure there (.png, .svg, .pdf).
    prices : mapping of item to unit price, optional
        Cost every point's topology (:mod:`simulator.topology.bom`); every item a point
        needs must have a price (0 leaves one out), checked before the sweep runs.
    watts : mapping of item to watts, optional
        Typical watts that fill in or override the cited ones for ``network_kw``.
    per : {"dollar", "watt"}, optional
        What the points are ranked by: ``fabric_cost`` (the default with prices) or
        ``network_kw``.
    target : float, optional
        The metric to meet, in its unit (seconds, GB/s): ``choice`` names the cheapest
        point that meets it (at most it for times, at least it for bandwidths).
    prices_source : str
        The name of the prices in messages (the file they came from).
    **options
        Passed to :func:`execute_sweep` (``workers``, ``scheduler``, ``client``,
        ``progress``...).

    Examples
    --------
    >>> found = size({"scenario": {"collective": "all_reduce", "size": "256M", "nodes": 2},
    ...               "axes": {"server.nic.bandwidth": ["100Gbps", "200Gbps", "400Gbps",
    ...                                                 "800Gbps"]}}, workers=1)
    >>> format_value("server.nic.bandwidth", found.knees[0].knee)  # PCIe, as NCCL runs it
    '200 Gb/s'
    """
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    if axis is None:
        if len(spec.axes) != 1:
            raise SweepError(
                f"{spec.source}: the sweep has several axes ({', '.join(spec.columns)}); "
                "say which one to size"
            )
        axis = spec.axes[0].name
    if axis not in spec.columns:
        raise SweepError(
            f"{spec.source}: {axis!r} is not an axis of this sweep; axes: "
            + ", ".join(spec.columns)
        )
    metric = metric or default_metric(spec)
    if metric not in METRICS[spec.kind]:
        raise SweepError(
            f"unknown metric {metric!r} for a {spec.kind} sweep; valid: "
            + ", ".join(METRICS[spec.kind])
        )
    if per is None:
        per = "dollar" if prices is not None else "watt" if watts is not None else None
    # A knee needs a numeric axis; a sweep of fabrics by name is still worth costing.
    values = next(a.values for a in spec.axes if a.name == axis)
    knees_wanted = all(is_number(v) for v in values)
    if not knees_wanted and (per is None or plot is not None):
        raise SweepError(
            f"{spec.source}: axis {axis!r} has the value {values[0]!r}; a knee needs a "
            "numeric axis (a bandwidth, latency, size or count)"
            + ("" if plot is not None else "; to rank its points, give prices or per watt")
        )
    if per is not None and per not in MEASURES:
        raise SweepError(f"per must be one of {', '.join(MEASURES)}, not {per!r}")
    if per == "dollar" and prices is None:
        raise SweepError("ranking per dollar needs unit prices")
    if target is not None and per is None:
        raise SweepError(
            "a target needs unit prices (the cheapest by cost) or per='watt' (the least "
            "network power)"
        )
    # Costed before the sweep runs: a missing price fails in a second, not after hours.
    costs = point_costs(spec, prices=prices, watts=watts, source=prices_source) if per else None
    run = execute_sweep(spec, out, **options)
    knees, figure = [], None
    if knees_wanted:
        knees = find_knee(run.rows, axis, metric, tolerance, by=by)
        figure = knee_figure(
            knees, title=f"{spec.name}: {METRIC_NAMES.get(metric, metric)} against {axis}"
        )
    if plot is not None:
        save_figure(figure, plot)
    found = SizeResult(run, knees, figure, per=per)
    if costs is not None:
        found.points = cost_rows(spec, run.rows, costs, metric, target=target)
        found.unpowered = sorted({item for cost in costs for item in cost.unpowered})
        if target is not None:
            found.choice = cheapest_meeting(found.points, metric, target, MEASURES[str(per)])
    return found


__all__ = [
    "METRICS",
    "Axis",
    "Choice",
    "Knee",
    "Point",
    "SizeResult",
    "SweepError",
    "SweepRun",
    "SweepSpec",
    "build_topology",
    "default_metric",
    "execute_sweep",
    "find_knee",
    "format_value",
    "knee_figure",
    "knee_of",
    "load_spec",
    "point_key",
    "read_results",
    "result_columns",
    "run_point",
    "run_sweep",
    "save_figure",
    "size",
]
