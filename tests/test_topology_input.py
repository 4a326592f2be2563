"""Bring-your-own topologies: the YAML schema, GraphML / JSON import, bad input, the CLI.

Bad input must raise TopologyError naming the node, edge or key path and the fix, and
the CLI must exit with code 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import networkx as nx
import pytest
import yaml

import simulator
from simulator.cli import main
from simulator.errors import TopologyError
from simulator.topology import load_topology, read_graph, ring_graph, summarize

PRESETS = ("dgx-a100", "dgx-h100", "ascend-910b", "ascend-910", "alibaba-ebmgn7ex", "pcie-8gpu")
README = Path(__file__).resolve().parents[1] / "topologies" / "README.md"


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def two_gpu_server(**nic) -> dict:
    """Two GPUs on a 100 GB/s link; one 100 Gb/s NIC per GPU unless overridden."""
    return {
        "name": "pair",
        "description": "two GPUs",
        "server": {
            "gpus": 2,
            "intra": {"kind": "mesh", "bandwidth": "100GB/s", "link": "nvlink"},
            "nic": {"bandwidth": "100Gbps", **nic},
        },
    }


# -- the README's worked example ------------------------------------------------------------


def readme_example(tmp_path: Path) -> Path:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "name: pcie-box" in b]
    path = tmp_path / "pcie-box.yaml"
    path.write_text(block)
    return path


def test_readme_worked_example_gives_the_figures_it_states(tmp_path):
    """The README works these out by hand for 4 servers: 32 GPUs, 8 NICs, 2 leaves and
    2 spines, per-GPU intra 31.5 GB/s, inter 2 x 25 / 8 = 6.25 GB/s, bisection 50 GB/s."""
    graph = load_topology(readme_example(tmp_path), nodes=4)
    summary = summarize(graph)
    assert (summary.gpus, summary.nics) == (32, 8)
    assert (summary.devices["leaf"], summary.devices["spine"]) == (2, 2)
    assert summary.intra_bandwidth == pytest.approx(31.5e9)
    assert summary.inter_bandwidth == pytest.approx(6.25e9)
    assert summary.bisection_bandwidth == pytest.approx(50e9)


def test_message_rate_and_nic_latency_reach_the_fabric_link(tmp_path):
    """The README example's NIC: 1 us latency and 50 M msg/s go on its fabric link,
    plus half of the 600 ns switch latency: 1.3 us."""
    graph = load_topology(readme_example(tmp_path), nodes=2)
    data = graph.edges["s0/nic0", "leaf0"]
    assert data["message_rate"] == pytest.approx(50e6)
    assert data["latency"] == pytest.approx(1.3e-6)
    assert data["bandwidth"] == pytest.approx(25e9)


# -- imported graphs ---------------------------------------------------------------------


def test_graphml_round_trip_simulates_the_closed_form(tmp_path):
    """A 4-GPU ring of 100 GB/s, 1 us links written as GraphML and read back: ring
    all-gather of 4 MB takes (p-1)(a + n/(pB)) = 3 x (1 + 10) us = 33 us."""
    path = tmp_path / "ring.graphml"
    nx.write_graphml(ring_graph(4, 100e9, 1e-6), path)
    result = simulator.simulate_collective(str(path), "all_gather", 4e6)
    assert result.time_us == pytest.approx(33.0, rel=1e-9)


def test_node_link_json_with_unit_strings(tmp_path):
    """Strings with units become bytes/s and seconds; ranks written as strings become
    integers. 2 GPUs, 100 GB/s: all-gather of 2 MB moves 1 MB in 10 us, plus 8 us."""
    graph = nx.Graph()
    graph.add_node("a", kind="gpu", rank="0")
    graph.add_node("b", kind="gpu", rank="1")
    graph.add_edge("a", "b", bandwidth="100GB/s", latency="8us", link="nvlink")
    path = tmp_path / "pair.json"
    data = nx.node_link_data(graph, edges="links")  # the older key, still accepted
    del data["multigraph"]  # left out: a plain graph, not a multigraph
    path.write_text(json.dumps(data))
    loaded = load_topology(path)
    assert loaded.edges["a", "b"]["bandwidth"] == 100e9
    assert loaded.nodes["b"]["rank"] == 1
    assert simulator.simulate_collective(path, "all_gather", 2e6).time_us == pytest.approx(18.0)


# -- bad input ---------------------------------------------------------------------------


def test_disconnected_graph_names_the_gpu_and_the_fix():
    graph = ring_graph(4, 1e9)
    graph.add_node("island", kind="gpu", rank=4)
    with pytest.raises(TopologyError, match=r"disconnected.*'island'.*add a link"):
        load_topology(graph)


@pytest.mark.parametrize("bandwidth", [None, 0, -5.0])
def test_missing_or_non_positive_bandwidth_names_the_edge(bandwidth):
    graph = ring_graph(3, 1e9)
    if bandwidth is None:
        del graph.edges["gpu0", "gpu1"]["bandwidth"]
    else:
        graph.edges["gpu0", "gpu1"]["bandwidth"] = bandwidth
    with pytest.raises(TopologyError, match=r"edge 'gpu0'-'gpu1'.*set 'bandwidth' to a positive"):
        load_topology(graph)


def test_unknown_unit_names_the_key_path_and_the_valid_units(tmp_path):
    path = write_yaml(tmp_path / "bad.yaml", two_gpu_server(bandwidth="400Gbs"))
    with pytest.raises(TopologyError, match=r"server\.nic\.bandwidth.*unknown unit 'Gbs'.*Gbps"):
        load_topology(path)


def test_unknown_unit_in_a_graph_file_names_the_edge(tmp_path):
    graph = ring_graph(2, 1e9)
    graph.edges["gpu0", "gpu1"]["bandwidth"] = "400Gbs"
    path = tmp_path / "bad.graphml"
    nx.write_graphml(graph, path)
    with pytest.raises(TopologyError, match=r"edge 'gpu0'-'gpu1'.*unknown unit 'Gbs'"):
        read_graph(path)


def test_gpu_without_a_route_to_a_nic(tmp_path):
    """One NIC attached to GPU 0 only: GPU 1 reaches it only through GPU 0."""
    path = write_yaml(tmp_path / "bad.yaml", two_gpu_server(attach=["gpu0"]))
    with pytest.raises(TopologyError, match=r"'s0/gpu1'.*no route to a NIC.*attach"):
        load_topology(path)


def test_unknown_key_names_its_path(tmp_path):
    path = write_yaml(tmp_path / "bad.yaml", two_gpu_server(bandwith="100Gbps"))
    with pytest.raises(TopologyError, match=r"unknown key 'server\.nic\.bandwith'"):
        load_topology(path)


@pytest.mark.parametrize(
    "fabric, message",
    [
        ({"type": "torus"}, r"fabric\.type.*valid fabrics: fat-tree, leaf-spine"),
        ({"type": "fat-tree", "k": 5}, r"fabric\.k.*even"),
        ({"type": "fat-tree", "k": 2}, r"2 host ports but there are 4 NICs; use k >= 4"),
        ({"type": "leaf-spine", "oversubscription": 121}, r"base-60"),
        ({"type": "leaf-spine", "oversubscription": 0.5}, r"at least 1"),
        ({"type": "single-switch", "spines": 2}, r"unknown key 'fabric\.spines'"),
    ],
)
def test_bad_fabric_parameters(tmp_path, fabric, message):
    path = write_yaml(tmp_path / "bad.yaml", {**two_gpu_server(), "fabric": fabric})
    with pytest.raises(TopologyError, match=message):
        load_topology(path, nodes=2)


def test_unknown_link_endpoint_lists_known_names(tmp_path):
    data = two_gpu_server()
    data["server"].pop("intra")
    data["server"]["links"] = [{"ends": ["gpu0", "gpu7"], "bandwidth": "1GB/s"}]
    path = write_yaml(tmp_path / "bad.yaml", data)
    with pytest.raises(TopologyError, match=r"links\[0\]\.ends.*'gpu7'.*known names: gpu0, gpu1"):
        load_topology(path)


# -- command line ------------------------------------------------------------------------


def test_cli_show_prints_the_summary(capsys):
    """4 x dgx-h100: 32 GPUs, 450 GB/s NVLink4, 8 x 50 / 8 = 50 GB/s per GPU to the
    network, 16 x 50 = 800 GB/s across the middle."""
    assert main(["topology", "show", "dgx-h100", "--nodes", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"GPUs\s+32\n", out)
    assert "450 GB/s" in out and "50 GB/s" in out and "800 GB/s" in out


def test_cli_show_draws_a_png_atomically(tmp_path, capsys):
    target = tmp_path / "h100.png"
    argv = f"topology show dgx-h100 --nodes 2 --fabric leaf-spine --png {target}".split()
    assert main(argv) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["h100.png"]  # no temporary file left


@pytest.mark.parametrize(
    "argv",
    [
        ["topology", "show", "no-such-preset"],
        ["topology", "show", "{bad}"],
        ["topology", "show", "dgx-a100", "--png", "/no/such/folder/x.png"],
    ],
)
def test_cli_bad_input_exits_2(argv, tmp_path, capsys):
    if argv[2] == "{bad}":  # a preset file with an unknown unit
        bad = write_yaml(tmp_path / "bad.yaml", two_gpu_server(bandwidth="400Gbs"))
        argv = [*argv[:2], str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ccsim: error:") and err.count("\n") == 1


def test_cli_help_names_units(capsys):
    with pytest.raises(SystemExit):
        main(["topology", "show", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    assert "--nodes N number of servers of the preset (count, default: 1)" in out
    assert "--fabric F fabric joining the servers (name: fat-tree" in out
    assert "--png FILE also draw the graph into FILE (path of a PNG image" in out


def test_cli_topologies_lists_presets(capsys):
    assert main(["topologies"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert re.search(rf"^{re.escape(name)}\s+\S", out, flags=re.M)


@pytest.mark.parametrize("bare", [200, "200", 2.5e5])
def test_a_bandwidth_with_no_unit_below_a_megabyte_a_second_is_refused(bare, tmp_path):
    """Issue 33: ``bandwidth: 200`` was read as 200 bytes/s (a bare number is bytes/s, as
    topologies/README.md says); no link runs below 1 MB/s, so the unit was forgotten."""
    from simulator.topology.presets import preset

    data = preset("dgx-a100")
    data["server"]["nic"]["bandwidth"] = bare
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError) as error:
        load_topology(path)
    assert str(error.value) == (
        f"bare.yaml: server.nic.bandwidth is {bare!r} with no unit, which reads as {bare!r} "
        f"bytes/s; write the unit, e.g. {bare!r}GB/s (bytes) or {bare!r}Gbps (bits)"
    )
    data["server"]["nic"]["bandwidth"] = 25e9  # bytes/s, as sweeps set it
    path.write_text(yaml.safe_dump(data))
    assert max(d["bandwidth"] for *_, d in load_topology(path, 2).edges(data=True)) >= 25e9


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"nodes": [{"id": "zzz"}], "edges": []},
            "node 'zzz' has no 'kind' attribute; give it one of cpu, gpu, nic",
        ),
        (
            {"nodes": [{"id": "g0", "kind": "gpu", "rank": 0}]},
            'node-link JSON needs a "links" or "edges" list of links',
        ),
    ],
)
def test_node_link_errors_name_what_is_missing(data, message, tmp_path):
    """Issue 33: these said ``node 'zzz' has kind None`` and ``'edges'`` (a KeyError)."""
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TopologyError, match="graph.json") as error:
        load_topology(path)
    assert message in str(error.value)
