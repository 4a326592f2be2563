"""Summaries over seeds: the median and the tail of a metric across random draws.

A sweep over random faults (``fault.seed``, :mod:`simulator.network.faults`) runs each
setting several times with different draws; what a user wants from it is not one run
but the typical one and the bad ones. :func:`over_seeds` groups the rows by every
other axis and gives, per group, the median, the 10th and 90th percentiles (linear
interpolation, as ``numpy.percentile``) and the extremes of the metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

#: The seed axis of random faults.
SEED_AXIS = "fault.seed"
#: Statistics :func:`over_seeds` reports, in column order.
STATISTICS = ("median", "p10", "p90", "min", "max")


def over_seeds(
    rows: Iterable[Mapping[str, Any]],
    metric: str,
    axes: Sequence[str],
    *,
    seed_axis: str = SEED_AXIS,
) -> list[dict[str, Any]]:
    """Per group of the ``axes`` other than ``seed_axis``: how many seeds ran (``seeds``),
    how many failed, and the :data:`STATISTICS` of ``metric`` over the ones that ran.

    Groups come in the order of their first row; a group whose every run failed has
    None statistics.

    >>> rows = [{"fault.q": q, "fault.seed": s, "status": "ok", "busbw_GBps": b}
    ...         for q, s, b in [(0.1, 0, 40.0), (0.1, 1, 20.0), (0.1, 2, 30.0)]]
    >>> [over_seeds(rows, "busbw_GBps", ["fault.q", "fault.seed"])[0][k]
    ...  for k in ("seeds", "median", "p10", "min")]
    [3, 30.0, 22.0, 20.0]
    """
    by = [axis for axis in axes if axis != seed_axis]
    groups: dict[tuple, dict[str, Any]] = {}
    values: dict[tuple, list[float]] = {}
    for row in rows:
        key = tuple(_hashable(row.get(axis)) for axis in by)
        if key not in groups:
            groups[key] = {axis: row.get(axis) for axis in by} | {"seeds": 0, "failed": 0}
            values[key] = []
        groups[key]["seeds"] += 1
        value = row.get(metric)
        if row.get("status", "ok") != "ok" or value is None or value != value:
            groups[key]["failed"] += 1
        else:
            values[key].append(float(value))
    out = []
    for key, group in groups.items():
        data = np.array(values[key])
        stats = (
            [np.median(data), *np.percentile(data, [10, 90]), data.min(), data.max()]
            if len(data)
            else [None] * len(STATISTICS)
        )
        group.update(
            {
                name: None if v is None else float(v)
                for name, v in zip(STATISTICS, stats, strict=True)
            }
        )
        out.append(group)
    return out


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
