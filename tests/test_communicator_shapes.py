"""Groups that see the same communicator share NCCL's decision (simulator.workload.engine).

The workload replay decides each group's collectives from NCCL's view of the group
(``communicator_view``); groups at the same positions of servers that are alike get one
view's decision. The reference is each group's own view."""

from __future__ import annotations

from simulator.collective.policy import library_policy
from simulator.topology import load_topology
from simulator.workload.engine import ServerIndex, communicator_view


def _system(graph, ranks):
    return library_policy("nccl", graph).system(communicator_view(graph, ranks))


def test_groups_on_alike_servers_share_a_shape_and_see_the_same_communicator():
    graph = load_topology("dgx-h100", 6)
    index = ServerIndex(graph)
    # Data-parallel groups of local GPU 0 and of local GPU 3, on different servers.
    a, b, c = [0, 8, 16], [24, 32, 40], [3, 11, 19]
    assert index.group_shape(a) == index.group_shape(b)
    assert index.group_shape(a) != index.group_shape(c)
    assert _system(graph, a) == _system(graph, b)
    # Two GPUs of one server and one of the next: the pattern of servers counts.
    assert index.group_shape([0, 1, 8]) != index.group_shape([0, 8, 16])


def test_a_server_unlike_the_others_gets_its_own_shape():
    graph = load_topology("dgx-h100", 4)
    graph.nodes["s2/nic0"]["bandwidth"] = 25e9  # one slower NIC on server 2
    index = ServerIndex(graph)
    a, b = [0, 8], [16, 24]
    assert index.group_shape(a) != index.group_shape(b)
    assert _system(graph, a) != _system(graph, b)  # NCCL sees the slower NIC


def _plain_signature(graph, server) -> bytes | None:
    """A server's signature formed as the definition says, nothing kept between
    nodes or servers: each node's place and attributes (but its server's name and its
    rank), then, where no link leaves the server, each link's ends and attributes."""
    import hashlib

    members = [(n, d) for n, d in graph.nodes(data=True) if d.get("server") == server]
    place = {node: i for i, (node, _) in enumerate(members)}
    digest = hashlib.blake2b(digest_size=16)
    for node, data in members:
        attributes = sorted((k, repr(v)) for k, v in data.items() if k not in ("server", "rank"))
        digest.update(repr((place[node], attributes)).encode())
    for node, _ in members:
        for other in graph.neighbors(node):
            if other not in place and graph.nodes[other].get("server") is not None:
                return None
    for u, v, data in graph.edges([node for node, _ in members], data=True):
        if v in place:
            ends = tuple(sorted((place[u], place[v])))
            digest.update(repr((ends, sorted((k, repr(x)) for k, x in data.items()))).encode())
    return digest.digest()


def test_signatures_are_those_formed_afresh_for_each_server():
    """The parts of a signature kept from server to server (servers alike repeat them)
    give each server the signature formed from its own nodes and links alone: on
    servers alike, on one with a slower NVLink, one whose NIC's attributes come in
    another order, one with an attribute no dict key can hold (a list), and one whose
    NVSwitch's ``nvls`` is 1 where the others' is True."""
    graph = load_topology("dgx-h100", 6)
    graph.edges["s1/gpu0", "s1/nvswitch"]["bandwidth"] = 300e9
    data = graph.nodes["s2/nic1"]
    items = list(data.items())
    data.clear()
    data.update(reversed(items))
    graph.nodes["s3/nic2"]["lanes"] = [1, 2]
    assert graph.nodes["s5/nvswitch"]["nvls"] is True
    graph.nodes["s5/nvswitch"]["nvls"] = 1  # equal to True, but not the same attribute
    index = ServerIndex(graph)
    servers = sorted({d["server"] for _, d in graph.nodes(data=True) if "server" in d})
    for server in servers:
        assert index._signature(server) == _plain_signature(graph, server)
    assert index._signature(0) == index._signature(2) == index._signature(4)
    assert index._signature(1) != index._signature(0)
    assert index._signature(3) != index._signature(0)
    assert index._signature(5) != index._signature(0)
