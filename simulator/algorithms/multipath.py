"""Multipath: an intra-server collective split over the GPU interconnect and the NICs.

During an intra-server all-reduce the server's RDMA links sit idle. This algorithm sends
a fraction x of the data as a ring over the intra-server links (NVLink, HCCS/SDMA) and
the remaining 1 - x as a ring whose every hop leaves through the sender's NIC, crosses
the leaf switch and enters through the receiver's NIC; both rings run at once.

With ring bounds B1 (intra) and B2 (network) and equal latencies the best split is
x = B1 / (B1 + B2) and the time n / (B1 + B2) times the ring's factor (the two-path form
of shared/reference/README.md). ``fraction="auto"`` (see
:func:`simulator.collective.simulate_collective`) measures each path alone by
simulation at the given size, so latencies count too, and takes x = T2 / (T1 + T2).
"""

from __future__ import annotations

import numpy as np

from ..errors import CcsimError
from .base import Algorithm, RankLayout
from .ring import Ring
from .schedule import PATH_NETWORK, Schedule


def merge(first: Schedule, second: Schedule, *, name: str, size_bytes: float) -> Schedule:
    """Two independent schedules of one op as one: ids, blocks and channels renumbered."""
    n = first.n_ops
    channels = int(first.channel.max()) + 1 if n else 0
    return Schedule(
        op=first.op,
        algorithm=name,
        ranks=first.ranks,
        size_bytes=size_bytes,
        src=np.concatenate([first.src, second.src]),
        dst=np.concatenate([first.dst, second.dst]),
        nbytes=np.concatenate([first.nbytes, second.nbytes]),
        segment=np.concatenate([first.segment, second.segment + first.n_segments]),
        reduce=np.concatenate([first.reduce, second.reduce]),
        dep_ptr=np.concatenate([first.dep_ptr[:-1], second.dep_ptr + first.dep_ptr[-1]]),
        dep_idx=np.concatenate([first.dep_idx, second.dep_idx + n]),
        dep_sent=np.concatenate([first.dep_sent, second.dep_sent]),
        segment_owner=np.concatenate([first.segment_owner, second.segment_owner]),
        channel=np.concatenate([first.channel, second.channel + channels]),
        step=np.concatenate([first.step, second.step]),
        chunk=np.concatenate([first.chunk, second.chunk]),
        path=np.concatenate([first.path, second.path]),
        params={**first.params},
    )


class Multipath(Algorithm):
    """Ring over the GPU interconnect for x of the data, ring over the NICs for 1 - x."""

    name = "multipath"
    ops = ("all_reduce", "all_gather", "reduce_scatter")
    description = "intra-server ring on NVLink/HCCS for x of the data and over the NICs for 1-x"

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        reason = super().unsupported(op, layout)
        if reason is None and layout.servers is not None and len(set(layout.servers)) > 1:
            return "multipath splits a collective inside one server (use pipelined across servers)"
        return reason

    def build(
        self,
        op: str,
        layout: RankLayout,
        size_bytes: float,
        *,
        chunks: int = 1,
        channels: int = 1,
        fraction: float = 0.5,
    ) -> Schedule:
        x = float(fraction)
        if not 0 <= x <= 1:
            raise CcsimError(f"multipath fraction must be in [0, 1], got {fraction!r}")
        ring = Ring()
        parts = []
        if x > 0:
            parts.append(ring.build(op, layout, x * size_bytes, chunks=chunks, channels=channels))
        if x < 1:
            network = ring.build(op, layout, (1 - x) * size_bytes, chunks=chunks, channels=channels)
            network.path = np.full(network.n_ops, PATH_NETWORK, dtype=np.int8)
            parts.append(network)
        schedule = (
            parts[0] if len(parts) == 1 else merge(*parts, name=self.name, size_bytes=size_bytes)
        )
        schedule.algorithm = self.name
        schedule.size_bytes = float(size_bytes)
        schedule.params = {"chunks": chunks, "channels": channels, "fraction": x}
        return schedule


def split(time_intra: float, time_network: float) -> float:
    """Fraction of the data for the intra-server path, given each path's time for all of it.

    Each path alone moves the data at n / T_i; sharing it in proportion to those rates
    makes both finish together: x = (1/T1) / (1/T1 + 1/T2) = T2 / (T1 + T2).

    >>> split(1.0, 3.0)
    0.75
    """
    return time_network / (time_intra + time_network)
