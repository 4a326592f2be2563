"""Conventions for topology graphs, and their validation.

A topology is a :class:`networkx.Graph` (every edge is a full-duplex link: the two
directions have the stated bandwidth each and never share it) or a
:class:`networkx.DiGraph` (every edge is one direction of a link).

Node attributes
    ``kind``: one of :data:`NODE_KINDS`. GPUs (and NPUs, which are ``kind: gpu`` too)
    carry ``rank`` (0..p-1, unique) and may carry ``server`` (index of the machine they
    sit in), ``model`` and ``reduce_bandwidth`` (bytes/s a local reduction runs at).
    NICs (``kind: nic``) may carry ``bandwidth``, ``latency`` and ``message_rate``, which
    fabric builders copy onto their fabric-facing link; fabric switches carry ``tier``
    (leaf, spine, edge, aggregation, core, switch).
Edge attributes
    ``bandwidth`` (bytes/s per direction, > 0), ``latency`` (s, >= 0) and ``link``
    (a free-form link type such as nvlink, hccs, pcie, rdma, ethernet); optionally
    ``message_rate`` (messages/s, > 0): each message crossing the link costs
    1/message_rate seconds more (a NIC's message-rate limit, on its fabric-facing link).
Graph attributes
    ``ecmp_seed`` (int, default 0): seed of the hash that spreads flows over
    equal-cost paths (see :mod:`simulator.network.routing`).

Every GPU must reach every other GPU; when the graph has NICs, every GPU must also
reach a NIC without passing through another GPU (GPUs do not forward network traffic).
"""

from __future__ import annotations

import math

import networkx as nx

from ..errors import TopologyError, shown

NODE_KINDS = frozenset({"gpu", "nvswitch", "pcie_switch", "nic", "switch", "cpu", "sdma"})


def validate_topology(graph: nx.Graph, *, source: str = "topology graph") -> None:
    """Check that ``graph`` follows the attribute conventions and is usable.

    Raises :class:`~simulator.errors.TopologyError` naming the node or edge at fault and
    the fix. ``source`` names where the graph came from (a file, a preset) in messages.

    >>> g = nx.Graph()
    >>> g.add_node("a", kind="gpu", rank=0); g.add_node("b", kind="gpu", rank=1)
    >>> g.add_edge("a", "b", bandwidth=1e9, latency=1e-6, link="nvlink")
    >>> validate_topology(g)
    """
    if not isinstance(graph, nx.Graph) or graph.is_multigraph():
        raise TopologyError(
            f"{source}: expected a networkx Graph or DiGraph (not a multigraph); "
            "join parallel links into one edge with their summed bandwidth"
        )
    if graph.number_of_nodes() == 0:
        raise TopologyError(
            f"{source}: the graph is empty; add GPU nodes with kind='gpu' and a rank"
        )
    ranks: dict[int, object] = {}
    for node, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind is None:
            raise TopologyError(
                f"{source}: node {shown(node)} has no 'kind' attribute; give it one of "
                + ", ".join(sorted(NODE_KINDS))
            )
        if not isinstance(kind, str) or kind not in NODE_KINDS:
            raise TopologyError(
                f"{source}: node {shown(node)} has kind {shown(kind)}; set 'kind' to one of "
                + ", ".join(sorted(NODE_KINDS))
            )
        for key, kinds in (("server", int), ("local_rank", int), ("host", int), ("tier", str)):
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                what = "an integer" if kinds is int else "a name"
                raise TopologyError(
                    f"{source}: node {shown(node)} has {key} {shown(value)}; write {what}"
                )
        if kind == "gpu":
            rank = data.get("rank")
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise TopologyError(
                    f"{source}: GPU node {node!r} has rank {rank!r}; give every GPU an integer "
                    "'rank' from 0 to p-1"
                )
            if rank in ranks:
                raise TopologyError(
                    f"{source}: GPU nodes {ranks[rank]!r} and {node!r} both have rank {rank}; "
                    "ranks must be unique"
                )
            ranks[rank] = node
            reduce_bw = data.get("reduce_bandwidth")
            if reduce_bw is not None and not (_is_number(reduce_bw) and reduce_bw > 0):
                raise TopologyError(
                    f"{source}: GPU node {node!r} has reduce_bandwidth {reduce_bw!r}; "
                    "give a positive number of bytes/s or leave it out (infinitely fast)"
                )
    if not ranks:
        raise TopologyError(f"{source}: no node has kind='gpu'; a topology needs at least one GPU")
    missing = sorted(set(range(len(ranks))) - set(ranks))
    if missing:
        raise TopologyError(
            f"{source}: GPU ranks must be 0..{len(ranks) - 1} without gaps; "
            f"rank {missing[0]} is missing"
        )
    for u, v, data in graph.edges(data=True):
        link = data.get("link")
        if link is not None and not isinstance(link, str):
            raise TopologyError(
                f"{source}: edge {shown(u)}-{shown(v)} has link {shown(link)}; write a name "
                "such as nvlink or rdma"
            )
        bandwidth = data.get("bandwidth")
        if not (_is_number(bandwidth) and bandwidth > 0):
            raise TopologyError(
                f"{source}: edge {u!r}-{v!r} has bandwidth {bandwidth!r}; set 'bandwidth' to a "
                "positive number of bytes/s per direction"
            )
        latency = data.get("latency", 0.0)
        if not (_is_number(latency) and latency >= 0 and math.isfinite(latency)):
            raise TopologyError(
                f"{source}: edge {u!r}-{v!r} has latency {latency!r}; set 'latency' to a "
                "non-negative number of seconds"
            )
        rate = data.get("message_rate")
        if rate is not None and not (_is_number(rate) and rate > 0):
            raise TopologyError(
                f"{source}: edge {u!r}-{v!r} has message_rate {rate!r}; set it to a positive "
                "number of messages per second or leave it out (no limit)"
            )
    _check_connected(graph, ranks, source)
    _check_nic_reach(graph, ranks, source)


