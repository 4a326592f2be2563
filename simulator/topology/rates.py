"""Measured rates of single NICs and links: a cluster's steady-state health as input.

Real clusters are not uniform: ``ib_write_bw`` on one public 2-server B200 cluster
measured 4 of its 8 NICs at ~40 GB/s and 4 at ~45 GB/s (issue 32). A *rates spec* gives
such figures one part at a time, by the names the topology graph uses:

* ``s0/nic3=40GB/s``: NIC 3 of server 0 sustains 40 GB/s (every link of the NIC that ran
  at the NIC's own rate now runs at this one; a slower attaching link, such as a PCIe
  switch's, keeps its own rate unless it was faster than this);
* ``s1/nic0-leaf0=45GB/s``: that one link (both directions) sustains 45 GB/s.

Inline (``--nic-rate 's0/nic0=40GB/s,s1/nic3=45GB/s'``), as a YAML/JSON file holding the
same mapping (or a mapping with the key ``rates`` holding it), or as a preset's top-level
``rates:`` section. :func:`apply_rates` applies a spec to a copy of a graph.

The figures are rates the bytes *see*, as ``ib_write_bw`` measures them. ccsim's links
carry line rates, which the calibrated model (``--proto`` and NCCL's default) scales by
the preset's ``nccl.efficiency`` for the link's type (0.96 for ``rdma`` on the NVIDIA
presets, NCCL's figure); so a measured rate is stored as the line rate that gives it
under that efficiency (40 GB/s measured on an ``rdma`` link of efficiency 0.96 becomes a
41.67 GB/s link), and the ideal model (no protocol) sees the same line rate. The
figure as given is kept as the ``measured`` attribute of the NIC and of each link set.

NCCL's choice does not see health: it reads each NIC's negotiated port speed
(``ibv_query_port``, transport/net_ib/init.cc:405-411 at v2.30.7), not what the port
sustains, so a NIC set here keeps its original rate as ``port_bandwidth``, which
:func:`simulator.library.nccl.nccl_system` reads. A server whose NIC is slower is no
longer a shifted copy of the others: the symmetry checks
(:mod:`simulator.topology.symmetry`, :mod:`simulator.collective.symmetry`) compare link
bandwidths, so such runs simulate every flow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import CcsimError, TopologyError, shown
from ..files import load_data
from ..units import parse_bandwidth

#: File suffixes read as rates files (anything else is an inline spec).
FILE_SUFFIXES = (".yaml", ".yml", ".json")
_NUMBER = re.compile(r"[-+0-9.eE]+")
_EXAMPLE = "s0/nic0=40GB/s,s1/nic3=45GB/s or s0/nic0-leaf0=45GB/s"


def parse_rates(spec: Any, *, where: str = "--nic-rate") -> dict[str, float]:
    """A rates spec as ``{part name: bytes/s}``: inline text (``NAME=RATE`` items joined
    by commas; repeatable as a list), a YAML/JSON file, or a mapping. Errors name
    ``where`` (an option or a preset field) on one line.

    >>> parse_rates("s0/nic0=40GB/s,s1/nic3=360Gbps")
    {'s0/nic0': 40000000000.0, 's1/nic3': 45000000000.0}
    >>> parse_rates({"s0/nic0-leaf0": "45GB/s"}, where="rates")
    {'s0/nic0-leaf0': 45000000000.0}
    """
    if spec is None:
        return {}
    if isinstance(spec, list | tuple):
        rates: dict[str, float] = {}
        for item in spec:
            rates.update(parse_rates(item, where=where))
        return rates
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, str | Path) and Path(str(spec)).suffix.lower() in FILE_SUFFIXES:
        path = Path(str(spec))
        if not path.is_file():
            raise TopologyError(f"{where}: rates file {str(path)!r} not found")
        data = load_data(path, what="rates file", error=TopologyError)
        if isinstance(data, Mapping) and set(data) == {"rates"}:
            data = data["rates"]
        if not isinstance(data, Mapping):
            raise TopologyError(
                f"{path.name}: a rates file is a mapping of NIC or link names to rates, "
                f"e.g. {{s0/nic0: 40GB/s}}"
            )
        return parse_rates(dict(data), where=path.name)
    elif isinstance(spec, str):
        items = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            name, sep, rate = part.partition("=")
            if not sep or not name.strip() or not rate.strip():
                raise TopologyError(
                    f"{where}: expected NAME=RATE items such as {_EXAMPLE}, got {shown(part)}"
                )
            items.append((name.strip(), rate.strip()))
        if not items:
            raise TopologyError(f"{where}: no rates given; write e.g. {_EXAMPLE}")
    else:
        raise TopologyError(
            f"{where}: expected a mapping of NIC or link names to rates, got {shown(spec)}"
        )
    rates = {}
    for name, rate in items:
        if isinstance(rate, int | float) or _NUMBER.fullmatch(str(rate).strip()):
            # parse_bandwidth reads a bare number as bytes/s: for a NIC, surely a slip.
            raise TopologyError(
                f"{where}: the rate of {name} is {shown(rate)} with no unit; write e.g. "
                "40GB/s or 320Gbps"
            )
        try:
            rates[str(name)] = parse_bandwidth(rate, field=f"rate of {name}")
        except CcsimError as error:
            raise TopologyError(f"{where}: {error}") from None
    return rates


def apply_rates(graph: nx.Graph, rates: Mapping[str, float], *, where: str = "--nic-rate"
                ) -> nx.Graph:  # fmt: skip
    """A copy of ``graph`` whose named NICs and links sustain the given rates (bytes/s;
    see the module docstring); ``graph`` itself when ``rates`` is empty. A name that is
    neither a NIC nor a link of the graph is one line naming ``where`` and the names
    that exist.

    >>> from simulator.topology import load_topology
    >>> g = apply_rates(load_topology("hgx-b200", 2), {"s1/nic3": 40e9})
    >>> d = g.nodes["s1/nic3"]
    >>> round(d["bandwidth"] / 1e9, 2), d["measured"] / 1e9, d["port_bandwidth"] / 1e9
    (41.67, 40.0, 50.0)
    >>> round(g.edges["s1/nic3", "leaf3"]["bandwidth"] / 1e9, 2)
    41.67
    """
    if not rates:
        return graph
    out = graph.copy()
    efficiency = _efficiencies(graph)
    for name, rate in rates.items():
        if name in out and out.nodes[name].get("kind") == "nic":
            _set_nic(out, name, rate, efficiency)
            continue
        link = _link(out, name)
        if link is None:
            raise TopologyError(f"{where}: {_unknown(out, name)}")
        for u, v in link:
            _set_link(out.edges[u, v], rate, efficiency)
    out.graph["rates"] = {**graph.graph.get("rates", {}), **dict(rates)}
    return out


def _efficiencies(graph: nx.Graph) -> dict[str, float]:
    """The preset's link efficiencies by link type (``nccl.efficiency``), as read; those
    that are not numbers in (0, 1] are left for the library layer to refuse."""
    nccl = graph.graph.get("nccl")
    raw = nccl.get("efficiency") if isinstance(nccl, Mapping) else None
    out = {}
    for kind, value in dict(raw or {}).items():
        if isinstance(value, int | float) and 0 < value <= 1:
            out[str(kind)] = float(value)
    return out


def _line(rate: float, kind: object, efficiency: Mapping[str, float]) -> float:
    """The line rate a link of type ``kind`` needs to sustain ``rate`` under the model."""
    return rate / efficiency.get(str(kind), 1.0)


def _set_link(data: dict, rate: float, efficiency: Mapping[str, float]) -> None:
    data["bandwidth"] = _line(rate, data.get("link"), efficiency)
    data["measured"] = rate


def _set_nic(graph: nx.Graph, nic: str, rate: float, efficiency: Mapping[str, float]) -> None:
    data = graph.nodes[nic]
    old = data.get("bandwidth")
    data.setdefault("port_bandwidth", old)
    edges = list(graph.in_edges(nic, data=True)) + list(graph.out_edges(nic, data=True)) if (
        graph.is_directed()
    ) else list(graph.edges(nic, data=True))  # fmt: skip
    kinds = {str(d.get("link")) for _, _, d in edges}
    for _, _, edge in edges:
        line = _line(rate, edge.get("link"), efficiency)
        if old is not None and abs(edge["bandwidth"] - old) <= 1e-9 * old:
            _set_link(edge, rate, efficiency)  # a link at the NIC's own rate
        elif edge["bandwidth"] > line:
            _set_link(edge, rate, efficiency)  # a faster attaching link no longer helps
    # The NIC's own figure, as the link type its fabric-facing link has (rdma, ethernet).
    kind = next((k for k in kinds if k != "pcie"), next(iter(kinds), ""))
    data["bandwidth"] = _line(rate, kind, efficiency)
    data["measured"] = rate


def _link(graph: nx.Graph, name: str) -> list[tuple[Any, Any]] | None:
    """The edges (one, or both directions of a directed graph) a link name ``A-B``
    names, or None. Node names may hold ``-``: every split is tried."""
    parts = name.split("-")
    for k in range(1, len(parts)):
        a, b = "-".join(parts[:k]), "-".join(parts[k:])
        if a in graph and b in graph:
            found = [(u, v) for u, v in ((a, b), (b, a)) if graph.has_edge(u, v)]
            if found:
                return found[:1] if not graph.is_directed() else found
    return None


def _unknown(graph: nx.Graph, name: str) -> str:
    nics = [n for n, d in graph.nodes(data=True) if d.get("kind") == "nic"]
    if not nics:
        return f"no NIC or link {shown(name)}: this topology has no NICs; name a link A-B"
    leaf = next((v for v in nx.all_neighbors(graph, nics[0]) if graph.nodes[v].get("kind") ==
                 "switch"), None)  # fmt: skip
    link = f", links like {nics[0]}-{leaf}" if leaf is not None else ""
    return (
        f"no NIC or link {shown(name)} in this topology; NICs are named {nics[0]} to "
        f"{nics[-1]} ({len(nics)} NICs){link}"
    )
