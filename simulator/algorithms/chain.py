"""Ring broadcast and reduce: a chain through every rank, pipelined over chunks.

Broadcast: the root sends chunk k to the next rank on the ring, which forwards it, and
so on to the rank before the root (p-1 hops). Reduce: the chain starts at the rank after
the root and ends at the root; each hop reduces. Each rank sends its K chunks one after
another, so chunk k+1 leaves while chunk k travels on.

Closed form on a contention-free ring (per-hop latency a, bandwidth B, chunk time
τ = n/(KB)): hop h of chunk k starts at h(a + τ) + kτ (every dependency path to it has
h hops and k chunk slots), so T = (p-1)(a + τ) + (K-1)τ = (p-1)a + (p-2+K) n/(KB).
With reduce bandwidth R each hop of the reduce also takes n/(KR) at the receiver.

The class extends :class:`~simulator.algorithms.ring.Ring` (and is registered as
``ring``): all-reduce, all-gather and reduce-scatter are the ring's own.
"""

from __future__ import annotations

import numpy as np

from .base import RankLayout, check_positive_int
from .builder import NONE, OpBuffer, check_root, replicate_channels
from .ring import Ring
from .schedule import Schedule

ROOTED_OPS = ("broadcast", "reduce")


def chain_schedule(
    algorithm: str, op: str, ranks: int, size_bytes: float, chunks: int, root: int
) -> Schedule:
    """One channel of a chain broadcast or reduce (see the module docstring)."""
    p, K = ranks, chunks
    if op == "broadcast":
        order = (root + np.arange(p)) % p
    else:
        order = (root + 1 + np.arange(p)) % p  # ends at the root
    # Op (hop h, chunk k) has id h*K + k: it needs chunk k from the previous hop (done)
    # and the sender's previous chunk out of the way (sent). Each rank sends on one hop
    # only, so that is all; one vectorised batch holds the whole chain.
    h, k = (a.ravel() for a in np.meshgrid(np.arange(p - 1), np.arange(K), indexing="ij"))
    buf = OpBuffer()
    buf.add(
        order[h],
        order[h + 1],
        k,
        size_bytes / K,
        reduce=op == "reduce",
        step=h,
        chunk=k,
        deps=[
            (np.where(h > 0, (h - 1) * K + k, NONE), False),
            (np.where(k > 0, h * K + k - 1, NONE), True),
        ],
    )
    return buf.schedule(
        op=op,
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.full(K, root),
        params={"chunks": K, "root": root},
    )


class RingWithChains(Ring):
    """The ring algorithm, plus broadcast and reduce as chains around the ring."""

    ops = (*Ring.ops, *ROOTED_OPS)
    description = (
        "ring over all ranks; 2(p-1) steps for all-reduce, p-1 otherwise; "
        "broadcast/reduce as a pipelined chain"
    )

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
        if op not in ROOTED_OPS:
            return super().build(op, layout, size_bytes, chunks=chunks, channels=channels)
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        root = check_root(root, layout.ranks)
        one = chain_schedule(self.name, op, layout.ranks, size_bytes / C, K, root)
        return replicate_channels(one, C, size_bytes)
