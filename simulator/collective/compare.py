"""Comparing collective algorithms by simulation: :func:`compare`.

:func:`compare` simulates a list of algorithms over a list of sizes on one topology
(loaded once) and returns rows (plain data) for a table, JSON, CSV or a plot
(:func:`simulator.viz.tables.compare_table`, :func:`simulator.viz.plots.save_compare_plot`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import networkx as nx

from ..algorithms import get_algorithm
from ..errors import CcsimError
from .policy import POLICIES, library_policy
from .run import rank_layout
from .tuner import AutoTuner

#: Keys of a compare row (``--format json`` / ``csv``).
COMPARE_KEYS = (
    "op",
    "algorithm",
    "ranks",
    "size_bytes",
    "chunks",
    "channels",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "winner",
)


def compare(
    graph: nx.Graph,
    op: str,
    sizes: Sequence[float],
    algorithms: Sequence[str],
    *,
    chunks: int | str = "auto",
    channels: int = 1,
    reduce_bandwidth: float | None = None,
    root: int = 0,
    protocol: str | None = None,
) -> list[dict[str, Any]]:
    """Simulate each algorithm at each size; one row per (size, algorithm).

    Rows have the keys :data:`COMPARE_KEYS`; ``winner`` marks the fastest algorithm at
    each size (ties go to the first listed); a name listed twice runs once, in its first
    place. With ``chunks="auto"`` each algorithm runs with its best chunk count at that
    size. A policy name (``nccl``, ``hccl``) runs that library's own choice per size,
    with its chunks and channels.

    Examples
    --------
    All-gather of 4 MB on a ring of 4 GPUs (100 GB/s, 1 us per link): the ring takes
    3 x (1 us + 10 us); direct sends each 1 MB block straight to its destination, the
    2-hop ones clockwise, so every link carries 3 blocks: 30 us + 2 us.

    >>> from simulator.topology import ring_graph
    >>> graph = ring_graph(4, 100e9, 1e-6)
    >>> rows = compare(graph, "all_gather", [4e6], ["ring", "direct"], chunks=1)
    >>> [(row["algorithm"], round(row["time_us"], 6), row["winner"]) for row in rows]
    [('ring', 33.0, False), ('direct', 32.0, True)]
    """
    algorithms = list(dict.fromkeys(algorithms))  # one column per algorithm
    if not algorithms:
        raise CcsimError("give at least one algorithm to compare")
    policies = {
        name: library_policy(name, graph, protocol=protocol, reduce_bandwidth=reduce_bandwidth)
        for name in algorithms
        if name in POLICIES
    }
    for name in algorithms:
        if name not in policies:
            get_algorithm(name)
    tuner = AutoTuner(channels=channels, reduce_bandwidth=reduce_bandwidth, protocol=protocol)
    layout = rank_layout(graph)
    rows = []
    for size in sizes:
        group = []
        for name in algorithms:
            c = channels
            if name in policies:
                result = policies[name].simulate(graph, op, float(size), root=root)
                k, c = result.params["chunks"], result.params["channels"]
            elif chunks == "auto":
                result, k = tuner.best_chunks(
                    graph, op, float(size), name, layout=layout, root=root
                )
            else:
                k = int(chunks)
                result = tuner.run(graph, op, float(size), name, k, layout=layout, root=root)
            row = {**result.row(), "algorithm": name}
            group.append({**row, "chunks": k, "channels": c, "winner": False})
        fastest = min(range(len(group)), key=lambda i: group[i]["time_us"])
        group[fastest]["winner"] = True
        rows.extend(group)
    return rows
