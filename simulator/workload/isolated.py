"""Calls timed alone once, then replayed from that timing while nothing else shares their
links: a training step's thousands of collectives at the cost of their distinct kinds.

A step repeats the same calls: every micro-batch's tensor-parallel all-reduces, every
pipeline send. Simulated flow by flow, each costs the same again (a 1.2 GB NCCL ring
all-reduce inside a DGX A100 is some 24,000 flows). But max-min fair sharing splits into
independent problems over sets of flows that share no link: while no other flow uses any
link of a call (its routes, and the reducers of its GPUs), its flows take exactly the
rates they take alone, so the call runs exactly as it does alone. Its timing (when each
rank is done, when each link is last used, bytes and busy time per link) then comes from
one run of the call alone on a scratch network, shared by every call with the same
schedule (what a replay reads of it, not its labels: a ring's reduce-scatter on GPUs
without a reducer bandwidth is timed as its all-gather), protocol and *signature*: the
same routes up to renaming the links, over links of the same bandwidth, latency and type,
and reducers of the same bandwidth. A ring of a few dozen transfers a step (a
data-parallel ring's channels) runs there in Python scalars
(:mod:`~simulator.collective.scalar_replay`: the same events, to the same times).

Checked, not assumed. A call replayed this way *holds* its links on the real network until
its timing says it lets each go; a flow started on a held link, or a call launched onto
links that are held, is a *conflict* (a call launched onto links that carry flows is
simply simulated flow by flow). The replay notes the groups of the calls whose links were
intruded on and goes on; a replay that had conflicts is run again with those groups'
calls simulated flow by flow (:class:`~simulator.workload.engine.WorkloadReplay` does
this until a replay has none). What is reported is therefore always a replay in which
every call timed alone really was alone. Networks with timed faults (capacities that
change during a run) never use it.

Taking sends over. A stage's data-parallel all-reduce usually starts while the stage's
last pipeline send is still on its NIC, so it is not alone. When the only flows on a
call's links are a few point-to-point sends that share no link with anything else, the
call and what the sends have left form an independent problem of their own: the call is
timed together with them (the timing's signature then includes their routes, bytes left
and weights), the sends are withdrawn from the network (:meth:`FlowNetwork.withdraw`,
which keeps what they carried so far), and they are sent and delivered when the joint
timing says. The call then holds the sends' links too; a conflict on them stops only the
taking over in the next attempt (:class:`TakeOver`), not the group's timings alone.

With one data-parallel replica standing for all (:mod:`simulator.workload.replicas`),
flows are aggregated over classes of links: the scratch network has the same classes, a
call is timed with its images in every replica (weights and quotient schedules as the
replay runs them), and it holds its links' classes.
"""

from __future__ import annotations

import hashlib
import itertools
import typing
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import simpy

from ..algorithms.schedule import Schedule
from ..collective.replay import ScheduleReplay, route_ops, route_pairs
from ..collective.scalar_replay import replay_scalar
from ..library.protocol import Protocol
from ..network.faults import fault_plan
from ..network.flows import FlowNetwork, FlowState, network_tables
from ..network.routing import LinkTable, Router, add_stand_in_route
from . import reduced as rd
from .bundles import Bundle
from .replicas import ReplicaSymmetry, unique_rows

#: Calls of fewer transfers are always simulated flow by flow: a single point-to-point
#: transfer costs about as much to simulate as to replay, and pipeline sends, which
#: often overlap on a GPU's links, would only cause conflicts.
MIN_OPS = 2
#: Ring calls timed alone whose steps hold at most this many transfers each (channels x
#: positions) run on the scalar replay (simulator.collective.scalar_replay), others on
#: the reference, whose numpy passes cost the same for a step of one flow or of
#: hundreds. Either gives the same times. Measured (s CPU a call, reference -> scalar):
#: the GPT-3 fp8 TP 4 row's DP all-gather, 16 a step, 0.42 -> 0.12; the Llama 3 405B
#: CP 16 row's 128-rank reduce-scatter, 64 a step, 2.2 -> 1.3; wider ones gain nothing
#: or lose (128 a step on the Qwen3 30B row, 0.074 -> 0.10; 192 a step, 0.15 -> 0.29),
#: and so do its all-to-alls (1.27 -> 2.08: large groups of flows meet at each event).
#: A ring whose steps are wider than that but whose transfers take at most this many
#: distinct routes (:func:`_routes`: its channels ride the same hops, NCCL's dozens of
#: channels on one NVLink port or NIC) runs there too: the scalar replay rates a route's
#: flows together (one rate and instant a route), so its cost follows the routes, not
#: the transfers. Measured (s CPU a call, reference -> scalar, load 11-13 on 2 cores,
#: every done time and link record the same double): the MLPerf Llama 3.1 8B rows'
#: data-parallel quotient rings, 16 channels over 8 positions (16 routes) on 256 B200,
#: 1.7 -> 0.6; 62 channels over 32 positions (64 routes) on 512 GB200, 505,920
#: transfers, 166 -> 34.
SCALAR_WIDTH = 64
#: Calls timed on their binding links (simulator.workload.reduced) run on the scalar
#: replay where its scope allows (the same doubles as the reference StandInReplay, which
#: tests compare it with by turning this off). Measured on the Llama 3.1 405B FSDP
#: GB200 row's DP all-gather (64 ranks, 62 channels, 250,000 transfers; 122,000
#: events of some 84 flows each): 50 s -> 18 s of CPU a run.
SCALAR_REDUCED = True
#: A call timed on its binding links (simulator.workload.reduced) of at least this many
#: transfers first replays its first PROBE_SHARE of sends (scalar replay): when these
#: already load every dropped link that could bind beyond its capacity, the next round
#: keeps them all without the whole run, which would find the same (see
#: IsolatedCalls._binding_early). Measured on the Llama 3.1 405B FSDP GB200 row's
#: 250,000-transfer DP all-gather: all 64 suspects over within its first 2% of time;
#: the round it spares costs 18 s of CPU, the probe 1 s.
PROBE_OPS = 10_000
PROBE_SHARE = 1 / 16
#: At most this many flows in flight on a call's links are taken over with it (a
#: pipeline send or two per rank: a data-parallel call over 16 replicas, every replica
#: simulated, meets 16); with more, the call is simulated flow by flow.
MAX_ADOPTED = 64
#: Bytes left of a flow taken over are matched to this many significant digits, so that
#: the same send met at another time (its bytes left differ in the last bits, from
#: rounding of times) shares the timing.
_LEFT_DIGITS = 12


