"""Pairwise-exchange all-to-all: p-1 rounds, one peer per rank per round.

In round i = 1..p-1 rank r sends block (r, d) to d = r XOR i when p is a power of two
(so r and d swap blocks), else to d = (r + i) mod p while receiving from (r - i) mod p.
A round starts once the rank's send and receive of the previous round are both done
(a blocking send-receive per round, as in MPI's pairwise all-to-all), which keeps at
most one message per rank in flight: the algorithm of choice when a rank's port cannot
serve p-1 peers at once.

Closed form when every round's messages have their own links (a full mesh, or one
port per rank on a non-blocking switch): T = (p-1)(a + n/(pB)), n being each rank's
whole buffer. ``chunks`` K sends each message as K back-to-back chunks (same time).
"""

from __future__ import annotations

import numpy as np

from .base import Algorithm, RankLayout, check_positive_int
from .builder import NONE, OpBuffer, replicate_channels
from .schedule import Schedule


def pairwise_peers(p: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """``(send_to, receive_from)`` of every rank in round ``i``.

    >>> [a.tolist() for a in pairwise_peers(3, 1)]
    [[1, 2, 0], [2, 0, 1]]
    """
    ranks = np.arange(p)
    if p & (p - 1) == 0:
        return ranks ^ i, ranks ^ i
    return (ranks + i) % p, (ranks - i) % p


def pairwise_schedule(algorithm: str, ranks: int, size_bytes: float, chunks: int) -> Schedule:
    """One channel of a pairwise all-to-all (see the module docstring)."""
    p, K = ranks, chunks
    buf = OpBuffer()
    ranks_ = np.arange(p)
    last: np.ndarray | None = None  # previous round's last chunk, indexed by sender
    came_from: np.ndarray | None = None
    for i in range(1, p):
        to, came = pairwise_peers(p, i)
        previous = None
        for k in range(K):
            deps = [(NONE if previous is None else previous, True)]
            if k == 0 and last is not None:
                # Blocking send-receive: my last send and my last receive are done.
                deps += [(last, False), (last[came_from], False)]
            previous = buf.add(
                ranks_,
                to,
                (ranks_ * p + to) * K + k,
                size_bytes / (p * K),
                reduce=False,
                step=i - 1,
                chunk=k,
                deps=deps,
            )
        last, came_from = previous, came
    return buf.schedule(
        op="all_to_all",
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.repeat(np.arange(p * p), K),
        params={"chunks": K},
    )


class Pairwise(Algorithm):
    """All-to-all in p-1 rounds of pairwise exchanges (XOR pairing for p = 2^m)."""

    name = "pairwise"
    ops = ("all_to_all",)
    description = "all-to-all in p-1 rounds: peer r XOR i (p = 2^m) or r +/- i mod p"

    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ) -> Schedule:
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        one = pairwise_schedule(self.name, layout.ranks, size_bytes / C, K)
        return replicate_channels(one, C, size_bytes)
