"""The steady-state check's index of a step's ops (simulator.workload.steady._Passes):
each offset's pair asked once and its ops compared as integer codes must give the
verdicts of the plain comparison, op by op, that it replaces."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_steady import BASE

from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.steady import _Passes, latest_offset

#: A TP 4 run as ``ccsim validate --training`` builds one (tests/test_steady.py's BASE),
#: PP 4 VP 2, 32 micro-batches a replica: 64 - 10 = 54 steady steps a stage.
OPTIONS = {**BASE, "pp": 4, "virtual_stages": 2, "dp": 2, "global_batch": 64}


@pytest.fixture(scope="module")
def run():
    replayed, _ = run_workload(megatron(**OPTIONS), "dgx-h100", nodes=4)
    return replayed


def _one_by_one(passes: _Passes, run, offset: int) -> tuple[float, str]:
    """The verdict as steady.py gave it before the index kept codes: the pair made
    afresh, its ops compared as tuples one by one, then the records."""
    first, second, why = passes.pair(offset)
    if why:
        return float("nan"), why
    ops = passes.workload.ops
    for i, j in zip(first, second, strict=True):
        a, b = ops[i], ops[j]
        if (a.kind, a.op, a.group, a.nbytes, a.flops, a.stream) != (
            b.kind, b.op, b.group, b.nbytes, b.flops, b.stream,
        ):  # fmt: skip
            return float("nan"), f"ops {a.id} and {b.id} differ"
    # Same ops throughout: the records decide, as in period (asked with the pair).
    return passes.period(run, offset, (first, second, ""))


def _same(a: tuple[float, str], b: tuple[float, str]) -> bool:
    return a[1] == b[1] and (repr(a[0]) == repr(b[0]))


def test_every_offset_judged_as_op_by_op_and_again_the_same(run):
    passes, fresh = _Passes(run.workload, 4, 2), _Passes(run.workload, 4, 2)
    offsets = range(latest_offset(32, 4, 2) + 1)
    first = [passes.period(run, offset) for offset in offsets]
    # Asked again (the watch, then later_period): what was kept of the first time.
    again = [passes.period(run, offset) for offset in offsets]
    reference = [_one_by_one(fresh, run, offset) for offset in offsets]
    assert all(_same(a, b) for a, b in zip(first, reference, strict=True))
    assert all(_same(a, b) for a, b in zip(again, reference, strict=True))
    # Both verdicts met: the pipeline still filling at 0, periodic at 19.
    assert "not periodic" in first[0][1] and first[19][1] == ""


def test_ops_that_differ_are_named_first_in_the_pairs_order(run):
    # Rank 0's steady step 27 runs backward 27: chunk 1 - (27 mod 8) // 4 = 1 of
    # micro-batch (27 // 8) 4 + 27 mod 4 = 15; its match 8 steps (one period) earlier,
    # steady step 19, backward chunk 1 of micro-batch (19 // 8) 4 + 19 mod 4 = 11.
    ops = list(run.workload.ops)
    index = next(op.index for op in ops if op.id == "r0.b1.15")
    ops[index] = dataclasses.replace(ops[index], flops=ops[index].flops * 2 + 1)
    changed = dataclasses.replace(run.workload, ops=ops)
    passes = _Passes(changed, 4, 2)
    period, why = passes.period(run, 19)
    assert np.isnan(period) and why == "ops r0.b1.11 and r0.b1.15 differ"
    assert _same(passes.period(run, 19), _one_by_one(_Passes(changed, 4, 2), run, 19))