@dataclass
class Timing:
    """A call run alone, from its start: ``done`` lists (offset, positions) of the ranks
    (positions in the call's group) done at each offset, in time order; per link of its
    footprint, in footprint order, the offset when it was last used, and its bytes and
    busy time; ``flows`` is how many flows it carried."""

    done: list[tuple[float, np.ndarray]]
    release_s: np.ndarray
    nbytes: np.ndarray
    busy_s: np.ndarray
    flows: int
    represented: float
    #: Per link, the integral of the call's flow count over time (flow-seconds): over
    #: its busy time, the flows it keeps there at once on average (bundles).
    flow_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Flows in flight taken over with the call (see :meth:`IsolatedCalls.run`): (offset,
    #: their indexes in canonical order) when each is sent.
    sent: list[tuple[float, np.ndarray]] = field(default_factory=list)

    def copies(self) -> np.ndarray:
        """Per link, the flows the call kept on it at once while it was busy, on
        average (at least 1): how many shares its bundle's flow takes there."""
        busy = np.where(self.busy_s > 0, self.busy_s, 1.0)
        return np.maximum(self.flow_s / busy, 1.0)


@dataclass(frozen=True)
class Call:
    """The key of one call (the ``index``-th call of the workload, on ``group``): a
    conflict first sends only the calls that met another flow back to be simulated flow
    by flow, not every call of their group (the replay escalates to the group after a
    few attempts; see :class:`~simulator.workload.engine.WorkloadReplay`)."""

    group: Hashable
    index: int


#: The key that sends every call of a replay flow by flow (see
#: :class:`~simulator.workload.engine.WorkloadReplay`: when conflicts are the rule).
EVERY_CALL = "every call"
#: What a timing on binding links returns when its check did not settle (the caller
#: simulates every flow).
_UNSETTLED = object()


@dataclass(frozen=True)
class TakeOver:
    """The key of a group's calls timed together with flows they took over: it holds
    their links apart from the group's calls timed alone, so that a conflict with one of
    them (a later send on a link it held for a send it took over) stops only the taking
    over, not the replay from timings of the group's calls that are alone."""

    group: Hashable


class TimingStore:
    """Timings of calls run alone, by signature, shared by every replay on one graph
    that is given the store: the attempts of one replay (a replay run again after a
    conflict times its calls once, not once per attempt), and the candidates of a
    search on one cluster (a pipeline split's data-parallel calls are the same calls
    whatever the micro-batch, recomputation or precision).

    A signature names what sets a call's timing alone in terms of its content (the
    schedule's arrays, the routes up to renaming links, the links' capacity, latency,
    message cost, type and class sizes, the reducers, the protocol, the copies a
    replica stands for), never the identity of Python objects, so a timing found by one
    replay is the one another would find; it belongs to :attr:`graph` because a
    signature does not describe the graph beyond the links it names.
    """

    def __init__(self, graph: nx.Graph):
        self.graph = graph
        self.timings: dict[bytes, Timing | None] = {}
        #: What replays derive from the graph alone, built once for all of them (its
        #: server index, server permutations' maps), by a key naming what it is.
        self.derived: dict[Hashable, object] = {}
        # Scratch networks for timing calls alone, by what sets them up (see
        # IsolatedCalls._time_alone): reset before each use, so reuse changes nothing.
        self.scratch: dict[Hashable, FlowNetwork] = {}
        #: Runs of calls on their binding links alone (see simulator.workload.reduced),
        #: by the signature of the reduced call; None: it did not finish.
        self.reduced: dict[bytes, rd.ReducedRun | None] = {}
        #: Calls' footprints and signatures (see IsolatedCalls._footprint) by what sets
        #: them: the replay's setting (:meth:`IsolatedCalls._setting`), the schedule's
        #: digest, the protocol, the ranks and the period. A footprint is kept as its
        #: graph links and its reducers' (rank, bandwidth), which each network numbers
        #: its own way: the runs of several jobs alone and together find their calls'
        #: footprints here instead of routing each call again.
        self.footprints: dict[tuple, tuple[np.ndarray, tuple, bytes]] = {}
        self._tables: tuple[LinkTable, Router] | None = None

    def tables(self) -> tuple[LinkTable, Router]:
        """The graph's link table and router for new networks (:func:`~simulator.
        network.flows.network_tables`), read from the graph once."""
        if self._tables is None:
            self._tables = network_tables(self.graph)
        return self._tables


def schedule_digest(schedule: Schedule) -> bytes:
    """A digest of everything in ``schedule`` (its arrays, counts and parameters): equal
    for schedules that a replay cannot tell apart."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(
        repr((schedule.op, schedule.algorithm, schedule.ranks, schedule.size_bytes)).encode()
    )
    digest.update(repr(sorted(schedule.params.items(), key=lambda kv: kv[0])).encode())
    names = (
        "src", "dst", "nbytes", "segment", "reduce", "dep_ptr", "dep_idx", "dep_sent",
        "segment_owner", "channel", "step", "chunk", "path",
    )  # fmt: skip
    return _arrays_digest(digest, schedule, names)


def _arrays_digest(digest: hashlib.blake2b, schedule: Schedule, names: tuple[str, ...]) -> bytes:
    """``digest`` updated with each of ``schedule``'s arrays ``names`` (dtype, shape and
    bytes; a mark for a missing one), then its value."""
    for name in names:
        array = getattr(schedule, name)
        if array is None:
            digest.update(b"-/")
            continue
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
        digest.update(b"/")
    return digest.digest()


#: The schedule's arrays that a replay reads (ScheduleReplay and route_ops: who sends
#: what to whom, over which channel and path, after which ops), besides ``reduce``, which
#: it reads only for ranks with a reducer. Its labels (``op``, ``algorithm``, ``segment``,
#: ``segment_owner``, ``step``, ``chunk``, ``params``) name the data and never change a
#: timing.
_TIMED_ARRAYS = ("src", "dst", "nbytes", "dep_ptr", "dep_idx", "dep_sent", "channel", "path")


def timing_digest(schedule: Schedule, reducing: bool) -> bytes:
    """A digest of what in ``schedule`` sets its timing alone: its ranks and the arrays a
    replay reads, ``reduce`` among them only if ``reducing`` (some rank reduces on a
    reducer). A ring's reduce-scatter and all-gather of one size on GPUs without a
    reducer bandwidth move the same bytes after the same ops, so they share one."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(repr((schedule.ranks, schedule.n_ops, reducing)).encode())
    names = (*_TIMED_ARRAYS, "reduce") if reducing else _TIMED_ARRAYS
    return _arrays_digest(digest, schedule, names)


@dataclass
class _Plan:
    """A call on a particular group: its footprint (link ids on the real network, in
    signature order) and its timing. The schedule and protocol are kept so that the ids
    keying the cache stay theirs."""

    footprint: np.ndarray
    timing: Timing | None
    schedule: Schedule
    protocol: Protocol | None
    signature: bytes = b""


