"""Sends between servers as NCCL routes them: through the GPU of the receiver's device
index on the sender's host when the send's communicator has one there (NCCL's PXN for
point-to-point, ``simulator.library.nccl_p2p.p2p_proxy``).

The timings are worked by hand from the topology's figures (a flow is delivered after
its route's latency plus its bytes at its slowest link's rate); the shortcuts (TP
shadows, one DP replica) are held bit-identical to the build of every rank.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import CcsimError, TopologyError
from simulator.library.nccl_env import parse_nccl_env
from simulator.library.nccl_p2p import p2p_relays
from simulator.network.routing import LinkTable, Router
from simulator.topology.builders import fabric_spec
from simulator.topology.presets import load_topology, preset, preset_graph
from simulator.workload import load_workload, run_workload
from simulator.workload.generators import megatron

#: Two servers of two GPUs: NVLink 400 GB/s (1 us a link), one 400 Gb/s NIC per GPU
#: behind 60 GB/s of PCIe (2 us), NIC k of each server on leaf k, one spine; every
#: switch adds 3 us (half on each of its links: simulator/topology/fabrics/base.py).
#: Efficiencies of 1: a flow moves at its slowest link's rate.
TWO_BY_TWO = {
    "name": "two-by-two",
    "server": {
        "gpus": 2,
        "intra": {"kind": "nvswitch", "bandwidth": "400GB/s", "latency": "1us"},
        "nic": {
            "bandwidth": "400Gbps",
            "latency": "0us",
            "pcie": {"bandwidth": "60GB/s", "latency": "2us"},
        },
    },
    "fabric": {"type": "rail-optimized", "latency": "3us", "spines": 1},
    "nccl": {"launch": "0us", "efficiency": {"nvlink": 1.0, "pcie": 1.0, "rdma": 1.0}},
}
NBYTES = 100e6


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
    import yaml

    path = tmp_path_factory.mktemp("topo") / "two-by-two.yaml"
    path.write_text(yaml.safe_dump(TWO_BY_TWO))
    return load_topology(str(path), nodes=2)


def _one_send(comms, graph, nccl=None):
    """Rank 1 (server 0, device 1) sends NBYTES to rank 2 (server 1, device 0)."""
    workload = load_workload(
        {
            "format": "ccsim-workload/1",
            "name": "one-send",
            "ranks": 4,
            "ops": [
                {"id": "s", "rank": 1, "kind": "send", "peer": 2, "bytes": NBYTES},
                {"id": "r", "rank": 2, "kind": "recv", "peer": 1, "bytes": NBYTES},
            ],
        }
    )
    workload.p2p_comms = comms
    run, _ = run_workload(workload, graph, nccl=nccl)
    return run.records.end_s


def test_relay_worked_by_hand(two_by_two):
    router = Router(two_by_two, LinkTable(two_by_two))
    hosts, devices = router.hosts()
    assert devices == [0, 1, 0, 1]
    servers = [host[0] for host in hosts]
    # One communicator of all four ranks: each cross-server send leaves through the
    # sender's server's GPU of the receiver's device index.
    relays = p2p_relays([[0, 1, 2, 3]], hosts, devices, servers, router.can_relay)
    assert relays == {(0, 3): 1, (1, 2): 0, (2, 1): 3, (3, 0): 2}
    # Each send on its own pair's communicator (PyTorch's isend alone): none.
    assert p2p_relays([[1, 2], [0, 3]], hosts, devices, servers, router.can_relay) == {}
    route = int(router.relay_route_ids([1], [0], [2])[0])
    assert router.path_nodes(route) == [
        "s0/gpu1", "s0/nvswitch", "s0/gpu0", "s0/nic0", "leaf0", "s1/nic0", "s1/gpu0"
    ]  # fmt: skip
    direct = int(router.route_ids(np.array([1]), np.array([2]))[0])
    assert router.path_nodes(direct) == [
        "s0/gpu1", "s0/nic1", "leaf1", "spine0", "leaf0", "s1/nic0", "s1/gpu0"
    ]  # fmt: skip
    # Through rank 0: two NVLink hops (1 us each), two PCIe links (2 us each), one
    # switch (3 us); 100 MB at the NIC's 50 GB/s.
    relayed = 2 * 1e-6 + 2 * 2e-6 + 3e-6 + NBYTES / 50e9
    # Directly: three switches (leaf, spine, leaf), two PCIe links.
    straight = 3 * 3e-6 + 2 * 2e-6 + NBYTES / 50e9
    assert _one_send(((0, 1, 2, 3),), two_by_two) == pytest.approx([relayed] * 2, rel=1e-12)
    assert _one_send(None, two_by_two) == pytest.approx([straight] * 2, rel=1e-12)


def test_pxn_level_zero_keeps_the_direct_route(two_by_two):
    alone = _one_send(None, two_by_two)
    off = _one_send(((0, 1, 2, 3),), two_by_two, nccl="NCCL_P2P_PXN_LEVEL=0")
    assert off.tolist() == alone.tolist()  # bit for bit
    assert _one_send(((0, 1, 2, 3),), two_by_two, nccl="NCCL_P2P_PXN_LEVEL=1")[0] < alone[0]


def test_pxn_level_parsed():
    assert parse_nccl_env(None).p2p_pxn_level == 2  # NCCL's default (search.cc:1274)
    env = parse_nccl_env("NCCL_P2P_PXN_LEVEL=0")
    assert env.p2p_pxn_level == 0 and env.text == "NCCL_P2P_PXN_LEVEL=0"
    with pytest.raises(CcsimError, match="NCCL_P2P_PXN_LEVEL=3: valid values: 0, 1, 2"):
        parse_nccl_env("NCCL_P2P_PXN_LEVEL=3")


def _graph(data: dict, nodes: int):
    data = {**data, "fabric": fabric_spec(data.get("fabric"), None)}
    return preset_graph(data, nodes, name=str(data["name"]), source="test")


def test_host_gpus_must_divide_the_server():
    spec = {**TWO_BY_TWO, "server": {**TWO_BY_TWO["server"], "gpus": 6, "host_gpus": 4}}
    with pytest.raises(TopologyError, match="host_gpus is 4; it must divide the GPU count 6"):
        _graph(spec, 1)


def _racks(
    gpus_per_rack: int,
    racks: int,
    trays: bool = True,
    spines: int | None = None,
    routing: str | None = None,
):
    """GB200 NVL72 racks of ``gpus_per_rack`` GPUs each (trays of 4, as the preset
    says, unless ``trays`` is False: one host a rack), over ``spines`` spines (None: the
    fabric's own count), routed as ``routing`` says (None: the stack's default, per
    destination on InfiniBand)."""
    data = preset("gb200-nvl72")
    server = {**data["server"], "gpus": gpus_per_rack}
    if not trays:
        server.pop("host_gpus")
    fabric = dict(data["fabric"]) if spines is None else {**data["fabric"], "spines": spines}
    if routing is not None:
        fabric["routing"] = routing
    return _graph({**data, "server": server, "fabric": fabric}, racks)


def test_gb200_relays_only_within_a_tray():
    """A PP group of stride 32 over two racks of 64 GPUs (Qwen3 235B's layout on 256
    GB200: TP 1, DP 32): its GPUs of one rack sit on different trays, so NCCL finds no
    GPU of the communicator on the sender's tray to relay through (topo.h:250 at
    v2.28.9-1), though one of the receiver's rack position is on its rack."""
    graph = _racks(64, 2)
    router = Router(graph, LinkTable(graph))
    hosts, devices = router.hosts()
    assert devices[:9] == [0, 1, 2, 3, 0, 1, 2, 3, 0]  # four GPUs a tray
    assert hosts[37] == (0, 9) and hosts[64 + 5] == (1, 1)
    servers = [host[0] for host in hosts]
    comms = [[x, 32 + x, 64 + x, 96 + x] for x in range(32)]
    assert p2p_relays(comms, hosts, devices, servers, router.can_relay) == {}
    # Seen as one host a rack (no trays), the same layout would relay stage 1's sends
    # to stage 2 through stage 0's GPU of the receiver's position.
    whole = _racks(64, 2, trays=False)
    router = Router(whole, LinkTable(whole))
    hosts, devices = router.hosts()
    relays = p2p_relays(comms, hosts, devices, [h[0] for h in hosts], router.can_relay)
    assert relays[(32 + 5, 64 + 5)] == 5


