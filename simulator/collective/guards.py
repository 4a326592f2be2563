"""Resource guards: how many flows a run will create, estimated from its inputs before
anything is built, and a one-line refusal past a limit.

A run's memory grows with the flows it creates (one per transfer of a schedule, about
:data:`BYTES_PER_FLOW` bytes each with its records), with its topology graph and with the
ops of a workload trace. Every figure here is counted in flows: a node or link of the
topology is :data:`GRAPH_ITEM_FLOWS` of them, a trace op :data:`OP_FLOWS`, a sweep point
:data:`POINT_FLOWS`. The estimate is made from the inputs alone (ranks, chunks, channels,
sizes, the library's choice per size), building at most two servers of the topology and
schedules of a few servers, so that ``--chunks 100000000`` or ``--nodes 100000`` is
refused in a fraction of a second instead of running until memory runs out.

The limit is ``--max-flows N``, else the environment variable ``CCSIM_MAX_FLOWS``, else
:func:`default_max_flows`: a quarter of this machine's physical memory at
:data:`BYTES_PER_FLOW` bytes a flow.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from ..algorithms import algorithm_names, build_schedule, get_algorithm
from ..algorithms.base import RankLayout
from ..errors import CcsimError
from ..library.nccl_env import NcclEnv
from ..topology import load_topology
from ..topology.graph import gpu_nodes
from ..topology.presets import preset_size
from .policy import POLICIES, HcclPolicy, NcclPolicy, library_of, library_policy
from .run import rank_layout
from .tuner import CHANNEL_CANDIDATES, CHUNK_CANDIDATES

#: Memory a flow costs, in bytes: measured 160 B per flow for a 1.1-million-flow ring
#: all-reduce (its schedule arrays, the flow while it runs, its row of results), rounded
#: up for the protocol model's and the workload replay's extra records.
BYTES_PER_FLOW = 200
#: Share of physical memory the default limit lets flows take; the rest is headroom for
#: Python, the libraries, the allocator's slack above the measured sizes, and what else
#: the machine runs (a half let ``--nodes 100000`` build a 12 GB topology for minutes on
#: a shared 24 GiB machine).
MEMORY_SHARE = 0.25
#: The limit where physical memory cannot be read: 200 M flows, 40 GB at 200 B a flow.
FALLBACK_MAX_FLOWS = 200_000_000
#: The environment variable that sets the limit when ``--max-flows`` is not given.
ENVIRONMENT = "CCSIM_MAX_FLOWS"
#: A node or link of the topology, in flows: 400 B measured per item in networkx, 1.8 KB
#: each at the peak of a run on 3,000 dgx-a100 servers (routes and the flow network's
#: per-link state) and 2.4 KB at the peak of ``topology show`` on 10,000 (its bisection
#: cut), rounded up to 3 KB.
GRAPH_ITEM_FLOWS = 15
#: An op of a workload trace, in flows: about 1 KB while it is generated or read.
OP_FLOWS = 5
#: A point of a sweep, in flows: its resolved scenario, key and result row, about 2 KB.
POINT_FLOWS = 10
#: Transfers of larger runs are extrapolated from schedules built on this many units
#: (servers, or blocks of :data:`UNIT_RANKS` ranks): exact for counts quadratic in them.
FIT_UNITS = (1, 2, 4)
#: Ranks per unit of the fit where servers are unknown or large.
UNIT_RANKS = 8
#: Chunks an ``auto`` search may build at the most.
MAX_CHUNKS = max(CHUNK_CANDIDATES)


class ResourceError(CcsimError):
    """A run would create more flows than the limit allows."""


@dataclass(frozen=True)
class Estimate:
    """Flows a run would create at its peak, and what they are (for the message)."""

    flows: int
    what: str

    def plus(self, other: Estimate) -> Estimate:
        """This estimate and what it runs on (``other``: the topology)."""
        return Estimate(self.flows + other.flows, f"{self.what}, on {other.what}")


def largest(estimates: Iterable[Estimate], *, empty: str = "nothing to run") -> Estimate:
    """The estimate with the most flows (runs that happen one after another)."""
    return max(estimates, key=lambda e: e.flows, default=Estimate(0, empty))


def memory_bytes() -> int | None:
    """Physical memory of this machine in bytes, or None where it cannot be read."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def default_max_flows() -> int:
    """The limit when none is given: :data:`MEMORY_SHARE` of physical memory at
    :data:`BYTES_PER_FLOW` bytes a flow (32 M flows on a 24 GiB machine), else
    :data:`FALLBACK_MAX_FLOWS`."""
    memory = memory_bytes()
    if memory is None:
        return FALLBACK_MAX_FLOWS
    return max(1_000_000, int(memory * MEMORY_SHARE / BYTES_PER_FLOW))


