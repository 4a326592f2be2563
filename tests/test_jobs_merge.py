"""Merging jobs' ops into one workload (simulator.workload.jobs.merge_jobs), and the
pause of Python's garbage collection while run_jobs builds them (issue 34's speed)."""

from __future__ import annotations

import dataclasses
import gc
import sys
import weakref

import numpy as np

from simulator.workload import load_workload
from simulator.workload.jobs import _job_ops, collections_frozen, collections_paused, merge_jobs
from simulator.workload.kernels import Attention, Gemm
from simulator.workload.trace import Op


def send_step():
    """Two ranks: rank 0 computes, sends to rank 1, then both all-reduce over ``dp``."""
    ops = [
        {"id": "c0", "rank": 0, "kind": "compute", "duration": "1ms"},
        {"id": "s0", "rank": 0, "kind": "send", "peer": 1, "bytes": 1e6, "deps": ["c0"]},
        {"id": "r1", "rank": 1, "kind": "recv", "peer": 0, "bytes": 1e6},
        {"id": "a0", "rank": 0, "kind": "collective", "op": "all_reduce", "group": "dp",
         "bytes": 1e6, "deps": ["s0"]},
        {"id": "a1", "rank": 1, "kind": "collective", "op": "all_reduce", "group": "dp",
         "bytes": 1e6, "deps": ["r1"]},
    ]  # fmt: skip
    return load_workload(
        {
            "format": "ccsim-workload/1",
            "name": "step",
            "ranks": 2,
            "ops": ops,
            "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}},
        }
    )


def _fields(op: Op) -> dict:
    """Every field of ``op`` by name (ops are slotted: no ``vars``)."""
    return {f.name: getattr(op, f.name) for f in dataclasses.fields(op)}


def test_the_second_job_s_ops_move_by_its_offset_and_onto_its_gpus():
    """Job B (second, 5 ops after A's) on GPUs 6 and 3: its op k is merged op 5 + k, its
    ids and group are prefixed, its ranks and peers are its GPUs, its deps move by 5;
    job A's keep their indices; the jobs' own ops are left as they were."""
    step = send_step()
    before = [_fields(op) for op in step.ops]
    merged = merge_jobs([step, step], [np.array([0, 1]), np.array([6, 3])], ["A", "B"], 8)
    rows = [(op.index, op.id, op.rank, op.deps, op.group, op.peer) for op in merged.ops]
    assert rows == [
        (0, "A/c0", 0, [], "", -1),
        (1, "A/s0", 0, [0], "", 1),
        (2, "A/r1", 1, [], "", 0),
        (3, "A/a0", 0, [1], "A/dp", -1),
        (4, "A/a1", 1, [2], "A/dp", -1),
        (5, "B/c0", 6, [], "", -1),
        (6, "B/s0", 6, [5], "", 3),
        (7, "B/r1", 3, [], "", 6),
        (8, "B/a0", 6, [6], "B/dp", -1),
        (9, "B/a1", 3, [7], "B/dp", -1),
    ]
    assert merged.groups["B/dp"].ranks == [6, 3]
    assert merged.pairs == [(1, 2), (6, 7)]
    assert [_fields(op) for op in step.ops] == before
    # Everything else an op holds is its job's.
    assert all(
        merged.ops[5 + k].nbytes == op.nbytes and merged.ops[5 + k].kind == op.kind
        for k, op in enumerate(step.ops)
    )


def test_a_moved_op_keeps_every_field_but_the_moved_ones():
    """Each of Op's fields (as dataclasses lists them, so that a field added later is
    covered) is the original's in the moved op, but index, id, rank, deps, group and
    peer, which move by the job's offset, prefix and GPUs."""
    op = Op(
        3, "s", 1, "send", "p2p", [0, 2], "a label", 1.5e-3, 7e12, 9e9,
        (Gemm(8, 16, 32),), (Attention(1, 8, 8, 64),), "all_gather", "tp", 4e6, "ring",
        2, 4, 0, "t1",
    )  # fmt: skip
    (moved,) = _job_ops([op], 10, "B", [5, 7])
    expected = _fields(op) | {
        "index": 13, "id": "B/s", "rank": 7, "deps": [10, 12], "group": "B/tp", "peer": 5,
    }  # fmt: skip
    assert _fields(moved) == expected


def test_collections_are_paused_inside_the_block_only():
    """Inside the block no automatic collection runs; after it, collection is as it was
    (on stays on, off stays off), also when the block raises."""
    assert gc.isenabled()
    with collections_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with collections_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with collections_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def _tracked(obj: object) -> bool:
    """Whether the collector still walks ``obj``: frozen objects are in no generation."""
    return any(o is obj for o in gc.get_objects())


def test_objects_are_frozen_inside_the_block_only_unless_others_froze_some():
    """Objects that exist before the block are left out of collections inside it; none
    after. Objects someone else froze stay frozen, and the block leaves them alone.

    Checked on objects of the test's own, not on ``gc.get_freeze_count()`` alone: a
    frozen object that is freed leaves the count, so the count may fall at any time."""
    assert gc.get_freeze_count() == 0
    kept = [[] for _ in range(100)]
    with collections_frozen():
        assert gc.get_freeze_count() >= len(kept)
        assert not _tracked(kept[0])
    assert gc.get_freeze_count() == 0
    assert _tracked(kept[0])
    theirs = []
    gc.freeze()
    mine = []  # made after their freeze: the block must not freeze it
    try:
        with collections_frozen():
            assert not _tracked(theirs)
            assert _tracked(mine)
        assert not _tracked(theirs)
        assert _tracked(mine)
    finally:
        gc.unfreeze()


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation=generation))


def test_objects_made_while_paused_go_to_the_oldest_generation_unwalked():
    """Objects the block made that live on are in CPython's oldest generation after it,
    with no collection run on the way (``gc.callbacks`` hears none as the block ends and
    the next allocations are made); the young generation's count starts again from
    zero. A cycle made in the block and dropped is still freed by a full collection."""
    assert gc.isenabled() and gc.get_freeze_count() == 0
    heard: list[int] = []

    def hear(phase: str, info: dict) -> None:
        if phase == "start":
            heard.append(info["generation"])

    gc.collect()
    with collections_paused():
        kept = [[] for _ in range(5_000)]  # more than the young threshold: a collection due
        cycle: list = []
        cycle.append(cycle)
        gone = weakref.ref(_Cell(cycle))
        del cycle
        gc.callbacks.append(hear)
    try:
        more = [[] for _ in range(100)]
        assert heard == []
        assert gc.get_count()[0] < 1_000
    finally:
        gc.callbacks.remove(hear)
    assert not _in_generation(kept[0], 0) and not _in_generation(kept[-1], 0)
    if sys.version_info < (3, 14):  # (CPython's three generations; 3.14's GC has two)
        assert _in_generation(kept[0], 2) and _in_generation(kept[-1], 2)
    assert _in_generation(more[0], 0)
    assert gone() is not None
    gc.collect()
    assert gone() is None


def test_objects_someone_froze_stay_frozen_after_a_pause():
    """Where objects were frozen before the block, its end leaves them frozen (and its
    own objects where the young collections would find them)."""
    theirs: list = []
    gc.freeze()
    try:
        with collections_paused():
            mine: list = []
        assert not _tracked(theirs)
        assert _in_generation(mine, 0)
    finally:
        gc.unfreeze()


class _Cell:
    """A weak-referenceable object in a reference cycle (through ``cycle``)."""

    def __init__(self, cycle: list):
        cycle.append(self)
        self.cycle = cycle
