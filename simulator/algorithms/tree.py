"""Double binary tree all-reduce (as NCCL), and binary tree broadcast and reduce.

All-reduce: two binary trees over the p ranks, each carrying half the data, cut into K
chunks. Tree 0 is NCCL's ``ncclGetBtree`` (rank 0 at the top with one child, a rank's
parent found by moving its lowest set bit up); tree 1 is its mirror (rank r plays rank
p-1-r) when p is even and its shift by one (rank r plays rank r-1) when p is odd, so
that most ranks are a leaf in one tree and an inner node in the other. In each tree
every chunk is reduced up to the root, then broadcast down; a rank forwards chunk k up
once it has chunk k from its children, and down once it has it from its parent, and
sends the chunks of each tree edge one after another, so the reduction of later chunks
overlaps the broadcast of earlier ones.

Both trees have depth D = ceil(log2 p). With per-hop latency a, bandwidth B per link
and no two transfers sharing a link at once (e.g. a full mesh for small K), chunk k
crosses hop h (1..2D on the longest root path) starting at (h-1)(a + τ) + kτ with
τ = n/(2KB), hence T = 2D(a + τ) + (K-1)τ = 2D a + (2D + K - 1) n/(2KB). The two trees
share a few rank pairs; on a full mesh they use such a link in the same direction at
hops h1 < h2 of the pipeline, which never overlaps while Kτ <= (h2 - h1)(a + τ).

Broadcast and reduce use tree 0 with ranks relabelled so that the root is rank
``root``: T = D(a + τ) + (K-1)τ with τ = n/(KB).
"""

from __future__ import annotations

import numpy as np

from .base import Algorithm, RankLayout, check_positive_int
from .builder import NONE, OpBuffer, check_root, replicate_channels
from .schedule import Schedule


def btree_parents(p: int) -> np.ndarray:
    """Parent of every rank in NCCL's binary tree (``ncclGetBtree``); -1 at the root.

    >>> btree_parents(8).tolist()
    [-1, 2, 4, 2, 0, 6, 4, 6]
    """
    parents = np.full(p, -1, dtype=np.int64)
    for rank in range(1, p):
        bit = 1
        while bit < p and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        parents[rank] = up if up < p else rank ^ bit
    return parents


