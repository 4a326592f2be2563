"""The steady-state check's index of a step's ops (simulator.workload.steady._Passes):
each offset's pair asked once and its ops compared as integer codes must give the
verdicts of the plain comparison, op by op, that it replaces."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from test_steady import BASE

from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.steady import _pass_tags, _Passes, latest_offset, pass_of

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


def _plain_index(workload, v: int) -> tuple[dict[int, int], list[int], dict]:
    """The index as steady.py read it op by op before it was made of arrays: each op's
    pass from its id (pass_of), warm-up forwards counted by their compute until each
    rank's first backward, the step's own ops, and the ops by (rank, stream, pass)."""
    warmup: dict[int, int] = {}
    forwards: dict[int, set] = {}
    own: list[int] = []
    by_pass: dict[tuple, list[int]] = {}
    for op in workload.ops:
        found = pass_of(op.id, v)
        if found is None:
            own.append(op.index)
            continue
        if op.kind == "compute":
            if found[0] == "b":
                warmup.setdefault(op.rank, len(forwards.get(op.rank, ())))
            elif op.rank not in warmup:
                forwards.setdefault(op.rank, set()).add(found[1:])
        by_pass.setdefault((op.rank, op.stream, *found), []).append(op.index)
    return warmup, own, by_pass


@pytest.mark.parametrize(
    "options",
    [
        OPTIONS,  # PP 4 x VP 2
        {**OPTIONS, "virtual_stages": 1, "global_batch": 32},  # 1F1B
        {**OPTIONS, "first_stage_layers": 12},  # uneven stages: 12, 28, 28, 28 layers
    ],
    ids=["interleaved", "1f1b", "uneven"],
)
def test_the_pairs_are_the_pass_by_pass_look_up_at_every_offset(options):
    # Issue 31: each rank's steady ops kept as one array in pair order, a pair two
    # slices a rank; the look-up pass by pass (rank, step, pass, stream) is the
    # reference, at every offset from before the first steady step to past the end.
    workload = megatron(**options)
    v = int(options.get("virtual_stages", 1))
    passes = _Passes(workload, 4, v)
    warmup, own, by_pass = _plain_index(workload, v)
    assert list(passes.warmup.items()) == list(warmup.items())  # (the ranks' order too)
    assert passes.own.tolist() == own
    assert passes._lookup()[0] == by_pass
    steps = 4 * v if v > 1 else 1
    micro = int(options["global_batch"]) // 2
    reasons = 0
    for offset in range(-1, micro * v + 2 * steps):
        fast, plain = passes.pair(offset), passes._pair_by_pass(offset)
        assert fast[2] == plain[2], offset
        assert fast[0].tolist() == plain[0].tolist() and fast[1].tolist() == plain[1].tolist()
        reasons += bool(plain[2])
    # Both kinds of answer met: pairs that compare, and passes that differ in number
    # (or are missing) near the step's end.
    assert 0 < reasons < micro * v + 2 * steps + 1


def test_pass_tags_read_at_once_are_pass_of_id_by_id():
    # One search over the ids joined by newlines must find the tag pass_of finds in
    # each id: the first at the id's start or after a dot, none inside a component.
    ids = [
        "r5.tp.f3.17.bucket0.reduce_scatter",
        "b1.15",
        "r0.xf3.17.b2.4",  # "xf3" is no tag; b2.4 is
        "r0.f3.17x.b2.4",  # "17x" is no micro-batch
        "r0.dp.params.0.3",
        "",
        "r0.send.b11.2",
        "r7.f12.300",
        "r1.b9",
    ]
    ops = [SimpleNamespace(id=op_id) for op_id in ids]
    for v in (1, 8):
        expected = [pass_of(op_id, v) for op_id in ids]
        for tags in (_pass_tags(ops, v), _pass_tags([*ops, SimpleNamespace(id="a\nb")], v)[:-1]):
            assert [_as_pass(tag, v) for tag in tags] == expected


def _as_pass(tag: tuple[str, ...], v: int) -> tuple[str, int, int] | None:
    """A tag's groups as pass_of answers."""
    if not tag[0]:
        return None
    return (tag[0], int(tag[1]), int(tag[2])) if v > 1 else (tag[0], 0, int(tag[1]))
