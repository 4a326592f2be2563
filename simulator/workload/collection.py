"""Python's cyclic garbage collector, told how a replay allocates.

A training step's replay builds hundreds of thousands of ops (and millions of small
objects with them) that live until it ends. CPython collects its oldest generation each
time the objects that survived younger collections have grown by a quarter, walking
every live object each time: measured on `ccsim search`'s heaviest candidates (Llama 3
405B, TP 8 x CP 2 x PP 64 on 16,384 H100), 11 to 13 such collections took 3.4-6.0 s of
a 20-25 s candidate, the young generations' thousands of collections 0.9 s more
(`gc.callbacks`). Raising the young generations' thresholds makes full collections
rare while a replay runs: every result is the same, only the time changes.
:func:`collections_paused` turns the collector off where the objects built are known to
hold no garbage cycles (two jobs' merged ops; a published step's build and replays, each
replay closed; a sweep's or a search's workload point, built, replayed and closed:
:func:`~simulator.sweep.point.simulate_workload_point`), and :func:`collections_frozen`
leaves the objects built before a block out of its collections.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Thresholds inside :func:`fewer_collections` (CPython's defaults are 700, 10, 10): a
#: young collection every 50,000 net allocations instead of 700. Chosen by measurement
#: (the same six search candidates: 110 s of CPU with the defaults, 97.5 s with these
#: and each replay closed after its result is read, at the same peak memory); nothing
#: depends on the exact figures but time.
THRESHOLDS = (50_000, 20, 10)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the block with :data:`THRESHOLDS` (as they were after; the collector stays
    on, so reference cycles are still freed, later). Process-wide while it runs, like
    any gc setting: only the time other threads spend collecting changes."""
    was = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*was)


@contextmanager
def collections_paused() -> Iterator[None]:
    """Pause Python's automatic garbage collection inside the block (as it was after).

    Building a 1,024-GPU job's ops (generating them, merging them, the replay's
    per-op tables) allocates millions of objects that live on; each time the heap has
    grown by a quarter, CPython collects its oldest generation, walking every object:
    20 such collections, 9.8 s of the 69 s of CPU of the two 1,024-GPU jobs on a 2:1
    leaf-spine (``ccsim bench``, measured with ``gc.callbacks``), all of them while
    building. The ops hold no reference cycles, so nothing is left for later. Only the
    time changes, not any result.

    Where the block turns collection back on, the objects it made that live on (a
    step's ops and records, which the caller still holds) go straight into the oldest
    generation (:func:`_to_oldest`) instead of being walked by the first young
    collections after it, which found nothing to free. Measured by timing the block's
    exit in ``run_steady`` (load 15-19 on 2 cores): DGX Cloud's Llama 3.1 405B step,
    0.6-1.5 s of ~16 s of CPU on 128 GB200 and 1.5 s of ~44 s on 256; the FSDP 405B
    step on 128 GB200, 0.2 s of ~20 s; 0.0 s after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            _to_oldest()
            gc.enable()


def _to_oldest() -> None:
    """Move every object the collector tracks into its oldest generation, walking none
    (``gc.freeze`` then ``gc.unfreeze``: both move whole generation lists at once, and
    the freeze sets the young generation's count to zero).

    What a young collection would do with the objects that survive it, without the
    walk: they stay tracked, so a full collection (``gc.collect()``, or CPython's own
    when the old generation has grown by a quarter) still frees any cycle among them.
    Nothing is done where someone else froze objects (``gc.get_freeze_count()``): the
    unfreeze would release theirs."""
    if gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()


@contextmanager
def collections_frozen() -> Iterator[None]:
    """Leave the objects that exist before the block out of the collections inside it
    (``gc.freeze``; ``gc.unfreeze`` after), unless something else froze objects.

    During a replay the ops, built before it, live on: a collection of the oldest
    generation would walk them all again (after :func:`collections_paused`, 4 of them,
    5 s of CPU at 1,024 GPUs a job) though only the replay's own objects can be garbage.
    Only the time changes, not any result."""
    if gc.get_freeze_count():
        yield  # someone else's frozen objects: unfreezing them is not ours to do
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
