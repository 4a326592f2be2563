"""Two-level (hierarchical) collectives: rings (or a full mesh) inside servers, rings across.

N servers of g ranks each; rank (s, j) is local rank j of server s. The buffer is cut
into g x N blocks (j, t) of n/(gN) bytes.

All-reduce, three phases:
    1. intra-server reduce-scatter: on each server a ring over its g ranks; local rank
       j ends with block row j (the N blocks (j, ·)) reduced over the server;
    2. inter-server all-reduce of that 1/g of the data: g rings in parallel, ring j over
       the N ranks (·, j) (reduce-scatter then all-gather of blocks (j, t));
    3. intra-server all-gather of the rows.
All-gather: inter-server all-gather among the ranks (·, j) (each gets the N blocks of
its column), then intra-server all-gather of those columns. Reduce-scatter: the mirror,
intra-server reduce-scatter of the columns, then inter-server reduce-scatter.

Closed form with contention-free links (intra: per-hop latency a_i, bandwidth B_i per
rank; inter: a_e, B_e per rank, each of the g rings on its own NIC):
    all-reduce     2(g-1)(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(gN B_e))
    all-gather     (N-1)(a_e + n/(p B_e)) + (g-1)(a_i + n/(g B_i))     (p = gN)
    reduce-scatter (g-1)(a_i + n/(g B_i)) + (N-1)(a_e + n/(p B_e))

A phase's first message from a rank waits for everything the rank received in the
previous phase's last step, as a real implementation sends each step's data as one
message: the phases follow one another (overlapping them is what ``pipelined`` does).

Options: ``chunks`` K cuts every ring step into K chunks sent back to back (as the
ring does), ``channels`` C runs C copies side by side, each on 1/C of the data.
``intra="mesh"`` runs the in-server phases as a direct (full-mesh) exchange instead of a
ring, as HCCL's level0 does on a fully connected server (:func:`mesh_phase
<simulator.algorithms.builder.mesh_phase>`): in the reduce-scatter each rank sends the
part each server peer owns straight to that peer, all g-1 messages at once, and reduces
what it receives; in the all-gather it sends its part to every peer at once. With each
pair of a server on its own link, an in-server phase then takes one step,
a_i + n/(g B_i) with every rank's g-1 links busy together, in place of g-1 ring steps:
    all-reduce     2(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(gN B_e))
    all-gather     (N-1)(a_e + n/(p B_e)) + a_i + n/(g B_i)
and reduce-scatter as all-gather.
:mod:`simulator.algorithms.pipelined` reuses these phases with the data cut into slices.

Ranks need not be numbered server by server; every server must hold the same number
of ranks, and the topology must say which server each GPU is on (``server``).
"""

from __future__ import annotations

import numpy as np

from ..errors import unknown_choice
from .base import Algorithm, RankLayout, check_positive_int
from .builder import (
    NONE,
    Fifo,
    LastWriter,
    OpBuffer,
    mesh_phase,
    replicate_channels,
    ring_phase,
)
from .schedule import PATH_DEFAULT, Merged, Schedule

TWO_LEVEL_OPS = ("all_reduce", "all_gather", "reduce_scatter")

# FIFO streams: the intra-server and the inter-server links are different resources,
# so each rank sends on them independently. A mesh phase sends on one stream per server
# peer, _MESH + the peer's local index.
_INTRA, _INTER, _MESH = 0, 1, 2
#: How the in-server phases run: ``intra`` option values and their phase builders.
INTRA_PHASES = {"ring": ring_phase, "mesh": mesh_phase}


def check_intra(intra: object) -> str:
    """Validate the ``intra`` option of the two-level algorithms."""
    if intra not in INTRA_PHASES:
        raise unknown_choice("in-server phase (intra)", intra, INTRA_PHASES)
    return str(intra)