class IsolatedCalls:
    """Calls of one replay that are timed alone and replayed from that timing.

    ``network`` is the replay's network (its conflicts come back through
    :attr:`FlowNetwork.on_conflict`); ``excluded`` are group keys whose calls must be
    simulated flow by flow, and :class:`TakeOver` keys of groups whose calls must not
    take flows over (those that conflicted in an earlier attempt); ``replicas``
    the symmetry of a replay where one replica stands for all (None: every rank is
    simulated).
    """

    def __init__(
        self,
        network: FlowNetwork,
        reduce_bandwidth: np.ndarray,
        excluded: set[Hashable] | frozenset[Hashable] = frozenset(),
        replicas: ReplicaSymmetry | None = None,
        bundles: bool = False,
        store: TimingStore | None = None,
        reduce_links: bool = True,
    ):
        self.network = network
        #: Time calls alone on the links that may limit them (simulator.workload.
        #: reduced), checked, before simulating every flow on every link.
        self.reduce_links = reduce_links
        #: Calls run on their binding links (distinct reduced calls), for reports.
        self.reduced_runs = 0
        self.bundles = bundles
        self.replicas = replicas
        self.copies = 1 if replicas is None else replicas.count
        self.reduce_bandwidth = reduce_bandwidth
        self.excluded = set(excluded)
        #: Group keys that conflicted in this replay (it must run again without them).
        self.conflicts: set[Hashable] = set()
        plan = fault_plan(network.graph)
        self.enabled = plan is None or not plan.timed_links
        # Footprints are shared through the store only on a healthy graph (a fault may
        # change capacities during a replay, which a footprint's signature reads).
        self._shares_footprints = plan is None
        self._holders: list[Hashable] = []
        self._holder_ids: dict[Hashable, int] = {}
        self._plans: dict[tuple, _Plan] = {}
        if store is None or store.graph is not network.graph:
            store = TimingStore(network.graph)
        self._store = store
        self._timings = store.timings
        # Schedule digests by id, with the schedule kept so that the id stays its own.
        self._digests: dict[int, tuple[Schedule, bytes]] = {}
        # Timing digests (timing_digest) by (id, reducing), the schedule kept likewise.
        self._timing_digests: dict[tuple[int, bool], tuple[Schedule, bytes]] = {}
        # Per schedule by id: its distinct (src, dst, channel, path) rows (_rows).
        self._row_cache: dict[int, tuple] = {}
        self._reducing_cache: dict[int, tuple] = {}
        self._scratch: FlowNetwork | None = None
        # The last call's routes found by _footprint: (schedule, ranks, routes).
        self._last_routes: tuple[Schedule, bytes, np.ndarray] | None = None
        #: Calls replayed from a timing, and calls timed alone (for reports).
        self.replayed = 0
        self.timed = 0
        #: Network owners whose flows in flight may be taken over by a call timed with
        #: them (plain point-to-point sends; see :meth:`run`).
        self.adoptable: set[int] = set()
        #: Calls replayed together with flows in flight they took over.
        self.joint = 0
        #: Calls this replay launched (replayed or not).
        self.launched = 0
        #: Calls run as bundles (see :meth:`bundle`), and of those, calls replayed from
        #: their timing until something met them (see :class:`_Live`).
        self.bundled = 0
        self.met = 0
        # With bundles: calls replayed now, by the holder id of their links.
        self._live: dict[int, _Live] = {}
        #: Passive calls replayed (images; see :meth:`run`), and of those, calls met.
        self.passive = 0
        self.passive_met = 0
        self._passives = 0  # passive calls in _live (see _lazy)
        self._spans: dict[int, float] = {}
        self._families: dict[tuple, _Family] = {}
        self._span_of: list[Timing] = []
        self._prune_at = 4096
        self._serial = 0
        self._setting_digest: bytes | None = None
        if self.enabled:
            network.on_conflict = self._on_conflict

    def run(
        self,
        group: Hashable,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        rank_done: Callable[[np.ndarray], None],
        period: int | None = None,
        index: int | None = None,
        passive: Passive | None = None,
    ) -> bool:
        """Replay ``schedule`` on ``ranks`` from its isolated timing, starting now, if its
        group and call may and its links are free; False if the caller must simulate its
        flows. ``rank_done(positions)`` is called as ranks (positions in ``ranks``)
        finish; ``period``: the schedule is a spanning group's quotient (see
        :class:`~simulator.collective.replay.ScheduleReplay`); ``index``: the call's
        number in the workload (conflicts are then noted per call, :class:`Call`).

        ``passive``, for a call nothing waits for (a TP master's image on its shadows),
        with bundles on: no event is scheduled for its ranks' ends, which
        ``passive.expect`` is told at once; only if something meets its links before
        they end does it go on as a bundle (as :class:`_Live` does), ``passive.retract``
        then taking back the ends it will not have, and ``rank_done`` hearing the
        bundle's."""
        call = group if index is None else Call(group, index)
        self.launched += 1
        if (
            not self.enabled
            or EVERY_CALL in self.excluded
            or schedule.n_ops < MIN_OPS
            or group in self.excluded
            or call in self.excluded
            or call in self.conflicts
        ):
            return False
        plan = self._plan(schedule, protocol, ranks, period)
        if plan.timing is None:
            return False
        busy, holders = self.network.holders(plan.footprint)
        if len(holders):
            # Not alone now: this call runs flow by flow (exact as it is), but calls
            # that hold its links will not have been alone.
            self._on_conflict(holders)
            return False
        adopted = None
        holder = call
        if busy:
            # Flows in flight on its links: if they are a few point-to-point sends that
            # share links with nothing else, the call is timed together with them (what
            # they have left) and takes them over; else it runs flow by flow.
            holder = TakeOver(call)
            if self.bundles or TakeOver(group) in self.excluded or holder in self.excluded:
                return False
            adopted = self._adoptable(plan.footprint)
            if adopted is None:
                return False
            plan = self._joint_plan(plan, adopted, ranks, period)
            if plan.timing is None:
                return False
        timing = plan.timing
        network = self.network
        env = network.env
        now = env.now
        if adopted is not None:
            network.withdraw(adopted)
            self.joint += 1
            for offset, flows in timing.sent:
                event = env.timeout(offset)
                event.callbacks.append(lambda _event, f=flows: self._send(adopted, f))
        live = None
        if self.bundles and adopted is None:
            # Held under an id of its own: if something meets it, it goes on as a bundle
            # from then (see _Live), in this replay.
            self._serial += 1
            holder_id = self._holder(("live", self._serial))
            if passive is not None:
                self._lazy(holder_id, _Passive(self, holder_id, plan, now, rank_done, passive))
                network.hold(plan.footprint, now + timing.release_s, holder_id)
                network.account(
                    plan.footprint, timing.nbytes, timing.busy_s, timing.flows, timing.represented
                )
                self.replayed += 1
                self.passive += 1
                passive.expect(now, timing.done)
                return True
            live = self._live[holder_id] = _Live(self, holder_id, plan, now, rank_done)
        else:
            holder_id = self._holder(holder)
        network.hold(plan.footprint, now + timing.release_s, holder_id)
        network.account(
            plan.footprint, timing.nbytes, timing.busy_s, timing.flows, timing.represented
        )
        self.replayed += 1
        if live is not None:
            live.start()
            return True
        for offset, positions in timing.done:
            if offset <= 0.0:
                rank_done(positions)  # as a replay does at its start, for idle ranks
            else:
                event = env.timeout(offset)
                event.callbacks.append(lambda _event, p=positions: rank_done(p))
        return True

    def run_family(
        self,
        calls: list[tuple[Hashable, Schedule, np.ndarray, int | None]],
        protocol: Protocol | None,
        rank_done: Callable[[int], Callable[[np.ndarray], None]],
        passive: PassiveFamily,
    ) -> bool:
        """Replay ``calls`` (group, schedule, ranks, period), each passive, as
        :meth:`run` would one after another, if every one of them can be and their
        links are apart and free: one look at their links, one hold, one account for
        all. False (nothing done) otherwise; the caller then runs them one by one.

        ``passive`` hears the ends of all (:meth:`PassiveFamily.expect`);
        ``rank_done(i)`` makes what hears call ``i``'s ends if something meets it (it
        then goes on as a bundle, as :meth:`run`'s passive calls do). What :meth:`run`
        makes per call (a holder, a registry entry) is made here only for a call met:
        the family is held under consecutive holder ids (:class:`_Passives`)."""
        if not (self.enabled and self.bundles) or EVERY_CALL in self.excluded:
            return False
        key = tuple((id(schedule), id(ranks)) for _, schedule, ranks, _ in calls)
        family = self._families.get(key)
        if family is None:
            for group, schedule, _, _ in calls:
                if schedule.n_ops < MIN_OPS or group in self.excluded or group in self.conflicts:
                    return False
            plans = [self._plan(s, protocol, r, period) for _, s, r, period in calls]
            groups = frozenset(call[0] for call in calls)
            family = self._families[key] = _Family.of(plans, [c[1:3] for c in calls], groups)
        elif not self.conflicts.isdisjoint(family.groups):
            # (A family is made only where the loop above passes; of what it checks,
            # only the conflicts change during a replay.)
            return False
        if not family.ok:
            return False
        network = self.network
        busy, holders = network.holders(family.footprint)
        if busy or len(holders):
            return False
        now = network.env.now
        first = len(self._holders)
        # One holder id per call, all naming the family (serials as run's would be).
        held = _Passives(first, self._serial + 1, family, now, rank_done, passive)
        self._holders.extend(itertools.repeat(held, len(calls)))
        self._serial += len(calls)
        network.hold(family.footprint, now + family.release_s, family.owner + first)
        # Each link is one call's (checked): the same sums as one account per call.
        network.link_bytes[family.footprint] += family.nbytes
        network.link_busy[family.footprint] += family.busy_s
        stats = network.stats
        for plan in family.plans:
            timing = plan.timing
            assert timing is not None
            stats.flows += timing.flows
            stats.represented_flows += timing.represented
        passive.expect(now, family.dones, family.distinct)
        self.launched += len(calls)
        self.replayed += len(calls)
        self.passive += len(calls)
        return True

    def bundle(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        rank_done: Callable[[np.ndarray], None],
        period: int | None = None,
    ) -> bool:
        """Run the call as a bundle (:mod:`simulator.workload.bundles`), starting now:
        one flow per link it uses alone, sharing its links with whatever else is on
        them. False if it cannot (timed faults, a single transfer, no timing alone):
        the caller then simulates its flows."""
        if not self.enabled or schedule.n_ops < MIN_OPS:
            return False
        plan = self._plan(schedule, protocol, ranks, period)
        timing = plan.timing
        if timing is None:
            return False
        self.bundled += 1
        Bundle(
            self.network,
            plan.footprint,
            timing.nbytes,
            timing.release_s,
            timing.done,
            rank_done,
            timing.represented,
            timing.copies(),
        )
        return True

    def _span(self, plan: _Plan) -> float:
        """How long after its start a call of ``plan`` still ends a rank or holds a
        link (once per timing)."""
        timing = plan.timing
        assert timing is not None
        span = self._spans.get(id(timing))
        if span is None:
            last = max((offset for offset, _ in timing.done), default=0.0)
            span = max(last, float(timing.release_s.max(initial=0.0)))
            self._spans[id(timing)] = span
            self._span_of.append(timing)  # keeps the id in the key valid
        return span

    def _lazy(self, holder: int, call: _Passive) -> None:
        """Keep a passive call until its links are let go (a conflict may still demote
        it); those past their last use are dropped now and then, so that the registry
        holds the calls in flight, not every call ever replayed."""
        self._live[holder] = call
        self._passives += 1
        if self._passives >= self._prune_at:
            now = self.network.env.now
            for key in [h for h, c in self._live.items() if isinstance(c, _Passive)]:
                if self._live[key].until <= now:
                    del self._live[key]
            self._passives = sum(isinstance(c, _Passive) for c in self._live.values())
            self._prune_at = max(4096, 2 * self._passives)

    # -- flows in flight taken over ---------------------------------------------------------
    def _adoptable(self, footprint: np.ndarray) -> FlowState | None:
        """The flows in flight on ``footprint`` if the call may take them over: a few,
        of adoptable owners, alone on their links, and on no held link; in canonical
        order (see :meth:`_joint_plan`). None otherwise."""
        network = self.network
        slots = network.flows_on(footprint)
        if len(slots) > MAX_ADOPTED:
            return None
        state = network.flow_state(slots)
        if (state.ops < 0).any():
            # A flow that finished at this instant (a call launched from its owners'
            # callbacks) is still on its links until the network settles: not ours.
            return None
        if not all(owner in self.adoptable for owner in state.owners.tolist()):
            return None
        if not np.array_equal(network.flows_on(state.links), slots):
            return None  # they share links with other flows, whose rates they set
        _, holders = network.holders(state.links)
        if len(holders):
            self._on_conflict(holders)
            return None
        return state

    def _send(self, state: FlowState, flows: np.ndarray) -> None:
        """Taken-over flows (indexes into ``state``) are sent now: their owners hear it."""
        for owner in np.unique(state.owners[flows]).tolist():
            mine = flows[state.owners[flows] == owner]
            self.network.deliver(owner, state.ops[mine], state.routes[mine])

    def _joint_plan(
        self, plan: _Plan, state: FlowState, ranks: np.ndarray, period: int | None
    ) -> _Plan:
        """The call of ``plan`` together with the flows of ``state``: its footprint
        grown by their links, and its timing with them, shared by every call of the same
        signature that meets flows of the same shape (routes up to renaming the links,
        bytes left, weights). ``state`` is put in canonical order, the timing's."""
        network = self.network
        link_class = None if self.replicas is None else self.replicas.link_class
        footprint = list(plan.footprint.tolist())
        number = {link: i for i, link in enumerate(footprint)}
        shapes = []
        for links in state.route_links:
            seen = links if link_class is None else link_class[links]
            for link in seen.tolist():
                if link not in number:
                    number[link] = len(footprint)
                    footprint.append(link)
            shapes.append(tuple(number[link] for link in seen.tolist()))
        left = [float(f"{value:.{_LEFT_DIGITS}g}") for value in state.left.tolist()]
        keys = list(zip(shapes, left, state.weight.tolist(), strict=True))
        order = sorted(range(len(keys)), key=keys.__getitem__)
        for name in ("slots", "owners", "ops", "routes", "left", "weight"):
            setattr(state, name, getattr(state, name)[order])
        state.route_links = [state.route_links[i] for i in order]
        extra = np.array(footprint[len(plan.footprint) :], dtype=np.int64)
        digest = hashlib.blake2b(plan.signature, digest_size=20)
        digest.update(repr([keys[i] for i in order]).encode())
        digest.update(self._link_attributes(extra).tobytes())
        digest.update("|".join(network.links.kind[i] for i in extra.tolist()).encode())
        signature = digest.digest()
        footprint_array = np.array(footprint, dtype=np.int64)
        if signature not in self._timings:
            self._timings[signature] = self._time_alone(
                plan.schedule, plan.protocol, ranks, footprint_array, period, state
            )
            self.timed += 1
        timing = self._timings[signature]
        return _Plan(footprint_array, timing, plan.schedule, plan.protocol, signature)

    def _link_attributes(self, links: np.ndarray) -> np.ndarray:
        """What sets a timing about each of ``links``: capacity, latency, message cost,
        and with link classes the copies each stands for (reducers: ``copies``)."""
        network = self.network
        table = network.links
        attributes = np.stack(
            [network.capacity[links], table.latency[links], table.message_cost[links]]
        )
        if self.replicas is not None:
            sizes = self.replicas.class_size
            inside = links < len(sizes)  # reducers stand for ``copies`` each
            copies = np.where(inside, sizes[np.minimum(links, len(sizes) - 1)], self.copies)
            attributes = np.vstack([attributes, copies])
        return np.ascontiguousarray(attributes)

    # -- conflicts -------------------------------------------------------------------------
    def _holder(self, group: Hashable) -> int:
        holder = self._holder_ids.get(group)
        if holder is None:
            holder = self._holder_ids[group] = len(self._holders)
            self._holders.append(group)
        return holder

    def _on_conflict(self, holders: np.ndarray) -> None:
        for h in holders.tolist():
            live = self._live.get(h)
            if live is not None:
                live.met()
                continue
            holder = self._holders[h]
            if type(holder) is _Passives:
                # A call of a family met: made now what run would have made at its
                # start (the same as if it had waited in the registry), unless made
                # before (then gone from the registry, as run's would be).
                call = holder.made(self, h)
                if call is not None:
                    self._lazy(h, call)
                    call.met()
                    continue
                holder = holder.key(h)
            self.conflicts.add(holder)

    # -- timings ---------------------------------------------------------------------------
    def _plan(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        period: int | None,
    ) -> _Plan:
        # The plan keeps the schedule and protocol alive, so their ids stay theirs.
        key = (id(schedule), id(protocol), ranks.tobytes(), period)
        plan = self._plans.get(key)
        if plan is None:
            footprint, signature = self._footprint(schedule, protocol, ranks, period)
            if signature not in self._timings:
                self._timings[signature] = self._time_alone(
                    schedule, protocol, ranks, footprint, period
                )
                self.timed += 1
            timing = self._timings[signature]
            plan = self._plans[key] = _Plan(footprint, timing, schedule, protocol, signature)
        return plan

    def _footprint(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        period: int | None,
    ) -> tuple[np.ndarray, bytes]:
        """The links a call may use (its routes' links in order of first use, then its
        reducers; with link classes, their representatives) and its signature: what,
        besides link names, sets its timing."""
        known = self._digests.get(id(schedule))
        if known is None:
            known = self._digests[id(schedule)] = (schedule, schedule_digest(schedule))
        key = None
        if self._shares_footprints:
            key = (self._setting(), known[1], repr(protocol), ranks.tobytes(), period)
            shared = self._store.footprints.get(key)
            if shared is not None:
                return self._placed_footprint(*shared)
        footprint, reducers, signature = self._new_footprint(schedule, protocol, ranks, period)
        if key is not None:
            graph_links = footprint[: len(footprint) - len(reducers)].copy()
            graph_links.flags.writeable = False  # shared by replays: never written
            self._store.footprints[key] = (graph_links, reducers, signature)
        return footprint, signature

    def _setting(self) -> bytes:
        """A digest of what, besides the call, sets a footprint and signature in this
        replay: the graph's links (usable capacity, latency, message cost), the
        reducers' bandwidths, the copies a flow stands for and the link classes."""
        if self._setting_digest is None:
            network = self.network
            n = len(self._store.tables()[0])  # the graph's links, before any reducer
            digest = hashlib.blake2b(digest_size=20)
            digest.update(repr((n, self.copies)).encode())
            for array in (
                network.capacity[:n],
                network.links.latency[:n],
                network.links.message_cost[:n],
                np.asarray(self.reduce_bandwidth, dtype=float),
            ):
                digest.update(np.ascontiguousarray(array).tobytes())
                digest.update(b"/")
            if self.replicas is not None:
                digest.update(self.replicas.link_class.tobytes())
                digest.update(np.asarray(self.replicas.class_size, dtype=float).tobytes())
            self._setting_digest = digest.digest()
        return self._setting_digest

    def _placed_footprint(
        self, graph_links: np.ndarray, reducers: tuple, signature: bytes
    ) -> tuple[np.ndarray, bytes]:
        """A stored footprint on this replay's network: its graph links, then its
        reducers' links (created now if new, in the order :meth:`_new_footprint` creates
        them, so that the network numbers them as it would have)."""
        footprint = graph_links
        if reducers:
            network = self.network
            for rank, bandwidth in reducers:
                route = network.reducer_route(rank, bandwidth, class_size=self.copies)
                ptr, flat, _ = network.router.arrays()  # the route may be new
                footprint = np.append(footprint, flat[ptr[route]])
        return footprint, signature

    def _new_footprint(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        period: int | None,
    ) -> tuple[np.ndarray, tuple, bytes]:
        """:meth:`_footprint` found by routing the call: also its reducers as (rank,
        bandwidth) pairs, in footprint order."""
        network = self.network
        # Routes of the schedule's distinct (src, dst, channel, path) rows, then each op's
        # by its row (a ring's ops repeat a few dozen rows over its steps and chunks).
        rows, op_row, row_first = self._rows(schedule)
        path = rows[:, 3].astype(np.int8)
        row_routes = route_pairs(
            network.router, ranks[rows[:, 0]], ranks[rows[:, 1]], rows[:, 2], path
        )
        routes = row_routes[op_row]
        # Kept for the timing alone that usually follows (see _time_reduced).
        self._last_routes = (schedule, ranks.tobytes(), routes)
        # np.unique(routes, return_index=True, return_inverse=True), from the rows: a
        # route's first op is the first of its rows' first ops.
        unique, route_of_row = np.unique(row_routes, return_inverse=True)
        first = np.full(len(unique), schedule.n_ops, dtype=np.int64)
        route_of_row = route_of_row.reshape(-1)
        np.minimum.at(first, route_of_row, row_first)
        # Routes numbered by first use, so that the numbering is the same for every group
        # with the same schedule.
        by_use = np.argsort(first, kind="stable")
        renumber = np.empty(len(unique), dtype=np.int64)
        renumber[by_use] = np.arange(len(unique))
        ptr, flat, _ = network.router.arrays()
        ordered = unique[by_use]
        lengths = ptr[ordered + 1] - ptr[ordered]
        chain = np.concatenate([flat[ptr[r] : ptr[r + 1]] for r in ordered.tolist()] or [[]])
        chain = chain.astype(np.int64)
        if self.replicas is not None:
            chain = self.replicas.link_class[chain]
        links, link_first, local = np.unique(chain, return_index=True, return_inverse=True)
        link_order = np.argsort(link_first, kind="stable")
        link_number = np.empty(len(links), dtype=np.int64)
        link_number[link_order] = np.arange(len(links))
        footprint = links[link_order]
        # Reducers of the ranks that reduce (created now, as the replay would).
        reducing = self._reducing(schedule)
        reducer_positions, reducer_bandwidth, reducers = [], [], []
        if period is not None:
            reducing = np.unique(np.asarray(reducing, dtype=np.int64) % period)
        for position in np.asarray(reducing, dtype=np.int64).tolist():
            bandwidth = float(self.reduce_bandwidth[ranks[position]])
            if np.isfinite(bandwidth):
                route = network.reducer_route(
                    int(ranks[position]), bandwidth, class_size=self.copies
                )
                reducer_positions.append(position)
                reducer_bandwidth.append(bandwidth)
                reducers.append((int(ranks[position]), bandwidth))
                # The route may be new: the router's arrays as they are now.
                ptr, flat, _ = network.router.arrays()
                footprint = np.append(footprint, flat[ptr[route]])
        attributes = self._link_attributes(footprint)
        kinds = "|".join(network.links.kind[i] for i in footprint.tolist())
        # What of the schedule sets its timing (not its labels: a ring's reduce-scatter
        # without reducers times as its all-gather does).
        digest = hashlib.blake2b(
            self._timing_digest(schedule, bool(reducer_positions)), digest_size=20
        )
        for part in (
            np.array([period or 0, self.copies], dtype=np.int64),
            # Each row's route (its ops' routes: the timing digest fixes which ops are
            # on which row, src, dst, channel and path being among its arrays).
            renumber[route_of_row].astype(np.int64),
            lengths.astype(np.int64),
            link_number[local],
            attributes,
            np.array(reducer_positions, dtype=np.int64),
            np.array(reducer_bandwidth, dtype=float),
        ):
            digest.update(np.ascontiguousarray(part).tobytes())
            digest.update(b"/")
        digest.update(kinds.encode())
        digest.update(repr(protocol).encode())
        return footprint, tuple(reducers), digest.digest()

    def _timing_digest(self, schedule: Schedule, reducing: bool) -> bytes:
        """:func:`timing_digest` of ``schedule``, once per schedule."""
        key = (id(schedule), reducing)
        known = self._timing_digests.get(key)
        if known is None:
            known = self._timing_digests[key] = (schedule, timing_digest(schedule, reducing))
        return known[1]

    def _reducing(self, schedule: Schedule) -> np.ndarray | list:
        """The ranks ``schedule`` reduces on (its reducing ops' receivers), once per
        schedule."""
        found = self._reducing_cache.get(id(schedule))
        if found is None:
            reducing = np.unique(schedule.dst[schedule.reduce]) if schedule.reduce.any() else []
            # (The schedule kept so that its id stays its own.)
            found = self._reducing_cache[id(schedule)] = (reducing, schedule)
        return found[0]

    def _rows(self, schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A schedule's distinct (src, dst, channel, path) rows, each op's row and each
        row's first op (once per schedule)."""
        found = self._row_cache.get(id(schedule))
        if found is None:
            path = schedule.path if schedule.path.any() else np.zeros(schedule.n_ops, np.int8)
            fields = np.stack([schedule.src, schedule.dst, schedule.channel, path], axis=1)
            rows, row_first, op_row = unique_rows(fields.astype(np.int64))
            # (The schedule kept so that its id stays its own.)
            found = self._row_cache[id(schedule)] = (rows, op_row, row_first, schedule)
        return found[0], found[1], found[2]

    def _scratch_network(self) -> FlowNetwork:
        """The scratch network for timing calls alone (same graph, efficiencies and link
        classes), shared through the store by replays whose scratch would be set up
        alike: the same efficiencies, link classes and copies (reducers made for one
        stand for that many copies)."""
        if self._scratch is None:
            network = self.network
            key: tuple = (tuple(sorted(network.link_efficiency.items())), self.copies)
            if self.replicas is not None:
                classes = hashlib.blake2b(self.replicas.link_class.tobytes(), digest_size=20)
                classes.update(np.asarray(self.replicas.class_size, dtype=float).tobytes())
                key += (classes.digest(),)
            self._scratch = self._store.scratch.get(key)
            if self._scratch is None:
                self._scratch = FlowNetwork(
                    simpy.Environment(),
                    network.graph,
                    link_efficiency=network.link_efficiency,
                    flow_seconds=True,
                    tables=self._store.tables(),
                )
                if self.replicas is not None:
                    self._scratch.set_link_classes(
                        self.replicas.link_class, self.replicas.class_size
                    )
                self._store.scratch[key] = self._scratch
        return self._scratch

    def _time_alone(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        footprint: np.ndarray,
        period: int | None,
        adopted: FlowState | None = None,
    ) -> Timing | None:
        """Run the call alone on the scratch network (same graph, efficiencies, reducers
        and link classes), with the flows ``adopted`` (what they have left) if given;
        None if it cannot finish alone. Every rank simulated and nothing taken over, it
        runs on its binding links when the check settles it (see
        :mod:`simulator.workload.reduced`), every flow on every link otherwise."""
        if self.reduce_links and adopted is None and self.replicas is None and period is None:
            timing = self._time_reduced(schedule, protocol, ranks, footprint)
            if timing is not _UNSETTLED:
                return timing  # type: ignore[return-value]
        return self._time_flows(schedule, protocol, ranks, footprint, period, adopted)

    def _time_flows(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        footprint: np.ndarray,
        period: int | None,
        adopted: FlowState | None = None,
    ) -> Timing | None:
        """:meth:`_time_alone` with every flow on every link of its route: its events in
        Python scalars (:mod:`~simulator.collective.scalar_replay`, the same times and
        records) where that replay's scope allows, else the reference replay."""
        scratch = self._scratch_network()
        if (
            adopted is None
            and schedule.algorithm == "ring"
            and (
                _step_width(schedule) <= SCALAR_WIDTH
                or _routes(self._rows(schedule)[0]) <= SCALAR_WIDTH
            )
        ):
            scalar = replay_scalar(
                scratch,
                schedule,
                rank_map=ranks,
                reduce_bandwidth=self.reduce_bandwidth,
                protocol=protocol,
                weight=None if self.replicas is None else float(self.copies),
                period=period,
                link_class=None if self.replicas is None else self.replicas.link_class,
                class_size=None if self.replicas is None else self.replicas.class_size,
            )
            if scalar is not None:
                return self._timing(
                    footprint, scalar.rank_done_s, np.zeros(0), scalar.records, scalar.flows,
                    scalar.represented,
                )  # fmt: skip
        env = simpy.Environment()
        scratch.reset_clock(env)
        represented = scratch.stats.represented_flows
        done_at = np.full(schedule.ranks if period is None else period, np.nan)

        def rank_done(positions: np.ndarray) -> None:
            done_at[positions] = env.now

        sent_at = np.zeros(0)
        if adopted is not None:
            sent_at = np.full(len(adopted.slots), np.nan)
            recorder = _SentAt(sent_at, env)
            router = scratch.router
            routes = [router.route_over(tuple(links.tolist())) for links in adopted.route_links]
            scratch.add_flows(
                scratch.register(recorder),
                np.arange(len(routes)),
                np.array(routes, dtype=np.int64),
                adopted.left.copy(),
                None if self.replicas is None else adopted.weight.copy(),
            )
        replay = ScheduleReplay(
            scratch,
            schedule,
            rank_map=ranks,
            reduce_bandwidth=self.reduce_bandwidth,
            on_rank_done=rank_done,
            protocol=protocol,
            weight=None if self.replicas is None else np.full(schedule.n_ops, float(self.copies)),
            period=period,
            copies=None if self.replicas is None else self.copies,
        )
        finished = replay.start()
        env.run()
        if not finished.triggered or np.isnan(done_at).any() or np.isnan(sent_at).any():
            return None
        scratch.close_link_records()
        # Flows taken over were counted when they started on the real network.
        flows, represented = scratch.stats.flows, scratch.stats.represented_flows - represented
        if adopted is not None:
            flows -= len(adopted.slots)
            represented -= float(adopted.weight.sum()) if self.replicas else len(adopted.slots)

        def records(ids: np.ndarray) -> tuple[np.ndarray, ...]:
            arrays = (scratch.link_bytes, scratch.link_busy, scratch.link_idle_at)
            return tuple(values[ids].copy() for values in (*arrays, scratch.link_flow_s))

        return self._timing(footprint, done_at, sent_at, records, flows, represented)

    def _timing(
        self,
        footprint: np.ndarray,
        done_at: np.ndarray,
        sent_at: np.ndarray,
        records: Callable[[np.ndarray], tuple[np.ndarray, ...]],
        flows: int,
        represented: float,
    ) -> Timing:
        """A call's :class:`Timing` from its run alone on the scratch network: when each
        rank was done and each flow taken over sent, and ``records(ids)``: the bytes,
        busy time, last idle instant and flow-seconds of scratch links ``ids``."""
        network, scratch = self.network, self._scratch_network()
        # The footprint on the scratch network: the same ids for the graph's links, its
        # own for reducers (numbered as it created them).
        ids = footprint.copy()
        for i, link in enumerate(footprint.tolist()):
            if network.links.kind[link] == "reduce":
                ids[i] = scratch.links.src_node.index(network.links.src_node[link])
        offsets, group = np.unique(done_at, return_inverse=True)
        done = [(float(t), np.flatnonzero(group == i)) for i, t in enumerate(offsets.tolist())]
        sent_offsets, sent_group = np.unique(sent_at, return_inverse=True)
        sent = [
            (float(t), np.flatnonzero(sent_group == i)) for i, t in enumerate(sent_offsets.tolist())
        ]
        nbytes, busy, idle_at, flow_s = records(ids)
        return Timing(
            done=done,
            release_s=np.where(busy > 0, idle_at, 0.0),
            nbytes=nbytes,
            busy_s=busy,
            flow_s=flow_s,
            flows=flows,
            represented=represented,
            sent=sent,
        )

    def _time_reduced(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        footprint: np.ndarray,
    ) -> Timing | object | None:
        """The call's timing alone from a run on its binding links (see
        :mod:`simulator.workload.reduced`), shared by calls whose kept routes are alike;
        :data:`_UNSETTLED` when the check does not settle within its rounds (the caller
        then simulates every flow)."""
        network = self.network
        n = schedule.n_ops
        last = self._last_routes
        if last is not None and last[0] is schedule and last[1] == ranks.tobytes():
            routes = last[2]
        else:
            routes = route_ops(
                network.router, schedule, np.arange(n), ranks[schedule.src], ranks[schedule.dst]
            )
        shape = rd.route_shape(network, routes)
        entries = rd.incidence(shape)
        kept = {int(a) for a in shape.anchor.tolist() if a >= 0}
        positions, bandwidths = self._reducers(schedule, ranks)
        base = hashlib.blake2b(self._timing_digest(schedule, bool(positions)), digest_size=20)
        base.update(np.array(positions, dtype=np.int64).tobytes())
        base.update(np.array(bandwidths, dtype=float).tobytes())
        base.update(repr((protocol, sorted(network.link_efficiency.items()))).encode())
        base_digest = base.digest()
        for _ in range(rd.MAX_ROUNDS):
            reduced = rd.kept_routes(shape, kept)
            signature = rd.reduced_signature(
                base_digest,
                shape,
                reduced,
                self._link_attributes,
                lambda links: [network.links.kind[i] for i in links.tolist()],
            )
            if signature not in self._store.reduced:
                early = self._binding_early(
                    schedule, protocol, ranks, shape, reduced, positions, kept, entries
                )
                if early:
                    kept |= early
                    continue
                self._store.reduced[signature] = self._run_reduced(
                    schedule, protocol, ranks, shape, reduced, positions, bandwidths
                )
                self.reduced_runs += 1
            run = self._store.reduced[signature]
            if run is None:
                return _UNSETTLED
            binding = rd.binding_links(shape, kept, run, network.capacity, entries)
            if not binding:
                return self._reduced_timing(run, footprint, entries)
            kept |= binding
        return _UNSETTLED

    def _binding_early(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        shape: rd.RouteShape,
        reduced: list[tuple[int, ...]],
        positions: list[int],
        kept: set[int],
        entries: tuple[np.ndarray, np.ndarray],
    ) -> set[int]:
        """The dropped links that the run on ``reduced`` would find binding, if its
        first :data:`PROBE_SHARE` of sends already shows every link that could be
        (:func:`~simulator.workload.reduced.suspect_links`) to be: then the whole run
        would find the same ones, and need not be made. Empty otherwise (a call too
        small to gain, out of the scalar replay's scope, or a suspect not yet over)."""
        if positions or schedule.n_ops < PROBE_OPS:
            return set()
        suspects = set(rd.suspect_links(shape, kept, self.network.capacity))
        if not suspects:
            return set()
        probe = replay_scalar(
            self._scratch_network(),
            schedule,
            rank_map=ranks,
            reduce_bandwidth=self.reduce_bandwidth,
            protocol=protocol,
            stand_in=self._stand_ins(shape, reduced)[shape.op_route],
            sent_limit=max(1, int(schedule.n_ops * PROBE_SHARE)),
        )
        if probe is None or probe.stopped_s is None:
            return set()  # (it ran to its end: the run itself is made as usual)
        assert probe.flow_start_s is not None
        stop = probe.stopped_s
        # Flows not started by then start and end there (no interval); those not sent
        # end there: the whole run's intervals cut at the stop.
        lo = np.where(np.isnan(probe.flow_start_s), stop, probe.flow_start_s)
        hi = np.where(np.isnan(probe.sent_s), stop, probe.sent_s)
        cut = rd.ReducedRun(lo, hi, probe.rank_done_s, np.zeros((0, 4)), np.zeros(0), 0, 0.0)
        binding = rd.binding_links(shape, kept, cut, self.network.capacity, entries)
        return binding if binding == suspects else set()

    def _stand_ins(self, shape: rd.RouteShape, reduced: list[tuple[int, ...]]) -> np.ndarray:
        """The scratch network's stand-in route of each of the call's distinct routes
        reduced to ``reduced`` (made once per kept links and latency)."""
        scratch = self._scratch_network()
        routes_in = self._store.derived.setdefault(("stand-in routes", id(scratch)), {})
        stand_in = np.empty(len(reduced), dtype=np.int64)
        for r, (links, latency) in enumerate(zip(reduced, shape.latency.tolist(), strict=True)):
            key = (links, latency)
            route = routes_in.get(key)  # type: ignore[union-attr]
            if route is None:
                route = routes_in[key] = add_stand_in_route(  # type: ignore[index]
                    scratch.router, list(links), latency
                )
            stand_in[r] = route
        return stand_in

    def _reducers(self, schedule: Schedule, ranks: np.ndarray) -> tuple[list[int], list[float]]:
        """Positions of the call's ranks that reduce on a reducer, and its bandwidth (as
        :meth:`_footprint` lists them)."""
        if not schedule.reduce.any():
            return [], []
        positions, bandwidths = [], []
        for position in np.unique(schedule.dst[schedule.reduce]).tolist():
            bandwidth = float(self.reduce_bandwidth[ranks[position]])
            if np.isfinite(bandwidth):
                positions.append(position)
                bandwidths.append(bandwidth)
        return positions, bandwidths

    def _run_reduced(
        self,
        schedule: Schedule,
        protocol: Protocol | None,
        ranks: np.ndarray,
        shape: rd.RouteShape,
        reduced: list[tuple[int, ...]],
        positions: list[int],
        bandwidths: list[float],
    ) -> rd.ReducedRun | None:
        """Run the call alone on the scratch network with its flows on ``reduced``
        routes (delivered after their whole routes' latency); None if it does not
        finish."""
        scratch = self._scratch_network()
        stand_in = self._stand_ins(shape, reduced)
        if SCALAR_REDUCED and not positions:
            # Its events in Python scalars where that replay's scope allows (no reducer
            # flows, no switch paths): the same times as the reference below.
            scalar = replay_scalar(
                scratch,
                schedule,
                rank_map=ranks,
                reduce_bandwidth=self.reduce_bandwidth,
                protocol=protocol,
                stand_in=stand_in[shape.op_route],
            )
            if scalar is not None:
                assert scalar.flow_start_s is not None
                wire = schedule.nbytes if protocol is None else schedule.nbytes / protocol.bandwidth
                return rd.ReducedRun(
                    flow_start=scalar.flow_start_s,
                    sent=scalar.sent_s,
                    done_at=scalar.rank_done_s,
                    reducers=np.zeros((0, 4)),
                    wire=np.broadcast_to(np.asarray(wire, dtype=float), (schedule.n_ops,)).copy(),
                    flows=scalar.flows,
                    represented=scalar.represented,
                )
        env = simpy.Environment()
        scratch.reset_clock(env)
        represented = scratch.stats.represented_flows
        done_at = np.full(schedule.ranks, np.nan)

        def rank_done(done: np.ndarray) -> None:
            done_at[done] = env.now

        replay = rd.StandInReplay(
            scratch,
            schedule,
            rank_map=ranks,
            reduce_bandwidth=self.reduce_bandwidth,
            on_rank_done=rank_done,
            protocol=protocol,
            stand_in=stand_in[shape.op_route],
        )
        finished = replay.start()
        env.run()
        if not finished.triggered or np.isnan(done_at).any():
            return None
        scratch.close_link_records()
        ptr, flat, _ = scratch.router.arrays()
        reducers = np.zeros((len(positions), 4))
        for i, (position, bandwidth) in enumerate(zip(positions, bandwidths, strict=True)):
            route = scratch.reducer_route(int(ranks[position]), bandwidth, class_size=self.copies)
            link = int(flat[ptr[route]])
            reducers[i] = (
                scratch.link_bytes[link],
                scratch.link_busy[link],
                scratch.link_idle_at[link],
                scratch.link_flow_s[link],
            )
        flow_start, sent, wire = replay.intervals()
        return rd.ReducedRun(
            flow_start=flow_start,
            sent=sent,
            done_at=done_at - replay.t0,
            reducers=reducers,
            wire=wire,
            flows=scratch.stats.flows,
            represented=scratch.stats.represented_flows - represented,
        )

    def _reduced_timing(
        self,
        run: rd.ReducedRun,
        footprint: np.ndarray,
        entries: tuple[np.ndarray, np.ndarray],
    ) -> Timing:
        """A call's timing from the reduced run it shares: its records on its own links
        from its flows' intervals, its reducers' from the run."""
        kinds = self.network.links.kind
        reducer = np.array([kinds[i] == "reduce" for i in footprint.tolist()], dtype=bool)
        m = len(footprint)
        nbytes, busy, idle, flow_s = np.zeros(m), np.zeros(m), np.zeros(m), np.zeros(m)
        graph = np.flatnonzero(~reducer)
        nbytes[graph], busy[graph], idle[graph], flow_s[graph] = rd.link_records(
            run, entries, footprint[graph]
        )
        if reducer.any():
            nbytes[reducer], busy[reducer], idle[reducer], flow_s[reducer] = run.reducers.T
        offsets, group = np.unique(run.done_at, return_inverse=True)
        done = [(float(t), np.flatnonzero(group == i)) for i, t in enumerate(offsets.tolist())]
        return Timing(
            done=done,
            release_s=np.where(busy > 0, idle, 0.0),
            nbytes=nbytes,
            busy_s=busy,
            flow_s=flow_s,
            flows=run.flows,
            represented=run.represented,
        )


def _routes(rows: np.ndarray) -> int:
    """Distinct (sender, receiver, path) of a schedule's distinct (src, dst, channel,
    path) rows (:meth:`IsolatedCalls._rows`): the routes its transfers take, a ring's
    channels on the same hop counting once.

    >>> _routes(np.array([[0, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0], [1, 0, 1, 6]]))
    3
    """
    return len(np.unique(rows[:, [0, 1, 3]], axis=0))


def _step_width(schedule: Schedule) -> float:
    """Transfers per step of ``schedule`` on average (per step and chunk: a ring's
    channels times its positions)."""
    chunk = schedule.chunk.astype(np.int64)
    levels = np.unique(schedule.step.astype(np.int64) * (int(chunk.max(initial=0)) + 1) + chunk)
    return schedule.n_ops / max(len(levels), 1)


@dataclass
class _Family:
    """Calls replayed together passively (:meth:`IsolatedCalls.run_family`): their plans
    and footprints laid end to end, with each link's call (``owner``, a position)."""

    plans: list[_Plan]
    footprint: np.ndarray
    release_s: np.ndarray
    nbytes: np.ndarray
    busy_s: np.ndarray
    owner: np.ndarray
    ok: bool
    #: The calls' schedules and ranks, which keep the ids in the family's key valid.
    keep: list = field(default_factory=list, repr=False)
    #: The calls' groups (a family is not replayed while one is excluded or conflicted).
    groups: frozenset = frozenset()
    #: Each call's timing's ends, and the calls whose list is not an earlier call's
    #: (:meth:`~simulator.workload.shadows.ExpectedFamily.expect`).
    dones: list = field(default_factory=list)
    distinct: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, plans: list[_Plan], keep: list, groups: frozenset = frozenset()) -> _Family:
        """The family of ``plans`` (of calls of ``groups``); not ``ok`` where one has no
        timing alone or two share a link (then one call's hold would be another's
        conflict)."""
        empty = np.zeros(0)
        if any(plan.timing is None for plan in plans):
            return cls(
                plans, empty.astype(np.int64), empty, empty, empty, empty, False, keep, groups
            )
        footprint = np.concatenate([plan.footprint for plan in plans])
        ok = len(np.unique(footprint)) == len(footprint)
        sizes = [len(plan.footprint) for plan in plans]
        dones = [plan.timing.done for plan in plans]  # type: ignore[union-attr]
        seen: set[int] = set()
        distinct = []
        for i, done in enumerate(dones):
            if id(done) not in seen:  # (the timings keep the lists, and their ids, alive)
                seen.add(id(done))
                distinct.append(i)
        return cls(
            plans,
            footprint,
            np.concatenate([plan.timing.release_s for plan in plans]),  # type: ignore[union-attr]
            np.concatenate([plan.timing.nbytes for plan in plans]),  # type: ignore[union-attr]
            np.concatenate([plan.timing.busy_s for plan in plans]),  # type: ignore[union-attr]
            np.repeat(np.arange(len(plans), dtype=np.int64), sizes),
            ok,
            keep,
            groups,
            dones,
            distinct,
        )


