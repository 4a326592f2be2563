"""Running sweeps: numbers against hand-computed bounds, failed points, resume after an
interrupt or a kill, torn rows, crashed workers, determinism."""

import os
import signal
import subprocess
import sys
import time

import pytest

from simulator.cli import main
from simulator.sweep import execute_sweep, read_results, result_columns, run_point, run_sweep
from simulator.sweep.spec import SweepError, load_spec
from simulator.sweep.store import ResultsStore, read_cells

# dgx-a100 (topologies/dgx-a100.yaml): each GPU has its own NIC behind a PCIe Gen4 x16
# link of 31.5 GB/s per direction. With every latency set to zero, a one-channel ring
# all-reduce over 2 servers sends each step's n/p bytes over 16 links at once; the two
# links that leave a server run at min(NIC, PCIe), all others on NVLink (300 GB/s), so
# t = 2(p-1) n / (p min(NIC, PCIe)) and busbw = algbw 2(p-1)/p = min(NIC, PCIe).
PCIE = 31.5e9
NIC_SPEC = {
    "scenario": {
        "collective": "all_reduce",
        "algorithm": "ring",  # the ideal ring, whose bound is the NIC's (or PCIe's) rate
        "size": "1GiB",
        "nodes": 2,
        "set": {"server.intra.latency": 0, "server.nic.pcie.latency": 0, "fabric.latency": 0},
    },
    "axes": {"server.nic.bandwidth": ["50Gbps", "100Gbps", "200Gbps", "400Gbps", "800Gbps"]},
}


def interrupt_on_third(params):
    """A point function that stops the sweep like Ctrl-C on its third point."""
    interrupt_on_third.calls = getattr(interrupt_on_third, "calls", 0) + 1
    if interrupt_on_third.calls == 3:
        raise KeyboardInterrupt
    return run_point(params)


def crash_on_3mib(params):
    """Kills its worker process (as a segfault or the OOM killer would) on one point."""
    if params["size"] == 3 * 2**20:
        os._exit(3)
    return run_point(params)


def with_pid(params):
    """A point function that also says which process ran the point."""
    row = run_point(params)
    row["ranks"] = os.getpid()  # (a metric column carries the pid)
    return row


def _algorithm_of(params):
    return params["algorithm"]


def test_lanes_keep_a_group_in_one_process_and_change_no_result(tmp_path):
    """With an affinity (as `ccsim search` gives its layouts), each group's points run
    in one worker process while another group is left for the other worker, and every
    row's time is the one a single process gives."""
    spec = {
        "scenario": {"collective": "all_gather", "size": "1M"},
        "axes": {"algorithm": ["ring", "direct"], "size": ["64K", "256K", "1M", "4M"]},
    }
    lanes = execute_sweep(
        spec, tmp_path / "a.csv", workers=2, point_function=with_pid, affinity=_algorithm_of
    )
    alone = execute_sweep(spec, tmp_path / "b.csv", workers=1)
    assert [r["time_us"] for r in lanes.rows] == [r["time_us"] for r in alone.rows]
    pids: dict[str, set] = {}
    for row in lanes.rows:
        pids.setdefault(row["algorithm"], set()).add(row["ranks"])
    # Each group starts in its own process; only the group still running when the
    # other is done is shared (next_group), so at most one group is split.
    assert sum(len(p) for p in pids.values()) <= 3
    assert len(set().union(*pids.values())) == 2


def test_lanes_share_the_last_group_rather_than_idle():
    """Once every group with points left has a lane, an idle lane shares the largest."""
    from simulator.sweep.runners import next_group

    assert next_group(None, {"a": 1, "b": 4}, {"a": 1, "b": 1}) == "b"
    assert next_group("a", {"a": 0, "b": 4}, {"b": 1}) == "b"
    assert next_group("a", {"a": 0}, {}) is None


def test_busbw_equals_the_hand_computed_nic_bound():
    rows = run_sweep(NIC_SPEC, workers=1, records=True)
    nics = [50e9 / 8, 100e9 / 8, 200e9 / 8, 400e9 / 8, 800e9 / 8]
    assert [row["server.nic.bandwidth"] for row in rows] == nics
    for row, nic in zip(rows, nics, strict=True):
        bound = min(nic, PCIE)
        assert row["status"] == "ok" and row["ranks"] == 16
        assert row["busbw_GBps"] == pytest.approx(bound / 1e9, rel=1e-9)
        assert row["time_s"] == pytest.approx(2 * 15 * 2**30 / (16 * bound), rel=1e-9)


def test_a_failing_point_records_its_error_and_the_others_complete(tmp_path):
    spec = {
        "scenario": {"collective": "all_reduce", "size": "1M"},
        "axes": {"algorithm": ["ring", "pairwise", "direct"]},  # pairwise: all-to-all only
    }
    frame = run_sweep(spec, tmp_path / "r.csv", workers=1)
    assert list(frame["status"]) == ["ok", "error", "ok"]
    error = frame["error"][1]
    assert "pairwise" in error and "all_reduce" in error
    assert frame["busbw_GBps"].isna().tolist() == [False, True, False]
    # The file holds the same: the failure is data, and a rerun does not retry it.
    assert execute_sweep(spec, tmp_path / "r.csv", workers=1).ran == 0
    assert execute_sweep(spec, tmp_path / "r.csv", workers=1, retry_failed=True).ran == 1
    assert len(read_results(tmp_path / "r.csv")) == 3  # the retried row replaced the old


