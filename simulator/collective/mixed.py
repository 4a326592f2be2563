"""Timing a schedule where only some flows meet: events for those, a pass for the rest.

The contention-free pass (:mod:`simulator.collective.contention_free`) times a schedule
without events when no two of its flows ever share a link, and gives up otherwise. On a
fat-tree with ECMP a few uplinks carry two rings' flows at once, the rings drift apart,
and then every one of millions of flows would be simulated event by event, although
most of them (every transfer inside a server, every hop whose links no other ring uses)
are still alone on their links from start to end. Here only the flows that may meet
run as events; the others are timed the moment their dependencies are known.

A *contended* set of links splits the ops in two:

* ops whose route (or reducer) crosses a contended link are *simulated*: their flows
  run on the :class:`~simulator.network.flows.FlowNetwork`, event by event, as the
  reference replay runs every flow;
* every other op is *timed*: when its last dependency is known (at an event of the
  simulated ops, or timed itself), its start is that dependency's time, it is sent
  one bottleneck transfer later, delivered one route latency after that and done after
  its reduction alone on its reducer, exactly the contention-free pass's arithmetic.
  Its successors are released at those times, so that a chain of timed ops is timed
  through in numpy passes with no event, and a simulated op it releases is launched at
  its time by one SimPy timeout.

Which links are contended is found, not guessed: after a run every flow interval on a
link that a timed op uses is checked against every other one on that link. A timed
op's interval that overlaps another (by more than rounding) means the premise failed
there; those links join the contended set and the run is repeated. Each round only
adds links, so the rounds end, at worst with every op simulated (the reference
itself). When no overlap is left, every timed flow was alone on its links while it
ran, so its times are those the reference gives it, and the simulated ops met only
each other: the result equals the event-by-event replay of every flow (tested to 1e-9:
op times, per-link bytes and busy time).

Skipping events whose outcome is already determined is steady-state fast-forwarding
(Wormhole, NSDI'26); this module's form of it is ours: the fast-forwarded state is a
flow alone on its links, checked after the fact rather than predicted.

Scope: the ideal model only (no protocol), no timed link faults, no link classes, as
for the contention-free pass.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.events import NORMAL

from ..algorithms.schedule import Schedule, csr_gather, successors
from ..network.flows import FlowNetwork, run_env
from ..network.lean import LeanFlowNetwork
from .contention_free import Timeline, op_reducers, op_routes, route_bottlenecks
from .replay import ScheduleReplay

#: Intervals overlapping by less than this (relative to the time, at least 1 s) touch,
#: as in the contention-free pass: the same instant computed by different sums.
_TOUCH = 1e-12
#: Give up (return None: the caller simulates every flow) after this many rounds, or
#: when more than this share of the ops would be simulated: each round costs a replay of
#: its simulated ops, and the reference replays all of them once.
MAX_ROUNDS = 3
MAX_SIMULATED = 0.3
#: ... except up to this many simulated ops, whose rounds cost little.
FEW_SIMULATED = 10_000
#: Up to this many ops at once, a level is timed (or released) in Python scalars, the
#: same arithmetic as the array pass: cheaper than its dozen numpy calls.
FEW_OPS = 64


class _Tick:
    """A timeout as SimPy's environment processes it (callbacks, ok), without the rest
    of an event: the mixed timing makes one or two per simulated op."""

    __slots__ = ("_ok", "_value", "callbacks")

    def __init__(self) -> None:
        self.callbacks: list = []
        self._ok = True
        self._value = None


class _Clock(simpy.Environment):
    """SimPy's environment whose timeouts are :class:`_Tick`: the same queue, keys
    (time, priority, sequence) and so the same order of events, at less cost each."""

    def timeout(self, delay: float = 0, value: object = None) -> _Tick:  # type: ignore[override]
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        tick = _Tick()
        heapq.heappush(self._queue, (self._now + delay, NORMAL, next(self._eid), tick))
        return tick


@dataclass(frozen=True, slots=True)
class _ScalarViews:
    """A replay's per-op arrays as memoryviews (the same memory), for one op at a time."""

    ready_at: memoryview
    pending: memoryview
    start: memoryview
    sent: memoryview
    end: memoryview
    simulated: memoryview
    reduces: memoryview
    routes: memoryview
    wire: memoryview
    copies: memoryview
    transfer: memoryview
    latency: memoryview
    reduce: memoryview
    sent_succ: tuple[memoryview, memoryview]
    done_succ: tuple[memoryview, memoryview]


