"""The workload trace format (``ccsim-workload/1``), loading and validation.

A workload is a list of ops per rank. JSON (or YAML) layout::

    {
      "format": "ccsim-workload/1",
      "name": "ddp-toy",
      "ranks": 2,
      "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}},
      "ops": [
        {"id": "r0.bwd0", "rank": 0, "kind": "compute", "duration": "2ms"},
        {"id": "r0.ar0", "rank": 0, "kind": "collective", "op": "all_reduce",
         "group": "dp", "bytes": "64MiB", "deps": ["r0.bwd0"]},
        ...
      ]
    }

Op fields:

``id``
    Unique name (default ``"<rank>:<index>"``); ``deps`` lists ids of ops that must be
    done first (any rank).
``rank``, ``kind``
    The rank that issues it; ``compute``, ``collective``, ``send`` or ``recv``.
``stream``
    Name of the rank's stream it runs on (default ``compute`` for compute ops, ``comm``
    otherwise). Ops on one stream run one at a time in list order, as on a CUDA stream.
``label``
    Free text for reports (e.g. ``"bwd layer 3"``).
compute
    ``duration`` (seconds or a string like ``"1.5ms"``), or work timed by the device
    model: ``gemms``, a list of GEMM kernels ``[m, n, k]`` (optionally ``[m, n, k,
    batch]`` or ``[m, n, k, batch, count]``) timed one after another by their shapes
    (:mod:`~simulator.workload.kernels`), ``attention``, a list of fused causal
    attention kernels ``[batch, queries, keys, head_dim, count, backward]`` (then
    optionally the backend, 0 cuDNN or 1 FlashAttention-2, and dropout, 0 or 1) timed at
    the device's attention rate for their length, then ``flops`` and ``bytes`` (memory
    traffic) by the roofline max(flops / GEMM FLOP/s, bytes / memory bandwidth). Any of
    them may be given alone.
collective
    ``op`` (all_reduce, all_gather, reduce_scatter, ...), ``group`` (a name in
    ``groups``), ``bytes`` (the nccl-tests size: the whole buffer), optional
    ``algorithm``, ``chunks``, ``channels``. The k-th collective a rank issues on a group
    matches the k-th of every other member, as on an NCCL communicator.
send / recv
    ``peer`` (the other rank), ``bytes``, optional ``tag``; the k-th send from a to b
    with a tag matches the k-th recv at b from a with that tag.

Groups have ``ranks`` and a ``kind`` (TP, PP, DP, EP or any label) used to report
exposed communication per parallel dimension.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..collective.run import COLLECTIVE_OPS
from ..errors import CcsimError, shown
from ..files import load_data, write_file
from ..units import parse_size, parse_time
from .kernels import Attention, Gemm
from .memory import MemoryEstimate

FORMAT = "ccsim-workload/1"
KINDS = ("compute", "collective", "send", "recv")
_OP_KEYS = {
    "compute": {"duration", "flops", "bytes", "gemms", "attention"},
    "collective": {"op", "group", "bytes", "algorithm", "chunks", "channels"},
    "send": {"peer", "bytes", "tag"},
    "recv": {"peer", "bytes", "tag"},
}
_COMMON = {"id", "rank", "kind", "stream", "deps", "label"}


class WorkloadError(CcsimError):
    """A workload trace is malformed or cannot run (mismatch, cycle, deadlock)."""


@dataclass(slots=True)
class Op:
    """One op of one rank (see the module docstring for the fields).

    Slotted: a step built for every rank holds a million ops or more, each ~100 B
    smaller and made and read faster without an instance dict."""

    index: int
    id: str
    rank: int
    kind: str
    stream: str
    deps: list[int] = field(default_factory=list)
    label: str = ""
    duration: float | None = None
    flops: float = 0.0
    mem_bytes: float = 0.0
    gemms: tuple[Gemm, ...] = ()
    attention: tuple[Attention, ...] = ()
    op: str = ""
    group: str = ""
    nbytes: float = 0.0
    algorithm: str | None = None
    chunks: int = 1
    channels: int = 1
    peer: int = -1
    tag: str = ""

    @property
    def total_flops(self) -> float:
        """FLOPs of a compute op: its GEMMs', its attention kernels' and its roofline
        part's."""
        return (
            self.flops
            + sum(gemm.flops for gemm in self.gemms)
            + sum(kernel.flops for kernel in self.attention)
        )


@dataclass
class Group:
    """A communicator: its ranks and the parallel dimension it belongs to."""

    name: str
    ranks: list[int]
    kind: str = ""
    #: The ranks as a set, for membership checks.
    members: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.members = frozenset(self.ranks)


