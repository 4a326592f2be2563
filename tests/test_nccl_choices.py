"""ccsim's model of NCCL's tuner against the choices NCCL printed on public machines
(tests/data/nccl_choices.yaml: the algorithm, protocol and channels of one call, and
NCCL's own predicted time where the log has it), each at its NCCL release. None of these
records set a constant; those marked ``independent: false`` were looked at while ccsim's
model was brought to NCCL's source, so they no longer check it independently.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

import pytest
import yaml

from simulator.library.nccl import (
    TREE_PATTERN_FACTOR,
    NcclSystem,
    launch_size,
    nccl_choice,
    nccl_system,
    predicted_time_us,
    working_channels,
)
from simulator.library.nccl_env import parse_nccl_env
from simulator.topology import load_topology
from simulator.topology.builders import fabric_spec
from simulator.topology.presets import preset, preset_graph

RECORDS = yaml.safe_load((Path(__file__).parent / "data" / "nccl_choices.yaml").read_text())[
    "records"
]


@cache
def _system(
    name: str,
    nodes: int,
    nic: str | None,
    version: str | None = None,
    gpus: int | None = None,
    server: str | None = None,
) -> NcclSystem:
    """The communicator a record describes: the preset's servers (or the record's own
    ``server``, as YAML), ``gpus`` of each where the job used fewer, NICs at ``nic``,
    under NCCL ``version``'s tuning figures."""
    data = copy.deepcopy(preset(name))
    if server is not None:
        data["server"] = yaml.safe_load(server)
    if nic is not None:
        data["server"]["nic"]["bandwidth"] = nic
    if gpus is not None:
        data["server"]["gpus"] = gpus
    data["fabric"] = fabric_spec(data.get("fabric"), None)
    graph = preset_graph(data, nodes, name=name, source=f"{name}.yaml")
    return nccl_system(graph, None if version is None else str(version))


def _record_system(record: dict) -> NcclSystem:
    server = record.get("server")
    system = _system(
        record["preset"],
        record["nodes"],
        record.get("nic"),
        record.get("nccl"),
        record.get("gpus"),
        None if server is None else yaml.safe_dump(server),
    )
    return parse_nccl_env(record.get("settings")).apply(system)


def _choice(record: dict):
    env = parse_nccl_env(record.get("settings"))
    return nccl_choice(
        _record_system(record),
        record["op"],
        float(record["bytes"]),
        algorithms=env.algorithms_for(record["op"]),
        protocols=env.protocols_for(record["op"]),
    )


def _id(record: dict) -> str:
    gpus = f"{record['gpus']}of" if record.get("gpus") else ""
    machine = f"{record['nodes']}x{gpus}{record['preset']}"
    return f"{record['source']}-{machine}-{record['op']}-{record['bytes']}B"


SCORED = [record for record in RECORDS if not record.get("unknown")]


@pytest.mark.parametrize("record", SCORED, ids=_id)
def test_ccsim_chooses_what_nccl_printed(record):
    choice = _choice(record)
    assert choice.algorithm == record["algorithm"]
    if record.get("protocol") is not None:  # null: the source does not say
        assert choice.protocol == record["protocol"]
    if record.get("channels") is not None:
        assert choice.channels == record["channels"]
    if record.get("time_us") is not None:
        # NCCL prints its float32 estimate to 6 decimals.
        assert choice.time_us == pytest.approx(record["time_us"], rel=1e-6)


@pytest.mark.parametrize(
    "record", [r for r in RECORDS if r.get("unknown") and r.get("time_us") is not None], ids=_id
)
def test_records_ccsim_cannot_score_still_price_the_printed_pair(record):
    """A record whose machine ccsim cannot know in full (``unknown`` says what) is not
    scored on its choice, but where NCCL printed its estimate, ccsim's model prices the
    printed pair at that estimate."""
    time = predicted_time_us(
        _record_system(record),
        record["op"],
        float(record["bytes"]),
        record["algorithm"],
        record["protocol"],
    )
    assert time == pytest.approx(record["time_us"], rel=1e-6)


