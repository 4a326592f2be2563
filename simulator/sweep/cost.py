"""What each point of a sweep costs, and the cheapest point that meets a target.

Every point's topology (its preset with the point's values, at its server count) is
counted by :func:`~simulator.topology.bom.bill_of_materials`: with unit prices that
gives the point's ``fabric_cost``, and the cited typical watts its network power
(``network_kw``: switches, NICs and transceivers with a figure). Beside the point's
metric, :func:`per_perf` gives the value for money: cost x seconds for a time (the cost
per step/s, as ``ccsim search --prices`` reports it) and cost / (GB/s) for a bandwidth;
lower is better either way.

:func:`cheapest_meeting` ranks the points by cost (or by power) and names the cheapest
whose metric meets a target (a step of at most 1.2 s, a bus bandwidth of at least
300 GB/s), or, when none does, the best metric reached.

>>> per_perf(1000.0, "step_s", 2.0), per_perf(1000.0, "busbw_GBps", 250.0)
(2000.0, 4.0)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CcsimError
from ..topology.bom import bill_of_materials
from ..units import parse_bandwidth, parse_time
from .point import METRIC_NAMES, one_line, point_graph
from .spec import SweepSpec

#: Metrics for which more is better (bandwidths); for every other metric (times, shares
#: of the step) less is better.
HIGHER_IS_BETTER = ("algbw_GBps", "busbw_GBps")

#: What ``--per`` ranks by: the column of each point's row.
MEASURES = {"dollar": "fabric_cost", "watt": "network_kw"}


def per_perf(amount: float | None, metric: str, value: float | None) -> float | None:
    """``amount`` (a cost, or kW) per unit of performance: ``amount x value`` for a time
    or share (the cost per step/s), ``amount / value`` for a bandwidth (the cost per
    GB/s); None when either is unknown. Lower is better value either way.

    >>> per_perf(50.0, "time_s", 0.5), per_perf(None, "step_s", 1.0)
    (25.0, None)
    """
    if amount is None or value is None or not math.isfinite(value):
        return None
    if metric in HIGHER_IS_BETTER:
        return amount / value if value > 0 else None
    return amount * value


def per_perf_key(prefix: str, metric: str) -> str:
    """The column name of :func:`per_perf` of ``prefix`` (``cost``, ``kw``) and ``metric``.

    >>> per_perf_key("cost", "step_s"), per_perf_key("kw", "busbw_GBps")
    ('cost_x_step_s', 'kw_per_busbw_GBps')
    """
    return f"{prefix}_{'per' if metric in HIGHER_IS_BETTER else 'x'}_{metric}"


#: Relative slack of :func:`meets`: a bus bandwidth of 24.999999999999996 GB/s (25 GB/s
#: up to float rounding) meets a target of 25 GB/s.
_SLACK = 1e-9


def meets(metric: str, value: float, target: float) -> bool:
    """Whether ``value`` of ``metric`` meets ``target``: at least it for a bandwidth,
    at most it otherwise (up to float rounding).

    >>> meets("step_s", 1.1, 1.2), meets("busbw_GBps", 290.0, 300.0)
    (True, False)
    >>> meets("busbw_GBps", 24.999999999999996, 25.0)
    True
    """
    slack = _SLACK * abs(target)
    return value >= target - slack if metric in HIGHER_IS_BETTER else value <= target + slack


def parse_target(metric: str, text: str | float, *, field: str = "--target") -> float:
    """A target for ``metric`` in the metric's unit: a time for ``_s`` metrics (``1.2s``,
    ``800ms``) in seconds, for ``_us`` ones in microseconds; a bandwidth for ``_GBps``
    ones (``300GB/s``, ``2400Gbps``) in GB/s; a plain number otherwise (a share, 0.2).

    >>> parse_target("step_s", "800ms"), parse_target("time_us", "1ms")
    (0.8, 1000.0)
    >>> parse_target("busbw_GBps", "2400Gbps")
    300.0
    """
    try:
        if metric.endswith("_GBps"):
            return parse_bandwidth(text, field=field) / 1e9
        if metric.endswith("_us"):
            return parse_time(text, field=field) * 1e6
        if metric.endswith("_s"):
            return parse_time(text, field=field)
    except CcsimError as error:
        kind = "a bandwidth, e.g. 300GB/s" if metric.endswith("_GBps") else "a time, e.g. 1.2s"
        raise CcsimError(f"{error} (a target of {metric} is {kind})") from None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise CcsimError(f"{field}: expected a number of 0 or more for {metric}, got {text!r}")
    return value


@dataclass(frozen=True)
class PointCost:
    """What one point's topology takes: its priced cost (None without prices), its
    network power in kW, the items whose power no cited figure gives (left out of it),
    and, when its topology could not be built, why (the sweep records the same failure)."""

    fabric_cost: float | None
    network_kw: float | None
    unpowered: tuple[str, ...] = ()
    error: str = ""


def _topology_key(params: Mapping[str, Any]) -> str:
    """What decides a point's graph: points that differ only in size, algorithm, faults
    or workload settings share one bill of materials."""
    keys = ("topology", "set", "fabric", "nodes", "seed")
    if params.get("nodes") is None:  # the workload decides the server count
        keys += ("workload",)
    return json.dumps({k: params.get(k) for k in keys}, sort_keys=True, default=str)


def point_label(spec: SweepSpec, values: Mapping[str, Any]) -> str:
    """A point's axis values as the spec wrote them, ``axis=value, ...``."""
    return ", ".join(f"{axis}={spec.label(axis, value)}" for axis, value in values.items())


