"""ccsim: a discrete-event simulator of GPU clusters and their collective communication.

The main entry points:

* :func:`simulate_collective` — one collective on a topology, returning times, nccl-tests
  style bandwidths and per-flow / per-link records.
* :func:`load_topology` — a preset name, preset file or networkx graph, validated.
* :func:`build_schedule` and :func:`verify` — collective algorithms as data.
"""

from .algorithms import algorithm_names, build_schedule
from .checker import verify
from .collective import CollectiveResult, bus_factor, run_schedule, simulate_collective
from .errors import CcsimError
from .schedule import Schedule
from .topology import list_presets, load_topology, ring_graph

__all__ = [
    "CcsimError",
    "CollectiveResult",
    "Schedule",
    "algorithm_names",
    "build_schedule",
    "bus_factor",
    "list_presets",
    "load_topology",
    "ring_graph",
    "run_schedule",
    "simulate_collective",
    "verify",
]

__version__ = "0.1.0"
