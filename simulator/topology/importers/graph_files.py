"""Whole topology graphs from GraphML or node-link JSON files.

The file holds the whole topology with the attributes of
:mod:`simulator.topology.graph`. Values may be numbers in base units (bytes/s, seconds)
or strings with units (``"400Gbps"``, ``"8us"``); ranks may be integers or integer
strings (GraphML often stores them so). Everything is checked by
:func:`~simulator.topology.graph.validate_topology` afterwards.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx

from ...errors import CcsimError, TopologyError, shown
from ...files import load_data
from ...units import parse_bandwidth, parse_time
from ..spec import parse_rate

GRAPH_SUFFIXES = (".graphml", ".json")

_INTEGER_NODE_ATTRS = ("rank", "server", "local_rank")


def read_graph(path: str | Path) -> nx.Graph:
    """Read a topology graph from a ``.graphml`` or node-link ``.json`` file.

    Unit strings are converted to base units; the result is not yet validated.

    >>> import tempfile, os
    >>> from simulator.topology import ring_graph
    >>> folder = tempfile.mkdtemp()
    >>> nx.write_graphml(ring_graph(4, 1e9), os.path.join(folder, "ring.graphml"))
    >>> read_graph(os.path.join(folder, "ring.graphml")).number_of_edges()
    4
    """
    path = Path(path)
    if path.suffix == ".graphml":
        try:
            graph = nx.read_graphml(path)
        except Exception as error:  # malformed XML or GraphML keys
            raise TopologyError(f"{path.name}: not a readable GraphML file: {error}") from None
    elif path.suffix == ".json":
        data = load_data(path, what="graph file", fmt="json", error=TopologyError)
        if not isinstance(data, dict) or "nodes" not in data:
            raise TopologyError(
                f"{path.name}: expected networkx node-link JSON, an object with 'nodes' and "
                "'edges' (or 'links'), as written by networkx.node_link_data"
            )
        if not isinstance(data.get("graph", {}), dict):
            raise TopologyError(f"{path.name}: 'graph' must be an object of graph attributes")
        edges = "links" if "links" in data and "edges" not in data else "edges"
        if not isinstance(data.get(edges), list):
            raise TopologyError(
                f'{path.name}: node-link JSON needs a "links" or "edges" list of '
                'links, e.g. [{"source": "gpu0", "target": "sw0", "bandwidth": "100GB/s"}]'
            )
        try:
            # A file that omits 'multigraph' means a plain graph (networkx would assume a
            # multigraph).
            graph = nx.node_link_graph(data, multigraph=False, edges=edges)
        except Exception as error:
            raise TopologyError(f"{path.name}: not valid node-link JSON: {error}") from None
    else:
        raise TopologyError(
            f"{path.name}: unknown graph format {path.suffix!r}; use .graphml or .json"
        )
    return normalize_graph(graph, source=path.name)


def normalize_graph(graph: nx.Graph, *, source: str) -> nx.Graph:
    """Convert unit strings and integer strings of ``graph`` in place; return it."""
    for node, data in graph.nodes(data=True):
        for key in _INTEGER_NODE_ATTRS:
            if key in data:
                data[key] = _integer(
                    data[key], f"{source}: node {shown(node)} attribute {shown(key)}"
                )
        if isinstance(data.get("reduce_bandwidth"), str):
            data["reduce_bandwidth"] = _convert(
                parse_bandwidth,
                data["reduce_bandwidth"],
                f"{source}: node {shown(node)} reduce_bandwidth",
            )
        for key, parse in (("bandwidth", parse_bandwidth), ("latency", parse_time)):
            if isinstance(data.get(key), str):
                data[key] = _convert(parse, data[key], f"{source}: node {shown(node)} {key}")
        if isinstance(data.get("message_rate"), str):
            data["message_rate"] = parse_rate(
                data["message_rate"], field=f"{source}: node {shown(node)} message_rate"
            )
    for u, v, data in graph.edges(data=True):
        where = f"{source}: edge {shown(u)}-{shown(v)}"
        for key, parse in (("bandwidth", parse_bandwidth), ("latency", parse_time)):
            if isinstance(data.get(key), str):
                data[key] = _convert(parse, data[key], f"{where} {key}")
        if isinstance(data.get("message_rate"), str):
            data["message_rate"] = parse_rate(data["message_rate"], field=f"{where} message_rate")
    return graph


def _convert(parse, value: str, field: str) -> float:
    try:
        return parse(value, field=field)
    except CcsimError as error:
        raise TopologyError(str(error)) from None


def _integer(value: object, field: str) -> object:
    """An integer from an int, an integral float or an integer string; else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise TopologyError(f"{field} is {shown(value)}; write an integer") from None
    return value
