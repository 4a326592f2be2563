"""Workload timelines: the trace of a replay against hand-computed times, the layout of
processes and threads, the Gantt chart, and ``ccsim run --timeline/--trace/--report``.

The topology is two GPUs joined by one full-duplex 100 GB/s link with no latency (as in
tests/test_workload.py), with GPU 1 put in a second server: a ring all-reduce of 1e8
bytes on 2 ranks takes 2 x (1e8 / 2) / 100e9 = 1 ms, a transfer of 5e7 bytes 0.5 ms.
"""

import doctest
import io
import json
import struct
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from PIL import Image

import simulator
from simulator.cli import main
from simulator.topology import load_topology, ring_graph
from simulator.viz import figure_bytes, save_trace, trace_events
from simulator.viz import workload as workload_module
from simulator.viz.timeline import kind_colors
from simulator.viz.workload import KINDS, STREAMS_HEADER, workload_figure, workload_timeline
from simulator.workload import run_workload

MS = 1e-3


def two_servers():
    """GPU 0 in server 0, GPU 1 in server 1, one 100 GB/s link between them."""
    graph = ring_graph(2, 100e9, 0.0)
    graph.nodes["gpu1"]["server"] = 1
    return graph


def hand_workload():
    """Rank 0 computes 1 ms, rank 1 3 ms; then both all-reduce 1e8 bytes on their comm
    stream: rank 0 issues it at 1 ms and waits for rank 1 until 3 ms; it runs 3-4 ms.
    Rank 1 posts a recv of 5e7 bytes on its p2p stream at once; rank 0 sends it after
    its all-reduce, at 4 ms: the recv waits 0-4 ms, the transfer runs 4-4.5 ms."""
    ops = [
        {"id": "c0", "rank": 0, "kind": "compute", "duration": "1ms", "label": "fwd"},
        {
            "id": "a0",
            "rank": 0,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 1e8,
            "deps": ["c0"],
            "label": "grads",
        },
        {
            "id": "s0",
            "rank": 0,
            "kind": "send",
            "peer": 1,
            "bytes": 5e7,
            "stream": "p2p",
            "deps": ["a0"],
        },
        {"id": "c1", "rank": 1, "kind": "compute", "duration": "3ms", "label": "fwd"},
        {
            "id": "a1",
            "rank": 1,
            "kind": "collective",
            "op": "all_reduce",
            "group": "dp",
            "bytes": 1e8,
            "deps": ["c1"],
            "label": "grads",
        },
        {"id": "r1", "rank": 1, "kind": "recv", "peer": 0, "bytes": 5e7, "stream": "p2p"},
    ]
    return {
        "format": "ccsim-workload/1",
        "name": "hand",
        "ranks": 2,
        "groups": {"dp": {"kind": "DP", "ranks": [0, 1]}},
        "ops": ops,
    }


@pytest.fixture(scope="module")
def hand():
    graph = two_servers()
    run, _ = run_workload(hand_workload(), graph, algorithm="ring")
    return run, graph


@pytest.fixture(scope="module")
def hand_trace(hand):
    run, graph = hand
    return list(trace_events(workload_timeline(run, graph)))


def thread_names(events):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}


def test_trace_times_are_microseconds_worked_out_by_hand(hand_trace):
    threads = thread_names(hand_trace)
    spans = sorted(
        (threads[(e["pid"], e["tid"])], e["cat"], e["name"], e["ts"], e["dur"])
        for e in hand_trace
        if e["ph"] == "X"
    )
    expected = sorted(
        [
            ("rank 0 compute", "compute", "fwd", 0.0, 1000.0),
            ("rank 0 comm", "waiting", "wait: grads", 1000.0, 2000.0),
            ("rank 0 comm", "DP collective", "grads", 3000.0, 1000.0),
            ("rank 0 p2p", "send", "send to rank 1", 4000.0, 500.0),
            ("rank 1 compute", "compute", "fwd", 0.0, 3000.0),
            ("rank 1 comm", "DP collective", "grads", 3000.0, 1000.0),
            ("rank 1 p2p", "waiting", "wait: recv from rank 0", 0.0, 4000.0),
            ("rank 1 p2p", "recv", "recv from rank 0", 4000.0, 500.0),
        ]
    )
    assert [s[:3] for s in spans] == [s[:3] for s in expected]
    for got, want in zip(spans, expected, strict=True):
        assert got[3:] == pytest.approx(want[3:], abs=1e-6), got


