"""Symbolic verification that a schedule computes the collective it names.

Every rank's buffer is modelled as, for each data block, the set of ranks whose
contributions it holds (a Python int used as a bitset; 0 means the rank holds nothing
of the block). Ops run in a dependency order: a reducing transfer adds the sender's set
to the receiver's (and fails if a contribution would be counted twice), a copying
transfer overwrites it, and sending a block one does not hold fails. At the end each
rank's buffer is compared with the collective's definition.

What each collective means, block by block (``segment_owner[g]`` = o, p ranks):

* all-reduce: every rank starts with its own contribution to every block and must end
  with all of them;
* reduce-scatter / reduce: as all-reduce, but only rank o must end with all of them
  (the block's owner; the root for reduce);
* all-gather / broadcast: rank o (the block's owner; the root for broadcast) starts with
  block g and every rank must end with exactly that;
* all-to-all: o encodes a (sender, receiver) pair as o = s * p + d: block g is data rank
  s has for rank d; rank s starts with it and rank d must end with exactly it. Several
  blocks may share a pair (chunks, channels); blocks with s = d need no transfer.

Ops run in one dependency order, and every access to a block is checked to be ordered
after the accesses it conflicts with (see :func:`_run`), so that every valid execution
order computes the same result: a schedule with a race fails the check. Two reductions
into the same block do not conflict with each other (they commute), so a rank may
receive several contributions at once, as a tree's inner node or a direct
reduce-scatter's owner does.

Self ops (src = dst, allowed only into or out of a reducing switch, an NVSwitch or a
SHARP switch of the fabric: see :data:`~simulator.algorithms.schedule.SWITCH_PATHS`) move
no data between ranks; they take part in the ordering only. The switch's reduction
itself is symbolic: members' copies reduce into the group owner's block (see
:mod:`simulator.algorithms.in_switch`).
"""

from __future__ import annotations

import numpy as np

from ..errors import ScheduleError
from .schedule import Schedule, topological_order


def _initial(schedule: Schedule) -> list[list[int]]:
    p, op, owner = schedule.ranks, schedule.op, schedule.segment_owner.tolist()
    blocks = range(schedule.n_segments)
    if op in ("all_reduce", "reduce_scatter", "reduce"):
        return [[1 << r for _ in blocks] for r in range(p)]
    if op in ("all_gather", "broadcast"):
        return [[(1 << r) if owner[g] == r else 0 for g in blocks] for r in range(p)]
    if op == "all_to_all":
        return [[(1 << r) if owner[g] // p == r else 0 for g in blocks] for r in range(p)]
    raise ScheduleError(f"the checker does not know the collective {op!r}")


def _check_owners(schedule: Schedule) -> None:
    """Block owners must name ranks (pairs of ranks for all-to-all) where the op uses them."""
    p, op = schedule.ranks, schedule.op
    if op == "all_reduce":
        return
    limit = p * p if op == "all_to_all" else p
    bad = np.flatnonzero((schedule.segment_owner < 0) | (schedule.segment_owner >= limit))
    if len(bad):
        what = "sender * ranks + receiver" if op == "all_to_all" else "a rank"
        raise ScheduleError(
            f"{schedule.algorithm} {op}: block {bad[0]} has owner "
            f"{schedule.segment_owner[bad[0]]}; it must be {what}, 0..{limit - 1}"
        )


def _run(schedule: Schedule, order: np.ndarray) -> list[list[int]]:
    """Execute the ops in ``order`` symbolically, checking each access is ordered.

    Each op is two events: its *read* of the sender's block (finished when the op is
    sent) and its *write* into the receiver's block (when it is done). A dependency on
    a done op orders that op's write before this op's read; a dependency on a sent op
    orders only its read. Every read must come after the last write to the same block
    of the same rank, and every write after the previous write and all reads since;
    otherwise some valid execution would see different data (a race). The exception:
    reductions into one block commute, so they need no order among themselves; the
    block's *frontier* then holds several writes, all of which a later access must
    follow. Ancestor sets are Python ints used as bitsets over events (2 per op).
    """
    state = _initial(schedule)
    src, dst, seg, red = (
        schedule.src.tolist(),
        schedule.dst.tolist(),
        schedule.segment.tolist(),
        schedule.reduce.tolist(),
    )
    ptr, idx, sent = (
        schedule.dep_ptr.tolist(),
        schedule.dep_idx.tolist(),
        schedule.dep_sent.tolist(),
    )
    n = schedule.n_ops
    ancestors = [0] * (2 * n)  # event 2i = read of op i, 2i + 1 = write of op i
    frontier: dict[tuple[int, int], list[int]] = {}  # latest writes, unordered among them
    reads_since: dict[tuple[int, int], list[int]] = {}
    for i in order.tolist():
        before = 0
        for k in range(ptr[i], ptr[i + 1]):
            event = 2 * idx[k] + (0 if sent[k] else 1)
            before |= ancestors[event] | (1 << event)
        read, write = 2 * i, 2 * i + 1
        ancestors[read] = before
        ancestors[write] = before | (1 << read)
        s, d, g = src[i], dst[i], seg[i]
        if s == d:
            continue  # a self op (into or out of a switch) moves no data: it only orders
        for writer in frontier.get((s, g), ()):
            if not before >> writer & 1:
                raise ScheduleError(
                    f"race: op {i} reads block {g} at rank {s} without waiting for op "
                    f"{writer // 2}, which writes it; add a dependency on op {writer // 2}"
                )
        reads_since.setdefault((s, g), []).append(read)
        kept = []
        for other in [*frontier.get((d, g), ()), *reads_since.get((d, g), ())]:
            if ancestors[write] >> other & 1:
                continue
            if red[i] and other & 1 and red[other // 2]:
                kept.append(other)  # two reductions into one block commute
                continue
            raise ScheduleError(
                f"race: op {i} writes block {g} at rank {d} while op {other // 2} may "
                "still access it; add a dependency between them"
            )
        frontier[(d, g)] = [*kept, write]
        if not red[i]:
            # A copy follows every earlier access, so later ones that follow it follow
            # those too. After a reduction the reads stay: a later reduction need not
            # follow this one, yet must follow them.
            reads_since[(d, g)] = []
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
    _check_owners(schedule)
    p = schedule.ranks
    everyone = (1 << p) - 1
    first = _run(schedule, topological_order(schedule))
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
            elif schedule.op == "all_to_all" and owner[g] % p == r:
                want = 1 << (owner[g] // p)
            else:
                continue
            if have != want:
                missing = sorted(set(_members(want)) - set(_members(have)))
                raise ScheduleError(
                    f"{schedule.algorithm} {schedule.op}: rank {r} ends with block {g} lacking the "
                    f"contributions of ranks {missing}"
                    if missing
                    else f"{schedule.algorithm} {schedule.op}: rank {r} ends with block {g} "
                    f"holding ranks {_members(have)} instead of {_members(want)}"
                )
