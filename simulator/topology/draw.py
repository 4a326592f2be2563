"""Drawing a topology graph to a PNG file with matplotlib (Agg, no pyplot state).

Nodes sit in rows by role, GPUs at the bottom and the top tier of switches at the top;
colours follow the node kind and line widths the link bandwidth (log scale).
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx

from ..files import check_writable, write_with

# Row of each node role, bottom (0) to top.
_ROWS = {
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
_COLOURS = {
    "gpu": "#76b900",
    "sdma": "#c0d890",
    "nvswitch": "#4a7ab8",
    "pcie_switch": "#8da0cb",
    "cpu": "#999999",
    "nic": "#fc8d62",
    "switch": "#e78ac3",
}


def _role(data: dict) -> str:
    kind = data.get("kind", "")
    return data.get("tier", "leaf") if kind == "switch" else kind


def draw_topology(graph: nx.Graph, path: str | Path, *, title: str | None = None) -> Path:
    """Draw ``graph`` into the PNG file ``path``, written atomically; return the path.

    The image goes through :func:`simulator.files.write_with`: a regular file is
    replaced atomically, so a reader never sees half of it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    target = check_writable(path)
    rows: dict[int, list] = {}
    for node, data in graph.nodes(data=True):
        rows.setdefault(_ROWS.get(_role(data), 3), []).append(node)
    # Each row spreads its nodes over the whole width, so a server's switch sits above
    # the middle of its GPUs and each leaf above the middle of its share of the NICs.
    pos = {
        node: ((i + 0.5) / len(rows[row]), float(height))
        for height, row in enumerate(sorted(rows))
        for i, node in enumerate(rows[row])
    }
    n = graph.number_of_nodes()
    widest = max(len(nodes) for nodes in rows.values())
    fig = Figure(figsize=(min(40.0, max(8.0, widest * 0.35)), 2.0 + 1.2 * len(rows)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    bandwidths = [float(d["bandwidth"]) for _, _, d in graph.edges(data=True)] or [1.0]
    low = math.log10(min(bandwidths))
    span = max(math.log10(max(bandwidths)) - low, 1e-9)

    def width(data: dict) -> float:
        return 0.4 + 2.0 * (math.log10(float(data["bandwidth"])) - low) / span

    across = [(u, v, d) for u, v, d in graph.edges(data=True) if pos[u][1] != pos[v][1]]
    within = [(u, v, d) for u, v, d in graph.edges(data=True) if pos[u][1] == pos[v][1]]
    style = {"ax": ax, "edge_color": "#888888", "alpha": 0.6}
    nx.draw_networkx_edges(
        graph,
        pos,
        edgelist=[(u, v) for u, v, _ in across],
        width=[width(d) for *_, d in across],
        **style,
    )
    if within:  # links inside a row (a mesh) as arcs, or they would hide behind each other
        nx.draw_networkx_edges(
            graph,
            pos,
            edgelist=[(u, v) for u, v, _ in within],
            width=[width(d) for *_, d in within],
            arrows=True,
            arrowstyle="-",
            connectionstyle="arc3,rad=0.4",
            **style,
        )
    colours = [_COLOURS.get(d.get("kind"), "#cccccc") for _, d in graph.nodes(data=True)]
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=colours, node_size=120 if n < 300 else 20)
    if n <= 120:
        labels = {node: str(node).split("/")[-1] for node in graph.nodes}
        nx.draw_networkx_labels(graph, pos, labels=labels, ax=ax, font_size=6)
    ax.set_title(title or str(graph.graph.get("name", "topology")))
    return write_with(target, lambda stream: fig.savefig(stream, format="png", dpi=120))