def point_costs(
    spec: SweepSpec,
    *,
    prices: Mapping[str, float] | None = None,
    watts: Mapping[str, float] | None = None,
    source: str = "prices",
) -> list[PointCost]:
    """The :class:`PointCost` of every point of ``spec``, in its order; each distinct
    topology is built once.

    With ``prices``, every item a point's topology needs must have one: a fabric that
    looked cheap because its switches had no price would be the wrong answer. The first
    item without one raises a :class:`~simulator.errors.CcsimError` naming ``source``
    (the prices file), the item and the point; a price of 0 leaves an item out knowingly.
    """
    built: dict[str, PointCost] = {}
    costs = []
    for point in spec.points:
        key = _topology_key(point.params)
        if key not in built:
            try:
                graph = point_graph(point.params)
            except Exception as error:  # the point fails in the sweep too, saying why
                built[key] = PointCost(None, None, error=one_line(error))
            else:
                bom = bill_of_materials(graph, prices=prices, watts=watts)
                if prices is not None and bom.unpriced:
                    missing = bom.unpriced
                    raise CcsimError(
                        f"{source}: no price for {', '.join(missing)}, which the point "
                        f"{point_label(spec, point.values) or 'of the scenario'} needs; add "
                        f"'{missing[0]}: PRICE' (0 leaves it out of the cost)"
                    )
                built[key] = PointCost(bom.cost, bom.power_kw, tuple(bom.unpowered))
        costs.append(built[key])
    return costs


def cost_rows(
    spec: SweepSpec,
    rows: Sequence[Mapping[str, Any]],
    costs: Sequence[PointCost],
    metric: str,
    *,
    target: float | None = None,
) -> list[dict[str, Any]]:
    """One record per point, in the spec's order: its axis values, ``status``, ``error``,
    the ``metric``, ``fabric_cost`` and ``network_kw`` with their :func:`per_perf`
    (``cost_x_step_s``, ``kw_x_step_s``...), and with a ``target`` whether it ``meets``
    it (None when the point has no result)."""
    records = []
    for point, row, cost in zip(spec.points, rows, costs, strict=True):
        value = row.get(metric) if row.get("status") == "ok" else None
        if value is not None and not math.isfinite(value):
            value = None
        record: dict[str, Any] = {
            **point.values,
            "status": row.get("status"),
            "error": row.get("error") or cost.error,
            metric: value,
            "fabric_cost": cost.fabric_cost,
            per_perf_key("cost", metric): per_perf(cost.fabric_cost, metric, value),
            "network_kw": cost.network_kw,
            per_perf_key("kw", metric): per_perf(cost.network_kw, metric, value),
        }
        if target is not None:
            record["meets"] = None if value is None else meets(metric, value, target)
        records.append(record)
    return records


