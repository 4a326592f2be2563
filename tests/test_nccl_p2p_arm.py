"""NCCL's send/receive chunk across nodes on Arm hosts with Blackwell GPUs.

From v2.29.2 ``computeBuffSizes`` doubles NCCL_P2P_NET_CHUNKSIZE (128 KiB) across nodes
when the hosts are Arm and every GPU has compute capability >= 10.0 ("GBx platforms only
have 4 GPUs per host", init.cc:748-752 at v2.29.2-1, 800-804 at v2.30.4-1), at most one
Simple step (init.cc:812). The expected channels and chunks below are worked by hand
from NCCL's rules at each tag (paths.cc:876-955 and enqueue.cc:892-897, 1110-1113 at
v2.30.4-1; paths.cc:817-852 at v2.28.7-1), as the comments show step by step.
"""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.library.nccl import host_cpu, nccl_system
from simulator.library.nccl_env import parse_nccl_env
from simulator.library.nccl_p2p import net_chunk, p2p_call
from simulator.topology import load_topology

KiB, MiB, GiB = 1024, 1024**2, 1024**3

#: Two racks' NVLink domains of 32 GB200 each (NCCL's nNodes = 2: an MNNVL clique is one
#: node), a 400 Gb/s NIC (50 GB/s) per GPU, 62 channels -> p2pnChannels 64.
GB200_2X32 = dict(ranks=64, nodes=2, channels=62, nvlinks=18, net_count=1, net_gbps=50.0,
                  nvlink_gbps=40.1, blackwell=True)  # fmt: skip
#: Two 8-GPU H100 servers (x86), one 400 Gb/s NIC per GPU, 32 channels.
H100_2X8 = dict(ranks=16, nodes=2, channels=32, nvlinks=18, net_count=1, net_gbps=50.0,
                nvlink_gbps=20.0, blackwell=False)  # fmt: skip


def plan(call: dict, cpu: str, version: str, size: float) -> tuple[int, int, float]:
    """(p2pnChannelsPerPeer, nChannels of a peer's message, chunk data bytes)."""
    got = p2p_call(**call, cpu=cpu, version=version, size_bytes=size)
    return got.per_peer, got.channels, got.chunk_bytes


def test_gb200_two_racks_at_16_gib():
    # 256 MiB a peer. v2.28.9: network peer 2 channels (2 x 64 ranks = 128 <= 4 x 64),
    # max(1 NIC, 2) = 2 < 36 NVLink ones; nChannelsMin 1 (2 x 64 > 64); parts double
    # from 1 while a part exceeds one 128 KiB step and n <= 2 / 2: 2.
    assert plan(GB200_2X32, "arm", "2.28.9", 16 * GiB) == (2, 2, 128 * KiB)
    # v2.30.4: max(1 NIC, ceil(50 / 14)) = 4; 4 x ceil(64 / 8) = 32 <= 64 keeps it;
    # nChannelsMin 1; parts 1 -> 2 -> 4; the chunk is 2 x 128 KiB on Grace.
    assert plan(GB200_2X32, "arm", "2.30.4", 16 * GiB) == (4, 4, 256 * KiB)
    # The same GPUs on an x86 host keep 128 KiB.
    assert plan(GB200_2X32, "x86", "2.30.4", 16 * GiB) == (4, 4, 128 * KiB)


def test_h100_two_servers_at_16_gib():
    # 1 GiB a peer. v2.28.9: 2 channels a network peer (2 x 16 <= 4 x 32), nChannelsMin
    # 2 (2 x 16 = 32 <= 32), parts 2 (n <= 1 stops the doubling), 128 KiB chunks.
    assert plan(H100_2X8, "x86", "2.28.9", 16 * GiB) == (2, 2, 128 * KiB)
    # v2.30.4: 4 a peer (4 x ceil(16 / 8) = 8 <= 32), nChannelsMin 2 (4 x 16 > 32),
    # parts 2 -> 4; Hopper is below compute capability 10.0, so 128 KiB even on Arm.
    assert plan(H100_2X8, "x86", "2.30.4", 16 * GiB) == (4, 4, 128 * KiB)
    assert plan(H100_2X8, "arm", "2.30.4", 16 * GiB) == (4, 4, 128 * KiB)


