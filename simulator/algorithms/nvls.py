"""NVLS: collectives reduced and multicast inside the NVSwitch (NVLink SHARP).

On NVSwitch generations with in-switch reduction (H100 and later), rank s owns shard s
(1/p of the buffer). To reduce it, the switch reads shard s from every GPU, adds the
copies up and returns the sum to s (``multimem.ld_reduce``); to share it, s writes it
once and the switch copies it to every GPU (``multimem.st``). So per GPU and per
direction an all-reduce moves n (p + 1) / p bytes, where a ring moves 2 n (p - 1) / p,
and at line rate B its bus bandwidth tends to 2 (p - 1) B / (p + 1) (1.56 B for p = 8).

Schedules express the switch with two route kinds (:data:`~simulator.schedule.PATH_UP`
loads only the sender's link into the switch, :data:`~simulator.schedule.PATH_DOWN`
only the switch's link to the receiver) and with *self* ops (src = dst) that carry no
data between ranks and exist only to load a link:

* reduce-scatter of block g (shard s, chunk k): every r != s sends g "up" towards s,
  reducing (the switch adds the copies); s sends its own copy up (self op); then the sum
  comes "down" to s (self op, after all p copies are up);
* all-gather of block g: s sends g up once (self op), then the switch copies it down to
  every rank (ops s -> r, and a self op for s's own copy).

``chunks`` K cuts each shard into K blocks. Each rank sends its up ops one chunk at a
time (a FIFO per rank), so the all-gather of chunk k overlaps the reduce-scatter of
chunk k + 1, and up and down links are busy at once.

Closed form (link bandwidth B and latency a each way, n bytes, K = 1): all-reduce
4a + 2 (p + 1) n / (p B) (four phases one after another: p n/p up, n/p down, n/p up,
p n/p down); reduce-scatter and all-gather 2a + (p + 1) n / (p B). For large K the
all-reduce tends to (p + 1) n / (p B).
"""

from __future__ import annotations

import numpy as np

from ..schedule import PATH_DOWN, PATH_UP, Schedule
from .base import Algorithm, RankLayout, check_positive_int
from .builder import NONE, Fifo, OpBuffer, replicate_channels

#: NCCL runs NVLS with the Simple protocol only.
NVLS_PROTOCOLS = ["Simple"]


def nvls_schedule(op: str, p: int, size_bytes: float, chunks: int) -> Schedule:
    """One channel of an NVLS collective (see the module docstring)."""
    K = chunks
    buf = OpBuffer()
    paths: list[np.ndarray] = []
    # Each rank's sends into the switch, one chunk after another: its reduce-scatter
    # copies (stream 0) and its all-gather writes (stream 1) proceed side by side.
    up = Fifo(p, 2)
    ranks = np.arange(p)
    # Every ordered pair (r, s), r != s, then the self pairs.
    r_all = np.repeat(ranks, p)
    s_all = np.tile(ranks, p)

    def add(src, dst, block, nbytes, *, reduce, step, chunk, path, deps=()):
        ids = buf.add(src, dst, block, nbytes, reduce=reduce, step=step, chunk=chunk, deps=deps)
        paths.append(np.full(len(ids), path, dtype=np.int8))
        return ids

    b = size_bytes / (p * K)
    for k in range(K):
        blocks = ranks * K + k  # block of shard s, chunk k
        ready = np.full(p, NONE, dtype=np.int64)  # per shard: the op after which it is whole
        if op in ("all_reduce", "reduce_scatter"):
            # Up: rank r sends its copy of every shard (reducing into the owner's sum).
            ids = add(
                r_all,
                s_all,
                blocks[s_all],
                b,
                reduce=r_all != s_all,
                step=0,
                chunk=k,
                path=PATH_UP,
                deps=[(up.deps(r_all, 0), True)],
            )
            up.record(r_all, ids, 0)
            into = ids.reshape(p, p)  # into[r, s]: rank r's copy of shard s
            # Down: the sum of shard s reaches s once all p copies are up.
            ready = add(
                ranks,
                ranks,
                blocks,
                b,
                reduce=False,
                step=1,
                chunk=k,
                path=PATH_DOWN,
                deps=[(into[r], False) for r in range(p)],
            )
        if op in ("all_reduce", "all_gather"):
            # Up once: the owner writes its (reduced) shard into the switch.
            lifted = add(
                ranks,
                ranks,
                blocks,
                b,
                reduce=False,
                step=2,
                chunk=k,
                path=PATH_UP,
                deps=[(up.deps(ranks, 1), True), (ready, False)],
            )
            up.record(ranks, lifted, 1)
            # Down to everyone: the switch multicasts shard s to every rank.
            add(
                s_all,
                r_all,
                blocks[s_all],
                b,
                reduce=False,
                step=3,
                chunk=k,
                path=PATH_DOWN,
                deps=[(lifted[s_all], False)],
            )
    schedule = buf.schedule(
        op=op,
        algorithm="nvls",
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.repeat(ranks, K),
        params={"chunks": K, "protocols": list(NVLS_PROTOCOLS)},
    )
    schedule.path = np.concatenate(paths) if paths else np.zeros(0, dtype=np.int8)
    return schedule


class Nvls(Algorithm):
    """In-switch reduction and multicast (NVLink SHARP) inside one NVSwitch domain."""

    name = "nvls"
    ops = ("all_reduce", "reduce_scatter", "all_gather")
    description = "NVLink SHARP: the NVSwitch reduces and multicasts (H100 and later, one server)"

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        reason = super().unsupported(op, layout)
        if reason is None and layout.servers is not None and len(set(layout.servers)) > 1:
            return "nvls works inside one NVSwitch domain (one server); use hierarchical across"
        return reason

    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        one = nvls_schedule(op, layout.ranks, size_bytes / C, K)
        schedule = replicate_channels(one, C, size_bytes)
        schedule.params.setdefault("protocols", list(NVLS_PROTOCOLS))
        return schedule
