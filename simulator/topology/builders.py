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
from ..units import parse_bandwidth, parse_time

FABRICS = ("single-switch",)


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


class _Spec:
    """Reads one mapping of a preset file, rejecting unknown keys with their path."""

    def __init__(self, data: Any, path: str, source: str):
        if not isinstance(data, Mapping):
            raise TopologyError(f"{source}: '{path}' must be a mapping, got {type(data).__name__}")
        self.data = dict(data)
        self.path = path
        self.source = source
        self.used: set[str] = set()

    def field(self, key: str) -> str:
        return f"{self.source}: {self.path}.{key}"

    def get(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required:
                raise TopologyError(f"{self.field(key)} is missing; add it")
            return default
        return self.data[key]

    def bandwidth(self, key: str, default: Any = None, *, required: bool = False) -> float:
        value = self.get(key, default, required=required)
        try:
            return parse_bandwidth(value, field=self.field(key))
        except TopologyError:
            raise
        except Exception as error:  # CcsimError from the parser already names the field
            raise TopologyError(str(error)) from None

    def time(self, key: str, default: Any = 0.0) -> float:
        value = self.get(key, default)
        try:
            result = parse_time(value, field=self.field(key))
        except Exception as error:
            raise TopologyError(str(error)) from None
        if result < 0:
            raise TopologyError(f"{self.field(key)} is negative; latencies are >= 0")
        return result

    def sub(self, key: str, *, required: bool = False) -> _Spec | None:
        value = self.get(key, required=required)
        if value is None:
            return None
        return _Spec(value, f"{self.path}.{key}", self.source)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise TopologyError(
                f"{self.source}: unknown key '{self.path}.{unknown[0]}'; valid keys here: "
                + ", ".join(sorted(self.used))
            )


def add_server(
    graph: nx.Graph, spec: Mapping, *, server: int, first_rank: int, source: str
) -> list:
    """Add one server described by ``spec`` to ``graph``; return its NIC nodes.

    GPU ``k`` of the server gets rank ``first_rank + k``. Node names are prefixed with
    ``s{server}/`` so that servers never collide.
    """
    top = _Spec(spec, "server", source)
    count = top.get("gpus", required=True)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TopologyError(f"{top.field('gpus')} must be a positive integer, got {count!r}")
    gpu = top.sub("gpu") or _Spec({}, "server.gpu", source)
    model = gpu.get("model", "gpu")
    reduce_bw = gpu.get("reduce_bandwidth")
    reduce_bw = gpu.bandwidth("reduce_bandwidth") if reduce_bw is not None else None
    gpu.done()
    prefix = f"s{server}/"
    gpus = []
    for k in range(count):
        node = f"{prefix}gpu{k}"
        attrs = {
            "kind": "gpu",
            "rank": first_rank + k,
            "server": server,
            "local_rank": k,
            "model": model,
        }
        if reduce_bw is not None:
            attrs["reduce_bandwidth"] = reduce_bw
        graph.add_node(node, **attrs)
        gpus.append(node)

    intra = top.sub("intra", required=True)
    shape = intra.get("kind", required=True)
    link = intra.get("link", "nvlink")
    bandwidth = intra.bandwidth("bandwidth", required=True)
    latency = intra.time("latency")
    intra.done()
    if shape in ("nvswitch", "pcie_switch"):
        hub = f"{prefix}{shape}"
        graph.add_node(hub, kind=shape, server=server)
        for node in gpus:
            graph.add_edge(node, hub, bandwidth=bandwidth, latency=latency, link=link)
    elif shape == "mesh":
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                graph.add_edge(a, b, bandwidth=bandwidth, latency=latency, link=link)
    else:
        raise TopologyError(
            f"{intra.field('kind')} is {shape!r}; use nvswitch, pcie_switch or mesh"
        )

    nics = []
    nic = top.sub("nic")
    if nic is not None:
        per = nic.get("gpus_per_nic", 1)
        if isinstance(per, bool) or not isinstance(per, int) or per < 1 or count % per:
            raise TopologyError(
                f"{nic.field('gpus_per_nic')} must be a positive divisor of the GPU count {count}"
            )
        nic_bw = nic.bandwidth("bandwidth", required=True)
        nic_latency = nic.time("latency")
        nic_link = nic.get("link", "rdma")
        pcie = nic.sub("pcie")
        if pcie is not None:
            pcie_bw = pcie.bandwidth("bandwidth", required=True)
            pcie_latency = pcie.time("latency")
            pcie.done()
        nic.done()
        for j in range(count // per):
            name = f"{prefix}nic{j}"
            graph.add_node(name, kind="nic", server=server, bandwidth=nic_bw)
            nics.append(name)
            for node in gpus[j * per : (j + 1) * per]:
                if pcie is not None:
                    graph.add_edge(node, name, bandwidth=pcie_bw, latency=pcie_latency, link="pcie")
                else:
                    graph.add_edge(node, name, bandwidth=nic_bw, latency=nic_latency, link=nic_link)
    top.get("name")
    top.done()
    return nics


def cluster_graph(
    server: Mapping,
    nodes: int = 1,
    *,
    fabric: Mapping | None = None,
    name: str = "cluster",
    source: str = "topology",
) -> nx.Graph:
    """``nodes`` servers of one shape joined by a fabric.

    ``fabric`` is the preset's ``fabric`` section; today the ``single-switch`` fabric is
    built (every NIC on one switch). With one node no fabric is added.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise TopologyError(f"{source}: --nodes must be a positive integer, got {nodes!r}")
    graph = nx.Graph(name=name if nodes == 1 else f"{name}x{nodes}")
    gpus_per_server = _Spec(server, "server", source).get("gpus", required=True)
    all_nics = []
    for index in range(nodes):
        all_nics.append(
            add_server(
                graph,
                server,
                server=index,
                first_rank=index * int(gpus_per_server),
                source=source,
            )
        )
    if nodes == 1:
        return graph
    spec = _Spec(fabric or {}, "fabric", source)
    kind = spec.get("type", "single-switch")
    if kind not in FABRICS:
        raise TopologyError(
            f"{spec.field('type')} is {kind!r}; valid fabrics: {', '.join(FABRICS)}"
        )
    latency = spec.time("latency", 0.0)
    link = spec.get("link", "rdma")
    spec.done()
    if not any(all_nics):
        raise TopologyError(
            f"{source}: {nodes} nodes need NICs to reach each other; add a 'server.nic' section"
        )
    graph.add_node("switch0", kind="switch")
    for nics in all_nics:
        for nic in nics:
            graph.add_edge(
                nic, "switch0", bandwidth=graph.nodes[nic]["bandwidth"], latency=latency, link=link
            )
    return graph
