"""A lower bound on a schedule's simulated time, without simulating it.

Two bounds, the larger counts:

* link load: every byte of a transfer crosses every link of its route, and no link
  carries more than its line rate, so a schedule takes at least ``max over links of
  bytes / capacity`` (latencies and dependencies only add to it); with a protocol, the
  bytes are the protocol's wire bytes and the capacity the link type's efficiency of
  line rate, as the replay moves them;
* critical path: an op starts once the ops it waits for are done (or sent), takes at
  least its bytes over its route's slowest link, and is delivered at least its route's
  latency (or the protocol's hop latency for its path class, if larger) later; the
  longest such chain, plus a protocol run's launch and base latency.

The tuner skips a candidate whose bound is already slower than the best time found: it
cannot win. Routing is the same as the replay's (:func:`~.replay.route_ops`), so the bound
sees the same NICs, rails and switch ports a run would load.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from ..algorithms.schedule import Schedule, successors
from ..library.protocol import Calibration
from ..network.routing import LinkTable, Router, path_class
from .replay import route_ops


class LoadBound:
    """Link-load lower bounds for schedules on one topology (routes cached).

    Examples
    --------
    A ring all-gather of 4 MB on 4 GPUs joined by 100 GB/s links, 1 us each: each link
    carries 3 blocks of 1 MB (30 us), and each step waits for the last, 3 x (10 us +
    1 us): the bound is the closed form here.

    >>> from simulator.algorithms import build_schedule
    >>> from simulator.collective import rank_layout
    >>> from simulator.topology import ring_graph
    >>> graph = ring_graph(4, 100e9, 1e-6)
    >>> bound = LoadBound(graph)
    >>> schedule = build_schedule("ring", "all_gather", rank_layout(graph), 4e6)
    >>> round(bound.time_s(schedule) * 1e6, 6)
    33.0
    """

    def __init__(self, graph: nx.Graph) -> None:
        self.links = LinkTable(graph)
        self.router = Router(graph, self.links)

    def link_bytes(self, schedule: Schedule, routes: np.ndarray | None = None) -> np.ndarray:
        """Bytes the schedule puts on each directed link."""
        if routes is None:
            routes = route_ops(self.router, schedule, np.arange(schedule.n_ops))
        ptr, flat, _ = self.router.arrays()
        starts, lengths = ptr[routes], ptr[routes + 1] - ptr[routes]
        total = int(lengths.sum())
        offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        links = flat[offsets + np.arange(total)]
        weights = np.repeat(np.asarray(schedule.nbytes, dtype=float), lengths)
        return np.bincount(links, weights=weights, minlength=len(self.links.capacity))

    def time_s(
        self,
        schedule: Schedule,
        *,
        calibration: Calibration | None = None,
        protocols: tuple[str, ...] = (),
    ) -> float:
        """The lower bound in seconds; with ``protocols`` (the ones a run may use), their
        smallest launch, base and hop latencies count too."""
        routes = route_ops(self.router, schedule, np.arange(schedule.n_ops))
        load = self.link_bytes(schedule, routes)
        capacity = self.links.capacity
        chosen = []
        if protocols and calibration is not None:
            chosen = [calibration.protocol(name) for name in protocols]
            # A protocol run moves each op's bytes over its data share of the wire (LL's
            # flags), on links at their type's efficiency: as the replay does, with the
            # most generous of the protocols, so the bound stays below every one's run.
            share = max(proto.bandwidth for proto in chosen)
            efficiency = calibration.efficiency
            # NVLS switch ops reach the "nvls" share on NVLink instead: the larger counts.
            nvls = float(efficiency.get("nvls", 0.0))
            scale = np.array(
                [
                    max(float(efficiency.get(kind, 1.0)), nvls if kind == "nvlink" else 0.0)
                    for kind in self.links.kind
                ]
            )
            capacity = capacity * scale * share
        bound = float(np.max(load / capacity[: len(load)])) if len(load) else 0.0
        ptr, flat, latency = self.router.arrays()
        # Each op's own floor: bytes over its route's slowest link, then its latency.
        slowest = np.minimum.reduceat(capacity[flat], ptr[:-1]) if len(flat) else []
        transfer = np.asarray(schedule.nbytes, dtype=float) / np.asarray(slowest)[routes]
        delay = latency[routes]
        start = 0.0
        if chosen:
            start = calibration.launch_s + min(proto.base_s for proto in chosen)
            classes = np.array(_route_classes(self.links, ptr, flat))[routes]
            for cls in set(classes.tolist()):
                hop = min(proto.hop_s[cls] for proto in chosen)
                mine = classes == cls
                delay[mine] = np.maximum(delay[mine], hop)
        return max(bound, start + critical_path(schedule, transfer, delay))


def _route_classes(links: LinkTable, ptr: np.ndarray, flat: np.ndarray) -> list[str]:
    return [
        path_class([links.kind[i] for i in flat[ptr[r] : ptr[r + 1]]]) for r in range(len(ptr) - 1)
    ]


def critical_path(schedule: Schedule, transfer: np.ndarray, delay: np.ndarray) -> float:
    """Longest chain of the schedule's dependencies: an op starts when its "done"
    predecessors are delivered and its "sent" ones sent, is sent ``transfer`` later and
    delivered ``delay`` after that. Level by level over the DAG, in numpy.

    >>> from simulator.algorithms import build_schedule
    >>> s = build_schedule("ring", "all_gather", 4, 4e6)  # 3 steps, each waits the last
    >>> critical_path(s, np.full(s.n_ops, 10e-6), np.full(s.n_ops, 1e-6)) * 1e6
    33.0
    """
    n = schedule.n_ops
    (done_ptr, done_idx), (sent_ptr, sent_idx) = successors(schedule)
    pending = np.diff(schedule.dep_ptr).astype(np.int64)
    start = np.zeros(n)
    sent = np.zeros(n)
    delivered = np.zeros(n)
    frontier = np.flatnonzero(pending == 0)
    while len(frontier):
        sent[frontier] = start[frontier] + transfer[frontier]
        delivered[frontier] = sent[frontier] + delay[frontier]
        released = []
        for ptr, idx, when in ((done_ptr, done_idx, delivered), (sent_ptr, sent_idx, sent)):
            counts = ptr[frontier + 1] - ptr[frontier]
            if not counts.sum():
                continue
            offsets = np.repeat(ptr[frontier] - np.cumsum(counts) + counts, counts)
            succ = idx[offsets + np.arange(int(counts.sum()))]
            np.maximum.at(start, succ, np.repeat(when[frontier], counts))
            np.subtract.at(pending, succ, 1)
            released.append(succ)
        if not released:
            break
        candidates = np.unique(np.concatenate(released))
        frontier = candidates[pending[candidates] == 0]
    return float(delivered.max()) if n else 0.0