def test_trace_layout_one_process_per_server_thread_per_rank_and_stream(hand_trace):
    processes = {e["pid"]: e["args"]["name"] for e in hand_trace if e["name"] == "process_name"}
    assert processes == {1: "server 0", 2: "server 1"}
    # Threads in order: the compute stream first, then the others as the trace names them.
    assert thread_names(hand_trace) == {
        (1, 1): "rank 0 compute",
        (1, 2): "rank 0 comm",
        (1, 3): "rank 0 p2p",
        (2, 1): "rank 1 compute",
        (2, 2): "rank 1 comm",
        (2, 3): "rank 1 p2p",
    }
    # Every span sits on a thread that was named; no thread needed a second lane.
    named = set(thread_names(hand_trace))
    assert {(e["pid"], e["tid"]) for e in hand_trace if e["ph"] == "X"} <= named


def test_trace_args_carry_bytes_group_and_peer(hand_trace):
    by_id = {}
    for e in hand_trace:
        if e["ph"] == "X" and e["cat"] != "waiting":
            by_id[e["args"]["id"]] = e["args"]
    assert by_id["a0"] == {"id": "a0", "bytes": 100_000_000, "group": "dp", "op": "all_reduce"}
    assert by_id["s0"] == {"id": "s0", "bytes": 50_000_000, "peer": 1}
    assert by_id["c0"] == {"id": "c0"}  # timed by a duration: no FLOPs to show
    waits = [e["args"] for e in hand_trace if e.get("cat") == "waiting"]
    assert sorted(w["id"] for w in waits) == ["a0", "r1"]


