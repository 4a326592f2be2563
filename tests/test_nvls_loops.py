"""NVLS all-reduce inside one NVLink domain on Blackwell: NCCL's loops bound by its
thread blocks (simulator.library.nccl.nvls_loops).

Every expected value is worked out here from the cited constants: NCCL's loop of
channels x heads x chunk bytes (enqueue.cc:2262-2274, device/all_reduce.h:410-455 at
v2.30.7), a GPU's NVLinks at NCCL's per-link figure and NVLS share (40.1 GB/s, 0.74),
the NVLS traffic n (p + 1) / p per direction, and the fitted per-step constants.
"""

import dataclasses
import math
from pathlib import Path

import pytest

from simulator.collective.policy import NcclPolicy, nvls_chunk, protocol_model
from simulator.library.nccl import (
    NVLS_CTA_GBPS,
    NVLS_STEP_US,
    NcclSystem,
    SearchGraph,
    nvls_loops,
)
from simulator.library.protocol import calibration_of
from simulator.topology import load_topology

GB300_64 = Path(__file__).parents[1] / "simulator/data/nccl-tests/gb300-nvl72-64.yaml"


def b200(ranks: int = 8, nodes: int = 1, arch: str = "blackwell") -> NcclSystem:
    ring = SearchGraph(16, 45.0, 45.0)
    nvls = SearchGraph(min(ranks // nodes, 32), 80.0, 90.0)
    return NcclSystem(arch, ranks, nodes, True, ring, ring, nvls, 32, 24, nvlinks=18)


def by_hand(size: float, channels: int, heads: int, chunk: float, ranks: int):
    a, b = NVLS_STEP_US["blackwell"]
    sync = a + b * heads
    step = sync + heads * chunk / (NVLS_CTA_GBPS["blackwell"] * 1e3)
    link_gbps = 18 * 40.1 * 0.74 * ranks / (ranks + 1)
    link = channels * heads * chunk / (link_gbps * 1e3)
    loops = size / (channels * heads * chunk)
    latency = max(0.0, math.ceil(loops) * sync + loops * (step - sync) - loops * max(step, link))
    return loops, step, link, min(1.0, link / step), latency


@pytest.mark.parametrize(
    ("size", "chunk"), [(64 * 2**20, 32768), (4 * 2**20, 16384), (2**34, 131072)]
)
def test_loops_of_eight_blackwell_gpus_match_the_hand_count(size, chunk):
    # NCCL's chunk for 24 channels x 8 heads: 16 KiB below 2 x 192 x 32 KiB, 32 KiB
    # below 8 x 192 x 64 KiB, 128 KiB from 64 x 192 x 128 KiB.
    assert nvls_chunk("NVLS", size, 24 * 8) == chunk
    got = nvls_loops(b200(), "all_reduce", size, 24, 8, chunk)
    want = by_hand(size, 24, 8, chunk, 8)
    assert dataclasses.astuple(got) == pytest.approx(want, rel=1e-12)


def test_64_mib_on_eight_gpus_is_thread_block_bound_and_16_gib_link_bound():
    middle = nvls_loops(b200(), "all_reduce", 64 * 2**20, 24, 8, 32768)
    # 6,291,456 B a loop at 18 x 40.1 x 0.74 x 8/9 = 474.8 GB/s: 13.25 us.
    assert middle.loops == pytest.approx(32 / 3)
    assert middle.link_us == pytest.approx(6291456 / 474.78e3, rel=1e-4)
    assert middle.factor < 1 and middle.latency_us > 0
    # 11 synchronisations where the factor charged 10 2/3 of them.
    sync = NVLS_STEP_US["blackwell"][0] + 8 * NVLS_STEP_US["blackwell"][1]
    assert middle.latency_us == pytest.approx((11 - 32 / 3) * sync, rel=1e-9)
    top = nvls_loops(b200(), "all_reduce", 2**34, 24, 8, 131072)
    assert top.factor == 1.0 and top.latency_us == 0.0


def test_no_bound_where_nothing_was_measured():
    assert nvls_loops(b200(arch="ampere"), "all_reduce", 2**26, 16, 8, 65536) is None
    assert nvls_loops(b200(16, 2), "all_reduce", 2**26, 32, 8, 65536) is None
    assert nvls_loops(b200(), "all_gather", 2**26, 24, 8, 65536) is None


def test_policy_hands_the_bound_to_the_protocol():
    graph = load_topology("hgx-b200")
    policy = NcclPolicy()
    system = policy.system(graph)
    plan = policy.plan(system, "all_reduce", 64 * 2**20)
    assert (plan.params["nccl_algorithm"], plan.channels) == ("NVLS", 24)
    loops = nvls_loops(system, "all_reduce", 64 * 2**20, 24, 8, 32768)
    assert plan.params["bandwidth_factor"] == pytest.approx(loops.factor)
    assert plan.params["step_latency_s"] == pytest.approx(loops.latency_us * 1e-6)
    proto = protocol_model(graph, "Simple", plan.params)
    simple = calibration_of(graph).protocol("Simple")
    assert proto.base_s == pytest.approx(simple.base_s + loops.latency_us * 1e-6)
    assert proto.bandwidth == pytest.approx(simple.bandwidth * loops.factor)
    # Hopper: its own step (a + b x 8 heads = 3 + 0.3 x 8 = 5.4 us) at the same block
    # rate; 256 MiB with 64 KiB chunks on 16 channels x 8 heads: 32 loops of 8 MiB, each
    # 5.4 + 8 x 64 KiB / 28.5 GB/s = 23.8 us of one block against 8 MiB at the links'
    # 18 x 20.6 x 0.85 x 8/9 = 280 GB/s = 30.0 us: link-bound, no factor.
    h100 = policy.plan(policy.system(load_topology("dgx-h100")), "all_reduce", 2**28)
    assert h100.params["nccl_algorithm"] == "NVLS"
    assert h100.params["bandwidth_factor"] == 1.0
    hopper = nvls_loops(policy.system(load_topology("dgx-h100")), "all_reduce", 2**28, 16, 8, 65536)
    assert hopper.step_us == pytest.approx(3 + 0.3 * 8 + 8 * 65536 / 28.5e3, rel=1e-12)
    assert hopper.link_us == pytest.approx(16 * 8 * 65536 / (18 * 20.6 * 0.85 * 8 / 9 * 1e3))
    assert hopper.factor == 1.0


def test_a_64_gpu_rack_pays_a_32_head_synchronisation_even_for_a_short_call():
    """64 GPUs: 32 NVLS heads (NCCL_MAX_NVLS_ARITY), 24 channels; 1 MiB is far less
    than one loop, yet its one synchronisation (a + 32 b) is paid whole."""
    system = NcclPolicy().system(load_topology(GB300_64))
    assert (system.ranks, system.nodes, system.nvls_channels) == (64, 1, 24)
    size = float(2**20)
    chunk = nvls_chunk("NVLS", size, 24 * 32)
    got = nvls_loops(system, "all_reduce", size, 24, 32, chunk)
    a, b = NVLS_STEP_US["blackwell"]
    loops = size / (24 * 32 * chunk)
    assert got.loops == pytest.approx(loops)
    # One synchronisation less the share of it the bandwidth factor already charges.
    assert got.latency_us == pytest.approx((1 - loops) * (a + 32 * b), rel=1e-9)


def test_nvls_tree_on_blackwell_takes_nccl_s_tree_correction():
    """NCCL scales NVLSTree's bandwidth on Blackwell (x86 hosts) by its tree correction
    table (tuning.cc:643-646 at v2.30.7): at 4 MiB, log2(4 MiB / 64) = 16, Simple's entry
    is 0.7; at 1 GiB (log 24) no correction. Hopper's NVLSTree keeps 1."""
    policy = NcclPolicy()
    system = policy.system(load_topology("hgx-b200", 2))
    plan = policy.plan(system, "all_reduce", 4 * 2**20)
    assert (plan.params["nccl_algorithm"], plan.protocol) == ("NVLSTree", "Simple")
    assert plan.params["bandwidth_factor"] == pytest.approx(0.7)
    assert policy.plan(system, "all_reduce", 2**30).params["bandwidth_factor"] == 1.0
    hopper = policy.plan(policy.system(load_topology("dgx-h100", 2)), "all_reduce", 2**24)
    assert hopper.params["nccl_algorithm"] == "NVLSTree"
    assert hopper.params["bandwidth_factor"] == 1.0


def test_runs_the_nvls_constants_were_chosen_on_are_not_called_predictions():
    """B200-1N-AR-Vultr set the fitted NVLS constants: ``ccsim validate`` marks it fitted
    (no prediction column until left out) and ``--loco`` says where its left-out error
    is rather than reusing the in-sample one."""
    from simulator.validate.calibrate import leave_one_case_out
    from simulator.validate.nccl_tests import BUNDLED, load_case, run_case

    case = load_case(BUNDLED / "B200-1N-AR-Vultr.yaml")
    case = dataclasses.replace(case, measured=case.measured[:1])  # 8 B: one fast size
    result = run_case(case)
    assert result.fitted
    assert result.summary()["loco_time_median_pct"] is None
    leave_one_case_out([case], [result])
    assert result.loco is None and "README" in result.loco_source


def test_large_nvls_all_reduce_reaches_the_links_closed_form():
    # 16 GiB on one DGX H100: NCCL runs 16 GiB / (16 channels x 8 heads x 128 KiB) =
    # 1024 loops a channel, so its pipeline fill is negligible and the call runs at the
    # links' NVLS bound: each GPU moves n (p + 1) / p per direction at the preset's NVLS
    # share of 450 GB/s (0.686), i.e. busbw 2 (p - 1) / (p + 1) x 450 x 0.686 = 480.2
    # GB/s, NVIDIA's ~480 GB/s (shared/reference/README.md). ccsim's schedule is at most
    # 32 chunks deep; before its fill was given back it reached 452.8 (5.7% low).
    from simulator.library.nccl import nvls_fill_factor

    result = NcclPolicy().simulate(load_topology("dgx-h100", 1), "all_reduce", 2**34)
    assert result.params["nccl_algorithm"] == "NVLS"
    assert result.busbw_GBps == pytest.approx(2 * 7 / 9 * 450 * 0.686, rel=0.01)
    # Where ccsim's pipeline is as deep as NCCL's, nothing changes.
    assert nvls_fill_factor(2, 2.0) == 1.0
    assert nvls_fill_factor(32, 1024) == pytest.approx((1 + 2 / 32) / (1 + 2 / 1024))
