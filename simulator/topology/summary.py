"""Figures that describe a topology: counts, per-GPU bandwidths, bisection bandwidth.

Bandwidths are bytes/s in one direction. They come from max-flow computations on the
graph's link bandwidths (every undirected edge is two arcs, one per direction), so they
hold for any shape, presets and users' graphs alike.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import networkx as nx

from .graph import gpu_nodes, nodes_of_kind
from .stacks import DEFAULT_STACK, stack_of

_SOURCE, _SINK = ("__source__",), ("__sink__",)  # tuples never collide with node names


def _flow_graph(graph: nx.Graph, keep=None) -> nx.DiGraph:
    """A DiGraph of capacities (``bandwidth``), restricted to the nodes in ``keep``."""
    flow = nx.DiGraph()
    for u, v, data in graph.edges(data=True):
        if keep is not None and (u not in keep or v not in keep):
            continue
        flow.add_edge(u, v, capacity=float(data["bandwidth"]))
        if not graph.is_directed():
            flow.add_edge(v, u, capacity=float(data["bandwidth"]))
    return flow


def _max_flow(flow: nx.DiGraph, sources: list, sinks: list) -> float:
    """Max flow from the ``sources`` together to the ``sinks`` together."""
    for node in sources:
        flow.add_edge(_SOURCE, node)  # no capacity attribute: unbounded
    for node in sinks:
        flow.add_edge(node, _SINK)
    if not sources or not sinks:
        return 0.0
    return float(nx.maximum_flow_value(flow, _SOURCE, _SINK))


def bisection_halves(graph: nx.Graph) -> tuple[list, list]:
    """The two halves of the GPUs that :func:`bisection_bandwidth` separates.

    With several servers, the first half of the servers (by index) against the rest;
    otherwise the first half of the ranks against the rest.
    """
    gpus = gpu_nodes(graph)
    servers = sorted({graph.nodes[node].get("server") for node in gpus}, key=str)
    if len(servers) > 1 and None not in servers:
        first = set(servers[: len(servers) // 2])
        left = [node for node in gpus if graph.nodes[node]["server"] in first]
    else:
        left = gpus[: len(gpus) // 2]
    chosen = set(left)
    return left, [node for node in gpus if node not in chosen]


def bisection_bandwidth(graph: nx.Graph) -> float:
    """Bytes/s that one half of the GPUs can send to the other half at once.

    The halves are those of :func:`bisection_halves`; the value is the max flow (equal
    to the min cut) between them, one direction. For the symmetric fabrics ccsim builds
    this is the bisection bandwidth; for an arbitrary graph it is the cut of that split.

    >>> from simulator.topology import ring_graph
    >>> bisection_bandwidth(ring_graph(8, 1e9))  # a ring is cut in two places
    2000000000.0
    """
    left, right = bisection_halves(graph)
    return _max_flow(_flow_graph(graph), left, right)


def intra_bandwidth(graph: nx.Graph) -> float:
    """Bytes/s rank 0 can send to the other GPUs of its server at once (not via NICs).

    >>> from simulator.topology import ring_graph
    >>> intra_bandwidth(ring_graph(8, 1e9))  # two ring links
    2000000000.0
    """
    gpus = gpu_nodes(graph)
    first = gpus[0]
    server = graph.nodes[first].get("server")
    keep = {
        node
        for node, data in graph.nodes(data=True)
        if data.get("kind") not in ("nic", "switch") and data.get("server") == server
    }
    peers = [node for node in gpus if node in keep and node != first]
    return _max_flow(_flow_graph(graph, keep), [first], peers)


def nic_bandwidth(graph: nx.Graph, nic) -> float:
    """A NIC's bandwidth: its ``bandwidth`` attribute, else its links to switches."""
    data = graph.nodes[nic]
    if data.get("bandwidth") is not None:
        return float(data["bandwidth"])
    return sum(
        float(graph.edges[nic, other]["bandwidth"])
        for other in nx.all_neighbors(graph, nic)
        if graph.nodes[other].get("kind") == "switch" and graph.has_edge(nic, other)
    )


