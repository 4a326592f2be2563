"""Workload replay with the topology's communication library: the default of ccsim run.

Each collective call runs what NCCL (or HCCL) chooses for its group, operation and size
on the group's own GPUs; the choice is recorded per call in ``WorkloadRun.choices``.
"""

import json

import pytest

from simulator import simulate_collective
from simulator.cli import main
from simulator.collective.guards import cluster_of
from simulator.collective.policy import HcclPolicy, NcclPolicy
from simulator.collective.run import run_schedule
from simulator.library.nccl import nccl_system
from simulator.topology import load_topology
from simulator.workload import WorkloadReplay, parse_workload, run_workload
from simulator.workload.engine import communicator_view
from simulator.workload.generators import ddp
from simulator.workload.guards import workload_estimate

MiB = 2**20


def calls(ranks, groups, op="all_reduce", nbytes=64 * MiB, repeat=1, compute="1ms"):
    """A trace: each rank computes, then runs ``repeat`` collectives on each of its
    groups (``groups``: name -> ranks) one after another on its comm stream."""
    ops = []
    for rank in range(ranks):
        ops.append({"id": f"r{rank}.c", "rank": rank, "kind": "compute", "duration": compute})
        for name, members in groups.items():
            if rank not in members:
                continue
            for i in range(repeat):
                ops.append({"id": f"r{rank}.{name}{i}", "rank": rank, "kind": "collective",
                            "op": op, "group": name, "bytes": nbytes,
                            "deps": [f"r{rank}.c"]})  # fmt: skip
    groups = {name: {"kind": "TP", "ranks": list(members)} for name, members in groups.items()}
    trace = {"format": "ccsim-workload/1", "name": "calls", "ranks": ranks, "groups": groups,
             "ops": ops}  # fmt: skip
    return parse_workload(trace)


def nccl_of(choice):
    """What NCCL decided, as a recorded choice says."""
    return choice["nccl_algorithm"], choice["protocol"], choice["channels"]


