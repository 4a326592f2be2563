"""Running one point of a sweep: its params (plain data) in, one result row out.

:func:`run_point` is what every runner executes, in this process, in a local worker
process or on a Dask worker, so results do not depend on where a point ran. It never
raises for a failing simulation: the error goes into the row (``status: error``) and the
sweep goes on. Only interruptions (``KeyboardInterrupt``, a dying process) escape.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import networkx as nx

from ..collective.policy import library_of
from ..collective.simulate import simulate_collective
from ..errors import CcsimError
from ..network.faults import apply_faults
from ..topology import fabric_spec, load_topology, preset
from ..topology.graph import gpu_nodes
from ..topology.presets import preset_graph

#: Metric columns of each kind of sweep, in results order (seconds, GB/s = 1e9 B/s).
METRICS = {
    "collective": ("ranks", "time_s", "time_us", "algbw_GBps", "busbw_GBps"),
    "workload": (
        "ranks",
        "step_s",
        "compute_s",
        "comm_s",
        "overlapped_s",
        "exposed_s",
        "waiting_s",
        "bubble_s",
        "exposed_share",
        "comm_share",
    ),
}
#: What each metric of :data:`METRICS` is, in words (a plot's axis label, before its
#: unit). Times are in seconds (``_s``) or microseconds (``_us``), bandwidths in GB/s
#: (``_GBps``), shares are fractions of the step time.
METRIC_NAMES = {
    "ranks": "ranks",
    "time_s": "collective time",
    "time_us": "collective time",
    "algbw_GBps": "algorithm bandwidth",
    "busbw_GBps": "bus bandwidth",
    "step_s": "step time",
    "compute_s": "compute time",
    "comm_s": "communication time",
    "overlapped_s": "communication overlapped with compute",
    "exposed_s": "exposed communication",
    "waiting_s": "waiting for peers",
    "bubble_s": "pipeline bubble",
    "exposed_share": "exposed communication",
    "comm_share": "communication",
}


def build_topology(params: Mapping[str, Any]) -> nx.Graph:
    """The graph of a point: its preset with the point's ``set`` paths applied.

    ``params`` needs ``topology`` (``{"name"}``, ``{"name", "data"}`` or
    ``{"graph", "path"}``), ``set`` (dotted path -> value), ``fabric``, ``nodes`` and
    optionally ``seed`` and ``fault`` (:func:`~simulator.network.faults.apply_faults`).
    A path may create keys the preset does not have (``fabric.oversubscription``); the
    topology parser rejects unknown ones.

    Examples
    --------
    >>> g = build_topology({"topology": {"name": "dgx-a100"}, "nodes": 2,
    ...                     "set": {"server.nic.bandwidth": 50e9}})
    >>> max(d["bandwidth"] for _, _, d in g.edges(data=True) if d["link"] == "rdma")
    50000000000.0
    """
    graph = _preset_topology(params)
    # The point's faults (issue 16), applied to a copy: a sweep may vary them.
    return apply_faults(graph, params["fault"]) if params.get("fault") else graph


class PointCache:
    """What the points one runner runs in one process share: the topology graphs they
    build (by the params that build them) and, per graph, the calls' timings alone
    (:class:`~simulator.workload.isolated.TimingStore`).

    Consecutive points of a sweep or a search usually run on one cluster: building a
    16,384-GPU graph costs about a second, and a pipeline split's data-parallel calls
    are timed alone once for all its micro-batch, recomputation and precision variants
    instead of once each. Results are the same with or without the cache: a graph is
    never changed by a replay (faults build their own copy), and a timing is found by
    the content of what sets it. A runner scopes a cache to the points it runs
    (:func:`point_cache_scope`); at most ``graphs`` graphs are kept, the least recently
    used dropped first.
    """

    def __init__(self, graphs: int = 2):
        self.graphs = graphs
        self._graphs: OrderedDict[str, tuple[nx.Graph, Any]] = OrderedDict()
        #: Points that found their graph here, and that built it.
        self.hits = 0
        self.misses = 0

    def graph(self, params: Mapping[str, Any]) -> tuple[nx.Graph, Any]:
        """The point's graph (:func:`build_topology`) and its timing store."""
        from ..workload.isolated import TimingStore

        key = json.dumps(
            {k: params.get(k) for k in ("topology", "set", "fabric", "nodes", "seed", "fault")},
            sort_keys=True,
            default=repr,
        )
        entry = self._graphs.get(key)
        if entry is None:
            self.misses += 1
            graph = build_topology(params)
            entry = self._graphs[key] = (graph, TimingStore(graph))
            while len(self._graphs) > self.graphs:
                self._graphs.popitem(last=False)
        else:
            self.hits += 1
            self._graphs.move_to_end(key)
        return entry