def test_interrupt_loses_only_in_flight_points_and_resume_finishes(tmp_path):
    out = tmp_path / "r.csv"
    spec = load_spec({**NIC_SPEC, "axes": {"size": ["1M", "2M", "3M", "4M", "5M", "6M"]}})
    interrupt_on_third.calls = 0
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, workers=1, point_function=interrupt_on_third)
    assert len(read_cells(out)) == 2  # the two finished points; the third was in flight
    run = execute_sweep(spec, out, workers=1)
    assert (run.resumed, run.ran) == (2, 4)
    keys = [cells["key"] for cells in read_cells(out)]
    assert sorted(keys) == sorted(p.key for p in spec.points)  # each exactly once
    assert run.rows == run_sweep(spec, workers=1, records=True)  # same as uninterrupted


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_cli_sweep_resumes_with_every_point_once(tmp_path, sig):
    spec = tmp_path / "slow.yaml"
    # ~0.15 s a point (16 chunks x 16 channels of 1 GiB on 8 GPUs), 10 points.
    spec.write_text(
        "scenario: {collective: all_reduce, size: 1G, chunks: 16, channels: 16}\n"
        "axes: {size: {min: 736M, max: 1G, step: 32M}}\n"
    )
    out = tmp_path / "r.csv"
    command = [sys.executable, "-m", "simulator", "sweep", str(spec), "--out", str(out)]
    process = subprocess.Popen(
        [*command, "--workers", "2", "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the kill reaches its workers
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 4:  # header + 3 rows
            break
        time.sleep(0.02)
    os.killpg(process.pid, sig)
    _, err = process.communicate(timeout=30)
    rows_before = len(read_cells(out))
    assert 3 <= rows_before < 10, "the sweep should be cut off mid-way"
    if sig == signal.SIGINT:
        assert process.returncode == 130
        assert "run the same command again to resume" not in err  # --quiet
    assert main([*command[3:], "--workers", "1", "--quiet"]) == 0
    cells = read_cells(out)
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 10 and len({c["key"] for c in cells}) == 10
    assert all(c["status"] == "ok" for c in cells)


def test_a_torn_last_row_is_cut_off_and_its_point_runs_again(tmp_path):
    spec = load_spec({**NIC_SPEC, "axes": {"size": ["1M", "2M", "3M"]}})
    out = tmp_path / "r.csv"
    run_sweep(spec, out, workers=1)
    whole = out.read_text()
    last = whole.splitlines()[-1]
    out.write_text(whole[: -len(last) - 1] + last[:20])  # the machine stopped mid-write
    assert len(read_cells(out)) == 2
    run = execute_sweep(spec, out, workers=1)
    assert (run.resumed, run.ran) == (2, 1)
    assert sorted(out.read_text().splitlines()) == sorted(whole.splitlines())


def test_results_of_another_sweep_and_a_second_writer_are_refused(tmp_path):
    out = tmp_path / "r.csv"
    run_sweep({**NIC_SPEC, "axes": {"size": ["1M"]}}, out, workers=1)
    with pytest.raises(SweepError, match="not this sweep's results file"):
        run_sweep({**NIC_SPEC, "axes": {"chunks": [1]}}, out, workers=1)
    other = tmp_path / "notes.txt"
    other.write_text("some,thing\nnot a sweep")  # no newline at the end: still untouched
    with pytest.raises(SweepError, match="not this sweep's results file"):
        run_sweep({**NIC_SPEC, "axes": {"size": ["1M"]}}, other, workers=1)
    assert other.read_text() == "some,thing\nnot a sweep"
    spec = load_spec({**NIC_SPEC, "axes": {"size": ["1M"]}})
    with (
        ResultsStore(out, result_columns(spec)),  # another sweep holds the file
        pytest.raises(SweepError, match="another sweep is writing"),
    ):
        execute_sweep(spec, out, workers=1)


def test_a_crashed_worker_loses_only_its_point(tmp_path):
    spec = {
        "scenario": {"collective": "all_reduce", "size": "1M"},
        "axes": {"size": ["1M", "2M", "3M", "4M", "5M", "6M"]},
    }
    run = execute_sweep(
        spec, tmp_path / "r.csv", workers=2, retries=0, point_function=crash_on_3mib
    )
    status = {row["size"]: row["status"] for row in run.rows}
    assert status == {s * 2**20: "error" if s == 3 else "ok" for s in range(1, 7)}
    crashed = next(row for row in run.rows if row["status"] == "error")
    assert "worker lost" in crashed["error"]


def test_file_order_does_not_change_the_sorted_view(tmp_path):
    spec = load_spec(
        {
            "scenario": {"collective": "all_gather", "size": "1M"},
            "axes": {"algorithm": ["ring", "direct"], "size": ["64K", "1M", "16M"]},
        }
    )
    out = tmp_path / "r.csv"
    expected = run_sweep(spec, out, workers=1, records=True)
    header, *rows = out.read_text().splitlines()
    out.write_text("\n".join([header, *reversed(rows)]) + "\n")  # as if completed backwards
    assert read_results(out, spec, records=True) == expected
    assert [r["algorithm"] for r in expected] == ["ring"] * 3 + ["direct"] * 3
    frame = read_results(out)  # without the spec: every row, sorted by the axes
    assert list(frame["size"]) == [65536, 1048576, 16777216] * 2


def test_workload_sweep_grows_the_workload_with_the_nodes(tmp_path):
    spec = {
        "scenario": {
            "workload": {"generator": "moe", "ranks": "all", "layers": 1, "tokens": 1024},
            "algorithm": "direct",
            "nodes": 1,
        },
        "axes": {"nodes": [1, 2]},
    }
    frame = run_sweep(spec, workers=1)
    assert list(frame["status"]) == ["ok", "ok"]
    assert list(frame["ranks"]) == [8, 16]  # 8 GPUs per dgx-a100 server
    for _, row in frame.iterrows():
        assert row["exposed_s"] <= row["comm_s"] <= row["step_s"] + 1e-12
