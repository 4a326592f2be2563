"""NVLS: collectives reduced and multicast inside the NVSwitch (NVLink SHARP).

On NVSwitch generations with in-switch reduction (H100 and later), rank s owns shard s
(1/p of the buffer). To reduce it, the switch reads shard s from every GPU, adds the
copies up and returns the sum to s (``multimem.ld_reduce``); to share it, s writes it
once and the switch copies it to every GPU (``multimem.st``). So per GPU and per
direction an all-reduce moves n (p + 1) / p bytes, where a ring moves 2 n (p - 1) / p,
and at line rate B its bus bandwidth tends to 2 (p - 1) B / (p + 1) (1.56 B for p = 8).

Schedules express the switch with two route kinds (:data:`~simulator.algorithms.schedule.PATH_UP`
loads only the sender's link into the switch, :data:`~simulator.algorithms.schedule.PATH_DOWN`
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

Across N servers of g GPUs (all-reduce only; as NCCL's NVLS tree does, with rings
between servers): row j (1/g of the buffer) is reduced into local rank j by the switch,
all-reduced by ring j over the ranks (., j) through their NICs, and multicast back to the
server. Blocks are (row j, column t, chunk k), n/(gNK) bytes each; the inter-server ring
runs chunk by chunk, so with K chunks the three phases overlap and the time tends to
the larger load: n(g+1)/(g B) on each NVLink or 2(N-1)/N x n/(g B_nic) on each NIC.

Closed form (link bandwidth B and latency a each way, n bytes, K = 1): all-reduce
4a + 2 (p + 1) n / (p B) (four phases one after another: p n/p up, n/p down, n/p up,
p n/p down); reduce-scatter and all-gather 2a + (p + 1) n / (p B). For large K the
all-reduce tends to (p + 1) n / (p B).
"""

from __future__ import annotations

import numpy as np

from .base import Algorithm, RankLayout, check_positive_int
from .builder import Fifo, LastWriter, OpBuffer, replicate_channels, ring_phase
from .hierarchical import server_groups
from .schedule import PATH_DEFAULT, PATH_DOWN, PATH_UP, Schedule

#: NCCL runs NVLS with the Simple protocol only.
NVLS_PROTOCOLS = ["Simple"]


