"""Identical micro-batches simulated once: a pipeline's steady state repeated.

Megatron's pipeline schedules (:mod:`simulator.workload.pipeline`) run every stage as
warm-up forwards, steady steps of one forward and one backward, and cool-down
backwards. With ``m`` micro-batches on ``p`` stages of ``v`` model chunks, the
schedule's pattern of (chunk, micro-batch) repeats every ``p v`` chunk-passes, that is
every ``q = p`` micro-batches (``q = 1`` in 1F1B, ``v = 1``), and the schedule of
``m + q`` micro-batches is that of ``m`` with one more period of steady steps in every
stage; the warm-up, the cool-down, the data-parallel calls at the step's two ends
(parameter gathers before the first micro-batch, gradient reductions after the last)
are those of ``m``.

So where the replay of ``m_s`` micro-batches is *periodic* in its steady state, every
op of steady step ``sigma + q v`` starting and ending exactly ``T`` after the same op
of step ``sigma``, the replay of ``m = m_s + n q`` micro-batches is that of ``m_s``
with ``n`` more periods of ``T`` each: the replay is deterministic and time-invariant,
so from a state that repeats shifted by ``T`` it goes on repeating. Its step is then
``step(m_s) + n T`` (:func:`run_steady`).

Checked, not assumed: a short step of ``m_s`` micro-batches is built and replayed with
two whole periods of steady steps on every stage and a margin (:func:`short_micro_batches`),
and every op of the first period's steps (each rank's: compute, tensor-parallel calls,
pipeline sends and receives) must start and end ``T`` before the same op of the second
period's, to :data:`PERIOD_TOLERANCE`, with none of the step's own ops running beside
them (:func:`steady_period`). Where one does not (the pipeline still filling, calls of
the step's ends reaching into the steady state, a host that launches ahead of the GPUs
by more each micro-batch, as MoE steps with the host's launches modelled do), or the
step has too few micro-batches to gain, the full step is built and replayed
(:attr:`SteadyStep.why` says why). The full replay stays the reference:
``tests/test_steady.py`` holds the two equal on small pipelines.

What is exact and what is rounded: the short step's replay is the same replay; the
step time adds ``n T`` to it, where the full replay adds the same durations to larger
clock values one op at a time, so the two agree to float rounding of the clock
(relative 1e-15 per op; :data:`STEP_TOLERANCE` bounds the whole step), not to the last
bit. Only the step's time and the short step's replay are returned: per-op records of
the full step are not made.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

# (Imported here, not in run_steady: the bench times run_steady alone, and the
# generators' import is seconds of CPU that is not the step's.)
from . import run_workload
from .engine import WorkloadRun
from .generators import megatron
from .metrics import Breakdown
from .trace import Workload

#: Largest difference (seconds, relative to the clock) between an op's shift from one
#: steady period to the next and the period itself for the step to count as periodic.
#: The replay's clock is a float sum over hundreds of thousands of ops; a shift that is
#: a real repeat differs from the period by a few ulps of the clock (1e-16 s per second
#: of clock), while a step that is not periodic differs by nanoseconds or more.
PERIOD_TOLERANCE = 1e-12

#: Relative difference the tests allow between the extrapolated step and the full
#: replay's (float rounding of the clock over the step's ops; see the module docstring).
STEP_TOLERANCE = 1e-12

# An op's pass in a Megatron step's op ids: "f3.17" (forward of chunk 3, micro-batch
# 17) with virtual stages, "b17" (backward of micro-batch 17) without, as a component
# of the dot-separated id (simulator.workload.generators, one_pass's ``tag``).
_TAG_CHUNKS = re.compile(r"(?:^|\.)([fb])(\d+)\.(\d+)(?=\.|$)")
_TAG_PLAIN = re.compile(r"(?:^|\.)([fb])(\d+)(?=\.|$)")


@dataclass
class SteadyStep:
    """A Megatron step's time from a shorter step's steady state (:func:`run_steady`).

    ``step_s`` is the step's time for ``micro_batches`` micro-batches a replica;
    ``run`` and ``breakdown`` are those of the step actually replayed, of ``simulated``
    micro-batches (``micro_batches`` itself when the full step was replayed, and then
    ``why`` says why); ``period_s`` is the time one period (:func:`period_micro_batches`) adds
    (None when the full step was replayed), and ``periods`` how many were added.
    """

    step_s: float
    micro_batches: int
    simulated: int
    period_s: float | None
    periods: int
    workload: Workload
    run: WorkloadRun
    breakdown: Breakdown
    why: str = ""


def period_micro_batches(pp: int, v: int) -> int:
    """Micro-batches in one period of the schedule's pattern: ``pp`` with virtual
    stages (the k-th forward's chunk goes round every ``pp v`` chunk-passes), one in
    1F1B (every steady step is alike).

    >>> period_micro_batches(8, 12), period_micro_batches(8, 1)
    (8, 1)
    """
    return 1 if v == 1 else pp


def short_micro_batches(micro: int, pp: int, v: int, extra_warmup: int = 0) -> int | None:
    """The fewest micro-batches ``m_s`` (``micro`` less a whole number of periods, see
    :func:`period_micro_batches`) whose step has two periods of steady steps on every
    stage (the first stage's warm-up is the longest) and a margin of half a period or
    ``pp`` steps, whichever is more: the two compared periods lie in the middle, away
    from the first steady steps, whose ops (and receives posted in the warm-up) still
    feel the pipeline filling, and from the last, beside which the first gradient
    reductions start. None when that is not fewer than ``micro``.

    >>> short_micro_batches(128, 8, 12)  # 2 x 7 + 11 x 8 = 102 warm-up forwards
    32
    >>> short_micro_batches(16, 4, 2), short_micro_batches(32, 4, 2)
    (None, 16)
    >>> short_micro_batches(32, 8, 1)  # 1F1B: 7 warm-up forwards, 2 + 8 steps more
    17
    """
    warmup = warmup_forwards(pp, v, extra_warmup)
    steps = period_micro_batches(pp, v) * v  # steady steps a period
    need = 2 * steps + max((steps + 1) // 2, pp) + warmup
    periods = (micro * v - need) // steps
    if periods < 1:
        return None
    return micro - periods * period_micro_batches(pp, v)


def warmup_forwards(pp: int, v: int, extra_warmup: int = 0) -> int:
    """The first stage's warm-up forwards, the most of any stage (see
    :mod:`simulator.workload.pipeline`).

    >>> warmup_forwards(8, 12), warmup_forwards(8, 1)
    (102, 7)
    """
    return (pp - 1 if v == 1 else 2 * (pp - 1) + (v - 1) * pp) + extra_warmup


def pass_of(op_id: str, v: int) -> tuple[str, int, int] | None:
    """The (pass, chunk, micro-batch) an op of a Megatron step belongs to, from its id;
    None for the step's own ops (data-parallel calls at its ends, the optimizer).

    >>> pass_of("r5.tp.f3.17.bucket0.reduce_scatter", 12), pass_of("r0.send.b11.2", 12)
    (('f', 3, 17), ('b', 11, 2))
    >>> pass_of("r0.b17", 1), pass_of("r0.dp.params.0.3", 12)
    (('b', 0, 17), None)
    """
    if v > 1:
        found = _TAG_CHUNKS.search(op_id)
        if found is None:
            return None
        return found.group(1), int(found.group(2)), int(found.group(3))
    found = _TAG_PLAIN.search(op_id)
    return None if found is None else (found.group(1), 0, int(found.group(2)))


def steady_period(
    workload: Workload, run: WorkloadRun, pp: int, v: int, offset: int
) -> tuple[float, str]:
    """The time one period (:func:`period_micro_batches`) takes in ``run``'s steady
    state, and ''; or NaN and why the replay is not periodic there (see the module
    docstring).

    Each rank's steady steps are numbered from its first: the steady step ``sigma`` runs
    forward ``k = sigma + w`` (``w`` the rank's warm-up forwards, counted from its ops)
    and backward ``sigma``; the k-th forward (backward) of a stage is chunk-pass
    ``(k mod p v) // p`` (reversed for backward) of micro-batch ``(k // p v) p + k mod
    p``. Every op of the ``P`` steps from ``offset`` (``P`` a period's) is compared with
    the same op ``P`` steps on; and none of the step's own ops (data-parallel calls at
    its ends, the optimizer) may run while they do.
    """
    steps = period_micro_batches(pp, v) * v
    ops = workload.ops
    # Per (rank, stream, pass, chunk, micro-batch): the ops in order.
    by_pass: dict[tuple, list[int]] = defaultdict(list)
    own: list[int] = []
    warmup: dict[int, int] = {}
    forwards: dict[int, set] = defaultdict(set)
    for op in ops:
        found = pass_of(op.id, v)
        if found is None:
            own.append(op.index)
            continue
        kind, chunk, micro = found
        rank = op.rank
        # Warm-up forwards counted by their compute (a receive may be posted early).
        if op.kind == "compute":
            if kind == "b":
                warmup.setdefault(rank, len(forwards[rank]))
            elif rank not in warmup:
                forwards[rank].add((chunk, micro))
        by_pass[(rank, op.stream, kind, chunk, micro)].append(op.index)
    if not warmup:
        return float("nan"), "the step has no backward passes named as Megatron's"

    def index(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k % (pp * v)) // pp
        if kind == "b":
            chunk = v - 1 - chunk
        return kind, chunk, (k // (pp * v)) * pp + k % pp

    first: list[int] = []
    second: list[int] = []
    streams: dict[int, set] = defaultdict(set)
    for rank, stream, *_ in by_pass:
        streams[rank].add(stream)
    for rank, w in warmup.items():
        for sigma in range(offset, offset + steps):
            for kind, k in (("f", sigma + w), ("b", sigma)):
                a, b = index(kind, k), index(kind, k + steps)
                # Sorted: a set of names iterates in an order that depends on the
                # process's hash seed, and the period is read off the first op compared.
                for stream in sorted(streams[rank]):
                    these = by_pass.get((rank, stream, *a), [])
                    those = by_pass.get((rank, stream, *b), [])
                    if len(these) != len(those):
                        return float("nan"), (
                            f"rank {rank}'s {kind} passes {a[1:]} and {b[1:]} have different ops"
                        )
                    first += these
                    second += those
    if not first:
        return float("nan"), "no steady steps to compare"
    records = run.records
    first_ids, second_ids = np.asarray(first), np.asarray(second)
    for i, j in zip(first_ids.tolist(), second_ids.tolist(), strict=True):
        a, b = ops[i], ops[j]
        if (a.kind, a.op, a.group, a.nbytes, a.flops, a.stream) != (
            b.kind,
            b.op,
            b.group,
            b.nbytes,
            b.flops,
            b.stream,
        ):
            return float("nan"), f"ops {a.id} and {b.id} differ"
    starts = records.start_s[second_ids] - records.start_s[first_ids]
    ends = records.end_s[second_ids] - records.end_s[first_ids]
    shifts = np.concatenate([starts, ends])
    if not np.isfinite(shifts).all():
        return float("nan"), "some steady op never ran"
    period_s = float(shifts[0])
    clock = float(np.nanmax(records.end_s[second_ids]))
    spread = float(np.abs(shifts - period_s).max())
    if spread > PERIOD_TOLERANCE * max(1.0, clock):
        return float("nan"), (
            f"the steady state is not periodic: ops repeat {spread:.3g} s apart from "
            f"the period of {period_s:.9g} s"
        )
    # The compared periods' span: a step's own op running in it would be in one
    # period and not in those added.
    low = float(np.nanmin(records.start_s[first_ids]))
    own_ids = np.asarray(own, dtype=np.int64)
    beside = (records.end_s[own_ids] > low) & (records.start_s[own_ids] < clock)
    if beside.any():
        name = ops[int(own_ids[np.flatnonzero(beside)[0]])].id
        return float("nan"), f"{name} runs beside the compared steady steps"
    return period_s, ""


def run_steady(
    options: dict[str, Any],
    topology: str | Path | nx.Graph,
    *,
    nodes: int | None = None,
    shortcut: bool = True,
    **arguments: Any,
) -> SteadyStep:
    """The step of ``megatron(**options)`` on ``topology``, replaying a shorter step and
    adding its steady state's period for the micro-batches left out where that step is
    periodic (see the module docstring), else (and with ``shortcut`` False) replaying
    the full step. ``arguments`` go to :func:`~simulator.workload.run_workload`
    (``bundles``, ``nccl``, ...).
    """
    pp = int(options.get("pp", 8))
    v = int(options.get("virtual_stages", 1))
    dp = int(options.get("dp", 1))
    micro_batch = int(options.get("micro_batch", 1))
    global_batch = options.get("global_batch") or micro_batch * dp * 4 * pp
    micro = int(global_batch) // (micro_batch * dp)
    extra = 1 if options.get("moe_a2a_overlap") else 0
    short = short_micro_batches(micro, pp, v, extra) if pp > 1 else None
    why = "too few micro-batches for two steady periods and more"
    if not shortcut:
        why = "the full step asked for"
    elif short is not None and not options.get("fsdp"):
        workload = megatron(**{**options, "global_batch": short * micro_batch * dp})
        run, result = run_workload(workload, topology, nodes=nodes, **arguments)
        # The compared periods in the middle of the steady steps the short step has.
        steps = period_micro_batches(pp, v) * v
        steady = short * v - warmup_forwards(pp, v, extra)
        period_s, why = steady_period(run.workload, run, pp, v, (steady - 2 * steps) // 2)
        if why:
            why = f"{short} of {micro} micro-batches: {why}"
            del run, result  # (the full step's replay needs the memory)
        else:
            periods = (micro - short) // period_micro_batches(pp, v)
            return SteadyStep(
                step_s=result.step_s + periods * period_s,
                micro_batches=micro,
                simulated=short,
                period_s=period_s,
                periods=periods,
                workload=workload,
                run=run,
                breakdown=result,
            )
    elif short is not None:
        why = "FSDP gathers weights per micro-batch (not checked here)"
    workload = megatron(**options)
    run, result = run_workload(workload, topology, nodes=nodes, **arguments)
    return SteadyStep(
        step_s=result.step_s,
        micro_batches=micro,
        simulated=micro,
        period_s=None,
        periods=0,
        workload=workload,
        run=run,
        breakdown=result,
        why=why,
    )
