"""NCCL's all-to-all: grouped ncclSend/ncclRecv to every peer, as NCCL schedules them.

nccl-tests' ``alltoall_perf`` calls, inside one ncclGroupStart/End, ncclSend and
ncclRecv of S/p bytes to and from every rank (itself included). NCCL turns the group
into one kernel that runs as follows (file:line at v2.28.7-1, the version of the
bundled GB300 runs; the mirrored master, commit 5067397c, is v2.30.7-1, and where it
differs it is said so):

* **Peers in rounds.** Round k pairs a send to one peer with a receive from the mirror
  peer. Ranks are cut into groups of NCCL_P2P_SCHEDULE_GROUP_SIZE = 8 (its gcd with the
  ranks per node; init.cc:766-776; v2.30.7 uses every rank of a single node as one
  group, init.cc:894); the group offset walks the quadratic sequence (x^2 + x)/2 mod
  pow2Up(groups) skipping offsets past the groups, and inside it the local offset
  0..G-1: rank r sends to (group + gd, local + delta) and receives from (group - gd,
  local - delta) (init.cc:805-828). Round 0 is the rank itself (a local copy, not
  modelled: it moves no data between GPUs).
* **Channels per peer.** A round's bytes go over ``nParts`` channels, starting at
  channel ``base(k) = reverseBits(k, log2 C)`` on one node (k's group of 8 rounds on
  several, channel.h:19-31) and wrapping modulo C = p2pnChannels = pow2Up(comm's
  channels) (paths.cc:859-886; ``(base + part) & (C-1)``, device.h:270). ``nParts``
  starts at nChannelsMin (p2pnChannelsPerPeer halved while x ranks exceeds C,
  enqueue.cc:1052-1056), at most one per ``stepSize/8`` bytes, and doubles while a part
  would exceed 32 steps (on one node; a step across nodes), up to p2pnChannelsPerPeer
  (enqueue.cc:891-902). A part is ``alignUp(ceil(bytes/nParts), 4 KiB)``
  (device.h:254-262), so the last parts can be short or empty.
* **Chunks.** Each part moves in chunks of the protocol's step: Simple
  p2pChunkSize (512 KiB over NVLink, 128 KiB across nodes, init.cc:704-717; from
  v2.29.2 256 KiB across nodes on Arm hosts with Blackwell, init.cc:800-804 at
  v2.30.4-1, :func:`simulator.library.nccl_p2p.net_chunk`), LL half its
  64 KiB step (enqueue.cc:840-857); the connection has NCCL_STEPS = 8 slots
  (device.h:24), so a sender runs at most 8 chunks ahead of its receiver.
* **Batches.** A channel runs its works in batches: at most
  NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8 works, all from one group of 8 rounds
  (enqueue.cc:110-140, device.h:364); the works of a batch run side by side (their
  warps split the thread block, sendrecv.h:103-112), and the next batch starts when
  every send and receive of this one has finished.

The schedule expresses exactly that: op (r -> peer, round k, part j, chunk c) on channel
``(base(k) + j) & (C-1)``; chunk c waits for chunk c-1 to be sent (one thread group
sends a part's chunks in order) and for chunk c - 8 to be done (its slot is free again);
a part's first chunk waits for the previous batch on its channel of both its sender and
its receiver (its sends sent, its receives done): a receiver's warps join a work only
when its batch starts. ``pxn`` sends ops between servers through the NIC on the
receiver's rail (:data:`~simulator.algorithms.schedule.PATH_PXN`).

To keep large calls tractable a part moves in at most ``max_chunks`` transfers; beyond
``max_ops`` transfers in all, fewer. A transfer then carries m NCCL chunks, m a power of
two (:func:`merged_transfers`), and the slot window counts w = max(2, 8/m) transfers: for
m <= 4 exactly NCCL's 8 chunks in flight. Each transfer pays the protocol's per-step
latency once, and where the protocol bounds a channel's rate (a chunk done no earlier
than h + c/R after it started, R the channel's rate) a merged transfer's bound is what
its chunks take in NCCL's 8-slot pipeline: w m / 8 chunk cycles, (w m / 8)(h + c/R),
written as ``channel_steps`` = w m / 8 steps of h and the rate scaled by
``channel_rate_scale`` = 8 / w (schedule params, which the replays read). Without that
scaling a merged transfer of m chunks paid h + m c / R, and only w of them were in
flight: a part's channel-bound rate fell from 8 c / (h + c/R) to w m c / (h + m c/R),
about w / 8 of it where c/R >> h (1/m for m <= 4), e.g. busbw 87 -> 52 GB/s on two B200
servers at one channel a network peer, 256 MiB. Where the channel's rate binds, the
merged pipeline moves a part at the unmerged one's rate exactly (w transfers of w m / 8
cycles each carry w m chunks); the call ends within one merged transfer (its wire time
or its bound) of the unmerged schedule, which tests/test_nccl_p2p_merge.py checks.

Closed forms on a full mesh (every pair its own link of bandwidth B; per-step latency
h, paid after a chunk's last byte is sent; n bytes per rank, one part per peer, all
works in one batch, K chunks of tau = n/(pKB)): T = K tau + h while h <= 7 tau (a chunk
never waits for its slot); past it chunk c >= 8 waits for chunk c-8's slot, e.g.
T = 29 tau for K = 16, h = 10 tau. Two batches on one channel (16 ranks, one channel,
one chunk) follow each other: T = 2 (tau + h). The tests check each timeline.

Examples
--------
>>> from simulator.algorithms import build_schedule
>>> s = build_schedule("nccl-p2p", "all_to_all", 4, 4e6, channels=2, chunks=2)
>>> s.n_ops  # 4 ranks x 3 peers x 2 parts x 2 chunks
48
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CcsimError
from .base import Algorithm, RankLayout, check_positive_int
from .builder import NONE, OpBuffer
from .schedule import PATH_DEFAULT, PATH_PXN, Schedule

#: NCCL_STEPS: slots of a connection's FIFO (include/device.h:24 at v2.28.7-1).
SLOTS = 8
#: NCCL_MAX_DEV_WORK_P2P_PER_BATCH (include/device.h:364 at v2.28.7-1).
WORKS_PER_BATCH = 8
#: NCCL_P2P_SCHEDULE_GROUP_SIZE's default (init.cc:766 at v2.28.7-1).
GROUP_SIZE = 8
#: ncclP2pPartBounds aligns parts to 4 KiB (include/device.h:254-262 at v2.28.7-1).
PART_ALIGN = 4096
#: Transfers per part and in all beyond which NCCL's chunks are merged (see docstring).
MAX_CHUNKS = 32
MAX_OPS = 400_000


def merged_transfers(chunks: int, cap: int, slots: int = SLOTS) -> tuple[int, int]:
    """NCCL chunks per transfer m and the slot window in transfers w when a part of
    ``chunks`` chunks moves in at most ``cap`` transfers: m the least power of two with
    ceil(chunks / m) <= cap, so that m divides the 8 slots while m <= 8 (w = 8 / m keeps
    NCCL's chunks in flight exactly); w = 2 beyond (waiting for the previous transfer to
    be done would serialise what NCCL overlaps).

    >>> merged_transfers(32, 32), merged_transfers(128, 32), merged_transfers(100, 32)
    ((1, 8), (4, 2), (4, 2))
    >>> merged_transfers(8192, 32)
    (256, 2)
    """
    m = pow2_up(math.ceil(max(1, chunks) / max(1, cap)))
    return m, max(2, slots // m) if m > 1 else slots


def pow2_up(n: int) -> int:
    """The smallest power of two >= n (NCCL's pow2Up).

    >>> pow2_up(1), pow2_up(24), pow2_up(32)
    (1, 32, 32)
    """
    return 1 << max(0, int(n) - 1).bit_length()


def reverse_bits(x: int, bits: int) -> int:
    """The low ``bits`` bits of ``x`` in reverse order (NCCL's reverseBits, bitops.h:383).

    >>> [reverse_bits(k, 5) for k in range(4)]
    [0, 16, 8, 24]
    """
    out = 0
    for i in range(bits):
        out |= ((x >> i) & 1) << (bits - 1 - i)
    return out


def p2p_rounds(layout: RankLayout, group_size: int = GROUP_SIZE) -> np.ndarray:
    """``send[r, k]``: the peer rank r sends to in round k (NCCL's ncclP2pSchedule,
    init.cc:768-834 at v2.28.7-1); in round k rank r receives from the rank that sends
    to it, ``argwhere(send[:, k] == r)``. Round 0 is every rank itself.

    ``group_size`` is the schedule's group (8 by default), lowered to its gcd with the
    ranks per server. Servers must hold equally many contiguous ranks.

    >>> p2p_rounds(RankLayout(4), 8)[1].tolist()  # rank 1: itself, then +1, +2, +3
    [1, 2, 3, 0]
    >>> p2p_rounds(RankLayout(16), 8)[0].tolist()[:10]  # group offsets 0, 1 of 2 groups
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    p = layout.ranks
    per_server = layout.ranks_per_server() if layout.servers is not None else p
    if per_server is None:
        raise CcsimError("nccl-p2p needs servers of equally many contiguous ranks")
    group = math.gcd(int(group_size), per_server)
    n_groups = p // group
    groups_pow2 = pow2_up(n_groups)
    deltas = []
    offset = walked = 0
    while True:  # quadratic walk over group offsets (init.cc:805-828)
        if offset < n_groups:
            deltas.append(offset)
        walked += 1
        offset = (offset + walked) & (groups_pow2 - 1)
        if walked == groups_pow2:
            break
    ranks = np.arange(p)
    my_group, local = ranks // group, ranks % group
    send = np.empty((p, p), dtype=np.int64)
    k = 0
    # Groups are numbered server by server with contiguous ranks, so group g holds ranks
    # g*G .. g*G + G-1 and a rank's local offset inside it is rank % G.
    for gd in deltas:
        target = (my_group + gd) % n_groups
        for delta in range(group):
            send[:, k] = target * group + (local + delta) % group
            k += 1
    return send


def channel_base(round_: int, channels: int, nodes: int, group_size: int) -> int:
    """First channel of round ``round_`` (NCCL's ncclP2pChannelBaseForRound,
    channel.h:19-31 at v2.28.7-1) among ``channels`` (a power of two).

    >>> [channel_base(k, 32, 1, 8) for k in range(4)]
    [0, 16, 8, 24]
    """
    if nodes > 1:
        base = (round_ // group_size) * -(-group_size // WORKS_PER_BATCH)
        base += (round_ % group_size) // WORKS_PER_BATCH
    else:
        base = round_
    return reverse_bits(base, int(math.log2(channels)))


def part_bytes(nbytes: float, parts: int) -> np.ndarray:
    """Bytes of each of ``parts`` parts (NCCL's ncclP2pPartBounds: parts of
    alignUp(ceil(bytes/parts), 4 KiB), the last ones short or empty).

    >>> part_bytes(10_000, 4).tolist()
    [4096.0, 4096.0, 1808.0, 0.0]
    """
    size = math.ceil(math.ceil(nbytes / parts) / PART_ALIGN) * PART_ALIGN
    begin = np.minimum(np.arange(parts) * size, nbytes)
    end = np.minimum((np.arange(parts) + 1) * size, nbytes)
    return (end - begin).astype(float)


def nccl_p2p_schedule(
    algorithm: str,
    layout: RankLayout,
    size_bytes: float,
    *,
    channels: int,
    p2p_channels: int,
    chunk_bytes: float | None,
    chunks: int,
    group_size: int,
    pxn: bool,
    slots: int = SLOTS,
    max_chunks: int = MAX_CHUNKS,
    max_ops: int = MAX_OPS,
) -> Schedule:
    """The schedule of the module docstring."""
    p, P, C = layout.ranks, channels, p2p_channels
    send = p2p_rounds(layout, group_size)
    servers = np.asarray(layout.servers) if layout.servers is not None else np.zeros(p, int)
    nodes = len(np.unique(servers))
    per_peer = size_bytes / p
    parts = part_bytes(per_peer, P)
    used = parts > 0
    if chunk_bytes is not None:
        wanted = np.ceil(parts / chunk_bytes).astype(int)
    else:
        wanted = np.where(used, chunks, 0)
    # NCCL chunks a part carries per transfer: at most max_chunks transfers per part, and
    # at most max_ops in all; one count m for every part (the largest part's), so that
    # the replay's scaled channel bound (module docstring) is one number.
    cap = max(1, min(max_chunks, max_ops // max(1, p * (p - 1) * int(used.sum()))))
    merge, slots_in_flight = merged_transfers(int(wanted.max(initial=1)), cap, slots)
    transfers = np.where(used, np.ceil(wanted / merge).astype(int), 0)
    window = np.full(len(parts), slots_in_flight, dtype=int)
    buf = OpBuffer()
    channel_of: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    ranks = np.arange(p)
    # Per channel: the current batch's round group and, per rank, the ops that end its
    # works (sends: last chunk, waited for sent; receives: last chunk, waited for done).
    batch_group = np.full(C, -1)
    current: list[list[tuple[np.ndarray, bool]]] = [[] for _ in range(C)]
    previous: list[list[tuple[np.ndarray, bool]]] = [[] for _ in range(C)]
    used_parts = np.flatnonzero(used)
    # Transfers of one round in op order: part by part, chunk by chunk, sender by sender.
    part_of = np.repeat(used_parts, transfers[used_parts])
    chunk_of = np.concatenate([np.arange(transfers[j]) for j in used_parts.tolist()])
    bytes_of = parts[part_of] / transfers[part_of]
    window_of = window[part_of]
    for k in range(p):
        dst = send[:, k]
        senders = ranks[dst != ranks]
        S = len(senders)
        if S == 0:
            continue  # the rank itself: a local copy
        dst = dst[senders]
        path = np.where(servers[senders] != servers[dst], PATH_PXN, PATH_DEFAULT) if pxn else 0
        base = channel_base(k, C, nodes, group_size)
        start = buf.n
        q = np.arange(len(part_of))  # transfer index within the round
        ids = start + q[:, None] * S + np.arange(S)  # (transfers, senders)
        # Chunk c follows chunk c-1 (sent) and waits for chunk c - window (done).
        after_sent = np.where(chunk_of[:, None] > 0, ids - S, NONE)
        after_done = np.where(
            (window_of[:, None] > 0) & (chunk_of[:, None] >= window_of[:, None]),
            ids - window_of[:, None] * S,
            NONE,
        )
        # A part's first chunk waits for the previous batch on its channel of both its
        # sender and its receiver: their sends sent and their receives done.
        firsts = np.flatnonzero(chunk_of == 0)
        columns: list[list[np.ndarray]] = []
        for row, j in zip(firsts.tolist(), part_of[firsts].tolist(), strict=True):
            ch = (base + j) & (C - 1)
            if batch_group[ch] != k // WORKS_PER_BATCH or len(current[ch]) >= 2 * WORKS_PER_BATCH:
                previous[ch], current[ch] = current[ch], []
                batch_group[ch] = k // WORKS_PER_BATCH
            columns.append([table[who] for table, _ in previous[ch] for who in (senders, dst)])
            last = ids[row + transfers[j] - 1]
            last_send = np.full(p, NONE, dtype=np.int64)
            last_recv = np.full(p, NONE, dtype=np.int64)
            last_send[senders] = last
            last_recv[dst] = last
            current[ch] += [(last_send, True), (last_recv, False)]
        width = max((len(c) for c in columns), default=0)
        batch = np.full((len(part_of), S, width), NONE, dtype=np.int64)
        for row, cols in zip(firsts.tolist(), columns, strict=True):
            if cols:
                batch[row, :, : len(cols)] = np.stack(cols, axis=1)
        # Entries alternate sends (sent) and receives (done), two columns each.
        deps = [(after_sent.ravel(), True), (after_done.ravel(), False)]
        deps += [(batch[:, :, m].ravel(), (m // 2) % 2 == 0) for m in range(width)]
        buf.add(
            np.tile(senders, len(q)), np.tile(dst, len(q)), ids.ravel(),
            np.repeat(bytes_of, S), reduce=False, step=k, chunk=np.repeat(chunk_of, S),
            path=np.tile(path, len(q)) if pxn else 0, deps=deps,
        )  # fmt: skip
        channel_of.append(np.repeat((base + part_of) & (C - 1), S))
        owners.append(np.tile(senders * p + dst, len(q)))
    schedule = buf.schedule(
        op="all_to_all",
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.concatenate(owners) if owners else np.zeros(0, int),
        params={
            "chunks": int(transfers.max(initial=0)),
            "channels": P,
            "p2p_channels": C,
            "nccl_chunks_per_transfer": merge,
            # A transfer's channel bound: (w m / 8) steps, its bytes at 8 / w the
            # channel's rate (module docstring).
            "channel_steps": slots_in_flight * merge / slots,
            "channel_rate_scale": slots / slots_in_flight,
        },
    )
    schedule.channel = (
        np.concatenate(channel_of).astype(np.int32) if channel_of else schedule.channel
    )
    return schedule


def works_per_batch(
    layout: RankLayout, channels: int, p2p_channels: int, group_size: int = GROUP_SIZE
) -> float:
    """Mean count of peer works (sends with their receives, the rank's own copy left
    out) that share one channel's batch, over the batches that have any: a channel's
    thread block splits its warps among them (sendrecv.h:103-112 at v2.28.7-1).

    >>> works_per_batch(RankLayout(4), 8, 32), works_per_batch(RankLayout(4), 32, 32)
    (1.0, 3.0)
    """
    p, C = layout.ranks, p2p_channels
    send = p2p_rounds(layout, group_size)
    servers = np.asarray(layout.servers) if layout.servers is not None else np.zeros(p, int)
    nodes = len(np.unique(servers))
    count: dict[tuple[int, int], int] = {}
    for k in range(p):
        if send[0, k] == 0:
            continue  # the rank's own copy
        base = channel_base(k, C, nodes, group_size)
        for j in range(channels):
            key = ((base + j) & (C - 1), k // WORKS_PER_BATCH)
            count[key] = count.get(key, 0) + 1
    return float(np.mean(list(count.values()))) if count else 1.0


def busy_channels(
    layout: RankLayout,
    size_bytes: float,
    channels: int,
    p2p_channels: int,
    group_size: int = GROUP_SIZE,
) -> float:
    """How many of its ``p2p_channels`` channels a rank's sends of an all-to-all of
    ``size_bytes`` per rank keep busy, counted as the channels' bytes over the most any
    one channel carries: each channel is one thread block (moving its works' bytes at
    one rate whatever their count), so the most loaded one sets the time. A peer's
    parts land on channels ``(base(k) + part) & (C-1)`` (device.h:270 at v2.28.7-1);
    the rank's own copy is left out.

    >>> busy_channels(RankLayout(4), 2**28, 8, 32)  # 3 peers x 8 parts, all apart
    24.0
    >>> busy_channels(RankLayout(4), 2**30, 16, 32)  # 48 parts: 16 channels carry two
    24.0
    >>> busy_channels(RankLayout(64), 2**28, 1, 32)  # 63 peers on 32 channels
    31.5
    >>> busy_channels(RankLayout(4), 4 * 4096, 8, 32)  # one 4 KiB part per peer
    3.0
    """
    p, C = layout.ranks, p2p_channels
    send = p2p_rounds(layout, group_size)
    servers = np.asarray(layout.servers) if layout.servers is not None else np.zeros(p, int)
    nodes = len(np.unique(servers))
    parts = part_bytes(size_bytes / p, channels)
    load = np.zeros(C)
    for k in range(p):
        if send[0, k] == 0:
            continue  # the rank's own copy
        base = channel_base(k, C, nodes, group_size)
        np.add.at(load, (base + np.arange(channels)) & (C - 1), parts)
    return float(load.sum() / load.max()) if load.max() > 0 else 0.0


class NcclP2p(Algorithm):
    """All-to-all as NCCL runs grouped send/receive (see the module docstring)."""

    name = "nccl-p2p"
    ops = ("all_to_all",)
    description = (
        "all-to-all as NCCL's grouped send/recv: peers in NCCL's rounds, parts on "
        "channels, chunks through 8 slots, batches of 8 works per channel"
    )

    def build(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        p2p_channels: int | None = None,
        chunk_bytes: float | None = None,
        group_size: int = GROUP_SIZE,
        pxn: bool = False,
        max_chunks: int = MAX_CHUNKS,
    ) -> Schedule:
        """``channels``: NCCL's channels per peer (parts of each message); ``chunks``:
        chunks per part, unless ``chunk_bytes`` (NCCL's chunk) sets them;
        ``p2p_channels``: NCCL's p2pnChannels (a power of two, default the parts'
        pow2Up); ``group_size``: the peer schedule's group; ``pxn``: route messages
        between servers through the receiver's rail; ``max_chunks``: transfers a part
        moves in at most, NCCL's chunks merged beyond (module docstring)."""
        K = check_positive_int(chunks, "chunks")
        P = check_positive_int(channels, "channels")
        C = pow2_up(P) if p2p_channels is None else check_positive_int(p2p_channels, "channels")
        if C & (C - 1) or C < P:
            raise CcsimError(
                f"NCCL's p2p channels must be a power of two >= the channels per peer ({P}), "
                f"got {C}"
            )
        if chunk_bytes is not None and not chunk_bytes > 0:
            raise CcsimError(f"chunk_bytes must be positive, got {chunk_bytes!r}")
        return nccl_p2p_schedule(
            self.name, layout, size_bytes, channels=P, p2p_channels=C,
            chunk_bytes=chunk_bytes, chunks=K, group_size=group_size, pxn=pxn,
            max_chunks=check_positive_int(max_chunks, "max_chunks"),
        )  # fmt: skip
