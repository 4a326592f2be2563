"""HCCL's own decision (simulator.library.hccl), pinned against the selection rules of
Huawei's open-source HCCL worked by hand (gitee ascend/cann-hccl, mirrored at github
zhuxy-USTC/HCCL@3a845e5; files under src/domain/collective_communication/algorithm/impl/,
file:line beside each constant in simulator/library/hccl.py) and the CANN HCCL_ALGO
documentation, and the ``hccl`` policy that simulates that decision."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simulator.cli import main
from simulator.collective import HcclPolicy, library_of, simulate_collective
from simulator.errors import CcsimError
from simulator.library.hccl import (
    HcclSystem,
    hccl_choice,
    hccl_system,
    level1_costs,
    parse_hccl_algo,
)
from simulator.topology import load_topology

MIB = 1 << 20

# (preset, servers, op, size as nccl-tests counts it) -> (HCCL's level1, ccsim schedule,
# HCCL executor). The rules, by hand:
# * one server, level0 only (alg_configurator.cc:364-395): 910B's HCCS full mesh is
#   NP_MESH; 910's 8 NPUs are 8P_RING (two 4-NPU groups, not a mesh);
# * 910B, one server, all-reduce: <= 256 KiB the one-shot small-count executor, else the
#   op-base loop (all_reduce_operator.cc:386-401, HCCL_SMALL_COUNT_256_KB common.h:50);
# * 910B across servers (coll_alg_operator.cc:265-305; RDMA Lite unknown -> false, so
#   2 MiB per rank is the pipeline threshold of all three operations): pipeline from
#   2 MiB per rank; else HCCL's cost model with 60 us per step: ring (N-1 steps)
#   against NHR and HD (ceil(log2 N) steps, same bytes when N is a power of two),
#   strict "<" so ties go to ring, then NHR: N = 2 and 3 ring, N >= 4 NHR;
# * 910 across servers (alg_configurator.cc:268-282, CANN 8.0.RC1 HCCL_ALGO page):
#   H-D_R for a power of two or >= 8 servers, else ring, whatever the size.
TABLE = [
    ("ascend-910b", 1, "all_reduce", 256 * 1024, None, "direct",
     "AllReduceMeshSmallCountExecutor"),
    ("ascend-910b", 1, "all_reduce", 256 * 1024 + 4, None, "direct",
     "AllReduceMeshOpbaseLoopExecutor"),
    ("ascend-910b", 1, "all_gather", 1 << 30, None, "direct", "AllGatherMeshOpbaseExecutor"),
    ("ascend-910b", 1, "reduce_scatter", MIB, None, "direct",
     "ReduceScatterMeshDmaEliminationExecutor"),
    # 2 servers x 8: 32 MiB is 2 MiB per rank, the threshold; 64 bytes less is under it.
    ("ascend-910b", 2, "all_reduce", 32 * MIB, "pipeline", "pipelined",
     "AllReduceMeshOpbasePipelineExecutor"),
    ("ascend-910b", 2, "all_reduce", 32 * MIB - 64, "ring", "hierarchical",
     "AllReduceMeshExecutor"),
    ("ascend-910b", 2, "all_gather", 32 * MIB, "pipeline", "pipelined",
     "AllGatherMeshOpbasePipelineExecutor"),
    ("ascend-910b", 2, "all_gather", 16 * MIB, "ring", "hierarchical", "AllGatherMeshExecutor"),
    ("ascend-910b", 3, "reduce_scatter", MIB, "ring", "hierarchical",
     "ReduceScatterMeshExecutor"),
    ("ascend-910b", 4, "all_reduce", MIB, "NHR", "hierarchical", "AllReduceMeshExecutor"),
    ("ascend-910b", 4, "reduce_scatter", 1 << 30, "pipeline", "pipelined",
     "ReduceScatterMeshOpbasePipelineExecutor"),
    ("ascend-910", 1, "all_reduce", MIB, None, "ring", "AllReduceRingExecutor"),
    ("ascend-910", 1, "all_gather", 1 << 30, None, "ring", "AllGatherRingExecutor"),
    ("ascend-910", 2, "all_reduce", 1 << 30, "H-D_R", "hierarchical", "AllReduceRingExecutor"),
    ("ascend-910", 3, "all_gather", MIB, "ring", "hierarchical", "AllGatherRingExecutor"),
    ("ascend-910", 4, "reduce_scatter", 8, "H-D_R", "hierarchical",
     "ReduceScatterRingExecutor"),
]  # fmt: skip


@pytest.mark.parametrize(("preset", "servers", "op", "size", "level1", "schedule", "executor"),
                         TABLE)  # fmt: skip
def test_choice_follows_hccl_rules(preset, servers, op, size, level1, schedule, executor):
    choice = HcclPolicy().choose(load_topology(preset, servers), op, size)
    assert (choice.level1, choice.schedule, choice.executor) == (level1, schedule, executor)


def test_level0_follows_the_hardware():
    """910B: 28 HCCS links among 8 NPUs is a full mesh (NP_MESH); 910: two groups of 4
    (12 links), so 8P_RING, HCCL's four rings (hccl_impl.h:41)."""
    b = hccl_system(load_topology("ascend-910b", 2))
    a = hccl_system(load_topology("ascend-910"))
    assert (b.device, b.servers, b.per_server, b.level0, b.bandwidth) == (
        "910b", 2, 8, "NP_MESH", 25e9)  # fmt: skip
    assert (a.device, a.level0) == ("910", "8P_RING")
    assert hccl_choice(a, "all_reduce", MIB).channels == 4
    assert hccl_choice(b, "all_reduce", MIB).algorithm == "fullmesh+ring"


