"""Bundled topology presets (YAML files in the top-level ``topologies/`` folder) and
:func:`load_topology`, the single entry point the rest of ccsim uses.

The folder is found next to the source tree (editable installs, a checkout) or inside
the package as ``simulator/_data/topologies`` (wheels copy it there).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import CcsimError, TopologyError, shown, unknown_choice
from ..files import load_data
from .builders import cluster_graph, fabric_spec
from .graph import validate_topology
from .importers import PRESET_SUFFIXES, import_graph, import_preset, importer_for
from .rates import apply_rates, parse_rates
from .server import server_items
from .stacks import get_routing

_PACKAGE = Path(__file__).resolve().parents[1]
_TOP_KEYS = ("description", "fabric", "library", "name", "nccl", "rates", "server")


def data_dir(name: str) -> Path:
    """The bundled data folder ``name`` (``topologies`` or ``workloads``)."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise TopologyError(f"bundled folder {shown(name)} not found; reinstall ccsim")


def preset_files() -> dict[str, Path]:
    """Preset name -> YAML file, for every bundled preset."""
    return {path.stem: path for path in sorted(data_dir("topologies").glob("*.yaml"))}


def read_preset(path: Path) -> dict[str, Any]:
    """Load a preset file (or a server in another format, see
    :mod:`simulator.topology.importers`) and check its top-level keys."""
    imported = import_preset(path)  # an NCCL topology XML; None for a preset file
    if imported is not None:
        return imported
    data = load_data(path, what="topology preset", fmt="yaml", error=TopologyError)
    if not isinstance(data, dict) or "server" not in data:
        raise TopologyError(f"{Path(path).name}: a preset is a mapping with a 'server' section")
    unknown = sorted(set(data) - set(_TOP_KEYS), key=str)
    if unknown:
        raise TopologyError(
            f"{Path(path).name}: unknown key {shown(unknown[0])}; valid keys: "
            + ", ".join(_TOP_KEYS)
        )
    return data


def preset(name: str) -> dict[str, Any]:
    """The parsed YAML of a bundled preset or preset file, to tweak and rebuild.

    >>> preset("dgx-a100")["server"]["gpus"]
    8
    """
    return read_preset(_preset_path(name))


def list_presets() -> list[tuple[str, str]]:
    """(name, one-line description) for every bundled preset."""
    return [
        (name, " ".join(str(read_preset(path).get("description", "")).split()))
        for name, path in preset_files().items()
    ]


def preset_size(topology: str | Path | nx.Graph) -> tuple[int, int] | None:
    """(GPUs, nodes plus links) of one server of a preset, a preset file or an NCCL
    topology XML, counted from its numbers (:func:`~simulator.topology.server.server_items`)
    before anything is built; None for graphs and graph files (read whole, their size is
    the file's) and where the numbers are not plain counts (building then says why).

    >>> preset_size("dgx-a100")
    (8, 33)
    """
    if isinstance(topology, nx.Graph):
        return None
    importer = importer_for(topology)
    if importer is not None and importer.whole:
        return None
    try:
        path = _preset_path(topology)
    except CcsimError:
        return None  # an unknown name: load_topology says so, listing the valid ones
    server = read_preset(path).get("server")
    items = server_items(server)
    return None if items is None or not isinstance(server, Mapping) else (server["gpus"], items)


def _preset_path(topology: str | Path) -> Path:
    presets = preset_files()
    if str(topology) in presets:
        return presets[str(topology)]
    path = Path(str(topology))
    if path.suffix in (".yaml", ".yml", *PRESET_SUFFIXES):
        if not path.is_file():
            raise TopologyError(f"preset file {str(path)!r} not found")
        return path
    raise unknown_choice("topology", str(topology), presets)