#: The cache of the runner running points in this process now (see
#: :func:`point_cache_scope`); None: every point builds its own.
_POINT_CACHE: ContextVar[PointCache | None] = ContextVar("ccsim_point_cache", default=None)


@contextmanager
def point_cache_scope(cache: PointCache | None) -> Iterator[None]:
    """Points run inside this block share ``cache`` (None: nothing shared)."""
    token = _POINT_CACHE.set(cache)
    try:
        yield
    finally:
        _POINT_CACHE.reset(token)


def use_point_cache(cache: PointCache) -> None:
    """Every later point in this process shares ``cache``: for a worker process, whose
    points are all its runner's (a pool's initializer calls it)."""
    _POINT_CACHE.set(cache)


def _preset_topology(params: Mapping[str, Any]) -> nx.Graph:
    """The point's healthy graph (see :func:`build_topology`)."""
    topology = params["topology"]
    nodes = params.get("nodes") or 1
    data = preset_data(params)
    if data is None:
        return load_topology(topology["path"], nodes, seed=params.get("seed"))
    name = str(data.get("name", topology["name"]))
    source = f"{name} (with the sweep's values)" if params.get("set") else name
    return preset_graph(
        data,
        nodes,
        name=name,
        source=source,
        seed=params.get("seed"),
        single_server_fabric=params.get("fabric") is not None,
    )


