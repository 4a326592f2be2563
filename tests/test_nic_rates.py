"""Measured rates of single NICs and links (issue 32, item 4): ``--nic-rate``, a rates
file, or a preset's ``rates`` section give one NIC (or link) of one server its own rate,
as ``ib_write_bw`` measures it. A ring is as fast as its slowest NIC; NCCL's choice keeps
the port speed it reads; a server with a slower NIC is not a shifted copy of the others.
"""

from __future__ import annotations

import pytest
import simpy
import yaml

from simulator import simulate_collective
from simulator.algorithms import build_schedule
from simulator.cli import main
from simulator.collective.replay import reduce_bandwidths
from simulator.collective.run import find_symmetry, rank_layout
from simulator.errors import TopologyError
from simulator.library.nccl import nccl_system
from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology
from simulator.topology.rates import apply_rates, parse_rates
from simulator.topology.symmetry import server_shift

GIB = 2**30


def _preset(tmp_path, nic="45GB/s", extra=None, name="even-nics"):
    """An 8-GPU NVSwitch server, one 45 GB/s NIC per GPU, no latencies (the closed form is
    the bandwidth term alone), no library constants (efficiency 1)."""
    spec = {
        "name": name,
        "server": {
            "gpus": 8,
            "gpu": {"model": "B200-SXM-180GB"},
            "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "900GB/s"},
            "nic": {"bandwidth": nic},
        },
        "fabric": {"type": "rail-optimized", "latency": "0us"},
        **(extra or {}),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _ring_all_gather(graph, channels=8):
    return simulate_collective(graph, "all_gather", GIB, "ring", channels=channels, chunks=1)


def test_one_slow_nic_of_one_server_sets_the_ring(tmp_path):
    """4 servers x 8 GPUs, every NIC at 45 GB/s but NIC 3 of server 2 at 40: each of the 8
    channels' rings crosses every server, so all wait for the channel through s2/nic3.
    Closed form (p - 1)/p x n / (C x B_slowest) = 31/32 x 1 GiB / (8 x 40e9) = 3.2506 ms;
    healthy, the same with 45 GB/s (ratio 45/40 exactly)."""
    healthy = load_topology(_preset(tmp_path), 4)
    slow = load_topology(_preset(tmp_path), 4, rates="s2/nic3=40GB/s")
    p, channels = 32, 8
    assert _ring_all_gather(slow).time_s == pytest.approx(
        (p - 1) / p * GIB / (channels * 40e9), rel=1e-9
    )
    assert _ring_all_gather(healthy).time_s == pytest.approx(
        (p - 1) / p * GIB / (channels * 45e9), rel=1e-9
    )


def _symmetry(graph):
    """The rank shift the runner would simulate the ring all-gather's quotient under
    (None: every flow is simulated)."""
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), GIB, channels=8, chunks=1)
    network = FlowNetwork(simpy.Environment(), graph)
    found = find_symmetry(network, schedule, reduce_bandwidths(graph))
    return None if found is None else found[0].period


def test_a_slower_server_breaks_the_server_symmetry(tmp_path):
    """The healthy cluster repeats every server (shift 8 ranks; one server's flows stand
    for all); with one slow NIC no shift maps the network onto itself. The slow run's
    time is the closed form above, so it is simulated flow by flow correctly."""
    healthy = load_topology(_preset(tmp_path), 4)
    slow = load_topology(_preset(tmp_path), 4, rates="s2/nic3=40GB/s")
    assert server_shift(healthy, 1) is not None and _symmetry(healthy) == 8
    assert server_shift(slow, 1) is None and _symmetry(slow) is None


def test_one_link_can_be_given(tmp_path):
    """The link from s1/nic5 to its leaf at 30 GB/s: the ring through it runs at 30."""
    graph = load_topology(_preset(tmp_path), 2, rates=["s1/nic5-leaf5=30GB/s"])
    assert graph.edges["s1/nic5", "leaf5"]["bandwidth"] == 30e9
    assert graph.edges["s1/gpu5", "s1/nic5"]["bandwidth"] == 45e9  # the NIC's other link
    assert _ring_all_gather(graph).time_s == pytest.approx(15 / 16 * GIB / (8 * 30e9), rel=1e-9)


def test_a_measured_rate_is_what_the_calibrated_model_delivers(tmp_path):
    """Links carry line rates that the protocol model scales by ``nccl.efficiency``; a
    measured 40 GB/s on an rdma link of efficiency 0.96 is stored as 40/0.96 GB/s, so the
    calibrated model delivers 40 (and a PCIe attach at 63 GB/s x 0.76 = 47.9 > 40 is
    capped to deliver 40 too)."""
    extra = {"nccl": {"efficiency": {"rdma": 0.96, "pcie": 0.76}}}
    path = _preset(tmp_path, extra=extra, name="calibrated")
    spec = yaml.safe_load(path.read_text())
    spec["server"]["nic"]["pcie"] = {"bandwidth": "63GB/s"}
    path.write_text(yaml.safe_dump(spec))
    graph = load_topology(path, 2, rates="s0/nic1=40GB/s")
    assert graph.edges["s0/nic1", "leaf1"]["bandwidth"] == pytest.approx(40e9 / 0.96)
    assert graph.edges["s0/gpu1", "s0/nic1"]["bandwidth"] == pytest.approx(40e9 / 0.76)
    assert graph.nodes["s0/nic1"]["measured"] == 40e9
    assert graph.nodes["s0/nic1"]["port_bandwidth"] == 45e9
    # Untouched NICs keep the preset's line rate.
    assert graph.edges["s1/nic1", "leaf1"]["bandwidth"] == 45e9


