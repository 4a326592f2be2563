"""Collective schedules: a DAG of point-to-point transfers, stored as arrays.

Each op ``i`` moves ``nbytes[i]`` of data block ``segment[i]`` from rank ``src[i]`` to
rank ``dst[i]``. When ``reduce[i]`` is set the receiver *reduces* the arriving data into
its own copy of the block (a local reduction costing bytes / the GPU's reduce
bandwidth); otherwise it overwrites its copy. An op may start when all its
dependencies are satisfied. A dependency on op ``j`` is satisfied either when ``j`` is
*done* (delivered and reduced) or, when ``dep_sent`` is set, when ``j`` has been *sent*
(its last byte left the sender: the link is free again). The second kind lets a schedule
say "send these chunks one after another on this channel" without waiting for each to
arrive, which is what makes chunked pipelines overlap latency with transmission.

Dependencies are a CSR structure: the dependencies of op ``i`` are
``dep_idx[dep_ptr[i]:dep_ptr[i + 1]]``. Schedules are plain data: they round-trip
through JSON (:meth:`Schedule.to_dict`, :meth:`Schedule.from_dict`) and are verified
symbolically by :mod:`simulator.algorithms.checker`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ScheduleError
from ..files import load_data, write_file

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")

_ARRAYS = {
    "src": np.int32,
    "dst": np.int32,
    "nbytes": np.float64,
    "segment": np.int32,
    "reduce": np.bool_,
    "channel": np.int32,
    "step": np.int32,
    "chunk": np.int32,
    "dep_ptr": np.int64,
    "dep_idx": np.int32,
    "dep_sent": np.bool_,
    "segment_owner": np.int32,
    "path": np.int8,
}

#: Values of ``Schedule.path``: the default (shortest) route, or a route that leaves the
#: server through the NICs and the fabric (multipath algorithms use both at once).
PATH_DEFAULT, PATH_NETWORK = 0, 1
#: Routes into and out of an NVSwitch that reduces and multicasts (NVLS): ``PATH_UP``
#: loads only the sender's link into the switch, ``PATH_DOWN`` only the switch's link to
#: the receiver. Only these ops may be *self* ops (src = dst): they move no data between
#: ranks, they load the link (the switch reading or writing the rank's own copy).
PATH_UP, PATH_DOWN = 2, 3
#: The same for a fabric switch that reduces and multicasts in the network (SHARP, for
#: CollNet): ``PATH_SHARP_UP`` loads the route from the sender's GPU out through its NIC
#: to the switch, ``PATH_SHARP_DOWN`` the route from the switch to the receiver's GPU.
PATH_SHARP_UP, PATH_SHARP_DOWN = 4, 5
#: A transfer between servers sent as NCCL's PXN sends it: over NVLink to the sender's
#: peer GPU on the receiver's rail, then through that peer's NIC (see
#: :meth:`~simulator.network.routing.Router.pxn_route_ids`).
PATH_PXN = 6
#: Every route kind that goes into or out of a reducing switch (self ops allowed).
SWITCH_PATHS = (PATH_UP, PATH_DOWN, PATH_SHARP_UP, PATH_SHARP_DOWN)


@dataclass
class Schedule:
    """A collective as a DAG of transfers; see the module docstring for the semantics.

    ``segment_owner[g]`` says who block ``g`` belongs to: for all-gather the rank that
    holds it at the start, for reduce-scatter the rank that must hold its full reduction
    at the end, for broadcast and reduce the root; -1 where the op does not use it.
    ``step``, ``channel`` and ``chunk`` label ops for reports and timelines.
    """

    op: str
    algorithm: str
    ranks: int
    size_bytes: float
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    segment: np.ndarray
    reduce: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    dep_sent: np.ndarray
    segment_owner: np.ndarray
    channel: np.ndarray | None = None
    step: np.ndarray | None = None
    chunk: np.ndarray | None = None
    path: np.ndarray | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.src)
        for name in ("channel", "step", "chunk", "path"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(n, dtype=np.int32))
        for name, dtype in _ARRAYS.items():
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))

    @property
    def n_ops(self) -> int:
        """Number of transfers."""
        return len(self.src)

    @property
    def n_segments(self) -> int:
        """Number of data blocks the buffer is cut into."""
        return len(self.segment_owner)

    def channel_span(self) -> tuple[float, float]:
        """How a protocol's channel bound (a step done no earlier than its latency plus
        its bytes at the channel's rate) counts one transfer of this schedule: as
        ``steps`` step latencies and its bytes at ``scale`` times the channel's rate.
        (1, 1) unless the schedule says otherwise: a transfer that stands for several of
        the library's pipelined chunks (``nccl-p2p``'s merging) sets ``channel_steps``
        and ``channel_rate_scale`` in its params.

        >>> from simulator.algorithms import build_schedule
        >>> build_schedule("ring", "all_gather", 4, 4e6).channel_span()
        (1.0, 1.0)
        """
        return (
            float(self.params.get("channel_steps", 1.0)),
            float(self.params.get("channel_rate_scale", 1.0)),
        )

    def subset(self, ops: np.ndarray, index: np.ndarray) -> Schedule:
        """The schedule of ``ops`` alone, each dependency ``d`` becoming ``index[d]`` (an
        op of the subset: the caller maps dependencies outside it onto ops inside).

        >>> from simulator.algorithms import build_schedule
        >>> from simulator.algorithms.base import RankLayout
        >>> full = build_schedule("ring", "all_gather", RankLayout(3), 3e3)
        >>> full.dep_idx[full.dep_ptr[3] : full.dep_ptr[4]].tolist()  # op 3 waits for 2 and 0
        [2, 0]
        >>> part = full.subset(np.array([0, 3]), np.array([0, 0, 0, 1, 1, 1]))
        >>> part.n_ops, part.dep_idx.tolist()
        (2, [0, 0])
        """
        ops = np.asarray(ops, dtype=np.int64)
        rows = np.diff(self.dep_ptr)[ops]
        dep_ptr = np.zeros(len(ops) + 1, dtype=np.int64)
        np.cumsum(rows, out=dep_ptr[1:])
        entries = csr_gather(self.dep_ptr, np.arange(len(self.dep_idx)), ops)
        return Schedule(
            op=self.op,
            algorithm=self.algorithm,
            ranks=self.ranks,
            size_bytes=self.size_bytes,
            src=self.src[ops],
            dst=self.dst[ops],
            nbytes=self.nbytes[ops],
            segment=self.segment[ops],
            reduce=self.reduce[ops],
            dep_ptr=dep_ptr,
            dep_idx=np.asarray(index, dtype=np.int64)[self.dep_idx[entries]],
            dep_sent=self.dep_sent[entries],
            segment_owner=self.segment_owner,
            channel=self.channel[ops],
            step=self.step[ops],
            chunk=self.chunk[ops],
            path=self.path[ops],
            params=dict(self.params),
        )

    def check_structure(self) -> None:
        """Check array shapes, index ranges and that the dependencies form a DAG."""
        n = self.n_ops
        if self.op not in OPS:
            raise ScheduleError(f"schedule op {self.op!r} is not one of {', '.join(OPS)}")
        for name in ("dst", "nbytes", "segment", "reduce", "channel", "step", "chunk", "path"):
            if len(getattr(self, name)) != n:
                raise ScheduleError(
                    f"schedule field {name!r} has {len(getattr(self, name))} "
                    f"entries; expected one per op ({n})"
                )
        if len(self.dep_ptr) != n + 1 or self.dep_ptr[0] != 0 or np.any(np.diff(self.dep_ptr) < 0):
            raise ScheduleError(
                "schedule field 'dep_ptr' must be n_ops + 1 non-decreasing offsets from 0"
            )
        if self.dep_ptr[-1] != len(self.dep_idx) or len(self.dep_sent) != len(self.dep_idx):
            raise ScheduleError(
                "schedule fields 'dep_idx'/'dep_sent' must have dep_ptr[-1] entries"
            )
        for name in ("src", "dst"):
            bad = np.flatnonzero((getattr(self, name) < 0) | (getattr(self, name) >= self.ranks))
            if len(bad):
                raise ScheduleError(
                    f"schedule op {bad[0]}: {name} rank {getattr(self, name)[bad[0]]} "
                    f"is outside 0..{self.ranks - 1}"
                )
        switch = np.isin(self.path, SWITCH_PATHS)
        same = np.flatnonzero((self.src == self.dst) & ~switch)
        if len(same):
            raise ScheduleError(
                f"schedule op {same[0]} sends from rank {self.src[same[0]]} to itself "
                "(only ops into or out of a switch, paths 2 to 5, may)"
            )
        bad = np.flatnonzero((self.path < PATH_DEFAULT) | (self.path > PATH_PXN))
        if len(bad):
            raise ScheduleError(
                f"schedule op {bad[0]} has path {self.path[bad[0]]}; paths are 0 (shortest), "
                "1 (through the NICs), 2 and 3 (into and out of the NVSwitch), 4 and 5 (into "
                "and out of the fabric's SHARP switch), 6 (between servers through the NIC on "
                "the receiver's rail, NCCL's PXN)"
            )
        bad = np.flatnonzero(~(self.nbytes >= 0))
        if len(bad):
            raise ScheduleError(f"schedule op {bad[0]} has a negative or missing byte count")
        bad = np.flatnonzero((self.segment < 0) | (self.segment >= self.n_segments))
        if len(bad):
            raise ScheduleError(
                f"schedule op {bad[0]} names block {self.segment[bad[0]]}; "
                f"blocks are 0..{self.n_segments - 1}"
            )
        bad = np.flatnonzero((self.dep_idx < 0) | (self.dep_idx >= n))
        if len(bad):
            raise ScheduleError(
                f"schedule dependency {bad[0]} points at op {self.dep_idx[bad[0]]}, "
                f"outside 0..{n - 1}"
            )
        order = topological_order(self)
        if len(order) < n:
            stuck = np.setdiff1d(np.arange(n), order)[:5]
            raise ScheduleError(
                f"schedule dependencies have a cycle; ops {stuck.tolist()} can never start"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (lists), suitable for JSON."""
        data: dict[str, Any] = {
            "format": "ccsim-schedule/1",
            "op": self.op,
            "algorithm": self.algorithm,
            "ranks": int(self.ranks),
            "size_bytes": float(self.size_bytes),
            "params": self.params,
        }
        for name in _ARRAYS:
            data[name] = getattr(self, name).tolist()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "schedule") -> Schedule:
        """Inverse of :meth:`to_dict`; checks the structure."""
        if not isinstance(data, dict) or data.get("format") != "ccsim-schedule/1":
            raise ScheduleError(
                f"{source}: not a ccsim schedule (expected format 'ccsim-schedule/1')"
            )
        try:
            schedule = cls(
                op=data["op"],
                algorithm=data["algorithm"],
                ranks=int(data["ranks"]),
                size_bytes=float(data["size_bytes"]),
                params=dict(data.get("params", {})),
                **{name: np.asarray(data[name]) for name in _ARRAYS if name != "path"},
                path=np.asarray(data.get("path", np.zeros(len(data.get("src", []))))),
            )
        except KeyError as error:
            raise ScheduleError(f"{source}: field {error.args[0]!r} is missing") from None
        except (TypeError, ValueError) as error:
            raise ScheduleError(f"{source}: malformed field: {error}") from None
        schedule.check_structure()
        return schedule

    def save(self, path: str | Path) -> None:
        """Write the schedule as JSON (atomically)."""
        write_file(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        """Read a schedule written by :meth:`save`."""
        data = load_data(path, what="schedule", fmt="json", error=ScheduleError)
        return cls.from_dict(data, source=str(path))


@dataclass
class Merged:
    """A schedule with the transfers that travel side by side merged: op ``i`` of
    ``schedule`` stands for ``weight[i]`` transfers of the full schedule, which are ops
    ``first[i] .. first[i] + weight[i] - 1`` there (``first`` = the running sum of
    ``weight``: merged ops keep the full schedule's order). Members have the same ranks,
    route, bytes (``schedule.nbytes`` is each one's), labels and reduction flag, so when
    they start together they run as one flow of that weight (k identical flows share
    every link equally and end together) and their times are the op's.

    The op's dependencies are the union of its members' (each mapped to the merged op
    that holds it), so the op starts when the last of them is met. A member whose own
    dependencies are fewer is listed in the ``member_*`` arrays: ``member_op[m]`` is its
    op and ``member_idx[member_ptr[m]:member_ptr[m + 1]]`` (kinds in ``member_sent``)
    its own dependencies. Merging changes no time exactly when each listed member's last
    dependency is met when its op's is; the runner checks that after timing
    (:func:`simulator.collective.merged.members_hold`) and otherwise simulates the full
    schedule. ``full_ops`` is the full schedule's op count.
    """

    schedule: Schedule
    weight: np.ndarray
    member_op: np.ndarray
    member_ptr: np.ndarray
    member_idx: np.ndarray
    member_sent: np.ndarray

    @property
    def full_ops(self) -> int:
        """Ops of the full schedule (the sum of the weights)."""
        return int(self.weight.sum())

    def op_of(self) -> np.ndarray:
        """The merged op of every op of the full schedule, in the full schedule's order."""
        return np.repeat(np.arange(self.schedule.n_ops, dtype=np.int64), self.weight)


def csr_gather(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenate ``idx[ptr[r]:ptr[r+1]]`` for every ``r`` in ``rows``, vectorised."""
    if len(rows) == 1:  # the common case in event-by-event replays: a plain slice
        row = int(rows[0])
        return idx[ptr[row] : ptr[row + 1]]
    starts = ptr[rows]
    lengths = ptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return idx[:0]
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return idx[offsets + np.arange(total)]


def successors(
    schedule: Schedule,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """CSR of successors: ``((done_ptr, done_idx), (sent_ptr, sent_idx))``.

    ``done_idx[done_ptr[j]:done_ptr[j+1]]`` are the ops waiting for op ``j`` to be done;
    the ``sent`` pair lists those waiting for it to be sent.
    """
    n = schedule.n_ops
    owner = np.repeat(np.arange(n, dtype=np.int32), np.diff(schedule.dep_ptr))
    result = []
    for kind in (False, True):
        mask = schedule.dep_sent == kind
        pred = schedule.dep_idx[mask]
        counts = np.bincount(pred, minlength=n)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        single = counts.max(initial=0) <= 1
        del counts  # before the largest temporaries below (memory is the limit at scale)
        if single:
            # At most one successor each (a ring's next hop, its next chunk): each goes
            # straight to its slot, without the stable sort (seconds at 8 M ops).
            succ = np.empty(len(pred), dtype=owner.dtype)
            succ[ptr[pred]] = owner[mask]
        else:
            order = np.argsort(pred, kind="stable")
            succ = owner[mask][order]
            del order
        result.append((ptr, succ))
    return result[0], result[1]


def topological_order(schedule: Schedule, *, reverse_ties: bool = False) -> np.ndarray:
    """Ops in an order that respects every dependency (Kahn's algorithm by levels).

    Within a level ops are in increasing id, or decreasing with ``reverse_ties``; the
    checker runs both orders to expose races. Ops on a cycle are left out.
    """
    n = schedule.n_ops
    pending = np.diff(schedule.dep_ptr).astype(np.int64)
    (dptr, didx), (sptr, sidx) = successors(schedule)
    frontier = np.flatnonzero(pending == 0)
    order = []
    while len(frontier):
        order.append(frontier[::-1] if reverse_ties else frontier)
        succ = np.concatenate([csr_gather(dptr, didx, frontier), csr_gather(sptr, sidx, frontier)])
        if len(succ) == 0:
            break
        ids, counts = np.unique(succ, return_counts=True)
        pending[ids] -= counts
        frontier = ids[pending[ids] == 0]
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)[:n]
