"""Sweep specs: a base scenario, axes to vary, explicit points; validated up front.

A spec is YAML (or the same mapping in Python)::

    name: nic-knee                      # optional; default: the file name
    scenario:                           # the base point
      workload: {preset: ddp-gpt1.5b-16, ranks: all}   # or collective: all_reduce
      topology: dgx-a100                # preset name or preset/graph file
      nodes: 2
      set: {server.intra.latency: 0us}  # fixed topology overrides
    axes:                               # varied; the points are their Cartesian product
      server.nic.bandwidth: [50Gbps, 100Gbps, 200Gbps, 400Gbps]
      nodes: [2, 4]
    points:                             # optional: extra points, each a mapping of axes
      - {server.nic.bandwidth: 800Gbps, nodes: 2}

Faults (:mod:`simulator.network.faults`): the scenario key ``fault`` holds a fault spec
(inline strings, a list of them or a YAML file); a ``fault`` axis takes one spec per
value (``none`` for a healthy cluster), and ``fault.q``, ``fault.fraction``,
``fault.seed``... vary the options of its random fault (one is added if it has none),
e.g. ``fault.q: [0, 0.05, 0.1]`` with ``fault.seed: {min: 0, max: 19, step: 1}``.

Every value is parsed when the spec is loaded, so a typo in a name or a unit is reported
before anything runs, naming the file and the field (``sweep.yaml: axes.size[2]: ...``).
Combinations that only fail together (an algorithm that does not implement an
operation) are run and their error recorded in the point's row.

Each point becomes a :class:`Point`: its axis values (for the results' columns) and its
*params*, the whole resolved scenario as plain JSON data, which is what a worker runs
and what the point's key hashes. The key therefore changes when anything that affects
the result changes (the base scenario, a preset file's contents), and only then.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..algorithms import algorithm_names
from ..collective.guards import (
    POINT_FLOWS,
    Cluster,
    Estimate,
    ResourceError,
    check_flows,
    collective_estimate,
    sized_cluster,
)
from ..collective.policy import POLICIES
from ..collective.run import COLLECTIVE_OPS
from ..errors import CcsimError, shown
from ..files import load_data
from ..library.nccl_env import parse_nccl_env
from ..library.protocol import PROTOCOLS
from ..network.faults import (
    FILE_SUFFIXES,
    RANDOM_KEYS,
    load_faults,
    random_option,
    with_random_option,
)
from ..topology.fabrics import FABRICS
from ..topology.importers import GRAPH_SUFFIXES
from ..topology.presets import preset_files as topology_files
from ..topology.presets import read_preset
from ..topology.server import server_items
from ..topology.spec import parse_rate, parse_ratio
from ..units import parse_bandwidth, parse_size, parse_sizes, parse_time
from ..workload.generators import GENERATORS, MODELS
from ..workload.presets import SPEC_FORMAT
from ..workload.presets import preset_files as workload_files


class SweepError(CcsimError):
    """A sweep spec or results file is malformed."""


#: Scenario keys of both kinds, then of collectives and of workloads only.
COMMON_KEYS = (
    "topology",
    "nodes",
    "fabric",
    "seed",
    "set",
    "algorithm",
    "reduce_bandwidth",
    "protocol",
    "nccl",
    "fault",
)
COLLECTIVE_KEYS = ("collective", "size", "chunks", "channels", "root")
WORKLOAD_KEYS = ("workload", "comm_slowdown")
#: Scenario keys that may also be axes (``set`` is the topology paths themselves).
SCALAR_AXES = tuple(
    key for key in COMMON_KEYS + COLLECTIVE_KEYS + WORKLOAD_KEYS if key not in ("set",)
)
#: Prefixes of the other axes: topology paths, workload generator parameters and the
#: options of the random fault (``fault.q``, ``fault.seed``...; see
#: :mod:`simulator.network.faults`).
PATH_PREFIXES = ("server.", "fabric.", "workload.", "fault.")
_TOP_KEYS = ("name", "description", "scenario", "axes", "points")
#: Keys of a workload generator spec that are not the generator's parameters.
_SPEC_TEXT = ("format", "name", "description")
#: The algorithm value that means "what the topology's library runs" (nccl, or hccl on
#: the Ascend presets): every point's default, as every command's is. Chunks and
#: channels left out are the library's (or 1 for an algorithm run as given).
LIBRARY = "library"
_DEFAULTS = {
    "collective": {"algorithm": LIBRARY, "root": 0, "nodes": 1, "topology": "dgx-a100"},
    "workload": {"algorithm": LIBRARY, "comm_slowdown": 0.0, "topology": "dgx-a100"},
}


@dataclass(frozen=True)
class Point:
    """One point of a sweep.

    Attributes
    ----------
    index : int
        Position in the spec's order (product first, then explicit points).
    values : dict
        Axis name -> canonical value (bytes, bytes/s, seconds, counts, names): the
        point's columns in the results. Axes a point does not set hold the base value.
    params : dict
        The resolved scenario, plain JSON data: what :func:`~simulator.sweep.run_point`
        runs.
    key : str
        Stable hash of ``params`` (16 hex digits), the point's identity for resume.
    """

    index: int
    values: dict[str, Any]
    params: dict[str, Any] = field(repr=False)
    key: str


@dataclass
class Axis:
    """A varied parameter.

    ``values`` are the canonical values shown in the results' column (bytes, bytes/s,
    seconds, counts, names), ``labels`` how they were written, ``params`` what each value
    sets in a point's params (the same as ``values`` except for ``topology`` and
    ``workload``, whose column holds the name and whose params hold the resolved data).
    """

    name: str
    values: list[Any] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list, repr=False)

    @property
    def unit(self) -> str:
        """Unit of the canonical values: ``B/s``, ``s``, ``B``, ``1/s`` or ``""``."""
        return axis_unit(self.name)


@dataclass
class SweepSpec:
    """A parsed, validated sweep spec (see the module docstring).

    Build it with :func:`load_spec`.
    """

    name: str
    source: str
    kind: str
    axes: list[Axis]
    points: list[Point]
    base: dict[str, Any] = field(repr=False)
    description: str = ""
    duplicates: int = 0

    @property
    def columns(self) -> list[str]:
        """Axis columns of the results, in spec order."""
        return [axis.name for axis in self.axes]

    def label(self, axis: str, value: Any) -> str:
        """How ``value`` of ``axis`` was written in the spec (else a readable default)."""
        for item in self.axes:
            if item.name == axis:
                for known, text in zip(item.values, item.labels, strict=True):
                    if known == value:
                        return text
        return format_value(axis, value)


def axis_unit(name: str) -> str:
    """The unit of an axis's canonical values, from its name.

    >>> axis_unit("server.nic.bandwidth"), axis_unit("size"), axis_unit("fabric.latency")
    ('B/s', 'B', 's')
    """
    last = name.rsplit(".", 1)[-1]
    if last.endswith("bandwidth"):
        return "B/s"
    if last.endswith("latency"):
        return "s"
    if last == "size" or last.endswith("_bytes"):
        return "B"
    if last == "message_rate":
        return "1/s"
    return ""


def bandwidth_unit(axis: str) -> tuple[float, str]:
    """(factor from bytes/s, unit) in which a bandwidth axis reads best: network links
    (NICs, fabric ports) in Gb/s as their rates are quoted, others (NVLink, PCIe) in GB/s.

    >>> bandwidth_unit("server.nic.bandwidth"), bandwidth_unit("server.intra.bandwidth")
    ((8e-09, 'Gb/s'), (1e-09, 'GB/s'))
    """
    network = ".nic." in f".{axis}." and ".pcie." not in f".{axis}."
    if network or axis.startswith("fabric."):
        return 8e-9, "Gb/s"
    return 1e-9, "GB/s"


def format_value(axis: str, value: Any) -> str:
    """A canonical value in readable units (see :func:`bandwidth_unit`; us for latencies).

    >>> format_value("server.nic.bandwidth", 25e9), format_value("fabric.latency", 5e-7)
    ('200 Gb/s', '0.5 us')
    >>> format_value("server.intra.bandwidth", 300e9)
    '300 GB/s'
    """
    if value is None:
        return "default"
    unit = axis_unit(axis)
    if unit == "B/s" and isinstance(value, int | float):
        factor, name = bandwidth_unit(axis)
        return f"{value * factor:.4g} {name}"
    if unit == "s" and isinstance(value, int | float):
        return f"{value * 1e6:.4g} us"
    if unit == "B" and isinstance(value, int | float):
        for suffix, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
            if value >= scale:
                return f"{value / scale:.4g}{suffix}"
        return f"{value:.4g}B"
    return str(value)


def load_spec(
    source: str | Path | Mapping[str, Any],
    *,
    name: str | None = None,
    max_flows: int | None = None,
    nccl: str | Sequence[str] | Mapping[str, Any] | None = None,
    check_points: bool = True,
) -> SweepSpec:
    """Parse and validate a sweep spec.

    Parameters
    ----------
    source : path or mapping
        A YAML file, or the same mapping in Python (relative file names in it are then
        relative to the current folder).
    name : str, optional
        Name to use in messages and results (default: the spec's ``name``, else the
        file name).
    max_flows : int, optional
        The resource guard's limit (:mod:`simulator.collective.guards`): a spec with
        more points than it allows is refused before they are expanded.
    nccl : str, list of str or mapping, optional
        NCCL's environment settings for every point (``ccsim sweep --nccl``), as the
        scenario key ``nccl`` takes them (:func:`~simulator.library.nccl_env.
        parse_nccl_env`); a spec's own ``nccl`` must then agree, and no axis may vary it.
    check_points : bool
        Estimate every point here and refuse the whole spec if one would pass the limit
        (the default). False leaves each point's check to its run, which records a
        refusal in its row: ``ccsim search``, whose candidates are each simulated or
        refused on their own, and whose estimates here would cost a generator run each.

    Examples
    --------
    >>> spec = load_spec({"scenario": {"collective": "all_reduce", "size": "1M"},
    ...                   "axes": {"server.nic.bandwidth": ["100Gbps", "200Gbps"],
    ...                            "nodes": [2, 4]}})
    >>> len(spec.points), spec.points[0].values
    (4, {'server.nic.bandwidth': 12500000000.0, 'nodes': 2})
    """
    if isinstance(source, Mapping):
        data: Any = dict(source)
        origin, folder = name or str(data.get("name", "sweep spec")), Path(".")
    else:
        path = Path(source)
        origin, folder = str(path), path.parent
        data = load_data(path, what="sweep spec", fmt="yaml", error=SweepError)
    spec = _Parser(origin, folder, max_flows, check_points).parse(data, name, nccl=nccl)
    return spec


def point_key(params: Mapping[str, Any]) -> str:
    """The stable key of a point: a hash of its resolved params (16 hex digits).

    Local file paths are left out (files are identified by their contents' hash), so a
    results file resumes from another folder or machine.

    >>> point_key({"size": 1024}) == point_key({"size": 1024})
    True
    """
    text = json.dumps(_without_paths(params), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _without_paths(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_paths(v) for k, v in value.items() if k != "path"}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


class _Parser:
    """Parses one spec; ``origin`` prefixes every message, files resolve from ``folder``."""

    def __init__(
        self,
        origin: str,
        folder: Path,
        max_flows: int | None = None,
        check_points: bool = True,
    ):
        self.origin = origin
        self.folder = folder
        self.max_flows = max_flows
        self.checks_points = check_points
        self.kind = ""
        self.base: dict[str, Any] = {}
        self.workload_overrides: dict[str, Any] = {}

    def error(self, where: str, message: str) -> SweepError:
        return SweepError(f"{self.origin}: {where}: {message}")

    # -- top level -------------------------------------------------------------------

    def parse(self, data: Any, name: str | None, *, nccl: Any = None) -> SweepSpec:
        if not isinstance(data, Mapping):
            raise SweepError(
                f"{self.origin}: a sweep spec is a mapping with 'scenario' and 'axes' or 'points'"
            )
        unknown = sorted(set(data) - set(_TOP_KEYS), key=str)
        if unknown:
            raise self.error(unknown[0], f"unknown key; valid keys: {', '.join(_TOP_KEYS)}")
        scenario = data.get("scenario")
        if not isinstance(scenario, Mapping):
            raise self.error("scenario", "missing or not a mapping; give the base point")
        raw_axes = data.get("axes") or {}
        if not isinstance(raw_axes, Mapping):
            raise self.error("axes", "must be a mapping of axis name to a list of values")
        self.scenario(scenario, sized="size" in raw_axes)
        if nccl is not None:
            self.nccl_override(nccl, scenario, raw_axes, data.get("points") or [])

        axes = [self.axis(str(axis_name), raw) for axis_name, raw in raw_axes.items()]
        # Explicit points may add values to an axis's column; the product keeps its own.
        product = [list(zip(a.params, a.values, strict=True)) for a in axes]
        raw_points = data.get("points") or []
        if not isinstance(raw_points, list):
            raise self.error("points", "must be a list of mappings of axis name to value")
        explicit: list[dict[str, tuple[Any, Any]]] = []  # name -> (param, column value)
        known = {a.name: {_identity(param) for param in a.params} for a in axes}
        for i, raw in enumerate(raw_points):
            if not isinstance(raw, Mapping) or not raw:
                raise self.error(f"points[{i}]", "must be a non-empty mapping of axis to value")
            point = {}
            for axis_name, item in raw.items():
                where = f"points[{i}].{axis_name}"
                self.check_axis_name(str(axis_name), where)
                param, label = self.value(str(axis_name), item, where)
                point[str(axis_name)] = (param, self.column(str(axis_name), param, label))
                axis = next((a for a in axes if a.name == axis_name), None)
                if axis is None:  # a column that only explicit points set
                    axis = Axis(str(axis_name))
                    axes.append(axis)
                    known[axis.name] = set()
                if _identity(param) not in known[axis.name]:
                    known[axis.name].add(_identity(param))
                    axis.params.append(param)
                    axis.values.append(point[str(axis_name)][1])
                    axis.labels.append(label)
            if self.kind == "collective" and "size" not in self.base and "size" not in point:
                raise self.error(
                    f"points[{i}]", "no size; the scenario gives none, so give 'size' here"
                )
            explicit.append(point)
        if not axes:
            raise self.error("axes", "the sweep has no points; give 'axes' or 'points'")
        counts = {str(k): len(v) for k, v in zip(raw_axes, product, strict=True)}
        total = (math.prod(counts.values()) if product else 0) + len(explicit)
        what = f"{self.origin}: a sweep of {total:,} points"
        check_flows(Estimate(total * POINT_FLOWS, what), self.max_flows)
        self.check_contexts(axes, counts, explicit)

        combos: list[dict[str, tuple[Any, Any]]] = []
        if product:
            names = [str(name) for name in raw_axes]
            for items in itertools.product(*product):
                combos.append(dict(zip(names, items, strict=True)))
        combos += explicit

        points: list[Point] = []
        seen: set[str] = set()
        duplicates = 0
        for combo in combos:
            params = self.resolve({k: param for k, (param, _) in combo.items()})
            key = point_key(params)
            if key in seen:  # e.g. an explicit point the product already has
                duplicates += 1
                continue
            seen.add(key)
            values = {
                a.name: combo[a.name][1] if a.name in combo else self.base_value(a.name)
                for a in axes
            }
            points.append(Point(len(points), values, params, key))
        if self.checks_points:
            self.check_points(points)
        spec_name = name or str(data.get("name") or Path(self.origin).stem)
        return SweepSpec(
            name=spec_name,
            source=self.origin,
            kind=self.kind,
            axes=axes,
            points=points,
            base=self.base,
            description=str(data.get("description") or ""),
            duplicates=duplicates,
        )

    def check_points(self, points: list[Point]) -> None:
        """Refuse, before any runs, a sweep one of whose points would pass the resource
        guard's limit (``chunks: [1, 10000000]``, ``nodes: [1, 1000000]``): each point
        is estimated as its command estimates it (:mod:`simulator.collective.guards`),
        its topology counted from the preset's numbers before any is built; points that
        differ only in size at once. A point that cannot be estimated (its topology does
        not build) is left to its run, which records why in its row."""
        from ..workload.guards import generator_estimate
        from .point import _gpus_per_server, build_topology, preset_data

        clusters: dict[str, Cluster | None] = {}
        memo: dict[tuple, int] = {}  # transfers by algorithm and shape, counted once
        sizes: dict[str, tuple[Point, Cluster, list[float]]] = {}
        for point in points:
            p = point.params
            where = ", ".join(f"{k}={v}" for k, v in point.values.items() if k != "size")
            try:
                if self.kind == "workload" and "generator" in p["workload"]:
                    options = {k: v for k, v in p["workload"].items() if k not in _SPEC_TEXT}
                    if options.get("ranks") == "all":  # as the point runs it
                        options["ranks"] = (p.get("nodes") or 1) * _gpus_per_server(p)
                    if options["generator"] == "megatron":
                        options.setdefault("replicas", True)
                        options.setdefault("shadows", True)
                    estimate = generator_estimate(options.pop("generator"), options)
                    if estimate is not None:
                        self.check_estimate(estimate, where)
                if self.kind == "workload" and p.get("nodes") is None:
                    continue  # the workload sizes the cluster: its estimate above
                key = json.dumps(
                    [p["topology"], p.get("set"), p.get("fabric"), p.get("nodes")],
                    sort_keys=True,
                    default=str,
                )
                if key not in clusters:
                    clusters[key] = None  # a point that fails here fails in its row
                    data = preset_data(p)
                    server = None
                    if data is not None:
                        items = server_items(data.get("server"))
                        server = None if items is None else (data["server"]["gpus"], items)
                    name = p["topology"].get("name") or p["topology"].get("path")
                    clusters[key] = sized_cluster(
                        lambda n, p=p: build_topology({**p, "nodes": n, "fault": None}),
                        p.get("nodes"),
                        topology=str(name),
                        fabric=p.get("fabric"),
                        server=server,
                        max_flows=self.max_flows,
                    )
            except ResourceError as error:
                raise self.error(f"the point {where}", str(error)) from None
            except Exception:  # the point's run reports it in its row
                continue
            cluster = clusters[key]
            if cluster is None:
                continue
            self.check_estimate(cluster.estimate(), where)
            if self.kind == "collective":
                group = json.dumps(
                    [key, *(p.get(k) for k in ("collective", "algorithm", "chunks", "channels",
                                               "protocol", "nccl"))],
                    default=str,
                )  # fmt: skip
                sizes.setdefault(group, (point, cluster, []))[2].append(float(p["size"]))
        for point, cluster, group_sizes in sizes.values():
            p = point.params
            where = ", ".join(f"{k}={v}" for k, v in point.values.items() if k != "size")
            algorithm = cluster.library if p["algorithm"] == LIBRARY else p["algorithm"]
            try:
                estimate = collective_estimate(
                    cluster,
                    p["collective"],
                    group_sizes,
                    algorithm,
                    chunks=p.get("chunks"),
                    channels=p.get("channels"),
                    protocol=p.get("protocol"),
                    nccl=p.get("nccl"),
                    memo=memo,
                )
            except ResourceError:
                raise
            except Exception:  # the point's run reports it in its row
                continue
            self.check_estimate(estimate, where)

    def check_estimate(self, estimate: Estimate, where: str) -> None:
        """:func:`check_flows` with the sweep's limit, the message naming the point."""
        try:
            check_flows(estimate, self.max_flows)
        except ResourceError as error:
            raise self.error(f"the point {where}" if where else "a point", str(error)) from None

    # -- scenario --------------------------------------------------------------------

    def scenario(self, raw: Mapping[str, Any], *, sized: bool = False) -> None:
        """Parse the base point; ``sized``: an axis gives every product point its size."""
        has_collective, has_workload = "collective" in raw, "workload" in raw
        if has_collective == has_workload:
            raise self.error(
                "scenario", "give exactly one of 'collective' (an operation) or 'workload'"
            )
        self.kind = kind = "collective" if has_collective else "workload"
        valid = COMMON_KEYS + (COLLECTIVE_KEYS if has_collective else WORKLOAD_KEYS)
        unknown = sorted(set(raw) - set(valid), key=str)
        if unknown:
            raise self.error(
                f"scenario.{unknown[0]}",
                f"unknown key for a {kind} sweep; valid keys: {', '.join(sorted(valid))}",
            )
        if kind == "collective" and "size" not in raw and not sized:
            raise self.error(
                "scenario.size", "missing; give the message size, e.g. 64MiB, or a 'size' axis"
            )
        base: dict[str, Any] = {
            "kind": kind,
            "nodes": None,
            "fabric": None,
            "seed": None,
            "reduce_bandwidth": None,
            "set": {},
        }
        self.base = base
        # The topology first: checking topology paths needs it.
        ordered = sorted({**_DEFAULTS[kind], **raw}.items(), key=lambda kv: kv[0] != "topology")
        for key, value in ordered:
            if key != "set":
                base[key] = self.value(key, value, f"scenario.{key}", scenario=True)[0]
        sets = raw.get("set") or {}
        if not isinstance(sets, Mapping):
            raise self.error("scenario.set", "must be a mapping of topology path to value")
        for path, value in sets.items():
            where = f"scenario.set.{path}"
            if not str(path).startswith(("server.", "fabric.")):
                raise self.error(where, "'set' holds topology paths (server.*, fabric.*)")
            self.check_axis_name(str(path), where)
            base["set"][str(path)] = self.value(str(path), value, where)[0]
        if base["set"]:
            self.check_topology(base["topology"], base["set"], base["fabric"], "scenario.set")

    def nccl_override(
        self, nccl: Any, scenario: Mapping[str, Any], axes: Mapping[str, Any], points: Any
    ) -> None:
        """Give every point the NCCL settings ``nccl`` (``--nccl``); the spec may state
        the same ones, but not others, nor vary them."""
        text = parse_nccl_env(nccl).text or None
        if "nccl" in axes or any(isinstance(p, Mapping) and "nccl" in p for p in points):
            raise self.error("axes.nccl", "--nccl sets every point's NCCL settings: no nccl axis")
        if "nccl" in scenario and self.base.get("nccl") != text:
            raise self.error(
                "scenario.nccl",
                f"{self.base.get('nccl')} disagrees with --nccl {text}: give one of them",
            )
        if text is not None:
            self.base["nccl"] = text

    # -- axes and values -------------------------------------------------------------

    def check_axis_name(self, name: str, where: str) -> None:
        if name in SCALAR_AXES:
            if name in COLLECTIVE_KEYS and self.kind != "collective":
                raise self.error(
                    where, f"{shown(name)} varies collectives; this is a workload sweep"
                )
            if name in WORKLOAD_KEYS and self.kind != "workload":
                raise self.error(
                    where, f"{shown(name)} varies workloads; this is a collective sweep"
                )
            return
        if name == "fabric.type":
            raise self.error(where, "vary the fabric type with the axis 'fabric' (as --fabric)")
        if name.startswith(("server.", "fabric.")):
            if any(not part for part in name.split(".")):
                raise self.error(where, f"bad topology path {shown(name)}")
            if "graph" in self.base.get("topology", {}):
                raise self.error(
                    where, "topology paths apply to presets; this topology is a graph file"
                )
            return
        if name.startswith("workload."):
            if self.kind != "workload":
                raise self.error(
                    where, f"{shown(name)} varies a workload; this is a collective sweep"
                )
            generator = self.base["workload"].get("generator")
            if generator is None:
                raise self.error(
                    where,
                    "workload parameters apply to generator specs (ddp, zero3, megatron, "
                    "moe); this workload is a trace file",
                )
            param = name.split(".", 1)[1]
            accepted = inspect.signature(GENERATORS[generator]).parameters
            if param not in accepted:
                raise self.error(
                    where,
                    f"unknown parameter {shown(param)} for generator {generator}; valid: "
                    + _join(accepted),
                )
            return
        if name.startswith("fault."):
            if name.split(".", 1)[1] not in RANDOM_KEYS:
                valid = ", ".join(f"fault.{key}" for key in RANDOM_KEYS)
                raise self.error(where, f"unknown fault axis {shown(name)}; valid: {valid}")
            return
        raise self.error(
            where,
            f"unknown axis {shown(name)}; valid axes: {', '.join(SCALAR_AXES)}, a topology path "
            "(server.nic.bandwidth, server.intra.bandwidth, fabric.oversubscription, "
            "fabric.latency...), workload.PARAM or fault.OPTION (fault.q, fault.seed...)",
        )

    def axis(self, name: str, raw: Any) -> Axis:
        where = f"axes.{name}"
        self.check_axis_name(name, where)
        labels: list[str] | None = None
        if name == "size" and isinstance(raw, str):
            try:
                raw = parse_sizes(raw)
            except CcsimError as error:
                raise self.error(where, str(error)) from None
            labels = [format_value(name, v) for v in raw]
        elif isinstance(raw, Mapping):
            raw = self.range(name, raw, where)
            labels = [format_value(name, v) for v in raw]
        if not isinstance(raw, list):
            raise self.error(
                where,
                f"give a list of values, e.g. [a, b] (got {shown(raw)}); a single value belongs "
                "in 'scenario'",
            )
        if not raw:
            raise self.error(where, "empty list: the product of the axes would be empty")
        axis = Axis(name)
        seen: set[Any] = set()  # a set, not a scan of the list: 40,000 values parse at once
        for i, item in enumerate(raw):
            param, label = self.value(name, item, f"{where}[{i}]")
            if _identity(param) in seen:
                raise self.error(f"{where}[{i}]", f"{label} repeats an earlier value")
            seen.add(_identity(param))
            label = labels[i] if labels else label
            axis.params.append(param)
            axis.values.append(self.column(name, param, label))
            axis.labels.append(label)
        return axis

    def range(self, name: str, raw: Mapping[str, Any], where: str) -> list[Any]:
        """``{min, max, factor}`` (geometric) or ``{min, max, step}`` (linear)."""
        if set(raw) not in ({"min", "max", "factor"}, {"min", "max", "step"}):
            raise self.error(
                where, "a range is {min: A, max: B, factor: F} or {min: A, max: B, step: S}"
            )
        low = self.value(name, raw["min"], f"{where}.min")[0]
        high = self.value(name, raw["max"], f"{where}.max")[0]
        if not _is_number(low) or not _is_number(high) or high < low:
            raise self.error(where, "a range needs numbers with min <= max")
        if "factor" in raw:
            factor = raw["factor"]
            if not _is_number(factor) or factor <= 1 or low <= 0:
                raise self.error(f"{where}.factor", "must be a number above 1 (and min > 0)")
            count = math.floor(math.log(high / low) / math.log(factor) + 1e-9) + 1
            values = [low * factor**k for k in range(count)]
        else:
            step = self.value(name, raw["step"], f"{where}.step")[0]
            if not _is_number(step) or step <= 0:
                raise self.error(f"{where}.step", "must be a positive number")
            count = math.floor((high - low) / step + 1e-9) + 1
            values = [low + k * step for k in range(count)]
        if count > 100_000:
            raise self.error(where, f"the range has {count} values; use a larger step")
        if isinstance(low, int) and isinstance(high, int):
            values = [round(v) for v in values]  # counts and byte sizes stay integers
        return values

    def value(self, name: str, raw: Any, where: str, *, scenario: bool = False) -> tuple[Any, str]:
        """(param value, label) of one value of axis or scenario key ``name``."""
        label = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)
        try:
            return self._value(name, raw, where, scenario), label
        except SweepError:
            raise
        except CcsimError as error:
            raise self.error(where, str(error)) from None

    def column(self, name: str, param: Any, label: str) -> Any:
        """The results column value of a param value: names for topology and workload."""
        return label if name in ("topology", "workload", "fault") else param

    def _value(self, name: str, raw: Any, where: str, scenario: bool) -> Any:
        if name == "collective":
            if raw not in COLLECTIVE_OPS:
                valid = _join(COLLECTIVE_OPS)
                raise self.error(where, f"unknown operation {shown(raw)}; valid: {valid}")
            return raw
        if name == "algorithm":
            names = (LIBRARY, *POLICIES, "auto", *algorithm_names())
            if raw not in names:
                raise self.error(where, f"unknown algorithm {shown(raw)}; valid: {_join(names)}")
            return raw
        if name == "size":
            size = parse_size(raw, field="size")
            if not size >= 1:
                raise self.error(where, f"{shown(raw)} is not a positive number of bytes")
            return round(size)
        if name in ("chunks", "channels", "nodes"):
            return self.integer(raw, where, minimum=1)
        if name in ("root", "seed"):
            return self.integer(raw, where, minimum=0)
        if name == "reduce_bandwidth":
            return parse_bandwidth(raw, field=name)
        if name == "protocol":
            # Specs without a protocol leave it out of the params (their points keep
            # their keys); "ideal" (or null) is the line-rate model, for an axis.
            if raw in (None, "ideal"):
                return None
            if raw not in (*PROTOCOLS, "auto"):
                valid = _join([*PROTOCOLS, "auto", "ideal"])
                raise self.error(where, f"unknown protocol {shown(raw)}; valid: {valid}")
            return raw
        if name == "nccl":
            # NCCL's settings as text (NCCL_ALGO=Ring ...) or a mapping of them, kept as
            # their canonical text; none (or null) for NCCL's defaults, for an axis.
            if raw in (None, "none", ""):
                return None
            return parse_nccl_env(raw).text
        if name == "comm_slowdown":
            if not _is_number(raw) or not 0 <= raw < 1:
                raise self.error(where, f"must be a fraction in [0, 1), got {shown(raw)}")
            return float(raw)
        if name == "fabric":
            if scenario and isinstance(raw, Mapping):
                return dict(raw)  # a whole fabric section, as load_topology(fabric={...})
            if raw not in FABRICS:
                raise self.error(where, f"unknown fabric {shown(raw)}; valid: {_join(FABRICS)}")
            return raw
        if name == "topology":
            return self.topology(raw, where)
        if name == "workload":
            return self.workload(raw, where, scenario=scenario)
        if name.startswith("workload."):
            return self.workload_value(name.split(".", 1)[1], raw, where)
        if name == "fault":
            return self.faults(raw)
        if name.startswith("fault."):
            return random_option(name.split(".", 1)[1], raw, where)
        return self.topology_value(name, raw, where)

    def faults(self, raw: Any) -> list[dict[str, Any]]:
        """A fault spec (an inline string, a YAML file, a list of them, or none/null for
        a healthy cluster) as plain data; files are read now and travel with the point."""
        if raw in (None, "none"):
            return []
        items = raw if isinstance(raw, list) else [raw]
        local = [
            str(self.folder / item)
            if isinstance(item, str)
            and item.lower().endswith(FILE_SUFFIXES)
            and not Path(item).is_absolute()
            else item
            for item in items
        ]
        return load_faults(local).data()

    def integer(self, raw: Any, where: str, *, minimum: int) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
            raise self.error(where, f"must be an integer >= {minimum}, got {shown(raw)}")
        return raw

    def topology_value(self, name: str, raw: Any, where: str) -> Any:
        """Parse a topology path's value by the unit its last key implies."""
        unit = axis_unit(name)
        if unit == "B/s":
            return parse_bandwidth(raw, field=name)
        if unit == "s":
            value = parse_time(raw, field=name)
            if not (value >= 0 and math.isfinite(value)):
                raise self.error(where, f"latencies are finite and >= 0, got {shown(raw)}")
            return value
        if unit == "1/s":
            return parse_rate(raw, field=name)
        if name.rsplit(".", 1)[-1] == "oversubscription":
            return parse_ratio(raw, field=name)
        if isinstance(raw, float) and not math.isfinite(raw):
            raise self.error(where, f"{shown(raw)} is not a finite number")
        return copy.deepcopy(raw)

    def topology(self, raw: Any, where: str) -> dict[str, Any]:
        """A preset name -> {name}; a preset file -> {name, data}; a graph file -> {graph}."""
        if not isinstance(raw, str) or not raw:
            raise self.error(where, f"give a preset name or a file, got {shown(raw)}")
        presets = topology_files()
        if raw in presets:
            return {"name": raw}
        path = Path(raw) if Path(raw).is_absolute() else self.folder / raw
        if path.suffix in (".yaml", ".yml", *GRAPH_SUFFIXES):
            if not path.is_file():
                raise self.error(where, f"topology file {str(path)!r} not found")
            if path.suffix in GRAPH_SUFFIXES:
                # Graph files are read where the point runs; the key hashes their contents.
                return {"graph": path.name, "path": str(path.resolve()), "sha256": _digest(path)}
            # Preset files travel with the point, so workers need no access to the file.
            try:
                return {"name": path.stem, "data": read_preset(path)}
            except CcsimError as error:
                raise self.error(where, str(error)) from None
        raise self.error(
            where,
            f"unknown topology {shown(raw)}; valid presets: {_join(presets)}, or a .yaml file",
        )

    def workload(self, raw: Any, where: str, *, scenario: bool) -> dict[str, Any]:
        """A generator spec ({generator, params...}) or a trace file ({file, sha256})."""
        params: dict[str, Any] = {}
        if isinstance(raw, Mapping):
            sources = [k for k in ("preset", "generator", "file") if k in raw]
            if len(sources) != 1:
                raise self.error(
                    where, "a workload mapping has one of 'preset', 'generator' or 'file'"
                )
            source = sources[0]
            params = {str(k): v for k, v in raw.items() if k != source}
            if source == "generator":
                if raw["generator"] not in GENERATORS:
                    raise self.error(
                        f"{where}.generator",
                        f"unknown generator {shown(raw['generator'])}; valid: {_join(GENERATORS)}",
                    )
                spec: dict[str, Any] = {"generator": raw["generator"], "name": raw["generator"]}
            else:
                spec = self.workload_source(raw[source], f"{where}.{source}")
        else:
            spec = self.workload_source(raw, where)
        if "generator" not in spec:
            if params:
                raise self.error(where, "parameters apply to generator specs, not trace files")
            return spec
        spec.pop("format", None)
        spec.pop("description", None)
        accepted = inspect.signature(GENERATORS[spec["generator"]]).parameters
        if not scenario:  # parameters the scenario set carry over to every workload
            spec.update({k: v for k, v in self.workload_overrides.items() if k in accepted})
        for key, value in params.items():
            if key not in accepted:
                raise self.error(
                    f"{where}.{key}",
                    f"unknown parameter for generator {spec['generator']}; valid: "
                    + _join(accepted),
                )
            spec[key] = self.workload_value(key, value, f"{where}.{key}")
            if scenario:
                self.workload_overrides[key] = spec[key]
        return spec

    def workload_source(self, raw: Any, where: str) -> dict[str, Any]:
        if not isinstance(raw, str) or not raw:
            raise self.error(where, f"give a workload preset name or file, got {shown(raw)}")
        presets = workload_files()
        path = presets.get(raw)
        if path is None:
            path = Path(raw) if Path(raw).is_absolute() else self.folder / raw
            if not path.is_file():
                raise self.error(
                    where,
                    f"unknown workload {shown(raw)}; valid presets: {_join(presets)}, or a file",
                )
        if path.suffix in (".yaml", ".yml"):
            try:
                data = load_data(path, what="workload", fmt="yaml")
            except CcsimError as error:
                raise self.error(where, str(error)) from None
            if isinstance(data, dict) and data.get("format") == SPEC_FORMAT:
                if data.get("generator") not in GENERATORS:
                    raise self.error(
                        where, f"{path}: unknown generator {shown(data.get('generator'))}"
                    )
                # Generator specs travel with the point, as preset files do.
                return {"name": path.stem, **data}
        return {"file": path.name, "path": str(path.resolve()), "sha256": _digest(path)}

    def workload_value(self, param: str, raw: Any, where: str) -> Any:
        if param == "ranks":
            return "all" if raw == "all" else self.integer(raw, where, minimum=1)
        if param == "model":
            if raw not in MODELS:
                raise self.error(where, f"unknown model {shown(raw)}; valid: {_join(MODELS)}")
            return raw
        if param.endswith("_bytes"):
            return round(parse_size(raw, field=param))
        return copy.deepcopy(raw)

    # -- cross-checks and resolution ------------------------------------------------

    def check_contexts(
        self, axes: list[Axis], product: Mapping[str, int], explicit: list[dict]
    ) -> None:
        """Build the topology (one server) for each value of each topology path.

        A value is accepted when it builds under any of the topologies and fabrics the
        sweep visits, so ``fabric.oversubscription`` passes next to a ``fabric`` axis that
        includes leaf-spine; a combination that fails is recorded in its row.
        """
        # ``product``: axis name -> how many of its values the product uses (the rest
        # come from explicit points, checked with their own point below).
        values = {a.name: a.params[: product[a.name]] for a in axes if a.name in product}
        topologies = values.get("topology", [self.base["topology"]])
        fabrics = values.get("fabric", [self.base["fabric"]])
        contexts = list(itertools.product(topologies, fabrics))
        for name, items in values.items():
            if not name.startswith(("server.", "fabric.")):
                continue
            for i, value in enumerate(items):
                paths = {**self.base["set"], name: value}
                errors = []
                for topology, fabric in contexts:
                    try:
                        self.check_topology(topology, paths, fabric, f"axes.{name}[{i}]")
                        break
                    except SweepError as error:
                        errors.append(error)
                else:
                    raise errors[0]
        for i, point in enumerate(explicit):
            paths = {k: v for k, (v, _) in point.items() if k.startswith(("server.", "fabric."))}
            if paths:
                topology = point.get("topology", (self.base["topology"],))[0]
                fabric = point.get("fabric", (self.base["fabric"],))[0]
                self.check_topology(topology, {**self.base["set"], **paths}, fabric, f"points[{i}]")

    def check_topology(self, topology: dict, paths: dict, fabric: Any, where: str) -> None:
        from .point import build_topology  # the code the workers run

        if "graph" in topology:
            if paths:
                raise self.error(where, "topology paths apply to presets, not to graph files")
            return
        try:
            build_topology({"topology": topology, "set": paths, "fabric": fabric, "nodes": 1})
        except CcsimError as error:
            raise self.error(where, str(error)) from None

    def resolve(self, combo: Mapping[str, Any]) -> dict[str, Any]:
        """The params of one point: the base scenario with the point's values applied."""
        params = copy.deepcopy(self.base)
        # A workload axis replaces the whole workload before its parameters are applied.
        # So does a fault axis before its random fault's options (fault.q, fault.seed...).
        for name in sorted(combo, key=lambda n: n not in ("workload", "fault")):
            value = copy.deepcopy(combo[name])
            if name.startswith(("server.", "fabric.")):
                params["set"][name] = value
            elif name.startswith("fault."):
                key = name.split(".", 1)[1]
                params["fault"] = with_random_option(params.get("fault"), key, value)
            elif name.startswith("workload."):
                if "generator" not in params["workload"]:
                    raise SweepError(f"{self.origin}: {name} needs a generator spec workload")
                params["workload"][name.split(".", 1)[1]] = value
            else:
                params[name] = value
        return params

    def base_value(self, name: str) -> Any:
        """The column value of a point that does not set axis ``name``."""
        if name.startswith(("server.", "fabric.")):
            return self.base["set"].get(name)  # None: the preset's own value or default
        if name.startswith("workload."):
            return self.base["workload"].get(name.split(".", 1)[1])
        if name == "fault":
            return str(load_faults(self.base.get("fault"))) or "none"
        if name.startswith("fault."):
            for item in self.base.get("fault") or []:
                if "random" in item:
                    return item["random"].get(name.split(".", 1)[1])
            return None
        value = self.base.get(name)
        if isinstance(value, dict):  # topology or workload: its name
            return value.get("name") or value.get("graph") or value.get("file")
        return value


def _identity(value: Any) -> Any:
    """What tells two values of an axis apart, hashable: the value itself (so that 1 and
    1.0 are one value, as ``==`` says), or the JSON text of a mapping or list."""
    try:
        hash(value)
    except TypeError:
        return (list, json.dumps(value, sort_keys=True, default=str))
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _join(names: Any) -> str:
    return ", ".join(sorted(map(str, names)))
