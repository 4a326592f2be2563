"""Finding the knee: the smallest setting of one axis that is as good as the largest.

For a metric m against a numeric axis x (say step time against NIC bandwidth), with
the reference m_ref = m at the largest x that has a result, the knee is the smallest x
from which on every result is within the tolerance of the reference:

    |m(x') - m_ref| <= tolerance * |m_ref|   for every x' >= x.

"From which on" makes one lucky point below a worse one not count as the knee. The
other axes that vary split the results into groups, each with its own knee (the knee
of NIC bandwidth for 2, 4 and 8 servers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from .point import METRICS
from .spec import SweepError

#: Relative slack on the comparison, for results equal up to float rounding.
_EPSILON = 1e-9
_NOT_AXES = {"key", "status", "error", *(m for names in METRICS.values() for m in names)}


@dataclass
class Knee:
    """The knee of ``metric`` against ``axis`` in one group of results.

    Attributes
    ----------
    axis, metric : str
    tolerance : float
        Relative tolerance (0.05 = within 5 %).
    group : dict
        Values of the other varying axes that define the group.
    knee, knee_metric : float
        The knee's axis value and the metric there.
    reference, reference_metric : float
        The largest axis value with a result, and the metric there.
    curve : list of (x, metric)
        The group's results sorted by the axis (failed points left out).
    """

    axis: str
    metric: str
    tolerance: float
    group: dict[str, Any]
    knee: float
    knee_metric: float
    reference: float
    reference_metric: float
    curve: list[tuple[float, float]] = field(repr=False)

    def row(self) -> dict[str, Any]:
        """A flat record: group values, then the knee and the reference."""
        return {
            **self.group,
            "axis": self.axis,
            "metric": self.metric,
            "tolerance": self.tolerance,
            "knee": self.knee,
            "knee_metric": self.knee_metric,
            "reference": self.reference,
            "reference_metric": self.reference_metric,
        }


def knee_of(
    curve: Sequence[tuple[float, float]], tolerance: float
) -> tuple[float, float, float, float]:
    """(knee x, its metric, reference x, its metric) of (x, metric) pairs.

    >>> knee_of([(1, 10.0), (2, 5.2), (4, 5.0), (8, 5.0)], 0.05)
    (2, 5.2, 8, 5.0)
    """
    points = sorted(curve)
    if not points:
        raise SweepError("no results to find a knee in")
    reference_x, reference = points[-1]
    slack = tolerance * abs(reference) + _EPSILON * max(abs(reference), 1e-300)
    knee_x, knee_m = reference_x, reference
    for x, m in reversed(points):
        if abs(m - reference) > slack:
            break
        knee_x, knee_m = x, m
    return knee_x, knee_m, reference_x, reference


def find_knee(
    results: Any,
    axis: str,
    metric: str,
    tolerance: float = 0.05,
    *,
    by: Sequence[str] | None = None,
) -> list[Knee]:
    """The knee of ``metric`` against ``axis`` in each group of sweep results.

    Parameters
    ----------
    results : pandas.DataFrame or sequence of mappings
        Rows as :func:`~simulator.sweep.run_sweep` returns them.
    axis : str
        A numeric axis column (e.g. ``server.nic.bandwidth``).
    metric : str
        A metric column (``step_s``, ``exposed_s``, ``busbw_GBps``...).
    tolerance : float
        Relative tolerance, in [0, 1) (0.05 = within 5 % of the reference).
    by : sequence of str, optional
        Columns that split the results into groups (default: every other axis column
        with more than one value).

    Returns
    -------
    list of Knee
        One per group, groups in order of first appearance.

    Examples
    --------
    >>> rows = [{"key": str(x), "bw": x, "status": "ok", "step_s": 1 + 8 / x}
    ...         for x in (1, 2, 4, 8, 16, 32, 64)]
    >>> knee = find_knee(rows, "bw", "step_s", 0.15)[0]  # 1.25 is within 15 % of 1.125
    >>> knee.knee, knee.reference
    (32, 64)
    """
    rows = _records(results)
    if not 0 <= tolerance < 1:
        raise SweepError(f"tolerance must be a fraction in [0, 1), got {tolerance!r}")
    if not rows:
        raise SweepError("no results to find a knee in")
    columns = list(rows[0])
    for name, what in ((axis, "axis"), (metric, "metric")):
        if name not in columns:
            valid = [c for c in columns if (c in _NOT_AXES) == (what == "metric")]
            valid = [c for c in valid if c not in ("key", "status", "error")]
            raise SweepError(f"unknown {what} {name!r}; the results have: {', '.join(valid)}")
    if by is None:
        by = [
            c
            for c in columns
            if c not in _NOT_AXES and c != axis and len({_hashable(r[c]) for r in rows}) > 1
        ]
    else:
        unknown = [c for c in by if c not in columns]
        if unknown:
            raise SweepError(f"unknown column {unknown[0]!r} to group by")
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for row in rows:
        key = tuple(_hashable(row[c]) for c in by)
        curve = groups.setdefault(key, [])
        if row.get("status", "ok") != "ok":
            continue
        x, m = row[axis], row[metric]
        if not is_number(x):
            raise SweepError(
                f"axis {axis!r} has the value {x!r}; a knee needs a numeric axis "
                "(a bandwidth, latency, size or count)"
            )
        if is_number(m):
            curve.append((x, float(m)))
    knees = []
    for key, curve in groups.items():
        group = dict(zip(by, key, strict=True))
        if not curve:
            where = ", ".join(f"{k}={v}" for k, v in group.items()) or "the sweep"
            raise SweepError(f"no successful point with a {metric} in {where}")
        knee, knee_m, reference, reference_m = knee_of(curve, tolerance)
        knees.append(
            Knee(
                axis, metric, tolerance, group, knee, knee_m, reference, reference_m, sorted(curve)
            )
        )
    return knees


def _records(results: Any) -> list[dict[str, Any]]:
    if hasattr(results, "to_dict"):  # a DataFrame; NaN (failed metrics) stays NaN
        return results.to_dict("records")
    return [dict(row) for row in results]


def is_number(value: Any) -> bool:
    """A finite real number (not a bool): a value a knee can be found along."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _hashable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None  # pandas turns None into NaN; NaN != NaN would split groups
    if isinstance(value, Mapping | list):
        return repr(value)
    return value
