"""The bill of materials (simulator/topology/bom.py) against closed forms.

Every expected count below is computed in the test from the fabric's shape, by hand:
a k-ary fat-tree (Al-Fares et al., SIGCOMM 2008) has k pods of k/2 edge and k/2
aggregation switches and (k/2)^2 cores, k^3/4 edge-to-aggregation and k^3/4
aggregation-to-core cables; a two-tier leaf-spine of L leaves and S spines has L x S
leaf-spine pairs, each leaf's uplinks being its downlinks / oversubscription; ccsim's
rail-optimized fabric of N servers with r NICs each has one leaf per rail (r leaves,
each with N server ports), ceil(N / oversubscription) spines and one cable from every
leaf to every spine. Power and cost are the counts times the cited unit figures.
"""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest

from simulator.cli.main import main
from simulator.errors import CcsimError
from simulator.topology import cluster_graph, load_topology, ring_graph
from simulator.topology.bom import bill_of_materials, check_items, load_items, speed_label


def server(nics: int, bandwidth: str = "400Gbps") -> dict:
    """A server of ``nics`` GPUs on an NVSwitch, one NIC per GPU."""
    return {
        "gpus": nics,
        "intra": {"kind": "nvswitch", "bandwidth": "450GB/s", "link": "nvlink"},
        "nic": {"bandwidth": bandwidth},
    }


def invariants(graph: nx.Graph, bom) -> None:
    """What holds whatever the fabric: every NIC port is one cable, every cable one
    link counted once, every switch port one cable end, two transceivers per optical
    cable (counted here from the graph, not from the bill)."""
    kinds = nx.get_node_attributes(graph, "kind")
    nic_cables = sum(n for k, n in bom.cables_by_kind.items() if k.startswith("server-to-"))
    assert nic_cables == sum(1 for k in kinds.values() if k == "nic") == sum(bom.nics.values())
    fabric = [
        (u, v, d.get("cables", 1))
        for u, v, d in graph.edges(data=True)
        if "switch" in (kinds[u], kinds[v])
    ]
    switch_links = sum(c for u, v, c in fabric if kinds[u] == kinds[v] == "switch")
    by_length = bom.cables_by_length
    assert by_length.get("copper", 0) + by_length.get("optical", 0) == sum(c for *_, c in fabric)
    assert sum(g.ports_used for g in bom.switches) == nic_cables + 2 * switch_links
    assert bom.transceivers == 2 * by_length.get("optical", 0)
    in_server = sum(1 for u, v in graph.edges() if "switch" not in (kinds[u], kinds[v]))
    assert by_length.get("in-server", 0) == in_server


