"""``leaf-spine``: servers grouped under leaf switches, leaves joined by spines.

All NICs of a server go to the same leaf. A leaf's uplink bandwidth is its downlink
bandwidth divided by ``oversubscription``, split evenly over the spines (one link per
leaf and spine, carrying the bandwidth of all the cables between them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx

from .base import Fabric, FabricConfig, add_switch, attach_nic, join_switches, port_bandwidth

# Ports of a leaf facing servers when servers_per_leaf is not given: half of a common
# 64-port switch, the other half facing spines.
LEAF_DOWN_PORTS = 32


@dataclass(frozen=True)
class LeafSpineConfig(FabricConfig):
    """Parameters of a two-tier leaf-spine fabric."""

    servers_per_leaf: int | None = field(
        default=None,
        metadata={
            "unit": "count",
            "help": f"servers cabled to each leaf (count; default: as many as fill "
            f"{LEAF_DOWN_PORTS} leaf ports, at least 1)",
        },
    )
    spines: int | None = field(
        default=None,
        metadata={
            "unit": "count",
            "help": "spine switches (count; default: a leaf's uplink ports, i.e. its "
            "downlinks / oversubscription, rounded up)",
        },
    )
    oversubscription: float = field(
        default=1.0,
        metadata={
            "unit": "ratio",
            "help": "a leaf's downlink to uplink bandwidth (ratio, e.g. 2 or '2:1'; default 1)",
        },
    )


def spine_layer(
    graph: nx.Graph,
    leaves: list[str],
    downlinks: int,
    per_port: float,
    config: FabricConfig,
    spines: int | None,
    oversubscription: float,
) -> None:
    """Join ``leaves`` (each with ``downlinks`` ports of ``per_port``) through spines."""
    if len(leaves) < 2:
        return  # one leaf already joins everything; spines would carry nothing
    count = spines or max(1, math.ceil(downlinks / oversubscription))
    uplink = downlinks * per_port / oversubscription / count
    # Whole cables of one port each: a share below one port (more spines than uplink
    # ports) still takes one cable; 1e-9 absorbs float rounding of exact multiples.
    cables = max(1, math.ceil(uplink / per_port - 1e-9))
    names = [add_switch(graph, f"spine{i}", "spine") for i in range(count)]
    for leaf in leaves:
        for spine in names:
            join_switches(graph, leaf, spine, uplink, config, cables)


class LeafSpine(Fabric):
    """Two-tier Clos: leaves hold whole servers, every leaf links to every spine."""

    name = "leaf-spine"
    description = "servers under leaf switches, leaves joined by spines (oversubscription)"
    Config = LeafSpineConfig

    def build(self, graph: nx.Graph, nics: list[list[str]], config: LeafSpineConfig) -> None:
        port = port_bandwidth(graph, nics, config)
        per_server = max(len(server) for server in nics)
        per_leaf = config.servers_per_leaf or max(1, LEAF_DOWN_PORTS // per_server)
        count = math.ceil(len(nics) / per_leaf)
        leaves = [add_switch(graph, f"leaf{i}", "leaf") for i in range(count)]
        for s, server in enumerate(nics):
            for nic in server:
                attach_nic(graph, nic, leaves[s // per_leaf], config, port)
        per_port = min(port, max(float(graph.nodes[n]["bandwidth"]) for s in nics for n in s))
        spine_layer(
            graph,
            leaves,
            per_leaf * per_server,
            per_port,
            config,
            config.spines,
            config.oversubscription,
        )
