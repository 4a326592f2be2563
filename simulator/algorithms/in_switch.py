"""Reduction and multicast inside a switch, as schedule ops.

Two kinds of switch reduce data on its way: an NVSwitch with NVLink SHARP (NVLS, H100
and later) and a fabric switch with in-network reduction (SHARP, which NCCL's CollNet
uses). A schedule names no switch: each op goes between two ranks, and its path kind
(:data:`~simulator.algorithms.schedule.PATH_UP` / ``PATH_DOWN`` for the NVSwitch,
``PATH_SHARP_UP`` / ``PATH_SHARP_DOWN`` for the fabric) says that it loads only the
route into the switch (from the sender) or out of it (to the receiver).

A group of ranks reduces a block in the switch by :func:`into_switch`: every member
sends its copy "up" to the group's *owner*, reducing (the owner's own copy is a self op,
src = dst, that loads its link and moves no data between ranks). Symbolically the sum
gathers in the owner's block; physically it exists only in the switch, until
:func:`out_of_switch` sends it "down" to the ranks that need it, once every copy is up.
So NVLS's reduce-scatter is up from every member and down to the owner alone; its
all-gather is up from the owner alone (a self op) and down to every member; a SHARP
all-reduce is up from every member and down to every member.

Both take arrays of groups: ``members[i]`` (m ranks), ``owners[i]`` and the blocks
``blocks[i]`` (w of them, which travel side by side) of group i, and return op ids of
shape (groups, members, blocks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .builder import OpBuffer


def _columns(deps: Sequence[tuple[np.ndarray, bool]], shape: tuple[int, ...]) -> list:
    return [(np.broadcast_to(ids, shape).ravel(), sent) for ids, sent in deps]


def into_switch(
    buf: OpBuffer,
    members: np.ndarray,
    owners: np.ndarray,
    blocks: np.ndarray,
    nbytes: float,
    *,
    path: int,
    step: int,
    chunk: int,
    deps: Sequence[tuple[np.ndarray, bool]] = (),
) -> np.ndarray:
    """Every member of each group sends its copy of the group's blocks into the switch,
    which adds them up: ops member -> owner, reducing (a self op for the owner).

    ``deps`` are dependency columns ``(ids, sent)`` with ``ids`` broadcastable to
    (groups, members, blocks), e.g. ``fifo.deps(members)[:, :, None]``.
    """
    shape = (*members.shape, blocks.shape[1])
    src = np.broadcast_to(members[:, :, None], shape).ravel()
    dst = np.broadcast_to(owners[:, None, None], shape).ravel()
    ids = buf.add(
        src, dst, np.broadcast_to(blocks[:, None, :], shape).ravel(), nbytes,
        reduce=src != dst, step=step, chunk=chunk, path=path, deps=_columns(deps, shape),
    )  # fmt: skip
    return ids.reshape(shape)


def out_of_switch(
    buf: OpBuffer,
    owners: np.ndarray,
    members: np.ndarray,
    blocks: np.ndarray,
    nbytes: float,
    *,
    path: int,
    step: int,
    chunk: int,
    after: np.ndarray,
) -> np.ndarray:
    """The switch writes each group's blocks to every member once all the ops ``after``
    (shape (groups, any, blocks): the copies that went in) are done: ops owner ->
    member, copying (a self op for the owner)."""
    shape = (*members.shape, blocks.shape[1])
    src = np.broadcast_to(owners[:, None, None], shape).ravel()
    deps = [(after[:, [c], :], False) for c in range(after.shape[1])]
    ids = buf.add(
        src, np.broadcast_to(members[:, :, None], shape).ravel(),
        np.broadcast_to(blocks[:, None, :], shape).ravel(), nbytes, reduce=False, step=step,
        chunk=chunk, path=path, deps=_columns(deps, shape),
    )  # fmt: skip
    return ids.reshape(shape)