# -- fat-tree ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [4, 6, 8])
def test_full_fat_tree_has_five_k_squared_over_four_switches(k):
    # Servers of k/2 NICs, k^3/4 NICs in all: every host port is used, each edge switch
    # holds exactly one server, so with one server a rack its NIC cables are copper.
    r, n = k // 2, k * k // 2
    graph = cluster_graph(server(r), n, fabric={"type": "fat-tree", "k": k})
    bom = bill_of_materials(graph, servers_per_rack=1)
    assert n * r == k**3 // 4
    assert bom.switches_by_tier == {
        "edge": k * k // 2,
        "aggregation": k * k // 2,
        "core": k * k // 4,
    }
    assert sum(bom.switches_by_tier.values()) == 5 * k * k // 4
    assert bom.cables_by_kind["server-to-edge"] == k**3 // 4
    assert bom.cables_by_kind["edge-to-aggregation"] == k * (k // 2) ** 2 == k**3 // 4
    assert bom.cables_by_kind["aggregation-to-core"] == k * (k // 2) * (k // 2) == k**3 // 4
    assert bom.cables_by_length["copper"] == k**3 // 4
    assert bom.cables_by_length["optical"] == k**3 // 2
    assert bom.transceivers == k**3
    # Every switch of a k-ary fat-tree uses k ports: k/2 down, k/2 up (cores k down).
    assert {(g.ports_min, g.ports_max) for g in bom.switches} == {(k, k)}
    invariants(graph, bom)


def test_a_partly_filled_fat_tree_still_has_every_switch():
    # 10 servers of 4 NICs on k = 8: 40 of the 128 host ports used.
    k = 8
    graph = cluster_graph(server(4), 10, fabric={"type": "fat-tree", "k": k})
    bom = bill_of_materials(graph)
    assert sum(bom.switches_by_tier.values()) == 5 * k * k // 4 == 80
    assert bom.cables_by_kind["server-to-edge"] == 40
    assert bom.cables_by_kind["edge-to-aggregation"] == k**3 // 4 == 128
    invariants(graph, bom)


# -- leaf-spine ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "per_leaf", "spines"),
    [(8, 4, None), (16, 4, None), (32, 4, 8), (12, 2, 4), (24, 4, 16)],
)
def test_leaf_spine_has_l_times_s_leaf_spine_pairs(servers, per_leaf, spines):
    r = 8
    fabric = {"type": "leaf-spine", "servers_per_leaf": per_leaf}
    if spines:
        fabric["spines"] = spines
    graph = cluster_graph(server(r), servers, fabric=fabric)
    bom = bill_of_materials(graph, servers_per_rack=per_leaf)
    leaves = math.ceil(servers / per_leaf)
    downlinks = per_leaf * r
    s = spines or downlinks  # default: one spine per uplink port
    assert bom.switches_by_tier == {"leaf": leaves, "spine": s}
    pairs = sum(
        1
        for u, v in graph.edges()
        if {graph.nodes[u].get("tier"), graph.nodes[v].get("tier")} == {"leaf", "spine"}
    )
    assert pairs == leaves * s
    # Each leaf has as many uplink cables as downlinks (non-blocking), split over S spines.
    assert bom.cables_by_kind["leaf-to-spine"] == leaves * downlinks
    assert bom.cables_by_kind["server-to-leaf"] == servers * r
    leaf = next(g for g in bom.switches if g.tier == "leaf")
    spine = next(g for g in bom.switches if g.tier == "spine")
    assert (leaf.ports_min, leaf.ports_max) == (2 * downlinks, 2 * downlinks)
    assert spine.ports_min == spine.ports_max == leaves * downlinks // s
    # A leaf per rack: its servers' cables are in-rack copper; every leaf-spine cable is
    # optical, with a transceiver at each end.
    assert bom.cables_by_length["copper"] == servers * r
    assert bom.cables_by_length["optical"] == leaves * downlinks
    assert bom.transceivers == 2 * leaves * downlinks
    invariants(graph, bom)


@pytest.mark.parametrize(("ratio", "spines"), [(2, None), (2, 4), (4, None), (4, 2)])
def test_oversubscribed_leaf_spine_has_the_uplinks_its_ratio_implies(ratio, spines):
    r, per_leaf, servers = 8, 4, 16
    fabric = {"type": "leaf-spine", "servers_per_leaf": per_leaf, "oversubscription": ratio}
    if spines:
        fabric["spines"] = spines
    graph = cluster_graph(server(r), servers, fabric=fabric)
    bom = bill_of_materials(graph)
    leaves, downlinks = servers // per_leaf, per_leaf * r
    uplinks = downlinks // ratio  # 32 downlinks at 2:1 -> 16 uplinks, at 4:1 -> 8
    assert bom.switches_by_tier["spine"] == (spines or uplinks)
    assert bom.cables_by_kind["leaf-to-spine"] == leaves * uplinks
    leaf = next(g for g in bom.switches if g.tier == "leaf")
    assert leaf.ports_max == downlinks + uplinks
    # Racks of 4 servers, one a leaf: copper to the leaf, optics only above it.
    assert bom.transceivers == 2 * leaves * uplinks
    invariants(graph, bom)


def test_one_leaf_needs_no_spine():
    graph = cluster_graph(server(8), 3, fabric="leaf-spine")  # 3 servers on a 32-port leaf
    bom = bill_of_materials(graph)
    assert bom.switches_by_tier == {"leaf": 1}
    assert bom.cables_by_kind == {
        "nvlink in server": 24,
        "rdma in server": 24,
        "server-to-leaf": 24,
    }


# -- rail-optimized ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "rails", "ratio"), [(4, 8, 1), (16, 8, 1), (32, 4, 1), (16, 8, 2), (9, 2, 2)]
)
def test_rail_optimized_has_one_leaf_per_rail_and_n_over_ratio_spines(servers, rails, ratio):
    graph = cluster_graph(
        server(rails), servers, fabric={"type": "rail-optimized", "oversubscription": ratio}
    )
    bom = bill_of_materials(graph, servers_per_rack=2)
    spines = math.ceil(servers / ratio)
    assert bom.switches_by_tier == {"leaf": rails, "spine": spines}
    assert bom.cables_by_kind["server-to-leaf"] == servers * rails
    assert bom.cables_by_kind["leaf-to-spine"] == rails * spines  # one cable per pair
    leaf = next(g for g in bom.switches if g.tier == "leaf")
    spine = next(g for g in bom.switches if g.tier == "spine")
    assert leaf.ports_min == leaf.ports_max == servers + spines
    assert spine.ports_min == spine.ports_max == rails
    # A rail leaf takes NIC k of servers in every rack: all optical.
    assert bom.cables_by_length["optical"] == servers * rails + rails * spines
    assert bom.transceivers == 2 * (servers * rails + rails * spines)
    invariants(graph, bom)


