"""Running a schedule whose side-by-side transfers are merged, checked against its members.

A :class:`~simulator.algorithms.schedule.Merged` schedule stands for a full schedule in
which some transfers travel side by side: the same ranks, route, bytes and labels, the
N blocks of a buffer row that a hierarchical all-reduce's in-server step sends at once.
Each group is one op of weight N here. Flows that start together on one route and carry
the same bytes get the same max-min rate at every instant (k of them share each link as
one flow of weight k does) and end together, so the op's times are each member's times,
provided every member starts when its op does.

An op starts when the last of its dependencies (the union of its members') is met; a
member whose own dependencies are fewer might have started earlier in the full
schedule. :func:`members_hold` checks, after timing, that each such member's last
dependency was met when its op's was (to rounding). By induction over the DAG every op
then has its members' times: the result equals the full schedule's, op by op, with
per-link bytes and busy time alike (tests hold it to the event-by-event replay of the
full schedule to 1e-9). When the check fails the caller simulates the full schedule.
"""

from __future__ import annotations

import numpy as np

from ..algorithms.schedule import Merged

#: Times closer than this (relative, at least 1 s) are the same instant reached by
#: different sums, as in the contention-free pass.
_TOUCH = 1e-12


def members_hold(merged: Merged, start: np.ndarray, sent: np.ndarray, done: np.ndarray) -> bool:
    """Whether every listed member's last dependency was met when its merged op started
    (``start``, ``sent``, ``done``: the merged ops' times, from the call's start).

    >>> from simulator.algorithms.schedule import Merged
    >>> m = Merged(None, np.array([1, 1, 2]), np.array([2, 2]), np.array([0, 1, 2]),
    ...            np.array([0, 1]), np.array([False, False]))
    >>> times = np.array([0.0, 0.0, 2.0]), np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])
    >>> members_hold(m, *times)  # op 2 starts at 2.0; its first member waits for op 0 only
    False
    """
    if len(merged.member_op) == 0:
        return True
    counts = np.diff(merged.member_ptr)
    ready = np.zeros(len(merged.member_op))
    has = counts > 0
    if has.any():
        idx = merged.member_idx
        times = np.where(merged.member_sent, sent[idx], done[idx])
        ready[has] = np.maximum.reduceat(times, merged.member_ptr[:-1][has])
    want = start[merged.member_op]
    return bool(np.all(ready >= want - _TOUCH * np.maximum(np.abs(want), 1.0)))


def expand_merged(merged: Merged, flows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-op records of the full schedule from the merged ops' (each member has its op's
    times and labels; ``op_index`` numbers the full schedule's ops)."""
    op_of = merged.op_of()
    expanded = {name: values[op_of] for name, values in flows.items()}
    expanded["op_index"] = np.arange(len(op_of))
    return expanded
