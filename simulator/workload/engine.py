"""Replaying a workload on a topology: streams, collectives, overlap, interference.

Each rank has named streams; ops on a stream run one at a time in trace order, and an op
is *issued* when its dependencies are done and its stream is free. A compute op then
runs; a collective starts when every member of its group has issued it (the time each
member waits is recorded), and a send/recv pair when both sides have issued. Collectives
and transfers of every rank share one :class:`~simulator.network.flows.FlowNetwork`, so
several collectives in flight contend for links. A rank is done with a collective when
all transfers it sends or receives are done.

Who decides how a collective runs: by default the topology's communication library
(:func:`~simulator.collective.policy.library_of`: NCCL, or HCCL on the Ascend presets).
Each call then runs what the library would choose for that operation and size on that
group's own GPUs, as a communicator over them sees them (its ranks, the servers it spans
and its GPUs in each, their NVLink / NVLS and their own NICs): the algorithm, protocol,
channels and chunks of :class:`~simulator.collective.policy.NcclPolicy` or
:class:`~simulator.collective.policy.HcclPolicy`, decided once per group shape,
operation and size. A registered algorithm instead runs every collective as given, and
"auto" the fastest ccsim finds for each.

Interference: communication kernels that run on GPU cores (NCCL's) slow compute that
overlaps them. While ``k >= 1`` such communications are in flight on a rank, its compute
progresses at ``1 - comm_slowdown`` of full speed. Communication by copy engines (SDMA)
does not slow compute: pass ``comm_slowdown=0`` or mark the topology graph with
``graph.graph["comm_engine"] = "sdma"``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import simpy

from ..algorithms import algorithm_names, build_quotient, build_schedule, get_algorithm
from ..algorithms.base import RankLayout
from ..algorithms.schedule import Schedule
from ..collective.policy import (
    POLICIES,
    HcclPolicy,
    NcclPolicy,
    library_of,
    library_policy,
    nccl_not_applied,
    protocol_model,
)
from ..collective.replay import ScheduleReplay, reduce_bandwidths
from ..errors import CcsimError, unknown_choice
from ..library.hccl import OPS as HCCL_OPS
from ..library.hccl import HcclSystem
from ..library.nccl import NcclSystem
from ..library.nccl_env import FUNCTIONS, CommConfig, NcclEnv, parse_nccl_env
from ..library.nccl_p2p import p2p_relays
from ..library.protocol import Protocol, calibration_of
from ..network.faults import compute_scaler, fault_plan, schedule_link_faults
from ..network.flows import FlowNetwork, NetworkStats, run_env
from ..topology.graph import gpu_nodes, servers_of_ranks
from .communicators import check_communicators, communicator_of
from .devices import Device, graph_device
from .isolated import EVERY_CALL, Call, IsolatedCalls, TakeOver, TimingStore
from .kernels import kernels_time
from .replicas import Asymmetric, ReplicaSymmetry, replica_symmetry, replicas_per_server
from .shadows import ShadowCheck, ShadowsUnlike, sends_hash, shadow_images
from .trace import Op, Workload, WorkloadError


@dataclass
class OpRecord:
    """What happened to each op: times in seconds (NaN when it never happened)."""

    issue_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray


@dataclass
class WorkloadRun:
    """Raw outcome of a replay; :mod:`simulator.workload.metrics` turns it into figures.

    ``algorithm`` is what ran the collectives that name no algorithm: a library policy
    ("nccl", "hccl"), a registered algorithm or "auto". ``choices[k]`` is how the k-th
    collective call (``workload.instances[k]``) ran, None for one that moved nothing:
    ``algorithm`` (the ccsim schedule), ``protocol`` (None: the ideal model),
    ``channels``, ``chunks`` and, where a library chose, ``policy`` and what it
    records of its choice (NCCL's ``nccl_algorithm`` and ``nccl_time_us``; HCCL's
    ``hccl_algorithm``, ...). Calls that ran alike share one dict.
    """

    workload: Workload
    records: OpRecord
    stats: NetworkStats
    links: dict[str, list] = field(repr=False, default_factory=dict)
    algorithm: str = ""
    choices: list[dict | None] = field(repr=False, default_factory=list)
    #: How the calls were simulated: ``replayed`` (from a timing of the call alone),
    #: ``timed`` (distinct calls timed alone), ``attempts`` (replays run: more than one
    #: when calls timed alone turned out not to be) and ``flow_by_flow`` (groups whose
    #: calls were then simulated flow by flow); see :mod:`simulator.workload.isolated`.
    isolated: dict = field(repr=False, default_factory=dict)
    #: For a workload given by one replica (:class:`~simulator.workload.trace.Replicas`):
    #: ``count`` replicas, and ``simulated`` the replicas whose ops were simulated (1 when
    #: one stood for all, ``count`` when they were built and simulated each, and then
    #: ``why``); see :mod:`simulator.workload.replicas`. Empty for other workloads.
    replicas: dict = field(repr=False, default_factory=dict)
    #: For a workload given by TP masters (:class:`~simulator.workload.trace.Shadows`):
    #: ``count`` ranks per TP group, and ``simulated`` 1 (the master's ops stood for the
    #: group) or "all" with ``why``; see :mod:`simulator.workload.shadows`.
    shadows: dict = field(repr=False, default_factory=dict)


class _Compute:
    """A compute op in progress whose speed changes with communication on its rank."""

    __slots__ = ("generation", "index", "last", "left", "rate")

    def __init__(self, index: int, work: float, now: float, rate: float):
        self.index = index
        self.left = work  # seconds of work at full speed
        self.last = now
        self.rate = rate
        self.generation = 0


class _ComputeEnd(simpy.Event):
    """The end of the compute op running on one stream (``index``), one event object per
    stream scheduled again for each of its ops: a stream runs one op at a time, and
    without ``comm_slowdown`` an op's end, once scheduled, never moves. It takes the
    place of a :class:`simpy.Timeout` and a closure per op; it is scheduled with the same
    delay at the same moment, so it holds the same place in SimPy's queue (time, then
    order of scheduling) as the timeout would."""

    def __init__(self, env: simpy.Environment, callback: Callable[[simpy.Event], None]):
        super().__init__(env)
        self._ok = True  # (a triggered event's: SimPy's step checks it after callbacks)
        self._value = None
        self.index = -1
        #: The callback list, handed to SimPy again at each scheduling (its step sets
        #: ``callbacks`` to None once it has run them and never changes the list).
        self.armed = [callback]


#: Op kinds by number in the replay's per-op table (``_kind_of``): compute, a
#: collective call, a side of a send/recv pair.
_COMPUTE, _CALL, _SIDE = 0, 1, 2


#: Members of a call up to which their start times are written one by one: a numpy
#: assignment through a list of indices costs more than a few scalar writes.
_FEW = 16


class _Later(simpy.Event):
    """``start()`` after ``delay`` (a call's launch overhead): scheduled as a
    :class:`simpy.Timeout` of that delay would be, at the same moment, so it takes the
    same place in SimPy's queue (time, then order of scheduling); one object rather
    than a timeout and a closure around ``start``."""

    def __init__(self, env: simpy.Environment, delay: float, start: Callable[[], None]):
        super().__init__(env)
        self._ok = True  # (a triggered event's: SimPy's step checks it after callbacks)
        self._value = None
        self.start = start
        self.callbacks = [self._fire]
        env.schedule(self, simpy.events.NORMAL, delay)

    def _fire(self, _event: simpy.Event) -> None:
        self.start()


#: Attempts whose conflicts send single calls back to be simulated flow by flow; from
#: then on, their whole groups (see :meth:`WorkloadReplay.run`).
CALLS_THEN_GROUPS = 30


#: Conflicts are the rule, and the next attempt simulates every call flow by flow, once
#: an attempt had conflicts in at least this share of the calls it launched (and at
#: least EVERY_CALL_MIN of them), or EVERY_CALL_AFTER attempts still had conflicts.
EVERY_CALL_SHARE = 0.03
EVERY_CALL_MIN = 8
EVERY_CALL_AFTER = 2


def _conflicts_are_the_rule(attempt: int, isolated: IsolatedCalls) -> bool:
    """Whether the attempt ``attempt`` (from 1), whose conflicts ``isolated`` holds,
    should be followed by one that simulates every call flow by flow: conflicts in
    :data:`EVERY_CALL_SHARE` of the calls launched (at least :data:`EVERY_CALL_MIN`), or
    still conflicts after :data:`EVERY_CALL_AFTER` attempts. A deterministic rule (counts,
    not wall time), so that the same inputs take the same attempts; either way the step is
    the same."""
    calls = sum(isinstance(key, Call) for key in isolated.conflicts)
    groups = len(isolated.conflicts) - calls
    if attempt >= EVERY_CALL_AFTER:
        return True
    return calls + groups >= EVERY_CALL_MIN and calls + groups >= EVERY_CALL_SHARE * max(
        1, isolated.launched
    )


def _as_group(key: object) -> object:
    """A conflict's key widened from one call to its group (a take-over's likewise)."""
    if isinstance(key, Call):
        return key.group
    if isinstance(key, TakeOver) and isinstance(key.group, Call):
        return TakeOver(key.group.group)
    return key


def _starting_over(progress: Callable[[float], None] | None, why: str) -> None:
    """Tell a progress callback that can hear it (``again(why)``, as the command line's
    bar has) that the replay starts over from time zero."""
    again = getattr(progress, "again", None)
    if again is not None:
        again(why)


class _Sends:
    """Flow owner of a replay's point-to-point transfers (a flow's op id is its pair's
    index): ``done(k)`` when pair k's data has arrived."""

    def __init__(self, done: Callable[[int], None]):
        self._done = done

    def on_sent(self, ops: np.ndarray) -> None:
        """Nothing to do until the data arrives."""

    def on_delivered(self, ops: np.ndarray) -> None:
        """Both sides of each pair are done."""
        for k in ops.tolist():
            self._done(k)