@pytest.mark.parametrize(
    ("system", "size", "schedule", "intra"),
    [
        (HcclSystem("910b", 2, 8, "NP_MESH", 25e9), MIB, "hierarchical", "mesh"),
        (HcclSystem("910b", 2, 8, "NP_MESH", 25e9), 1 << 30, "pipelined", "mesh"),
        (HcclSystem("910b", 2, 8, "8P_RING", 25e9), MIB, "hierarchical", "ring"),
        (HcclSystem("910", 2, 4, "4P_MESH", 12.5e9), MIB, "hierarchical", "mesh"),
        (HcclSystem("910", 3, 8, "8P_RING", 12.5e9), MIB, "hierarchical", "ring"),
        (HcclSystem("910", 3, 2, "NP_SINGLE_RING", 12.5e9), MIB, "hierarchical", "ring"),
        (HcclSystem("910b", 1, 8, "NP_MESH"), MIB, "direct", None),
        (HcclSystem("910b", 4, 1, "NP_SINGLE_RING", 25e9), MIB, "ring", None),
    ],
)
def test_level0_sets_the_in_server_phase(system, size, schedule, intra):
    """Across servers level0 runs as HCCL runs it: a full mesh where it is fullmesh
    (NP_MESH, 4P_MESH: common.h:76-89), a ring for the 8P and single rings; one-level
    schedules take no option."""
    choice = hccl_choice(system, "all_reduce", size)
    assert (choice.schedule, choice.intra) == (schedule, intra)
    assert choice.options == ({"intra": intra} if intra else {})


COUNTS = [(5, "ring"), (6, "ring"), (7, "ring"), (8, "H-D_R"), (12, "H-D_R"), (16, "H-D_R")]


@pytest.mark.parametrize(("servers", "level1"), COUNTS)
def test_910_server_counts(servers, level1):
    """GetDefaultAlgoLevel1V1: >= 8 servers (common.h:62) or a power of two -> H-D_R."""
    system = HcclSystem("910", servers, 8, "8P_RING", 12.5e9)
    for size in (8, MIB, 1 << 32):
        assert hccl_choice(system, "all_reduce", size).level1 == level1


def test_910b_cost_model_by_hand():
    """All-gather on 4 servers of 8, 1 MiB per rank, 25 GB/s: ring 3 x 60 + 3/4 x 32 MiB
    / 25 GB/s; NHR and HD (a power of two) 2 x 60 + the same: NHR wins the tie with HD
    (coll_alg_operator.cc:346-383). On 5 servers recursive HD moves 9/5, not 4/5."""
    system = HcclSystem("910b", 4, 8, "NP_MESH", 25e9)
    moved = 0.75 * 32 * MIB / 25e9 * 1e6
    costs = level1_costs(system, "all_gather", MIB)
    assert costs == pytest.approx({"ring": 180 + moved, "NHR": 120 + moved, "H-D_R": 120 + moved})
    odd = level1_costs(HcclSystem("910b", 5, 8, "NP_MESH", 25e9), "all_gather", MIB)
    assert odd["H-D_R"] - odd["NHR"] == pytest.approx(40 * MIB / 25e9 * 1e6)
    # 2 MiB per rank -> pipeline; 2 MiB - 4 B is under the threshold -> the cost model.
    assert hccl_choice(system, "all_gather", 64 * MIB).level1 == "pipeline"
    assert hccl_choice(system, "all_gather", 64 * MIB - 128).level1 == "NHR"


def test_rdma_lite_lowers_the_pipeline_threshold():
    """With RDMA Lite: 32 KiB per rank for all-gather / reduce-scatter, 1 MiB per rank for
    all-reduce (coll_alg_operator.cc:34-35)."""
    lite = HcclSystem("910b", 2, 8, "NP_MESH", 25e9, rdma_lite=True)
    assert hccl_choice(lite, "all_gather", 16 * 32 * 1024).level1 == "pipeline"
    assert hccl_choice(lite, "all_gather", 16 * 32 * 1024 - 64).level1 == "ring"
    assert hccl_choice(lite, "all_reduce", 16 * MIB).level1 == "pipeline"
    assert hccl_choice(lite, "all_reduce", 16 * MIB - 64).level1 == "ring"


