"""NCCL's CollNet all-reduces: the fabric's switches reduce across servers (SHARP).

N servers of g GPUs; rank (s, j) is local rank j of server s. Every server has *heads*,
one per NIC (NCCL's CollNet search keeps the GPU next to each NIC, ``src/graph/search.cc``
at v2.30.7); here every GPU has its own NIC (as in a DGX), so head j is local rank j and
handles *row* j, 1/g of the buffer. Across servers the heads of row j hand their row to
the fabric, whose switches add the N copies up and send the total back to every one of
them (SHARP, NCCL's CollNet plugin): ops into and out of the fabric's reducing switch
(:mod:`simulator.algorithms.in_switch`), which needs a fabric with ``sharp: true``.

``collnet-direct`` (``RunWorkColl<..., NCCL_ALGO_COLLNET_DIRECT, ...>`` in
``src/device/all_reduce.h``; ``connectCollNet`` in ``src/graph/connect.cc``):

1. every GPU sends row j of its buffer to head j over NVLink, which reduces the g-1
   copies into its own ("scatter" and "reduce" warps);
2. head j sends the server's sum of row j into the fabric and gets the total back;
3. head j sends the total to the g-1 other GPUs of its server ("broadcast" warps).

``collnet-chain`` (``RunWorkColl<..., NCCL_ALGO_COLLNET_CHAIN, ...>``;
``collnetChain.up/down`` in ``connect.cc``): every channel runs a chain through all the
GPUs of the server, from its head (``up`` is the network) to the last GPU; the data goes
up the chain, each GPU adding its own copy, into the fabric from the head, and back down
the chain. NCCL's channels start their chains at different NICs; here row j takes the
chain j, j+1, ..., j-1 (mod g), so every NIC carries one row.

``chunks`` K cuts every row into K blocks (n/(gK) bytes) that flow through the phases
one after another, so with many chunks they overlap; ``channels`` C runs C copies side
by side, each on n/C.

Loads per GPU and direction, both algorithms: over NVLink, (g-1) n/g out to the heads
(or up the chains) and (g-1) n/g back (n/g to each of g-1 peers, or down the chains):
2(g-1) n/g; through each head's NIC, n/g into the fabric and n/g back. With K large and
no latency, on an NVSwitch of per-GPU bandwidth B_v and NICs of B_n, the time tends to
max(2(g-1) n/(g B_v), n/(g B_n)).
"""

from __future__ import annotations

import numpy as np

from .builder import NONE, Fifo, OpBuffer
from .hierarchical import AcrossServers
from .in_switch import into_switch, out_of_switch
from .schedule import PATH_SHARP_DOWN, PATH_SHARP_UP, Schedule
from .tree import _down, _Tree, _up

#: NCCL runs CollNet with the Simple protocol only (src/graph/tuning.cc:338-339 at v2.30.7).
COLLNET_PROTOCOLS = ("Simple",)

# FIFO streams of each GPU: its sends to the heads, its row into the fabric, its sends
# of the total to the server.
_SCATTER, _FABRIC, _BROADCAST = 0, 1, 2


def fabric_all_reduce(
    buf: OpBuffer, fifo: Fifo, groups: np.ndarray, blocks: np.ndarray, nbytes: float, k: int,
    after: list[np.ndarray],
) -> np.ndarray:  # fmt: skip
    """Chunk ``k`` of every row j all-reduced across servers by the fabric: the heads
    ``groups[:, j]`` send block ``blocks[j]`` into the reducing switch (once their own
    sum is ready: the ops ``after[c][j, s]``, done), and the switch sends the total back
    to each of them. Returns the ops that bring it back, by (row, server)."""
    heads, owners = groups.T, groups[0]
    into = into_switch(
        buf, heads, owners, blocks[:, None], nbytes, path=PATH_SHARP_UP, step=1, chunk=k,
        deps=[(fifo.deps(heads, _FABRIC)[:, :, None], True)]
        + [(ops[:, :, None], False) for ops in after],
    )  # fmt: skip
    fifo.record(heads.ravel(), into.ravel(), _FABRIC)
    back = out_of_switch(
        buf, owners, heads, blocks[:, None], nbytes, path=PATH_SHARP_DOWN, step=2, chunk=k,
        after=into,
    )  # fmt: skip
    return back[:, :, 0]


