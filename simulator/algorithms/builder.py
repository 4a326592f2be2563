"""Helpers shared by the algorithm modules: an op buffer, dependency trackers, ring phases.

Algorithms emit ops in *batches* (numpy arrays of ops that belong to one step and chunk)
into an :class:`OpBuffer`, which assigns consecutive op ids and assembles the CSR
dependency arrays once at the end. Two trackers compute the usual dependencies:

* :class:`LastWriter` remembers, for every (rank, block), the op that last delivered the
  block to the rank. An op that sends a block depends on it being *done* (the data has
  arrived and been reduced): a read-after-write dependency. An op that delivers a block
  also waits for the receiver's previous delivery of it, so the writes into one block
  are in order and the last one stands for all (a rank that receives a fold and then a
  reduction into the same block forwards it only after both).
* :class:`Fifo` remembers, for every (rank, stream), the op that rank last sent on the
  stream. The next op on the stream depends on it being *sent* (the link is free): the
  ops of a stream leave one after another, as chunks do on one NCCL channel. When a
  batch holds several ops from one rank on one stream (a step that moves several blocks
  to the same peer at once) they run side by side and finish together, so any one of
  them stands for the group.

:func:`ring_phase` expands a reduce-scatter or all-gather over many rings at once,
:func:`mesh_phase` the same over many groups as a direct (full-mesh) exchange, both on
:func:`pair_sends` (messages in chunks on per-pair streams), and
:func:`replicate_channels` turns a one-channel schedule into ``C`` independent copies,
each carrying 1/C of the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CcsimError
from .schedule import PATH_DEFAULT, Schedule

#: "No dependency" in dependency columns.
NONE = -1

_FIELDS = ("src", "dst", "segment", "nbytes", "reduce", "step", "chunk", "path")


class OpBuffer:
    """Collects batches of ops and their dependencies; :meth:`schedule` assembles them."""

    def __init__(self) -> None:
        self.n = 0
        self._parts: dict[str, list[np.ndarray]] = {name: [] for name in _FIELDS}
        self._dep_idx: list[np.ndarray] = []
        self._dep_sent: list[np.ndarray] = []
        self._dep_count: list[np.ndarray] = []

    def add(
        self,
        src: Any,
        dst: Any,
        segment: Any,
        nbytes: Any,
        *,
        reduce: bool | np.ndarray,
        step: int | np.ndarray,
        chunk: int | np.ndarray = 0,
        path: int | np.ndarray = PATH_DEFAULT,
        deps: Sequence[tuple[Any, bool]] = (),
    ) -> np.ndarray:
        """Append one batch of ops; return their ids.

        Parameters
        ----------
        src, dst, segment, nbytes : array-like or scalar
            Broadcast to a common length (the batch size).
        reduce, step, chunk, path : bool / int or arrays
            Per-op flags, labels and route kinds (``Schedule.path``), broadcast likewise.
        deps : sequence of (ids, sent)
            Dependency columns: ``ids`` (one per op, :data:`NONE` for none) and whether
            the op waits for them to be *sent* (True) or *done* (False).
        """
        src = np.asarray(src).ravel()
        arrays = np.broadcast_arrays(
            src,
            np.asarray(dst).ravel(),
            np.asarray(segment).ravel(),
            np.asarray(nbytes, dtype=float).ravel(),
            np.asarray(reduce, dtype=bool).ravel(),
            np.asarray(step).ravel(),
            np.asarray(chunk).ravel(),
            np.asarray(path).ravel(),
        )
        m = len(arrays[0])
        for name, values in zip(_FIELDS, arrays, strict=True):
            self._parts[name].append(np.array(values))
        if deps:
            table = np.stack(
                [np.broadcast_to(np.asarray(ids, dtype=np.int64).ravel(), (m,)) for ids, _ in deps],
                axis=1,
            )
            kinds = np.broadcast_to(np.array([sent for _, sent in deps], dtype=bool), table.shape)
            has = table >= 0
            self._dep_idx.append(table[has].astype(np.int32))
            self._dep_sent.append(kinds[has])
            self._dep_count.append(has.sum(axis=1))
        else:
            self._dep_count.append(np.zeros(m, dtype=np.int64))
        ids = np.arange(self.n, self.n + m, dtype=np.int64)
        self.n += m
        return ids

    def schedule(
        self,
        *,
        op: str,
        algorithm: str,
        ranks: int,
        size_bytes: float,
        segment_owner: np.ndarray,
        params: dict[str, Any],
    ) -> Schedule:
        """The :class:`~simulator.algorithms.schedule.Schedule` made of every batch added so far."""

        def joined(name: str, dtype) -> np.ndarray:
            parts = self._parts[name]
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        dep_ptr = np.zeros(self.n + 1, dtype=np.int64)
        if self._dep_count:
            np.cumsum(np.concatenate(self._dep_count), out=dep_ptr[1:])
        return Schedule(
            op=op,
            algorithm=algorithm,
            ranks=ranks,
            size_bytes=float(size_bytes),
            src=joined("src", np.int32),
            dst=joined("dst", np.int32),
            nbytes=joined("nbytes", np.float64),
            segment=joined("segment", np.int32),
            reduce=joined("reduce", np.bool_),
            dep_ptr=dep_ptr,
            dep_idx=np.concatenate(self._dep_idx) if self._dep_idx else np.zeros(0, np.int32),
            dep_sent=np.concatenate(self._dep_sent) if self._dep_sent else np.zeros(0, bool),
            segment_owner=np.asarray(segment_owner, dtype=np.int32),
            step=joined("step", np.int32),
            chunk=joined("chunk", np.int32),
            path=joined("path", np.int8),
            params=params,
        )


class LastWriter:
    """The op that last delivered each block to each rank (:data:`NONE`: initial data).

    Blocks are numbered ``0..blocks-1`` locally; an algorithm with independent groups of
    blocks (pipeline slices) can use one tracker per group and drop it when done.
    """

    def __init__(self, ranks: int, blocks: int) -> None:
        self.table = np.full((ranks, blocks), NONE, dtype=np.int64)

    def columns(self, src: np.ndarray, dst: np.ndarray, blocks: np.ndarray) -> list:
        """Dependency columns of transfers of ``blocks`` from ``src`` to ``dst``.

        The data must have arrived at the sender, and the receiver's previous write of
        the block must be done.
        """
        return [(self.table[src, blocks], False), (self.table[dst, blocks], False)]

    def record(self, ranks: np.ndarray, blocks: np.ndarray, ops: np.ndarray) -> None:
        """``ops`` deliver ``blocks`` to ``ranks``."""
        self.table[ranks, blocks] = ops


class Fifo:
    """The op each rank last sent on each stream (a channel, a peer, a link class)."""

    def __init__(self, ranks: int, streams: int = 1) -> None:
        self.last = np.full((ranks, streams), NONE, dtype=np.int64)

    def deps(self, src: np.ndarray, stream: int | np.ndarray = 0) -> np.ndarray:
        """Ops that must be sent before ``src`` sends again on ``stream``."""
        return self.last[src, stream]

    def record(self, src: np.ndarray, ops: np.ndarray, stream: int | np.ndarray = 0) -> None:
        """``ops`` are now the last ops of ``src`` on ``stream``."""
        self.last[src, stream] = ops


def ring_phase(
    buf: OpBuffer,
    writer: LastWriter,
    fifo: Fifo,
    rings: np.ndarray,
    blocks: np.ndarray,
    block_bytes: float,
    *,
    reduce: bool,
    stream: int = 0,
    segment_base: int = 0,
    step0: int = 0,
    chunk0: int = 0,
    after: np.ndarray | None = None,
) -> np.ndarray | None:
    """Emit a ring reduce-scatter (``reduce``) or all-gather on many rings at once.

    ``rings[q]`` lists the ranks of ring ``q`` in ring order (m positions). Position
    ``i`` sends to position ``i + 1``. ``blocks[q, b, k]`` are the local block ids (of
    ``block_bytes`` each) that make up chunk ``k`` of ring block ``b``; a chunk may
    consist of several blocks, which then travel side by side.

    Reduce-scatter: at step ``s`` position ``i`` sends ring block ``i - s - 1`` and the
    receiver reduces it; after m-1 steps position ``i`` holds ring block ``i`` reduced
    over the ring. All-gather: position ``i`` starts with ring block ``i`` and at step
    ``s`` sends ring block ``i - s``. Each step sends its K chunks one after another on
    ``stream``. Ops are labelled step ``step0 + s`` and chunk ``chunk0 + k``.

    Phases follow one another as messages do: a rank's step-0 sends of chunk k also
    wait for the ops ``after[rank, k]`` (the previous phase's last messages into the
    rank, :data:`NONE`-padded), even for blocks it already holds. Returns the same kind
    of array for this phase (its last step's ops, by receiver and chunk), to pass on.
    """
    n_rings, m = rings.shape
    n_chunks, width = blocks.shape[2:]
    if m < 2:
        return after
    received = np.full((int(rings.max()) + 1, n_chunks, width), NONE, dtype=np.int64)
    positions = np.arange(m)
    ring_index = np.arange(n_rings)[:, None]
    dst = np.roll(rings, -1, axis=1)
    for s in range(m - 1):
        sent = (positions - s - 1) % m if reduce else (positions - s) % m
        for k in range(n_chunks):
            local = blocks[ring_index, sent[None, :], k]  # (rings, m, blocks per chunk)
            src_ops = np.broadcast_to(rings[:, :, None], local.shape).ravel()
            dst_ops = np.broadcast_to(dst[:, :, None], local.shape).ravel()
            local = local.ravel()
            deps = [*writer.columns(src_ops, dst_ops, local), (fifo.deps(src_ops, stream), True)]
            if s == 0 and after is not None:
                waits = after[src_ops, k]
                deps += [(waits[:, c], False) for c in range(waits.shape[1])]
            ids = buf.add(
                src_ops,
                dst_ops,
                local + segment_base,
                block_bytes,
                reduce=reduce,
                step=step0 + s,
                chunk=chunk0 + k,
                deps=deps,
            )
            writer.record(dst_ops, local, ids)
            fifo.record(src_ops, ids, stream)
            if s == m - 2:
                received[dst[:, :, None], k, np.arange(width)] = ids.reshape(n_rings, m, width)
    return received


def ordered_pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` of every ordered pair of distinct positions ``0..p-1``, by src then dst.

    >>> [a.tolist() for a in ordered_pairs(3)]
    [[0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]]
    """
    src, dst = np.divmod(np.arange(p * p, dtype=np.int64), p)
    keep = src != dst
    return src[keep], dst[keep]


def pair_sends(
    buf: OpBuffer,
    fifo: Fifo,
    src: Any,
    dst: Any,
    segments: Sequence[Any],
    nbytes: float,
    *,
    reduce: bool,
    step: int,
    chunk0: int = 0,
    streams: Any = None,
    deps: Sequence[Sequence[tuple[Any, bool]]] = (),
) -> list[np.ndarray]:
    """Send a message from each ``src[i]`` to ``dst[i]``, all at once, in chunks.

    Chunk ``k`` carries blocks ``segments[k]`` (one per op, or a scalar) and is labelled
    chunk ``chunk0 + k``; the chunks of one message leave one after another on the
    sender's FIFO stream ``streams[i]`` (default ``dst[i]``: one stream per receiver, on a
    ``Fifo(ranks, ranks)``). ``deps[k]``, when given, are chunk k's further dependency
    columns. Returns the op ids of each chunk.
    """
    streams = dst if streams is None else streams
    chunks = []
    for k, segment in enumerate(segments):
        ids = buf.add(
            src,
            dst,
            segment,
            nbytes,
            reduce=reduce,
            step=step,
            chunk=chunk0 + k,
            deps=[(fifo.deps(src, streams), True), *(deps[k] if deps else ())],
        )
        fifo.record(src, ids, streams)
        chunks.append(ids)
    return chunks


def mesh_phase(
    buf: OpBuffer,
    writer: LastWriter | None,
    fifo: Fifo,
    groups: np.ndarray,
    blocks: np.ndarray,
    block_bytes: float,
    *,
    reduce: bool,
    stream: int = 0,
    segment_base: int = 0,
    step0: int = 0,
    chunk0: int = 0,
    after: np.ndarray | None = None,
) -> np.ndarray | None:
    """Emit a direct (full-mesh) reduce-scatter (``reduce``) or all-gather on many groups.

    ``groups[q]`` lists the m ranks of group ``q``; ``blocks[q, b, k]`` are the local
    block ids (of ``block_bytes`` each) that make up chunk ``k`` of group block ``b``, as
    in :func:`ring_phase`. Reduce-scatter: every member ``i`` sends group block ``b`` to
    member ``b`` for every ``b != i``, all at once, and member ``b`` reduces the m-1
    contributions as they arrive (they commute). All-gather: member ``i`` sends group
    block ``i`` to every other member. One step, labelled ``step0``; the chunks of a
    message go one after another on the sender's stream ``stream + b`` for receiver
    position ``b`` (a FIFO per peer), labelled ``chunk0 + k``.

    ``writer`` tracks blocks as in :func:`ring_phase` (None: ``after`` alone orders the
    phase, as in a one-group direct all-reduce). Every send of chunk k waits for the
    ops ``after[rank, k]``. Returns, for the next phase, every op of this phase into
    each rank by chunk: ``received[rank, k]`` holds the m-1 senders' ops (by sender
    position, then block), :data:`NONE`-padded.
    """
    n_groups, m = groups.shape
    n_chunks, width = blocks.shape[2:]
    if m < 2:
        return after
    i, b = ordered_pairs(m)
    shape = (n_groups, len(i), width)
    src = np.broadcast_to(groups[:, i, None], shape).ravel()
    dst = np.broadcast_to(groups[:, b, None], shape).ravel()
    streams = np.broadcast_to((stream + b)[None, :, None], shape).ravel()
    # Blocks of chunk k travelling on each op: the receiver's (reduce) or the sender's.
    local = [
        blocks[np.arange(n_groups)[:, None], (b if reduce else i)[None, :], k].ravel()
        for k in range(n_chunks)
    ]
    deps = []
    for k in range(n_chunks):
        columns = writer.columns(src, dst, local[k]) if writer is not None else []
        if after is not None:
            waits = after[src, k]
            columns += [(waits[:, c], False) for c in range(waits.shape[1])]
        deps.append(columns)
    segments = [blocks_k + segment_base for blocks_k in local]
    sent = pair_sends(
        buf, fifo, src, dst, segments, block_bytes, reduce=reduce, step=step0, chunk0=chunk0,
        streams=streams, deps=deps,
    )  # fmt: skip
    # Slot of each op in its receiver's row: the sender's position among the others.
    slot = np.broadcast_to(((i - (i > b)) * width)[None, :, None] + np.arange(width), shape)
    received = np.full((int(groups.max()) + 1, n_chunks, (m - 1) * width), NONE, np.int64)
    for k, ids in enumerate(sent):
        if writer is not None:
            writer.record(dst, local[k], ids)
        received[dst, k, slot.ravel()] = ids
    return received


def replicate_channels(
    schedule: Schedule,
    channels: int,
    size_bytes: float,
    rank_maps: np.ndarray | None = None,
) -> Schedule:
    """``channels`` independent copies of a one-channel ``schedule``, one per channel.

    Copy ``c`` has its own blocks (ids shifted by ``c`` x blocks) and ops, labelled
    channel ``c``; ``schedule`` must have been built for ``size_bytes / channels``.
    ``rank_maps[c][r]``, when given, is the rank that plays rank ``r`` in copy ``c``
    (each row a permutation), so channels can run the same pattern through different
    GPUs and NICs.
    """
    if rank_maps is not None:
        rank_maps = np.asarray(rank_maps, dtype=np.int64)
        expected = np.arange(schedule.ranks)
        if rank_maps.shape != (channels, schedule.ranks) or not all(
            np.array_equal(np.sort(row), expected) for row in rank_maps
        ):
            raise ValueError("rank_maps must hold one permutation of the ranks per channel")
    if channels == 1:
        schedule.size_bytes = float(size_bytes)
        schedule.params["channels"] = 1
        if rank_maps is not None:
            schedule.src = rank_maps[0][schedule.src].astype(schedule.src.dtype)
            schedule.dst = rank_maps[0][schedule.dst].astype(schedule.dst.dtype)
            schedule.segment_owner = rank_maps[0][schedule.segment_owner].astype(
                schedule.segment_owner.dtype
            )
        return schedule
    n, n_deps, n_blocks = schedule.n_ops, len(schedule.dep_idx), schedule.n_segments
    copies = np.arange(channels, dtype=np.int64)[:, None]

    def tile(values: np.ndarray) -> np.ndarray:
        return np.tile(values, channels)

    def ranks(values: np.ndarray) -> np.ndarray:
        if rank_maps is None:
            return tile(values)
        return rank_maps[:, values].ravel().astype(values.dtype)

    dep_ptr = np.empty(channels * n + 1, dtype=np.int64)
    dep_ptr[:-1] = (schedule.dep_ptr[:-1][None, :] + copies * n_deps).ravel()
    dep_ptr[-1] = channels * n_deps
    return Schedule(
        op=schedule.op,
        algorithm=schedule.algorithm,
        ranks=schedule.ranks,
        size_bytes=float(size_bytes),
        src=ranks(schedule.src),
        dst=ranks(schedule.dst),
        nbytes=tile(schedule.nbytes),
        segment=(schedule.segment[None, :] + copies * n_blocks).ravel(),
        reduce=tile(schedule.reduce),
        dep_ptr=dep_ptr,
        dep_idx=(schedule.dep_idx[None, :] + copies * n).ravel(),
        dep_sent=tile(schedule.dep_sent),
        segment_owner=ranks(schedule.segment_owner),
        channel=np.repeat(np.arange(channels, dtype=np.int32), n),
        step=tile(schedule.step),
        chunk=tile(schedule.chunk),
        path=tile(schedule.path),
        params={**schedule.params, "channels": channels},
    )


def check_root(root: object, ranks: int) -> int:
    """Validate the root rank of a broadcast or reduce."""
    if isinstance(root, bool) or not isinstance(root, int | np.integer) or not 0 <= root < ranks:
        raise CcsimError(f"--root must be a rank from 0 to {ranks - 1}, got {root!r}")
    return int(root)