class _ImageSends(_Sends):
    """Flow owner of the shadows' images of the replay's point-to-point transfers (a
    flow's op id is its master's pair index): ``done(k)`` once for each pair among the
    flows that arrive together. A send has dozens of images (one a shadow), which arrive
    at one instant: hearing each would check the same end against the master's again and
    keep a copy of it for each (516,128 images of 4,064 sends in the Llama 3 405B CP 16
    step), where one tells the check all it learns."""

    def on_delivered(self, ops: np.ndarray) -> None:
        """The images of each pair among ``ops`` arrived now: one end for each pair."""
        for k in dict.fromkeys(ops.tolist()):
            self._done(k)


class _ImageEnds:
    """What hears the ends of call ``k``'s image on group ``name``: checked against the
    master's (one made per image and call, so its message is formed only if needed)."""

    __slots__ = ("across_cp", "check", "env", "k", "name")

    def __init__(
        self,
        check: ShadowCheck,
        k: int,
        name: str,
        env: simpy.Environment,
        across_cp: bool = False,
    ):
        self.check, self.k, self.name, self.env = check, k, name, env
        self.across_cp = across_cp  # the image is a CP rank (or more) away

    def __call__(self, positions: np.ndarray) -> None:
        self.check.shadow((self.k,), positions.tolist(), self.env.now, self.what, self.across_cp)

    def what(self) -> str:
        """The image, named for a message."""
        return f"call {self.k}'s image on {self.name!r}"


class _FamilyEnds:
    """Makes what hears the ends of call ``k``'s image ``i`` (on the ``i``-th group of
    ``family``, :meth:`WorkloadReplay._family`): an :class:`_ImageEnds`."""

    __slots__ = ("across_cp", "check", "env", "family", "k")

    def __init__(
        self,
        check: ShadowCheck,
        k: int,
        family: list,
        env: simpy.Environment,
        across_cp: Callable[[str], bool],
    ):
        self.check, self.k, self.family, self.env = check, k, family, env
        self.across_cp = across_cp  # whether an image (by group) is a CP rank away

    def __call__(self, i: int) -> _ImageEnds:
        name = self.family[i][0]
        return _ImageEnds(self.check, self.k, name, self.env, self.across_cp(name))


