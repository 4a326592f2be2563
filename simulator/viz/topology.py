"""Drawing a topology graph (``ccsim topology show --png``) with matplotlib (no pyplot).

Nodes sit in rows by role, GPUs at the bottom and the top tier of switches at the top.
What a newcomer needs to read the picture is on it, once:

* a legend of node kinds, with their counts (``GPU x16 (H100-SXM5-80GB)``, ``leaf
  switch x8``);
* a legend of link classes, each with its bandwidth per direction in the unit people
  quote for it: GB/s inside a server (``NVLink 450 GB/s``), Gb/s on the network
  (``RDMA 400 Gb/s``); links are coloured by class and drawn wider the faster they are;
* node names only on the first server (the others repeat them) and on the fabric's
  switches, and each server named once under its GPUs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..files import write_with

#: Row of each node role, bottom (0) to top.
ROWS = {
    "gpu": 0,
    "sdma": 1,
    "nvswitch": 2,
    "pcie_switch": 2,
    "cpu": 3,
    "nic": 4,
    "leaf": 5,
    "edge": 5,
    "switch": 5,
    "aggregation": 6,
    "spine": 7,
    "core": 7,
}
#: Colour of each node kind.
NODE_COLOURS = {
    "gpu": "#76b900",
    "sdma": "#c0d890",
    "nvswitch": "#4a7ab8",
    "pcie_switch": "#8da0cb",
    "cpu": "#999999",
    "nic": "#fc8d62",
    "switch": "#e78ac3",
    "leaf": "#e78ac3",
    "edge": "#e78ac3",
    "aggregation": "#c45fa5",
    "spine": "#8e3b78",
    "core": "#8e3b78",
}
#: How each node role is named in the legend.
NODE_NAMES = {
    "gpu": "GPU",
    "sdma": "SDMA engine",
    "nvswitch": "NVSwitch",
    "pcie_switch": "PCIe switch",
    "cpu": "CPU",
    "nic": "NIC",
    "leaf": "leaf switch",
    "edge": "edge switch",
    "switch": "switch",
    "aggregation": "aggregation switch",
    "spine": "spine switch",
    "core": "core switch",
}
#: How each link kind is named in the legend.
LINK_NAMES = {
    "nvlink": "NVLink",
    "pcie": "PCIe",
    "rdma": "RDMA",
    "erdma": "eRDMA",
    "roce": "RoCE",
    "hccs": "HCCS",
    "xgmi": "xGMI",
    "sdma": "SDMA",
}
#: Links quoted in bits per second (network ports), the others in bytes per second.
NETWORK_LINKS = ("rdma", "erdma", "roce", "ethernet", "infiniband")
#: Colour of each link kind (the same in every picture); other kinds take :data:`_SPARE`.
LINK_COLOURS = {
    "nvlink": "#2ca02c",
    "pcie": "#7f7f7f",
    "rdma": "#d62728",
    "roce": "#ff7f0e",
    "erdma": "#bcbd22",
    "hccs": "#17becf",
    "sdma": "#9467bd",
    "xgmi": "#8c564b",
}
_SPARE = ("#1f77b4", "#e377c2", "#393b79", "#637939", "#843c39")
#: The legend's section headings.
NODES_HEADING = "nodes"
LINKS_HEADING = "links (bandwidth per direction)"
#: Most nodes a row may have for their names to be drawn (beyond, they would overlap;
#: the legend says what the row holds).
MAX_LABELLED_ROW = 40


def node_role(data: Mapping[str, Any]) -> str:
    """A node's role: its kind, or a switch's tier (leaf, spine, ...).

    >>> node_role({"kind": "switch", "tier": "spine"}), node_role({"kind": "gpu"})
    ('spine', 'gpu')
    """
    kind = str(data.get("kind", ""))
    return str(data.get("tier", "leaf")) if kind == "switch" else kind


def link_kind(graph: nx.Graph, u: Any, v: Any, data: Mapping[str, Any]) -> str:
    """A link's kind: its ``link`` attribute, else named after its ends (``nic-switch``)."""
    if data.get("link"):
        return str(data["link"])
    ends = sorted(str(graph.nodes[n].get("kind", "?")) for n in (u, v))
    return "-".join(ends)


