"""Simulated times of the algorithm suite against closed forms on contention-free graphs.

Notation: p ranks, n bytes (nccl-tests' size), a = per-link latency, B = bandwidth per
link and direction, K chunks; m = log2 p. The alpha-beta forms are from
shared/reference/README.md where it has them; the others are derived in each docstring.
Reductions are free (no reduce bandwidth) unless a test says otherwise.
"""

import math

import networkx as nx
import pytest

from simulator import simulate_collective
from simulator.collective.tuner import AutoTuner
from simulator.topology import ring_graph

B, A = 100e9, 1e-6  # 100 GB/s per direction, 1 us per link
N_BYTES = 48 * 2**20
REL = 1e-6


def mesh(p: int, bandwidth: float = B, latency: float = A) -> nx.Graph:
    """p GPUs, every pair joined by its own full-duplex link."""
    graph = nx.Graph()
    for rank in range(p):
        graph.add_node(f"gpu{rank}", kind="gpu", rank=rank, server=0)
    for i in range(p):
        for j in range(i + 1, p):
            graph.add_edge(
                f"gpu{i}", f"gpu{j}", bandwidth=bandwidth, latency=latency, link="nvlink"
            )
    return graph


def two_level(servers: int, per_server: int, bi: float, ai: float, be: float, ae: float):
    """N servers of g GPUs: a full mesh inside each server (bi, ai per link), and one
    full mesh per local index across servers (a "rail": GPU j of every server; be, ae).
    Ring neighbours inside a server and on a rail each have their own link, and the
    direct link is the lowest-latency path whenever ai < ae + 2 ai and ae < ai + ae + ai."""
    graph = nx.Graph()
    for s in range(servers):
        for j in range(per_server):
            graph.add_node((s, j), kind="gpu", rank=s * per_server + j, server=s)
    for s in range(servers):
        for j in range(per_server):
            for k in range(j + 1, per_server):
                graph.add_edge((s, j), (s, k), bandwidth=bi, latency=ai, link="nvlink")
            for t in range(s + 1, servers):
                graph.add_edge((s, j), (t, j), bandwidth=be, latency=ae, link="rdma")
    return graph


def time_of(graph, op, algorithm, n=N_BYTES, **options):
    return simulate_collective(graph, op, n, algorithm, **options).time_s


# -- halving-doubling ------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_halving_doubling_power_of_two(p):
    """Reference closed forms, one partner per round on its own mesh link:
    Rabenseifner all-reduce 2 m a + 2 (p-1)/p n/B; recursive doubling all-gather and
    recursive halving reduce-scatter m a + (p-1)/p n/B (round i moves n/2^(i+1) or
    2^i n/p bytes, which sum to (p-1)/p n)."""
    m, n, graph = int(math.log2(p)), N_BYTES, mesh(p)
    assert time_of(graph, "all_reduce", "halving-doubling") == pytest.approx(
        2 * m * A + 2 * (p - 1) / p * n / B, rel=REL
    )
    for op in ("all_gather", "reduce_scatter"):
        assert time_of(graph, op, "halving-doubling") == pytest.approx(
            m * A + (p - 1) / p * n / B, rel=REL
        )


@pytest.mark.parametrize("p", [3, 5, 6, 12])
def test_halving_doubling_folds_extra_ranks(p):
    """p = P + r with P = 2^floor(log2 p): ranks 2i+1 (i < r) send their whole buffer to
    2i (a + n/B), the P others run Rabenseifner on P blocks (2 log2(P) a +
    2 (P-1)/P n/B), then 2i returns the result (a + n/B). p = 6: 2 x (1 us + 503.3 us)
    + 4 us + 754.97 us."""
    P, n = 2 ** int(math.log2(p)), N_BYTES
    expected = 2 * (A + n / B) + 2 * math.log2(P) * A + 2 * (P - 1) / P * n / B
    assert time_of(mesh(p), "all_reduce", "halving-doubling") == pytest.approx(expected, rel=REL)


