"""Directed links of a topology graph, and routes between GPUs.

Every undirected edge becomes two directed links (full duplex: each direction has the
edge's bandwidth to itself); every edge of a DiGraph becomes one. A route is the list of
directed links on the shortest path by latency; ties go to the path with fewer hops,
then to networkx's deterministic search order, so the same graph always gives the same
routes.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from .topology.graph import gpu_nodes

# Added to every hop's latency when searching for routes, so that among paths of equal
# latency the one with fewer hops wins (and zero-latency graphs still route sensibly).
_HOP_PENALTY = 1e-12

# Up to this many ranks the (src, dst) -> route cache is a dense p x p table.
_DENSE_LIMIT = 4096


class LinkTable:
    """Directed links of ``graph`` as arrays: endpoints, capacity, latency, link type."""

    def __init__(self, graph: nx.Graph):
        src, dst, capacity, latency, kind = [], [], [], [], []
        directions = ((False,),) if graph.is_directed() else ((False,), (True,))
        for u, v, data in graph.edges(data=True):
            for (flip,) in directions:
                a, b = (v, u) if flip else (u, v)
                src.append(a)
                dst.append(b)
                capacity.append(float(data["bandwidth"]))
                latency.append(float(data.get("latency", 0.0)))
                kind.append(str(data.get("link", "")))
        self.src_node = src
        self.dst_node = dst
        self.capacity = np.array(capacity, dtype=float)
        self.latency = np.array(latency, dtype=float)
        self.kind = kind
        self.index = {(a, b): i for i, (a, b) in enumerate(zip(src, dst, strict=True))}

    def __len__(self) -> int:
        return len(self.capacity)


class Router:
    """Routes between ranks, computed on first use and cached.

    ``route_ids(src_ranks, dst_ranks)`` returns one route id per pair; the links of
    route ``r`` are ``links[ptr[r]:ptr[r + 1]]`` (see :meth:`arrays`) and its latency
    ``latency[r]``.
    """

    def __init__(self, graph: nx.Graph, links: LinkTable):
        self.graph = graph
        self.links = links
        self.nodes = gpu_nodes(graph)
        p = len(self.nodes)
        self._dense = np.full((p, p), -1, dtype=np.int32) if p <= _DENSE_LIMIT else None
        self._sparse: dict[tuple[int, int], int] = {}
        self._route_links: list[np.ndarray] = []
        self._latency: list[float] = []
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _weight(self, u, v, data) -> float:
        return float(data.get("latency", 0.0)) + _HOP_PENALTY

    def _compute(self, s: int, d: int) -> int:
        _, path = nx.bidirectional_dijkstra(
            self.graph, self.nodes[s], self.nodes[d], weight=self._weight
        )
        links = np.array(
            [self.links.index[(a, b)] for a, b in zip(path, path[1:], strict=False)], dtype=np.int64
        )
        self._route_links.append(links)
        self._latency.append(float(self.links.latency[links].sum()))
        self._arrays = None
        return len(self._route_links) - 1

    def route_ids(
        self, src: np.ndarray, dst: np.ndarray, labels: np.ndarray | None = None
    ) -> np.ndarray:
        """Route id for each (src rank, dst rank) pair.

        ``labels`` (one per pair, e.g. the channel) are reserved for multi-path routing;
        with a single shortest path per pair they are ignored.
        """
        if self._dense is not None:
            ids = self._dense[src, dst]
            missing = ids < 0
            if missing.any():
                for s, d in np.unique(np.stack([src[missing], dst[missing]], axis=1), axis=0):
                    self._dense[s, d] = self._compute(int(s), int(d))
                ids = self._dense[src, dst]
            return ids
        out = np.empty(len(src), dtype=np.int32)
        for n, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            key = (s, d)
            if key not in self._sparse:
                self._sparse[key] = self._compute(s, d)
            out[n] = self._sparse[key]
        return out

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ptr, links, latency)`` over all routes computed so far."""
        if self._arrays is None:
            lengths = [len(links) for links in self._route_links]
            ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=ptr[1:])
            flat = (
                np.concatenate(self._route_links)
                if self._route_links
                else np.zeros(0, dtype=np.int64)
            )
            self._arrays = (ptr, flat, np.array(self._latency, dtype=float))
        return self._arrays

    def path_nodes(self, route: int) -> list:
        """The nodes a route visits, for reports."""
        ptr, flat, _ = self.arrays()
        links = flat[ptr[route] : ptr[route + 1]]
        return [self.links.src_node[links[0]]] + [self.links.dst_node[i] for i in links]
