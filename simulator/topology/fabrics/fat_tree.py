"""``fat-tree``: the k-ary fat-tree of Al-Fares et al. (SIGCOMM 2008).

k pods, each with k/2 edge and k/2 aggregation switches (every edge switch linked to
every aggregation switch of its pod); (k/2)^2 core switches, aggregation switch a of
every pod linked to cores a*k/2 .. a*k/2 + k/2 - 1. Each edge switch has k/2 host
ports, k^3/4 in all; NICs fill them in order (server 0's NICs first). Every link has
the port bandwidth, so the tree is non-blocking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from ...errors import TopologyError
from ..spec import Spec
from .base import Fabric, FabricConfig, add_switch, attach_nic, join_switches, port_bandwidth


@dataclass(frozen=True)
class FatTreeConfig(FabricConfig):
    """Parameters of a k-ary fat-tree."""

    k: int | None = field(
        default=None,
        metadata={
            "unit": "count",
            "help": "switch radix, even (count; default: the smallest even k whose k^3/4 "
            "host ports hold every NIC)",
        },
    )


def smallest_k(hosts: int) -> int:
    """The smallest even k >= 2 with k^3/4 >= hosts.

    >>> smallest_k(16), smallest_k(17), smallest_k(32)
    (4, 6, 6)
    """
    k = 2
    while k**3 // 4 < hosts:
        k += 2
    return k


class FatTree(Fabric):
    """Three-tier k-ary fat-tree (edge, aggregation, core)."""

    name = "fat-tree"
    description = "k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores"
    Config = FatTreeConfig

    def check(self, config: FatTreeConfig, spec: Spec) -> None:
        super().check(config, spec)
        if config.k is not None and config.k % 2:
            raise TopologyError(f"{spec.field('k')} is {config.k}; a fat-tree needs an even k")

    def build(self, graph: nx.Graph, nics: list[list[str]], config: FatTreeConfig) -> None:
        port = port_bandwidth(graph, nics, config)
        hosts = [nic for server in nics for nic in server]
        k = config.k or smallest_k(len(hosts))
        if k**3 // 4 < len(hosts):
            raise TopologyError(
                f"fabric.k is {k}: a {k}-ary fat-tree has {k**3 // 4} host ports but there "
                f"are {len(hosts)} NICs; use k >= {smallest_k(len(hosts))} or leave k out"
            )
        half = k // 2
        cores = [add_switch(graph, f"core{c}", "core") for c in range(half * half)]
        edges = []
        for pod in range(k):
            aggs = [add_switch(graph, f"pod{pod}/agg{a}", "aggregation") for a in range(half)]
            for e in range(half):
                edge = add_switch(graph, f"pod{pod}/edge{e}", "edge")
                edges.append(edge)
                for agg in aggs:
                    join_switches(graph, edge, agg, port, config)
            for a, agg in enumerate(aggs):
                for core in cores[a * half : (a + 1) * half]:
                    join_switches(graph, agg, core, port, config)
        for i, nic in enumerate(hosts):
            attach_nic(graph, nic, edges[i // half], config, port)
