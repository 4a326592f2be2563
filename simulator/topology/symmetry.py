"""Automorphisms of a cluster graph that move every server a few places on.

:func:`server_shift` builds the node map that sends server ``s`` to server ``s + k`` and
checks that it maps the graph onto itself, every node and link attribute included.
Simulations of collectives that repeat every ``k`` servers use it to simulate one
server's flows for all (:mod:`simulator.collective.symmetry`): where the map is an
automorphism, the unique shortest route between two GPUs is mapped onto the unique
shortest route between their images, so routes need not be searched again.
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from .graph import gpu_nodes

# Edge attributes that change how a link carries traffic (the rest are labels).
_EDGE_KEYS = ("bandwidth", "latency", "link", "message_rate")
# Node attributes that change routing or timing.
_NODE_KEYS = ("kind", "nvls", "sharp", "reduce_bandwidth", "tier")


def server_shift(graph: nx.Graph, shift: int) -> dict | None:
    """The node map sending server ``s`` to server ``s + shift`` (modulo the number of
    servers), or None when there is none that maps ``graph`` onto itself.

    Nodes with a ``server`` attribute map to the node at the same position (in graph
    order) among the next server's nodes; GPUs must land on the GPU ``shift`` servers'
    worth of ranks on. A node outside the servers (a fabric switch) maps to the node
    whose neighbours are the images of its own (itself when they map onto themselves,
    as a spine joined to every leaf). Then every edge must map onto an edge with the same
    bandwidth, latency, type and message rate, and every node onto one with the same
    kind and attributes.

    >>> from simulator.topology import load_topology
    >>> g = load_topology("dgx-h100", 4)
    >>> phi = server_shift(g, 1)
    >>> phi["s0/gpu3"], phi["s3/nic2"], phi["leaf2"]
    ('s1/gpu3', 's0/nic2', 'leaf2')
    """
    members = _server_members(graph)
    n = len(members)
    if n < 2 or shift % n == 0:
        return None
    phi = server_permutation(graph, [(s + shift) % n for s in range(n)])
    if phi is None:
        return None
    # GPUs: ranks are numbered server by server.
    gpus = gpu_nodes(graph)
    p = len(gpus)
    if p % n:
        return None
    step = shift * (p // n)
    if any(phi.get(gpus[r]) != gpus[(r + step) % p] for r in range(p)):
        return None
    return phi


def server_permutation(graph: nx.Graph, image: list[int] | tuple[int, ...]) -> dict | None:
    """The node map sending server ``s`` to server ``image[s]`` (a permutation of the
    servers ``0..n-1``), or None when it does not map ``graph`` onto itself.

    Nodes of a server map to the nodes at the same positions (in graph order) among its
    image's nodes; fabric nodes follow the images of their neighbours (see
    :func:`server_shift`). The caller checks where GPUs land (ranks are its business).

    >>> from simulator.topology import load_topology
    >>> g = load_topology("dgx-h100", 4)
    >>> phi = server_permutation(g, [1, 0, 3, 2])
    >>> phi["s0/gpu3"], phi["s2/nic1"], phi["leaf0"]
    ('s1/gpu3', 's3/nic1', 'leaf0')
    >>> server_permutation(g, [0, 1, 2]) is None  # not a permutation of the 4 servers
    True
    """
    members = _server_members(graph)
    n = len(members)
    image = [int(s) for s in image]
    if n < 1 or set(members) != set(range(n)) or sorted(image) != list(range(n)):
        return None  # servers must be numbered 0..n-1
    if len({len(nodes) for nodes in members.values()}) != 1:
        return None
    phi: dict = {}
    for s in range(n):
        for a, b in zip(members[s], members[image[s]], strict=True):
            phi[a] = b
    outside = [node for node, data in graph.nodes(data=True) if data.get("server") is None]
    return _extended(graph, phi, outside)


def gpu_permutation(graph: nx.Graph, image: dict) -> dict | None:
    """The node map sending each GPU to ``image[gpu]`` (a permutation of the GPUs, which
    may move them inside their servers), or None when it extends to no map of ``graph``
    onto itself.

    Every other node, in a server or not, follows the images of its neighbours, as
    fabric nodes do in :func:`server_permutation`: a GPU's NIC goes with its GPU, the
    leaf of a rail with its NICs, a switch that every GPU of a server reaches stays.

    >>> from simulator.topology import load_topology
    >>> g = load_topology("dgx-h100", 2)
    >>> swap = {f"s{s}/gpu{i}": f"s{s}/gpu{(i + 4) % 8}" for s in range(2) for i in range(8)}
    >>> phi = gpu_permutation(g, swap)
    >>> phi["s0/gpu1"], phi["s1/nic1"], phi["leaf1"]
    ('s0/gpu5', 's1/nic5', 'leaf5')
    """
    gpus = set(gpu_nodes(graph))
    if set(image) != gpus or set(image.values()) != gpus:
        return None
    rest = [node for node in graph.nodes if node not in gpus]
    return _extended(graph, dict(image), rest)


def _extended(graph: nx.Graph, phi: dict, left: list) -> dict | None:
    """``phi`` (a map of some of ``graph``'s nodes) extended to the nodes ``left`` by the
    images of their neighbours, or None where that fails or the map is not an
    automorphism."""
    # First the nodes next to those mapped (a leaf, by its NICs), then those next to
    # those (a spine, by its leaves), and so on. Nodes with the same neighbours (twins)
    # may only map onto themselves.
    known = set(phi)
    for _ in range(8):
        keys = {node: frozenset(v for v in graph.neighbors(node) if v in known) for node in left}
        lookup: dict = {}
        for node, key in keys.items():
            if key:
                lookup[key] = None if key in lookup else node
        pending = []
        for node in left:
            key = keys[node]
            if not key:
                pending.append(node)
                continue
            image = frozenset(phi[v] for v in key)
            if image == key:
                phi[node] = node
            elif lookup.get(image) is not None:
                phi[node] = lookup[image]
            else:
                return None
        known = set(phi)
        if not pending or len(pending) == len(left):
            left = pending
            break
        left = pending
    if left or len(set(phi.values())) != len(phi):
        return None
    return phi if _is_automorphism(graph, phi) else None


def _server_members(graph: nx.Graph) -> dict:
    """Each server's nodes, in graph order."""
    members: dict = defaultdict(list)
    for node, data in graph.nodes(data=True):
        server = data.get("server")
        if server is not None:
            members[server].append(node)
    return members


def _is_automorphism(graph: nx.Graph, phi: dict) -> bool:
    """Whether ``phi`` maps every node and edge of ``graph`` onto one with the same
    attributes (see :data:`_EDGE_KEYS` and :data:`_NODE_KEYS`)."""
    # Plain dicts of the nodes' data and of each node's neighbours' edge data (views
    # made per lookup cost ~0.2 s on 16,384 GPUs). Every edge of an undirected graph
    # is met from both ends: the same test twice, on the same data.
    nodes = dict(graph.nodes(data=True))
    for node, data in nodes.items():
        other = nodes[phi[node]]
        for key in _NODE_KEYS:
            if data.get(key) != other.get(key):
                return False
        if ("server" in data) != ("server" in other):
            return False
    adjacency = dict(graph.adjacency())  # successors, for a directed graph
    for u, neighbours in adjacency.items():
        images = adjacency[phi[u]]
        for v, data in neighbours.items():
            image = images.get(phi[v])
            if image is None:
                return False
            if image == data:
                continue  # (all attributes equal: most links; validated ones hold no NaN)
            for key in _EDGE_KEYS:
                if data.get(key) != image.get(key):
                    return False
    return True
