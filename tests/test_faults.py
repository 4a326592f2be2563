"""Faults and stragglers (simulator.network.faults), each against a hand calculation."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from simulator import simulate_collective
from simulator.cli import main
from simulator.network.faults import (
    FaultError,
    LinkFailure,
    LinkFault,
    LinkMatch,
    NicFailure,
    RandomFaults,
    SlowGpu,
    apply_faults,
    compute_scaler,
    fault_plan,
    load_faults,
)
from simulator.sweep import run_sweep
from simulator.sweep.seeds import over_seeds
from simulator.topology import load_topology, ring_graph
from simulator.viz.collective import collective_timeline
from simulator.viz.perfetto import trace_json
from simulator.workload import WorkloadReplay, breakdown
from simulator.workload.generators import ddp
from simulator.workload.trace import load_workload


def two_servers(g: int = 4, bi: float = 100e9, ai: float = 1e-6, be: float = 10e9, ae=2e-6):
    """Two servers of ``g`` GPUs on an NVSwitch (``bi`` per GPU, ``ai`` per GPU-GPU hop),
    each GPU with its own NIC (PCIe effectively free) on one switch (``be`` per NIC,
    ``ae`` per NIC-NIC path)."""
    graph = nx.Graph(name="two-servers")
    graph.add_node("switch", kind="switch", tier="leaf")
    for s in range(2):
        graph.add_node(f"s{s}/nvswitch", kind="nvswitch", server=s)
        for j in range(g):
            gpu, nic = f"s{s}/gpu{j}", f"s{s}/nic{j}"
            graph.add_node(gpu, kind="gpu", rank=s * g + j, server=s)
            graph.add_node(nic, kind="nic", server=s)
            graph.add_edge(gpu, f"s{s}/nvswitch", bandwidth=bi, latency=ai / 2, link="nvlink")
            graph.add_edge(gpu, nic, bandwidth=1e15, latency=0.0, link="pcie")
            graph.add_edge(nic, "switch", bandwidth=be, latency=ae / 2, link="rdma")
    return graph


def small_leaf_spine(bandwidth: float = 10e9, hop: float = 1e-6) -> nx.Graph:
    """Two GPUs, each with a NIC on its own leaf; two spines joining the leaves. Every
    link ``bandwidth`` and ``hop`` latency: GPU to GPU is 6 hops through either spine."""
    graph = nx.Graph(name="small-leaf-spine")
    for rank in range(2):
        graph.add_node(f"gpu{rank}", kind="gpu", rank=rank, server=rank)
        graph.add_node(f"nic{rank}", kind="nic", server=rank)
        graph.add_edge(f"gpu{rank}", f"nic{rank}", bandwidth=bandwidth, latency=hop, link="pcie")
        graph.add_node(f"leaf{rank}", kind="switch", tier="leaf")
        graph.add_edge(f"nic{rank}", f"leaf{rank}", bandwidth=bandwidth, latency=hop, link="rdma")
    for spine in range(2):
        graph.add_node(f"spine{spine}", kind="switch", tier="spine")
        for leaf in range(2):
            graph.add_edge(
                f"leaf{leaf}", f"spine{spine}", bandwidth=bandwidth, latency=hop, link="rdma"
            )
    return graph


# -- acceptance: hand-computed cases -------------------------------------------------------


def test_ring_with_one_link_at_f_runs_at_f_of_the_bandwidth():
    """Ring all-reduce on a 1-D ring of p GPUs (bandwidth B, latency a per link), n bytes,
    blocks s = n/p. Healthy: 2(p-1)(a + s/B). With link 0->1 at f B, rank 0 sends its
    2(p-1) blocks back to back at f B (every other hop is fast enough to keep it fed:
    a + (p-1)(a + s/B) <= (p-1) s/(f B)), and rank 1 receives the last one a later:
    T = 2(p-1) s/(f B) + a. Bandwidth terms: 2(p-1) s/(f B) against 2(p-1) s/B, 1/f."""
    p, bandwidth, a, n, f = 4, 100e9, 1e-6, 4e6, 0.25
    s = n / p
    graph = ring_graph(p, bandwidth, a)
    healthy = simulate_collective(graph, "all_reduce", n, "ring")
    faulted = simulate_collective(apply_faults(graph, f"link=gpu0-gpu1:{f}"), "all_reduce", n)
    assert healthy.time_s == pytest.approx(2 * (p - 1) * (a + s / bandwidth), rel=1e-12)
    assert faulted.time_s == pytest.approx(2 * (p - 1) * s / (f * bandwidth) + a, rel=1e-12)
    healthy_bw_term = healthy.time_s - 2 * (p - 1) * a
    faulted_bw_term = faulted.time_s - a
    assert faulted_bw_term / healthy_bw_term == pytest.approx(1 / f, rel=1e-12)


def test_hierarchical_all_reduce_with_one_slow_nic_matches_its_closed_form():
    """N = 2 servers of g GPUs; intra hop a_i, B_i per GPU; inter path a_e, B_e per NIC.
    Healthy (hierarchical.py): 2(g-1)(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(g N B_e)).
    NIC j of server 0 at f B_e: inter-server ring j (ranks (0, j) and (1, j)) sends its
    2(N-1) steps of n/(gN) at f B_e, both directions (the NIC's links are full duplex and
    both degraded), while the other g-1 rings finish early. The intra-server all-gather
    then waits for row j: it leaves (s, j) at the end of ring j and crosses g-1 hops, one
    intra step each, so the last GPU has it at T_late + (g-1)(a_i + n/(g B_i)) - the same
    as if every NIC were slow:
    T = 2(g-1)(a_i + n/(g B_i)) + 2(N-1)(a_e + n/(g N f B_e))."""
    g, servers, bi, ai, be, ae, n, f = 4, 2, 100e9, 1e-6, 10e9, 2e-6, 8e6, 0.25
    graph = two_servers(g, bi, ai, be, ae)
    intra = 2 * (g - 1) * (ai + n / (g * bi))
    healthy = simulate_collective(graph, "all_reduce", n, "hierarchical")
    assert healthy.time_s == pytest.approx(
        intra + 2 * (servers - 1) * (ae + n / (g * servers * be)), rel=1e-12
    )
    slow = simulate_collective(
        apply_faults(graph, f"node=s0/nic1:{f}"), "all_reduce", n, "hierarchical"
    )
    expected = intra + 2 * (servers - 1) * (ae + n / (g * servers * f * be))
    assert slow.time_s == pytest.approx(expected, rel=1e-12)
    # The rail form names the same NIC's links on both servers: the same bound.
    rail = simulate_collective(apply_faults(graph, f"rail=1:{f}"), "all_reduce", n, "hierarchical")
    assert rail.time_s == pytest.approx(expected, rel=1e-12)


def test_failed_spine_link_is_routed_around_as_if_it_were_never_there():
    """One flow gpu0 -> gpu1 (broadcast, p = 2): 6 hops of latency h, bandwidth B, by
    either spine: T = 6h + n/B. Fail leaf0-spine0: the flow takes spine1, same time; the
    result equals the graph built without that link, and no byte crosses it."""
    bandwidth, hop, n = 10e9, 1e-6, 1e6
    graph = small_leaf_spine(bandwidth, hop)
    without = graph.copy()
    without.remove_edge("leaf0", "spine0")
    faulted = apply_faults(graph, "fail=leaf0-spine0")
    assert not faulted.has_edge("leaf0", "spine0") and graph.has_edge("leaf0", "spine0")
    result = simulate_collective(faulted, "broadcast", n, "direct")
    assert result.time_s == pytest.approx(6 * hop + n / bandwidth, rel=1e-12)
    assert result.time_s == simulate_collective(without, "broadcast", n, "direct").time_s
    used = {
        (a, b)
        for a, b, carried in zip(*(result.links[k] for k in ("src", "dst", "bytes")), strict=True)
        if carried
    }
    assert used == {
        ("gpu0", "nic0"),
        ("nic0", "leaf0"),
        ("leaf0", "spine1"),
        ("spine1", "leaf1"),
        ("leaf1", "nic1"),
        ("nic1", "gpu1"),
    }
    # Both spine links of leaf0 down: nothing is left between the two GPUs.
    with pytest.raises(FaultError, match=r"cut off rank 1 \(gpu1\) from rank 0 \(gpu0\)"):
        apply_faults(graph, ["fail=leaf0-spine0", "fail=leaf0-spine1"])


def test_failed_leaf_spine_link_on_a_preset_equals_the_graph_without_it():
    """On a 2-server DGX H100 leaf-spine, 8 ring channels spread over both spines by ECMP:
    with leaf0-spine0 down, every run equals the same graph with that edge removed, and
    none of its traffic crosses the failed link."""
    graph = load_topology(
        "dgx-h100", 2, fabric={"type": "leaf-spine", "servers_per_leaf": 1, "spines": 2}
    )
    without = graph.copy()
    without.remove_edge("leaf0", "spine0")
    faulted = apply_faults(graph, "fail=leaf0-spine0")
    options = {"chunks": 1, "channels": 8}
    a = simulate_collective(faulted, "all_reduce", 64e6, "ring", **options)
    b = simulate_collective(without, "all_reduce", 64e6, "ring", **options)
    healthy = simulate_collective(graph, "all_reduce", 64e6, "ring", **options)
    assert a.time_s == b.time_s > healthy.time_s
    assert ("leaf0", "spine0") not in set(zip(a.links["src"], a.links["dst"], strict=True))


def test_straggler_delays_a_ddp_step_by_exactly_its_extra_compute():
    """A DDP step (8 ranks, one DGX A100) whose communication is hidden but for the last
    bucket: with rank 3 computing x times slower, every bucket's all-reduce waits for it
    and the last one starts (x - 1) C later, C = rank 3's compute time in the healthy
    step: the step grows by exactly (x - 1) C."""
    workload = ddp("gpt-1.5b", ranks=8)
    graph = load_topology("dgx-a100")
    healthy = WorkloadReplay(workload, graph, algorithm="ring").run()
    assert breakdown(healthy).summary()["exposed_s"] < 0.01 * breakdown(healthy).summary()["step_s"]
    computes = [op.index for op in workload.ops if op.rank == 3 and op.kind == "compute"]
    c = float(np.sum(healthy.records.end_s[computes] - healthy.records.start_s[computes]))
    x = 1.5
    slow = WorkloadReplay(workload, apply_faults(graph, f"gpu=3:compute={x}"), algorithm="ring")
    step = breakdown(slow.run()).summary()["step_s"]
    assert step == pytest.approx(breakdown(healthy).summary()["step_s"] + (x - 1) * c, rel=1e-12)


def test_a_fault_starting_mid_flow_re_rates_it_then():
    """One flow of n bytes on a link of B (latency a): the link drops to f B at t0 and
    (second case) recovers at t1. By t0 it sent B t0; the rest at f B:
    T = t0 + (n - B t0)/(f B) + a. With recovery: B t0 + f B (t1 - t0) by t1, the rest at
    B: T = t1 + (n - B t0 - f B (t1 - t0))/B + a."""
    bandwidth, a, n, f, t0, t1 = 1e9, 1e-6, 1e6, 0.5, 250e-6, 1e-3
    graph = ring_graph(2, bandwidth, a)
    down = apply_faults(graph, f"link=gpu0-gpu1:{f},t0=250us")
    result = simulate_collective(down, "broadcast", n, "direct")
    assert result.time_s == pytest.approx(t0 + (n - bandwidth * t0) / (f * bandwidth) + a)
    both = apply_faults(graph, f"link=gpu0-gpu1:{f},t0=250us,t1=1ms")
    result = simulate_collective(both, "broadcast", n, "direct")
    left = n - bandwidth * t0 - f * bandwidth * (t1 - t0)
    assert result.time_s == pytest.approx(t1 + left / bandwidth + a)
    # A fault that starts after the collective has ended changes nothing (and the run
    # still ends with the collective).
    late = apply_faults(graph, f"link=gpu0-gpu1:{f},t0=1ms,t1=2ms")
    assert fault_plan(late).timed_links  # timed, not a static change
    result = simulate_collective(late, "broadcast", 1e3, "direct")
    assert result.time_s == pytest.approx(1e3 / bandwidth + a)


def test_timed_faults_act_on_a_workload_step_too():
    """Rank 0 computes 100 us, then sends n bytes to rank 1 over a link of B that drops to
    f B at t0 = 350 us: 250 us at B, the rest at f B, done at 350 us + (n - 250 us B)/(f B).
    Rank 1 computes two 100 us ops and is 3x slower from 0 to 50 us: the first op starts
    in the window (300 us), the second after it (100 us): 400 us."""
    bandwidth, n, f = 1e9, 1e6, 0.5
    workload = load_workload(
        {
            "format": "ccsim-workload/1",
            "name": "p2p",
            "ranks": 2,
            "ops": [
                {"id": "c0", "rank": 0, "kind": "compute", "duration": "100us"},
                {"id": "s", "rank": 0, "kind": "send", "peer": 1, "bytes": n, "deps": ["c0"]},
                {"id": "r", "rank": 1, "kind": "recv", "peer": 0, "bytes": n, "stream": "net"},
                {"id": "a", "rank": 1, "kind": "compute", "duration": "100us"},
                {"id": "b", "rank": 1, "kind": "compute", "duration": "100us", "deps": ["a"]},
            ],
        }
    )
    graph = apply_faults(
        ring_graph(2, bandwidth), [f"link=gpu0-gpu1:{f},t0=350us", "gpu=1:compute=3,t1=50us"]
    )
    run = WorkloadReplay(workload, graph, algorithm="ring").run()
    end = dict(zip((op.id for op in workload.ops), run.records.end_s, strict=True))
    assert end["s"] == pytest.approx(350e-6 + (n - 250e-6 * bandwidth) / (f * bandwidth))
    assert end["a"] == pytest.approx(300e-6) and end["b"] == pytest.approx(400e-6)


# -- the spec and its errors ---------------------------------------------------------------


def test_inline_faults_parse_into_the_documented_dataclasses(tmp_path):
    spec = load_faults(
        [
            "link=s0/nic0-leaf0:50%,t0=1ms,t1=3ms",
            "kind=rdma:0.5",
            "server=3:0.25",
            "rail=2:latency=2us",
            "fail=s1/nic3",
            "fail=leaf0-spine1",
            "gpu=0-2,5:compute=2,reduce=1.5",
            "random:q=0.05,fraction=0.5,seed=1,kind=rdma,jitter=0.1,dist=normal",
        ]
    )
    assert spec.faults == (
        LinkFault(LinkMatch("link", "s0/nic0-leaf0"), 0.5, 0.0, 1e-3, 3e-3),
        LinkFault(LinkMatch("kind", "rdma"), 0.5),
        LinkFault(LinkMatch("server", 3), 0.25),
        LinkFault(LinkMatch("rail", 2), 1.0, 2e-6),
        NicFailure("s1/nic3"),
        LinkFailure(LinkMatch("link", "leaf0-spine1")),
        SlowGpu((0, 1, 2, 5), 2.0, 1.5),
        RandomFaults(0.05, 0.5, 1, "rdma", 0.1, "normal"),
    )
    assert load_faults(spec.data()) == spec  # the plain-data form reads back
    assert load_faults(str(spec).split(" ")) == spec  # and so does the inline form
    path = tmp_path / "faults.yaml"
    path.write_text(
        "faults:\n"
        "  - {link: s0/nic0-leaf0, fraction: 0.5, t0: 1ms, t1: 3ms}\n"
        "  - fail=s1/nic3\n"
        "  - {gpu: [5, 0, 1, 2], compute: 2, reduce: 1.5}\n"
    )
    assert load_faults(str(path)).faults == (spec.faults[0], spec.faults[4], spec.faults[6])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind=rdma:1.5", "fraction 1.5 is not in (0, 1]"),
        ("kind=rdma:0", "fraction 0 is not in (0, 1]"),
        ("kind=rdma", "give the share of bandwidth left"),
        ("gpu=3:compute=0.5", "how many times slower"),
        ("gpu=3", "needs compute=X or reduce=Y"),
        ("link=a-b:0.5,latency=1us,t1=1ms", "added latency holds for the whole run"),
        ("link=a-b:0.5,t0=2ms,t1=1ms", "t1 (1 ms) must come after t0 (2 ms)"),
        ("fail=s1/nic3:0.5", "fail=NAME takes no options"),
        ("random:q=2", "q 2 is not in [0, 1]"),
        ("random:q=0.1,dist=cauchy", "unknown distribution 'cauchy'"),
        ("slow=3:0.5", "expected WHAT=TARGET"),
        ("missing.yaml", "fault file 'missing.yaml' not found"),
    ],
)
def test_bad_specs_are_refused_naming_the_string_and_the_fix(text, message):
    with pytest.raises(FaultError) as error:
        load_faults(text)
    assert message in str(error.value)
    if not text.endswith(".yaml"):
        assert repr(text) in str(error.value)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("fail=s1/nic3", "cut off rank 11 (s1/gpu3) from the network"),
        ("link=s0/nic9-leaf0:0.5", "no link 's0/nic9-leaf0' in the topology"),
        ("link=s0/nic0-leaf1:0.5", "'s0/nic0' and 'leaf1' are not linked"),
        ("node=leaf99:0.5", "no node 'leaf99' in the topology"),
        ("kind=ib:0.5", "no link of type 'ib'; types here: nvlink, pcie, rdma"),
        ("server=7:0.5", "no server 7; servers here: 0-1"),
        ("rail=8:0.5", "no NIC with local index 8"),
        ("gpu=16:compute=2", "no rank 16; the topology has ranks 0-15"),
        ("fail=s0/gpu1", "is a GPU"),
        ("kind=rdma:1.5", "fraction 1.5 is not in (0, 1]"),
        ("random:q=0.1,kind=ib", "no link of type 'ib'"),
    ],
)
def test_command_line_faults_that_cannot_apply_exit_2_with_one_line(capsys, fault, message):
    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "2"]
    assert main([*argv, "--sizes", "1M", "--algo", "ring", "--fault", fault]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("ccsim: error:")


def test_workload_run_refuses_a_bad_fault_too(capsys):
    argv = ["run", "ddp-gpt1.5b-16", "--topology", "dgx-a100", "--fault", "gpu=99:compute=2"]
    assert main(argv) == 2
    assert "no rank 99" in capsys.readouterr().err


def test_faults_never_change_the_callers_graph():
    graph = two_servers()
    before = nx.to_dict_of_dicts(graph), dict(graph.graph)
    faulted = apply_faults(graph, ["kind=rdma:0.5", "fail=s0/nvswitch", "gpu=1:compute=2"])
    assert (nx.to_dict_of_dicts(graph), dict(graph.graph)) == before
    assert "s0/nvswitch" not in faulted and "s0/nvswitch" in graph
    assert apply_faults(graph, []) is graph  # nothing to apply: the graph itself


def test_several_faults_on_a_link_multiply_and_latencies_add():
    graph = ring_graph(4, 100e9, 1e-6)
    faulted = apply_faults(graph, ["link=gpu0-gpu1:0.5,latency=1us", "node=gpu0:0.5,latency=2us"])
    edge = faulted.edges["gpu0", "gpu1"]
    assert edge["bandwidth"] == 25e9 and edge["latency"] == pytest.approx(4e-6)
    assert faulted.edges["gpu3", "gpu0"]["bandwidth"] == 50e9
    assert faulted.edges["gpu1", "gpu2"]["bandwidth"] == 100e9


# -- random faults -------------------------------------------------------------------------


def degraded(graph: nx.Graph) -> set:
    return {(u, v) for u, v, data in graph.edges(data=True) if "fault" in data}


def test_random_faults_are_seeded_and_nested_in_q():
    """Same seed: same links degraded and the same result; another seed: other links;
    a larger q with the same seed: a superset (the draws are shared)."""
    graph = load_topology("dgx-h100", 2)
    rdma = sum(1 for *_, d in graph.edges(data=True) if d["link"] == "rdma")

    def spec(q, seed):
        return f"random:q={q},fraction=0.25,seed={seed},kind=rdma"

    a, b = apply_faults(graph, spec(0.2, 1)), apply_faults(graph, spec(0.2, 1))
    assert degraded(a) == degraded(b) and 0 < len(degraded(a)) < rdma
    assert degraded(apply_faults(graph, spec(0.2, 2))) != degraded(a)
    assert degraded(apply_faults(graph, spec(0.1, 1))) <= degraded(a)
    assert all(graph.edges[e]["link"] == "rdma" for e in degraded(a))
    assert all(a.edges[e]["bandwidth"] == 0.25 * graph.edges[e]["bandwidth"] for e in degraded(a))
    # q = 0.05: seed 1 degrades a NIC link every ring channel crosses, seed 2 none.
    times = {
        seed: simulate_collective(
            apply_faults(graph, spec(0.05, seed)), "all_reduce", 16e6, "ring", channels=8
        ).time_s
        for seed in (1, 2)
    }
    faulted = apply_faults(graph, spec(0.05, 1))
    again = simulate_collective(faulted, "all_reduce", 16e6, "ring", channels=8)
    assert again.time_s == times[1] != times[2]


def test_compute_jitter_is_seeded_per_op_and_follows_its_distribution():
    graph = ring_graph(2, 1e9)
    draws = {}
    for dist in ("lognormal", "normal", "uniform", "exponential"):
        scale = compute_scaler(apply_faults(graph, f"random:jitter=0.1,dist={dist},seed=4"))
        draws[dist] = np.array([scale(0, op, 0.0) for op in range(4000)])
        assert [scale(0, op, 0.0) for op in range(5)] == list(draws[dist][:5])  # repeatable
    assert np.median(draws["lognormal"]) == pytest.approx(1.0, abs=0.01)
    assert np.std(np.log(draws["lognormal"])) == pytest.approx(0.1, rel=0.05)
    assert np.mean(draws["normal"]) == pytest.approx(1.0, abs=0.01)
    assert draws["uniform"].min() >= 0.9 and draws["uniform"].max() <= 1.1
    assert draws["exponential"].min() >= 1.0
    assert np.mean(draws["exponential"]) == pytest.approx(1.1, abs=0.01)
    other = compute_scaler(apply_faults(graph, "random:jitter=0.1,seed=5"))
    assert [other(0, op, 0.0) for op in range(5)] != list(draws["lognormal"][:5])
    assert compute_scaler(graph) is None


def test_jittered_step_is_the_same_for_a_seed_and_differs_between_seeds():
    workload = ddp("gpt-1.5b", ranks=8)
    graph = load_topology("dgx-a100")

    def step(seed):
        faulted = apply_faults(graph, f"random:jitter=0.05,seed={seed}")
        run = WorkloadReplay(workload, faulted, algorithm="ring").run()
        return breakdown(run).summary()["step_s"]

    assert step(1) == step(1) != step(2)


# -- compare, sweep, traces ----------------------------------------------------------------


def test_compare_with_a_fault_reports_what_each_algorithm_keeps(capsys):
    """On two DGX H100s with rail 2 at half speed: a one-channel ring stays on rail 0
    and keeps everything; the hierarchical all-reduce runs one inter-server ring per rail
    and is held to the slow one."""
    argv = ["compare", "all_reduce", "--topology", "dgx-h100", "--nodes", "2"]
    argv += ["--sizes", "64M", "--algos", "ring,hierarchical", "--chunks", "1", "--ideal"]
    assert main([*argv, "--fault", "rail=2:0.5", "--format", "json"]) == 0
    import json

    rows = {row["algorithm"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["ring"]["busbw_kept"] == pytest.approx(1.0)
    assert rows["hierarchical"]["busbw_kept"] < 0.75
    assert main([*argv, "--fault", "rail=2:0.5"]) == 0
    assert "# degrades least: ring" in capsys.readouterr().out


def test_sweep_over_fault_seeds_gives_median_and_tail(tmp_path, capsys):
    spec = {
        "scenario": {
            "collective": "all_reduce",
            "size": "16M",
            "topology": "dgx-h100",
            "nodes": 2,
            "algorithm": "hierarchical",
            "fault": "random:fraction=0.25,kind=rdma",
        },
        "axes": {"fault.q": [0, 0.1], "fault.seed": [0, 1, 2, 3]},
    }
    frame = run_sweep(spec, workers=1, progress=False)
    assert list(frame["status"]) == ["ok"] * 8
    groups = over_seeds(frame.to_dict("records"), "busbw_GBps", ["fault.q", "fault.seed"])
    healthy, faulty = groups
    assert healthy["seeds"] == faulty["seeds"] == 4
    assert healthy["min"] == healthy["max"]  # q = 0: every seed is the healthy cluster
    assert faulty["min"] <= faulty["p10"] <= faulty["median"] <= faulty["max"] <= healthy["min"]
    path = tmp_path / "spec.yaml"
    path.write_text(
        "scenario: {collective: all_reduce, size: 16M, topology: dgx-h100, nodes: 2,\n"
        "           algorithm: hierarchical, fault: 'random:fraction=0.25,kind=rdma'}\n"
        "axes: {fault.q: [0, 0.1], fault.seed: [0, 1, 2, 3]}\n"
    )
    out = tmp_path / "results.csv"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "busbw_GBps over fault.seed" in text and f"{faulty['median']:.6g}" in text


def test_sweep_refuses_unknown_fault_axes_and_bad_values():
    base = {"collective": "all_reduce", "size": "1M"}
    from simulator.sweep import SweepError, load_spec

    with pytest.raises(SweepError, match="unknown fault axis 'fault.p'"):
        load_spec({"scenario": base, "axes": {"fault.p": [0.1]}})
    with pytest.raises(SweepError, match=r"axes.fault.q\[0\]: fault .*q 1.5 is not in"):
        load_spec({"scenario": base, "axes": {"fault.q": [1.5]}})
    with pytest.raises(SweepError, match="fraction 2 is not in"):
        load_spec({"scenario": {**base, "fault": "kind=rdma:2"}, "axes": {"size": ["1M"]}})


def test_sweep_fault_axes_resolve_into_each_points_spec():
    from simulator.sweep import load_spec

    spec = load_spec(
        {
            "scenario": {"collective": "all_reduce", "size": "1M", "fault": "fail=s1/nic3"},
            "axes": {"fault.q": [0, 0.05], "fault.seed": [7]},
        }
    )
    assert [p.params["fault"] for p in spec.points] == [
        [{"fail": "s1/nic3"}, {"random": {"q": 0.0, "seed": 7}}],
        [{"fail": "s1/nic3"}, {"random": {"q": 0.05, "seed": 7}}],
    ]
    spec = load_spec(
        {
            "scenario": {"collective": "all_reduce", "size": "1M"},
            "axes": {"fault": ["none", "kind=rdma:0.5", ["rail=1:0.5", "gpu=0:compute=2"]]},
        }
    )
    assert [p.params["fault"] for p in spec.points] == [
        [],
        [{"kind": "rdma", "fraction": 0.5}],
        [{"rail": 1, "fraction": 0.5}, {"gpu": [0], "compute": 2.0}],
    ]
    assert [p.values["fault"] for p in spec.points][:2] == ["none", "kind=rdma:0.5"]


def test_traces_mark_faulted_links_and_slowed_ranks():
    graph = apply_faults(ring_graph(4, 100e9, 1e-6), ["link=gpu0-gpu1:0.5", "gpu=2:compute=3"])
    timeline = collective_timeline(simulate_collective(graph, "all_reduce", 4e6), graph)
    names = [track.name for track in timeline.tracks]
    assert "gpu0→gpu1 [degraded 0.5x]" in names and "gpu1→gpu2" in names
    assert "rank 2 [compute 3x]" in names and "rank 1" in names
    assert timeline.meta["faults"] == "link=gpu0-gpu1:0.5 gpu=2:compute=3"
    text = trace_json(timeline)
    assert '"gpu0→gpu1 [degraded 0.5x]"' in text and '"faults":"link=gpu0-gpu1:0.5' in text


def test_slow_reduction_divides_the_reduce_bandwidth():
    graph = ring_graph(2, 1e9)
    nx.set_node_attributes(graph, 4e9, "reduce_bandwidth")
    faulted = apply_faults(graph, "gpu=1:reduce=2")
    assert faulted.nodes["gpu1"]["reduce_bandwidth"] == 2e9
    assert faulted.nodes["gpu0"]["reduce_bandwidth"] == 4e9
    with pytest.raises(FaultError, match="has no reduce_bandwidth"):
        apply_faults(ring_graph(2, 1e9), "gpu=1:reduce=2")
    assert math.isinf(load_faults("gpu=1:compute=2").faults[0].t1)
