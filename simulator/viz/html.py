"""``report.html``: a report folder as one self-contained web page.

The page holds what the folder's ``README.md`` holds, for a browser: the command and
its parameters, the versions, the topology, the result tables as HTML tables, every
figure inline as SVG (the same matplotlib figures the folder has as PNG), and relative
links to the folder's other files (trace, CSV, JSON, copies of the inputs). It loads
nothing else: no stylesheet, script, font or image from anywhere, so it renders offline
and can be mailed or attached as it is (the links work when it sits in its folder).

Every piece of text that comes from the user or the run (arguments, file names,
workload names and descriptions, table cells) goes through :func:`html.escape`.

>>> page = html_page("a <b> run", [("Command", code_block("ccsim x <y>"))])
>>> "a &lt;b&gt; run" in page and "ccsim x &lt;y&gt;" in page
True
>>> '<meta name="ccsim-figures" content="0">' in page
True
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from matplotlib.figure import Figure

from ..version import __version__
from .plots import size_label
from .timeline import figure_bytes

#: Name of the page in a report folder.
HTML_NAME = "report.html"

#: A collection with more vertices than this is drawn as a picture in the page's SVG.
_RASTER_VERTICES = 2_000

# System fonts only: a web font would be a download, and the page must render offline.
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
pre { background: #f6f8fa; padding: 0.7em; overflow-x: auto; font-size: 0.85em; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f0f2f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; }
figure svg { display: block; width: 100%; height: auto; }
figcaption { font-size: 0.9em; color: #444; margin-top: 0.3em; }
.note { color: #555; font-size: 0.9em; }
"""


@dataclass(frozen=True)
class ReportFigure:
    """One figure of the page: its inline SVG, the PNG beside it and a caption.

    Parameters
    ----------
    file : str
        The PNG file of the same figure in the report folder (linked under it).
    caption : str
        What the figure shows (plain text; escaped on the page).
    svg : str
        The ``<svg>`` element (from :func:`inline_svg`); its ids are prefixed when the
        page numbers it.
    """

    file: str
    caption: str
    svg: str


def inline_svg(fig: Figure) -> str:
    """``fig`` as an ``<svg>`` element to put inside an HTML page.

    The XML prolog, doctype, metadata and comments are dropped (the page is HTML, and
    the metadata names outside addresses). Collections of more than
    :data:`_RASTER_VERTICES` vertices are embedded as PNG pictures (data URIs) inside the
    SVG; axes, text and the other artists stay vector.

    >>> from matplotlib.figure import Figure
    >>> fig = Figure(figsize=(2, 1))
    >>> _ = fig.add_subplot().plot([0, 1], [1, 0])
    >>> svg = inline_svg(fig)
    >>> svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    True
    """
    # Dense collections (the timeline's busy-share bands are one vertex pair per pixel
    # column) are drawn as pictures inside the SVG, at the PNG's resolution: as paths
    # they would weigh megabytes and add nothing the PNG does not show.
    dense = [
        artist
        for ax in fig.axes
        for artist in ax.collections
        if not artist.get_rasterized()
        and sum(len(path.vertices) for path in artist.get_paths()) > _RASTER_VERTICES
    ]
    for artist in dense:
        artist.set_rasterized(True)
    try:
        text = figure_bytes(fig, "svg").decode("utf-8")
    finally:
        for artist in dense:
            artist.set_rasterized(False)
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # matplotlib escapes "--" inside the comments it writes, so the first "-->" ends one.
    return re.sub(r"<!--.*?-->\s*", "", text, flags=re.S)


def prefix_ids(svg: str, prefix: str) -> str:
    """``svg`` with ``prefix`` before every element id and every ``#id`` reference to it.

    matplotlib numbers ``figure_1``, ``axes_1``... from 1 in each figure: prefixed, the
    figures of one page keep their ids unique.

    >>> prefix_ids('<g id="a"><use xlink:href="#a"/><path clip-path="url(#a)"/></g>', "f1-")
    '<g id="f1-a"><use xlink:href="#f1-a"/><path clip-path="url(#f1-a)"/></g>'
    """
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m[1]}"', svg)
    return re.sub(
        r'(href="#|url\(#)([^")]+)',
        lambda m: f"{m[1]}{prefix}{m[2]}" if m[2] in ids else m[0],
        svg,
    )


def report_figure(fig: Figure, file: str, caption: str) -> ReportFigure:
    """``fig`` for the page, beside its PNG ``file`` in the folder."""
    return ReportFigure(file=file, caption=caption, svg=inline_svg(fig))


