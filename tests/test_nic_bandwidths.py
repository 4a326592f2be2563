"""A preset's NIC section may give one bandwidth per NIC (issue 32: a public 2-server
B200 cluster measured 4 of its 8 NICs at ~40 GB/s and 4 at ~45 GB/s with ib_write_bw).
A ring is as fast as its slowest NIC, and a list of the wrong length is one line, exit 2.
"""

from __future__ import annotations

import pytest
import yaml

from simulator import simulate_collective
from simulator.cli import main
from simulator.errors import TopologyError
from simulator.topology import load_topology

GIB = 2**30


def _preset(tmp_path, bandwidth, name="mixed-nics"):
    """An 8-GPU NVSwitch server, one NIC per GPU, no latencies (so the closed form is the
    bandwidth term alone)."""
    spec = {
        "name": name,
        "server": {
            "gpus": 8,
            "gpu": {"model": "B200-SXM-180GB"},
            "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "900GB/s"},
            "nic": {"bandwidth": bandwidth},
        },
        "fabric": {"type": "rail-optimized", "latency": "0us"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


MIXED = ["40GB/s"] * 4 + ["45GB/s"] * 4


def test_each_nic_gets_its_own_rate(tmp_path):
    graph = load_topology(_preset(tmp_path, MIXED), 2)
    for server in (0, 1):
        rates = [graph.nodes[f"s{server}/nic{j}"]["bandwidth"] for j in range(8)]
        assert rates == [40e9] * 4 + [45e9] * 4
        # The GPU-to-NIC link (no pcie section) runs at that NIC's rate too.
        assert graph.edges[f"s{server}/gpu5", f"s{server}/nic5"]["bandwidth"] == 45e9


def test_units_are_accepted_per_value(tmp_path):
    graph = load_topology(_preset(tmp_path, ["320Gbps"] * 4 + ["45GB/s"] * 4), 2)
    assert graph.nodes["s0/nic0"]["bandwidth"] == 40e9
    assert graph.nodes["s0/nic7"]["bandwidth"] == 45e9


def test_a_two_server_ring_runs_at_the_slowest_nic(tmp_path):
    """Ring all-gather on 2 x 8 GPUs with 8 channels: each channel's ring crosses the
    network, so the call takes (p - 1)/p x n / (C x B) with B the slowest NIC's rate
    (40 GB/s), not the mean (42.5) or the fastest (45): NVLink (900 GB/s) is never the
    bound. Closed form: 15/16 x 1 GiB / (8 x 40e9 B/s) = 3.1457 ms."""
    p, channels, size = 16, 8, GIB
    result = simulate_collective(
        _preset(tmp_path, MIXED), "all_gather", size, "ring", nodes=2, channels=channels, chunks=1
    )
    expected = (p - 1) / p * size / (channels * 40e9)
    assert result.time_s == pytest.approx(expected, rel=1e-9)
    # The same preset with every NIC at 45 GB/s is faster by exactly 45/40.
    fast = simulate_collective(
        _preset(tmp_path, "45GB/s", "fast"), "all_gather", size, "ring", nodes=2,
        channels=channels, chunks=1,
    )  # fmt: skip
    assert result.time_s / fast.time_s == pytest.approx(45 / 40, rel=1e-9)


@pytest.mark.parametrize(
    ("bandwidth", "needle"),
    [
        (MIXED[:7], "server.nic.bandwidth lists 7 values but there are 8 NICs"),
        (["40GB/s"] * 7 + [40], "server.nic.bandwidth[7] is 40 with no unit"),
    ],
)
def test_a_bad_list_is_one_line_naming_file_and_field(tmp_path, capsys, bandwidth, needle):
    path = _preset(tmp_path, bandwidth)
    with pytest.raises(TopologyError, match=r"mixed-nics\.yaml"):
        load_topology(path, 2)
    code = main(["collective", "all_reduce", "--topology", str(path), "--nodes", "2",
                 "--sizes", "1M"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err and "mixed-nics.yaml" in err


def test_a_list_follows_gpus_per_nic(tmp_path):
    """Two GPUs per NIC: four NICs, so four values."""
    path = _preset(tmp_path, ["40GB/s"] * 4)
    spec = yaml.safe_load(path.read_text())
    spec["server"]["nic"]["gpus_per_nic"] = 2
    path.write_text(yaml.safe_dump(spec))
    graph = load_topology(path, 2)
    assert sum(1 for _, d in graph.nodes(data=True) if d.get("kind") == "nic") == 8
    spec["server"]["nic"]["bandwidth"] = MIXED
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(TopologyError, match="lists 8 values but there are 4 NICs"):
        load_topology(path, 2)