def test_rail_leaves_past_the_radix_are_flagged():
    # 128 DGX H100: a rail leaf has 128 server ports and 128 spine ports, 256 > 64.
    bom = bill_of_materials(load_topology("dgx-h100", 128, fabric="rail-optimized"))
    leaf = next(g for g in bom.switches if g.tier == "leaf")
    assert (leaf.count, leaf.ports_max, leaf.radix, leaf.over_radix) == (8, 256, 64, 8)
    assert "8 over the radix" in bom.rows()[4]["description"]


# -- rack rule, NVL72, other graphs ----------------------------------------------------------


def test_nic_cables_are_copper_only_to_a_switch_in_the_rack():
    graph = load_topology("dgx-h100", 8, fabric="leaf-spine")  # 4 servers a leaf
    assert bill_of_materials(graph).cables_by_length["copper"] == 64  # racks of 4
    assert "copper" not in bill_of_materials(graph, servers_per_rack=2).cables_by_length
    assert bill_of_materials(graph, servers_per_rack=8).cables_by_length["copper"] == 64


def test_an_nvl72_rack_is_one_server_a_rack():
    bom = bill_of_materials(load_topology("gb200-nvl72", 4))
    assert bom.servers_per_rack == 1
    assert bom.switches_by_tier == {"leaf": 72, "spine": 4}
    assert bom.cables_by_kind["nvlink in server"] == 4 * 72
    assert bom.devices == {"nvswitch": 4}


def test_a_graph_without_a_fabric_has_links_only():
    bom = bill_of_materials(ring_graph(4, 1e9))
    assert (bom.servers, bom.gpus, bom.switches, bom.transceivers) == (1, 4, (), 0)
    assert bom.cables_by_kind == {"nvlink in server": 4}


def test_speed_classes():
    assert [speed_label(b) for b in (100e9, 200e9, 399e9, 800e9, 1.6e12)] == [
        "100G",
        "200G",
        "400G",
        "800G",
        "1.6T",
    ]


# -- power and cost ------------------------------------------------------------------------


def test_power_is_counts_times_the_cited_watts():
    # dgx-h100 x 8 on leaf-spine: 2 leaves + 32 spines (QM9700, 747 W typical), 64
    # leaf-spine optical cables x 2 transceivers (9 W), 64 in-rack copper NIC cables.
    bom = bill_of_materials(load_topology("dgx-h100", 8, fabric="leaf-spine"))
    assert bom.power_w() == {"switch": 34 * 747.0, "nic": 0.0, "transceiver": 128 * 9.0}
    assert bom.power_kw == pytest.approx((34 * 747 + 128 * 9) / 1e3)
    assert bom.unpowered == ["nic-400G"]
    with_nics = bill_of_materials(
        load_topology("dgx-h100", 8, fabric="leaf-spine"), watts={"nic-400G": 20}
    )
    assert with_nics.power_kw == pytest.approx((34 * 747 + 128 * 9 + 64 * 20) / 1e3)
    assert with_nics.unpowered == []


def test_cost_is_price_times_count_per_item():
    prices = {
        "server": 300_000,
        "nic-400G": 1_500,
        "switch-400G": 25_000,
        "transceiver-400G": 900,
        "copper-cable-400G": 100,
        "optical-cable-400G": 200,
    }
    bom = bill_of_materials(load_topology("dgx-h100", 8, fabric="leaf-spine"), prices=prices)
    expected = 8 * 300_000 + 64 * 1_500 + 34 * 25_000 + 128 * 900 + 64 * 100 + 64 * 200
    assert bom.cost == expected
    assert bom.unpriced == []
    row = next(r for r in bom.rows() if r["item"] == "switch-400G" and "spine" in r["description"])
    assert (row["count"], row["cost"]) == (32, 32 * 25_000)
    partial = bill_of_materials(
        load_topology("dgx-h100", 8, fabric="leaf-spine"), prices={"server": 1}
    )
    assert partial.cost == 8 and "switch-400G" in partial.unpriced
    assert bill_of_materials(load_topology("dgx-h100", 2)).cost is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"swich-400G": 1}, "unknown item 'swich-400G'"),
        ({"switch-400G": -5}, "switch-400G has a negative price -5"),
        ({"switch-400G": "cheap"}, "switch-400G has price 'cheap'; write a number"),
        ({"switch-400G": float("nan")}, "write a number"),
        ([1, 2], "expected a mapping of item to price"),
    ],
)
def test_bad_prices_are_refused_naming_the_item(values, message):
    with pytest.raises(CcsimError, match=message):
        check_items(values)


