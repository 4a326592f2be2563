"""Ring collectives against their closed forms.

Notation: p ranks, n bytes, per-hop latency a, link bandwidth B (bytes/s per direction),
reduce bandwidth R. On a contention-free ring every step moves n/p bytes from each rank
to the next; every flow has its own directed link, so it runs at B.
"""

import pytest

from simulator import simulate_collective
from simulator.topology import load_topology, ring_graph

A = 500e-9
B = 150e9
N_BYTES = 64 * 2**20


@pytest.mark.parametrize("p", [2, 3, 8, 64])
def test_all_reduce_closed_form(p):
    """2(p-1) steps of a + n/(pB)."""
    result = simulate_collective(ring_graph(p, B, A), "all_reduce", N_BYTES)
    assert result.time_s == pytest.approx(2 * (p - 1) * (A + N_BYTES / (p * B)), rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 8, 64])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_all_gather_and_reduce_scatter_closed_form(p, op):
    """p-1 steps of a + n/(pB), n being the whole gathered buffer."""
    result = simulate_collective(ring_graph(p, B, A), op, N_BYTES)
    assert result.time_s == pytest.approx((p - 1) * (A + N_BYTES / (p * B)), rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 8, 64])
def test_all_reduce_with_reduction_cost(p):
    """Each of the p-1 reduce-scatter steps also reduces n/p bytes at R before the block
    moves on: + (p-1) n/(pR), the gamma term of the alpha-beta-gamma model."""
    R = 40e9
    result = simulate_collective(ring_graph(p, B, A), "all_reduce", N_BYTES, reduce_bandwidth=R)
    expected = 2 * (p - 1) * (A + N_BYTES / (p * B)) + (p - 1) * N_BYTES / (p * R)
    assert result.time_s == pytest.approx(expected, rel=1e-9)


def pipelined_ring_time(steps, p, n, chunks, a, b):
    """Ring with K chunks per step sent back to back on the channel.

    Let tau = n/(pKB) be one chunk's transmission time and S(s, k) the time chunk k of
    step s leaves a rank (all ranks are alike on a uniform ring). It needs its data
    (chunk k of step s-1, sent by the previous rank at S(s-1, k), here after tau + a)
    and the channel (the previous chunk sent: S(s, k-1) + tau, or S(s-1, K-1) + tau for
    k = 0). With S(0, k) = k tau, induction gives S(s, 0) = s M with
    M = max(a + tau, K tau), and S(s, k) = s M + k tau. The last chunk arrives at
    S(N-1, K-1) + tau + a, so

        T(K) = (N - 1) max(a + tau, K tau) + K tau + a.

    K = 1 gives N (a + n/(pB)); for large K the per-hop latency hides behind the
    following chunks and T tends to N n/(pB) + a.
    """
    tau = n / (p * chunks * b)
    return (steps - 1) * max(a + tau, chunks * tau) + chunks * tau + a


@pytest.mark.parametrize("p", [3, 8, 64])
@pytest.mark.parametrize("chunks", [2, 4, 16])
@pytest.mark.parametrize("size", [64 * 2**10, 64 * 2**20])  # latency- and bandwidth-bound
def test_chunked_all_reduce_matches_the_pipelined_form(p, chunks, size):
    result = simulate_collective(ring_graph(p, B, A), "all_reduce", size, chunks=chunks)
    expected = pipelined_ring_time(2 * (p - 1), p, size, chunks, A, B)
    assert result.time_s == pytest.approx(expected, rel=1e-9)


def test_chunking_hides_latency():
    """On a bandwidth-bound step chunking approaches N n/(pB) + a, below the unchunked
    N (a + n/(pB))."""
    p, size = 8, 64 * 2**20
    one = simulate_collective(ring_graph(p, B, A), "all_reduce", size, chunks=1).time_s
    many = simulate_collective(ring_graph(p, B, A), "all_reduce", size, chunks=64).time_s
    steps = 2 * (p - 1)
    assert one == pytest.approx(steps * (A + size / (p * B)), rel=1e-9)
    assert many < one
    assert many == pytest.approx(pipelined_ring_time(steps, p, size, 64, A, B), rel=1e-9)


@pytest.mark.parametrize("channels", [2, 4])
def test_channels_on_one_ring_share_its_links(channels):
    """C channels on the same physical ring each carry n/C: C flows of n/(pC) share each
    link at B/C, so a step still takes a + n/(pB) and the total is unchanged."""
    p = 8
    result = simulate_collective(ring_graph(p, B, A), "all_reduce", N_BYTES, channels=channels)
    assert result.time_s == pytest.approx(2 * (p - 1) * (A + N_BYTES / (p * B)), rel=1e-9)


def test_dgx_a100_ring_bound():
    """8 GPUs on one NVSwitch, 300 GB/s per direction per GPU, 0.3 us per GPU-switch hop:
    each ring flow uses its sender's uplink and its receiver's downlink alone, so the ring
    is contention-free with a = 0.6 us and B = 300 GB/s. busbw tends to B."""
    p, a, b = 8, 0.6e-6, 300e9
    size = 4 * 2**30
    result = simulate_collective("dgx-a100", "all_reduce", size)
    assert result.time_s == pytest.approx(2 * (p - 1) * (a + size / (p * b)), rel=1e-9)
    assert result.busbw_GBps == pytest.approx(300.0, rel=1e-3)


def test_two_dgx_a100_ring_is_nic_bound():
    """Across 2 servers the ring crosses one 200 Gb/s (25 GB/s) NIC per direction per
    server; busbw is bounded by it (the ring bound of the slowest link)."""
    result = simulate_collective("dgx-a100", "all_reduce", 2**30, nodes=2)
    assert result.busbw_GBps == pytest.approx(25.0, rel=0.01)
    assert result.busbw_GBps < 25.0


def test_channels_use_distinct_nics():
    """With 8 channels the rings leave each server through 8 different GPUs and NICs:
    8 x 25 GB/s = 200 GB/s of ring bound."""
    graph = load_topology("dgx-a100", nodes=2)
    result = simulate_collective(graph, "all_reduce", 2**30, channels=8)
    assert result.busbw_GBps == pytest.approx(200.0, rel=0.01)