class WorkloadReplay:
    """Replays ``workload`` on ``graph`` (one GPU per rank, rank r on topology rank r).

    Parameters
    ----------
    algorithm : str, optional
        Who runs the collectives that name no algorithm. None (the default): the
        topology's communication library (:func:`~simulator.collective.policy.library_of`),
        the realistic prediction; "nccl" or "hccl" ask for one by name. Each call runs
        the library's choice for its group, operation and size (see the module
        docstring); a call's ``chunks`` or ``channels`` other than 1 force the
        library's (as NCCL_MIN_CTAS = NCCL_MAX_CTAS does for channels). HCCL's model
        covers all-reduce, all-gather and reduce-scatter; its other operations run the
        first algorithm that can (pairwise for all-to-all). A registered algorithm runs
        every call as given, on the ideal model unless ``protocol``; "auto" the fastest
        algorithm and chunks found by simulating each group's call alone.
    comm_slowdown : float
        Fraction by which compute slows while communication on GPU cores overlaps it.
    sm_contention : bool
        Instead, compute on a rank slows by the multiprocessors its communication holds:
        each call in flight holds one CTA per channel (NCCL's kernel grid), so compute
        runs at 1 - CTAs / SMs of the device (:attr:`~simulator.workload.devices.
        Device.units`) while they run. Point-to-point transfers are left out: one CTA
        (their ops' channels here) slows compute by under 1% while they run, and with
        them the MLPerf v5.1 405B step on 256 B200 was no longer found periodic: the
        full 144 micro-batches replayed instead of 48, three times the CPU, for 0.07% of
        the step.
    device : Device, optional
        What times compute ops given in FLOPs (default: from the GPUs' model).
    reduce_bandwidth : float, optional
        Bytes/s of local reductions on every GPU (default: the topology's).
    protocol : str, optional
        With a library: None or "auto" let NCCL pick; "LL", "LL128" or "Simple" force
        one, as NCCL_PROTO does (HCCL has none). With an algorithm run as given: the
        calibrated protocol model (:mod:`simulator.library.protocol`) for every call,
        "auto" the fastest for each (None: the ideal model). Calls that name their own
        algorithm under NCCL run it with the fastest of its protocols.
    nccl : NcclEnv or str, optional
        NCCL's environment settings (:mod:`simulator.library.nccl_env`), applied to every
        call NCCL chooses for (refused unless NCCL is the library that chooses). Calls
        that name their own algorithm keep it; where NCCL_PROTO leaves one protocol for
        every operation, they run with it.
    communicators : mapping of str to CommConfig, optional
        NCCL's configuration per Megatron-Core process group (``cp``, ``dp_cp``, ...:
        :mod:`simulator.workload.communicators`): the collectives of the ``megatron``
        generator's groups of that process group run on a communicator whose channels
        its ``min_ctas`` / ``max_ctas`` bound, unless ``nccl``'s NCCL_MIN_CTAS /
        NCCL_MAX_CTAS replace them, as NCCL does. Default: every communicator NCCL's
        default configuration.
    compute_scale : callable, optional
        ``compute_scale(rank, op index, start time)``: the factor on a compute op's
        duration (a straggler's 2, jitter). Default: what a faulted graph asks for
        (:func:`simulator.network.faults.compute_scaler`; none for a healthy one).
    isolated : bool
        Time each distinct call alone once and replay it from that timing while no other
        flow shares its links (:mod:`simulator.workload.isolated`; exact: a replay in
        which a call was not alone after all runs again with that call's group simulated
        flow by flow). False simulates every call's flows.
    bundles : bool
        With ``isolated``: a call that shares links with others runs as a *bundle*, one
        flow per link at the pace it keeps alone (:mod:`simulator.workload.bundles`; a
        few tenths of a percent from the reference on training steps, at a fraction of
        the work). False simulates such calls flow by flow: the per-flow reference.
    timings : TimingStore, optional
        Where calls' timings alone are kept (:class:`~simulator.workload.isolated.
        TimingStore`): a store given to several replays on this graph (a search's
        candidates) times each distinct call once for all of them; results are the same
        with or without one. Default: a store of this replay's own.
    chained : bool
        Without ``comm_slowdown``, end compute ops by one reused event per stream, and
        start a compute op whose predecessor on its stream is a compute op that nothing
        else waits for straight from that predecessor's end, rather than through the
        general bookkeeping of ends and issues (:meth:`_compute_end`). The same events at
        the same times in the same order, so the same results to the bit; False runs
        every op through the general path (the reference, tests/test_engine_chained.py).

    A workload given by one data-parallel replica (``megatron(replicas=True)``) is
    simulated once for all where the cluster, the routes and every spanning call look
    the same from each replica (checked: :mod:`simulator.workload.replicas`); otherwise,
    and as soon as a call proves otherwise, the full workload is built and replayed.
    """

    def __init__(
        self,
        workload: Workload,
        graph: nx.Graph,
        *,
        algorithm: str | None = None,
        comm_slowdown: float = 0.0,
        device: Device | None = None,
        reduce_bandwidth: float | None = None,
        protocol: str | None = None,
        compute_scale: Callable[[int, int, float], float] | None = None,
        sm_contention: bool = False,
        isolated: bool = True,
        bundles: bool = True,
        nccl: NcclEnv | str | None = None,
        timings: TimingStore | None = None,
        chained: bool = True,
        communicators: dict[str, CommConfig] | None = None,
        _excluded: frozenset = frozenset(),
    ):
        nccl = parse_nccl_env(nccl)
        communicators = dict(communicators or {})
        check_communicators(communicators, workload.groups)
        # Calls' timings alone, shared with the attempts that may follow this one (and
        # with other replays on this graph given the same store).
        if timings is None or timings.graph is not graph:
            timings = TimingStore(graph)
        self._store = timings
        # Kept to run the replay again when calls timed alone turn out not to be alone.
        self._arguments = dict(
            algorithm=algorithm, comm_slowdown=comm_slowdown, device=device,
            reduce_bandwidth=reduce_bandwidth, protocol=protocol,
            compute_scale=compute_scale, sm_contention=sm_contention,
            isolated=isolated, bundles=bundles, nccl=nccl,
            timings=timings, chained=chained, communicators=communicators,
        )  # fmt: skip
        p = len(gpu_nodes(graph))
        if workload.ranks > p:
            raise WorkloadError(
                f"workload {workload.name!r} has {workload.ranks} ranks but the topology has "
                f"{p} GPUs; use more --nodes or a larger topology"
            )
        if not 0 <= comm_slowdown < 1:
            raise CcsimError(f"comm_slowdown must be in [0, 1), got {comm_slowdown!r}")
        if graph.graph.get("comm_engine") == "sdma":
            comm_slowdown = 0.0  # copy engines leave the GPU cores to compute
            sm_contention = False
        if comm_slowdown and sm_contention:
            raise CcsimError(
                "comm_slowdown (a fixed fraction) and sm_contention (the calls' own CTAs) "
                "both set how communication slows compute: give one"
            )
        algorithm = library_of(graph) if algorithm is None else algorithm
        valid = ("auto", *POLICIES, *algorithm_names())
        if algorithm not in valid:
            raise unknown_choice("algorithm", algorithm, valid)
        self.graph = graph
        self.algorithm = algorithm
        self.comm_slowdown = comm_slowdown
        # Communication's kernels hold multiprocessors: NCCL launches one CTA per channel
        # (src/enqueue.cc line 1553 at v2.28.3-1, grid = {nChannels, 1, 1}), each on an SM
        # the rank's compute then lacks.
        self.sm_contention = sm_contention
        self.env = simpy.Environment()
        # A library decides per call (its policy); otherwise, with a protocol, the
        # calibrated model of simulator.library.protocol applies to every collective:
        # links at their efficiency, per-step latencies, and a launch plus base latency
        # before each call; "auto" picks, per collective, the protocol fastest for it
        # alone (as NCCL's tuner does per call).
        self.calibration = calibration_of(graph)
        self.policy: NcclPolicy | HcclPolicy | None = None
        if algorithm in POLICIES:
            self.policy = library_policy(
                algorithm, graph, protocol=protocol, reduce_bandwidth=reduce_bandwidth, nccl=nccl
            )
        elif nccl:
            raise CcsimError(nccl_not_applied(algorithm))
        elif protocol is not None and str(protocol).lower() != "auto":
            self.calibration.protocol(protocol)  # an unknown name fails now
        if communicators and not isinstance(self.policy, NcclPolicy):
            raise CcsimError(
                "NCCL settings per process group apply where NCCL chooses the collectives "
                f"(--algo nccl, or a preset whose library is NCCL), not to {algorithm}"
            )
        self.communicators = communicators
        self.protocol = protocol
        self.nccl = nccl
        # The protocol of calls run as given: under NCCL its protocols (the fastest for
        # the call unless one is forced, or NCCL_PROTO leaves one); under HCCL none.
        if isinstance(self.policy, NcclPolicy):
            only = {nccl.protocols_for(op) for op in FUNCTIONS}
            single = only.pop() if len(only) == 1 else None
            self._given_protocol = protocol or (
                single[0] if single is not None and len(single) == 1 else "auto"
            )
        elif isinstance(self.policy, HcclPolicy):
            self._given_protocol = None
        else:
            self._given_protocol = protocol
        self.network = FlowNetwork(
            self.env,
            graph,
            link_efficiency=None if self._given_protocol is None else self.calibration.efficiency,
            tables=self._store.tables(),
        )
        # Sends NCCL leaves through another GPU of their communicator (its PXN for
        # point-to-point, simulator.library.nccl_p2p.p2p_proxy), (sender, receiver) ->
        # that GPU; none where each send runs on its own pair's communicator (PyTorch's
        # isend on its own, Megatron's with overlap_p2p_comm) or off NCCL.
        self._p2p_relays: dict[tuple[int, int], int] = {}
        if isinstance(self.policy, NcclPolicy) and workload.p2p_comms is not None:
            router = self.network.router
            hosts, devices = router.hosts()
            self._p2p_relays = p2p_relays(
                workload.p2p_comms,
                hosts,
                devices,
                [host[0] for host in hosts],
                router.can_relay,
                nccl.p2p_pxn_level,
            )
        # Neither shortcut follows a relayed send's images: both build every rank then.
        relayed = "a pipeline send leaves through another GPU of its communicator (NCCL's PXN)"
        # One rank per TP group standing for the group (see simulator.workload.shadows),
        # or every rank built.
        self._images: dict[str, tuple[str, ...]] | None = None
        self._shadows_report: dict = {}
        # Set on a replay with the TP ranks alone shadowed that stands in for one whose
        # masters stood for TP x CP ranks (their count, for the report).
        self._shadows_given: int | None = None
        if workload.shadows is not None:
            why = "a compute_scale was given (it may single out ranks)"
            if compute_scale is None:
                why = "the topology has faults" if fault_plan(graph) is not None else ""
                if not why and self._p2p_relays:
                    why = relayed
                if not why and sends_hash(workload, servers_of_ranks(graph), self.network.router):
                    # Known before the run: the shadows' sends would be hashed onto other
                    # paths than their masters' (see simulator.workload.shadows).
                    why = "a master's pipeline send crosses servers over several shortest paths"
                if not why:
                    self._images, why = shadow_images(workload)
            if self._images is None:
                count = workload.shadows.count
                workload = workload.shadows.build()
                self._shadows_report = {"count": count, "simulated": "all", "why": why}
            else:
                self._shadows_report = {"count": workload.shadows.count, "simulated": 1}
        self._shadow_check = ShadowCheck()
        # (group, positions) -> each position's master's position (_shadow_positions),
        # and the positions of the masters (made once per group and size).
        self._owners: dict[tuple[str, int], tuple[list[int], list[int], list[bool]]] = {}
        # (group, image) -> whether the image is a CP rank (or more) away (_across_cp).
        self._apart_images: dict[tuple[str, str], bool] = {}
        # Per group: its ranks as an array; per group and call: its schedule, protocol,
        # record and period (see _call_schedule).
        self._rank_arrays: dict[str, np.ndarray] = {}
        self._group_calls: dict[tuple, tuple] = {}
        self._routes_checked: dict[tuple[int, int], tuple] = {}
        # Per group and call: its images' calls where they start together (_family).
        self._families: dict[tuple, list | None] = {}
        # One replica standing for all (symmetric flows aggregated over link classes), or
        # every replica built (see simulator.workload.replicas).
        self.replicas: ReplicaSymmetry | None = None
        self._replicas_report: dict = {}
        if workload.replicas is not None:
            why = "a compute_scale was given (it may single out ranks)"
            if compute_scale is None and self._p2p_relays:
                why = relayed
            elif compute_scale is None:
                self.replicas, why = replica_symmetry(workload, self.network, self._store.derived)
                k = None
                if self.replicas is None and workload.replicas.build is not None:
                    k = replicas_per_server(workload, graph)
                if k is not None:
                    # Replicas smaller than a server: k of them together stand for the
                    # next k, and so on.
                    together = workload.replicas.build(k * workload.replicas.unit)
                    symmetry, also = replica_symmetry(together, self.network, self._store.derived)
                    if symmetry is not None:
                        self.replicas, workload = symmetry, together
                    else:
                        why = also
            given = workload.replicas
            dp = given.count * given.unit  # data-parallel replicas in all
            if self.replicas is None:
                workload = _every_replica(workload, why)
                self._replicas_report = {"count": dp, "simulated": "all", "why": why}
            else:
                self.network.set_link_classes(self.replicas.link_class, self.replicas.class_size)
                self._replicas_report = {"count": dp, "simulated": given.unit}
        self.workload = workload
        # Faults (issue 16, simulator.network.faults): slow GPUs and jitter scale compute
        # durations; timed link degradations re-rate the network at their start and end.
        self.compute_scale = compute_scale or compute_scaler(graph)
        schedule_link_faults(self.network)
        self._protocols: dict[tuple, str] = {}
        self.device = device or graph_device(graph)
        # (id of an op's GEMM tuple, id of its attention tuple) -> seconds
        self._gemm_times: dict[tuple[int, int], float] = {}
        self.reduce_bandwidth = reduce_bandwidths(graph, reduce_bandwidth)
        # Calls timed alone once and replayed from that timing while nothing else uses
        # their links (checked as the replay goes; see simulator.workload.isolated).
        self.bundles = bundles
        self.isolated = (
            IsolatedCalls(
                self.network,
                self.reduce_bandwidth,
                _excluded,
                replicas=self.replicas,
                bundles=bundles,
                store=timings,
            )
            if isolated
            else None
        )
        self.servers = servers_of_ranks(graph)
        ops = workload.ops
        n = len(ops)
        self.records = OpRecord(np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan))
        # The records written one op at a time through views of their memory: a store
        # into a memoryview costs about half a numpy scalar store, the same double in
        # the same array (read as it runs by a watch, simulator.workload.steady).
        self._issue_at = memoryview(self.records.issue_s)
        self._start_at = memoryview(self.records.start_s)
        self._end_at = memoryview(self.records.end_s)
        # Per-op bookkeeping in Python lists, not numpy arrays: it is read and written
        # one element at a time, several times per op, where a numpy scalar costs more.
        # An op is issued once it waits for nothing: ``_waits[i]`` counts its deps not
        # done plus 1 while the op before it on its stream is not done (ops on a stream
        # run in trace order, so "the stream is free for it" is "its predecessor there
        # is done"); the op that ends a wait issues it (_finish), as soon as the count
        # is 0, so no op is looked at again before it can run.
        #
        # Each (rank, stream) by number: its first op (issued at the start once it waits
        # for no dep), each op's stream and the op after it there (-1: the last). Each
        # op's kind as a small number (_COMPUTE, _CALL, _SIDE), read without reaching
        # the op's object: a call's and a pair's issue need only their number. (One
        # pass over the ops for all of them.)
        waits: list[int] = [0] * n
        successors: list[list[int]] = [[] for _ in ops]
        stream_ids: dict[tuple[int, str], int] = {}
        heads: list[int] = []
        stream_of: list[int] = [0] * n
        next_on_stream: list[int] = [-1] * n
        last: list[int] = []
        kinds = bytearray(n)
        codes = {"compute": _COMPUTE, "collective": _CALL}
        for op in ops:
            index, deps = op.index, op.deps
            for dep in deps:
                successors[dep].append(index)
            sid = stream_ids.setdefault((op.rank, op.stream), len(stream_ids))
            if sid == len(last):
                heads.append(index)
                last.append(index)
                waits[index] = len(deps)
            else:
                next_on_stream[last[sid]] = index
                last[sid] = index
                waits[index] = len(deps) + 1
            stream_of[index] = sid
            kinds[index] = codes.get(op.kind, _SIDE)
        self._waits = waits
        self._successors = successors
        self._stream_heads = heads
        self._stream_of = stream_of
        self._next_on_stream = next_on_stream
        self._kind_of = bytes(kinds)
        # Ends of compute ops: one reused event per stream (_ComputeEnd), and the next
        # compute op on a stream started straight from the end of the one before it
        # where nothing else held it back (_compute_end). Only without comm_slowdown,
        # where compute ends never move.
        self._chained = chained and not self.comm_slowdown and not self.sm_contention
        self._ends: list[_ComputeEnd | None] = [None] * len(last)
        instance_of = [-1] * n
        for k, members in enumerate(workload.instances):
            for index in members:
                instance_of[index] = k
        self._instance_of: list[int] = instance_of
        # Members of each call, and sides of each pair, not issued yet.
        self._members_left: list[int] = [len(members) for members in workload.instances]
        pair_of = [-1] * n
        for k, (s, r) in enumerate(workload.pairs):
            pair_of[s] = pair_of[r] = k
        self._pair_of: list[int] = pair_of
        self._sides_left: list[int] = [2] * len(workload.pairs)
        self._comm_active = np.zeros(workload.ranks, dtype=np.int64)
        # Compute ops on the "host" stream (CPU work) under sm_contention: never re-timed.
        self._host_jobs: set[int] = set()
        self._computing: dict[int, list[_Compute]] = defaultdict(list)
        self._schedules: dict[tuple, Schedule] = {}
        self._p2p: dict[float, Schedule] = {}
        # A send's bytes as the network takes them (per size), and its weight with one
        # replica standing for all; its images' (per size, as many as the shadows).
        self._p2p_bytes: dict[float, np.ndarray] = {}
        self._p2p_weight: np.ndarray | None = None
        self._image_arrays: dict[float, tuple[np.ndarray, np.ndarray | None]] = {}
        self._p2p_routes: dict[tuple[int, int], np.ndarray] = {}
        self._sends: int | None = None  # the network owner id of point-to-point flows
        self._image_sends: int | None = None  # and of the shadows' (see shadows.py)
        self._image_routes: dict[tuple[int, int], np.ndarray] = {}
        self._attempt = 1
        self._choices: list[dict | None] = [None] * len(workload.instances)
        self._given: dict[tuple, dict] = {}
        self._tuner = None  # for algorithm="auto": one tuner per replay, never shared
        self._auto_choices: dict[tuple, tuple[str, int]] = {}
        self._group_graphs: dict[tuple, nx.Graph] = {}
        # The library's decisions: per group, its communicator's shape (the library's
        # view of it, and its rank layout with servers numbered from 0); per shape,
        # operation, size and forced counts, the schedule, protocol and record.
        self._shapes: dict[tuple, tuple[RankLayout, NcclSystem | HcclSystem]] = {}
        self._server_index: ServerIndex | None = None
        self._calls: dict[tuple, tuple[Schedule, Protocol | None, dict, bool]] = {}
        self._policies: dict[tuple, NcclPolicy | HcclPolicy] = {}
        self._done = 0

    def close(self) -> None:
        """Let go of what refers back to this replay once its result has been read (its
        network's flow owners, the calls in its registries, the network's hook into
        them), so that the replay, its workload and its network are freed as soon as
        nothing else holds them, rather than at the interpreter's next full collection
        of reference cycles: a search runs hundreds of replays in one process. Only
        memory changes; the replay cannot run again."""
        network = getattr(self, "network", None)
        if network is not None:
            network._owners.clear()
            network.on_conflict = None
        if self.isolated is not None:
            self.isolated._live.clear()
            self.isolated._holders.clear()  # families replayed refer back (_Passives)
        self._shadow_check = ShadowCheck()
        self._ends.clear()  # each holds the replay's _compute_end
        # A run stops once every op is done, and events may still wait in SimPy's queue
        # (a compute end, a network wake-up whose callback holds the network): each
        # refers back to the environment that queues it, a cycle through the replay's
        # network. SimPy has no public call to drop them; its queue is a plain list.
        queue = getattr(self.env, "_queue", None)
        if isinstance(queue, list):
            queue.clear()

    # -- running ---------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> WorkloadRun:
        """Replay every op; raise :class:`WorkloadError` if some can never run.

        ``progress``, if given, is called with the simulated time (seconds) as it
        advances (the command line passes a progress bar's callback).

        Where an attempt finds its stand-ins (TP masters, one replica, calls timed
        alone) unlike what they stand for, a new replay starts over; each attempt given
        up is closed (see :meth:`close`) and dropped before the next runs, so that only
        one attempt's records are alive at a time and none is left as cyclic garbage
        for a full collection (which walks every op alive) to find.
        """
        replay = self
        while True:
            outcome = replay._attempt_run(progress)
            if isinstance(outcome, WorkloadRun):
                if replay is not self:
                    replay.close()
                return outcome
            replay.close()
            replay = outcome

    def _attempt_run(
        self, progress: Callable[[float], None] | None
    ) -> WorkloadRun | WorkloadReplay:
        """One attempt of :meth:`run`: its result, or the replay to start over with."""
        try:
            self._check_spanning_calls()
            waits = self._waits
            for head in self._stream_heads:
                # (One issued meanwhile by a call that ended at once is not again.)
                if not waits[head] and np.isnan(self.records.issue_s[head]):
                    self._issue(head)
            run_env(self.env, progress=progress)
        except ShadowsUnlike as error:
            return self._every_tp_rank(str(error), progress, error.across_cp)
        except Asymmetric as error:
            # A call showed that single replicas are not alike: as many together as it
            # repeats over (a ring that alternates its direction from server to server
            # repeats every two), or every replica.
            given = self.workload.replicas
            dp = self._replicas_report["count"]
            unit = (error.together or dp) * given.unit
            if given.build is not None and unit < dp and dp % unit == 0:
                workload = given.build(unit)
                together = f"{unit} replicas together"
            else:
                workload = _every_replica(self.workload, str(error))
                together = "every replica built"
            again = WorkloadReplay(workload, self.graph, **self._arguments)
            again._attempt = self._attempt + 1
            _starting_over(progress, f"replicas not alike, {together}")
            if again.replicas is None:
                why = again._replicas_report.get("why", str(error))
                again._replicas_report = {"count": dp, "simulated": "all", "why": why}
            return again
        if self.isolated is not None and self.isolated.conflicts:
            # Some calls timed alone shared links after all: this replay is not exact.
            # Run again with their groups simulated flow by flow (each attempt excludes
            # at least one more group, so this ends).
            excluded = self.isolated.excluded | self.isolated.conflicts
            if _conflicts_are_the_rule(self._attempt, self.isolated):
                # Every attempt replays the whole step: where calls overlap others as a
                # rule (a data-parallel ring sharing NVLink with tensor-parallel calls),
                # excluding them attempt by attempt costs more than simulating every
                # flow once (a 7.1B TP 2 step: 4 attempts, 188 s; every flow: 26 s).
                excluded = {EVERY_CALL}
            elif self._attempt >= CALLS_THEN_GROUPS:
                # Still conflicts: the calls of a group that met others are usually its
                # neighbours in time too, met once the first were slowed; so that the
                # attempts stay few, whole groups go flow by flow from now on.
                excluded = {_as_group(key) for key in excluded}
            excluded = frozenset(excluded)
            again = WorkloadReplay(self.workload, self.graph, **self._arguments, _excluded=excluded)
            again._attempt = self._attempt + 1
            _starting_over(progress, "calls that were not alone after all, run flow by flow")
            again._replicas_report = again._replicas_report or self._replicas_report
            return again
        why = self._shadow_check.settle() if self._images is not None else ""
        if why and self._done == len(self.workload.ops):
            return self._every_tp_rank(why, progress, self._shadow_check.across_cp)
        self.network.close_link_records()
        if self._done < len(self.workload.ops):
            raise self._deadlock()
        return WorkloadRun(
            self.workload,
            self.records,
            self.network.stats,
            self.network.link_records(),
            algorithm=self.algorithm,
            choices=list(self._choices),
            isolated={}
            if self.isolated is None
            else {
                "replayed": self.isolated.replayed,
                "timed": self.isolated.timed,
                "joint": self.isolated.joint,
                "bundled": self.isolated.bundled,
                "met": self.isolated.met,
                # Images replayed passively, and those met (then bundles).
                "passive": self.isolated.passive,
                "passive_met": self.isolated.passive_met,
                "attempts": self._attempt,
                "flow_by_flow": sorted(
                    str(key)
                    for key in self.isolated.excluded
                    if not isinstance(key, (TakeOver, Call))
                ),
                # Single calls simulated flow by flow (their groups' others were not).
                "calls_flow_by_flow": sum(isinstance(key, Call) for key in self.isolated.excluded),
                # Groups whose calls may not take sends over (they conflicted doing so).
                "no_take_over": sorted(
                    {
                        str(_as_group(key).group)
                        for key in self.isolated.excluded
                        if isinstance(key, TakeOver)
                    }
                ),
            },
            replicas=dict(self._replicas_report),
            shadows=dict(self._shadows_report),
        )

    def _every_tp_rank(
        self, why: str, progress: Callable[[float], None] | None, across_cp: bool = False
    ) -> WorkloadReplay:
        """A shadow did not end with its master (``why``): the replay with every TP rank
        built, to run instead (see simulator.workload.shadows); where the shadow was a
        CP rank away from its master (``across_cp``) and the workload has a build with
        the TP ranks alone shadowed, that build, whose own check falls back to every
        rank in turn. (The CP ranks of a data-parallel ring on fewer channels than its
        ranks in a server end apart, their rings entering each server at the first
        GPUs; the TP shift still maps each ring onto its image: issue 31.)"""
        shadows = self.workload.shadows
        # (Reports count the ranks a master stood for at first, TP x CP.)
        count = self._shadows_given or shadows.count
        if across_cp and shadows.tp_only is not None:
            again = WorkloadReplay(shadows.tp_only(), self.graph, **self._arguments)
            again._attempt = self._attempt + 1
            again._shadows_given = count
            _starting_over(progress, "CP ranks not alike, every CP rank built")
            if again._shadows_report.get("simulated") == 1:
                again._shadows_report = {
                    "count": count,
                    "simulated": count // again.workload.shadows.count,
                    "why": why,
                }
            return again
        again = WorkloadReplay(shadows.build(), self.graph, **self._arguments)
        again._attempt = self._attempt + 1
        _starting_over(progress, "TP ranks not alike, every rank built")
        again._shadows_report = {"count": count, "simulated": "all", "why": why}
        return again

    def _check_spanning_calls(self) -> None:
        """With one replica standing for all, check before the run that every distinct
        call of a group spanning the replicas repeats from one replica to the next
        (raises :class:`~simulator.workload.replicas.Asymmetric`), so that a run does not
        find out at its end."""
        if self.replicas is None:
            return
        ops, groups = self.workload.ops, self.workload.groups
        for members in self.workload.instances:
            first = ops[members[0]]
            if first.group not in self.replicas.period or first.nbytes == 0:
                continue
            self._call_schedule(first, groups[first.group].ranks, first.group)

    def _issue(self, index: int) -> None:
        """Issue op ``index``, which waits for nothing (its deps are done and so is the
        op before it on its stream): compute starts; a call launches once every member
        has issued it, a send/recv pair once both sides have."""
        self._issue_at[index] = self.env._now  # (SimPy's clock, without a call)
        kind = self._kind_of[index]
        if kind == _COMPUTE:
            self._start_compute(self.workload.ops[index])
        elif kind == _CALL:
            k = self._instance_of[index]
            left = self._members_left[k] - 1
            self._members_left[k] = left
            if not left:
                self._launch_collective(k)
        else:
            k = self._pair_of[index]
            left = self._sides_left[k] - 1
            self._sides_left[k] = left
            if not left:
                self._launch_pair(k)

    def _finish(self, index: int) -> None:
        """Op ``index`` is done: the op after it on its stream, then the ops that
        depend on it (in order), are issued where they now wait for nothing."""
        self._end_at[index] = self.env._now
        self._done += 1
        waits = self._waits
        after = self._next_on_stream[index]
        if after >= 0:
            left = waits[after] - 1
            waits[after] = left
            if not left:
                self._issue(after)
        for succ in self._successors[index]:
            left = waits[succ] - 1
            waits[succ] = left
            if not left:
                self._issue(succ)

    # -- compute ---------------------------------------------------------------------------
    def _work(self, op: Op) -> float:
        if op.duration is not None:
            return op.duration
        if self.device is None:
            raise WorkloadError(
                f"op {op.id!r} gives FLOPs but the topology's GPUs have no known device model "
                "to time them; give 'duration' or set the GPUs' 'model' (A100, H100, 910B)"
            )
        kernels = 0.0
        if op.gemms or op.attention:
            # Passes of one stage share their kernel tuples (the parser interns them).
            key = (id(op.gemms), id(op.attention))
            if key not in self._gemm_times:
                self._gemm_times[key] = kernels_time(self.device, op.gemms, op.attention)
            kernels = self._gemm_times[key]
        return kernels + self.device.compute_time(op.flops, op.mem_bytes)

    def _rate(self, rank: int) -> float:
        active = self._comm_active[rank]
        if not active:
            return 1.0
        if self.sm_contention:
            # The SMs the calls in flight hold (one CTA a channel), at most all but one.
            units = self.device.units
            return 1.0 - min(int(active), units - 1) / units
        return 1.0 - self.comm_slowdown

    def _ctas(self, k: int, op: Op) -> int:
        """CTAs call ``k`` (first member ``op``) holds on each rank while it runs: its
        channels as the library chose them (one CTA a channel), else the op's own; 1
        without sm_contention (the count of calls in flight is what comm_slowdown asks)."""
        if not self.sm_contention:
            return 1
        choice = self._choices[k] if k < len(self._choices) else None
        channels = (choice or {}).get("channels") or op.channels or 1
        return max(1, int(channels))

    def _start_compute(self, op: Op) -> None:
        self._start_at[op.index] = self.env._now
        work = self._work(op)
        if self.compute_scale is not None:  # a straggler or jitter (faults)
            work *= self.compute_scale(op.rank, op.index, self.env.now)
        if self._chained:
            sid = self._stream_of[op.index]
            end = self._ends[sid]
            if end is None:
                end = self._ends[sid] = _ComputeEnd(self.env, self._compute_end)
            end.index = op.index
            end.callbacks = end.armed
            # The delay a Timeout of ``work / rate`` would have (the rate is 1 here:
            # x / 1.0 is x), scheduled now as it would be: the same time and place.
            self.env.schedule(end, simpy.events.NORMAL, work)
            return
        if self.sm_contention and op.stream == "host":
            # The host's CPU work (launches, Python): the SMs communication holds do
            # not slow it, so it keeps its rate whatever starts or ends.
            self._host_jobs.add(op.index)
            job = _Compute(op.index, work, self.env.now, 1.0)
        else:
            job = _Compute(op.index, work, self.env.now, self._rate(op.rank))
        self._computing[op.rank].append(job)
        self._schedule_compute(op.rank, job)

    def _schedule_compute(self, rank: int, job: _Compute) -> None:
        job.generation += 1
        generation = job.generation
        event = self.env.timeout(job.left / job.rate)
        event.callbacks.append(lambda _e: self._compute_done(rank, job, generation))

    def _compute_end(self, event: _ComputeEnd) -> None:
        """A compute op ended (``chained``). Where the next op on its stream is a compute
        op that waits for nothing else and that nothing but it waits for (the end's
        only successors, if any, are that op), start that op at once, as :meth:`_finish`
        and :meth:`_issue` would: the same records and counts, the same
        ``compute_scale`` call at the same time. Otherwise finish it the general way."""
        index = event.index
        after = self._next_on_stream[index]
        if after >= 0 and self._kind_of[after] == _COMPUTE:
            successors = self._successors[index]
            waits = self._waits
            # (Its waits: this op as its stream's predecessor, and as each dep.)
            if waits[after] == len(successors) + 1 and all(succ == after for succ in successors):
                now = self.env._now
                self._end_at[index] = now
                self._done += 1
                waits[after] = 0
                self._issue_at[after] = now
                self._start_compute(self.workload.ops[after])
                return
        self._finish(index)

    def _compute_done(self, rank: int, job: _Compute, generation: int) -> None:
        if generation != job.generation:
            return  # its speed changed; a newer wake-up is scheduled
        self._computing[rank].remove(job)
        self._finish(job.index)

    def _set_comm(self, ranks: list[int] | np.ndarray, delta: int) -> None:
        """Count communications in flight on ``ranks`` and re-time their compute."""
        if not self.comm_slowdown and not self.sm_contention:
            return  # (the count only matters where communication slows compute)
        for rank in ranks:
            before = self._rate(rank)
            self._comm_active[rank] += delta
            after = self._rate(rank)
            if before == after:
                continue
            now = self.env.now
            for job in self._computing[rank]:
                if job.index in self._host_jobs:
                    continue  # CPU work: held SMs do not slow it
                job.left = max(job.left - (now - job.last) * job.rate, 0.0)
                job.last = now
                job.rate = after
                self._schedule_compute(rank, job)

    # -- communication -------------------------------------------------------------------
    def _layout(self, ranks: list[int]) -> RankLayout:
        servers = None if self.servers is None else tuple(self.servers[r] for r in ranks)
        return RankLayout(len(ranks), servers)

    def _launch_collective(self, k: int) -> None:
        members = self.workload.instances[k]
        first = self.workload.ops[members[0]]
        group = self.workload.groups[first.group]
        now = self.env._now
        if len(members) <= _FEW:
            start_at = self._start_at
            for index in members:
                start_at[index] = now
        else:
            self.records.start_s[members] = now
        ranks = group.ranks
        if len(ranks) == 1 or first.nbytes == 0:
            for index in members:
                self._finish(index)
            return
        # A group spanning the replicas: its first replica's ranks (the first ``period``)
        # run the representatives of the schedule's transfers.
        key = (first.group, first.op, first.nbytes, first.chunks, first.channels, first.algorithm)
        schedule, proto, self._choices[k], period = self._call_schedule(
            first, ranks, first.group, key
        )
        slowdown = self._ctas(k, first) if self.comm_slowdown or self.sm_contention else 0
        if slowdown:
            self._set_comm(ranks[:period], +slowdown)
        images = None if self._images is None else self._images.get(first.group)
        if images is None:
            member_at, owner, apart = members, None, None
        else:
            # Masters' ops are the members; a TP group's shadows have none, and each
            # ends when its master does (checked).
            member_at, owner, apart = self._shadow_positions(first.group, ranks, members, period)
        check = self._shadow_check
        finish = self._finish

        def rank_done(positions: np.ndarray) -> None:
            done = positions.tolist()
            if slowdown:
                self._set_comm([ranks[i] for i in done], -slowdown)
            if owner is not None:
                # Every position's end, shadows' too: an image on the other CP ranks'
                # group is held to the position it stands for.
                check.master((k,), done, self.env.now)
                ours = [i for i in done if member_at[i] >= 0]
                if len(ours) < len(done):
                    # TP shadows checked first: where those disagree, so may the TP
                    # ranks of a build without CP shadows (see ShadowsUnlike).
                    theirs = [owner[i] for i in done if member_at[i] < 0 and not apart[i]]
                    if theirs:
                        check.shadow((k,), theirs, self.env.now, lambda: f"a TP shadow in call {k}")
                    theirs = [owner[i] for i in done if member_at[i] < 0 and apart[i]]
                    if theirs:
                        check.shadow(
                            (k,), theirs, self.env.now, lambda: f"a CP shadow in call {k}", True
                        )
                done = ours
            for i in done:
                finish(member_at[i])

        start = self._call_start(
            first.group, schedule, proto, self._ranks(first.group), rank_done, period, k
        )
        if not images:
            self._after_launch(proto, start)
            return
        # The images start with the master's call (in the same callback, after the
        # same launch overhead, where their protocol is the master's): all at once
        # where they can (_start_family), else one by one.
        family = self._family(first, images, proto, key)
        if family is not None:

            def together() -> None:
                start()
                self._start_family(k, family, proto)

            self._after_launch(proto, together)
            return
        starts = [start]
        for name in images:
            image = self._launch_image(k, first, name, proto)
            if image is not None:
                starts.append(image)
        if len(starts) == 1:
            self._after_launch(proto, start)
        else:
            self._after_launch(proto, lambda: [call() for call in starts])

    def _shadow_positions(
        self, name: str, ranks: list[int], members: list[int], period: int | None
    ) -> tuple[list[int], list[int], list[bool]]:
        """For a call of group ``name`` with masters: the member op at each position
        (-1 for a shadow's), each position's master's position (its own where the
        master is not in the group), and whether that master is a CP rank (or more)
        away, not in the position's TP group."""
        size = len(ranks) if period is None else period
        known = self._owners.get((name, size))
        if known is None:
            shadows = self.workload.shadows
            master_of = shadows.master_of()
            position = {ranks[i]: i for i in range(size)}
            owner = [position.get(int(master_of[ranks[i]]), i) for i in range(size)]
            apart = [
                bool(shadows.more) and not shadows.same_tp_group(ranks[i], ranks[owner[i]])
                for i in range(size)
            ]
            # The positions of the masters, whose member ops fill them in order.
            masters = shadows.masters
            slots = [i for i in range(size) if ranks[i] in masters]
            known = self._owners[(name, size)] = (owner, slots, apart)
        owner, slots, apart = known
        if len(slots) == size == len(members):
            return members, owner, apart  # every position a master's, in order
        member_at = [-1] * size
        for i, index in zip(slots, members, strict=True):
            member_at[i] = index
        return member_at, owner, apart

    def _across_cp(self, group: str, image: str) -> bool:
        """Whether ``image``, an image of ``group`` on the shadows' ranks, is a CP rank
        (or more) away from it, not the same ranks' TP shift (see ShadowsUnlike)."""
        known = self._apart_images.get((group, image))
        if known is None:
            shadows = self.workload.shadows
            groups = self.workload.groups
            known = self._apart_images[(group, image)] = bool(
                shadows is not None
                and shadows.more
                and not shadows.same_tp_group(groups[group].ranks[0], groups[image].ranks[0])
            )
        return known

    def _family(
        self, first: Op, images: tuple[str, ...], proto: Protocol | None, key: tuple
    ) -> list | None:
        """The images of a master's call (its first member ``first``, its call ``key`` as
        :meth:`_call_schedule` has it), each as (group, schedule, ranks, period), where
        they can start passively together with it (:meth:`_start_family`): calls
        replayed from timings, with bundles, each with the master's protocol; else None.
        Decided once per group and call, as is the replica check of their routes (at
        the call's first launch, as for any call: a route checked once stays checked)."""
        if self.isolated is None or not self.bundles:
            return None
        family = self._families.get(key, ())
        if family != ():
            return family
        family = []
        for name in images:
            ranks = self._ranks(name)
            schedule, own, _, period = self._call_schedule(first, ranks, name)
            if own is not proto:
                family = None
                break
            family.append((name, schedule, ranks, period))
        if family is not None and self.replicas is not None:
            for _, schedule, ranks, _ in family:
                checked = (id(schedule), id(ranks))
                if checked not in self._routes_checked:
                    self.replicas.check_routes(self.network, schedule, ranks)
                    self._routes_checked[checked] = (schedule, ranks)
        self._families[key] = family
        return family

    def _start_family(self, k: int, family: list, proto: Protocol | None) -> None:
        """Start the images of call ``k`` at once (passive calls, see
        :meth:`~simulator.workload.isolated.IsolatedCalls.run_family`), or, where they
        cannot all be replayed so now, one by one as :meth:`_launch_image` does."""
        check = self._shadow_check
        isolated = self.isolated
        assert isolated is not None
        env = self.env
        # What hears an image's ends is made only for one met (it then goes on as a
        # bundle); the ends expected are held for the family at once.
        group = self.workload.ops[self.workload.instances[k][0]].group
        ends = _FamilyEnds(check, k, family, env, lambda name: self._across_cp(group, name))
        apart = [self._across_cp(group, image[0]) for image in family]
        if isolated.run_family(family, proto, ends, check.expected_family((k,), apart)):
            return
        for i, (name, schedule, ranks, period) in enumerate(family):
            done = ends(i)
            image = ((k,), done.what, done.across_cp)
            self._call_start(name, schedule, proto, ranks, done, period, image=image)()

    def _launch_image(
        self, k: int, first: Op, name: str, proto: Protocol | None
    ) -> Callable[[], None] | None:
        """Run the image of call ``k`` (its first member ``first``) on the shadows' group
        ``name`` beside it: what the master's call does there, which nothing waits for
        but the check that it ends with the master's. Where its protocol is the
        master's (``proto``), the image's start is returned, for the master's call to
        run when it starts; otherwise it is started here after its own overhead."""
        ranks = self.workload.groups[name].ranks
        schedule, own, _, period = self._call_schedule(first, ranks, name)
        check = self._shadow_check

        def what() -> str:  # (named only in a message)
            return f"call {k}'s image on {name!r}"

        across_cp = self._across_cp(first.group, name)

        def image_done(positions: np.ndarray) -> None:
            check.shadow((k,), positions.tolist(), self.env.now, what, across_cp)

        image = ((k,), what, across_cp)
        start = self._call_start(
            name, schedule, own, self._ranks(name), image_done, period, image=image
        )
        if own is proto:
            return start
        self._after_launch(own, start)
        return None

    def _after_launch(self, proto: Protocol | None, start: Callable[[], None]) -> None:
        """Run ``start`` now, or after the protocol's launch overhead."""
        if proto is None:
            start()
        else:
            _Later(self.env, self.calibration.launch_s + proto.base_s, start)

    def _call_start(
        self,
        group: object,
        schedule: Schedule,
        proto: Protocol | None,
        ranks: np.ndarray,
        rank_done: Callable[[np.ndarray], None],
        period: int | None = None,
        index: int | None = None,
        image: tuple[tuple, Callable[[], str], bool] | None = None,
    ) -> Callable[[], None]:
        """What starts a call's schedule on ``ranks`` (to run now or after the protocol's
        launch overhead, :meth:`_after_launch`): replayed from its isolated timing when
        it is alone, else flow by flow. With one replica standing for all, each flow
        stands for its images in every replica, and ``period`` says the schedule is a
        spanning group's quotient. ``image``: the key and name of a master's call this
        one is the image of, and whether it is a CP rank (or more) away from it,
        replayed passively where it can be
        (:meth:`~simulator.workload.isolated.IsolatedCalls.run`)."""
        copies = None
        if self.replicas is not None:
            checked = (id(schedule), id(ranks))
            if checked not in self._routes_checked:
                self.replicas.check_routes(self.network, schedule, ranks)
                self._routes_checked[checked] = (schedule, ranks)  # keeps the ids valid
            copies = self.replicas.count

        def start() -> None:
            isolated = self.isolated
            if isolated is not None:
                passive = None
                if image is not None and self.bundles:
                    passive = self._shadow_check.expected(*image)
                if isolated.run(group, schedule, proto, ranks, rank_done, period, index, passive):
                    return
                if self.bundles and isolated.bundle(schedule, proto, ranks, rank_done, period):
                    return
            ScheduleReplay(
                self.network,
                schedule,
                rank_map=ranks,
                reduce_bandwidth=self.reduce_bandwidth,
                on_rank_done=rank_done,
                protocol=proto,
                weight=None if copies is None else np.full(schedule.n_ops, float(copies)),
                period=period,
                copies=copies,
            ).start()

        return start

    def _as_given(self, first: Op, ranks: list[int]) -> tuple[Schedule, Protocol | None, dict]:
        """The schedule and protocol of a call run with its own algorithm or the run's."""
        layout = self._layout(ranks)
        chunks = first.chunks
        if first.algorithm:
            algorithm = first.algorithm
        elif self.algorithm == "auto":
            algorithm, chunks = self._auto(first.op, ranks, first.nbytes)
        else:
            algorithm = self._default_algorithm(first.op, layout)
        key = (algorithm, first.op, first.nbytes, chunks, first.channels, _shape_of(layout))
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = build_schedule(
                algorithm,
                first.op,
                layout,
                first.nbytes,
                chunks=chunks,
                channels=first.channels,
            )
            self._schedules[key] = schedule
        proto = self._protocol_for(key, schedule, ranks)
        record_key = (key, None if proto is None else proto.name)
        if record_key not in self._given:
            self._given[record_key] = {
                "algorithm": algorithm,
                "protocol": None if proto is None else proto.name,
                "channels": first.channels,
                "chunks": chunks,
            }
        return schedule, proto, self._given[record_key]

    def _call_schedule(
        self, first: Op, ranks: list[int], group: str, key: tuple | None = None
    ) -> tuple[Schedule, Protocol | None, dict, int | None]:
        """A call's schedule, protocol and record, and the period of its group when the
        group spans the replicas: the schedule is then the representatives of the first
        ``period`` ranks' transfers (raises
        :class:`~simulator.workload.replicas.Asymmetric` where it does not repeat).
        ``key``: the call's key below, where the caller has made it already."""
        if key is None:
            key = (group, first.op, first.nbytes, first.chunks, first.channels, first.algorithm)
        known = self._group_calls.get(key)
        if known is not None:
            return known
        period = None
        if self.replicas is not None and group in self.replicas.period:
            period = self.replicas.period[group]
        built = False  # whether the schedule is already the representatives
        if self.policy is None or first.algorithm:
            schedule, proto, record = self._as_given(first, ranks)
        else:
            schedule, proto, record, built = self._as_library(first, ranks, period, group)
        if period is not None and not built:
            assert self.replicas is not None
            schedule = self.replicas.quotient(schedule, group).schedule
        # Decided once per group and call (the same decision for every micro-batch).
        self._group_calls[key] = (schedule, proto, record, period)
        return schedule, proto, record, period

    def _ranks(self, group: str) -> np.ndarray:
        """A group's ranks as an array (made once per group)."""
        ranks = self._rank_arrays.get(group)
        if ranks is None:
            ranks = self._rank_arrays[group] = np.asarray(self.workload.groups[group].ranks)
        return ranks

    def _as_library(
        self, first: Op, ranks: list[int], period: int | None = None, group: str = ""
    ) -> tuple[Schedule, Protocol | None, dict, bool]:
        """The schedule, protocol and record of the library's choice for a call, decided
        once per group shape, communicator configuration, operation, size and forced
        counts. With a ``period`` the schedule is the representatives of its first
        ``period`` ranks where the algorithm builds them directly (a ring over 512
        replicas is not built whole: the last item says so), else the full schedule."""
        config = self._config_of(group)
        layout, system = self._shape(ranks, config)
        key = (layout, system, first.op, first.nbytes, first.chunks, first.channels, period)
        if config is not None:
            key += (config,)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = self._library_call(system, layout, first, period, config)
        return call

    def _config_of(self, group: str) -> CommConfig | None:
        """The NCCL configuration of ``group``'s communicator (None: NCCL's default)."""
        if not self.communicators:
            return None
        name = communicator_of(group)
        return None if name is None else self.communicators.get(name)

    def _library_call(
        self,
        system: NcclSystem | HcclSystem,
        layout: RankLayout,
        first: Op,
        period: int | None = None,
        config: CommConfig | None = None,
    ) -> tuple[Schedule, Protocol | None, dict, bool]:
        policy = self._policy(first.chunks, first.channels, config)
        if isinstance(policy, HcclPolicy) and first.op not in HCCL_OPS:
            algorithm = self._default_algorithm(first.op, layout)
            schedule = build_schedule(algorithm, first.op, layout, first.nbytes)
            record = {"policy": policy.name, "algorithm": algorithm, "protocol": None,
                      "channels": 1, "chunks": 1}  # fmt: skip
            return schedule, None, record, False
        if isinstance(policy, NcclPolicy):
            plan = policy.plan(system, first.op, first.nbytes)
        else:
            plan = policy.plan(system, first.op, first.nbytes)
        schedule, built = None, False
        if period is not None:
            # Equal to the full schedule's quotient (tests/test_symmetry.py holds the
            # algorithms to it); None where the algorithm does not build it directly.
            schedule = build_quotient(
                plan.schedule, first.op, layout, first.nbytes, period, chunks=plan.chunks,
                channels=plan.built, **plan.options,
            )  # fmt: skip
            built = schedule is not None
        if schedule is None:
            schedule = build_schedule(
                plan.schedule, first.op, layout, first.nbytes, chunks=plan.chunks,
                channels=plan.built, **plan.options,
            )  # fmt: skip
        record = {
            "policy": policy.name, "algorithm": plan.schedule, "protocol": plan.protocol,
            "channels": plan.channels, "chunks": plan.chunks, **plan.params, **plan.options,
        }  # fmt: skip
        if config is not None:
            record["nccl_config"] = config.text
        proto = None
        if plan.protocol is not None:
            model = protocol_model(self.graph, plan.protocol, plan.params)
            proto = self.calibration.protocol(model) if isinstance(model, str) else model
        return schedule, proto, record, built

    def _policy(
        self, chunks: int, channels: int, config: CommConfig | None = None
    ) -> NcclPolicy | HcclPolicy:
        """The run's library policy, with a call's chunks or channels other than 1 forced,
        on a communicator of configuration ``config`` (None: NCCL's default)."""
        assert self.policy is not None
        key = (chunks, channels) if config is None else (chunks, channels, config)
        if key not in self._policies:
            self._policies[key] = library_policy(
                self.policy.name,
                self.graph,
                protocol=self.protocol,
                channels=None if channels == 1 else channels,
                chunks=None if chunks == 1 else chunks,
                reduce_bandwidth=self.policy.reduce_bandwidth,
                nccl=self.nccl if config is None else self.nccl.with_communicator(config),
            )
        return self._policies[key]

    def _shape(
        self, ranks: list[int], config: CommConfig | None = None
    ) -> tuple[RankLayout, NcclSystem | HcclSystem]:
        """A group's rank layout, servers numbered from 0, and its communicator as the
        library sees it (cached per group, and per group shape: groups whose ranks sit
        at the same positions of servers that are alike, with the same configuration
        ``config``, see the same communicator)."""
        key: tuple = tuple(ranks) if config is None else (tuple(ranks), config)
        shape = self._shapes.get(key)
        if shape is not None:
            return shape
        if self._server_index is None:
            index = self._store.derived.get("server index")
            if index is None:
                index = self._store.derived["server index"] = ServerIndex(self.graph)
            self._server_index = index
        alike = self._server_index.group_shape(ranks)
        if alike is not None and config is not None:
            alike = (alike, config)
        shape = None if alike is None else self._shapes.get(alike)
        if shape is None:
            assert self.policy is not None
            # The communicator's channels bounded by its configuration (NcclEnv.ctas).
            policy = self.policy if config is None else self._policy(1, 1, config)
            try:
                view = communicator_view(self.graph, ranks, self._server_index)
                system = policy.system(view)
            except CcsimError as error:
                raise CcsimError(
                    f"{error} (group of ranks {_ranges(ranks)}); {self.policy.name} cannot "
                    "decide its collectives here: to run an algorithm as given instead, "
                    "name one (--algo ring)"
                ) from None
            shape = (_shape_of(self._layout(ranks)), system)
            if alike is not None:
                self._shapes[alike] = shape
        self._shapes[key] = shape
        return shape

    def _protocol_for(self, key: tuple, schedule: Schedule, ranks: list[int]) -> Protocol | None:
        """The protocol a call run as given runs with (None: the ideal model); "auto" is
        the fastest of the enabled ones for this schedule alone on the group's GPUs."""
        protocol = self._given_protocol
        if protocol is None:
            return None
        if str(protocol).lower() != "auto":
            return self.calibration.protocol(protocol)
        if key not in self._protocols:
            from ..collective.run import run_schedule

            group = self._group_graph(ranks)
            result = run_schedule(group, schedule, protocol="auto")
            self._protocols[key] = result.params["protocol"]
        return self.calibration.protocol(self._protocols[key])

    def _auto(self, op: str, ranks: list[int], nbytes: float) -> tuple[str, int]:
        """Fastest (algorithm, chunks) for this group, op and size bucket, found by
        simulating the candidates on the group's GPUs alone (the rest of the network
        idle), as ``--algo auto`` does for one collective; cached per run."""
        from ..collective.tuner import AutoTuner, size_bucket

        key = (tuple(ranks), op, size_bucket(nbytes))
        if key not in self._auto_choices:
            if self._tuner is None:
                self._tuner = AutoTuner(reduce_bandwidth=None, protocol=self.protocol)
            choice = self._tuner.choose(self._group_graph(ranks), op, nbytes)
            self._auto_choices[key] = (choice.algorithm, choice.chunks)
        return self._auto_choices[key]

    def _group_graph(self, ranks: list[int]) -> nx.Graph:
        """The topology with only the group's GPUs, renumbered 0..len(ranks)-1 (cached)."""
        group = self._group_graphs.get(tuple(ranks))
        if group is None:
            nodes = gpu_nodes(self.graph)
            members = {nodes[r]: i for i, r in enumerate(ranks)}
            keep = [
                n for n, d in self.graph.nodes(data=True) if d.get("kind") != "gpu" or n in members
            ]
            group = self.graph.subgraph(keep).copy()
            for node, i in members.items():
                group.nodes[node]["rank"] = i
            self._group_graphs[tuple(ranks)] = group
        return group

    def _default_algorithm(self, op: str, layout: RankLayout) -> str:
        """The run's algorithm, or the first that can run ``op`` here (e.g. all-to-all
        has no ring form: pairwise runs it)."""
        preferred = [self.algorithm, "ring", "pairwise", "direct", *algorithm_names()]
        for name in preferred:
            if name in algorithm_names() and get_algorithm(name).unsupported(op, layout) is None:
                return name
        return self.algorithm  # build_schedule then explains what can run it

    def _launch_pair(self, k: int) -> None:
        send, recv = self.workload.pairs[k]
        src, dst = self.workload.ops[send].rank, self.workload.ops[recv].rank
        now = self.env.now
        start_at = self._start_at
        start_at[send] = now
        start_at[recv] = now
        nbytes = self.workload.ops[send].nbytes
        if self.comm_slowdown:
            self._set_comm([src, dst], +1)
        # One point-to-point transfer: a flow of the replay's own (no schedule to walk;
        # it runs as a one-transfer schedule would, with no protocol). The arrays of its
        # bytes and weight are made once per size (the network copies what it is given).
        weight = None
        sizes = self._p2p_bytes.get(nbytes)
        if sizes is None:
            sizes = self._p2p_bytes[nbytes] = np.array([float(nbytes)])
        if self.replicas is not None:
            schedule = self._p2p.get(nbytes)
            if schedule is None:
                schedule = self._p2p[nbytes] = self._p2p_schedule(nbytes)
            weight = self._p2p_weight
            if weight is None:
                weight = self._p2p_weight = np.array([float(self.replicas.count)])
        route = self._p2p_routes.get((src, dst))
        if route is None:
            if self.replicas is not None:
                # (A route does not depend on the bytes: checked once per pair.)
                self.replicas.check_routes(self.network, schedule, np.array([src, dst]))
            via = self._p2p_relays.get((src, dst))
            if via is None:
                route = self.network.route_ids(
                    np.array([src]), np.array([dst]), np.zeros(1, dtype=np.int64)
                )
            else:  # through the GPU on the receiver's rail (no shortcut: see above)
                route = self.network.router.relay_route_ids([src], [via], [dst])
            self._p2p_routes[(src, dst)] = route
        if self._sends is None:
            self._sends = self.network.register(_Sends(self._pair_done))
            if self.isolated is not None:
                # A collective that meets a send in flight on its links may be timed
                # together with it and take it over (simulator.workload.isolated).
                self.isolated.adoptable.add(self._sends)
        self.network.add_flows(self._sends, np.array([k]), route, sizes, weight)
        if self._images is not None:
            # The shadows' sends beside the master's (see simulator.workload.shadows),
            # started together: one call for all of them.
            routes = self._image_routes.get((src, dst))
            if routes is None:
                routes = self._image_pair_routes(src, dst, schedule if weight is not None else None)
            if self._image_sends is None:
                self._image_sends = self.network.register(_ImageSends(self._image_send_done))
            n = len(routes)
            images = self._image_arrays.get(nbytes)
            if images is None or len(images[0]) != n:
                images = self._image_arrays[nbytes] = (
                    np.full(n, float(nbytes)),
                    None if weight is None else np.full(n, weight[0]),
                )
            self.network.add_flows(self._image_sends, np.full(n, k), routes, *images)

    def _image_pair_routes(self, src: int, dst: int, schedule: Schedule | None) -> np.ndarray:
        """The routes of the shadows' images of a send from ``src`` to ``dst`` (found,
        and with replicas checked, once per pair of ranks)."""
        perms = self.workload.shadows.images()
        sources, targets = perms[:, src], perms[:, dst]
        if schedule is not None:
            assert self.replicas is not None
            pairs = np.stack([sources, targets], axis=1).astype(np.int64)
            self.replicas.check_routes(self.network, schedule, pairs)
        routes = self.network.route_ids(sources, targets, np.zeros(len(sources), dtype=np.int64))
        self._image_routes[(src, dst)] = routes
        return routes

    def _image_send_done(self, k: int) -> None:
        """A shadow's send arrived: it must be when its master's does."""
        self._shadow_check.shadow(("send", k), [0], self.env.now, lambda: f"a shadow of send {k}")

    def _pair_done(self, k: int) -> None:
        """A send's data arrived: both sides are done (sender first)."""
        if self._images is not None:
            self._shadow_check.master(("send", k), [0], self.env.now)
        send, recv = self.workload.pairs[k]
        for index in (send, recv):
            if self.comm_slowdown:
                self._set_comm([self.workload.ops[index].rank], -1)
            self._finish(index)

    @staticmethod
    def _p2p_schedule(nbytes: float) -> Schedule:
        """A point-to-point transfer of ``nbytes``: rank 0 sends to rank 1."""
        return Schedule(
            op="broadcast",
            algorithm="p2p",
            ranks=2,
            size_bytes=max(nbytes, 1.0),
            src=[0],
            dst=[1],
            nbytes=[nbytes],
            segment=[0],
            reduce=[False],
            dep_ptr=[0, 0],
            dep_idx=[],
            dep_sent=[],
            segment_owner=[0],
        )

    # -- diagnosis -----------------------------------------------------------------------
    def _deadlock(self) -> WorkloadError:
        stuck = [op for op in self.workload.ops if np.isnan(self.records.end_s[op.index])]
        lines = []
        for op in stuck[:5]:
            if np.isnan(self.records.issue_s[op.index]):
                lines.append(f"{op.id!r} (rank {op.rank}) never issued")
            elif op.kind == "collective":
                members = self.workload.instances[self._instance_of[op.index]]
                missing = [
                    self.workload.ops[m].rank for m in members if np.isnan(self.records.issue_s[m])
                ]
                lines.append(
                    f"{op.id!r} (rank {op.rank}) waits for ranks {missing} to issue "
                    f"{op.op} on group {op.group!r}"
                )
            else:
                lines.append(f"{op.id!r} (rank {op.rank}) waits for its peer {op.peer}")
        return WorkloadError(
            f"workload {self.workload.name!r} deadlocked with {len(stuck)} ops "
            "left: " + "; ".join(lines)
        )