def server_groups(layout: RankLayout) -> np.ndarray | None:
    """``groups[s, j]``: rank of local index j on server s; None if not a uniform layout.

    >>> server_groups(RankLayout(4, (0, 1, 0, 1))).tolist()
    [[0, 2], [1, 3]]
    """
    if layout.servers is None or len(layout.servers) != layout.ranks:
        return None
    servers = np.asarray(layout.servers)
    members = [np.flatnonzero(servers == s) for s in np.unique(servers)]
    if len({len(m) for m in members}) != 1:
        return None
    return np.array(members, dtype=np.int64)


def across_servers(name: str, layout: RankLayout) -> str | None:
    """Why ``name``, an algorithm that joins servers, cannot run on ``layout``, or None:
    it needs each rank's server, ranks on 2 servers or more, the same number on each.

    >>> across_servers("nvls-tree", RankLayout(4, (0, 0, 0, 0)))
    "nvls-tree joins servers: it needs ranks on 2 servers or more (each GPU's 'server')"
    """
    if layout.servers is None or len(set(layout.servers)) < 2:
        return f"{name} joins servers: it needs ranks on 2 servers or more (each GPU's 'server')"
    return uneven_servers(name, layout)


def uneven_servers(name: str, layout: RankLayout) -> str | None:
    """Why ``name`` cannot run where servers hold different numbers of ranks, or None."""
    if layout.servers is None or server_groups(layout) is not None:
        return None
    counts = np.bincount(np.asarray(layout.servers)).tolist()
    return f"{name} needs the same number of ranks on every server, got {counts}"


class AcrossServers(Algorithm):
    """An all-reduce that joins equal servers (nvls-tree, collnet-direct, collnet-chain):
    one channel from :meth:`one_channel` on :func:`server_groups`, copied per channel,
    with the protocols the library runs it with."""

    ops = ("all_reduce",)
    #: The protocols NCCL runs it with (None: any).
    protocols: tuple[str, ...] | None = None

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        return super().unsupported(op, layout) or across_servers(self.name, layout)

    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        one = self.one_channel(server_groups(layout), size_bytes / C, K)
        schedule = replicate_channels(one, C, size_bytes)
        if self.protocols is not None:
            schedule.params["protocols"] = list(self.protocols)
        return schedule

    @staticmethod
    def one_channel(groups: np.ndarray, size_bytes: float, chunks: int) -> Schedule:
        """One channel's schedule on ``groups[s, j]`` (rank of local index j on server s)."""
        raise NotImplementedError


def two_level_unsupported(algo: Algorithm, op: str, layout: RankLayout) -> str | None:
    """Shared ``unsupported`` of the hierarchical and pipelined algorithms."""
    reason = Algorithm.unsupported(algo, op, layout)
    if reason is not None:
        return reason
    if layout.servers is None:
        return (
            f"{algo.name} needs to know each rank's server; give every GPU node a "
            "'server' attribute"
        )
    return uneven_servers(algo.name, layout)


