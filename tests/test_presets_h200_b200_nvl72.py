"""The hgx-h200, hgx-b200 and gb200-nvl72 presets, checked against their cited figures.

Every number here comes from the presets' sources (``topologies/*.yaml`` comments) or a
closed form worked out by hand, never from ccsim's output. GB = 1e9 bytes:

- NVLink4 (H200): 18 links x 25 GB/s = 450 GB/s per direction per GPU (H200 datasheet:
  900 GB/s bidirectional);
- NVLink5 (B200, GB200 NVL72): 18 links x 50 GB/s = 900 GB/s per direction per GPU
  (1.8 TB/s bidirectional; NVL72: 130 TB/s = 72 x 1.8 TB/s);
- one ConnectX-7 400 Gb/s NIC per GPU: 400e9 / 8 = 50 GB/s per GPU;
- NVSwitch latency 0.3 us per GPU link, so 0.6 us GPU to GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from simulator.collective.simulate import simulate_collective
from simulator.network.routing import LinkTable, Router
from simulator.topology import gpu_nodes, load_topology
from simulator.topology.presets import preset_files
from simulator.topology.summary import summarize
from simulator.workload.devices import graph_device

CCSIM = [sys.executable, "-m", "simulator"]

# preset: (GPUs per server, NVLink bytes/s per direction per GPU, device name)
NEW = {
    "hgx-h200": (8, 18 * 25e9, "H200"),
    "hgx-b200": (8, 18 * 50e9, "B200"),
    "gb200-nvl72": (72, 18 * 50e9, "GB200"),
}
NIC_SHARE = 400e9 / 8  # one 400 Gb/s NIC per GPU, in bytes/s


def ccsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CCSIM, *args], capture_output=True, text=True, check=False)


def test_the_new_presets_are_listed_with_their_descriptions():
    """``ccsim topologies`` prints each name with the description its file holds (read
    here with PyYAML, not ccsim's reader)."""
    run = ccsim("topologies")
    assert run.returncode == 0, run.stderr
    lines = {
        line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1] for line in run.stdout.splitlines()
    }
    for name in NEW:
        description = yaml.safe_load(preset_files()[name].read_text())["description"]
        assert lines[name] == " ".join(description.split())


@pytest.mark.parametrize("name", list(NEW))
def test_summary_reports_nvlink_and_nic_bandwidth_per_gpu(name):
    """One server: per-GPU intra-node bandwidth is the GPU's NVLink total (its one link
    to the NVSwitch node), its NIC share 50 GB/s; half the GPUs reach the other half at
    (gpus / 2) x NVLink through the non-blocking switch."""
    gpus, nvlink, _ = NEW[name]
    summary = summarize(load_topology(name))
    assert (summary.servers, summary.gpus, summary.nics) == (1, gpus, gpus)
    assert summary.devices == {"nvswitch": 1}
    assert summary.intra_bandwidth == pytest.approx(nvlink, rel=1e-12)
    assert summary.inter_bandwidth == pytest.approx(NIC_SHARE, rel=1e-12)
    assert summary.bisection_bandwidth == pytest.approx(gpus / 2 * nvlink, rel=1e-12)


@pytest.mark.parametrize("name", list(NEW))
def test_two_servers_on_a_rail_optimized_fabric(name):
    """Two servers: one leaf per rail (one per NIC index, so per GPU), spines = servers /
    oversubscription 1 = 2 (topologies/README.md). Links: GPU-NVSwitch, GPU-NIC and
    NIC-leaf, one each per GPU, plus every leaf to every spine. Bisection: rack 0 reaches
    rack 1 through its NICs only, gpus x 50 GB/s."""
    gpus, nvlink, _ = NEW[name]
    summary = summarize(load_topology(name, nodes=2))
    assert summary.fabric == "rail-optimized"
    assert (summary.servers, summary.gpus, summary.nics) == (2, 2 * gpus, 2 * gpus)
    assert summary.devices == {"leaf": gpus, "nvswitch": 2, "spine": 2}
    assert summary.links == 3 * 2 * gpus + gpus * 2
    assert summary.intra_bandwidth == pytest.approx(nvlink, rel=1e-12)
    assert summary.inter_bandwidth == pytest.approx(NIC_SHARE, rel=1e-12)
    assert summary.bisection_bandwidth == pytest.approx(gpus * NIC_SHARE, rel=1e-12)


@pytest.mark.parametrize("name", list(NEW))
def test_workload_device_model_resolves(name):
    assert graph_device(load_topology(name)).name == NEW[name][2]


def test_nvl72_rack_is_one_nvlink_domain_without_nics_on_its_paths():
    """All 72 GPUs are one server, and every route between two of them is GPU, NVSwitch,
    GPU: no NIC (nor PCIe) on any path inside the rack."""
    graph = load_topology("gb200-nvl72", nodes=1)
    gpus = gpu_nodes(graph)
    assert len(gpus) == 72
    assert {graph.nodes[gpu]["server"] for gpu in gpus} == {0}
    router = Router(graph, LinkTable(graph))
    src, dst = np.array([(s, d) for s in range(72) for d in range(72) if s != d]).T
    for s, d, route in zip(src, dst, router.route_ids(src, dst), strict=True):
        path = router.path_nodes(int(route))
        assert [graph.nodes[node]["kind"] for node in path] == ["gpu", "nvswitch", "gpu"]
        assert (path[0], path[-1]) == (gpus[s], gpus[d])


