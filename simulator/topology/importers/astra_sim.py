"""ASTRA-sim's analytical network file (``network.yml``) as a whole topology graph.

The file gives one entry per dimension in each of four lists::

    topology: [Ring, Switch]   # Ring, Switch or FullyConnected
    npus_count: [8, 4]         # NPUs along each dimension (> 1)
    bandwidth: [400.0, 50.0]   # GB/s per link and direction, GB = 2^30 bytes
    latency: [500.0, 2000.0]   # ns per link

as read by ASTRA-sim's analytical backend (astra-sim/astra-network-analytical,
``common/network-parser/NetworkParser.cpp:66-84``; checks at ``:106-152``: every
dimension has more than one NPU, a positive bandwidth and a non-negative latency).

Units, as the backend uses them
    ``bandwidth`` is GB/s with GB = 2^30 bytes (``common/NetworkFunction.cpp:11-16``,
    ``bw_GBps_to_Bpns``: ``bw * (1 << 30) / 1e9`` bytes per ns), so ``50`` is
    53.687e9 bytes/s here; ``latency`` is ns per link crossed
    (``congestion_unaware/basic-topology/BasicTopology.cpp:53``).

Shape
    NPU ``i`` has coordinates ``c_d = (i // stride_d) % npus_count[d]`` with dimension 0
    fastest (``stride_0 = 1``, ``stride_d = npus_count[0] x ... x npus_count[d-1]``), as
    ``MultiDimTopology::translate_address`` computes them
    (``congestion_unaware/multi-dim-topology/MultiDimTopology.cpp:61-96``). NPUs that
    differ only in coordinate ``d`` form one group of dimension ``d``, joined by that
    dimension's building block, each link full duplex with the dimension's bandwidth in
    each direction (the congestion-aware backend's links, ``congestion_aware/basic-topology/``):

    * ``Ring``: a bidirectional ring, NPU ``k`` to ``k + 1`` of the group (``Ring.cpp:19-22``);
      a ring of two NPUs is one link (ccsim joins parallel links into one edge);
    * ``Switch``: every NPU of the group to one switch (``Switch.cpp:23-25``), so a message
      crosses two links (``congestion_unaware/basic-topology/Switch.cpp:28``);
    * ``FullyConnected``: a link between every two NPUs (``FullyConnected.cpp:21-24``).

The NPUs are GPU nodes ``npu{i}`` with rank ``i``. A group of dimension 0 is one server
(``server = i // npus_count[0]``, ``local_rank = c_0``), so hierarchical algorithms see
dimension 0 as the scale-up domain; its switch is an ``nvswitch`` node inside that
server, switches of higher dimensions are fabric ``switch`` nodes. Links are named
``dim0``, ``dim1``... after their dimension.

The file describes every NPU, so it is a whole topology: ``--nodes`` and ``--fabric``
do not apply (add a dimension instead).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from ...errors import TopologyError, shown
from ...files import load_data

#: The four keys of an ASTRA-sim analytical network file.
KEYS = ("topology", "npus_count", "bandwidth", "latency")
#: Building blocks of one dimension (NetworkParser.cpp:86-101).
BLOCKS = ("Ring", "Switch", "FullyConnected")
#: Bytes in ASTRA-sim's GB (common/NetworkFunction.cpp:14-16).
GIB = float(1 << 30)
#: Most NPUs one file may describe: a guard against a typo building a huge graph.
MAX_NPUS = 1 << 20


def is_astra_sim(data: Any) -> bool:
    """Whether parsed YAML ``data`` is an ASTRA-sim network file (it has ``topology`` and
    ``npus_count``; a ccsim preset has neither).

    >>> is_astra_sim({"topology": ["Ring"], "npus_count": [8]}), is_astra_sim({"server": {}})
    (True, False)
    """
    return isinstance(data, Mapping) and "topology" in data and "npus_count" in data


def read_astra_sim(path: str | Path) -> nx.Graph:
    """Read an ASTRA-sim analytical network file into a topology graph (not yet validated).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ring.yml")
    >>> _ = open(path, "w").write(
    ...     "topology: [Ring]\\nnpus_count: [8]\\nbandwidth: [50.0]\\nlatency: [500.0]\\n")
    >>> g = read_astra_sim(path)
    >>> g.number_of_nodes(), g.edges["npu0", "npu1"]["bandwidth"] == 50 * 2**30
    (8, True)
    """
    path = Path(path)
    data = load_data(path, what="ASTRA-sim network file", fmt="yaml", error=TopologyError)
    return astra_sim_graph(data, source=path.name, name=path.stem)


def astra_sim_graph(
    data: Any, *, source: str = "network file", name: str = "astra-sim"
) -> nx.Graph:
    """The topology graph of a parsed ASTRA-sim network file ``data``.

    Parameters
    ----------
    data : mapping
        ``topology``, ``npus_count``, ``bandwidth`` (GB/s, GB = 2^30 bytes) and
        ``latency`` (ns), one entry per dimension.
    source : str
        Where ``data`` came from, for error messages.
    name : str
        The graph's name.

    Examples
    --------
    >>> g = astra_sim_graph({"topology": ["Switch", "Ring"], "npus_count": [4, 2],
    ...                      "bandwidth": [100, 25], "latency": [100, 1000]})
    >>> sorted(n for n, d in g.nodes(data=True) if d["kind"] != "gpu")
    ['s0/switch', 's1/switch']
    >>> g.nodes["npu5"]["server"], g.edges["npu1", "npu5"]["latency"]
    (1, 1e-06)
    """
    if not isinstance(data, Mapping):
        raise TopologyError(
            f"{source}: an ASTRA-sim network file is a mapping of {', '.join(KEYS)}"
        )
    unknown = sorted((str(key) for key in data if key not in KEYS), key=str)
    if unknown:
        raise TopologyError(
            f"{source}: unknown key {shown(unknown[0])} in an ASTRA-sim network file; valid "
            f"keys: {', '.join(KEYS)}"
        )
    lists = {key: _list(data, key, source) for key in KEYS}
    dims = len(lists["topology"])
    for key in KEYS[1:]:
        if len(lists[key]) != dims:
            raise TopologyError(
                f"{source}: '{key}' has {len(lists[key])} entries but 'topology' has {dims}; "
                "give one entry per dimension in each list"
            )
    blocks = []
    for d, block in enumerate(lists["topology"]):
        if block not in BLOCKS:
            raise TopologyError(
                f"{source}: topology[{d}] is {shown(block)}; use one of {', '.join(BLOCKS)}"
            )
        blocks.append(block)
    counts = [
        _number(lists["npus_count"], d, "npus_count", source, integer=True) for d in range(dims)
    ]
    bandwidths = [_number(lists["bandwidth"], d, "bandwidth", source) for d in range(dims)]
    latencies = [_number(lists["latency"], d, "latency", source) for d in range(dims)]
    for d in range(dims):
        # NetworkParser::check_validity (NetworkParser.cpp:106-152).
        if counts[d] <= 1:
            raise TopologyError(
                f"{source}: npus_count[{d}] is {counts[d]}; a dimension needs more than one NPU"
            )
        if bandwidths[d] <= 0:
            raise TopologyError(
                f"{source}: bandwidth[{d}] is {shown(bandwidths[d])}; give a positive number "
                "of GB/s (GB = 2^30 bytes)"
            )
        if latencies[d] < 0:
            raise TopologyError(
                f"{source}: latency[{d}] is {shown(latencies[d])}; give a number of ns >= 0"
            )
    total = math.prod(counts)
    if total > MAX_NPUS:
        raise TopologyError(
            f"{source}: npus_count {counts} makes {total:,} NPUs; ccsim builds at most {MAX_NPUS:,}"
        )

    graph = nx.Graph(name=name)
    servers = counts[0]
    for npu in range(total):
        graph.add_node(
            f"npu{npu}", kind="gpu", rank=npu, server=npu // servers, local_rank=npu % servers
        )
    stride = 1
    for d, (block, count) in enumerate(zip(blocks, counts, strict=True)):
        attrs = {
            "bandwidth": bandwidths[d] * GIB,
            "latency": latencies[d] / 1e9,
            "link": f"dim{d}",
        }
        # The group of NPU `base` along dimension d: base + k * stride for k < count,
        # where `base` has coordinate 0 in dimension d.
        for base in range(total):
            if (base // stride) % count:
                continue
            members = [f"npu{base + k * stride}" for k in range(count)]
            _add_block(graph, block, members, attrs, d=d, group=base, server=base // servers)
        stride *= count
    return graph


def _add_block(
    graph: nx.Graph, block: str, members: list[str], attrs: dict, *, d: int, group: int, server: int
) -> None:
    """Join one group's NPUs ``members`` by the building block ``block``."""
    if block == "Ring":
        for k, node in enumerate(members):
            graph.add_edge(node, members[(k + 1) % len(members)], **attrs)
    elif block == "FullyConnected":
        for k, node in enumerate(members):
            for other in members[k + 1 :]:
                graph.add_edge(node, other, **attrs)
    else:
        if d == 0:
            # Inside one server: counted by the summary's intra-node bandwidth.
            hub = f"s{server}/switch"
            graph.add_node(hub, kind="nvswitch", server=server)
        else:
            hub = f"dim{d}/switch{group}"
            graph.add_node(hub, kind="switch", tier="switch")
        for node in members:
            graph.add_edge(node, hub, **attrs)


def _list(data: Mapping, key: str, source: str) -> list:
    if key not in data:
        raise TopologyError(
            f"{source}: '{key}' is missing; an ASTRA-sim network file lists "
            f"{', '.join(KEYS)}, one entry per dimension"
        )
    value = data[key]
    if not isinstance(value, list) or not value:
        raise TopologyError(
            f"{source}: '{key}' is {shown(value)}; write a list with one entry per dimension, "
            "e.g. [8] or [8, 4]"
        )
    return value


def _number(values: list, d: int, key: str, source: str, *, integer: bool = False) -> float:
    value = values[d]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        what = "an integer" if integer else "a number"
        unit = {"bandwidth": " of GB/s", "latency": " of ns"}.get(key, "")
        raise TopologyError(f"{source}: {key}[{d}] is {shown(value)}; write {what}{unit}")
    if integer:
        if not float(value).is_integer():
            raise TopologyError(f"{source}: {key}[{d}] is {shown(value)}; write an integer")
        return int(value)
    return float(value)
