"""NCCL's CollNet all-reduces (``collnet-direct``, ``collnet-chain``): the fabric's
switches reduce across servers (SHARP), on fabrics marked ``sharp: true``.

Proofs by the symbolic checker, the ops NCCL's kernels issue, bytes on every link, where
the in-network reduction happens, the simulated time against closed forms, and the
one-line refusals. Notation: N servers of g GPUs, p = gN ranks, n bytes, K chunks, B_v
the NVLink bandwidth between a GPU and its NVSwitch, B_n a NIC's bandwidth (both per
direction).
"""

import numpy as np
import pytest

from simulator import simulate_collective
from simulator.algorithms import algorithm_names, build_schedule, get_algorithm
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.algorithms.schedule import PATH_DEFAULT, PATH_SHARP_DOWN, PATH_SHARP_UP
from simulator.collective.bounds import LoadBound
from simulator.collective.run import run_schedule
from simulator.errors import CcsimError, ScheduleError
from simulator.network.routing import LinkTable, Router
from simulator.topology import load_topology
from simulator.topology.builders import cluster_graph

COLLNET = ("collnet-direct", "collnet-chain")
N_BYTES = 2**30
B_V, B_N = 400e9, 50e9


def servers(N: int, g: int) -> RankLayout:
    """N servers of g GPUs, ranks numbered server by server."""
    return RankLayout(N * g, tuple(r // g for r in range(N * g)))


def cluster(N: int, g: int, nvlink: float = B_V, nic: float = B_N, **fabric):
    """N servers of g GPUs on an NVSwitch, each GPU with its own NIC, every NIC on one
    SHARP switch; no latency anywhere."""
    spec = {
        "gpus": g,
        "intra": {"kind": "nvswitch", "bandwidth": nvlink},
        "nic": {"bandwidth": nic, "gpus_per_nic": 1},
    }
    fabric = {"type": "single-switch", "latency": 0, "sharp": True, **fabric}
    return cluster_graph(spec, N, fabric=fabric)


def time_of(graph, algorithm: str, chunks: int) -> float:
    return simulate_collective(graph, "all_reduce", N_BYTES, algorithm, chunks=chunks).time_s


# -- the collective it computes ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", COLLNET)
@pytest.mark.parametrize(("N", "g"), [(2, 1), (2, 2), (2, 4), (3, 3), (4, 2), (5, 1), (3, 8)])
@pytest.mark.parametrize(("chunks", "channels"), [(1, 1), (3, 1), (2, 2)])
def test_checker_proves_an_all_reduce(algorithm, N, g, chunks, channels):
    """Every rank ends with every block reduced over all p ranks, each contribution once,
    and every conflicting access is ordered (no race)."""
    layout = servers(N, g)
    verify(build_schedule(algorithm, "all_reduce", layout, 1e6, chunks=chunks, channels=channels))


@pytest.mark.parametrize("algorithm", COLLNET)
def test_ranks_need_not_be_numbered_server_by_server(algorithm):
    verify(build_schedule(algorithm, "all_reduce", RankLayout(6, (0, 1, 2, 0, 1, 2)), 1e6))


@pytest.mark.parametrize("algorithm", COLLNET)
def test_heads_wait_for_their_server_before_the_fabric(algorithm):
    """If the ops into the fabric waited for the server's copies to be sent rather than
    delivered (and reduced) at the head, a head could send its row before holding all of
    it: the checker rejects that, so the proofs above are not vacuous."""
    schedule = build_schedule(algorithm, "all_reduce", servers(3, 4), 1e6, chunks=2)
    waiter = np.repeat(np.arange(schedule.n_ops), np.diff(schedule.dep_ptr))
    schedule.dep_sent[schedule.path[waiter] == PATH_SHARP_UP] = True
    with pytest.raises(ScheduleError, match="race|before holding"):
        verify(schedule)


# -- the ops NCCL issues -----------------------------------------------------------------


def test_direct_scatters_to_heads_reduces_in_the_fabric_and_broadcasts():
    """collnet-direct, 2 servers of 4: every GPU sends row j to head j (local rank j) of
    its server, reducing (NCCL's scatter into direct->up, the heads); each head sends its
    row into the fabric and gets the total back (direct->out, the CollNet peer), in one
    group per local index; each head sends the total to its 3 peers (direct->down)."""
    g = 4
    schedule = build_schedule("collnet-direct", "all_reduce", servers(2, g), 1e6)
    src, dst, path = schedule.src, schedule.dst, schedule.path
    plain = path == PATH_DEFAULT
    assert np.all(src[plain] // g == dst[plain] // g)  # NVLink ops stay in the server
    row = schedule.segment % g  # K = 1: block j is row j
    scatter = plain & schedule.reduce
    assert np.all(dst[scatter] % g == row[scatter]) and np.all(src[scatter] % g != row[scatter])
    broadcast = plain & ~schedule.reduce
    assert np.all(src[broadcast] % g == row[broadcast])
    assert scatter.sum() == broadcast.sum() == 2 * g * (g - 1)
    fabric = ~plain
    assert set(np.unique(path[fabric]).tolist()) == {PATH_SHARP_UP, PATH_SHARP_DOWN}
    assert np.all(src[fabric] % g == row[fabric]) and np.all(dst[fabric] % g == row[fabric])
    assert (path == PATH_SHARP_UP).sum() == (path == PATH_SHARP_DOWN).sum() == 2 * g


def test_chain_runs_up_and_down_one_chain_per_row():
    """collnet-chain, 2 servers of 3: row j climbs the chain j-1 -> ... -> j+1 -> j of
    each server (collnetChain.up: the previous GPU, the network at the head) and comes
    back down the same edges; the head is local rank j."""
    g = 3
    schedule = build_schedule("collnet-chain", "all_reduce", servers(2, g), 1e6)
    plain = schedule.path == PATH_DEFAULT
    for j in range(g):
        mine = plain & (schedule.segment == j)
        up = {(int(u), int(v)) for u, v in zip(
            schedule.src[mine & schedule.reduce], schedule.dst[mine & schedule.reduce],
            strict=True,
        )}  # fmt: skip
        chain = [(j + i) % g for i in range(g)]
        expected = {(s * g + chain[i], s * g + chain[i - 1]) for s in range(2) for i in (1, 2)}
        assert up == expected
        down = mine & ~schedule.reduce
        assert {(int(v), int(u)) for u, v in zip(schedule.src[down], schedule.dst[down],
                                                    strict=True)} == expected  # fmt: skip


# -- bytes on every link and where the fabric reduces ------------------------------------


@pytest.mark.parametrize("algorithm", COLLNET)
@pytest.mark.parametrize(("N", "g"), [(2, 4), (3, 2)])
def test_bytes_on_every_link(algorithm, N, g):
    """Every GPU's links into and out of its NVSwitch carry 2(g-1) n/g each way: (g-1)
    rows to the heads (or up the chains) and (g-1) totals back. Each head's row goes
    into the fabric once and comes back once: n/g on each direction of its NIC's links.
    The one switch sees every head: its links carry nothing else."""
    n = 96e6
    result = simulate_collective(cluster(N, g), "all_reduce", n, algorithm, chunks=3)
    links = result.links
    loads = dict(zip(zip(links["src"], links["dst"], strict=True), links["bytes"], strict=True))
    for s in range(N):
        for j in range(g):
            gpu, nic, hub = f"s{s}/gpu{j}", f"s{s}/nic{j}", f"s{s}/nvswitch"
            for key in ((gpu, hub), (hub, gpu)):
                assert loads[key] == pytest.approx(2 * (g - 1) * n / g, rel=1e-12)
            for key in ((gpu, nic), (nic, gpu), (nic, "switch0"), ("switch0", nic)):
                assert loads[key] == pytest.approx(n / g, rel=1e-12)
    assert sum(links["bytes"]) == pytest.approx(N * g * (4 * (g - 1) + 4) * n / g, rel=1e-12)


def test_rail_optimized_reduces_each_row_on_its_rail():
    """dgx-h100 on a rail-optimized fabric with sharp: true: head j of every server goes
    out through its own NIC to leaf j (rail j), the nearest SHARP switch, where the heads
    of row j all meet; the spines carry nothing."""
    graph = load_topology("dgx-h100", nodes=4, fabric={"type": "rail-optimized", "sharp": True})
    router = Router(graph, LinkTable(graph))
    for rank in (0, 11, 31):
        s, j = divmod(rank, 8)
        assert router.sharp_switch(rank) == f"leaf{j}"
        (up,) = router.sharp_route_ids(np.array([rank]), down=False)
        assert router.path_nodes(int(up)) == [f"s{s}/gpu{j}", f"s{s}/nic{j}", f"leaf{j}"]
    result = simulate_collective(graph, "all_reduce", 64e6, "collnet-direct", chunks=2)
    links = result.links
    spine = [b for u, v, b in zip(links["src"], links["dst"], links["bytes"], strict=True)
             if "spine" in u or "spine" in v]  # fmt: skip
    assert not any(spine)


# -- simulated times ---------------------------------------------------------------------


@pytest.mark.parametrize(("N", "g", "nvlink", "nic"), [(2, 4, 400e9, 50e9), (3, 8, 800e9, 25e9),
                                                       (4, 2, 400e9, 100e9)])  # fmt: skip
@pytest.mark.parametrize("chunks", [1, 2, 3, 8])
def test_direct_time_where_the_nics_limit(N, g, nvlink, nic, chunks):
    """NICs the bottleneck ((g-1) B_n <= B_v). Chunk 0's scatter: each GPU sends g-1
    blocks of n/(gK) into the NVSwitch, (g-1) n/(gK B_v). Then each head's NIC sends
    its K chunks into the fabric back to back, n/(gK B_n) each (later scatters keep
    ahead), and the total of the last one comes back on the other direction,
    n/(gK B_n); its broadcast takes (g-1) n/(gK B_v) again:
    T = (K + 1) n/(gK B_n) + 2(g-1) n/(gK B_v), so the bandwidth term is n/(g B_n).
    2 servers of 4, K = 8: 9 x 0.671 ms + 2 x 0.252 ms = 6.543 ms."""
    n, K = N_BYTES, chunks
    expected = (K + 1) * n / (g * K * nic) + 2 * (g - 1) * n / (g * K * nvlink)
    graph = cluster(N, g, nvlink=nvlink, nic=nic)
    assert time_of(graph, "collnet-direct", K) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("algorithm", COLLNET)
@pytest.mark.parametrize(("N", "g"), [(2, 4), (3, 8)])
@pytest.mark.parametrize("chunks", [4, 12])
def test_time_where_nvlink_limits(algorithm, N, g, chunks):
    """NVLink the bottleneck (B_v = B_n = 100 GB/s): each GPU's link into the NVSwitch
    carries 2(g-1) n/g, from the first scatter (or chain step) to the last broadcast,
    and never idles: sends of later chunks run while earlier ones are in the fabric. So
    T = 2(g-1) n/(g B_v), whatever K from 4 on (K = 1 adds the fabric's round trip,
    2 n/(g B_n)). 2 servers of 4: 1.5 x 2^30 / 100 GB/s = 16.1 ms."""
    expected = 2 * (g - 1) * N_BYTES / (g * 100e9)
    graph = cluster(N, g, nvlink=100e9, nic=100e9)
    assert time_of(graph, algorithm, chunks) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("N", "g"), [(2, 4), (3, 2)])
def test_chain_bandwidth_term_where_the_nics_limit(N, g):
    """collnet-chain, NICs the bottleneck (B_n = 50 GB/s, B_v = 400 GB/s): each head
    sends its K chunks into the fabric back to back, n/(gK B_n) each, so past the
    chain's fill and drain (a fixed number of chunk times) T(K) = n/(g B_n) + c/K:
    the bandwidth term, T(inf) = 2 T(2K) - T(K), is n/(g B_n) (2 servers of 4: 5.37 ms)."""
    graph = cluster(N, g)
    limit = 2 * time_of(graph, "collnet-chain", 32) - time_of(graph, "collnet-chain", 16)
    assert limit == pytest.approx(N_BYTES / (g * B_N), rel=1e-6)


# -- options and refusals ----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", COLLNET)
def test_registered_for_all_reduce_across_servers(algorithm):
    assert algorithm in algorithm_names()
    schedule = build_schedule(algorithm, "all_reduce", servers(3, 4), 1e6, chunks=4, channels=2)
    assert schedule.params == {
        "chunks": 4, "servers": 3, "ranks_per_server": 4, "channels": 2, "protocols": ["Simple"]
    }  # fmt: skip
    assert schedule.n_segments == 2 * 4 * 4  # C x g rows x K
    algo = get_algorithm(algorithm)
    assert algo.unsupported("reduce_scatter", servers(2, 2)) == (
        f"{algorithm} does not implement reduce_scatter"
    )
    assert algo.unsupported("all_reduce", servers(1, 8)) == (
        f"{algorithm} joins servers: it needs ranks on 2 servers or more (each GPU's 'server')"
    )
    assert "got [3, 1]" in algo.unsupported("all_reduce", RankLayout(4, (0, 0, 0, 1)))


@pytest.mark.parametrize("algorithm", COLLNET)
def test_refused_in_one_line_without_a_sharp_switch(algorithm):
    """No switch marked sharp: the error names the fix, on one line."""
    with pytest.raises(CcsimError) as error:
        simulate_collective("dgx-h100", "all_reduce", 1e6, algorithm, nodes=2)
    message = str(error.value)
    assert "\n" not in message
    assert "no fabric switch with in-network reduction (SHARP)" in message
    assert "set 'sharp: true' in the topology's fabric section" in message


def test_refused_where_a_row_would_reduce_in_two_switches():
    """Leaf-spine with one server per leaf: the heads of a row reach different SHARP
    leaves first; ccsim reduces a group in one switch and says so."""
    graph = cluster(2, 2, servers_per_leaf=1, type="leaf-spine")
    with pytest.raises(CcsimError, match="reach different SHARP switches"):
        simulate_collective(graph, "all_reduce", 1e6, "collnet-direct")


def test_simple_protocol_only():
    graph = load_topology("dgx-h100", nodes=2, fabric={"type": "rail-optimized", "sharp": True})
    with pytest.raises(CcsimError, match="Simple protocol only"):
        simulate_collective(graph, "all_reduce", 1e6, "collnet-direct", protocol="LL")
    result = simulate_collective(graph, "all_reduce", 2**26, "collnet-direct", protocol="Simple")
    assert result.params["protocol"] == "Simple"


@pytest.mark.parametrize("algorithm", COLLNET)
def test_the_tuners_lower_bound_sees_the_fabric_routes(algorithm):
    """The lower bound the tuner prunes with routes ops into and out of the SHARP switch
    as a run does: its link-load part is a head NIC's load, n/(g B_n) (NICs the
    bottleneck), and the whole bound (with the critical path) stays below the run."""
    g, graph = 4, cluster(2, 4)
    schedule = build_schedule(algorithm, "all_reduce", servers(2, g), N_BYTES, chunks=8)
    bound = LoadBound(graph)
    load = bound.link_bytes(schedule) / bound.links.capacity
    assert load.max() == pytest.approx(N_BYTES / (g * B_N), rel=1e-12)
    assert load.max() <= bound.time_s(schedule) <= run_schedule(graph, schedule).time_s