def _every_replica(workload: Workload, why: str) -> Workload:
    """The full workload of one given by a replica, built because ``why``."""
    replicas = workload.replicas
    if replicas is None or replicas.build is None:
        raise WorkloadError(
            f"workload {workload.name!r} gives one of {replicas.count if replicas else 0} "
            f"data-parallel replicas, which cannot stand for all here ({why}), and cannot "
            "build the others; generate it with every replica"
        )
    return replicas.build(False)


def _shape_of(layout: RankLayout) -> RankLayout:
    """``layout`` with its servers numbered 0, 1, ... in order: groups of the same shape
    on different servers run the same schedule.

    >>> _shape_of(RankLayout(4, (3, 3, 5, 5)))
    RankLayout(ranks=4, servers=(0, 0, 1, 1))
    """
    if layout.servers is None:
        return layout
    number = {server: i for i, server in enumerate(sorted(set(layout.servers)))}
    return RankLayout(layout.ranks, tuple(number[server] for server in layout.servers))


def communicator_view(
    graph: nx.Graph, ranks: list[int], index: ServerIndex | None = None
) -> nx.Graph:
    """The topology as a communicator over ``ranks`` sees it, on which a library decides
    (NCCL's topology search, HCCL's level0 shape): the group's GPUs, renumbered
    0..len(ranks)-1 in group order, and of the servers they sit in every switch, CPU and
    NIC except the devices attached only to GPUs outside the group (their NICs, their
    SDMA engines); no fabric between servers. NCCL, likewise, sees only its own ranks'
    GPUs, and a GPU reaches the NICs of other GPUs only through them.

    >>> from simulator.topology import load_topology
    >>> view = communicator_view(load_topology("dgx-h100", 2), [0, 8])
    >>> sorted(node for node, data in view.nodes(data=True) if data["kind"] == "nic")
    ['s0/nic0', 's1/nic0']

    ``index`` (:class:`ServerIndex`, built once per graph) saves scanning the whole graph
    for each group.
    """
    index = index or ServerIndex(graph)
    nodes = index.gpus
    members = {nodes[r]: i for i, r in enumerate(ranks)}
    servers = {graph.nodes[node].get("server") for node in members}
    keep = list(members)
    for node, data in (pair for server in servers for pair in index.nodes.get(server, ())):
        if data.get("kind") == "gpu":
            continue  # members are in; other servers and the fabric between them out
        gpus = [v for v in nx.all_neighbors(graph, node) if graph.nodes[v].get("kind") == "gpu"]
        if gpus and not any(v in members for v in gpus):
            continue  # another GPU's own device
        keep.append(node)
    view = graph.subgraph(keep).copy()
    for node, i in members.items():
        view.nodes[node]["rank"] = i
    return view