def _check_connected(graph: nx.Graph, ranks: dict[int, object], source: str) -> None:
    first = ranks[0]
    if graph.is_directed():
        reach_out = nx.descendants(graph, first) | {first}
        reach_in = nx.ancestors(graph, first) | {first}
        for rank in sorted(ranks):
            node = ranks[rank]
            if node not in reach_out or node not in reach_in:
                raise TopologyError(
                    f"{source}: GPU {node!r} (rank {rank}) and GPU {first!r} (rank 0) cannot reach "
                    "each other in both directions; add the missing links"
                )
        return
    component = nx.node_connected_component(graph, first)
    for rank in sorted(ranks):
        node = ranks[rank]
        if node not in component:
            raise TopologyError(
                f"{source}: the graph is disconnected: GPU {node!r} (rank {rank}) has no path to "
                f"GPU {first!r} (rank 0); add a link between their components"
            )


def _check_nic_reach(graph: nx.Graph, ranks: dict[int, object], source: str) -> None:
    """Every GPU reaches a NIC through non-GPU nodes (when the graph has NICs at all)."""
    cut = set(gpus_without_nic(graph))
    for rank in sorted(ranks):
        node = ranks[rank]
        if node in cut:
            raise TopologyError(
                f"{source}: GPU {node!r} (rank {rank}) has no route to a NIC that avoids other "
                "GPUs; attach it to a NIC (server.nic.gpus_per_nic or attach) or link it to a "
                "switch that a NIC hangs off"
            )


def gpus_without_nic(graph: nx.Graph) -> list:
    """GPU nodes that reach no NIC without passing another GPU (GPUs do not forward
    traffic); none when the graph has no NIC at all.

    >>> from simulator.topology import ring_graph
    >>> gpus_without_nic(ring_graph(4, 1e9))
    []
    """
    kinds = nx.get_node_attributes(graph, "kind")
    nics = [node for node, kind in kinds.items() if kind == "nic"]
    if not nics:
        return []
    others = graph.to_undirected(as_view=True) if graph.is_directed() else graph
    adjacency = others.adj
    # The non-GPU nodes (those with a kind) that NICs reach without passing a GPU: the
    # components with a NIC of the graph without its GPUs, found by one search from
    # every NIC (a subgraph view and its components cost ~0.2 s on 16,384 GPUs).
    near_nic = set(nics)
    stack = nics
    while stack:
        for v in adjacency[stack.pop()]:
            if v not in near_nic and kinds.get(v, "gpu") != "gpu":
                near_nic.add(v)
                stack.append(v)
    return [
        node
        for node, kind in kinds.items()
        if kind == "gpu" and not any(v in near_nic for v in adjacency[node])
    ]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def gpu_nodes(graph: nx.Graph) -> list:
    """The GPU nodes ordered by rank."""
    gpus = [
        (data["rank"], node) for node, data in graph.nodes(data=True) if data.get("kind") == "gpu"
    ]
    return [node for _, node in sorted(gpus, key=lambda item: item[0])]


def nodes_of_kind(graph: nx.Graph, kind: str) -> list:
    """The nodes whose ``kind`` is ``kind``, in graph order.

    >>> from simulator.topology import ring_graph
    >>> len(nodes_of_kind(ring_graph(4, 1e9), "gpu"))
    4
    """
    return [node for node, data in graph.nodes(data=True) if data.get("kind") == kind]


def servers_of_ranks(graph: nx.Graph) -> list[int] | None:
    """The ``server`` attribute of each rank's GPU, or None when the graph has none."""
    server = dict(graph.nodes(data="server"))  # (one pass, not a view per GPU)
    servers = [server[node] for node in gpu_nodes(graph)]
    if any(server is None for server in servers):
        return None
    return [int(server) for server in servers]
