"""The symbolic checker proves ring schedules right and catches broken ones."""

import dataclasses

import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.algorithms.schedule import Schedule
from simulator.errors import ScheduleError


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("p", range(2, 18))
def test_ring_schedules_compute_their_collective(op, p):
    for chunks, channels in ((1, 1), (3, 2)):
        verify(build_schedule("ring", op, p, 1e6, chunks=chunks, channels=channels))


@pytest.mark.parametrize("servers", [1, 2, 3, 8])
def test_ring_with_server_rotated_channels(servers):
    layout = RankLayout(4 * servers, tuple(r // 4 for r in range(4 * servers)))
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        verify(build_schedule("ring", op, layout, 1e6, chunks=2, channels=4))


def drop_op(schedule: Schedule, victim: int) -> Schedule:
    """The schedule without op ``victim`` (dependencies on it removed, ids shifted)."""
    keep = np.ones(schedule.n_ops, dtype=bool)
    keep[victim] = False
    new_id = np.cumsum(keep) - 1
    owner = np.repeat(np.arange(schedule.n_ops), np.diff(schedule.dep_ptr))
    live = keep[owner] & keep[schedule.dep_idx]
    counts = np.bincount(owner[live], minlength=schedule.n_ops)[keep]
    ptr = np.concatenate([[0], np.cumsum(counts)])
    fields = {
        name: getattr(schedule, name)[keep]
        for name in (
            "src",
            "dst",
            "nbytes",
            "segment",
            "reduce",
            "channel",
            "step",
            "chunk",
            "path",
        )
    }
    return dataclasses.replace(
        schedule,
        dep_ptr=ptr,
        dep_idx=new_id[schedule.dep_idx[live]],
        dep_sent=schedule.dep_sent[live],
        **fields,
    )


def test_missing_transfer_is_caught():
    schedule = build_schedule("ring", "all_reduce", 4, 1e3)
    # The last op is an all-gather copy: without it one rank lacks a finished block.
    with pytest.raises(ScheduleError, match="lacking|holding|before holding"):
        verify(drop_op(schedule, schedule.n_ops - 1))


def test_double_reduction_is_caught():
    schedule = build_schedule("ring", "reduce_scatter", 4, 1e3)
    # Repeat op 0's reducing transfer once everything else is done: rank 1 then counts
    # rank 0's contribution to that block twice.
    n = schedule.n_ops
    duplicate = dataclasses.replace(
        schedule,
        src=np.append(schedule.src, schedule.src[0]),
        dst=np.append(schedule.dst, schedule.dst[0]),
        nbytes=np.append(schedule.nbytes, schedule.nbytes[0]),
        segment=np.append(schedule.segment, schedule.segment[0]),
        reduce=np.append(schedule.reduce, True),
        channel=np.append(schedule.channel, 0),
        step=np.append(schedule.step, 0),
        chunk=np.append(schedule.chunk, 0),
        path=np.append(schedule.path, 0),
        dep_ptr=np.append(schedule.dep_ptr, schedule.dep_ptr[-1] + n),
        dep_idx=np.append(schedule.dep_idx, np.arange(n)),
        dep_sent=np.append(schedule.dep_sent, np.zeros(n, dtype=bool)),
    )
    with pytest.raises(ScheduleError, match="twice"):
        verify(duplicate)


def test_copy_instead_of_reduce_is_caught():
    schedule = build_schedule("ring", "all_reduce", 5, 1e3)
    reduce = schedule.reduce.copy()
    reduce[np.flatnonzero(reduce)[3]] = False
    with pytest.raises(ScheduleError, match="lacking"):
        verify(dataclasses.replace(schedule, reduce=reduce))


def without_data_dependencies(schedule: Schedule) -> Schedule:
    keep = schedule.dep_sent  # keep only the channel-order ("sent") dependencies
    owner = np.repeat(np.arange(schedule.n_ops), np.diff(schedule.dep_ptr))
    counts = np.bincount(owner[keep], minlength=schedule.n_ops)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    return dataclasses.replace(
        schedule, dep_ptr=ptr, dep_idx=schedule.dep_idx[keep], dep_sent=schedule.dep_sent[keep]
    )


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_missing_data_dependency_is_a_race(op):
    """Without its data dependencies a step may forward a block before the previous
    rank's partial sum has arrived: a race, whatever order the checker happens to use."""
    schedule = build_schedule("ring", op, 4, 1e3)
    with pytest.raises(ScheduleError, match="race"):
        verify(without_data_dependencies(schedule))


def test_cycle_is_caught():
    """Ring all-gather on 3 ranks: op 4 (step 1 at rank 1) waits for op 0 (step 0 at rank
    0); making op 0 wait for op 4 closes a cycle."""
    schedule = build_schedule("ring", "all_gather", 3, 1e3)
    assert 0 in schedule.dep_idx[schedule.dep_ptr[4] : schedule.dep_ptr[5]]
    ptr = np.concatenate([[0], schedule.dep_ptr[1:] + 1])
    dep_idx = np.insert(schedule.dep_idx, 0, 4)
    dep_sent = np.insert(schedule.dep_sent, 0, False)
    with pytest.raises(ScheduleError, match="cycle"):
        verify(dataclasses.replace(schedule, dep_ptr=ptr, dep_idx=dep_idx, dep_sent=dep_sent))