class _MixedReplay(ScheduleReplay):
    """A :class:`ScheduleReplay` that simulates the ops in ``simulated`` and times the
    others from their dependencies' times (see the module docstring)."""

    def __init__(
        self,
        network: FlowNetwork,
        schedule: Schedule,
        *,
        reduce_bandwidth: np.ndarray,
        simulated: np.ndarray,
        routes: np.ndarray,
        transfer_s: np.ndarray,
        latency_s: np.ndarray,
        reduce_s: np.ndarray,
        successor_lists: tuple,
        weight: np.ndarray | None = None,
    ):
        super().__init__(
            network,
            schedule,
            reduce_bandwidth=reduce_bandwidth,
            successor_lists=successor_lists,
            weight=weight,
        )
        # Identical transfers each op stands for (a merged schedule's), as floats.
        self._copies = np.ones(schedule.n_ops) if weight is None else self._weight
        self._all_routes = routes
        self._simulated = simulated
        self._transfer_s = transfer_s
        self._latency_s = latency_s
        self._reduce_s = reduce_s
        # The latest time among each op's satisfied dependencies.
        self._ready_at = np.zeros(schedule.n_ops)
        self._timed_count = 0
        self._n_ops = schedule.n_ops
        #: The op whose interval stands for each timed op's (itself, or the first of
        #: its identical twins, see :meth:`_twins`).
        self.twin_of = np.arange(schedule.n_ops)
        self._finish_scheduled = False
        # Simulated ops whose flow is their last event (no reduction flow follows): done
        # one route latency after they are sent, which is known when they are sent.
        self._reduces = np.zeros(schedule.n_ops, dtype=bool)
        if self._reducer is not None:
            self._reduces = schedule.reduce & (self._reducer[self._local[0]] >= 0)
        # The same arrays as memoryviews, for the paths that handle one op at a time:
        # reading or storing one element of a memoryview is a Python scalar, half the
        # cost of numpy's element access and a third of its arithmetic on int32.
        self._one = _ScalarViews(
            ready_at=memoryview(self._ready_at),
            pending=memoryview(self._pending),
            start=memoryview(self.start_s),
            sent=memoryview(self.sent_s),
            end=memoryview(self.end_s),
            simulated=memoryview(np.ascontiguousarray(simulated)),
            reduces=memoryview(np.ascontiguousarray(self._reduces)),
            routes=memoryview(np.ascontiguousarray(routes)),
            wire=memoryview(np.ascontiguousarray(self._wire, dtype=float)),
            copies=memoryview(np.ascontiguousarray(self._copies, dtype=float)),
            transfer=memoryview(np.ascontiguousarray(transfer_s, dtype=float)),
            latency=memoryview(np.ascontiguousarray(latency_s, dtype=float)),
            reduce=memoryview(np.ascontiguousarray(reduce_s, dtype=float)),
            sent_succ=(memoryview(self._sent_ptr), memoryview(self._sent_idx)),
            done_succ=(memoryview(self._done_ptr), memoryview(self._done_idx)),
        )

    def start(self) -> simpy.Event:
        """Start (or time) the ops without dependencies now."""
        self.t0 = self.env.now
        if self.schedule.n_ops == 0:
            self.finished.succeed()
            return self.finished
        first = np.flatnonzero(self._pending == 0)
        self._ready_at[first] = self.env.now
        self._dispatch(first)
        return self.finished

    def _dispatch(self, ready: np.ndarray) -> None:
        """Launch the simulated ops of ``ready`` at their ready times; time the others."""
        simulated = self._simulated[ready]
        if simulated.any():
            self._launch_at(ready[simulated])
        if not simulated.all():
            self._time(ready[~simulated])
        self._check_finished()

    def wants_delivery(self, ops: np.ndarray) -> np.ndarray:
        """The network tells of deliveries only for ops that reduce after them (not of
        reduction flows', ids ``op + n_ops``, whose delivery means nothing)."""
        wanted = np.zeros(len(ops), dtype=bool)
        transfers = ops < self.schedule.n_ops
        wanted[transfers] = self._reduces[ops[transfers]]
        return wanted

    def on_sent(self, ops: np.ndarray) -> None:
        """Network callback (see :meth:`ScheduleReplay.on_sent`); ops with no reduction
        are done one route latency from now, and their successors released then."""
        ops = self._transfers_sent(ops)
        if len(ops) == 0:
            return
        now = self.env.now
        if len(ops) == 1:  # one flow (a drifting ring's hop): scalar bookkeeping
            self._sent_one(int(ops[0]), now)
            return
        if len(ops) <= FEW_OPS:
            self._sent_few(ops.tolist(), now)
            return
        self.sent_s[ops] = now
        ready = [self._release_at(ops, np.full(len(ops), now), self._sent_ptr, self._sent_idx)]
        plain = ops[~self._reduces[ops]]
        if len(plain):
            end = now + self._latency_s[plain]
            self.end_s[plain] = end
            self._done_count += len(plain)
            ready.append(self._release_at(plain, end, self._done_ptr, self._done_idx))
        ready = np.concatenate(ready)
        if len(ready) > 1:
            ready = np.unique(ready)
        if len(ready):
            self._dispatch(ready)
        else:
            self._check_finished()

    def _sent_few(self, ops: list[int], now: float) -> None:
        """:meth:`on_sent` for a few ops, in Python scalars (the same arithmetic)."""
        one = self._one
        found: list[int] = []
        for op in ops:
            one.sent[op] = now
            self._release_one(op, now, one.sent_succ, found)
        for op in ops:
            if not one.reduces[op]:
                end = now + one.latency[op]
                one.end[op] = end
                self._done_count += 1
                self._release_one(op, end, one.done_succ, found)
        if found:
            self._dispatch_sorted(sorted(found))
        else:
            self._check_finished()

    def _dispatch_sorted(self, ready: list[int]) -> None:
        """:meth:`_dispatch` for ops given as a sorted list: the simulated ones launched
        together as there, the others timed in Python scalars."""
        simulated = self._one.simulated
        launch = [op for op in ready if simulated[op]]
        if launch:
            self._launch_at(np.array(launch, dtype=np.int64))
        timed = [op for op in ready if not simulated[op]]
        if timed:
            self._time_few(timed)
        self._check_finished()

    def sent_one(self, op: int) -> bool:
        """:meth:`on_sent` and :meth:`wants_delivery` for one flow whose op is a Python
        int (the lean network's scalar callback): whether it wants the delivery."""
        n = self._n_ops
        if op >= n:  # a reduction flow: its op is done
            self._complete(np.array([op - n], dtype=np.int64))
            return False
        self._sent_one(op, self.env.now)
        return self._one.reduces[op]

    def _sent_one(self, op: int, now: float) -> None:
        """:meth:`on_sent` for one op, in Python scalars (the same arithmetic)."""
        one = self._one
        one.sent[op] = now
        ready: list[int] = []
        self._release_one(op, now, one.sent_succ, ready)
        if not one.reduces[op]:
            end = now + one.latency[op]
            one.end[op] = end
            self._done_count += 1
            self._release_one(op, end, one.done_succ, ready)
        if len(ready) == 1:
            self._dispatch_few(ready)
        elif ready:
            self._dispatch_few(sorted(set(ready)))
        else:
            self._check_finished()

    def _release_one(self, op: int, time: float, succ_lists: tuple, ready: list[int]) -> None:
        """:meth:`_release_at` for one op, in Python scalars: appends to ``ready`` the
        successors it makes ready (``succ_lists``: the CSR successors, as memoryviews)."""
        ptr, idx = succ_lists
        first, last = ptr[op], ptr[op + 1]
        if first == last:
            return
        one = self._one
        ready_at, pending = one.ready_at, one.pending
        for succ in idx[first:last].tolist():
            if ready_at[succ] < time:
                ready_at[succ] = time
            left = pending[succ] - 1
            pending[succ] = left
            if left == 0:
                ready.append(succ)

    def _launch_at(self, ops: np.ndarray) -> None:
        now = self.env.now
        if len(ops) == 1:
            self._launch_one(int(ops[0]))
            return
        if len(ops) <= FEW_OPS:
            self._launch_few(ops.tolist(), now)
            return
        at = self._ready_at[ops]
        later = at > now
        if not later.all():
            self._launch(ops[~later])
        if later.any():
            self._at(at[later] - now, lambda pick, o=ops[later]: self._launch(o[pick]))

    def _launch_few(self, ops: list[int], now: float) -> None:
        """:meth:`_launch_at` for a few ops (a sorted list): those ready now launched
        together, the others together with those ready at the same time, one timeout
        per time in increasing order, as :meth:`_at` groups them."""
        ready_at = self._one.ready_at
        at_once = []
        later: dict[float, list[int]] = {}
        for op in ops:
            at = ready_at[op]
            if at > now:
                later.setdefault(at - now, []).append(op)
            else:
                at_once.append(op)
        if len(at_once) == 1:
            self._start_one(at_once[0])
        elif at_once:
            self._launch(np.array(at_once, dtype=np.int64))
        for delay in sorted(later):
            batch = later[delay]
            if len(batch) == 1:
                op = batch[0]
                self.env.timeout(delay).callbacks.append(lambda _event, o=op: self._start_one(o))
            else:
                group = np.array(batch, dtype=np.int64)
                self.env.timeout(delay).callbacks.append(lambda _event, g=group: self._launch(g))

    def _release(self, ops: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> None:
        # A simulated op's event (sent, or done): its successors' dependency is met now.
        ready = self._release_at(ops, np.full(len(ops), self.env.now), ptr, idx)
        if len(ready):
            self._dispatch(ready)

    def _release_at(
        self,
        ops: np.ndarray,
        times: np.ndarray,
        ptr: np.ndarray,
        idx: np.ndarray,
        *,
        unique: bool = True,
    ) -> np.ndarray:
        """Satisfy, at ``times``, the dependencies on ``ops`` (``ptr``, ``idx``: the
        successors waiting for them to be sent, or done); returns the ops made ready
        (sorted, each once; with ``unique=False`` possibly repeated, for a caller that
        merges several)."""
        succ = csr_gather(ptr, idx, ops)
        if len(succ) == 0:
            return succ
        at = np.repeat(times, ptr[ops + 1] - ptr[ops]) if len(ops) > 1 else times[:1]
        if len(succ) == 1:
            self._ready_at[succ] = np.maximum(self._ready_at[succ], at)
            self._pending[succ] -= 1
            ready = succ if self._pending[succ[0]] == 0 else succ[:0]
        else:
            np.maximum.at(self._ready_at, succ, at)
            np.subtract.at(self._pending, succ, np.int32(1))  # its type: ufunc.at's fast path
            ready = succ[self._pending[succ] == 0]
            if unique and len(ready) > 1:
                ready = np.unique(ready)
        return ready

    def _time(self, ops: np.ndarray) -> None:
        """Time ``ops`` (not simulated, dependencies known) and every op they make ready
        that is not simulated either, level by level; launch the simulated ones."""
        while len(ops):
            if len(ops) <= FEW_OPS:  # a few ops: scalar arithmetic, no array pass
                self._time_few(ops.tolist())
                return
            begin = self._ready_at[ops]
            share = self._twins(ops, begin)
            sent = begin + self._transfer_s[ops] * share
            end = sent + self._latency_s[ops] + self._reduce_s[ops] * share
            self.start_s[ops] = begin
            self.sent_s[ops] = sent
            self.end_s[ops] = end
            self._timed_count += len(ops)
            ready = np.concatenate(
                [
                    self._release_at(ops, sent, self._sent_ptr, self._sent_idx, unique=False),
                    self._release_at(ops, end, self._done_ptr, self._done_idx, unique=False),
                ]
            )
            if len(ready) > 1:
                ready = np.unique(ready)
            simulated = self._simulated[ready]
            if simulated.any():
                self._launch_at(ready[simulated])
            ops = ready[~simulated]

    def _time_few(self, ops: list[int]) -> None:
        """:meth:`_time` for a few ops given as a sorted list, level by level in Python
        scalars: the same arithmetic, and the same identical twins (:meth:`_twins`)."""
        one = self._one
        while ops:
            if len(ops) == 1:
                self._time_chain(ops[0])
                return
            if len(ops) > FEW_OPS:
                self._time(np.array(ops, dtype=np.int64))
                return
            # Twins: the same route, start, bytes and reduction, in ``ops``' order.
            groups: dict[tuple, list[int]] = {}
            for op in ops:
                key = (one.routes[op], one.ready_at[op], one.wire[op], one.reduce[op])
                members = groups.get(key)
                if members is None:
                    groups[key] = [op]
                else:
                    members.append(op)
            twin_of = self.twin_of
            times: list[tuple[int, float, float]] = []
            for members in groups.values():
                if len(members) == 1:
                    share = one.copies[members[0]]
                else:
                    share = 0.0
                    for op in members:  # in order, as np.bincount sums them
                        share += one.copies[op]
                    for op in members:
                        twin_of[op] = members[0]
                for op in members:
                    times.append((op, *self._time_one(op, share)))
            self._timed_count += len(ops)
            found: list[int] = []
            for op, sent, _ in times:
                self._release_one(op, sent, one.sent_succ, found)
            for op, _, end in times:
                self._release_one(op, end, one.done_succ, found)
            found.sort()
            launch = [op for op in found if one.simulated[op]]
            if launch:
                self._launch_at(np.array(launch, dtype=np.int64))
            ops = [op for op in found if not one.simulated[op]]

    def _time_one(self, op: int, share: float) -> tuple[float, float]:
        """Time ``op`` from when its last dependency is met, its flow one of ``share``
        identical ones (its weight, alone): stores and returns its sent and done times,
        the array pass's arithmetic."""
        one = self._one
        begin = one.ready_at[op]
        sent = begin + one.transfer[op] * share
        end = sent + one.latency[op] + one.reduce[op] * share
        one.start[op] = begin
        one.sent[op] = sent
        one.end[op] = end
        return sent, end

    def _dispatch_few(self, ready: list[int]) -> None:
        """:meth:`_dispatch` for a few ops given as a sorted list, in Python scalars."""
        timed = []
        simulated = self._one.simulated
        for op in ready:
            if simulated[op]:
                self._launch_one(op)
            else:
                timed.append(op)
        if timed:
            self._time_few(timed)
        self._check_finished()

    def _launch_one(self, op: int) -> None:
        """:meth:`_launch_at` for one op."""
        now = self.env.now
        at = self._one.ready_at[op]
        if at > now:
            self.env.timeout(at - now).callbacks.append(lambda _event: self._start_one(op))
        else:
            self._start_one(op)

    def _start_one(self, op: int) -> None:
        """:meth:`_launch` for one op, in Python scalars (the same stores)."""
        add_flow = getattr(self.network, "add_flow", None)
        if add_flow is None:
            self._launch(np.array([op], dtype=np.int64))
            return
        now = self.env.now
        one = self._one
        one.start[op] = now
        self._flow_start[op] = now
        add_flow(self._owner, op, one.routes[op], one.wire[op], one.copies[op])

    def _time_chain(self, op: int) -> None:
        """:meth:`_time` for one op and, while each makes exactly one more timed op
        ready, the chain that follows it (a ring's hops), in Python scalars (the same
        arithmetic as the array pass)."""
        one = self._one
        while True:
            sent, end = self._time_one(op, one.copies[op])
            self._timed_count += 1
            found: list[int] = []
            self._release_one(op, sent, one.sent_succ, found)
            self._release_one(op, end, one.done_succ, found)
            timed = []
            for succ in sorted(set(found)) if len(found) > 1 else found:
                if one.simulated[succ]:
                    self._launch_one(succ)
                else:
                    timed.append(succ)
            if len(timed) != 1:
                if timed:
                    self._time_few(timed)
                return
            op = timed[0]

    def _twins(self, ops: np.ndarray, begin: np.ndarray) -> np.ndarray:
        """How many identical flows (same route, start, bytes and reduction) each of
        ``ops`` starts with: k of them share every link of their route (and their
        reducer) equally, each at 1/k of its bottleneck, and end together (an op of
        weight w counts w times). Records each one's group head in ``twin_of``; returns
        k per op."""
        share = self._copies[ops]
        if len(ops) < 2:
            return share
        route, wire, red = self._all_routes[ops], self._wire[ops], self._reduce_s[ops]
        order = np.lexsort((red, wire, begin, route))
        key = (route[order], begin[order], wire[order], red[order])
        first = np.r_[True, np.any([k[1:] != k[:-1] for k in key], axis=0)]
        if first.all():
            return share
        group = np.cumsum(first) - 1
        share = share.copy()
        share[order] = np.bincount(group, weights=share[order])[group]
        self.twin_of[ops[order]] = ops[order][first][group]
        return share

    def _check_finished(self) -> None:
        if self._finish_scheduled:
            return
        if self._done_count + self._timed_count < self.schedule.n_ops:
            return
        self._finish_scheduled = True
        self.network.release(self._owner)
        wait = float(np.nanmax(self.end_s)) - self.env.now
        if wait <= 0:
            self.finished.succeed()
        else:
            self.env.timeout(wait).callbacks.append(lambda _event: self.finished.succeed())


def time_mixed(
    network: FlowNetwork,
    schedule: Schedule,
    reduce_bandwidth: np.ndarray,
    *,
    routes: np.ndarray | None = None,
    max_rounds: int = MAX_ROUNDS,
    weight: np.ndarray | None = None,
    max_simulated: float | None = None,
) -> Timeline | None:
    """Time ``schedule`` on ``network`` simulating, event by event, only the flows that
    meet others (see the module docstring); None when that is not settled within
    ``max_rounds`` rounds or the schedule deadlocks (the caller then replays every flow,
    which reports the deadlock).

    ``network`` must be fresh (no flow added yet); on success its records (bytes, busy
    time, when idle per link) and stats are those of replaying every flow. ``routes``:
    each op's route, when the caller already has them. ``weight[i]``: op i stands for
    that many identical transfers side by side (a merged schedule's; default one).
    ``max_simulated``: the share of the ops simulated past which it gives up (default
    :data:`MAX_SIMULATED`).
    """
    n = schedule.n_ops
    if n == 0:
        return Timeline.empty()
    router = network.router
    routes = op_routes(network, schedule, routes)
    reducer, reduce_s = op_reducers(network, schedule, reduce_bandwidth)
    ptr, route_links, route_latency = router.arrays()
    capacity = network.capacity
    lengths = np.diff(ptr)
    bottleneck = route_bottlenecks(ptr, route_links, capacity)
    wire = schedule.nbytes
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer_s = np.where(wire > 0, wire / bottleneck[routes], 0.0)
    latency_s = route_latency[routes]
    # Each op's links (its route's, then its reducer) as a CSR incidence.
    op_len = lengths[routes] + (reducer >= 0)
    op_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(op_len, out=op_ptr[1:])
    # int32: millions of entries, and memory is the limit at scale.
    inc_link = np.empty(int(op_ptr[-1]), dtype=np.int32)
    on_route = np.ones(len(inc_link), dtype=bool)
    has_red = np.flatnonzero(reducer >= 0)
    on_route[op_ptr[has_red + 1] - 1] = False
    inc_link[on_route] = csr_gather(ptr, route_links, routes)
    inc_link[~on_route] = reducer[has_red]
    inc_op = np.repeat(np.arange(n, dtype=np.int32), op_len)

    lists = successors(schedule)  # the same every round
    n_links = len(capacity)
    contended = np.zeros(n_links, dtype=bool)
    # A fresh network (see above): its clock can be one of cheaper timeouts.
    env = _Clock()
    network.reset_clock(env)
    for _ in range(max_rounds):
        crossing = np.zeros(n, dtype=bool)
        np.logical_or.at(crossing, inc_op, contended[inc_link])
        share = MAX_SIMULATED if max_simulated is None else max_simulated
        if crossing.sum() > max(share * n, FEW_SIMULATED):
            return None
        # Few simulated flows meet at a time: the network's model in Python scalars.
        lean = LeanFlowNetwork(network)
        replay = _MixedReplay(
            lean,
            schedule,
            reduce_bandwidth=reduce_bandwidth,
            simulated=crossing,
            routes=routes,
            transfer_s=transfer_s,
            latency_s=latency_s,
            reduce_s=reduce_s,
            successor_lists=lists,
            weight=weight,
        )
        finished = replay.start()
        try:
            run_env(env, finished)
        except RuntimeError:
            return None  # a deadlock: the full replay reports it
        lean.close_link_records()
        # Each op's intervals on its links: [start, sent) on its route, [delivered,
        # done) on its reducer.
        lo = np.where(on_route, replay.start_s[inc_op], 0.0)
        hi = np.where(on_route, replay.sent_s[inc_op], 0.0)
        lo[~on_route] = replay.sent_s[has_red] + latency_s[has_red]
        hi[~on_route] = replay.end_s[has_red]
        timed = ~crossing[inc_op]
        # A group of identical twins occupies its links once (its first op's intervals).
        heads = ~timed | (replay.twin_of[inc_op] == inc_op)
        clash = _overlaps(inc_link[heads], lo[heads], hi[heads], timed[heads], n_links)
        if not clash.any():
            carried = schedule.nbytes if weight is None else schedule.nbytes * weight
            nbytes = carried[inc_op[timed]]
            _add_records(network, inc_link[timed], lo[timed], hi[timed], nbytes, heads[timed])
            copies = np.ones(n) if weight is None else np.asarray(weight, dtype=float)
            network.stats.flows += int((~crossing).sum()) + int((~crossing[has_red]).sum())
            network.stats.represented_flows += float(
                copies[~crossing].sum() + copies[has_red][~crossing[has_red]].sum()
            )
            return Timeline(replay.start_s - replay.t0, replay.sent_s - replay.t0,
                            replay.end_s - replay.t0, network.stats.flows)  # fmt: skip
        contended |= clash
        env = _Clock()
        network.reset_clock(env)
    return None


def _overlaps(
    link: np.ndarray, lo: np.ndarray, hi: np.ndarray, timed: np.ndarray, n_links: int
) -> np.ndarray:
    """Links where a timed interval overlaps another interval (by more than rounding).

    ``link[i]`` carries interval ``[lo[i], hi[i])``; ``timed[i]`` says whether it is a
    timed op's. Empty intervals occupy nothing."""
    live = hi > lo
    uses = np.zeros(n_links, dtype=bool)
    uses[link[live & timed]] = True
    keep = live & uses[link]
    link, lo, hi, timed = link[keep], lo[keep], hi[keep], timed[keep]
    clash = np.zeros(n_links, dtype=bool)
    if len(link) < 2:
        return clash
    order = np.lexsort((lo, link))
    link, lo, hi, timed = link[order], lo[order], hi[order], timed[order]
    tol = _TOUCH * np.maximum(np.abs(lo), 1.0)
    same = link[1:] == link[:-1]
    # Sorted by start, intervals that each end before the next starts never overlap:
    # only links where two neighbours overlap need the full check.
    meet = same & (lo[1:] + tol[1:] < hi[:-1])
    if not meet.any():
        return clash
    suspects = np.zeros(n_links, dtype=bool)
    suspects[link[1:][meet]] = True
    pick = suspects[link]
    link, lo, hi, timed, tol = link[pick], lo[pick], hi[pick], timed[pick], tol[pick]
    # The latest end among earlier intervals of the same link, of any and of timed ones.
    before_all = _previous_max(link, hi)
    before_timed = _previous_max(link, np.where(timed, hi, -np.inf))
    bad = (timed & (lo + tol < before_all)) | (lo + tol < before_timed)
    clash[link[bad]] = True
    return clash


def _previous_max(segment: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each position, the maximum of ``values`` at earlier positions of the same
    (sorted, contiguous) ``segment``; -inf for the first of each."""
    m = len(values)
    out = np.full(m, -np.inf)
    if m < 2:
        return out
    same = segment[1:] == segment[:-1]
    out[1:] = np.where(same, values[:-1], -np.inf)
    # Doubling: after the pass with shift s, out[i] covers the s earlier positions.
    shift = 1
    while shift < m:
        reach = segment[shift:] == segment[:-shift]
        if not reach.any():
            break
        out[shift:] = np.maximum(out[shift:], np.where(reach, out[:-shift], -np.inf))
        shift *= 2
    return out


def _add_records(
    network: FlowNetwork,
    link: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    nbytes: np.ndarray,
    head: np.ndarray,
) -> None:
    """Add timed flows' bytes, busy time and idle instants to the network's records (the
    simulated ones are there already): flow ``i`` carried ``nbytes[i]`` over ``link[i]``
    during ``[lo[i], hi[i])``, alone or with identical twins (``head``: the one of them
    whose interval counts), so that the heads' busy times add up."""
    np.add.at(network.link_bytes, link, nbytes)
    np.add.at(network.link_busy, link[head], np.maximum(hi - lo, 0.0)[head])
    np.maximum.at(network.link_idle_at, link, hi)