def format_cell(value: Any) -> str:
    """A value as table text: 6 significant digits for floats, lists joined by commas.

    >>> format_cell(28.659200000000013), format_cell(None), format_cell([1, 2.5])
    ('28.6592', '', '1, 2.5')
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return ", ".join(format_cell(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, default=str)
    return str(value)


def html_table(
    rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]],
    header: Sequence[str] | None = None,
) -> str:
    """An HTML table: ``rows`` of cells under ``header``, or mappings under their keys.

    Numbers are right-aligned; every cell is escaped.

    >>> table = html_table([{"size": 1024, "time_us": 2.5}, {"size": 2048, "time_us": 4.0}])
    >>> table.count("<tr>"), "<th>time_us</th>" in table, '<td class="num">2.5</td>' in table
    (3, True, True)
    >>> "<td>&lt;x&gt;</td>" in html_table([["<x>"]], ["a"])
    True
    """
    if rows and isinstance(rows[0], Mapping):
        keys = list(header) if header is not None else list(rows[0])
        cells = [[row.get(key) for key in keys] for row in rows]  # type: ignore[union-attr]
        header = keys
    else:
        cells = [list(row) for row in rows]  # type: ignore[arg-type]
    lines = ["<table>"]
    if header is not None:
        heads = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
        lines.append(f"<thead><tr>{heads}</tr></thead>")
    lines.append("<tbody>")
    for row in cells:
        tds = []
        for value in row:
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            css = ' class="num"' if numeric else ""
            tds.append(f"<td{css}>{html.escape(format_cell(value))}</td>")
        lines.append(f"<tr>{''.join(tds)}</tr>")
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)


def code_block(text: str) -> str:
    """``text`` as a preformatted block (escaped)."""
    return f"<pre><code>{html.escape(text.rstrip(chr(10)))}</code></pre>"


def paragraph(text: str) -> str:
    """``text`` as a paragraph (escaped)."""
    return f"<p>{html.escape(text)}</p>"


def figure_html(figure: ReportFigure, number: int) -> str:
    """A ``<figure>``: the inline SVG, a numbered caption and a link to the PNG."""
    href = html.escape(quote(figure.file), quote=True)
    caption = figure.caption[:1].upper() + figure.caption[1:]
    label = html.escape(caption, quote=True)
    svg = prefix_ids(figure.svg, f"fig{number}-")
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{label}" ', 1)
    return (
        f'<figure id="figure-{number}">\n{svg}\n'
        f"<figcaption>Figure {number}. {html.escape(caption)} "
        f'(<a href="{href}">{html.escape(figure.file)}</a>)</figcaption>\n</figure>'
    )


def files_list(files: Mapping[str, str]) -> str:
    """The folder's files as a list of relative links with what each holds."""
    items = [
        f'<li><a href="{html.escape(quote(name), quote=True)}"><code>{html.escape(name)}'
        f"</code></a>: {html.escape(text)}</li>"
        for name, text in files.items()
    ]
    return "<ul>\n" + "\n".join(items) + "\n</ul>"


