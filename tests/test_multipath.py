"""Multipath: part of an intra-server collective over the GPU links, part over the NICs."""

import numpy as np
import pytest

import simulator
from simulator import Schedule, build_schedule, verify
from simulator.algorithms.base import RankLayout
from simulator.cli.main import main
from simulator.errors import CcsimError


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("p", range(2, 18))
def test_multipath_schedules_compute_their_collective(op, p):
    for fraction in (0.0, 0.3, 1.0):
        verify(build_schedule("multipath", op, p, 1e6, fraction=fraction, chunks=2))


def test_auto_split_matches_the_best_swept_split_and_the_two_path_bound():
    """One ascend-910b server, 1 GiB all-reduce. The HCCS ring runs at one 56 GB/s link
    per hop (B1); the RoCE ring at one 200GE port per NPU, 25 GB/s (B2). With the data
    split in proportion, both finish together: T = 2(p-1)/p x n / (B1 + B2) plus small
    latencies. The auto split must be within 2% of the best of x = 0, 0.01, ..., 1."""
    n, p = 2**30, 8
    auto = simulator.simulate_collective("ascend-910b", "all_reduce", n, "multipath")
    swept = min(
        simulator.simulate_collective(
            "ascend-910b", "all_reduce", n, "multipath", fraction=float(x)
        ).time_s
        for x in np.linspace(0, 1, 101)
    )
    assert auto.time_s <= swept * 1.02
    bound = 2 * (p - 1) / p * n / (56e9 + 25e9)
    assert auto.time_s == pytest.approx(bound, rel=0.05)
    assert auto.params["fraction"] == pytest.approx(56 / 81, abs=0.01)
    ring = simulator.simulate_collective("ascend-910b", "all_reduce", n)
    assert ring.time_s / auto.time_s == pytest.approx(81 / 56, rel=0.02)


def test_network_share_crosses_the_switch():
    """With everything on the NICs, every byte crosses the leaf switch; with nothing,
    none does."""
    for fraction, crosses in ((0.0, True), (1.0, False)):
        result = simulator.simulate_collective(
            "ascend-910b", "all_gather", 8e6, "multipath", fraction=fraction
        )
        links = zip(result.links["src"], result.links["dst"], result.links["bytes"], strict=True)
        switch_bytes = sum(b for u, v, b in links if "switch" in u or "switch" in v)
        assert (switch_bytes > 0) == crosses


def test_multipath_is_for_one_server():
    layout = RankLayout(16, tuple([0] * 8 + [1] * 8))
    with pytest.raises(CcsimError, match="inside one server.*algorithms that can: .*ring"):
        build_schedule("multipath", "all_reduce", layout, 1e6)


def test_one_ascend_910b_runs_multipath_as_shipped(capsys):
    """Regression: on one ascend-910b with the preset's defaults (no --fabric) multipath
    failed, finding no network path: one server got no fabric, although the preset names
    one. Its fabric now says ``single_server: true``, so the NICs reach its switch and a
    1 GiB all-reduce takes the closed form of the split. A ring all-reduce of m bytes
    takes 2(p-1)(a + m/(pB)); a hop of the HCCS ring costs a1 = 2 us (NPU -> SDMA 0.5,
    HCCS 1, SDMA -> NPU 0.5) at B1 = 56 GB/s, one of the RoCE ring a2 = 1 us (NPU -> NIC
    0, NIC -> switch 0.5, switch -> NIC 0.5) at B2 = 25 GB/s. The auto split gives the HCCS ring
    x = T2 / (T1 + T2) of the data, T_i each ring's time for all of it; the rings share no
    link, so the collective ends with the later of them. That is 81/56 faster than the
    HCCS ring alone, the RoCE ports adding their bandwidth (direct, on all seven HCCS
    links at once, is faster still: multipath splits a ring)."""
    n, p = 2**30, 8
    ring = [2 * (p - 1) * (a + n / (p * b)) for a, b in ((2e-6, 56e9), (1e-6, 25e9))]
    x = ring[1] / sum(ring)
    closed = max(
        2 * (p - 1) * (2e-6 + x * n / (p * 56e9)), 2 * (p - 1) * (1e-6 + (1 - x) * n / (p * 25e9))
    )
    result = simulator.simulate_collective("ascend-910b", "all_reduce", n, "multipath")
    assert result.params["fraction"] == pytest.approx(x, rel=1e-9)
    assert result.time_s == pytest.approx(closed, rel=1e-9)
    hccs_only = simulator.simulate_collective("ascend-910b", "all_reduce", n, "ring").time_s
    assert hccs_only == pytest.approx(ring[0], rel=1e-9)
    assert hccs_only / result.time_s == pytest.approx(81 / 56, rel=0.01)
    command = "collective all_reduce --topology ascend-910b --algo multipath --sizes 1M,1G"
    assert main(command.split()) == 0
    assert "23222.5" in capsys.readouterr().out


def test_no_network_path_is_a_clear_error():
    """One dgx-a100's fabric is not built for one server (no ``single_server``), so its
    NICs are unlinked and no network path exists."""
    with pytest.raises(CcsimError, match="avoids the server's GPU interconnect"):
        simulator.simulate_collective("dgx-a100", "all_reduce", 1e6, "multipath", fraction=0.5)


def test_path_survives_json(tmp_path):
    schedule = build_schedule("multipath", "all_reduce", 4, 1e6, fraction=0.5)
    schedule.save(tmp_path / "m.json")
    assert np.array_equal(Schedule.load(tmp_path / "m.json").path, schedule.path)
    assert set(schedule.path.tolist()) == {0, 1}
