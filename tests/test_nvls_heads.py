"""NVLS-tree with fewer heads than GPUs a server: NCCL keeps at most 32 NVLS heads, one
per NIC (NCCL_MAX_NVLS_ARITY, include/device.h:213; search.cc:1126-1127 at v2.30.7), so on
NVL72 racks 32 of 72 GPUs, and their NICs, carry the inter-rack trees."""

from __future__ import annotations

import pytest
import yaml

from simulator.algorithms import build_schedule
from simulator.algorithms.base import RankLayout
from simulator.algorithms.checker import verify
from simulator.collective.policy import NcclPolicy
from simulator.collective.run import rank_layout, run_schedule
from simulator.topology import load_topology

GIB = 2**30


@pytest.mark.parametrize(("servers", "gpus", "heads"), [(2, 4, 2), (3, 4, 1), (4, 8, 3)])
def test_every_rank_ends_with_the_sum(servers, gpus, heads):
    layout = RankLayout(servers * gpus, tuple(s for s in range(servers) for _ in range(gpus)))
    schedule = build_schedule(
        "nvls-tree", "all_reduce", layout, 1e6, chunks=3, channels=2, heads=heads
    )
    verify(schedule)  # raises unless every rank ends with every rank's data reduced
    assert schedule.params["heads"] == heads


def _nic_bound_preset(tmp_path):
    """8 GPUs on an NVSwitch of 100 TB/s (never the bound) with NVLS, one 10 GB/s NIC per
    GPU, no latencies."""
    spec = {
        "name": "slow-nics",
        "server": {
            "gpus": 8,
            "gpu": {"model": "H100-SXM5-80GB"},
            "intra": {
                "kind": "nvswitch", "link": "nvlink", "bandwidth": "100TB/s", "nvls": True,
            },
            "nic": {"bandwidth": "10GB/s"},
        },
        "fabric": {"type": "rail-optimized", "latency": "0us"},
    }  # fmt: skip
    path = tmp_path / "slow-nics.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("heads", [8, 4, 2])
def test_the_heads_nics_carry_the_trees(tmp_path, heads):
    """Two servers: each head's NIC carries its row's half up one tree and the other half
    down (e = 2 edges of n/(2h)), n/h each way; with K chunks the time tends to
    n/(h B_nic) from above, the pipeline adding at most a few chunks."""
    graph = load_topology(_nic_bound_preset(tmp_path), 2)
    K = 32
    schedule = build_schedule(
        "nvls-tree", "all_reduce", rank_layout(graph), GIB, chunks=K, heads=heads
    )
    bound = GIB / (heads * 10e9)
    time = run_schedule(graph, schedule).time_s
    assert bound * (1 - 1e-9) <= time <= bound * (1 + 3 / K)


def test_nccl_runs_nvlstree_with_32_heads_on_nvl72_racks():
    """72 GPUs a rack, 72 NICs: NCCL's NVLS graph has 32 heads; on DGX H100 (8 GPUs,
    8 NICs) every GPU is a head and the schedule is built as before."""
    policy = NcclPolicy()
    racks = load_topology("gb200-nvl72", 2)
    plan = policy.plan(policy.system(racks), "all_reduce", GIB)
    assert plan.params["nccl_algorithm"] == "NVLSTree"
    assert plan.options == {"heads": 32}
    dgx = load_topology("dgx-h100", 2)
    plan = policy.plan(policy.system(dgx), "all_reduce", 64 * 2**20)
    assert plan.params["nccl_algorithm"] == "NVLSTree" and plan.options == {}


@pytest.mark.parametrize(("gpus", "heads"), [(8, 8), (8, 4), (12, 3)])
def test_one_domain_with_fewer_heads(gpus, heads):
    """Every rank writes its copy of each of the h rows into the switch and takes every
    row's total out (n each way); a head also takes its row's sum out and writes the total
    in (n/h more). With one chunk the four phases run one after another, each bound by the
    heads' links: n/B up, n/(hB) down, n/(hB) up, n/B down; so 2 n (h + 1)/(h B) with no
    latency, here at B = 100 GB/s."""
    spec = {
        "name": "switch",
        "server": {
            "gpus": gpus,
            "gpu": {"model": "H100-SXM5-80GB"},
            "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "100GB/s", "nvls": True},
        },
    }
    graph = _graph_of(spec)
    schedule = build_schedule("nvls", "all_reduce", rank_layout(graph), GIB, chunks=1, heads=heads)
    expected = 2 * GIB * (heads + 1) / (heads * 100e9)
    assert run_schedule(graph, schedule).time_s == pytest.approx(expected, rel=1e-9)


def _graph_of(spec):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "switch.yaml"
        path.write_text(yaml.safe_dump(spec))
        return load_topology(path)


def test_nccl_runs_nvls_with_32_heads_on_a_rack():
    """One 72-GPU NVLink domain: NVLS with 32 heads; 8 GPUs: every GPU a head."""
    policy = NcclPolicy()
    rack = load_topology("gb200-nvl72", 1)
    plan = policy.plan(policy.system(rack), "all_reduce", 8 * GIB)
    assert plan.params["nccl_algorithm"] == "NVLS" and plan.options == {"heads": 32}
    server = load_topology("hgx-b200", 1)
    plan = policy.plan(policy.system(server), "all_reduce", 8 * GIB)
    assert plan.params["nccl_algorithm"] == "NVLS" and plan.options == {}
