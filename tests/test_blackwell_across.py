"""Blackwell runs across servers and on B300: the hgx-b300 preset against its cited
figures, and the bundled cases (B200-2N-AG-gke-a4, B300-*-oci-quickstart), never
used to set a constant, run as NCCL would run them.

Figures from the preset's sources (``topologies/hgx-b300.yaml``), GB = 1e9 bytes:
NVLink5 18 x 50 GB/s = 900 GB/s per direction per GPU; one 800 Gb/s ConnectX-8 per
GPU = 100 GB/s; PCIe Gen6 x16 = 126 GB/s per direction.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from simulator.collective.policy import NcclPolicy, protocol_model
from simulator.library.nccl_p2p import p2p_call, proxy_share
from simulator.library.protocol import calibration_of
from simulator.topology import load_topology
from simulator.topology.summary import summarize
from simulator.validate import BUNDLED, validate_folder


def test_hgx_b300_preset_has_its_cited_figures():
    """One server: 8 GPUs, 8 NICs, NVLink 900 GB/s per GPU, 100 GB/s of NIC per GPU;
    two servers: each server reaches the other through its 8 NICs, 8 x 100 GB/s."""
    one = summarize(load_topology("hgx-b300"))
    assert (one.servers, one.gpus, one.nics) == (1, 8, 8)
    assert one.intra_bandwidth == pytest.approx(18 * 50e9, rel=1e-12)
    assert one.inter_bandwidth == pytest.approx(800e9 / 8, rel=1e-12)
    two = summarize(load_topology("hgx-b300", nodes=2))
    assert two.bisection_bandwidth == pytest.approx(8 * 100e9, rel=1e-12)
    graph = load_topology("hgx-b300")
    pcie = [d["bandwidth"] for u, v, d in graph.edges(data=True) if "nic" in (u + v)]
    assert pcie and all(b == pytest.approx(126e9, rel=1e-12) for b in pcie)


def test_nccl_2_28_sizes_a_network_channel_at_half_its_nics():
    """NCCL 2.28 gives a network peer max(NICs, 2) channels ("start from 2 channels
    per NIC", paths.cc:838-849 at v2.28.9-1), so one channel is sized at the GPU's NIC
    GB/s over that count: 100 / 2 = 50 GB/s on B300's 800 Gb/s NIC, 50 / 2 = 25 on a
    400 Gb/s one; 2.29 and later size it at NCCL_P2P_PER_CHANNEL_NET_BW = 14 GB/s
    whatever the NIC (paths.cc:920 at v2.30.7-1)."""
    common = dict(ranks=16, nodes=2, channels=32, nvlinks=18, net_count=1, size_bytes=2**33)
    old = p2p_call(net_gbps=100.0, version="2.28.9", **common)
    assert (old.per_peer, old.channel_gbps, old.protocol) == (2, 50.0, "Simple")
    assert p2p_call(net_gbps=50.0, version="2.28.9", **common).channel_gbps == 25.0
    new = p2p_call(net_gbps=100.0, version="2.30.7", **common)
    assert (new.per_peer, new.channel_gbps) == (8, 14.0)  # ceil(100 / 14) = 8 channels


def test_grouped_receives_lower_the_proxy_cost_of_an_all_to_all_across_servers():
    """With PXN a receiver's proxy posts up to NCCL_NET_IB_MAX_RECVS = 8 receives with
    one irecv (net.cc recvProxyProgress), sends one by one: a proxy that posts as many
    sends as receives spends (1 + 1/8) / 2 = 0.5625 of a lone message's time on each.
    Two B300 servers under NCCL 2.28.9: a channel's batch holds 7 works (the round
    with the rank itself left out) or 8, 7.5 on average, so (1 + 1/7.5) / 2; the plan
    carries it and the protocol model scales the preset's proxy cost by it. One server
    has no network: no scale."""
    assert proxy_share(8) == 0.5625 and proxy_share(1) == 1.0
    graph = load_topology("hgx-b300", 2)
    policy = NcclPolicy(version="2.28.9")
    plan = policy.plan(policy.system(graph), "all_to_all", 2**33)
    assert plan.params["proxy_scale"] == pytest.approx((1 + 1 / 7.5) / 2, rel=1e-12)
    proto = protocol_model(graph, plan.protocol, plan.params)
    base = calibration_of(graph).protocol("Simple").proxy_s
    assert proto.proxy_s == pytest.approx(base * (1 + 1 / 7.5) / 2, rel=1e-12)
    one = NcclPolicy(version="2.28.9")
    assert (
        "proxy_scale"
        not in one.plan(one.system(load_topology("hgx-b300")), "all_to_all", 2**33).params
    )


#: Issue 32's all-gather, reduce-scatter and all-to-all runs on Google Cloud machines
#: (tests/test_gather_across.py), left out of this module's cases.
ISSUE32_GOOGLE = ("-docs.", "-gke-a4x", "-a4x-pedia")


@pytest.fixture(scope="module")
def across_results(tmp_path_factory):
    """The bundled cross-server and B300 cases, simulated once."""
    folder = tmp_path_factory.mktemp("across")
    for path in BUNDLED.iterdir():
        if path.name.startswith(("B200-2N", "B300-", "GB200-", "gb200-")) and not any(
            mark in path.name for mark in ISSUE32_GOOGLE
        ):
            shutil.copy(path, folder / path.name)
    return {r.name: r for r in validate_folder(folder)}


def test_b300_runs_are_predicted_at_their_published_sizes(across_results):
    """OCI's B300 runs (1 and 2 servers, all-reduce and all-to-all, 8 and 16 GiB only:
    the smaller rows are not published), never used to set a constant: every size
    within 7% of the measured busbw. The 2-server all-to-all (181 GB/s busbw, the two
    servers' 800 Gb/s NICs at 0.96 of line rate: 8 GiB x 8/16 / 96 GB/s) was 42% slow
    before the two mechanisms above; they come from NCCL's source, but were looked for
    because of this run, so it no longer checks them independently."""
    names = [name for name in across_results if name.startswith("B300-")]
    assert len(names) == 4
    for name in names:
        result = across_results[name]
        assert not result.error, result.error
        measured, simulated = np.array(result.measured_busbw), np.array(result.simulated_busbw)
        assert np.all(np.abs(simulated - measured) / measured <= 0.07), name
    assert across_results["B300-2N-A2A-oci-quickstart"].algorithms == ["SendRecv"]


def test_all_gather_across_servers_runs_nccl_ring(across_results):
    """NCCL's tuner offers all-gather only Ring, PAT (one GPU per node, :220), NVLS (across
    nodes only with CollNet) and CollNet Direct (tuning.cc:295-296, 353-358 at v2.30.7),
    so two 8-GPU B200 servers run a Ring at every size."""
    result = across_results["B200-2N-AG-gke-a4"]
    assert not result.error and set(result.algorithms) == {"Ring"}


def test_an_all_to_all_in_one_nvlink_domain_pays_its_last_chunks_copy_out():
    """The FITTED terms of an all-to-all inside one NVLink domain, from their constants
    by hand (simulator.library.nccl_p2p): 4 GB300 GPUs, 16 MiB per rank under NCCL
    2.28.7: 4 MiB per peer in 8 parts of 512 KiB, each one 512 KiB chunk, so a call adds
    P2P_CALL_US + 512 KiB / P2P_COPY_GBPS = 2 + 524288 / 50e3 = 12.49 us. At 64 MiB a
    part is 2 MiB, still one 512 KiB chunk copied out last: the same. An LL call (2 MiB:
    64 KiB per part) adds the call's 2 us only, and its channels move
    LL_COPY_SHARE x 0.5 x 20.05 GB/s (half of NCCL's 40.1 GB/s NVLink5 link, half of
    that data in LL's lines) = 3.0075 GB/s, shared by the works of a batch."""
    graph = load_topology(BUNDLED / "gb300-nvl72-4.yaml")
    policy = NcclPolicy(version="2.28.7")
    system = policy.system(graph)
    for size in (2**24, 2**26):
        plan = policy.plan(system, "all_to_all", size)
        assert plan.protocol == "Simple" and plan.channels == 8
        assert plan.params["step_latency_s"] == pytest.approx((2 + 524288 / 50e3) * 1e-6)
    ll = policy.plan(system, "all_to_all", 2**21)
    assert ll.protocol == "LL"
    assert ll.params["step_latency_s"] == pytest.approx(2e-6)
    assert ll.params["channel_rate"] == pytest.approx(0.3 * 0.5 * 20.05e9, rel=1e-12)


def test_gb200_all_to_all_runs_are_predicted_at_their_published_sizes(across_results):
    """OCI's GB200 all-to-all runs on 4, 8 and 64 GPUs of one NVL72 rack (the two
    largest sizes only), never used to set a constant: every size within 6% of the
    measured busbw, as NCCL's grouped send/receive."""
    names = [n for n in across_results if n.startswith("GB200-") and "-A2A-" in n]
    assert len(names) == 3
    for name in names:
        result = across_results[name]
        assert not result.error, result.error
        measured, simulated = np.array(result.measured_busbw), np.array(result.simulated_busbw)
        assert np.all(np.abs(simulated - measured) / measured <= 0.06), name
        assert set(result.algorithms) == {"SendRecv"}
