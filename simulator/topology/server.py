"""One server (machine) of a topology, built from the ``server`` section of a preset.

The section is documented with a worked example in ``topologies/README.md``. In short:

``gpus``
    How many GPUs (or NPUs); GPU ``k`` is the node ``gpu{k}`` and gets rank
    ``first_rank + k``.
``host_gpus``
    GPUs per operating-system host, where one server (an NVLink domain) spans several
    (a GB200 NVL72 rack: 4-GPU compute trays); host h holds GPUs ``h x host_gpus`` to
    ``(h + 1) x host_gpus - 1``, marked by the GPU attribute ``host`` (h). Left out: the
    server is one host (no ``host`` attribute). NCCL relays a send only through a GPU
    of the sender's own host (:func:`simulator.library.nccl_p2p.p2p_proxy`).
``gpu``
    ``model`` and ``reduce_bandwidth`` of every GPU.
``intra``
    Shorthand for the common shapes: every GPU on one ``nvswitch`` or ``pcie_switch``
    (a non-blocking crossbar), or a full ``mesh`` of direct links. ``nvls: true`` says
    the NVSwitch reduces and multicasts in the switch (NVLink SHARP, H100 and later),
    which the ``nvls`` algorithm needs.
``devices`` and ``links``
    Any other shape: named extra nodes (``pcie0: {kind: pcie_switch}``; ``sdma0-7``
    declares eight) and links between named nodes, each ``ends: [A, B]`` (every node of
    A to every node of B), ``pairs: [A, B]`` (A[i] to B[i]) or ``mesh: A`` (all pairs).
``nic``
    NICs: ``bandwidth`` (one figure, or a list with one per NIC), ``latency`` (added
    each time a message crosses the NIC; default: its ``stack``'s), ``message_rate``
    (messages/s), ``link``, ``stack`` (the network stack: infiniband, roce, erdma, tcpx,
    tcpxo; :mod:`simulator.topology.stacks`);
    attached to ``gpus_per_nic`` consecutive GPUs each, or to the nodes listed in
    ``attach``; ``pcie`` gives the bandwidth and latency of the attaching links when they
    are PCIe.

Every node is named ``s{server}/{local name}`` so that servers never collide.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx

from ..errors import TopologyError
from .graph import NODE_KINDS
from .spec import Spec, expand_names
from .stacks import DEFAULT_STACK, get_stack

# Kinds a `devices` entry may have: GPUs come from `gpus` and NICs from `nic`, so that
# ranks and NIC attributes are always set.
DEVICE_KINDS = tuple(sorted(NODE_KINDS - {"gpu", "nic"}))


def add_server(
    graph: nx.Graph, spec: Mapping, *, server: int, first_rank: int, source: str
) -> list[str]:
    """Add the server described by ``spec`` to ``graph``; return its NIC nodes in order.

    Parameters
    ----------
    graph : networkx.Graph
        The graph to add to (this builder's own graph; it is mutated).
    spec : mapping
        The ``server`` section of a preset (see the module docstring).
    server : int
        Index of this server; node names get the prefix ``s{server}/``.
    first_rank : int
        Rank of the server's GPU 0.
    source : str
        Where the spec came from, for error messages.

    Examples
    --------
    >>> g = nx.Graph()
    >>> spec = {"gpus": 2, "intra": {"kind": "mesh", "bandwidth": "100GB/s"},
    ...         "nic": {"bandwidth": "200Gbps"}}
    >>> add_server(g, spec, server=0, first_rank=0, source="example")
    ['s0/nic0', 's0/nic1']
    >>> g.edges["s0/gpu0", "s0/gpu1"]["bandwidth"]
    100000000000.0
    """
    top = Spec(spec, "server", source)
    count = top.count("gpus", required=True)
    host_gpus = top.count("host_gpus") if top.has("host_gpus") else None
    if host_gpus is not None and count % host_gpus:
        raise TopologyError(
            f"{top.field('host_gpus')} is {host_gpus}; it must divide the GPU count {count} "
            "(each host holds that many GPUs)"
        )
    top.text("name")
    prefix = f"s{server}/"
    local: dict[str, str] = {}  # local name -> node

    gpu = top.sub("gpu") or Spec({}, "server.gpu", source)
    model = gpu.text("model", "gpu")
    reduce_bw = gpu.bandwidth("reduce_bandwidth") if gpu.has("reduce_bandwidth") else None
    gpu.done()
    for k in range(count):
        node = f"{prefix}gpu{k}"
        attrs = {"kind": "gpu", "rank": first_rank + k, "server": server, "local_rank": k}
        attrs["model"] = model
        if host_gpus is not None:
            attrs["host"] = k // host_gpus
        if reduce_bw is not None:
            attrs["reduce_bandwidth"] = reduce_bw
        graph.add_node(node, **attrs)
        local[f"gpu{k}"] = node

    devices = top.sub("devices")
    if devices is not None:
        for key, value in devices.data.items():
            where = devices.field(str(key))
            for name in expand_names(str(key), field=where):
                if name in local:
                    raise TopologyError(
                        f"{where}: the name {name!r} is already taken (GPUs are gpu0, gpu1, "
                        "..., NICs nic0, ...); pick another name"
                    )
                entry = Spec(value, f"{devices.path}.{key}", source)
                kind = entry.get("kind", required=True)
                if kind not in DEVICE_KINDS:
                    raise TopologyError(
                        f"{entry.field('kind')} is {kind!r}; use one of {', '.join(DEVICE_KINDS)} "
                        "(GPUs come from 'gpus', NICs from 'nic')"
                    )
                attrs = {"kind": kind, "server": server}
                device_model = entry.text("model")
                if device_model is not None:
                    attrs["model"] = device_model
                entry.done()
                graph.add_node(prefix + name, **attrs)
                local[name] = prefix + name

    intra = top.sub("intra")
    if intra is not None:
        _add_intra(graph, intra, [local[f"gpu{k}"] for k in range(count)], prefix, server, local)
    for entry in top.items("links"):
        _add_links(graph, entry, local)
    if count > 1 and intra is None and not top.data.get("links"):
        raise TopologyError(
            f"{source}: server has {count} GPUs but no links between them; add an "
            "'intra' section (nvswitch, pcie_switch or mesh) or a 'links' list"
        )

    nics: list[str] = []
    nic = top.sub("nic")
    if nic is not None:
        nics = _add_nics(graph, nic, count, prefix, server, local)
    top.done()
    return nics


def server_items(spec: object) -> int | None:
    """Nodes plus links that :func:`add_server` would add for ``spec``, counted from its
    numbers without building anything (so that a resource guard can refuse
    ``gpus: 10000000`` before the graph exists); None where the numbers are not plain
    counts (the builder then says what is wrong).

    >>> server_items({"gpus": 8, "intra": {"kind": "nvswitch"}, "nic": {}})
    33
    >>> server_items({"gpus": 4, "intra": {"kind": "mesh"}})
    10
    """
    if not isinstance(spec, Mapping):
        return None
    gpus = spec.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        return None
    items = gpus
    devices = spec.get("devices")
    if isinstance(devices, Mapping):
        items += len(devices)
    links = spec.get("links")
    if isinstance(links, list):
        items += len(links)  # at least one link each; the named devices bound the rest
    intra = spec.get("intra")
    if isinstance(intra, Mapping):
        # A mesh links every pair; a switch is one node with a link to each GPU.
        items += gpus * (gpus - 1) // 2 if intra.get("kind") == "mesh" else gpus + 1
    nic = spec.get("nic")
    if isinstance(nic, Mapping):
        attach = nic.get("attach")
        per = nic.get("gpus_per_nic", 1)
        if isinstance(attach, list):
            nics = len(attach)
        elif isinstance(per, int) and not isinstance(per, bool) and per >= 1:
            nics = gpus // per
        else:
            nics = gpus
        items += nics + max(nics, gpus if attach is None else nics)  # NICs, their links
    return items


def _add_intra(
    graph: nx.Graph, intra: Spec, gpus: list[str], prefix: str, server: int, local: dict
) -> None:
    shape = intra.get("kind", required=True)
    link = intra.text("link", "nvlink")
    bandwidth = intra.bandwidth("bandwidth", required=True)
    latency = intra.time("latency")
    nvls = intra.get("nvls", False)
    if not isinstance(nvls, bool):
        raise TopologyError(f"{intra.field('nvls')} must be true or false, got {nvls!r}")
    if nvls and shape != "nvswitch":
        raise TopologyError(f"{intra.field('nvls')}: in-switch reduction needs kind nvswitch")
    intra.done()
    if shape in ("nvswitch", "pcie_switch"):
        if shape in local:
            raise TopologyError(
                f"{intra.field('kind')}: a device is already named {shape!r}; rename the device"
            )
        hub = prefix + shape
        graph.add_node(hub, kind=shape, server=server, **({"nvls": True} if nvls else {}))
        local[shape] = hub
        for node in gpus:
            graph.add_edge(node, hub, bandwidth=bandwidth, latency=latency, link=link)
    elif shape == "mesh":
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                graph.add_edge(a, b, bandwidth=bandwidth, latency=latency, link=link)
    else:
        raise TopologyError(
            f"{intra.field('kind')} is {shape!r}; use nvswitch, pcie_switch or mesh "
            "(or describe the server with 'devices' and 'links')"
        )


def _resolve(names: object, local: dict, field: str) -> list[str]:
    nodes = []
    for name in expand_names(names, field=field):
        if name not in local:
            known = ", ".join(list(local)[:12]) + (", ..." if len(local) > 12 else "")
            raise TopologyError(
                f"{field}: no node named {name!r} in this server; known names: {known}"
            )
        nodes.append(local[name])
    return nodes


def _add_links(graph: nx.Graph, entry: Spec, local: dict) -> None:
    shapes = [key for key in ("ends", "pairs", "mesh") if entry.has(key)]
    if len(shapes) != 1:
        raise TopologyError(
            f"{entry.source}: {entry.path} needs exactly one of 'ends: [A, B]', "
            "'pairs: [A, B]' or 'mesh: A'"
        )
    shape = shapes[0]
    value = entry.get(shape)
    bandwidth = entry.bandwidth("bandwidth", required=True)
    latency = entry.time("latency")
    link = entry.text("link", "link")
    entry.done()
    where = entry.field(shape)
    if shape == "mesh":
        nodes = _resolve(value, local, where)
        pairs = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1 :]]
    else:
        if not (isinstance(value, list) and len(value) == 2):
            raise TopologyError(f"{where} must be a list of two node groups, e.g. [gpu0-3, pcie0]")
        left = _resolve(value[0], local, where)
        right = _resolve(value[1], local, where)
        if shape == "ends":
            pairs = [(a, b) for a in left for b in right]
        else:
            if len(left) != len(right):
                raise TopologyError(
                    f"{where} pairs {len(left)} nodes with {len(right)}; both sides need the "
                    "same count"
                )
            pairs = list(zip(left, right, strict=True))
    for a, b in pairs:
        if a == b:
            raise TopologyError(f"{where} links {a!r} to itself; remove it from one side")
        if graph.has_edge(a, b):
            raise TopologyError(
                f"{where}: {a!r} and {b!r} are already linked; join parallel links into one "
                "entry with their summed bandwidth"
            )
        graph.add_edge(a, b, bandwidth=bandwidth, latency=latency, link=link)


def _add_nics(
    graph: nx.Graph, nic: Spec, count: int, prefix: str, server: int, local: dict
) -> list[str]:
    stack = get_stack(nic.get("stack", DEFAULT_STACK), field=nic.field("stack"))
    # A NIC's own latency wins; without one, the time its network stack adds per message.
    latency = nic.time("latency") if nic.has("latency") else stack.latency_s
    rate = nic.rate("message_rate")
    link = nic.text("link", "rdma")
    pcie = nic.sub("pcie")
    attach_bw: float | None = None  # None: a direct link at the NIC's own bandwidth
    attach_latency, attach_link = 0.0, link
    if pcie is not None:
        attach_bw = pcie.bandwidth("bandwidth", required=True)
        attach_latency = pcie.time("latency")
        attach_link = "pcie"
        pcie.done()
    if nic.has("attach") and nic.has("gpus_per_nic"):
        raise TopologyError(
            f"{nic.field('attach')}: give either 'attach' (where each NIC hangs off) or "
            "'gpus_per_nic', not both"
        )
    if nic.has("attach"):
        hosts = [[node] for node in _resolve(nic.get("attach"), local, nic.field("attach"))]
    else:
        per = nic.count("gpus_per_nic", 1)
        if count % per:
            raise TopologyError(
                f"{nic.field('gpus_per_nic')} is {per}; it must divide the GPU count {count}"
            )
        hosts = [
            [f"{prefix}gpu{k}" for k in range(j * per, (j + 1) * per)] for j in range(count // per)
        ]
    # One figure for every NIC, or a list with one per NIC (measured rates such as
    # ib_write_bw's differ from NIC to NIC on real clusters).
    bandwidths = nic.bandwidths("bandwidth", len(hosts), what="NIC")
    nic.done()
    nics = []
    for j, (attached, bandwidth) in enumerate(zip(hosts, bandwidths, strict=True)):
        if f"nic{j}" in local:
            raise TopologyError(
                f"{nic.source}: a device is named 'nic{j}', the name of NIC {j}; rename the device"
            )
        name = f"{prefix}nic{j}"
        attrs = {
            "kind": "nic",
            "server": server,
            "bandwidth": bandwidth,
            "latency": latency,
            "stack": stack.name,
        }
        if rate is not None:
            attrs["message_rate"] = rate
        graph.add_node(name, **attrs)
        local[f"nic{j}"] = name
        nics.append(name)
        for host in attached:
            graph.add_edge(
                host,
                name,
                bandwidth=bandwidth if attach_bw is None else attach_bw,
                latency=attach_latency,
                link=attach_link,
            )
    return nics