class _Passives:
    """The calls of a family replayed passively (:meth:`IsolatedCalls.run_family`),
    held under the consecutive holder ids from ``first`` (their serials from
    ``serial``): each is made a :class:`_Passive`, as :meth:`IsolatedCalls.run` makes
    one at a passive call's start, only if something meets it."""

    __slots__ = ("_made", "family", "first", "passive", "rank_done", "serial", "start")

    def __init__(
        self,
        first: int,
        serial: int,
        family: _Family,
        start: float,
        rank_done: Callable[[int], Callable[[np.ndarray], None]],
        passive: PassiveFamily,
    ):
        self.first, self.serial, self.family, self.start = first, serial, family, start
        self.rank_done, self.passive = rank_done, passive
        self._made: set[int] | None = None  # (most families are never met)

    def made(self, calls: IsolatedCalls, holder: int) -> _Passive | None:
        """The call held as ``holder``, made now; None if it was made before."""
        if self._made is None:
            self._made = set()
        elif holder in self._made:
            return None
        self._made.add(holder)
        i = holder - self.first
        return _Passive(
            calls,
            holder,
            self.family.plans[i],
            self.start,
            self.rank_done(i),
            _OnePassive(self.passive, i),
        )

    def key(self, holder: int) -> tuple[str, int]:
        """The conflict key :meth:`IsolatedCalls.run` gives the call held as ``holder``."""
        return ("live", self.serial + holder - self.first)