def test_small_messages_use_fewer_parts_and_larger_chunks_on_grace():
    # 8 ranks on 2 nodes, 256 KiB a peer, v2.30.4: nChannelsMin 4 (4 x 8 <= 32). A part
    # is at least stepSize / 2 (enqueue.cc:892-894): 128 KiB on Grace -> 2 parts,
    # 64 KiB on x86 -> 4 parts. 256 KiB < 8 steps halves the chunk (enqueue.cc:917):
    # 128 KiB and 64 KiB; below one step (64 KiB a peer) x86 quarters its 128 KiB step
    # (32 KiB) and Grace its 256 KiB one (64 KiB, enqueue.cc:916).
    call = dict(GB200_2X32, ranks=8, channels=32)
    assert plan(call, "arm", "2.30.4", 8 * 256 * KiB) == (4, 2, 128 * KiB)
    assert plan(call, "x86", "2.30.4", 8 * 256 * KiB) == (4, 4, 64 * KiB)
    assert plan(call, "arm", "2.30.4", 8 * 64 * KiB)[2] == 64 * KiB
    assert plan(call, "x86", "2.30.4", 8 * 64 * KiB)[2] == 32 * KiB


def test_the_doubled_chunk_is_at_most_one_simple_step():
    # NCCL_BUFFSIZE=1 MiB: a Simple step of 128 KiB caps the 256 KiB chunk
    # (init.cc:812 at v2.30.4-1).
    steps = parse_nccl_env("NCCL_BUFFSIZE=1048576").steps()
    got = p2p_call(**GB200_2X32, cpu="arm", version="2.30.4", size_bytes=16 * GiB, steps=steps)
    assert got.chunk_bytes == 128 * KiB


def test_the_rule_starts_at_2_29_2():
    assert net_chunk("2.29.1", "arm", True) == 128 * KiB
    assert net_chunk("2.29.2", "arm", True) == 256 * KiB
    assert net_chunk(None, "arm", True) == 256 * KiB  # the modelled v2.30.7
    with pytest.raises(CcsimError, match="cpu"):
        net_chunk("2.30.4", "power", True)


def test_one_nvlink_domain_keeps_its_512_kib_chunk():
    # nNodes = 1: the NVLink chunk, whatever the CPU (init.cc:805-806 at v2.30.4-1).
    call = dict(GB200_2X32, nodes=1)
    assert plan(call, "arm", "2.30.4", 16 * GiB)[2] == 512 * KiB


def test_presets_name_their_hosts_cpu():
    assert host_cpu("GB300-NVL72") == "arm" and host_cpu("H100-SXM5-80GB") == "x86"
    assert nccl_system(load_topology("gb200-nvl72", 1)).cpu == "arm"
    assert nccl_system(load_topology("hgx-b200", 2)).cpu == "x86"
    assert nccl_system(load_topology("dgx-h100", 2)).cpu == "x86"


def _chunks(capsys, topology: str, nodes: int, size: str, version: str) -> int:
    code = main(["collective", "all_to_all", "--topology", topology, "--nodes", str(nodes),
                 "--sizes", size, "--format", "json", "--nccl-version", version])  # fmt: skip
    assert code == 0
    return json.loads(capsys.readouterr().out)[0]["chunks"]


def test_nccl_version_doubles_the_chunk_on_grace_only(capsys):
    """64 KiB a peer across 2 nodes, one part a peer: below one step the chunk is a
    quarter step (enqueue.cc:916). On 2 x 4 GB200 (Grace) v2.28.9 moves it as 2 chunks
    of 32 KiB, v2.30.4 as 1 of 64 KiB; 2 x 8 B200 (x86) move it as 2 at both."""
    gb200 = "simulator/data/nccl-tests/gb200-nvl72-4.yaml"
    assert _chunks(capsys, gb200, 2, "512K", "2.28.9") == 2
    assert _chunks(capsys, gb200, 2, "512K", "2.30.4") == 1
    assert _chunks(capsys, "hgx-b200", 2, "1M", "2.28.9") == 2
    assert _chunks(capsys, "hgx-b200", 2, "1M", "2.30.4") == 2
