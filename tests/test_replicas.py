"""One data-parallel replica standing for all (simulator.workload.replicas).

The reference is the full workload, every replica's ops simulated flow by flow on the same
topology: the replica's replay must give every op the same times (to rounding), every link
the same bytes and busy time, and the same number of flows represented; where the
symmetry breaks, the replay must say so and fall back to the full workload.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.topology import load_topology
from simulator.topology.symmetry import server_permutation
from simulator.workload.engine import WorkloadReplay
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown


def _both(topology: str, servers: int, model: str = "gpt3-175b", graph=None, algorithm=None, **kw):
    # SC'21's options keep these flow-by-flow references small (one DP call per stage);
    # test_megatron_core_defaults_stand_for_all runs today's defaults.
    kw.setdefault("defaults", "sc21")
    full = megatron(model, **kw)
    one = megatron(model, replicas=True, **kw)
    graph = load_topology(topology, servers) if graph is None else graph
    runs = [WorkloadReplay(w, graph, algorithm=algorithm).run() for w in (full, one)]
    return full, one, *runs


def _assert_same(full, one, run_full, run_one):
    index = {op.id: op.index for op in full.ops}
    mine = np.array([op.index for op in one.ops])
    theirs = np.array([index[op.id] for op in one.ops])
    step = breakdown(run_full).step_s
    for name in ("issue_s", "start_s", "end_s"):
        a = getattr(run_full.records, name)[theirs]
        b = getattr(run_one.records, name)[mine]
        assert np.allclose(a, b, rtol=0, atol=1e-9 * step), name
    # Every link of every replica carried the same bytes for the same time.
    n = len(run_full.links["bytes"])
    for name in ("bytes", "busy_s"):
        a = np.array(run_full.links[name])
        b = np.array(run_one.links[name])[:n]
        assert np.allclose(a, b, rtol=1e-12, atol=1e-9 * max(a.max(), 1.0)), name
    assert run_one.stats.represented_flows == pytest.approx(run_full.stats.represented_flows)
    a, b = breakdown(run_full).summary(), breakdown(run_one).summary()
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key


def test_megatron_core_defaults_stand_for_all():
    """Megatron-Core's defaults (sequence parallelism, the distributed optimizer with its
    reduce-scatters overlapped bucket by bucket and its parameter all-gathers at the
    step's start, TP collectives beside the GEMMs, flash attention): one replica
    stands for 4, op for op and link for link."""
    from simulator.workload.model import Transformer

    small = Transformer(layers=8, hidden=2048, seq=1024, vocab=32000, heads=16)
    full, one, run_full, run_one = _both(
        "dgx-h100", 8, model=small, tp=8, pp=2, dp=4, global_batch=16, defaults="megatron-core"
    )
    labels = {op.label for op in one.ops}
    assert {"DP parameters", "DP gradients"} <= labels
    assert any(op.stream == "tp" for op in one.ops)  # TP overlap
    assert run_one.replicas == {"count": 4, "simulated": 1}
    _assert_same(full, one, run_full, run_one)


@pytest.mark.parametrize("dp", [2, 4])
def test_one_replica_stands_for_all(dp):
    full, one, run_full, run_one = _both("dgx-a100", 2 * dp, tp=8, pp=2, dp=dp, global_batch=2 * dp)
    assert len(one.ops) * dp == len(full.ops)  # the first replica's ops only
    assert run_one.replicas == {"count": dp, "simulated": 1}
    # Fewer flows simulated stand for all of them.
    assert run_one.stats.flows < run_full.stats.flows
    _assert_same(full, one, run_full, run_one)


def test_replicas_smaller_than_a_server_go_together():
    # TP 4 on 8-GPU servers: a replica is half a server, two replicas fill one; NCCL's
    # DP ring (two GPUs per server, every server alike) repeats every server, but not
    # every half server: two replicas stand for the next two.
    full, _one, run_full, run_one = _both("dgx-a100", 8, tp=4, pp=2, dp=8, global_batch=8)
    assert run_one.replicas == {"count": 8, "simulated": 2}
    assert len(run_one.workload.ops) * 4 == len(full.ops)
    _assert_same(full, run_one.workload, run_full, run_one)


def test_sharded_optimizer_overlapped_with_nvls():
    full, one, run_full, run_one = _both(
        "dgx-h100",
        4,
        tp=8,
        pp=2,
        dp=2,
        global_batch=8,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
    )
    assert run_one.replicas == {"count": 2, "simulated": 1}
    _assert_same(full, one, run_full, run_one)


def test_interleaved_stages_with_sequence_parallelism():
    full, one, run_full, run_one = _both(
        "dgx-a100",
        8,
        tp=8,
        pp=4,
        dp=2,
        global_batch=8,
        virtual_stages=2,
        sequence_parallel=True,
    )
    assert run_one.replicas["simulated"] == 1
    _assert_same(full, one, run_full, run_one)


def test_a_slower_nic_in_one_replica_falls_back_to_every_replica():
    graph = load_topology("dgx-a100", 4)
    u, v = next(
        (u, v)
        for u, v, data in graph.edges(data=True)
        if str(u).startswith("s3/nic0") or str(v).startswith("s3/nic0")
    )
    graph.edges[u, v]["bandwidth"] = graph.edges[u, v]["bandwidth"] / 2
    full, _one, run_full, run_one = _both(
        "dgx-a100", 4, graph=graph, tp=8, pp=2, dp=2, global_batch=4
    )
    assert run_one.replicas["simulated"] == "all"
    assert "does not look the same" in run_one.replicas["why"]
    assert len(run_one.workload.ops) == len(full.ops)
    assert breakdown(run_one).step_s == breakdown(run_full).step_s


def test_a_ring_over_whole_servers_takes_replicas_one_by_one():
    # DP x CP groups of 8 over 4 servers, two GPUs each (a replica's CP pair fills a
    # server's half): NCCL's ring repeats every server, and one replica moves whole
    # servers' worth of the ring on, so one stands for the others.
    full, _one, run_full, run_one = _both(
        "dgx-h100", 8, tp=4, pp=2, dp=4, cp=2, global_batch=8, distributed_optimizer=True
    )
    assert run_one.replicas == {"count": 4, "simulated": 1}
    _assert_same(full, run_one.workload, run_full, run_one)


def test_replicas_sharing_servers_stand_for_all_by_moving_gpus():
    # The two replicas of TP 4 share both servers: no fewer than all of them move whole
    # servers, but moving GPU i to GPU i + 4 in each server (its NIC and rail with it)
    # maps the cluster onto itself, so one replica stands for both (issue 31), op for
    # op and link for link.
    full, _one, run_full, run_one = _both("dgx-a100", 2, tp=4, pp=2, dp=2, global_batch=2)
    assert run_one.replicas == {"count": 2, "simulated": 1}
    _assert_same(full, run_one.workload, run_full, run_one)


def test_replicas_inside_one_server_stand_for_all():
    # Four replicas of TP 2 in one server: moving GPU i to GPU i + 2 (NIC and rail with
    # it) maps the server onto itself, so one stands for the four (issue 31; before,
    # every replica was built), op for op and link for link with the full build.
    kw = dict(tp=2, pp=1, dp=4, global_batch=4, defaults="sc21")
    full = megatron("llama3-8b", **kw)
    one = megatron("llama3-8b", replicas=True, **kw)
    graph = load_topology("dgx-a100", 1)
    run_full, run_one = (WorkloadReplay(w, graph).run() for w in (full, one))
    assert run_one.replicas == {"count": 4, "simulated": 1}
    _assert_same(full, one, run_full, run_one)


def test_mixture_of_experts_builds_whole_ep_groups_of_replicas():
    # EP groups of 2 replicas out of 4: the ops of the first 2 replicas are built,
    # standing for the next 2 (tests/test_moe_runs.py: the same step as every rank).
    kw = dict(tp=1, pp=1, dp=4, ep=2, global_batch=4)
    one = megatron("mixtral-8x7b", replicas=True, **kw)
    assert one.replicas is not None and one.replicas.unit == 2
    assert 2 * len(one.ops) == len(megatron("mixtral-8x7b", **kw).ops)


def test_server_permutation_maps_the_fabric_and_refuses_what_is_not_one():
    graph = load_topology("dgx-a100", 4)
    phi = server_permutation(graph, [2, 3, 0, 1])
    # Each server's nodes land on the same positions of its image.
    assert phi["s0/gpu5"] == "s2/gpu5" and phi["s3/nic7"] == "s1/nic7"
    # A map of servers that is not a permutation, or that a slow link breaks, is none.
    assert server_permutation(graph, [0, 0, 1, 2]) is None
    u, v = next((u, v) for u, v in graph.edges() if str(u).startswith("s1/"))
    graph.edges[u, v]["bandwidth"] = 1.0
    assert server_permutation(graph, [1, 0, 2, 3]) is None
    assert server_permutation(graph, [0, 1, 3, 2]) is not None  # servers 2 and 3 alike


def test_ccsim_run_of_a_spec_with_replicas_says_so_and_gives_the_full_step(tmp_path, capsys):
    from simulator.cli import main

    spec = (
        "format: ccsim-workload-spec/1\ngenerator: megatron\nmodel: gpt3-175b\n"
        "tp: 8\npp: 2\ndp: 2\nmicro_batch: 1\nglobal_batch: 4\n"
    )
    steps = {}
    for replicas in (False, True):
        path = tmp_path / f"step-{replicas}.yaml"
        path.write_text(spec + f"replicas: {str(replicas).lower()}\n")
        assert main(["run", str(path), "--topology", "dgx-a100", "--format", "json"]) == 0
        steps[replicas] = capsys.readouterr().out

    full, one = (json.loads(steps[r])[0] for r in (False, True))
    for key in ("step_s", "exposed_s", "bubble_s"):
        assert one[key] == pytest.approx(full[key], rel=1e-9), key
    assert one["step_s"] == pytest.approx(full["step_s"], rel=1e-12)
    assert main(["run", str(tmp_path / "step-True.yaml"), "--topology", "dgx-a100"]) == 0
    assert "1 of 2 DP replicas simulated (alike)" in capsys.readouterr().out


def test_routes_through_the_nics_are_checked_against_their_images():
    import simpy

    from simulator.algorithms.schedule import PATH_NETWORK, Schedule
    from simulator.network.flows import FlowNetwork
    from simulator.workload.replicas import Asymmetric, replica_symmetry

    step = megatron("gpt3-175b", tp=8, pp=1, dp=4, global_batch=4, replicas=True)
    graph = load_topology("dgx-a100", 4)
    network = FlowNetwork(simpy.Environment(), graph)
    symmetry, why = replica_symmetry(step, network)
    assert symmetry is not None, why
    # One transfer from rank 0 to rank 8 forced through the NICs (a special route, routed
    # image by image): its images really are the routes of the images.
    send = Schedule(
        op="broadcast", algorithm="p2p", ranks=2, size_bytes=1.0, src=[0], dst=[1],
        nbytes=[1.0], segment=[0], reduce=[False], dep_ptr=[0, 0], dep_idx=[],
        dep_sent=[], segment_owner=[0], path=[PATH_NETWORK],
    )  # fmt: skip
    symmetry.check_routes(network, send, np.array([0, 8]))
    # With a wrong link map the same routes are not each other's images: refused.
    symmetry._checked.clear()
    symmetry._pairs_checked.clear()
    symmetry.psi = np.arange(len(symmetry.psi))
    with pytest.raises(Asymmetric, match="not the same in every replica"):
        symmetry.check_routes(network, send, np.array([0, 8]))


def test_routes_checked_once_per_pairs_whatever_the_call():
    """A call whose (rank, rank, channel, path) pairs were checked is not checked again
    (its routes are those of the pairs), whatever its size; other pairs are. Shown with
    a wrong link map set after the first check: only new pairs meet it."""
    import simpy

    from simulator.algorithms.schedule import PATH_NETWORK, Schedule
    from simulator.network.flows import FlowNetwork
    from simulator.workload.replicas import Asymmetric, replica_symmetry

    step = megatron("gpt3-175b", tp=8, pp=1, dp=4, global_batch=4, replicas=True)
    network = FlowNetwork(simpy.Environment(), load_topology("dgx-a100", 4))
    symmetry, why = replica_symmetry(step, network)
    assert symmetry is not None, why

    def send(size: float, src: list[int], dst: list[int]) -> Schedule:
        n = len(src)
        return Schedule(
            op="broadcast", algorithm="p2p", ranks=2, size_bytes=size, src=src, dst=dst,
            nbytes=[size] * n, segment=[0] * n, reduce=[False] * n, dep_ptr=[0] * (n + 1),
            dep_idx=[], dep_sent=[], segment_owner=[0], path=[PATH_NETWORK] * n,
        )  # fmt: skip

    symmetry.check_routes(network, send(1.0, [0], [1]), np.array([0, 8]))
    psi = symmetry.psi
    symmetry.psi = np.arange(len(symmetry.psi))
    # The same pair, twice in one call of another size: already checked.
    symmetry.check_routes(network, send(2.0, [0, 0], [1, 1]), np.array([0, 8]))
    # Another pair (rank 8 to rank 0) is checked, and meets the wrong map.
    with pytest.raises(Asymmetric, match="not the same in every replica"):
        symmetry.check_routes(network, send(1.0, [1], [0]), np.array([0, 8]))
    # Several calls at once (a send's images, one a row) are each checked: with the
    # right map every row passes, and each is then known alone.
    symmetry.psi = psi
    one = send(1.0, [0], [1])
    symmetry.check_routes(network, one, np.array([[8, 16], [16, 24], [24, 0]]))
    symmetry.psi = np.arange(len(symmetry.psi))
    symmetry.check_routes(network, one, np.array([16, 24]))
    # A batch with a pair not seen yet meets the wrong map.
    with pytest.raises(Asymmetric, match="not the same in every replica"):
        symmetry.check_routes(network, one, np.array([[8, 16], [0, 24]]))


def test_pxn_routes_between_rails_follow_their_images_without_a_search():
    import simpy

    from simulator.algorithms.schedule import PATH_PXN
    from simulator.network.flows import FlowNetwork
    from simulator.workload.replicas import replica_symmetry

    # TP 4 on 8-GPU servers, two replicas to a server: the data-parallel ring goes from
    # local GPU 4 of one server to local GPU 0 of the next, through server 0's GPU 0
    # (PXN) and rail 0. Both legs are single paths on a rail-optimized fabric, so the
    # route's images need no search; the router's own routes of the images agree.
    step = megatron("gpt3-175b", tp=4, pp=1, dp=8, global_batch=8, replicas=True)
    step = step.replicas.build(2 * step.replicas.unit)
    for fabric in ("rail-optimized", "leaf-spine"):
        graph = load_topology("dgx-h100", 4, fabric=fabric)
        network = FlowNetwork(simpy.Environment(), graph)
        symmetry, why = replica_symmetry(step, network)
        assert symmetry is not None, why
        router = network.router
        pairs = np.array([[4, 8, 0, PATH_PXN], [4, 8, 0, 0]])
        # Only the PXN row is taken as following; a plain row is not this shortcut's.
        assert symmetry._images_follow(router, pairs).tolist() == [True, False]
        assert router.pxn_via(4, 8) == 0
        route = int(router.pxn_route_ids(np.array([4]), np.array([8]))[0])
        ptr, flat, _ = router.arrays()
        links = flat[ptr[route] : ptr[route + 1]]
        a, b = 4, 8
        for _ in range(1, symmetry.count):
            a, b, links = int(symmetry.shift[a]), int(symmetry.shift[b]), symmetry.psi[links]
            image = int(router.pxn_route_ids(np.array([a]), np.array([b]))[0])
            ptr, flat, _ = router.arrays()
            assert flat[ptr[image] : ptr[image + 1]].tolist() == links.tolist()


def test_data_parallel_rings_over_the_replicas_are_built_as_representatives_only():
    # NCCL's rings over the 8 replicas: their representatives are built directly (a
    # ring over hundreds of replicas is never built whole), and the step is still the
    # one every replica built gives.
    full, one, run_full, run_one = _both(
        "dgx-a100", 8, tp=8, pp=1, dp=8, global_batch=8, defaults="megatron-core"
    )
    _assert_same(full, run_one.workload, run_full, run_one)
    replay = WorkloadReplay(one, load_topology("dgx-a100", 8))
    replay.run()
    spanning = [call for key, call in replay._calls.items() if key[-1] is not None]
    assert spanning and all(built for *_, built in spanning)
