"""A workload's share of the resource guards (:mod:`simulator.collective.guards`): the
flows a replay creates and the ops a generator writes, estimated before either is built.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from ..collective.guards import MAX_CHUNKS, OP_FLOWS, Estimate, call_transfers, check_flows
from .generators import GENERATORS
from .trace import Workload

#: Generator parameters that multiply the ranks: an estimate runs the generator with them
#: at 1 and scales its ops per rank (exact, or above where fewer data-parallel ranks
#: would each run more micro-batches of a fixed global batch).
RANK_PARAMETERS = ("ranks", "tp", "dp")


def workload_estimate(workload: Workload, algorithm: str = "ring") -> Estimate:
    """Flows a replay of ``workload`` creates: every collective call's transfers (with
    ``algorithm`` where a call names none; "auto" counts the largest candidate the
    search may build), every send/recv, and its ops at :data:`OP_FLOWS` each.

    >>> from simulator.workload.generators import ddp
    >>> estimate = workload_estimate(ddp(ranks=8))
    >>> estimate.flows  # 1,160 ops x 5, and 48 all-reduces of 112 transfers
    11176
    """
    flows = len(workload.ops) * OP_FLOWS + len(workload.pairs)
    counted: dict[tuple[str, str, int], int] = {}
    largest = 0
    for members in workload.instances:
        first = workload.ops[members[0]]
        ranks = len(workload.groups[first.group].ranks)
        if ranks < 2 or first.nbytes == 0:
            continue  # finished at once, no transfers
        largest = max(largest, ranks)
        name = first.algorithm or algorithm
        key = (name, first.op, ranks)
        if key not in counted:
            counted[key] = call_transfers(name, first.op, ranks)
        chunks = first.chunks
        if name == "auto":  # the search's largest candidate, as for a collective
            chunks = MAX_CHUNKS
        flows += counted[key] * chunks * first.channels
    what = (
        f"workload {workload.name}: {len(workload.ops):,} ops, "
        f"{len(workload.instances):,} collective calls on up to {largest:,} ranks"
    )
    return Estimate(flows, what)


def generator_estimate(generator: str, options: Mapping[str, Any]) -> Estimate | None:
    """Ops that ``GENERATORS[generator](**options)`` would write, at :data:`OP_FLOWS`
    each: the same generator run with its rank counts (:data:`RANK_PARAMETERS`) at 1,
    scaled to the ranks asked for. None where the options are not plain positive
    counts (the generator then says what is wrong).

    >>> generator_estimate("ddp", {"ranks": 100_000_000}).what
    'ddp on 100,000,000 ranks: 14,500,000,000 ops'
    """
    function = GENERATORS[generator]
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if name in RANK_PARAMETERS
    }
    counts = {**defaults, **{k: v for k, v in options.items() if k in defaults}}
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in counts.values()):
        return None
    small = function(**{**options, **dict.fromkeys(counts, 1)})
    ranks = math.prod(counts.values()) * small.ranks  # the counts kept (pp) stay in small
    ops = math.ceil(len(small.ops) / small.ranks * ranks)
    return Estimate(ops * OP_FLOWS, f"{generator} on {ranks:,} ranks: {ops:,} ops")


def check_generator(
    generator: str, options: Mapping[str, Any], max_flows: int | None = None
) -> None:
    """Refuse (:class:`~simulator.collective.guards.ResourceError`) a generator run whose
    trace would pass the limit, before it is generated."""
    estimate = generator_estimate(generator, options)
    if estimate is not None:
        check_flows(estimate, max_flows)
