"""Ring all-reduce, all-gather and reduce-scatter.

On a ring of p positions, at each step position ``i`` sends one block to position
``i + 1``. Reduce-scatter takes p-1 steps in which the receiver reduces the block into
its copy; all-gather takes p-1 steps that copy; all-reduce is the two back to back
(2(p-1) steps). Closed form on a contention-free ring of per-hop latency a and
bandwidth B: all-reduce 2(p-1)(a + n/(pB)), the others (p-1)(a + n/(pB)).

Options
    ``channels`` C: independent rings, each carrying n/C bytes. When every server holds
    the same number g of consecutive ranks, channel c visits the first server's GPUs
    from local GPU c mod g upwards, and every server alike, as NCCL's rings do. The hop
    from a server's last GPU to the next server's first is sent as NCCL's PXN sends it
    (``PATH_PXN``): over NVLink to the GPU of the receiver's local index, then through
    its NIC, so that it stays on one rail; different channels leave a server through
    different GPUs (and so different NICs).
    ``chunks`` K: each step's block is cut into K chunks sent one after another on the
    channel; chunk k of step s may leave once it has arrived (chunk k of step s-1 at the
    previous position) and the channel has finished sending the chunk before it. Larger
    K hides per-hop latency behind transmission.
"""

from __future__ import annotations

import numpy as np

from .base import Algorithm, RankLayout, check_positive_int
from .schedule import PATH_DEFAULT, PATH_PXN, Schedule


def g_of(layout: RankLayout) -> int:
    """Ranks per server (1 when servers are not given or uneven)."""
    return layout.ranks_per_server() or 1


