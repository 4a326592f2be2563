"""Symbolic verification that a schedule computes the collective it names.

Every rank's buffer is modelled as, for each data block, the set of ranks whose
contributions it holds (a Python int used as a bitset; 0 means the rank holds nothing
of the block). Ops run in a dependency order: a reducing transfer adds the sender's set
to the receiver's (and fails if a contribution would be counted twice), a copying
transfer overwrites it, and sending a block one does not hold fails. At the end each
rank's buffer is compared with the collective's definition.

The schedule runs in two different dependency orders; if they end in different states,
two unordered ops touch the same block (a race) and the check fails.
"""

from __future__ import annotations

import numpy as np

from .errors import ScheduleError
from .schedule import Schedule, topological_order


def _initial(schedule: Schedule) -> list[list[int]]:
    p, op, owner = schedule.ranks, schedule.op, schedule.segment_owner
    blocks = range(schedule.n_segments)
    if op in ("all_reduce", "reduce_scatter", "reduce"):
        return [[1 << r for _ in blocks] for r in range(p)]
    if op in ("all_gather", "broadcast"):
        return [[(1 << r) if owner[g] == r else 0 for g in blocks] for r in range(p)]
    raise ScheduleError(f"the checker does not know the collective {op!r}")


def _run(schedule: Schedule, order: np.ndarray) -> list[list[int]]:
    state = _initial(schedule)
    src, dst, seg, red = (
        schedule.src.tolist(),
        schedule.dst.tolist(),
        schedule.segment.tolist(),
        schedule.reduce.tolist(),
    )
    for i in order.tolist():
        s, d, g = src[i], dst[i], seg[i]
        data = state[s][g]
        if data == 0:
            raise ScheduleError(
                f"op {i}: rank {s} sends block {g} to rank {d} before holding any of it"
            )
        if red[i]:
            if state[d][g] & data:
                twice = sorted(_members(state[d][g] & data))
                raise ScheduleError(
                    f"op {i}: rank {d} reduces block {g} from rank {s} and would count the "
                    f"contributions of ranks {twice} twice"
                )
            state[d][g] |= data
        else:
            state[d][g] = data
    return state


def _members(bits: int) -> list[int]:
    return [r for r in range(bits.bit_length()) if bits >> r & 1]


def verify(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` computes its collective.

    >>> from simulator.algorithms import build_schedule
    >>> verify(build_schedule("ring", "all_reduce", 5, 1000.0))
    """
    schedule.check_structure()
    p = schedule.ranks
    everyone = (1 << p) - 1
    first = _run(schedule, topological_order(schedule))
    second = _run(schedule, topological_order(schedule, reverse_ties=True))
    if first != second:
        for r in range(p):
            for g in range(schedule.n_segments):
                if first[r][g] != second[r][g]:
                    raise ScheduleError(
                        f"race: rank {r}'s block {g} ends differently depending on the order of "
                        "ops that the dependencies leave unordered; add the missing dependency"
                    )
    owner = schedule.segment_owner.tolist()
    for r in range(p):
        for g in range(schedule.n_segments):
            have = first[r][g]
            if schedule.op == "all_reduce" or (
                schedule.op in ("reduce_scatter", "reduce") and owner[g] == r
            ):
                want = everyone
            elif schedule.op in ("all_gather", "broadcast"):
                want = 1 << owner[g]
            else:
                continue
            if have != want:
                missing = sorted(set(_members(want)) - set(_members(have)))
                raise ScheduleError(
                    f"{schedule.algorithm} {schedule.op}: rank {r} ends with block {g} lacking the "
                    f"contributions of ranks {missing}"
                    if missing
                    else f"{schedule.algorithm} {schedule.op}: rank {r} ends with block {g} holding "
                    f"ranks {_members(have)} instead of {_members(want)}"
                )