@dataclass(frozen=True)
class Replicas:
    """A workload given by one replica: ``count`` replicas (data-parallel ones) do the
    same, and the workload's ops are those of the first.

    ``shift[r]`` is the rank that does in the next replica what rank ``r`` does (a
    permutation; applied ``count`` times it is the identity and it moves every rank).
    ``first`` are the ranks of the first replica, whose ops the workload holds. A group
    that the shift maps onto itself *spans* the replicas (a data-parallel group) and
    must list the first replica's ranks first and then their images,
    ``g[i + p] = shift[g[i]]`` with ``p = len(g) / count``: the first replica issues its
    calls for all; every other group lies inside one replica. A "replica" may be
    ``unit`` data-parallel replicas together (where one is smaller than a server).
    """

    count: int
    shift: tuple[int, ...]
    first: frozenset[int]
    unit: int = 1
    #: Builds the workload again with the first k replicas standing for each next k
    #: (``build(k)``), or every replica's ops (``build(False)``): replays fall back on it
    #: where single replicas are not alike (:mod:`simulator.workload.replicas`).
    build: Callable[[bool | int], Workload] | None = field(default=None, compare=False, repr=False)

    def spans(self, ranks: list[int]) -> bool:
        """Whether a group with these ranks spans the replicas."""
        return self.shift[ranks[0]] in set(ranks)


