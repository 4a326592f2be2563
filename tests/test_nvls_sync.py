"""The synchronisation floor of NCCL's NVLS all-gather and reduce-scatter inside one
NVLink domain (simulator.library.nccl.nvls_sync_us).

At v2.30.4-1 the all-gather's broadcast group sends through ``nvls->down`` on send[0]
(device/all_gather.h:277-285) and the reduce-scatter's reduce group receives from it on
recv[0] (device/reduce_scatter.h:247-255); transport/nvls.cc:525 and 540 flag those two
connections NCCL_NVLS_MIN_POLL, so every step's counter is read with
multimem.ld_reduce.min over every rank (prims_simple.h:96-104), the wait ccsim's NVLS
all-reduce already prices per step as NVLS_STEP_US = a + b x heads (Blackwell 3.0 +
0.85 x heads us, Hopper 3.0 + 0.3 x heads, fitted on all-reduce runs). Each expected
figure below is worked by hand from those constants and NCCL's latency table
(tuning.cc at v2.30.4-1: Simple base 8.4 us, line 146; Simple NVLink step 3.4 us and LL
NVLink step 0.6 us, line 154; LL base 6.6 us, line 146) and the presets' 3 us launch.
"""

from pathlib import Path

import pytest

from simulator.collective.policy import NcclPolicy, nvls_chunk
from simulator.library.nccl import NVLS_STEP_US, nvls_loops, nvls_sync_us
from simulator.topology import load_topology

DATA = Path(__file__).parents[1] / "simulator/data/nccl-tests"
GB200_32 = DATA / "gb200-nvl72-32.yaml"  # 32 GB200 of one NVL72 rack, one NVLink domain
GB200_8 = DATA / "gb200-nvl72-8.yaml"

LAUNCH_US = 3.0  # the presets' launch (nccl.launch)
SIMPLE_BASE_US, SIMPLE_NVLINK_US = 8.4, 3.4  # tuning.cc:146 and 154 at v2.30.4-1
LL_BASE_US, LL_NVLINK_US = 6.6, 0.6  # tuning.cc:146 and 154 at v2.30.4-1


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_a_32_gpu_nvls_call_pays_one_32_head_synchronisation(op):
    """32 GPUs of one domain: NCCL's model puts NVLS (25.0 us) under Ring/LL (6.6 + 31 x
    0.6 = 25.2 us) for a 1 KiB all-gather or reduce-scatter; each channel has 32 heads
    (every GPU, at most NCCL_MAX_NVLS_ARITY = 32), so the call waits 3.0 + 0.85 x 32 =
    30.2 us once, on top of its two Simple NVLink steps (GPU to switch, switch to GPU)."""
    policy = NcclPolicy()
    graph = load_topology(GB200_32)
    system = policy.system(graph)
    sync = 3.0 + 0.85 * 32
    assert nvls_sync_us(system, op, 32) == pytest.approx(sync, rel=1e-12)
    plan = policy.plan(system, op, 1024.0)
    assert (plan.params["nccl_algorithm"], plan.protocol, plan.channels) == ("NVLS", "Simple", 1)
    assert plan.params["step_latency_s"] == pytest.approx(sync * 1e-6, rel=1e-12)
    # 1 KiB moves 32 B a GPU at hundreds of GB/s: well under 0.01 us of bytes.
    want = LAUNCH_US + SIMPLE_BASE_US + 2 * SIMPLE_NVLINK_US + sync  # 48.4 us
    got = policy.simulate(graph, op, 1024.0).time_s * 1e6
    assert got == pytest.approx(want, abs=0.01)


def test_hopper_nvls_all_gather_takes_hopper_s_step():
    """Eight H200s with NCCL_ALGO=NVLS (NCCL's model itself prefers Ring for an
    all-gather on one Hopper server): Hopper's step, 3.0 + 0.3 x 8 = 5.4 us, so a 1 KiB
    call costs 3 + 8.4 + 2 x 3.4 + 5.4 = 23.6 us."""
    policy = NcclPolicy(algorithms=["NVLS"])
    graph = load_topology("hgx-h200")
    plan = policy.plan(policy.system(graph), "all_gather", 1024.0)
    assert plan.params["nccl_algorithm"] == "NVLS"
    assert NVLS_STEP_US["hopper"] == (3.0, 0.3)
    assert plan.params["step_latency_s"] == pytest.approx(5.4e-6, rel=1e-12)
    got = policy.simulate(graph, "all_gather", 1024.0).time_s * 1e6
    assert got == pytest.approx(LAUNCH_US + SIMPLE_BASE_US + 2 * SIMPLE_NVLINK_US + 5.4, abs=0.01)


def test_the_all_reduce_keeps_its_own_loop_model():
    """The all-reduce's NVLS latency stays what :func:`nvls_loops` gives (its loops'
    last synchronisation), not that plus a second one."""
    policy = NcclPolicy()
    system = policy.system(load_topology(GB200_32))
    plan = policy.plan(system, "all_reduce", 1024.0)
    assert plan.params["nccl_algorithm"] == "NVLS"
    chunk = plan.params["message_bytes"]
    assert chunk == nvls_chunk("NVLS", 1024.0, 32)
    loops = nvls_loops(system, "all_reduce", 1024.0, plan.channels, 32, chunk)
    assert plan.params["step_latency_s"] == pytest.approx(loops.latency_us * 1e-6, rel=1e-12)
    assert nvls_sync_us(system, "all_reduce", 32) is None


def test_no_floor_where_nvls_does_not_run_the_call():
    """Eight GB200s (one domain) run a 1 KiB all-gather as Ring/LL, as NCCL's model says
    (6.6 + 7 x 0.6 = 10.8 us against NVLS's 25): no NVLS term; ccsim's Blackwell LL step
    over NVLink (1.2 us, LL_NVLINK_HOP_US) gives 3 + 6.6 + 7 x 1.2 = 18.0 us. Across two
    domains NCCL runs neither operation as NVLS (tuning.cc:332-337), and a generation
    without a fitted step (Ampere) has none."""
    policy = NcclPolicy()
    graph = load_topology(GB200_8)
    plan = policy.plan(policy.system(graph), "all_gather", 1024.0)
    assert (plan.params["nccl_algorithm"], plan.protocol) == ("Ring", "LL")
    assert "step_latency_s" not in plan.params
    got = policy.simulate(graph, "all_gather", 1024.0).time_s * 1e6
    assert got == pytest.approx(LAUNCH_US + LL_BASE_US + 7 * 1.2, abs=0.05)
    two = policy.system(load_topology(GB200_8, 2))
    assert two.nodes == 2 and nvls_sync_us(two, "all_gather", 8) is None
    assert policy.plan(two, "all_gather", 1024.0).params["nccl_algorithm"] == "Ring"
    ampere = policy.system(load_topology("dgx-a100"))
    assert nvls_sync_us(ampere, "reduce_scatter", 8) is None
