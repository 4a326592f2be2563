"""Picking the fastest configuration of a collective by simulation: ``auto``.

:class:`AutoTuner` finds, for a topology, an operation and a message size, the fastest
registered algorithm and its chunk count by simulating the candidates. It remembers
each choice per (topology, operation, size bucket): sizes within a factor of two of
each other (same ``floor(log2(size))``) share a choice, so a program that issues the
same collective many times pays for the search once. The tuner is an ordinary object
owned by its caller; there is no global cache, so two simulations in one process
never see each other's choices.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from ..algorithms import algorithm_names, build_schedule, get_algorithm
from ..algorithms.base import RankLayout
from ..algorithms.chain import ROOTED_OPS
from ..errors import CcsimError
from ..library.protocol import PROTOCOLS, calibration_of
from .bounds import LoadBound
from .run import COLLECTIVE_OPS, CollectiveResult, auto_fraction, rank_layout, run_schedule

#: Chunk counts tried, in this order, when chunks are "auto".
CHUNK_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
#: Channel counts tried, in this order, when channels are "auto" (NCCL runs up to 32).
CHANNEL_CANDIDATES = (1, 2, 4, 8, 16, 32)


def topology_key(graph: nx.Graph) -> str:
    """A digest of ``graph``'s nodes, links and their attributes.

    Two graphs with the same content get the same key, whatever object holds them.
    """
    digest = hashlib.sha256()
    digest.update(b"directed" if graph.is_directed() else b"undirected")
    # Every attribute counts (bandwidth, latency, message rates, servers...): cheaper to
    # hash them all than to know which ones some model version reads.
    nodes = sorted(
        repr((repr(node), sorted(data.items()))) for node, data in graph.nodes(data=True)
    )

    def ends(u, v) -> tuple[str, ...]:
        pair = (repr(u), repr(v))
        return pair if graph.is_directed() else tuple(sorted(pair))

    edges = sorted(
        repr((ends(u, v), sorted(data.items()))) for u, v, data in graph.edges(data=True)
    )
    for line in (*nodes, *edges):
        digest.update(line.encode())
    return digest.hexdigest()[:16]


def size_bucket(size_bytes: float) -> int:
    """Sizes in ``[2^b, 2^(b+1))`` share bucket ``b``.

    >>> size_bucket(1024), size_bucket(1500), size_bucket(2048)
    (10, 10, 11)
    """
    return math.floor(math.log2(size_bytes))


@dataclass(frozen=True)
class Choice:
    """An algorithm, chunk and channel count, with the time it took where it was chosen."""

    algorithm: str
    chunks: int
    time_s: float
    channels: int = 1


class AutoTuner:
    """Picks the fastest algorithm and chunk count per size, by simulation, with a cache.

    Parameters
    ----------
    algorithms : sequence of str, optional
        Candidates for ``algorithm="auto"``; default every registered algorithm that
        supports the operation on the topology's ranks.
    chunk_candidates : sequence of int
        Chunk counts tried for ``chunks="auto"``, in increasing order: the search goes on
        while each count is faster than the one before, stops at the first that is not
        (time as a function of chunks falls while pipelining hides latency and transfers
        overlap, and rises once per-chunk latency dominates), and keeps the fastest it
        simulated; of equal times, the fewer chunks.
    channels : int or "auto"
        Channels every candidate runs with, or "auto" to search
        :data:`CHANNEL_CANDIDATES` per algorithm as chunk counts are searched (parallel
        rings spread over more NICs and paths, and cut each message finer).
    reduce_bandwidth : float, optional
        Bytes/s of local reductions (see :func:`simulator.simulate_collective`).
    protocol : str, optional
        Protocol model every candidate runs with (None: ideal; "auto": the fastest).

    Examples
    --------
    >>> from simulator.topology import ring_graph
    >>> tuner = AutoTuner(algorithms=["ring", "direct"], chunk_candidates=(1,))
    >>> graph = ring_graph(8, 100e9, 1e-6)
    >>> tuner.choose(graph, "all_reduce", 8).algorithm  # 2 steps of <= 4 hops, not 14 steps
    'direct'
    >>> tuner.choose(graph, "all_reduce", 2**30).algorithm  # no detours sharing links
    'ring'
    >>> tuner.choose(graph, "all_reduce", 12) is tuner.choose(graph, "all_reduce", 8)
    True
    """

    def __init__(
        self,
        *,
        algorithms: Sequence[str] | None = None,
        chunk_candidates: Sequence[int] = CHUNK_CANDIDATES,
        channels: int = 1,
        reduce_bandwidth: float | None = None,
        protocol: str | None = None,
    ) -> None:
        if algorithms is not None:
            for name in algorithms:
                get_algorithm(name)  # unknown names fail now, listing the valid ones
        if not chunk_candidates or any(
            not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in chunk_candidates
        ):
            raise CcsimError(
                f"chunk candidates must be positive integers, got {chunk_candidates!r}"
            )
        self.algorithms = None if algorithms is None else list(algorithms)
        self.chunk_candidates = tuple(sorted(set(chunk_candidates)))
        if channels != "auto" and (
            isinstance(channels, bool) or not isinstance(channels, int) or channels < 1
        ):
            raise CcsimError(f"channels must be a positive integer or 'auto', got {channels!r}")
        self.channels = channels
        self.reduce_bandwidth = reduce_bandwidth
        self.protocol = protocol
        self._choices: dict[tuple, Choice] = {}
        self._times: dict[tuple, float] = {}
        self._results: dict[tuple, CollectiveResult] = {}
        self._bounds: dict[str, LoadBound] = {}
        self.simulations = 0  # how many schedules the tuner has replayed
        self.pruned = 0  # candidates skipped: their link-load bound was already slower

    def run(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        algorithm: str,
        chunks: int,
        *,
        layout: RankLayout | None = None,
        root: int = 0,
        channels: int | None = None,
        cutoff: float = math.inf,
    ) -> CollectiveResult | None:
        """Simulate one configuration, once per tuner (later calls return the same
        result); ``channels`` defaults to the tuner's (1 when that is "auto"). With a
        ``cutoff`` (seconds), a configuration whose link-load lower bound
        (:class:`~.bounds.LoadBound`) is not below it is not simulated: None."""
        layout = layout or rank_layout(graph)
        if channels is None:
            channels = 1 if self.channels == "auto" else self.channels
        key = (topology_key(graph), op, float(size_bytes), algorithm, chunks, channels, root)
        if key in self._results:
            return self._results[key]
        options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
        if algorithm == "multipath":
            options["fraction"] = auto_fraction(
                graph, op, size_bytes, chunks=chunks, channels=channels, protocol=self.protocol
            )
        schedule = build_schedule(
            algorithm, op, layout, size_bytes, chunks=chunks, channels=channels, **options
        )
        protocols = self._protocols(graph, schedule)
        if len(protocols) <= 1:
            if math.isfinite(cutoff) and self._bound_of(graph, schedule) >= cutoff:
                self.pruned += 1
                return None
            self.simulations += 1
            result = run_schedule(
                graph, schedule, reduce_bandwidth=self.reduce_bandwidth, protocol=self.protocol
            )
        else:
            # --proto auto: the fastest protocol, as run_schedule's "auto" finds it, but
            # each protocol whose own bound is already slower than the cutoff or than a
            # protocol simulated before it is skipped (most promising first).
            bounds = {name: self._bound_of(graph, schedule, (name,)) for name in protocols}
            result = None
            for name in sorted(protocols, key=bounds.__getitem__):
                if bounds[name] >= min(cutoff, result.time_s if result else math.inf):
                    self.pruned += 1
                    continue
                self.simulations += 1
                run = run_schedule(
                    graph, schedule, reduce_bandwidth=self.reduce_bandwidth, protocol=name
                )
                if result is None or run.time_s < result.time_s:
                    result = run
            if result is None:
                return None
        self._results[key] = result
        return result

    def bound(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        algorithm: str,
        chunks: int,
        layout: RankLayout,
        root: int,
        channels: int,
    ) -> float:
        """Lower bound (s) on one configuration's time (:class:`~.bounds.LoadBound`);
        0 where it cannot be built (it then sorts first and fails when run)."""
        if algorithm == "multipath":
            return 0.0  # its split is itself found by simulation
        options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
        try:
            schedule = build_schedule(
                algorithm, op, layout, size_bytes, chunks=chunks, channels=channels, **options
            )
            return self._bound_of(graph, schedule)
        except CcsimError:  # e.g. nvls where no switch reduces: the run says why
            return 0.0

    def _bound_of(
        self, graph: nx.Graph, schedule, protocols: tuple[str, ...] | None = None
    ) -> float:
        key = topology_key(graph)
        if key not in self._bounds:
            self._bounds[key] = LoadBound(graph)
        if protocols is None:
            protocols = self._protocols(graph, schedule)
        return self._bounds[key].time_s(
            schedule, calibration=calibration_of(graph), protocols=protocols
        )

    def _protocols(self, graph: nx.Graph, schedule) -> tuple[str, ...]:
        """The protocols a run of ``schedule`` may use (none: the ideal model)."""
        if self.protocol is None:
            return ()
        allowed = schedule.params.get("protocols") or PROTOCOLS
        if str(self.protocol).lower() != "auto":
            return tuple(name for name in PROTOCOLS if name.lower() == str(self.protocol).lower())
        enabled = [name for name in allowed if name in calibration_of(graph).enabled()]
        return tuple(enabled or allowed)

    def best_chunks(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        algorithm: str,
        *,
        layout: RankLayout | None = None,
        root: int = 0,
        channels: int | None = None,
        cutoff: float = math.inf,
        start: int | None = None,
    ) -> tuple[CollectiveResult, int] | None:
        """The fastest chunk count of ``algorithm`` at this size, and its result; None
        when its link load alone is slower than ``cutoff`` (seconds) at every count.

        The search walks the candidates up from the first (or from ``start``, a count
        near the expected best, e.g. the best with half the channels: cut finer, a step
        wants about half the chunks), while each count is faster than the one before;
        from a ``start`` that the next count does not beat, it walks down instead."""
        layout = layout or rank_layout(graph)
        candidates = self.chunk_candidates
        if start is not None and start > candidates[0]:
            first = max(i for i, k in enumerate(candidates) if k <= start)
            up = self._walk_chunks(
                graph, op, size_bytes, algorithm, candidates[first:], layout, root, channels,
                cutoff,
            )  # fmt: skip
            if up is None or up[1] != candidates[first] or first == 0:
                return up
            down = self._walk_chunks(
                graph, op, size_bytes, algorithm, candidates[first::-1], layout, root,
                channels, cutoff,
            )  # fmt: skip
            return down if down is not None and down[0].time_s < up[0].time_s else up
        return self._walk_chunks(
            graph, op, size_bytes, algorithm, candidates, layout, root, channels, cutoff
        )

    def _walk_chunks(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        algorithm: str,
        order: Sequence[int],
        layout: RankLayout,
        root: int,
        channels: int | None,
        cutoff: float,
    ) -> tuple[CollectiveResult, int] | None:
        """Chunk counts in ``order`` while each is faster than the one before."""
        best: tuple[CollectiveResult, int] | None = None
        for chunks in order:
            try:
                result = self.run(
                    graph,
                    op,
                    size_bytes,
                    algorithm,
                    chunks,
                    layout=layout,
                    root=root,
                    channels=channels,
                    cutoff=min(cutoff, best[0].time_s) if best else cutoff,
                )
            except CcsimError:
                if best is None:
                    raise
                break  # too many chunks to build (e.g. direct all-reduce's size limit)
            if result is None:
                break  # more chunks move the same bytes: no count can beat the cutoff
            if best is not None and not result.time_s < best[0].time_s:
                break  # no faster than the count before: the fastest is found
            best = (result, chunks)
        return best

    def candidates(self, op: str, layout: RankLayout) -> list[str]:
        """Algorithms ``auto`` considers for ``op`` on ``layout``."""
        names = self.algorithms if self.algorithms is not None else algorithm_names()
        able = [name for name in names if get_algorithm(name).unsupported(op, layout) is None]
        if not able:
            raise CcsimError(
                f"no algorithm among {', '.join(names)} can run {op} on {layout.ranks} ranks"
            )
        return able

    def choose(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        *,
        algorithm: str = "auto",
        chunks: int | str = "auto",
        root: int = 0,
    ) -> Choice:
        """The fastest (algorithm, chunks) for ``op`` at this size's bucket on ``graph``.

        ``algorithm`` or ``chunks`` may be fixed; what is "auto" is searched.
        """
        if op not in COLLECTIVE_OPS:
            raise CcsimError(
                f"unknown operation {op!r}; valid choices: {', '.join(COLLECTIVE_OPS)}"
            )
        key = (topology_key(graph), op, size_bucket(size_bytes), algorithm, chunks, root)
        if key in self._choices:
            return self._choices[key]
        layout = rank_layout(graph)
        names = self.candidates(op, layout) if algorithm == "auto" else [algorithm]
        best: Choice | None = None
        channel_counts = CHANNEL_CANDIDATES if self.channels == "auto" else (self.channels,)
        if len(names) > 1:
            # Most promising first (smallest lower bound), so that the best time found
            # early prunes the rest; ties keep the registry's order.
            first = self.chunk_candidates[-1] if chunks == "auto" else int(chunks)
            names = sorted(
                names,
                key=lambda name: self.bound(
                    graph, op, size_bytes, name, first, layout, root, channel_counts[0]
                ),
            )
        for name in names:
            mine: Choice | None = None  # this algorithm's best over channel counts
            counts = channel_counts
            if self.channels == "auto" and get_algorithm(name).channels_are_copies:
                counts = channel_counts[:1]  # more channels: the same time, more flows
            for c in counts:
                # Prune only when there is a choice to make: a candidate whose link load
                # alone is slower than the best so far cannot win.
                cutoff = min(
                    best.time_s if best and len(names) > 1 else math.inf,
                    mine.time_s if mine else math.inf,
                )
                try:
                    if chunks == "auto":
                        found = self.best_chunks(
                            graph,
                            op,
                            size_bytes,
                            name,
                            layout=layout,
                            root=root,
                            channels=c,
                            cutoff=cutoff,
                            start=max(1, mine.chunks // 2) if mine else None,
                        )
                        result, k = found if found else (None, 0)
                    else:
                        k = int(chunks)
                        result = self.run(
                            graph,
                            op,
                            size_bytes,
                            name,
                            k,
                            layout=layout,
                            root=root,
                            channels=c,
                            cutoff=cutoff,
                        )
                except CcsimError:
                    if len(names) == 1 and mine is None:
                        raise
                    break  # e.g. multipath on a server whose NICs reach no switch
                if result is None:
                    break  # more channels move the same bytes: they cannot win either
                if mine is not None and not result.time_s < mine.time_s:
                    break  # more channels no longer pay (as with chunks)
                mine = Choice(name, k, result.time_s, c)
            if mine is not None and (best is None or mine.time_s < best.time_s):
                best = mine
        assert best is not None
        self._choices[key] = best
        self._times[(*key[:2], float(size_bytes), *key[3:])] = best.time_s
        return best

    def time_s(self, graph: nx.Graph, op: str, size_bytes: float, **choice: Any) -> float:
        """Simulated time of the chosen configuration at exactly this size (cached)."""
        key = (
            topology_key(graph),
            op,
            float(size_bytes),
            choice.get("algorithm", "auto"),
            choice.get("chunks", "auto"),
            choice.get("root", 0),
        )
        if key not in self._times:
            result = self.simulate(graph, op, size_bytes, **choice)
            self._times[key] = result.time_s
        return self._times[key]

    def simulate(
        self, graph: nx.Graph, op: str, size_bytes: float, *, root: int = 0, **choice: Any
    ) -> CollectiveResult:
        """Simulate the chosen configuration at this size; ``params`` record the choice."""
        picked = self.choose(graph, op, size_bytes, root=root, **choice)
        result = self.run(
            graph,
            op,
            size_bytes,
            picked.algorithm,
            picked.chunks,
            root=root,
            channels=picked.channels,
        )
        assert result is not None  # no cutoff: always simulated (or cached)
        result.params.update(chunks=picked.chunks, channels=picked.channels)
        return result
