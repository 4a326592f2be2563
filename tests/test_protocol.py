"""Protocol model (LL / LL128 / Simple), link efficiency and ccsim validate."""

import shutil
import subprocess
import sys

import pytest

from simulator.algorithms import build_schedule
from simulator.collective import rank_layout, run_schedule
from simulator.errors import TopologyError
from simulator.protocol import DEFAULT_PROTOCOLS, Calibration, parse_calibration
from simulator.topology import list_presets, load_topology, ring_graph
from simulator.validate import BUNDLED, validate_folder


def ring_run(graph, n, protocol):
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), float(n))
    return run_schedule(graph, schedule, protocol=protocol)


@pytest.mark.parametrize("name", ["LL", "LL128", "Simple"])
def test_protocol_closed_form_on_a_ring(name):
    """p = 8 ring of 100 GB/s links with 0.1 us propagation, launch 2 us. Each of the
    2(p-1) steps moves n/p data bytes as n/(p f) wire bytes (f the protocol's bandwidth
    factor) and costs the protocol's NVLink hop latency h instead of 0.1 us:
    T = launch + base + 2(p-1)(h + n/(p f B))."""
    p, b, n = 8, 100e9, 8e6
    graph = ring_graph(p, b, 0.1e-6)
    graph.graph["nccl"] = Calibration(launch_s=2e-6)
    proto = DEFAULT_PROTOCOLS[name]
    expected = (
        2e-6 + proto.base_s + 2 * (p - 1) * (proto.hop_s["nvlink"] + n / (p * proto.bandwidth * b))
    )
    assert ring_run(graph, n, name).time_s == pytest.approx(expected, rel=1e-9)


def test_link_efficiency_scales_the_ring_bound():
    """dgx-a100's NVLink runs at 0.8 of 300 GB/s with a protocol: busbw tends to 240."""
    graph = load_topology("dgx-a100")
    assert ring_run(graph, 4 * 2**30, "Simple").busbw_GBps == pytest.approx(240, rel=2e-3)
    assert ring_run(graph, 4 * 2**30, None).busbw_GBps == pytest.approx(300, rel=2e-3)


def test_multi_node_steps_pay_the_network_hop():
    """As in NCCL's model, once a ring spans servers every step pays the network hop
    latency: 2 x dgx-a100, LL, 8 bytes: launch 3 us + base 6.6 + 30 x 2.7 us."""
    graph = load_topology("dgx-a100", nodes=2)
    time_us = ring_run(graph, 8, "LL").time_us
    assert time_us == pytest.approx(3 + 6.6 + 30 * 2.7, rel=1e-3)


@pytest.mark.parametrize("preset", [name for name, _ in list_presets()])
def test_protocol_crossovers(preset):
    """LL (lowest latency) wins for tiny messages; Simple (full bandwidth) for large."""
    graph = load_topology(preset)
    tiny = {name: ring_run(graph, 64, name).time_s for name in ("LL", "LL128", "Simple")}
    large = {name: ring_run(graph, 2**30, name).time_s for name in ("LL", "LL128", "Simple")}
    assert min(tiny, key=tiny.get) == "LL"
    assert min(large, key=large.get) == "Simple"
    assert ring_run(graph, 64, "auto").params["protocol"] == "LL"


def test_bad_calibration_sections():
    with pytest.raises(TopologyError, match="nccl.efficiency.nvlink"):
        parse_calibration({"efficiency": {"nvlink": 1.5}}, source="x.yaml")
    with pytest.raises(TopologyError, match="nccl.protocols.LL.hop.warp"):
        parse_calibration({"protocols": {"LL": {"hop": {"warp": "1us"}}}}, source="x.yaml")
    with pytest.raises(TopologyError, match="unknown key 'nccl.colour'"):
        parse_calibration({"colour": 1}, source="x.yaml")


def test_validate_reports_bad_cases_and_runs_the_others(tmp_path):
    shutil.copy(BUNDLED / "RTX5090-1N-AR-PCIe.csv", tmp_path / "good.csv")
    shutil.copy(BUNDLED / "RTX5090-1N-AR-PCIe.yaml", tmp_path / "good.yaml")
    (tmp_path / "broken.csv").write_text("bytes,time_us_oop,busbw_oop\n8,fast,0\n")
    shutil.copy(BUNDLED / "RTX5090-1N-AR-PCIe.yaml", tmp_path / "broken.yaml")
    (tmp_path / "ghost.csv").write_text("bytes,time_us_oop,busbw_oop\n8,1,0\n")
    (tmp_path / "ghost.yaml").write_text("preset: dgx-z900\n")
    results = {r.name: r for r in validate_folder(tmp_path)}
    assert "broken.csv:2" in results["broken"].error
    assert "dgx-z900" in results["ghost"].error and "dgx-a100" in results["ghost"].error
    good = results["good"]
    assert not good.error and len(good.sizes) == 25
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "validate", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "good" in done.stdout and "Traceback" not in done.stderr
    assert "broken, ghost" in done.stderr


def test_bundled_cases_run():
    """The three calibration cases simulate every measured size. The H100 ring case meets
    the issue's bar (median busbw error <= 10% for sizes >= 1 MiB); the other two do not
    yet (see ccsim validate), so only their running is checked."""
    results = validate_folder()
    assert [r.name for r in results] == [
        "A100-1N-AR-g8",
        "H100-2N-AR-ring-tuned",
        "RTX5090-1N-AR-PCIe",
    ]
    assert [len(r.sizes) for r in results] == [30, 14, 25]
    assert all(not r.error for r in results)
    assert results[1].summary()["busbw_median_pct"] <= 10.0