def two_level_schedule(
    algorithm: str,
    op: str,
    groups: np.ndarray,
    size_bytes: float,
    *,
    slices: int = 1,
    chunks: int = 1,
    intra: str = "ring",
) -> Schedule:
    """One channel of a two-level collective; ``slices`` > 1 pipelines it, ``intra``
    ("ring" or "mesh") says how the in-server phases run.

    With L slices the data is cut into L parts, each running every phase. Each rank
    sends on its intra-server and inter-server links in slice order, so slice i's
    inter-server phase overlaps slice i+1's intra-server phase. For all-reduce, whose
    first and last phases share the intra-server links, a rank's intra-server sends run
    in the order RS(0), RS(1), AG(0), RS(2), AG(1), ...: the all-gather of a slice
    waits behind the next slice's reduce-scatter, which keeps the inter-server rings fed.
    With ``intra="mesh"`` the order is the same on each (rank, peer) stream.
    """
    N, g = groups.shape
    p = N * g
    L, K = slices, chunks
    per_slice = g * N * K
    block_bytes = size_bytes / (L * per_slice)
    fifo = Fifo(p, _MESH + g)
    buf = OpBuffer()
    # The in-server phase builder, its first stream and its number of steps.
    mesh = intra == "mesh"
    intra_phase = INTRA_PHASES[intra]
    intra_stream, intra_steps = (_MESH, min(1, g - 1)) if mesh else (_INTRA, g - 1)

    if op == "all_reduce":
        # Local block id of (row j, column t, chunk k), as ids[j, k, t].
        j, k, t = np.ix_(np.arange(g), np.arange(K), np.arange(N))
        ids = (j * N + t) * K + k
        # Ring s, position j: row j, its N columns side by side, listed from column s on
        # (the order does not change the timing; it makes server s + 1's ops the images
        # of server s's in op order, which the symmetry finder matches them by).
        intra_blocks = ids[:, :, _rotations(N)].transpose(2, 0, 1, 3)
        inter_blocks = ids.transpose(0, 2, 1)[:, :, :, None]  # ring j, position t: block (j, t)
        # Block (j, t) ends its inter-server reduce-scatter on rank (t, j).
        owner = np.broadcast_to(groups.T[:, :, None], (g, N, K)).ravel()
        # Per live slice: its block tracker and the last messages of its latest phase.
        writers: dict[int, LastWriter] = {}
        barrier: dict[int, np.ndarray | None] = {}

        def phase(i: int, build, rings, blocks, reduce: bool, stream: int, step0: int) -> None:
            barrier[i] = build(
                buf, writers[i], fifo, rings, blocks, block_bytes,
                reduce=reduce, stream=stream, segment_base=i * per_slice,
                step0=step0, chunk0=i * K, after=barrier[i],
            )  # fmt: skip

        last = intra_steps + 2 * (N - 1)  # the in-server all-gather's first step
        for i in range(L):
            writers[i], barrier[i] = LastWriter(p, per_slice), None
            phase(i, intra_phase, groups, intra_blocks, True, intra_stream, 0)
            if i >= 1:
                phase(i - 1, intra_phase, groups, intra_blocks, False, intra_stream, last)
                del writers[i - 1], barrier[i - 1]
            phase(i, ring_phase, groups.T, inter_blocks, True, _INTER, intra_steps)
            phase(i, ring_phase, groups.T, inter_blocks, False, _INTER, intra_steps + N - 1)
        phase(L - 1, intra_phase, groups, intra_blocks, False, intra_stream, last)
    else:
        # Local block id of rank (s, j)'s block, chunk k, as ids[s, j, k].
        s, j, k = np.ix_(np.arange(N), np.arange(g), np.arange(K))
        ids = (s * g + j) * K + k
        inter_blocks = ids.transpose(1, 0, 2)[:, :, :, None]  # ring j, position s, chunk k
        intra_blocks = ids.transpose(1, 2, 0)[:, :, _rotations(N)].transpose(2, 0, 1, 3)
        owner = np.repeat(groups.ravel(), K)
        reduce = op == "reduce_scatter"
        in_server = (intra_phase, groups, intra_blocks, intra_stream, intra_steps)
        across = (ring_phase, groups.T, inter_blocks, _INTER, N - 1)
        for i in range(L):
            writer, after, step = LastWriter(p, per_slice), None, 0
            for build, rings, blocks, stream, steps in (
                (in_server, across) if reduce else (across, in_server)
            ):
                after = build(
                    buf, writer, fifo, rings, blocks, block_bytes, reduce=reduce,
                    stream=stream, segment_base=i * per_slice, step0=step, chunk0=i * K,
                    after=after,
                )  # fmt: skip
                step += steps
    return buf.schedule(
        op=op,
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.tile(owner, L),
        params={"servers": N, "ranks_per_server": g, **({"intra": intra} if mesh else {})},
    )


