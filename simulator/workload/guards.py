"""A workload's share of the resource guards (:mod:`simulator.collective.guards`): the
flows a replay creates and the ops a generator writes, estimated before either is built.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..collective.guards import (
    MAX_CHUNKS,
    OP_FLOWS,
    Cluster,
    Estimate,
    call_transfers,
    check_flows,
    transfers,
)
from ..collective.policy import POLICIES, HcclPolicy, library_policy
from ..errors import CcsimError
from ..library.hccl import OPS as HCCL_OPS
from ..library.nccl_env import NcclEnv
from ..topology import load_topology
from .generators import GENERATORS, moe_replicas
from .model import MODELS, Transformer
from .trace import Workload

#: Generator parameters that multiply the ranks: an estimate runs the generator with them
#: at 1 and scales its ops per rank (exact, or above where fewer data-parallel ranks
#: would each run more micro-batches of a fixed global batch).
RANK_PARAMETERS = ("ranks", "tp", "dp", "cp")


def workload_estimate(
    workload: Workload,
    algorithm: str | None = "ring",
    *,
    cluster: Cluster | None = None,
    protocol: str | None = None,
    nccl: NcclEnv | str | None = None,
) -> Estimate:
    """Flows a replay of ``workload`` holds at its peak: its ops at :data:`OP_FLOWS`
    each, every send/recv, the transfers of each distinct collective call (its schedule
    is built once and kept) and, for each group and stream, those of its largest call
    (calls on one group and stream run one at a time, and a finished call's flows are
    freed). A call's transfers are those of ``algorithm`` where the call names none;
    "auto" counts the largest candidate the search may build; a library, or None for
    ``cluster``'s, the schedule, chunks and channels it chooses for the call's group
    (:func:`library_plans`).

    >>> from simulator.workload.generators import ddp
    >>> estimate = workload_estimate(ddp(ranks=8))
    >>> estimate.flows  # 1,928 ops x 5; 48 equal all-reduces: 1 kept, 1 in flight, 112 each
    9864
    """
    if algorithm is None or algorithm in POLICIES:
        if cluster is None:
            raise CcsimError("a library's estimate needs the cluster it runs on")
        plan = library_plans(cluster, algorithm or cluster.library, protocol, nccl)
    counted: dict[tuple, int] = {}
    kept: dict[tuple, int] = {}  # distinct calls
    live: dict[tuple, int] = {}  # the largest call per group and stream
    largest = 0
    replicas = workload.replicas
    for members in workload.instances:
        first = workload.ops[members[0]]
        ranks = workload.groups[first.group].ranks
        if len(ranks) < 2 or first.nbytes == 0:
            continue  # finished at once, no transfers
        largest = max(largest, len(ranks))
        name = first.algorithm or algorithm
        if name is None or name in POLICIES:
            servers = len({rank // (cluster.per_server or len(ranks)) for rank in ranks})
            key = (name, first.op, len(ranks), servers, first.nbytes, first.chunks,
                   first.channels)  # fmt: skip
            if key not in counted:
                counted[key] = plan(*key[1:])
        else:
            key = (name, first.op, len(ranks), first.nbytes, first.chunks, first.channels)
            if key not in counted:
                # "auto": the search's largest candidate, as for a collective
                chunks = MAX_CHUNKS if name == "auto" else first.chunks
                counted[key] = call_transfers(name, first.op, len(ranks)) * chunks * first.channels
        # One replica standing for the rest runs a call spanning them as its quotient:
        # 1/count of the transfers (simulator.workload.replicas).
        share = counted[key]
        if replicas is not None and replicas.spans(ranks):
            key, share = (*key, "quotient"), math.ceil(share / replicas.count)
        kept[key] = share
        lane = (first.group, first.stream)
        live[lane] = max(live.get(lane, 0), share)
    flows = len(workload.ops) * OP_FLOWS + len(workload.pairs)
    flows += sum(kept.values()) + sum(live.values())
    what = (
        f"workload {workload.name}: {len(workload.ops):,} ops, "
        f"{len(workload.instances):,} collective calls on up to {largest:,} ranks"
        + (f", one replica built for {replicas.count}" if replicas is not None else "")
    )
    return Estimate(flows, what)


def library_plans(
    cluster: Cluster,
    name: str,
    protocol: str | None = None,
    nccl: NcclEnv | str | None = None,
) -> Callable[[str, int, int, float, int, int], int]:
    """Transfers of one call as library ``name`` runs it on ``cluster``, as a function
    of (operation, ranks, servers it spans, bytes, chunks, channels of the call; 1
    leaves them to the library): the schedule, chunks and channels the library chooses
    with its model of one server, or of two with the server count set to the group's
    (as :func:`~simulator.collective.guards.collective_estimate` does)."""
    systems: dict[int, object] = {}
    policies: dict[tuple[int, int], object] = {}

    def system(servers: int, policy):
        proxy = min(servers, 2, cluster.servers)
        if proxy not in systems:
            graph = load_topology(cluster.topology, proxy, fabric=cluster.fabric)
            systems[proxy] = policy.system(graph)
        found = systems[proxy]
        if servers == proxy:
            return found
        if isinstance(policy, HcclPolicy):
            return dataclasses.replace(found, servers=servers)
        return dataclasses.replace(found, ranks=found.ranks // proxy * servers, nodes=servers)

    def count(op: str, ranks: int, servers: int, size: float, chunks: int, channels: int) -> int:
        key = (chunks, channels)
        if key not in policies:
            policies[key] = library_policy(
                name, load_topology(cluster.topology, 1, fabric=cluster.fabric),
                protocol=protocol, chunks=None if chunks == 1 else chunks,
                channels=None if channels == 1 else channels, nccl=nccl,
            )  # fmt: skip
        policy = policies[key]
        if isinstance(policy, HcclPolicy) and op not in HCCL_OPS:
            return call_transfers("auto", op, ranks)  # run by the first algorithm that can
        try:
            chosen = policy.plan(system(servers, policy), op, size)
        except CcsimError:  # the library cannot decide here: the replay says why
            return call_transfers("auto", op, ranks)
        per = ranks // servers if ranks % servers == 0 else None
        # A schedule that cannot run this group's shape counts as the largest that can.
        calls = transfers(chosen.schedule, op, ranks, per) or call_transfers("auto", op, ranks)
        return calls * chosen.chunks * chosen.built

    return count


def generator_estimate(generator: str, options: Mapping[str, Any]) -> Estimate | None:
    """Ops that ``GENERATORS[generator](**options)`` would write, at :data:`OP_FLOWS`
    each: the same generator run with its rank counts (:data:`RANK_PARAMETERS`) at 1
    (and a fixed ``global_batch`` divided by the data-parallel size, so that the one
    replica runs the micro-batches each of the real ones runs), scaled to the ranks whose
    ops are built: every rank, or those of the replicas a Megatron step builds with
    ``replicas`` (one, or k, standing for the rest; :func:`built_replicas`). None where
    the options are not plain positive counts (the generator then says what is wrong).

    >>> generator_estimate("ddp", {"ranks": 100_000_000}).what
    'ddp on 100,000,000 ranks: 24,100,000,000 ops'
    >>> generator_estimate("megatron", {"tp": 8, "pp": 2, "dp": 64, "global_batch": 512,
    ...                                 "replicas": True}).what
    'megatron on 16 of 1,024 ranks (1 of 64 data-parallel replicas built): 8,864 ops'
    """
    function = GENERATORS[generator]
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if name in RANK_PARAMETERS
    }
    counts = {**defaults, **{k: v for k, v in options.items() if k in defaults}}
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in counts.values()):
        return None
    # Each count at 2 where it is 2 or more: a rank then runs every kind of op it runs
    # at full size (TP, CP and DP collectives exist only with 2 ranks or more).
    small_counts = {name: min(value, 2) for name, value in counts.items()}
    if counts.get("tp", 1) >= 2:
        # TP's smallest prime factor: it divides the heads wherever the real TP does.
        small_counts["tp"] = next(p for p in range(2, counts["tp"] + 1) if counts["tp"] % p == 0)
    # Expert parallelism splits DP rather than adding ranks: the small run has 2 expert-
    # parallel ranks where the real one has 2 or more (its all-to-alls are there), and
    # twice as many data-parallel ones where the real one reduces expert gradients over
    # the replicas with the same experts (ep < dp).
    ep = options.get("ep", 1)
    small_ep = 2 if isinstance(ep, int) and ep >= 2 and counts.get("dp", 1) >= 2 else 1
    if small_ep == 2 and ep < counts["dp"]:
        small_counts["dp"] = min(counts["dp"], 4)
    sizes = options.get("hierarchical_context_parallel_sizes")
    small_sizes = None
    if (
        isinstance(sizes, (list, tuple))
        and len(sizes) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes)
        and sizes[0] * sizes[1] == counts.get("cp", 1)
    ):
        # a2a+p2p: each level at 2 where it is 2 or more (both kinds of CP group kept).
        small_sizes = [min(n, 2) for n in sizes]
        small_counts["cp"] = small_sizes[0] * small_sizes[1]
    elif sizes is not None:
        return None  # the generator says what is wrong with them
    small_options = {**options, **small_counts}
    if small_sizes is not None:
        small_options["hierarchical_context_parallel_sizes"] = small_sizes
    if "ep" in options:
        small_options["ep"] = small_ep
    if "replicas" in options:
        small_options["replicas"] = False  # every small replica: the built ones counted below
    dp = counts.get("dp", 1)
    batch = options.get("global_batch")
    if isinstance(batch, int) and not isinstance(batch, bool) and batch % dp == 0:
        small_options["global_batch"] = batch // dp * small_counts.get("dp", 1)
    small_ops, small_ranks = _small_run(
        generator, function, small_options, small_counts.get("dp", 1)
    )
    # The counts kept (pp) stay in the small run's ranks.
    ranks = math.prod(counts.values()) * small_ranks // math.prod(small_counts.values())
    built = built_replicas(generator, options, dp)
    per_rank = small_ops / small_ranks
    ops = math.ceil(per_rank * ranks * built / dp)
    if built < dp:
        what = (
            f"{generator} on {ranks * built // dp:,} of {ranks:,} ranks ({built} of {dp} "
            f"data-parallel replicas built): {ops:,} ops"
        )
    else:
        what = f"{generator} on {ranks:,} ranks: {ops:,} ops"
    return Estimate(ops * OP_FLOWS, what)


def _small_run(
    generator: str, function: Callable[..., Workload], options: Mapping[str, Any], dp: int
) -> tuple[int, int]:
    """Ops and ranks of ``function(**options)``. A Megatron step's op count is affine
    in its micro-batches (each adds its forward and backward passes, their sends and
    calls, to every rank; the rest is per step), so a step of many is counted from two
    steps of one and two (of ``pp`` and ``2 pp`` when interleaved, which needs whole
    rounds): a 64-stage pipeline's estimate then costs two small runs, not one as long
    as the real one's."""
    batch, micro = options.get("global_batch"), options.get("micro_batch", 1)
    pp, virtual = options.get("pp", 8), options.get("virtual_stages", 1)
    plain = all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 1
        for x in (batch, micro, pp, virtual)
    )
    if generator == "megatron" and plain and batch % (micro * dp) == 0:
        count = batch // (micro * dp)
        unit = pp if virtual > 1 else 1
        if count >= 3 * unit and count % unit == 0:
            one = function(**{**options, "global_batch": unit * micro * dp})
            two = function(**{**options, "global_batch": 2 * unit * micro * dp})
            added = len(two.ops) - len(one.ops)  # by ``unit`` more micro-batches
            return len(one.ops) + (count // unit - 1) * added, one.ranks
    small = function(**options)
    return len(small.ops), small.ranks


def built_replicas(generator: str, options: Mapping[str, Any], dp: int) -> int:
    """Data-parallel replicas whose ops a generator run builds: ``dp``, or for a Megatron
    step with ``replicas`` the one (``True``) or k (an integer dividing ``dp``) that
    stand for the rest; for a mixture-of-experts model, as many as keep each
    expert-parallel group inside them (:func:`~simulator.workload.generators.moe_replicas`)."""
    replicas = options.get("replicas", False)
    if generator != "megatron" or replicas is False or replicas is None:
        return dp
    model = options.get("model", "gpt3-175b")
    transformer = model if isinstance(model, Transformer) else MODELS.get(model)
    if transformer is None:
        return dp  # an unknown model: the generator says so
    if replicas is True:
        unit = 1
    elif isinstance(replicas, int) and replicas >= 1 and dp % replicas == 0:
        unit = replicas
    else:
        return dp
    if transformer.is_moe and unit < dp:
        # As the generator builds them: whole units of the replicas an EP group covers.
        names = ("tp", "cp", "ep", "etp")
        counts = {name: options.get(name, 8 if name == "tp" else 1) for name in names}
        if all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
            block = counts["ep"] * counts["etp"]  # ranks holding whole EP groups
            return moe_replicas(unit, ep=block, tp=counts["tp"], cp=counts["cp"], dp=dp)
        return dp
    return unit


def check_generator(
    generator: str, options: Mapping[str, Any], max_flows: int | None = None
) -> None:
    """Refuse (:class:`~simulator.collective.guards.ResourceError`) a generator run whose
    trace would pass the limit, before it is generated."""
    estimate = generator_estimate(generator, options)
    if estimate is not None:
        check_flows(estimate, max_flows)