# -- direct and pairwise ---------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_direct_one_shot(p):
    """Every message has its own mesh link and all start at once: all-gather,
    reduce-scatter, all-to-all a + n/(pB) (blocks of n/p); broadcast and reduce a + n/B
    (the root's p-1 links work in parallel; K = 3 chunks back to back take as long)."""
    graph, n = mesh(p), N_BYTES
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert time_of(graph, op, "direct") == pytest.approx(A + n / (p * B), rel=REL)
    for op in ("broadcast", "reduce"):
        assert time_of(graph, op, "direct", chunks=3, root=p - 1) == pytest.approx(
            A + n / B, rel=REL
        )


@pytest.mark.parametrize(("p", "chunks"), [(4, 1), (4, 2), (6, 4), (9, 8)])
def test_direct_all_reduce(p, chunks):
    """Direct reduce-scatter then all-gather, τ = n/(pKB). A pair link carries the K
    reduce-scatter chunks back to back (chunk k sent at (k+1)τ, arrived τ + a later);
    the all-gather chunk k leaves at max((K+k)τ, (k+1)τ + a) (behind the pair's RS
    chunks, after chunk k of every contribution arrived), so the last one arrives at
    T = a + max(2Kτ, (K+1)τ + a); K = 1 gives the two-step 2(a + n/(pB))."""
    tau = N_BYTES / (p * chunks * B)
    expected = A + max(2 * chunks * tau, (chunks + 1) * tau + A)
    assert time_of(mesh(p), "all_reduce", "direct", chunks=chunks) == pytest.approx(
        expected, rel=REL
    )


@pytest.mark.parametrize(("p", "chunks"), [(4, 1), (8, 2), (5, 1), (7, 3)])
def test_pairwise_all_to_all(p, chunks):
    """p-1 rounds of one n/p message per rank, each on its own mesh link, each round
    after the previous send and receive are done: (p-1)(a + n/(pB)), whatever K."""
    expected = (p - 1) * (A + N_BYTES / (p * B))
    assert time_of(mesh(p), "all_to_all", "pairwise", chunks=chunks) == pytest.approx(
        expected, rel=REL
    )


# -- trees and chains ------------------------------------------------------------------


@pytest.mark.parametrize(("p", "chunks"), [(2, 1), (3, 1), (4, 1), (4, 3), (5, 5), (8, 5), (16, 7)])
def test_double_binary_tree_all_reduce(p, chunks):
    """Each tree carries n/2 in K chunks, τ = n/(2KB); depth D = ceil(log2 p). Chunk k
    starts hop h (1..2D, up then down the deepest path) at (h-1)(a + τ) + kτ: every
    dependency path to it has h-1 hops and k chunk slots. So T = 2D(a + τ) + (K-1)τ.
    The trees share a few rank pairs, which must not carry both trees at once. p = 4:
    tree 0 is 0-2, 2-1, 2-3 and tree 1 (the mirror) 3-1, 1-0, 1-2; link 2->1 is tree 1's
    hop 1 (up from 2) and tree 0's hop 4 (down 0->2->1), busy during [0, Kτ] and
    [3(a+τ), 3(a+τ) + Kτ]: apart while K <= 3. Listing the edges the same way gives a
    gap of 5 hops for p = 5 and 8, 7 for p = 16, and 1 for p = 2, 3 (so K = 1 there)."""
    depth = math.ceil(math.log2(p))
    tau = N_BYTES / (2 * chunks * B)
    expected = 2 * depth * (A + tau) + (chunks - 1) * tau
    assert time_of(mesh(p), "all_reduce", "tree", chunks=chunks) == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize(("p", "root", "chunks"), [(4, 0, 1), (7, 3, 4), (16, 9, 8)])
def test_tree_broadcast_and_reduce(p, root, chunks):
    """One binary tree rooted at ``root``, every edge its own mesh link, τ = n/(KB):
    T = D(a + τ) + (K-1)τ with D = ceil(log2 p) hops (as for the all-reduce, one way)."""
    tau = N_BYTES / (chunks * B)
    expected = math.ceil(math.log2(p)) * (A + tau) + (chunks - 1) * tau
    for op in ("broadcast", "reduce"):
        assert time_of(mesh(p), op, "tree", chunks=chunks, root=root) == pytest.approx(
            expected, rel=REL
        )


