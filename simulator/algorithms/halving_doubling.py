"""Recursive halving and doubling: Rabenseifner all-reduce, and its two halves.

For p = 2^m ranks:

* reduce-scatter by recursive halving: in round i = 0..m-1 rank v exchanges with
  v XOR p/2^(i+1) and sends the half of its current range that the partner keeps (n/2^(i+1)
  bytes, reduced by the receiver); after m rounds rank v holds block v fully reduced;
* all-gather by recursive doubling: in round i rank v exchanges with v XOR 2^i
  everything it has gathered so far (2^i blocks);
* all-reduce (Rabenseifner): the reduce-scatter, then the all-gather in reverse
  (distances 1, 2, ..., p/2), which rebuilds the ranges the halving split.

p not a power of two: with P = 2^floor(log2 p) and r = p - P, each rank 2i+1 (i < r)
first folds its data into rank 2i (all of it for all-reduce and reduce-scatter, its own
block for all-gather); the P remaining ranks run the algorithm above, rank 2i standing
for both; at the end rank 2i sends rank 2i+1 its result (all of it, the blocks it
lacks, or its block). All-reduce works on P blocks of n/P; all-gather and
reduce-scatter on the p ranks' blocks, so a virtual rank may own two.

Closed forms on a full mesh (latency a, bandwidth B per link, each round on its own
link; reductions free), p = 2^m:
    all-reduce      2 m a + 2 (p-1)/p n/B
    all-gather      m a + (p-1)/p n/B
    reduce-scatter  m a + (p-1)/p n/B
and for other p the all-reduce adds the fold and the return, 2 (a + n/B), with m and
p replaced by floor(log2 p) and P.

Each round is one message per rank, as in MPI's send-receive rounds: a rank sends its
round-i message once it has received its round-(i-1) message (even the blocks it
already had wait for it). ``chunks`` K cuts every message into K chunks sent one after
another; chunk k of a round may go once chunk k of the previous round has arrived.
"""

from __future__ import annotations

import numpy as np

from .base import Algorithm, RankLayout, check_positive_int
from .builder import NONE, Fifo, LastWriter, OpBuffer, replicate_channels
from .schedule import Schedule


class _Rounds:
    """Emits exchanges (lists of blocks per sender) chunk by chunk, with deps tracked."""

    def __init__(self, ranks: int, blocks: int, chunks: int, block_bytes: float):
        self.buf = OpBuffer()
        self.writer = LastWriter(ranks, blocks * chunks)
        self.fifo = Fifo(ranks)
        # Per chunk, the op that last delivered that chunk of a message to each rank.
        self.received = np.full((chunks, ranks), NONE, dtype=np.int64)
        self.chunks = chunks
        self.block_bytes = block_bytes
        self.step = 0

    def exchange(self, src: list[int], dst: list[int], blocks: list[np.ndarray], reduce: bool):
        """Sender ``src[i]`` sends ``blocks[i]`` to ``dst[i]``; one step, K chunks."""
        counts = [len(b) for b in blocks]
        if sum(counts) == 0:
            return
        senders = np.repeat(np.asarray(src, dtype=np.int64), counts)
        receivers = np.repeat(np.asarray(dst, dtype=np.int64), counts)
        flat = np.concatenate(blocks).astype(np.int64)
        for k in range(self.chunks):
            segment = flat * self.chunks + k
            ids = self.buf.add(
                senders,
                receivers,
                segment,
                self.block_bytes,
                reduce=reduce,
                step=self.step,
                chunk=k,
                deps=[
                    *self.writer.columns(senders, receivers, segment),
                    (self.fifo.deps(senders), True),
                    (self.received[k, senders], False),
                ],
            )
            self.received[k, receivers] = ids
            self.writer.record(receivers, segment, ids)
            self.fifo.record(senders, ids)
        self.step += 1


def halving_doubling_schedule(
    algorithm: str, op: str, ranks: int, size_bytes: float, chunks: int
) -> Schedule:
    """One channel of a halving-doubling collective (see the module docstring)."""
    p, K = ranks, chunks
    m = p.bit_length() - 1
    P = 1 << m
    extra = p - P
    # Virtual rank v (0..P-1) is played by active[v]; ranks 2i+1 (i < extra) fold away.
    active = np.concatenate([2 * np.arange(extra), np.arange(2 * extra, p)]).astype(np.int64)
    folded = 2 * np.arange(extra) + 1
    partners = folded - 1
    virtual = np.arange(P)

    if op == "all_reduce":
        n_blocks = P
        owner = active  # block v ends its reduce-scatter at virtual rank v
        every = np.arange(P)
    else:
        n_blocks = p
        owner = np.arange(p)
        every = np.arange(p)
        # Blocks each virtual rank stands for: its own, plus its folded partner's.
        owned = [np.array([q, q + 1]) if q < 2 * extra else np.array([q]) for q in active]
    rounds = _Rounds(p, n_blocks, K, size_bytes / (n_blocks * K))

    def union(members: np.ndarray) -> np.ndarray:
        return np.concatenate([owned[w] for w in members.tolist()])

    if op == "all_reduce":
        if extra:
            rounds.exchange(folded, partners, [every] * extra, True)
        for i in range(m):  # recursive halving
            d = P >> (i + 1)
            keep = ((virtual // d) ^ 1)[:, None] * d + np.arange(d)
            rounds.exchange(active, active[virtual ^ d], list(keep), True)
        for i in reversed(range(m)):  # recursive doubling back
            d = P >> (i + 1)
            have = (virtual // d)[:, None] * d + np.arange(d)
            rounds.exchange(active, active[virtual ^ d], list(have), False)
        if extra:
            rounds.exchange(partners, folded, [every] * extra, False)
    elif op == "all_gather":
        if extra:
            rounds.exchange(folded, partners, [np.array([q]) for q in folded], False)
        for i in range(m):
            d = 1 << i
            groups = [union((v >> i << i) + np.arange(d)) for v in range(P)]
            rounds.exchange(active, active[virtual ^ d], groups, False)
        if extra:
            rest = [np.delete(every, q) for q in folded]
            rounds.exchange(partners, folded, rest, False)
    else:  # reduce_scatter
        if extra:
            rounds.exchange(folded, partners, [every] * extra, True)
        for i in range(m):
            d = P >> (i + 1)
            halves = [union(((v // d) ^ 1) * d + np.arange(d)) for v in range(P)]
            rounds.exchange(active, active[virtual ^ d], halves, True)
        if extra:
            rounds.exchange(partners, folded, [np.array([q]) for q in folded], False)
    return rounds.buf.schedule(
        op=op,
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.repeat(owner, K),
        params={"chunks": K},
    )


class HalvingDoubling(Algorithm):
    """Recursive halving / doubling (Rabenseifner); folds extra ranks when p is not 2^m."""

    name = "halving-doubling"
    ops = ("all_reduce", "all_gather", "reduce_scatter")
    description = "recursive halving RS / doubling AG (Rabenseifner AR); any p by folding"

    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        one = halving_doubling_schedule(self.name, op, layout.ranks, size_bytes / C, K)
        return replicate_channels(one, C, size_bytes)