class _OnePassive:
    """Call ``i`` of a family as its own :class:`Passive` (only retracted: its ends
    were expected with the family's)."""

    __slots__ = ("family", "i")

    def __init__(self, family: PassiveFamily, i: int):
        self.family, self.i = family, i

    def expect(self, start: float, done: list[tuple[float, np.ndarray]]) -> None:
        """(Expected with the family: never asked.)"""
        raise NotImplementedError

    def retract(self, after: float) -> None:
        """Ends of call ``i`` after ``after`` will not be."""
        self.family.retract(self.i, after)


class _Live:
    """A call replayed from its timing alone, with bundles on: until something starts
    on its links, exactly as :meth:`IsolatedCalls.run` replays it; when something does,
    it goes on from that instant as a bundle of what it had left (see
    :mod:`simulator.workload.bundles`) instead of the replay running again. What it had
    left on each link is taken as its bytes there spread evenly up to its last use (as a
    bundle spreads them): the bytes and busy time the replay accounted beyond now are
    taken back and carried by the bundle's flows."""

    def __init__(
        self,
        calls: IsolatedCalls,
        holder: int,
        plan: _Plan,
        start: float,
        rank_done: Callable[[np.ndarray], None],
    ):
        self.calls = calls
        self.holder = holder
        self.plan = plan
        self.started = start
        self.rank_done = rank_done
        timing = plan.timing
        assert timing is not None
        self.fired = [offset <= 0.0 for offset, _ in timing.done]
        self.pending = len(self.fired) - sum(self.fired)
        self.demoted = False
        self.scheduled = False

    def start(self) -> None:
        """Finish idle ranks now and schedule the others' ends from the timing."""
        env = self.calls.network.env
        for i, (offset, positions) in enumerate(self.plan.timing.done):
            if offset <= 0.0:
                self.rank_done(positions)
            else:
                event = env.timeout(offset)
                event.callbacks.append(lambda _event, i=i: self._fire(i))
        if self.pending == 0:
            self.calls._live.pop(self.holder, None)

    def _fire(self, i: int) -> None:
        if self.demoted or self.fired[i]:
            return
        self.fired[i] = True
        self.pending -= 1
        if self.pending == 0:
            self.calls._live.pop(self.holder, None)
        self.rank_done(self.plan.timing.done[i][1])

    def met(self) -> None:
        """Something started on its links now: it becomes a bundle at this instant, once
        the network has taken the newcomer in (a zero-delay event, so that no call
        starts or ends inside the network's own bookkeeping)."""
        if self.demoted or self.scheduled:
            return
        self.scheduled = True
        event = self.calls.network.env.timeout(0)
        event.callbacks.append(lambda _event: self._demote())

    def _demote(self) -> None:
        if self.demoted or self.pending == 0:
            return
        self.demoted = True
        calls, network = self.calls, self.calls.network
        calls._live.pop(self.holder, None)
        timing, footprint = self.plan.timing, self.plan.footprint
        elapsed = network.env.now - self.started
        release = timing.release_s
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(release > elapsed, 1.0 - elapsed / release, 0.0)
        left = timing.nbytes * share
        network.unhold(footprint, self.holder)
        network.account(footprint, -left, -timing.busy_s * share, 0, 0.0)
        done = [
            (offset - elapsed, positions)
            for (offset, positions), fired in zip(timing.done, self.fired, strict=True)
            if not fired
        ]
        calls.bundled += 1
        calls.met += 1
        Bundle(
            network,
            footprint,
            left,
            np.maximum(release - elapsed, 0.0),
            done,
            self.rank_done,
            0.0,
            timing.copies(),
        )


