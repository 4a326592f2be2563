"""Topologies: networkx graphs of GPUs, switches, NICs and links.

See :mod:`simulator.topology.graph` for the attribute conventions every graph follows.
"""

from .builders import cluster_graph, ring_graph
from .graph import NODE_KINDS, gpu_nodes, servers_of_ranks, validate_topology
from .presets import list_presets, load_topology

__all__ = [
    "NODE_KINDS",
    "cluster_graph",
    "gpu_nodes",
    "list_presets",
    "load_topology",
    "ring_graph",
    "servers_of_ranks",
    "validate_topology",
]
