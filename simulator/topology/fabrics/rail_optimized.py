"""``rail-optimized``: NIC k of every server on leaf k (rail k), leaves joined by spines.

Traffic between GPUs of the same local index stays on its rail (one switch); other
traffic climbs to a spine, chosen per flow by the ECMP hash. A leaf has one downlink per
server; its uplink bandwidth is that divided by ``oversubscription``, split evenly over
the spines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from .base import Fabric, FabricConfig, add_switch, attach_nic, port_bandwidth
from .leaf_spine import spine_layer


@dataclass(frozen=True)
class RailOptimizedConfig(FabricConfig):
    """Parameters of a rail-optimized fabric."""

    spines: int | None = field(
        default=None,
        metadata={
            "unit": "count",
            "help": "spine switches (count; default: a leaf's uplink ports, i.e. the "
            "number of servers / oversubscription, rounded up)",
        },
    )
    oversubscription: float = field(
        default=1.0,
        metadata={
            "unit": "ratio",
            "help": "a leaf's downlink to uplink bandwidth (ratio, e.g. 2 or '2:1'; default 1)",
        },
    )


class RailOptimized(Fabric):
    """One leaf per rail (NIC index); spines join the rails."""

    name = "rail-optimized"
    description = "NIC k of every server on leaf k (a rail), leaves joined by spines"
    Config = RailOptimizedConfig

    def build(self, graph: nx.Graph, nics: list[list[str]], config: RailOptimizedConfig) -> None:
        port = port_bandwidth(graph, nics, config)
        rails = max(len(server) for server in nics)
        leaves = []
        for k in range(rails):
            leaves.append(add_switch(graph, f"leaf{k}", "leaf"))
            graph.nodes[leaves[-1]]["rail"] = k
        for server in nics:
            for k, nic in enumerate(server):
                attach_nic(graph, nic, leaves[k], config, port)
        per_port = min(port, max(float(graph.nodes[n]["bandwidth"]) for s in nics for n in s))
        spine_layer(
            graph, leaves, len(nics), per_port, config, config.spines, config.oversubscription
        )