def test_a_prices_file_is_read_and_checked(tmp_path):
    good = tmp_path / "prices.yaml"
    good.write_text("switch-400G: 25000\nserver: 3.0e5\n")
    assert load_items(good) == {"switch-400G": 25000.0, "server": 300000.0}
    with pytest.raises(CcsimError, match="missing.yaml"):
        load_items(tmp_path / "missing.yaml")


# -- command line ----------------------------------------------------------------------------


def test_cli_prints_the_bill_with_totals(capsys, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("switch-400G: 25000\noptical-cable-400G: 200\n")
    assert (
        main(
            [
                "topology",
                "bom",
                "dgx-h100",
                "--nodes",
                "8",
                "--fabric",
                "leaf-spine",
                "--prices",
                str(prices),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "# switches: 34 (leaf 2, spine 32)" in out
    assert "# transceivers: 128" in out
    assert f"# network power: {(34 * 747 + 128 * 9) / 1e3:.2f} kW" in out
    assert f"# cost: {34 * 25000 + 64 * 200:,.2f}" in out


def test_cli_json_and_csv(capsys, tmp_path):
    assert main(["topology", "bom", "dgx-h100", "--nodes", "4", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)[0]
    assert data["totals"]["switches_by_tier"] == {"leaf": 8, "spine": 4}
    out = tmp_path / "bom.csv"
    assert (
        main(["topology", "bom", "dgx-h100", "--nodes", "4", "--format", "csv", "--out", str(out)])
        == 0
    )
    assert out.read_text().splitlines()[0] == (
        "section,item,description,count,watts_each,power_kw,price_each,cost"
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("swich-400G: 1\n", "unknown item 'swich-400G'"),
        ("switch-400G: -1\n", "switch-400G has a negative price"),
        ("[1, 2]\n", "expected a mapping"),
    ],
)
def test_cli_bad_prices_file_is_one_line_and_exit_2(capsys, tmp_path, text, named):
    prices = tmp_path / "p.yaml"
    prices.write_text(text)
    assert main(["topology", "bom", "dgx-h100", "--prices", str(prices)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(prices) in err and named in err


def test_cli_missing_prices_file_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["topology", "bom", "dgx-h100", "--prices", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.yaml" in err


# -- cost in sizing ------------------------------------------------------------------------


def test_search_with_prices_reports_the_fabric_cost_and_cost_x_step(capsys, tmp_path):
    from simulator.search import search

    # 2 dgx-a100 on their single-switch fabric: 1 switch of 200G ports, 2 servers.
    prices = {"switch-200G": 1000, "server": 100}
    result = search(
        "gpt-1.5b",
        "dgx-a100",
        nodes=2,
        global_batch=16,
        simulate=1,
        micro_batches=[1],
        recompute=["full"],
        virtual_stages=[1],
        workers=1,
        progress=False,
        prices=prices,
    )
    row = result.ranked()[0]
    assert result.fabric_cost == row["fabric_cost"] == 1 * 1000 + 2 * 100
    assert row["cost_x_step"] == pytest.approx(1200 * row["step_s"])
    file = tmp_path / "prices.yaml"
    file.write_text("switch-200G: 1000\nserver: 100\n")
    argv = [
        "search",
        "gpt-1.5b",
        "--topology",
        "dgx-a100",
        "--nodes",
        "2",
        "--global-batch",
        "16",
        "--simulate",
        "1",
        "--micro-batches",
        "1",
        "--recompute",
        "full",
        "--virtual-stages",
        "1",
        "--workers",
        "1",
        "--quiet",
        "--prices",
        str(file),
    ]
    assert main([*argv, "--format", "csv"]) == 0
    header, first = capsys.readouterr().out.splitlines()[:2]
    assert header.endswith("fabric_cost,cost_x_step") and ",1200.0," in first
    assert main(argv) == 0
    assert "# fabric cost (priced items, ccsim topology bom): 1,200.00" in capsys.readouterr().out