def html_page(
    title: str,
    sections: Sequence[tuple[str, str]],
    *,
    figures: int = 0,
) -> str:
    """The whole page: ``title`` and ``(heading, body HTML)`` sections.

    Bodies are HTML already (built with the functions above, which escape); headings
    and the title are escaped here. ``figures`` is how many figures the page holds,
    recorded in ``<meta name="ccsim-figures">`` for tools and tests that check them.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="ccsim {html.escape(__version__, quote=True)}">',
        f'<meta name="ccsim-figures" content="{int(figures)}">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for heading, body in sections:
        anchor = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
        parts += [f'<section id="{anchor}">', f"<h2>{html.escape(heading)}</h2>", body]
        parts.append("</section>")
    parts += [
        f'<p class="note">Written by ccsim {html.escape(__version__)}; this page loads '
        "nothing from the network.</p>",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


# -- the two kinds of report ----------------------------------------------------------


def _command(run: Mapping[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items())
    command = run["command"] or "(called from Python; see run.json for the inputs)"
    return "\n".join(
        [
            code_block(command),
            paragraph(f"Versions: {versions}."),
            paragraph(
                "To rerun, install the same ccsim version and run the command from the "
                "folder it was run in; run.json holds the same as data."
            ),
        ]
    )


def _parameters(inputs: Mapping[str, Any]) -> str:
    if not inputs:
        return paragraph("No inputs were recorded (see run.json).")
    rows = [[name, "(default)" if value is None else value] for name, value in inputs.items()]
    return html_table(rows, ["parameter", "value"])


def _topology(topo: Mapping[str, Any]) -> str:
    nodes = ", ".join(f"{n} {k}" for k, n in topo["nodes"].items())
    text = (
        f"{topo['name'] or 'graph'}: {topo['gpus']} GPUs, {topo['servers']} server(s); "
        f"nodes {nodes}. SHA-256 of the graph: {topo['sha256']}."
    )
    if topo.get("file"):
        text += f" {topo['file']} is the topology file the command read."
    links = [
        [
            link["link"],
            link["ends"],
            link["count"],
            link["bandwidth_GBps"],
            link["latency_us"],
        ]
        for link in topo["links"]
    ]
    header = ["link", "ends", "count", "bandwidth (GB/s per direction)", "latency (us)"]
    return paragraph(text) + "\n" + html_table(links, header)


def _figures(figures: Sequence[ReportFigure], first: int = 1) -> str:
    return "\n".join(figure_html(f, n) for n, f in enumerate(figures, first))


def collective_page(
    run: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    table: str,
    figures: Sequence[ReportFigure],
) -> str:
    """``report.html`` of a collective report folder.

    Parameters
    ----------
    run : mapping
        The folder's ``run.json`` content (command, versions, inputs, topology, files).
    rows, keys : rows of results and the columns shown (those of ``results.csv``)
    table : str
        The nccl-tests style table, shown as printed.
    figures : sequence of ReportFigure
        The bandwidth plot, then the timeline.
    """
    size = run["timeline_size_bytes"]
    title = f"ccsim report: {run['inputs'].get('op', 'collective')}"
    results = [
        html_table(rows, keys),
        "<details><summary>as printed (nccl-tests style)</summary>",
        code_block(table),
        "</details>",
    ]
    sections = [
        ("Command", _command(run)),
        ("Parameters", _parameters(run["inputs"])),
        ("Topology", _topology(run["topology"])),
        ("Results", "\n".join(results) + "\n" + _figures(figures[:1])),
        (
            f"Timeline of the last size ({size_label(size)}, {size:.0f} bytes)",
            _figures(figures[1:], 2)
            + "\n"
            + paragraph("trace.json opens in the Perfetto UI (ui.perfetto.dev)."),
        ),
        ("Files", files_list(run["files"])),
    ]
    return html_page(title, sections, figures=len(figures))


#: Rows of the workload page's breakdown table: (label, summary key).
_BREAKDOWN = (
    ("step time", "step_s"),
    ("compute busy", "compute_s"),
    ("communication busy", "comm_s"),
    ("overlapped with compute", "overlapped_s"),
    ("exposed communication", "exposed_s"),
    ("waiting for peers", "waiting_s"),
    ("bubble (nothing running)", "bubble_s"),
)


def workload_page(
    run: Mapping[str, Any],
    summary: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    table: str,
    figures: Sequence[ReportFigure],
) -> str:
    """``report.html`` of a workload report folder (``ccsim run --report``).

    Parameters
    ----------
    run : mapping
        The folder's ``run.json`` content (command, versions, inputs, workload, topology,
        files).
    summary, ranks : the summary row and the per-rank rows (``breakdown.json``)
    table : str
        The breakdown table, shown as printed.
    figures : sequence of ReportFigure
        The step's timeline.
    """
    work = run["workload"]
    step = float(summary.get("step_s") or run.get("step_s") or 0.0)
    breakdown = [
        [label, summary[key] * 1e3, f"{summary[key] / step:.1%}" if step else ""]
        for label, key in _BREAKDOWN
        if isinstance(summary.get(key), int | float)
    ]
    parts = [html_table(breakdown, ["", "mean (ms)", "share of the step"])]
    for name, key in (("kind", "exposed_by_kind_s"), ("call", "exposed_by_call_s")):
        by = summary.get(key) or {}
        if by:
            parts.append(
                html_table(
                    [[what, s * 1e3, f"{s / step:.1%}" if step else ""] for what, s in by.items()],
                    [f"exposed communication by {name}", "mean (ms)", "share of the step"],
                )
            )
    if ranks:
        parts += [
            f"<details><summary>per rank ({len(ranks)} rows, seconds)</summary>",
            html_table(list(ranks)),
            "</details>",
        ]
    parts += ["<details><summary>as printed</summary>", code_block(table), "</details>"]
    described = f"{work['name']}: {work['ranks']} ranks, {work['ops']} ops."
    if work.get("description"):
        described += f" {str(work['description']).rstrip('.')}."
    if work.get("file"):
        described += f" {work['file']} is the workload file the command read."
    sections = [
        ("Command", _command(run)),
        ("Parameters", _parameters(run["inputs"])),
        ("Workload", paragraph(described)),
        ("Topology", _topology(run["topology"])),
        ("Step-time breakdown", "\n".join(parts)),
        (
            "Timeline",
            _figures(figures)
            + "\n"
            + paragraph(
                "trace.json opens in the Perfetto UI (ui.perfetto.dev): one process per "
                "server, one thread per rank and stream."
            ),
        ),
        ("Files", files_list(run["files"])),
    ]
    return html_page(f"ccsim workload report: {work['name']}", sections, figures=len(figures))


__all__ = [
    "HTML_NAME",
    "ReportFigure",
    "code_block",
    "collective_page",
    "figure_html",
    "files_list",
    "format_cell",
    "html_page",
    "html_table",
    "inline_svg",
    "paragraph",
    "prefix_ids",
    "report_figure",
    "workload_page",
]
