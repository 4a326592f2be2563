"""Output files of ``ccsim collective`` and ``ccsim run``: ``--timeline``, ``--trace`` and
``--report DIR``.

A report folder holds everything needed to read and to rerun a sweep:

========================  ===============================================================
``results.csv``/``.json``  the table, one row per size (the ``--format csv/json`` output)
``table.txt``             the nccl-tests style table
``bandwidth.png``         time and bus bandwidth against size
``timeline.png``          Gantt chart of the last size of the sweep (above
                          :data:`~.heatmap.HEATMAP_RANKS` ranks: its heat-map)
``trace.json``            Perfetto / Chrome trace of the last size
``topology.<ext>``        the preset or graph file the topology came from (if a file)
``run.json``              argv, the command, ccsim and library versions, the inputs and
                          a summary of the resolved topology (with a SHA-256 of the graph)
``README.md``             the same for people: what was run, how to rerun it
``report.html``           all of it as one self-contained web page (:mod:`~.html`)
========================  ===============================================================

Every file is written atomically (:mod:`simulator.files`); ``run.json`` is written
last, so a folder that has it is complete. A non-empty folder is refused unless
``force`` is given (files of the same names are then replaced; others are left alone).

A workload report (``ccsim run --report DIR``, :func:`write_workload_report`) holds the
step-time breakdown (``breakdown.txt``, ``.csv``, ``.json``), ``timeline.png`` and
``trace.json`` of the step (:mod:`simulator.viz.workload`), copies of the workload and
topology files, ``README.md``, ``report.html`` and ``run.json``, under the same rules.

Each figure is drawn once and saved twice: as the PNG file and inline (SVG) in
``report.html``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shlex
import shutil
from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from ..collective.run import CollectiveResult
from ..errors import CcsimError
from ..files import check_writable, write_file, write_with
from ..topology.graph import gpu_nodes
from ..workload.engine import WorkloadRun
from .collective import collective_timeline
from .heatmap import (
    HEATMAP_RANKS,
    collective_heatmap_figure,
    rank_rows,
    traffic_heatmaps,
    with_heatmap_counters,
)
from .html import HTML_NAME, collective_page, report_figure, workload_page
from .perfetto import DETAILS, save_trace
from .plots import bandwidth_figure, size_label
from .tables import COLLECTIVE_KEYS, to_csv, to_json
from .timeline import figure_bytes, image_format, timeline_figure
from .workload import workload_figure, workload_timeline

#: Files of a report folder and what they hold.
REPORT_FILES = {
    "results.csv": "the table as CSV",
    "results.json": "the table as JSON",
    "table.txt": "the nccl-tests style table",
    "bandwidth.png": "time and bus bandwidth against message size",
    "timeline.png": "Gantt chart of the last size of the sweep (above "
    f"{HEATMAP_RANKS} ranks: traffic heat-map per server and per rail)",
    "trace.json": "Perfetto trace of the last size (open at https://ui.perfetto.dev)",
    "run.json": "command, versions, inputs and topology summary, to rerun",
    "README.md": "this summary",
    HTML_NAME: "this report as one web page (figures, tables, parameters; works offline)",
}

_PACKAGES = ("ccsim", "numpy", "simpy", "networkx", "matplotlib", "pyyaml")


def check_report_dir(path: str | Path, *, force: bool = False) -> Path:
    """Check that a report can go to ``path``: absent, an empty folder, or ``force``.

    Raises :class:`~simulator.errors.CcsimError` (one line, naming the fix) otherwise.
    Nothing is created here: the folder is made when the report is written.
    """
    path = check_writable(path, option="--report", folder=True)
    if path.is_dir() and any(path.iterdir()) and not force:
        raise CcsimError(
            f"--report folder {str(path)!r} is not empty; choose a new folder or add "
            "--force to overwrite the report files in it"
        )
    return path


def topology_summary(graph: nx.Graph) -> dict[str, Any]:
    """Counts, link types and a SHA-256 of ``graph`` (attributes included).

    The hash is over a canonical listing of nodes and edges with their attributes, so
    two runs with the same hash ran on the same topology.

    >>> from simulator.topology import ring_graph
    >>> s = topology_summary(ring_graph(4, 1e9, 1e-6))
    >>> s["gpus"], s["nodes"], s["links"][0]["count"], s["links"][0]["bandwidth_GBps"]
    (4, {'gpu': 4}, 4, [1.0])
    """
    kind = {node: str(data.get("kind", "")) for node, data in graph.nodes(data=True)}
    servers = {graph.nodes[node].get("server") for node in gpu_nodes(graph)} - {None}
    groups: dict[tuple[str, str], dict[str, set]] = {}
    counts: Tally = Tally()
    for u, v, data in graph.edges(data=True):
        ends = "-".join(sorted((kind[u], kind[v])))
        key = (str(data.get("link", "")), ends)
        counts[key] += 1
        entry = groups.setdefault(key, {"bandwidth": set(), "latency": set()})
        entry["bandwidth"].add(float(data["bandwidth"]) / 1e9)
        entry["latency"].add(float(data.get("latency", 0.0)) * 1e6)
    canonical = json.dumps(
        {
            "directed": graph.is_directed(),
            "graph": {str(k): v for k, v in graph.graph.items()},
            "nodes": sorted([str(n), sorted(d.items())] for n, d in graph.nodes(data=True)),
            "edges": sorted(
                [*sorted([str(u), str(v)]), sorted(d.items())] for u, v, d in graph.edges(data=True)
            ),
        },
        sort_keys=True,
        default=str,
    )
    return {
        "name": str(graph.graph.get("name", "")),
        "directed": graph.is_directed(),
        "gpus": len(gpu_nodes(graph)),
        "servers": len(servers),
        "nodes": dict(sorted(Tally(kind.values()).items())),
        "links": [
            {
                "link": link,
                "ends": ends,
                "count": counts[(link, ends)],
                "bandwidth_GBps": sorted(groups[(link, ends)]["bandwidth"]),
                "latency_us": sorted(groups[(link, ends)]["latency"]),
            }
            for link, ends in sorted(groups)
        ],
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _source_file(value: Any, presets: Any) -> Path | None:
    """The file an argument was read from: a path, or a bundled preset of ``presets()``."""
    if value is None or isinstance(value, nx.Graph):
        return None
    path = Path(str(value))
    if path.is_file():
        return path
    try:
        return presets().get(str(value))
    except Exception:  # the report is still useful without the copy
        return None


def _topology_file(topology: Any) -> Path | None:
    """The file a ``--topology`` value was read from: a path, or a bundled preset."""
    from ..topology.presets import preset_files

    return _source_file(topology, preset_files)


def write_collective_report(
    directory: str | Path,
    *,
    rows: Sequence[Mapping[str, Any]],
    result: CollectiveResult,
    graph: nx.Graph,
    table: str,
    argv: Sequence[str] = (),
    inputs: Mapping[str, Any] | None = None,
    topology: Any = None,
    force: bool = False,
    trace_detail: Sequence[str] | None = None,
    trace_ranks: Sequence[tuple[int, int]] | None = None,
) -> list[Path]:
    """Write a report folder (see the module docstring); return the files written.

    Parameters
    ----------
    directory : path
        The folder; created if absent. Refused if not empty, unless ``force``.
    rows : sequence of mappings
        The sweep's result rows (:meth:`CollectiveResult.row`).
    result : CollectiveResult
        The run drawn in the timeline and trace (the CLI passes the last size).
    graph : networkx graph
        The topology it ran on.
    table : str
        The nccl-tests style table text.
    argv : sequence of str
        The command's arguments after ``ccsim``.
    inputs : mapping, optional
        The resolved inputs (op, sizes in bytes, options), recorded in ``run.json``.
    topology : str, path or graph, optional
        What ``--topology`` named: its file is copied into the folder.
    trace_detail, trace_ranks : optional
        What ``trace.json`` holds (:func:`~simulator.viz.perfetto.select`; default:
        everything).
    """
    directory = check_report_dir(directory, force=force)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def put(name: str, data: str | bytes) -> None:
        written.append(write_file(directory / name, data))

    put("results.csv", to_csv(rows, COLLECTIVE_KEYS))
    put("results.json", to_json(rows))
    put("table.txt", table)
    title = f"{result.algorithm} {result.op} · {result.ranks} ranks"
    bandwidth = bandwidth_figure(rows, title=title)
    put("bandwidth.png", figure_bytes(bandwidth, "png"))
    large = result.ranks > HEATMAP_RANKS
    links = not large or not {"links", "counters"}.isdisjoint(trace_detail or DETAILS)
    timeline = collective_timeline(result, graph, links=links)
    maps = traffic_heatmaps(result, graph) if large else None
    gantt = (
        collective_heatmap_figure(result, graph, maps=maps) if large else timeline_figure(timeline)
    )
    put("timeline.png", figure_bytes(gantt, "png"))
    figures = [
        report_figure(bandwidth, "bandwidth.png", REPORT_FILES["bandwidth.png"]),
        report_figure(gantt, "timeline.png", REPORT_FILES["timeline.png"]),
    ]
    timeline, trace_ranks = _large_trace(result, graph, timeline, trace_ranks, maps)
    save_trace(timeline, directory / "trace.json", detail=trace_detail, ranks=trace_ranks)
    written.append(directory / "trace.json")
    source = _topology_file(topology)
    copied = None
    if source is not None:
        copied = f"topology{source.suffix}"
        with source.open("rb") as original:
            write_with(directory / copied, lambda stream: shutil.copyfileobj(original, stream))
        written.append(directory / copied)

    command = "ccsim " + shlex.join(argv) if argv else ""
    summary = topology_summary(graph)
    run = {
        "command": command,
        "argv": list(argv),
        "versions": _versions(),
        "inputs": dict(inputs or {}),
        "timeline_size_bytes": result.size_bytes,
        "topology": {
            "source": str(topology) if topology is not None else None,
            "file": copied,
            **summary,
        },
        "files": {
            p.name: REPORT_FILES.get(p.name, "topology file --topology named") for p in written
        },
    }
    run["files"][HTML_NAME] = REPORT_FILES[HTML_NAME]
    readme = _readme(command, run, rows, table)
    put("README.md", readme)
    run["files"]["README.md"] = REPORT_FILES["README.md"]
    run["files"]["run.json"] = REPORT_FILES["run.json"]
    put(HTML_NAME, collective_page(run, rows, COLLECTIVE_KEYS, table, figures))
    put("run.json", json.dumps(run, indent=2, default=str) + "\n")
    return written


def _readme(command: str, run: Mapping[str, Any], rows, table: str) -> str:
    topo = run["topology"]
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items())
    lines = [
        "# ccsim report",
        "",
        "## Command",
        "",
        "```bash",
        command or "(called from Python; see run.json for the inputs)",
        "```",
        "",
        f"Versions: {versions}.",
        "",
        "To rerun, install the same ccsim version and run the command from the folder it was",
        "run in. "
        + (
            f"`{topo['file']}` is the topology file it read; pass "
            f"`--topology {topo['file']}` if the preset has changed since."
            if topo.get("file")
            else ""
        ),
        "",
        "## Topology",
        "",
        f"{topo['name'] or 'graph'}: {topo['gpus']} GPUs, {topo['servers']} server(s); nodes "
        + ", ".join(f"{n} {k}" for k, n in topo["nodes"].items())
        + f". SHA-256 of the graph: `{topo['sha256']}`.",
        "",
        "| link | ends | count | bandwidth (GB/s per direction) | latency (us) |",
        "|---|---|---|---|---|",
    ]
    for link in topo["links"]:
        lines.append(
            f"| {link['link']} | {link['ends']} | {link['count']} | "
            f"{', '.join(f'{b:g}' for b in link['bandwidth_GBps'])} | "
            f"{', '.join(f'{x:g}' for x in link['latency_us'])} |"
        )
    lines += [
        "",
        "## Results",
        "",
        "```text",
        table.rstrip("\n"),
        "```",
        "",
        "![bandwidth](bandwidth.png)",
        "",
        f"## Timeline of the last size ({size_label(run['timeline_size_bytes'])}, "
        f"{run['timeline_size_bytes']:.0f} bytes)",
        "",
        "![timeline](timeline.png)",
        "",
        "`trace.json` opens in https://ui.perfetto.dev.",
        "",
        "## Files",
        "",
    ]
    for name, text in run["files"].items():
        lines.append(f"- `{name}`: {text}")
    lines += ["- `README.md`: this summary", "- `run.json`: " + REPORT_FILES["run.json"], ""]
    return "\n".join(lines)


def check_output_options(
    *,
    timeline: str | None = None,
    trace: str | None = None,
    report: str | None = None,
    force: bool = False,
    heatmap: str | None = None,
) -> None:
    """Check ``--timeline``, ``--trace``, ``--heatmap`` and ``--report`` before any
    simulation runs.

    Raises :class:`~simulator.errors.CcsimError` naming the option and the fix, so a bad
    output name fails at once rather than after a long sweep.
    """
    if timeline:
        image_format(timeline)
    if heatmap:
        try:
            image_format(heatmap)
        except CcsimError as error:
            raise CcsimError(f"--heatmap: {error}") from None
    for option, value in (("--timeline", timeline), ("--trace", trace), ("--heatmap", heatmap)):
        if value:
            check_writable(value, option=option)
    if report:
        check_report_dir(report, force=force)


def write_collective_outputs(
    result: CollectiveResult,
    graph: nx.Graph,
    *,
    rows: Sequence[Mapping[str, Any]],
    table: str,
    timeline: str | None = None,
    trace: str | None = None,
    report: str | None = None,
    force: bool = False,
    argv: Sequence[str] = (),
    inputs: Mapping[str, Any] | None = None,
    topology: Any = None,
    trace_detail: Sequence[str] | None = None,
    trace_ranks: Sequence[tuple[int, int]] | None = None,
    heatmap: str | None = None,
) -> None:
    """Write what ``--timeline``, ``--trace``, ``--heatmap`` and ``--report`` ask for,
    each atomically.

    ``result`` is the run drawn (the CLI passes the sweep's last size); the other
    arguments are those of :func:`write_collective_report`. Link rows, whose load can
    take as long to rebuild as the run took, are built only if the picture or the trace
    shows them. Above :data:`~.heatmap.HEATMAP_RANKS` ranks the timeline picture is the
    heat-map (:func:`~.heatmap.collective_heatmap_figure`), and the trace carries the
    heat-map's rows as counters and, unless ``trace_ranks`` says otherwise, the slices
    of one server's ranks only (:func:`_large_trace`).
    """
    large = result.ranks > HEATMAP_RANKS
    heat_figure = maps = None
    if heatmap or (large and (timeline or trace)):
        maps = traffic_heatmaps(result, graph)
    if heatmap or (timeline and large):
        heat_figure = collective_heatmap_figure(result, graph, maps=maps)
    if heatmap:
        write_file(heatmap, figure_bytes(heat_figure, image_format(heatmap)))
    if timeline or trace:
        gantt = bool(timeline) and not large
        links = gantt or not {"links", "counters"}.isdisjoint(trace_detail or DETAILS)
        records = collective_timeline(result, graph, links=links)
        if timeline:
            fig = heat_figure if large else timeline_figure(records)
            write_file(timeline, figure_bytes(fig, image_format(timeline)))
        if trace:
            records, ranks = _large_trace(result, graph, records, trace_ranks, maps)
            save_trace(records, trace, detail=trace_detail, ranks=ranks)
    if report:
        write_collective_report(
            report,
            rows=rows,
            result=result,
            graph=graph,
            table=table,
            argv=argv,
            inputs=inputs,
            topology=topology,
            force=force,
            trace_detail=trace_detail,
            trace_ranks=trace_ranks,
        )


def _large_trace(
    result: CollectiveResult,
    graph: nx.Graph,
    records,
    ranks: Sequence[tuple[int, int]] | None,
    maps=None,
):
    """The records and ranks a trace of ``result`` holds: as given up to
    :data:`~.heatmap.HEATMAP_RANKS` ranks; above, with the heat-map rows as counter
    tracks (:func:`~.heatmap.with_heatmap_counters`), and when no ``ranks`` are given
    and the records list every rank (not the representatives of a symmetric run, which
    are few already), the slices of server 0's ranks only, so that the trace's size
    does not grow with the ranks. ``maps``: the heat-maps if already made."""
    if result.ranks <= HEATMAP_RANKS:
        return records, ranks
    maps = traffic_heatmaps(result, graph) if maps is None else maps
    note = ""
    if ranks is None and result.params.get("flows") != "representatives":
        server = rank_rows(graph, "server")
        last = int(np.argmax(server != server[0])) - 1 if (server != server[0]).any() else 0
        ranks = [(0, last)]
        note = f"slices of ranks 0-{last} only (server 0); choose others with --trace-ranks"
    return with_heatmap_counters(records, maps, note=note), ranks


# -- ccsim run: workload timelines and reports -------------------------------------------

#: Files of a workload report folder (``ccsim run --report DIR``) and what they hold.
WORKLOAD_REPORT_FILES = {
    "breakdown.txt": "the step-time breakdown table, with one row per rank",
    "breakdown.csv": "the per-rank breakdown as CSV (the --format csv output)",
    "breakdown.json": "the summary and per-rank rows as JSON (--format json --per-rank)",
    "timeline.png": "Gantt chart of every rank's streams over the step",
    "trace.json": "Perfetto trace of the step (open at https://ui.perfetto.dev)",
    "run.json": "command, versions, inputs and topology summary, to rerun",
    "README.md": "this summary",
    HTML_NAME: REPORT_FILES[HTML_NAME],
}


def _workload_file(workload: Any) -> Path | None:
    """The file a workload argument was read from: a path, or a bundled preset."""
    from ..workload.presets import preset_files

    return _source_file(workload, preset_files)


def write_workload_report(
    directory: str | Path,
    *,
    run: WorkloadRun,
    graph: nx.Graph,
    table: str,
    summary: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    argv: Sequence[str] = (),
    inputs: Mapping[str, Any] | None = None,
    topology: Any = None,
    workload: Any = None,
    force: bool = False,
    trace_detail: Sequence[str] | None = None,
    trace_ranks: Sequence[tuple[int, int]] | None = None,
) -> list[Path]:
    """Write a workload report folder (:data:`WORKLOAD_REPORT_FILES`); return the files.

    Parameters
    ----------
    directory : path
        The folder; created if absent. Refused if not empty, unless ``force``.
    run : WorkloadRun
        The replay drawn in the timeline and trace.
    graph : networkx graph
        The topology it ran on.
    table : str
        The breakdown table text.
    summary, ranks : mapping, sequence of mappings
        The summary row and the per-rank rows (``ccsim run --format json --per-rank``).
    argv : sequence of str
        The command's arguments after ``ccsim``.
    inputs : mapping, optional
        The resolved inputs, recorded in ``run.json``.
    topology, workload : str, path or graph, optional
        What the command named: their files (a path, or a bundled preset's file) are
        copied into the folder as ``topology.<ext>`` and ``workload.<ext>``.
    trace_detail, trace_ranks : optional
        What ``trace.json`` holds, as for :func:`write_collective_report`.

    Like :func:`write_collective_report`, every file is written atomically and
    ``run.json`` last, so a folder that has it is complete.
    """
    directory = check_report_dir(directory, force=force)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    describe = dict(WORKLOAD_REPORT_FILES)

    def put(name: str, data: str | bytes) -> None:
        written.append(write_file(directory / name, data))

    put("breakdown.txt", table)
    put("breakdown.csv", to_csv(list(ranks)))
    put("breakdown.json", to_json([dict(summary), *ranks]))
    records = workload_timeline(run, graph)
    gantt = workload_figure(records)
    put("timeline.png", figure_bytes(gantt, "png"))
    figures = [report_figure(gantt, "timeline.png", describe["timeline.png"])]
    save_trace(records, directory / "trace.json", detail=trace_detail, ranks=trace_ranks)
    written.append(directory / "trace.json")
    copies: dict[str, str | None] = {}
    for role, source in (
        ("topology", _topology_file(topology)),
        ("workload", _workload_file(workload)),
    ):
        copies[role] = None
        if source is None:
            continue
        name = f"{role}{source.suffix}"
        with source.open("rb") as original:
            write_with(directory / name, lambda stream: shutil.copyfileobj(original, stream))
        written.append(directory / name)
        copies[role] = name
        describe[name] = f"the {role} file the command read"

    command = "ccsim " + shlex.join(argv) if argv else ""
    info = {
        "command": command,
        "argv": list(argv),
        "versions": _versions(),
        "inputs": dict(inputs or {}),
        "workload": {
            "source": str(workload) if workload is not None else None,
            "file": copies["workload"],
            "name": run.workload.name,
            "description": run.workload.description,
            "ranks": run.workload.ranks,
            "ops": len(run.workload.ops),
        },
        "step_s": records.meta["step_s"],
        "topology": {
            "source": str(topology) if topology is not None else None,
            "file": copies["topology"],
            **topology_summary(graph),
        },
        "files": {p.name: describe[p.name] for p in written},
    }
    info["files"][HTML_NAME] = describe[HTML_NAME]
    info["files"]["README.md"] = describe["README.md"]
    info["files"]["run.json"] = describe["run.json"]
    put("README.md", _workload_readme(command, info, table))
    put(HTML_NAME, workload_page(info, summary, ranks, table, figures))
    put("run.json", json.dumps(info, indent=2, default=str) + "\n")
    return written


def _workload_readme(command: str, run: Mapping[str, Any], table: str) -> str:
    topo, work = run["topology"], run["workload"]
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items())
    rerun = [
        f"`{name}` is the {role} file it read; pass it instead of the preset name if the "
        "preset has changed since."
        for role, name in (("workload", work["file"]), ("topology", topo["file"]))
        if name
    ]
    lines = [
        "# ccsim workload report",
        "",
        "## Command",
        "",
        "```bash",
        command or "(called from Python; see run.json for the inputs)",
        "```",
        "",
        f"Versions: {versions}.",
        "",
        "To rerun, install the same ccsim version and run the command from the folder it was",
        "run in. " + " ".join(rerun),
        "",
        "## Workload and topology",
        "",
        f"{work['name']}: {work['ranks']} ranks, {work['ops']} ops. {work['description']}",
        "",
        f"{topo['name'] or 'graph'}: {topo['gpus']} GPUs, {topo['servers']} server(s). "
        f"SHA-256 of the graph: `{topo['sha256']}`.",
        "",
        "## Step-time breakdown",
        "",
        "```text",
        table.rstrip("\n"),
        "```",
        "",
        "## Timeline",
        "",
        "![timeline](timeline.png)",
        "",
        "`trace.json` opens in https://ui.perfetto.dev: one process per server, one thread",
        "per rank and stream.",
        "",
        "## Files",
        "",
    ]
    lines += [f"- `{name}`: {text}" for name, text in run["files"].items()]
    lines.append("")
    return "\n".join(lines)


def write_workload_outputs(
    run: WorkloadRun,
    graph: nx.Graph,
    *,
    table: str,
    summary: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    timeline: str | None = None,
    trace: str | None = None,
    report: str | None = None,
    force: bool = False,
    argv: Sequence[str] = (),
    inputs: Mapping[str, Any] | None = None,
    topology: Any = None,
    workload: Any = None,
    trace_detail: Sequence[str] | None = None,
    trace_ranks: Sequence[tuple[int, int]] | None = None,
) -> None:
    """Write what ``ccsim run --timeline``, ``--trace`` and ``--report`` ask for.

    Each file is written atomically; the arguments are those of
    :func:`write_workload_report`.
    """
    if timeline or trace:
        records = workload_timeline(run, graph)
        if timeline:
            fig = workload_figure(records)
            write_file(timeline, figure_bytes(fig, image_format(timeline)))
        if trace:
            save_trace(records, trace, detail=trace_detail, ranks=trace_ranks)
    if report:
        write_workload_report(
            report,
            run=run,
            graph=graph,
            table=table,
            summary=summary,
            ranks=ranks,
            argv=argv,
            inputs=inputs,
            topology=topology,
            workload=workload,
            force=force,
            trace_detail=trace_detail,
            trace_ranks=trace_ranks,
        )