def bandwidth_label(bandwidth: float, kind: str) -> str:
    """A link's bandwidth (bytes/s, one direction) as people quote it: Gb/s on the
    network, GB/s inside a server (1 GB = 1e9 bytes).

    >>> bandwidth_label(50e9, "rdma"), bandwidth_label(450e9, "nvlink")
    ('400 Gb/s', '450 GB/s')
    >>> bandwidth_label(31.5e9, "pcie")
    '31.5 GB/s'
    """
    if kind in NETWORK_LINKS:
        return f"{bandwidth * 8 / 1e9:.4g} Gb/s"
    return f"{bandwidth / 1e9:.4g} GB/s"


def link_classes(graph: nx.Graph) -> dict[tuple[str, str, float], list[tuple[Any, Any]]]:
    """The graph's links grouped by class: (kind, the roles at their ends, bandwidth).

    >>> from simulator.topology import load_topology
    >>> sorted(k[:2] for k in link_classes(load_topology("dgx-h100")))
    [('nvlink', 'GPU-NVSwitch'), ('pcie', 'GPU-NIC')]
    """
    classes: dict[tuple[str, str, float], list[tuple[Any, Any]]] = {}
    for u, v, data in graph.edges(data=True):
        ends = sorted((node_role(graph.nodes[u]), node_role(graph.nodes[v])), key=_row)
        name = "-".join(NODE_NAMES.get(end, end) for end in ends)
        key = (link_kind(graph, u, v, data), name, float(data["bandwidth"]))
        classes.setdefault(key, []).append((u, v))
    return classes


def link_class_label(key: tuple[str, str, float], count: int) -> str:
    """A link class's legend entry: ``NVLink 450 GB/s  GPU-NVSwitch x16``.

    >>> link_class_label(("rdma", "NIC-leaf switch", 50e9), 16)
    'RDMA 400 Gb/s  NIC-leaf switch x16'
    """
    kind, ends, bandwidth = key
    return f"{LINK_NAMES.get(kind, kind)} {bandwidth_label(bandwidth, kind)}  {ends} x{count}"


def _row(role: str) -> int:
    return ROWS.get(role, 3)


def _labelled(graph: nx.Graph, rows: Mapping[int, list]) -> dict[Any, str]:
    """Names drawn: every node of the first server (the others repeat them) and every
    node outside servers (the fabric's switches), short names (``s0/`` dropped), in rows
    of at most :data:`MAX_LABELLED_ROW` nodes."""
    servers = [d.get("server") for _, d in graph.nodes(data=True) if d.get("server") is not None]
    first = min(servers) if servers else None
    return {
        node: str(node).split("/")[-1]
        for nodes in rows.values()
        if len(nodes) <= MAX_LABELLED_ROW
        for node in nodes
        if graph.nodes[node].get("server") in (None, first)
    }


