"""NCCL's Tree all-reduce: a chain inside every server, a double binary tree across them.

N servers of g GPUs, ranks numbered server by server (rank s*g + j is local rank j of
server s). As NCCL v2.30 builds its trees (``src/graph/connect.cc``: ``ncclTopoPreset``
and ``connectTrees``; ``src/graph/trees.cc``: ``ncclGetDtree``):

* inside a server the GPUs form a chain in local rank order, local rank 0 at the top:
  the parent of local rank j > 0 is local rank j-1 of the same server;
* across servers, local rank 0 of each server is the server's node in a binary tree:
  its parent is local rank 0 of the parent server. Tree 0 is ``ncclGetBtree`` over the
  N servers and tree 1 its mirror (N even) or its shift by one (N odd), as
  :func:`simulator.algorithms.tree.double_tree` builds them. Both trees use the same
  chain inside each server (NCCL copies channel c to channel c + nChannels before
  connecting the inter-server trees), so only the inter-server edges differ.

(NCCL's topology search may also pick the "balanced" or "split" tree pattern, in which
the link to one inter-server child or to the parent leaves from local rank 1 instead of
0; this module models the plain pattern, every inter-server edge on local rank 0.)

All-reduce (``runTreeSplit`` in ``src/device/all_reduce.h``): half of the data goes on
each tree (NCCL's channel c on tree 0, channel c + nChannels on tree 1), cut into K
chunks. In each tree every chunk is reduced up to the root (the root server's local
rank 0), then broadcast down the same edges; a rank forwards chunk k up once it has
chunk k from all its children (one in a chain, up to three at a server's local rank 0),
and down once it has it from its parent. Each edge sends its chunks one after another,
and a rank's reduction (to its parent) and broadcast (to its children) run side by side,
so the reduction of later chunks overlaps the broadcast of earlier ones. With one server
this is a pure chain of 2(g-1) hops; with one GPU per server it is the ``tree``
algorithm's double binary tree. Channel c starts every server's chain at local GPU
c mod g (the chain runs j = c, c+1, ... cyclically), as NCCL's tree channels follow the
same channel's ring, so channels spread over the servers' GPUs and NICs.

Every tree edge carries the tree's n/2 bytes once up and once down: 2(p-1)n bytes on
the wire in all (p = gN). ``channels`` C runs C copies side by side, each on n/C.

Closed forms (per-hop latency a, bandwidth B per link and direction, links not shared
by other transfers):

* one server (a chain of D = 2(g-1) hops): the two halves travel the same chain in the
  same direction at the same moments, so every chunk of a hop shares the link with its
  twin of the other tree and takes τ = n/(KB) (two chunks of n/(2K) at B/2 each).
  Chunk k starts hop h (1..D) at (h-1)(a + τ) + kτ, hence
  T = 2(g-1)(a + τ) + (K-1)τ, whatever C (2C flows of n/(2KC) at B/(2C) each);
* one GPU per server: the ``tree`` algorithm's T = 2D(a + τ) + (K-1)τ with
  D = ceil(log2 N), τ = n/(2KB);
* two servers, K = 1, intra-server links (a_i, B_i) and inter-server links (a_e, B_e)
  with a_e + n/(2B_e) >= n/(2B_i): both halves go up every chain together, (g-1)
  hops of a_i + n/B_i; they cross between the servers in opposite directions,
  a_e + n/(2B_e); each root then sends its half down its own chain and across, and the
  other half follows a_e + n/(2B_e) behind on each chain, each hop alone on its link
  (a_i + n/(2B_i)):
  T = (g-1)(a_i + n/B_i) + 2(a_e + n/(2B_e)) + (g-1)(a_i + n/(2B_i)).
"""

from __future__ import annotations

import numpy as np

from .base import Algorithm, RankLayout, check_positive_int
from .builder import OpBuffer, replicate_channels
from .schedule import Schedule
from .tree import _down, _Tree, _up, double_tree


def chain_tree_parents(per_server: int, server_parents: np.ndarray) -> np.ndarray:
    """Parent of every rank (-1 at the root) for the given parents of the servers.

    Local rank j > 0 hangs below local rank j-1 of its server; local rank 0 below local
    rank 0 of the parent server. Two servers of three GPUs, server 0 at the top:

    >>> chain_tree_parents(3, np.array([-1, 0])).tolist()
    [-1, 0, 1, 0, 3, 4]
    """
    g = per_server
    parents = np.arange(len(server_parents) * g, dtype=np.int64) - 1
    heads = np.arange(len(server_parents)) * g
    parents[heads] = np.where(server_parents < 0, -1, server_parents * g)
    return parents


def chain_tree_schedule(
    algorithm: str, servers: int, per_server: int, size_bytes: float, chunks: int
) -> Schedule:
    """One channel of the all-reduce (see the module docstring): tree t carries blocks
    t*K .. t*K + K-1, chunk k of half the data each."""
    N, g, K = servers, per_server, chunks
    trees = [_Tree(chain_tree_parents(g, parents)) for parents in double_tree(N)]
    nbytes = size_bytes / (2 * K)
    buf = OpBuffer()
    ups: list[list[np.ndarray]] = []
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
    owner = np.repeat([tree.root for tree in trees], K)
    return buf.schedule(
        op="all_reduce",
        algorithm=algorithm,
        ranks=N * g,
        size_bytes=size_bytes,
        segment_owner=owner,
        params={"chunks": K, "servers": N, "ranks_per_server": g},
    )


class ChainTree(Algorithm):
    """NCCL's Tree all-reduce: intra-server chains joined by a double binary tree."""

    name = "chain-tree"
    ops = ("all_reduce",)
    description = "NCCL tree all-reduce: a chain in each server, double binary tree across"

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        reason = super().unsupported(op, layout)
        if reason is not None or layout.servers is None:
            return reason  # no server information: all ranks form one chain
        if layout.ranks_per_server() is None:
            servers = np.asarray(layout.servers)
            _, counts = np.unique(servers, return_counts=True)
            if len(servers) != layout.ranks or len(set(counts.tolist())) != 1:
                return (
                    f"{self.name} needs the same number of ranks on every server, "
                    f"got {counts.tolist()}"
                )
            return (
                f"{self.name} needs ranks numbered server by server (the GPUs of a "
                "server on consecutive ranks)"
            )
        return None

    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        g = layout.ranks if layout.servers is None else layout.ranks_per_server()
        servers = layout.ranks // g
        one = chain_tree_schedule(self.name, servers, g, size_bytes / C, K)
        return replicate_channels(one, C, size_bytes, chain_rotations(servers, g, C))


def chain_rotations(servers: int, per_server: int, channels: int) -> np.ndarray:
    """Rank maps that start channel ``c``'s chains at local GPU ``c mod g`` of every
    server, as a ring's channel ``c`` does (:func:`simulator.algorithms.ring.ring_orders`).

    NCCL builds each tree channel's intra-server chain from the ring graph of the same
    channel (``src/graph/connect.cc``, ``ncclTopoPreset`` at v2.30.7), so channels leave
    a server through different GPUs and NICs; every server rotates alike, so the
    inter-server edges join GPUs of one local index (one rail).

    >>> chain_rotations(2, 3, 2).tolist()
    [[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]]
    """
    local = (np.arange(per_server)[None, :] + np.arange(channels)[:, None]) % per_server
    offsets = np.arange(servers)[:, None] * per_server
    return (offsets[None, :, :] + local[:, None, :]).reshape(channels, -1)
