"""Blackwell runs across servers and on B300: the hgx-b300 preset against its cited
figures, and the bundled cases (B200-2N-AG-gke-a4, B300-*-oci-quickstart), never
used to set a constant, run as NCCL would run them.

Figures from the preset's sources (``topologies/hgx-b300.yaml``), GB = 1e9 bytes:
NVLink5 18 x 50 GB/s = 900 GB/s per direction per GPU; one 800 Gb/s ConnectX-8 per
GPU = 100 GB/s; PCIe Gen6 x16 = 126 GB/s per direction.
"""

from __future__ import annotations

import pytest

from simulator.topology import load_topology
from simulator.topology.summary import summarize


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
