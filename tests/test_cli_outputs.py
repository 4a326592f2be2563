"""Output paths are checked before anything is simulated, a results file must be a
regular file, an unreachable Dask scheduler leaves nothing behind, and SIGTERM stops a
sweep with one line (issue 33, item 7)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.sweep.store import read_cells

DATA = Path(__file__).parents[1] / "simulator" / "data" / "nccl-tests"
SWEEP = "scenario: {collective: all_reduce, size: 1M}\naxes: {algorithm: [ring, direct]}\n"


def _bad(tmp_path: Path, name: str) -> str:
    """A path no one can write, root included: its folder is a regular file."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be\n")
    return str(blocker / "dir" / name)


def _cases(tmp_path: Path) -> list[list[str]]:
    validate = tmp_path / "cases"
    validate.mkdir()
    for suffix in ("csv", "yaml"):  # one small bundled case: validate runs only it
        (validate / f"A100-1N-AR-g8.{suffix}").write_text(
            (DATA / f"A100-1N-AR-g8.{suffix}").read_text()
        )
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)
    coll = ["collective", "all_reduce", "--sizes", "1M"]
    comp = ["compare", "all_reduce", "--sizes", "1M"]
    run = ["run", "ddp-gpt1.5b-16"]
    size = ["size", str(spec), "--axis", "algorithm", "--workers", "1"]
    return [
        [*coll, "--out", "x.csv"],
        [*coll, "--timeline", "x.png"],
        [*coll, "--trace", "x.json"],
        [*coll, "--heatmap", "x.png"],
        [*coll, "--report", "r"],
        [*coll, "--algo", "ring", "--chakra", "x.et"],
        [*comp, "--out", "x.csv"],
        [*comp, "--plot", "x.png"],
        [*comp, "--timeline", "x.png"],
        [*comp, "--trace", "x.json"],
        ["topology", "show", "dgx-a100", "--png", "x.png"],
        ["bench", "--quick", "--out", "x.csv"],
        [*run, "--out", "x.csv"],
        [*run, "--timeline", "x.png"],
        [*run, "--trace", "x.json"],
        [*run, "--report", "r"],
        ["generate", "ddp", "--model", "gpt-1.5b", "--ranks", "8", "--out", "x.json"],
        ["validate", "--data", str(validate), "--plot", "x.png"],
        ["search", "gpt-1.5b", "--global-batch", "64", "--workers", "1", "--out", "x.csv"],
        ["sweep", str(spec), "--workers", "1", "--out", "x.csv"],
        [*size, "--out", "x.csv"],
        [*size, "--plot", "x.png"],
    ]


def _case_ids() -> list[str]:
    # The ids name the command and the option: "collective --trace", "size --plot".
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return [f"{case[0]} {case[-2]}" for case in _cases(Path(folder))]


@pytest.mark.parametrize("index", range(len(_case_ids())), ids=_case_ids())
def test_an_unwritable_output_fails_at_once_with_one_line(tmp_path, capsys, index):
    argv = _cases(tmp_path)[index]
    option, name = argv[-2], argv[-1]
    argv[-1] = _bad(tmp_path, name)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("ccsim: error: cannot write ")
    assert option in err and "blocker" in err
    # Nothing was simulated: no table, no progress, no file written anywhere.
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "{spec}", "--workers", "1", "--out", "/dev/null"],
        ["size", "{spec}", "--axis", "algorithm", "--workers", "1", "--out", "/dev/null"],
        ["search", "gpt-1.5b", "--global-batch", "64", "--workers", "1", "--out", "/dev/null"],
    ],
    ids=["sweep", "size", "search"],
)
def test_a_results_file_that_is_not_a_regular_file_is_refused_clearly(tmp_path, capsys, argv):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)
    argv = [arg.format(spec=spec) for arg in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and out == ""
    assert "Invalid argument" not in err
    assert "--out '/dev/null'" in err and "as the results file" in err
    assert "regular file" in err


def test_an_unreachable_dask_scheduler_fails_before_the_results_file_exists(tmp_path, capsys):
    pytest.importorskip("distributed")
    from simulator.sweep.runners import CONNECT_TIMEOUT_S

    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)
    out = tmp_path / "r.csv"
    argv = ["sweep", str(spec), "--out", str(out), "--scheduler", "tcp://127.0.0.1:1"]
    assert main(argv) == 2
    _, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and "cannot reach the Dask scheduler" in lines[0]
    assert not out.exists()  # no header-only file left behind
    assert CONNECT_TIMEOUT_S <= 5  # the wait is bounded by a short timeout, not timed here


def test_sigterm_stops_a_sweep_with_one_line_and_its_pool(tmp_path):
    spec = tmp_path / "slow.yaml"
    # ~0.15 s a point (16 chunks x 16 channels of 1 GiB on 8 GPUs), 10 points.
    spec.write_text(
        "scenario: {collective: all_reduce, size: 1G, chunks: 16, channels: 16}\n"
        "axes: {size: {min: 736M, max: 1G, step: 32M}}\n"
    )
    out = tmp_path / "r.csv"
    command = [sys.executable, "-m", "simulator", "sweep", str(spec), "--out", str(out)]
    process = subprocess.Popen(
        [*command, "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a supervisor's kill reaches the workers too
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 3:  # header + 2 rows
            break
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    kept = len(read_cells(out))
    assert process.returncode == 128 + signal.SIGTERM
    assert err.splitlines() == [
        f"ccsim: stopped by SIGTERM; {kept} points written to {out}; run the same command "
        "again to resume"
    ]
    assert "Traceback" not in err and "leaked" not in err
    # The pool went with it: no process of the session is left running.
    time.sleep(0.5)
    alive = subprocess.run(
        ["ps", "-o", "pid=,stat=", "-g", str(process.pid)], capture_output=True, text=True
    ).stdout.split("\n")
    assert [line for line in alive if line.strip() and "Z" not in line.split()[-1]] == []


def test_sigterm_handler_is_put_back_after_main(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    assert main(["algorithms"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
