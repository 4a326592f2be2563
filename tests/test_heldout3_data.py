"""The third set of held-out public nccl-tests runs (simulator/data/nccl-tests-heldout3).

Cheap checks only (no simulation): every sidecar parses, cites its source, builds its
preset with as many GPUs as the run had, passes the resource guard, names an operation
ccsim runs, was never used to set a constant, and its table agrees with nccl-tests' own
definitions of algbw and busbw.
"""

from __future__ import annotations

import csv

import pytest

from simulator.collective.run import COLLECTIVE_OPS, bus_factor
from simulator.library.nccl import LL_FITTED_TO, NVLS_FITTED_TO
from simulator.library.nccl_p2p import P2P_FITTED_TO
from simulator.library.protocol import PROXY_FITTED_TO, calibration_of
from simulator.topology import gpu_nodes
from simulator.topology.stacks import TCPXO_FITTED_TO
from simulator.validate import BUNDLED, load_case
from simulator.validate.nccl_tests import case_graph, check_case, sidecars

FOLDER = BUNDLED.parent / "nccl-tests-heldout3"

#: Ranks of each run, as its source gives them (rank lines, -np, or the GPU count of the
#: command), independently of the sidecars' presets.
RANKS = {
    "H100-1N-AR-azure-nvls": 8,  # all_reduce_perf -g 8 on one ND H100 v5 VM
    "H200-2N-AR-nebius-runai": 16,  # ranks 0-15 printed on two workers
    "H200-2N-AR-nccltests256": 16,  # mpirun -np 16, ranks 0-15 printed on fs-207/fs-208
    "A100-1N-AR-g8-nccl2193": 8,  # "nGpus 8", ranks 0-7 on one host
    "GB300-2R2N-AG-gke-a4xmax": 8,  # ranks 0-7 printed, 4 on each of two VMs
    "H100-2N-AG-a3mega-dstack": 16,  # mpirun -n DSTACK_GPUS_NUM -N DSTACK_GPUS_PER_NODE
    "H100-2N-AG-a3mega-toolkit": 16,  # srun -N 2 --ntasks-per-node=8
    "H100-2N-AG-a3mega-gke": 16,  # allgather.sh on two hosts of 8 GPUs (not printed)
    "H100-2N-AG-a3high-tcpx": 16,  # allgather.sh on two hosts of 8 GPUs (not printed)
}

#: nccl-tests' bus bandwidth factors (nccl-tests doc/PERFORMANCE.md: all-reduce
#: 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n), written out here so
#: that the code's own factor is checked against them, not used to check itself.
FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}

CASES = [sidecar.stem for sidecar in sidecars(FOLDER)]


def test_the_folder_holds_every_run_found_and_nothing_else():
    """The folder's sidecars are exactly the runs listed above."""
    assert sorted(CASES) == sorted(RANKS)


def test_no_run_is_also_in_another_validation_folder():
    """Held out means new: no table here repeats a row set already bundled elsewhere
    (the same sizes with the same measured times), so each run scores once."""
    here = {}
    for name in CASES:
        with open(FOLDER / f"{name}.csv", newline="") as table:
            rows = list(csv.DictReader(table))
        here[name] = {
            (row["bytes"], row.get("time_us_oop") or row.get("time_us_ip")) for row in rows
        }
    for folder in ("nccl-tests", "nccl-tests-heldout2", "nccl-tests-racks"):
        for other in sorted((BUNDLED.parent / folder).glob("*.csv")):
            with open(other, newline="") as table:
                theirs = {
                    (row["bytes"], row.get("time_us_oop") or row.get("time_us_ip"))
                    for row in csv.DictReader(table)
                }
            for name, rows in here.items():
                assert not rows & theirs, (name, other.name)


@pytest.mark.parametrize("name", CASES)
def test_a_heldout_case_parses_and_builds_its_preset(name):
    """Each case loads, cites its source, runs an operation ccsim has, passes the
    resource guard, and its preset has one GPU per rank of the run."""
    sidecar = FOLDER / f"{name}.yaml"
    comment = " ".join(sidecar.read_text().replace("#", " ").split())
    assert "Source:" in comment and "held out" in comment and "read 2026-11-27" in comment
    case = load_case(sidecar)
    assert case.settings["op"] in COLLECTIVE_OPS
    check_case(case)
    assert len(gpu_nodes(case_graph(case))) == RANKS[name]


@pytest.mark.parametrize("name", CASES)
def test_no_constant_was_fitted_to_a_heldout_case(name):
    """Held out means no fit names the run: neither its preset's calibration nor any
    of the shared fitted constants (LL, NVLS, all-to-all copy-out, proxy, TCPXO)."""
    case = load_case(FOLDER / f"{name}.yaml")
    fitted = set(calibration_of(case_graph(case)).fitted_to)
    for names in (LL_FITTED_TO, NVLS_FITTED_TO, P2P_FITTED_TO, PROXY_FITTED_TO, TCPXO_FITTED_TO):
        fitted |= set(names)
    assert name not in fitted


@pytest.mark.parametrize("name", CASES)
def test_a_heldout_table_agrees_with_nccl_tests_definitions(name):
    """Transcription check: algbw = bytes / time, and busbw = algbw x the operation's
    factor, within the tables' rounding (1%, or 0.02 GB/s where nccl-tests prints two
    decimals of a tiny figure). The busbw-only table (Azure) had its time computed from
    busbw, so it must give the busbw back."""
    case = load_case(FOLDER / f"{name}.yaml")
    factor = FACTORS[case.settings["op"]](RANKS[name])
    assert bus_factor(case.settings["op"], RANKS[name]) == pytest.approx(factor)
    with open(FOLDER / f"{name}.csv", newline="") as table:
        rows = list(csv.DictReader(table))
    checked = 0
    for row in rows:
        size = int(row["bytes"])
        for column in ("oop", "ip"):
            if f"time_us_{column}" not in row:
                continue
            algbw = size / float(row[f"time_us_{column}"]) / 1e3  # GB/s, as nccl-tests
            if f"algbw_{column}" in row:
                printed = float(row[f"algbw_{column}"])
                assert algbw == pytest.approx(printed, rel=0.01, abs=0.02), (size, column)
            assert algbw * factor == pytest.approx(
                float(row[f"busbw_{column}"]), rel=0.01, abs=0.02
            ), (size, column)
            checked += 1
    assert checked >= len(rows)
