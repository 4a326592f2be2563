"""Topology importers: NCCL's topology XML and ASTRA-sim's network YAML.

Expected figures come from the formats' own units and from closed forms, worked out here
by hand: PCIe line rate = GT/s x lanes x line code / 8; NVLink = links x per-link line
rate; NIC = Mb/s / 8; ASTRA-sim's GB = 2^30 bytes and ns; a ring all-reduce of n bytes
on p ranks takes 2(p-1) steps of n/p bytes.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from simulator import simulate_collective
from simulator.cli.main import main
from simulator.errors import TopologyError
from simulator.topology import gpu_nodes, load_topology, preset, servers_of_ranks, summarize
from simulator.topology.importers import (
    GRAPH_SUFFIXES,
    IMPORTERS,
    importer_for,
    normalize_graph,
    read_graph,
    read_nccl_xml,
)
from simulator.topology.presets import read_preset

DATA = Path(__file__).parent / "data"
DGX = DATA / "nccl_topo_dgx_h100.xml"
RING = DATA / "astra_ring_8npus.yml"
SWITCH = DATA / "astra_switch_8npus.yml"
SWITCH_RING = DATA / "astra_switch_ring_16npus.yml"

GEN5_X16 = 32e9 * 16 * (128 / 130) / 8  # 63.015 GB/s per direction
H100_NVLINK = 18 * 25e9  # 18 NVLink4 links of 25 GB/s per direction (900 GB/s both ways)
NDR = 400e9 / 8  # a 400 Gb/s NIC
GIB = 2.0**30  # ASTRA-sim's GB


def gpu_nvlink(graph: nx.Graph, rank: int = 0) -> float:
    """Bytes/s of the NVLinks at the GPU of ``rank``."""
    node = gpu_nodes(graph)[rank]
    return sum(d["bandwidth"] for _, _, d in graph.edges(node, data=True) if d["link"] == "nvlink")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- NCCL topology XML: the DGX-H100-like dump against the bundled preset -------------------


def test_dgx_dump_has_the_dgx_h100_presets_per_gpu_bandwidths():
    imported, bundled = load_topology(DGX), load_topology("dgx-h100")
    mine, theirs = summarize(imported), summarize(bundled)
    assert (mine.gpus, mine.nics, mine.servers) == (theirs.gpus, theirs.nics, 1) == (8, 8, 1)
    # NVLink per GPU: 18 links x 25 GB/s, the preset's 450 GB/s.
    assert gpu_nvlink(imported) == pytest.approx(H100_NVLINK, rel=1e-12)
    assert gpu_nvlink(imported) == pytest.approx(theirs.intra_bandwidth, rel=1e-12)
    # NIC per GPU: one 400 Gb/s NIC each.
    assert mine.inter_bandwidth == pytest.approx(NDR, rel=1e-12)
    assert mine.inter_bandwidth == pytest.approx(theirs.inter_bandwidth, rel=1e-12)
    # The dump also has the PCIe tree: GPU 0 reaches the others through its Gen5 x16 link
    # to the CPU as well, and the two sockets are joined at NCCL's Sapphire Rapids 22 GB/s.
    assert mine.intra_bandwidth == pytest.approx(H100_NVLINK + GEN5_X16, rel=1e-12)
    assert mine.bisection_bandwidth == pytest.approx(4 * H100_NVLINK + 22e9, rel=1e-12)
    assert mine.devices == {"cpu": 2, "nvswitch": 1, "pcie_switch": 8}  # the NVMe is left out


def test_dgx_dump_builds_clusters_like_the_preset():
    for fabric in ("rail-optimized", "leaf-spine"):
        mine = summarize(load_topology(DGX, 4, fabric=fabric))
        theirs = summarize(load_topology("dgx-h100", 4, fabric=fabric))
        assert (mine.servers, mine.gpus, mine.nics, mine.fabric) == (4, 32, 32, fabric)
        assert mine.inter_bandwidth == pytest.approx(theirs.inter_bandwidth, rel=1e-12)
        # The same NVSwitches, leaves and spines; the dump adds its CPUs and PCIe switches.
        switches = {k: v for k, v in mine.devices.items() if k not in ("cpu", "pcie_switch")}
        assert switches == theirs.devices


def test_dgx_dump_preset_data():
    data = read_nccl_xml(DGX)
    server = data["server"]
    assert server["gpus"] == 8 and server["gpu"]["model"] == "H100-SXM5-80GB"  # device 0x2330
    assert server["intra"]["kind"] == "nvswitch" and server["intra"]["nvls"] is True
    assert server["nic"]["bandwidth"] == NDR
    assert server["nic"]["pcie"]["bandwidth"] == pytest.approx(GEN5_X16, rel=1e-12)
    # NCCL's own figures over the line rates: 20.6 of 25 GB/s per NVLink (topo.h:22),
    # 16 lanes x 240 x 100 Mb/s / 80 = 48 GB/s for Gen5 x16 (topo.cc:657).
    assert data["nccl"]["efficiency"]["nvlink"] == pytest.approx(20.6 / 25, rel=1e-12)
    assert data["nccl"]["efficiency"]["pcie"] == pytest.approx(48e9 / GEN5_X16, rel=1e-12)
    assert preset(str(DGX)) == data  # preset() and sweeps read it as a preset file
    assert read_preset(DGX) == data


def test_dgx_dump_ring_all_reduce_reaches_the_closed_form():
    n = 2**30
    one = simulate_collective(DGX, "all_reduce", n, "ring")
    # 2(p-1) steps of n/p over 450 GB/s NVLinks; the dump has no link latencies.
    assert one.time_s == pytest.approx(14 * (n / 8) / H100_NVLINK, rel=1e-9)
    two = simulate_collective(DGX, "all_reduce", n, "ring", nodes=2)
    bound = 30 * (n / 16) / NDR  # the two server-crossing steps run at the NIC's 50 GB/s
    assert bound <= two.time_s <= bound * (1 + 1e-4)  # + the fabric's switch latencies


def test_cli_shows_and_simulates_an_nccl_dump(capsys):
    assert main(["topology", "show", str(DGX), "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 server(s) on a rail-optimized fabric" in out
    assert "per-GPU inter-node    50 GB/s" in out
    argv = ["collective", "all_reduce", "--topology", str(DGX), "--nodes", "2", "--sizes", "1G"]
    assert main([*argv, "--algo", "ring"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if not line.startswith("#"))
    busbw = float(row.split()[7])  # GB/s: the NIC's 50 GB/s less the fabric latency
    assert 49.99 < busbw <= 50.0


# -- NCCL topology XML: units and shapes, one by one ----------------------------------------

SYSTEM = '<system version="1">\n{}\n</system>\n'
CPU = '<cpu numaid="{n}" arch="x86_64" vendor="AuthenticAMD" familyid="25" modelid="1">{body}</cpu>'


def gpu_pci(
    bus: str,
    rank: int,
    *,
    sm: int = 90,
    speed: str = "32.0 GT/s PCIe",
    width: int = 16,
    links: str = "",
    device: str = "0x2330",
) -> str:
    return (
        f'<pci busid="0000:{bus}:00.0" class="0x030200" vendor="0x10de" device="{device}" '
        f'link_speed="{speed}" link_width="{width}"><gpu dev="{rank}" sm="{sm}" rank="{rank}" '
        f'gdr="1">{links}</gpu></pci>'
    )


def nic_pci(bus: str, dev: int, *, speed: str = "400000", latency: str = "0") -> str:
    return (
        f'<pci busid="0000:{bus}:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" '
        f'link_width="16"><nic><net name="mlx5_{dev}" dev="{dev}" speed="{speed}" port="1" '
        f'latency="{latency}" gdr="1"/></nic></pci>'
    )


def one_cpu(tmp_path: Path, body: str) -> nx.Graph:
    return load_topology(write(tmp_path, "t.xml", SYSTEM.format(CPU.format(n=0, body=body))))


def test_pcie_speed_times_lanes_times_line_code(tmp_path):
    body = (
        gpu_pci("01", 0, speed="16.0 GT/s PCIe", width=8)  # Gen4 x8: 128b/130b
        + gpu_pci("02", 1, speed="5 GT/s", width=4)  # Gen2 x4, kernel <= 5.6 spelling: 8b/10b
        + gpu_pci("03", 2, speed="8.0 GT/s PCIe", width=0)  # width 0 reads as 16 (topo.cc:655)
        + gpu_pci("04", 3, speed="")  # no speed: NCCL's fallback, Gen3 (topo.cc:556)
    )
    graph = one_cpu(tmp_path, body)
    pcie = [graph.edges[gpu, "s0/cpu0"]["bandwidth"] for gpu in gpu_nodes(graph)]
    gen3_x16 = 8e9 * 16 * 128 / 130 / 8
    expected = [16e9 * 8 * 128 / 130 / 8, 5e9 * 4 * 0.8 / 8, gen3_x16, gen3_x16]
    assert pcie == pytest.approx(expected, rel=1e-12)


def test_nic_speed_is_megabits_and_latency_microseconds(tmp_path):
    body = gpu_pci("01", 0) + nic_pci("02", 0, speed="200000", latency="2.5")
    graph = one_cpu(tmp_path, body)
    nic = graph.nodes["s0/nic0"]
    assert nic["bandwidth"] == 200e9 / 8 and nic["latency"] == pytest.approx(2.5e-6, rel=1e-12)
    # Its PCIe link (Gen4 x16) joins it to the CPU its <pci> hangs off.
    assert graph.edges["s0/nic0", "s0/cpu0"]["bandwidth"] == pytest.approx(16e9 * 2 * 128 / 130)
    # A NIC reporting speed -1 counts as 10 Gb/s (topo.cc:417).
    graph = one_cpu(tmp_path, gpu_pci("01", 0) + nic_pci("02", 0, speed="-1"))
    assert graph.nodes["s0/nic0"]["bandwidth"] == 10e9 / 8


def test_slower_nics_are_left_out(tmp_path):
    body = (
        gpu_pci("01", 0)
        + gpu_pci("02", 1)
        + nic_pci("03", 0)
        + nic_pci("04", 2, speed="100000")  # a storage port
        + nic_pci("05", 1)
    )
    data = read_nccl_xml(write(tmp_path, "t.xml", SYSTEM.format(CPU.format(n=0, body=body))))
    assert data["server"]["nic"]["bandwidth"] == NDR and len(data["server"]["nic"]["attach"]) == 2
    assert "1 slower NIC port(s) left out" in data["description"]


def test_gpu_to_gpu_nvlinks_and_a100_nvswitch(tmp_path):
    # Two V100s (sm 70) with 2 NVLink2 links between them, listed on both sides.
    links0 = '<nvlink target="0000:02:00.0" count="2" tclass="0x030200"/>'
    links1 = '<nvlink target="0000:01:00.0" count="2" tclass="0x030200"/>'
    body = gpu_pci("01", 0, sm=70, links=links0) + gpu_pci("02", 1, sm=70, links=links1)
    graph = one_cpu(tmp_path, body)
    assert graph.edges["s0/gpu0", "s0/gpu1"]["bandwidth"] == 2 * 25e9
    assert graph.edges["s0/gpu0", "s0/gpu1"]["link"] == "nvlink"
    # A100 (sm 80, device 0x20b2): 12 NVLink3 links to the NVSwitch, 300 GB/s per direction;
    # no NVLS before sm 90.
    nvs = '<nvlink target="0000:a0:00.0" count="12" tclass="0x068000"/>'
    body = gpu_pci("01", 0, sm=80, links=nvs, device="0x20b2") + gpu_pci(
        "02", 1, sm=80, links=nvs, device="0x20b2"
    )
    data = read_nccl_xml(write(tmp_path, "a.xml", SYSTEM.format(CPU.format(n=0, body=body))))
    assert data["server"]["intra"] == {
        "kind": "nvswitch",
        "link": "nvlink",
        "bandwidth": 300e9,
        "nvls": False,
    }
    assert data["server"]["gpu"]["model"] == "A100-SXM4-80GB"
    assert data["nccl"]["efficiency"]["nvlink"] == pytest.approx(20.0 / 25)


def test_c2c_and_cpu_sockets(tmp_path):
    c2c = '<c2c bw="45000" count="10"/>'  # 10 links x 45,000 MB/s
    body0 = gpu_pci("01", 0, links=c2c)
    body1 = gpu_pci("81", 1, links=c2c)
    text = SYSTEM.format(CPU.format(n=0, body=body0) + CPU.format(n=1, body=body1))
    graph = load_topology(write(tmp_path, "t.xml", text))
    # The GPU's PCIe link and its C2C link join into one edge to its CPU.
    assert graph.edges["s0/gpu0", "s0/cpu0"]["bandwidth"] == pytest.approx(450e9 + GEN5_X16)
    assert graph.edges["s0/gpu0", "s0/cpu0"]["link"] == "c2c"
    assert graph.edges["s0/cpu0", "s0/cpu1"]["bandwidth"] == 16e9  # NCCL's AMD_BW (topo.h)


def test_gpus_without_rank_are_not_in_the_job(tmp_path):
    body = gpu_pci("01", 0) + gpu_pci("02", 1).replace(' rank="1"', "") + gpu_pci("03", 2)
    graph = one_cpu(tmp_path, body.replace('rank="2"', 'rank="1"'))
    assert len(gpu_nodes(graph)) == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            gpu_pci("01", 0).replace("<gpu ", "<gpux "),
            "line 2: unknown element <gpux> inside <pci>",
        ),
        (
            gpu_pci("01", 0).replace('sm="90"', 'sm="nine"'),
            "<gpu> attribute sm='nine' is not an integer",
        ),
        (gpu_pci("01", 0).replace(' sm="90"', ""), "<gpu> has no 'sm' attribute"),
        (gpu_pci("01", 0, speed="32 Gbps"), "link_speed='32 Gbps' is not a PCIe speed"),
        (gpu_pci("01", 0, speed="12 GT/s"), "no PCIe generation runs at that rate"),
        (
            gpu_pci("01", 0, links='<nvlink target="0000:02:00.0" count="x" tclass="0x030200"/>'),
            "<nvlink> attribute count='x' is not an integer",
        ),
        (nic_pci("02", 0, latency="soon"), "<net> attribute latency='soon' is not a number"),
        (nic_pci("02", 0), "no <gpu> with a rank"),
        (gpu_pci("01", 0) + gpu_pci("02", 0), "has rank 0, as line 2 has"),
        # Issue 33: read before as 10 Gb/s (NCCL's reading of -1, unknown) and as the
        # newest GPU's NVLink; -1 and 0 still read as NCCL reads them.
        (
            gpu_pci("01", 0) + nic_pci("02", 0, speed="-400000"),
            "<net> attribute speed=-400000 is negative; write the NIC's speed in Mb/s",
        ),
        (
            gpu_pci("01", 0).replace('sm="90"', 'sm="9999"'),
            "<gpu> attribute sm=9999 is not a compute capability; write it as NCCL does",
        ),
    ],
)
def test_nccl_xml_errors_name_file_line_element_and_attribute(tmp_path, body, message):
    path = write(tmp_path, "bad.xml", SYSTEM.format(CPU.format(n=0, body=body)))
    with pytest.raises(TopologyError, match="bad.xml") as error:
        load_topology(path)
    assert message in str(error.value)


def test_nccl_xml_refuses_what_is_not_a_topology(tmp_path):
    cases = {
        "<system><cpu/></system>": "version=None",
        '<system version="2"></system>': "version='2'",
        "<topology/>": "the top element is <topology>",
        '<system version="1"><cpu numaid="0">': "not well-formed XML",
        '<!DOCTYPE x [<!ENTITY a "b">]><system version="1"/>': "DTDs and entities",
        SYSTEM.format(
            '<cpu host_hash="0x1" numaid="0"/><cpu host_hash="0x2" numaid="0"/>'
        ): "describes 2 hosts",
    }
    for text, message in cases.items():
        with pytest.raises(TopologyError, match="bad.xml") as error:
            load_topology(write(tmp_path, "bad.xml", text))
        assert message in str(error.value)
    with pytest.raises(TopologyError, match="not found"):
        load_topology(tmp_path / "missing.xml")


# -- ASTRA-sim network YAML ----------------------------------------------------------------


def test_astra_ring_all_reduce_is_the_alpha_beta_closed_form():
    # ASTRA-sim's congestion-unaware send: hops x latency + bytes / bandwidth
    # (BasicTopology.cpp:53-57); a ring all-reduce is 2(p-1) neighbour sends of n/p bytes,
    # one hop each: 2(p-1)(a + n/(pB)).
    p, a, bandwidth = 8, 500e-9, 50 * GIB
    for n in (2**20, 2**26):
        result = simulate_collective(RING, "all_reduce", n, "ring")
        assert result.time_s == pytest.approx(2 * (p - 1) * (a + n / (p * bandwidth)), rel=1e-9)


def test_astra_switch_all_reduce_crosses_two_links_per_step():
    # On a Switch every send is two hops (Switch.cpp:28): 2(p-1)(2a + n/(pB)).
    p, a, bandwidth = 8, 936.25e-9, 400 * GIB
    for n in (2**20, 2**26):
        result = simulate_collective(SWITCH, "all_reduce", n, "ring")
        assert result.time_s == pytest.approx(2 * (p - 1) * (2 * a + n / (p * bandwidth)), rel=1e-9)


def test_astra_two_dimensions_make_servers():
    graph = load_topology(SWITCH_RING)
    assert servers_of_ranks(graph) == [0] * 8 + [1] * 8
    kinds = nx.get_node_attributes(graph, "kind")
    assert sorted(k for k in kinds.values() if k != "gpu") == ["nvswitch", "nvswitch"]
    assert graph.number_of_edges() == 2 * 8 + 8  # two switches of 8, eight rings of 2
    # NPU k of server 0 and NPU k of server 1 share the dimension-1 ring of two.
    edge = graph.edges["npu3", "npu11"]
    assert (edge["bandwidth"], edge["latency"], edge["link"]) == (50 * GIB, 1e-6, "dim1")
    summary = summarize(graph)
    assert summary.intra_bandwidth == 400 * GIB and summary.servers == 2


def test_astra_three_dimensions_follow_astra_sims_addresses(tmp_path):
    # astra-network-analytical's input/Ring_FullyConnected_Switch.yml.
    text = (
        "topology: [ Ring, FullyConnected, Switch ]\nnpus_count: [ 2, 8, 4 ]\n"
        "bandwidth: [ 200.0, 100.0, 50.0 ]\nlatency: [ 50.0, 500.0, 2000.0 ]\n"
    )
    graph = load_topology(write(tmp_path, "net.yml", text))
    assert len(gpu_nodes(graph)) == 64
    # MultiDimTopology.cpp's own example: NPU 47 has the address [1, 7, 2].
    by_link = {}
    for _, other, data in graph.edges("npu47", data=True):
        by_link.setdefault(data["link"], set()).add(other)
    assert by_link["dim0"] == {"npu46"}  # [0, 7, 2]
    assert by_link["dim1"] == {f"npu{1 + 2 * k + 32}" for k in range(8) if k != 7}  # [1, k, 2]
    (hub,) = by_link["dim2"]
    assert graph.nodes[hub]["kind"] == "switch"
    assert set(graph[hub]) == {f"npu{1 + 14 + 16 * m}" for m in range(4)}  # [1, 7, m]
    # 32 rings of 2, 8 fully connected groups of 8, 16 switches of 4.
    assert graph.number_of_edges() == 32 + 8 * 28 + 16 * 4


def test_astra_errors_name_the_key(tmp_path):
    cases = {
        "topology: [Ring]\nnpus_count: [8]\nbandwidth: [tbd]\nlatency: [500]\n": "bandwidth[0]",
        "topology: [Ring, Ring]\nnpus_count: [8]\nbandwidth: [1]\nlatency: [5]\n": (
            "'npus_count' has 1 entries but 'topology' has 2"
        ),
        "topology: [Torus]\nnpus_count: [8]\nbandwidth: [1]\nlatency: [5]\n": "topology[0]",
        "topology: [Ring]\nnpus_count: [1]\nbandwidth: [1]\nlatency: [5]\n": "npus_count[0] is 1",
        "topology: [Ring]\nnpus_count: [8]\nbandwidth: [0]\nlatency: [5]\n": "bandwidth[0] is 0",
        "topology: [Ring]\nnpus_count: [8]\nbandwidth: [1]\nlatency: [-5]\n": "latency[0] is -5",
        "topology: [Ring]\nnpus_count: [8]\nbandwidth: [1]\n": "'latency' is missing",
        "topology: [Ring]\nnpus_count: [8]\nbandwidth: [1]\nlatency: [5]\nunits: GB\n": (
            "unknown key 'units'"
        ),
    }
    for text, message in cases.items():
        with pytest.raises(TopologyError, match="net.yml") as error:
            load_topology(write(tmp_path, "net.yml", text))
        assert message in str(error.value)


def test_astra_file_is_a_whole_topology():
    with pytest.raises(TopologyError, match="nodes= and fabric= apply to presets only"):
        load_topology(RING, 2)
    with pytest.raises(TopologyError, match="is a whole topology, not a server preset"):
        read_preset(RING)


def test_cli_shows_an_astra_file(capsys):
    assert main(["topology", "show", str(RING)]) == 0
    out = capsys.readouterr().out
    assert "GPUs                  8" in out
    assert "per-GPU intra-node    107.4 GB/s" in out  # two ring links of 50 x 2^30 bytes/s


# -- the registry and what stays as it was -----------------------------------------------


def test_yaml_presets_and_graph_files_load_as_before(tmp_path):
    bundled = Path(__file__).parents[1] / "topologies" / "dgx-a100.yaml"
    assert importer_for(bundled) is None
    assert summarize(load_topology(bundled, 2)).gpus == 16
    path = tmp_path / "ring.graphml"
    nx.write_graphml(load_topology(RING), path)
    assert importer_for(path) is IMPORTERS["graphml"]
    assert load_topology(path).number_of_edges() == 8
    assert GRAPH_SUFFIXES == (".graphml", ".json") and callable(read_graph)
    assert callable(normalize_graph)
