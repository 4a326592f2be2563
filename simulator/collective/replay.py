"""Replaying a collective schedule on a flow network.

A :class:`ScheduleReplay` walks a schedule's DAG inside SimPy: ops whose dependencies
are satisfied start together as one batch of flows; when flows are sent or delivered
the network calls back, the replay counts down the dependencies of their successors and
starts whatever became ready. A reducing transfer is done after its delivery plus the
receiver's reduction time (bytes / reduce bandwidth). Dependencies are counted with
numpy over CSR successor lists, so a step of a thousand-rank ring is a handful of array
operations.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
import numpy as np
import simpy

from ..algorithms.schedule import (
    PATH_DEFAULT,
    PATH_DOWN,
    PATH_NETWORK,
    PATH_PXN,
    PATH_SHARP_DOWN,
    PATH_SHARP_UP,
    PATH_UP,
    Schedule,
    csr_gather,
    successors,
)
from ..errors import DeadlockError
from ..library.protocol import Protocol
from ..network.flows import FlowNetwork
from ..network.routing import Router
from ..topology.graph import gpu_nodes

#: NCCL's network post overhead (x86 Intel), src/graph/tuning.cc:226-233 at v2.30.7.
NET_OVERHEAD_S = 1e-6


def reduce_bandwidths(graph: nx.Graph, override: float | None = None) -> np.ndarray:
    """Reduction bandwidth (bytes/s) of each rank's GPU; ``inf`` when not given."""
    if override is not None:
        return np.full(len(gpu_nodes(graph)), float(override))
    return np.array(
        [float(graph.nodes[node].get("reduce_bandwidth", np.inf)) for node in gpu_nodes(graph)]
    )