def flow_limit(max_flows: int | None = None) -> tuple[int, str]:
    """The limit in force and where it comes from: ``max_flows`` (``--max-flows``), else
    :data:`ENVIRONMENT`, else :func:`default_max_flows`."""
    if max_flows is not None:
        if isinstance(max_flows, bool) or not isinstance(max_flows, int) or max_flows < 1:
            raise CcsimError(f"--max-flows must be a positive integer, got {max_flows!r}")
        return max_flows, "--max-flows"
    text = os.environ.get(ENVIRONMENT, "").strip()
    if text:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            value = 0
        if value < 1:
            raise CcsimError(f"{ENVIRONMENT} must be a positive integer, got {text[:40]!r}")
        return value, ENVIRONMENT
    memory = memory_bytes()
    if memory is None:
        return FALLBACK_MAX_FLOWS, "the default"
    return default_max_flows(), f"the default, a quarter of {memory / 2**30:.0f} GiB of memory"


def check_flows(estimate: Estimate, max_flows: int | None = None) -> Estimate:
    """Raise :class:`ResourceError` if ``estimate`` is past the limit; else return it.

    >>> check_flows(Estimate(10, "a tiny run"), 100).flows
    10
    >>> try:
    ...     check_flows(Estimate(10**9, "all_reduce on 8 ranks"), 100)
    ... except ResourceError as error:
    ...     print(str(error)[:74])
    all_reduce on 8 ranks: about 1,000,000,000 flows (186 GiB at 200 B a flow)
    """
    limit, source = flow_limit(max_flows)
    if estimate.flows > limit:
        raise ResourceError(
            f"{estimate.what}: about {estimate.flows:,} flows "
            f"({estimate.flows * BYTES_PER_FLOW / 2**30:,.0f} GiB at {BYTES_PER_FLOW} B a "
            f"flow), past the limit of {limit:,} ({source}); ask for less, or raise the "
            f"limit with --max-flows N or {ENVIRONMENT}=N"
        )
    return estimate