def load_topology(
    topology: str | Path | nx.Graph,
    nodes: int | None = None,
    *,
    fabric: str | Mapping | None = None,
    seed: int | None = None,
    rates: object = None,
    routing: str | None = None,
) -> nx.Graph:
    """Resolve a preset name, a preset file, a graph file or a graph into a validated graph.

    Parameters
    ----------
    topology : str, Path or networkx.Graph
        A bundled preset name (``ccsim topologies``), a preset ``.yaml`` file, an NCCL
        topology ``.xml`` (a server, as a preset), a ``.graphml`` or node-link ``.json``
        graph file, an ASTRA-sim network ``.yml``, or a graph
        (:mod:`simulator.topology.importers`).
    nodes : int, optional
        Number of servers of a preset (default 1). Graphs and graph files are whole
        topologies, so only None or 1 is accepted for them.
    fabric : str or mapping, optional
        Fabric joining the servers of a preset: a name (rail-optimized, leaf-spine,
        fat-tree, single-switch) or a whole ``fabric`` section; default the preset's.
        Given explicitly, it is built even for one server (its NICs then reach a switch);
        so is a preset's own with ``single_server: true``.
    seed : int, optional
        ECMP hash seed (graph attribute ``ecmp_seed``); default the fabric's (0).
    routing : str, optional
        How switches pick among equal-cost paths, ``per_destination`` or ``ecmp``
        (``fabric.routing``, graph attribute ``routing``; ``--routing``); default the
        fabric's, else its NICs' network stack's.
    rates : str, list or mapping, optional
        Measured rates of single NICs and links, over the preset's own ``rates``
        section: ``s0/nic3=40GB/s``, a rates file or a mapping
        (:mod:`simulator.topology.rates`; errors name ``--nic-rate``).

    Examples
    --------
    >>> g = load_topology("dgx-a100", nodes=2)
    >>> sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    16
    >>> g = load_topology("dgx-h100", nodes=2, fabric="leaf-spine")
    >>> g.graph["fabric"]
    'leaf-spine'
    """
    path = None
    if not isinstance(topology, nx.Graph):
        graph = import_graph(topology)  # a whole-topology file; None for presets
        if graph is not None:
            path, topology = Path(str(topology)), graph
    if isinstance(topology, nx.Graph):
        source = path.name if path is not None else "the graph passed in"
        if nodes not in (None, 1) or fabric is not None:
            raise TopologyError(
                f"{source}: nodes= and fabric= apply to presets only; a graph is the whole "
                "topology, so build the multi-node graph yourself"
            )
        validate_topology(topology, source=source)
        if seed is not None or routing is not None:
            topology = topology.copy()  # never mutate the caller's graph
            if seed is not None:
                topology.graph["ecmp_seed"] = int(seed)
            if routing is not None:
                topology.graph["routing"] = get_routing(routing, field="--routing")
        return apply_rates(topology, parse_rates(rates))
    path = _preset_path(topology)
    data = read_preset(path)
    graph = preset_graph(
        {**data, "fabric": fabric_spec(data.get("fabric"), fabric)},
        1 if nodes is None else nodes,
        name=str(data.get("name", path.stem)),
        source=str(path.name),
        seed=seed,
        single_server_fabric=fabric is not None,
    )
    if routing is not None:
        graph.graph["routing"] = get_routing(routing, field="--routing")
    return apply_rates(graph, parse_rates(rates))


def preset_graph(
    data: Mapping[str, Any],
    nodes: int,
    *,
    name: str,
    source: str,
    seed: int | None = None,
    single_server_fabric: bool = False,
) -> nx.Graph:
    """The validated graph of a read preset (``data``, its ``fabric`` already resolved
    with :func:`~simulator.topology.builders.fabric_spec`) on ``nodes`` servers, with the
    library and its constants the preset names; errors name ``source``. Sweeps build
    their points' edited presets with it."""
    graph = cluster_graph(
        data["server"],
        nodes,
        fabric=data.get("fabric") or {},
        name=name,
        source=source,
        seed=seed,
        single_server_fabric=single_server_fabric,
    )
    validate_topology(graph, source=source)
    if "library" in data:
        # The communication library the machine runs (nccl unless said): the collective
        # layer checks the name and picks its policy (simulator.collective.library_of).
        graph.graph["library"] = str(data["library"])
    if "nccl" in data:
        # The communication library's constants, kept as read: the library layer
        # (simulator.library.protocol.calibration_of) parses and checks them.
        graph.graph["nccl"] = data["nccl"]
        graph.graph["nccl_source"] = source
    if data.get("rates") is not None:
        # Measured NIC and link rates (simulator.topology.rates), after the library's
        # constants: a measured rate is stored as the line rate its efficiency gives.
        where = f"{source}: rates"
        graph = apply_rates(graph, parse_rates(data["rates"], where=where), where=where)
    return graph
