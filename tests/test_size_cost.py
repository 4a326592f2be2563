"""Cost in sizing (`ccsim size --prices / --per watt / --target`, simulator/sweep/cost.py).

Every expected figure is worked out here by hand: a point's cost is its counts times the
unit prices (counts from the servers' NICs and the fabric's closed form), its network
power the counts times the cited typical watts, and the bus bandwidth of the NIC sweep the
closed form of tests/test_sweep_knee.py (a one-channel ring on dgx-a100 with latencies
zeroed runs at min(NIC, PCIe 31.5 GB/s)). The cheapest point meeting a target is then
picked by hand from those numbers and compared with what ccsim names.
"""

from __future__ import annotations

import json

import pytest

from simulator.cli.main import main
from simulator.errors import CcsimError
from simulator.sweep import load_spec, size
from simulator.sweep.cost import cheapest_meeting, parse_target, per_perf, point_costs

# dgx-a100 x 2 on its single switch, 1 GiB ring all-reduce, NIC 100/200/400 Gb/s.
NIC_SPEC = """\
name: nic-cost
scenario:
  collective: all_reduce
  algorithm: ring
  size: 1GiB
  nodes: 2
  set: {server.intra.latency: 0, server.nic.pcie.latency: 0, fabric.latency: 0}
axes:
  server.nic.bandwidth: [100Gbps, 200Gbps, 400Gbps]
"""

PRICES = {
    "server": 100_000,
    "nic-100G": 500,
    "nic-200G": 1_000,
    "nic-400G": 1_600,
    "switch-100G": 10_000,
    "switch-200G": 20_000,
    "switch-400G": 30_000,
    "copper-cable-100G": 50,
    "copper-cable-200G": 80,
    "copper-cable-400G": 120,
}

SERVERS, NICS_PER_SERVER = 2, 8  # a DGX A100 has 8 compute NICs, one per GPU
RANKS = SERVERS * NICS_PER_SERVER
PCIE_GBPS = 31.5  # the preset's PCIe Gen4 x16 link, what caps a NIC's traffic
BYTES = 2**30


def hand_cost(speed: str) -> float:
    """2 servers, 16 NICs of the speed, one switch (two servers fit its ports), one
    copper cable per NIC (both servers in one rack of four DGX)."""
    nics = SERVERS * NICS_PER_SERVER
    return (
        SERVERS * PRICES["server"]
        + nics * PRICES[f"nic-{speed}"]
        + 1 * PRICES[f"switch-{speed}"]
        + nics * PRICES[f"copper-cable-{speed}"]
    )


def hand_busbw(gbps: float) -> float:
    return min(gbps / 8, PCIE_GBPS)


def hand_time(gbps: float) -> float:
    """A ring all-reduce moves 2 (n-1)/n of the message at the bus bandwidth."""
    return 2 * (RANKS - 1) / RANKS * BYTES / (hand_busbw(gbps) * 1e9)


@pytest.fixture
def nic_spec(tmp_path):
    path = tmp_path / "nic.yaml"
    path.write_text(NIC_SPEC)
    return path