def _op_times(run) -> list[tuple[str, float, float]]:
    records = run.records
    return sorted(
        (op.id, float(records.start_s[op.index]), float(records.end_s[op.index]))
        for op in run.workload.ops
    )


@pytest.mark.parametrize("shortcuts", [True, False])
def test_megatron_batched_sends_relay(shortcuts):
    """TP 4 PP 4 on two DGX H100 without interleaving: Megatron batches each exchange
    over the pipeline group, whose GPUs of devices t and 4 + t share a server, so stage
    1 (device 4 + t) sends to stage 2 (device t of the next server) through stage 0's
    GPU t, and stage 2 back to stage 1 through stage 3's GPU 4 + t."""
    workload = megatron(
        "llama3-8b", tp=4, pp=4, dp=1, micro_batch=1, global_batch=8,
        shadows=shortcuts, replicas=shortcuts,
    )  # fmt: skip
    assert workload.p2p_comms == tuple((t, 4 + t, 8 + t, 12 + t) for t in range(4))
    graph = load_topology("dgx-h100", nodes=2)
    router = Router(graph, LinkTable(graph))
    hosts, devices = router.hosts()
    relays = p2p_relays(workload.p2p_comms, hosts, devices, [h[0] for h in hosts], router.can_relay)
    # (Rank 5 to rank 13, device 5, and 9 to 1, device 1: the sender is that GPU.)
    assert {k: v for k, v in relays.items() if k[0] in (5, 9)} == {(5, 9): 1, (9, 5): 13}
    run, _ = run_workload(workload, graph)
    full, _ = run_workload(megatron(
        "llama3-8b", tp=4, pp=4, dp=1, micro_batch=1, global_batch=8,
        shadows=False, replicas=False,
    ), graph)  # fmt: skip
    assert _op_times(run) == _op_times(full)  # the shortcuts stand aside, bit for bit
    if shortcuts:
        assert "NCCL's PXN" in run.shadows["why"]