def preset_data(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The preset a point builds, with its fabric and ``set`` paths applied (None for a
    graph file, which is the whole topology)."""
    topology = params["topology"]
    if "graph" in topology:
        return None
    data = copy.deepcopy(topology["data"]) if "data" in topology else preset(topology["name"])
    fabric = fabric_spec(data.get("fabric"), params.get("fabric"))
    if fabric:
        data["fabric"] = fabric
    for path, value in sorted(params.get("set", {}).items()):
        _set_path(data, path, value)
    return data


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``path`` ``"a.b.c"``, creating mappings."""
    *parents, last = path.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise CcsimError(f"{path}: {part!r} is not a section of the topology")
        node = child
    node[last] = copy.deepcopy(value)


def _workload(params: Mapping[str, Any], gpus_per_server: int) -> tuple[Any, int | None]:
    """The point's workload and the node count it needs when ``nodes`` is not given."""
    from ..workload.presets import from_spec, resolve_workload

    spec = params["workload"]
    nodes = params.get("nodes")
    if "generator" not in spec:
        workload = resolve_workload(Path(spec["path"]))
    else:
        spec = dict(spec)
        if spec.get("ranks") == "all":
            # Every GPU of the cluster: the workload follows a nodes axis.
            spec["ranks"] = (nodes or 1) * gpus_per_server
        if spec["generator"] == "megatron":
            # A point needs the step's figures, not every rank's: one data-parallel
            # replica stands for all where the run is symmetric (same results; the
            # replay builds every replica where not: simulator.workload.replicas).
            spec.setdefault("replicas", True)
            spec.setdefault("shadows", True)  # one rank per TP group: simulator.workload.shadows
        workload = from_spec(spec, origin=str(spec.get("name", spec["generator"])))
    if nodes is None:
        nodes = max(1, math.ceil(workload.ranks / gpus_per_server))
    return workload, nodes


def run_point(params: Mapping[str, Any]) -> dict[str, Any]:
    """Run one point; return its status, error and metrics as a flat row.

    Parameters
    ----------
    params : mapping
        A :class:`~simulator.sweep.spec.Point`'s ``params``.

    Returns
    -------
    dict
        ``status`` (``ok`` or ``error``), ``error`` (one line, empty when ok) and the
        metrics of :data:`METRICS` for the point's kind (None on error).

    Examples
    --------
    >>> row = run_point({"kind": "collective", "collective": "all_reduce", "size": 2**20,
    ...                  "algorithm": "ring", "chunks": 1, "channels": 1, "root": 0,
    ...                  "topology": {"name": "dgx-a100"}, "nodes": 1, "set": {}})
    >>> row["status"], row["ranks"]
    ('ok', 8)
    """
    kind = params["kind"]
    row: dict[str, Any] = {"status": "ok", "error": ""}
    row.update(dict.fromkeys(METRICS[kind]))
    try:
        row.update(_collective(params) if kind == "collective" else _run_workload(params))
    except Exception as error:
        # Any failure of the simulation itself (bad input, or a bug that only this
        # combination reaches) belongs to this point; the sweep goes on. Interruptions
        # (KeyboardInterrupt, SystemExit) are not Exceptions and stop the sweep.
        row["status"] = "error"
        row["error"] = one_line(error)
    return row


def _collective(params: Mapping[str, Any]) -> dict[str, Any]:
    graph = build_topology(params)
    algorithm = params["algorithm"]
    result = simulate_collective(
        graph,
        params["collective"],
        float(params["size"]),
        library_of(graph) if algorithm == "library" else algorithm,
        chunks=params.get("chunks"),
        channels=params.get("channels"),
        reduce_bandwidth=params.get("reduce_bandwidth"),
        root=params.get("root", 0),
        protocol=params.get("protocol"),
        nccl=params.get("nccl"),
    )
    return {
        "ranks": result.ranks,
        "time_s": result.time_s,
        "time_us": result.time_us,
        "algbw_GBps": result.algbw_GBps,
        "busbw_GBps": result.busbw_GBps,
    }


def point_graph(params: Mapping[str, Any]) -> nx.Graph:
    """The healthy graph a point runs on, at the server count it runs with (a workload
    point without ``nodes`` takes as many servers as its ranks need), without its
    faults: what building it takes (:mod:`simulator.topology.bom`) does not change when a
    link slows down."""
    if params["kind"] == "workload" and params.get("nodes") is None:
        _, nodes = _workload(params, _gpus_per_server(params))
        params = {**params, "nodes": nodes}
    return _preset_topology(params)


def megatron_tp_spread(params: Mapping[str, Any]) -> Any:
    """Where a Megatron generator point's TP groups sit on its servers
    (:func:`~simulator.workload.servers.megatron_spread`, from its sizes alone), or None
    for other points and for sizes the point itself will refuse."""
    from ..workload.generators import megatron
    from ..workload.servers import megatron_spread

    spec = params.get("workload") if params.get("kind") == "workload" else None
    if not isinstance(spec, Mapping) or spec.get("generator") != "megatron":
        return None
    defaults = inspect.signature(megatron).parameters
    sizes = [spec.get(k, defaults[k].default) for k in ("tp", "pp", "dp", "cp")]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
        return None
    try:
        per_server = _gpus_per_server(params)
    except CcsimError:  # the point reports it when it runs
        return None
    return megatron_spread(sizes[0], math.prod(sizes), per_server)


def simulate_workload_point(params: Mapping[str, Any]) -> tuple[Any, nx.Graph, Any]:
    """Replay a workload point: its workload, graph and
    :class:`~simulator.workload.metrics.Breakdown` (for point functions that report
    more than :func:`run_point`, such as ``ccsim search``'s)."""
    from ..workload import WorkloadReplay, breakdown
    from ..workload.collection import collections_paused

    # Python's cyclic collector paused for the point (building its workload, graph and
    # replay): its collections would walk the millions of ops and network tables that
    # live until the replay ends and free nothing, as in run_steady. The collector is
    # back on (as it was) once the point is done, so any cycle made here is freed at a
    # later collection, between points.
    with collections_paused():
        gpus = _gpus_per_server(params)
        workload, nodes = _workload(params, gpus)
        cache = _POINT_CACHE.get()
        timings = None
        if cache is None:
            graph = build_topology({**params, "nodes": nodes})
        else:
            graph, timings = cache.graph({**params, "nodes": nodes})
        # The graph was validated as it was built (run_workload would validate it again).
        replay = WorkloadReplay(
            workload,
            graph,
            algorithm=None if params["algorithm"] == "library" else params["algorithm"],
            comm_slowdown=params.get("comm_slowdown", 0.0),
            reduce_bandwidth=params.get("reduce_bandwidth"),
            protocol=params.get("protocol"),
            nccl=params.get("nccl"),
            timings=timings,
        )
        run = replay.run()
        result = breakdown(run)
        replay.close()  # its memory back now, not at the next full collection
    return workload, graph, result


def _run_workload(params: Mapping[str, Any]) -> dict[str, Any]:
    from ..workload.collection import collections_paused

    # Paused until the workload (its ops) is freed too: the first collection once the
    # collector is back walks every object made while it was off that still lives.
    with collections_paused():
        workload, _, breakdown = simulate_workload_point(params)
        row = {"ranks": workload.ranks, **breakdown.summary()}
        del workload, breakdown
    return row


def _gpus_per_server(params: Mapping[str, Any]) -> int:
    topology = params["topology"]
    if "graph" in topology:
        return len(gpu_nodes(build_topology({**params, "nodes": 1})))
    gpus = params.get("set", {}).get("server.gpus")
    if gpus is None:
        data = topology["data"] if "data" in topology else preset(topology["name"])
        gpus = data["server"]["gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise CcsimError(f"server.gpus must be a positive integer, got {gpus!r}")
    return gpus


def one_line(error: BaseException) -> str:
    """An error as one line (its type named unless it is a ccsim error)."""
    text = " ".join(str(error).split()) or type(error).__name__
    if not isinstance(error, CcsimError):
        text = f"{type(error).__name__}: {text}"
    return text