@pytest.fixture
def prices_file(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("".join(f"{item}: {price}\n" for item, price in PRICES.items()))
    return path


def test_point_costs_are_counts_times_unit_prices(nic_spec):
    costs = point_costs(load_spec(nic_spec), prices=PRICES)
    assert [c.fabric_cost for c in costs] == [hand_cost(s) for s in ("100G", "200G", "400G")]
    assert hand_cost("100G") == 218_800  # 200,000 + 8,000 + 10,000 + 800
    # Power: the one switch is a QM9700 (747 W typical) at every speed; NICs have no
    # cited figure, copper draws none.
    assert [c.network_kw for c in costs] == [0.747] * 3
    assert costs[0].unpowered == ("nic-100G",)


def test_size_costs_every_point_and_picks_the_cheapest_meeting_the_target(nic_spec):
    gbps = (100, 200, 400)
    found = size(nic_spec, metric="time_s", prices=PRICES, target=0.1, workers=1)
    assert [p["time_s"] for p in found.points] == pytest.approx([hand_time(g) for g in gbps])
    assert [p["fabric_cost"] for p in found.points] == [hand_cost(f"{g}G") for g in gbps]
    for point, g in zip(found.points, gbps, strict=True):
        assert point["cost_x_time_s"] == pytest.approx(hand_cost(f"{g}G") * hand_time(g))
    # By hand: 0.161 s (100G) misses 0.1 s; 0.0805 s (200G, 237,280) and 0.0639 s (400G,
    # 257,520) meet it; the cheaper of those is 200G.
    assert hand_time(100) > 0.1 > hand_time(200) > hand_time(400)
    assert found.choice.cheapest["server.nic.bandwidth"] == 200e9 / 8
    assert [p["meets"] for p in found.points] == [False, True, True]
    # A tighter target only the 400G NIC meets; one none meets names the best reached.
    tight = size(nic_spec, metric="time_s", prices=PRICES, target=0.07, workers=1)
    assert tight.choice.cheapest["server.nic.bandwidth"] == 400e9 / 8
    none = size(nic_spec, metric="time_s", prices=PRICES, target=0.05, workers=1)
    assert none.choice.cheapest is None
    assert none.choice.best["time_s"] == pytest.approx(hand_time(400))


def test_a_bandwidth_target_is_met_from_above_and_costs_per_gbps(nic_spec):
    found = size(nic_spec, prices=PRICES, target=parse_target("busbw_GBps", "25GB/s"), workers=1)
    # 12.5, 25 and 31.5 GB/s: 200G meets 25 GB/s exactly (up to rounding) and is cheaper.
    assert found.choice.cheapest["server.nic.bandwidth"] == 200e9 / 8
    point = found.points[0]
    assert point["cost_per_busbw_GBps"] == pytest.approx(hand_cost("100G") / hand_busbw(100))


def test_cheapest_meeting_is_the_pick_by_hand():
    # A table as ccsim prints it: (fabric, step s, cost). By hand: steps <= 1.2 s are B,
    # C and D; the cheapest of them is D (ties in cost go to the faster step).
    table = [("A", 1.35, 100.0), ("B", 1.10, 300.0), ("C", 1.20, 250.0), ("D", 1.15, 250.0)]
    rows = [{"fabric": f, "step_s": s, "fabric_cost": c} for f, s, c in table]
    choice = cheapest_meeting(rows, "step_s", 1.2, "fabric_cost")
    assert choice.cheapest["fabric"] == "D"
    assert [r["fabric"] for r in choice.ranked] == ["A", "D", "C", "B"]
    assert cheapest_meeting(rows, "step_s", 1.0, "fabric_cost").best["fabric"] == "B"
    # Points without a result (failed) or a cost are not candidates.
    rows.append({"fabric": "E", "step_s": None, "fabric_cost": 1.0})
    assert cheapest_meeting(rows, "step_s", 1.2, "fabric_cost").cheapest["fabric"] == "D"
    assert per_perf(250.0, "step_s", 1.15) == 250.0 * 1.15


# dgx-h100 x 8, leaf-spine against fat-tree (both non-blocking, 64 NICs of 400G):
# leaf-spine: 2 leaves of 4 servers (32 ports down, 32 up) and 32 spines = 34 switches,
# 64 leaf-spine optical cables (128 transceivers); fat-tree: the smallest even k with
# k^3/4 >= 64 NICs is 8: 5k^2/4 = 80 switches, k^3/4 = 128 edge-aggregation and 128
# aggregation-core optical cables (512 transceivers). NIC cables are copper in both.
FABRIC_SPEC = """\
name: fabric-cost
scenario:
  collective: all_reduce
  algorithm: ring
  size: 1MiB
  topology: dgx-h100
  nodes: 8
axes:
  fabric: [leaf-spine, fat-tree]
"""
SWITCH_W, TRANSCEIVER_W = 747.0, 9.0  # QM9700 typical; MMS4X00-NS400 at 400G typical


def test_fabrics_by_name_are_costed_and_the_least_power_meeting_a_target_is_named(tmp_path, capsys):
    spec = tmp_path / "fabric.yaml"
    spec.write_text(FABRIC_SPEC)
    switches_only = {"server": 0, "switch-400G": 25_000, "nic-400G": 0}
    switches_only |= {"transceiver-400G": 0, "copper-cable-400G": 0, "optical-cable-400G": 0}
    costs = point_costs(load_spec(spec), prices=switches_only, watts={"nic-400G": 20})
    assert [c.fabric_cost for c in costs] == [34 * 25_000, 80 * 25_000]
    assert [c.network_kw for c in costs] == pytest.approx(
        [
            (34 * SWITCH_W + 128 * TRANSCEIVER_W + 64 * 20) / 1e3,
            (80 * SWITCH_W + 512 * TRANSCEIVER_W + 64 * 20) / 1e3,
        ]
    )
    watts = tmp_path / "watts.yaml"
    watts.write_text("nic-400G: 20\n")
    argv = ["size", str(spec), "--workers", "1", "--quiet", "--metric", "time_s"]
    assert main([*argv, "--watts", str(watts), "--target", "1ms", "--format", "json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert data["knees"] == [] and data["per"] == "watt" and data["power_unknown"] == []
    points = {p["fabric"]: p for p in data["points"]}
    # By hand from the table: both meet 1 ms (a 1 MiB all-reduce takes ~0.1 ms); the
    # leaf-spine draws less.
    assert all(p["meets"] for p in points.values())
    assert min(points, key=lambda f: points[f]["network_kw"]) == "leaf-spine"
    assert data["target"]["cheapest"]["fabric"] == "leaf-spine"
    assert main([*argv, "--watts", str(watts), "--target", "1ms"]) == 0
    out = capsys.readouterr().out
    assert "fabric is not numeric, so it has no knee" in out
    assert out.splitlines()[-1].startswith("# cheapest meeting time_s <= 0.001")
    assert "fabric=leaf-spine" in out.splitlines()[-1]


def test_cli_prints_costs_under_the_knees_and_csv_lists_the_points(nic_spec, prices_file, capsys):
    argv = ["size", str(nic_spec), "--workers", "1", "--quiet", "--prices", str(prices_file)]
    assert main([*argv, "--target", "25GB/s"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("# knee") and "400Gbps" in out[2]
    row = next(line for line in out if line.lstrip().startswith("100Gbps"))
    assert f"{hand_cost('100G'):,.2f}" in row
    assert out[-1] == (
        "# cheapest meeting busbw_GBps >= 25 (bus bandwidth): server.nic.bandwidth=200Gbps: "
        f"cost {hand_cost('200G'):,.2f}, busbw_GBps 25"
    )
    assert main([*argv, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(",")[:5] == [
        "server.nic.bandwidth",
        "status",
        "error",
        "busbw_GBps",
        "fabric_cost",
    ]
    assert len(lines) == 4


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("swich-400G: 1\n", "unknown item 'swich-400G'"),
        ("server: -1\n", "server has a negative price"),
        ("[1, 2]\n", "expected a mapping"),
        # The 100G point needs NIC, switch and cable prices this file lacks.
        ("server: 1\n", "no price for copper-cable-100G, nic-100G, switch-100G"),
    ],
)
def test_bad_or_incomplete_prices_are_one_line_and_exit_2(nic_spec, tmp_path, capsys, text, named):
    prices = tmp_path / "p.yaml"
    prices.write_text(text)
    out = tmp_path / "r.csv"
    argv = ["size", str(nic_spec), "--workers", "1", "--prices", str(prices), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(prices) in err and named in err
    assert not out.exists()  # refused before the sweep ran


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--target", "1s"], "--target needs --prices FILE"),
        (["--per", "dollar"], "--per dollar needs --prices FILE"),
        (["--prices", "none.yaml"], "none.yaml"),
        (["--per", "watt", "--target", "1s"], "a target of busbw_GBps is a bandwidth"),
        (["--per", "watt", "--metric", "time_s", "--target", "fast"], "invalid --target"),
    ],
)
def test_bad_cost_options_are_one_line_and_exit_2(nic_spec, capsys, extra, named):
    assert main(["size", str(nic_spec), "--workers", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err


def test_a_named_axis_without_costs_is_refused_before_the_sweep(tmp_path, capsys):
    spec = tmp_path / "fabric.yaml"
    spec.write_text(FABRIC_SPEC)
    out = tmp_path / "r.csv"
    assert main(["size", str(spec), "--workers", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a knee needs a numeric axis" in err and "per watt" in err
    assert not out.exists()
    with pytest.raises(CcsimError, match="ranking per dollar needs unit prices"):
        size(spec, per="dollar")
