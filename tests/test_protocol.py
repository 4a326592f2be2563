"""Protocol model (LL / LL128 / Simple), link efficiency and ccsim validate."""

import dataclasses
import shutil
import subprocess
import sys

import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.algorithms.builder import OpBuffer
from simulator.collective.replay import proxy_queue
from simulator.collective.run import rank_layout, run_schedule
from simulator.errors import CcsimError, TopologyError
from simulator.library.protocol import (
    DEFAULT_PROTOCOLS,
    PROXY_S,
    Calibration,
    calibration_of,
    parse_calibration,
)
from simulator.topology import list_presets, load_topology, ring_graph
from simulator.topology.stacks import TCPXO_FITTED_TO
from simulator.validate import BUNDLED, load_case, validate_folder
from simulator.validate.calibrate import fit_case, leave_one_case_out
from simulator.validate.nccl_tests import case_graph, run_case
from simulator.viz.tables import report_table


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
    """dgx-a100's NVLink runs at its calibrated share e of 300 GB/s with a protocol. A
    Simple ring: T = launch + base + 14 (hop + n/(8 e B)), every step paying the hop
    latency (above the links' 0.6 us); ideal: 14 (0.6 us + n/(8B))."""
    graph = load_topology("dgx-a100")
    cal = calibration_of(graph)
    simple, eff, n, b = cal.protocol("Simple"), cal.efficiency["nvlink"], 4 * 2**30, 300e9
    expected = cal.launch_s + simple.base_s + 14 * (simple.hop_s["nvlink"] + n / (8 * eff * b))
    assert ring_run(graph, n, "Simple").time_s == pytest.approx(expected, rel=1e-9)
    assert ring_run(graph, n, None).time_s == pytest.approx(14 * (0.6e-6 + n / (8 * b)), rel=1e-9)


def test_multi_node_steps_pay_their_own_hop():
    """As in NCCL v2.30's model (tuning.cc:393-413), a step inside a server pays the
    NVLink hop (at least the 1 us network post overhead once the ring spans servers) and
    a step across servers the network hop. 2 x dgx-a100, LL, 8 bytes, ring 0..15: step s
    of rank r waits for step s-1 of rank r-1, so the longest chain is 30 consecutive ring
    edges, 4 of them crossing servers: launch + 6.6 + 26 max(hop, 1 us) + 4 x 2.7 us."""
    graph = load_topology("dgx-a100", nodes=2)
    cal = calibration_of(graph)
    hop = max(cal.protocol("LL").hop_s["nvlink"] * 1e6, 1.0)
    time_us = ring_run(graph, 8, "LL").time_us
    assert time_us == pytest.approx(cal.launch_s * 1e6 + 6.6 + 26 * hop + 4 * 2.7, rel=1e-3)


def test_auto_picks_among_the_enabled_protocols_only():
    """NCCL enables LL128 only over NVLink: the PCIe box never picks it, even where it
    would be fastest if forced; NVLS, Simple only, never runs LL."""
    graph = load_topology("pcie-8gpu")
    assert calibration_of(graph).enabled() == ["LL", "Simple"]
    picked = {ring_run(graph, n, "auto").params["protocol"] for n in (64, 2**16, 2**22, 2**28)}
    assert picked == {"LL", "Simple"}
    assert ring_run(graph, 2**22, "LL128").params["protocol"] == "LL128"  # forced: runs
    a100 = load_topology("dgx-a100")
    assert calibration_of(a100).enabled() == ["LL", "LL128", "Simple"]


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
    with pytest.raises(TopologyError, match="nccl.protocols.LL128.enabled must be true"):
        parse_calibration({"protocols": {"LL128": {"enabled": "no"}}}, source="x.yaml")
    off = {name: {"enabled": False} for name in ("LL", "LL128", "Simple")}
    with pytest.raises(TopologyError, match="disables every protocol"):
        parse_calibration({"protocols": off}, source="x.yaml")