class ScheduleReplay:
    """Runs one schedule on ``network``; ``finished`` fires when every op is done.

    ``rank_map[r]`` is the topology rank that plays schedule rank ``r`` (identity by
    default), so a schedule can run on a subset of the GPUs.

    A *quotient* schedule (:mod:`simulator.collective.symmetry`) runs with ``weight``, the
    number of flows each op's flow stands for, and ``period``: schedule ranks ``period``
    apart share one proxy and one reducer, those of the rank in ``0..period-1`` (the
    network's link classes must be set to match), and ``on_rank_done`` names those
    ranks only (a rank is done with the transfers it sends and those its images
    receive, which finish together). ``copies`` is how many GPUs each reducer stands
    for (default ``ranks / period``; a workload simulating one of several identical
    replicas gives their count). ``successor_lists``: the schedule's
    :func:`~simulator.algorithms.schedule.successors`, when the caller already has them
    (several replays of one schedule).
    """

    def __init__(
        self,
        network: FlowNetwork,
        schedule: Schedule,
        *,
        rank_map: np.ndarray | None = None,
        reduce_bandwidth: np.ndarray | None = None,
        on_rank_done: Callable[[np.ndarray], None] | None = None,
        protocol: Protocol | None = None,
        weight: np.ndarray | None = None,
        period: int | None = None,
        copies: int | None = None,
        successor_lists: tuple | None = None,
    ):
        self.env: simpy.Environment = network.env
        self.network = network
        self.schedule = schedule
        n = schedule.n_ops
        if rank_map is None:
            self._src, self._dst = schedule.src, schedule.dst
        else:
            rank_map = np.asarray(rank_map, dtype=np.int32)
            self._src, self._dst = rank_map[schedule.src], rank_map[schedule.dst]
        if reduce_bandwidth is None:
            reduce_bandwidth = reduce_bandwidths(network.graph)
        reduce_bandwidth = np.asarray(reduce_bandwidth, dtype=float)
        self._weight = None if weight is None else np.asarray(weight, dtype=float)
        # Rank whose proxy and reducer stand for each rank's (itself without a period):
        # folded on the schedule's ranks, then mapped like them.
        if period is None:
            self._local = (self._dst, self._src)
        else:
            fold = np.arange(schedule.ranks) % period
            if rank_map is not None:
                fold = rank_map[fold]
            self._local = (fold[schedule.dst], fold[schedule.src])
        if copies is None:
            copies = 1 if period is None else schedule.ranks // period
        # Reductions run on the receiving GPU at its reduce bandwidth, and the reductions a
        # GPU has in progress (from any collective on this network) share it: each one is
        # a flow on a per-GPU "reducer" link of that capacity. None when they are free.
        self._reducer = None
        if schedule.reduce.any() and np.isfinite(reduce_bandwidth).any():
            self._reducer = np.full(len(reduce_bandwidth), -1, dtype=np.int64)
            for rank in np.unique(self._local[0][schedule.reduce]).tolist():
                if np.isfinite(reduce_bandwidth[rank]):
                    self._reducer[rank] = network.reducer_route(
                        rank, reduce_bandwidth[rank], class_size=copies
                    )
        # With a protocol, flows carry more bytes than the data (LL's flags) and each
        # transfer's step costs at least the protocol's per-hop latency for its path.
        self._protocol = protocol
        self._wire = schedule.nbytes if protocol is None else schedule.nbytes / protocol.bandwidth
        self._extra = None if protocol is None else np.zeros(n)
        # Whether each transfer crosses the network (its proxies handle it), and when
        # each GPU's network proxy is next free. NCCL runs one proxy thread per GPU and
        # communicator (proxy.cc, ncclProxyCreate; shared only between communicators
        # split with shared resources), so another collective's proxies do not queue
        # with this one's.
        self._crosses = np.zeros(n, dtype=bool)
        # When each transfer's flow started and its step latency (for channel_rate).
        self._flow_start = np.zeros(n)
        self._hop = np.zeros(n)
        self._proxy_free = np.zeros(
            int(max(self._src.max(initial=0), self._dst.max(initial=0))) + 1
        )
        nvls = network.link_efficiency.get("nvls")
        switch = (schedule.path == PATH_UP) | (schedule.path == PATH_DOWN)
        if protocol is not None and nvls and switch.any():
            # NVLink capacity is already scaled to plain copies' efficiency; the switch's
            # multimem reads and writes reach the calibration's "nvls" share instead.
            scale = network.link_efficiency.get("nvlink", 1.0) / nvls
            self._wire = np.where(switch, self._wire * scale, self._wire)
        self._step_s: float | None = None
        self._all_routes: np.ndarray | None = None
        self._latencies: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pending = np.diff(schedule.dep_ptr).astype(np.int32)
        # The schedule's successor lists (see successors), unless the caller has them.
        (self._done_ptr, self._done_idx), (self._sent_ptr, self._sent_idx) = (
            successor_lists or successors(schedule)
        )
        self.start_s = np.full(n, np.nan)
        self.sent_s = np.full(n, np.nan)
        self.end_s = np.full(n, np.nan)
        self.t0 = self.env.now
        self._done_count = 0
        self.finished = self.env.event()
        self._owner = network.register(self)
        # Per-rank completion (for workloads): a rank is done with this collective when
        # every transfer it sends or receives is done.
        self._on_rank_done = on_rank_done
        self._period = schedule.ranks if period is None else period
        if on_rank_done is not None:
            p = self._period
            self._rank_left = np.bincount(schedule.src % p, minlength=p) + np.bincount(
                schedule.dst % p, minlength=p
            )

    def start(self) -> simpy.Event:
        """Start the ops without dependencies now; returns the ``finished`` event."""
        self.t0 = self.env.now
        if self._on_rank_done is not None and not self._rank_left.all():
            self._on_rank_done(np.flatnonzero(self._rank_left == 0))
        if self.schedule.n_ops == 0:
            self.finished.succeed()
        else:
            self._launch(np.flatnonzero(self._pending == 0))
        return self.finished

    def _launch(self, ops: np.ndarray) -> None:
        if len(ops) == 0:
            return
        if len(ops) == 1 and self._protocol is None:
            # One transfer (a hop of a drifting ring, the mixed timing's usual launch):
            # scalar stores and one-element views instead of fancy indexing.
            op = int(ops[0])
            now = self.env.now
            self.start_s[op] = now
            self._flow_start[op] = now
            one = slice(op, op + 1)
            weight = None if self._weight is None else self._weight[one]
            self.network.add_flows(
                self._owner, ops, self._route_table()[one], self._wire[one], weight
            )
            return
        self.start_s[ops] = self.env.now
        routes = self._route_table()[ops]
        if self._protocol is not None:
            wanted, network, extra = (values[ops] for values in self._latency_table())
            self._extra[ops] = extra
            self._crosses[ops] = network
            if np.isfinite(self._protocol.channel_rate):
                self._hop[ops] = wanted
            if self._protocol.proxy_s > 0 and network.any():
                # A transfer over the network leaves when its sender's proxy has posted
                # its messages (NCCL's sendProxyProgress, transport/net.cc).
                self._send(ops[~network], routes[~network])
                ops, routes = ops[network], routes[network]
                ready = proxy_queue(
                    self._proxy_free, self._local[1][ops], self._proxy_busy(ops), self.env.now
                )
                self._at(
                    self._proxy_wait(ready),
                    lambda pick, o=ops, r=routes: self._send(o[pick], r[pick]),
                )
                return
        self._send(ops, routes)

    def _send(self, ops: np.ndarray, routes: np.ndarray) -> None:
        """Start the flows of ``ops`` now."""
        if len(ops):
            self._flow_start[ops] = self.env.now
            weight = None if self._weight is None else self._weight[ops]
            self.network.add_flows(self._owner, ops, routes, self._wire[ops], weight)

    def _proxy_busy(self, ops: np.ndarray) -> np.ndarray:
        """Proxy time of each network transfer: one protocol message per
        ``message_bytes`` of data (at least one)."""
        proto = self._protocol
        messages = np.maximum(1.0, np.ceil(self.schedule.nbytes[ops] / proto.message_bytes))
        return messages * proto.proxy_s

    def _proxy_wait(self, ready: np.ndarray) -> np.ndarray:
        """How long transfers wait for a proxy done at ``ready``: NCCL's per-step network
        latency (hwLatencies, measured end to end) already holds one message's handling,
        so only the queue before it and a transfer's further messages add time."""
        wait = ready - self.env.now - self._protocol.proxy_s
        return np.where(wait > 1e-12, wait, 0.0)

    def _at(self, delays: np.ndarray, action: Callable[[np.ndarray], None]) -> None:
        """Call ``action`` with the indices of equal ``delays``, after that delay (at
        once for those not positive)."""
        if len(delays) == 1:  # one transfer (a chain of steps): no grouping
            value = float(delays[0])
            pick = np.zeros(1, dtype=np.int64)
            if value <= 0.0:
                action(pick)
            else:
                event = self.env.timeout(value)
                event.callbacks.append(lambda _event: action(pick))
            return
        delays = np.maximum(delays, 0.0)
        if delays.min() == delays.max():  # one delay for all (a step of a ring): no sort
            values, group = delays[:1], np.zeros(len(delays), dtype=np.int64)
        else:
            values, group = np.unique(delays, return_inverse=True)
        for index, value in enumerate(values.tolist()):
            pick = np.flatnonzero(group == index)
            if value == 0.0:
                action(pick)
            else:
                event = self.env.timeout(value)
                event.callbacks.append(lambda _event, pick=pick: action(pick))

    def _route_table(self) -> np.ndarray:
        """Every op's route, found once (on the replay's ranks, which a workload maps
        from the group's to the cluster's)."""
        if self._all_routes is None:
            ops = np.arange(self.schedule.n_ops)
            self._all_routes = route_ops(
                self.network.router, self.schedule, ops, self._src, self._dst
            )
        return self._all_routes

    def _latency_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every op's step latency, whether it crosses the network, and the latency its
        step adds to its path's (see :meth:`_step_latency`), found once."""
        if self._latencies is None:
            routes = self._route_table()
            wanted, network = self._step_latency(routes)
            extra = np.maximum(wanted - self.network.route_latency(routes), 0.0)
            self._latencies = (wanted, network, extra)
        return self._latencies

    def _step_latency(self, routes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Protocol latency of each transfer's step, and whether it crosses the network,
        by the class of its own path (NCCL v2.30, src/graph/tuning.cc:393-413: a ring's
        steps inside a server cost the intra-node hop latency, those that cross the
        network the network's). Once the
        schedule spans servers, a step inside one costs at least NCCL's network post
        overhead, 1 us (x3 for Simple; tuning.cc:226-233 and 405-407), where the
        protocol's ``net_floor`` says so (NCCL's ring model)."""
        if self._step_s is None:
            classes = set(self.network.route_classes(np.unique(self._route_table())))
            overhead = 0.0
            if "network" in classes and self._protocol.net_floor:
                overhead = NET_OVERHEAD_S * (3 if self._protocol.name == "Simple" else 1)
            self._step_s = overhead
        unique, inverse = np.unique(routes, return_inverse=True)
        mine = self.network.route_classes(unique)
        hops = np.array([self._protocol.hop_s[cls] for cls in mine], dtype=float)[inverse]
        network = np.array([cls == "network" for cls in mine], dtype=bool)[inverse]
        return np.maximum(hops, self._step_s), network

    def _release(self, ops: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> None:
        succ = csr_gather(ptr, idx, ops)
        if len(succ) == 0:
            return
        # The common case in a step of a quotient or a small schedule is one successor:
        # plain indexing, no sort.
        if len(succ) == 1:
            self._pending[succ] -= 1
            if self._pending[succ[0]] == 0:
                self._launch(succ)
            return
        np.subtract.at(self._pending, succ, np.int32(1))  # its type: ufunc.at's fast path
        ready = succ[self._pending[succ] == 0]
        self._launch(np.unique(ready) if len(ready) > 1 else ready)

    def on_sent(self, ops: np.ndarray) -> None:
        """Network callback: the last byte of these flows left (a reduction flow, with id
        op + n_ops, has then finished: its op is done)."""
        ops = self._transfers_sent(ops)
        if len(ops) == 0:
            return
        self.sent_s[ops] = self.env.now
        self._release(ops, self._sent_ptr, self._sent_idx)

    def _transfers_sent(self, ops: np.ndarray) -> np.ndarray:
        """Of the flows just sent, complete the reductions (ids op + n_ops: their op is
        done) and return the transfers' ops."""
        n = self.schedule.n_ops
        if len(ops) == 1 and ops[0] < n:  # one transfer: no array comparison
            return ops
        reductions = ops >= n
        if not reductions.any():
            return ops
        self._complete(ops[reductions] - n)
        return ops[~reductions]

    def on_delivered(self, ops: np.ndarray) -> None:
        """Network callback: these ops arrived; after the protocol's step latency they
        are reduced if needed, then done."""
        ops = ops[ops < self.schedule.n_ops]  # a reduction flow's "delivery" means nothing
        if len(ops) == 0:
            return
        delay = self._extra[ops] if self._extra is not None else None
        if delay is not None and np.isfinite(self._protocol.channel_rate):
            # One channel's thread block moves its data no faster than channel_rate:
            # the step ends no earlier than its latency plus the bytes at that rate
            # (for a transfer standing for several pipelined chunks, as many steps and
            # the rate they reach together: Schedule.channel_span).
            steps, scale = self.schedule.channel_span()
            copied = self._flow_start[ops] + self._hop[ops] * steps
            copied += self.schedule.nbytes[ops] / (self._protocol.channel_rate * scale)
            delay = np.maximum(delay, copied - self.env.now)
        if delay is not None and self._protocol.proxy_s > 0:
            delay = self._receive_proxy(ops, delay)
        if delay is None or not delay.any():
            self._arrived(ops)
            return
        self._at(delay, lambda pick: self._arrived(ops[pick]))

    def _receive_proxy(self, ops: np.ndarray, delay: np.ndarray) -> np.ndarray:
        """The receiver's proxy handles each network message's completion. With Simple
        it then flushes and tells the GPU (recvProxyProgress, transport/net.cc), so the
        data is usable only after that; LL and LL128 carry their own flags, which the GPU
        polls, so the proxy's work only keeps it busy."""
        network = self._crosses[ops]
        if not network.any():
            return delay
        these = ops[network]
        ready = proxy_queue(
            self._proxy_free, self._local[0][these], self._proxy_busy(these), self.env.now
        )
        if self._protocol.name != "Simple":
            return delay
        delay = delay.copy()
        delay[network] = np.maximum(delay[network], self._proxy_wait(ready))
        return delay

    def _arrived(self, ops: np.ndarray) -> None:
        """Data is at the receiver: copies are done; reductions start on its reducer."""
        if self._reducer is None or len(ops) == 0:
            self._complete(ops)
            return
        routes = np.where(self.schedule.reduce[ops], self._reducer[self._local[0][ops]], -1)
        self._complete(ops[routes < 0])
        reducing = ops[routes >= 0]
        if len(reducing):
            self.network.add_flows(
                self._owner,
                reducing + self.schedule.n_ops,
                routes[routes >= 0],
                self.schedule.nbytes[reducing],
                None if self._weight is None else self._weight[reducing],
            )

    def _complete(self, ops: np.ndarray) -> None:
        if len(ops) == 0:
            return
        self.end_s[ops] = self.env.now
        self._done_count += len(ops)
        if self._on_rank_done is not None and len(ops) == 1:
            # One transfer (a chain of steps): scalar bookkeeping, same result.
            p, left = self._period, self._rank_left
            op = int(ops[0])
            ends = {int(self.schedule.src[op]) % p, int(self.schedule.dst[op]) % p}
            finished = []
            for rank in sorted(ends):
                before = left[rank] > 0
                left[rank] -= 2 if len(ends) == 1 else 1
                if before and left[rank] == 0:
                    finished.append(rank)
            if finished:
                self._on_rank_done(np.array(finished, dtype=np.int64))
        elif self._on_rank_done is not None:
            p = self._period
            touched = np.bincount(self.schedule.src[ops] % p, minlength=p) + np.bincount(
                self.schedule.dst[ops] % p, minlength=p
            )
            before = self._rank_left > 0
            self._rank_left -= touched
            finished = np.flatnonzero(before & (self._rank_left == 0))
            if len(finished):
                self._on_rank_done(finished)
        self._release(ops, self._done_ptr, self._done_idx)
        self._check_finished()

    def _check_finished(self) -> None:
        """Fire ``finished`` once every op is done."""
        if self._done_count == self.schedule.n_ops:
            self.network.release(self._owner)
            self.finished.succeed()

    def stuck_ops(self) -> np.ndarray:
        """Ops that never started (for deadlock reports)."""
        return np.flatnonzero(np.isnan(self.start_s))

    def deadlock_error(self) -> DeadlockError:
        """Describe what is left when the simulation ran dry before ``finished``."""
        stuck = self.stuck_ops()
        sample = ", ".join(
            f"op {i} (rank {self.schedule.src[i]}->{self.schedule.dst[i]}, step "
            f"{self.schedule.step[i]})"
            for i in stuck[:5]
        )
        return DeadlockError(
            f"{self.schedule.algorithm} {self.schedule.op}: {len(stuck)} of "
            f"{self.schedule.n_ops} transfers can never start; first: {sample}"
        )


def route_ops(
    router: Router,
    schedule: Schedule,
    ops: np.ndarray,
    src: np.ndarray | None = None,
    dst: np.ndarray | None = None,
) -> np.ndarray:
    """Route of each op (see :func:`route_pairs`). ``src`` and ``dst`` give every op's
    ranks on the topology when they are not the schedule's own."""
    src = (schedule.src if src is None else src)[ops]
    dst = (schedule.dst if dst is None else dst)[ops]
    path = schedule.path[ops] if schedule.path.any() else None
    return route_pairs(router, src, dst, schedule.channel[ops], path)


def route_pairs(
    router: Router,
    src: np.ndarray,
    dst: np.ndarray,
    channel: np.ndarray,
    path: np.ndarray | None = None,
) -> np.ndarray:
    """Route of each transfer from ``src`` to ``dst`` rank: the shortest (ECMP-hashed by
    ``channel``), unless ``path`` (``Schedule.path`` codes; None for all default) sends it
    through the NICs (multipath) or into or out of a reducing switch (an NVLS NVSwitch,
    or a SHARP switch of the fabric)."""
    if path is None or not path.any():
        return router.route_ids(src, dst, channel)
    routes = np.empty(len(src), dtype=np.int64)
    plain = path == PATH_DEFAULT
    if plain.any():
        routes[plain] = router.route_ids(src[plain], dst[plain], channel[plain])
    for code in (PATH_NETWORK, PATH_UP, PATH_DOWN, PATH_SHARP_UP, PATH_SHARP_DOWN, PATH_PXN):
        these = path == code
        if not these.any():
            continue
        if code == PATH_PXN:
            routes[these] = router.pxn_route_ids(src[these], dst[these], channel[these])
        elif code == PATH_NETWORK:
            routes[these] = router.network_route_ids(src[these], dst[these])
        elif code == PATH_UP:
            routes[these] = router.switch_route_ids(src[these], down=False)
        elif code == PATH_DOWN:
            routes[these] = router.switch_route_ids(dst[these], down=True)
        elif code == PATH_SHARP_UP:
            routes[these] = router.sharp_route_ids(src[these], down=False, partners=dst[these])
        else:
            routes[these] = router.sharp_route_ids(dst[these], down=True, partners=src[these])
    return routes


#: Up to this many requests, :func:`proxy_queue` serves them one by one in Python (the
#: same order and sums), cheaper than sorting them.
_FEW = 16


def proxy_queue(free: np.ndarray, ranks: np.ndarray, busy_s: np.ndarray, now: float) -> np.ndarray:
    """Queue work on GPUs' network proxies; returns when each request is served.

    A GPU's proxy is one host thread that handles its network messages one at a time, in
    arrival order (requests of one call in the order given): request ``i`` occupies rank
    ``ranks[i]``'s proxy for ``busy_s[i]`` seconds from the later of ``now`` and the end
    of that proxy's previous request. ``free`` (when each rank's proxy is next free) is
    updated in place.
    """
    if len(ranks) <= _FEW:  # the common case in a chain of steps: no sorting
        result = []
        for rank, busy in zip(np.asarray(ranks).tolist(), np.asarray(busy_s).tolist(), strict=True):
            done = max(now, float(free[rank])) + busy
            free[rank] = done
            result.append(done)
        return np.array(result)
    ranks = np.asarray(ranks, dtype=np.int64)
    order = np.argsort(ranks, kind="stable")
    sorted_ranks, busy = ranks[order], np.asarray(busy_s, dtype=float)[order]
    first = np.r_[True, sorted_ranks[1:] != sorted_ranks[:-1]]
    start = np.maximum(now, free[sorted_ranks[first]])
    # Within a rank the requests follow each other: its start plus the running sum.
    group = np.cumsum(first) - 1
    running = np.cumsum(busy)
    before = np.r_[0.0, running][np.flatnonzero(first)]
    done = start[group] + running - before[group]
    last = np.r_[first[1:], True]
    free[sorted_ranks[last]] = done[last]
    result = np.empty(len(ranks))
    result[order] = done
    return result
