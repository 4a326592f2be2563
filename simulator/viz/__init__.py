"""Seeing results: timeline records, Gantt charts, Perfetto traces and report folders.

Everything here draws from plain records (:mod:`simulator.viz.records`), so any engine
that can list ``(track, start_s, end_s, kind, label, args)`` spans can use the same
writers:

>>> from simulator.viz import Timeline, timeline_figure, trace_json
>>> t = Timeline.from_spans([("rank 0", 0.0, 1e-6, "compute", "fwd"),
...                          ("rank 0", 1e-6, 3e-6, "comm", "all_reduce")])
>>> fig = timeline_figure(t, width=800, height=300)
>>> '"dur": 2.0' in trace_json(t)
True

Modules: :mod:`~simulator.viz.records` (the record types), :mod:`~simulator.viz.collective`
(a collective's result as a timeline), :mod:`~simulator.viz.links` (link load over time),
:mod:`~simulator.viz.timeline` (matplotlib Gantt), :mod:`~simulator.viz.perfetto` (trace
JSON), :mod:`~simulator.viz.plots` (bandwidth against size),
:mod:`~simulator.viz.tables` (Markdown tables), :mod:`~simulator.viz.outputs`
(``--timeline``/``--trace``/``--report``) and
:mod:`~simulator.viz.atomic` (atomic file writes).
"""

from .atomic import atomic_open, write_bytes_atomically, write_text_atomically
from .collective import collective_timeline
from .links import LinkLoad, link_load
from .outputs import topology_summary, write_collective_report
from .perfetto import save_trace, trace_events, trace_json
from .plots import bandwidth_figure
from .records import Counter, Phase, Span, Timeline, Track
from .tables import markdown_table
from .timeline import figure_bytes, save_timeline, timeline_figure

__all__ = [
    "Counter",
    "LinkLoad",
    "Phase",
    "Span",
    "Timeline",
    "Track",
    "atomic_open",
    "bandwidth_figure",
    "collective_timeline",
    "figure_bytes",
    "link_load",
    "markdown_table",
    "save_timeline",
    "save_trace",
    "timeline_figure",
    "topology_summary",
    "trace_events",
    "trace_json",
    "write_bytes_atomically",
    "write_collective_report",
    "write_text_atomically",
]
