"""Topology presets and fabrics: invariants and bandwidth bounds worked out by hand.

Figures come from the presets' cited sources (``topologies/*.yaml`` comments and
``shared/reference/README.md``), never from ccsim's output: GB = 1e9 bytes, NVLink3
300 GB/s, NVLink4 450 GB/s, HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s,
100 Gb/s = 12.5 GB/s, PCIe Gen5 x16 63 GB/s, 910B HCCS 56 GB/s per link, 910 HCCS
30 GB/s per link and PCIe 4.0 x16 31.5 GB/s.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np
import pytest

import simulator
from simulator.errors import TopologyError
from simulator.network.routing import LinkTable, Router
from simulator.topology import (
    bisection_bandwidth,
    cluster_graph,
    gpu_nodes,
    list_presets,
    load_topology,
    preset,
    summarize,
)

PRESETS = ("dgx-a100", "dgx-h100", "ascend-910b", "ascend-910", "alibaba-ebmgn7ex", "pcie-8gpu")


def kinds(graph: nx.Graph) -> dict[str, int]:
    counts = Counter()
    for _, data in graph.nodes(data=True):
        kind = data["kind"]
        counts[data.get("tier", kind) if kind == "switch" else kind] += 1
    return dict(counts)


def test_every_preset_is_listed_with_a_description():
    """Six presets from the issue, each with a one-line description."""
    listed = dict(list_presets())
    assert set(PRESETS) <= set(listed)
    assert all(listed[name] and "\n" not in listed[name] for name in PRESETS)


# Counts by hand from each preset's description (one server, without its fabric):
#   NVSwitch servers: 8 GPU-NVSwitch links + one GPU-NIC link per GPU.
#   ascend-910b: 8 NPU-SDMA links + C(8,2) = 28 HCCS links + 8 NPU-NIC links = 44.
#   ascend-910: 2 x C(4,2) = 12 HCCS + 8 PCIe to the host + 8 NPU-NIC = 28.
#   pcie-8gpu: 8 GPU-switch + 2 switch-CPU + 1 CPU-CPU = 11.
SERVER_SHAPES = {
    "dgx-a100": ({"gpu": 8, "nvswitch": 1, "nic": 8}, 16, {"gpu": 2, "nvswitch": 8, "nic": 1}),
    "dgx-h100": ({"gpu": 8, "nvswitch": 1, "nic": 8}, 16, {"gpu": 2, "nvswitch": 8, "nic": 1}),
    "ascend-910b": ({"gpu": 8, "sdma": 8, "nic": 8}, 44, {"gpu": 2, "sdma": 8, "nic": 1}),
    "ascend-910": ({"gpu": 8, "cpu": 1, "nic": 8}, 28, {"gpu": 5, "cpu": 8, "nic": 1}),
    "alibaba-ebmgn7ex": (
        {"gpu": 8, "nvswitch": 1, "nic": 2},
        16,
        {"gpu": 2, "nvswitch": 8, "nic": 4},
    ),
    "pcie-8gpu": (
        {"gpu": 8, "pcie_switch": 2, "cpu": 2},
        11,
        {"gpu": 1, "pcie_switch": 5, "cpu": 2},
    ),
}


@pytest.mark.parametrize("name", PRESETS)
def test_server_counts_and_degrees(name):
    """Node counts by kind, link count and the degree of every node of a kind."""
    counts, links, degree = SERVER_SHAPES[name]
    graph = cluster_graph(preset(name)["server"])
    assert kinds(graph) == counts
    assert graph.number_of_edges() == links
    for node, data in graph.nodes(data=True):
        assert graph.degree(node) == degree[data["kind"]], node


@pytest.mark.parametrize("name", PRESETS)
def test_one_server_gets_its_fabric_where_the_preset_says(name):
    """A fabric with ``single_server: true`` (ascend-910b's) is built on one server too: the
    server's graph plus switches, every NIC linked to one. Elsewhere one server is the
    server alone, as before (on one dgx-a100 a fabric would let auto pick multipath)."""
    server = cluster_graph(preset(name)["server"])
    graph = load_topology(name)
    fabric = preset(name).get("fabric") or {}
    assert set(server.edges) <= set(graph.edges)
    added = {graph.nodes[node]["kind"] for node in set(graph) - set(server)}
    assert fabric.get("single_server", False) == (name == "ascend-910b")
    if not fabric.get("single_server"):
        assert added == set() and set(graph.edges) == set(server.edges)
        assert "fabric" not in graph.graph
        return
    assert added == {"switch"} and graph.graph["fabric"] == fabric["type"]
    for nic in (n for n, d in graph.nodes(data=True) if d["kind"] == "nic"):
        assert any(graph.nodes[peer]["kind"] == "switch" for peer in graph[nic]), nic


@pytest.mark.parametrize("name", PRESETS)
def test_every_gpu_routes_to_every_gpu(name):
    """Every ordered pair of GPUs gets a route from the one to the other (2 servers;
    pcie-8gpu has no NICs, so 1). A route between servers crosses exactly two NICs, a
    route inside a server none, and no route passes through a third GPU."""
    nodes = 1 if name == "pcie-8gpu" else 2
    graph = load_topology(name, nodes=nodes)
    router = Router(graph, LinkTable(graph))
    gpus = gpu_nodes(graph)
    p = 8 * nodes
    src, dst = np.array([(s, d) for s in range(p) for d in range(p) if s != d]).T
    for s, d, route in zip(src, dst, router.route_ids(src, dst), strict=True):
        path = router.path_nodes(int(route))
        assert (path[0], path[-1]) == (gpus[s], gpus[d])
        inner = [graph.nodes[node]["kind"] for node in path[1:-1]]
        assert "gpu" not in inner
        assert inner.count("nic") == (2 if s // 8 != d // 8 else 0)


# Per-GPU figures straight from each preset's cited sources (GB/s, one direction):
# intra = what one GPU can send to the rest of its server; inter = its share of the
# server's NIC bandwidth.
#   ascend-910b: 7 HCCS links x 56 = 392; ascend-910: 3 HCCS x 30 + PCIe 31.5 = 121.5.
#   alibaba-ebmgn7ex: 2 NICs x 12.5 / 8 GPUs = 3.125.
PER_GPU = {
    "dgx-a100": (300.0, 25.0),
    "dgx-h100": (450.0, 50.0),
    "ascend-910b": (392.0, 25.0),
    "ascend-910": (121.5, 12.5),
    "alibaba-ebmgn7ex": (300.0, 3.125),
    "pcie-8gpu": (63.0, 0.0),
}


@pytest.mark.parametrize("name", PRESETS)
def test_per_gpu_bandwidth_matches_the_cited_figures(name):
    summary = summarize(load_topology(name))
    intra, inter = PER_GPU[name]
    assert summary.intra_bandwidth == pytest.approx(intra * 1e9)
    assert summary.inter_bandwidth == pytest.approx(inter * 1e9)


# Ring all-reduce bound: the ring visits ranks 0..7 and back to 0; busbw equals the
# bandwidth of the slowest directed link any ring hop uses (each directed link carries
# one hop). Worked out per preset:
RING_BOUNDS = {
    # Each hop is GPU -> NVSwitch -> GPU: 300 GB/s (NVLink3) each way.
    "dgx-a100": 300.0,
    # Same shape with NVLink4: 18 x 25 = 450 GB/s.
    "dgx-h100": 450.0,
    # Hop i -> i+1 is NPU -> SDMA (392) -> direct HCCS link (56) -> SDMA -> NPU: 56 GB/s.
    "ascend-910b": 56.0,
    # Hops inside a group use one HCCS link (30 GB/s); hops 3 -> 4 and 7 -> 0 go
    # NPU -> host -> NPU over PCIe 4.0 (31.5 GB/s, opposite directions, no sharing):
    # min(30, 31.5) = 30 GB/s.
    "ascend-910": 30.0,
    # NVSwitch as dgx-a100; the shared NICs are not on a one-server ring.
    "alibaba-ebmgn7ex": 300.0,
    # Hops inside a PCIe switch: GPU -> switch -> GPU at 63 GB/s (Gen5 x16). Hop 3 -> 4:
    # gpu3 -> pcie0 -> cpu0 -> cpu1 -> pcie1 -> gpu4 over 63, 63, 256, 63, 63 GB/s; hop
    # 7 -> 0 is the same path the other way (full duplex): 63 GB/s.
    "pcie-8gpu": 63.0,
}


@pytest.mark.parametrize("name", PRESETS)
def test_single_server_ring_reaches_the_bound_of_its_links(name):
    """Ring all-reduce of 1 GiB: busbw within 0.5% of the hand bound above (latency
    costs 2(p-1) x a few us against tens of ms of transfer), never above it."""
    result = simulator.simulate_collective(name, "all_reduce", 2**30)
    assert result.busbw_GBps == pytest.approx(RING_BOUNDS[name], rel=0.005)
    assert result.busbw_GBps <= RING_BOUNDS[name]


def test_alibaba_shared_nic_limits_the_ring_across_servers():
    """2 servers, 8 channels. Channel c leaves server s through local GPU c-1 and enters
    the next through local GPU c, so each server's two 100 Gb/s NICs (12.5 GB/s, GPUs
    0-3 and 4-7) carry 4 channels each way: 12.5 / 4 = 3.125 GB/s per channel, busbw =
    8 x 3.125 = 25 GB/s (the server's 200 Gb/s). With one 100G NIC per GPU, every
    channel has its own NIC: 8 x 12.5 = 100 GB/s, 4 times more."""
    shared = simulator.simulate_collective(
        "alibaba-ebmgn7ex", "all_reduce", 2**30, nodes=2, channels=8
    )
    spec = preset("alibaba-ebmgn7ex")
    spec["server"]["nic"]["gpus_per_nic"] = 1
    own = simulator.simulate_collective(
        cluster_graph(spec["server"], 2, fabric=spec["fabric"]), "all_reduce", 2**30, channels=8
    )
    assert shared.busbw_GBps == pytest.approx(25.0, rel=0.005)
    assert own.busbw_GBps == pytest.approx(100.0, rel=0.005)
    assert own.busbw_GBps / shared.busbw_GBps == pytest.approx(4.0, rel=0.01)


# Fabric shapes for 4 x dgx-h100 (8 NICs of 50 GB/s per server, 64 server links), by hand:
#   rail-optimized: 8 leaves (rails); spines = 4 servers / 1 = 4; 32 NIC links + 8 x 4
#       leaf-spine links. Leaf degree 4 NICs + 4 spines.
#   leaf-spine, 2 servers per leaf: 2 leaves; spines = 2 x 8 downlinks / 1 = 16;
#       32 + 2 x 16 links.
#   fat-tree: 32 NICs need k = 6 (k = 4 holds 16); 5k^2/4 = 45 switches: 9 cores, 18
#       aggregation, 18 edge; k^3/2 = 108 switch links + 32 NIC links.
#   single-switch: 1 switch, 32 NIC links.
FABRIC_SHAPES = {
    ("rail-optimized", ()): ({"leaf": 8, "spine": 4}, 64 + 32 + 32, {"leaf": 8, "spine": 8}),
    ("leaf-spine", (("servers_per_leaf", 2),)): (
        {"leaf": 2, "spine": 16},
        64 + 32 + 32,
        {"leaf": 16 + 16, "spine": 2},
    ),
    ("fat-tree", ()): (
        {"core": 9, "aggregation": 18, "edge": 18},
        64 + 32 + 108,
        {"core": 6, "aggregation": 6},
    ),
    ("single-switch", ()): ({"switch": 1}, 64 + 32, {"switch": 32}),
}


@pytest.mark.parametrize("fabric, params", list(FABRIC_SHAPES))
def test_fabric_counts_degrees_and_bisection(fabric, params):
    """Switch counts by tier, link count, switch degrees; all four fabrics are
    non-blocking, so half the servers (16 NICs x 50 GB/s) reach the other half at
    800 GB/s."""
    counts, links, degree = FABRIC_SHAPES[(fabric, params)]
    graph = load_topology("dgx-h100", nodes=4, fabric={"type": fabric, **dict(params)})
    found = kinds(graph)
    assert {tier: found[tier] for tier in counts} == counts
    assert (found["gpu"], found["nic"], found["nvswitch"]) == (32, 32, 4)
    assert graph.number_of_edges() == links
    for node, data in graph.nodes(data=True):
        if data.get("tier") in degree:
            assert graph.degree(node) == degree[data["tier"]], node
    assert bisection_bandwidth(graph) == pytest.approx(800e9)
    assert nx.is_connected(graph)


@pytest.mark.parametrize("fabric, params", list(FABRIC_SHAPES))
def test_sharp_marks_every_fabric_switch(fabric, params):
    """``sharp: true`` in the fabric section marks every fabric switch (and only those:
    not the NVSwitches) as reducing in the network; the default marks none. The shape
    is the same either way."""
    spec = {"type": fabric, **dict(params)}
    plain = load_topology("dgx-h100", nodes=4, fabric=spec)
    sharp = load_topology("dgx-h100", nodes=4, fabric={**spec, "sharp": True})
    switches = [n for n, d in sharp.nodes(data=True) if d["kind"] == "switch"]
    assert switches and all(sharp.nodes[n]["sharp"] is True for n in switches)
    assert [n for n, d in sharp.nodes(data=True) if d.get("sharp")] == switches
    assert not any(d.get("sharp") for _, d in plain.nodes(data=True))
    assert nx.utils.graphs_equal(nx.Graph(sharp.edges(data=True)), nx.Graph(plain.edges(data=True)))


def test_sharp_must_be_true_or_false():
    with pytest.raises(TopologyError, match="fabric.sharp must be true or false, got 'yes'"):
        load_topology("dgx-h100", nodes=2, fabric={"type": "single-switch", "sharp": "yes"})


def test_rail_optimized_puts_nic_k_on_leaf_k():
    """Rail k is leaf k: NIC k of every server hangs off it and nothing else does."""
    graph = load_topology("dgx-h100", nodes=4)
    for s in range(4):
        for k in range(8):
            (leaf,) = [n for n in graph[f"s{s}/nic{k}"] if graph.nodes[n]["kind"] == "switch"]
            assert graph.nodes[leaf]["rail"] == k


def test_leaf_spine_oversubscription_halves_the_bisection():
    """8 x dgx-h100, 4 servers per leaf (the default 32 ports / 8 NICs): 2 leaves.
    Servers 0-3 (leaf 0) send to 4-7 through leaf 0's uplinks: 32 downlinks x 50 GB/s =
    1600 GB/s at 1:1, half of it, 800 GB/s, at 2:1."""
    full = load_topology("dgx-h100", nodes=8, fabric={"type": "leaf-spine"})
    half = load_topology(
        "dgx-h100", nodes=8, fabric={"type": "leaf-spine", "oversubscription": "2:1"}
    )
    assert bisection_bandwidth(full) == pytest.approx(1600e9)
    assert bisection_bandwidth(half) == pytest.approx(800e9)
    assert bisection_bandwidth(half) == pytest.approx(bisection_bandwidth(full) / 2)


def test_summary_figures_of_a_rail_optimized_cluster():
    """4 x dgx-h100: per-GPU intra-node 450 GB/s (its NVLink), per-GPU inter-node
    8 x 50 / 8 = 50 GB/s, bisection 800 GB/s (see the fabric test)."""
    summary = summarize(load_topology("dgx-h100", nodes=4))
    assert (summary.gpus, summary.nics, summary.servers) == (32, 32, 4)
    assert summary.intra_bandwidth == pytest.approx(450e9)
    assert summary.inter_bandwidth == pytest.approx(50e9)
    assert summary.bisection_bandwidth == pytest.approx(800e9)
    assert summary.fabric == "rail-optimized"


def test_one_rail_ring_on_rail_optimized_h100_reaches_the_nic_bound():
    """4 x dgx-h100: the ring visits even servers' GPUs upwards and odd servers' GPUs
    downwards (0..7, 15..8, 16..23, 31..24), so every server hop joins GPUs of the same
    local index: it crosses one rail leaf and no spine. Its slowest link is the 400 Gb/s
    NIC (50 GB/s < PCIe Gen5 63 < NVLink 450), so busbw = 50 GB/s and the spines carry
    nothing."""
    result = simulator.simulate_collective("dgx-h100", "all_reduce", 2**30, nodes=4)
    assert result.busbw_GBps == pytest.approx(50.0, rel=0.005)
    links = zip(result.links["src"], result.links["dst"], result.links["bytes"], strict=True)
    spine_bytes = sum(b for u, v, b in links if "spine" in u or "spine" in v)
    assert spine_bytes == 0


def test_ecmp_spreads_cross_rail_rings_over_spines():
    """4 x dgx-h100, rail-optimized, 8 channels, n = 64 MiB, odd servers' GPUs renumbered
    so that each of a channel's 4 server hops joins local GPU c-1 to c or c to c+1: all
    between rails, so all go leaf -> spine -> leaf. Each hop carries 2(p-1) = 62 flows of
    n / (C p) = n / 256 bytes: one connection is 62n/256 bytes, and the 32 connections
    put 32 x 62n/256 = 7.75n bytes on leaf -> spine links in all.

    A connection keeps one path, so each leaf -> spine link carries a whole number m of
    connections. Uplinks have 4 x 50 / 4 spines = 50 GB/s, so m connections share
    50 GB/s and the slowest channel runs at 50/m: busbw = 8 x 50/m = 400/m GB/s, the run
    lasting as long as the busiest link needs for its bytes, no longer."""
    n = 2**26
    graph = load_topology("dgx-h100", nodes=4)
    # Renumber the odd servers' GPUs one place round (rank 8s + k on local GPU k + 1), so
    # that the ring's server hops, which join equal rank positions, cross rails.
    for s in (1, 3):
        for k in range(8):
            graph.nodes[f"s{s}/gpu{(k + 1) % 8}"]["rank"] = 8 * s + k
    result = simulator.simulate_collective(graph, "all_reduce", n, channels=8)
    links = result.links
    up = {
        (u, v): b
        for u, v, b in zip(links["src"], links["dst"], links["bytes"], strict=True)
        if u.startswith("leaf") and v.startswith("spine")
    }
    connection = 62 * n / 256
    assert sum(up.values()) == pytest.approx(7.75 * n)
    multiples = [b / connection for b in up.values()]
    assert multiples == pytest.approx([round(m) for m in multiples])
    spines_used = {v for (u, v), b in up.items() if b > 0}
    assert len(spines_used) >= 2
    m = max(round(x) for x in multiples)
    assert result.busbw_GBps == pytest.approx(400.0 / m, rel=0.01)
    busiest = max(b / bw for b, bw in zip(links["bytes"], links["bandwidth"], strict=True))
    assert busiest <= result.time_s <= 1.01 * busiest


def _without_nic_by_search(graph: nx.Graph) -> list:
    """GPUs from which no NIC is reached through non-GPU nodes, one search per GPU
    (the definition, slowly)."""
    kinds = nx.get_node_attributes(graph, "kind")
    if "nic" not in kinds.values():
        return []
    undirected = graph.to_undirected(as_view=True) if graph.is_directed() else graph
    lost = []
    for gpu, kind in kinds.items():
        if kind != "gpu":
            continue
        seen, stack, found = set(), [gpu], False
        while stack and not found:
            for v in undirected.adj[stack.pop()]:
                if v in seen or kinds.get(v, "gpu") == "gpu":
                    continue
                found = kinds[v] == "nic"
                seen.add(v)
                stack.append(v)
        if not found:
            lost.append(gpu)
    return lost


@pytest.mark.parametrize("directed", [False, True])
def test_gpus_without_nic_are_those_no_search_from_them_finds_one(directed):
    """Three H100s cut from their NICs and PCIe switches reach only NVSwitches, which
    reach no NIC: those three, as a search from each GPU finds (directed too)."""
    from simulator.topology.graph import gpus_without_nic

    graph = load_topology("dgx-h100", 2).copy()
    cut = ["s0/gpu0", "s0/gpu1", "s1/gpu5"]
    for gpu in cut:
        for v in list(graph.adj[gpu]):
            if graph.nodes[v]["kind"] in ("nic", "pcie_switch"):
                graph.remove_edge(gpu, v)
    graph.add_node("spare")  # a node without a kind is no path
    if directed:
        graph = graph.to_directed()
    assert gpus_without_nic(graph) == _without_nic_by_search(graph) == cut
    assert gpus_without_nic(load_topology("dgx-h100", 2)) == []