def test_hopper_trees_across_servers_are_credited_0_85():
    """NCCL #1453's printed Tree times (3 x 8 H100, 8 x 200 Gb/s) are the balanced-tree
    model's at 0.85 of the bandwidth: 262144 B on Tree/LL128 is 48.5 us of latency
    (14 + 2 (7 x 1.25 + 8.5)) plus 262144 B / (1000 x bw) with bw = 8 channels x 24 GB/s
    x 0.92 x 120/128 x 0.85 x 0.5 x 0.6 (treeCorrectionFactor at 2^12 x 64 B) =
    42.24 GB/s: 54.7078 us, as printed (54.707825)."""
    system = _system("dgx-h100", 3, "200Gbps")
    assert system.simple_tree and (system.tree.channels, system.tree.bw_inter) == (8, 24.0)
    bw = 8 * 24.0 * 0.92 * 120 / 128 * TREE_PATTERN_FACTOR * 0.5 * 0.6
    expected = 14 + 2 * (7 * 1.25 + 8.5) + 262144 / (1000 * bw)
    assert nccl_choice(system, "all_reduce", 262144.0).time_us == pytest.approx(expected)
    assert expected == pytest.approx(54.707825, rel=1e-6)


def test_one_server_and_ampere_keep_the_balanced_tree():
    """The fallback to the simple tree is Hopper-and-later's (search.cc:1215-1219) and
    needs a network to balance: one H100 server and two A100 servers keep 1.0."""
    assert not nccl_system(load_topology("dgx-h100", 1)).simple_tree
    assert not nccl_system(load_topology("dgx-a100", 2)).simple_tree
    assert nccl_system(load_topology("hgx-b200", 2)).simple_tree


def test_nvls_heads_across_servers_are_one_per_nic():
    """Across servers an NVLS head is a GPU with its own NIC (search.cc:754-771): a
    server of 8 H100 with 4 NICs has 4 heads (the "NVLS Head 0-3" lines of the 2 x 8
    H100, 4-NIC log in NVIDIA/nccl#1357), so NVLSTree's bus bandwidth is 4 channels'."""
    data = copy.deepcopy(preset("dgx-h100"))
    data["server"]["nic"]["gpus_per_nic"] = 2
    data["fabric"] = fabric_spec(data.get("fabric"), None)
    system = nccl_system(preset_graph(data, 2, name="h100-4nic", source="h100-4nic.yaml"))
    assert system.nvls is not None and system.nvls.channels == 4
    assert _system("dgx-h100", 2, None).nvls.channels == 8


@pytest.mark.parametrize(("nodes", "channels"), [(2, 32), (4, 24)])
def test_blackwell_nvls_tree_channels_follow_nccl_s_sm100_tuning(nodes, channels):
    """ncclNvlsTreeSm100Tuning (transport/nvls.cc:164-200): 400 Gb/s NICs (50 GB/s),
    8 GPUs per server: 32 CTAs on 2 servers, 24 beyond."""
    system = nccl_system(load_topology("hgx-b200", nodes))
    assert system.nvls_channels == channels
    assert launch_size(system, "all_reduce", 2**30, "NVLSTree", "Simple")[0] == channels


@pytest.mark.parametrize(("version", "channels"), [("2.27.3", 10), ("2.30.7", 9)])
def test_channel_cells_follow_the_release(version, channels):
    """182,092 bytes of LL all-reduce on 4 ranks, trimmed to 11 channels of the
    communicator's 24 (enqueue.cc scheduleCollTasksToPlan), worked by hand: 1,456,736
    bytes of traffic (x 2 all-reduce, x 4 LL). v2.27.3: 16 KiB cells of 2,048 bytes, 89
    of them; 132,430 bytes a channel is 9 cells; 9 + 8 x 9 + 8 = 89 on 10 channels.
    v2.30.7: 32 KiB cells of 4,096 bytes, 45 of them; 132,432 bytes a channel is 5 cells;
    5 + 7 x 5 + 5 = 45 on 9 channels."""
    assert working_channels("all_reduce", 182092, "LL", 11, ranks=4, max_channels=24,
                            version=version) == channels  # fmt: skip


