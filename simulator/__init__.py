"""ccsim: a discrete-event simulator of GPU clusters and their collective communication.

The main entry points:

* :func:`simulate_collective` — one collective on a topology, returning times, nccl-tests
  style bandwidths and per-flow / per-link records.
* :func:`load_topology` — a preset name, preset file or networkx graph, validated.
* :func:`build_schedule` and :func:`verify` — collective algorithms as data.
"""

from .algorithms import algorithm_names, build_schedule
from .algorithms.checker import verify
from .algorithms.schedule import Schedule
from .collective.run import CollectiveResult, bus_factor, run_schedule
from .collective.simulate import simulate_collective
from .errors import CcsimError
from .topology import list_presets, load_topology, ring_graph
from .version import __version__

__all__ = [
    "CcsimError",
    "CollectiveResult",
    "Schedule",
    "__version__",
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
