"""NCCL_NCHANNELS_PER_NET_PEER: send/receive's channels per peer on another server.

NCCL reads it as ``NCCL_PARAM(NChannelsPerNetPeer, "NCHANNELS_PER_NET_PEER", ...)``
(paths.cc:796 at v2.27.7-1; init.cc:1729 at v2.30.7-1, copied into
``comm->config.nChannelsPerNetPeer`` by envConfigOverride, init.cc:2038-2049). Where set
it replaces NCCL's own count for a network peer (paths.cc:818-832 at v2.27.7-1,
943-952 at v2.30.7-1); the per-peer count is the least over all peers, pow2Up, at most
p2pnChannels, and v2.30.7 halves it across nodes only when the user did not set it
(paths.cc:993-1003). The expected counts below are worked by hand from those lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.library.nccl_env import SUPPORTED, parse_nccl_env
from simulator.library.nccl_p2p import p2p_call
from simulator.validate import log_case

GiB = 1024**3

#: 16 servers of 8 H100-like GPUs (18 NVLinks: 36 channels to an NVLink peer), one
#: 400 Gb/s NIC (50 GB/s) a GPU, 32 channels: p2pnChannels 32.
H100_16X8 = dict(ranks=128, nodes=16, channels=32, nvlinks=18, net_count=1, net_gbps=50.0,
                 nvlink_gbps=20.0, size_bytes=16 * GiB)  # fmt: skip


def per_peer(version: str, setting: int | None, **call) -> int:
    """p2pnChannelsPerPeer for ``call`` (default :data:`H100_16X8`)."""
    args = {**H100_16X8, **call}
    return p2p_call(**args, version=version, net_peer_channels=setting).per_peer


def test_the_setting_is_read_and_written_back():
    env = parse_nccl_env("NCCL_NCHANNELS_PER_NET_PEER=2")
    assert env.net_peer_channels == 2
    assert env.text == "NCCL_NCHANNELS_PER_NET_PEER=2"
    assert parse_nccl_env(env.text) == env
    assert parse_nccl_env({"NCCL_NCHANNELS_PER_NET_PEER": 4}).net_peer_channels == 4
    assert parse_nccl_env(None).net_peer_channels is None
    assert "NCCL_NCHANNELS_PER_NET_PEER" in SUPPORTED  # so logs' lines are applied too


@pytest.mark.parametrize("value", ["0", "-1", "65", "two", "1.5"])
def test_values_outside_nccls_range_are_one_line_naming_the_variable(value):
    # NCCL ignores a value below 1 ("too low", init.cc:2040-2042 at v2.30.7-1) and
    # refuses a configuration above MAXCHANNELS = 64 (init.cc:2369-2371).
    with pytest.raises(CcsimError) as error:
        parse_nccl_env(f"NCCL_NCHANNELS_PER_NET_PEER={value}")
    message = str(error.value)
    assert "NCCL_NCHANNELS_PER_NET_PEER" in message and "from 1 to 64" in message
    assert "\n" not in message


def test_nccl_has_no_nchannels_per_peer_variable():
    # No NCCL_NCHANNELS_PER_PEER in src/ at v2.23.4-1 .. v2.30.7-1 (an NVLink peer's
    # channels are always 2 per NVLink, paths.cc:933-936 at v2.30.7-1).
    with pytest.raises(CcsimError, match="unknown NCCL setting"):
        parse_nccl_env("NCCL_NCHANNELS_PER_PEER=2")


def test_v2_28_default_and_the_users_count():
    # v2.28 (paths.cc:818-832 at v2.27.7-1): start from 2, halve while 2 x 128 ranks >
    # 4 x 32 channels -> 1; max(1 NIC, 1) = 1; least with the NVLink peers' 36 -> 1.
    assert per_peer("2.28.9", None) == 1
    # Set: the network peer gets 4; min(36, 4) = 4, pow2Up 4, <= 32.
    assert per_peer("2.28.9", 4) == 4
    # 64 a peer is more than an NVLink peer's 36: the least is 36, pow2Up 64, capped at
    # p2pnChannels 32 (paths.cc:886 at v2.27.7-1).
    assert per_peer("2.28.9", 64) == 32


def test_v2_30_skips_its_halving_across_nodes_when_the_user_sets_it():
    # v2.30.7: max(1 NIC, ceil(50 / 14)) = 4, then halved while 4 x ceil(128 / 8) = 64
    # > 32 -> 2 (2 x 16 = 32 <= 32): paths.cc:943-952 and 993-1001.
    assert per_peer("2.30.7", None) == 2
    # Set to 4: the halving is skipped ("the user didn't set nChannelsPerNetPeer",
    # paths.cc:993); min(32, 4) = 4 (paths.cc:1003).
    assert per_peer("2.30.7", 4) == 4
    assert per_peer("2.30.7", 1) == 1


def test_one_server_ignores_it():
    # Every peer is an NVLink peer: no network channel count enters the least.
    one = dict(ranks=8, nodes=1, channels=32)
    assert per_peer("2.30.7", 1, **one) == per_peer("2.30.7", None, **one) == 32


def test_a_channel_moves_what_nccl_sizes_it_for_whatever_the_count():
    # The count sets how many channels a peer's message may use, not what a thread block
    # moves: 2.29's 14 GB/s a channel (NCCL_P2P_PER_CHANNEL_NET_BW, paths.cc:918) stays.
    assert p2p_call(**H100_16X8, net_peer_channels=1).channel_gbps == 14


def test_the_all_to_all_on_two_b200_servers_runs_the_users_channels(capsys):
    # hgx-b200, 2 servers: 16 ranks, 16 channels (p2pnChannels 16), 1 NIC of 50 GB/s a
    # GPU. 64 MiB is 4 MiB a peer; nChannelsMin halves the per-peer count while x 16
    # ranks > 16 -> 1; a part doubles while it exceeds a 128 KiB step and n <=
    # per-peer / 2 (enqueue.cc:891-902 at v2.28.7-1). Default 4 a peer -> 4 parts; set
    # to 2 -> 2; set to 1 -> 1.
    got = {}
    for setting in (None, "1", "2"):
        extra = ["--nccl", f"NCCL_NCHANNELS_PER_NET_PEER={setting}"] if setting else []
        argv = ["collective", "all_to_all", "--topology", "hgx-b200", "--nodes", "2"]
        assert main([*argv, "--sizes", "64M", "--format", "json", *extra]) == 0
        got[setting] = json.loads(capsys.readouterr().out)[0]
    assert {k: row["channels"] for k, row in got.items()} == {None: 4, "1": 1, "2": 2}
    assert got["2"]["nccl_env"] == "NCCL_NCHANNELS_PER_NET_PEER=2"
    assert got[None]["time_us"] < got["1"]["time_us"]  # one channel a peer is slower


def test_a_bad_value_on_the_command_line_exits_2_on_one_line(capsys):
    argv = ["collective", "all_to_all", "--topology", "hgx-b200", "--nodes", "2"]
    code = main([*argv, "--sizes", "1M", "--nccl", "NCCL_NCHANNELS_PER_NET_PEER=0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "NCCL_NCHANNELS_PER_NET_PEER=0" in err


def test_a_log_line_setting_it_is_applied(tmp_path):
    # NCCL prints an integer NCCL_PARAM read from the environment as "%s set by
    # environment to %lld." (misc/param.cc:100 at v2.30.7-1).
    log = Path(__file__).parent / "data" / "nccl-tests" / "oci-a100-2n-all_reduce.log"
    line = "host:43:43 [0] NCCL INFO NCCL_NCHANNELS_PER_NET_PEER set by environment to 2."
    path = tmp_path / "env.log"
    path.write_text(line + "\n" + log.read_text())
    notes: list[str] = []
    case = log_case(path, topology="dgx-a100", notify=notes.append)
    assert case.settings["nccl"] == "NCCL_NCHANNELS_PER_NET_PEER=2"
    assert "NCCL settings from the log: NCCL_NCHANNELS_PER_NET_PEER=2" in notes[0]
    assert "ignored" not in notes[0]
