"""The held-out public nccl-tests runs of issue 32 (simulator/data/nccl-tests-heldout2).

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

FOLDER = BUNDLED.parent / "nccl-tests-heldout2"

#: Ranks of each run, as its source gives them (rank lines, -np, or the GPU count of the
#: table's row), independently of the sidecars' presets.
RANKS = {
    "B200-1N-AR-gke-a4-deepep": 8,  # "nGpus 8", ranks 0-7 on one A4 VM
    "B200-2N-AR-gke-a4-deepep": 16,  # mpirun -np 16, "16 GPUs, 2 nodes"
    "H200-2N-AR-spectrumx": 16,  # ranks 0-15 printed on two hosts
    "GB300-1N-AR-a4xmax": 4,  # "1 节点 4 GPU"
    "GB200-2R32N-AR-oci-oke": 128,  # "Rank 127" is the last rank printed
    "GB200-2N-AR-a4x-pedia": 8,
    "GB200-8N-AR-a4x-pedia": 32,
    "GB200-16N-AR-a4x-pedia": 64,
    "GB200-2R4N-AR-a4x-pedia": 16,
    "GB200-2R16N-AR-a4x-pedia": 64,
    **{f"GB200-1N-{op}-a4x-prod": 4 for op in ("AR", "AG", "RS", "A2A")},
    **{f"GB200-4N-{op}-a4x-prod": 16 for op in ("AR", "AG", "RS", "A2A")},
    **{f"GB200-18N-{op}-a4x-prod": 72 for op in ("AR", "AG", "RS", "A2A")},
    **{f"GB200-2R2N-{op}-a4x-prod": 8 for op in ("AR", "AG", "RS", "A2A")},
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
    """The folder's sidecars are exactly the runs listed above (a preset file beside
    them is not a sidecar)."""
    assert sorted(CASES) == sorted(RANKS)


@pytest.mark.parametrize("name", CASES)
def test_a_heldout_case_parses_and_builds_its_preset(name):
    """Each case loads, cites its source, runs an operation ccsim has, passes the
    resource guard, and its preset has one GPU per rank of the run."""
    sidecar = FOLDER / f"{name}.yaml"
    comment = " ".join(sidecar.read_text().replace("#", " ").split())
    assert "Source:" in comment and "held out" in comment
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
    decimals of a tiny figure). The single-size tables publish busbw only; their time
    was computed from it, so it must give the busbw back."""
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


def test_a_sidecar_naming_an_operation_ccsim_does_not_run_is_refused_as_it_loads(tmp_path):
    """nccl-tests' binary names (alltoall) are not ccsim's operations (all_to_all): the
    sidecar's op is checked when it loads, one line naming the file, field and the valid
    operations, not an algorithm error at run time."""
    from simulator.errors import CcsimError

    name = "GB200-1N-A2A-a4x-prod"
    text = (FOLDER / f"{name}.yaml").read_text().replace("op: all_to_all", "op: alltoall")
    assert "op: alltoall" in text
    (tmp_path / f"{name}.yaml").write_text(text)
    (tmp_path / f"{name}.csv").write_text((FOLDER / f"{name}.csv").read_text())
    with pytest.raises(CcsimError) as error:
        load_case(tmp_path / f"{name}.yaml")
    message = str(error.value)
    assert message.startswith(f"{name}.yaml: op 'alltoall' is not an operation ccsim runs")
    assert "all_to_all" in message and "\n" not in message
