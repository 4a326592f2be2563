"""Fitting a preset's constants to measurements (ccsim validate --fit)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from simulator.collective.run import bus_factor
from simulator.library.protocol import Calibration, parse_calibration
from simulator.validate import BUNDLED, load_case, run_case
from simulator.validate.calibrate import fit_case

TOPOLOGY = """\
name: quad
server:
  gpus: 4
  intra: {kind: nvswitch, bandwidth: 100GB/s, latency: 0.2us}
"""
# The "true" machine: constants far from NCCL's defaults.
TRUTH = """\
nccl:
  launch: 5us
  efficiency: {nvlink: 0.7}
  protocols:
    LL: {hop: {nvlink: 1.5us}, bandwidth: 0.3}
    LL128: {hop: {nvlink: 4us}, bandwidth: 0.7}
    Simple: {hop: {nvlink: 12us}}
"""
SIZES = [8, 128, 2048, 2**15, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28]


def write_case(folder, preset_text, times_us, sizes=SIZES):
    (folder / "quad.yaml").write_text(preset_text)
    (folder / "run.yaml").write_text("preset: quad.yaml\ngpus_per_process: 4\n")
    lines = ["bytes,time_us_oop,busbw_oop"]
    for size, t in zip(sizes, times_us, strict=True):
        lines.append(f"{size},{t},{size / t / 1e3 * bus_factor('all_reduce', 4)}")
    (folder / "run.csv").write_text("\n".join(lines) + "\n")
    return load_case(folder / "run.yaml")


def test_fit_recovers_a_machine_it_did_not_start_from(tmp_path):
    """Measurements made by simulating known constants; fitting from NCCL's defaults
    must find a model that reproduces them, with the plateau's efficiency and the
    host's launch cost as they were."""
    truth = write_case(tmp_path, TOPOLOGY + TRUTH, [1.0] * len(SIZES))
    measured = run_case(truth).simulated_us
    case = write_case(tmp_path, TOPOLOGY, measured)
    fit = fit_case(case, holdout=False)
    assert fit.before["busbw_median_pct"] > 20  # NCCL's defaults are far off here
    assert fit.after["busbw_median_pct"] < 2
    assert fit.after["time_median_pct"] < 2
    assert fit.bottleneck == ["nvlink"] and fit.path_class == "nvlink"
    assert fit.calibration.efficiency["nvlink"] == pytest.approx(0.7, rel=0.02)
    assert fit.calibration.launch_s == pytest.approx(5e-6, rel=0.02)
    # The printed section is a valid preset section that reproduces the fit.
    section = yaml.safe_load(yaml.safe_dump({"nccl": fit.nccl_section()}))["nccl"]
    again = parse_calibration(section, source="fit")
    assert again.efficiency["nvlink"] == pytest.approx(fit.calibration.efficiency["nvlink"], 1e-3)


def test_fit_predicts_the_sizes_it_did_not_see():
    """On the public A100 run, each size run as NCCL's tuning model decides, fitting from
    NCCL's own constants (its 20 of 25 GB/s per NVLink3 link, its protocol latencies; 3 us
    launches) on every other size lowers the median busbw error on the other sizes from
    about 21% to about 13%, and the small-message time error from about 39% to about 1%
    (the host's launch cost, which NCCL's constants do not know)."""
    nccl = Calibration(launch_s=3e-6, efficiency={"nvlink": 0.8, "pcie": 0.76, "rdma": 0.96})
    fit = fit_case(load_case(BUNDLED / "A100-1N-AR-g8.yaml"), holdout=True, base=nccl)
    assert fit.before["busbw_median_pct"] > 18.0
    assert fit.after["busbw_median_pct"] <= 15.0
    assert fit.after["time_median_pct"] <= 5.0


def test_cli_fit_prints_errors_and_sections(tmp_path):
    shutil.copy(BUNDLED / "RTX5090-1N-AR-PCIe.csv", tmp_path / "rtx.csv")
    shutil.copy(BUNDLED / "RTX5090-1N-AR-PCIe.yaml", tmp_path / "rtx.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "validate", "--fit", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "sizes left out of the fit" in done.stdout
    body = done.stdout.split("# rtx:")[1]
    section = yaml.safe_load(body.split("\n", 1)[1])["nccl"]
    assert section["protocols"]["LL128"]["enabled"] is False  # kept from the preset
    wrong = subprocess.run(
        [sys.executable, "-m", "simulator", "validate", "--no-holdout"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2 and "--no-holdout goes with --fit" in wrong.stderr


def test_a_fold_fit_skips_the_error_report_and_finds_the_same_constants(tmp_path):
    """--loco's folds want the constants alone: report=False leaves before/after empty
    (no simulation of the held-out sizes) and the fitted calibration is the same."""
    truth = write_case(tmp_path, TOPOLOGY + TRUTH, [1.0] * len(SIZES))
    case = write_case(tmp_path, TOPOLOGY, run_case(truth).simulated_us)
    full = fit_case(case, holdout=True, rounds=1)
    quiet = fit_case(case, holdout=True, rounds=1, report=False)
    assert quiet.before == {} and quiet.after == {} and full.after
    assert quiet.calibration == full.calibration
