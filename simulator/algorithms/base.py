"""The interface every collective algorithm implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..errors import CcsimError
from .schedule import Merged, Schedule


@dataclass(frozen=True)
class RankLayout:
    """What an algorithm may know about the ranks it runs on.

    ``servers[r]`` is the server (machine) of rank ``r``, or ``servers`` is None when
    the topology does not say (a user's graph without ``server`` attributes).
    """

    ranks: int
    servers: tuple[int, ...] | None = None

    def ranks_per_server(self) -> int | None:
        """GPUs per server when every server has the same count and ranks are contiguous."""
        if self.servers is None:
            return None
        servers = np.asarray(self.servers)
        if len(servers) != self.ranks or np.any(np.diff(servers) < 0):
            return None
        counts = np.bincount(servers)
        counts = counts[counts > 0]
        if len(set(counts.tolist())) != 1:
            return None
        return int(counts[0])


class Algorithm(ABC):
    """A collective algorithm: expands (op, ranks, bytes, options) into a Schedule."""

    #: Registry key, as typed on the command line.
    name: str = ""
    #: Operations this algorithm implements.
    ops: tuple[str, ...] = ()
    #: One line for ``--help`` and listings.
    description: str = ""
    #: Whether one channel already spreads over every link the algorithm uses, so that
    #: C channels are C identical copies on the same links: the same time with C times
    #: the flows (the tuner and the NCCL policy then run one).
    channels_are_copies: bool = False

    def unsupported(self, op: str, layout: RankLayout) -> str | None:
        """Why this algorithm cannot run ``op`` on ``layout``, or None if it can."""
        if op not in self.ops:
            return f"{self.name} does not implement {op}"
        if layout.ranks < 2:
            return "a collective needs at least 2 ranks"
        return None

    @abstractmethod
    def build(
        self, op: str, layout: RankLayout, size_bytes: float, *, chunks: int = 1, channels: int = 1
    ):
        """Return the :class:`~simulator.algorithms.schedule.Schedule` for this op and size."""

    def quotient(
        self, op: str, layout: RankLayout, size_bytes: float, period: int, **options
    ) -> Schedule | None:
        """The schedule's ops whose sender is one of ranks ``0..period-1``, with every
        dependency pointing at the one of these ops that stands for it (its image under a
        shift of whole periods), built without the full schedule; None when this
        algorithm does not build it directly or the schedule does not repeat itself
        every ``period`` ranks. It must equal
        :func:`simulator.collective.symmetry.schedule_quotient` of :meth:`build`'s
        schedule (tests hold it to that), which simulates ranks ``period`` apart once.
        """
        return None

    def merged(self, op: str, layout: RankLayout, size_bytes: float, **options) -> Merged | None:
        """The schedule with the transfers that travel side by side merged into one op
        each (:class:`~simulator.algorithms.schedule.Merged`), built without the full
        schedule; None when this algorithm does not build it. Expanded, it must equal
        :meth:`build`'s schedule (tests hold it to that)."""
        return None


def check_positive_int(value: object, name: str) -> int:
    """Validate an integer option such as ``chunks`` (a user-facing error otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise CcsimError(f"--{name} must be a positive integer, got {value!r}")
    return int(value)
