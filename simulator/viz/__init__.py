"""Seeing results: timeline records, Gantt charts, Perfetto traces and report folders.

Everything here draws from plain records (:mod:`simulator.viz.records`), so any engine
that can list ``(track, start_s, end_s, kind, label, args)`` spans can use the same
writers:

>>> from simulator.viz import Timeline, timeline_figure, trace_json
>>> t = Timeline.from_spans([("rank 0", 0.0, 1e-6, "compute", "fwd"),
...                          ("rank 0", 1e-6, 3e-6, "comm", "all_reduce")])
>>> fig = timeline_figure(t, width=800, height=300)
>>> '"dur":2.0' in trace_json(t)
True

Modules: :mod:`~simulator.viz.records` (the record types), :mod:`~simulator.viz.collective`
(a collective's result as a timeline), :mod:`~simulator.viz.links` (link load over time),
:mod:`~simulator.viz.timeline` (matplotlib Gantt), :mod:`~simulator.viz.perfetto` (trace
JSON), :mod:`~simulator.viz.plots` (bandwidth against size),
:mod:`~simulator.viz.tables` (Markdown tables), :mod:`~simulator.viz.outputs`
(``--timeline``/``--trace``/``--report``); files are written
through :mod:`simulator.files`.
"""

import importlib
from typing import Any

# Names resolve on first use (PEP 562), so that importing simulator.viz for a trace or a
# table does not load matplotlib: only the plotting modules import it.
_HOMES = {
    "collective_timeline": "collective",
    "LinkLoad": "links",
    "link_load": "links",
    "topology_summary": "outputs",
    "write_collective_report": "outputs",
    "save_trace": "perfetto",
    "trace_events": "perfetto",
    "trace_json": "perfetto",
    "bandwidth_figure": "plots",
    "Counter": "records",
    "Phase": "records",
    "Span": "records",
    "Timeline": "records",
    "Track": "records",
    "markdown_table": "tables",
    "figure_bytes": "timeline",
    "save_timeline": "timeline",
    "timeline_figure": "timeline",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Counter",
    "LinkLoad",
    "Phase",
    "Span",
    "Timeline",
    "Track",
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
    "write_collective_report",
]