def test_nvl72_ideal_ring_all_reduce_is_the_closed_form():
    """Ideal model, one channel, one chunk: ring all-reduce takes 2(p-1)(a + n/(pB))
    (shared/reference/README.md, no reduction cost), a = 0.6 us GPU to GPU, B = 900 GB/s.
    Its busbw is then B / (1 + a p B / n): at 1 GiB the 142 latencies cost 3.6%."""
    p, bandwidth, alpha, n = 72, 900e9, 0.6e-6, 2**30
    result = simulate_collective(load_topology("gb200-nvl72"), "all_reduce", n, "ring")
    assert result.ranks == p
    assert result.time_s == pytest.approx(2 * (p - 1) * (alpha + n / (p * bandwidth)), rel=1e-9)
    assert result.busbw_GBps == pytest.approx(900 / (1 + alpha * p * bandwidth / n), rel=1e-9)


def test_nvl72_ideal_ring_all_reduce_reaches_nvlink_line_rate():
    """busbw (nccl-tests: algbw x 2(p-1)/p) of a pipelined ring is the NVLink line rate,
    900 GB/s, within 1%. Tolerance: with 4 chunks per step a chunk takes n/(4pB) = 4.1 us,
    longer than the 0.6 us latency, so each step's latency hides behind the next chunk
    and only a pipeline fill of about one latency is left against 2(p-1)n/(pB) = 2.35 ms
    (well under 0.1%). 1% still fails if every step paid its latency (3.6%, above) or a
    path crossed a 63 GB/s PCIe link or a 50 GB/s NIC; busbw can never exceed 900."""
    result = simulate_collective(
        load_topology("gb200-nvl72"), "all_reduce", 2**30, "ring", chunks=4
    )
    assert result.busbw_GBps == pytest.approx(900.0, rel=0.01)
    assert result.busbw_GBps <= 900.0 * (1 + 1e-9)


def test_cli_runs_nccls_choice_on_two_nvl72_racks():
    """``ccsim collective all_reduce --topology gb200-nvl72 --nodes 2 --sizes 1G`` runs
    NCCL's policy and prints one row. No figure is asserted: nothing independent of the
    model gives NCCL's busbw on NVL72. ``--chunks 1`` keeps NCCL's algorithm, protocol and
    channels but runs one chunk per step: with NCCL's own chunking (a tree of 144 ranks,
    32 channels, 32 chunks) the run takes about 5 minutes on 2 cores."""
    run = ccsim(
        "collective", "all_reduce", "--topology", "gb200-nvl72", "--nodes", "2",
        "--sizes", "1G", "--chunks", "1",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if not line.startswith("#")]
    assert len(rows) == 1 and rows[0][0] == str(2**30)
    assert "144 ranks" in run.stdout
    assert "# nccl: size (B), then NCCL's choice" in run.stdout


def test_cli_json_row_on_one_nvl72_rack():
    """The default command on one rack (NCCL's own choices) gives a JSON row. Its busbw
    is bounded whatever algorithm NCCL picks: every GPU must at least send its n bytes
    and receive the n-byte result over its 900 GB/s link (even with in-switch
    reduction), so t >= n / B and busbw = 2(p-1)/p n/t <= 2(p-1)/p x 900 GB/s."""
    run = ccsim(
        "collective", "all_reduce", "--topology", "gb200-nvl72", "--sizes", "1G",
        "--format", "json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(run.stdout)
    assert (row["ranks"], row["size_bytes"]) == (72, 2**30)
    assert 0 < row["busbw_GBps"] <= 2 * 71 / 72 * 900.0


def test_nccl_runs_nvls_on_an_nvl72_rack_with_32_heads():
    """NCCL's NVLS search takes at most NCCL_MAX_NVLS_ARITY = 32 heads (device.h) and
    needs (heads + 1) x bw through each GPU's NVLinks (search.cc's NVLS try): on the
    NVL72, NVLink5 counts 18 x 40.1 = 721.8 GB/s (topo.h), so the largest Blackwell
    search speed with 33 x s <= 721.8 is 20 GB/s (24 x 33 = 792 is too much). With NVLS
    found, NCCL's model runs it for a 1 GiB all-reduce over the rack."""
    from simulator.library.nccl import nccl_system

    system = nccl_system(load_topology("gb200-nvl72"))
    assert system.nvls is not None
    assert (system.nvls.channels, system.nvls.bw_intra) == (32, 20.0)
    result = simulate_collective(load_topology("gb200-nvl72"), "all_reduce", 2**30, "nccl")
    assert result.params["nccl_algorithm"] == "NVLS"