def nvls_schedule(
    op: str, groups: np.ndarray, size_bytes: float, chunks: int, heads: int | None = None
) -> Schedule:
    """One channel of an NVLS collective on ``groups[s, j]`` (rank of local index j on
    server s); see the module docstring.

    ``heads`` h (an all-reduce in one NVSwitch domain only; default every rank): the
    rows are owned by local ranks ``0..h-1`` alone, 1/h of the buffer each, as NCCL's
    NVLS graph keeps at most NCCL_MAX_NVLS_ARITY = 32 heads (include/device.h:213,
    search.cc:1126-1127 at v2.30.7) and only heads run the reduce-and-multicast warps
    (device/all_reduce.h, ``nvls->headRank != -1``). Every rank's links then carry n each
    way and a head's n/h more: n (h + 1)/h, where every rank a head gives n (p + 1)/p
    (a 72-GPU rack: 33/32 against 73/72).
    """
    N, g = groups.shape
    p, K = N * g, chunks
    h = g if heads is None else min(int(heads), g)
    if h < g and (N > 1 or op != "all_reduce"):
        raise ValueError("nvls heads apply to an all-reduce in one NVSwitch domain only")
    buf = OpBuffer()
    paths: list[np.ndarray] = []
    writer = LastWriter(p, h * N * K)
    # Each rank's sends, one chunk after another on each stream: its reduce-scatter
    # copies into the switch, its all-gather writes into it, and the inter-server ring's
    # reduce-scatter and all-gather.
    fifo = Fifo(p, 4)
    local = np.arange(g)
    # Every (r, j) pair of a local index r and a head j: r's copy of row j goes to j.
    r_all, j_all = np.repeat(local, h), np.tile(np.arange(h), g)

    b = size_bytes / (h * N * K)  # one block: row j, column t (a server), chunk k

    def add(src, dst, block, *, reduce, step, chunk, path, deps):
        ids = buf.add(
            src, dst, block, b, reduce=reduce, step=step, chunk=chunk, deps=deps
        )  # fmt: skip
        paths.append(np.full(len(ids), path, dtype=np.int8))
        return ids

    block = (np.arange(h)[:, None] * N + np.arange(N)[None, :])[:, :, None] * K + np.arange(K)
    heads_of = groups[:, :h]  # each server's heads, in row order
    reduce_first = op in ("all_reduce", "reduce_scatter")
    gather_last = op in ("all_reduce", "all_gather")
    for s in range(N):
        ranks = groups[s]
        for k in range(K):
            for t in range(N):
                ids_of_row = block[:, t, k]  # block (j, t, k) for every row j
                if reduce_first:
                    # Up: every rank sends its copy of row j, the switch adds them up.
                    src, dst = ranks[r_all], ranks[j_all]
                    into = add(
                        src, dst, ids_of_row[j_all], reduce=r_all != j_all, step=0,
                        chunk=k, path=PATH_UP, deps=[(fifo.deps(src, 0), True)],
                    ).reshape(g, h)  # fmt: skip
                    fifo.record(src, into.ravel(), 0)
                    # Down: the sum of row j reaches j's rank once all g copies are up.
                    owners = heads_of[s]
                    down = add(
                        owners, owners, ids_of_row, reduce=False, step=1, chunk=k,
                        path=PATH_DOWN, deps=[(into[r], False) for r in range(g)],
                    )  # fmt: skip
                    writer.record(owners, ids_of_row, down)
    if N > 1:
        # Across servers: ring j over the ranks (·, j) reduce-scatters, then all-gathers,
        # the blocks (j, ·) of row j (each server's sum of it).
        # Chunk by chunk, the reduce-scatter and the all-gather on separate streams, so
        # that chunk k's all-gather (and then its NVLS all-gather) need not wait behind
        # every chunk's reduce-scatter: the intra-server phases, which load the links into
        # (reduce-scatter) and out of (all-gather) the switch, then overlap.
        rings = groups.T
        for k in range(K):
            blocks = block[:, :, k : k + 1, None]  # ring j, position t, this chunk
            for reduce, stream, step0 in ((True, 2, 2), (False, 3, N + 1)):
                ring_phase(
                    buf, writer, fifo, rings, blocks, b, reduce=reduce, stream=stream,
                    step0=step0, chunk0=k,
                )  # fmt: skip
        paths.append(np.full(buf.n - sum(len(x) for x in paths), PATH_DEFAULT, dtype=np.int8))
    if gather_last:
        last = 2 + 2 * (N - 1) if N > 1 else 2
        for s in range(N):
            ranks = groups[s]
            for k in range(K):
                for t in range(N):
                    ids_of_row = block[:, t, k]
                    # Up once: j's rank writes its (reduced) row into the switch.
                    owners = heads_of[s]
                    lifted = add(
                        owners, owners, ids_of_row, reduce=False, step=last, chunk=k,
                        path=PATH_UP, deps=[
                            (fifo.deps(owners, 1), True),
                            (writer.table[owners, ids_of_row], False),
                        ],
                    )  # fmt: skip
                    fifo.record(owners, lifted, 1)
                    # Down to everyone: the switch multicasts row j to the server.
                    add(
                        ranks[j_all], ranks[r_all], ids_of_row[j_all], reduce=False,
                        step=last + 1, chunk=k, path=PATH_DOWN,
                        deps=[(lifted[j_all], False)],
                    )  # fmt: skip
    schedule = buf.schedule(
        op=op,
        algorithm="nvls",
        ranks=p,
        size_bytes=size_bytes,
        # Row j, column t lands (reduce-scatter) or starts (all-gather) on rank (t, j).
        segment_owner=heads_of.T[:, :, None].repeat(K, axis=2).ravel(),
        params={
            "chunks": K, "servers": N, "protocols": list(NVLS_PROTOCOLS),
            **({"heads": h} if h < g else {}),
        },
    )  # fmt: skip
    schedule.path = np.concatenate(paths) if paths else np.zeros(0, dtype=np.int8)
    return schedule


class Nvls(Algorithm):
    """In-switch reduction and multicast (NVLink SHARP) inside one NVSwitch domain."""

    name = "nvls"
    channels_are_copies = True
    ops = ("all_reduce", "reduce_scatter", "all_gather")
    description = (
        "NVLink SHARP: the NVSwitch reduces and multicasts (H100 and later); rings across servers"
    )

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        reason = super().unsupported(op, layout)
        if reason is not None or layout.servers is None or len(set(layout.servers)) == 1:
            return reason
        if op != "all_reduce":
            return "across servers nvls implements all-reduce only"
        if server_groups(layout) is None:
            counts = np.bincount(np.asarray(layout.servers)).tolist()
            return f"nvls across servers needs the same number of ranks on every server: {counts}"
        return None

    def build(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        heads: int | None = None,
    ) -> Schedule:
        """The schedule; ``heads`` (an all-reduce in one NVSwitch domain): NCCL's NVLS
        heads, the ranks that own the rows (default every rank)."""
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        groups = server_groups(layout)
        if groups is None:  # one server (or no server attributes): one NVSwitch domain
            groups = np.arange(layout.ranks)[None, :]
        if heads is not None:
            heads = check_positive_int(heads, "heads")
            if groups.shape[0] > 1 or op != "all_reduce":
                heads = None  # across servers each GPU's ring row has its own head
        one = nvls_schedule(op, groups, size_bytes / C, K, heads)
        schedule = replicate_channels(one, C, size_bytes)
        schedule.params.setdefault("protocols", list(NVLS_PROTOCOLS))
        return schedule