def test_fitted_constants_name_their_runs_and_keep_what_they_replaced():
    """A preset fitted to measured runs says which (fitted_to) and keeps the constants
    before the fit (unfitted), so a leave-one-case-out check can predict those runs."""
    cal = calibration_of(load_topology("dgx-a100"))
    assert cal.fitted_to == ("A100-1N-AR-g8",)
    assert cal.unfitted.efficiency["nvlink"] == 0.8  # NCCL's 20 of 25 GB/s
    assert cal.unfitted.protocols == DEFAULT_PROTOCOLS  # NCCL's latencies, not the fit's
    assert calibration_of(load_topology("dgx-h100")).fitted_to == ()
    with pytest.raises(TopologyError, match="unfitted goes with nccl.fitted_to"):
        parse_calibration({"unfitted": {"launch": "3us"}}, source="x.yaml")
    with pytest.raises(TopologyError, match="fitted_to must be a list"):
        parse_calibration({"fitted_to": "A100"}, source="x.yaml")


def test_leave_one_case_out_predicts_a_fitted_run_from_the_unfitted_constants():
    """RTX5090-1N-AR-PCIe is the only run of pcie-8gpu, and the preset was fitted to it:
    left out, nothing remains to fit on, so it is predicted with the preset's unfitted
    constants; the error tables mark it, and a run the preset never saw is its own
    prediction."""
    case = load_case(BUNDLED / "RTX5090-1N-AR-PCIe.yaml")
    other = load_case(BUNDLED / "H100-1N-AR-default-g8-partial.yaml")
    results = [run_case(case), run_case(other)]
    assert [r.fitted for r in results] == [True, False]
    assert results[0].summary()["loco_busbw_median_pct"] is None  # not computed yet
    leave_one_case_out([case, other], results)
    unfitted = calibration_of(load_topology("pcie-8gpu")).unfitted
    expected = run_case(case, calibration=unfitted)
    assert results[0].loco.simulated_us == expected.simulated_us
    assert results[0].loco.simulated_us != results[0].simulated_us
    assert "unfitted" in results[0].loco_source
    assert results[1].loco is None
    row = results[1].summary()
    assert row["loco_busbw_median_pct"] == row["busbw_median_pct"]
    table = report_table(results)
    assert "RTX5090-1N-AR-PCIe *" in table and "median over cases" in table


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


#: Issue 32's Google Cloud all-gather, reduce-scatter and all-to-all runs, which the tests
#: here do not read (tests/test_gather_across.py simulates them): left out of the fixture
#: below for its CPU time (~40 s).
ISSUE32_GOOGLE = ("-docs.", "-gke-a4x", "-a4x-pedia", "-gke-a3ultra")


@pytest.fixture(scope="module")
def bundled_results(tmp_path_factory):
    """Every bundled case the tests below read, simulated once (those across servers on
    Blackwell and H200, and the TCPXO runs, are read by tests of their own files)."""
    folder = tmp_path_factory.mktemp("bundled")
    elsewhere = (*ACROSS, *HOPPER_ACROSS, *TCPXO_FITTED_TO)
    for path in BUNDLED.iterdir():
        if (
            path.is_file()
            and not any(mark in path.name for mark in ISSUE32_GOOGLE)
            and not path.name.startswith(elsewhere)
        ):
            shutil.copy(path, folder / path.name)
    return validate_folder(folder)


def test_bundled_cases_are_predicted_within_the_measured_bar(bundled_results):
    """The eleven public nccl-tests runs, each size simulated as NCCL's tuning model
    decides (sidecars say algorithm: nccl where the run used NCCL's defaults). Only
    A100-1N-AR-g8 and RTX5090-1N-AR-PCIe were fitted (their presets' constants); the
    nine others are predictions. Over the cases, the median of the per-case median busbw
    error (sizes >= 1 MiB) is <= 10% and of the time error (<= 64 KiB) <= 20%; NVLS on
    one H100 server is within 6%; no case is off by more than 25% at the median."""
    results = [
        r
        for r in bundled_results
        if not r.name.startswith(BLACKWELL + ACROSS + HELD_OUT + HOPPER_ACROSS)
        and r.name not in TCPXO_FITTED_TO
    ]
    assert len(results) == 11 and all(not r.error for r in results)
    rows = {r.name: r.summary() for r in results}
    busbw = [row["busbw_median_pct"] for row in rows.values()]
    times = [row["time_median_pct"] for row in rows.values() if row["time_median_pct"]]
    assert float(np.median(busbw)) <= 10.0
    assert float(np.median(times)) <= 20.0
    assert max(busbw) <= 25.0
    assert rows["H100-1N-AR-default-g8-partial"]["busbw_median_pct"] <= 6.0
    nvls = next(r for r in results if r.name == "H100-1N-AR-default-g8-partial")
    assert set(nvls.algorithms) == {"NVLS"}


