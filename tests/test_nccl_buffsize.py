"""NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE and NCCL_LL128_BUFFSIZE: parsed as NCCL reads them, and
the steps, chunks and network messages NCCL derives from them.

NCCL sizes each protocol's connection buffer from the variable or its default
(``computeBuffSizes``, init.cc:810-827 at v2.30.7-1: LL 8 lines x 512 threads x 8 steps x
16 B = 512 KiB, LL128 120 x 640 x 8 x 8 B = 4,915,200 B, Simple 4 MiB) and cuts it into
NCCL_STEPS = 8 steps. A collective's chunk is one step (enqueue.cc:2222-2227), of which LL
carries half (its flags) and LL128 15 of 16 words, rounded down to the protocol's grain
(16, 1,920, 512 B; enqueue.cc:2321, device.h:328-333); a Ring/Simple slice, what one
network message carries, is two steps (ALLREDUCE_SLICESTEPS = NCCL_STEPS / 4). NVLS starts
from one Simple step before NCCL_NVLS_CHUNKSIZE caps it (enqueue.cc:2258-2267), and
send/receive's chunk is at most one Simple step (init.cc:841-843). The tuning model reads
none of them, so NCCL's choice does not move. Every expected figure here is worked from
those rules by hand.
"""

import json

import pytest

from simulator.cli import main
from simulator.collective.policy import NcclPolicy, message_bytes, pipeline_chunks
from simulator.errors import CcsimError
from simulator.library.nccl import NcclChoice
from simulator.library.nccl_env import parse_nccl_env
from simulator.library.nccl_p2p import p2p_call
from simulator.topology import load_topology

MiB = 2**20
GiB = 2**30
BIG = "NCCL_BUFFSIZE=16777216"  # 16 MiB, as OCI's GB200 nccl-tests job sets it


# -- parsing -------------------------------------------------------------------------


def test_default_steps_are_nccls_buffers_over_eight():
    env = parse_nccl_env(None)
    assert env.step_bytes("LL") == 512 * 1024 // 8 // 2  # 32 KiB of data
    assert env.step_bytes("LL128") == 4_915_200 // 8 * 15 // 16  # 576,000 B
    assert env.step_bytes("Simple") == 4 * MiB // 8  # 512 KiB


@pytest.mark.parametrize(
    ("setting", "protocol", "step"),
    [
        ("NCCL_BUFFSIZE=16777216", "Simple", 2 * MiB),
        ("NCCL_BUFFSIZE=0x1000000", "Simple", 2 * MiB),  # strtoll reads hex
        ("NCCL_BUFFSIZE=1000000", "Simple", 124_928),  # 125,000 down to 244 x 512
        ("NCCL_LL_BUFFSIZE=1048576", "LL", 64 * 1024),  # 128 KiB a step, half data
        ("NCCL_LL128_BUFFSIZE=9830400", "LL128", 1_152_000),  # twice the default
        # 125,000 B a step: 7,812 x 15 = 117,180 B of data, down to 61 x 1,920.
        ("NCCL_LL128_BUFFSIZE=1000000", "LL128", 117_120),
    ],
)
def test_a_set_buffer_gives_nccls_step(setting, protocol, step):
    env = parse_nccl_env(setting)
    assert env.step_bytes(protocol) == step
    assert env.text == setting
    # The other protocols keep their defaults.
    plain = parse_nccl_env(None)
    for other in {"LL", "LL128", "Simple"} - {protocol}:
        assert env.step_bytes(other) == plain.step_bytes(other)


@pytest.mark.parametrize(
    ("setting", "least"),
    [
        ("NCCL_BUFFSIZE=4095", 4096),  # a step under one 512 B grain
        ("NCCL_LL_BUFFSIZE=255", 256),  # 16 B of data a step needs 32 B of lines
        ("NCCL_LL128_BUFFSIZE=16383", 16384),  # 1,920 B of data needs 2,048 B
        ("NCCL_BUFFSIZE=2147483648", 4096),  # NCCL's int cannot hold it
        ("NCCL_BUFFSIZE=16MiB", 4096),  # NCCL reads bytes only
        ("NCCL_BUFFSIZE=-1", 4096),
    ],
)
def test_a_buffer_nccl_could_not_use_is_one_line_naming_the_variable(setting, least):
    with pytest.raises(CcsimError) as error:
        parse_nccl_env(setting)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{setting}: ") and f"from {least} to 2147483647" in message


