"""Bundled topology presets: YAML files in the top-level ``topologies/`` folder.

The folder is found next to the source tree (editable installs, a checkout) or inside
the package as ``simulator/_data/topologies`` (wheels copy it there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from ..errors import TopologyError, unknown_choice
from .builders import cluster_graph
from .graph import validate_topology

_PACKAGE = Path(__file__).resolve().parents[1]


def data_dir(name: str) -> Path:
    """The bundled data folder ``name`` (``topologies`` or ``workloads``)."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise TopologyError(f"bundled folder {name!r} not found; reinstall ccsim")


def preset_files() -> dict[str, Path]:
    """Preset name -> YAML file, for every bundled preset."""
    return {path.stem: path for path in sorted(data_dir("topologies").glob("*.yaml"))}


def read_preset(path: Path) -> dict[str, Any]:
    """Load a preset file and check its top-level keys."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise TopologyError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict) or "server" not in data:
        raise TopologyError(f"{path}: a preset is a mapping with a 'server' section")
    unknown = sorted(set(data) - {"name", "description", "server", "fabric"})
    if unknown:
        raise TopologyError(
            f"{path}: unknown key {unknown[0]!r}; valid keys: description, fabric, name, server"
        )
    return data


def list_presets() -> list[tuple[str, str]]:
    """(name, one-line description) for every bundled preset."""
    return [
        (name, str(read_preset(path).get("description", "")).strip())
        for name, path in preset_files().items()
    ]


def load_topology(topology: str | Path | nx.Graph, nodes: int | None = None) -> nx.Graph:
    """Resolve a preset name, a preset file or a user's graph into a validated graph.

    A graph passed in is validated and returned as is (``nodes`` must then be None or 1).

    >>> g = load_topology("dgx-a100", nodes=2)
    >>> sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    16
    """
    if isinstance(topology, nx.Graph):
        if nodes not in (None, 1):
            raise TopologyError(
                "nodes= applies to presets only; build the multi-node graph yourself"
            )
        validate_topology(topology, source="the graph passed in")
        return topology
    path = Path(str(topology))
    presets = preset_files()
    if str(topology) in presets:
        path = presets[str(topology)]
    elif not (path.suffix in (".yaml", ".yml") and path.is_file()):
        raise unknown_choice("topology", str(topology), presets)
    data = read_preset(path)
    graph = cluster_graph(
        data["server"],
        1 if nodes is None else nodes,
        fabric=data.get("fabric"),
        name=str(data.get("name", path.stem)),
        source=str(path.name),
    )
    validate_topology(graph, source=path.name)
    return graph