#: Single-server Hopper runs bundled for issue 32 (Hopper's NVLS thread-block constants
#: were chosen on their middle sizes): tested in test_hopper_nvls_runs_reach_their_plateau.
HELD_OUT = ("H100-1N-AR-dgxc", "H200-1N-AR-azure")
#: Hopper runs across servers bundled for issue 32 (all-gather on Google's A3 Ultra, never
#: fitted to; tested in tests/test_gather_across.py).
HOPPER_ACROSS = ("H200-2N-",)
#: Bundled Blackwell runs (B200 server, parts of a GB300 NVL72 rack): never fitted to.
BLACKWELL = ("B200-1N", "GB300-")
#: Bundled Blackwell runs across servers, on B300 and on GB200 (never fitted to; tested
#: in tests/test_blackwell_across.py).
ACROSS = ("B200-2N", "B300-", "GB200-")


def test_blackwell_cases_are_predicted_at_their_plateau(bundled_results):
    """The bundled Blackwell runs (B200 and GB300, all-reduce and all-to-all, 4-64 GPUs
    on NVLink5) are predictions from NCCL's own NVLink5 and NVLS figures (hgx-b200). At
    the two largest sizes (8 and 16 GiB), where bandwidth alone sets the time, each is
    within 11% of the measured busbw; all-reduce on 8 GPUs runs NVLS there, as NCCL does,
    and all-to-all runs NCCL's grouped send/receive (the nccl-p2p schedule). The middle
    sizes are far off (README) and are not held here. The 64-GPU all-reduce is held to
    13%: ccsim's NVLS reaches the links' bound there (1,011-1,026 GB/s busbw) where the
    rack measures 900-931 and is still rising at 16 GiB (README); it was within 11% only
    while ccsim's 32-chunk pipeline fill cost every NVLS call ~6%."""
    results = [r for r in bundled_results if r.name.startswith(BLACKWELL)]
    assert len(results) == 7 and all(not r.error for r in results)
    for result in results:
        measured = np.array(result.measured_busbw[-2:])
        simulated = np.array(result.simulated_busbw[-2:])
        assert result.sizes[-1] == 16 * 2**30
        bound = 0.13 if result.name == "GB300-16N-AR-oci-quickstart" else 0.11
        assert np.all(np.abs(simulated - measured) / measured <= bound), result.name
    by_name = {r.name: r for r in results}
    assert by_name["B200-1N-AR-Vultr"].algorithms[-1] == "NVLS"
    assert by_name["GB300-2N-A2A-oci-quickstart"].algorithms[-1] == "SendRecv"


def test_back_to_back_calls_cost_the_larger_of_host_and_gpus(tmp_path):
    """nccl-tests times back-to-back calls: with g GPUs per process the host issues g
    launches per call while the GPUs run the previous one, so a call costs
    max(g x launch, GPU time). On a 2-GPU ring of 100 GB/s, 1 us links, launch 10 us,
    LL (base 6.6, hop 0.6 < 1 us link): GPU time 6.6 + 2 (1 us + n/(2 x 0.25 x B)).
    8 bytes: host-bound (2 x 10 = 20 us); 4 MB: GPU-bound (6.6 + 2 + 160 = 168.6 us)."""
    preset = tmp_path / "pair.yaml"
    preset.write_text(
        "name: pair\nserver:\n  gpus: 2\n  links:\n"
        "    - {ends: [gpu0, gpu1], bandwidth: 100GB/s, latency: 1us, link: nvlink}\n"
        "nccl:\n  launch: 10us\n  protocols:\n    LL128: {enabled: false}\n"
        "    Simple: {enabled: false}\n"
    )
    (tmp_path / "pair-run.yaml").write_text(
        "preset: pair.yaml\nop: all_reduce\nalgorithm: ring\nprotocol: auto\ngpus_per_process: 2\n"
    )
    (tmp_path / "pair-run.csv").write_text(
        "bytes,time_us_oop,busbw_oop\n8,20,0\n4000000,168.6,23.7\n"
    )
    (result,) = validate_folder(tmp_path)
    assert not result.error
    assert result.simulated_us == pytest.approx([20.0, 6.6 + 2 + 160.0], rel=1e-9)
    assert result.protocols == ["LL", "LL"]


