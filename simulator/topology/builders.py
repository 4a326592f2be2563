"""Builders that return fresh topology graphs.

Each builder is named after the shape it returns and never mutates its inputs.
Server shapes come from a *server spec* (the ``server`` section of a preset file, see
``topologies/README.md``); :func:`cluster_graph` places N servers on a fabric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import networkx as nx

from ..errors import TopologyError
from .fabrics import COMMON_KEYS, DEFAULT_FABRIC, get_fabric
from .fabrics.base import mark_sharp
from .server import add_server
from .spec import Spec
from .stacks import routing_of


def ring_graph(p: int, bandwidth: float, latency: float = 0.0, *, link: str = "nvlink") -> nx.Graph:
    """A 1-D ring of ``p`` GPUs joined by full-duplex links (GPU r to GPU r+1 mod p).

    >>> g = ring_graph(4, 150e9, 500e-9)
    >>> g.number_of_nodes(), g.number_of_edges()
    (4, 4)
    """
    if p < 2:
        raise TopologyError(f"ring_graph: need at least 2 GPUs, got {p}")
    graph = nx.Graph(name=f"ring-{p}")
    for rank in range(p):
        graph.add_node(f"gpu{rank}", kind="gpu", rank=rank, server=0)
    for rank in range(p):
        graph.add_edge(
            f"gpu{rank}",
            f"gpu{(rank + 1) % p}",
            bandwidth=float(bandwidth),
            latency=float(latency),
            link=link,
        )
    return graph


def fabric_spec(preset: Mapping | None, override: str | Mapping | None = None) -> dict[str, Any]:
    """The ``fabric`` section to build: the preset's, with ``override`` applied.

    ``override`` is a fabric name (``--fabric``) or a whole section. A name that differs
    from the preset's fabric keeps only the parameters every fabric shares (latency,
    port bandwidth, link type, seed): the others belong to the preset's fabric.

    >>> fabric_spec({"type": "fat-tree", "k": 8, "latency": "1us"}, "leaf-spine")
    {'latency': '1us', 'type': 'leaf-spine'}
    """
    if preset is not None and not isinstance(preset, Mapping):
        raise TopologyError(
            f"the 'fabric' section must be a mapping of keys to values, got {type(preset).__name__}"
        )
    base = dict(preset or {})
    if override is None:
        return base
    if isinstance(override, Mapping):
        return dict(override)
    if base.get("type", DEFAULT_FABRIC) == override:
        return base
    kept = {key: value for key, value in base.items() if key in COMMON_KEYS}
    kept["type"] = override
    return kept


def cluster_graph(
    server: Mapping,
    nodes: int = 1,
    *,
    fabric: Mapping | str | None = None,
    name: str = "cluster",
    source: str = "topology",
    seed: int | None = None,
    single_server_fabric: bool = False,
) -> nx.Graph:
    """``nodes`` servers of one shape joined by a fabric.

    Parameters
    ----------
    server : mapping
        A server spec (the ``server`` section of a preset).
    nodes : int
        Number of servers. With one, no fabric is added (the NICs are left unlinked)
        unless the fabric's ``single_server`` or ``single_server_fabric`` asks for the
        server's switches too (a multipath collective inside one server uses its NICs and
        leaf switch).
    fabric : mapping or str, optional
        A ``fabric`` section (``type`` plus the fabric's parameters) or a fabric name;
        default ``rail-optimized`` with default parameters.
    name : str
        Graph name (``name`` or ``name x nodes``).
    source : str
        Where the specs came from, for error messages.
    seed : int, optional
        ECMP hash seed, stored as the graph attribute ``ecmp_seed`` that
        :class:`~simulator.network.routing.Router` reads; default: the fabric's ``seed`` (0).

    Examples
    --------
    >>> spec = {"gpus": 2, "intra": {"kind": "nvswitch", "bandwidth": "300GB/s"},
    ...         "nic": {"bandwidth": "200Gbps"}}
    >>> g = cluster_graph(spec, 4, fabric="rail-optimized")
    >>> sorted(n for n, d in g.nodes(data=True) if d["kind"] == "switch")
    ['leaf0', 'leaf1', 'spine0', 'spine1', 'spine2', 'spine3']
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise TopologyError(f"{source}: --nodes must be a positive integer, got {nodes!r}")
    graph = nx.Graph(name=name if nodes == 1 else f"{name}x{nodes}")
    gpus_per_server = Spec(server, "server", source).count("gpus", required=True)
    all_nics = [
        add_server(graph, server, server=index, first_rank=index * gpus_per_server, source=source)
        for index in range(nodes)
    ]
    spec = Spec(
        fabric if isinstance(fabric, Mapping) else fabric_spec(None, fabric), "fabric", source
    )
    variant = get_fabric(spec.get("type", DEFAULT_FABRIC), where=spec.field("type"))
    config = variant.parse(spec)
    graph.graph["ecmp_seed"] = config.seed if seed is None else int(seed)
    # The fabric's own choice, else its NICs' stack's (InfiniBand: per destination).
    graph.graph["routing"] = config.routing or routing_of(graph)
    if nodes == 1 and not ((single_server_fabric or config.single_server) and all(all_nics)):
        return graph
    if not all(all_nics):
        raise TopologyError(
            f"{source}: {nodes} nodes need NICs to reach each other; add a 'server.nic' section"
        )
    variant.build(graph, all_nics, config)
    if config.sharp:
        mark_sharp(graph)
    graph.graph["fabric"] = variant.name
    return graph
