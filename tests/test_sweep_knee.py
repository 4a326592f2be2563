"""Knee finding: the definition on made-up curves, then `size` on a NIC sweep whose knee
follows from the hardware figures by hand, with its plot and the CLI."""

import json

import pytest

from simulator.cli import main
from simulator.sweep import SweepError, find_knee, knee_of, size


def rows_of(curve, **extra):
    return [
        {"key": f"{x}-{extra}", "bw": x, **extra, "status": "ok", "step_s": m} for x, m in curve
    ]


def test_knee_is_the_first_point_from_which_every_larger_one_is_within_tolerance():
    # Reference 1.0 at x = 64. 1.04 at x = 4 is within 5 %, but 1.2 at x = 8 is not, so
    # the knee is 16, not 4.
    curve = [(1, 3.0), (2, 2.0), (4, 1.04), (8, 1.2), (16, 1.05), (32, 1.01), (64, 1.0)]
    assert knee_of(curve, 0.05) == (16, 1.05, 64, 1.0)
    assert knee_of(curve, 0.0) == (64, 1.0, 64, 1.0)
    assert knee_of(curve, 0.25) == (4, 1.04, 64, 1.0)
    # Metrics that rise with the axis (bus bandwidth) work the same way.
    assert knee_of([(1, 10.0), (2, 19.5), (4, 20.0)], 0.05) == (2, 19.5, 4, 20.0)


def test_groups_failed_points_and_errors():
    rows = rows_of([(1, 4.0), (2, 2.0), (4, 2.0)], nodes=2) + rows_of(
        [(1, 8.0), (2, 4.0), (4, 2.0)], nodes=4
    )
    rows.append({"key": "x", "bw": 8, "nodes": 4, "status": "error", "step_s": None})
    knees = find_knee(rows, "bw", "step_s", 0.05)
    assert [(k.group, k.knee, k.reference) for k in knees] == [
        ({"nodes": 2}, 2, 4),
        ({"nodes": 4}, 4, 4),  # the failed point at 8 is left out: 4 is the reference
    ]
    with pytest.raises(SweepError, match="unknown metric 'steps'"):
        find_knee(rows, "bw", "steps")
    with pytest.raises(SweepError, match="tolerance"):
        find_knee(rows, "bw", "step_s", 5)
    text_rows = [{**row, "bw": "fast"} for row in rows]
    with pytest.raises(SweepError, match="numeric axis"):
        find_knee(text_rows, "bw", "step_s")


# dgx-a100 with latencies zeroed (see tests/test_sweep_run.py): a one-channel ring's
# busbw is min(NIC, PCIe 31.5 GB/s). Over 50-800 Gb/s NICs it is 6.25, 12.5, 25, 31.5,
# 31.5 GB/s: the knee within 5 % of the 800 Gb/s value is the smallest NIC of the grid
# above 31.5 GB/s = 252 Gb/s, i.e. 400 Gb/s (25 GB/s at 200 Gb/s is 21 % short).
NIC_SPEC = """\
name: nic-knee
scenario:
  collective: all_reduce
  algorithm: ring
  size: 1GiB
  nodes: 2
  set: {server.intra.latency: 0, server.nic.pcie.latency: 0, fabric.latency: 0}
axes:
  server.nic.bandwidth: [50Gbps, 100Gbps, 200Gbps, 400Gbps, 800Gbps]
"""


def test_size_finds_the_nic_knee_and_draws_it(tmp_path):
    spec = tmp_path / "nic.yaml"
    spec.write_text(NIC_SPEC)
    plot = tmp_path / "knee.png"
    found = size(spec, plot=plot, workers=1)
    (knee,) = found.knees
    assert knee.axis == "server.nic.bandwidth" and knee.metric == "busbw_GBps"
    assert knee.knee == 400e9 / 8
    assert knee.knee_metric == pytest.approx(31.5, rel=1e-9)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["knee.png", "nic.yaml"]  # no temp
    assert found.table()["knee"].tolist() == [50e9]


def test_cli_size_prints_the_knee(tmp_path, capsys):
    spec = tmp_path / "nic.yaml"
    spec.write_text(NIC_SPEC)
    out = tmp_path / "r.csv"
    argv = ["size", str(spec), "--out", str(out), "--workers", "1", "--tolerance", "5%"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "400Gbps" in captured.out.splitlines()[-1]  # as the spec wrote it
    assert "5 run now" in captured.err
    assert main([*argv, "--format", "json", "--metric", "time_s"]) == 0  # resumed: no runs
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    assert row["knee"] == 400e9 / 8 and row["metric"] == "time_s"
    assert "0 run now, 5 already there" in captured.err
    assert main([*argv, "--axis", "nodes"]) == 2  # not an axis of this sweep
    assert main([*argv, "--plot", "knee.gif"]) == 2


# Axis labels a newcomer reads without the code: (metric, values) -> the y label.
LABELS = {
    ("step_s", 0.02): "step time (ms)",
    ("step_s", 2.5): "step time (s)",
    ("compute_s", 0.02): "compute time (ms)",
    ("comm_s", 0.02): "communication time (ms)",
    ("overlapped_s", 0.02): "communication overlapped with compute (ms)",
    ("exposed_s", 0.02): "exposed communication (ms)",
    ("waiting_s", 0.02): "waiting for peers (ms)",
    ("bubble_s", 0.02): "pipeline bubble (ms)",
    ("exposed_share", 0.2): "exposed communication (% of step time)",
    ("comm_share", 0.2): "communication (% of step time)",
    ("ranks", 16): "ranks",
    ("time_s", 3e-5): "collective time (us)",
    ("time_us", 30.0): "collective time (us)",
    ("algbw_GBps", 100.0): "algorithm bandwidth (GB/s)",
    ("busbw_GBps", 100.0): "bus bandwidth (GB/s)",
}


@pytest.mark.parametrize(("metric", "value"), sorted(LABELS))
def test_every_metric_a_size_plot_shows_has_a_label_in_words(metric, value):
    from simulator.sweep import knee_figure

    rows = [
        {"key": str(x), "bw": x, "status": "ok", metric: value * (1 + 1 / x)} for x in (1, 2, 4)
    ]
    fig = knee_figure(find_knee(rows, "bw", metric, 0.05))
    assert fig.axes[0].get_ylabel() == LABELS[metric, value]


def test_every_metric_of_a_sweep_is_covered_by_the_labels():
    from simulator.sweep import METRICS

    assert {m for names in METRICS.values() for m in names} == {m for m, _ in LABELS}


def test_size_plot_of_a_size_axis_has_byte_ticks_and_worded_labels(tmp_path):
    spec = tmp_path / "sizes.yaml"
    spec.write_text(
        "scenario: {collective: all_reduce, algorithm: ring, topology: dgx-a100}\n"
        "axes: {size: [1M, 2M, 4M, 8M, 16M]}\n"
    )
    found = size(spec, workers=1)
    ax = found.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "1 MiB",
        "2 MiB",
        "4 MiB",
        "8 MiB",
        "16 MiB",
    ]
    assert ax.get_ylabel() == "bus bandwidth (GB/s)"
    assert "busbw_GBps" not in found.figure.axes[0].get_title()
