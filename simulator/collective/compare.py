"""Comparing collective algorithms by simulation: :func:`compare`.

:func:`compare` simulates a list of algorithms over a list of sizes on one topology
(loaded once) and returns rows (plain data) for a table, JSON, CSV or a plot
(:func:`simulator.viz.tables.compare_table`, :func:`simulator.viz.plots.save_compare_plot`).

Each algorithm runs as the topology's library would run it: on NVIDIA GPUs an algorithm
NCCL has (ring, chain-tree, nvls, nvls-tree) runs as NCCL runs it when forced to it
(``NCCL_ALGO=Ring`` and so on: NCCL's protocol, channels and chunking for that call),
beside ``nccl``, NCCL's own choice. Algorithms the library does not have, and every
algorithm with ``ideal=True``, run on the ideal model (line rate, no protocol, the
channels given, the best chunk count): an upper bound, labelled so in each row's
``model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import networkx as nx

from ..algorithms import get_algorithm
from ..errors import CcsimError
from ..library.nccl import ALGORITHMS, SCHEDULES, nccl_choice
from ..library.nccl_env import NcclEnv, parse_nccl_env
from .policy import POLICIES, NcclPolicy, library_of, library_policy
from .run import rank_layout
from .tuner import AutoTuner

#: The NCCL algorithm each ccsim schedule runs when NCCL is forced to it (NCCL_ALGO);
#: PAT, which ccsim runs as a ring, is reached through ``nccl`` only.
FORCED = {schedule: name for name, schedule in SCHEDULES.items() if name != "PAT"}

#: Keys of a compare row (``--format json`` / ``csv``).
COMPARE_KEYS = (
    "op",
    "algorithm",
    "ranks",
    "size_bytes",
    "model",
    "protocol",
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
    ideal: bool = False,
    progress: Any = None,
    nccl: NcclEnv | str | None = None,
) -> list[dict[str, Any]]:
    """Simulate each algorithm at each size; one row per (size, algorithm).

    Rows have the keys :data:`COMPARE_KEYS`; ``winner`` marks the fastest algorithm at
    each size (ties go to the first listed); a name listed twice runs once, in its first
    place. A policy name (``nccl``, ``hccl``) runs that library's own choice per size,
    with its chunks and channels; an algorithm NCCL has runs as NCCL forced to it would
    (:data:`FORCED`; model ``NCCL_ALGO=...``), unless ``ideal``. The others run on the
    ideal model (model ``ideal``) with ``channels`` and, with ``chunks="auto"``, their
    best chunk count at that size. ``progress``, if given, is called once per row.
    ``nccl`` (NCCL's environment settings) applies to ``nccl`` as given and to the
    forced runs without its NCCL_ALGO, which forcing replaces: NCCL_PROTO, NVLS and the
    channel bounds still hold there.

    Examples
    --------
    All-gather of 4 MB on a ring of 4 GPUs (100 GB/s, 1 us per link), on the ideal
    model: the ring takes 3 x (1 us + 10 us); direct sends each 1 MB block straight to
    its destination, the 2-hop ones clockwise, so every link carries 3 blocks: 30 us +
    2 us.

    >>> from simulator.topology import ring_graph
    >>> graph = ring_graph(4, 100e9, 1e-6)
    >>> rows = compare(graph, "all_gather", [4e6], ["ring", "direct"], chunks=1, ideal=True)
    >>> [(row["algorithm"], round(row["time_us"], 6), row["winner"]) for row in rows]
    [('ring', 33.0, False), ('direct', 32.0, True)]
    """
    algorithms = list(dict.fromkeys(algorithms))  # one column per algorithm
    if not algorithms:
        raise CcsimError("give at least one algorithm to compare")
    env = parse_nccl_env(nccl)
    policies = {
        name: library_policy(
            name, graph, protocol=protocol, reduce_bandwidth=reduce_bandwidth, nccl=env
        )
        for name in algorithms
        if name in POLICIES
    }
    for name in algorithms:
        if name not in policies:
            get_algorithm(name)
    forced: dict[str, NcclPolicy] = {}
    if not ideal and library_of(graph) == "nccl":
        forced = {
            name: forced_policy(
                name, protocol=protocol, reduce_bandwidth=reduce_bandwidth, nccl=env
            )
            for name in algorithms
            if name in FORCED
        }
    tuner = AutoTuner(channels=channels, reduce_bandwidth=reduce_bandwidth, protocol=protocol)
    layout = rank_layout(graph)
    rows = []
    for size in sizes:
        group = []
        for name in algorithms:
            c = channels
            policy = policies.get(name) or forced.get(name)
            if policy is not None and name in forced and not nccl_runs(policy, graph, op, size):
                policy = None  # NCCL cannot run it here: the ideal model, said so
            if policy is not None:
                result = policy.simulate(graph, op, float(size), root=root)
                k, c = result.params["chunks"], result.params["channels"]
                model = "library choice" if name in policies else f"NCCL_ALGO={FORCED[name]}"
            elif chunks == "auto":
                result, k = tuner.best_chunks(
                    graph, op, float(size), name, layout=layout, root=root
                )
            else:
                k = int(chunks)
                result = tuner.run(graph, op, float(size), name, k, layout=layout, root=root)
            if policy is None:
                model = "ideal"
            row = {**result.row(), "algorithm": name}
            proto = result.params.get("protocol") if policy is not None else protocol
            group.append(
                {
                    **row,
                    "model": model,
                    "protocol": proto or "-",
                    "chunks": k,
                    "channels": c,
                    "winner": False,
                }
            )
            if progress is not None:
                progress()
        fastest = min(range(len(group)), key=lambda i: group[i]["time_us"])
        group[fastest]["winner"] = True
        rows.extend(group)
    return rows


def forced_policy(
    name: str,
    *,
    protocol: str | None = None,
    reduce_bandwidth: float | None = None,
    nccl: NcclEnv | str | None = None,
) -> NcclPolicy:
    """NCCL forced to the algorithm that runs schedule ``name`` (:data:`FORCED`), under
    the user's settings ``nccl`` but their NCCL_ALGO, which forcing replaces."""
    env = parse_nccl_env(nccl).without("NCCL_ALGO")
    return NcclPolicy(
        protocol=protocol, reduce_bandwidth=reduce_bandwidth, algorithms=(FORCED[name],), env=env
    )


def nccl_runs(policy: NcclPolicy, graph: nx.Graph, op: str, size: float) -> bool:
    """Whether NCCL, restricted as ``policy`` is, has an algorithm for this call."""
    if op == "all_to_all":
        return False  # not through NCCL's tuner: no algorithm to force
    system = policy.system(graph)
    algorithms, protocols = policy.allowed(op, system)
    try:
        nccl_choice(system, op, float(size), algorithms=algorithms, protocols=protocols)
    except CcsimError:
        return False
    return True


def library_algorithms(
    graph: nx.Graph, op: str, size: float, nccl: NcclEnv | str | None = None
) -> list[str]:
    """The default line-up: the topology's library's own choice, then (NCCL) each
    algorithm NCCL can be forced to for ``op`` here, in NCCL's order (under the
    settings ``nccl`` but their NCCL_ALGO: NCCL_NVLS_ENABLE=0 leaves out nvls)."""
    library = library_of(graph)
    names = [library]
    if library == "nccl":
        for schedule in sorted(FORCED, key=lambda name: ALGORITHMS.index(FORCED[name])):
            if nccl_runs(forced_policy(schedule, nccl=nccl), graph, op, size):
                names.append(schedule)
    return names
