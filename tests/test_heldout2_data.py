"""The held-out public nccl-tests runs of issue 32 (simulator/data/nccl-tests-heldout2,
the third set, simulator/data/nccl-tests-heldout3, the fourth,
simulator/data/nccl-tests-heldout4, and the fifth, simulator/data/nccl-tests-heldout5,
mostly full size sweeps of all-gather, reduce-scatter and all-to-all).

Cheap checks only (no simulation): every sidecar parses, cites its source, builds its
preset with as many GPUs as the run had, passes the resource guard, names an operation
ccsim runs, was never used to set a constant, and its table agrees with nccl-tests' own
definitions of algbw and busbw.
"""

from __future__ import annotations

import csv
from pathlib import Path

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
THIRD = BUNDLED.parent / "nccl-tests-heldout3"
FOURTH = BUNDLED.parent / "nccl-tests-heldout4"
FIFTH = BUNDLED.parent / "nccl-tests-heldout5"

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

#: The third set's ranks, as their sources give them.
RANKS3 = {
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

#: The fourth set's ranks, as their sources give them.
RANKS4 = {
    "H200-1N-AR-stas00-nvls": 8,  # "-g 8"; the GPU-count table's row 8
    "H200-1N-AR-stas00-ring": 8,  # "-g 8"; the GPU-count table's row 8
    "H200-1N-AG-stas00": 8,  # all_gather_perf ... -g 8
    "H200-1N-RS-stas00": 8,  # reduce_scatter_perf ... -g 8
    "B200-1N-AR-stas00-p6": 8,  # the B200 GPU-count table's row 8
    "B200-1N-AR-stas00-p6-ring": 8,  # the same row, NVLS off
    "H200-1N-AR-azure-nch32": 8,  # mpirun -np 8, ranks 0-7 printed
    "H200-2N-AR-oci-argonne": 16,  # ranks 0-15 printed on GPU-6550 and GPU-3841
    "H200-2N-AG-a3ultra-skypilot": 16,  # ranks 0-15 printed on head and worker1
    "H200-2N-AG-a3ultra-gcppod": 16,  # ranks 0-15 printed on nccl-test-host-1 and -2
    "GB200-3R3N-AR-nccl1801-ring": 12,  # "NVL4  12" (num GPUs)
    "GB200-3R3N-AR-nccl1801-tree": 12,
    "GB200-3R6N-AR-nccl1801-ring": 24,  # "NVL8  24"
    "GB200-3R6N-AR-nccl1801-tree": 24,
    "H100-2N-AR-oci-ocitutorials": 16,  # mpirun -n 16, ranks 0-15 printed
    "A100-1N-AR-oci-ubuntu": 8,  # mpirun -n 8, ranks 0-7 printed
    "A100-2N-AR-oci-ubuntu": 16,  # mpirun -n 16 -N 8, ranks 0-15 printed
    "A100-1N-AR-oci-container": 8,  # mpirun -n 8, ranks 0-7 printed
    "A100-2N-AR-oci-container": 16,  # mpirun -n 16, ranks 0-15 printed
}

#: The fifth set's ranks, as their sources give them.
RANKS5 = {
    "B200-1N-AG-vultr": 8,  # "all_gather ranks=8 (intra-node)"
    "B200-1N-RS-vultr": 8,  # "reduce_scatter ranks=8 (intra-node)"
    "B200-1N-A2A-vultr": 8,  # "alltoall ranks=8 (intra-node)"
    "B200-2N-AR-vultr": 16,  # "all_reduce ranks=16 (inter-node)"
    "B200-2N-AG-vultr": 16,  # "all_gather ranks=16 (inter-node)"
    "B200-2N-RS-vultr": 16,  # "reduce_scatter ranks=16 (inter-node)"
    "B200-2N-A2A-vultr": 16,  # "alltoall_v2 ranks=16 (inter-node)"
    "H100-2N-AG-a3mega-clustertoolkit": 16,  # allgather.sh on two hosts of 8 GPUs
    "H100-2N-AG-a3high-clustertoolkit": 16,  # run-allgather.sh 8 ...: mpirun -np 16
    "H200-2N-AG-a3ultra-dwsflex": 16,  # a JobSet of 2 pods of 8 GPUs, a process per GPU
    "H100-1N-RS-nccl1047-ring": 8,  # "one H100 server", ranks up to "Rank  7" printed
    # OCI's multi-rack GB200 tables: 4 GPUs a host; their busbw agrees with these ranks
    "GB200-2R32N-AR-oci-quickstart": 128,  # "32 Hosts 2 Racks" / "2 Racks - 32 nodes"
    "GB200-2R32N-A2A-oci-quickstart": 128,
    "GB200-3R48N-AR-oci-quickstart": 192,  # "48 Hosts 3 Racks" / "3 Racks - 48 nodes"
    "GB200-3R48N-A2A-oci-quickstart": 192,
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
CASES3 = [sidecar.stem for sidecar in sidecars(THIRD)]
CASES4 = [sidecar.stem for sidecar in sidecars(FOURTH)]
CASES5 = [sidecar.stem for sidecar in sidecars(FIFTH)]
#: Every held-out case of the four sets, with its folder and the ranks its source gives.
ALL = (
    [(FOLDER, name, RANKS[name]) for name in CASES]
    + [(THIRD, name, RANKS3.get(name, 0)) for name in CASES3]
    + [(FOURTH, name, RANKS4.get(name, 0)) for name in CASES4]
    + [(FIFTH, name, RANKS5.get(name, 0)) for name in CASES5]
)
IDS = [name for _, name, _ in ALL]


def test_the_folder_holds_every_run_found_and_nothing_else():
    """Each folder's sidecars are exactly the runs listed above (a preset file beside
    them is not a sidecar)."""
    assert sorted(CASES) == sorted(RANKS)
    assert sorted(CASES3) == sorted(RANKS3)
    assert sorted(CASES4) == sorted(RANKS4)
    assert sorted(CASES5) == sorted(RANKS5)


def _rows(table_path: Path) -> set[tuple[str, str]]:
    """A table's (size, measured time) pairs: the out-of-place time where printed."""
    with open(table_path, newline="") as table:
        return {
            (row["bytes"], row.get("time_us_oop") or row.get("time_us_ip"))
            for row in csv.DictReader(table)
        }


@pytest.mark.parametrize(
    ("folder", "names", "others"),
    [
        (THIRD, CASES3, ("nccl-tests", "nccl-tests-heldout2", "nccl-tests-racks")),
        (
            FOURTH,
            CASES4,
            ("nccl-tests", "nccl-tests-heldout2", "nccl-tests-heldout3", "nccl-tests-racks"),
        ),
        (
            FIFTH,
            CASES5,
            (
                "nccl-tests",
                "nccl-tests-heldout2",
                "nccl-tests-heldout3",
                "nccl-tests-heldout4",
                "nccl-tests-racks",
            ),
        ),
    ],
    ids=["third", "fourth", "fifth"],
)
def test_no_run_is_also_in_another_validation_folder(folder, names, others):
    """Held out means new: no table of the third, fourth or fifth set repeats a row set
    already bundled elsewhere (the same sizes with the same measured times), so each run
    scores once; nor are two tables of one set mostly the same rows (one run transcribed
    twice; a single size may coincide, as the third set's two A3 Mega runs do at 2 GiB)."""
    here = {name: _rows(folder / f"{name}.csv") for name in names}
    for other_folder in others:
        for other in sorted((BUNDLED.parent / other_folder).glob("*.csv")):
            theirs = _rows(other)
            for name, rows in here.items():
                assert not rows & theirs, (name, other.name)
    for name, rows in here.items():
        for other_name, other_rows in here.items():
            if other_name != name:
                assert len(rows & other_rows) * 2 < len(rows), (name, other_name)


@pytest.mark.parametrize(("folder", "name", "ranks"), ALL, ids=IDS)
def test_a_heldout_case_parses_and_builds_its_preset(folder, name, ranks):
    """Each case loads, cites its source, runs an operation ccsim has, passes the
    resource guard, and its preset has one GPU per rank of the run."""
    sidecar = folder / f"{name}.yaml"
    comment = " ".join(sidecar.read_text().replace("#", " ").split())
    assert "Source:" in comment and "held out" in comment
    if folder == THIRD:
        assert "read 2026-11-27" in comment
    if folder in (FOURTH, FIFTH):
        assert "read 2026-11-28" in comment
    case = load_case(sidecar)
    assert case.settings["op"] in COLLECTIVE_OPS
    check_case(case)
    assert len(gpu_nodes(case_graph(case))) == ranks


@pytest.mark.parametrize(("folder", "name", "ranks"), ALL, ids=IDS)
def test_no_constant_was_fitted_to_a_heldout_case(folder, name, ranks):
    """Held out means no fit names the run: neither its preset's calibration nor any
    of the shared fitted constants (LL, NVLS, all-to-all copy-out, proxy, TCPXO)."""
    case = load_case(folder / f"{name}.yaml")
    fitted = set(calibration_of(case_graph(case)).fitted_to)
    for names in (LL_FITTED_TO, NVLS_FITTED_TO, P2P_FITTED_TO, PROXY_FITTED_TO, TCPXO_FITTED_TO):
        fitted |= set(names)
    assert name not in fitted


@pytest.mark.parametrize(("folder", "name", "ranks"), ALL, ids=IDS)
def test_a_heldout_table_agrees_with_nccl_tests_definitions(folder, name, ranks):
    """Transcription check: algbw = bytes / time, and busbw = algbw x the operation's
    factor, within the tables' rounding (1%, or 0.02 GB/s where nccl-tests prints two
    decimals of a tiny figure). The single-size tables (and Azure's) publish busbw only;
    their time was computed from it, so it must give the busbw back."""
    case = load_case(folder / f"{name}.yaml")
    factor = FACTORS[case.settings["op"]](ranks)
    assert bus_factor(case.settings["op"], ranks) == pytest.approx(factor)
    with open(folder / f"{name}.csv", newline="") as table:
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
