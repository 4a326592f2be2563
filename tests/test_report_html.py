"""``report.html`` of ``--report DIR``: one self-contained page, checked in a real browser.

A collective report and a workload report are written through the CLI; headless Chromium
(Debian's /usr/bin/chromium, no downloaded browser) opens each ``report.html`` with a
probe script appended that measures the rendered page and writes what it found into the
DOM, which ``--dump-dom`` prints. The numbers it is checked against come from elsewhere:
the figures the Markdown report shows (its ``![..](*.png)`` lines), the rows of
``results.csv``, the files in the folder and the command in ``run.json``.
"""

import csv
import html
import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import networkx as nx
import pytest

from simulator.cli import main
from simulator.topology import ring_graph

CHROMIUM = Path("/usr/bin/chromium")
# CI installs Chromium (.ci/run): there a missing browser fails rather than skips, so a
# broken page cannot pass unseen.
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists() and not os.environ.get("CI"),
    reason="headless Chromium is not installed at /usr/bin/chromium "
    "(apt-get install chromium; .ci/run installs it in CI)",
)

#: Appended before </body>: measures the page once it has loaded, then writes the
#: measurements into the DOM as JSON for --dump-dom.
PROBE = """
<script>
window.addEventListener("load", async () => {
  const out = {figures: [], images: [], embedded: [], links: [], ids: [], tables: {}};
  out.declared = document.querySelector('meta[name="ccsim-figures"]').content;
  out.svgs = document.querySelectorAll("svg").length;
  for (const svg of document.querySelectorAll("figure > svg")) {
    const box = svg.getBoundingClientRect();
    // Glyphs and tick marks are <use> references to paths by id: a broken reference
    // draws nothing. Count the references whose target is missing, and those whose
    // target has a size but which drew nothing (a space glyph is an empty path).
    const uses = Array.from(svg.querySelectorAll("use"));
    let missing = 0, blank = 0;
    for (const use of uses) {
      const ref = (use.getAttribute("xlink:href") || use.getAttribute("href")).slice(1);
      const target = document.getElementById(ref);
      if (!target) { missing += 1; continue; }
      const size = b => b.width > 0 || b.height > 0;
      if (size(target.getBBox()) && !size(use.getBBox())) blank += 1;
    }
    out.figures.push({id: svg.parentElement.id, width: box.width, height: box.height,
                      uses: uses.length, missing: missing, blank: blank});
  }
  out.images = Array.from(document.images, i => [i.complete, i.naturalWidth]);
  for (const image of document.querySelectorAll("svg image")) {
    const copy = new Image();
    copy.src = image.getAttribute("xlink:href") || image.getAttribute("href");
    let width = 0;
    try { await copy.decode(); width = copy.naturalWidth; } catch (error) { width = -1; }
    const box = image.getBoundingClientRect();
    out.embedded.push([width, box.width, box.height]);
  }
  out.links = Array.from(document.querySelectorAll("a[href]"), a => a.href);
  out.ids = Array.from(document.querySelectorAll("[id]"), e => e.id);
  for (const section of document.querySelectorAll("section")) {
    const table = section.querySelector("table");
    if (table) {
      out.tables[section.id] = Array.from(table.querySelectorAll("tbody tr"),
        tr => Array.from(tr.cells, td => td.textContent));
    }
  }
  out.command = document.querySelector("#command code").textContent;
  out.bold = document.querySelectorAll("b").length;
  out.resources = performance.getEntriesByType("resource").map(e => e.name);
  const pre = document.createElement("pre");
  pre.id = "ccsim-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def measure(page: Path, scratch: Path) -> dict:
    """Open ``page`` (with PROBE added, beside it) in headless Chromium; what PROBE saw."""
    assert CHROMIUM.exists(), "CI must install Chromium before the tests (see .ci/run)"
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"))
    try:
        # A loaded machine can leave the probe unfinished when Chromium's virtual time
        # runs out (the images decode asynchronously); what the page shows does not
        # change between tries, so a second or third try is the same measurement.
        for _ in range(3):
            done = subprocess.run(
                [
                    str(CHROMIUM),
                    "--headless",
                    "--no-sandbox",  # CI runs as root
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing outside loads
                    f"--user-data-dir={scratch}",
                    "--window-size=1280,2000",
                    "--virtual-time-budget=10000",
                    "--dump-dom",
                    probe.as_uri(),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            found = re.search(r'<pre id="ccsim-probe">(.*?)</pre>', done.stdout, re.S)
            if found:
                break
    finally:
        probe.unlink()
    assert found, f"the probe did not run (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(html.unescape(found[1]))


def markdown_figures(folder: Path) -> list[str]:
    """The images README.md shows, in order."""
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (folder / "README.md").read_text())


def check_page(folder: Path, seen: dict) -> None:
    """What every report page must show, whatever its kind."""
    pngs = markdown_figures(folder)
    assert pngs and pngs == sorted(pngs, key=pngs.index)
    assert sorted(pngs) == sorted(p.name for p in folder.glob("*.png"))
    # As many figures as the Markdown report has, each drawn at a real size.
    assert int(seen["declared"]) == len(pngs) == len(seen["figures"]) == seen["svgs"]
    for figure in seen["figures"]:
        assert figure["width"] > 300 and figure["height"] > 100, figure
        assert figure["uses"] > 10 and figure["missing"] == figure["blank"] == 0, figure
    assert all(complete and width > 0 for complete, width in seen["images"])
    for decoded, width, height in seen["embedded"]:  # pictures inside the SVGs
        assert decoded > 0 and width > 0 and height > 0
    assert seen["resources"] == []  # nothing fetched: no CSS, script, font or image
    assert len(seen["ids"]) == len(set(seen["ids"]))  # figures' ids do not collide
    # Every file of the folder is linked, and every link is a file of the folder.
    linked = {Path(unquote(urlparse(href).path)) for href in seen["links"]}
    assert linked == set(folder.iterdir())
    run = json.loads((folder / "run.json").read_text())
    assert seen["command"] == run["command"]
    assert set(run["files"]) == {p.name for p in folder.iterdir()}


@pytest.fixture(scope="module")
def collective(tmp_path_factory):
    # Markup in the folder name reaches the page through the command: it must stay text.
    folder = tmp_path_factory.mktemp("html") / "r<b>&x"
    argv = ["collective", "all_reduce", "--sizes", "1K,1M,64M", "--algo", "ring"]
    assert main([*argv, "--report", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """Two GPUs in two servers, 100 GB/s between them: rank 1 computes 3 ms, then both
    all-reduce 1e8 bytes, which takes 2 x (1e8 / 2) / 100e9 = 1 ms: a 4 ms step."""
    where = tmp_path_factory.mktemp("workload")
    graph = ring_graph(2, 100e9, 0.0)
    graph.nodes["gpu1"]["server"] = 1
    nx.write_graphml(graph, where / "two.graphml")
    ops = [
        {"id": "c0", "rank": 0, "kind": "compute", "duration": "1ms", "label": "fwd"},
        {"id": "c1", "rank": 1, "kind": "compute", "duration": "3ms", "label": "fwd"},
    ]
    ops += [
        {
            "id": f"a{rank}",
            "rank": rank,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 1e8,
            "deps": [f"c{rank}"],
        }
        for rank in (0, 1)
    ]
    spec = {
        "format": "ccsim-workload/1",
        "name": "hand <i>",
        "ranks": 2,
        "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}},
        "ops": ops,
    }
    (where / "hand.json").write_text(json.dumps(spec))
    folder = where / "report"
    argv = ["run", str(where / "hand.json"), "--topology", str(where / "two.graphml")]
    assert main([*argv, "--algo", "ring", "--report", str(folder)]) == 0
    return folder


@needs_chromium
def test_collective_page_renders_every_figure_table_and_link(collective, tmp_path):
    seen = measure(collective / "report.html", tmp_path / "chromium")
    check_page(collective, seen)
    assert len(seen["figures"]) == 2  # bandwidth against size, and the timeline
    assert seen["bold"] == 0  # the <b> of the folder name stayed text
    assert "r<b>&x" in seen["command"]
    with (collective / "results.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    shown = seen["tables"]["results"]
    assert len(shown) == len(rows) == 3
    for cells, row in zip(shown, rows, strict=True):
        assert len(cells) == len(row)
        for cell, value in zip(cells, row.values(), strict=True):
            try:
                assert float(cell) == pytest.approx(float(value), rel=1e-5)
            except ValueError:
                assert cell == value


@needs_chromium
def test_workload_page_renders_its_timeline_and_breakdown(workload, tmp_path):
    seen = measure(workload / "report.html", tmp_path / "chromium")
    check_page(workload, seen)
    assert len(seen["figures"]) == 1
    breakdown = {label: cells for label, *cells in seen["tables"]["step-time-breakdown"]}
    assert float(breakdown["step time"][0]) == pytest.approx(4.0)  # ms, from the docstring
    assert float(breakdown["compute busy"][0]) == pytest.approx(2.0)  # mean of 1 and 3 ms
    assert breakdown["step time"][1] == "100.0%"


def test_page_loads_nothing_and_escapes_user_text(collective, workload):
    for folder in (collective, workload):
        page = (folder / "report.html").read_text(encoding="utf-8")
        assert page.startswith("<!DOCTYPE html>")
        assert not re.search(r"<(script|link|iframe|img|object)\b|@import|\bsrc=", page)
        # The only url() and href targets are ids in the page or files of the folder.
        assert set(re.findall(r"url\((?!#)", page)) == set()
        hrefs = set(re.findall(r'href="([^"#][^"]*)"', page))
        pictures = {h for h in hrefs if h.startswith("data:image/png;base64,")}
        assert hrefs - pictures == {quote(p.name) for p in folder.iterdir()}
    page = (workload / "report.html").read_text(encoding="utf-8")
    assert "hand <i>" not in page and "hand &lt;i&gt;" in page


def test_figures_match_the_pngs_drawn_from_them(collective):
    """The SVG is the PNG's figure saved again: same title, and one per PNG, in order."""
    page = (collective / "report.html").read_text(encoding="utf-8")
    captions = re.findall(r'<figcaption>Figure (\d+)\..*?<a href="([^"]+)">', page, re.S)
    assert captions == [("1", "bandwidth.png"), ("2", "timeline.png")]
    assert markdown_figures(collective) == ["bandwidth.png", "timeline.png"]