class Passive(typing.Protocol):
    """Who hears a passive call's ends (see :meth:`IsolatedCalls.run`): the ends it will
    have unless something meets it, and, if something does, which of them it will not."""

    def expect(self, start: float, done: list[tuple[float, np.ndarray]]) -> None:
        """The call's ranks (positions in ``done``) end at ``start`` plus their offsets,
        unless retracted."""

    def retract(self, after: float) -> None:
        """Ends expected after ``after`` will not be: the call goes on as a bundle,
        whose ends its ``rank_done`` hears."""


class PassiveFamily(typing.Protocol):
    """Who hears the ends of a family of passive calls (see
    :meth:`IsolatedCalls.run_family`): :class:`Passive`'s, per call ``i``."""

    def expect(
        self, start: float, dones: list[list[tuple[float, np.ndarray]]], distinct: list[int]
    ) -> None:
        """Call ``i``'s ranks end at ``start`` plus the offsets of ``dones[i]``, unless
        retracted; ``distinct`` lists the calls whose ``dones`` entry is not an earlier
        call's."""

    def retract(self, i: int, after: float) -> None:
        """Call ``i``'s ends after ``after`` will not be."""


class _Passive(_Live):
    """A passive call (no events for its ends): demoted like a :class:`_Live` call if
    something meets its links before it ends; its ends up to then are those its timing
    gave (what the events a live call schedules at launch would have fired by now, the
    demotion coming after them at this instant), the rest are retracted."""

    def __init__(
        self,
        calls: IsolatedCalls,
        holder: int,
        plan: _Plan,
        start: float,
        rank_done: Callable[[np.ndarray], None],
        passive: Passive,
    ):
        # (No call to _Live's: its per-end bookkeeping is made only if demoted.)
        self.calls = calls
        self.holder = holder
        self.plan = plan
        self.started = start
        self.rank_done = rank_done
        self.demoted = False
        self.scheduled = False
        self.passive = passive
        self.until = start + calls._span(plan)

    def _demote(self) -> None:
        if self.demoted:
            return
        now = self.calls.network.env.now
        self.fired = [self.started + offset <= now for offset, _ in self.plan.timing.done]
        self.pending = len(self.fired) - sum(self.fired)
        if self.pending == 0:
            self.calls._live.pop(self.holder, None)
            return
        self.passive.retract(now)
        self.calls.passive_met += 1
        super()._demote()


class _SentAt:
    """Scratch owner of flows taken over: notes when each is sent."""

    def __init__(self, sent_at: np.ndarray, env: simpy.Environment):
        self.sent_at = sent_at
        self.env = env

    def on_sent(self, ops: np.ndarray) -> None:
        """Note the time."""
        self.sent_at[ops] = self.env.now

    def on_delivered(self, ops: np.ndarray) -> None:
        """Delivery is the real network's (one route latency after sending)."""
