"""Topology files written by other tools, one importer per format, looked up by file.

``graphml``, ``json`` (:mod:`.graph_files`)
    A GraphML or networkx node-link JSON graph: the whole topology.
``nccl-xml`` (:mod:`.nccl_xml`)
    An ``.xml`` topology dump of NCCL (``NCCL_TOPO_DUMP_FILE``): one server, read as a
    preset, so ``--nodes`` and ``--fabric`` build a cluster of it as of a bundled preset.
``astra-sim`` (:mod:`.astra_sim`)
    A ``.yaml``/``.yml`` file holding ``topology`` and ``npus_count``: ASTRA-sim's
    analytical network, the whole topology. Any other ``.yaml`` file is a ccsim preset
    (:mod:`simulator.topology.presets`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from ...errors import TopologyError
from ...files import load_data
from .astra_sim import astra_sim_graph, is_astra_sim, read_astra_sim
from .graph_files import GRAPH_SUFFIXES, normalize_graph, read_graph
from .nccl_xml import read_nccl_xml


@dataclass(frozen=True)
class Importer:
    """One foreign topology format: which files it reads and what it makes of them."""

    #: Name of the format, as listed in messages.
    name: str
    #: File name endings it reads (``.xml``).
    suffixes: tuple[str, ...]
    #: What such a file is, for messages.
    what: str
    #: True: the file is the whole topology (a graph); False: one server (preset data).
    whole: bool
    #: Path -> graph (``whole``) or preset data.
    read: Callable[[Path], Any]
    #: For endings other formats share (``.yaml``): whether the parsed file is this format.
    detect: Callable[[Any], bool] | None = None


#: Every importer by name.
IMPORTERS = {
    importer.name: importer
    for importer in (
        Importer("graphml", (".graphml",), "GraphML graph", True, read_graph),
        Importer("json", (".json",), "node-link JSON graph", True, read_graph),
        Importer("nccl-xml", (".xml",), "NCCL topology XML", False, read_nccl_xml),
        Importer(
            "astra-sim",
            (".yaml", ".yml"),
            "ASTRA-sim network file",
            True,
            read_astra_sim,
            detect=is_astra_sim,
        ),
    )
}

#: Endings of files that hold one server in another format (read as presets).
PRESET_SUFFIXES = tuple(
    suffix for importer in IMPORTERS.values() if not importer.whole for suffix in importer.suffixes
)


def importer_for(path: str | Path) -> Importer | None:
    """The importer that reads ``path``, or None (a preset name or a ccsim preset file).

    A ``.yaml`` file is read to tell an ASTRA-sim network from a preset.

    >>> importer_for("topo.xml").name, importer_for("ring.graphml").name, importer_for("dgx-h100")
    ('nccl-xml', 'graphml', None)
    """
    path = Path(str(path))
    for importer in IMPORTERS.values():
        if path.suffix not in importer.suffixes:
            continue
        if importer.detect is None:
            return importer
        if path.is_file():
            data = load_data(path, what="topology file", fmt="yaml", error=TopologyError)
            if importer.detect(data):
                return importer
    return None


def import_graph(topology: str | Path) -> nx.Graph | None:
    """The graph of a file that is a whole topology, or None for anything else.

    Raises :class:`~simulator.errors.TopologyError` when such a file is missing or bad.
    """
    path = Path(str(topology))
    importer = importer_for(path)
    if importer is None or not importer.whole:
        return None
    if not path.is_file():
        raise TopologyError(f"graph file {str(path)!r} not found")
    return importer.read(path)


def import_preset(path: str | Path) -> dict[str, Any] | None:
    """The preset data of a server file in another format (NCCL's topology XML), or None
    for a ccsim preset file. A whole topology has no server to build or edit: refused."""
    path = Path(str(path))
    importer = importer_for(path)
    if importer is None:
        return None
    if importer.whole:
        raise TopologyError(
            f"{path.name} ({importer.what}) is a whole topology, not a server preset; use it "
            "as --topology (or load_topology) without --nodes and --fabric"
        )
    return importer.read(path)


__all__ = [
    "GRAPH_SUFFIXES",
    "IMPORTERS",
    "PRESET_SUFFIXES",
    "Importer",
    "astra_sim_graph",
    "import_graph",
    "import_preset",
    "importer_for",
    "is_astra_sim",
    "normalize_graph",
    "read_astra_sim",
    "read_graph",
    "read_nccl_xml",
]