def double_tree(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents in NCCL's two trees (``ncclGetDtree``): mirrored for even p, shifted for odd."""
    first = btree_parents(p)
    ranks = np.arange(p)
    if p % 2:
        up = first[(ranks - 1) % p]
        second = np.where(up < 0, -1, (up + 1) % p)
    else:
        up = first[p - 1 - ranks]
        second = np.where(up < 0, -1, p - 1 - up)
    return first, second


def tree_depth(parents: np.ndarray) -> int:
    """Largest number of hops from a rank to the root."""
    depth = np.zeros(len(parents), dtype=np.int64)
    at = parents.copy()
    while (at >= 0).any():
        depth += at >= 0
        at = np.where(at >= 0, parents[np.maximum(at, 0)], -1)
    return int(depth.max())


class _Tree:
    """One tree's edges as arrays: the non-root ranks, their parents, their children.

    ``children[r]`` lists rank r's children, padded with -1 (two in a binary tree; in
    chain-tree a server's local rank 0 may have three: the next GPU of its chain and two
    servers below it). ``parents`` may describe a forest (several ranks with parent -1,
    e.g. one tree per row of heads in nvls-tree, where the other ranks stand alone):
    ``root`` is then the first root, and ``is_root`` marks them all.
    """

    def __init__(self, parents: np.ndarray):
        p = len(parents)
        self.parents = parents
        self.is_root = parents < 0
        self.root = int(np.flatnonzero(self.is_root)[0])
        self.nodes = np.flatnonzero(parents >= 0)  # op order within a batch
        self.index = np.full(p, -1, dtype=np.int64)
        self.index[self.nodes] = np.arange(len(self.nodes))
        arity = max(1, int(np.bincount(parents[self.nodes], minlength=p).max(initial=0)))
        self.children = np.full((p, arity), -1, dtype=np.int64)
        filled = np.zeros(p, dtype=np.int64)
        for node in self.nodes.tolist():
            parent = parents[node]
            self.children[parent, filled[parent]] = node
            filled[parent] += 1

    def child_ops(self, ranks: np.ndarray, up: np.ndarray) -> list[np.ndarray]:
        """For each rank, the ops (of an up batch ``up``) that bring its children's data."""
        kids = self.children[ranks]
        up = np.append(up, NONE)  # index -1 (no such child) reads NONE, even with no nodes
        return [
            np.where(kids[:, c] >= 0, up[self.index[np.maximum(kids[:, c], 0)]], NONE)
            for c in range(kids.shape[1])
        ]


def _blocks(segment: int | np.ndarray, ranks: np.ndarray) -> int | np.ndarray:
    """The block each of ``ranks`` handles: one for all, or ``segment[rank]``."""
    return segment if np.ndim(segment) == 0 else np.asarray(segment)[ranks]


def _up(
    buf: OpBuffer,
    tree: _Tree,
    segment: int | np.ndarray,
    nbytes: float,
    k: int,
    previous,
    ready: np.ndarray | None = None,
) -> np.ndarray:
    """Chunk ``k`` reduced one level up: every non-root rank to its parent, once the
    rank has the chunk from all its children, after its previous chunk left.

    ``segment`` is the block (or, per rank, the block each rank sends); ``ready[r]``,
    if given, is an op that must be done before rank r's own copy may leave (the op that
    reduced it inside its server, in nvls-tree), :data:`NONE` for none.
    """
    nodes = tree.nodes
    ids = buf.n + np.arange(len(nodes))
    deps = [(ops, False) for ops in tree.child_ops(nodes, ids)]
    deps.append((NONE if previous is None else previous, True))
    if ready is not None:
        deps.append((ready[nodes], False))
    buf.add(
        nodes, tree.parents[nodes], _blocks(segment, nodes), nbytes, reduce=True, step=0,
        chunk=k, deps=deps,
    )  # fmt: skip
    return ids


def _down(
    buf: OpBuffer,
    tree: _Tree,
    segment: int | np.ndarray,
    nbytes: float,
    k: int,
    previous,
    up,
    ready: np.ndarray | None = None,
) -> np.ndarray:
    """Chunk ``k`` broadcast one level down: every parent to each child, once the parent
    has the chunk from its parent. With ``up`` (the chunk's reduction ops, in an
    all-reduce) a root first waits for its children's data, and with ``ready`` (as in
    :func:`_up`) for ``ready[root]``."""
    nodes = tree.nodes
    ids = buf.n + np.arange(len(nodes))
    parents = tree.parents[nodes]
    from_root = tree.is_root[parents]
    via_parent = np.where(from_root, NONE, ids[tree.index[np.maximum(parents, 0)]])
    deps = [(via_parent, False), (NONE if previous is None else previous, True)]
    if up is not None:
        root_ops = tree.child_ops(parents, up)
        deps += [(np.where(from_root, ops, NONE), False) for ops in root_ops]
    if ready is not None:
        deps.append((np.where(from_root, ready[parents], NONE), False))
    buf.add(
        parents, nodes, _blocks(segment, nodes), nbytes, reduce=False, step=1, chunk=k,
        deps=deps,
    )  # fmt: skip
    return ids


def tree_schedule(
    algorithm: str, op: str, ranks: int, size_bytes: float, chunks: int, root: int = 0
) -> Schedule:
    """One channel of a tree collective (see the module docstring)."""
    p, K = ranks, chunks
    buf = OpBuffer()
    if op == "all_reduce":
        trees = [_Tree(parents) for parents in double_tree(p)]
        nbytes = size_bytes / (2 * K)
        ups = []
        for t, tree in enumerate(trees):
            previous = None
            ups.append([])
            for k in range(K):
                previous = _up(buf, tree, t * K + k, nbytes, k, previous)
                ups[t].append(previous)
        for t, tree in enumerate(trees):
            previous = None
            for k in range(K):
                previous = _down(buf, tree, t * K + k, nbytes, k, previous, ups[t][k])
        owner = np.full(2 * K, -1)
        owner[:K], owner[K:] = trees[0].root, trees[1].root
    else:
        first = btree_parents(p)
        relabelled = (np.arange(p) - root) % p  # rank r plays rank r - root of tree 0
        up = first[relabelled]
        tree = _Tree(np.where(up < 0, -1, (up + root) % p))
        previous = None
        for k in range(K):
            if op == "reduce":
                previous = _up(buf, tree, k, size_bytes / K, k, previous)
            else:
                previous = _down(buf, tree, k, size_bytes / K, k, previous, None)
        owner = np.full(K, root)
    return buf.schedule(
        op=op,
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=owner,
        params={"chunks": K},
    )


class Tree(Algorithm):
    """Double binary tree all-reduce; binary tree broadcast and reduce; pipelined."""

    name = "tree"
    ops = ("all_reduce", "broadcast", "reduce")
    description = "double binary tree all-reduce (NCCL), tree broadcast/reduce, over chunks"

    def build(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        root: int = 0,
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        root = check_root(root, layout.ranks)
        one = tree_schedule(self.name, op, layout.ranks, size_bytes / C, K, root)
        if op == "all_reduce":
            one.params.pop("root", None)
        else:
            one.params["root"] = root
        return replicate_channels(one, C, size_bytes)