def test_megatron_interleaved_sends_go_direct():
    """With interleaving Megatron overlaps the exchanges with isend/irecv on their own
    (batch_p2p_comm = not overlap_p2p_comm), each on its two ranks' communicator: no
    other GPU of it can relay, and the run equals NCCL_P2P_PXN_LEVEL=0's bit for bit."""
    options = dict(
        tp=4, pp=4, dp=1, micro_batch=1, global_batch=8, virtual_stages=2,
        shadows=False, replicas=False,
    )  # fmt: skip
    workload = megatron("llama3-8b", **options)
    assert workload.p2p_comms is None
    graph = load_topology("dgx-h100", nodes=2)
    run, _ = run_workload(workload, graph)
    off, _ = run_workload(megatron("llama3-8b", **options), graph, nccl="NCCL_P2P_PXN_LEVEL=0")
    assert _op_times(run) == _op_times(off)


@pytest.mark.parametrize(
    "tp, pp, dp, vp, spines, routing, stand_in",
    [
        # Interleaved: each send on its pair's communicator, across rails; over one
        # spine each has one shortest path and both shortcuts stand in.
        (2, 4, 4, 2, 1, None, True),
        # Several spines under ECMP: a send's images hash elsewhere.
        (2, 4, 4, 2, None, "ecmp", False),
        # Several spines routed per destination (InfiniBand's subnet manager): a send's
        # image comes down its destination's spine, the image of the send's: both stand in.
        (2, 4, 4, 2, None, None, True),
        # Batched over PP groups with two GPUs a tray: relayed sends.
        (2, 16, 1, 1, 1, None, False),
    ],
)
def test_gb200_shortcuts_equal_the_full_build_across_racks(
    tp, pp, dp, vp, spines, routing, stand_in
):
    """Two GB200 racks of 16 GPUs (trays of 4), pipeline sends from one rack to the
    next: from rack position 8 + x to x (other rails) with interleaving; at TP 2 DP 1
    without it, stage 7 (positions 14-15, tray 3) sends to stage 8 (positions 0-1 of
    the next rack) through stage 6's GPUs (12-13, tray 3). Whatever the shortcuts
    decide, every op's times equal those of the build of every rank."""
    graph = _racks(16, 2, spines=spines, routing=routing)
    options = dict(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=32, virtual_stages=vp)
    short = megatron("llama3-8b", **options, shadows=True, replicas=True)
    if vp == 1:
        router = Router(graph, LinkTable(graph))
        hosts, devices = router.hosts()
        relays = p2p_relays(
            short.p2p_comms, hosts, devices, [h[0] for h in hosts], router.can_relay
        )
        assert relays[(14, 16)] == 12 and relays[(15, 17)] == 13
    run, _ = run_workload(short, graph)
    assert (run.shadows["simulated"] == 1) == stand_in
    assert (run.replicas.get("simulated") == 1) == stand_in
    full, _ = run_workload(megatron("llama3-8b", **options, shadows=False, replicas=False), graph)
    if not stand_in:
        assert _op_times(run) == _op_times(full)  # every rank built: bit for bit
        return
    # The ranks simulated, to 1e-9 of the step (the shortcuts' own tests' bound: sums
    # taken in another order differ in their last bits).
    every = {op_id: (start, end) for op_id, start, end in _op_times(full)}
    step = max(end for _, end in every.values())
    for op_id, start, end in _op_times(run):
        assert every[op_id] == pytest.approx((start, end), abs=1e-9 * step), op_id