def test_nccl_sees_the_port_speed_and_the_slowest_server(tmp_path):
    """NCCL reads port speeds (ibv_query_port), so a measured rate leaves its search
    alone; when a server's ports are slower, every rank keeps the least channels and
    speeds any rank found (init.cc:1439-1442): the same search as a cluster whose NICs
    are all that slow."""
    healthy = load_topology("hgx-b200", 2)
    measured = load_topology("hgx-b200", 2, rates="s1/nic0=40GB/s,s1/nic1=40GB/s")
    assert nccl_system(measured) == nccl_system(healthy)
    # Server 1's ports at 200 Gb/s (a NIC trained at half speed), server 0 at 400.
    mixed = healthy.copy()
    for j in range(8):
        mixed.nodes[f"s1/nic{j}"]["bandwidth"] = 25e9
    slow_path = tmp_path / "slow.yaml"
    data = yaml.safe_load(_preset_path("hgx-b200").read_text())
    data["server"]["nic"]["bandwidth"] = "200Gbps"
    slow_path.write_text(yaml.safe_dump(data))
    slow = nccl_system(load_topology(slow_path, 2))
    assert nccl_system(mixed).ring == slow.ring
    assert nccl_system(mixed).ring != nccl_system(healthy).ring
    # The same with the slow server first (the search is not rank 0's alone).
    swapped = healthy.copy()
    for j in range(8):
        swapped.nodes[f"s0/nic{j}"]["bandwidth"] = 25e9
    assert nccl_system(swapped).ring == slow.ring


def _preset_path(name):
    from simulator.topology.presets import preset_files

    return preset_files()[name]


def test_a_rates_file_and_a_preset_section(tmp_path):
    rates = tmp_path / "rates.yaml"
    rates.write_text(yaml.safe_dump({"rates": {"s0/nic0": "40GB/s", "s1/nic7": "320Gbps"}}))
    assert parse_rates(str(rates)) == {"s0/nic0": 40e9, "s1/nic7": 40e9}
    path = _preset(tmp_path, extra={"rates": {"s1/nic2": "41GB/s"}}, name="with-rates")
    graph = load_topology(path, 2)
    assert graph.edges["s1/nic2", "leaf2"]["bandwidth"] == 41e9
    # The command line's rates come on top of the preset's.
    graph = load_topology(path, 2, rates=str(rates))
    assert graph.edges["s1/nic2", "leaf2"]["bandwidth"] == 41e9
    assert graph.edges["s0/nic0", "leaf0"]["bandwidth"] == 40e9


def test_the_healthy_graph_is_returned_untouched(tmp_path):
    graph = load_topology(_preset(tmp_path), 2)
    assert apply_rates(graph, {}) is graph
    apply_rates(graph, {"s0/nic0": 1e9})
    assert graph.nodes["s0/nic0"]["bandwidth"] == 45e9  # a copy was changed, not the input


@pytest.mark.parametrize(
    ("rates", "needle"),
    [
        ("s2/nic0=40GB/s", "--nic-rate: no NIC or link 's2/nic0'"),
        ("s0/nic0=40", "the rate of s0/nic0 is '40' with no unit"),
        ("s0/nic0", "expected NAME=RATE items"),
        ("s0/nic0=40 parsecs", "--nic-rate: invalid rate of s0/nic0"),
        ("s0/gpu0-s0/nic9=1GB/s", "no NIC or link 's0/gpu0-s0/nic9'"),
    ],
)
def test_bad_rates_are_one_line_exit_2(tmp_path, capsys, rates, needle):
    code = main(["collective", "all_reduce", "--topology", str(_preset(tmp_path)), "--nodes",
                 "2", "--sizes", "1M", "--nic-rate", rates])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_a_bad_name_in_a_preset_names_the_file(tmp_path):
    path = _preset(tmp_path, extra={"rates": {"s5/nic0": "40GB/s"}}, name="bad-rates")
    with pytest.raises(TopologyError, match=r"bad-rates\.yaml: rates: no NIC or link 's5/nic0'"):
        load_topology(path, 2)


def test_every_command_that_builds_a_topology_takes_it(tmp_path, capsys):
    """collective (table rows slower by the NIC), topology show, run and compare."""
    base = ["collective", "all_gather", "--topology", "hgx-b200", "--nodes", "2", "--sizes",
            "1G", "--format", "csv"]  # fmt: skip
    assert main(base) == 0
    healthy = capsys.readouterr().out
    assert main([*base, "--nic-rate", "s1/nic3=24GB/s"]) == 0
    slow = capsys.readouterr().out
    assert healthy != slow
    show = ["topology", "show", "hgx-b200", "--nodes", "2"]
    assert main([*show, "--nic-rate", "s9/nic0=1GB/s"]) == 2
    assert "--nic-rate: no NIC or link 's9/nic0'" in capsys.readouterr().err
    assert main(["compare", "all_gather", "--topology", "hgx-b200", "--nodes", "2", "--sizes",
                 "1M", "--nic-rate", "s9/nic0=1GB/s"]) == 2  # fmt: skip
    assert "--nic-rate" in capsys.readouterr().err


def test_the_summary_counts_the_slowest_nic_of_the_slowest_server(tmp_path):
    """topology show's per-GPU inter-node figure (which search's estimates use): 8 NICs
    at 45 GB/s, one of server 1's at 40, so 8 x 40 / 8 GPUs = 40 GB/s, not rank 0's 45."""
    from simulator.topology import summarize

    graph = load_topology(_preset(tmp_path), 2, rates="s1/nic6=40GB/s")
    assert summarize(graph).inter_bandwidth == pytest.approx(40e9)
    assert summarize(load_topology(_preset(tmp_path), 2)).inter_bandwidth == pytest.approx(45e9)
