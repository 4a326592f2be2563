"""The flow network's max-min model in Python scalars, for flows that meet in small groups.

:class:`~simulator.network.flows.FlowNetwork` keeps flows in numpy arrays and pays a few
dozen array operations per event, whatever the number of flows it touches: cheap per
flow when thousands start or end together (a symmetric step), about 100 us per event
when they come one at a time. The flows that the mixed timing
(:mod:`simulator.collective.mixed`) simulates come one at a time (rings drifting apart
over ECMP collisions) and meet in groups of two or three on an uplink. Here the same
model runs on Python sets and floats: each link knows the flows on it, an event finds
the flows connected to the links it changed by a walk over those sets, and max-min
fairness (progressive filling, the same levels and ties as
:func:`~simulator.network.maxmin.max_min_rates`) is computed on that group alone. The
links that one route alone uses (a GPU's, a NIC's) hold that route's flows and no
others, so each route's are kept as one link of their least capacity (the same
constraint), whose records each of them gets: a hop over a fat-tree is three links to
walk, not six.

The semantics are the FlowNetwork's: flows are rated when they start (the FlowNetwork
rates those added at one instant together, after everything queued for it; here each
call's are rated at once, and a later call at the same instant re-rates what it meets,
to the same max-min rates); a flow
alone on every link of its route runs at its slowest link without a max-min; flows
ending within a relative 1e-12 of the earliest end end with it; per-link bytes, busy
time (while at least one flow is on the link) and last idle instant are kept as the
FlowNetwork keeps them, and written into its arrays at the end. A flow of weight k
stands for k identical flows (a merged schedule's op): it loads each of its links k times
its rate, as the FlowNetwork's weighted flows do. Scope: no link classes, rate caps,
holds or flow-seconds; the routes, reducers and records are those of the FlowNetwork it
wraps.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np
import simpy

from .flows import FlowNetwork, FlowOwner

# As in simulator.network.flows and simulator.network.maxmin.
_SAME_TIME = 1e-12
_TIE = 1e-12


class LeanFlowNetwork:
    """Plain flows over ``network``'s links and routes, rated in Python (see the module
    docstring); records go to ``network`` when :meth:`close_link_records` is called."""

    def __init__(self, network: FlowNetwork):
        self.network = network
        self.env: simpy.Environment = network.env
        self.graph = network.graph
        self.router = network.router
        self.links = network.links
        self.link_efficiency = network.link_efficiency
        self.stats = network.stats
        self._owners: list[FlowOwner | None] = []
        # Route id -> (its links as internal ids, its slowest link's capacity, its
        # latency), read once: a flow alone on its route is rated and delivered from
        # these without a lookup per link (capacities do not change: no timed faults).
        self._route_info: dict[int, tuple[tuple[int, ...], float, float]] = {}
        # Links are kept under internal ids. A link that only one route's flows use
        # (a NIC's, a GPU's) carries exactly that route's flows, so all such links of a
        # route have the same flows at every instant: they are kept as one *private*
        # link of the route, of their least capacity, whose records are each of
        # theirs (the same sums in the same order). Only links that several routes use
        # are kept one by one. ``_use[link]``: routes over each graph link, counted over
        # the router's routes when the first flow comes and over later routes as they
        # come; a link a later route shares is split off its private link then.
        self._use: list[int] | None = None
        self._known_routes = 0
        self._internal: dict[int, int] = {}  # graph link -> internal id (shared links)
        self._members: dict[int, list[int]] = {}  # private link -> its graph links
        self._private_of: dict[int, tuple[int, int]] = {}  # graph link -> (route, id)
        self._capacity: list[float] = []  # per internal id
        self._reseed: set[int] = set()  # private links whose capacity changed
        # Flow id -> [op, owner, links, bytes, left, rate, last, finish, version, route,
        # weight, bottleneck].
        self._flows: dict[int, list] = {}
        self._next_id = 0
        # Per internal link id: the flows on it (None until one comes), and its records:
        # bytes, busy seconds, since when busy, last idle instant (-inf: never idle).
        self._on_link: list[set[int] | None] = []
        self._bytes: list[float] = []
        self._busy: list[float] = []
        self._since: list[float] = []
        self._idle_at: list[float] = []
        self._pending: list[int] = []
        self._heap: list[tuple[float, int, int]] = []
        self._in_wake = False
        self._generation = 0
        # When the live wake-up (of generation ``_generation``) fires; None: none.
        self._wake_at: float | None = None

    # -- what a ScheduleReplay asks of its network ----------------------------------------
    def register(self, owner: FlowOwner) -> int:
        """Register a flow owner; returns the id to pass to :meth:`add_flows`."""
        self._owners.append(owner)
        return len(self._owners) - 1

    def release(self, owner: int) -> None:
        """Forget a finished owner."""
        self._owners[owner] = None

    def reducer_route(self, rank: int, bandwidth: float, class_size: int = 1) -> int:
        """The wrapped network's reducer route (see FlowNetwork.reducer_route)."""
        return self.network.reducer_route(rank, bandwidth, class_size)

    def route_latency(self, routes: np.ndarray) -> np.ndarray:
        """Latency in seconds of each route."""
        return self.network.route_latency(routes)

    def route_classes(self, routes: np.ndarray) -> list[str]:
        """Path class of each route (see FlowNetwork.route_classes)."""
        return self.network.route_classes(routes)

    def add_flows(
        self,
        owner: int,
        ops: np.ndarray,
        routes: np.ndarray,
        nbytes: np.ndarray,
        weight: np.ndarray | None = None,
        cap: np.ndarray | None = None,
    ) -> None:
        """Start one flow per op now, flow i standing for ``weight[i]`` identical ones
        (see FlowNetwork.add_flows; no rate caps)."""
        if cap is not None:
            raise ValueError("LeanFlowNetwork carries no rate caps")
        if len(ops) == 0:
            return
        now = self.env.now
        info, flows, pending = self._route_info, self._flows, self._pending
        if len(ops) == 1:  # one flow (a drifting ring's hop): no list conversions
            copies = 1.0 if weight is None else float(weight[0])
            items: object = ((int(ops[0]), int(routes[0]), float(nbytes[0]), copies),)
            total = copies
        else:
            weights = [1.0] * len(ops) if weight is None else np.asarray(weight, float).tolist()
            items = zip(
                np.asarray(ops).tolist(), np.asarray(routes).tolist(),
                np.asarray(nbytes).tolist(), weights, strict=True,
            )  # fmt: skip
            total = sum(weights)
        for op, route, size, copies in items:
            entry = info.get(route)
            if entry is None:
                entry = self._route_entry(route)
            fid = self._next_id
            self._next_id = fid + 1
            flows[fid] = [op, owner, entry[0], size, size, 0.0, now, np.inf, 0, route, copies,
                          entry[1]]  # fmt: skip
            pending.append(fid)
        self.stats.flows += len(ops)
        self.stats.represented_flows += total
        if not self._in_wake:
            # Rated at once, not after the rest of this instant's callbacks as the
            # FlowNetwork does (one event fewer per start): flows another callback adds
            # at the same instant re-rate what they meet then, to the same max-min rates.
            self._settle([])

    def add_flow(self, owner: int, op: int, route: int, nbytes: float, copies: float) -> None:
        """:meth:`add_flows` for one flow given as Python scalars (the mixed timing's usual
        launch: a drifting ring's next hop), rated at once as there."""
        now = self.env.now
        entry = self._route_info.get(route)
        if entry is None:
            entry = self._route_entry(route)
        fid = self._next_id
        self._next_id = fid + 1
        flow = [op, owner, entry[0], nbytes, nbytes, 0.0, now, math.inf, 0, route, copies,
                entry[1]]  # fmt: skip
        self._flows[fid] = flow
        stats = self.stats
        stats.flows += 1
        stats.represented_flows += copies
        if self._in_wake or self._pending or self._reseed:
            self._pending.append(fid)
            if not self._in_wake:
                self._settle([])
            return
        # _settle([]) for this one flow: alone on every link, its slowest link's rate.
        links = flow[2]
        on_link = self._on_link
        alone = True
        for link in links:
            on = on_link[link]
            if on is None:
                on = on_link[link] = set()
            if not on:
                self._since[link] = now
            else:
                alone = False
            on.add(fid)
        if not links:  # both ends on one node: sent at once
            flow[5], flow[7] = math.inf, now
            self._push(fid, flow)
        elif alone:
            rate = flow[11] / copies
            flow[5] = rate
            flow[7] = _finish(now, nbytes, rate)
            stats.recomputed_flows += 1
            self._push(fid, flow)
        else:
            self._recompute(self._component(set(links)), now)
        self._schedule_wake()

    def _route_entry(self, route: int) -> tuple[tuple[int, ...], float, float]:
        """Read ``route``'s links, bottleneck and latency once (see ``_route_info``)."""
        ptr, flat, latency = self.router.arrays()
        links = flat[ptr[route] : ptr[route + 1]].tolist()
        capacity = self.network.capacity
        if self._use is None:
            self._use = np.bincount(flat, minlength=len(capacity)).tolist()
            self._known_routes = len(ptr) - 1
        use = self._use
        if route >= self._known_routes:  # a route made since: count it now
            for link in links:
                while link >= len(use):
                    use.append(0)
                use[link] += 1
                if use[link] == 2 and link in self._private_of:
                    self._split(link)
        shared = [self._link_id(link) for link in links if use[link] > 1]
        private = [link for link in links if use[link] == 1]
        if private:
            own = self._new_id(min(float(capacity[link]) for link in private))
            self._members[own] = private
            for link in private:
                self._private_of[link] = (route, own)
            shared.append(own)
        bottleneck = min((float(capacity[link]) for link in links), default=np.inf)
        entry = self._route_info[route] = (tuple(shared), bottleneck, float(latency[route]))
        return entry

    def _new_id(self, capacity: float) -> int:
        """A new internal link of ``capacity``, without flows or records."""
        self._capacity.append(capacity)
        self._on_link.append(None)
        self._bytes.append(0.0)
        self._busy.append(0.0)
        self._since.append(0.0)
        self._idle_at.append(-np.inf)
        return len(self._capacity) - 1

    def _link_id(self, link: int) -> int:
        """The internal id of a graph link kept one by one."""
        found = self._internal.get(link)
        if found is None:
            found = self._internal[link] = self._new_id(float(self.network.capacity[link]))
        return found

    def _split(self, link: int) -> None:
        """A later route shares ``link``, until now in a route's private link: keep it
        one by one from now on, with the records and flows it has had so far."""
        route, own = self._private_of.pop(link)
        members = self._members[own]
        members.remove(link)
        mine = self._link_id(link)
        self._bytes[mine] += self._bytes[own]
        self._busy[mine] += self._busy[own]
        self._idle_at[mine] = max(self._idle_at[mine], self._idle_at[own])
        on = self._on_link[own]
        if on:
            self._on_link[mine] = set(on)
            self._since[mine] = self._since[own]
        capacity = self.network.capacity
        self._capacity[own] = min((float(capacity[other]) for other in members), default=np.inf)
        links, bottleneck, latency = self._route_info[route]
        links = (*links, mine)
        self._route_info[route] = (links, bottleneck, latency)
        for fid in [*(on or ()), *self._pending]:
            if self._flows[fid][9] == route:
                self._flows[fid][2] = links
        if on:
            self._reseed.add(own)  # its capacity may have risen: re-rate its flows

    def close_link_records(self) -> None:
        """Close busy intervals of links still carrying flows and add this network's
        records to the wrapped network's arrays."""
        now = self.env.now
        for link, flows in enumerate(self._on_link):
            if flows:
                self._busy[link] += now - self._since[link]
                self._since[link] = now
        # Each graph link's internal id: its own, or its route's private link.
        target = list(self._internal)
        source = list(self._internal.values())
        for own, members in self._members.items():
            target += members
            source += [own] * len(members)
        if target:
            net = self.network
            ids = np.array(target, dtype=np.int64)
            pick = np.array(source, dtype=np.int64)
            np.add.at(net.link_bytes, ids, np.array(self._bytes)[pick])
            np.add.at(net.link_busy, ids, np.array(self._busy)[pick])
            np.maximum.at(net.link_idle_at, ids, np.array(self._idle_at)[pick])
        n = len(self._capacity)
        self._bytes, self._busy, self._idle_at = [0.0] * n, [0.0] * n, [-np.inf] * n

    # -- rates ----------------------------------------------------------------------------
    def _settle(self, finished: list[int]) -> None:
        """Take in pending flows, drop ``finished`` ones, re-rate what they touch."""
        now = self.env.now
        on_link, flows = self._on_link, self._flows
        seeds: set[int] = set()
        if finished:
            busy, since, idle_at = self._busy, self._since, self._idle_at
            for fid in finished:
                for link in flows.pop(fid)[2]:
                    on = on_link[link]
                    on.discard(fid)
                    if on:
                        seeds.add(link)
                    else:
                        busy[link] += now - since[link]
                        idle_at[link] = now
        new = self._pending
        if new:
            self._pending = []
            since = self._since
            for fid in new:
                for link in flows[fid][2]:
                    on = on_link[link]
                    if on is None:
                        on = on_link[link] = set()
                    if not on:
                        since[link] = now
                    on.add(fid)
            for fid in new:
                flow = flows[fid]
                links = flow[2]
                if not links:  # both ends on one node: sent at once
                    flow[5], flow[7] = np.inf, now
                    self._push(fid, flow)
                    continue
                for link in links:
                    if len(on_link[link]) != 1:
                        seeds.update(links)
                        break
                else:  # alone on every link: its slowest link's rate, no max-min
                    # min(c / k) over the links is min(c) / k exactly (division by k > 0
                    # is monotonic in c), the FlowNetwork's rate.
                    rate = flow[11] / flow[10]
                    flow[5], flow[6] = rate, now
                    flow[7] = _finish(now, flow[4], rate)
                    self.stats.recomputed_flows += 1
                    self._push(fid, flow)
        if self._reseed:
            seeds.update(self._reseed)
            self._reseed.clear()
        if seeds:
            # Links the ended flows left empty change nothing.
            seeds = {link for link in seeds if on_link[link]}
            if seeds:
                self._recompute(self._component(seeds), now)
        self._schedule_wake()

    def _finish_one(self, fid: int) -> None:
        """:meth:`_settle` for one ended flow and nothing pending (the usual case)."""
        if self._pending or self._reseed:
            self._settle([fid])
            return
        now = self.env.now
        on_link = self._on_link
        seeds: set[int] = set()
        for link in self._flows.pop(fid)[2]:
            on = on_link[link]
            on.discard(fid)
            if on:
                seeds.add(link)
            else:
                self._busy[link] += now - self._since[link]
                self._idle_at[link] = now
        if seeds:
            self._recompute(self._component(seeds), now)
        self._schedule_wake()

    def _component(self, seeds: set[int]) -> set[int]:
        """Flows connected, through shared links, to the ``seeds`` links."""
        on_link, flows = self._on_link, self._flows
        found: set[int] = set()
        reached = set(seeds)
        todo = list(seeds)
        while todo:
            for fid in on_link[todo.pop()]:
                if fid not in found:
                    found.add(fid)
                    for link in flows[fid][2]:
                        if link not in reached:
                            reached.add(link)
                            todo.append(link)
        return found

    def _recompute(self, group: set[int], now: float) -> None:
        """Max-min fair rates of ``group`` (a whole component), by progressive filling."""
        self.stats.recomputes += 1
        self.stats.recomputed_flows += len(group)
        flows, capacity = self._flows, self._capacity
        if len(group) == 1:
            # Alone on its links (a component of one): the filling's one level is its
            # slowest link's capacity over its weight, min(c / k) = min(c) / k exactly.
            for fid in group:
                flow = flows[fid]
                elapsed = now - flow[6]
                if elapsed > 0 and flow[5] > 0:
                    flow[4] = max(flow[4] - flow[5] * elapsed, 0.0)
                flow[6] = now
                flow[5] = flow[11] / flow[10]
                flow[7] = _finish(now, flow[4], flow[5])
                self._push(fid, flow)
            return
        remaining: dict[int, float] = {}
        # Per link: the summed weight of its rising flows, and how many there are.
        count: dict[int, float] = {}
        number: dict[int, int] = {}
        for fid in group:
            flow = flows[fid]
            elapsed = now - flow[6]
            if elapsed > 0 and flow[5] > 0:
                flow[4] = max(flow[4] - flow[5] * elapsed, 0.0)
            flow[6] = now
            copies = flow[10]
            for link in flow[2]:
                if link in count:
                    count[link] += copies
                    number[link] += 1
                else:
                    remaining[link] = capacity[link]
                    count[link] = 0.0 + copies
                    number[link] = 1
        rising = set(group)
        on_link = self._on_link
        while rising:
            # Each link's fair share this level (links whose flows all froze: none).
            shares = {
                link: max(remaining[link], 0.0) / n for link, n in count.items() if number[link]
            }
            level = min(shares.values(), default=math.inf)
            if not math.isfinite(level):
                break
            limit = level * (1 + _TIE)
            for link, share in shares.items():
                if share > limit:
                    continue
                for fid in on_link[link]:
                    if fid in rising:
                        rising.discard(fid)
                        flow = flows[fid]
                        flow[5] = level
                        copies = flow[10]
                        for other in flow[2]:
                            remaining[other] -= level * copies
                            count[other] -= copies
                            number[other] -= 1
        for fid in rising:  # only infinite links: no limit
            flows[fid][5] = np.inf
        for fid in group:
            flow = flows[fid]
            flow[7] = _finish(now, flow[4], flow[5])
            self._push(fid, flow)

    def _push(self, fid: int, flow: list) -> None:
        flow[8] += 1
        heapq.heappush(self._heap, (flow[7], fid, flow[8]))

    def _schedule_wake(self) -> None:
        heap, flows = self._heap, self._flows
        while heap:
            _, fid, version = heap[0]
            flow = flows.get(fid)
            if flow is not None and flow[8] == version:
                break
            heapq.heappop(heap)  # stale: re-rated or ended since
        target = heap[0][0] if heap else math.inf
        if target == self._wake_at:
            return  # the wake-up already scheduled is for this instant: keep it
        self._generation += 1  # any other scheduled wake-up is stale
        self._wake_at = target
        if not math.isfinite(target):
            return
        generation = self._generation
        wake = self.env.timeout(max(target - self.env.now, 0.0))
        wake.callbacks.append(lambda _event: self._wake(generation, target))

    # -- completions ----------------------------------------------------------------------
    def _wake(self, generation: int, target: float) -> None:
        if generation != self._generation:
            return
        self._wake_at = None  # this wake-up is being used
        limit = target + _SAME_TIME * abs(target)
        heap, flows = self._heap, self._flows
        done: list[int] = []
        while heap and heap[0][0] <= limit:
            _, fid, version = heapq.heappop(heap)
            flow = flows.get(fid)
            if flow is not None and flow[8] == version:
                flow[8] += 1  # ends now: any other entry of it is stale
                done.append(fid)
        if len(done) == 1:
            self._end_one(done[0])
            return
        by_owner: dict[int, list[tuple[int, int]]] = {}
        for fid in done:
            flow = flows[fid]
            carried = flow[3] * flow[10]
            for link in flow[2]:
                self._bytes[link] += carried
            by_owner.setdefault(flow[1], []).append((flow[0], flow[9]))
        self._in_wake = True
        try:
            for owner in sorted(by_owner):
                pairs = np.array(sorted(by_owner[owner]), dtype=np.int64).reshape(-1, 2)
                ops, routes = pairs[:, 0], pairs[:, 1]
                target_owner = self._owners[owner]  # on_sent may finish and release it
                target_owner.on_sent(ops)
                wanted = getattr(target_owner, "wants_delivery", None)
                if wanted is not None:
                    keep = wanted(ops)
                    ops, routes = ops[keep], routes[keep]
                if len(ops):
                    self._deliver_later(
                        target_owner.on_delivered, ops, self.network.route_latency(routes)
                    )
        finally:
            self._in_wake = False
        self._settle(done)

    def _end_one(self, fid: int) -> None:
        """:meth:`_wake`'s work for one ending flow (the usual case: flows that drift
        apart end one at a time), without grouping by owner."""
        flow = self._flows[fid]
        carried = flow[3] * flow[10]
        records = self._bytes
        for link in flow[2]:
            records[link] += carried
        target_owner = self._owners[flow[1]]  # on_sent may finish and release it
        sent_one = getattr(target_owner, "sent_one", None)
        if sent_one is not None:
            # The owner takes the op as a Python int and says whether it wants the
            # delivery: no one-element arrays (a drifting ring's usual hop).
            self._in_wake = True
            try:
                wanted = sent_one(flow[0])
            finally:
                self._in_wake = False
            if wanted:
                ops = np.array([flow[0]], dtype=np.int64)
                delivered = target_owner.on_delivered
                delay = self._route_info[flow[9]][2]
                self.env.timeout(delay).callbacks.append(lambda _event: delivered(ops))
            self._finish_one(fid)
            return
        ops = np.array([flow[0]], dtype=np.int64)
        self._in_wake = True
        try:
            target_owner.on_sent(ops)
            wanted = getattr(target_owner, "wants_delivery", None)
            if wanted is None or wanted(ops)[0]:
                delivered = target_owner.on_delivered
                delay = self._route_info[flow[9]][2]
                self.env.timeout(delay).callbacks.append(lambda _event: delivered(ops))
        finally:
            self._in_wake = False
        self._settle([fid])

    def _deliver_later(
        self, callback: Callable[[np.ndarray], None], ops: np.ndarray, delay: np.ndarray
    ) -> None:
        """Call ``callback(ops)`` after each op's delay, as the FlowNetwork does."""
        FlowNetwork._deliver_later(self, callback, ops, delay)  # type: ignore[arg-type]


def _finish(now: float, left: float, rate: float) -> float:
    """When a flow with ``left`` bytes at ``rate`` is through (never at rate 0), as the
    FlowNetwork computes it."""
    if left <= 0:
        return now
    return now + left / rate if rate > 0 else np.inf