def two_level_quotient(
    algorithm: str, groups: np.ndarray, size_bytes: float, servers: int, *, chunks: int = 1
) -> Schedule:
    """The ops sent by the first ``servers`` servers of one channel of
    :func:`two_level_schedule`'s all-reduce (one slice, rings inside servers), each
    dependency pointing at the op of those servers that stands for it: the same op
    ``servers`` servers (or a multiple) away. Built from closed-form indices, in
    ``servers / N`` of the full schedule's time and memory; equal to
    :func:`simulator.collective.symmetry.schedule_quotient` of the full schedule (a test
    holds it to that, array by array).
    """
    return _two_level_closed_form(algorithm, groups, size_bytes, servers, chunks, False)[0]


def two_level_merged(
    algorithm: str, groups: np.ndarray, size_bytes: float, *, chunks: int = 1
) -> Merged:
    """One channel of :func:`two_level_schedule`'s all-reduce (one slice, rings inside
    servers) with the N blocks that each in-server step moves side by side (a row of
    the buffer, one block per server) merged into one op of weight N
    (:class:`~simulator.algorithms.schedule.Merged`): (g-1) K g N ops per in-server
    phase instead of (g-1) K g N^2, the inter-server phases as they are.

    The members of a merged op have the same dependencies, mapped to merged ops, except
    in the in-server all-gather's first step: there each column waits for the
    inter-server step that completed it on the rank (its own column the reduce-scatter's
    last, the others an all-gather step each) besides the all-gather's last step, which
    every member waits for; the op waits for all of them and each member's own list is
    kept for the runner's check (the last all-gather step comes after the others on the
    same link, so the check holds wherever transfers on one route keep their order).
    Built from closed-form indices; a test holds it, expanded, to the full schedule.
    """
    schedule, members = _two_level_closed_form(
        algorithm, groups, size_bytes, groups.shape[0], chunks, True
    )
    return Merged(schedule, *members)


