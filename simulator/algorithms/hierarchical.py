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
from .builder import Fifo, LastWriter, OpBuffer, mesh_phase, replicate_channels, ring_phase
from .schedule import Schedule

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
        intra_blocks = np.broadcast_to(ids[None], (N, g, K, N))  # ring s, position j: row j
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
        intra_blocks = np.broadcast_to(ids.transpose(1, 2, 0)[None], (N, g, K, N))
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