def test_the_command_line_refuses_a_bad_buffer_with_exit_2(capsys):
    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--sizes", "1M"]
    assert main([*argv, "--nccl", "NCCL_BUFFSIZE=1k"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NCCL_BUFFSIZE=1k" in err


# -- what NCCL derives from them -----------------------------------------------------


def test_ring_simple_messages_are_two_steps():
    ring = NcclChoice("Ring", "Simple", 16, 512, 0.0)
    assert message_bytes(ring, GiB, 16, 16, 2) == 1 * MiB
    steps = parse_nccl_env(BIG).steps()
    assert message_bytes(ring, GiB, 16, 16, 2, steps=steps) == 4 * MiB
    # The pipeline: a 1 GiB all-reduce over 16 ranks on 16 channels moves 4 MiB a
    # channel and ring step, so 4 chunks of 1 MiB, or 1 of 4 MiB.
    assert pipeline_chunks(ring, "all_reduce", GiB, 16, 16, 2) == 4
    assert pipeline_chunks(ring, "all_reduce", GiB, 16, 16, 2, steps=steps) == 1


def test_tree_nvls_and_ll128_chunks_follow_their_steps():
    steps = parse_nccl_env("NCCL_BUFFSIZE=1048576 NCCL_LL128_BUFFSIZE=9830400").steps()
    tree = NcclChoice("Tree", "Simple", 16, 512, 0.0)
    assert message_bytes(tree, GiB, 16, 16, 2, steps=steps) == 128 * 1024  # one step
    # NVLS starts from one Simple step (128 KiB here) under NCCL_NVLS_CHUNKSIZE (128
    # KiB): unchanged at 1 GiB on 8 GPUs x 16 channels; a 512 KiB buffer's 64 KiB step
    # would cut it.
    nvls = NcclChoice("NVLS", "Simple", 16, 512, 0.0)
    assert message_bytes(nvls, GiB, 8, 16, 1, steps=steps) == 128 * 1024
    small = parse_nccl_env("NCCL_BUFFSIZE=524288").steps()
    assert message_bytes(nvls, GiB, 8, 16, 1, steps=small) == 64 * 1024
    # Tree/LL128 starts from one LL128 step (1,152,000 B here) and halves while a
    # channel gets under (1 + log2(nodes) + 0.1 ppn) x 64 / ppn chunks: 16 GPUs on 2
    # nodes, 16 channels, 1 GiB is 67,108,864 B a channel; 2.8 x 64 / 8 = 22.4 chunks
    # needed, 58.25 at 1,152,000 B, so it stays.
    tree128 = NcclChoice("Tree", "LL128", 16, 512, 0.0)
    assert message_bytes(tree128, GiB, 16, 16, 2, steps=steps) == 1_152_000
    assert message_bytes(tree128, GiB, 16, 16, 2) == 576_000


def test_send_receive_chunks_are_at_most_one_simple_step():
    """Across nodes a peer's chunk is NCCL_P2P_NET_CHUNKSIZE (128 KiB) unless the
    Simple buffer's step is smaller (init.cc:841-843); with 16 MiB per peer it is not
    tuned down further (8 x step < the message, enqueue.cc:845-849)."""
    call = dict(ranks=16, nodes=2, channels=32, nvlinks=18, net_count=8, net_gbps=400.0,
                size_bytes=16 * 16 * MiB, nvlink_gbps=20.0)  # fmt: skip
    assert p2p_call(**call).chunk_bytes == 128 * 1024
    small = parse_nccl_env("NCCL_BUFFSIZE=524288").steps()
    assert p2p_call(**call, steps=small).chunk_bytes == 64 * 1024


def test_the_buffers_do_not_change_what_nccl_picks():
    graph = load_topology("dgx-h100", 2)
    plain, big = NcclPolicy(), NcclPolicy(env=BIG + " NCCL_LL128_BUFFSIZE=9830400")
    for size in (2**10, 2**16, 2**20, 2**26, 2**30):
        a, b = plain.choose(graph, "all_reduce", size), big.choose(graph, "all_reduce", size)
        assert (a.algorithm, a.protocol, a.channels) == (b.algorithm, b.protocol, b.channels)


def test_the_default_buffer_set_explicitly_changes_nothing(capsys):
    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "2",
            "--sizes", "1M,64M,1G", "--format", "json"]  # fmt: skip
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--nccl", "NCCL_BUFFSIZE=4194304"]) == 0
    explicit = json.loads(capsys.readouterr().out)
    assert [r["time_us"] for r in explicit] == [r["time_us"] for r in plain]


def test_a_larger_buffer_fills_the_ring_in_coarser_chunks(capsys):
    """2 DGX H100s, a 1 GiB Ring/Simple all-reduce on 16 channels: each channel moves 4
    MiB a ring step, 4 slices of 1 MiB by default, 1 of 4 MiB under 16 MiB buffers. A
    ring's steps pipeline into each other, so the coarser grain costs at most the fill of
    one more slice: 3 MiB more on one hop before the next starts, at a channel's share
    of the NICs (16 channels over 8 x 50 GB/s: 25 GB/s), under 126 us; and the same
    bytes take a quarter of the proxy's messages, which costs nothing here (the links
    bind). So the call is slower, by less than that fill."""
    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "2",
            "--sizes", "1G", "--format", "json",
            "--nccl", "NCCL_ALGO=Ring,NCCL_PROTO=Simple"]  # fmt: skip
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)[0]
    assert main([*argv, "--nccl", BIG]) == 0
    big = json.loads(capsys.readouterr().out)[0]
    assert (plain["algorithm"], big["algorithm"]) == ("ring", "ring")
    assert (plain["chunks"], big["chunks"]) == (4, 1)
    fill_us = 3 * MiB / 25e9 * 1e6
    assert 0 < big["time_us"] - plain["time_us"] < fill_us