@pytest.mark.parametrize(("p", "chunks"), [(2, 1), (5, 4), (8, 16)])
def test_ring_chain_broadcast_and_reduce(p, chunks):
    """A chain of p-1 ring hops, τ = n/(KB): hop h of chunk k starts at h(a + τ) + kτ,
    so T = (p-1)(a + τ) + (K-1)τ. p = 5, K = 4, n = 48 MiB: τ = 125.83 us,
    T = 4 x 126.83 + 3 x 125.83 = 884.8 us."""
    tau = N_BYTES / (chunks * B)
    expected = (p - 1) * (A + tau) + (chunks - 1) * tau
    graph = ring_graph(p, B, A)
    for op in ("broadcast", "reduce"):
        assert time_of(graph, op, "ring", chunks=chunks, root=1) == pytest.approx(expected, rel=REL)


def test_ring_chain_reduce_with_reduce_bandwidth():
    """Each hop of the reduce also reduces its chunk at the receiver before the next hop
    may forward it, and a GPU's reductions share its reduce bandwidth R.

    K = 1: T = (p-1)(a + τ + ρ) with τ = n/B, ρ = n/R.

    K = 2, ρ >= τ (τ = n/(2B), ρ = n/(2R)): at every hop the two chunks arrive τ apart
    (at t and t + τ). The first reduces alone for τ, then both share R, so the first
    finishes at t + τ + 2(ρ - τ) = t + 2ρ - τ and the second at t + 2ρ; the next hop
    sends them then, so they arrive at the next rank τ apart again, the first a + 2ρ
    after the previous hop's first arrival, starting from τ + a. The last chunk is done
    at (p-1)(a + 2ρ) + τ. p = 4, R = 50 GB/s: 3 x 1007.63 + 251.66 = 3274.56 us."""
    p, reduce_bw = 4, 50e9
    tau, rho = N_BYTES / B, N_BYTES / reduce_bw
    assert simulate_collective(
        ring_graph(p, B, A), "reduce", N_BYTES, "ring", chunks=1, reduce_bandwidth=reduce_bw
    ).time_s == pytest.approx((p - 1) * (A + tau + rho), rel=REL)
    tau, rho = N_BYTES / (2 * B), N_BYTES / (2 * reduce_bw)
    assert simulate_collective(
        ring_graph(p, B, A), "reduce", N_BYTES, "ring", chunks=2, reduce_bandwidth=reduce_bw
    ).time_s == pytest.approx((p - 1) * (A + 2 * rho) + tau, rel=REL)


# -- two-level --------------------------------------------------------------------------

BI, AI, BE, AE = 100e9, 0.5e-6, 20e9, 2e-6


@pytest.mark.parametrize(("servers", "per_server"), [(3, 4), (4, 2), (2, 3), (1, 4), (4, 1)])
def test_hierarchical_closed_forms(servers, per_server):
    """Intra-server rings (a_i, B_i) and g rail rings across servers (a_e, B_e), each hop
    on its own link: all-reduce 2(g-1)(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(gN B_e));
    all-gather (N-1)(a_e + n/(p B_e)) + (g-1)(a_i + n/(g B_i)) and reduce-scatter the
    same (the phases swapped). N = 3, g = 4, n = 48 MiB: 6 x 126.3 us + 4 x 211.7 us."""
    N, g, n = servers, per_server, N_BYTES
    graph = two_level(N, g, BI, AI, BE, AE)
    intra = (g - 1) * (AI + n / (g * BI))
    assert time_of(graph, "all_reduce", "hierarchical") == pytest.approx(
        2 * intra + 2 * (N - 1) * (AE + n / (g * N * BE)), rel=REL
    )
    half = intra + (N - 1) * (AE + n / (N * g * BE))
    for op in ("all_gather", "reduce_scatter"):
        assert time_of(graph, op, "hierarchical") == pytest.approx(half, rel=REL)


