"""``--timeline``, ``--trace`` and ``--report DIR``: contents, refusal of non-empty
folders, and atomic writes (no half-written file after an interruption)."""

import csv
import json
import os
import struct
import subprocess
import sys

import pytest

import simulator
from simulator import files as atomic
from simulator.cli import main
from simulator.topology.presets import preset_files
from simulator.viz import collective_timeline, save_timeline, save_trace
from simulator.viz import perfetto as perfetto_module

CCSIM = [sys.executable, "-m", "simulator"]


def run(*args):
    return subprocess.run([*CCSIM, *args], capture_output=True, text=True, check=False)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "report"
    argv = [
        "collective",
        "all_reduce",
        "--sizes",
        "1K,1M",
        "--algo",
        "ring",
        "--report",
        str(folder),
    ]
    assert main(argv) == 0
    return folder, argv


def test_report_holds_table_plots_trace_and_inputs(report):
    folder, _ = report
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(
        [
            "README.md",
            "report.html",
            "bandwidth.png",
            "results.csv",
            "results.json",
            "run.json",
            "table.txt",
            "timeline.png",
            "topology.yaml",
            "trace.json",
        ]
    )
    rows = json.loads((folder / "results.json").read_text())
    assert [r["size_bytes"] for r in rows] == [1024, 2**20]
    with (folder / "results.csv").open() as stream:
        table = list(csv.DictReader(stream))
    assert [int(r["size_bytes"]) for r in table] == [1024, 2**20]
    assert float(table[1]["time_us"]) == pytest.approx(rows[1]["time_us"])
    assert (folder / "table.txt").read_text().startswith("# ccsim all_reduce")
    for name in ("bandwidth.png", "timeline.png"):
        width, height = png_size((folder / name).read_bytes())
        assert width > 500 and height > 300
    trace = json.loads((folder / "trace.json").read_text(encoding="utf-8"))
    sizes = {e["args"]["bytes"] for e in trace["traceEvents"] if e.get("cat") == "reduce"}
    assert sizes == {2**20 // 8}  # the trace is the last size: 1 MiB in 8 blocks


def test_run_json_records_command_versions_inputs_and_topology(report):
    folder, argv = report
    run_info = json.loads((folder / "run.json").read_text())
    assert run_info["argv"] == argv
    assert run_info["command"].startswith("ccsim collective all_reduce --sizes 1K,1M")
    assert run_info["versions"]["ccsim"] == simulator.__version__
    inputs = run_info["inputs"]
    assert inputs["sizes_bytes"] == [1024, 2**20] and inputs["algorithm"] == "ring"
    assert inputs["topology"] == "dgx-a100" and inputs["nodes"] == 1
    topology = run_info["topology"]
    assert topology["gpus"] == 8 and topology["servers"] == 1
    assert len(topology["sha256"]) == 64
    nvlink = next(link for link in topology["links"] if link["link"] == "nvlink")
    assert nvlink["count"] == 8 and nvlink["bandwidth_GBps"] == [300.0]
    assert (folder / "topology.yaml").read_bytes() == preset_files()["dgx-a100"].read_bytes()
    assert set(run_info["files"]) == {p.name for p in folder.iterdir()}


def test_non_empty_report_folder_is_refused_unless_forced(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    done = run("collective", "all_reduce", "--sizes", "1K", "--report", str(folder))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not empty" in lines[0] and "--force" in lines[0]
    assert done.stdout == ""  # refused before simulating anything
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]

    done = run("collective", "all_reduce", "--sizes", "1K", "--report", str(folder), "--force")
    assert done.returncode == 0, done.stderr
    assert (folder / "notes.txt").read_text() == "mine"  # other files are left alone
    assert (folder / "run.json").is_file()


def test_report_into_a_file_or_empty_folder(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["collective", "all_reduce", "--sizes", "1K", "--report", str(target)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["collective", "all_reduce", "--sizes", "1K", "--report", str(empty)]) == 0
    assert (empty / "run.json").is_file()


def test_timeline_and_trace_options_write_the_last_size(tmp_path, capsys):
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    argv = [
        "collective",
        "all_gather",
        "--algo",
        "ring",
        "--sizes",
        "1K,8M",
        "--timeline",
        str(png),
    ]
    assert main([*argv, "--trace", str(trace)]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 4  # the table still prints
    assert png_size(png.read_bytes())[0] == 1600
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    copies = [e for e in events if e.get("cat") == "copy"]
    assert len(copies) == 7 * 8  # p-1 steps x p ranks
    assert {e["args"]["bytes"] for e in copies} == {8 * 2**20 // 8}
    first = png.read_bytes()
    assert main(argv) == 0
    assert png.read_bytes() == first  # same command, same picture


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--timeline", "plot.jpg", [".png", ".svg"]),
        ("--timeline", "missing/plot.png", ["does not exist"]),
        ("--trace", "missing/trace.json", ["does not exist"]),
    ],
)
def test_bad_output_names_fail_at_once_with_one_line(
    tmp_path, monkeypatch, capsys, option, value, words
):
    monkeypatch.chdir(tmp_path)
    assert main(["collective", "all_reduce", "--sizes", "1K", option, value]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing simulated
    lines = err.strip().splitlines()
    assert len(lines) == 1
    for word in words:
        assert word in lines[0]


def test_help_documents_the_output_options():
    done = run("collective", "--help")
    for option in ("--timeline", "--trace", "--report", "--force", "LAST size", "microseconds"):
        assert option in done.stdout


# -- atomic writes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    graph = simulator.ring_graph(4, 1e9, 1e-6)
    result = simulator.simulate_collective(graph, "all_reduce", 4e3)
    return graph, result


def test_interrupted_trace_leaves_the_old_file_and_no_temporary(tmp_path, small, monkeypatch):
    graph, result = small
    target = tmp_path / "trace.json"
    target.write_text("old")
    real = perfetto_module._Layout.batches

    def interrupted(layout):
        for count, batch in enumerate(real(layout)):
            if count == 1:
                raise KeyboardInterrupt  # the first batch of events is written by now
            yield batch

    monkeypatch.setattr(perfetto_module._Layout, "batches", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_trace(collective_timeline(result, graph), target)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


@pytest.mark.parametrize("name", ["timeline.png", "trace.json", "report"])
def test_interruption_just_before_the_rename_changes_nothing(tmp_path, small, monkeypatch, name):
    """The worst moment: the new content is complete in the temporary file."""
    graph, result = small
    target = tmp_path / name

    def stop(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", stop)
    with pytest.raises(KeyboardInterrupt):
        if name == "timeline.png":
            target.write_bytes(b"old")
            save_timeline(collective_timeline(result, graph), target)
        elif name == "trace.json":
            target.write_bytes(b"old")
            save_trace(collective_timeline(result, graph), target)
        else:
            from simulator.viz import write_collective_report

            write_collective_report(
                target, rows=[result.row()], result=result, graph=graph, table="t\n"
            )
    if name == "report":
        assert [p.name for p in target.iterdir()] == []  # nothing half-written inside
    else:
        assert target.read_bytes() == b"old"
        assert [p.name for p in tmp_path.iterdir()] == [name]


def test_atomic_files_get_ordinary_permissions(tmp_path):
    target = tmp_path / "x.txt"
    atomic.write_file(target, "whole")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