def _two_level_closed_form(
    algorithm: str, groups: np.ndarray, size_bytes: float, servers: int, chunks: int, merge: bool
) -> tuple[Schedule, tuple]:
    """:func:`two_level_quotient` (``merge`` False: the weights and members are None) or,
    on all ``servers``, :func:`two_level_merged`'s schedule, weights and member lists.

    Each phase below says which op last wrote a block, as :class:`LastWriter` would
    have recorded it: a ring position receives from the one before it, at step ``x``
    block ``i - x - 2`` in a reduce-scatter (its own block at the last step) and block
    ``i - x - 1`` in an all-gather; rows inside servers, columns across them.
    """
    N, g = groups.shape
    S, K = servers, chunks
    p = N * g
    block_bytes = size_bytes / (g * N * K)
    buf = OpBuffer()
    none = NONE
    # Indices as int32 throughout: every op id fits (the buffer keeps dependencies as
    # int32), and the index arrays of millions of ops are what the build holds at peak.
    groups = groups.astype(np.int32)

    def grid(*sizes):
        return [
            a.ravel()
            for a in np.meshgrid(*(np.arange(n, dtype=np.int32) for n in sizes), indexing="ij")
        ]

    # In-server ops per (step, chunk, server, position): N side by side, or one merged.
    W = 1 if merge else N

    def fold(server):  # the representative server of a server index (any integer)
        return np.mod(server, S)

    def add(src, dst, segment, nbytes, *, reduce, step, chunk, deps):
        # Ranks, blocks and labels as int32 in the buffer (as the schedule keeps them):
        # millions of ops, and memory is the limit at scale.
        small = np.int32
        return buf.add(
            np.asarray(src, small), np.asarray(dst, small), np.asarray(segment, small), nbytes,
            reduce=reduce, step=np.asarray(step, small), chunk=np.asarray(chunk, small),
            path=np.int8(PATH_DEFAULT), deps=deps,
        )  # fmt: skip

    # --- index formulas of the four phases' ops, in the order they are added --------
    n_intra = (g - 1) * K * S * g * W  # per in-server phase
    n_inter = (N - 1) * K * g * S  # per inter-server phase
    base_b, base_c = n_intra, n_intra + n_inter
    base_d = n_intra + 2 * n_inter

    def intra_id(base, s, k, q, j, w):
        op = base + (((s * K + k) * S + fold(q)) * g + np.mod(j, g)) * W
        return op if merge else op + np.mod(w, N)

    def inter_id(base, s, k, j, t):
        return base + ((s * K + k) * g + j) * S + fold(t)

    def block(row, col, k):
        return (np.mod(row, g) * N + np.mod(col, N)) * K + k

    # Intra-server phases: (step s, chunk k, server q, position j, width w), column
    # (w + q) mod N as two_level_schedule lists a server's side-by-side blocks.
    s, k, q, j, w = grid(g - 1, K, S, g, W)
    col = w + q
    src, dst = groups[q, j], groups[q, (j + 1) % g]
    # 1. reduce-scatter inside servers: row j - s - 1.
    prev = np.where(s > 0, intra_id(0, s - 1, k, q, j - 1, w), none)
    fifo = np.where(
        k > 0,
        intra_id(0, s, k - 1, q, j, N - 1),
        np.where(s > 0, intra_id(0, s - 1, K - 1, q, j, N - 1), none),
    )
    add(
        src, dst, block(j - s - 1, col, k), block_bytes, reduce=True, step=s, chunk=k,
        deps=[(prev, False), (none, False), (fifo, True)],
    )  # fmt: skip

    # Inter-server phases: (step s, chunk k, ring j, position t).
    s2, k2, r2, t2 = grid(N - 1, K, g, S)
    src2, dst2 = groups[t2, r2], groups[(t2 + 1) % N, r2]
    last_rs = g - 2  # the in-server reduce-scatter's last step
    # 2. reduce-scatter across servers: column t - s - 1 of row j.
    c = t2 - s2 - 1
    into_src = np.where(
        s2 > 0,
        inter_id(base_b, s2 - 1, k2, r2, t2 - 1),
        intra_id(0, last_rs, k2, t2, r2 - 1, c - t2),
    )
    into_dst = intra_id(0, last_rs, k2, t2 + 1, r2 - 1, c - (t2 + 1))
    fifo = np.where(
        k2 > 0,
        inter_id(base_b, s2, k2 - 1, r2, t2),
        np.where(s2 > 0, inter_id(base_b, s2 - 1, K - 1, r2, t2), none),
    )
    # Step 0 also waits for the N blocks of the row the rank has just reduced: added
    # apart (they are the phase's first ops) so that the other steps carry no N columns.
    first = s2 == 0
    after = [
        (intra_id(0, last_rs, k2[first], t2[first], r2[first] - 1, width), False)
        for width in range(W)  # merged: the row is one op
    ]
    for pick, extra in ((first, after), (~first, [])):
        add(
            src2[pick], dst2[pick], block(r2, c, k2)[pick], block_bytes, reduce=True,
            step=g - 1 + s2[pick], chunk=k2[pick],
            deps=[(into_src[pick], False), (into_dst[pick], False), (fifo[pick], True), *extra],
        )  # fmt: skip
    # 3. all-gather across servers: column t - s of row j.
    c = t2 - s2
    into_src = np.where(
        s2 > 0,
        inter_id(base_c, s2 - 1, k2, r2, t2 - 1),
        inter_id(base_b, N - 2, k2, r2, t2 - 1),
    )
    into_dst = np.where(
        s2 > 0,
        inter_id(base_b, s2 - 1, k2, r2, t2),
        intra_id(0, last_rs, k2, t2 + 1, r2 - 1, c - (t2 + 1)),
    )
    fifo = np.where(
        k2 > 0,
        inter_id(base_c, s2, k2 - 1, r2, t2),
        np.where(
            s2 > 0,
            inter_id(base_c, s2 - 1, K - 1, r2, t2),
            inter_id(base_b, N - 2, K - 1, r2, t2),
        ),
    )
    after = np.where(s2 == 0, inter_id(base_b, N - 2, k2, r2, t2 - 1), none)
    add(
        src2, dst2, block(r2, c, k2), block_bytes, reduce=False, step=g - 1 + N - 1 + s2,
        chunk=k2, deps=[(into_src, False), (into_dst, False), (fifo, True), (after, False)],
    )  # fmt: skip

    # 4. all-gather inside servers: row j - s, each column from where it was completed.
    row = j - s
    column = np.mod(col, N)
    own = column == q  # the server's own column was completed by the reduce-scatter
    gathered = np.mod(q - 1 - column, N)  # the all-gather step that brought the column
    into_src = np.where(
        s > 0,
        intra_id(base_d, s - 1, k, q, j - 1, w),
        np.where(
            own,
            inter_id(base_b, N - 2, k, j, q - 1),
            inter_id(base_c, np.minimum(gathered, N - 2), k, j, q - 1),
        ),
    )
    into_dst = np.where(s > 0, intra_id(0, s - 1, k, q, j, w), none)
    fifo = np.where(
        k > 0,
        intra_id(base_d, s, k - 1, q, j, N - 1),
        np.where(
            s > 0,
            intra_id(base_d, s - 1, K - 1, q, j, N - 1),
            intra_id(0, last_rs, K - 1, q, j, N - 1),
        ),
    )
    after = np.where(s == 0, inter_id(base_c, N - 2, k, j, q - 1), none)
    members = (None,) * 5
    if not merge:
        add(
            src, dst, block(row, col, k), block_bytes, reduce=False,
            step=g - 1 + 2 * (N - 1) + s, chunk=k,
            deps=[(into_src, False), (into_dst, False), (fifo, True), (after, False)],
        )  # fmt: skip
    else:
        # Step 0 (its rows come first): each member w (column (w + q) mod N) waits for
        # the inter-server op that completed its column on the rank; the merged op waits
        # for all N of them (the all-gather's last step among them).
        first = s == 0
        completed = [inter_id(base_b, N - 2, k[first], j[first], q[first] - 1)] + [
            inter_id(base_c, step, k[first], j[first], q[first] - 1) for step in range(N - 1)
        ]
        ids = add(
            src[first], dst[first], block(row, col, k)[first], block_bytes, reduce=False,
            step=g - 1 + 2 * (N - 1), chunk=k[first],
            deps=[(fifo[first], True), *((column, False) for column in completed)],
        )  # fmt: skip
        later = ~first
        add(
            src[later], dst[later], block(row, col, k)[later], block_bytes, reduce=False,
            step=g - 1 + 2 * (N - 1) + s[later], chunk=k[later],
            deps=[(into_src[later], False), (into_dst[later], False), (fifo[later], True)],
        )  # fmt: skip
        # Each member's own list: its column's op, the op's FIFO predecessor, the last
        # all-gather step (as the full schedule's op has them, mapped to merged ops).
        width = np.arange(N)
        column = (width[None, :] + q[first][:, None]) % N
        gathered = np.minimum((q[first][:, None] - 1 - column) % N, N - 2)
        own = column == q[first][:, None]
        kk, jj, qq = (a[first][:, None] for a in (k, j, q))
        member_src = np.where(
            own,
            inter_id(base_b, N - 2, kk, jj, qq - 1),
            inter_id(base_c, gathered, kk, jj, qq - 1),
        )
        rows = len(ids) * N
        member_idx = np.stack(
            [
                member_src.ravel(),
                np.repeat(fifo[first], N),
                np.repeat(after[first], N),
            ],
            axis=1,
        ).ravel()
        weight = np.full(buf.n, N, dtype=np.int32)
        weight[base_b:base_d] = 1  # the inter-server ops
        members = (
            weight,
            np.repeat(ids, N).astype(np.int32),
            np.arange(0, 3 * rows + 1, 3, dtype=np.int64),
            member_idx.astype(np.int32),
            np.tile(np.array([False, True, False]), rows),
        )
    owner = np.broadcast_to(groups.T[:, :, None], (g, N, K)).ravel()
    schedule = buf.schedule(
        op="all_reduce",
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=owner,
        params={"servers": N, "ranks_per_server": g},
    )
    return schedule, members


