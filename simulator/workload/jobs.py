"""Several jobs on one cluster: placed on disjoint GPUs, run together on one fabric.

Each job is a workload (any generator, preset or trace) and a placement
(:mod:`simulator.workload.placement`). The jobs are *merged* into one workload whose
ranks are the topology's GPUs: job ``A``'s rank ``r`` becomes GPU ``gpus[r]``, its ops,
ids and groups are prefixed ``A/``. That workload is replayed by the ordinary
:class:`~simulator.workload.engine.WorkloadReplay`: one SimPy environment, one
:class:`~simulator.network.flows.FlowNetwork`, so the jobs' flows share links max-min
fairly exactly as one job's flows share them, and ECMP routes follow the topology's
seeded hash (``ecmp_seed``, ``--seed``).

Each job is also run *alone*: the same merged form with only that job, on the same GPUs
of the same topology and seed, so that its slowdown (step together / step alone) is
the neighbour's doing only.

The replay's shortcuts stay on, because each is checked rather than assumed:

* calls timed alone (:mod:`simulator.workload.isolated`) are replayed from that timing
  only while no other flow, of any job, touches their links; a call that meets another
  job's flows goes on as a bundle (:mod:`simulator.workload.bundles`; ``bundles=False``
  among the options runs it flow by flow);
* one data-parallel replica standing for all (:mod:`simulator.workload.replicas`)
  applies to the jobs together only when every job is given by one replica with the
  same count: the merged shift moves each job's replicas among that job's GPUs, and
  :func:`~simulator.workload.replicas.replica_symmetry` then checks that it is a
  symmetry of the whole cluster and of every route, as for one job; otherwise every
  replica is built;
* one rank per TP group standing for the group (:mod:`simulator.workload.shadows`)
  applies when every job is given so with the same TP size: the merged shift moves
  each job's TP ranks among its own GPUs, and the replay checks the shadows as for one
  job (building every rank where they are not alike); otherwise every rank is built.
  A job whose masters' calls or sends cross servers over several shortest paths is
  given every rank from the start: ECMP hashes each TP rank onto paths of its own, and
  the replay would find the shadows unlike only after running them.

Per job and link, the bytes a job puts on a link depend on its routes and schedules
only (routes are hashed, not load-dependent; the library decides per group, operation
and size), so they are taken from its run alone; :attr:`JobsRun.bytes_mismatch` checks
that they add up to what the links carried together.

>>> import simulator
>>> from simulator.topology import load_topology
>>> ops = [{"id": f"c{r}", "rank": r, "kind": "compute", "duration": "1ms"} for r in (0, 1)]
>>> ops += [{"id": f"a{r}", "rank": r, "kind": "collective", "op": "all_reduce",
...          "group": "dp", "bytes": 1e8, "deps": [f"c{r}"]} for r in (0, 1)]
>>> trace = {"format": "ccsim-workload/1", "name": "toy", "ranks": 2, "ops": ops,
...          "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}}}
>>> toy = simulator.workload.load_workload(trace)
>>> graph = load_topology("dgx-a100", 1)
>>> result = run_jobs([Job("A", toy), Job("B", toy)], graph, algorithm="ring")
>>> [(job.name, job.gpus.tolist(), job.slowdown) for job in result.jobs]
[('A', [0, 1], 1.0), ('B', [2, 3], 1.0)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

import networkx as nx
import numpy as np

from ..errors import CcsimError
from ..network.routing import Router
from ..topology.graph import gpu_nodes, servers_of_ranks
from .collection import collections_frozen, collections_paused
from .engine import OpRecord, WorkloadReplay, WorkloadRun
from .isolated import TimingStore
from .metrics import Breakdown, breakdown
from .placement import PlacementError, place_jobs
from .shadows import crosses_hashed
from .trace import Group, Op, Replicas, Shadows, Workload


@dataclass
class Job:
    """A workload to place: its ``name`` (prefix of its ops and groups; a letter or
    word), the ``workload``, and its ``placement`` (a policy name of
    :data:`~simulator.workload.placement.POLICIES`, ``"ranks=0-7"``, or a list of
    GPUs)."""

    name: str
    workload: Workload
    placement: str | Sequence[int] = "packed"


@dataclass
class JobPart:
    """One job inside a merged workload: its workload as simulated (possibly one
    replica standing for all), the GPU of each of its ranks, and the index of its first
    op among the merged ops (its ops follow in their own order)."""

    name: str
    workload: Workload
    gpus: np.ndarray
    offset: int


@dataclass
class JobsWorkload(Workload):
    """A workload made of several jobs' (see :func:`merge_jobs`); ``parts`` says which
    ops are whose."""

    parts: list[JobPart] = field(default_factory=list)


@dataclass
class JobResult:
    """One job's figures: step alone and together (seconds), slowdown (together /
    alone), and both breakdowns (per job rank).

    The breakdowns are worked out when first read, from the job's part of each run
    (``alone_run``, ``together_run``): at two 1,024-GPU jobs the four cost ~4 s of CPU,
    and reading steps, slowdowns and shared links needs none of them. The steps are
    those the breakdowns give (the last op's end, :func:`_step_of`)."""

    name: str
    workload: str
    gpus: np.ndarray
    step_alone_s: float
    step_together_s: float
    alone_run: WorkloadRun | None = field(default=None, repr=False, compare=False)
    together_run: WorkloadRun | None = field(default=None, repr=False, compare=False)

    @cached_property
    def alone(self) -> Breakdown | None:
        """The job's breakdown alone (None without its run)."""
        return None if self.alone_run is None else breakdown(self.alone_run)

    @cached_property
    def together(self) -> Breakdown | None:
        """The job's breakdown beside the others (None without its run)."""
        return None if self.together_run is None else breakdown(self.together_run)

    @property
    def slowdown(self) -> float:
        """Step together over step alone (1.0: the neighbour cost nothing)."""
        return self.step_together_s / self.step_alone_s if self.step_alone_s else 1.0


@dataclass
class SharedLink:
    """A directed link that carried bytes of more than one job, with each job's bytes."""

    src: str
    dst: str
    link: str
    bandwidth: float
    bytes_by_job: dict[str, float]


@dataclass
class JobsRun:
    """Several jobs run alone and together on one topology (one ECMP ``seed``)."""

    jobs: list[JobResult]
    together: WorkloadRun
    alone: list[WorkloadRun]
    #: Links that carried bytes of more than one job, most bytes first.
    shared: list[SharedLink]
    seed: int
    #: Largest |bytes carried together - sum of each job's bytes alone| over links,
    #: relative to the most bytes any link carried (0: bytes conserved per job).
    bytes_mismatch: float = 0.0


def _job_ops(ops: Sequence[Op], offset: int, name: str, gpus: list[int]) -> list[Op]:
    """``ops`` moved into a merged workload: index, id, rank, deps, group and peer.

    One loop making each moved op from the fields of the original (the others as they
    are), not a copy and a call per field: a 1,024-GPU job has 288k ops, merged three
    times by :func:`run_jobs`.
    """
    prefix = f"{name}/"
    groups: dict[str, str] = {}
    out: list[Op] = []
    append = out.append
    for op in ops:
        # The first job's deps keep their indices: its list is shared, never modified.
        deps = [dep + offset for dep in op.deps] if offset and op.deps else op.deps
        group = op.group
        if group:
            group = groups.get(group) or groups.setdefault(group, prefix + group)
        peer = op.peer
        if peer >= 0:
            peer = gpus[peer]
        moved = Op(
            op.index + offset, prefix + op.id, gpus[op.rank], op.kind, op.stream, deps,
            op.label, op.duration, op.flops, op.mem_bytes, op.gemms, op.attention,
            op.op, group, op.nbytes, op.algorithm, op.chunks, op.channels, peer, op.tag,
        )  # fmt: skip
        append(moved)
    return out


def merge_jobs(
    workloads: Sequence[Workload],
    gpus: Sequence[np.ndarray],
    names: Sequence[str],
    gpu_count: int,
    cache: dict | None = None,
) -> JobsWorkload:
    """One workload of several jobs on a cluster of ``gpu_count`` GPUs: job ``j``'s rank
    ``r`` on GPU ``gpus[j][r]`` (see the module docstring). Jobs given by one replica
    stay so when all of them are, with the same count and unit; otherwise their every
    replica is built. Likewise jobs given by tensor-parallel masters
    (:class:`~simulator.workload.trace.Shadows`) stay so when all of them are, with the
    same TP size; otherwise their every TP rank is built. ``cache``: a job's merged ops
    by what sets them (its workload, name, GPUs and first index), reused by later
    merges given the same dict (ops are never modified)."""
    workloads = _with_shadows_alike(workloads, names)
    given = [w.replicas for w in workloads]
    shared = (
        all(r is not None for r in given)
        and len({(r.count, r.unit) for r in given}) == 1  # type: ignore[union-attr]
        and all(r.build is not None for r in given)  # type: ignore[union-attr]
    )
    if not shared:
        for w, name in zip(workloads, names, strict=True):
            if w.replicas is not None and w.replicas.build is None:
                raise CcsimError(
                    f"job {name} ({w.name!r}) gives one of {w.replicas.count} data-parallel "
                    "replicas and cannot build the others, which its neighbours' placement "
                    "needs; generate it with every replica"
                )
        workloads = [w if w.replicas is None else w.replicas.build(False) for w in workloads]
    ops: list[Op] = []
    groups: dict[str, Group] = {}
    instances: list[list[int]] = []
    pairs: list[tuple[int, int]] = []
    parts: list[JobPart] = []
    for workload, placed, name in zip(workloads, gpus, names, strict=True):
        offset = len(ops)
        where = [int(g) for g in placed]
        key = (id(workload), name, offset, tuple(where))
        known = None if cache is None else cache.get(key)
        if known is None:
            known = (workload, _job_ops(workload.ops, offset, name, where))
            if cache is not None:
                cache[key] = known  # keeps the workload, so that its id stays its own
        ops.extend(known[1])
        for group in workload.groups.values():
            groups[f"{name}/{group.name}"] = Group(
                f"{name}/{group.name}", [where[r] for r in group.ranks], group.kind
            )
        instances.extend([i + offset for i in members] for members in workload.instances)
        pairs.extend((s + offset, r + offset) for s, r in workload.pairs)
        parts.append(JobPart(name, workload, np.asarray(placed, dtype=np.int64), offset))
    replicas = None
    if shared:
        first = given[0]
        shift = np.arange(gpu_count, dtype=np.int64)
        members: set[int] = set()
        for replica, placed in zip(given, gpus, strict=True):
            assert replica is not None
            placed = np.asarray(placed, dtype=np.int64)
            shift[placed] = placed[np.asarray(replica.shift, dtype=np.int64)]
            members.update(placed[sorted(replica.first)].tolist())
        originals = list(workloads)

        def build(k: bool | int) -> JobsWorkload:
            built = [w.replicas.build(k) for w in originals]  # type: ignore[union-attr]
            return merge_jobs(built, gpus, names, gpu_count, cache)

        replicas = Replicas(
            count=first.count,  # type: ignore[union-attr]
            shift=tuple(shift.tolist()),
            first=frozenset(members),
            unit=first.unit,  # type: ignore[union-attr]
            build=build,
        )
    shadows = None
    if all(w.shadows is not None for w in workloads) and workloads:
        # Each job's TP shift (and CP shift, see Shadows.more) moved onto its GPUs; GPUs
        # of no job stay put (each shift of its order still). The replay checks the
        # merged shadows as one job's.
        first_shadows = workloads[0].shadows
        assert first_shadows is not None
        shifts = [np.arange(gpu_count, dtype=np.int64) for _ in range(1 + len(first_shadows.more))]
        masters: set[int] = set()
        for workload, placed in zip(workloads, gpus, strict=True):
            own = workload.shadows
            assert own is not None
            placed = np.asarray(placed, dtype=np.int64)
            for shift, given in zip(
                shifts, [own.shift, *(perm for _, perm in own.more)], strict=True
            ):
                shift[placed] = placed[np.asarray(given, dtype=np.int64)]
            masters.update(placed[sorted(own.masters)].tolist())
        shadowed = list(workloads)

        def build_ranks() -> JobsWorkload:
            built = [w.shadows.build() for w in shadowed]  # type: ignore[union-attr]
            return merge_jobs(built, gpus, names, gpu_count, cache)

        shadows = Shadows(
            first_shadows.count,
            tuple(shifts[0].tolist()),
            frozenset(masters),
            build=build_ranks,
            more=tuple(
                (order, tuple(shift.tolist()))
                for (order, _), shift in zip(first_shadows.more, shifts[1:], strict=True)
            ),
        )
    # Each job's send communicators on its GPUs (None where every job's sends run on
    # their own pairs' communicators).
    comms = [
        tuple(tuple(int(placed[r]) for r in comm) for comm in w.p2p_comms)
        for w, placed in zip(workloads, gpus, strict=True)
        if w.p2p_comms is not None
    ]
    return JobsWorkload(
        name=" + ".join(f"{n}: {w.name}" for n, w in zip(names, workloads, strict=True)),
        ranks=gpu_count,
        ops=ops,
        groups=groups,
        description="several jobs on one cluster",
        instances=instances,
        pairs=pairs,
        model_flops=sum(w.model_flops for w in workloads),
        precision=workloads[0].precision if workloads else "bf16",
        replicas=replicas,
        shadows=shadows,
        parts=parts,
        p2p_comms=tuple(c for job in comms for c in job) if comms else None,
    )


def _with_shadows_alike(workloads: Sequence[Workload], names: Sequence[str]) -> list[Workload]:
    """``workloads`` as given when every one is by masters of one kind (the same TP
    size, and CP size where CP ranks are shadows too; or none is); otherwise each given
    so with its every rank built."""
    given = [w.shadows for w in workloads]
    if all(s is None for s in given) or (
        all(s is not None and s.build is not None for s in given)
        and len({(s.count, tuple(o for o, _ in s.more)) for s in given}) == 1  # type: ignore[union-attr]
    ):
        return list(workloads)
    out = []
    for w, name in zip(workloads, names, strict=True):
        if w.shadows is not None and w.shadows.build is None:
            raise CcsimError(
                f"job {name} ({w.name!r}) gives one rank of each TP group and cannot build "
                "the others, which its neighbours need; generate it with every TP rank"
            )
        out.append(w if w.shadows is None else w.shadows.build())
    return out


def job_runs(run: WorkloadRun) -> dict[str, WorkloadRun]:
    """Each job's part of a merged run, as a run of its own workload (its own ranks):
    what :func:`~simulator.workload.metrics.breakdown` and the timeline take."""
    workload = run.workload
    if not isinstance(workload, JobsWorkload):
        raise CcsimError("job_runs takes a run of a merged workload (merge_jobs, run_jobs)")
    out = {}
    for part in workload.parts:
        span = slice(part.offset, part.offset + len(part.workload.ops))
        records = OpRecord(
            run.records.issue_s[span], run.records.start_s[span], run.records.end_s[span]
        )
        out[part.name] = WorkloadRun(
            part.workload,
            records,
            run.stats,
            algorithm=run.algorithm,
            isolated=run.isolated,
            replicas=run.replicas,
        )
    return out


def _step_of(run: WorkloadRun) -> float:
    """A run's step: when its last op ended, as :func:`~simulator.workload.metrics.
    breakdown` gives ``step_s`` (the same expression, so the same bits)."""
    return float(np.nanmax(run.records.end_s))


def _link_bytes(run: WorkloadRun) -> dict[tuple[str, str], float]:
    """Bytes per directed link of the topology (reducers, which are a GPU's own, left out)."""
    links = run.links
    return {
        (src, dst): float(nbytes)
        for src, dst, kind, nbytes in zip(
            links["src"], links["dst"], links["link"], links["bytes"], strict=True
        )
        if kind != "reduce"
    }


def run_jobs(
    jobs: Sequence[Job],
    graph: nx.Graph,
    *,
    seed: int | None = None,
    progress: Callable[[str], Callable[[float], None] | None] | None = None,
    **options,
) -> JobsRun:
    """Run ``jobs`` on ``graph``, each alone and all together (see the module docstring).

    Parameters
    ----------
    jobs : sequence of Job
        Names must differ; placements are those of
        :func:`~simulator.workload.placement.place_jobs`.
    graph : networkx graph
        The topology (not modified).
    seed : int, optional
        ECMP hash seed (the graph's ``ecmp_seed`` otherwise).
    progress : callable, optional
        ``progress(what)`` returns a progress callback for the replay it names (or None).
    **options
        Passed to :class:`~simulator.workload.engine.WorkloadReplay` (``algorithm``,
        ``protocol``, ``comm_slowdown``, ``nccl``, ...), the same for every run.
    """
    if not jobs:
        raise PlacementError("no jobs to run; give at least one --job")
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise PlacementError(f"job names must differ, got {names}")
    if seed is not None:
        graph = graph.copy()  # never mutate the caller's graph
        graph.graph["ecmp_seed"] = int(seed)
    count = len(gpu_nodes(graph))
    servers = servers_of_ranks(graph) or list(range(count))
    gpus = place_jobs(
        servers, [job.workload.ranks for job in jobs], [job.placement for job in jobs], names
    )

    # The runs alone and together share calls' timings alone (keyed by what sets them,
    # not by which run built the schedule): the run together finds most of its calls
    # timed already by the runs alone.
    timings = options.pop("timings", None) or TimingStore(graph)
    # Jobs' merged ops, shared by the runs where a job is merged alike (the first job
    # alone and together).
    merged_ops: dict = {}

    def replay(workloads: list[Workload], where: list[np.ndarray], who: list[str]) -> WorkloadRun:
        callback = progress(" + ".join(who)) if progress is not None else None
        with ExitStack() as frozen:
            with collections_paused():
                # Merging, and building every rank or replica (the replay's
                # constructor), allocate hundreds of thousands of ops that live on.
                merged = merge_jobs(workloads, where, who, count, merged_ops)
                replayer = WorkloadReplay(merged, graph, timings=timings, **options)
                # Frozen before collections resume: the first would walk them all.
                frozen.enter_context(collections_frozen())
            run = replayer.run(callback)
            # Its network's owners and the calls' registries refer back to the replay:
            # let go of them so that the replay's per-op tables are freed as soon as it
            # is dropped, not by a full collection that walks every op alive.
            replayer.close()
            return run

    # A job whose stand-ins (TP masters, one replica) were found unlike alone is given
    # whole to the later runs: the replay would find them unlike again (the routes are
    # the same hashed ones) and build every rank after a wasted attempt. The steps are
    # the same either way; only the CPU time differs.
    given: dict[int, Workload] = {}
    alone = []
    router = timings.tables()[1]
    for job, g in zip(jobs, gpus, strict=True):
        workload = given.get(id(job.workload), job.workload)
        if id(job.workload) not in given and _routes_hash(workload, g, servers, router):
            # Its TP ranks' calls cross hashed paths: the replay would find the masters
            # unlike their shadows only after running them, then start over whole.
            with collections_paused():
                workload = workload.shadows.build()  # type: ignore[union-attr]
        run = replay([workload], [g], [job.name])
        given[id(job.workload)] = _whole_where_unlike(workload, run)
        alone.append(run)
    together = replay([given[id(job.workload)] for job in jobs], gpus, names)
    # Reading the figures off allocates enough to set off a collection of the oldest
    # generation, which walks the millions of ops the runs hold (2.2 s of CPU at two
    # 1,024-GPU jobs, gc.callbacks) and finds nothing: the replays were closed, their
    # garbage freed as they were.
    with collections_paused():
        return _jobs_run(jobs, gpus, alone, together, graph)


def _jobs_run(
    jobs: Sequence[Job],
    gpus: list[np.ndarray],
    alone: list[WorkloadRun],
    together: WorkloadRun,
    graph: nx.Graph,
) -> JobsRun:
    """The figures of :func:`run_jobs`: each job's steps and breakdowns alone and
    together, the links where the jobs met, and the bytes check."""
    parts = job_runs(together)
    results = []
    for job, g, single in zip(jobs, gpus, alone, strict=True):
        mine, by_itself = parts[job.name], job_runs(single)[job.name]
        results.append(
            JobResult(
                job.name,
                job.workload.name,
                g,
                _step_of(by_itself),
                _step_of(mine),
                by_itself,
                mine,
            )
        )
    # Per-job bytes per link from each run alone; links that carried more than one job's.
    per_job = [_link_bytes(run) for run in alone]
    total = _link_bytes(together)
    shared = []
    index = {
        (s, d): i
        for i, (s, d) in enumerate(zip(together.links["src"], together.links["dst"], strict=True))
    }
    for key in total:
        mine = {
            job.name: b[key] for job, b in zip(jobs, per_job, strict=True) if b.get(key, 0.0) > 0
        }
        if len(mine) > 1:
            i = index[key]
            shared.append(
                SharedLink(
                    key[0],
                    key[1],
                    together.links["link"][i],
                    float(together.links["bandwidth"][i]),
                    mine,
                )
            )
    shared.sort(key=lambda link: (-sum(link.bytes_by_job.values()), link.src, link.dst))
    most = max(total.values(), default=0.0)
    worst = max(
        (abs(carried - sum(b.get(key, 0.0) for b in per_job)) for key, carried in total.items()),
        default=0.0,
    )
    return JobsRun(
        results,
        together,
        alone,
        shared,
        int(graph.graph.get("ecmp_seed", 0)),
        worst / most if most else 0.0,
    )


def _routes_hash(workload: Workload, gpus: np.ndarray, servers: list, router: Router) -> bool:
    """Whether ``workload``, given by TP masters that can build the rest and placed on
    ``gpus``, has a group of a master with two ranks next to each other, or a master's
    pipeline send, on different servers that several shortest paths join. ECMP then
    hashes each TP rank's calls and sends onto paths of their own, and the replay would
    find the masters unlike their shadows (a guess about CPU time only: either way the
    steps are those of every rank built)."""
    shadows = workload.shadows
    if shadows is None or shadows.build is None:
        return False
    masters = shadows.masters
    ends: set[tuple[int, int]] = set()
    for group in workload.groups.values():
        if not masters.isdisjoint(group.ranks):  # the replay runs only these
            ends.update(pairwise(group.ranks))
    ops = workload.ops
    for send, receive in workload.pairs:
        if ops[send].rank in masters:
            ends.add((ops[send].rank, ops[receive].rank))
    return crosses_hashed([(int(gpus[a]), int(gpus[b])) for a, b in sorted(ends)], servers, router)


def _whole_where_unlike(workload: Workload, run: WorkloadRun) -> Workload:
    """``workload`` with every TP rank (every replica) built where ``run`` found its TP
    masters (its first replica) unlike the rest; as given otherwise."""
    shadows = workload.shadows
    if run.shadows.get("simulated") == "all" and shadows is not None and shadows.build:
        workload = shadows.build()
    replicas = workload.replicas
    if run.replicas.get("simulated") == "all" and replicas is not None and replicas.build:
        parts = getattr(run.workload, "parts", [])
        if workload.shadows is None and len(parts) == 1 and parts[0].workload.replicas is None:
            # The replay built it so (replicas.build(False) of this very workload): the
            # same ops, not built a second time (seconds for a 1,024-GPU job).
            return parts[0].workload
        workload = replicas.build(False)
    return workload


#: Statistics of a job's slowdown over seeds, in column order.
SEED_STATISTICS = ("median", "p90", "min", "max")


def slowdown_over_seeds(runs: Sequence[JobsRun]) -> dict[str, dict[str, float]]:
    """Per job, the median, 90th percentile (linear interpolation, as
    ``numpy.percentile``), least and largest slowdown over runs of several ECMP seeds.

    >>> def run(s):
    ...     job = JobResult("A", "w", np.arange(2), 1.0, s, None, None)
    ...     return JobsRun([job], None, [], [], 0)
    >>> slowdown_over_seeds([run(1.0), run(1.5), run(2.0)])["A"]
    {'median': 1.5, 'p90': 1.9, 'min': 1.0, 'max': 2.0}
    """
    out: dict[str, dict[str, float]] = {}
    if not runs:
        return out
    for i, job in enumerate(runs[0].jobs):
        values = np.array([run.jobs[i].slowdown for run in runs])
        out[job.name] = {
            "median": float(np.median(values)),
            "p90": float(np.percentile(values, 90)),
            "min": float(values.min()),
            "max": float(values.max()),
        }
    return out


def job_names(count: int) -> list[str]:
    """Default job names: A, B, ..., Z, then J26, J27, ...

    >>> job_names(3)
    ['A', 'B', 'C']
    """
    return [chr(ord("A") + j) if j < 26 else f"J{j}" for j in range(count)]
