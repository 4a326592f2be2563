"""NCCL's tuning figures by release (simulator.library.nccl.tuning_release): the times
NCCL's model gives, worked by hand from the tuning tables at each tag, and the choices
that follow. The system is the held-out 128-GPU OCI run's (two NVL72 racks of 64 GB200s,
one 400 Gb/s NIC a GPU, NVLS off, NCCL 2.29.2): ring and tree 16 channels x 45.1 GB/s
(16 x 45.1 = 721.6 fits the 18 x 40.1 = 721.8 GB/s NCCL counts on a GPU's NVLinks), run
on 32 channels.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from simulator.collective.policy import NcclPolicy
from simulator.library.nccl import (
    NcclSystem,
    nccl_choice,
    nccl_system,
    predicted_time_us,
    tuning_release,
)
from simulator.library.nccl_env import parse_nccl_env
from simulator.topology import load_topology

DATA = Path(__file__).resolve().parents[1] / "simulator" / "data"
OCI_PRESET = DATA / "nccl-tests" / "gb200-nvl72-64.yaml"
NVLS_OFF = parse_nccl_env("NCCL_NVLS_ENABLE=0")
MIB = 2**20

# Hand-worked from tuning.cc at v2.29.2-1 (latencies lines 148-170, caps 176-198,
# ncclTopoTuneModel 300-390): 128 ranks on 2 nodes, 2 x 127 = 254 ring steps of which 2
# cross the network.
RING_LL128_LATENCY = 14.0 + 252 * 1.9 + 2 * 4.0  # base + NVLink steps + network steps
RING_SIMPLE_LATENCY = (8.4 + 252 * 3.4 + 2 * 14.0) * 1.4  # x 1.4: "plateau effect of ring"
TREE_LL128_LATENCY = 14.0 + 2 * (63 * 1.25 + 1 * 8.5)
RING_RATIO = 128 / 254  # nRanks / nsteps: bus to algorithm bandwidth
RING_SIMPLE_BW = 16 * 45.1 * RING_RATIO
#: Ring/LL128: min(busBw x 0.92, channels x perChMaxRingLL128Bw[Blackwell][N2]).
RING_LL128_BW = {
    "2.29.2": min(16 * 45.1 * 0.92, 16 * 34.6) * RING_RATIO,
    "2.30.7": min(16 * 45.1 * 0.92, 16 * 40.0) * RING_RATIO,
}
#: Tree/LL128: min(bus x 0.92, 16 x 42.8), then min(x 120/128, 16 x 31.67), x 0.85 (the
#: tree pattern across servers), x 0.5 (bus to algorithm bandwidth); the same in both.
TREE_LL128_BW = min(min(16 * 45.1 * 0.92, 16 * 42.8) * 120 / 128, 16 * 31.67) * 0.85 * 0.5


@cache
def _oci(version: str | None) -> NcclSystem:
    return NVLS_OFF.apply(nccl_system(load_topology(OCI_PRESET, 2), version))


def _us(size: int, bw_gbs: float) -> float:
    return size / (1000 * bw_gbs)


def test_the_release_before_2_28_3_and_after_2_30_3_is_the_modelled_one():
    assert tuning_release("2.27.3") == tuning_release("2.30.7") == tuning_release(None)
    assert tuning_release("2.31.0") == tuning_release(None)
    assert tuning_release("2.29.3") == tuning_release("2.29.2") != tuning_release("2.29.7")


def test_oci_system_is_the_same_search_result_in_both_releases():
    for version in ("2.29.2", "2.30.7"):
        system = _oci(version)
        assert (system.ring.channels, system.ring.bw_intra, system.channels) == (16, 45.1, 32)


@pytest.mark.parametrize("version", ["2.29.2", "2.30.7"])
def test_ring_ll128_time_at_512_mib_from_each_release_cap(version):
    expected = RING_LL128_LATENCY + _us(512 * MIB, RING_LL128_BW[version])
    got = predicted_time_us(_oci(version), "all_reduce", 512 * MIB, "Ring", "LL128")
    assert got == pytest.approx(expected, rel=1e-5)
    # 2425.2 us at 2.29.2's 34.6 GB/s a channel, 2165.4 us at 2.30.7's 40.
    assert round(expected, 1) == {"2.29.2": 2425.2, "2.30.7": 2165.4}[version]


def test_256_mib_runs_tree_ll128_at_2_29_2_and_ring_ll128_at_2_30_7():
    size = 256 * MIB
    tree = TREE_LL128_LATENCY + _us(size, TREE_LL128_BW)  # correction 1.0 at 2^22 x 64 B
    ring_229 = RING_LL128_LATENCY + _us(size, RING_LL128_BW["2.29.2"])
    ring_230 = RING_LL128_LATENCY + _us(size, RING_LL128_BW["2.30.7"])
    assert ring_230 < tree < ring_229  # 1333.1 < 1435.0 < 1463.0
    old = nccl_choice(_oci("2.29.2"), "all_reduce", size, algorithms=("Tree", "Ring"))
    new = nccl_choice(_oci("2.30.7"), "all_reduce", size, algorithms=("Tree", "Ring"))
    assert (old.algorithm, old.protocol) == ("Tree", "LL128")
    assert old.time_us == pytest.approx(tree, rel=1e-5)
    assert (new.algorithm, new.protocol) == ("Ring", "LL128")
    assert new.time_us == pytest.approx(ring_230, rel=1e-5)


def test_1_gib_runs_ring_simple_at_2_29_2_and_ring_ll128_at_2_30_7():
    size = 1024 * MIB
    simple = RING_SIMPLE_LATENCY + _us(size, RING_SIMPLE_BW)  # 4203.3 us
    ll128_229 = RING_LL128_LATENCY + _us(size, RING_LL128_BW["2.29.2"])  # 4349.6 us
    ll128_230 = RING_LL128_LATENCY + _us(size, RING_LL128_BW["2.30.7"])  # 3830.1 us
    assert ll128_230 < simple < ll128_229
    old = nccl_choice(_oci("2.29.2"), "all_reduce", size, algorithms=("Tree", "Ring"))
    assert (old.algorithm, old.protocol) == ("Ring", "Simple")
    assert old.time_us == pytest.approx(simple, rel=1e-5)
    new = nccl_choice(_oci("2.30.7"), "all_reduce", size, algorithms=("Tree", "Ring"))
    assert (new.algorithm, new.protocol) == ("Ring", "LL128")


def test_policy_runs_the_version_it_is_given():
    graph = load_topology(OCI_PRESET, 2)
    old = NcclPolicy(env=NVLS_OFF, version="2.29.2").choose(graph, "all_reduce", 2**30)
    new = NcclPolicy(env=NVLS_OFF).choose(graph, "all_reduce", 2**30)
    assert (old.algorithm, old.protocol, new.algorithm, new.protocol) == (
        "Ring", "Simple", "Ring", "LL128",
    )  # fmt: skip


def test_nvls_tree_network_latency_is_14_us_before_2_28_9():
    """hwLatencies[NET][NVLSTree][Simple] is 14 us at v2.28.7 (tuning.cc:165) and 20.9 from
    v2.28.9: NVLSTree's latency on 2 B200 servers is 0 (base) + 25 (NVLink) + 2 x log2(2)
    x the network figure."""
    graph = load_topology("hgx-b200", 2)
    times = {
        version: predicted_time_us(
            nccl_system(graph, version), "all_reduce", 0, "NVLSTree", "Simple"
        )
        for version in ("2.28.7", "2.28.9")
    }
    assert times == pytest.approx({"2.28.7": 25 + 2 * 14.0, "2.28.9": 25 + 2 * 20.9})


def test_search_speeds_are_not_versioned():
    """The search's speed arrays stay v2.30.7's (see TUNING_RELEASES): the 2-server B300
    run (NCCL 2.28.9) keeps 8 NVLS heads at 80 GB/s, so its choice does not move."""
    graph = load_topology("hgx-b300", 2)
    assert nccl_system(graph, "2.28.9").nvls == nccl_system(graph).nvls


@pytest.mark.parametrize(
    ("version", "racks", "channels"),
    [
        # ncclNvlsTreeSm100Tuning at v2.30.7-1 (transport/nvls.cc:164-200): 2 nodes with
        # NICs of >= 48 GB/s run 32 channels; 3 nodes with NICs of 48-96 GB/s run 24.
        ("2.30.7", 2, 32),
        ("2.30.7", 3, 24),
        ("2.30.3", 3, 24),
        # Before v2.30.3 no such rule: NVLS_NCHANNELS_SM100 = 32 on every communicator
        # spanning several nodes (transport/nvls.cc:148 and 193 at v2.27.3-1; at
        # v2.29.7-1 the same lines and no ncclNvlsTreeSm100Tuning).
        ("2.29.7", 3, 32),
        ("2.27.3", 3, 32),
        ("2.26.2", 3, 32),
    ],
)
def test_nvls_tree_channels_across_blackwell_racks_follow_the_release(version, racks, channels):
    # The held-out OCI GB200 racks (64 GPUs a rack, one 400 Gb/s NIC a GPU, 48 GB/s to
    # NCCL), with NVLS on as they ran it.
    system = nccl_system(load_topology(OCI_PRESET, racks), version)
    assert system.nvls_channels == channels