def stage_times(N, g, n, k, ai, ae):
    """Per-slice times of the three all-reduce phases for slices of n/k bytes."""
    t_rs = (g - 1) * (ai + n / (k * g * BI))
    t_inter = 2 * (N - 1) * (ae + n / (k * g * N * BE))
    return t_rs, t_inter


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_pipelined_follows_the_stage_model(k):
    """N = 4 servers of g = 4, inter-server bound. A slice of n/k takes t_A = t_C =
    (g-1)(a_i + n/(k g B_i)) on the intra links (reduce-scatter, all-gather) and
    t_B = 2(N-1)(a_e + n/(k gN B_e)) on the rails, with 2 t_A <= t_B. The rails are the
    bottleneck stage: the reference pipeline formula gives
    T(k) = t_A + t_B + t_C + (k-1) t_B (fill: slice 0's A, drain: the last C). The
    simulation hides a little latency between consecutive slices on a link, so it may
    be slightly faster; within 2%."""
    N, g, n = 4, 4, 256 * 2**20
    t_a, t_b = stage_times(N, g, n, k, AI, AE)
    assert 2 * t_a <= t_b
    model = 2 * t_a + k * t_b
    simulated = time_of(two_level(N, g, BI, AI, BE, AE), "all_reduce", "pipelined", n, chunks=k)
    assert simulated == pytest.approx(model, rel=0.02)
    assert simulated <= model * (1 + 1e-9)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_pipelined_two_stage_ops(op):
    """Two stages, rails (t1 = (N-1)(a_e + n/(k p B_e))) and intra links
    (t2 = (g-1)(a_i + n/(k g B_i))): T(k) = t1 + t2 + (k-1) max(t1, t2) (reference
    formula); k = 8, N = 4, g = 4, n = 256 MiB: t1 = 3 x 106.9 us, t2 = 3 x 84.4 us,
    T = 575 + 7 x 320.6 = 2819 us, within 2%."""
    N, g, k, n = 4, 4, 8, 256 * 2**20
    t1 = (N - 1) * (AE + n / (k * N * g * BE))
    t2 = (g - 1) * (AI + n / (k * g * BI))
    model = t1 + t2 + (k - 1) * max(t1, t2)
    graph = two_level(N, g, BI, AI, BE, AE)
    assert time_of(graph, op, "pipelined", n, chunks=k) == pytest.approx(model, rel=0.02)


@pytest.mark.parametrize(("be", "bound"), [(20e9, "inter"), (40e9, "intra")])
def test_pipelined_speedup_over_hierarchical(be, bound):
    """N = 4 servers of g = 4, latencies 0.05 us, n = 512 MiB, rails of 20 or 40 GB/s
    against 100 GB/s intra links: T_intra = 2(g-1) n/(g B_i) = 8.05 ms, and
    T_inter = 2(N-1) n/(gN B_e) = 10.07 ms (inter-bound) or 5.03 ms (intra-bound).
    Plain hierarchical takes T_intra + T_inter. Pipelined with k slices: per slice
    t_A = t_C = T_intra/(2k) on the intra links (reduce-scatter, all-gather) and
    t_B = T_inter/k on the rails; the intra links run A0 A1 C0 A2 C1 ... .
    Inter-bound: the rails never idle after A0, and the last C follows the last B:
    T = T_inter + 2 t_A = T_inter + T_intra/k. Intra-bound with t_A <= t_B <= 2 t_A:
    the intra links idle only while C0 waits for B0 (t_B - t_A after A1) and while
    the last C waits for the last B (again t_B - t_A): T = T_intra + 2(t_B - t_A).
    At the best k (searched by simulation over 1..64) the time is within 1% of that,
    and the speedup within 5% of (T_intra + T_inter) / max(T_intra, T_inter) = 1.80
    (inter-bound) or 1.62 (intra-bound)."""
    N, g, n, latency = 4, 4, 512 * 2**20, 0.05e-6
    graph = two_level(N, g, BI, latency, be, latency)
    t_intra = 2 * (g - 1) * (latency + n / (g * BI))
    t_inter = 2 * (N - 1) * (latency + n / (g * N * be))
    assert (t_inter > t_intra) == (bound == "inter")
    hierarchical = time_of(graph, "all_reduce", "hierarchical", n)
    assert hierarchical == pytest.approx(t_intra + t_inter, rel=REL)
    result, k = AutoTuner().best_chunks(graph, "all_reduce", n, "pipelined")
    t_a, t_b = t_intra / (2 * k), t_inter / k
    if bound == "inter":
        model = t_inter + 2 * t_a
    else:
        assert t_a <= t_b <= 2 * t_a
        model = t_intra + 2 * (t_b - t_a)
    assert result.time_s == pytest.approx(model, rel=0.01)
    assert hierarchical / result.time_s == pytest.approx(
        (t_intra + t_inter) / max(t_intra, t_inter), rel=0.05
    )