def test_validate_lets_the_tuner_pick_the_algorithm(tmp_path):
    """A run with the library's default algorithm (sidecar: algorithm auto) is simulated
    with the fastest algorithm per size. On a 4-GPU full mesh, 8 bytes go fastest
    one-shot: direct all-reduce takes 2 dependent steps, a ring 6, a tree 4 (2 x depth
    2), halving-doubling 4, each step paying the same per-hop latency."""
    preset = tmp_path / "mesh4.yaml"
    preset.write_text(
        "name: mesh4\nserver:\n  gpus: 4\n  intra: {kind: mesh, bandwidth: 100GB/s, latency: 1us}\n"
    )
    (tmp_path / "run.yaml").write_text("preset: mesh4.yaml\nalgorithm: auto\nchunks: auto\n")
    (tmp_path / "run.csv").write_text("bytes,time_us_oop,busbw_oop\n8,10,0\n64000000,900,1\n")
    (result,) = validate_folder(tmp_path)
    assert not result.error, result.error
    assert result.algorithms[0] == "direct"
    (tmp_path / "run.yaml").write_text("preset: mesh4.yaml\nchunks: 0\n")
    (bad,) = validate_folder(tmp_path)
    assert "run.yaml: chunks must be a positive integer or auto" in bad.error
    (tmp_path / "run.yaml").write_text("preset: mesh4.yaml\nalgorithm: auto\n")
    with pytest.raises(CcsimError, match="--fit needs the algorithm the run used"):
        fit_case(load_case(tmp_path / "run.yaml"))


def test_proxy_queue_serves_each_gpu_in_arrival_order():
    """Hand timeline: at t=0 rank 0 queues 1, 3 and 4 us of work and rank 1 queues 2 us;
    rank 0's requests follow each other (done at 1, 4, 8 us), rank 1's at 2 us. At t=5
    us rank 0 is still busy until 8 (done 9), rank 1 is free (done 6)."""
    free = np.zeros(2)
    done = proxy_queue(free, np.array([0, 1, 0, 0]), np.array([1.0, 2.0, 3.0, 4.0]), 0.0)
    assert done.tolist() == [1.0, 2.0, 4.0, 8.0]
    assert free.tolist() == [8.0, 2.0]
    assert proxy_queue(free, np.array([1, 0]), np.array([1.0, 1.0]), 5.0).tolist() == [6.0, 9.0]


def _sends(graph, count, nbytes, protocol):
    """``count`` transfers of ``nbytes`` from rank 0 to rank 1, all ready at once."""
    buffer = OpBuffer()
    buffer.add(0, 1, np.arange(count), float(nbytes), reduce=False, step=0)
    schedule = buffer.schedule(
        op="all_gather",
        algorithm="hand",
        ranks=2,
        size_bytes=count * nbytes,
        segment_owner=np.zeros(count, dtype=np.int32),
        params={},
    )
    return run_schedule(graph, schedule, protocol=protocol).time_s


@pytest.mark.parametrize("name", ["LL", "Simple"])
def test_network_sends_of_one_gpu_queue_on_its_proxy(name):
    """Two GPUs joined by one RDMA link. k transfers of 8 bytes leave rank 0 at once:
    its proxy posts them one after another (proxy_s each), so the last leaves
    (k - 1) proxy_s after the first; the first message's post is inside the network
    hop latency, so one transfer takes as long as with no proxy cost. Rank 1's proxy
    handles each completion as it arrives (8 bytes take far less than proxy_s to cross),
    and never falls behind."""
    graph = ring_graph(2, 100e9, 0.5e-6, link="rdma")
    proxy = 2e-6
    times = {}
    for proxy_s in (0.0, proxy):
        graph.graph["nccl"] = Calibration(proxy_s=proxy_s)
        times[proxy_s] = [_sends(graph, k, 8, name) for k in (1, 2, 3)]
    alone, paid = times[0.0][0], times[proxy]
    assert paid[0] == alone
    # Spaced by the proxy, each transfer crosses the link alone, as the first does.
    assert paid[1] == pytest.approx(alone + proxy, rel=1e-12)
    assert paid[2] == pytest.approx(alone + 2 * proxy, rel=1e-12)
    # With no proxy cost they leave together and share the link: longer than one alone.
    assert times[0.0][2] > alone


