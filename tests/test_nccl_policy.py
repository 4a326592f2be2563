"""NCCL's own decision (simulator.library.nccl), pinned against its tuning formulas worked
by hand from NCCL v2.30.7's source (src/graph/tuning.cc, src/enqueue.cc; file:line in
simulator/library/nccl.py), and the ``nccl`` policy that simulates that decision."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.algorithms import build_schedule, get_algorithm
from simulator.cli import main
from simulator.collective import NcclPolicy, rank_layout, run_schedule, simulate_collective
from simulator.collective.policy import protocol_model
from simulator.errors import CcsimError
from simulator.library.nccl import nccl_choice, nccl_system, predicted_time_us
from simulator.library.protocol import calibration_of
from simulator.topology import load_topology


@pytest.fixture(scope="module")
def a100():
    return nccl_system(load_topology("dgx-a100"))


@pytest.fixture(scope="module")
def h100x2():
    return nccl_system(load_topology("dgx-h100", 2))


def test_search_reproduces_the_channel_counts_of_public_logs(a100, h100x2):
    """DGX A100: 12 NVLinks x 20 GB/s (NCCL's SM80 figure) = 240 GB/s; the first speed
    of the intra array, 40, fits 6 rings, duplicated to 12 x 20 (search.cc:1036-1049);
    run on 2 x 12 = 24 channels (connect.cc:460; 'Channel 23/24' in nccl-tests#100).
    Two DGX H100: one ring per NIC at min(PCIe Gen5 48, NDR 50) = 48 GB/s, 8 rings, no
    duplication above 4 channels on Hopper, run on 16 ('Channel 13/16' in nccl#1453)."""
    assert (a100.ring.channels, a100.ring.bw_intra, a100.channels) == (12, 20.0, 24)
    assert (h100x2.ring.channels, h100x2.ring.bw_inter, h100x2.channels) == (8, 48.0, 16)
    # NVLS: 9 x 40 GB/s <= 18 x 20.6 = 370.8 GB/s per GPU (one head per GPU).
    assert (h100x2.nvls.channels, h100x2.nvls.bw_intra, h100x2.nvls.bw_inter) == (8, 40.0, 48.0)
    assert h100x2.nvls_channels == 16 and a100.nvls is None


def test_a100_large_all_reduce_is_the_simple_ring(a100):
    size = 2**28
    # Ring Simple: 8.4 + 14 x 3.4 us; 12 x 20 GB/s bus x 8/14 to algorithm bandwidth.
    ring_simple = 8.4 + 14 * 3.4 + size / (1000 * 240 * 8 / 14)
    # Ring LL128: 14 + 14 x 1.9; min(240 x 0.92, 12 x 20) x 8/14.
    ring_ll128 = 14.0 + 14 * 1.9 + size / (1000 * 220.8 * 8 / 14)
    # Tree Simple: 8.4 + 2 x 7 x 4.0; min(0.92 x 240, 12 x 24) x 0.5 x correction 0.9.
    tree_simple = 8.4 + 2 * 7 * 4.0 + size / (1000 * 220.8 * 0.5 * 0.9)
    assert predicted_time_us(a100, "all_reduce", size, "Ring", "Simple") == pytest.approx(
        ring_simple, rel=1e-12
    )
    assert predicted_time_us(a100, "all_reduce", size, "Ring", "LL128") == pytest.approx(
        ring_ll128, rel=1e-12
    )
    assert predicted_time_us(a100, "all_reduce", size, "Tree", "Simple") == pytest.approx(
        tree_simple, rel=1e-12
    )
    choice = nccl_choice(a100, "all_reduce", size)
    # 2^28 >= 24 channels x 512 threads x 64 B: every channel stays (enqueue.cc:2091-2097).
    assert (choice.algorithm, choice.protocol, choice.channels) == ("Ring", "Simple", 24)
    assert choice.time_us == pytest.approx(ring_simple, rel=1e-12)


def test_a100_tiny_all_reduce_is_ll_on_one_channel_of_96_threads(a100):
    """8 B: Ring LL 6.6 + 14 x 0.6 = 15.0 us beats Tree LL 6.8 + 2 x 7 x 0.6 = 15.2 us;
    8 < nc x 512 x (8 x 8 ranks) drops channels to 1 and threads to 64, raised to 96."""
    choice = nccl_choice(a100, "all_reduce", 8)
    assert (choice.algorithm, choice.protocol, choice.channels, choice.threads) == (
        "Ring",
        "LL",
        1,
        96,
    )
    assert choice.time_us == pytest.approx(15.0 + 8 / (1000 * 87.7 * 8 / 14), rel=1e-12)


def test_a100_mid_sizes_switch_protocols_where_the_formulas_cross(a100):
    """Ring LL (15.0 us, 87.7 x 8/14 GB/s) against LL128 (40.6 us, 220.8 x 8/14): equal at
    n = 25.6 us / (1/50.11 - 1/126.17) GB/s = 2.13 MB; LL128 against Simple (56.0 us,
    137.1 GB/s) at n = 15.4 us / (1/126.17 - 1/137.14) = 24.3 MB."""
    got = {size: nccl_choice(a100, "all_reduce", size).protocol for size in (2**21, 2**22)}
    assert got == {2**21: "LL", 2**22: "LL128"}
    got = {size: nccl_choice(a100, "all_reduce", size).protocol for size in (2**24, 2**25)}
    assert got == {2**24: "LL128", 2**25: "Simple"}


def test_h100_one_server_runs_nvls_from_a_few_mib():
    system = nccl_system(load_topology("dgx-h100"))
    size = 2**30
    # NVLS: 40 x 0.85 x 7/8 x 2 (all-reduce) = 59.5 per channel, x 8 = 476 bus, x 8/14;
    # latency the NVLink NVLS figure, 25 us (tuning.cc:424-426).
    nvls = 25.0 + size / (1000 * 476 * 8 / 14)
    choice = nccl_choice(system, "all_reduce", size)
    assert (choice.algorithm, choice.protocol, choice.channels) == ("NVLS", "Simple", 16)
    assert choice.time_us == pytest.approx(nvls, rel=1e-12)
    assert nccl_choice(system, "all_reduce", 2**10).algorithm == "Ring"


def test_two_h100_servers_pick_nvls_tree_over_the_plateaued_ring(h100x2):
    size = 2**34
    # NVLSTree: min(59.5, 2 x 48, cap 57.7) x 8 channels x 16/30; 25 + 2 x 1 x 20.9 us.
    nvls_tree = 25.0 + 2 * 20.9 + size / (1000 * 8 * 57.7 * 16 / 30)
    # Ring Simple: 8.4 + 28 x max(3.4, 3 x 1.0) + 2 x 14 us, x 1.4 for the ring plateau.
    ring = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4 + size / (1000 * 8 * 48 * 16 / 30)
    assert predicted_time_us(h100x2, "all_reduce", size, "Ring", "Simple") == pytest.approx(ring)
    choice = nccl_choice(h100x2, "all_reduce", size)
    assert (choice.algorithm, choice.channels) == ("NVLSTree", 16)
    assert choice.time_us == pytest.approx(nvls_tree, rel=1e-12)


def test_two_servers_small_all_reduce_is_the_tree():
    """Tree LL: 6.8 + 2 (7 x 0.6 + log2(2) x 5.0) = 25.2 us; Ring LL: 6.6 + 28 x
    max(0.6, 1.0 net overhead) + 2 x 2.7 = 40.0 us."""
    system = nccl_system(load_topology("dgx-a100", 2))
    assert predicted_time_us(system, "all_reduce", 0, "Tree", "LL") == pytest.approx(25.2)
    assert predicted_time_us(system, "all_reduce", 0, "Ring", "LL") == pytest.approx(40.0)
    assert nccl_choice(system, "all_reduce", 8).algorithm == "Tree"


def test_pcie_box_never_runs_ll128():
    system = nccl_system(load_topology("pcie-8gpu"))
    choice = nccl_choice(system, "all_reduce", 2**24)
    assert not any(protocol == "LL128" for _, protocol in choice.table)
    assert choice.protocol in ("LL", "Simple")


def test_all_gather_has_no_tree_and_all_to_all_is_not_tuned(a100):
    choice = nccl_choice(a100, "all_gather", 2**26)
    assert {algorithm for algorithm, _ in choice.table} == {"Ring"}
    with pytest.raises(CcsimError, match="send/receive"):
        nccl_choice(a100, "all_to_all", 2**20)


def test_policy_runs_exactly_the_chosen_schedule():
    graph = load_topology("dgx-a100")
    policy = NcclPolicy()
    result = policy.simulate(graph, "all_reduce", 2**30)
    assert result.params["nccl_algorithm"] == "Ring" and result.params["protocol"] == "Simple"
    schedule = build_schedule(
        "ring",
        "all_reduce",
        rank_layout(graph),
        2**30,
        chunks=result.params["chunks"],
        channels=result.params["channels"],
    )
    assert run_schedule(graph, schedule, protocol="Simple").time_s == result.time_s
    assert simulate_collective(graph, "all_reduce", 2**30, "nccl").time_s == result.time_s


def test_tree_runs_with_nccl_s_tree_latencies_and_middle_size_correction():
    """NCCL's latency table (tuning.cc:157-175, v2.30.7) charges a Tree step over the
    network 8.5 us with LL128 where a Ring step costs 4.0, and over NVLink 1.25 against
    1.9; its treeCorrectionFactor (tuning.cc:620-655) gives the Tree LL128 all-reduce
    0.6 of its bandwidth at 1 MiB (log2(2^20 / 64) = 14). The policy's Tree call runs
    with the preset's (ring) constants scaled so; a Ring call with them unchanged."""
    graph = load_topology("dgx-h100", 2)
    policy = NcclPolicy()
    _, protocol, params = policy.schedule(graph, "all_reduce", 2**20)
    assert (params["nccl_algorithm"], protocol) == ("Tree", "LL128")
    model = protocol_model(graph, protocol, params)
    ring = calibration_of(graph).protocol("LL128")
    assert model.bandwidth == pytest.approx(ring.bandwidth * 0.6, rel=1e-12)
    assert model.hop_s["network"] == pytest.approx(ring.hop_s["network"] * 8.5 / 4.0)
    assert model.hop_s["nvlink"] == pytest.approx(ring.hop_s["nvlink"] * 1.25 / 1.9)
    _, protocol, params = NcclPolicy(algorithms=["Ring"]).schedule(graph, "all_reduce", 2**20)
    model = protocol_model(graph, protocol, params)
    assert (model.hop_s, model.bandwidth) == (ring.hop_s, ring.bandwidth)


def test_a_small_tree_call_across_servers_takes_nccl_s_tree_latency():
    """NCCL's tree latency (tuning.cc:384-435, v2.30.7) is base + 2((g - 1) intra +
    log2(nodes) inter) with g GPUs per server, and unlike its ring's it does not raise
    the NVLink step to the 1 us network post overhead. 8 bytes on 2x dgx-h100 run Tree
    LL on one channel: 7 NVLink steps up the chain in each server (0.6 us each), one
    network step (NCCL's Tree LL entry, 5.0 us), and the same back down: 6.6 + 2 (7 x 0.6
    + 5.0) = 25.0 us after launch (NCCL's model: 25.2 with its 6.8 us Tree base; the
    XE9680 run measured 24.7)."""
    graph = load_topology("dgx-h100", 2)
    result = NcclPolicy().simulate(graph, "all_reduce", 8.0)
    assert (result.params["nccl_algorithm"], result.params["protocol"]) == ("Tree", "LL")
    cal = calibration_of(graph)
    ll = cal.protocol("LL")
    expected = cal.launch_s + ll.base_s + 2 * (7 * ll.hop_s["nvlink"] + 5.0e-6)
    assert result.time_s == pytest.approx(expected, rel=1e-3)  # bytes' time: < 1e-3
    assert ll.hop_s["nvlink"] < 1e-6  # so the ring's 1 us floor would have applied


def test_one_ll_channel_moves_data_at_nccl_s_per_channel_rate():
    """A channel's LL copy is one thread block polling flags: NCCL's model gives it the
    search graph's per-channel bandwidth over 3.8 for Tree (tuning.cc:305-383, v2.30.7;
    48 GB/s per channel on 2x dgx-h100), and a tree hop carries half of it (Tree's
    algorithm bandwidth is half its bus bandwidth): 6.3 GB/s. 4 KiB on one channel runs
    as two trees of 2 KiB, each hop no faster than that, on the 16-hop path of the test
    above: 6.6 + 2 (7 x 0.6 + 5.0) + 16 x 2048 B / 6.3 GB/s = 30.2 us after launch (the
    XE9680 run measured 29.7; 24.7 at 8 B)."""
    graph = load_topology("dgx-h100", 2)
    result = NcclPolicy().simulate(graph, "all_reduce", 4096.0)
    assert (result.params["nccl_algorithm"], result.params["channels"]) == ("Tree", 1)
    rate = 48e9 / 3.8 / 2
    cal = calibration_of(graph)
    ll = cal.protocol("LL")
    expected = cal.launch_s + ll.base_s + 2 * (7 * ll.hop_s["nvlink"] + 5.0e-6) + 16 * 2048 / rate
    assert result.time_s == pytest.approx(expected, rel=1e-9)


def test_nvls_tree_pipelines_in_nccl_s_loops():
    """NVLSTree on 4 servers of 8 with 16 channels: NCCL's loop is channels x heads x
    chunk = 16 x 8 x 128 KiB = 16 MiB (enqueue.cc:2276-2285, 2322-2369), so 64 MiB takes
    4 loops; at 4 MiB (< 1 x ops x 128 KiB) the chunk is capped at 32 KiB: 4 MiB / (16 x
    8 x 32 KiB) = 1 loop."""
    graph = load_topology("dgx-h100", 4)
    for size, chunks in ((2**26, 4), (2**22, 1)):
        _, _, params = NcclPolicy(algorithms=["NVLSTree"]).schedule(graph, "all_reduce", size)
        assert (params["nccl_algorithm"], params["channels"]) == ("NVLSTree", 16)
        assert params["chunks"] == chunks


def test_forcing_a_protocol_is_nccl_proto():
    graph = load_topology("dgx-a100")
    assert NcclPolicy(protocol="Simple").choose(graph, "all_reduce", 8).protocol == "Simple"
    with pytest.raises(CcsimError, match="protocol"):
        NcclPolicy(protocol="LL256")


def test_the_command_line_default_is_nccl(capsys):
    assert main(["collective", "all_reduce", "--sizes", "8,256M"]) == 0
    out = capsys.readouterr().out
    assert "algorithm nccl" in out
    assert "#           8  Ring LL channels 1" in out
    assert "#   268435456  Ring Simple channels 24" in out


@pytest.mark.parametrize(("algorithm", "nodes"), [("nvls", 1), ("nvls", 2), ("nvls-tree", 2)])
def test_nvls_channels_are_copies_on_the_same_links(algorithm, nodes):
    """The policy and the tuner simulate NCCL's 16 NVLS / NVLS-tree channels as one: same
    bytes on the same links, so the same time (what lets them skip 15/16 of the flows).
    Not so for the network proxy, which sees 16 smaller messages where one channel has
    one: compared without its cost."""
    assert get_algorithm(algorithm).channels_are_copies
    graph = load_topology("dgx-h100", nodes=nodes)
    graph.graph["nccl"] = dataclasses.replace(calibration_of(graph), proxy_s=0.0)
    times = [
        simulate_collective(
            graph,
            "all_reduce",
            2**28,
            algorithm,
            channels=c,
            chunks=8,
            protocol="Simple",
        ).time_s
        for c in (1, 16)
    ]
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_validate_detail_lists_every_size_with_nccl_s_choice(tmp_path, capsys):
    """`ccsim validate --detail` prints, per size, what ran: on the RTX 5090 PCIe box
    NCCL never runs LL128 (no NVLink), so every row is LL or Simple on the ring."""
    import json
    import shutil

    from simulator.validate import BUNDLED

    for suffix in (".csv", ".yaml"):
        shutil.copy(BUNDLED / f"RTX5090-1N-AR-PCIe{suffix}", tmp_path / f"rtx{suffix}")
    assert main(["validate", "--data", str(tmp_path), "--detail", "--format", "json"]) == 0
    (case,) = json.loads(capsys.readouterr().out)
    measured = (tmp_path / "rtx.csv").read_text().strip().splitlines()[1:]
    assert [row["size_bytes"] for row in case["sizes"]] == [
        int(line.split(",")[0]) for line in measured
    ]
    assert {(row["algorithm"], row["protocol"]) for row in case["sizes"]} <= {
        ("Ring", "LL"),
        ("Ring", "Simple"),
    }


def test_ring_channel_rate_is_nccl_s_bandwidth_over_its_channels():
    """NCCL's Ring LL128 bus bandwidth is graph channels x min(0.92 bw, perChMaxRingLL128Bw)
    (tuning.cc:280 at v2.27.3-1) and runs on twice the graph's channels (connect.cc:452):
    two HGX B200 servers, 8 graph channels of 48 GB/s, cap 40 (v2.30.7): 8 x 40 / 16 =
    20 GB/s a channel; two DGX H100, cap 36.7: 8 x 36.7 / 16 = 18.35 GB/s; one server:
    no bound (unchanged)."""
    from simulator.library.nccl import ring_channel_rate

    b200 = nccl_system(load_topology("hgx-b200", 2))
    assert (b200.ring.channels, b200.ring.bw_intra, b200.channels) == (8, 48.0, 16)
    assert ring_channel_rate(b200, "LL128") == pytest.approx(20e9, rel=1e-12)
    h100 = nccl_system(load_topology("dgx-h100", 2))
    assert ring_channel_rate(h100, "LL128") == pytest.approx(8 * 36.7e9 / 16, rel=1e-12)
    assert ring_channel_rate(nccl_system(load_topology("hgx-b200", 1)), "LL128") == float("inf")
    # Simple: graph channels x bw (tuning.cc:266-274), 8 x 48 / 16 = 24 GB/s; LL has its own.
    assert ring_channel_rate(b200, "Simple") == pytest.approx(24e9, rel=1e-12)
    assert ring_channel_rate(b200, "LL") == float("inf")


def test_cross_server_ll128_ring_hops_run_in_series_at_the_channel_rate():
    """All-gather on 2 x 8 B200 at 16 and 32 MiB runs Ring LL128 on 16 channels; each
    rank's slice is one step a hop (64 and 128 KiB, below LL128's 576,000 B step), so a
    channel's 15 steps run one after another and doubling the size adds 15 x 64 KiB at
    20 GB/s = 49.15 us (hand-worked from NCCL's figures above; ccsim gave 30.9 us before
    the rate, the links' bandwidth only)."""
    graph = load_topology("hgx-b200", 2)
    times = {}
    for size in (2**24, 2**25):
        result = NcclPolicy().simulate(graph, "all_gather", float(size))
        assert (result.params["nccl_algorithm"], result.params["protocol"]) == ("Ring", "LL128")
        assert result.params["channels"] == 16
        times[size] = result.time_s
    assert times[2**25] - times[2**24] == pytest.approx(15 * 65536 / 20e9, rel=0.01)


def test_cross_server_simple_ring_steps_of_one_slice_run_in_series():
    """At 64 MiB the same all-gather runs Ring Simple with 256 KiB per rank and channel,
    less than one slice (2 x 512 KiB, RING_SLICE_STEPS): one message a hop, the 15 hops in
    series at 24 GB/s. Hand-worked: launch 3 + base 8.4 + 15 steps of (hop + 256 KiB /
    24 GB/s = 10.92 us), 13 of them over NVLink (3.4 us) and at most 2 over the network
    (14 us, and 1 us of proxy each): between 226.2 and 249.4 us (ccsim gave 186.7 before,
    the links' bandwidth only; the measured B200 runs took 490 us)."""
    graph = load_topology("hgx-b200", 2)
    result = NcclPolicy().simulate(graph, "all_gather", float(2**26))
    assert (result.params["nccl_algorithm"], result.params["protocol"]) == ("Ring", "Simple")
    assert (result.params["channels"], result.params["chunks"]) == (16, 1)
    assert result.params["channel_rate"] == pytest.approx(24e9, rel=1e-12)
    cal = calibration_of(graph)
    simple = cal.protocol("Simple")
    assert (simple.hop_s["nvlink"], simple.hop_s["network"]) == (3.4e-6, 14e-6)
    step = 2**18 / 24e9
    floor = cal.launch_s + simple.base_s
    low = floor + 15 * (simple.hop_s["nvlink"] + step)
    high = floor + 13 * (simple.hop_s["nvlink"] + step) + 2 * (simple.hop_s["network"] + step)
    assert low <= result.time_s <= high + 2 * cal.proxy_s
