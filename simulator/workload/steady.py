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
them (:func:`steady_period`). A steady state may repeat exactly only after a
transient: uneven stages (Megatron-Bridge's Llama 3.1 405B, the embedding and the loss
counted as layers) settle over a few periods, 136 steady steps of 64-step periods on
1,024 H100. So where the middle pair is not periodic, later pairs are compared too, up
to the end's half of the margin (:func:`later_period`): any pair that repeats will do,
since the steps before it are the same in the short step and the full one. Where none
does, one longer short step whose pairs can start two periods later still is replayed,
if it spares half the step or more (:data:`LONGER_AT_MOST`). Where that fails too, or
is not made, the full step is replayed with its periods compared as it runs, from the
last steady step seen (:class:`_Watch`): a pair that repeats while a short step holding
it has fewer passes than the full replay has left ends the replay, and that short step
is replayed and checked as the others (MLPerf's 405B on 512 H100: periodic only from
steady step ~456 of 2,234, seven periods of 64 in); where none does, the watched replay
is the full step's, the same events in the same order. Where the stages are uneven and
the shortest step is more than half the step, the watched full step is replayed first
(:data:`WATCH_FIRST_FROM`). A short step's replay is watched too: once every pair it
would compare has run and none repeats, it ends there, its end (cool-down, gradient
reductions) never replayed (40-60% of a refused attempt's CPU on the H100
405B rows). Where all that fails (the
pipeline still filling, calls of the step's ends reaching into the steady state, ranks
drifting apart by a little every period, a host that launches ahead of the GPUs by more
each micro-batch, as MoE steps with the host's launches modelled do), or the step has
too few micro-batches to gain, the full step is built and replayed
(:attr:`SteadyStep.why` says why). The full replay stays the reference:
``tests/test_steady.py`` and ``tests/test_steady_transient.py`` hold the two equal on
small pipelines.

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
import simpy

from ..network.flows import FlowNetwork
from ..topology import load_topology
from . import layers as layers_module
from .collection import collections_paused
from .engine import WorkloadReplay, WorkloadRun

# (Imported here, not in run_steady: the bench times run_steady alone, and the
# generators' import is seconds of CPU that is not the step's.)
from .generators import _model, megatron, megatron_step_memory
from .isolated import TimingStore
from .layers import layer_scope
from .metrics import Breakdown, breakdown
from .replicas import neither_stands_in
from .trace import Workload

#: Largest difference (seconds, relative to the clock) between an op's shift from one
#: steady period to the next and the period itself for the step to count as periodic.
#: The replay's clock is a float sum over hundreds of thousands of ops; a shift that is
#: a real repeat differs from the period by a few ulps of the clock (1e-16 s per second
#: of clock), while a step that is not periodic differs by nanoseconds or more.
PERIOD_TOLERANCE = 1e-12

#: The start of :func:`steady_period`'s reason where the shifts differ from the period
#: (the only failure :func:`later_period` looks past).
NOT_PERIODIC = "the steady state is not periodic"

#: Offsets :func:`later_period` tries per period of steady steps (every eighth of one:
#: a transient's end is found to within an eighth of a period, at a few tens of
#: milliseconds of CPU per offset on a 1,024-GPU step).
OFFSET_STRIDE = 8

#: The longest second short step :func:`run_steady` replays, as a fraction of the step's
#: micro-batches: a second attempt that fails adds its replay to the full step's, so it
#: is made only where it would spare at least half the step.
LONGER_AT_MOST = 0.5

#: Where the stages are uneven (:func:`uneven_stages`) and the shortest step is more than
#: this fraction of the step, the full step is replayed first, watched (:class:`_Watch`),
#: rather than the shortest: uneven stages settle only after several periods (7 on the
#: H100 405B rows, PP 8 x VP 8, fp8), so the shortest step is mostly refused and its
#: replay thrown away, and where it is more than half the step, what it spares when it
#: holds is less than what it costs when refused. (At half, as on the 64-micro-batch
#: rows, it is tried: DGX Cloud's bf16 405B on 512 H100 holds at its middle and takes
#: 7.6 s of CPU so, 15.6 s watched first; its fp8 twin, refused, 20.3 s and 13.3 s.)
WATCH_FIRST_FROM = 0.5

#: Relative difference the tests allow between the extrapolated step and the full
#: replay's (float rounding of the clock over the step's ops; see the module docstring).
STEP_TOLERANCE = 1e-12

# An op's pass in a Megatron step's op ids: "f3.17" (forward of chunk 3, micro-batch
# 17) with virtual stages, "b17" (backward of micro-batch 17) without, as a component
# of the dot-separated id (simulator.workload.generators, one_pass's ``tag``).
_TAG_CHUNKS = re.compile(r"(?:^|\.)([fb])(\d+)\.(\d+)(?=\.|$)")
_TAG_PLAIN = re.compile(r"(?:^|\.)([fb])(\d+)(?=\.|$)")
# The same tags read off every id at once, one line an id (:func:`_pass_tags`): the
# fewest dot-separated components before a tag (the tag the patterns above find first:
# at the id's start or after a dot), or the whole line where none is.
_LINES_CHUNKS = re.compile(r"^(?:(?:[^.\n]*\.)*?([fb])(\d+)\.(\d+)(?=\.|$))?[^\n]*$", re.M)
_LINES_PLAIN = re.compile(r"^(?:(?:[^.\n]*\.)*?([fb])(\d+)(?=\.|$))?[^\n]*$", re.M)


def _pass_tags(ops: list, v: int) -> list[tuple[str, ...]]:
    """Each op's pass tag as :func:`pass_of` finds it in its id, as the regular
    expression's groups (kind, chunk and micro-batch with virtual stages, kind and
    micro-batch without; empty strings where the id has none). One search over the ids
    joined by newlines, where no id holds one; else one search an id.

    >>> from types import SimpleNamespace as Op
    >>> _pass_tags([Op(id="r5.tp.f3.17.bucket0"), Op(id="r0.dp.params.0.3")], 8)
    [('f', '3', '17'), ('', '', '')]
    """
    ids = [op.id for op in ops]
    joined = "\n".join(ids)
    if joined.count("\n") == max(len(ids) - 1, 0):
        found = (_LINES_CHUNKS if v > 1 else _LINES_PLAIN).findall(joined)
        if len(found) == len(ids):
            return found
    search = (_TAG_CHUNKS if v > 1 else _TAG_PLAIN).search
    empty = ("", "", "") if v > 1 else ("", "")
    tags = []
    for op_id in ids:
        hit = search(op_id)
        tags.append(empty if hit is None else hit.groups())
    return tags


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
    tried: tuple[str, ...] = ()
    #: Layers of the step replayed where a step of fewer layers stood for the model's
    #: (:mod:`simulator.workload.layers`; ``workload``, ``run`` and ``breakdown`` are
    #: then that step's), with each pass's period per layer; None: the model's.
    layers: int | None = None
    layer_periods_s: tuple[float, ...] = ()


def period_micro_batches(pp: int, v: int) -> int:
    """Micro-batches in one period of the schedule's pattern: ``pp`` with virtual
    stages (the k-th forward's chunk goes round every ``pp v`` chunk-passes), one in
    1F1B (every steady step is alike).

    >>> period_micro_batches(8, 12), period_micro_batches(8, 1)
    (8, 1)
    """
    return 1 if v == 1 else pp


def short_micro_batches(
    micro: int, pp: int, v: int, extra_warmup: int = 0, reach: int = 0
) -> int | None:
    """The fewest micro-batches ``m_s`` (``micro`` less a whole number of periods, see
    :func:`period_micro_batches`) whose step has two periods of steady steps on every
    stage (the first stage's warm-up is the longest) and a margin of half a period or
    ``pp`` steps, whichever is more: the two compared periods lie in the middle, away
    from the first steady steps, whose ops (and receives posted in the warm-up) still
    feel the pipeline filling, and from the last, beside which the first gradient
    reductions start. With ``reach``, the compared periods can also start as late as
    steady step ``reach`` and keep the end's half of the margin
    (:func:`latest_offset`). None when that is not fewer than ``micro``.

    >>> short_micro_batches(128, 8, 12)  # 2 x 7 + 11 x 8 = 102 warm-up forwards
    32
    >>> short_micro_batches(16, 4, 2), short_micro_batches(32, 4, 2)
    (None, 16)
    >>> short_micro_batches(32, 8, 1)  # 1F1B: 7 warm-up forwards, 2 + 8 steps more
    17
    >>> short_micro_batches(192, 8, 8, reach=106)  # 70 + 2 x 64 + 106 + 16 = 320 passes
    40
    """
    warmup = warmup_forwards(pp, v, extra_warmup)
    steps = period_micro_batches(pp, v) * v  # steady steps a period
    margin = _margin(pp, v)
    need = 2 * steps + max(margin, reach + margin - margin // 2) + warmup
    periods = (micro * v - need) // steps
    if periods < 1:
        return None
    return micro - periods * period_micro_batches(pp, v)


def _margin(pp: int, v: int) -> int:
    """Steady steps kept clear of the two compared periods, the first half before them
    and the rest after (see :func:`short_micro_batches`)."""
    return max((period_micro_batches(pp, v) * v + 1) // 2, pp)


def middle_offset(micro: int, pp: int, v: int, extra_warmup: int = 0) -> int:
    """The first of the two compared periods' steady steps in the middle of a step of
    ``micro`` micro-batches: as many steady steps before them as after.

    >>> middle_offset(32, 8, 8)  # 256 - 70 = 186 steady steps: 29 + 2 x 64 + 29
    29
    """
    steps = period_micro_batches(pp, v) * v
    return (micro * v - warmup_forwards(pp, v, extra_warmup) - 2 * steps) // 2


def latest_offset(micro: int, pp: int, v: int, extra_warmup: int = 0) -> int:
    """The latest first steady step of the two compared periods in a step of ``micro``
    micro-batches that keeps the end's half of the margin after them.

    >>> latest_offset(32, 8, 8), latest_offset(48, 8, 8)  # 186 - 128 - 16, 314 - 144
    (42, 170)
    """
    steps = period_micro_batches(pp, v) * v
    margin = _margin(pp, v)
    steady = micro * v - warmup_forwards(pp, v, extra_warmup)
    return steady - 2 * steps - (margin - margin // 2)


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


class _Passes:
    """A Megatron step's ops indexed once by (rank, stream, pass, chunk, micro-batch),
    for :meth:`period` to compare the steady steps at many offsets of one replay.

    Each rank's ops of its steady steps are kept as one array in the order
    :meth:`pair` lists them (steady step, forward then backward, stream by name, op by
    op), so that a pair is two slices a rank, where it was a dictionary look-up per
    rank, step, pass and stream (issue 31: 76 pairs and four indexes of 35,000-316,000
    ops on MLPerf's 405B on 512 H100). :meth:`_pair_by_pass` is that look-up, the
    reference (``tests/test_steady_index.py`` holds the two equal at every offset)."""

    def __init__(self, workload: Workload, pp: int, v: int):
        self.workload, self.pp, self.v = workload, pp, v
        ops = workload.ops
        n = len(ops)
        # Each op's pass tag (".f3.17"), read off its id as pass_of reads it, as a code
        # into ``parsed`` (the same few hundred tags for 10^5 ops); None: the step's own.
        table: dict[tuple[str, ...], int] = {}
        codes = np.fromiter(
            (table.setdefault(tag, len(table)) for tag in _pass_tags(ops, v)), np.int64, n
        )
        parsed: list[tuple[str, int, int] | None] = [None] * len(table)
        for tag, code in table.items():
            if tag[0]:
                parsed[code] = (
                    (tag[0], int(tag[1]), int(tag[2])) if v > 1 else (tag[0], 0, int(tag[1]))
                )
        self._parsed, self._tag_code = parsed, codes
        known = np.array([p is not None for p in parsed] + [False], dtype=bool)
        backward = np.array([p is not None and p[0] == "b" for p in parsed] + [False])
        chunk_of = np.array([0 if p is None else p[1] for p in parsed] + [0], dtype=np.int64)
        micro_of = np.array([0 if p is None else p[2] for p in parsed] + [0], dtype=np.int64)
        tagged, is_b = known[codes], backward[codes]
        chunk, micro = chunk_of[codes], micro_of[codes]
        self.own = np.flatnonzero(~tagged).astype(np.int64)
        rank = np.fromiter((op.rank for op in ops), np.int64, n)
        compute = np.fromiter((op.kind == "compute" for op in ops), bool, n)
        ranks = int(rank.max()) + 1 if n else 0
        # Warm-up forwards counted by their compute (a receive may be posted early):
        # the distinct forward passes a rank computes before its first backward one;
        # the ranks in the order of their first backward compute.
        backwards = np.flatnonzero(tagged & compute & is_b)
        b_ranks, at = np.unique(rank[backwards], return_index=True)
        order = np.argsort(backwards[at], kind="stable")
        b_ranks, starts = b_ranks[order], backwards[at][order]
        until = np.full(ranks, -1, dtype=np.int64)
        until[b_ranks] = starts
        forwards = np.flatnonzero(tagged & compute & ~is_b & (np.arange(n) < until[rank]))
        counted: dict[int, int] = defaultdict(int)
        for r, _, _ in set(
            zip(
                rank[forwards].tolist(),
                chunk[forwards].tolist(),
                micro[forwards].tolist(),
                strict=True,
            )
        ):
            counted[r] += 1
        self.warmup: dict[int, int] = {r: counted[r] for r in b_ranks.tolist()}
        # Streams by name: a set of names iterates in an order that depends on the
        # process's hash seed, and the period is read off the first op compared.
        names = sorted({op.stream for op in ops})
        number = {name: i for i, name in enumerate(names)}
        self._stream = np.fromiter((number[op.stream] for op in ops), np.int64, n)
        self._streams_count = len(names)
        self._backward = is_b
        # Each op's steady step on its rank: the k-th forward (backward) pass, as
        # _index numbers them, runs in steady step k - w (k), w the rank's warm-up
        # forwards; -1 for the rest (warm-up forwards, passes _index never names, ranks
        # without backward passes, the step's own ops).
        w = np.zeros(ranks, dtype=np.int64)
        place = np.full(ranks, -1, dtype=np.int64)
        w[b_ranks] = [self.warmup[r] for r in b_ranks.tolist()]
        place[b_ranks] = np.arange(len(b_ranks))
        span = pp * v
        k = (micro // pp) * span + np.where(is_b, v - 1 - chunk, chunk) * pp + micro % pp
        sigma = np.where(is_b, k, k - w[rank])
        valid = tagged & (chunk < v) & (place[rank] >= 0) & (sigma >= 0)
        self._sigma = sigma = np.where(valid, sigma, -1)
        # Per rank (warm-up order): its ops of steady steps in pair order (steady step,
        # forward then backward, stream by name, op by op), and each one's step.
        steady = np.flatnonzero(valid)
        steady = steady[
            np.lexsort(
                (steady, self._stream[steady], is_b[steady], sigma[steady], place[rank[steady]])
            )
        ]
        bounds = np.searchsorted(place[rank[steady]], np.arange(len(b_ranks) + 1))
        self._rows = [
            (steady[bounds[i] : bounds[i + 1]], sigma[steady[bounds[i] : bounds[i + 1]]])
            for i in range(len(b_ranks))
        ]
        self._by_pass: dict[tuple, list[int]] | None = None
        # What depends on the workload alone, judged once per offset however often the
        # pair is judged (a watch, then later_period, judge the same offsets): the
        # pair's ops as compact arrays and why they cannot be compared ('' if they can).
        self._judged: dict[int, tuple[np.ndarray, np.ndarray, str]] = {}
        # Each op's (kind, op, group, bytes, FLOPs, stream) as a small integer, made
        # for the ops compared only (-1: not yet).
        self._codes = np.full(len(workload.ops), -1, dtype=np.int32)
        self._code_of: dict[tuple, int] = {}

    def _index(self, kind: str, k: int) -> tuple[str, int, int]:
        pp, v = self.pp, self.v
        chunk = (k % (pp * v)) // pp
        if kind == "b":
            chunk = v - 1 - chunk
        return kind, chunk, (k // (pp * v)) * pp + k % pp

    def pair(self, offset: int) -> tuple[np.ndarray, np.ndarray, str]:
        """The ops of the period of steady steps from ``offset`` and of the next, in
        matching order, and ''; or why they cannot be compared (as
        :meth:`_pair_by_pass` gives them)."""
        if not self.warmup or offset < 0:
            return self._pair_by_pass(offset)
        steps = period_micro_batches(self.pp, self.v) * self.v
        firsts: list[np.ndarray] = []
        seconds: list[np.ndarray] = []
        for ops, sigma in self._rows:
            lo, middle, hi = np.searchsorted(sigma, [offset, offset + steps, offset + 2 * steps])
            firsts.append(ops[lo:middle])
            seconds.append(ops[middle:hi])
        first = np.concatenate(firsts)
        second = np.concatenate(seconds)
        # Each (rank, step, pass, stream) as many ops in both periods, else the
        # reference names the first that is not.
        streams = self._streams_count
        cells = len(self._rows) * steps * 2 * streams

        def cell(ids: np.ndarray, parts: list[np.ndarray], base: int) -> np.ndarray:
            place = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
            step = self._sigma[ids] - base
            key = ((place * steps + step) * 2 + self._backward[ids]) * streams + self._stream[ids]
            return np.bincount(key, minlength=cells)

        if not np.array_equal(cell(first, firsts, offset), cell(second, seconds, offset + steps)):
            return self._pair_by_pass(offset)
        if not len(first):
            return first, second, "no steady steps to compare"
        return first, second, ""

    def _pair_by_pass(self, offset: int) -> tuple[np.ndarray, np.ndarray, str]:
        """:meth:`pair` by looking up each (rank, stream, pass, chunk, micro-batch)
        of the two periods, rank by rank, step by step: the reference, and the reason
        where some pass's ops differ in number."""
        none = np.zeros(0, dtype=np.int64)
        if not self.warmup:
            return none, none, "the step has no backward passes named as Megatron's"
        by_pass, streams = self._lookup()
        steps = period_micro_batches(self.pp, self.v) * self.v
        first: list[int] = []
        second: list[int] = []
        for rank, w in self.warmup.items():
            for sigma in range(offset, offset + steps):
                for kind, k in (("f", sigma + w), ("b", sigma)):
                    a, b = self._index(kind, k), self._index(kind, k + steps)
                    for stream in streams[rank]:
                        these = by_pass.get((rank, stream, *a), [])
                        those = by_pass.get((rank, stream, *b), [])
                        if len(these) != len(those):
                            return (
                                none,
                                none,
                                (
                                    f"rank {rank}'s {kind} passes {a[1:]} and {b[1:]} have "
                                    "different ops"
                                ),
                            )
                        first += these
                        second += those
        if not first:
            return none, none, "no steady steps to compare"
        return np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64), ""

    def _lookup(self) -> tuple[dict[tuple, list[int]], dict[int, list[str]]]:
        """The ops by (rank, stream, pass, chunk, micro-batch), in order, and each
        rank's streams by name (made once, where :meth:`_pair_by_pass` is asked)."""
        if self._by_pass is None:
            by_pass: dict[tuple, list[int]] = defaultdict(list)
            ops, parsed = self.workload.ops, self._parsed
            for i, code in enumerate(self._tag_code.tolist()):
                found = parsed[code]
                if found is not None:
                    op = ops[i]
                    by_pass[(op.rank, op.stream, *found)].append(i)
            self._by_pass = by_pass
            named: dict[int, set] = defaultdict(set)
            for rank, stream, *_ in by_pass:
                named[rank].add(stream)
            self._streams = {rank: sorted(names) for rank, names in named.items()}
        return self._by_pass, self._streams

    def period(
        self,
        run: WorkloadRun | WorkloadReplay,
        offset: int,
        pair: tuple[list[int], list[int], str] | None = None,
    ) -> tuple[float, str]:
        """:func:`steady_period` of ``run`` (a replay of this index's workload, or one
        under way: ops not yet run are NaN) at ``offset`` (``pair``: :meth:`pair`'s
        answer for it, if already asked)."""
        first_ids, second_ids, why = self._static(offset, pair)
        if why:
            return float("nan"), why
        ops = self.workload.ops
        records = run.records
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
                f"{NOT_PERIODIC}: ops repeat {spread:.3g} s apart from "
                f"the period of {period_s:.9g} s"
            )
        # The compared periods' span: a step's own op running in it would be in one
        # period and not in those added.
        low = float(np.nanmin(records.start_s[first_ids]))
        own = self.own
        beside = (records.end_s[own] > low) & (records.start_s[own] < clock)
        if beside.any():
            name = ops[int(own[np.flatnonzero(beside)[0]])].id
            return float("nan"), f"{name} runs beside the compared steady steps"
        return period_s, ""

    def _static(
        self, offset: int, pair: tuple[list[int], list[int], str] | None = None
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """The pair at ``offset`` (``pair``: :meth:`pair`'s answer for it, if asked
        already) as arrays, and '' where each op of the first period is the same op
        (kind, operation, group, bytes, FLOPs, stream) as its match in the second;
        else why not (:meth:`pair`'s reason, or the first ops that differ). Once an
        offset: it depends on the workload alone."""
        found = self._judged.get(offset)
        if found is not None:
            return found
        first, second, why = self.pair(offset) if pair is None else pair
        first_ids = np.asarray(first, dtype=np.int32)
        second_ids = np.asarray(second, dtype=np.int32)
        if not why:
            codes = self._codes
            both = np.concatenate([first_ids, second_ids])
            new = np.unique(both[codes[both] < 0])
            if len(new):
                ops, code_of = self.workload.ops, self._code_of
                made = []
                for i in new.tolist():
                    a = ops[i]
                    key = (a.kind, a.op, a.group, a.nbytes, a.flops, a.stream)
                    made.append(code_of.setdefault(key, len(code_of)))
                codes[new] = made
            differ = np.flatnonzero(codes[first_ids] != codes[second_ids])
            if len(differ):
                ops = self.workload.ops
                a, b = ops[int(first_ids[differ[0]])], ops[int(second_ids[differ[0]])]
                why = f"ops {a.id} and {b.id} differ"
        found = self._judged[offset] = (first_ids, second_ids, why)
        return found


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
    return _Passes(workload, pp, v).period(run, offset)


def later_period(
    workload: Workload,
    run: WorkloadRun,
    pp: int,
    v: int,
    first: int,
    last: int,
    passes: _Passes | None = None,
) -> tuple[float, int, str]:
    """The period of ``run``'s steady state (:func:`steady_period`) at the first offset
    from ``first`` to ``last`` (every :data:`OFFSET_STRIDE`-th of a period, and
    ``last``) where it is periodic, and that offset, and ''; or NaN, ``first`` and why
    not at ``first``. Offsets are tried past ``first`` only while the replay is
    :data:`NOT_PERIODIC` (a transient dying out); ops that differ or a step's own ops
    beside the compared steps end the search. ``passes``: ``workload``'s index if made
    already (a watch's, :class:`_Watch`).
    """
    if passes is None or passes.workload is not workload or (passes.pp, passes.v) != (pp, v):
        passes = _Passes(workload, pp, v)
    period_s, why = passes.period(run, first)
    if not why or not why.startswith(NOT_PERIODIC):
        return period_s, first, why
    stride = max(1, period_micro_batches(pp, v) * v // OFFSET_STRIDE)
    later = list(range(first + stride, last, stride))
    for offset in [*later, *([last] if last > first else [])]:
        period_s, also = passes.period(run, offset)
        if not also:
            return period_s, offset, ""
        if not also.startswith(NOT_PERIODIC):
            break
    return float("nan"), first, _refusal(why, first, last)


def _refusal(why: str, first: int, last: int) -> str:
    """:func:`later_period`'s reason where no pair from ``first`` to ``last`` repeats:
    the first pair's (``why``), naming the steps tried past it."""
    reach = f" (nor later, up to steady step {last})" if last > first else ""
    return why + reach


def uneven_stages(options: dict[str, Any]) -> bool:
    """Whether ``megatron(**options)``'s pipeline stages hold different layers (whole
    stages set apart, or the embedding and the loss counted as layers): stages whose
    work differs run at different paces until the lighter wait on the others, a
    transient of several periods (see :data:`WATCH_FIRST_FROM`).

    >>> uneven_stages({"account_for_loss_in_pipeline_split": True}), uneven_stages({})
    (True, False)
    """
    keys = (
        "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split",
        "first_stage_layers",
        "last_stage_layers",
    )
    return any(options.get(key) for key in keys)


class _Found(Exception):
    """Raised by :class:`_Watch` to end a full step's replay: the pair of periods from
    steady step ``offset`` repeats, and a short step holding it spares replay."""

    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


class _Refused(Exception):
    """Raised by :class:`_Watch` to end a short step's replay: no pair of its periods
    repeats (its reason in ``refused``)."""


class _Watch:
    """Progress callback of a replay that compares its steady periods while it runs
    (:meth:`_Passes.period` on the ops run so far: an op's record is final once it has
    ended, so each pair is judged as on the finished replay), from steady step
    ``first`` on, every :data:`OFFSET_STRIDE`-th of a period.

    Of a full step (``until`` None): raises :class:`_Found` at the first pair that
    repeats, while the short step holding that pair (:func:`short_micro_batches` with
    ``reach``) has fewer passes than the full step has left to replay; past that, or at
    ops that differ or a step's own ops beside, it stops watching and the full replay
    runs on, unchanged (the same events in the same order:
    :func:`~simulator.network.flows.run_env`). The pair found is a hint, not the
    result: the short step is replayed and checked as any other (:func:`later_period`).

    Of a short step (``until`` its :func:`latest_offset`): raises :class:`_Refused` once
    every pair :func:`later_period` would compare, ``first`` to ``until``, is
    :data:`NOT_PERIODIC` (its reason in ``refused``, as :func:`later_period` gives it),
    sparing the replay of the step's end; at anything else it stops watching and the
    replay runs on, to be judged when done."""

    def __init__(
        self, pp: int, v: int, micro: int, extra: int, first: int, until: int | None = None
    ):
        self.pp, self.v, self.micro, self.extra = pp, v, micro, extra
        self.first = self.offset = first
        self.until = until
        self.refused = ""
        self.why_first = ""
        self.steps = period_micro_batches(pp, v) * v
        self.stride = max(1, self.steps // OFFSET_STRIDE)
        self.warmup = warmup_forwards(pp, v, extra)
        self.replay: WorkloadReplay | None = None
        self.passes: _Passes | None = None
        # The compared pair's ops (:meth:`_Passes.pair`), and its second period's.
        self.pair: tuple[list[int], list[int], str] | None = None
        self.second: np.ndarray | None = None
        self.next_s = 0.0
        self.watching = True
        #: The last offset compared, and why the watch stopped ('' while it watches).
        self.last = -1
        self.stopped = ""

    def bind(self, replay: WorkloadReplay) -> None:
        """Watch ``replay`` (its workload indexed once)."""
        self.replay = replay
        self.passes = _Passes(replay.workload, self.pp, self.v)

    def again(self, why: str) -> None:
        """The replay starts over (:func:`~simulator.workload.engine._starting_over`),
        as another replay whose records are not the ones bound: stop watching."""
        self._stop(f"the replay started over ({why})")

    def _stop(self, why: str) -> None:
        self.watching, self.stopped = False, why

    def _short(self, why: str) -> None:
        """A short step's pair at ``offset`` judged ``why``: on to the next, or the
        replay ended where every pair up to ``until`` is refused."""
        assert self.until is not None  # (a short step's watch)
        if not why.startswith(NOT_PERIODIC):
            self._stop(why or f"steady step {self.offset} repeats")
            return
        if self.offset == self.first:
            self.why_first = why
        if self.offset >= self.until:
            self.refused = _refusal(self.why_first, self.first, self.until)
            raise _Refused
        self.offset = min(self.offset + self.stride, self.until)
        self.pair = self.second = None

    def __call__(self, now: float) -> None:
        if not self.watching or now < self.next_s:
            return
        # Records looked at as simulated time grows by 1/256 of itself: a few thousand
        # looks over a step, each a vector test, against hundreds of thousands of events.
        self.next_s = now * (1 + 1 / 256)
        assert self.replay is not None and self.passes is not None  # (bound first)
        if self.second is None and self.until is None:
            sized = short_micro_batches(self.micro, self.pp, self.v, self.extra, reach=self.offset)
            left = self.micro * self.v - (self.warmup + self.offset + 2 * self.steps)
            if sized is None or sized * self.v >= left:
                self._stop(f"a short step holding steady step {self.offset} spares nothing")
                return
        if self.second is None:
            self.pair = self.passes.pair(self.offset)
            if self.pair[2]:
                self._stop(self.pair[2])
                return
            self.second = np.asarray(self.pair[1], dtype=np.int64)
        if not np.isfinite(self.replay.records.end_s[self.second]).all():
            return
        _, why = self.passes.period(self.replay, self.offset, self.pair)
        self.last = self.offset
        if self.until is not None:
            self._short(why)
            return
        if not why:
            raise _Found(self.offset)
        if not why.startswith(NOT_PERIODIC):
            self._stop(why)
            return
        self.offset += self.stride
        self.pair = self.second = None


def _run(
    workload: Workload, graph: nx.Graph, arguments: dict[str, Any], watch: _Watch | None
) -> tuple[WorkloadRun, Breakdown] | None:
    """``run_workload(workload, graph, **arguments)`` on the validated ``graph``, under
    ``watch`` if given: None where the watch ended the replay (:class:`_Found`: the
    pair in ``watch.last``; :class:`_Refused`: why in ``watch.refused``)."""
    # Not through run_workload: run_steady validated the graph as it loaded it, and a
    # second validation is ~0.4 s of CPU on 16,384 GPUs (the result is the same).
    replay = WorkloadReplay(workload, graph, **arguments)
    if watch is not None:
        watch.bind(replay)
    try:
        run = replay.run(progress=watch)
    except (_Found, _Refused):
        return None
    finally:
        replay.close()
    return run, breakdown(run)


def _replayed(
    options: dict[str, Any],
    graph: nx.Graph,
    arguments: dict[str, Any],
    watch: _Watch | None = None,
) -> tuple[Workload, WorkloadRun, Breakdown] | None:
    """Build ``megatron(**options)`` and replay it on ``graph`` (``arguments`` hold a
    :class:`TimingStore` of it); returns the workload built, the run and its breakdown,
    or None where ``watch`` (:class:`_Watch`) ended the replay.

    Where neither the TP masters nor one replica would stand in
    (:func:`~simulator.workload.replicas.neither_stands_in`, asked on the masters'
    build), every rank is built at once: the replay would otherwise build every TP rank
    of one replica, find the replicas refused, and build every rank, the same workload
    replayed the same way (issue 31: 4.6 s of CPU spared on DGX Cloud's 405B on 128
    GB200). The run then says why, as the replay would have."""
    workload = megatron(**options)
    refused = None
    if workload.shadows is not None and workload.replicas is not None:
        store = arguments["timings"]
        network = FlowNetwork(simpy.Environment(), graph, tables=store.tables())
        refused = neither_stands_in(workload, network, store.derived)
    if refused is None:
        done = _run(workload, graph, arguments, watch)
        return None if done is None else (workload, *done)
    shadows, replicas = workload.shadows, workload.replicas
    assert shadows is not None and replicas is not None  # (neither_stands_in's premise)
    every = megatron(**{**options, "replicas": False, "shadows": False})
    done = _run(every, graph, arguments, watch)
    if done is None:
        return None
    run, result = done
    run.shadows = {"count": shadows.count, "simulated": "all", "why": refused[0]}
    dp = replicas.count * replicas.unit
    run.replicas = {"count": dp, "simulated": "all", "why": refused[1]}
    return every, run, result


def _attempt(
    options: dict[str, Any],
    graph: nx.Graph,
    arguments: dict[str, Any],
    micro: int,
    short: int,
    pp: int,
    v: int,
    extra: int,
    tried: list[str],
) -> SteadyStep | tuple[str, int]:
    """Replay the short step of ``short`` of ``micro`` micro-batches and compare its
    steady periods (:func:`later_period`): the step extrapolated where a pair repeats,
    else why not and the latest steady step compared (``tried`` gets the attempt)."""
    middle, latest = middle_offset(short, pp, v, extra), latest_offset(short, pp, v, extra)
    # Watched: where every pair is refused, the replay ends past the last one.
    watch = _Watch(pp, v, micro, extra, middle, until=latest)
    options = {**options, "global_batch": short * _replica_batch(options)}
    replayed = _replayed(options, graph, arguments, watch)
    if replayed is None:
        tried.append(f"{short} of {micro} micro-batches: {watch.refused}")
        return watch.refused, latest
    workload, run, result = replayed
    # The watch's index of the step's ops, where the run is of the workload it indexed
    # (later_period checks; a replay that started over built another).
    period_s, _, why = later_period(run.workload, run, pp, v, middle, latest, watch.passes)
    if not why:
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
            tried=tuple(tried),
        )
    tried.append(f"{short} of {micro} micro-batches: {why}")
    return why, latest


def _every_micro_batch(micro: int, replayed: tuple, why: str, **fields: Any) -> SteadyStep:
    """A step whose every micro-batch was replayed (no period stood in), from
    ``_replayed``'s (workload, run, breakdown); ``fields`` override the step (the layer
    shortcut's step and periods)."""
    workload, run, result = replayed
    fields.setdefault("step_s", result.step_s)
    return SteadyStep(
        micro_batches=micro,
        simulated=micro,
        period_s=None,
        periods=0,
        workload=workload,
        run=run,
        breakdown=result,
        why=why,
        **fields,
    )


def _layer_step(
    options: dict[str, Any], graph: nx.Graph, arguments: dict[str, Any], micro: int, why: str
) -> SteadyStep | str:
    """The step of an unpipelined FSDP model from the replay of fewer of its layers
    (:func:`~simulator.workload.layers.short_layers`) where every pass of that is
    periodic in its middle units (:mod:`simulator.workload.layers`), else why not."""
    layers = int(_model(options.get("model", "gpt3-175b"), "megatron", moe_ok=True).layers)
    short = layers_module.short_layers(options)
    replayed = _replayed(layers_module.short_options(options, short), graph, arguments)
    assert replayed is not None  # (unwatched)
    workload, run, result = replayed
    window = layers_module.window_units(options)
    # (run.workload: the ops replayed, every replica where one could not stand in)
    periods, refused = layers_module.layer_periods(run.workload, run, window, PERIOD_TOLERANCE)
    if refused:
        return f"{short} of {layers} layers replayed: {refused}"
    # The model's memory, not the short step's (its layers' weights and activations).
    workload.memory = megatron_step_memory(**options)
    added = sorted(periods.items())
    step_s = result.step_s + sum((layers - short) * period for _, period in added)
    return _every_micro_batch(
        micro,
        replayed,
        why,
        step_s=step_s,
        layers=short,
        layer_periods_s=tuple(period for _, period in added),
    )


def _replica_batch(options: dict[str, Any]) -> int:
    """Samples in one micro-batch of every replica: ``micro_batch x dp``.

    >>> _replica_batch({"micro_batch": 2, "dp": 4}), _replica_batch({})
    (8, 1)
    """
    return int(options.get("micro_batch", 1)) * int(options.get("dp", 1))


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

    The short step is compared in the middle of its steady steps, then, while it is not
    periodic there, at later steady steps up to the end's margin (a transient dying
    out: :func:`later_period`). Where none is periodic yet, one longer short step whose
    compared periods can start two periods later still is replayed, if it spares at
    least half the step (:data:`LONGER_AT_MOST`); then the full step, its periods
    compared as it runs from the last steady step seen (:class:`_Watch`): where a pair
    repeats while a short step holding it would spare replay, the full replay is ended
    and that short step replayed and checked, else the full replay is the step. Where
    the stages are uneven and the shortest step is more than half the step
    (:data:`WATCH_FIRST_FROM`), the watched full step is replayed first.
    """
    # Python's cyclic collector paused throughout (building the graph, the steps and
    # their replays): its collections here walk the hundreds of thousands of ops and
    # network tables that live on and find nothing to free (every replay is closed and
    # freed by reference counts), ~1 s of the ~9 s of CPU of Llama 3 405B's CP 16
    # step on 16,384 H100 (gc.callbacks; peak memory within 3%). Only time changes.
    with collections_paused():
        return _run_steady(options, topology, nodes, shortcut, arguments)


def _run_steady(
    options: dict[str, Any],
    topology: str | Path | nx.Graph,
    nodes: int | None,
    shortcut: bool,
    arguments: dict[str, Any],
) -> SteadyStep:
    """:func:`run_steady`'s step, its collector paused."""
    pp = int(options.get("pp", 8))
    v = int(options.get("virtual_stages", 1))
    dp = int(options.get("dp", 1))
    micro_batch = int(options.get("micro_batch", 1))
    global_batch = options.get("global_batch") or micro_batch * dp * 4 * pp
    micro = int(global_batch) // (micro_batch * dp)
    extra = 1 if options.get("moe_a2a_overlap") else 0
    short = short_micro_batches(micro, pp, v, extra) if pp > 1 else None
    why = "too few micro-batches for two steady periods and more"
    # One graph and one store of calls' timings alone for every replay of the step (the
    # results are the same; the later replays time no call twice).
    graph = load_topology(topology, nodes)
    if arguments.get("timings") is None or arguments["timings"].graph is not graph:
        arguments = {**arguments, "timings": TimingStore(graph)}
    if not shortcut:
        why = "the full step asked for"
    elif short is not None and not options.get("fsdp"):
        steps = period_micro_batches(pp, v) * v
        tried: list[str] = []
        # The first steady step a watched full replay compares (None: not watched).
        watch_from = None
        if uneven_stages(options) and short > micro * WATCH_FIRST_FROM:
            tried.append(
                f"uneven stages and the shortest step ({short} micro-batches) more than "
                f"{WATCH_FIRST_FROM:g} of the step: the full step replayed first"
            )
            watch_from, short = middle_offset(short, pp, v, extra), None
        while short is not None:
            attempt = _attempt(options, graph, arguments, micro, short, pp, v, extra, tried)
            if isinstance(attempt, SteadyStep):
                return attempt
            why, latest = attempt
            longer = None
            watch_from = latest + 1 if why.startswith(NOT_PERIODIC) else None
            if why.startswith(NOT_PERIODIC) and len(tried) == 1:
                # A transient outlasting the short step: give it two periods more.
                longer = short_micro_batches(micro, pp, v, extra, reach=latest + 2 * steps)
            short = longer if longer is not None and longer <= micro * LONGER_AT_MOST else None
        if watch_from is not None:
            # The full step, its steady periods compared as it runs: where a pair
            # repeats early enough, the short step holding it; else the full replay.
            watch = _Watch(pp, v, micro, extra, watch_from)
            replayed = _replayed(options, graph, arguments, watch)
            if replayed is None:
                tried.append(f"the full step watched: steady step {watch.last} repeats")
                sized = short_micro_batches(micro, pp, v, extra, reach=watch.last)
                assert sized is not None  # (the watch asked the same)
                attempt = _attempt(options, graph, arguments, micro, sized, pp, v, extra, tried)
                if isinstance(attempt, SteadyStep):
                    return attempt
            else:
                tried.append(
                    f"the full step watched from steady step {watch_from}: {watch.stopped}"
                )
                return _every_micro_batch(micro, replayed, "; ".join(tried))
        why = "; ".join(tried)
    elif short is not None:
        why = "FSDP gathers weights per micro-batch (not checked here)"
    if shortcut and not layer_scope(options):
        layered = _layer_step(options, graph, arguments, micro, why)
        if isinstance(layered, SteadyStep):
            return layered
        why = f"{why}; {layered}"
    replayed = _replayed(options, graph, arguments)
    assert replayed is not None  # (unwatched)
    return _every_micro_batch(micro, replayed, why)