def transfers(algorithm: str, op: str, ranks: int, per_server: int | None = None) -> int:
    """Transfers of one chunk on one channel of ``algorithm``'s ``op`` on ``ranks`` ranks
    (``per_server`` a server, or unknown): counted on the schedule where it has at most
    4 units (servers, or blocks of 8 ranks), else extrapolated quadratically from
    schedules of 1, 2 and 4 units (2, 4 and 8 for algorithms that need 2 servers). 0
    where the algorithm cannot run ``op`` there.

    >>> transfers("ring", "all_reduce", 800_000, 8) == 2 * 800_000 * 799_999
    True
    >>> transfers("chain-tree", "all_reduce", 64, 8)
    252
    """
    unit = per_server if per_server and ranks % per_server == 0 and per_server <= 64 else 0
    size = unit or UNIT_RANKS

    def count(n: int) -> int:
        layout = RankLayout(n, tuple(r // unit for r in range(n)) if unit else None)
        options = {"fraction": 0.5} if algorithm == "multipath" else {}
        try:
            return build_schedule(algorithm, op, layout, float(n) * 2**20, **options).n_ops
        except CcsimError:
            return 0

    if ranks <= FIT_UNITS[-1] * size:
        return count(ranks)
    units = FIT_UNITS
    points = [(x, count(x * size)) for x in units]
    if points[0][1] == 0 and ranks > 2 * units[-1] * size:  # e.g. it needs 2 servers
        units = tuple(2 * x for x in units)
        points = [(x, count(x * size)) for x in units]
    points = [(x, c) for x, c in points if c]
    if len(points) < 3:  # runs only at some sizes: a power law through the largest two
        if len(points) < 2:
            return points[-1][1] if points else 0
        (x1, c1), (x2, c2) = points[-2:]
        return math.ceil(c2 * (ranks / (x2 * size)) ** (math.log(c2 / c1) / math.log(x2 / x1)))
    (x1, c1), (x2, c2), (x3, c3) = points
    x = ranks / size
    value = (
        c1 * (x - x2) * (x - x3) / ((x1 - x2) * (x1 - x3))
        + c2 * (x - x1) * (x - x3) / ((x2 - x1) * (x2 - x3))
        + c3 * (x - x1) * (x - x2) / ((x3 - x1) * (x3 - x2))
    )
    return max(c3, math.ceil(value))


def call_transfers(algorithm: str, op: str, ranks: int, per_server: int | None = None) -> int:
    """:func:`transfers` of one call; for ``auto``, or an algorithm that cannot run
    ``op`` there (a workload then falls back to one that can), the largest of the
    algorithms that implement ``op``.

    >>> call_transfers("auto", "all_reduce", 8) >= transfers("ring", "all_reduce", 8)
    True
    """
    count = 0 if algorithm == "auto" else transfers(algorithm, op, ranks, per_server)
    names = (name for name in algorithm_names() if op in get_algorithm(name).ops)
    return count or max((transfers(name, op, ranks, per_server) for name in names), default=0)


@dataclass(frozen=True)
class Cluster:
    """A topology's size, known before it is built: ranks, ranks per server, servers
    and graph items (nodes plus links)."""

    ranks: int
    per_server: int | None
    servers: int
    items: int
    topology: str | Path | nx.Graph
    fabric: str | None = None
    library: str = "nccl"
    #: Builds the topology on n servers, where it is not ``topology`` as
    #: :func:`~simulator.topology.load_topology` reads it (a sweep's edited preset).
    build: Callable[[int], nx.Graph] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    def estimate(self) -> Estimate:
        """The topology's share of a run's memory, in flows."""
        return _topology_estimate(self.topology, self.ranks, self.servers, self.items)

    def proxy(self) -> nx.Graph:
        """The topology on at most 2 servers: what a library sees of the whole."""
        servers = min(self.servers, 2)
        if self.build is not None:
            return self.build(servers)
        return load_topology(self.topology, servers, fabric=self.fabric)


def cluster_of(
    topology: str | Path | nx.Graph,
    nodes: int | None = None,
    *,
    fabric: str | None = None,
    max_flows: int | None = None,
) -> Cluster:
    """The size of ``topology`` on ``nodes`` servers. A preset's servers are first
    counted from its numbers (:func:`~simulator.topology.presets.preset_size`) and
    refused past the limit (:func:`check_flows` with ``max_flows``) before any is built;
    then one server is built alone and, for more, 2 and 4 of them, whose difference is
    what each further server adds with its share of the fabric (a graph or graph file is
    read whole: its size is the file's).

    >>> cluster_of("dgx-a100", 3000).items  # 41 a server (33, and 8 of the fabric's), 1 spine
    123001
    """
    rough = preset_size(topology)
    return sized_cluster(
        lambda n: load_topology(topology, n, fabric=fabric),
        nodes,
        topology=topology,
        fabric=fabric,
        server=rough,
        max_flows=max_flows,
        edited=False,
    )


def sized_cluster(
    build: Callable[[int], nx.Graph],
    nodes: int | None,
    *,
    topology: str | Path | nx.Graph,
    fabric: str | None = None,
    server: tuple[int, int] | None = None,
    max_flows: int | None = None,
    edited: bool = True,
) -> Cluster:
    """The :class:`Cluster` that ``build(n)`` makes on ``nodes`` servers (see
    :func:`cluster_of`): ``server`` (GPUs, nodes plus links of one server, counted from
    the preset's numbers) is checked first; ``topology`` names it in messages and, unless
    ``edited``, is what the cluster's library proxy loads (else ``build`` is kept)."""
    nodes = 1 if nodes is None else nodes
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise CcsimError(f"--nodes must be a positive integer, got {nodes!r}")
    if server is not None:
        gpus, per_server = server
        estimate = _topology_estimate(topology, gpus * nodes, nodes, per_server * nodes)
        check_flows(estimate, max_flows)
    one = build(1)
    per = len(gpu_nodes(one))
    items = _items(one)
    if nodes > 1:
        built = {n: _items(build(n)) for n in {min(nodes, 4), 2}}
        if nodes <= 4:
            items = built[nodes]
        else:  # each further server adds what the third and fourth did
            items = built[4] + (nodes - 4) * math.ceil((built[4] - built[2]) / 2)
    layout = rank_layout(one)
    per_server = per if nodes > 1 else layout.ranks_per_server()
    return Cluster(
        per * nodes,
        per_server,
        nodes,
        items,
        topology,
        fabric,
        library_of(one),
        build if edited else None,
    )


def _items(graph: nx.Graph) -> int:
    return graph.number_of_nodes() + graph.number_of_edges()


def _topology_estimate(
    topology: str | Path | nx.Graph, ranks: int, servers: int, items: int
) -> Estimate:
    """A topology's estimate, its message naming the preset or file (the input to lower)."""
    name = "" if isinstance(topology, nx.Graph) else f"{Path(str(topology)).name}: "
    what = f"a topology of {ranks:,} GPUs" + (f" ({servers:,} servers)" if servers > 1 else "")
    return Estimate(items * GRAPH_ITEM_FLOWS, name + what)


def collective_estimate(
    cluster: Cluster,
    op: str,
    sizes: Sequence[float],
    algorithm: str,
    *,
    chunks: int | str | None = 1,
    channels: int | str | None = 1,
    protocol: str | None = None,
    nccl: NcclEnv | str | None = None,
    memo: dict[tuple, int] | None = None,
    nvls_tree_loops: bool = False,
) -> Estimate:
    """Flows of the largest of one collective's runs over ``sizes`` on ``cluster``, with
    its topology: ``algorithm`` run as given, a library policy (its choice at each size,
    under NCCL's settings ``nccl``), or ``auto`` (the largest candidate the search may
    build). ``memo`` keeps the transfers counted across calls (a sweep estimating each of
    its points); ``nvls_tree_loops`` is :class:`~.policy.NcclPolicy`'s."""
    ranks, per = cluster.ranks, cluster.per_server
    where = f"{op} on {ranks:,} ranks"
    counted = {} if memo is None else memo

    def count(name: str, function: Callable[..., int] = transfers) -> int:
        key = (function.__name__, name, op, ranks, per)
        if key not in counted:
            counted[key] = function(name, op, ranks, per)
        return counted[key]

    if algorithm in POLICIES:
        runs = _library_runs(
            cluster, op, sizes, algorithm, chunks, channels, protocol, nccl, nvls_tree_loops
        )
        found = largest(
            Estimate(
                count(name) * k * c,
                f"{where} at {size:,.0f} B as {algorithm} runs it ({name}, {k} chunks, "
                f"{c} channels)",
            )
            for size, name, k, c in runs
        )
    else:
        k = MAX_CHUNKS if chunks == "auto" else int(chunks or 1)
        c = max(CHANNEL_CANDIDATES) if channels == "auto" else int(channels or 1)
        name = "the largest candidate of auto" if algorithm == "auto" else algorithm
        flows = count(algorithm, call_transfers) * k * c
        orbit = symmetric_orbit(algorithm, op, cluster)
        found = Estimate(
            flows // orbit,
            f"{where} ({name}, {k} chunks, {c} channels"
            + (f"; symmetric ranks simulated once, 1 in {orbit}" if orbit > 1 else "")
            + ")",
        )
    return found.plus(cluster.estimate())


def symmetric_orbit(algorithm: str, op: str, cluster: Cluster) -> int:
    """How many ranks each simulated rank stands for when ``algorithm`` builds its
    quotient directly on ``cluster`` (:func:`simulator.collective.run.build_and_run`):
    the ring repeats every two servers (its direction alternates), the hierarchical
    all-reduce every server; 1 otherwise. Whether the network is symmetric is known
    only once it is built; where it is not, the run refuses past a fixed size.

    >>> symmetric_orbit("hierarchical", "all_reduce", cluster_of("dgx-h100", 64))
    64
    >>> symmetric_orbit("ring", "all_reduce", cluster_of("dgx-h100", 64))
    32
    """
    period = {"hierarchical": 1, "ring": 2}.get(algorithm)
    if period is None or cluster.servers < 2 * period or cluster.servers % period:
        return 1
    if (algorithm, op) == ("hierarchical", "all_reduce") or (
        algorithm == "ring" and op in ("all_reduce", "all_gather", "reduce_scatter")
    ):
        return cluster.servers // period
    return 1


def _library_runs(
    cluster: Cluster,
    op: str,
    sizes: Sequence[float],
    name: str,
    chunks: int | str | None,
    channels: int | str | None,
    protocol: str | None,
    nccl: NcclEnv | str | None = None,
    nvls_tree_loops: bool = False,
) -> list[tuple[float, str, int, int]]:
    """(size, schedule, chunks, channels built) a library policy runs at each size on
    the whole cluster, from its model of a 2-server proxy with the server count set to
    the cluster's (NCCL's and HCCL's models see a server and how many there are): their
    ``plan`` methods."""
    proxy = cluster.proxy()
    policy = library_policy(
        name, proxy, protocol=protocol, channels=channels, chunks=chunks, nccl=nccl,
        nvls_tree_loops=nvls_tree_loops,
    )  # fmt: skip
    runs = []
    if isinstance(policy, NcclPolicy):
        system = policy.system(proxy)
        if cluster.servers > 2:
            per = system.ranks // system.nodes
            system = dataclasses.replace(system, ranks=per * cluster.servers, nodes=cluster.servers)
        for size in sizes:
            plan = policy.plan(system, op, float(size))
            runs.append((size, plan.schedule, plan.chunks, plan.built))
    elif isinstance(policy, HcclPolicy):
        system = policy.system(proxy)
        if cluster.servers > 2:
            system = dataclasses.replace(system, servers=cluster.servers)
        for size in sizes:
            plan = policy.plan(system, op, float(size))
            runs.append((size, plan.schedule, plan.chunks, plan.built))
    return runs


def check_collective(
    topology: str | Path | nx.Graph,
    op: str,
    sizes: Sequence[float],
    algorithms: Sequence[str | None],
    *,
    nodes: int | None = None,
    fabric: str | None = None,
    chunks: int | str | None = 1,
    channels: int | str | None = 1,
    protocol: str | None = None,
    max_flows: int | None = None,
    nccl: NcclEnv | str | None = None,
    nvls_tree_loops: bool = False,
) -> Estimate:
    """Refuse (:class:`ResourceError`) a run of ``op`` over ``sizes`` with each of
    ``algorithms`` (None: the topology's library) whose largest would pass the limit,
    before the topology is built (``nvls_tree_loops``: :class:`~.policy.NcclPolicy`'s).

    >>> try:
    ...     check_collective("dgx-a100", "all_reduce", [1024], ["ring"], chunks=10**7)
    ... except ResourceError as error:
    ...     print(str(error).split(": about")[0])
    all_reduce on 8 ranks (ring, 10000000 chunks, 1 channels), on dgx-a100: a topology of 8 GPUs
    """
    cluster = cluster_of(topology, nodes, fabric=fabric, max_flows=max_flows)
    check_flows(cluster.estimate(), max_flows)  # before a library's model is consulted
    return check_flows(
        largest(
            collective_estimate(
                cluster,
                op,
                sizes,
                name or cluster.library,
                chunks=chunks,
                channels=channels,
                protocol=protocol,
                nccl=nccl,
                nvls_tree_loops=nvls_tree_loops,
            )
            for name in algorithms
        ),
        max_flows,
    )
