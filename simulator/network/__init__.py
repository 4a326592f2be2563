"""How bytes move: routes over the topology graph, max-min fair sharing of links, and
the flow network that SimPy processes send through.

Modules: :mod:`~.routing` (shortest paths, ECMP, the link table and path classes),
:mod:`~.maxmin` (the water-filling rate solver), :mod:`~.flows` (:class:`FlowNetwork`:
flows that start and end at SimPy times, rates recomputed at each change) and
:mod:`~.lean` (:class:`LeanFlowNetwork`: the same model in Python scalars, for plain
flows that meet in small groups).
"""

from .flows import FlowNetwork, NetworkStats
from .lean import LeanFlowNetwork
from .maxmin import max_min_rates
from .routing import PATH_CLASSES, LinkTable, Router, path_class

__all__ = [
    "PATH_CLASSES",
    "FlowNetwork",
    "LeanFlowNetwork",
    "LinkTable",
    "NetworkStats",
    "Router",
    "max_min_rates",
    "path_class",
]
