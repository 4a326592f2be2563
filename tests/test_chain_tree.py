"""NCCL's Tree all-reduce (``chain-tree``): a chain inside each server, a double binary
tree across servers.

Proofs by the symbolic checker, the tree edges NCCL builds, bytes on the wire, and
simulated times against closed forms on graphs whose links no two transfers share
unless the closed form says so. Notation: N servers of g GPUs, p = gN ranks, n bytes,
K chunks, C channels, a = per-link latency, B = bandwidth per link and direction.
"""

import dataclasses
import math

import networkx as nx
import numpy as np
import pytest

from simulator import simulate_collective
from simulator.algorithms import algorithm_names, build_schedule, get_algorithm
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.algorithms.schedule import Schedule
from simulator.errors import CcsimError, ScheduleError

N_BYTES = 48 * 2**20  # 3 x 2^24: n/(2KC) is a whole number for K, C in 1..4
B, A = 100e9, 1e-6
REL = 1e-9


def servers(N: int, g: int) -> RankLayout:
    """N servers of g GPUs, ranks numbered server by server."""
    return RankLayout(N * g, tuple(r // g for r in range(N * g)))


def chain_tree(layout, n=N_BYTES, **options) -> Schedule:
    return build_schedule("chain-tree", "all_reduce", layout, n, **options)


def pair_bytes(schedule: Schedule) -> dict[tuple[int, int], float]:
    """Bytes sent from rank u to rank v, by (u, v)."""
    out: dict[tuple[int, int], float] = {}
    for u, v, b in zip(schedule.src, schedule.dst, schedule.nbytes, strict=True):
        out[int(u), int(v)] = out.get((int(u), int(v)), 0.0) + float(b)
    return out


def without(schedule: Schedule, drop) -> Schedule:
    """``schedule`` without the dependencies for which ``drop(op, dep, sent)`` holds."""
    owner = np.repeat(np.arange(schedule.n_ops), np.diff(schedule.dep_ptr))
    keep = ~drop(owner, schedule.dep_idx, schedule.dep_sent)
    counts = np.bincount(owner[keep], minlength=schedule.n_ops)
    return dataclasses.replace(
        schedule,
        dep_ptr=np.concatenate([[0], np.cumsum(counts)]),
        dep_idx=schedule.dep_idx[keep],
        dep_sent=schedule.dep_sent[keep],
    )


# -- the collective it computes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("N", "g"), [(1, 2), (1, 8), (2, 1), (2, 8), (3, 4), (4, 2), (5, 3), (7, 1), (6, 2)]
)
@pytest.mark.parametrize(("chunks", "channels"), [(1, 1), (4, 1), (1, 2), (4, 2)])
def test_checker_proves_an_all_reduce(N, g, chunks, channels):
    """Every rank ends with every block reduced over all p ranks, each contribution
    once, and every conflicting access is ordered (no race)."""
    verify(chain_tree(servers(N, g), chunks=chunks, channels=channels))


def test_without_server_information_it_is_one_chain():
    """A layout with no servers is one chain over all ranks: the same schedule as one
    server of p GPUs; it still verifies."""
    plain = chain_tree(RankLayout(6), chunks=3)
    one_server = chain_tree(servers(1, 6), chunks=3)
    verify(plain)
    for field in ("src", "dst", "segment", "nbytes", "reduce", "dep_ptr", "dep_idx"):
        assert np.array_equal(getattr(plain, field), getattr(one_server, field))


def test_missing_data_dependencies_are_caught():
    """With only the send-order ("sent") dependencies kept, a rank may forward a chunk
    before it has received it: the checker rejects the schedule, so the proofs above
    are not vacuous."""
    schedule = chain_tree(servers(3, 4), chunks=2)
    with pytest.raises(ScheduleError, match="race|before holding"):
        verify(without(schedule, lambda _op, _dep, sent: ~sent))


def test_a_head_waits_for_all_three_children():
    """N = 4, g = 2, tree 0 (servers 0 <- 2 <- {1, 3}): rank 4 (server 2's local rank 0)
    reduces from rank 5 (its chain), rank 2 (server 1) and rank 6 (server 3) before
    sending up to rank 0. Dropping its wait for rank 6 is a race."""
    schedule = chain_tree(servers(4, 2))
    tree0 = schedule.segment_owner[schedule.segment] == 0
    up = schedule.reduce & tree0
    to_root = np.flatnonzero(up & (schedule.src == 4) & (schedule.dst == 0))[0]
    deps = schedule.dep_idx[schedule.dep_ptr[to_root] : schedule.dep_ptr[to_root + 1]]
    assert sorted(int(schedule.src[d]) for d in deps) == [2, 5, 6]
    from_6 = np.flatnonzero(up & (schedule.src == 6) & (schedule.dst == 4))[0]
    with pytest.raises(ScheduleError, match="race"):
        verify(without(schedule, lambda op, dep, _sent: (op == to_root) & (dep == from_6)))


# -- the trees NCCL builds ---------------------------------------------------------------


def tree_edges(schedule: Schedule, root: int) -> tuple[set, set]:
    """(child, parent) pairs of the reduction and (parent, child) pairs of the broadcast,
    for the half whose blocks belong to ``root``."""
    mine = schedule.segment_owner[schedule.segment] == root
    pairs = [
        {(int(u), int(v)) for u, v in zip(schedule.src[ops], schedule.dst[ops], strict=True)}
        for ops in (mine & schedule.reduce, mine & ~schedule.reduce)
    ]
    return pairs[0], pairs[1]


def test_edges_follow_nccl_for_four_servers_of_two():
    """ncclGetBtree over 4 servers: 0 <- 2 <- {1, 3} (tree 0); its mirror (4 is even)
    r -> 3 - r: 3 <- 1 <- {2, 0} (tree 1). In ranks (server s's GPUs are 2s, 2s+1;
    local rank 0 is the server's tree node, local rank 1 hangs below it) the parents are
    tree 0: 1->0, 2->4, 3->2, 4->0, 5->4, 6->4, 7->6 (root 0);
    tree 1: 0->2, 1->0, 2->6, 3->2, 4->2, 5->4, 7->6 (root 6).
    The broadcast uses the same edges reversed."""
    schedule = chain_tree(servers(4, 2), chunks=2)
    assert sorted(set(schedule.segment_owner.tolist())) == [0, 6]
    expected = {
        0: {(1, 0), (2, 4), (3, 2), (4, 0), (5, 4), (6, 4), (7, 6)},
        6: {(0, 2), (1, 0), (2, 6), (3, 2), (4, 2), (5, 4), (7, 6)},
    }
    for root, edges in expected.items():
        up, down = tree_edges(schedule, root)
        assert up == edges
        assert down == {(v, u) for u, v in edges}


def test_odd_server_count_shifts_the_second_tree():
    """5 servers of 3 (5 is odd): tree 0 is 0 <- 4 <- 2 <- {1, 3} in servers, tree 1
    its shift by one (server r plays r - 1 of tree 0): 1 <- 0 <- 3 <- {2, 4}; roots
    rank 0 (server 0) and rank 3 (server 1). Every chain edge (local rank j -> j-1) is
    in both trees; inter-server edges join local ranks 0."""
    g = 3
    schedule = chain_tree(servers(5, g))
    server_parents = {0: [-1, 2, 4, 2, 0], 3: [1, -1, 3, 0, 3]}
    for root, parents in server_parents.items():
        chain = {(s * g + j, s * g + j - 1) for s in range(5) for j in range(1, g)}
        across = {(s * g, parent * g) for s, parent in enumerate(parents) if parent >= 0}
        up, _ = tree_edges(schedule, root)
        assert up == chain | across


def test_one_server_is_a_chain():
    """One server of 8: both halves go up the chain 7 -> 6 -> ... -> 0 and back down,
    2(g-1) = 14 hops deep, as NCCL's tree on one node."""
    schedule = chain_tree(servers(1, 8))
    assert schedule.segment_owner.tolist() == [0, 0]  # both halves rooted at rank 0
    up, down = tree_edges(schedule, 0)
    assert up == {(j, j - 1) for j in range(1, 8)}
    assert down == {(j - 1, j) for j in range(1, 8)}


def test_one_gpu_per_server_is_the_double_binary_tree():
    """g = 1: the inter-server double binary tree alone, op for op the ``tree``
    algorithm's all-reduce."""
    for p in (2, 5, 8):
        ours = chain_tree(servers(p, 1), chunks=3)
        theirs = build_schedule("tree", "all_reduce", p, N_BYTES, chunks=3)
        for field in ("src", "dst", "segment", "nbytes", "reduce", "segment_owner"):
            assert np.array_equal(getattr(ours, field), getattr(theirs, field)), field


# -- bytes on the wire -------------------------------------------------------------------


@pytest.mark.parametrize(("N", "g"), [(1, 8), (2, 8), (3, 4), (4, 2), (5, 3), (2, 1)])
@pytest.mark.parametrize(("chunks", "channels"), [(1, 1), (3, 2), (4, 4)])
def test_bytes_on_the_wire(N, g, chunks, channels):
    """Each tree carries n/2; every one of its p-1 edges moves it once up and once down:
    2(p-1) n/2 per tree, 2(p-1) n over both, whatever K and C (n/(2KC) is a whole
    number of bytes here, so the sum is exact). Per ordered pair: a chain edge is in
    both trees, so it carries n each way; an inter-server edge carries n/2 each way per
    tree that uses it."""
    p, n, C = N * g, N_BYTES, channels
    schedule = chain_tree(servers(N, g), chunks=chunks, channels=channels)
    assert schedule.nbytes.sum() == 2 * (p - 1) * n
    for c in range(C):
        # Channel c's chain runs through local GPUs c, c+1, ... (mod g), with local GPU
        # c at the top: its j-th link joins local GPUs (c+j) mod g and (c+j-1) mod g.
        ops = schedule.channel == c
        pairs = pair_bytes(
            dataclasses.replace(
                schedule, src=schedule.src[ops], dst=schedule.dst[ops], nbytes=schedule.nbytes[ops]
            )
        )
        for j in range(1, g):
            below, above = (c + j) % g, (c + j - 1) % g
            for s in range(N):
                assert pairs[s * g + below, s * g + above] == n / C
                assert pairs[s * g + above, s * g + below] == n / C
        across = {(u, v): b for (u, v), b in pairs.items() if u // g != v // g}
        assert all(u % g == c % g and v % g == c % g for u, v in across)
        # N-1 edges x 2 trees x 2 ways x n/(2C)
        assert sum(across.values()) == 2 * (N - 1) * n / C


def test_channels_leave_through_different_gpus():
    """2 servers of 4, 4 channels: channel c's chains start at local GPU c (NCCL takes
    each tree channel's chain from the ring of that channel), so the four channels cross
    between the servers on four different GPU pairs (four NICs), n/2 each way on each:
    the n/4 of a channel travels once up and once down each of its two trees' crossing
    edge, n/(2C) per tree and way, and both trees cross the same pair."""
    n, g = N_BYTES, 4
    schedule = chain_tree(servers(2, g), channels=4)
    across = {}
    for u, v, b in zip(schedule.src, schedule.dst, schedule.nbytes, strict=True):
        if u // g != v // g:
            across[int(u), int(v)] = across.get((int(u), int(v)), 0.0) + float(b)
    assert across == {(j, g + j): n / 4 for j in range(g)} | {(g + j, j): n / 4 for j in range(g)}
    verify(schedule)


# -- simulated times ---------------------------------------------------------------------


def mesh(p: int, per_server: int | None = None) -> nx.Graph:
    """p GPUs, every pair joined by its own full-duplex link (B, A); ``server`` set
    when ``per_server`` is given."""
    graph = nx.Graph()
    for rank in range(p):
        attrs = {} if per_server is None else {"server": rank // per_server}
        graph.add_node(f"gpu{rank}", kind="gpu", rank=rank, **attrs)
    for i in range(p):
        for j in range(i + 1, p):
            graph.add_edge(f"gpu{i}", f"gpu{j}", bandwidth=B, latency=A, link="nvlink")
    return graph


def time_of(graph, n=N_BYTES, **options) -> float:
    return simulate_collective(graph, "all_reduce", n, "chain-tree", **options).time_s


@pytest.mark.parametrize("g", [2, 3, 8])
@pytest.mark.parametrize("chunks", [1, 4, 16])
def test_one_server_chain_time(g, chunks):
    """Pure chain of D = 2(g-1) hops on a full mesh (each hop its own link; up and down
    use the two directions), one channel (channels start their chains at different
    GPUs, so their links differ). Both halves cross every hop in the same direction at
    the same moments, so a chunk of n/(2K) shares its link with its twin and takes
    τ = n/(KB). Chunk k starts hop h at (h-1)(a + τ) + kτ (its previous
    hop and the previous chunk of this hop both end then), so
    T = 2(g-1)(a + τ) + (K-1)τ. g = 8, K = 4: τ = 125.83 us, T = 14 x 126.83 + 3 x 125.83
    = 2153.1 us."""
    tau = N_BYTES / (chunks * B)
    expected = 2 * (g - 1) * (A + tau) + (chunks - 1) * tau
    assert time_of(mesh(g, g), chunks=chunks) == pytest.approx(expected, rel=REL)
    if chunks == 4:  # no server attribute: the same single chain
        assert time_of(mesh(g), chunks=chunks) == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize(("p", "chunks"), [(2, 1), (4, 1), (4, 3), (5, 5), (8, 5)])
def test_one_gpu_per_server_time(p, chunks):
    """g = 1 on a full mesh: the double binary tree, depth D = ceil(log2 p), each half
    n/2 in chunks τ = n/(2KB): T = 2D(a + τ) + (K-1)τ. The two trees share a few rank
    pairs, used in one direction G hops apart in the pipeline (G = 1 for p = 2, 3 for
    p = 4, 5 for p = 5 and 8), so never at once while K <= G: the same cases as the
    ``tree`` algorithm's test."""
    depth = math.ceil(math.log2(p))
    tau = N_BYTES / (2 * chunks * B)
    expected = 2 * depth * (A + tau) + (chunks - 1) * tau
    assert time_of(mesh(p, 1), chunks=chunks) == pytest.approx(expected, rel=REL)


BI, AI, BE, AE = 100e9, 0.5e-6, 20e9, 2e-6


def two_servers(g: int) -> nx.Graph:
    """Two servers of g GPUs: a full mesh inside each (BI, AI per link) and one link
    (BE, AE) between the servers' local ranks 0."""
    graph = nx.Graph()
    for s in range(2):
        for j in range(g):
            graph.add_node((s, j), kind="gpu", rank=s * g + j, server=s)
        for j in range(g):
            for k in range(j + 1, g):
                graph.add_edge((s, j), (s, k), bandwidth=BI, latency=AI, link="nvlink")
    graph.add_edge((0, 0), (1, 0), bandwidth=BE, latency=AE, link="rdma")
    return graph


@pytest.mark.parametrize("g", [1, 2, 4, 8])
def test_two_servers_time(g):
    """N = 2, K = 1. Tree 0 has its root on rank 0, tree 1 (the mirror) on rank g.
    Up: in each server both halves climb the chain together, sharing every hop:
    (g-1)(a_i + n/B_i). Then tree 0's half crosses g -> 0 and tree 1's 0 -> g, opposite
    directions of the one link: a_e + n/(2B_e). Each root now holds its half reduced
    and sends it down its own chain and across the link (a_e + n/(2B_e) again); the
    other half enters each chain that much later. Since a_e + n/(2B_e) >= n/(2B_i), the
    second half reaches a hop after the first has left it: each hop carries one half
    alone, a_i + n/(2B_i), and the late half finishes last:
    T = (g-1)(a_i + n/B_i) + 2(a_e + n/(2B_e)) + (g-1)(a_i + n/(2B_i)).
    g = 8, n = 48 MiB: 7 x 503.8 + 2 x 1260.3 + 7 x 252.2 us = 7812.4 us."""
    n = N_BYTES
    cross = AE + n / (2 * BE)
    assert cross >= n / (2 * BI)
    expected = (g - 1) * (AI + n / BI) + 2 * cross + (g - 1) * (AI + n / (2 * BI))
    assert time_of(two_servers(g)) == pytest.approx(expected, rel=REL)


# -- options and refusals ----------------------------------------------------------------


def test_registered_for_all_reduce_only():
    """Built through the registry under its name; params say the shape; C channels
    label their copies 0..C-1, each with the 2K blocks of one channel."""
    assert "chain-tree" in algorithm_names()
    algo = get_algorithm("chain-tree")
    assert algo.ops == ("all_reduce",)
    schedule = build_schedule("chain-tree", "all_reduce", servers(3, 4), 1e6, chunks=4, channels=2)
    assert schedule.algorithm == "chain-tree" and schedule.op == "all_reduce"
    assert schedule.params == {"chunks": 4, "servers": 3, "ranks_per_server": 4, "channels": 2}
    assert schedule.n_segments == 2 * 2 * 4
    assert sorted(set(schedule.channel.tolist())) == [0, 1]
    assert schedule.nbytes.max() == pytest.approx(1e6 / (2 * 4 * 2))
    with pytest.raises(CcsimError, match="--chunks must be a positive integer"):
        build_schedule("chain-tree", "all_reduce", servers(2, 2), 1e6, chunks=0)


def test_unsupported_layouts_and_ops():
    """Other collectives, uneven servers and servers not numbered in order are refused
    with a reason; no servers (one chain) and a single server are fine."""
    algo = get_algorithm("chain-tree")
    assert algo.unsupported("all_gather", servers(2, 2)) == (
        "chain-tree does not implement all_gather"
    )
    assert "at least 2 ranks" in algo.unsupported("all_reduce", RankLayout(1))
    uneven = RankLayout(4, (0, 0, 0, 1))
    assert algo.unsupported("all_reduce", uneven) == (
        "chain-tree needs the same number of ranks on every server, got [3, 1]"
    )
    interleaved = RankLayout(4, (0, 1, 0, 1))
    assert "numbered server by server" in algo.unsupported("all_reduce", interleaved)
    assert algo.unsupported("all_reduce", RankLayout(4)) is None
    assert algo.unsupported("all_reduce", servers(1, 4)) is None
    with pytest.raises(CcsimError, match=r"got \[3, 1\]"):
        build_schedule("chain-tree", "all_reduce", uneven, 1e6)
    with pytest.raises(CcsimError, match="does not implement reduce_scatter"):
        build_schedule("chain-tree", "reduce_scatter", servers(2, 2), 1e6)
