"""Calls that share links with others, run as bundles: one flow per link, at the pace
the call keeps alone.

A training step overlaps its calls: a data-parallel reduce-scatter runs beside the
backward's tensor-parallel collectives and shares their GPUs' NVLink ports. A call that
is not alone cannot be replayed from its timing alone (:mod:`simulator.workload.isolated`)
and, flow by flow, costs every transfer of its schedule: a ring all-reduce over 32 ranks
with 24 channels of 12 chunks is tens of thousands of flows, and a step has hundreds of
such calls. That is the per-flow reference (``WorkloadReplay(..., bundles=False)``,
``--exact``); it is also minutes a step.

A *bundle* is the call reduced to what it does to each link. Its timing alone gives,
per link of its footprint, the bytes it moves there and when it last uses it. The
bundle starts one flow per link, carrying those bytes at most at the rate that spreads
them evenly up to that last use, and the flows share their links with everything else,
max-min, like any flow. The call is done when all of them are sent, and each rank
finishes as long after the last one as it did alone after the call's last link use.

What it keeps and what it loses:

- Alone (nothing else on its links) a bundle's flows run at their caps and end when the
  call's last use of each link ends: every rank finishes when it did alone, except ranks
  that finished before the call's last link use, which finish with that last use; bytes
  per link are the call's. Only the links' busy time is longer (each link is busy over
  the whole span of its use, not only while the call's flows were on it).
- Shared, each link's flow takes its max-min share; a call whose traffic on a link is
  below the share is not slowed (a NIC-bound data-parallel ring beside tensor-parallel
  traffic on NVLink keeps its pace, as its flows do), and one above it is slowed there
  and the call ends when its slowest link does. Lost: the coupling between a call's
  links (a ring slowed on one link slows on all of them, leaving the others to the
  rest sooner), and each link's flows count as one in the share however many the call
  runs there at once.

Measured against the reference on published training steps (README, *Calls that share
links*): the same step to a few tenths of a percent at one to two orders of magnitude
less work. Calls that are alone are still replayed exactly from their timing; only calls
that are not become bundles, and a replay keeps the conflict checks of
:mod:`simulator.workload.isolated` (a bundle started on links held by a replayed call
makes that call a bundle in the next attempt).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..network.flows import FlowNetwork


class Bundle:
    """One call as a bundle: its flows on ``network`` (one per link of ``footprint``
    that it uses alone, from ``nbytes`` and ``release_s``, its bytes and last use per
    link), and its ranks' ``done`` offsets alone, as (offset, positions) in time order.
    ``rank_done(positions)`` is called as ranks finish; ``copies``: per link, the flows
    the call kept there at once alone (on average while busy), each link's flow counting
    as that many in the share. Starts now."""

    #: Nothing waits for a bundle's flows to arrive (its ranks' offsets after the last
    #: link use are added where it ends): the network schedules no delivery events.
    delivers = False

    def __init__(
        self,
        network: FlowNetwork,
        footprint: np.ndarray,
        nbytes: np.ndarray,
        release_s: np.ndarray,
        done: list[tuple[float, np.ndarray]],
        rank_done: Callable[[np.ndarray], None],
        represented: float,
        copies: np.ndarray | None = None,
    ):
        self.network = network
        self.rank_done = rank_done
        used = (nbytes > 0) & (release_s > 0)
        #: The call's last use of any link, from its start, alone.
        self.last_use = float(release_s[used].max()) if used.any() else 0.0
        self.done = []
        for offset, positions in done:
            if offset <= 0.0:
                rank_done(positions)  # ranks with nothing to do (as a replay at its start)
            else:
                self.done.append((offset, positions))
        self.left = int(used.sum())
        self.owner = -1
        if self.left == 0:
            self._finish()
            return
        self.owner = network.register(self)
        network.add_link_loads(
            self.owner,
            footprint[used],
            nbytes[used],
            nbytes[used] / release_s[used],
            represented,
            None if copies is None else copies[used],
        )

    def on_sent(self, ops: np.ndarray) -> None:
        """Flows of the bundle are sent; with the last, the call's ranks finish."""
        self.left -= len(ops)
        if self.left == 0:
            self.network.release(self.owner)
            self._finish()

    def on_delivered(self, ops: np.ndarray) -> None:
        """Never called (``delivers``): its ranks' offsets after the last link use
        (latency, the last reduction) are added where it ends."""

    def _finish(self) -> None:
        env = self.network.env
        for offset, positions in self.done:
            delay = max(offset - self.last_use, 0.0)
            if delay == 0.0:
                self.rank_done(positions)
            else:
                event = env.timeout(delay)
                event.callbacks.append(lambda _event, p=positions: self.rank_done(p))