def test_ccsim_run_defaults_to_the_presets_library(capsys):
    """ccsim run with no --algo runs the preset's library and says so: in the table's
    title and in the JSON summary row."""
    argv = ["run", "ddp-gpt1.5b-16", "--topology", "dgx-h100"]
    assert main([*argv, "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["algorithm"] == "nccl"
    assert main(argv) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert "algorithm nccl (the preset's library)" in title


def test_a_ddp_bucket_runs_nccls_choice_for_the_16_rank_group():
    """Every 25 MiB gradient bucket of DDP on 2 x dgx-h100 runs the algorithm, protocol
    and channels NcclPolicy chooses for the whole 16-GPU communicator at that size."""
    graph = load_topology("dgx-h100", 2)
    workload = ddp(ranks=16)
    run, _ = run_workload(workload, graph)
    assert run.algorithm == "nccl"
    policy = NcclPolicy()
    for members, choice in zip(workload.instances, run.choices, strict=True):
        size = workload.ops[members[0]].nbytes
        want = policy.choose(graph, "all_reduce", size)
        assert nccl_of(choice) == (want.algorithm, want.protocol, want.channels)
        assert choice["policy"] == "nccl" and choice["algorithm"] == want.schedule


def test_a_tp_group_inside_one_server_gets_nccls_one_server_choice():
    """Two TP groups of 8, one per server of 2 x dgx-h100: each decides as a communicator
    over one server's GPUs (NVLS at 256 MiB), not as the 16-GPU cluster would (NVLSTree),
    and both run the same decision."""
    graph = load_topology("dgx-h100", 2)
    size = 256 * MiB
    workload = calls(16, {"tp0": range(8), "tp1": range(8, 16)}, nbytes=size)
    run, _ = run_workload(workload, graph)
    one_server = NcclPolicy().choose(load_topology("dgx-h100", 1), "all_reduce", size)
    cluster = NcclPolicy().choose(graph, "all_reduce", size)
    assert (one_server.algorithm, cluster.algorithm) == ("NVLS", "NVLSTree")
    first, second = run.choices
    assert first is second  # decided once for the shape
    assert nccl_of(first) == (one_server.algorithm, one_server.protocol, one_server.channels)


def test_a_group_sees_only_its_own_gpus_and_nics():
    """A data-parallel group of one GPU per server sees 2 ranks on 2 servers, each GPU
    with its own NIC only: the ring search finds one ring through it at 48 GB/s, doubled
    to 2 at 24 (ncclTopoDupChannels), where all 8 NICs of the server would give 8 rings at
    45. Eight GPUs of one
    server, inside a larger cluster, see what one server alone does."""
    graph = load_topology("dgx-h100", 2)
    pair = nccl_system(communicator_view(graph, [0, 8]))
    assert (pair.ranks, pair.nodes, pair.ring.channels) == (2, 2, 2)
    assert nccl_system(communicator_view(graph, list(range(8, 16)))) == nccl_system(
        load_topology("dgx-h100", 1)
    )
    assert nccl_system(communicator_view(graph, list(range(16)))) == nccl_system(graph)


@pytest.mark.parametrize(
    ("topology", "nodes", "op", "size"),
    [
        ("dgx-h100", 2, "all_reduce", 64 * MiB),
        ("dgx-a100", 1, "all_gather", MiB),
        ("dgx-a100", 2, "all_to_all", 4 * MiB),
    ],
)
def test_one_call_takes_what_simulate_collective_nccl_takes(topology, nodes, op, size):
    """A workload of one collective over every GPU, with nothing else running, ends
    when simulate_collective(..., "nccl") of that call does (to rounding: the replay
    times a call alone, then adds its offsets to the launch time)."""
    graph = load_topology(topology, nodes)
    ranks = len([n for n, d in graph.nodes(data=True) if d["kind"] == "gpu"])
    workload = calls(ranks, {"all": range(ranks)}, op=op, nbytes=size, compute="0s")
    run, result = run_workload(workload, graph)
    alone = simulate_collective(graph, op, size, "nccl")
    assert result.step_s == pytest.approx(alone.time_s, rel=1e-12)
    assert run.choices[0]["protocol"] == alone.params["protocol"]


def test_identical_calls_are_decided_once(monkeypatch):
    """Fifty all-reduces on each of two TP groups of the same shape: NCCL's plan is
    made once, and every call shares its record."""
    made = []
    plan = NcclPolicy.plan

    def counting(self, system, op, size):
        made.append(size)
        return plan(self, system, op, size)

    monkeypatch.setattr(NcclPolicy, "plan", counting)
    graph = load_topology("dgx-a100", 2)
    workload = calls(16, {"tp0": range(8), "tp1": range(8, 16)}, nbytes=MiB, repeat=50)
    run, _ = run_workload(workload, graph)
    assert len(made) == 1 and len(run.choices) == 100
    assert all(choice is run.choices[0] for choice in run.choices)


def test_explicit_algorithms_and_protocols_still_run_as_asked(capsys):
    """--algo ring runs ring (ideal model unless --proto); --proto forces NCCL's
    protocol; auto and an unknown name behave as before."""
    graph = load_topology("dgx-a100", 1)
    workload = calls(8, {"tp": range(8)}, nbytes=MiB)
    run, _ = run_workload(workload, graph, algorithm="ring")
    assert run.algorithm == "ring"
    assert run.choices[0] == {"algorithm": "ring", "protocol": None, "channels": 1, "chunks": 1}
    run, _ = run_workload(workload, graph, algorithm="ring", protocol="Simple")
    assert run.choices[0]["protocol"] == "Simple"
    run, _ = run_workload(workload, graph, protocol="LL")
    assert run.choices[0]["policy"] == "nccl" and run.choices[0]["protocol"] == "LL"
    # A call that names its algorithm runs it, with the fastest of NCCL's protocols.
    named = calls(8, {"tp": range(8)}, nbytes=MiB)
    for op in named.ops:
        if op.kind == "collective":
            op.algorithm = "direct"
    run, _ = run_workload(named, graph)
    assert run.choices[0]["algorithm"] == "direct" and run.choices[0]["protocol"]
    argv = ["run", "ddp-gpt1.5b-16", "--format", "json", "--algo", "ring"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)[0]["algorithm"] == "ring"
    assert main(["run", "ddp-gpt1.5b-16", "--algo", "rings"]) == 2
    assert "unknown algorithm 'rings'" in capsys.readouterr().err
    assert main(["run", "ddp-gpt1.5b-16", "--topology", "ascend-910b", "--algo", "nccl"]) == 2
    assert "NCCL runs on NVIDIA GPUs only" in capsys.readouterr().err


def test_ascend_runs_hccl_and_its_unmodelled_operations_as_before():
    """On 2 x ascend-910b the default is HCCL: an all-reduce runs HCCL's choice for the
    group; an all-to-all, outside HCCL's modelled operations, runs pairwise."""
    graph = load_topology("ascend-910b", 2)
    run, _ = run_workload(calls(16, {"dp": range(16)}, nbytes=MiB), graph)
    want = HcclPolicy().choose(graph, "all_reduce", MiB)
    assert run.algorithm == "hccl"
    assert run.choices[0]["hccl_algorithm"] == want.algorithm
    assert run.choices[0]["algorithm"] == want.schedule and run.choices[0]["protocol"] is None
    run, _ = run_workload(calls(16, {"ep": range(16)}, op="all_to_all", nbytes=MiB), graph)
    assert run.choices[0]["algorithm"] == "pairwise"


def test_the_resource_estimate_counts_the_librarys_schedule():
    """One NCCL all-reduce over 2 x dgx-h100: the estimate holds its schedule (kept once,
    and in flight once) besides the trace's ops."""
    graph = load_topology("dgx-h100", 2)
    workload = calls(16, {"all": range(16)}, nbytes=64 * MiB)
    estimate = workload_estimate(workload, None, cluster=cluster_of("dgx-h100", 2))
    schedule, _, _ = NcclPolicy().schedule(graph, "all_reduce", 64 * MiB)
    assert estimate.flows - len(workload.ops) * 5 == pytest.approx(2 * schedule.n_ops, rel=0.05)
    assert run_schedule(graph, schedule).time_s > 0  # the schedule the estimate counted runs


def test_a_replay_forgets_finished_collectives():
    """The network lets go of a collective once it is done, so a long step does not keep
    every call's transfers alive (each simulated flow by flow here: replayed from an
    isolated timing, a call never reaches the network)."""
    graph = load_topology("dgx-a100", 1)
    workload = calls(8, {"tp": range(8)}, nbytes=MiB, repeat=5)
    replay = WorkloadReplay(workload, graph, isolated=False)
    replay.run()
    assert replay.network._owners == [None] * 5