def test_nvls_calls_share_cells_over_the_nvls_channels():
    """An NVLS all-reduce of 128 KiB on 8 H100 (16 NVLS channels, v2.30.7): 256 KiB of
    traffic, 16,384 bytes a channel, cells of 16 KiB (32 KiB of traffic), 8 of them, one
    a channel: 8 channels. 2 MiB fills all 16 (as the 8 x H100 log prints)."""
    system = nccl_system(load_topology("dgx-h100", 1))
    assert system.nvls_channels == 16
    assert launch_size(system, "all_reduce", 2**17, "NVLS", "Simple")[0] == 8
    assert launch_size(system, "all_reduce", 2**21, "NVLS", "Simple")[0] == 16


@pytest.mark.parametrize(
    ("size", "protocol", "channels", "time_us"),
    [
        (2**16, "LL", 1, None),
        (2**17, "LL", 2, None),
        (2**18, "LL", 4, None),
        (2**19, "LL", 8, None),
        (2**20, "LL128", 16, None),
        (2**25, "LL128", 16, 44.6 + 2**25 / 1e3 / (8 * 40 * 16 / 15)),
        (2**26, "Simple", 16, 70.0 + 2**26 / 1e3 / (8 * 48 * 16 / 15)),
    ],
)
def test_two_b200_servers_all_gather_as_nccl_s_source_picks(size, protocol, channels, time_us):
    """A 2 x 8 B200 all-gather, worked from NCCL's source (issue 32, the two Vultr B200
    servers of heldout5). Ring at every size: NVLS across servers needs CollNet
    (tuning.cc:446-448 at v2.27.3-1) and PAT one GPU a node (tuning.cc:196). LL's
    channels: ``nBytes < nc * nt * threshold`` trims them (enqueue.cc:1853-1856), with
    512 threads and NCCL_LL_THREAD_THRESHOLD 8 x 16 ranks (tuning.cc:513-517): 64 KiB a
    channel. The graph: 8 rings at 48 GB/s, run on 16 channels. Latency (baseLat and
    hwLat, tuning.cc:131-155 at v2.27.3-1, the same at v2.30.7): LL128 14.0 + 14 NVLink
    steps x 1.9 + one network step x 4.0 = 44.6 us, Simple 8.4 + 14 x 3.4 + 14 = 70.0
    us (the 1 us network overhead, x 3 for Simple, is below both NVLink steps).
    Algorithm bandwidth: LL128 8 x min(0.92 x 48, 40) x 16/15 = 341.3 GB/s, Simple
    8 x 48 x 16/15 = 409.6 GB/s; so LL128 wins at 32 MiB (142.9 against 151.9 us) and
    Simple at 64 MiB (233.8 against 241.2 us)."""
    system = nccl_system(load_topology("hgx-b200", 2))
    choice = nccl_choice(system, "all_gather", size)
    assert (choice.algorithm, choice.protocol, choice.channels) == ("Ring", protocol, channels)
    assert set(a for a, _ in choice.table) == {"Ring"}
    if time_us is not None:
        assert choice.time_us == pytest.approx(time_us, abs=0.05)


def test_two_b200_servers_all_gather_keeps_ll128_at_64_mib_under_2_28_3():
    """v2.28.3's Blackwell ring LL128 cap is 2 x 36.7 (tuning.cc:179 at v2.28.3-1, as at
    v2.25-v2.27.7, tuning.cc:176 at v2.27.3-1): 8 x min(44.16, 73.4) x 16/15 = 376.8
    GB/s, so at 64 MiB LL128 takes 44.6 + 178.1 = 222.7 us against Simple's 233.8 and
    NCCL moves to Simple only at 128 MiB (400.8 against 397.7 us)."""
    system = nccl_system(load_topology("hgx-b200", 2), version="2.28.3")
    at_64 = nccl_choice(system, "all_gather", 2**26)
    assert at_64.protocol == "LL128"
    assert at_64.time_us == pytest.approx(44.6 + 2**26 / 1e3 / 376.832, abs=0.05)
    assert nccl_choice(system, "all_gather", 2**27).protocol == "Simple"
