"""NCCL's all-to-all as grouped send/receive: the nccl-p2p schedule and NCCL's p2p rules.

Timelines are hand-computed on a full mesh (every pair its own link, so each pair's
chunks are alone on their link): tau = bytes of one chunk / B, h = the protocol's
per-step latency, which a chunk pays after its last byte is sent.
"""

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.algorithms.nccl_p2p import (
    busy_channels,
    channel_base,
    p2p_rounds,
    part_bytes,
    works_per_batch,
)
from simulator.algorithms.schedule import PATH_PXN
from simulator.collective.policy import NcclPolicy
from simulator.collective.run import run_schedule
from simulator.library.nccl_p2p import channel_share, p2p_call, version_rules
from simulator.library.protocol import Protocol
from simulator.topology import load_topology

B = 100e9


def mesh(p: int) -> nx.Graph:
    graph = nx.Graph()
    for rank in range(p):
        graph.add_node(f"gpu{rank}", kind="gpu", rank=rank, server=0)
    for i in range(p):
        for j in range(i + 1, p):
            graph.add_edge(f"gpu{i}", f"gpu{j}", bandwidth=B, latency=0.0, link="nvlink")
    return graph


def step_latency(h: float) -> Protocol:
    return Protocol("Simple", 0.0, {"nvlink": h, "pcie": h, "network": h}, 1.0)


@pytest.mark.parametrize(
    ("ranks", "options"),
    [
        (4, {"channels": 2, "chunks": 3}),
        (8, {"channels": 4, "chunk_bytes": 1e5, "p2p_channels": 8}),
        (16, {"channels": 2, "chunks": 9, "p2p_channels": 8}),
        (12, {"channels": 1, "chunks": 2, "p2p_channels": 4}),
    ],
)
def test_every_block_reaches_its_rank_once_and_bytes_are_conserved(ranks, options):
    size = 3.2e7
    schedule = build_schedule("nccl-p2p", "all_to_all", ranks, size, **options)
    verify(schedule)  # the checker: block (s, d) ends at d exactly, no race
    moved = np.zeros((ranks, ranks))
    np.add.at(moved, (schedule.src, schedule.dst), schedule.nbytes)
    expected = np.full((ranks, ranks), size / ranks)
    np.fill_diagonal(expected, 0.0)
    assert moved == pytest.approx(expected)
    # One block per transfer, each delivered once.
    assert len(np.unique(schedule.segment)) == schedule.n_ops == schedule.n_segments


def test_peer_rounds_are_nccl_order():
    # init.cc's comment: the group offsets for 16 groups of one rank.
    order = p2p_rounds(RankLayout(16), group_size=1)[0].tolist()
    assert order == [0, 1, 3, 6, 10, 15, 5, 12, 4, 13, 7, 2, 14, 11, 9, 8]
    for layout in (RankLayout(24), RankLayout(16, tuple([0] * 8 + [1] * 8))):
        send = p2p_rounds(layout)
        p = layout.ranks
        assert (send[:, 0] == np.arange(p)).all()  # round 0: the rank itself
        for k in range(p):  # each round pairs every rank with one sender and one receiver
            assert sorted(send[:, k].tolist()) == list(range(p))
        for r in range(p):  # every peer once
            assert sorted(send[r].tolist()) == list(range(p))


def test_channels_of_rounds_and_parts():
    assert [channel_base(k, 32, 1, 8) for k in range(5)] == [0, 16, 8, 24, 4]
    # Across nodes, rounds of one group of 8 share a base (channel.h:21-28).
    assert {channel_base(k, 32, 2, 8) for k in range(8)} == {0}
    assert part_bytes(2**20, 3).tolist() == [352256.0, 352256.0, 344064.0]
    # 4 ranks, 8 parts of 32: every peer on its own 8 channels; 32 parts: all 3 share.
    assert works_per_batch(RankLayout(4), 8, 32) == 1.0
    assert works_per_batch(RankLayout(4), 32, 32) == 3.0


@pytest.mark.parametrize(("chunks", "window"), [(4, False), (16, True)])
def test_crossbar_timeline_with_chunks_and_slots(chunks, window):
    """4 ranks, one part per peer, all three works in one batch on one channel, each
    pair on its own link. Chunk c leaves after chunk c-1 is sent and once chunk c-8 is
    done (its slot free): with h = 10 tau and 16 chunks, chunks 0-7 are sent at
    (c+1) tau and done 10 tau later; chunk 8 waits for chunk 0's slot until 11 tau, and
    chunks 8-15 are sent at (c+4) tau, the last done at 19 tau + 10 tau = 29 tau. With
    4 chunks no slot is waited for: T = 4 tau + h."""
    size = 4 * chunks * 1e6  # 1 MB chunks
    tau = 1e6 / B
    h = 10 * tau
    schedule = build_schedule("nccl-p2p", "all_to_all", 4, size, chunks=chunks)
    result = run_schedule(mesh(4), schedule, protocol=step_latency(h))
    expected = 29 * tau if window else chunks * tau + h
    assert result.time_s == pytest.approx(expected, rel=1e-9)