def _rotations(n: int) -> np.ndarray:
    """``rotations[s]`` lists ``0..n-1`` starting from ``s``.

    >>> _rotations(3).tolist()
    [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    """
    return (np.arange(n)[:, None] + np.arange(n)) % n


class Hierarchical(Algorithm):
    """Two-level rings: intra-server, then inter-server on g parallel rings, then intra
    (``intra="mesh"``: the in-server phases as a full-mesh exchange)."""

    name = "hierarchical"
    ops = TWO_LEVEL_OPS
    description = "intra-server ring RS, inter-server ring AR on g parallel rings, intra AG"
    #: Whether ``chunks`` cuts the data into pipeline slices (``pipelined``) rather than
    #: each ring step into chunks.
    slices = False

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        return two_level_unsupported(self, op, layout)

    def build(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        intra: str = "ring",
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        intra = check_intra(intra)
        one = two_level_schedule(
            self.name, op, server_groups(layout), size_bytes / C, intra=intra,
            **({"slices": K} if self.slices else {"chunks": K}),
        )  # fmt: skip
        one.params.update(chunks=K)
        return replicate_channels(one, C, size_bytes)

    def quotient(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        period: int,
        *,
        chunks: int = 1,
        channels: int = 1,
        intra: str = "ring",
        **options,
    ) -> Schedule | None:
        """The all-reduce's ops on the first ``period / g`` servers
        (:func:`two_level_quotient`), for servers numbered rank by rank; None otherwise
        (other operations, the pipelined slices, a mesh inside servers)."""
        groups = server_groups(layout)
        if options or op != "all_reduce" or self.slices or intra != "ring" or groups is None:
            return None
        N, g = groups.shape
        if N < 2 or g < 2 or period % g or N % (period // g) or period >= layout.ranks:
            return None
        if not np.array_equal(groups.ravel(), np.arange(layout.ranks)):
            return None
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        one = two_level_quotient(self.name, groups, size_bytes / C, period // g, chunks=K)
        one.params.update(chunks=K)
        return replicate_channels(one, C, size_bytes)

    def merged(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        intra: str = "ring",
        **options,
    ) -> Merged | None:
        """The all-reduce with each in-server step's side-by-side blocks merged
        (:func:`two_level_merged`); None otherwise (other operations, the pipelined
        slices, a mesh inside servers)."""
        groups = server_groups(layout)
        if options or op != "all_reduce" or self.slices or intra != "ring" or groups is None:
            return None
        N, g = groups.shape
        if N < 2 or g < 2:
            return None
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        if C * 2 * K * g * (N * (g - 1) + N * (N - 1)) >= 2**31:
            return None  # op ids are int32
        one = two_level_merged(self.name, groups, size_bytes / C, chunks=K)
        one.schedule.params.update(chunks=K)
        return replicate_merged(one, C, size_bytes)


def replicate_merged(one: Merged, channels: int, size_bytes: float) -> Merged:
    """:func:`replicate_channels` of a merged one-channel schedule: the copies' ops,
    weights and member lists, copy ``c``'s op ids shifted by ``c`` x its op count."""
    n, listed = one.schedule.n_ops, len(one.member_idx)
    copies = np.arange(channels, dtype=np.int64)[:, None]
    return Merged(
        replicate_channels(one.schedule, channels, size_bytes),
        np.tile(one.weight, channels),
        (one.member_op[None, :] + copies * n).ravel(),
        np.r_[(one.member_ptr[None, :-1] + copies * listed).ravel(), channels * listed],
        (one.member_idx[None, :] + copies * n).ravel(),
        np.tile(one.member_sent, channels),
    )
