"""NVLSTree across NVLink domains on Blackwell: the thread blocks of channels whose head
has a tree parent gather with 5 warps where one-domain NVLS gathers with 7
(simulator.library.nccl.nvls_tree_loops).

Every expected value is worked out here from the cited source and constants: NCCL's
warp split (device/all_reduce.h at v2.27.3-1: NVLS lines 393-397, NVLSTree 533-537;
NCCL_MAX_NTHREADS 640 = 20 warps, include/device.h), NCCL's loop of channels x heads x
chunk bytes, a GPU's NVLinks at NCCL's per-link figure and NVLS share (18 x 40.1 GB/s x
0.74), a head's own 400 Gb/s NIC, and the fitted per-step constants.
"""

import dataclasses
import math
from pathlib import Path

import pytest

from simulator.collective.policy import NcclPolicy
from simulator.library.nccl import (
    NVLS_CTA_GBPS,
    NVLS_GATHER_WARPS,
    NVLS_STEP_US,
    NVLS_TREE_GATHER_WARPS,
    nccl_system,
    nvls_tree_loops,
)
from simulator.topology import load_topology

DATA = Path(__file__).parents[1] / "simulator/data/nccl-tests"
TOTAL_WARPS = 640 // 32


def test_warp_split_follows_all_reduce_h():
    # NVLS, one node, more than 6 ranks, no registered buffers: reduce 5, bcast 0,
    # scatter (20 - 5 - 0 + 1) >> 1, gather (20 - 5 - 0) >> 1.
    assert (TOTAL_WARPS - 5 - 0) >> 1 == NVLS_GATHER_WARPS == 7
    # NVLSTree, a head with a tree parent: bcast 4, reduce 5, gather (20 - 5 - 4) >> 1;
    # the scatter gets (20 - 5 - 4 + 1) >> 1 = 6, so the gather is the smaller group.
    assert (TOTAL_WARPS - 5 - 4) >> 1 == NVLS_TREE_GATHER_WARPS == 5
    assert (TOTAL_WARPS - 5 - 4 + 1) >> 1 == 6


def racks(gpus: int, nodes: int, version: str = "2.27.3"):
    return nccl_system(load_topology(DATA / f"gb200-nvl72-{gpus}.yaml", nodes), version)


def by_hand(size, channels, heads, chunk, nodes):
    a, b = NVLS_STEP_US["blackwell"]
    sync = a + b * heads
    rate = NVLS_CTA_GBPS["blackwell"] * 5 / 7
    step = sync + heads * chunk / (rate * 1e3)
    link = channels * heads * chunk * (heads + 1) / heads / (18 * 40.1 * 0.74 * 1e3)
    nic = channels * chunk * min(nodes, 4) / 2 / (50 * 1e3)  # 400 Gb/s = 50 GB/s
    bound = max(link, nic)
    loops = size / (channels * heads * chunk)
    latency = max(0.0, math.ceil(loops) * sync + loops * (step - sync) - loops * max(step, bound))
    return loops, step, bound, min(1.0, bound / step), latency


@pytest.mark.parametrize(("gpus", "nodes"), [(64, 2), (64, 3), (8, 2)])
def test_loops_across_racks_match_the_hand_count(gpus, nodes):
    system = racks(gpus, nodes)
    heads = system.nvls.channels
    assert heads == min(gpus, 32)  # one head a NIC, at most 32
    got = nvls_tree_loops(system, "all_reduce", 8 * 2**30, 32, heads, 131072)
    assert dataclasses.astuple(got) == pytest.approx(by_hand(8 * 2**30, 32, heads, 131072, nodes))


def test_eight_heads_stay_nic_bound():
    # 2 x 8 GPUs, 8 heads: a loop's 32 x 128 KiB cross each head's NIC in 83.9 us, more
    # than the links' 70.7 us, so the NICs (simulated) bind, not a factor.
    got = nvls_tree_loops(racks(8, 2), "all_reduce", 8 * 2**30, 32, 8, 131072)
    assert got.link_us == pytest.approx(32 * 131072 / 50e3)
    assert got.factor == 1.0 or got.step_us > got.link_us


def test_one_domain_and_other_operations_have_no_tree_bound():
    assert nvls_tree_loops(racks(64, 1), "all_reduce", 2**33, 24, 32, 131072) is None
    assert nvls_tree_loops(racks(64, 2), "all_gather", 2**33, 32, 32, 131072) is None


def test_policy_applies_the_factor_to_nvls_tree_across_racks():
    graph = load_topology(DATA / "gb200-nvl72-64.yaml", 2)
    policy = NcclPolicy(version="2.27.3")
    plan = policy.plan(policy.system(graph), "all_reduce", 8 * 2**30)
    assert plan.params["nccl_algorithm"] == "NVLSTree"
    loops = nvls_tree_loops(policy.system(graph), "all_reduce", 8 * 2**30, 32, 32, 131072)
    assert plan.params["message_bytes"] == 131072
    assert plan.params["bandwidth_factor"] == pytest.approx(loops.factor)