def test_trace_file_is_valid_json(tmp_path, hand):
    run, graph = hand
    path = tmp_path / "trace.json"
    save_trace(workload_timeline(run, graph), path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["otherData"]["workload"] == "hand"
    assert data["otherData"]["step_s"] == pytest.approx(4.5 * MS)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_is_deterministic_and_of_the_requested_size(hand):
    run, graph = hand
    first, second = (
        figure_bytes(workload_figure(workload_timeline(run, graph), width=1000, height=400))
        for _ in range(2)  # a fresh timeline and figure each time
    )
    assert first == second
    assert png_size(first) == (1000, 400)


def test_picture_shows_each_kind_in_its_colour(hand):
    """Waiting is drawn in its own colour; the colours follow KINDS in every workload."""
    run, graph = hand
    timeline = workload_timeline(run, graph)
    assert timeline.kinds[: len(KINDS)] == list(KINDS)
    fig = workload_figure(timeline, width=1000, height=400)
    assert STREAMS_HEADER in [text.get_text() for ax in fig.axes for text in ax.texts]
    pixels = np.asarray(Image.open(io.BytesIO(figure_bytes(fig))).convert("RGB"))
    colors = kind_colors(timeline.kinds)
    for kind in ("compute", "DP collective", "waiting", "send", "recv"):
        rgb = [int(colors[kind][i : i + 2], 16) for i in (1, 3, 5)]
        assert np.all(pixels == rgb, axis=2).sum() > 100, kind


@pytest.fixture(scope="module")
def nine_servers():
    """72 ranks on 9 DGX A100 servers: 1 ms of compute, then an all-reduce of 1 MiB over
    each server's 8 ranks on the comm stream: 144 tracks."""
    ops, groups = [], {}
    for server in range(9):
        members = list(range(8 * server, 8 * server + 8))
        groups[f"tp{server}"] = {"kind": "TP", "ranks": members}
        for rank in members:
            ops.append({"id": f"c{rank}", "rank": rank, "kind": "compute", "duration": "1ms"})
            ops.append(
                {
                    "id": f"a{rank}",
                    "rank": rank,
                    "kind": "collective",
                    "op": "all_reduce",
                    "group": f"tp{server}",
                    "bytes": 2**20,
                    "deps": [f"c{rank}"],
                }
            )
    trace = {"format": "ccsim-workload/1", "name": "wide", "ranks": 72, "groups": groups}
    graph = load_topology("dgx-a100", 9)
    run, _ = run_workload({**trace, "ops": ops}, graph, algorithm="ring")
    return workload_timeline(run, graph)


def row_labels(fig):
    return [label.get_text() for ax in fig.axes for label in ax.get_yticklabels()]


def test_many_ranks_merge_per_server_and_stream_then_into_server_bins(nine_servers):
    assert len(nine_servers.tracks) == 144
    labels = row_labels(workload_figure(nine_servers, width=800))
    assert labels == [
        f"server {s} {stream} (8 ranks)" for s in range(9) for stream in ("compute", "comm")
    ]
    # 6 rows for 2 streams: 3 bins of 3 servers, the same for both streams.
    labels = row_labels(workload_figure(nine_servers, width=800, max_rows=6))
    assert labels == [
        f"server {a} … server {a + 2} {stream} (24 ranks)"
        for a in (0, 3, 6)
        for stream in ("compute", "comm")
    ]


def test_a_graph_without_servers_groups_ranks_in_blocks():
    graph = ring_graph(2, 100e9, 0.0)
    for node in graph.nodes:
        del graph.nodes[node]["server"]
    run, _ = run_workload(hand_workload(), graph, algorithm="ring")
    timeline = workload_timeline(run, graph)
    assert {t.group for t in timeline.tracks} == {""}
    assert [t.category for t in timeline.tracks[:2]] == ["ranks 0-1 compute", "ranks 0-1 comm"]


def test_docstring_examples_run():
    assert doctest.testmod(workload_module).failed == 0


# -- ccsim run --timeline / --trace / --report ------------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    workload = folder / "hand.json"
    workload.write_text(json.dumps(hand_workload()))
    topology = folder / "two.graphml"
    nx.write_graphml(two_servers(), topology)
    return workload, topology


def test_run_writes_timeline_trace_and_report(tmp_path, inputs, capsys):
    workload, topology = inputs
    png, trace, report = tmp_path / "t.png", tmp_path / "t.json", tmp_path / "report"
    argv = ["run", str(workload), "--topology", str(topology), "--algo", "ring"]
    argv += ["--timeline", str(png)]
    argv += ["--trace", str(trace), "--report", str(report)]
    assert main(argv) == 0
    assert "step time" in capsys.readouterr().out  # the table still prints
    assert png_size(png.read_bytes())[0] == 1600
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    assert next(e for e in events if e.get("cat") == "DP collective")["dur"] == pytest.approx(1000)

    names = sorted(p.name for p in report.iterdir())
    assert names == sorted(
        [
            "README.md",
            "report.html",
            "breakdown.csv",
            "breakdown.json",
            "breakdown.txt",
            "run.json",
            "timeline.png",
            "topology.graphml",
            "trace.json",
            "workload.json",
        ]
    )
    rows = json.loads((report / "breakdown.json").read_text())
    assert rows[0]["step_s"] == pytest.approx(4.5 * MS)
    assert [r["rank"] for r in rows[1:]] == [0, 1]
    assert len((report / "breakdown.csv").read_text().splitlines()) == 3  # header + 2 ranks
    assert "     1 " in (report / "breakdown.txt").read_text()  # per-rank rows included
    info = json.loads((report / "run.json").read_text())
    assert info["argv"] == argv and info["command"].startswith("ccsim run ")
    assert info["versions"]["ccsim"] == simulator.__version__
    assert info["inputs"]["workload"] == str(workload)
    assert info["workload"]["ranks"] == 2 and info["topology"]["servers"] == 2
    assert set(info["files"]) == set(names)
    assert (report / "workload.json").read_bytes() == workload.read_bytes()
    assert (report / "trace.json").read_bytes() == trace.read_bytes()

    first = png.read_bytes()
    assert main(argv[:6]) == 0  # --timeline only
    assert png.read_bytes() == first  # same command, same picture


def run_cli(*args):
    command = [sys.executable, "-m", "simulator", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_non_empty_report_folder_is_refused_before_the_replay(tmp_path, inputs):
    workload, topology = inputs
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    argv = ["run", str(workload), "--topology", str(topology), "--algo", "ring"]
    argv += ["--report", str(folder)]
    done = run_cli(*argv)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not empty" in lines[0] and "--force" in lines[0]
    assert done.stdout == ""
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    done = run_cli(*argv, "--force")
    assert done.returncode == 0, done.stderr
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "run.json").is_file()


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--timeline", "plot.jpg", [".png", ".svg"]),
        ("--trace", "missing/trace.json", ["does not exist"]),
    ],
)
def test_bad_output_names_fail_at_once_with_one_line(
    tmp_path, monkeypatch, capsys, inputs, option, value, words
):
    workload, topology = inputs
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(workload), "--topology", str(topology), option, value]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words)


def test_a_plain_run_does_not_load_matplotlib(inputs):
    workload, topology = inputs
    code = (
        "import sys; from simulator.cli import main; "
        f"main(['run', {str(workload)!r}, '--topology', {str(topology)!r}, '--algo', 'ring']); "
        "print('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("False")


def test_help_documents_the_output_options():
    done = run_cli("run", "--help")
    for option in ("--timeline", "--trace", "--report", "--force", "microseconds"):
        assert option in done.stdout
