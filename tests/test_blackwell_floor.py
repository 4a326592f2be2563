"""Blackwell's LL step over NVLink and LL's share of the links (simulator.library.nccl
LL_NVLINK_HOP_US, LL_BANDWIDTH), checked against NCCL's own latency formula.

NCCL's ring all-reduce latency on one server (tuning.cc:384-412 at v2.30.7) is the LL
base latency 6.6 us plus 2 (p - 1) NVLink steps. NCCL's model prices a step at 0.6 us
on every generation; ccsim prices a Blackwell step at the FITTED 1.2 us, so an 8-byte
all-reduce of 8 GPUs (one LL line, no bandwidth term to speak of) costs 6.6 + 14 x 1.2
= 23.4 us on an HGX B200 and 6.6 + 14 x 0.6 = 15.0 us on a DGX H100, after the
kernel launch (both presets' 3 us; ``ccsim validate`` overlaps it with the previous
call's GPU time, as nccl-tests' back-to-back calls do).
"""

from __future__ import annotations

import pytest

from simulator.collective.policy import NcclPolicy, protocol_model
from simulator.library.nccl import LL_BANDWIDTH, LL_NVLINK_HOP_US
from simulator.topology import load_topology


def _tiny(topology: str) -> float:
    result = NcclPolicy().simulate(load_topology(topology), "all_reduce", 8)
    assert (result.params["nccl_algorithm"], result.params.get("protocol")) == ("Ring", "LL")
    return result.time_s * 1e6


def test_an_8_byte_all_reduce_pays_nccls_latency_with_the_generations_step():
    assert LL_NVLINK_HOP_US["blackwell"] == 1.2
    assert _tiny("hgx-b200") == pytest.approx(3 + 6.6 + 14 * 1.2, rel=0.01)
    assert _tiny("dgx-h100") == pytest.approx(3 + 6.6 + 14 * 0.6, rel=0.01)


def test_a_preset_with_its_own_ll_step_keeps_it():
    # dgx-a100 fitted its LL NVLink step (1.21 us); a Blackwell figure never replaces a
    # preset's own, and Hopper and Ampere get no generation figure at all.
    graph = load_topology("hgx-b200")
    params = {"nccl_algorithm": "Ring", "ll_nvlink_hop_s": 1.2e-6, "ll_bandwidth": 0.35}
    proto = protocol_model(graph, "LL", params)
    assert proto.hop_s["nvlink"] == pytest.approx(1.2e-6)
    assert proto.bandwidth == pytest.approx(LL_BANDWIDTH["blackwell"])
    a100 = protocol_model(load_topology("dgx-a100"), "LL", params)
    assert a100.hop_s["nvlink"] == pytest.approx(1.21e-6)
    assert a100.bandwidth == pytest.approx(0.442)
    h100 = NcclPolicy().plan(NcclPolicy().system(load_topology("dgx-h100")), "all_reduce", 8)
    assert "ll_nvlink_hop_s" not in h100.params and "ll_bandwidth" not in h100.params
