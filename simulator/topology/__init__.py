"""Topologies: networkx graphs of GPUs, switches, NICs and links.

See :mod:`simulator.topology.graph` for the attribute conventions every graph follows,
``topologies/README.md`` for the preset file schema.
"""

from .builders import cluster_graph, fabric_spec, ring_graph
from .fabrics import FABRICS, get_fabric
from .graph import NODE_KINDS, gpu_nodes, nodes_of_kind, servers_of_ranks, validate_topology
from .importers import read_graph
from .presets import list_presets, load_topology, preset
from .summary import TopologySummary, bisection_bandwidth, summarize

__all__ = [
    "FABRICS",
    "NODE_KINDS",
    "TopologySummary",
    "bisection_bandwidth",
    "cluster_graph",
    "fabric_spec",
    "get_fabric",
    "gpu_nodes",
    "list_presets",
    "load_topology",
    "nodes_of_kind",
    "preset",
    "read_graph",
    "ring_graph",
    "servers_of_ranks",
    "summarize",
    "validate_topology",
]
