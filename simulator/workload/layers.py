"""Identical layers simulated once: an unpipelined FSDP step's middle layers repeated.

Megatron-FSDP runs a step without pipelining as every micro-batch's forward over the
layers, one FSDP unit (a transformer layer) after another, then its backward in reverse:
each unit's weights gathered ahead of it (:func:`~simulator.workload.memory.
fsdp_gathered_units`), its tensor-parallel calls, and in the backward its gradients
reduce-scattered. Every layer but the first (the embedding) and the last (the loss) is
the same work, and where a unit waits for another (the gather for the buffer of the unit
``fsdp_window`` before it) the distance is counted in units, not from the step's ends.
So the step of ``L`` layers is that of ``L_s < L`` layers with ``L - L_s`` more units in
the middle of every pass, and where the replay of ``L_s`` layers is *periodic* in the
middle of a pass, every op of ``w`` consecutive units starting and ending exactly ``T``
before the same op of the next ``w`` units, the replay of ``L`` layers is that of ``L_s``
with ``L - L_s`` more periods of ``T`` in that pass: the replay is deterministic and
time-invariant, so from a state that repeats shifted by ``T`` it goes on repeating
(the argument :mod:`simulator.workload.steady` makes for micro-batches). The step is
then ``step(L_s) + (L - L_s) sum(T_pass)``.

Checked, not assumed: every pass of the short step (forward and backward of each
micro-batch) is compared at a window of ``w`` units (the gathered units and one more),
with the units before and after it as margin; the compared ops must be the same ops
(kind, operation, group, bytes, FLOPs, stream), repeat to :data:`~simulator.workload.
steady.PERIOD_TOLERANCE`, and no other op of the step (another pass's, the optimizer,
the embedding's all-reduce) may run while they do. Where a pass is not periodic at its
middle, later windows up to its margin are tried; where none holds, the caller replays
the full step (:func:`~simulator.workload.steady.run_steady`).

What differs in the short step besides its layers is set back to the model's: the
optimizer step walks the full model's shard (``megatron(optimizer_layers=L)``) and the
memory estimate is the model's (:func:`~simulator.workload.generators.
megatron_step_memory`). Exact as the micro-batch shortcut is: the short step is the same
replay, and the step adds ``n T`` where the full replay adds the same durations to larger
clock values (float rounding of the clock, :data:`~simulator.workload.steady.
STEP_TOLERANCE`). ``tests/test_layers.py`` holds the two equal on small FSDP steps, and
every op of the short step before the inserted units bit-identical to the full step's.

Measured (CPU seconds of the step's build and replay, paired runs at load 8-12 on 2
cores): Megatron-Bridge 25.09's Llama 3.1 405B in Megatron-FSDP on 128 GB200 (126
layers, 13 replayed) 20.1-22.5 -> 9.8-11.8 s, 460 -> 365 MiB, the step
5.168914296249977 -> 5.168914296249955 s; most of what is left is its 64-rank,
62-channel all-gather timed alone once (7-8 s, the same whatever the layers). The six
Megatron-Bridge Llama 3 70B rows on 64 GB200 (80 layers, 13 replayed) 1.5-2.6 -> 1.1-1.2
s, each step within 2e-15 of the full replay's.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from typing import Any

import numpy as np

from .generators import _model
from .memory import fsdp_gathered_units
from .trace import Workload

#: Fewest layers of the short step (:func:`short_layers`), which is made only where the
#: model has at least twice as many. On the FSDP GB200 row (2 units gathered: double
#: buffer, windows of 3) 13 of 126 layers: its replay about a tenth of the full one's.
SHORT_LAYERS = 12

#: A unit's op: ``r3.f0.unit17``, ``r3.tp.b1.unit4.all_gather``, ``r3.fsdp.f0.unit2.gather``
#: (pass kind, micro-batch, unit).
_UNIT = re.compile(r"(?:^|\.)([fb])(\d+)\.unit(\d+)(?=\.|$)")


def layer_scope(options: dict[str, Any]) -> str:
    """'' where ``megatron(**options)``'s step is one this module can shorten (FSDP,
    no pipeline, a dense model whose layers are alike); else why not."""
    if not options.get("fsdp"):
        # Without FSDP a pass is not built layer by layer: a chunk's pass is one piece,
        # cut only by gradient buckets in its last backward and by the parameter
        # gathers' buckets in its first forward (megatron's one_pass), so its ops do not
        # grow with the layers and fewer layers would spare nothing.
        return "not an FSDP step (built per gradient bucket, not per layer)"
    if int(options.get("pp", 8)) != 1 or int(options.get("virtual_stages", 1)) != 1:
        return "pipelined"
    m = _model(options.get("model", "gpt3-175b"), "megatron", moe_ok=True)
    if m.is_moe:
        return "a mixture-of-experts model"
    if m.window or m.full_attention_every:
        return "layers of windowed and full attention"
    if m.layers < 2 * short_layers(options):
        return f"{m.layers} layers: too few to gain"
    return ""


def short_layers(options: dict[str, Any]) -> int:
    """Layers of the short step: the first and last units (embedding, loss), a margin of
    a window and one unit on each side (:func:`layer_periods`), and two windows to
    compare one unit apart, two placings of them: ``3 w + 4`` for windows of ``w``
    units (:func:`window_units`), at least :data:`SHORT_LAYERS`."""
    return max(SHORT_LAYERS, 3 * window_units(options) + 4)


def window_units(options: dict[str, Any]) -> int:
    """Units compared per window: the units gathered at once (the one running and those
    prefetched, :func:`~simulator.workload.memory.fsdp_gathered_units`) and one more, so
    that a window holds every unit a compared unit waits on or for."""
    m = _model(options.get("model", "gpt3-175b"), "megatron", moe_ok=True)
    gathered = fsdp_gathered_units(
        m.layer_params / int(options.get("tp", 8)),
        communication_unit=options.get("fsdp_communication_unit"),
        double_buffer=bool(options.get("fsdp_double_buffer", False)),
    )
    return gathered + 1


def short_options(options: dict[str, Any], layers: int) -> dict[str, Any]:
    """``options`` for the step of ``layers`` layers standing for the model's: the
    model's optimizer shard kept, host-offloaded layers capped at the layers there are
    (they set the memory only, which :func:`run_layers` takes from the full step)."""
    m = _model(options.get("model", "gpt3-175b"), "megatron", moe_ok=True)
    short = {**options, "model": dataclasses.replace(m, layers=layers)}
    short["optimizer_layers"] = m.layers
    if short.get("activation_offload_layers"):
        short["activation_offload_layers"] = min(int(short["activation_offload_layers"]), layers)
    return short


class LayerIndex:
    """A step's unit ops indexed once: per pass (kind, micro-batch), per unit, per
    (rank, stream), the op indexes in order; the other ops apart."""

    def __init__(self, workload: Workload):
        self.workload = workload
        units: dict[tuple[str, int], dict[int, dict[tuple[int, str], list[int]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list))
        )
        self.pass_of = np.full(len(workload.ops), -1, dtype=np.int64)
        self.unit_of = np.full(len(workload.ops), -1, dtype=np.int64)
        passes: dict[tuple[str, int], int] = {}
        tags: dict[str, tuple[str, int, int]] = {}
        search = _UNIT.search
        for op in workload.ops:
            found = search(op.id)
            if found is None:
                continue
            tag = found.group(0)
            parsed = tags.get(tag)
            if parsed is None:
                parsed = tags[tag] = (found.group(1), int(found.group(2)), int(found.group(3)))
            kind, micro, unit = parsed
            key = (kind, micro)
            units[key][unit][(op.rank, op.stream)].append(op.index)
            self.pass_of[op.index] = passes.setdefault(key, len(passes))
            self.unit_of[op.index] = unit
        self.units = units
        self.passes = passes

    def ops(self, key: tuple[str, int], first: int, count: int) -> tuple[list[int], str]:
        """The ops of units ``first`` to ``first + count - 1`` of pass ``key``, each
        unit's in (rank, stream) order, and ''; or why they cannot be matched with the
        next units' (a unit missing or holding other ranks or streams)."""
        units = self.units[key]
        out: list[int] = []
        shape = None
        for unit in range(first, first + count):
            ops = units.get(unit)
            if ops is None:
                return [], f"pass {key} has no unit {unit}"
            these = sorted(ops)
            counts = [len(ops[k]) for k in these]
            if shape is not None and shape != (these, counts):
                return [], f"pass {key}'s units {first} and {unit} differ in their ops"
            shape = (these, counts)
            for k in these:
                out += ops[k]
        return out, ""

    def period(
        self, run: Any, key: tuple[str, int], first: int, count: int, tolerance: float
    ) -> tuple[float, str]:
        """The time one unit takes in pass ``key`` of ``run`` where units ``first`` to
        ``first + count - 1`` repeat one unit on (see the module docstring), and ''; or
        NaN and why not."""
        a, why = self.ops(key, first, count)
        if not why:
            b, why = self.ops(key, first + 1, count)
        if why:
            return float("nan"), why
        ops = self.workload.ops
        for i, j in zip(a, b, strict=True):
            x, y = ops[i], ops[j]
            if (x.kind, x.op, x.group, x.nbytes, x.flops, x.stream) != (
                y.kind, y.op, y.group, y.nbytes, y.flops, y.stream,
            ):  # fmt: skip
                return float("nan"), f"ops {x.id} and {y.id} differ"
        first_ids, second_ids = np.asarray(a), np.asarray(b)
        records = run.records
        starts, ends = records.start_s, records.end_s
        shifts = np.concatenate(
            [starts[second_ids] - starts[first_ids], ends[second_ids] - ends[first_ids]]
        )
        if not np.isfinite(shifts).all():
            return float("nan"), "some compared op never ran"
        period_s = float(shifts[0])
        clock = float(np.max(ends[second_ids]))
        spread = float(np.abs(shifts - period_s).max())
        if spread > tolerance * max(1.0, clock):
            return float("nan"), (
                f"pass {key} is not periodic at units {first}-{first + count}: ops repeat "
                f"{spread:.3g} s apart from the period of {period_s:.9g} s"
            )
        # Nothing but the pass's own units may run beside them (as steady.py asks of
        # the step's own ops): another pass's op, the optimizer or the embedding's
        # all-reduce would be in one window and not in the units added. (A unit's
        # gather runs ahead, beside the units before it, which are the pass's.)
        low = float(np.min(starts[first_ids]))
        beside = (self.pass_of != self.passes[key]) & (ends > low) & (starts < clock)
        if beside.any():
            name = ops[int(np.flatnonzero(beside)[0])].id
            return float("nan"), f"{name} runs beside pass {key}'s units {first}-{first + count}"
        return period_s, ""


def layer_periods(
    workload: Workload, run: Any, window: int, tolerance: float
) -> tuple[dict[tuple[str, int], float], str]:
    """Each pass's period in ``run`` (the replay of the short step ``workload``): per
    pass, the first window of ``window`` units from its middle to its margin that
    repeats; and ''. Empty and why not where a pass has none."""
    index = LayerIndex(workload)
    if not index.passes:
        return {}, "the step has no units named as Megatron-FSDP's"
    periods: dict[tuple[str, int], float] = {}
    for key in sorted(index.passes):
        units = len(index.units[key])
        margin = window + 1
        middle = (units - window - 1) // 2
        why = ""
        for first in range(middle, units - window - margin):
            if first < margin:
                continue
            period_s, why = index.period(run, key, first, window, tolerance)
            if not why:
                periods[key] = period_s
                break
            if "not periodic" not in why:
                break
        else:
            why = why or f"pass {key}: {units} units leave no window between the margins"
        if key not in periods:
            return {}, why
    return periods, ""