@dataclass(frozen=True)
class Shadows:
    """A workload whose tensor-parallel (and context-parallel) ranks are given by one:
    the ``count`` ranks of a TP group (of a TP x CP block) do the same work on the same
    data shapes, so the workload holds the ops of one of them, its *master*
    (``masters``), and the others are its *shadows*.

    ``shift[r]`` is the rank that does what rank ``r`` does, one TP rank on (a
    permutation); ``more`` holds further generators as (order, permutation), such as
    one CP rank on. The permutations these generate (:meth:`images`, ``count`` with the
    identity) map a master onto the ranks it stands for. Each group is mapped onto
    itself or onto other groups, its *images*: the TP group onto itself by the TP shift
    (its call runs over all its ranks, the master issuing for the others) and onto the
    TP groups of the other CP ranks; a data-parallel group of TP rank 0 onto those of
    TP ranks 1, 2, ... The replay runs the images' calls beside the master's, as it
    does the images of the master's point-to-point sends, so that the network carries
    every rank's traffic (see :class:`~simulator.workload.engine.WorkloadReplay`, which
    checks that the shadows end when their masters do). ``build()`` builds every rank's
    ops; ``tp_only()``, where CP ranks are shadowed too, the ops of every CP rank with
    the TP ranks alone shadowed (what the replay runs where a CP rank does not end with
    its master: a data-parallel ring on fewer channels than GPUs in a server enters each
    server at the first few, so its positions, one CP rank apart, end at different times
    (issue 31), while the TP shift still maps every ring onto its image, one rail on)."""

    count: int
    shift: tuple[int, ...]
    masters: frozenset[int]
    build: Callable[[], Workload] | None = field(default=None, compare=False, repr=False)
    more: tuple[tuple[int, tuple[int, ...]], ...] = ()
    tp_only: Callable[[], Workload] | None = field(default=None, compare=False, repr=False)

    @cached_property
    def _maps(self) -> tuple[np.ndarray, np.ndarray]:
        orders = [self.count // math.prod(order for order, _ in self.more)]
        generators = [np.asarray(self.shift, dtype=np.int64)]
        for order, shift in self.more:
            orders.append(order)
            generators.append(np.asarray(shift, dtype=np.int64))
        powers = []  # powers[g][e]: generator g applied e times
        for order, generator in zip(orders, generators, strict=True):
            steps = [np.arange(len(generator), dtype=np.int64)]
            for _ in range(1, order):
                steps.append(generator[steps[-1]])
            powers.append(steps)
        # Single generators' powers first, then their products (so that a group's image
        # is first met in its own rank order: see shadow_images).
        exponents = sorted(
            itertools.product(*(range(order) for order in orders)),
            key=lambda e: (sum(x > 0 for x in e), e),
        )[1:]
        perms = np.empty((len(exponents), len(self.shift)), dtype=np.int64)
        for row, exponent in enumerate(exponents):
            perm = np.arange(len(self.shift), dtype=np.int64)
            for steps, e in zip(powers, exponent, strict=True):
                perm = steps[e][perm]
            perms[row] = perm
        master_of = np.arange(len(self.shift), dtype=np.int64)
        masters = np.array(sorted(self.masters), dtype=np.int64)
        for perm in perms:
            master_of[perm[masters]] = masters
        return perms, master_of

    def images(self) -> np.ndarray:
        """The ``count - 1`` permutations other than the identity that map masters onto
        their shadows, one per row (single generators' powers first)."""
        return self._maps[0]

    def master_of(self) -> np.ndarray:
        """Per rank, the master it stands for (itself for a master)."""
        return self._maps[1]

    @cached_property
    def _tp_orbits(self) -> np.ndarray:
        # Per rank, the least rank that powers of the TP shift alone reach from it.
        shift = np.asarray(self.shift, dtype=np.int64)
        identity = np.arange(len(shift), dtype=np.int64)
        least, step = identity, shift
        while not np.array_equal(step, identity):  # a permutation: back within its order
            least, step = np.minimum(least, step), shift[step]
        return least

    def same_tp_group(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` are powers of ``shift`` apart (with TP shadows,
        the same TP group's ranks), not apart by a further generator (a CP rank on)."""
        orbits = self._tp_orbits
        return bool(orbits[a] == orbits[b])


@dataclass
class Workload:
    """A validated workload: ops in file order, groups, and the matching of comm ops.

    ``instances`` lists, for every collective call, the indices of its member ops (one per
    group rank, in group order); ``pairs`` lists (send index, recv index).
    """

    name: str
    ranks: int
    ops: list[Op]
    groups: dict[str, Group]
    description: str = ""
    instances: list[list[int]] = field(default_factory=list)
    pairs: list[tuple[int, int]] = field(default_factory=list)
    #: Peak memory per GPU of the configuration the generator built (None for traces,
    #: which do not say what they hold).
    memory: MemoryEstimate | None = None
    #: FLOPs of the whole step as the generator's framework counts them (Megatron-LM's
    #: ``num_floating_point_operations``: the model's own, no recomputation; 0 where
    #: unknown), for model TFLOP/s per GPU and MFU.
    model_flops: float = 0.0
    #: The precision of the step's GEMMs ("bf16" or "fp8"): MFU is taken against that
    #: precision's peak (:meth:`~simulator.workload.devices.Device.peak`).
    precision: str = "bf16"
    #: Set when the ops are those of one replica standing for ``replicas.count``.
    replicas: Replicas | None = None
    #: Set when the ops are those of one rank per tensor-parallel group (its master).
    shadows: Shadows | None = None
    #: The communicators the sends run on, each its ranks (every rank of the cluster,
    #: whichever ranks the ops are built for), where they are not each pair's own:
    #: PyTorch runs an isend/irecv on its own over a communicator of its two ranks
    #: (ProcessGroupNCCL::pointToPoint, key getKeySendRecv), a batch_isend_irecv over
    #: its process group's. NCCL may send through another GPU of the communicator
    #: (:func:`simulator.library.nccl_p2p.p2p_proxy`). None: each pair's own.
    p2p_comms: tuple[tuple[int, ...], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form in the trace format (times in seconds, sizes in bytes)."""
        ops = []
        for op in self.ops:
            data: dict[str, Any] = {
                "id": op.id,
                "rank": op.rank,
                "kind": op.kind,
                "stream": op.stream,
            }
            if op.deps:
                data["deps"] = [self.ops[d].id for d in op.deps]
            if op.label:
                data["label"] = op.label
            if op.kind == "compute":
                if op.duration is not None:
                    data["duration"] = op.duration
                else:
                    if op.gemms:
                        data["gemms"] = [gemm.as_list() for gemm in op.gemms]
                    if op.attention:
                        data["attention"] = [kernel.as_list() for kernel in op.attention]
                    if op.flops or not (op.gemms or op.attention):
                        data["flops"] = op.flops
                    if op.mem_bytes:
                        data["bytes"] = op.mem_bytes
            elif op.kind == "collective":
                data.update(op=op.op, group=op.group, bytes=op.nbytes)
                if op.algorithm:
                    data["algorithm"] = op.algorithm
                if op.chunks != 1:
                    data["chunks"] = op.chunks
                if op.channels != 1:
                    data["channels"] = op.channels
            else:
                data.update(peer=op.peer, bytes=op.nbytes)
                if op.tag:
                    data["tag"] = op.tag
            ops.append(data)
        return {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "ranks": self.ranks,
            "groups": {g.name: {"kind": g.kind, "ranks": g.ranks} for g in self.groups.values()},
            "ops": ops,
        }

    def save(self, path: str | Path) -> None:
        """Write the workload as JSON (atomically)."""
        write_file(path, json.dumps(self.to_dict(), indent=1) + "\n")


def load_workload(source: str | Path | dict[str, Any]) -> Workload:
    """Read and validate a workload from a JSON/YAML file or a dict."""
    if isinstance(source, dict):
        return parse_workload(source, origin="workload")
    path = Path(source)
    fmt = "yaml" if path.suffix in (".yaml", ".yml") else "json"
    data = load_data(path, what="workload", fmt=fmt, error=WorkloadError)
    return parse_workload(data, origin=str(path))


def parse_workload(
    data: Any,
    *,
    origin: str = "workload",
    replicas: Replicas | None = None,
    shadows: Shadows | None = None,
    trusted: bool = False,
) -> Workload:
    """Validate plain data in the trace format and build a :class:`Workload`; with
    ``replicas``, the ops are those of the first replica (see :class:`Replicas`); with
    ``shadows``, those of one rank per TP group (see :class:`Shadows`).

    ``trusted``: the data comes from ccsim's own generators, whose ops are well formed
    by construction: each op is converted without its fields' checks, and the graph is
    not searched for a cycle beforehand (a generator's bug that made one would still be
    reported by the replay as a deadlock, with its ranks and ops). Calls are matched as
    always. The ops are the same as those built with every check
    (tests/test_generators_trusted.py)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WorkloadError(f'{origin}: not a ccsim workload (expected "format": "{FORMAT}")')
    unknown = sorted(set(data) - {"format", "name", "description", "ranks", "groups", "ops"})
    if unknown:
        raise WorkloadError(f"{origin}: unknown top-level key {shown(unknown[0])}")
    ranks = data.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise WorkloadError(f"{origin}: 'ranks' must be a positive integer, got {shown(ranks)}")
    groups = _parse_groups(data.get("groups", {}), ranks, origin)
    raw_ops = data.get("ops")
    if not isinstance(raw_ops, list) or not raw_ops:
        raise WorkloadError(f"{origin}: 'ops' must be a non-empty list of ops")
    ops: list[Op] = []
    ids: dict[str, int] = {}
    per_rank_count: dict[int, int] = defaultdict(int)
    # Every pass of a stage has the same GEMMs: share one tuple between its ops.
    gemm_cache: dict[tuple, tuple[Gemm, ...]] = {}
    for index, raw in enumerate(raw_ops):
        if trusted:
            op = trusted_op(index, raw["id"], raw["rank"], raw["kind"], raw, origin, gemm_cache)
            ids[op.id] = index
            ops.append(op)
            continue
        op = _parse_op(raw, index, ranks, groups, per_rank_count, origin, gemm_cache)
        if op.id in ids:
            raise WorkloadError(
                f"{origin}: op id {shown(op.id)} is used twice (ops {ids[op.id]} and {index})"
            )
        ids[op.id] = index
        ops.append(op)
    if trusted:
        return trusted_workload(
            data, ops, [raw.get("deps") for raw in raw_ops], groups, origin, replicas, shadows
        )
    for op, raw in zip(ops, raw_ops, strict=True):
        deps = raw.get("deps", [])
        if not isinstance(deps, list):
            raise WorkloadError(f"{origin}: op {shown(op.id)}: 'deps' must be a list of op ids")
        for dep in deps:
            if str(dep) not in ids:
                raise WorkloadError(
                    f"{origin}: op {shown(op.id)} depends on unknown op {shown(dep)}"
                )
            op.deps.append(ids[str(dep)])
    workload = _workload(data, origin, ranks, ops, groups, replicas, shadows)
    _check_acyclic(workload, origin)
    return workload


def trusted_workload(
    data: dict[str, Any],
    ops: list[Op],
    deps: list[list[str] | None],
    groups: dict[str, Group] | None = None,
    origin: str | None = None,
    replicas: Replicas | None = None,
    shadows: Shadows | None = None,
    ids: dict[str, int] | None = None,
) -> Workload:
    """The :class:`Workload` of a generator's ``ops`` (made by :func:`trusted_op`, in
    order, each op's ``deps`` given by id): what :func:`parse_workload` builds with
    ``trusted``, without going through the trace format's plain data (``data`` gives
    the name, description, ranks and groups only; its ``ops`` are not read). Calls
    are matched as always. ``ids``: each op's index by id where the caller has it
    (ops whose ``deps`` entry is None keep the deps they hold)."""
    origin = data["name"] if origin is None else origin
    if groups is None:
        groups = _parse_groups(data.get("groups", {}), data["ranks"], origin)
    if ids is None:
        ids = {op.id: op.index for op in ops}
    elif len(ids) != len(ops):
        # (The caller's deps already resolved would name the first of several ops with
        # an id, where a table made here names the last; parse_workload refuses them.)
        raise WorkloadError(f"{origin}: {len(ops) - len(ids)} op ids used more than once")
    get = ids.__getitem__
    if len(deps) != len(ops):
        raise ValueError(f"{len(ops)} ops and {len(deps)} lists of deps")  # (zip's strict)
    for index, names in enumerate(deps):
        if names:
            # A new list rather than extending the empty one: a comprehension of 2 to 4
            # ids holds 4 slots where extend gives 8 (CPython's list_resize), 32 B an
            # op on the millions of ops of a GB200 405B step built for every rank; and
            # the names are let go as they are read, so that the step's peak does not
            # hold both (issue 31). The same ids in the same order.
            ops[index].deps = [get(name) for name in names]
            deps[index] = None
    return _workload(data, origin, data["ranks"], ops, groups, replicas, shadows)


def _workload(
    data: dict[str, Any],
    origin: str,
    ranks: int,
    ops: list[Op],
    groups: dict[str, Group],
    replicas: Replicas | None,
    shadows: Shadows | None,
) -> Workload:
    """The :class:`Workload` of parsed or trusted ``ops``, named and described by
    ``data``, with its collective calls matched (both :func:`parse_workload` and
    :func:`trusted_workload` end here)."""
    workload = Workload(
        name=str(data.get("name", Path(origin).stem)),
        ranks=ranks,
        ops=ops,
        groups=groups,
        description=str(data.get("description", "")),
        replicas=replicas,
        shadows=shadows,
    )
    _match(workload, origin)
    return workload


def _parse_groups(raw: Any, ranks: int, origin: str) -> dict[str, Group]:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{origin}: 'groups' must map group names to {{ranks, kind}}")
    groups = {}
    for name, spec in raw.items():
        members = spec.get("ranks") if isinstance(spec, dict) else spec
        kind = spec.get("kind", "") if isinstance(spec, dict) else ""
        if not isinstance(members, list) or not members:
            raise WorkloadError(f"{origin}: group {shown(name)} needs a non-empty list of ranks")
        for rank in members:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
                raise WorkloadError(
                    f"{origin}: group {shown(name)} names rank {shown(rank)}; "
                    f"ranks are 0..{ranks - 1}"
                )
        if len(set(members)) != len(members):
            raise WorkloadError(f"{origin}: group {shown(name)} lists a rank twice")
        groups[str(name)] = Group(str(name), [int(r) for r in members], str(kind))
    return groups


def _gemms(
    raw: Any, where: Callable[[], str], cache: dict[Any, tuple[Gemm, ...]]
) -> tuple[Gemm, ...]:
    """A compute op's ``gemms`` field: a list of [m, n, k(, batch(, count(, bits)))] of
    positive integers, bits 16 or 8 (``where()`` names the op in errors). The same list
    object (a generator's passes share one) is checked once."""
    seen = cache.get(id(raw))
    if seen is not None and seen[0] is raw:
        return seen[1]
    usage = (
        "give a list of [m, n, k], [m, n, k, batch], [m, n, k, batch, count] or "
        "[m, n, k, batch, count, bits] (bits 16 or 8), or [m, n, k, batch, count, 8, 32] "
        "(MXFP8's 1 x 32 block-scaled fp8), or [m, n, k, batch, count, bits, block, splits, "
        "margin] (block 0 or 32, a GEMM chunked beside communication: Gemm)"
    )
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where()}: 'gemms' must be a non-empty list; {usage}")
    key = []
    for entry in raw:
        overlapped = isinstance(entry, list | tuple) and len(entry) == 9
        if (
            not isinstance(entry, list | tuple)
            or not (3 <= len(entry) <= 7 or overlapped)
            or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)
            or any(x < 1 for x in (entry[:5] + entry[7:8] if overlapped else entry))
            or (len(entry) >= 6 and entry[5] not in (8, 16))
            or (len(entry) == 7 and (entry[5], entry[6]) != (8, 32))
            or (overlapped and (entry[6] not in (0, 32) or entry[8] < 0))
            or (overlapped and entry[6] == 32 and entry[5] != 8)
        ):
            raise WorkloadError(
                f"{where()}: GEMM {shown(entry)} is not a list of 3 to 7 positive integers "
                f"(bits 16 or 8; block 32 with bits 8) or of 9 (splits >= 1, margin >= 0); " + usage
            )
        key.append(tuple(entry))
    frozen = tuple(key)
    if frozen not in cache:
        cache[frozen] = tuple(Gemm(*entry) for entry in frozen)
    cache[id(raw)] = (raw, cache[frozen])  # the list itself is kept, so its id stays its
    return cache[frozen]


def _attention(raw: Any, where: Callable[[], str], cache: dict[Any, Any]) -> tuple[Attention, ...]:
    """A compute op's ``attention`` field: a list of [batch, queries, keys, head_dim,
    count, backward] (positive integers, backward 0 or 1) and optionally the backend (0
    cuDNN's, 1 FlashAttention-2's) and then dropout (0 or 1), each a fused attention
    kernel (:class:`~simulator.workload.kernels.Attention`); checked once per list
    object."""
    seen = cache.get(id(raw))
    if seen is not None and seen[0] is raw:
        return seen[1]
    usage = (
        "give a list of [batch, queries, keys, head_dim, count, backward (0 or 1)], "
        "optionally then the backend (0 cuDNN, 1 FlashAttention-2) and dropout (0 or 1)"
    )
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where()}: 'attention' must be a non-empty list; {usage}")
    kernels = []
    for entry in raw:
        if (
            not isinstance(entry, list | tuple)
            or len(entry) not in (6, 7, 8)
            or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)
            or min(entry[:5]) < 1
            or any(x not in (0, 1) for x in entry[5:])
        ):
            raise WorkloadError(f"{where()}: attention kernel {shown(entry)} is malformed; {usage}")
        kernels.append(Attention(*entry))
    frozen = tuple(kernels)
    cache[id(raw)] = (raw, frozen)
    return frozen


def _parse_op(
    raw: Any,
    index: int,
    ranks: int,
    groups: dict[str, Group],
    per_rank_count: dict[int, int],
    origin: str,
    gemm_cache: dict[tuple, tuple[Gemm, ...]],
) -> Op:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{origin}: op {index} must be a mapping")
    rank = raw.get("rank")
    # Where an error is, built only for one (a step has a million ops).
    where = lambda: f"{origin}: op {shown(raw.get('id', index))}"  # noqa: E731
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
        raise WorkloadError(f"{where()}: unknown rank {shown(rank)}; ranks are 0..{ranks - 1}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise WorkloadError(f"{where()}: kind {shown(kind)}; use one of {', '.join(KINDS)}")
    unknown = set(raw) - _COMMON - _OP_KEYS[kind]
    if unknown:
        raise WorkloadError(
            f"{where()}: unknown field {shown(sorted(unknown)[0])} for a {kind} op; valid: "
            + ", ".join(sorted(_COMMON | _OP_KEYS[kind]))
        )
    op_id = str(raw.get("id", f"{rank}:{per_rank_count[rank]}"))
    per_rank_count[rank] += 1
    op = Op(
        index=index,
        id=op_id,
        rank=rank,
        kind=kind,
        stream=str(raw.get("stream", "compute" if kind == "compute" else "comm")),
        label=str(raw.get("label", "")),
    )
    where = lambda: f"{origin}: op {shown(op_id)}"  # noqa: E731
    try:
        if kind == "compute":
            if "duration" in raw:
                op.duration = parse_time(raw["duration"], field=f"{where()} duration")
                if op.duration < 0:
                    raise WorkloadError(f"{where()}: duration must be >= 0")
            elif "flops" in raw or "gemms" in raw or "attention" in raw:
                op.flops = float(raw.get("flops", 0.0))
                op.mem_bytes = _size(raw.get("bytes", 0), where)
                if op.flops < 0 or op.mem_bytes < 0:
                    raise WorkloadError(f"{where()}: flops and bytes must be >= 0")
                if "gemms" in raw:
                    op.gemms = _gemms(raw["gemms"], where, gemm_cache)
                if "attention" in raw:
                    op.attention = _attention(raw["attention"], where, gemm_cache)
            else:
                raise WorkloadError(
                    f"{where()}: a compute op needs 'duration', 'flops', 'gemms' or 'attention'"
                )
        elif kind == "collective":
            op.op = str(raw.get("op", ""))
            if op.op not in COLLECTIVE_OPS:
                close = op.op.replace("-", "_").replace("allreduce", "all_reduce")
                hint = next((f" (did you mean {o}?)" for o in COLLECTIVE_OPS if o.replace(
                    "_", "") == close.replace("_", "").lower()), "")  # fmt: skip
                raise WorkloadError(
                    f"{where()}: unknown op {shown(op.op)}{hint}; valid ops: "
                    + ", ".join(COLLECTIVE_OPS)
                )
            op.group = str(raw.get("group", ""))
            if op.group not in groups:
                raise WorkloadError(
                    f"{where()}: unknown group {shown(op.group)}; defined groups: "
                    + (", ".join(sorted(groups)) or "none")
                )
            if rank not in groups[op.group].members:
                raise WorkloadError(
                    f"{where()}: rank {rank} is not a member of group {shown(op.group)}"
                )
            op.nbytes = _size(raw.get("bytes", 0), where)
            op.algorithm = raw.get("algorithm")
            op.chunks = int(raw.get("chunks", 1))
            op.channels = int(raw.get("channels", 1))
        else:
            peer = raw.get("peer")
            if (
                isinstance(peer, bool)
                or not isinstance(peer, int)
                or not 0 <= peer < ranks
                or peer == rank
            ):
                raise WorkloadError(
                    f"{where()}: peer {shown(peer)} must be another rank in 0..{ranks - 1}"
                )
            op.peer = peer
            op.nbytes = _size(raw.get("bytes", 0), where)
            op.tag = str(raw.get("tag", ""))
    except (TypeError, ValueError) as error:
        raise WorkloadError(f"{where()}: {error}") from None
    except CcsimError as error:
        if isinstance(error, WorkloadError):
            raise
        raise WorkloadError(str(error)) from None
    return op


def trusted_op(
    index: int,
    op_id: str,
    rank: int,
    kind: str,
    fields: dict[str, Any],
    origin: str,
    gemm_cache: dict[Any, Any],
) -> Op:
    """An op of a generator's (its other ``fields`` as the trace format names them),
    converted as :func:`_parse_op` converts it, without its checks (see ``trusted`` in
    :func:`parse_workload`). ``gemm_cache`` is shared by the ops of one workload: equal
    GEMM and attention lists become one tuple, and equal labels, tags and non-zero sizes
    one object (:func:`_shared_values`)."""
    get = fields.get
    # (The table's bound method, kept in the cache: no Python frame a value, millions
    # of ops.)
    one = gemm_cache.get(_SHARED_SET)
    if one is None:
        one = gemm_cache[_SHARED_SET] = _shared_values(gemm_cache).setdefault
    label = str(get("label", ""))
    op = Op(
        index,
        str(op_id),
        rank,
        kind,
        str(get("stream", "compute" if kind == "compute" else "comm")),
        [],
        one(label, label) if label else label,
    )
    if kind == "compute":
        if "duration" in fields:
            duration = fields["duration"]
            if type(duration) in _PLAIN:
                # parse_time's answer for a plain number (itself, as a float), without
                # its message naming the op, made for every op (issue 31: ~1% of the
                # builds of DeepSeek-V3's steps).
                op.duration = float(duration)
            else:
                where = lambda: f"{origin}: op {shown(op.id)}"  # noqa: E731
                op.duration = parse_time(duration, field=f"{where()} duration")
        else:
            op.flops = float(get("flops", 0.0))
            size = get("bytes", 0)
            if type(size) in _PLAIN and _isfinite(size):  # (_trusted_size's fast path)
                size = float(size)
            else:
                size = _trusted_size(size, op, origin)
            op.mem_bytes = one(size, size) if size else size
            gemms = get("gemms")
            if gemms is not None:
                seen = gemm_cache.get(id(gemms))
                if seen is not None and seen[0] is gemms:
                    op.gemms = seen[1]
                else:
                    op.gemms = _gemms(gemms, lambda: f"{origin}: op {shown(op.id)}", gemm_cache)
            attention = get("attention")
            if attention is not None:
                op.attention = _trusted_attention(attention, gemm_cache)
    elif kind == "collective":
        op.op = str(get("op", ""))
        op.group = str(get("group", ""))
        size = get("bytes", 0)
        if type(size) in _PLAIN and _isfinite(size):  # (_trusted_size's fast path)
            size = float(size)
        else:
            size = _trusted_size(size, op, origin)
        op.nbytes = one(size, size) if size else size
        op.algorithm = get("algorithm")
        op.chunks = int(get("chunks", 1))
        op.channels = int(get("channels", 1))
    else:
        op.peer = fields["peer"]
        size = get("bytes", 0)
        if type(size) in _PLAIN and _isfinite(size):  # (_trusted_size's fast path)
            size = float(size)
        else:
            size = _trusted_size(size, op, origin)
        op.nbytes = one(size, size) if size else size
        tag = str(get("tag", ""))
        op.tag = one(tag, tag) if tag else tag
    return op


#: The key of :func:`_shared_values`'s table in a workload's cache (an object no other
#: key equals: the cache's keys are ids, tuples and this), and of its ``setdefault``.
_SHARED = object()
_SHARED_SET = object()


def _shared_values(cache: dict[Any, Any]) -> dict[str | float, str | float]:
    """The table in ``cache`` (a workload's, see :func:`trusted_op`) of each label, tag
    and size met, by itself: ``table.setdefault(value, value)`` is the equal value met
    first. A generator makes an op's label, tag and sizes anew (an f-string, a float of
    an int), the same few hundred values over millions of ops, an object each (~80 B an
    op on Llama 3.1 405B on 256 GB200 built for every rank; issue 31). Only non-empty
    strings and non-zero floats go in: 0.0 and -0.0 are equal keys, while equal non-zero
    floats have the same bits.

    >>> one = _shared_values({}).setdefault
    >>> a, b = float(1 << 26), float(1 << 26)
    >>> a is b, one(a, a) is one(b, b)
    (False, True)
    """
    table = cache.get(_SHARED)
    if table is None:
        table = cache[_SHARED] = {}
    return table


#: Types of a size taken as it is (:func:`_trusted_size`'s fast path, inlined in
#: :func:`trusted_op`).
_PLAIN = (int, float)
_isfinite = math.isfinite


def _trusted_size(value: Any, op: Op, origin: str) -> float:
    """:func:`_size` of a generator's op (its error message built only if needed)."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return _size(value, lambda: f"{origin}: op {shown(op.id)}")


def _trusted_attention(raw: list, cache: dict[Any, Any]) -> tuple[Attention, ...]:
    """A generator's ``attention`` field as :func:`_attention` converts it, unchecked;
    equal lists (a generator makes a new one per pass) share one tuple."""
    seen = cache.get(id(raw))
    if seen is not None and seen[0] is raw:
        return seen[1]
    key = ("attention", *(tuple(entry) for entry in raw))
    frozen = cache.get(key)
    if frozen is None:
        frozen = cache[key] = tuple(Attention(*entry) for entry in raw)
    return frozen


def _size(value: Any, where: Callable[[], str]) -> float:
    """An op's ``bytes``: a plain number as it is (what generators write), else parsed
    with its unit."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return parse_size(value, field=f"{where()} bytes")


def _match(workload: Workload, origin: str) -> None:
    """Pair collectives across group members and sends with recvs."""
    # One pass over the ops: each (group, rank)'s calls, and each (source, target,
    # tag)'s sends and receives, in trace order.
    calls: dict[tuple[str, int], list[int]] = defaultdict(list)  # (group, rank) -> ops
    sends: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    for op in workload.ops:
        kind = op.kind
        if kind == "collective":
            calls[(op.group, op.rank)].append(op.index)
        elif kind == "send":
            sends[(op.rank, op.peer, op.tag)].append(op.index)
        elif kind == "recv":
            recvs[(op.peer, op.rank, op.tag)].append(op.index)
    replicas = workload.replicas
    ops = workload.ops
    # Groups no op calls on (most of a step built by masters and one replica: the other
    # replicas' and shadows' groups) are passed over without filtering their ranks.
    called = {group for group, _ in calls}
    for group in workload.groups.values():
        if group.name not in called:
            continue
        ranks = group.ranks
        if replicas is not None:
            # The first replica's members issue for all (see Replicas).
            ranks = [rank for rank in ranks if rank in replicas.first]
            if not ranks:
                continue
        if workload.shadows is not None:
            # Masters issue for their shadows (see Shadows).
            ranks = [rank for rank in ranks if rank in workload.shadows.masters]
            if not ranks:
                continue
        # Each member's calls on the group; the k-th of each make call k.
        lists = [calls.get((group.name, rank), []) for rank in ranks]
        most = max(map(len, lists))
        if most == 0:
            continue
        for k, column in enumerate(zip(*lists, strict=False)):
            first = ops[column[0]]
            for index in column[1:]:
                other = ops[index]
                if (other.op, other.nbytes) != (first.op, first.nbytes):
                    raise WorkloadError(
                        f"{origin}: collective #{k} on group {shown(group.name)} does not match: "
                        f"rank {first.rank} issues {first.op} of {first.nbytes:.0f} B (op "
                        f"{shown(first.id)}), rank {other.rank} issues {other.op} of "
                        f"{other.nbytes:.0f} B (op {shown(other.id)})"
                    )
            workload.instances.append(list(column))
        k = min(map(len, lists))  # (zip stopped at the first member without call k)
        if k < most:
            members = [calls_of[k] for calls_of in lists if k < len(calls_of)]
            missing = [
                rank for rank, calls_of in zip(ranks, lists, strict=True) if k >= len(calls_of)
            ]
            first = ops[members[0]]
            raise WorkloadError(
                f"{origin}: collective {first.op} #{k} on group {shown(group.name)} (op "
                f"{shown(first.id)}) is never issued by ranks {missing}: the other members "
                "would wait forever (deadlock); add the missing call or remove it everywhere"
            )
    for key in sorted(set(sends) | set(recvs)):
        out, into = sends.get(key, []), recvs.get(key, [])
        if len(out) != len(into):
            src, dst, tag = key
            lone = ops[(out or into)[min(len(out), len(into))]]
            raise WorkloadError(
                f"{origin}: {len(out)} sends from rank {src} to rank {dst} (tag {shown(tag)}) but "
                f"{len(into)} recvs; op {shown(lone.id)} has no partner (deadlock)"
            )
        for s, r in zip(out, into, strict=True):
            if ops[s].nbytes != ops[r].nbytes:
                raise WorkloadError(
                    f"{origin}: send {shown(ops[s].id)} carries "
                    f"{ops[s].nbytes:.0f} B but its recv {shown(ops[r].id)} "
                    f"expects {ops[r].nbytes:.0f} B"
                )
            workload.pairs.append((s, r))


def _check_acyclic(workload: Workload, origin: str) -> None:
    """Dependencies, stream order and matched calls must not form a cycle (deadlock)."""
    n = len(workload.ops)
    # Matched ops start together: merge them into one node.
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for members in workload.instances:
        for index in members[1:]:
            parent[find(index)] = find(members[0])
    for s, r in workload.pairs:
        parent[find(r)] = find(s)
    root = [find(i) for i in range(n)]  # each op's merged node, found once
    edges: dict[int, set[int]] = defaultdict(set)
    last_on_stream: dict[tuple[int, str], int] = {}
    for op in workload.ops:
        node = root[op.index]
        for dep in op.deps:
            source = root[dep]
            if source != node:
                edges[source].add(node)
            else:
                raise WorkloadError(
                    f"{origin}: op {shown(op.id)} depends on an op it must run "
                    f"together with ({shown(workload.ops[dep].id)}): a cycle"
                )
        key = (op.rank, op.stream)
        previous = last_on_stream.get(key)
        if previous is not None and root[previous] != node:
            edges[root[previous]].add(node)
        last_on_stream[key] = op.index
    indegree: dict[int, int] = defaultdict(int)
    for targets in edges.values():
        for t in targets:
            indegree[t] += 1
    nodes = set(root)
    ready = [v for v in nodes if indegree[v] == 0]
    seen = 0
    while ready:
        v = ready.pop()
        seen += 1
        for t in edges.get(v, ()):
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    if seen < len(nodes):
        stuck = sorted(i for i in range(n) if indegree[root[i]] > 0)[:6]
        described = ", ".join(
            f"{shown(workload.ops[i].id)} (rank {workload.ops[i].rank})" for i in stuck
        )
        raise WorkloadError(
            f"{origin}: dependencies, stream order and matched calls form a cycle (a deadlock); "
            f"ops involved include {described}"
        )
