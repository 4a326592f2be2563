"""Direct (one-shot, full-mesh) collectives: every rank talks to every other at once.

* reduce-scatter: rank r sends block d to rank d for every d != r, which reduces it;
* all-gather: rank r sends its block to every other rank;
* all-reduce: the reduce-scatter, then each rank d sends its reduced block d to every
  other rank once all p-1 contributions to it have arrived;
* all-to-all: rank s sends block (s, d) to rank d for every d != s;
* broadcast / reduce: the root sends to (receives from) every other rank.

``chunks`` K cuts each message into K chunks sent one after another on its (sender,
receiver) pair; in all-reduce the all-gather of block d, chunk k, waits for chunk k of
every contribution, and each pair sends its reduce-scatter chunks before its all-gather
chunks.

Closed forms on a full mesh (latency a, bandwidth B per directed link, n bytes, blocks
of n/p): all-gather, reduce-scatter and all-to-all a + n/(pB); broadcast and reduce
a + n/B (any K). All-reduce with K chunks, τ = n/(pKB): the all-gather chunk k on a pair
starts at max((K+k)τ, (k+1)τ + a) (behind the pair's K reduce-scatter chunks, and after
chunk k of every contribution has arrived), so T = a + max(2Kτ, (K+1)τ + a), which is
2(a + n/(pB)) for K = 1.

All-reduce needs each all-gather op to wait for p-1 reduce-scatter ops: K p (p-1)^2
dependencies, so it is limited to 256 ranks.
"""

from __future__ import annotations

import numpy as np

from ..errors import CcsimError
from .base import Algorithm, RankLayout, check_positive_int
from .builder import (
    Fifo,
    OpBuffer,
    check_root,
    mesh_phase,
    ordered_pairs,
    pair_sends,
    replicate_channels,
)
from .schedule import Schedule

#: Ranks beyond which direct all-reduce is refused (its dependencies grow as p^3).
MAX_ALL_REDUCE_RANKS = 256
_MAX_DEPENDENCIES = 1 << 27


def direct_schedule(
    algorithm: str, op: str, ranks: int, size_bytes: float, chunks: int, root: int = 0
) -> Schedule:
    """One channel of a direct collective (see the module docstring)."""
    p, K = ranks, chunks
    buf = OpBuffer()
    fifo = Fifo(p, p)  # one FIFO per (sender, receiver) pair
    if op in ("all_reduce", "reduce_scatter", "all_gather"):
        owner = np.arange(p)
        everyone = np.arange(p)[None, :]
        blocks = (np.arange(p)[:, None] * K + np.arange(K))[None, :, :, None]  # block d, chunk k
        # All-reduce: the all-gather of block d, chunk k, waits for chunk k of every
        # contribution to it (the reduce-scatter ops into rank d).
        received = None
        if op != "all_gather":
            received = mesh_phase(buf, None, fifo, everyone, blocks, size_bytes / (p * K),
                                  reduce=True)  # fmt: skip
        if op != "reduce_scatter":
            mesh_phase(
                buf, None, fifo, everyone, blocks, size_bytes / (p * K), reduce=False,
                step0=int(op == "all_reduce"), after=received,
            )  # fmt: skip
    elif op == "all_to_all":
        owner = np.arange(p * p)  # block (s, d) = s * p + d: from s, for d
        src, dst = ordered_pairs(p)
        segments = [(src * p + dst) * K + k for k in range(K)]
        pair_sends(buf, fifo, src, dst, segments, size_bytes / (p * K), reduce=False, step=0)
    else:
        owner = np.full(1, root)
        peers = np.delete(np.arange(p), root)
        ends = (np.full(p - 1, root), peers)
        src, dst = ends if op == "broadcast" else ends[::-1]
        pair_sends(
            buf, fifo, src, dst, range(K), size_bytes / K, reduce=op == "reduce", step=0
        )  # fmt: skip
    return buf.schedule(
        op=op,
        algorithm=algorithm,
        ranks=p,
        size_bytes=size_bytes,
        segment_owner=np.repeat(owner, K),
        params={"chunks": K},
    )


class Direct(Algorithm):
    """Full-mesh one-shot exchange; all-reduce is a direct reduce-scatter + all-gather."""

    name = "direct"
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
    description = "one-shot full-mesh exchange (all-reduce: direct RS then direct AG)"

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        reason = super().unsupported(op, layout)
        if reason is None and op == "all_reduce" and layout.ranks > MAX_ALL_REDUCE_RANKS:
            return (
                f"direct all-reduce is limited to {MAX_ALL_REDUCE_RANKS} ranks: each of its "
                "p(p-1) all-gather sends waits for p-1 reduce-scatter sends"
            )
        return reason

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
        p = layout.ranks
        root = check_root(root, p)
        if op == "all_reduce" and K * C * p * (p - 1) ** 2 > _MAX_DEPENDENCIES:
            raise CcsimError(
                f"direct all-reduce on {p} ranks with {K} chunks x {C} channels needs "
                f"{K * C * p * (p - 1) ** 2:,} dependencies; use fewer chunks or channels"
            )
        one = direct_schedule(self.name, op, p, size_bytes / C, K, root)
        if op in ("broadcast", "reduce"):
            one.params["root"] = root
        return replicate_channels(one, C, size_bytes)