def topology_figure(graph: nx.Graph, *, title: str | None = None) -> Figure:
    """Draw ``graph``: nodes in rows by role, links coloured by class, two legends.

    >>> from simulator.topology import load_topology
    >>> fig = topology_figure(load_topology("dgx-h100", 2))
    >>> [t.get_text() for t in fig.legends[0].get_texts()][:3]
    ['nodes', 'GPU x16 (H100-SXM5-80GB)', 'NVSwitch x2']
    """
    rows: dict[int, list] = {}
    for node, data in graph.nodes(data=True):
        rows.setdefault(_row(node_role(data)), []).append(node)
    # Each row spreads its nodes over the whole width, so a server's switch sits above
    # the middle of its GPUs and each leaf above the middle of its share of the NICs.
    pos = {
        node: ((i + 0.5) / len(rows[row]), float(height))
        for height, row in enumerate(sorted(rows))
        for i, node in enumerate(rows[row])
    }
    n = graph.number_of_nodes()
    widest = max((len(nodes) for nodes in rows.values()), default=1)
    classes = link_classes(graph)
    roles = Counter(node_role(d) for _, d in graph.nodes(data=True))
    legend_rows = len(roles) + len(classes) + 2
    height = max(2.0 + 1.1 * len(rows), 1.0 + 0.22 * legend_rows)
    fig = Figure(figsize=(min(24.0, max(11.0, widest * 0.4)), height))
    ax = fig.add_axes((0.02, 0.02, 0.66, 0.88))
    ax.set_axis_off()
    bandwidths = [key[2] for key in classes] or [1.0]
    low = math.log10(min(bandwidths))
    span = max(math.log10(max(bandwidths)) - low, 1e-9)

    def width(bandwidth: float) -> float:
        return 0.6 + 2.4 * (math.log10(bandwidth) - low) / span

    link_handles = []
    others = sorted({key[0] for key in classes} - set(LINK_COLOURS))
    colour_of = {**LINK_COLOURS, **{k: _SPARE[i % len(_SPARE)] for i, k in enumerate(others)}}
    for key in sorted(classes, key=lambda k: (-k[2], k[0], k[1])):
        edges = classes[key]
        colour = colour_of[key[0]]
        across = [(u, v) for u, v in edges if pos[u][1] != pos[v][1]]
        within = [(u, v) for u, v in edges if pos[u][1] == pos[v][1]]
        style = {"ax": ax, "edge_color": colour, "alpha": 0.6, "width": width(key[2])}
        if across:
            nx.draw_networkx_edges(graph, pos, edgelist=across, **style)
        if within:  # links inside a row (a mesh) as arcs, or they would hide each other
            nx.draw_networkx_edges(
                graph,
                pos,
                edgelist=within,
                arrows=True,
                arrowstyle="-",
                connectionstyle="arc3,rad=0.4",
                **style,
            )
        link_handles.append(
            Line2D(
                [],
                [],
                color=colour,
                linewidth=width(key[2]),
                label=link_class_label(key, len(edges)),
            )
        )
    colours = [NODE_COLOURS.get(node_role(d), "#cccccc") for _, d in graph.nodes(data=True)]
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=colours, node_size=120 if n < 300 else 20)
    nx.draw_networkx_labels(graph, pos, labels=_labelled(graph, rows), ax=ax, font_size=7)
    _name_servers(ax, graph, pos)
    node_handles = []
    for role in sorted(roles, key=lambda r: (_row(r), r)):
        models = {
            str(d["model"])
            for _, d in graph.nodes(data=True)
            if node_role(d) == role and "model" in d
        }
        label = f"{NODE_NAMES.get(role, role)} x{roles[role]}"
        if len(models) == 1:
            label += f" ({models.pop()})"
        node_handles.append(
            Line2D(
                [],
                [],
                linestyle="",
                marker="o",
                markersize=8,
                markerfacecolor=NODE_COLOURS.get(role, "#cccccc"),
                markeredgecolor="none",
                label=label,
            )
        )
    # One legend, two sections: a heading is an entry with an empty handle.
    nodes_heading = Line2D([], [], linestyle="", label=NODES_HEADING)
    links_heading = Line2D([], [], linestyle="", label=LINKS_HEADING)
    legend = fig.legend(
        handles=[nodes_heading, *node_handles, links_heading, *link_handles],
        loc="upper left",
        bbox_to_anchor=(0.69, 0.9),
        fontsize=8,
        frameon=False,
        handlelength=2.5,
    )
    for text in legend.get_texts():
        if text.get_text() in (NODES_HEADING, LINKS_HEADING):
            text.set_fontweight("bold")
    fig.suptitle(title or str(graph.graph.get("name", "topology")))
    return fig


def _name_servers(ax: Any, graph: nx.Graph, pos: Mapping[Any, tuple[float, float]]) -> None:
    """Write ``server k`` once under each server's GPUs (up to 32 servers)."""
    spots: dict[int, list[float]] = {}
    for node, data in graph.nodes(data=True):
        if data.get("kind") == "gpu" and data.get("server") is not None:
            spots.setdefault(int(data["server"]), []).append(pos[node][0])
    if not 1 < len(spots) <= 32:
        return
    for server, xs in sorted(spots.items()):
        ax.text(sum(xs) / len(xs), -0.35, f"server {server}", ha="center", va="top", fontsize=7)


def draw_topology(graph: nx.Graph, path: str | Path, *, title: str | None = None) -> Path:
    """Draw ``graph`` (:func:`topology_figure`) into the PNG file ``path``, written
    atomically through :func:`simulator.files.write_with`; return the path."""
    fig = topology_figure(graph, title=title)
    return write_with(path, lambda stream: fig.savefig(stream, format="png", dpi=120))
