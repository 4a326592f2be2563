"""``single-switch``: every NIC on one non-blocking switch."""

from __future__ import annotations

import networkx as nx

from .base import Fabric, FabricConfig, add_switch, attach_nic, port_bandwidth


class SingleSwitch(Fabric):
    """One switch with a port per NIC: no oversubscription, one path between servers."""

    name = "single-switch"
    description = "every NIC on one non-blocking switch"
    Config = FabricConfig

    def build(self, graph: nx.Graph, nics: list[list[str]], config: FabricConfig) -> None:
        port = port_bandwidth(graph, nics, config)
        switch = add_switch(graph, "switch0", "switch")
        for server in nics:
            for nic in server:
                attach_nic(graph, nic, switch, config, port)
