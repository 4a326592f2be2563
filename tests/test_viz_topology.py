"""The topology drawing (``ccsim topology show --png``): a legend of node kinds and link
classes with their bandwidths, names drawn once rather than on every server."""

from pathlib import Path

import networkx as nx
import yaml

from simulator.cli import main
from simulator.topology import load_topology
from simulator.viz.topology import LINKS_HEADING, NODES_HEADING, topology_figure

PRESETS = Path(__file__).parents[1] / "topologies"


def legend_texts(fig) -> list[str]:
    (legend,) = fig.legends
    return [text.get_text() for text in legend.get_texts()]


def drawn_names(fig) -> list[str]:
    return [text.get_text() for ax in fig.axes for text in ax.texts]


def test_the_legend_names_every_node_kind_with_its_count():
    fig = topology_figure(load_topology("dgx-h100", 2))
    texts = legend_texts(fig)
    nodes = texts[texts.index(NODES_HEADING) + 1 : texts.index(LINKS_HEADING)]
    # Two DGX H100 servers on the rail-optimized fabric: 8 GPUs, 8 NICs and an NVSwitch
    # each; one leaf per rail (8) under 2 spines.
    assert nodes == [
        "GPU x16 (H100-SXM5-80GB)",
        "NVSwitch x2",
        "NIC x16",
        "leaf switch x8",
        "spine switch x2",
    ]


def test_link_classes_carry_the_bandwidths_of_the_preset_file():
    preset = yaml.safe_load((PRESETS / "dgx-h100.yaml").read_text())
    nvlink = preset["server"]["intra"]["bandwidth"]  # "450GB/s"
    nic = preset["server"]["nic"]["bandwidth"]  # "400Gbps"
    fig = topology_figure(load_topology("dgx-h100", 2))
    texts = legend_texts(fig)
    links = texts[texts.index(LINKS_HEADING) + 1 :]
    nvlink_text = f"NVLink {nvlink.replace('GB/s', ' GB/s')}"
    nic_text = f"RDMA {nic.replace('Gbps', ' Gb/s')}"
    assert links[0] == f"{nvlink_text}  GPU-NVSwitch x16"  # fastest first
    assert f"{nic_text}  NIC-leaf switch x16" in links
    assert f"{nic_text}  leaf switch-spine switch x16" in links
    # Every link is in exactly one class: the counts add up to the graph's links.
    counts = [int(text.rsplit("x", 1)[1]) for text in links]
    assert sum(counts) == load_topology("dgx-h100", 2).number_of_edges()
    # Each class is drawn in its own colour, the legend's line matching.
    (legend,) = fig.legends
    colours = {line.get_color() for line in legend.get_lines()[-len(links) :]}
    assert len(colours) == len({text.split()[0] for text in links})


def test_names_appear_once_and_each_server_is_named():
    graph = load_topology("dgx-h100", 2)
    names = drawn_names(topology_figure(graph))
    assert names.count("gpu0") == 1 and names.count("nic7") == 1  # not once per server
    assert names.count("nvswitch") == 1
    assert {"leaf0", "leaf7", "spine0", "spine1"} <= set(names)  # the fabric's own
    assert "server 0" in names and "server 1" in names


def test_a_graph_without_link_kinds_is_drawn_with_classes_named_by_their_ends():
    graph = nx.Graph(name="tiny")
    graph.add_node("g0", kind="gpu", rank=0)
    graph.add_node("g1", kind="gpu", rank=1)
    graph.add_node("sw", kind="switch", tier="leaf")
    graph.add_edge("g0", "sw", bandwidth=25e9)
    graph.add_edge("g1", "sw", bandwidth=25e9)
    texts = legend_texts(topology_figure(graph))
    assert texts == [
        NODES_HEADING,
        "GPU x2",
        "leaf switch x1",
        LINKS_HEADING,
        "gpu-switch 25 GB/s  GPU-leaf switch x2",
    ]


def test_cli_png_is_written(tmp_path, capsys):
    target = tmp_path / "t.png"
    assert main(["topology", "show", "ascend-910", "--nodes", "2", "--png", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.endswith(f"drawing written to {target}\n")


def test_docstring_examples_run():
    import doctest

    import simulator.viz.topology as module

    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