class ServerIndex:
    """A graph's GPUs by rank and its nodes (with their data) by server, for
    :func:`communicator_view` over many groups of one graph."""

    def __init__(self, graph: nx.Graph):
        self.gpus = gpu_nodes(graph)
        self.nodes: dict[object, list[tuple[object, dict]]] = defaultdict(list)
        #: The nodes of every server (those with a server).
        self.nodes_in_servers: set[object] = set()
        for node, data in graph.nodes(data=True):
            server = data.get("server")
            if server is not None:
                self.nodes[server].append((node, data))
                self.nodes_in_servers.add(node)
        self.graph = graph
        self._signatures: dict[object, bytes | None] = {}
        self._position: dict[int, int] | None = None
        #: What a node or link adds to a server's signature, by its place and data
        #: (servers alike repeat the same few: formed once each).
        self._parts: dict[tuple, bytes] = {}

    def group_shape(self, ranks: list[int]) -> tuple | None:
        """A key equal for groups whose communicator views are the same up to the names
        of their servers: each rank's server (numbered in order of first appearance) and
        position in it, and each server's signature (its nodes and the links among them,
        every attribute but the server's name and its GPUs' ranks, which the view
        renumbers; nodes named by their place in it). None
        where a server's links reach outside it (then only the group itself is a key)."""
        if self._position is None:
            seen: dict[object, int] = defaultdict(int)
            self._position = {}
            for rank, node in enumerate(self.gpus):
                server = self.graph.nodes[node].get("server")
                self._position[rank] = seen[server]
                seen[server] += 1
        numbers: dict[object, int] = {}
        pattern = []
        for rank in ranks:
            server = self.graph.nodes[self.gpus[rank]].get("server")
            pattern.append((numbers.setdefault(server, len(numbers)), self._position[rank]))
        signatures = tuple(self._signature(server) for server in numbers)
        if any(sig is None for sig in signatures):
            return None
        return ("shape", tuple(pattern), signatures)

    def _signature(self, server: object) -> bytes | None:
        found = self._signatures.get(server, b"")
        if found != b"":
            return found
        members = self.nodes.get(server, [])
        place = {node: i for i, (node, _) in enumerate(members)}
        digest = hashlib.blake2b(digest_size=16)
        for node, data in members:
            # A GPU's rank is the group's position in the view (the pattern says it).
            digest.update(self._part(place[node], data, _RENAMED))
        signature: bytes | None = None
        inside = True
        in_servers = self.nodes_in_servers
        for node, _ in members:
            for other in nx.all_neighbors(self.graph, node):
                if other not in place and other in in_servers:
                    inside = False  # a link to another server's node: no shape key
        if inside:
            directed = self.graph.is_directed()
            for u, v, data in self.graph.edges([node for node, _ in members], data=True):
                if v in place:
                    ends = (place[u], place[v])
                    digest.update(self._part(ends if directed else tuple(sorted(ends)), data))
            signature = digest.digest()
        self._signatures[server] = signature
        return signature

    def _part(self, place: object, data: dict, leave: frozenset = frozenset()) -> bytes:
        """A node's or link's bytes in a server's signature: its ``place`` and its
        attributes but those in ``leave``, by name, each value by its repr."""
        try:
            # (Each value's type too: 1 and True, equal keys, have different reprs.)
            key = (place, tuple((k, type(v), v) for k, v in data.items() if k not in leave))
            found = self._parts.get(key)
        except TypeError:  # (an unhashable value: formed each time)
            key, found = None, None
        if found is None:
            attributes = sorted((k, repr(v)) for k, v in data.items() if k not in leave)
            found = repr((place, attributes)).encode()
            if key is not None:
                self._parts[key] = found
        return found


#: Node attributes a communicator view does not keep as they are (the server's name; the
#: GPUs' ranks, renumbered in group order): left out of a server's signature.
_RENAMED = frozenset({"server", "rank"})


def _ranges(ranks: list[int]) -> str:
    """Ranks as short ranges: ``0-7,16``.

    >>> _ranges([0, 1, 2, 3, 8, 10, 11])
    '0-3,8,10-11'
    """
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(f"{start}" if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts)
