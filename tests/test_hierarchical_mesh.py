"""Two-level collectives with a full mesh inside each server (``intra="mesh"``): the
in-server reduce-scatter and all-gather as one direct exchange among a server's g ranks,
the phase between servers a ring on each plane of equal local index, as HCCL runs a
fullmesh level0 (simulator.library.hccl)."""

from __future__ import annotations

import numpy as np
import pytest
from test_algorithms_timing import two_level

from simulator.algorithms import RankLayout, build_schedule
from simulator.algorithms.checker import verify
from simulator.collective import HcclPolicy
from simulator.collective.run import rank_layout, run_schedule
from simulator.errors import CcsimError
from simulator.topology import load_topology

OPS = ("all_reduce", "all_gather", "reduce_scatter")
SHAPES = [(2, 4), (3, 4), (4, 2), (2, 3), (1, 4), (4, 1), (2, 8)]
BI, AI, BE, AE = 100e9, 0.5e-6, 20e9, 2e-6  # in-server links, rails across servers
N_BYTES = 48 * 2**20


def layout(servers: int, per_server: int, *, strided: bool = False) -> RankLayout:
    """N servers of g ranks, numbered server by server or (strided) round robin."""
    p = servers * per_server
    where = [r % servers if strided else r // per_server for r in range(p)]
    return RankLayout(p, tuple(where))


@pytest.mark.parametrize(("servers", "per_server"), SHAPES)
def test_mesh_schedules_compute_their_collective(servers, per_server):
    """The symbolic checker passes for every op, both rank numberings, with and without
    chunks, channels and pipeline slices."""
    for strided in (False, True):
        ranks = layout(servers, per_server, strided=strided)
        for algorithm in ("hierarchical", "pipelined"):
            for op in OPS:
                for chunks, channels in ((1, 1), (3, 2)):
                    verify(
                        build_schedule(
                            algorithm, op, ranks, 1e6, chunks=chunks, channels=channels,
                            intra="mesh",
                        )
                    )  # fmt: skip


@pytest.mark.parametrize(("servers", "per_server"), [(2, 4), (3, 4), (4, 2), (2, 8)])
@pytest.mark.parametrize("algorithm", ["hierarchical", "pipelined"])
def test_mesh_bytes_by_hand(servers, per_server, algorithm):
    """Bytes each rank sends, n = nccl-tests' size, blocks as the module says.

    All-reduce: the mesh reduce-scatter sends the g-1 rows the other ranks own, n/g
    each: (g-1)/g n; the all-gather the same again; the ring across servers moves
    2(N-1)/N of the rank's n/g. All-gather and reduce-scatter: one in-server exchange of
    the rank's column (N blocks of n/p = n/g) with g-1 peers, (g-1)/g n, and a ring across
    servers of (N-1) blocks of n/p. Channels and slices cut the same bytes finer."""
    N, g, n = servers, per_server, 3.0 * 2**20
    ranks = layout(N, g, strided=True)
    server = np.asarray(ranks.servers)
    hand = {
        "all_reduce": (2 * (g - 1) / g * n, 2 * (N - 1) / N * n / g),
        "all_gather": ((g - 1) / g * n, (N - 1) * n / (N * g)),
        "reduce_scatter": ((g - 1) / g * n, (N - 1) * n / (N * g)),
    }
    for op, (inside, across) in hand.items():
        s = build_schedule(algorithm, op, ranks, n, chunks=2, channels=3, intra="mesh")
        same = server[s.src] == server[s.dst]
        sent_in = np.bincount(s.src[same], weights=s.nbytes[same], minlength=ranks.ranks)
        sent_out = np.bincount(s.src[~same], weights=s.nbytes[~same], minlength=ranks.ranks)
        np.testing.assert_allclose(sent_in, inside, rtol=1e-12)
        np.testing.assert_allclose(sent_out, across, rtol=1e-12)
        # One step inside a server: each message goes straight to the block's owner.
        assert len(np.unique(s.step[same])) == (2 if op == "all_reduce" else 1)


@pytest.mark.parametrize(("servers", "per_server"), SHAPES)
def test_mesh_closed_forms(servers, per_server):
    """Ideal two-level graph (tests/test_algorithms_timing.two_level): every pair in a
    server on its own link (a_i, B_i), every pair on a rail (same local index) on its own
    link (a_e, B_e). n bytes, g ranks per server, N servers, p = gN.

    Mesh reduce-scatter: rank (s, j) sends row b (N blocks of n/(gN), so n/g) to each peer
    (s, b) at once, g-1 messages on g-1 different links, each at B_i: a_i + n/(g B_i).
    Ring all-reduce of row j on rail j: 2(N-1) steps of a block n/(gN):
    2(N-1)(a_e + n/(gN B_e)). Mesh all-gather as the reduce-scatter. The phases follow one
    another (each waits for the last messages into the rank), so
        all-reduce       2(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(gN B_e))
        all-gather       (N-1)(a_e + n/(p B_e)) + a_i + n/(g B_i)
        reduce-scatter   a_i + n/(g B_i) + (N-1)(a_e + n/(p B_e))
    with no in-server term for g = 1. N = 3, g = 4, n = 48 MiB: 2 x 126.3 us +
    4 x 211.7 us = 1099.5 us (the ring inside took 6 x 126.3 us + the same)."""
    N, g, n = servers, per_server, N_BYTES
    graph = two_level(N, g, BI, AI, BE, AE)
    mesh = (AI + n / (g * BI)) if g > 1 else 0.0
    expected = {
        "all_reduce": 2 * mesh + 2 * (N - 1) * (AE + n / (g * N * BE)),
        "all_gather": mesh + (N - 1) * (AE + n / (N * g * BE)),
        "reduce_scatter": mesh + (N - 1) * (AE + n / (N * g * BE)),
    }
    for op, time_s in expected.items():
        schedule = build_schedule("hierarchical", op, rank_layout(graph), n, intra="mesh")
        assert run_schedule(graph, schedule).time_s == pytest.approx(time_s, rel=1e-9)


def test_910b_hccl_all_reduce_runs_the_mesh_inside_servers():
    """2 x Atlas 800T A2 (ascend-910b preset), 1 GiB all-reduce with HCCL's choice:
    fullmesh inside, pipeline across (2 MiB per rank and more), run as ``pipelined`` with
    k = 2 slices and intra="mesh". The preset's figures: in a server a_i = 0.5 (NPU to
    SDMA) + 1 (HCCS) + 0.5 (SDMA to NPU) = 2 us, B_i = 56 GB/s per HCCS link (a rank's 7
    flows load its SDMA link with 7 x 56 = 392 GB/s, its capacity, so it never limits);
    across, a_e = 0.5 + 0.5 = 1 us (NIC to switch to NIC), B_e = 25 GB/s per NPU.

    n = 2^30, g = 8, N = 2. Per slice: mesh reduce-scatter (A) and all-gather (C)
    t_A = a_i + n/(k g B_i) = 2 + 1198.37 = 1200.37 us; ring all-reduce across (B)
    t_B = 2(N-1)(a_e + n/(k gN B_e)) = 2 x (1 + 1342.18) = 2686.36 us, > 2 t_A.
    A0 ends at t_A; B0 runs to t_A + t_B, while A1 runs beside it on the HCCS links. B1's
    first send waits for B0's last send to leave the NIC (a stream waits for *sent*,
    a_e before delivery) and for A1 (done at 2 t_A, earlier): it runs from
    t_A + t_B - a_e to t_A + 2 t_B - a_e; C0 fits in between; C1 takes t_A after B1:
    T = 2 t_A + 2 t_B - a_e = 7772.45 us, busbw 2(p-1)/p n / T = 259.03 GB/s (the ring
    inside servers gave 33604.4 us, 59.91 GB/s).

    HCCL_ALGO level1:ring gives the unpipelined hierarchical mesh:
    T = 2(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(gN B_e)) = 2 x 2398.75 + 2 x 2685.35
    = 10168.20 us, busbw 198.00 GB/s (ring inside: 38953.1 us)."""
    graph = load_topology("ascend-910b", 2)
    n, g, N, p = 2**30, 8, 2, 16
    a_i, b_i, a_e, b_e = 2e-6, 56e9, 1e-6, 25e9
    t_a = a_i + n / (2 * g * b_i)
    t_b = 2 * (N - 1) * (a_e + n / (2 * g * N * b_e))
    result = HcclPolicy().simulate(graph, "all_reduce", n)
    assert (result.algorithm, result.params["intra"], result.params["chunks"]) == (
        "pipelined", "mesh", 2)  # fmt: skip
    time_s = 2 * t_a + 2 * t_b - a_e
    assert result.time_s == pytest.approx(time_s, rel=1e-9)
    assert result.busbw_GBps == pytest.approx(2 * (p - 1) / p * n / time_s / 1e9, rel=1e-9)
    assert result.busbw_GBps == pytest.approx(259.03, abs=0.01)

    ring = HcclPolicy(algo="level0:NA;level1:ring").simulate(graph, "all_reduce", n)
    time_s = 2 * (a_i + n / (g * b_i)) + 2 * (N - 1) * (a_e + n / (g * N * b_e))
    assert (ring.algorithm, ring.params["intra"]) == ("hierarchical", "mesh")
    assert ring.time_s == pytest.approx(time_s, rel=1e-9)
    assert ring.busbw_GBps == pytest.approx(198.00, abs=0.01)


def test_ring_stays_the_default_and_bad_values_are_refused():
    ranks = layout(2, 4)
    for algorithm in ("hierarchical", "pipelined"):
        default = build_schedule(algorithm, "all_reduce", ranks, 1e6, chunks=2)
        ring = build_schedule(algorithm, "all_reduce", ranks, 1e6, chunks=2, intra="ring")
        assert "intra" not in default.params
        for field in ("src", "dst", "segment", "step", "dep_ptr", "dep_idx", "dep_sent"):
            np.testing.assert_array_equal(getattr(default, field), getattr(ring, field))
        with pytest.raises(CcsimError, match="'tree'.*mesh, ring"):
            build_schedule(algorithm, "all_reduce", ranks, 1e6, intra="tree")
