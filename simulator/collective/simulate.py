"""Simulating one collective call: :func:`simulate_collective`.

The choice of algorithm, chunks and channels is resolved first (fixed by the caller, or
searched by :class:`~simulator.collective.tuner.AutoTuner` where "auto"), then the
schedule runs with :func:`~simulator.collective.run.run_schedule`. The runner never
imports the tuner; this module sits above both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import networkx as nx

from ..algorithms.chain import ROOTED_OPS
from ..errors import CcsimError, unknown_choice
from ..library.nccl_env import NcclEnv
from ..topology import load_topology
from .policy import POLICIES, library_policy, nccl_not_applied
from .run import COLLECTIVE_OPS, CollectiveResult, auto_fraction, build_and_run
from .tuner import AutoTuner


def simulate_collective(
    topology: str | Path | nx.Graph,
    op: str,
    size_bytes: float,
    algorithm: str = "ring",
    *,
    nodes: int | None = None,
    chunks: int | str | None = None,
    channels: int | str | None = None,
    reduce_bandwidth: float | None = None,
    root: int = 0,
    protocol: str | None = None,
    fraction: float | str | None = None,
    fabric: str | None = None,
    seed: int | None = None,
    nccl: NcclEnv | str | None = None,
) -> CollectiveResult:
    """Simulate one collective on a topology.

    Parameters
    ----------
    topology : preset name, preset YAML path or networkx graph
        Where it runs; graphs follow :mod:`simulator.topology.graph`'s conventions.
    op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"}
    size_bytes : float
        Message size as nccl-tests counts it (for all-gather and reduce-scatter the whole
        gathered buffer; for all-to-all each rank's whole send buffer).
    algorithm : str
        A registered algorithm (see :func:`simulator.algorithms.algorithm_names`);
        "nccl" for what NCCL would run with its defaults (its algorithm, protocol and
        channels, :mod:`simulator.library.nccl`: the realistic prediction); "hccl" for
        what HCCL would run on Ascend NPUs (:mod:`simulator.library.hccl`; refused with
        "nccl" where the topology's ``library`` is hccl); or "auto" for the fastest
        schedule ccsim finds by simulation (an ideal scheduler).
    nodes : int, optional
        Number of servers, for presets.
    fabric, seed : optional
        Fabric type and ECMP seed for presets (see :func:`simulator.topology.load_topology`).
    chunks, channels : int or "auto"
        Pipelining chunks per step (or slices, for pipelined) and parallel rings.
        "auto" searches the fastest count; chunks default to 1, or "auto" when
        ``algorithm="auto"``; channels default to 1, or the library's for "nccl" and
        "hccl".
    reduce_bandwidth : float, optional
        Bytes/s of local reductions on every GPU, overriding the topology's
        ``reduce_bandwidth`` attributes (absent means infinitely fast).
    root : int
        Root rank of a broadcast or reduce (ignored by the other operations).
    protocol : {None, "LL", "LL128", "Simple", "auto"}
        None for the ideal model; otherwise the calibrated protocol model
        (:mod:`simulator.library.protocol`).
    fraction : float or "auto", optional
        For ``multipath``: the share of the data on the intra-server links (the rest
        goes through the NICs); "auto" (the default) sizes it by simulating each path.
    nccl : NcclEnv or str, optional
        NCCL's environment settings, such as ``"NCCL_ALGO=Ring NCCL_PROTO=Simple"``
        (:mod:`simulator.library.nccl_env`), for ``algorithm="nccl"`` only.

    Examples
    --------
    >>> from simulator.topology import ring_graph
    >>> r = simulate_collective(ring_graph(4, 100e9, 1e-6), "all_gather", 4e6)
    >>> round(r.time_us, 6)  # (p-1)(a + n/(pB)) = 3 x (1 us + 10 us)
    33.0
    """
    if op not in COLLECTIVE_OPS:
        raise unknown_choice("operation", op, COLLECTIVE_OPS)
    graph = load_topology(topology, nodes, fabric=fabric, seed=seed)
    if algorithm in POLICIES:
        policy = library_policy(
            algorithm,
            graph,
            protocol=protocol,
            channels=channels,
            chunks=chunks,
            reduce_bandwidth=reduce_bandwidth,
            nccl=nccl,
        )
        return policy.simulate(graph, op, size_bytes, root=root)
    if nccl:
        raise CcsimError(nccl_not_applied(algorithm))
    if channels is None:
        channels = 1
    if chunks is None:  # 1, except that "auto" algorithms search the chunk count too
        chunks = "auto" if algorithm == "auto" else 1
    if "auto" in (algorithm, chunks, channels):
        tuner = AutoTuner(channels=channels, reduce_bandwidth=reduce_bandwidth, protocol=protocol)
        return tuner.simulate(graph, op, size_bytes, algorithm=algorithm, chunks=chunks, root=root)
    options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
    if algorithm == "multipath":
        options["fraction"] = (
            auto_fraction(
                graph, op, size_bytes, chunks=chunks, channels=channels, protocol=protocol
            )
            if fraction in (None, "auto")
            else float(fraction)
        )
    elif fraction is not None:
        raise CcsimError(f"fraction applies to the multipath algorithm only, not {algorithm!r}")
    return build_and_run(
        graph,
        algorithm,
        op,
        size_bytes,
        reduce_bandwidth=reduce_bandwidth,
        protocol=protocol,
        chunks=chunks,
        channels=channels,
        **options,
    )