def test_a_proxy_that_keeps_up_leaves_the_ring_closed_form():
    """A ring of 4 GPUs over RDMA links, Simple, 1 us of proxy work per message: each
    step's one message is posted while the previous step's hop latency runs, so the
    proxy never delays a step and the ring keeps its closed form
    T = base + 2(p-1)(h + n/(p B)) (as test_protocol_closed_form_on_a_ring)."""
    p, b, n = 4, 25e9, 4e6
    graph = ring_graph(p, b, 0.1e-6, link="rdma")
    graph.graph["nccl"] = Calibration(proxy_s=1e-6)
    simple = DEFAULT_PROTOCOLS["Simple"]
    expected = simple.base_s + 2 * (p - 1) * (simple.hop_s["network"] + n / (p * b))
    assert ring_run(graph, n, "Simple").time_s == pytest.approx(expected, rel=1e-9)


def test_a_preset_may_set_its_proxy_cost():
    """nccl.proxy is a time like the others; it reaches every protocol."""
    cal = parse_calibration({"proxy": "2.5us"}, source="x.yaml")
    assert cal.protocol("LL128").proxy_s == pytest.approx(2.5e-6)
    assert parse_calibration({}, source="x.yaml").proxy_s == PROXY_S
    with pytest.raises(TopologyError, match="nccl.proxy"):
        parse_calibration({"proxy": "fast"}, source="x.yaml")


def test_leave_one_case_out_chooses_the_proxy_cost_on_the_other_runs():
    """Two runs the proxy cost was fitted to, cut to two middle sizes, whose
    'measurements' are made to be exactly what ccsim simulates with no proxy cost (the
    A100 run) and with 1 us (the H100 run). Left out, each is predicted with the value
    the other one prefers: the A100 run with 1 us, the H100 run with none."""
    sizes = [2**22, 2**24]

    def made(name, proxy_s):
        case = load_case(BUNDLED / f"{name}.yaml")
        case = dataclasses.replace(case, measured=[m for m in case.measured if m[0] in sizes])
        cal = calibration_of(case_graph(case))
        truth = run_case(case, calibration=dataclasses.replace(cal, proxy_s=proxy_s))
        measured = list(zip(truth.sizes, truth.simulated_us, truth.simulated_busbw, strict=True))
        return dataclasses.replace(case, measured=measured), cal

    (a100, cal_a), (h100, cal_h) = (
        made("A100-2N-AR-default-roce", 0.0),
        made("H100-2N-AR-default-XE9680", 1e-6),
    )
    results = [run_case(a100), run_case(h100)]
    assert all(r.fitted for r in results)
    leave_one_case_out([a100, h100], results, proxy_grid=(0.0, 1e-6))
    with_proxy = run_case(a100, calibration=dataclasses.replace(cal_a, proxy_s=1e-6))
    assert results[0].loco.simulated_us == with_proxy.simulated_us
    assert (
        results[1].loco.simulated_us
        == run_case(h100, calibration=dataclasses.replace(cal_h, proxy_s=0.0)).simulated_us
    )
    assert with_proxy.simulated_us != [us for _, us, _ in a100.measured]  # it matters
    assert "network proxy 1 us, chosen on H100-2N-AR-default-XE9680" in results[0].loco_source


def test_hopper_nvls_runs_reach_their_plateau(bundled_results):
    """Two public single-server runs (NVIDIA's dgxc-benchmarking sample on a DGX H100,
    Azure's ND H200 v5 with NCCL_ALGO=NVLS and one process driving the 8 GPUs; Hopper's
    NVLS thread-block constants were chosen on their middle sizes, which do not bind
    here): at 4-16 GiB NVLS is bound by the links, 2 (p - 1)
    / (p + 1) x 450 GB/s x 0.686 = 480.2 GB/s busbw (dgx-h100's NVLS share, from
    NVIDIA's ~480 GB/s), and both runs measure 477-480: within 2% at every such size.
    Both run NVLS there, as NCCL does (forced on H200)."""
    results = {r.name: r for r in bundled_results if r.name.startswith(HELD_OUT)}
    assert sorted(results) == ["H100-1N-AR-dgxc", "H200-1N-AR-azure-nvls"]
    for name, result in results.items():
        assert not result.error, result.error
        sizes = np.array(result.sizes)
        big = sizes >= 4 * 2**30
        assert big.sum() >= 2
        measured = np.array(result.measured_busbw)[big]
        simulated = np.array(result.simulated_busbw)[big]
        assert np.all(np.abs(simulated - measured) / measured <= 0.02), name
        assert simulated == pytest.approx(2 * 7 / 9 * 450 * 0.686, rel=0.02)
        assert {result.algorithms[i] for i in np.flatnonzero(big)} == {"NVLS"}
