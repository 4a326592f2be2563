"""nccl-p2p's merged transfers against NCCL's own chunks (the unmerged schedule).

A part of K NCCL chunks moves in at most ``max_chunks`` transfers; beyond, a transfer
carries m chunks and the slot window counts w = max(2, 8/m) of them. Where a channel's
rate R binds (each chunk done no earlier than h + c/R after it started), NCCL's 8 slots
complete 8 chunks per D = h + c/R. Timelines are worked by hand on a full mesh (each
pair its own link of B, so tau = c/B per chunk): 4 ranks, one part per peer, the three
works in one batch.
"""

import pytest

from simulator.algorithms import build_schedule
from simulator.algorithms.nccl_p2p import MAX_CHUNKS, merged_transfers
from simulator.collective.policy import NcclPolicy, protocol_model
from simulator.collective.run import build_and_run, run_schedule
from simulator.library.protocol import Protocol
from simulator.topology import load_topology
from tests.test_nccl_p2p import mesh

B = 100e9
CHUNK = 1e6  # bytes of one NCCL chunk
TAU = CHUNK / B  # 10 us on the wire


def channel_protocol(h: float, rate: float) -> Protocol:
    return Protocol("Simple", 0.0, {"nvlink": h, "pcie": h, "network": h}, 1.0, channel_rate=rate)


def a2a_time(chunks: int, max_chunks: int, protocol: Protocol) -> float:
    schedule = build_schedule(
        "nccl-p2p", "all_to_all", 4, 4 * chunks * CHUNK, chunk_bytes=CHUNK, max_chunks=max_chunks
    )
    return run_schedule(mesh(4), schedule, protocol=protocol).time_s


def test_merged_transfers_keep_the_eight_slots():
    """m is the least power of two fitting the cap; w m = 8 while m <= 8."""
    assert merged_transfers(64, 64) == (1, 8)
    assert merged_transfers(64, 32) == (2, 4)
    assert merged_transfers(64, 16) == (4, 2)
    assert merged_transfers(64, 8) == (8, 2)
    assert merged_transfers(64, 4) == (16, 2)
    assert merged_transfers(65, 16) == (8, 2)  # ceil(65/16) = 5 -> 8


@pytest.mark.parametrize(("max_chunks", "m", "w"), [(64, 1, 8), (32, 2, 4), (16, 4, 2),
                                                    (8, 8, 2), (4, 16, 2)])  # fmt: skip
def test_channel_bound_pipeline_by_hand(max_chunks, m, w):
    """K = 64 chunks, h = 10 us, c/R = 200 us: D = 210 us > 8 tau = 80 us, so the
    channel binds. Unmerged, chunk i starts at (i // 8) D + (i % 8) tau (its slot frees
    when chunk i-8 is done, D after it started) and the last is done at 8 D + 7 tau.
    Merged, a transfer's bound is (w m / 8) D: transfer j starts at
    (j // w)(w m / 8) D + (j % w) m tau, the last done at (K/8) D + (w - 1) m tau. The
    two differ by |(w - 1) m - 7| tau <= m tau, one merged transfer's wire time.
    (Before, a merged transfer paid h + m c/R with w in flight: at m = 4 the call took
    8 (h + 4 c/R) + 4 tau = 6.5 ms against 1.75 ms unmerged.)"""
    h, rate = 10e-6, CHUNK / 200e-6
    d = h + CHUNK / rate
    K = 64
    expected = K / 8 * d + (w - 1) * m * TAU
    assert a2a_time(K, max_chunks, channel_protocol(h, rate)) == pytest.approx(expected, rel=1e-9)
    unmerged = K / 8 * d + 7 * TAU
    assert abs(expected - unmerged) <= m * TAU


@pytest.mark.parametrize(
    ("h", "c_over_r"),
    [(10e-6, 200e-6), (10e-6, 20e-6), (30e-6, 50e-6), (2e-6, 5e-6), (60e-6, 60e-6)],
)
@pytest.mark.parametrize("max_chunks", [32, 16, 8, 4])
def test_merged_within_one_transfer_of_unmerged(h, c_over_r, max_chunks):
    """Channel-bound, wire-bound (8 tau = 80 us > D) and between: the merged call ends
    within one merged transfer's bound or wire time, max(m tau, (w m / 8) D), of NCCL's
    own chunks (K = 64 chunks a part)."""
    protocol = channel_protocol(h, CHUNK / c_over_r)
    unmerged = a2a_time(64, 64, protocol)
    merged = a2a_time(64, max_chunks, protocol)
    m, w = merged_transfers(64, max_chunks)
    bound = max(m * TAU, w * m / 8 * (h + c_over_r))
    assert abs(merged - unmerged) <= bound * (1 + 1e-9)


@pytest.mark.parametrize("size", [2**28, 2**30])
def test_two_b200_servers_at_one_channel_a_peer_merged_as_unmerged(size):
    """The case that showed the loss: two HGX B200 servers, NCCL_NCHANNELS_PER_NET_PEER=1
    (one part a peer, 128 KiB chunks: 128 and 512 chunks a part at 256 MiB and 1 GiB).
    Merged into at most 32 transfers a part, the call takes what NCCL's own chunks take
    within 3% (a part's fill and drain, one transfer of 4 or 16 chunks in 128 or 512);
    before, busbw fell 87 -> 52 GB/s (time +69%)."""
    merged, full = (nccl_a2a(size, max_chunks) for max_chunks in (MAX_CHUNKS, 10**6))
    assert merged == pytest.approx(full, rel=0.03)


def nccl_a2a(size: float, max_chunks: int) -> float:
    """NCCL's all-to-all on two B200 servers at one channel a network peer, its parts
    moved in at most ``max_chunks`` transfers (10**6: every NCCL chunk its own)."""
    graph = load_topology("hgx-b200", 2)
    policy = NcclPolicy(env="NCCL_NCHANNELS_PER_NET_PEER=1")
    plan = policy.plan(policy.system(graph), "all_to_all", size)
    params = {"chunks": plan.chunks, "channels": plan.channels, **plan.params}
    result = build_and_run(
        graph, plan.schedule, "all_to_all", size,
        protocol=protocol_model(graph, plan.protocol, params), chunks=plan.chunks,
        channels=plan.built, max_chunks=max_chunks, **plan.options,
    )  # fmt: skip
    return result.time_s