def test_batches_on_a_channel_follow_each_other():
    """16 ranks on one channel: rounds 1-7 form the first batch (7 works side by side),
    rounds 8-15 the second, which starts when both ends finished the first: each
    batch takes tau + h, T = 2 (tau + h)."""
    size = 16 * 1e6
    tau, h = 1e6 / B, 3e-6
    schedule = build_schedule("nccl-p2p", "all_to_all", 16, size, channels=1, p2p_channels=1)
    result = run_schedule(mesh(16), schedule, protocol=step_latency(h))
    assert result.time_s == pytest.approx(2 * (tau + h), rel=1e-9)


def test_messages_between_servers_go_by_pxn():
    layout = RankLayout(8, (0, 0, 0, 0, 1, 1, 1, 1))
    schedule = build_schedule("nccl-p2p", "all_to_all", layout, 8e6, pxn=True)
    across = np.asarray(layout.servers)[schedule.src] != np.asarray(layout.servers)[schedule.dst]
    assert (schedule.path[across] == PATH_PXN).all()
    assert (schedule.path[~across] == 0).all()


def test_nccl_ll_threshold_by_version():
    gb300 = {"ranks": 4, "nodes": 1, "channels": 32, "nvlinks": 18, "net_count": 1,
             "net_gbps": 100.0, "nvlink_gbps": 40.1}  # fmt: skip
    # v2.28.7: LL up to 16 KiB x 32 channels per peer = 512 KiB per peer (2 MiB here).
    assert p2p_call(size_bytes=2**21, version="2.28.7", **gb300).protocol == "LL"
    assert p2p_call(size_bytes=2**22, version="2.28.7", **gb300).protocol == "Simple"
    # v2.29+: 16 KiB x the 2 channels a 128 KiB message uses: Simple.
    assert p2p_call(size_bytes=2**19, **gb300).protocol == "Simple"
    assert p2p_call(size_bytes=2**16, **gb300).protocol == "LL"
    big = p2p_call(size_bytes=2**32, version="2.28.7", **gb300)
    assert (big.channels, big.chunk_bytes, big.channel_gbps) == (32, 524288.0, 20.05)
    assert version_rules("2.28.7") == "2.28" and version_rules("2.30.7") == "2.29"


def test_nccl_policy_runs_all_to_all_as_grouped_p2p():
    graph = load_topology("dgx-h100")
    plan = NcclPolicy(version="2.28.7").plan(NcclPolicy().system(graph), "all_to_all", 2**26)
    assert (plan.schedule, plan.protocol, plan.channels) == ("nccl-p2p", "Simple", 4)
    assert plan.options["p2p_channels"] == 32 and plan.options["chunk_bytes"] == 2**19
    assert plan.params["channel_rate"] == pytest.approx(20.6e9 / 2)
    assert NcclPolicy().plan(None, "all_to_all", 2**26).schedule == "direct"


def test_busy_channels_count_the_most_loaded_thread_block():
    """A rank's sends keep (bytes on its channels) / (bytes on the busiest one) thread
    blocks busy: 4 ranks x 8 parts on 32 channels sit on bases 16, 8, 24 (reverseBits)
    and never meet: 24. With 16 parts the bases overlap by half: 48 parts on 32
    channels, 16 of them twice loaded: 48 / 2 = 24. 64 ranks with one part each: 63
    rounds on 32 channels, one channel (base 0, rounds 0 and 32 minus the own copy)
    carries one part, the other 31 two: 63 / 2 = 31.5."""
    assert busy_channels(RankLayout(4), 2**28, 8, 32) == 24.0
    assert busy_channels(RankLayout(4), 2**30, 16, 32) == 24.0
    assert busy_channels(RankLayout(64), 2**28, 1, 32) == 31.5
    # A short message fills only its first 4 KiB parts: 3 peers x 2 parts of 8 parts.
    assert busy_channels(RankLayout(4), 4 * 8192, 8, 32) == 6.0


def test_thread_blocks_bound_an_all_to_all_inside_one_nvlink_domain():
    """4 GB300 GPUs (18 NVLink5 links, NCCL's 40.1 GB/s each), 256 MiB: 8 parts per
    peer, 24 busy channels at NCCL's 20.05 GB/s per channel: 481.2 of 721.8 GB/s, a
    factor 2/3 on the links' rate; at 16 GiB (32 parts, 96 on 32 channels, three
    each) 32 x 20.05 = 641.6 GB/s: 0.8889. Two servers over the network: no such
    bound (the NICs bound it)."""
    gb300 = Path(__file__).parents[1] / "simulator/data/nccl-tests/gb300-nvl72-4.yaml"
    policy = NcclPolicy(version="2.28.7")
    system = policy.system(load_topology(gb300))
    plan = policy.plan(system, "all_to_all", 2**28)
    assert (plan.protocol, plan.channels, plan.options["p2p_channels"]) == ("Simple", 8, 32)
    assert plan.params["bandwidth_factor"] == pytest.approx(24 * 20.05 / (18 * 40.1))
    top = policy.plan(system, "all_to_all", 2**34)
    assert top.params["bandwidth_factor"] == pytest.approx(32 * 20.05 / (18 * 40.1))
    assert channel_share(24, 20.05, 18 * 40.1) == pytest.approx(2 / 3)
    assert channel_share(40, 20.05, 18 * 40.1) == 1.0
    two = policy.plan(policy.system(load_topology("dgx-h100", 2)), "all_to_all", 2**28)
    assert "bandwidth_factor" not in two.params
