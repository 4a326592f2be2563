"""NCCL's NVLS-tree all-reduce (``nvls-tree``): NVLink SHARP inside each server, a double
binary tree of heads across servers.

Proofs by the symbolic checker, the edges NCCL builds, bytes on every link, and the
bandwidth term of the simulated time against closed forms. Notation: N servers of g
GPUs, p = gN ranks, n bytes, K chunks, B_v the NVLink bandwidth between a GPU and its
NVSwitch, B_n a NIC's bandwidth (both per direction).
"""

import numpy as np
import pytest

from simulator import simulate_collective
from simulator.algorithms import algorithm_names, build_schedule, get_algorithm
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.algorithms.nvls_tree import nvls_tree_schedule
from simulator.algorithms.schedule import PATH_DEFAULT, PATH_DOWN, PATH_UP
from simulator.collective.run import run_schedule
from simulator.errors import CcsimError
from simulator.topology import load_topology
from simulator.topology.builders import cluster_graph

N_BYTES = 2**30
B_V, B_N = 400e9, 50e9


def servers(N: int, g: int) -> RankLayout:
    """N servers of g GPUs, ranks numbered server by server."""
    return RankLayout(N * g, tuple(r // g for r in range(N * g)))


def cluster(N: int, g: int, nic: float = B_N):
    """N servers of g GPUs on an NVLS NVSwitch (B_v), each GPU with its own NIC, all NICs
    on one switch; no latency anywhere."""
    spec = {
        "gpus": g,
        "intra": {"kind": "nvswitch", "bandwidth": B_V, "nvls": True},
        "nic": {"bandwidth": nic, "gpus_per_nic": 1},
    }
    return cluster_graph(spec, N, fabric={"type": "single-switch", "latency": 0})


def time_of(graph, chunks: int) -> float:
    return simulate_collective(graph, "all_reduce", N_BYTES, "nvls-tree", chunks=chunks).time_s


def bandwidth_term(graph, chunks: int = 16) -> float:
    """The limit of the simulated time for many chunks. With no latency, once K is past
    the pipeline's start-up, the time is T(K) = T_inf + c/K exactly (the fill and drain
    take a fixed number of chunk times, each n/K over some bandwidth), so
    T_inf = 2 T(2K) - T(K)."""
    return 2 * time_of(graph, 2 * chunks) - time_of(graph, chunks)


# -- the collective it computes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("N", "g"), [(2, 1), (2, 2), (2, 4), (3, 2), (3, 8), (4, 2), (5, 3), (7, 1), (8, 2)]
)
@pytest.mark.parametrize(("chunks", "channels"), [(1, 1), (3, 1), (2, 2)])
def test_checker_proves_an_all_reduce(N, g, chunks, channels):
    """Every rank ends with every block reduced over all p ranks, each contribution once,
    and every conflicting access is ordered (no race)."""
    verify(build_schedule("nvls-tree", "all_reduce", servers(N, g), 1e6, chunks=chunks,
                          channels=channels))  # fmt: skip


def test_ranks_need_not_be_numbered_server_by_server():
    interleaved = RankLayout(6, (0, 1, 2, 0, 1, 2))
    verify(build_schedule("nvls-tree", "all_reduce", interleaved, 1e6, chunks=2))


# -- the edges NCCL builds ---------------------------------------------------------------


def test_tree_edges_join_heads_of_one_local_index():
    """4 servers of 2: ncclGetDtree over the servers gives tree 0 = 0 <- 2 <- {1, 3} and
    tree 1 (its mirror) = 3 <- 1 <- {2, 0}; head j of a server talks to head j of the
    others only (connectNvls: treeUp/treeDown are heads[h] of other nodes). Every other
    op goes into or out of the NVSwitch of its own server."""
    g = 2
    schedule = build_schedule("nvls-tree", "all_reduce", servers(4, g), 1e6)
    plain = schedule.path == PATH_DEFAULT
    assert set(np.unique(schedule.path).tolist()) == {PATH_DEFAULT, PATH_UP, PATH_DOWN}
    up = {(int(u) // g, int(v) // g) for u, v in zip(
        schedule.src[plain & schedule.reduce], schedule.dst[plain & schedule.reduce], strict=True
    )}  # fmt: skip
    assert up == {(2, 0), (1, 2), (3, 2), (1, 3), (2, 1), (0, 1)}
    assert np.all(schedule.src[plain] % g == schedule.dst[plain] % g)
    switch = ~plain
    assert np.all(schedule.src[switch] // g == schedule.dst[switch] // g)
    # Each head's tree messages cross its NIC: one per tree edge and direction.
    assert schedule.nbytes[plain].sum() == pytest.approx(2 * 2 * (4 - 1) * 1e6 / 2)


# -- bytes on every link -----------------------------------------------------------------


@pytest.mark.parametrize(("N", "g", "edges"), [(2, 4, [2, 2]), (4, 2, [2, 4, 4, 2])])
def test_bytes_on_every_link(N, g, edges):
    """Inside a server, as NVLS: each GPU's link into the NVSwitch carries its copy of
    every row (n) and its own row's total once (n/g); the link out carries its row's sum
    (n/g) and every row's total (n): n(g+1)/g each way. Across: head (s, j) sends its
    half of row j (n/(2g)) over each of its e_s tree edges, once up or down, and receives
    as much. e_s counts server s's edges in both trees: N = 2, one per tree (2, 2); N = 4
    (trees 0 <- 2 <- {1, 3} and 3 <- 1 <- {2, 0}): 2, 4, 4, 2."""
    n = 96e6
    result = simulate_collective(cluster(N, g), "all_reduce", n, "nvls-tree", chunks=3)
    links = result.links
    loads = dict(zip(zip(links["src"], links["dst"], strict=True), links["bytes"], strict=True))
    for s in range(N):
        for j in range(g):
            gpu, nic = f"s{s}/gpu{j}", f"s{s}/nic{j}"
            for key in ((gpu, f"s{s}/nvswitch"), (f"s{s}/nvswitch", gpu)):
                assert loads[key] == pytest.approx(n * (g + 1) / g, rel=1e-12)
            for key in ((gpu, nic), (nic, gpu), (nic, "switch0"), ("switch0", nic)):
                assert loads[key] == pytest.approx(edges[s] * n / (2 * g), rel=1e-12)


def test_one_server_is_nvls():
    """On one server there is no tree: the NVSwitch reduces and multicasts, and the time
    is NVLS's to the last bit. (The registry refuses one server, as NCCL runs NVLS
    there and enables NVLS-tree from 2 nodes; the schedule itself still works.)"""
    graph = load_topology("dgx-h100")
    for chunks in (1, 4):
        one = nvls_tree_schedule(np.arange(8)[None, :], N_BYTES, chunks)
        verify(one)
        theirs = simulate_collective(graph, "all_reduce", N_BYTES, "nvls", chunks=chunks)
        assert run_schedule(graph, one).time_s == pytest.approx(theirs.time_s, rel=1e-12)


# -- the bandwidth term ------------------------------------------------------------------


@pytest.mark.parametrize(("N", "g", "e"), [(2, 4, 2), (3, 2, 3), (4, 2, 4)])
def test_bandwidth_term_where_the_nics_limit(N, g, e):
    """NICs the bottleneck (B_n = 50 GB/s, B_v = 400 GB/s): once the first chunk is in
    the tree, the busiest head's NIC never idles until the last chunk leaves it, so the
    bandwidth term is that NIC's load, e n/(2g B_n), e = the most tree edges at a server
    (both trees): N = 2: 1 + 1 = 2; N = 3 (trees 0 <- 2 <- 1 and 1 <- 0 <- 2): server 0
    has 1 + 2 = 3; N = 4: server 2 has 3 + 1 = 4 (2 children and a parent in tree 0, a
    parent in tree 1). N = 4, g = 2: 4 x 2^30 / (4 x 50 GB/s) = 21.47 ms. The NVSwitch
    phases load each NVLink n(g+1)/(g B_v), less (4.03 ms here; 3.36 ms against 5.37
    for N = 2, g = 4), and overlap."""
    expected = e * N_BYTES / (2 * g * B_N)
    assert N_BYTES * (g + 1) / (g * B_V) < expected
    assert bandwidth_term(cluster(N, g)) == pytest.approx(expected, rel=1e-6)


def test_bandwidth_term_where_nvlink_limits():
    """NVLink the bottleneck (B_n = 200 GB/s: 2 servers of 4, each head's NIC carries
    n/g = 2^28 bytes each way, 1.34 ms): the links into and out of each NVSwitch carry
    n(g+1)/g each way and never idle, so the bandwidth term is n(g+1)/(g B_v) =
    5/4 x 2^30 / 400 GB/s = 3.36 ms, NVLS's on one server."""
    g = 4
    expected = N_BYTES * (g + 1) / (g * B_V)
    assert N_BYTES / (g * 200e9) < expected / 2
    assert bandwidth_term(cluster(2, g, nic=200e9)) == pytest.approx(expected, rel=1e-6)


# -- options and refusals ----------------------------------------------------------------


def test_registered_for_all_reduce_with_simple_only():
    assert "nvls-tree" in algorithm_names()
    schedule = build_schedule("nvls-tree", "all_reduce", servers(3, 4), 1e6, chunks=4, channels=2)
    assert schedule.params == {
        "chunks": 4, "servers": 3, "ranks_per_server": 4, "channels": 2, "protocols": ["Simple"]
    }  # fmt: skip
    assert schedule.n_segments == 2 * (4 * 2 * 4)  # C x (g rows x 2 halves x K)
    algo = get_algorithm("nvls-tree")
    assert algo.unsupported("all_gather", servers(2, 2)) == (
        "nvls-tree does not implement all_gather"
    )
    assert algo.unsupported("all_reduce", RankLayout(4, (0, 0, 0, 1))) == (
        "nvls-tree needs the same number of ranks on every server, got [3, 1]"
    )
    assert algo.unsupported("all_reduce", servers(1, 8)) == (
        "nvls-tree joins servers: it needs ranks on 2 servers or more (each GPU's 'server')"
    )
    assert "2 servers or more" in algo.unsupported("all_reduce", RankLayout(8))
    with pytest.raises(CcsimError, match="Simple protocol only"):
        simulate_collective("dgx-h100", "all_reduce", 1e6, "nvls-tree", nodes=2, protocol="LL")


def test_refused_without_nvlink_sharp():
    with pytest.raises(CcsimError, match="NVLink SHARP"):
        simulate_collective("dgx-a100", "all_reduce", 1e6, "nvls-tree", nodes=2)
