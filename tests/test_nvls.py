"""NVLS (in-switch reduction and multicast): symbolic correctness, closed forms, bytes on
each link, the calibrated H100 figures and the errors a user can hit."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.algorithms import RankLayout, build_schedule
from simulator.algorithms.checker import verify
from simulator.algorithms.schedule import PATH_DEFAULT, PATH_DOWN, PATH_UP, Schedule
from simulator.collective.simulate import simulate_collective
from simulator.collective.tuner import AutoTuner
from simulator.errors import CcsimError, ScheduleError
from simulator.topology import load_topology

B = 450e9  # dgx-h100: NVLink4 per GPU and direction
A = 0.3e-6  # dgx-h100: GPU <-> NVSwitch link latency
P = 8


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("p", [2, 3, 5, 8, 9])
@pytest.mark.parametrize(("chunks", "channels"), [(1, 1), (3, 1), (2, 2)])
def test_schedule_computes_the_collective(op, p, chunks, channels):
    verify(build_schedule("nvls", op, p, 1e6, chunks=chunks, channels=channels))


def test_json_round_trip_keeps_switch_paths():
    schedule = build_schedule("nvls", "all_reduce", 4, 1e6, chunks=2)
    again = Schedule.from_dict(schedule.to_dict())
    assert np.array_equal(again.path, schedule.path)
    assert set(np.unique(again.path).tolist()) == {PATH_UP, PATH_DOWN}
    verify(again)


def test_self_ops_only_on_switch_paths():
    schedule = build_schedule("nvls", "all_reduce", 4, 1e6)
    schedule.path[:] = PATH_DEFAULT
    with pytest.raises(ScheduleError, match="to itself"):
        schedule.check_structure()


@pytest.mark.parametrize(
    ("op", "phases"), [("all_reduce", 4), ("reduce_scatter", 2), ("all_gather", 2)]
)
def test_one_chunk_closed_form(op, phases):
    # K = 1: the phases run one after another. All-reduce: p copies of n/p up, the sum
    # n/p down, n/p up, p copies of n/p down: 4a + 2(p+1)n/(pB). RS or AG: half of it.
    n = 2**30
    result = simulate_collective("dgx-h100", op, n, "nvls")
    expected = phases * A + phases / 2 * (P + 1) * n / (P * B)
    assert result.time_s == pytest.approx(expected, rel=1e-9)


def test_every_gpu_link_carries_n_times_p_plus_one_over_p():
    n = 64e6
    result = simulate_collective("dgx-h100", "all_reduce", n, "nvls", chunks=4)
    links = result.links
    for src, dst, kind, nbytes in zip(
        links["src"], links["dst"], links["link"], links["bytes"], strict=True
    ):
        if kind == "nvlink":  # every GPU <-> switch link, both directions
            assert nbytes == pytest.approx(n * (P + 1) / P, rel=1e-12), (src, dst)


def test_chunks_pipeline_towards_the_in_switch_bound():
    # Large K overlaps the all-gather of chunk k with the reduce-scatter of chunk k+1:
    # the time tends to (p+1)n/(pB), busbw to 2(p-1)B/(p+1) = 700 GB/s, well above a
    # ring's B = 450.
    n = 2**30
    bound = 2 * (P - 1) / (P + 1) * B / 1e9
    busbw = [
        simulate_collective("dgx-h100", "all_reduce", n, "nvls", chunks=k).busbw_GBps
        for k in (1, 4, 16, 64)
    ]
    assert busbw == sorted(busbw)
    assert bound * 0.95 < busbw[-1] <= bound
    ring = simulate_collective("dgx-h100", "all_reduce", n, "ring").busbw_GBps
    # Ring: 2(p-1) steps of a + n/(pB), a = 2A (GPU -> switch -> GPU).
    assert ring == pytest.approx(B / 1e9 * (n / P) / (n / P + 2 * A * B), rel=1e-9)
    assert busbw[-1] > 1.5 * ring


def test_calibrated_h100_matches_nvidia_figures():
    # NVIDIA reports ~480 GB/s NVLS all-reduce busbw on one H100 node and ~365-370 GB/s
    # with the ring forced (shared/reference/README.md).
    n = 4 * 2**30
    nvls = simulate_collective("dgx-h100", "all_reduce", n, "nvls", chunks=64, protocol="auto")
    ring = simulate_collective("dgx-h100", "all_reduce", n, "ring", protocol="auto")
    assert nvls.params["protocol"] == "Simple"
    assert 450 <= nvls.busbw_GBps <= 480
    assert 360 <= ring.busbw_GBps <= 372


def test_tuner_picks_nvls_for_large_messages_where_the_switch_has_it():
    """--algo auto --proto auto: the (algorithm, protocol) pair with the lowest simulated
    time: NVLS (Simple) at 1 GiB on H100; for 1 KiB the lowest-latency protocol, LL."""
    h100 = load_topology("dgx-h100", 1)
    tuner = AutoTuner(protocol="auto")
    big = tuner.simulate(h100, "all_reduce", 2**30)
    assert (big.algorithm, big.params["protocol"]) == ("nvls", "Simple")
    assert tuner.simulate(h100, "all_reduce", 2**10).params["protocol"] == "LL"
    a100 = load_topology("dgx-a100", 1)
    assert tuner.choose(a100, "all_reduce", 2**30).algorithm != "nvls"


def test_errors_name_the_problem():
    with pytest.raises(CcsimError, match="NVLink SHARP"):
        simulate_collective("dgx-a100", "all_reduce", 1e6, "nvls")
    with pytest.raises(CcsimError, match="across servers nvls implements all-reduce only"):
        simulate_collective("dgx-h100", "reduce_scatter", 1e6, "nvls", nodes=2)
    with pytest.raises(CcsimError, match="Simple protocol only"):
        simulate_collective("dgx-h100", "all_reduce", 1e6, "nvls", protocol="LL")
    with pytest.raises(CcsimError, match="does not implement broadcast"):
        simulate_collective("dgx-h100", "broadcast", 1e6, "nvls")


@pytest.mark.parametrize("servers", [2, 3])
@pytest.mark.parametrize("per_server", [2, 4])
@pytest.mark.parametrize(("chunks", "channels"), [(1, 1), (2, 2)])
def test_across_servers_computes_an_all_reduce(servers, per_server, chunks, channels):
    layout = RankLayout(
        servers * per_server, tuple(r // per_server for r in range(servers * per_server))
    )
    verify(build_schedule("nvls", "all_reduce", layout, 1e6, chunks=chunks, channels=channels))
    # Ranks need not be numbered server by server.
    mixed = RankLayout(
        servers * per_server, tuple(r % servers for r in range(servers * per_server))
    )
    verify(build_schedule("nvls", "all_reduce", mixed, 1e6, chunks=chunks))


def test_across_servers_bytes_per_link():
    """N servers of g GPUs: inside, each GPU <-> switch link carries n(g+1)/g each way
    (as on one server); across, ring j all-reduces row j (n/g) over the N ranks (., j),
    so each GPU's NIC sends and receives 2(N-1)/N x n/g."""
    n, servers, g = 96e6, 2, 8
    result = simulate_collective("dgx-h100", "all_reduce", n, "nvls", nodes=servers, chunks=2)
    links = result.links
    for src, dst, kind, nbytes in zip(
        links["src"], links["dst"], links["link"], links["bytes"], strict=True
    ):
        if kind == "nvlink":
            assert nbytes == pytest.approx(n * (g + 1) / g, rel=1e-12), (src, dst)
        elif kind == "rdma" and ("nic" in src) != ("nic" in dst):  # NIC <-> leaf switch
            assert nbytes == pytest.approx(2 * (servers - 1) / servers * n / g, rel=1e-12)


def test_across_servers_pipelines_towards_its_bound():
    """Ideal model, 2 x dgx-h100, 1 GiB: with enough chunks the intra-server NVLS phases
    (n(g+1)/g per NVLink at 450 GB/s) and the inter-server rings (n/g per 50 GB/s NIC)
    overlap, so the time tends to the larger of the two loads: here both take
    2.5 ps per byte, busbw 2(p-1)/p / 2.5 ps = 750 GB/s. The plain hierarchical ring
    adds its phases up and stays far below."""
    n, g = 2**30, 8
    bound = max(n * (g + 1) / g / 450e9, n / g / 50e9)
    result = simulate_collective("dgx-h100", "all_reduce", n, "nvls", nodes=2, chunks=64)
    assert bound <= result.time_s <= 1.1 * bound
    hier = simulate_collective("dgx-h100", "all_reduce", n, "hierarchical", nodes=2)
    assert result.time_s < 0.7 * hier.time_s