def test_hccl_algo_forces_level1():
    """HCCL_ALGO (CANN 8.0.RC2+): global or per operation; forcing turns the automatic
    choice off (no pipeline); pipeline is 910B only (alg_configurator.cc:253-258)."""
    b = HcclSystem("910b", 2, 8, "NP_MESH", 25e9)
    assert hccl_choice(b, "all_reduce", 1 << 30, algo="level0:NA;level1:NHR").level1 == "NHR"
    per_op = "allreduce=level0:NA;level1:H-D_R/allgather=level0:NA;level1:ring"
    assert hccl_choice(b, "all_reduce", MIB, algo=per_op).level1 == "H-D_R"
    assert hccl_choice(b, "reduce_scatter", 1 << 30, algo=per_op).level1 == "pipeline"
    a = HcclSystem("910", 3, 8, "8P_RING", 12.5e9)
    assert hccl_choice(a, "all_reduce", MIB, algo="level0:NA;level1:pipeline").level1 == "ring"
    one_npu = HcclSystem("910b", 4, 1, "NP_SINGLE_RING", 25e9)
    assert hccl_choice(one_npu, "all_reduce", MIB, algo="level1:H-D_R").schedule == (
        "halving-doubling")  # fmt: skip
    assert parse_hccl_algo("", "all_reduce") is None


@pytest.mark.parametrize(("text", "words"), [("level0:NA;level1:tree", ["tree", "NHR"]),
                                             ("alltoal=level1:ring", ["alltoal", "allreduce"]),
                                             ("level1ring", ["level0:NA"])])  # fmt: skip
def test_bad_hccl_algo_is_one_clear_error(text, words):
    with pytest.raises(CcsimError) as error:
        HcclPolicy(algo=text)
    assert "\n" not in str(error.value)
    for word in words:
        assert word in str(error.value)


def test_ascend_presets_default_to_hccl_and_refuse_nccl(capsys):
    assert library_of(load_topology("ascend-910")) == "hccl"
    assert library_of(load_topology("ascend-910b", 2)) == "hccl"
    assert library_of(load_topology("dgx-h100")) == "nccl"
    main(["collective", "all_reduce", "--topology", "ascend-910b", "--sizes", "1K,1M"])
    out = capsys.readouterr().out
    assert "algorithm hccl" in out and "# hccl: size (B), then HCCL's choice" in out
    assert "1048576  fullmesh (AllReduceMeshOpbaseLoopExecutor) channels 1 (ccsim direct" in out
    with pytest.raises(CcsimError, match="NCCL runs on NVIDIA GPUs only.*hccl"):
        simulate_collective("ascend-910", "all_reduce", MIB, "nccl")
    with pytest.raises(CcsimError, match="Ascend 910 and 910B.*A100"):
        simulate_collective("dgx-a100", "all_reduce", MIB, "hccl")


def test_one_910b_server_matches_the_mesh_closed_form():
    """HCCL's Mesh all-reduce (docs/Mesh.md): 2 alpha + 2/p n beta, run as ccsim's direct.
    Per hop: NPU -> SDMA 0.5 us, HCCS 1 us, SDMA -> NPU 0.5 us = 2 us; each NPU sends n/8
    to each of 7 peers at once over its own 56 GB/s HCCS link (the SDMA engines carry
    7 x 56 = 392 GB/s, so never limit). All-gather: one step, alpha + n/(p B)."""
    for size in (MIB, 64 * MIB):
        result = simulate_collective("ascend-910b", "all_reduce", size, "hccl")
        assert result.algorithm == "direct"
        assert result.params["hccl_algorithm"] == "fullmesh"
        assert result.time_us == pytest.approx(2 * (2.0 + size / 8 / 56e9 * 1e6), rel=1e-9)
    result = simulate_collective("ascend-910b", "all_gather", 64 * MIB, "hccl")
    assert result.time_us == pytest.approx(2.0 + 8 * MIB / 56e9 * 1e6, rel=1e-9)


def test_policy_records_the_choice_and_runs_across_servers():
    result = HcclPolicy().simulate(load_topology("ascend-910b", 2), "all_gather", 1 << 30)
    assert result.algorithm == "pipelined"
    assert (result.params["hccl_algorithm"], result.params["chunks"]) == ("fullmesh+pipeline", 2)
    assert result.params["hccl_loops"] == 6  # 1 GiB through a 200 MiB buffer


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["all_reduce", "--algo", "hcl"], ["hcl", "hccl", "nccl", "ring"]),
        (["all_reduce", "--algo", "nccl", "--topology", "ascend-910b"], ["NCCL", "hccl"]),
        (["all_reduce", "--algo", "hccl", "--topology", "dgx-a100"], ["Ascend", "nccl"]),
        (["all_reduce", "--algo", "hccl", "--topology", "ascend-910", "--proto", "LL"],
         ["protocols"]),
        (["broadcast", "--topology", "ascend-910b"], ["all_reduce", "--algo"]),
    ],
)  # fmt: skip
def test_bad_names_give_one_line(args, words):
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "collective", "--sizes", "1M", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0]
