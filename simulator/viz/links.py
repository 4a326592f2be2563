"""Link load over time, derived from a collective's flow records.

The network records per link only totals (bytes, busy time). Over time, each directed
link carries the sum of the rates of the flows crossing it, and the network's model
fixes those rates: between two consecutive events (a flow starting or its last byte
leaving) the active flows share every link max-min fairly. So the rates can be rebuilt
after the run from the flow records alone: route each flow as the network did (same
:class:`~simulator.network.routing.Router` on the same graph, so the same links), then replay
the event times and solve the max-min allocation once per interval. No hook in the
network's hot path is needed, and ``tests/test_viz_links.py`` checks the result
against the network's own per-link byte and busy-time totals.

Cost: one max-min solve over the active flows per distinct event time, which is about
what the simulation itself did (a 1024-rank ring all-reduce, 2 M transfers: about 3 s).
``max_work`` bounds it: past that many (flow, link) entries visited,
:class:`LinkLoadTooLarge` is raised and callers leave link rows out.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import networkx as nx
import numpy as np

from ..errors import CcsimError
from ..network.maxmin import max_min_rates
from ..network.routing import LinkTable, Router

#: Default bound on the work of :func:`link_load`: (flow, link) entries visited over all
#: intervals (a 1024-rank ring all-reduce visits 4 M; 300 M take about a minute).
MAX_WORK = 300_000_000


class LinkLoadTooLarge(CcsimError):
    """Rebuilding link load would take more than the ``max_work`` allowed."""


@dataclass
class LinkLoad:
    """Rate carried by each used directed link over time.

    ``links`` are indices into ``table`` (a :class:`~simulator.network.routing.LinkTable` of the
    graph, the same numbering as ``CollectiveResult.links``); for link ``links[j]``,
    ``rate[j][i]`` bytes/s flow from ``time_s[j][i]`` to ``time_s[j][i + 1]`` (the last
    sample is 0, when it falls idle). ``flows[j]`` counts the transfers that crossed it.
    """

    table: LinkTable
    links: np.ndarray
    time_s: list[np.ndarray]
    rate: list[np.ndarray]
    flows: np.ndarray

    def utilisation(self, j: int) -> np.ndarray:
        """Rate of ``links[j]`` as a fraction of its capacity."""
        return self.rate[j] / self.table.capacity[self.links[j]]

    def bytes(self, j: int) -> float:
        """Bytes carried by ``links[j]``: the integral of its rate."""
        return float(np.sum(self.rate[j][:-1] * np.diff(self.time_s[j])))

    def busy_s(self, j: int) -> float:
        """Time ``links[j]`` carried at least one flow."""
        return float(np.sum(np.diff(self.time_s[j])[self.rate[j][:-1] > 0]))


def link_load(graph: nx.Graph, flows: dict[str, Any], *, max_work: int = MAX_WORK) -> LinkLoad:
    """Rebuild per-link rates over time from flow records (see the module docstring).

    Parameters
    ----------
    graph : networkx graph
        The topology the flows ran on.
    flows : dict of arrays
        ``CollectiveResult.flows``: ``src`` and ``dst`` ranks, ``channel``, ``bytes``,
        ``start_s`` and ``sent_s`` per transfer.
    max_work : int
        Bound on (flow, link) entries visited; beyond it :class:`LinkLoadTooLarge` is
        raised.

    Examples
    --------
    Two 1000-byte flows share a 1 GB/s link: 0.5 GB/s each, both sent at 2 us.

    >>> from simulator.topology import ring_graph
    >>> g = ring_graph(2, 1e9)
    >>> f = {"src": [0, 0], "dst": [1, 1], "channel": [0, 0], "bytes": [1e3, 1e3],
    ...      "start_s": [0.0, 0.0], "sent_s": [2e-6, 2e-6]}
    >>> load = link_load(g, f)
    >>> load.time_s[0].tolist(), load.rate[0].tolist(), load.flows.tolist()
    ([0.0, 2e-06], [1000000000.0, 0.0], [2])
    """
    table = LinkTable(graph)
    router = Router(graph, table)
    src = np.asarray(flows["src"], dtype=np.int64)
    dst = np.asarray(flows["dst"], dtype=np.int64)
    channel = np.asarray(flows.get("channel", np.zeros(len(src))), dtype=np.int64)
    start = np.asarray(flows["start_s"], dtype=float)
    sent = np.asarray(flows["sent_s"], dtype=float)
    n_links = len(table)
    empty = LinkLoad(table, np.zeros(0, dtype=np.int64), [], [], np.zeros(0, dtype=np.int64))
    if len(src) == 0:
        return empty
    path = flows.get("path")
    if path is None:
        routes = router.route_ids(src, dst, channel).astype(np.int64)
    else:  # the routes the schedule asked for (PXN, NVLS, through the NICs)
        from ..collective.replay import route_pairs

        routes = route_pairs(router, src, dst, channel, np.asarray(path)).astype(np.int64)
    ptr, route_links, _ = router.arrays()
    length = ptr[routes + 1] - ptr[routes]
    # Flows that never occupied a link (no route, no bytes, never started) carry nothing.
    keep = np.flatnonzero((length > 0) & (sent > start) & np.isfinite(start) & np.isfinite(sent))
    if len(keep) == 0:
        return empty
    times = np.unique(np.concatenate([start[keep], sent[keep]]))
    begin = np.searchsorted(times, start[keep])
    finish = np.searchsorted(times, sent[keep])
    # Incidence (flow, link) of every kept flow, grouped by flow.
    lengths = length[keep]
    inc_flow_all = np.repeat(np.arange(len(keep)), lengths)
    inc_link_all = route_links[_ranges(ptr[routes[keep]], lengths)]
    inc_ptr = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(lengths, out=inc_ptr[1:])
    flow_count = np.bincount(inc_link_all, minlength=n_links)

    starting = _groups(begin, len(times))
    ending = _groups(finish, len(times))
    capacity = table.capacity
    act_flow = np.zeros(0, dtype=np.int64)  # incidence of the active flows
    act_link = np.zeros(0, dtype=np.int64)
    ended = np.zeros(len(keep), dtype=bool)
    current = np.zeros(n_links)
    out_t, out_link, out_rate = [], [], []
    work = 0
    for j, now in enumerate(times.tolist()):
        gone = ending[j]
        if len(gone):
            ended[gone] = True
            alive = ~ended[act_flow]
            act_flow, act_link = act_flow[alive], act_link[alive]
        new = starting[j]
        if len(new):
            entries = _ranges(inc_ptr[new], lengths[new])
            act_flow = np.concatenate([act_flow, inc_flow_all[entries]])
            act_link = np.concatenate([act_link, inc_link_all[entries]])
        work += len(act_link)
        if work > max_work:
            raise LinkLoadTooLarge(
                f"link load needs more than {max_work} (flow, link) visits ({len(keep)} "
                f"transfers, {len(times)} event times); raise max_work to draw link rows"
            )
        flows_here, local = np.unique(act_flow, return_inverse=True)
        rate = max_min_rates(local, act_link, len(flows_here), capacity)
        total = np.zeros(n_links)
        if len(act_link):
            np.add.at(total, act_link, rate[local])
        changed = np.flatnonzero(total != current)
        if len(changed):
            out_t.append(np.full(len(changed), now))
            out_link.append(changed)
            out_rate.append(total[changed])
            current = total
    t = np.concatenate(out_t)
    link = np.concatenate(out_link)
    value = np.concatenate(out_rate)
    order = np.lexsort((t, link))
    t, link, value = t[order], link[order], value[order]
    used, first = np.unique(link, return_index=True)
    bounds = [*first.tolist(), len(link)]
    return LinkLoad(
        table=table,
        links=used,
        time_s=[t[a:b] for a, b in pairwise(bounds)],
        rate=[value[a:b] for a, b in pairwise(bounds)],
        flows=flow_count[used],
    )


def _groups(index: np.ndarray, n: int) -> list[np.ndarray]:
    """``out[j]`` = positions ``i`` with ``index[i] == j`` (ascending)."""
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(n + 1))
    return [order[bounds[j] : bounds[j + 1]] for j in range(n)]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(total)