def inter_bandwidth(graph: nx.Graph) -> float:
    """Per-GPU share of a server's NIC bandwidth, bytes/s: its NICs at the rate of its
    slowest one (a collective's channels spread over the NICs and wait for the slowest:
    a ring is as fast as its slowest NIC), on the server where that is least (rank 0's
    server when all are alike; a server without NICs is skipped)."""
    gpus = gpu_nodes(graph)
    local: dict = {}
    for node in gpus:
        server = graph.nodes[node].get("server")
        local[server] = local.get(server, 0) + 1
    rates: dict = {}
    for nic in nodes_of_kind(graph, "nic"):
        rates.setdefault(graph.nodes[nic].get("server"), []).append(nic_bandwidth(graph, nic))
    first = graph.nodes[gpus[0]].get("server")
    if first not in rates:
        return 0.0
    shares = [
        min(found) * len(found) / local[server]
        for server, found in rates.items()
        if server in local
    ]  # fmt: skip
    return min(shares) if shares else 0.0


def _gbps(value: float) -> str:
    """Bytes/s as GB/s with up to 4 significant digits: ``3.125 GB/s``, ``1800 GB/s``."""
    return f"{value / 1e9:.4g} GB/s"


@dataclass(frozen=True)
class TopologySummary:
    """What ``ccsim topology show`` prints; bandwidths in bytes/s, one direction."""

    name: str
    fabric: str | None
    servers: int
    gpus: int
    nics: int
    devices: dict[str, int]
    links: int
    intra_bandwidth: float
    inter_bandwidth: float
    bisection_bandwidth: float
    #: The NICs' network stack (:mod:`simulator.topology.stacks`), None without NICs.
    stack: str | None = None

    def text(self) -> str:
        """Aligned ``label  value`` lines (GB = 1e9 bytes)."""
        devices = ", ".join(f"{kind} {count}" for kind, count in self.devices.items()) or "none"
        fabric = f" on a {self.fabric} fabric" if self.fabric else ""
        stack = f" (network stack {self.stack})" if self.stack not in (None, DEFAULT_STACK) else ""
        rows = [
            ("topology", f"{self.name}: {self.servers} server(s){fabric}"),
            ("GPUs", f"{self.gpus}"),
            ("NICs", f"{self.nics}{stack}"),
            ("switches and devices", devices),
            ("links", f"{self.links} (full duplex)"),
            ("per-GPU intra-node", f"{_gbps(self.intra_bandwidth)} per direction"),
            (
                "per-GPU inter-node",
                f"{_gbps(self.inter_bandwidth)} per direction (server NIC bandwidth / GPUs; "
                "NICs at the slowest one's rate, on the slowest server)",
            ),
            ("bisection", f"{_gbps(self.bisection_bandwidth)} per direction"),
        ]
        width = max(len(label) for label, _ in rows)
        return "".join(f"{label:<{width}}  {value}\n" for label, value in rows)


def summarize(graph: nx.Graph, name: str | None = None) -> TopologySummary:
    """Counts and bandwidth figures of a validated topology graph.

    >>> from simulator.topology import ring_graph
    >>> s = summarize(ring_graph(4, 1e9))
    >>> s.gpus, s.links, s.bisection_bandwidth
    (4, 4, 2000000000.0)
    """
    kinds = Counter()
    for _, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind in ("gpu", "nic"):
            continue
        kinds[data.get("tier", kind) if kind == "switch" else kind] += 1
    gpus = gpu_nodes(graph)
    servers = {graph.nodes[node].get("server") for node in gpus}
    return TopologySummary(
        name=name or str(graph.graph.get("name", "graph")),
        fabric=graph.graph.get("fabric"),
        servers=len(servers),
        gpus=len(gpus),
        nics=len(nodes_of_kind(graph, "nic")),
        devices=dict(sorted(kinds.items())),
        links=graph.number_of_edges(),
        intra_bandwidth=intra_bandwidth(graph),
        inter_bandwidth=inter_bandwidth(graph),
        bisection_bandwidth=bisection_bandwidth(graph),
        stack=stack.name if (stack := stack_of(graph)) is not None else None,
    )