def ring_orders(layout: RankLayout, channels: int) -> list[np.ndarray]:
    """The rank order of each channel's ring (see the module docstring)."""
    p = layout.ranks
    g = layout.ranks_per_server()
    orders = []
    for c in range(channels):
        if g is None or g == 1:
            orders.append(np.arange(p))
            continue
        local = (np.arange(g) + c) % g
        # Every server alike, as NCCL's rings are (one intra-server pattern per channel,
        # servers in order): the hop to the next server leaves through the NIC of the
        # GPU the ring entered by, on the receiver's rail (PXN; the schedule marks it).
        orders.append((np.arange(p // g)[:, None] * g + local[None, :]).ravel())
    return orders


class Ring(Algorithm):
    """Ring algorithm (bandwidth-optimal; latency grows linearly with p)."""

    name = "ring"
    ops = ("all_reduce", "all_gather", "reduce_scatter")
    description = "ring over all ranks; 2(p-1) steps for all-reduce, p-1 otherwise"

    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ) -> Schedule:
        return self._build(op, layout, size_bytes, chunks, channels, layout.ranks)

    def quotient(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        period: int,
        *,
        chunks: int = 1,
        channels: int = 1,
        **options,
    ) -> Schedule | None:
        """The ops of the ranks ``0..period-1`` alone (see :meth:`Algorithm.quotient`):
        when every ring's order repeats itself ``period`` positions on, ``period`` ranks
        on, they are its first ``period`` positions, and position 0 receives from
        position ``period - 1`` (the representative of position ``p - 1``). Built in
        ``period / p`` of the full schedule's time and memory."""
        p = layout.ranks
        if options or op not in Ring.ops or period < 1 or period >= p or p % period:
            return None  # other options (a chain's root) are not the ring's
        C = check_positive_int(channels, "channels")
        for order in ring_orders(layout, C):
            head = order[:period]
            if head.max() >= period or not np.array_equal(order[period:], order[:-period] + period):
                return None
        return self._build(op, layout, size_bytes, chunks, channels, period)

    def _build(
        self, op: str, layout: RankLayout, size_bytes: float, chunks: int, channels: int, q: int
    ) -> Schedule:
        """The ops of ring positions ``0..q-1`` (all of them for ``q = p``), each
        receiving from position ``i - 1 mod q``."""
        p = layout.ranks
        K = check_positive_int(chunks, "chunks")
        C = check_positive_int(channels, "channels")
        half = p - 1
        steps = 2 * half if op == "all_reduce" else half
        per_channel = steps * K * q
        chunk_bytes = float(size_bytes) / (C * p * K)

        # int32 throughout: a 1024-rank ring has 8 M ops, and memory is the limit there.
        index = np.int32
        s, k, i = (
            a.ravel()
            for a in np.meshgrid(
                np.arange(steps, dtype=index),
                np.arange(K, dtype=index),
                np.arange(q, dtype=index),
                indexing="ij",
                copy=True,
            )
        )
        # Which block position (on the ring) position i sends at step s, and whether the
        # receiver reduces it (reduce-scatter phase) or copies it (all-gather phase).
        if op == "all_gather":
            position, reducing = (i - s) % p, np.zeros(len(s), dtype=bool)
        elif op == "reduce_scatter":
            position, reducing = (i - s - 1) % p, np.ones(len(s), dtype=bool)
        else:
            in_rs = s < half
            position = np.where(in_rs, (i - s - 1) % p, (i - (s - half)) % p)
            reducing = in_rs
        # Dependencies: the block must have arrived (data), and the channel must have sent
        # the chunk before this one (FIFO); -1 marks "none".
        data_dep = np.where(s > 0, ((s - 1) * K + k) * q + (i - 1) % q, -1)
        fifo_dep = np.where(
            k > 0, (s * K + k - 1) * q + i, np.where(s > 0, ((s - 1) * K + K - 1) * q + i, -1)
        )
        deps = np.stack([data_dep, fifo_dep], axis=1).astype(index)
        del data_dep, fifo_dep
        kinds = np.broadcast_to(np.array([False, True]), deps.shape)
        has = deps >= 0
        counts = has.sum(axis=1, dtype=index)

        parts: dict[str, list[np.ndarray]] = {
            key: []
            for key in (
                "src",
                "dst",
                "segment",
                "reduce",
                "channel",
                "step",
                "chunk",
                "dep_idx",
                "dep_sent",
                "dep_count",
            )
        }
        servers = None if layout.servers is None else np.asarray(layout.servers)
        paths = []
        for c, order in enumerate(ring_orders(layout, C)):
            order = order.astype(index)
            base = c * per_channel
            parts["src"].append(order[i])
            parts["dst"].append(order[(i + 1) % p])
            if servers is not None and g_of(layout) > 1:
                between = servers[order[i]] != servers[order[(i + 1) % p]]
                paths.append(np.where(between, PATH_PXN, PATH_DEFAULT).astype(np.int8))
            parts["segment"].append((c * p + order[position]) * K + k)
            parts["reduce"].append(reducing)
            parts["channel"].append(np.full(len(s), c, dtype=index))
            parts["step"].append(s)
            parts["chunk"].append(k)
            parts["dep_idx"].append(deps[has] + base)
            parts["dep_sent"].append(kinds[has])
            parts["dep_count"].append(counts)
        del deps, has, counts, position, reducing

        def joined(key: str) -> np.ndarray:
            # One channel: its arrays as they are (no copy of millions of entries).
            values = parts.pop(key)
            return values[0] if len(values) == 1 else np.concatenate(values)

        dep_ptr = np.zeros(per_channel * C + 1, dtype=np.int64)
        np.cumsum(joined("dep_count"), out=dep_ptr[1:])
        owner = np.repeat(np.arange(p, dtype=index), K)  # block (c, b, k) belongs to rank b
        return Schedule(
            op=op,
            algorithm=self.name,
            ranks=p,
            size_bytes=float(size_bytes),
            src=joined("src"),
            dst=joined("dst"),
            nbytes=np.full(per_channel * C, chunk_bytes),
            segment=joined("segment"),
            reduce=joined("reduce"),
            dep_ptr=dep_ptr,
            dep_idx=joined("dep_idx"),
            dep_sent=joined("dep_sent"),
            segment_owner=np.tile(owner, C),
            channel=joined("channel"),
            step=joined("step"),
            chunk=joined("chunk"),
            path=(paths[0] if len(paths) == 1 else np.concatenate(paths)) if paths else None,
            params={"chunks": K, "channels": C},
        )