@dataclass(frozen=True)
class Choice:
    """The answer to "the cheapest point that meets the target".

    ``ranked`` holds the points with a result and a cost, cheapest first (by ``measure``:
    ``fabric_cost`` or ``network_kw``; ties by the better metric); ``cheapest`` the first
    of them that meets the target, None when none does; ``best`` the point with the best
    metric reached (what to relax the target to).
    """

    metric: str
    target: float
    measure: str
    ranked: list[dict[str, Any]]
    cheapest: dict[str, Any] | None
    best: dict[str, Any] | None

    def summary(self) -> dict[str, Any]:
        """The answer as plain data (for JSON)."""
        return {
            "metric": self.metric,
            "target": self.target,
            "ranked_by": self.measure,
            "cheapest": self.cheapest,
            "best": self.best,
        }


def cheapest_meeting(
    records: Sequence[Mapping[str, Any]], metric: str, target: float, measure: str
) -> Choice:
    """Rank ``records`` (:func:`cost_rows`) by ``measure`` and pick the cheapest whose
    ``metric`` meets ``target``.

    >>> rows = [{"step_s": 1.0, "fabric_cost": 30.0}, {"step_s": 1.3, "fabric_cost": 10.0},
    ...         {"step_s": 1.1, "fabric_cost": 20.0}]
    >>> cheapest_meeting(rows, "step_s", 1.2, "fabric_cost").cheapest["fabric_cost"]
    20.0
    >>> cheapest_meeting(rows, "step_s", 0.5, "fabric_cost").best["step_s"]
    1.0
    """
    sign = -1.0 if metric in HIGHER_IS_BETTER else 1.0
    usable = [dict(r) for r in records if r.get(metric) is not None and r.get(measure) is not None]
    ranked = sorted(usable, key=lambda r: (r[measure], sign * r[metric]))
    cheapest = next((r for r in ranked if meets(metric, r[metric], target)), None)
    best = min(usable, key=lambda r: (sign * r[metric], r[measure]), default=None)
    return Choice(metric, target, measure, ranked, cheapest, best)


def describe_choice(choice: Choice, spec: SweepSpec) -> str:
    """One line: the cheapest point meeting the target and what it costs, or that none
    does and the best metric reached."""
    name = METRIC_NAMES.get(choice.metric, choice.metric)
    sign = ">=" if choice.metric in HIGHER_IS_BETTER else "<="
    goal = f"{choice.metric} {sign} {choice.target:.6g}"

    def what(record: Mapping[str, Any]) -> str:
        if choice.measure == "fabric_cost":
            return f"cost {record[choice.measure]:,.2f}"
        return f"network power {record[choice.measure]:,.3f} kW"

    def where(record: Mapping[str, Any]) -> str:
        values = {axis: record[axis] for axis in spec.columns}
        return point_label(spec, values) or "the scenario"

    if choice.cheapest is not None:
        r = choice.cheapest
        return (
            f"cheapest meeting {goal} ({name}): {where(r)}: {what(r)}, "
            f"{choice.metric} {r[choice.metric]:.6g}"
        )
    if choice.best is None:
        return f"no point has both a {choice.metric} and a {choice.measure}: none to choose"
    r = choice.best
    return (
        f"no point meets {goal} ({name}); the best reached is {r[choice.metric]:.6g} at "
        f"{where(r)} ({what(r)})"
    )


__all__ = [
    "HIGHER_IS_BETTER",
    "MEASURES",
    "Choice",
    "PointCost",
    "cheapest_meeting",
    "cost_rows",
    "describe_choice",
    "meets",
    "parse_target",
    "per_perf",
    "per_perf_key",
    "point_costs",
    "point_label",
]
