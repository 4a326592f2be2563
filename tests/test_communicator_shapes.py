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
