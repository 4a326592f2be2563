"""Routing per destination (InfiniBand's subnet manager) against ECMP's hash per connection.

OpenSM's fat-tree engine (linux-rdma/opensm osm_ucast_ftree.c) gives each destination
port one up-port per switch, taking each leaf's ports in turn over its up-links, and
its documentation states the design goal: "congestion-free shift communication
pattern" (opensm doc/current-routing.txt, "Fat-tree Unicast routing algorithm"). These
tests work that out by hand on small trees and hold the router to it.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import networkx as nx
import numpy as np
import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.network.routing import LinkTable, Router, subnet_manager_chains
from simulator.topology import cluster_graph, load_topology

#: One GPU and one NIC a server: rank r is server r, NIC r.
ONE_GPU = {"gpus": 1, "nic": {"bandwidth": "400Gbps"}}


def two_level(routing: str | None = None, seed: int = 0) -> nx.Graph:
    """16 hosts, 4 to a leaf, 4 leaves each cabled to the same 4 spines (1:1): a
    two-level fat tree where host h sits on leaf h // 4 at port h % 4."""
    fabric = {"type": "leaf-spine", "servers_per_leaf": 4, "spines": 4, "seed": seed}
    if routing is not None:
        fabric["routing"] = routing
    return cluster_graph(ONE_GPU, 16, fabric=fabric)


def routes(router: Router, src, dst, labels=None) -> list[list]:
    ids = router.route_ids(np.asarray(src), np.asarray(dst), labels)
    return [router.path_nodes(int(r)) for r in ids]


def switch_links(paths: list[list]) -> Counter:
    """How many of ``paths`` cross each directed switch-to-switch link."""
    return Counter(
        (a, b)
        for path in paths
        for a, b in pairwise(path)
        if str(a).startswith(("leaf", "spine", "pod", "core"))
        and str(b).startswith(("leaf", "spine", "pod", "core"))
    )


def test_infiniband_presets_route_per_destination_and_ethernet_stacks_hash():
    """The default follows the NICs' stack: InfiniBand (dgx-h100 names none: the
    default stack) per destination, TCPXO (a3-mega, Ethernet) by the hash; the fabric
    section's ``routing`` overrides it."""
    assert Router(*_graph_links(load_topology("dgx-h100", 2))).routing == "per_destination"
    assert Router(*_graph_links(load_topology("a3-mega", 2))).routing == "ecmp"
    assert two_level("ecmp").graph["routing"] == "ecmp"
    assert two_level().graph["routing"] == "per_destination"


def _graph_links(graph: nx.Graph) -> tuple[nx.Graph, LinkTable]:
    return graph, LinkTable(graph)


def test_each_leaf_deals_its_ports_round_robin_over_the_spines():
    """The engine's chains by hand: leaf l's port p (host 4 l + p) comes down from spine
    p, on every leaf (each leaf's least-loaded up-link in turn, from the first)."""
    graph = two_level()
    chains = subnet_manager_chains(graph)
    for host in range(16):
        assert chains[f"s{host}/nic0"] == (f"leaf{host // 4}", f"spine{host % 4}")


@pytest.mark.parametrize("shift", range(1, 16))
def test_a_shift_is_congestion_free_per_destination(shift):
    """Host h sends to h + shift (mod 16). Per destination, the flow to host d climbs to
    spine d % 4. The four hosts of a leaf send to four consecutive hosts, whose ports
    (d % 4) are distinct: four different up-links; the four flows into a leaf come from
    four consecutive hosts through spines d % 4, distinct again. So no switch link
    carries two flows, for every shift."""
    router = Router(*_graph_links(two_level()))
    hosts = np.arange(16)
    paths = routes(router, hosts, (hosts + shift) % 16)
    for h, path in enumerate(paths):
        d = (h + shift) % 16
        if h // 4 != d // 4:
            assert path[3] == f"spine{d % 4}"
    counts = switch_links(paths)
    assert counts and max(counts.values()) == 1


def test_the_same_shift_collides_under_ecmp():
    """The same shift by 4 hashed per connection (seed 0): four flows out of each leaf
    onto four spines independently; a fair hash avoids every shared up-link with
    probability (4!/4^4)^4 < 1e-4, so some link carries two flows."""
    router = Router(*_graph_links(two_level("ecmp", seed=0)))
    hosts = np.arange(16)
    counts = switch_links(routes(router, hosts, (hosts + 4) % 16))
    assert max(counts.values()) >= 2


def test_flows_to_one_destination_share_its_spine_whatever_the_source_and_channel():
    """Every source, on any leaf and on any channel (label: NCCL's queue pairs), reaches
    host 6 (leaf 1, port 2) through spine 2: the forwarding table is per destination.
    Routes do not depend on the ECMP seed either, and are the same router after router."""
    sources = [0, 1, 3, 8, 13, 15]
    labels = np.arange(len(sources))
    for seed in (0, 7):
        router = Router(*_graph_links(two_level(seed=seed)))
        paths = routes(router, sources, [6] * len(sources), labels)
        assert {path[3] for path in paths} == {"spine2"}
        again = Router(*_graph_links(two_level(seed=seed)))
        assert paths == routes(again, sources, [6] * len(sources), labels)
    router = Router(*_graph_links(two_level()))
    for label in range(8):
        assert routes(router, [0], [6], np.array([label]))[0][3] == "spine2"


def test_a_three_level_fat_tree_routes_shifts_without_shared_links():
    """The k = 4 fat-tree (16 hosts; 4 pods of 2 edge and 2 aggregation switches; 4
    cores). The engine deals an edge's two ports over its two aggregation switches and
    each aggregation switch's destinations over its two cores in turn, which is the
    d-mod-k rule (Zahavi et al.): the destination's port picks the aggregation switch,
    its edge switch the core. Every shift is then routed with no switch link carrying
    two flows."""
    graph = cluster_graph(ONE_GPU, 16, fabric={"type": "fat-tree", "k": 4})
    chains = subnet_manager_chains(graph)
    for host in range(16):
        pod, edge, port = host // 4, host // 2 % 2, host % 2
        assert chains[f"s{host}/nic0"] == (
            f"pod{pod}/edge{edge}",
            f"pod{pod}/agg{port}",
            f"core{2 * port + edge}",
        )
    router = Router(*_graph_links(graph))
    hosts = np.arange(16)
    for shift in range(1, 16):
        counts = switch_links(routes(router, hosts, (hosts + shift) % 16))
        assert max(counts.values()) == 1, shift


def test_an_unknown_routing_is_refused_with_the_field_and_the_choices():
    with pytest.raises(CcsimError, match=r"fabric\.routing.*per_destination, ecmp"):
        two_level("adaptive")


def test_routing_override_reaches_the_router_and_bad_values_exit_2(capsys):
    """``load_topology(routing=...)`` (``--routing``) overrides the stack's default on a
    preset and on a graph; an unknown mode is one line naming ``--routing`` and the
    choices, exit 2."""
    graph = load_topology("dgx-h100", 2, routing="ecmp")
    assert Router(*_graph_links(graph)).routing == "ecmp"
    again = load_topology(graph, routing="per_destination")
    assert again.graph["routing"] == "per_destination" and graph.graph["routing"] == "ecmp"
    with pytest.raises(CcsimError, match=r"--routing.*per_destination, ecmp"):
        load_topology("dgx-h100", 2, routing="spray")
    args = ["collective", "all_reduce", "--sizes", "1MiB", "--topology", "dgx-h100", "--nodes", "2"]
    assert main([*args, "--routing", "spray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--routing" in err[0] and "per_destination, ecmp" in err[0]
