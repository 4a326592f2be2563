"""Which servers a workload's tensor-parallel groups span.

Megatron-LM orders ranks with tensor parallelism varying fastest (its
``RankGenerator`` order ``tp-cp-ep-dp-pp``), so that a TP group of up to a server's GPU
count sits inside one server's NVLink domain: TP's all-gathers and reduce-scatters (or
all-reduces) run several times in every layer, in the critical path, and are sized for
NVLink. A TP size that does not divide a server's GPU count leaves some groups split over
two servers, and one larger than it puts every group on several: their collectives then
cross the network. Nothing refuses that (the model still splits), so the commands that
place a workload on servers say it on one warning line (:func:`tp_warning`), naming the
option and the sizes that keep TP inside a server.

>>> from simulator.workload.generators import megatron
>>> w = megatron("llama3-8b", tp=4, pp=1, dp=4, global_batch=8)
>>> tp_spread(w, [rank // 8 for rank in range(w.ranks)])
Spread(groups=4, spanning=0, size=4, gpus_per_server=8)
>>> spread = tp_spread(w, [rank // 6 for rank in range(w.ranks)])
>>> spread.spanning  # ranks 4-7 on servers 0 and 1; 8-11 and 12-15 inside one
1
>>> print(tp_warning(spread))  # doctest: +ELLIPSIS
tp 4 does not divide the 6 GPUs of a server: 1 of the 4 TP groups spans two servers, ...
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import networkx as nx

from ..topology.graph import gpu_nodes
from .trace import Workload

#: GPUs of the common training server, for a trace written before it is placed on one
#: (``ccsim generate``): a DGX A100, DGX H100 or DGX B200 holds 8 GPUs on one NVSwitch
#: baseboard (NVIDIA DGX user guides), as the presets dgx-a100 and dgx-h100 model.
SERVER_GPUS = 8


@dataclass(frozen=True)
class Spread:
    """How a workload's TP groups sit on servers: ``groups`` of them, ``spanning`` of
    which have ranks on more than one server; ``size`` ranks in the largest group;
    ``gpus_per_server`` of the server of rank 0 (None when unknown)."""

    groups: int
    spanning: int
    size: int
    gpus_per_server: int | None


def server_of_ranks(graph: nx.Graph) -> list[Hashable]:
    """The server of every rank of ``graph`` (its GPUs in rank order).

    >>> from simulator.topology import load_topology
    >>> server_of_ranks(load_topology("dgx-a100", 2))[7:9]
    [0, 1]
    """
    return [graph.nodes[node].get("server") for node in gpu_nodes(graph)]


def tp_spread(workload: Workload, server_of: Sequence[Hashable]) -> Spread:
    """Where ``workload``'s groups of kind ``TP`` sit, given the server of every rank
    (:func:`server_of_ranks`, or ``rank // 8`` for 8-GPU servers)."""
    groups = [g for g in workload.groups.values() if g.kind == "TP"]
    spanning = sum(1 for g in groups if len({server_of[r] for r in g.ranks}) > 1)
    per_server = Counter(server_of)
    first = per_server.get(server_of[0]) if server_of else None
    return Spread(len(groups), spanning, max((len(g.ranks) for g in groups), default=0), first)


def megatron_spread(tp: int, ranks: int, gpus_per_server: int) -> Spread:
    """Where Megatron-LM's TP groups sit without building the workload: group ``k``
    holds ranks ``k*tp`` to ``k*tp + tp - 1`` (TP varies fastest), rank ``r`` sits on
    server ``r // gpus_per_server``.

    >>> megatron_spread(6, 24, 8)  # ranks 6-11 and 12-17 cross a server's edge
    Spread(groups=4, spanning=2, size=6, gpus_per_server=8)
    """
    spanning = sum(
        1
        for k in range(ranks // tp)
        if (k * tp) // gpus_per_server != (k * tp + tp - 1) // gpus_per_server
    )
    return Spread(ranks // tp, spanning, tp, gpus_per_server)


def tp_warning(spread: Spread, *, option: str = "tp") -> str | None:
    """One line saying that TP groups span servers, why it matters and which ``option``
    values keep them inside one; None when every group sits in one server.

    >>> print(tp_warning(Spread(groups=2, spanning=2, size=16, gpus_per_server=8)))
    ... # doctest: +NORMALIZE_WHITESPACE
    tp 16 is more than the 8 GPUs of a server: every TP group spans 2 servers, so its
    collectives (several a layer, in the critical path) cross the network instead of
    NVLink; keep tp to 1, 2, 4 or 8 and scale out with pipeline or data parallelism
    """
    if not spread.spanning:
        return None
    size, per_server = spread.size, spread.gpus_per_server
    cost = "collectives (several a layer, in the critical path) cross the network instead of NVLink"
    span, its = ("spans", "its") if spread.spanning == 1 else ("span", "their")
    if not per_server:
        return f"{spread.spanning} of the {spread.groups} TP groups {span} servers, so {its} {cost}"
    divisors = [d for d in range(1, per_server + 1) if per_server % d == 0]
    keep = ", ".join(map(str, divisors[:-1])) + f" or {divisors[-1]}" if divisors[1:] else "1"
    if size > per_server:
        servers = -(-size // per_server)
        return (
            f"{option} {size} is more than the {per_server} GPUs of a server: every TP group "
            f"spans {servers} servers, so its {cost}; keep {option} to {keep} and scale out "
            "with pipeline or data parallelism"
        )
    return (
        f"{option} {size} does not divide the {per_server} GPUs of a server: "
        f"{spread.spanning} of the {spread.groups} TP groups {span} two servers, so {its} "
        f"{cost}; pick {option} {keep}"
    )


__all__ = [
    "SERVER_GPUS",
    "Spread",
    "megatron_spread",
    "server_of_ranks",
    "tp_spread",
    "tp_warning",
]
