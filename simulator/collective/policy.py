"""Policies: who chooses how a collective runs.

A policy turns (topology, operation, size) into a configuration (algorithm, protocol,
channels, chunks) and simulates it. ``nccl`` is what NCCL itself would run with its
defaults (:mod:`simulator.library.nccl`), ``hccl`` what Huawei's HCCL would run on Ascend
NPUs (:mod:`simulator.library.hccl`): the realistic prediction, and the command line's
default by the preset's ``library`` (:func:`library_of`). ``auto``
(:class:`~simulator.collective.tuner.AutoTuner`) is the best schedule ccsim can find by
simulation, an ideal scheduler rather than a library.

A policy object belongs to its caller: it caches per topology, never globally.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from ..algorithms import algorithm_names, build_schedule, get_algorithm
from ..algorithms.base import RankLayout
from ..algorithms.chain import ROOTED_OPS
from ..algorithms.nccl_p2p import busy_channels, works_per_batch
from ..algorithms.schedule import Schedule
from ..errors import CcsimError, unknown_choice
from ..library.hccl import OPS as HCCL_OPS
from ..library.hccl import HcclChoice, HcclSystem, hccl_choice, hccl_system, parse_hccl_algo
from ..library.nccl import (
    ALGORITHMS,
    LL_BANDWIDTH,
    LL_NVLINK_HOP_US,
    NVLINK_GBPS,
    NVLS_MAX_ARITY,
    PROTOCOLS,
    NcclChoice,
    NcclSystem,
    hop_scale,
    ll_channel_rate,
    nccl_choice,
    nccl_system,
    nvls_fill_factor,
    nvls_loops,
    nvls_sync_us,
    tree_correction,
)
from ..library.nccl_env import CHANNEL_VARIABLES, NcclEnv, parse_nccl_env
from ..library.nccl_p2p import DEFAULT_VERSION as P2P_DEFAULT_VERSION
from ..library.nccl_p2p import (
    channel_share,
    copy_out_us,
    p2p_call,
    pow2_up,
    proxy_share,
    version_rules,
)
from ..library.protocol import DEFAULT_PROTOCOLS, STEP_BYTES, Protocol, calibration_of
from .run import CollectiveResult, build_and_run, rank_layout, run_schedule
from .tuner import topology_key

#: Names accepted where an algorithm is, that ask a policy instead: the communication
#: libraries whose own choice ccsim reproduces.
POLICIES = ("nccl", "hccl")

#: Data bytes NCCL moves per pipeline step and channel: the library's STEP_BYTES, with
#: Simple tree at 512 KiB and NVLS at most NCCL_NVLS_CHUNKSIZE (enqueue.cc:2182-2321 at
#: v2.30.7).
PIPELINE_BYTES = STEP_BYTES
#: NCCL_NVLS_CHUNKSIZE's default (transport/nvls.cc:160 at v2.30.7).
NVLS_CHUNK = 128 * 1024
#: NVLS's chunk starts from one step of the Simple buffer, DEFAULT_BUFFSIZE 4 MiB over
#: NCCL_STEPS = 8 (init.cc:813, device.h:26; chunkSteps is 1 off Ring,
#: enqueue.cc:2222-2223) before NCCL_NVLS_CHUNKSIZE caps it (enqueue.cc:2263-2267):
#: a larger setting leaves NVLS at 512 KiB. NVLSTree takes the setting as it is.
NVLS_MAX_CHUNK = (4 << 20) // 8
#: Every chunk is rounded down to a multiple of the Simple grain (enqueue.cc:2321,
#: ``ncclProtoGrainSize``, device.h:328-333).
SIMPLE_GRAIN = 512
TREE_CHUNK = 512 * 1024
#: Each protocol's step data under NCCL's default buffers (LL 32 KiB, LL128 576,000 B,
#: Simple 512 KiB: :meth:`~simulator.library.nccl_env.NcclEnv.step_bytes`).
DEFAULT_STEPS = NcclEnv().steps()
#: A Ring/Simple slice is two steps (ALLREDUCE_SLICESTEPS = ALLGATHER_SLICESTEPS =
#: REDUCESCATTER_SLICESTEPS = NCCL_STEPS / 4, collectives.h at v2.30.7-1): what one
#: network message carries.
RING_SLICE_STEPS = 2
#: ccsim pipelines a step in at most this many chunks: past it the bandwidth term no
#: longer moves (a k-chunk pipeline is within (stages - 1)/k of its limit) and flows grow.
MAX_CHUNKS = 32
#: The same for each part of an all-to-all peer's message (nccl-p2p merges NCCL's chunks
#: beyond it, :data:`simulator.algorithms.nccl_p2p.MAX_CHUNKS`).
P2P_MAX_CHUNKS = 32
#: The deepest NVLSTree pipeline ccsim builds where asked to run NCCL's loop
#: (``NcclPolicy(nvls_tree_loops=True)``): NCCL's loop count at 16 GiB on 16 channels x 8
#: heads x 128 KiB chunks (the kernel loops over nHeads x chunkCount a channel,
#: src/device/all_reduce.h:535 and 562-632 at v2.30.7-1; the chunk, enqueue.cc:2276-2285).
#: A 16 GiB call on two 8-GPU servers then costs ~8.5 s of CPU and ~220 MB, against ~1.4 s
#: at 32 chunks.
NVLS_TREE_MAX_CHUNKS = 1024


@dataclass(frozen=True)
class Plan:
    """A library's choice for one call as a ccsim configuration: the schedule, its
    protocol (None: the ideal model), the library's channels, the chunks, the channels
    the schedule is built with, what to record of the choice, and the schedule's other
    build options (HCCL's ``intra``)."""

    schedule: str
    protocol: str | None
    channels: int
    chunks: int
    built: int
    params: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


class NcclPolicy:
    """NCCL's choice per call, simulated with ccsim's schedules and protocol model.

    Parameters
    ----------
    protocol : str or sequence of str, optional
        None or "auto": NCCL picks (its default); "LL", "LL128" or "Simple" forces one,
        a sequence of them lets NCCL pick among those, as NCCL_PROTO does. With ``env``'s
        NCCL_PROTO, each must be one it allows.
    channels : int, optional
        Force the channel count (as NCCL_MIN_CTAS = NCCL_MAX_CTAS); default NCCL's. With
        ``env``'s channel bounds, it must lie within them.
    chunks : int, optional
        Pipelining chunks per step of the ccsim schedule (default: NCCL's pipeline
        granularity, :func:`pipeline_chunks`).
    algorithms : sequence of str, optional
        NCCL algorithms allowed, as NCCL_ALGO does ("Ring", "Tree", "NVLS", "NVLSTree",
        "PAT"); default all. Given, it replaces ``env``'s NCCL_ALGO (NCCL forced to an
        algorithm, as ``ccsim compare`` runs it) while the rest of ``env`` applies.
    reduce_bandwidth : float, optional
        Bytes/s of local reductions (see :func:`simulator.simulate_collective`).
    env : NcclEnv or str, optional
        NCCL's environment settings (:mod:`simulator.library.nccl_env`): NCCL_ALGO,
        NCCL_PROTO, NCCL_NVLS_ENABLE and the channel bounds restrict every call's choice;
        NCCL_NVLS_CHUNKSIZE sets NVLS's and NVLSTree's chunk (:func:`nvls_chunk`).
    nvls_tree_loops : bool, optional
        Run NVLSTree's ccsim pipeline as deep as NCCL's loop (one chunk per loop of
        channels x heads x chunk, up to :data:`NVLS_TREE_MAX_CHUNKS`) rather than at most
        :data:`MAX_CHUNKS` deep. Off by default: deeper, ccsim's 2-server NVLSTree
        plateaus rise ~11% to the links' bound, above the measured ones (README, issue
        32), and a 16 GiB call costs ~6x the CPU.
    version : str, optional
        The NCCL version that runs: the send/receive rules the all-to-all follows
        ("2.28.7": LL below 16 KiB x channels per peer; default 2.30.7's rules,
        :mod:`simulator.library.nccl_p2p`), and the tuning figures of its release from
        v2.28.3 on (:func:`simulator.library.nccl.tuning_release`; earlier ones get
        2.30.7's).

    Examples
    --------
    >>> from simulator.topology import load_topology
    >>> policy = NcclPolicy()
    >>> graph = load_topology("dgx-h100")
    >>> [policy.choose(graph, "all_reduce", size).algorithm for size in (2**10, 2**30)]
    ['Ring', 'NVLS']
    """

    name = "nccl"

    def __init__(
        self,
        *,
        protocol: str | Sequence[str] | None = None,
        channels: int | None = None,
        chunks: int | None = None,
        reduce_bandwidth: float | None = None,
        algorithms: tuple[str, ...] | list[str] | None = None,
        env: NcclEnv | str | None = None,
        version: str | None = None,
        nvls_tree_loops: bool = False,
    ) -> None:
        self.nvls_tree_loops = bool(nvls_tree_loops)
        if version is not None:
            version_rules(version)  # a malformed version fails here
        self.version = version
        self.env = parse_nccl_env(env) if env is not None else NcclEnv()
        self.algorithms: tuple[str, ...] | None = None
        if algorithms is not None:
            names = {name.lower(): name for name in ALGORITHMS}
            unknown = [name for name in algorithms if str(name).lower() not in names]
            if unknown or not algorithms:
                raise unknown_choice("NCCL algorithm", (unknown or [""])[0], ALGORITHMS)
            self.algorithms = tuple(names[str(name).lower()] for name in algorithms)
        self.protocols = forced_protocols(protocol)
        if self.protocols is not None and self.env.protocols is not None:
            for function, allowed in self.env.protocols:
                if not set(self.protocols) & set(allowed):
                    raise CcsimError(
                        f"--proto {'/'.join(self.protocols)} disagrees with NCCL_PROTO="
                        f"{self.env.value('NCCL_PROTO')} (which allows {', '.join(allowed)} "
                        f"for {function}): give one of them"
                    )
        check_counts(channels=channels, chunks=chunks)
        if channels is not None and not self.env.allows_channels(channels):
            bounds = " ".join(
                f"{name}={value}" for name, value in self.env.settings if name in CHANNEL_VARIABLES
            )
            raise CcsimError(f"--channels {channels} disagrees with {bounds}: give one of them")
        self.channels = channels
        self.chunks = chunks
        self.reduce_bandwidth = reduce_bandwidth
        self._systems: dict[str, NcclSystem] = {}

    def env_for(self, system: NcclSystem | None) -> NcclEnv:
        """The settings in effect on ``system``: the user's over the defaults its network
        stack's vendor setup exports (:attr:`NcclSystem.stack_nccl`)."""
        if system is None or not system.stack_nccl:
            return self.env
        return self.env.over(system.stack_nccl)

    def allowed(
        self, op: str, system: NcclSystem | None = None
    ) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        """The algorithms and protocols NCCL may choose from for ``op`` (None: all):
        ``algorithms`` (else the env's NCCL_ALGO), NVLS removed where NCCL_NVLS_ENABLE=0
        (also done by :meth:`system`), and the forced protocols within NCCL_PROTO's; the
        env is :meth:`env_for` ``system``."""
        env = self.env_for(system)
        if self.algorithms is not None:
            algorithms: tuple[str, ...] | None = self.algorithms
        else:
            algorithms = env.algorithms_for(op)
        protocols = env.protocols_for(op)
        if self.protocols is not None:
            protocols = tuple(p for p in self.protocols if protocols is None or p in protocols)
        return algorithms, protocols

    def system(self, graph: nx.Graph) -> NcclSystem:
        """NCCL's view of ``graph`` (computed once per topology)."""
        key = topology_key(graph)
        if key not in self._systems:
            # NCCL_NVLS_ENABLE and the channel bounds act on the communicator itself.
            base = nccl_system(graph, self.version)
            self._systems[key] = self.env_for(base).apply(base)
        return self._systems[key]

    def choose(self, graph: nx.Graph, op: str, size_bytes: float) -> NcclChoice:
        """NCCL's algorithm, protocol and channels for this call."""
        system = self.system(graph)
        algorithms, protocols = self.allowed(op, system)
        return nccl_choice(
            system,
            op,
            float(size_bytes),
            algorithms=algorithms,
            protocols=protocols,
            settings=self.env_for(system).text,
            tuner=self.env_for(system).tuner,
        )

    def plan(self, system: NcclSystem | None, op: str, size_bytes: float) -> Plan:
        """NCCL's choice for one call on ``system`` as a ccsim configuration (all-to-all,
        which NCCL runs without its tuner, as grouped send/receive; with no system, the
        ideal ``direct`` exchange)."""
        if op == "all_to_all":
            return self._p2p_plan(system, float(size_bytes))
        assert system is not None
        algorithms, protocols = self.allowed(op, system)
        choice = nccl_choice(
            system,
            op,
            float(size_bytes),
            algorithms=algorithms,
            protocols=protocols,
            settings=self.env_for(system).text,
            tuner=self.env_for(system).tuner,
        )
        name = choice.schedule
        if name not in algorithm_names():  # the NCCL tree schedule, where missing
            name = "tree"
        channels = self.channels or choice.channels
        # NCCL_NVLS_CHUNKSIZE and the protocols' buffers (NCCL_BUFFSIZE, ...), where the
        # user (or the network stack's setup) sets them.
        env = self.env_for(system)
        nvls_bytes = env.nvls_chunk or NVLS_CHUNK
        steps = env.steps()
        # NCCL's NVLSTree loops over channels x heads x chunk: ~1,024 times a channel at
        # 16 GiB, where ccsim's schedule stops at MAX_CHUNKS and so pays more pipeline fill
        # (~3.7 chunk-times on two servers: 11% at 32 chunks) unless asked to go as deep.
        deep = self.nvls_tree_loops and choice.algorithm == "NVLSTree"
        chunks = self.chunks or pipeline_chunks(
            choice, op, float(size_bytes), system.ranks, channels, system.nodes, nvls_bytes,
            steps, max_chunks=NVLS_TREE_MAX_CHUNKS if deep else MAX_CHUNKS,
        )  # fmt: skip
        # ccsim's nvls and nvls-tree schedules already spread over every GPU's NVLinks
        # and NICs, so their channels are identical copies on the same links: one
        # carries the same bytes at the same rates (checked equal to 1e-12 in the tests)
        # with 1/C of the flows.
        built = 1 if get_algorithm(name).channels_are_copies else channels
        extra = {
            "nccl_algorithm": choice.algorithm,
            "nccl_time_us": choice.time_us,
            "bandwidth_factor": tree_correction(
                op, choice.algorithm, choice.protocol, float(size_bytes), system.arch
            ),
            "message_bytes": message_bytes(
                choice,
                float(size_bytes),
                system.ranks,
                channels,
                system.nodes,
                nvls_bytes,
                steps,
            ),
        }
        if choice.tuner_line:  # NCCL_TUNER_CONFIG_FILE's rule on this line chose
            extra["nccl_tuner_line"] = choice.tuner_line
        if choice.protocol == "LL":
            extra["channel_rate"] = ll_channel_rate(system, choice.algorithm, channels)
            if system.arch in LL_NVLINK_HOP_US:
                # A generation whose LL step over NVLink NCCL's one figure misses.
                extra["ll_nvlink_hop_s"] = LL_NVLINK_HOP_US[system.arch] * 1e-6
            if system.arch in LL_BANDWIDTH:
                extra["ll_bandwidth"] = LL_BANDWIDTH[system.arch]
        if choice.algorithm == "NVLS":
            heads = nvls_heads(system.ranks, system.nodes)
            if system.nodes == 1 and op == "all_reduce":
                # ccsim's pipeline is at most MAX_CHUNKS deep where NCCL's runs one loop
                # per channels x heads x chunk: give back the extra fill of the shorter one.
                deep = float(size_bytes) / (channels * heads * extra["message_bytes"])
                extra["bandwidth_factor"] *= nvls_fill_factor(chunks, deep)
            loops = nvls_loops(
                system, op, float(size_bytes), channels, heads, extra["message_bytes"]
            )
            if loops is not None:
                # NCCL's thread blocks, not the links, bound NVLS at middle sizes on
                # Blackwell: each loop costs at least one step of every role.
                extra["bandwidth_factor"] *= loops.factor
                extra["step_latency_s"] = loops.latency_us * 1e-6
            sync = nvls_sync_us(system, op, heads)
            if sync is not None:
                # An all-gather or reduce-scatter waits on the same every-rank counter
                # once before its first chunk lands: the call's floor.
                extra["step_latency_s"] = sync * 1e-6
        options: dict[str, Any] = {}
        if choice.algorithm == "NVLS" and system.nodes == 1 and op == "all_reduce":
            # Only NCCL's NVLS heads (at most 32) own rows and run the reduce-and-
            # multicast warps: on a 64- or 72-GPU rack each head's links carry 33/32 of
            # the buffer where every GPU a head would carry 73/72.
            heads = nvls_heads(system.ranks, system.nodes)
            if heads < system.ranks:
                options["heads"] = heads
                extra["nvls_heads"] = heads
        if choice.algorithm == "NVLSTree" and system.nvls is not None:
            # NCCL's NVLS heads: one per NIC, at most 32 (the NVLS search graph's
            # channels): on a 72-GPU rack 32 GPUs, and their NICs, carry the trees.
            heads = system.nvls.channels
            if heads < system.ranks // system.nodes:
                options["heads"] = heads
                extra["nvls_heads"] = heads
            if system.nvls_head_ranks:
                # The first GPU next to each NIC (simulator.library.nccl.nvls_head_ranks).
                options["head_ranks"] = system.nvls_head_ranks
        return Plan(name, choice.protocol, channels, chunks, built, extra, options)

    def _p2p_plan(self, system: NcclSystem | None, size_bytes: float) -> Plan:
        """NCCL's all-to-all: grouped send/receive to every peer (no tuner; NCCL_PROTO
        does not apply), run by the ``nccl-p2p`` schedule with NCCL's channels per
        peer, protocol and chunk (:mod:`simulator.library.nccl_p2p`). Without a system
        (callers that do not model NCCL's communicator) the ideal ``direct`` exchange."""
        if system is None:
            channels = self.channels or 1
            return Plan("direct", "Simple", channels, 1, channels)
        call = p2p_call(
            ranks=system.ranks, nodes=system.nodes, channels=system.channels,
            nvlinks=system.nvlinks, net_count=system.net_count, net_gbps=system.net_gbps,
            size_bytes=size_bytes, nvlink_gbps=NVLINK_GBPS[system.arch], version=self.version,
            steps=self.env_for(system).steps(), cpu=system.cpu,
            blackwell=system.arch == "blackwell",
        )  # fmt: skip
        parts = self.channels or call.channels
        per_part = size_bytes / system.ranks / parts
        if self.chunks is not None:
            chunks, options = self.chunks, {}
        else:
            chunks = int(min(P2P_MAX_CHUNKS, max(1, math.ceil(per_part / call.chunk_bytes))))
            options = {"chunk_bytes": call.chunk_bytes}
        options.update(
            p2p_channels=max(call.p2p_channels, pow2_up(parts)),
            group_size=call.group_size,
            pxn=system.nodes > 1,
        )
        params: dict[str, Any] = {
            "nccl_algorithm": "SendRecv",
            "message_bytes": call.chunk_bytes,
            "nccl_version": self.version or P2P_DEFAULT_VERSION,
        }
        if math.isfinite(call.channel_gbps):
            # A channel's rate, split among the peer works that share its batch.
            layout = RankLayout(system.ranks, tuple(np.arange(system.ranks) // int(system.ppn)))
            share = works_per_batch(layout, parts, options["p2p_channels"], call.group_size)
            params["channel_rate"] = call.channel_gbps * 1e9 / share
            if system.nodes > 1:
                # Through PXN a receiver's proxy posts the receives of a channel's
                # works with one irecv each group (up to 8): the proxy's cost per
                # message falls (simulator.library.nccl_p2p.proxy_share).
                params["proxy_scale"] = proxy_share(share)
            if system.nodes == 1 and call.protocol == "Simple" and system.nvlinks:
                # Within one NVLink domain a rank's busy channels, one thread block
                # each at NCCL's channel sizing, bound its sends below the links'
                # rate at middle sizes (few parts per peer, so few channels).
                busy = busy_channels(
                    layout, size_bytes, parts, options["p2p_channels"], call.group_size
                )
                link = system.nvlinks * NVLINK_GBPS[system.arch]
                params["bandwidth_factor"] = channel_share(busy, call.channel_gbps, link)
            if system.nodes == 1 and system.nvlinks:
                # The receivers copy a part's last chunk out after it is written, and a
                # call has its own cost (FITTED, simulator.library.nccl_p2p.P2P_COPY_GBPS).
                params["step_latency_s"] = copy_out_us(call, per_part) * 1e-6
        return Plan("nccl-p2p", call.protocol, parts, chunks, parts, params, options)

    def schedule(
        self, graph: nx.Graph, op: str, size_bytes: float, *, root: int = 0
    ) -> tuple[Schedule, str, dict[str, Any]]:
        """The schedule and protocol that run NCCL's choice, and what to record of it."""
        options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
        plan = self.plan(self.system(graph), op, size_bytes)
        schedule = build_schedule(
            plan.schedule,
            op,
            rank_layout(graph),
            float(size_bytes),
            chunks=plan.chunks,
            channels=plan.built,
            **options,
            **plan.options,
        )
        params = {"chunks": plan.chunks, "channels": plan.channels, **plan.params}
        return schedule, plan.protocol, params

    def simulate(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        *,
        root: int = 0,
        progress: Callable[[float], None] | None = None,
    ) -> CollectiveResult:
        """Simulate NCCL's choice; ``params`` record it (``nccl_algorithm``, ``protocol``,
        ``channels``, ``chunks`` and NCCL's own predicted time ``nccl_time_us``).
        ``progress`` is :func:`~simulator.collective.run.run_schedule`'s."""
        options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
        plan = self.plan(self.system(graph), op, size_bytes)
        params = {"chunks": plan.chunks, "channels": plan.channels, **plan.params}
        # Built and run as run_schedule would (a large symmetric schedule as its quotient).
        result = build_and_run(
            graph,
            plan.schedule,
            op,
            float(size_bytes),
            reduce_bandwidth=self.reduce_bandwidth,
            protocol=protocol_model(graph, plan.protocol, params),
            progress=progress,
            chunks=plan.chunks,
            channels=plan.built,
            **options,
            **plan.options,
        )
        result.params.update(policy="nccl", **params)
        return result


class HcclPolicy:
    """HCCL's choice per call (:mod:`simulator.library.hccl`), simulated with ccsim's
    schedules on the ideal line-rate model (HCCL has no LL / LL128 / Simple protocols).

    Parameters
    ----------
    algo : str, optional
        An HCCL_ALGO setting, such as ``"level0:NA;level1:ring"`` or
        ``"allreduce=level0:NA;level1:NHR"``; default HCCL chooses.
    channels, chunks : int, optional
        Force the ccsim schedule's channels or chunks (default: those of the choice).
    reduce_bandwidth : float, optional
        Bytes/s of local reductions (see :func:`simulator.simulate_collective`).
    rdma_lite : bool
        Whether the NPUs' RoCE has RDMA Lite, which lowers the size from which HCCL
        pipelines (default False, HCCL's own default).

    Examples
    --------
    >>> from simulator.topology import load_topology
    >>> policy = HcclPolicy()
    >>> graph = load_topology("ascend-910b", 2)
    >>> [policy.choose(graph, "all_reduce", size).algorithm for size in (2**20, 2**30)]
    ['fullmesh+ring', 'fullmesh+pipeline']
    """

    name = "hccl"

    def __init__(
        self,
        *,
        algo: str | None = None,
        channels: int | None = None,
        chunks: int | None = None,
        reduce_bandwidth: float | None = None,
        rdma_lite: bool = False,
    ) -> None:
        for op in HCCL_OPS:  # a bad setting fails before anything is simulated
            parse_hccl_algo(algo, op)
        check_counts(channels=channels, chunks=chunks)
        self.algo = algo
        self.channels = channels
        self.chunks = chunks
        self.reduce_bandwidth = reduce_bandwidth
        self.rdma_lite = rdma_lite
        self._systems: dict[str, HcclSystem] = {}

    def system(self, graph: nx.Graph) -> HcclSystem:
        """HCCL's view of ``graph`` (computed once per topology)."""
        key = topology_key(graph)
        if key not in self._systems:
            self._systems[key] = hccl_system(graph, rdma_lite=self.rdma_lite)
        return self._systems[key]

    def choose(self, graph: nx.Graph, op: str, size_bytes: float) -> HcclChoice:
        """HCCL's algorithm for this call and the ccsim schedule that runs it."""
        return hccl_choice(self.system(graph), op, float(size_bytes), algo=self.algo)

    def plan(self, system: HcclSystem, op: str, size_bytes: float) -> Plan:
        """HCCL's choice for one call on ``system`` as a ccsim configuration (no
        protocol: HCCL runs on the ideal line-rate model)."""
        choice = hccl_choice(system, op, float(size_bytes), algo=self.algo)
        channels = self.channels or choice.channels
        chunks = self.chunks or choice.chunks
        params = {
            "hccl_algorithm": choice.algorithm, "hccl_executor": choice.executor,
            "hccl_loops": choice.loops,
        }  # fmt: skip
        return Plan(choice.schedule, None, channels, chunks, channels, params, choice.options)

    def simulate(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        *,
        root: int = 0,
        progress: Callable[[float], None] | None = None,
    ) -> CollectiveResult:
        """Simulate HCCL's choice; ``params`` record it (``hccl_algorithm`` as HCCL names
        it, ``hccl_executor``, ``hccl_loops`` through its buffer, ``channels``,
        ``chunks``, and ``intra``, how a two-level schedule runs level0: "mesh" or
        "ring"). ``root`` is accepted for symmetry; HCCL's modelled operations have
        none. ``progress`` is :func:`~simulator.collective.run.run_schedule`'s."""
        plan = self.plan(self.system(graph), op, size_bytes)
        schedule = build_schedule(
            plan.schedule, op, rank_layout(graph), float(size_bytes), chunks=plan.chunks,
            channels=plan.built, **plan.options,
        )  # fmt: skip
        result = run_schedule(
            graph, schedule, reduce_bandwidth=self.reduce_bandwidth, progress=progress
        )
        result.params.update(
            policy="hccl", **plan.params, channels=plan.channels, chunks=plan.chunks,
            **plan.options,
        )  # fmt: skip
        return result


def check_counts(**counts: int | None) -> None:
    """Channel and chunk counts given to a policy are positive integers (or None)."""
    for what, value in counts.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise CcsimError(f"{what} must be a positive integer, got {value!r}")


def forced_protocols(protocol: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """The protocols ``--proto`` lets NCCL choose from: None ("auto" or not given), or
    NCCL's names, in its order.

    >>> forced_protocols("simple"), forced_protocols(["LL128", "LL"]), forced_protocols("auto")
    (('Simple',), ('LL', 'LL128'), None)
    """
    if protocol is None or (isinstance(protocol, str) and protocol.lower() == "auto"):
        return None
    names = [protocol] if isinstance(protocol, str) else list(protocol)
    lower = {name.lower(): name for name in PROTOCOLS}
    for name in names:
        if str(name).lower() not in lower:
            raise unknown_choice("protocol", name, (*PROTOCOLS, "auto"))
    if not names:
        raise unknown_choice("protocol", "", (*PROTOCOLS, "auto"))
    chosen = {lower[str(name).lower()] for name in names}
    return tuple(name for name in PROTOCOLS if name in chosen)


def nccl_not_applied(algorithm: str) -> str:
    """The message refusing NCCL settings for an algorithm not chosen by NCCL."""
    return (
        f"NCCL settings (--nccl) restrict NCCL's own choice (--algo nccl, the default on "
        f"NVIDIA presets), not --algo {algorithm}: leave one of them out"
    )


def library_of(graph: nx.Graph) -> str:
    """The communication library a topology runs: its ``library`` attribute (a preset's
    ``library:`` key; the Ascend presets say hccl), else nccl.

    >>> from simulator.topology import load_topology
    >>> library_of(load_topology("ascend-910b")), library_of(load_topology("dgx-a100"))
    ('hccl', 'nccl')
    """
    name = graph.graph.get("library", "nccl")
    if name not in POLICIES:
        where = graph.graph.get("name", "the topology")
        raise unknown_choice(f"library of {where}", name, POLICIES)
    return name


def library_policy(
    name: str,
    graph: nx.Graph,
    *,
    protocol: str | None = None,
    channels: int | str | None = None,
    chunks: int | str | None = None,
    reduce_bandwidth: float | None = None,
    nccl: NcclEnv | str | None = None,
    nvls_tree_loops: bool = False,
) -> NcclPolicy | HcclPolicy:
    """The policy ``name`` (one of :data:`POLICIES`) for ``graph``; channels or chunks
    None or "auto" leave them to the library; ``nccl`` holds NCCL's environment settings
    (:func:`~simulator.library.nccl_env.parse_nccl_env`), refused for HCCL;
    ``nvls_tree_loops`` is :class:`NcclPolicy`'s (ignored for HCCL, which has no NVLSTree). NCCL is
    refused where the topology's library is another (it runs on NVIDIA GPUs only), as
    HCCL is off Ascend NPUs.

    >>> from simulator.topology import load_topology
    >>> library_policy("nccl", load_topology("ascend-910"))
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: NCCL runs on NVIDIA GPUs only; ascend-910 runs hccl: ask ...
    """
    if name not in POLICIES:
        raise unknown_choice("policy", name, POLICIES)
    library = library_of(graph)
    if name == "nccl" and library != "nccl":
        where = graph.graph.get("name", "this topology")
        raise CcsimError(
            f"NCCL runs on NVIDIA GPUs only; {where} runs {library}: ask for {library} "
            f"(--algo {library}, its default)"
        )
    channels = None if channels in (None, "auto") else channels
    chunks = None if chunks in (None, "auto") else chunks
    env = parse_nccl_env(nccl) if nccl is not None else NcclEnv()
    if name == "nccl":
        return NcclPolicy(
            protocol=protocol,
            channels=channels,
            chunks=chunks,
            reduce_bandwidth=reduce_bandwidth,
            env=env,
            version=env.version,
            nvls_tree_loops=nvls_tree_loops,
        )
    if env:
        raise CcsimError(
            f"NCCL settings ({env.text or f'version {env.version}'}) apply to NCCL; HCCL "
            "runs here: leave out --nccl and --nccl-version"
        )
    if protocol not in (None, "auto"):
        raise CcsimError(
            "HCCL has no LL / LL128 / Simple protocols: --proto applies to nccl and to "
            "algorithms run as given"
        )
    return HcclPolicy(channels=channels, chunks=chunks, reduce_bandwidth=reduce_bandwidth)


def protocol_model(graph: nx.Graph, protocol: str, params: dict[str, Any]) -> str | Protocol:
    """The protocol a planned NCCL call runs with: the topology's constants (a ring's),
    with the per-hop latencies scaled to the plan's algorithm as NCCL's latency table
    does (:func:`simulator.library.nccl.hop_scale`) and the share of line rate by the
    plan's ``bandwidth_factor`` (NCCL's own correction of its Tree at middle sizes,
    :func:`simulator.library.nccl.tree_correction`)."""
    factor = float(params.get("bandwidth_factor", 1.0))
    algorithm = params.get("nccl_algorithm")
    scale = hop_scale(algorithm, protocol) if algorithm in ALGORITHMS else {}
    proto = calibration_of(graph).protocol(protocol)
    message = float(params.get("message_bytes", proto.message_bytes))
    hop_s = dict(proto.hop_s)
    if "ll_nvlink_hop_s" in params and hop_s["nvlink"] == DEFAULT_PROTOCOLS["LL"].hop_s["nvlink"]:
        # The generation's LL step over NVLink, unless the preset sets its own.
        hop_s["nvlink"] = float(params["ll_nvlink_hop_s"])
    share = proto.bandwidth
    if "ll_bandwidth" in params and share == DEFAULT_PROTOCOLS["LL"].bandwidth:
        share = float(params["ll_bandwidth"])
    hops = {cls: value * scale.get(cls, 1.0) for cls, value in hop_s.items()}
    return dataclasses.replace(
        proto,
        proxy_s=proto.proxy_s * float(params.get("proxy_scale", 1.0)),
        base_s=proto.base_s + float(params.get("step_latency_s", 0.0)),
        bandwidth=share * factor,
        hop_s=hops,
        message_bytes=message,
        net_floor=algorithm not in ALGORITHMS or algorithm == "Ring",
        channel_rate=float(params.get("channel_rate", math.inf)),
    )


def pipeline_chunks(
    choice: NcclChoice,
    op: str,
    size_bytes: float,
    ranks: int,
    channels: int,
    nodes: int = 1,
    nvls_bytes: int = NVLS_CHUNK,
    steps: Mapping[str, int] | None = None,
    max_chunks: int = MAX_CHUNKS,
) -> int:
    """Chunks per step of the ccsim schedule: the data one channel moves in one step of
    the algorithm, cut at NCCL's pipeline granularity (at most ``max_chunks``, by default
    :data:`MAX_CHUNKS`); ``nvls_bytes`` is NCCL_NVLS_CHUNKSIZE (:func:`nvls_chunk`),
    ``steps`` the data of a protocol's step
    (:meth:`~simulator.library.nccl_env.NcclEnv.steps`; None: NCCL's default buffers).
    For NVLS and NVLSTree that is NCCL's loop count: a channel's share of the call over
    heads x chunk.

    >>> from simulator.library.nccl import NcclChoice
    >>> pipeline_chunks(NcclChoice("NVLS", "Simple", 16, 640, 0.0), "all_reduce", 2**30, 8, 16)
    32
    >>> pipeline_chunks(NcclChoice("Ring", "LL", 1, 96, 0.0), "all_reduce", 8, 8, 1)
    1
    >>> pipeline_chunks(NcclChoice("NVLSTree", "Simple", 16, 640, 0.0), "all_reduce", 2**34,
    ...                 16, 16, 2, max_chunks=NVLS_TREE_MAX_CHUNKS)
    1024
    """
    if choice.algorithm in ("NVLS", "NVLSTree"):
        step = size_bytes / (channels * nvls_heads(ranks, nodes))
    elif choice.algorithm == "Tree":
        step = size_bytes / (2 * channels)  # two trees, each half the data
    else:
        per_rank = ranks if op in ("all_reduce", "all_gather", "reduce_scatter") else 1
        step = size_bytes / (channels * per_rank)
    grain = message_bytes(choice, size_bytes, ranks, channels, nodes, nvls_bytes, steps)
    return int(min(max_chunks, max(1, math.ceil(step / grain))))


def message_bytes(
    choice: NcclChoice,
    size_bytes: float,
    ranks: int,
    channels: int,
    nodes: int = 1,
    nvls_bytes: int = NVLS_CHUNK,
    steps: Mapping[str, int] | None = None,
) -> float:
    """The data one NCCL step carries for this call: its pipeline grain, and what one
    network message holds (enqueue.cc:2182-2477 at v2.30.7; Ring/Simple sends a slice
    of two steps, :data:`RING_SLICE_STEPS`); NVLS and NVLSTree by NCCL_NVLS_CHUNKSIZE =
    ``nvls_bytes``; ``steps`` is each protocol's step data under the connection buffers
    the user sets (NCCL_BUFFSIZE, ...; None: :data:`DEFAULT_STEPS`).

    >>> from simulator.library.nccl import NcclChoice
    >>> message_bytes(NcclChoice("Ring", "Simple", 24, 544, 0.0), 2**30, 16, 24, 2)
    1048576.0
    >>> message_bytes(NcclChoice("Tree", "Simple", 24, 544, 0.0), 2**30, 16, 24, 2,
    ...               steps={"LL": 32768, "LL128": 576000, "Simple": 2 * 2**20})
    2097152.0
    """
    steps = DEFAULT_STEPS if steps is None else steps
    if choice.algorithm in ("NVLS", "NVLSTree"):
        ops = channels * nvls_heads(ranks, nodes)
        return nvls_chunk(choice.algorithm, size_bytes, ops, nvls_bytes, steps["Simple"])
    if choice.algorithm == "Tree":
        if choice.protocol == "LL128":
            return tree_ll128_chunk(size_bytes, channels, ranks, nodes, steps["LL128"])
        return float(steps[choice.protocol])
    if choice.protocol == "Simple":
        return float(RING_SLICE_STEPS * steps["Simple"])
    return float(steps[choice.protocol])


def nvls_heads(ranks: int, nodes: int) -> int:
    """NCCL's NVLS heads: every GPU of a server (one NIC each), at most
    NCCL_MAX_NVLS_ARITY = 32 (include/device.h:213, search.cc:1126-1127 at v2.30.7), so a
    72-GPU NVL72 rack has 32.

    >>> nvls_heads(16, 2), nvls_heads(72, 1)
    (8, 32)
    """
    return min(ranks // nodes, NVLS_MAX_ARITY)


def nvls_chunk(
    algorithm: str,
    size_bytes: float,
    ops: int,
    setting: int = NVLS_CHUNK,
    simple_step: int = NVLS_MAX_CHUNK,
) -> float:
    """NCCL's NVLS / NVLSTree chunk for a call of ``size_bytes`` run as ``ops`` =
    channels x heads pieces, under NCCL_NVLS_CHUNKSIZE = ``setting`` (default 128 KiB):
    NVLS starts from one Simple step (:data:`NVLS_MAX_CHUNK`, 512 KiB) cut to the
    setting, NVLSTree from the setting itself; both are then cut while a piece would
    get too few chunks (enqueue.cc:2258-2285 at v2.30.7) and rounded down to the Simple
    grain (enqueue.cc:2321). NVLSTree's own ceiling (nvlsTreeMaxChunkSize) is not
    followed (:data:`simulator.library.nccl.NVLS_CHANNELS` says why).

    A larger setting raises the size below which the chunk is cut: NCCL compares the
    call with 64 x ops x chunk, so 8 B200s (24 channels x 8 heads) keep 64 KiB chunks
    up to 1.5 GiB by default and up to 6 GiB with 512 KiB.

    >>> nvls_chunk("NVLS", 2**30, 128), nvls_chunk("NVLS", 2**20, 128)
    (131072.0, 16384.0)
    >>> nvls_chunk("NVLSTree", 64 * 2**20, 128), nvls_chunk("NVLSTree", 4 * 2**20, 128)
    (131072.0, 32768.0)
    >>> nvls_chunk("NVLS", 2**31, 192), nvls_chunk("NVLS", 2**31, 192, 524288)
    (131072.0, 65536.0)
    >>> nvls_chunk("NVLS", 2**34, 192, 2**20), nvls_chunk("NVLSTree", 2**34, 192, 2**20)
    (524288.0, 1048576.0)
    """
    start = min(simple_step, setting) if algorithm == "NVLS" else setting
    chunk = float(start)
    if algorithm == "NVLS":
        caps = ((64, 65536), (8, 32768), (2, 16384))
    else:
        caps = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
    # Each test compares with the chunk as the tests before it left it (NCCL lowers
    # chunkSize in place), not with the chunk it started from.
    for factor, cap in caps:
        if size_bytes < factor * ops * chunk and chunk > cap:
            chunk = float(cap)
    return float(int(chunk) // SIMPLE_GRAIN * SIMPLE_GRAIN)


def tree_ll128_chunk(
    size_bytes: float, channels: int, ranks: int, nodes: int, step: int = 576_000
) -> float:
    """NCCL's Tree/LL128 chunk: one LL128 step (``step``, 576,000 B of data by default)
    halved while a channel would get too few chunks to fill the tree's pipeline
    (enqueue.cc:2286-2294 at v2.30.7).

    >>> tree_ll128_chunk(4 * 2**20, 16, 16, 2)
    36000.0
    """
    ppn = ranks / nodes
    depth = 1 + int(math.log2(nodes)) + 0.1 * ppn
    chunk = float(step)
    while size_bytes / (channels * chunk) < depth * 64 / ppn and chunk > 131072:
        chunk /= 2
    while size_bytes / (channels * chunk) < depth * 16 / ppn and chunk > 32768:
        chunk /= 2
    return chunk