def collnet_direct_schedule(groups: np.ndarray, size_bytes: float, chunks: int) -> Schedule:
    """One channel of ``collnet-direct`` on ``groups[s, j]``; block (j, k) is chunk k of
    row j, id jK + k."""
    N, g = groups.shape
    p, K = N * g, chunks
    b = size_bytes / (g * K)
    buf = OpBuffer()
    fifo = Fifo(p, 3)
    # Every (server, sender r, head j) with r != j.
    s, r, j = (x.ravel() for x in np.meshgrid(range(N), range(g), range(g), indexing="ij"))
    pair = r != j
    s, r, j = s[pair], r[pair], j[pair]
    rows = np.arange(g)
    for k in range(K):
        src, dst = groups[s, r], groups[s, j]
        scatter = np.full((N, g, g), NONE, dtype=np.int64)
        scatter[s, r, j] = buf.add(
            src, dst, j * K + k, b, reduce=True, step=0, chunk=k,
            deps=[(fifo.deps(src, _SCATTER), True)],
        )  # fmt: skip
        fifo.record(src, scatter[s, r, j], _SCATTER)
        # Head j's sum is ready once every other GPU's row j has arrived.
        after = [scatter[:, c, :].T for c in range(g)]
        back = fabric_all_reduce(buf, fifo, groups, rows * K + k, b, k, after)
        src, dst = groups[s, j], groups[s, r]
        ids = buf.add(
            src, dst, j * K + k, b, reduce=False, step=3, chunk=k,
            deps=[(back[j, s], False), (fifo.deps(src, _BROADCAST), True)],
        )  # fmt: skip
        fifo.record(src, ids, _BROADCAST)
    return _finish(buf, "collnet-direct", groups, size_bytes, K)


def chain_forest(groups: np.ndarray, head: int) -> _Tree:
    """Chain ``head`` of every server as one forest over all ranks: local rank head at
    the top, then head+1, ..., head-1 (mod g), each below the one before.

    >>> chain_forest(np.array([[0, 1, 2], [3, 4, 5]]), 1).parents.tolist()
    [2, -1, 1, 5, -1, 4]
    """
    N, g = groups.shape
    order = groups[:, (head + np.arange(g)) % g]  # chain position i on server s
    parents = np.full(N * g, -1, dtype=np.int64)
    parents[order[:, 1:]] = order[:, :-1]
    return _Tree(parents)


def collnet_chain_schedule(groups: np.ndarray, size_bytes: float, chunks: int) -> Schedule:
    """One channel of ``collnet-chain`` on ``groups[s, j]``; block (j, k) is chunk k of
    row j, id jK + k, which takes chain j."""
    N, g = groups.shape
    p, K = N * g, chunks
    b = size_bytes / (g * K)
    buf = OpBuffer()
    fifo = Fifo(p, 3)
    chains = [chain_forest(groups, j) for j in range(g)]
    heads = groups.T  # heads[j, s]: the head of chain j on server s
    rows = np.arange(g)
    previous_up: list = [None] * g
    previous_down: list = [None] * g
    for k in range(K):
        for j, chain in enumerate(chains):
            previous_up[j] = _up(buf, chain, j * K + k, b, k, previous_up[j])
        # A head's sum is ready once the next GPU of its chain has sent its own.
        nexts = [chain.child_ops(heads[j], previous_up[j])[0] for j, chain in enumerate(chains)]
        after = [np.stack(nexts)]
        back = fabric_all_reduce(buf, fifo, groups, rows * K + k, b, k, after)
        for j, chain in enumerate(chains):
            ready = np.full(p, NONE, dtype=np.int64)
            ready[heads[j]] = back[j]
            previous_down[j] = _down(
                buf, chain, j * K + k, b, k, previous_down[j], None, ready=ready
            )  # fmt: skip
    return _finish(buf, "collnet-chain", groups, size_bytes, K)


def _finish(buf: OpBuffer, algorithm: str, groups: np.ndarray, size_bytes: float, K: int):
    N, g = groups.shape
    return buf.schedule(
        op="all_reduce",
        algorithm=algorithm,
        ranks=N * g,
        size_bytes=size_bytes,
        # Row j's total gathers (symbolically) at its head on server 0.
        segment_owner=np.repeat(groups[0], K),
        params={"chunks": K, "servers": N, "ranks_per_server": g},
    )


class CollNetDirect(AcrossServers):
    """NCCL's CollNet Direct: scatter to per-NIC heads, SHARP across, broadcast back."""

    name = "collnet-direct"
    description = "NCCL CollNet Direct all-reduce: heads reduce over NVLink, SHARP switches across"
    protocols = COLLNET_PROTOCOLS
    one_channel = staticmethod(collnet_direct_schedule)


class CollNetChain(AcrossServers):
    """NCCL's CollNet Chain: up a chain of the server's GPUs, SHARP across, back down."""

    name = "collnet-chain"
    description = "NCCL CollNet Chain all-reduce: a chain in each server, SHARP switches across"
    protocols = COLLNET_PROTOCOLS
    one_channel = staticmethod(collnet_chain_schedule)
