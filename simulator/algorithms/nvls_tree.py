"""NCCL's NVLS-tree all-reduce: NVLink SHARP inside each server, a double binary tree
across servers.

N servers of g GPUs; rank (s, j) is local rank j of server s. As NCCL v2.30 runs it
(``src/device/all_reduce.h``, ``RunWorkColl<..., NCCL_ALGO_NVLS_TREE, ...>``, and
``src/graph/connect.cc``, ``connectNvls``):

* every server has *heads*, one per NIC (the GPU next to it: the NVLS search keeps one
  head per NIC, ``src/graph/search.cc``); each head reduces and shares 1/heads of every
  chunk. Here every GPU has its own NIC (as in a DGX), so head j is local rank j and
  handles *row* j, 1/g of the buffer;
* inside the server, every GPU writes its copy of row j into the NVSwitch, which adds
  the g copies up and hands the sum to head j (``multimem.ld_reduce``: the "scatter"
  and "reduce" warps);
* across servers, the heads of row j (one per server) form a binary tree: head (s, j)
  reduces the sums of its children (``treeDown``) into its own and sends the result to
  its parent (``treeUp``); the root then sends the total back down the same edges.
  The trees are ``ncclGetDtree`` over the servers; NCCL puts channel c on tree c % 2, so
  half the data takes each tree: here each row is cut into two halves, one per tree;
* every head writes its row's total into the NVSwitch once, which multicasts it to the
  server (``multimem.st``: the "broadcast" and "gather" warps).

NCCL enables NVLS-tree from 2 nodes (``src/graph/tuning.cc`` disables it on one, where
NVLS runs), and so does the registry: on one server this schedule would be ``nvls``.

``chunks`` K cuts every half-row into K blocks (n/(2gK) bytes); each chunk flows
through the four phases as soon as it can, so with many chunks they overlap. Each GPU
sends its NVSwitch writes one chunk after another, and each head its tree messages (per
tree and direction). ``channels`` C runs C copies side by side, each on n/C.

Loads per GPU and direction (no latency), as NVLS on one server: every GPU's link into
the NVSwitch carries n (its copy of every row) plus n/g (its row's total, once), and the
link out carries n/g (its row's sum) plus n (every row's total): n(g+1)/g each way. A
head's NIC carries n/(2g) each way per tree edge at its server (up to its parent, down
to each child), e_s edges in both trees: e_s n/(2g). ``ncclGetDtree`` gives every server
one edge per tree for N = 2 (e = 2, n/g), at most 3 for N = 3 and 4 for N >= 4 (a server
is an inner node with two children in one tree and a leaf in the other). With K large,
the time tends to the larger of the two: max(n(g+1)/(g B_nvlink), max_s e_s n/(2g B_nic)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from ..errors import CcsimError
from .base import RankLayout, check_positive_int
from .builder import NONE, Fifo, OpBuffer, replicate_channels
from .hierarchical import AcrossServers, replicate_merged, server_groups
from .in_switch import into_switch, out_of_switch
from .nvls import NVLS_PROTOCOLS
from .schedule import PATH_DOWN, PATH_UP, Merged, Schedule
from .tree import _down, _Tree, _up, double_tree

# FIFO streams of each GPU: its copies into the NVSwitch (reduction), its row's total
# into the NVSwitch (multicast).
_REDUCE, _MULTICAST = 0, 1


def head_trees(groups: np.ndarray, heads: int | None = None) -> list[_Tree]:
    """The two inter-server trees as forests over all ranks: in tree t, head (s, j) hangs
    below head (parent_t(s), j), so row j's heads form one tree; the heads are local
    ranks ``0..heads-1`` (default every one), the other ranks stand alone.

    Two servers of two GPUs (ranks s*2 + j): tree 0 has server 0 on top, tree 1 server 1.

    >>> [tree.parents.tolist() for tree in head_trees(np.array([[0, 1], [2, 3]]))]
    [[-1, -1, 0, 1], [2, 3, -1, -1]]
    >>> [tree.parents.tolist() for tree in head_trees(np.array([[0, 1], [2, 3]]), 1)]
    [[-1, -1, 0, -1], [2, -1, -1, -1]]
    """
    N, g = groups.shape
    columns = groups[:, : g if heads is None else heads]
    forests = []
    for server_parents in double_tree(N):
        parents = np.full(N * g, -1, dtype=np.int64)
        below = server_parents >= 0
        parents[columns[below]] = columns[server_parents[below]]
        forests.append(_Tree(parents))
    return forests


def nvls_tree_schedule(
    groups: np.ndarray,
    size_bytes: float,
    chunks: int,
    heads: int | None = None,
    *,
    head_ranks: Sequence[int] | None = None,
    merged: bool = False,
) -> Schedule | Merged:
    """One channel of the all-reduce on ``groups[s, j]`` (see the module docstring), with
    ``heads`` h heads a server (local ranks ``0..h-1``; default every GPU): NCCL's NVLS
    search keeps at most NCCL_MAX_NVLS_ARITY = 32 heads, one per NIC (include/device.h:213,
    graph/search.cc:1126-1127 at v2.30.7), so on a 72-GPU NVL72 rack 40 GPUs only write
    their copies into the switch and take the totals it multicasts, and 32 NICs carry
    the trees. ``head_ranks`` names the heads' local ranks instead (head j is the j-th
    listed, in every server): NCCL pairs each NIC with the first GPU next to it, so a
    server of 8 GPUs with one NIC for every two has heads 0, 2, 4 and 6 (the "NVLS Head"
    lines of the 2 x 8 H100, 4-NIC log in NVIDIA/nccl#1357), not 0-3, which share two NICs.

    Block (j, t, k) is chunk k of tree t's half of row j: id (2j + t)K + k. A GPU's
    copies into the switch are listed GPU by GPU (the rows it does not own, then its
    own row's two halves), and so are the totals the switch multicasts to it.

    ``merged`` returns the schedule with those side-by-side transfers merged
    (:class:`~simulator.algorithms.schedule.Merged`): on every chunk each GPU's copies
    of the rows it does not own become one op (of weight 2(h - 1), or 2h on a GPU that
    owns no row), its own row's copies another (weight 2), and the h totals of each
    half the switch writes to it one more (two, weight h). A transfer into the switch
    is routed by its sender alone and one out of it by its receiver alone
    (:func:`~simulator.collective.replay.route_pairs`), so the members of each op share
    their route, bytes and labels; they differ only in the rank at the switch's end
    (the row's head), which only a GPU reducer of finite bandwidth would use
    (:func:`~simulator.collective.run.run_merged` then runs the full schedule). A
    multicast op waits for every head's total of its half; each member's own total is
    listed (``member_*``), as the runner's check needs. The rows are symmetric (every
    row's tree has the same shape, on its own heads and NICs), so a GPU's copies of one
    chunk, and the totals of one half across heads, keep equal times; the runner
    checks it.
    """
    N, g = groups.shape
    h = g if heads is None else min(int(heads), g)
    if head_ranks is not None:
        # The heads' local ranks first: head j is then column j of every server.
        first = [int(r) for r in head_ranks]
        if len(set(first)) != len(first) or not all(0 <= r < g for r in first) or not first:
            raise CcsimError(
                f"nvls-tree: head_ranks {list(head_ranks)} must be distinct local ranks 0..{g - 1}"
            )
        groups = groups[:, first + [c for c in range(g) if c not in set(first)]]
        h = len(first)
    p, K = N * g, chunks
    b = size_bytes / (2 * h * K)
    buf = OpBuffer()
    fifo = Fifo(p, 2)
    trees = head_trees(groups, h)
    local = np.zeros(p, dtype=np.int64)
    local[groups[:, :h]] = np.arange(h)[None, :]  # each head's row (others: unused)
    owners = groups[:, :h].ravel()
    # Row order of each local GPU m's copies: the rows it does not own, then its own.
    order = np.argsort(np.arange(h)[None, :] == np.arange(g)[:, None], axis=1, kind="stable")
    place = np.argsort(order, axis=1)  # position of row j in GPU m's list
    own = np.arange(g) < h  # GPUs that own a row (the heads)
    s_ix = np.arange(N)[:, None, None, None]
    m_ix = np.arange(g)[None, :, None, None]
    j_ix = np.arange(h)[None, None, :, None]
    t_ix = np.arange(2)[None, None, None, :]
    weight: list[tuple[np.ndarray, np.ndarray]] = []  # (merged op ids, weights)
    members: list[tuple[np.ndarray, np.ndarray]] = []  # (merged op, own dependency)
    previous_up: list = [None, None]
    previous_down: list = [None, None]
    for k in range(K):
        # The NVSwitch adds up each row's copies (both halves) and hands the sum to its
        # head. into[s h + j, m, t]: GPU m's copy of half t of row j.
        last = fifo.deps(groups, _REDUCE)  # (N, g): each GPU's previous copy
        if merged:
            into = _merged_copies(buf, groups, h, order, own, last, b, k, K, weight)
        else:
            rows_m = order[None, :, :, None]  # (1, g, h, 1): the row at each place
            shape = (N, g, h, 2)
            ids = buf.add(
                np.broadcast_to(groups[:, :, None, None], shape).ravel(),
                np.broadcast_to(groups[s_ix[..., 0], rows_m[..., 0]][..., None], shape).ravel(),
                np.broadcast_to((2 * rows_m + t_ix) * K + k, shape).ravel(),
                b,
                reduce=np.broadcast_to(rows_m != m_ix, shape).ravel(),
                step=0, chunk=k, path=PATH_UP,
                deps=[(np.broadcast_to(last[:, :, None, None], shape).ravel(), True)],
            ).reshape(shape)  # fmt: skip
            # ids[s, m, place, t] -> into[s h + j, m, t]
            into = ids[s_ix, m_ix, place[None, :, :, None], t_ix]
            into = into.transpose(0, 2, 1, 3).reshape(N * h, g, 2)
        # Each GPU's next copies wait for this chunk's (as listed: its own row's last).
        fifo.record(groups.ravel(), into.reshape(N, h, g, 2)[:, h - 1, :, 0].ravel(), _REDUCE)
        blocks = (2 * np.tile(np.arange(h), N)[:, None] + np.arange(2)) * K + k
        summed = out_of_switch(
            buf, owners, owners[:, None], blocks, b, path=PATH_DOWN, step=1, chunk=k,
            after=into,
        )  # fmt: skip
        totals = []  # dependency columns of each head's total, per half
        for t, tree in enumerate(trees):
            ready = np.full(p, NONE, dtype=np.int64)
            ready[owners] = summed[:, 0, t]
            segment = (2 * local + t) * K + k
            up = previous_up[t] = _up(buf, tree, segment, b, k, previous_up[t], ready=ready)
            down = previous_down[t] = _down(
                buf, tree, segment, b, k, previous_down[t], up, ready=ready
            )  # fmt: skip
            # Each head's total: from its parent, or (at a root) its own sum and its
            # children's.
            from_parent = np.full(p, NONE, dtype=np.int64)
            from_parent[tree.nodes] = down
            roots = tree.is_root[owners]
            columns = [from_parent[owners], ready[owners]]
            columns += [np.where(roots, ops, NONE) for ops in tree.child_ops(owners, up)]
            for ops in columns:
                half = np.full((len(owners), 1, 2), NONE, dtype=np.int64)
                half[:, 0, t] = ops
                totals.append((half, False))
        # Each head writes its row's total (both halves) into the NVSwitch once, which
        # multicasts it to the server.
        lifted = into_switch(
            buf, owners[:, None], owners, blocks, b, path=PATH_UP, step=2, chunk=k,
            deps=[(fifo.deps(owners, _MULTICAST)[:, None, None], True), *totals],
        )  # fmt: skip
        fifo.record(owners, lifted[:, 0, 0], _MULTICAST)
        # The totals the switch writes to each GPU m: row j's half t from head (s, j).
        total = lifted.reshape(N, h, 2)  # total[s, j, t]
        if merged:
            _merged_totals(buf, groups, h, total, b, k, K, weight, members)
        else:
            # Listed GPU by GPU, half by half: (s, m, t, j).
            shape = (N, g, 2, h)
            rows, halves = j_ix.transpose(0, 1, 3, 2), t_ix.transpose(0, 1, 3, 2)
            heads_of = groups[s_ix[..., 0], rows[..., 0, :]][:, :, None, :]
            buf.add(
                np.broadcast_to(heads_of, shape).ravel(),
                np.broadcast_to(groups[:, :, None, None], shape).ravel(),
                np.broadcast_to((2 * rows + halves) * K + k, shape).ravel(),
                b, reduce=False, step=3, chunk=k, path=PATH_DOWN,
                deps=[(np.broadcast_to(total.transpose(0, 2, 1)[:, None], shape).ravel(), False)],
            )  # fmt: skip
    # Block (j, t, k) is totalled at the head of row j on the root server of tree t.
    root_heads = np.stack(
        [groups[np.flatnonzero(tree.is_root[groups[:, 0]])[0], :h] for tree in trees]
    )
    schedule = buf.schedule(
        op="all_reduce",
        algorithm="nvls-tree",
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=root_heads.T[:, :, None].repeat(K, axis=2).ravel(),
        params={
            "chunks": K,
            "servers": N,
            "ranks_per_server": g,
            **({"heads": h} if h < g else {}),
        },
    )
    if not merged:
        return schedule
    weights = np.ones(schedule.n_ops, dtype=np.int64)
    for ids, values in weight:
        weights[ids] = values
    member_op = np.concatenate([ops for ops, _ in members])
    return Merged(
        schedule,
        weights,
        member_op,
        np.arange(len(member_op) + 1, dtype=np.int64),
        np.concatenate([deps for _, deps in members]),
        np.zeros(len(member_op), dtype=bool),
    )


def _merged_copies(
    buf: OpBuffer,
    groups: np.ndarray,
    h: int,
    order: np.ndarray,
    own: np.ndarray,
    last: np.ndarray,
    b: float,
    k: int,
    K: int,
    weight: list,
) -> np.ndarray:
    """Chunk ``k``'s copies into the switch, merged (see :func:`nvls_tree_schedule`):
    per GPU (s, m) one op for the rows it does not own, then one for its own row; returns
    ``into[s h + j, m, t]``, the merged op that holds each copy."""
    N, g = groups.shape
    others = h - own  # rows each local GPU does not own
    # Slots (s, m, 0) = the other rows, (s, m, 1) = its own row, where there are any.
    exists = np.stack([others > 0, own], axis=1)  # (g, 2)
    first = order[:, 0]  # the first row each GPU lists
    dst_local = np.stack([first, np.arange(g)], axis=1)  # (g, 2)
    slot = np.broadcast_to(exists, (N, g, 2))
    src = np.broadcast_to(groups[:, :, None], (N, g, 2))[slot]
    dst = groups[np.arange(N)[:, None, None], np.minimum(dst_local, h - 1)[None]][slot]
    row = np.broadcast_to(np.minimum(dst_local, h - 1)[None], (N, g, 2))[slot]
    ids = buf.add(
        src, dst, 2 * row * K + k, b,
        reduce=np.broadcast_to(np.array([True, False]), (N, g, 2))[slot],
        step=0, chunk=k, path=PATH_UP,
        deps=[(np.broadcast_to(last[:, :, None], (N, g, 2))[slot], True)],
    )  # fmt: skip
    weights = np.broadcast_to(np.stack([2 * others, 2 * own], axis=1), (N, g, 2))[slot]
    weight.append((ids, weights))
    held = np.full((N, g, 2), NONE, dtype=np.int64)
    held[slot] = ids
    # Copy (j, m): the own-row op when j == m, else the other-rows op.
    mine = np.arange(h)[:, None] == np.arange(g)[None, :]  # (h, g)
    into = np.where(mine[None, :, :], held[:, None, :, 1], held[:, None, :, 0])  # (N, h, g)
    return np.repeat(into.reshape(N * h, g)[:, :, None], 2, axis=2)


def _merged_totals(
    buf: OpBuffer,
    groups: np.ndarray,
    h: int,
    total: np.ndarray,
    b: float,
    k: int,
    K: int,
    weight: list,
    members: list,
) -> None:
    """Chunk ``k``'s multicast of the totals, merged: one op per GPU (s, m) and half t
    standing for the h transfers of row j's half t from head (s, j), waiting for every
    head's total of that half (the two halves come down different trees, so at
    different times); each member's own total (``total[s, j, t]``) is recorded in
    ``members``."""
    N, g = groups.shape
    shape = (N, g, 2)
    ids = buf.add(
        np.broadcast_to(groups[:, :1, None], shape).ravel(),
        np.broadcast_to(groups[:, :, None], shape).ravel(),
        np.broadcast_to(np.arange(2) * K + k, shape).ravel(),
        b, reduce=False, step=3, chunk=k, path=PATH_DOWN,
        deps=[
            (np.broadcast_to(total[:, None, j, :], shape).ravel(), False) for j in range(h)
        ],
    )  # fmt: skip
    weight.append((ids, np.full(len(ids), h)))
    # Members in the full schedule's order (s, m, t, j).
    members.append(
        (
            np.repeat(ids, h),
            np.broadcast_to(total.transpose(0, 2, 1)[:, None], (N, g, 2, h)).ravel(),
        )
    )


class NvlsTree(AcrossServers):
    """NCCL's NVLS-tree: in-NVSwitch reduction and multicast, a double binary tree across."""

    name = "nvls-tree"
    channels_are_copies = True
    description = (
        "NCCL NVLS-tree all-reduce: NVSwitch reduces and multicasts, double binary tree across"
    )
    protocols = tuple(NVLS_PROTOCOLS)
    one_channel = staticmethod(nvls_tree_schedule)

    def build(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        heads: int | None = None,
        head_ranks: Sequence[int] | None = None,
    ) -> Schedule:
        """As :class:`~simulator.algorithms.hierarchical.AcrossServers` builds it, with
        ``heads`` heads a server (default every GPU; NCCL's are at most 32), or the heads'
        local ranks ``head_ranks`` (NCCL's: the first GPU next to each NIC)."""
        if heads is None and head_ranks is None:
            return super().build(op, layout, size_bytes, chunks=chunks, channels=channels)
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        h = None if heads is None else check_positive_int(heads, "heads")
        one = nvls_tree_schedule(server_groups(layout), size_bytes / C, K, h, head_ranks=head_ranks)
        schedule = replicate_channels(cast(Schedule, one), C, size_bytes)
        schedule.params["protocols"] = list(self.protocols)
        return schedule

    def merged(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        heads: int | None = None,
        head_ranks: Sequence[int] | None = None,
        **options,
    ) -> Merged | None:
        """:meth:`build`'s schedule with each GPU's side-by-side transfers into and out
        of the switch merged (``nvls_tree_schedule(..., merged=True)``); None for other
        options.

        Two servers of 8 GPUs, 4 heads, 2 chunks: per chunk and server 8 x 4 x 2 copies
        in and as many totals out, 8 sums and 8 lifts, and 16 tree transfers per chunk
        (4 rows x 2 trees, up and down): 2 x (2 x 144 + 16) = 608 ops. Merged, each GPU
        has one op of others' rows, each head one of its own, each GPU two of totals:
        2 x (2 x (12 + 16 + 16) + 16) = 208.

        >>> layout = RankLayout(16, tuple([0] * 8 + [1] * 8))
        >>> merged = NvlsTree().merged("all_reduce", layout, 1e6, chunks=2, heads=4)
        >>> merged.full_ops, merged.schedule.n_ops
        (608, 208)
        """
        groups = server_groups(layout)
        if options or op != "all_reduce" or groups is None or groups.shape[0] < 2:
            return None
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        h = None if heads is None else check_positive_int(heads, "heads")
        one = cast(
            Merged,
            nvls_tree_schedule(groups, size_bytes / C, K, h, head_ranks=head_ranks, merged=True),
        )
        merged = replicate_merged(one, C, size_bytes)
        merged.schedule.params["protocols"] = list(self.protocols)
        return merged
