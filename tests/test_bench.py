"""ccsim bench: runs scenarios in subprocesses and reports consistent counters.

Performance targets live in the benchmark output, not here: these tests check only
that the figures are measured and coherent.
"""

import pytest

from simulator.cli.bench import run_bench


def test_quick_scenario_reports_its_figures():
    """ring-8: 64 MiB all-reduce on 8 ranks with 4 chunks is 2(p-1) p K = 448 flows; the
    simulated time is the pipelined ring form of tests/test_ring.py."""
    (row,) = run_bench(["ring-8"])
    assert row["flows"] == 2 * 7 * 8 * 4
    # The 1-D ring is symmetric under a shift of one rank: one rank's flows stand for all.
    assert row["simulated_flows"] * 8 == row["flows"]
    p, k, n, a, b = 8, 4, 64 * 2**20, 500e-9, 150e9
    tau = n / (p * k * b)
    expected = (2 * (p - 1) - 1) * max(a + tau, k * tau) + k * tau + a
    assert row["sim_time_us"] == pytest.approx(expected * 1e6, rel=1e-9)
    assert row["wall_s"] > 0 and row["peak_MiB"] > 0
    assert row["flows_per_s"] == pytest.approx(row["flows"] / row["wall_s"])


def test_workload_scenario_reports_the_step_it_replays():
    """A workload scenario replays its Megatron step: its simulated time is the step's
    with every rank built and its ops those of the TP masters it builds (a 2-stage
    Llama 3 8B on one dgx-a100, built here and replayed directly for comparison)."""
    from simulator.cli.bench import Scenario, run_workload_scenario
    from simulator.workload import run_workload
    from simulator.workload.generators import megatron

    params = (("model", "llama3-8b"), ("tp", 4), ("pp", 2), ("dp", 1), ("global_batch", 4))
    scenario = Scenario("tiny", "", kind="workload", preset="dgx-a100", workload=params)
    row = run_workload_scenario(scenario)
    # The bench builds one replica and one rank per TP group; the step is every rank's.
    built = megatron(**dict(params), replicas=True, shadows=True)
    full = megatron(**dict(params))
    _, result = run_workload(full, "dgx-a100")
    assert row["ranks"] == 8 and row["ops"] == len(built.ops) == len(full.ops) // 4
    assert row["sim_time_us"] == pytest.approx(result.step_s * 1e6, rel=1e-12)
    assert row["flows"] > 0 and row["flows_per_s"] == pytest.approx(row["flows"] / row["wall_s"])


def test_asymmetric_scenarios_simulate_every_rank_as_the_event_replay_does():
    """Issue 35's rows: a 16-rank ring with one link at half speed, and the same ring
    with symmetry off. The slow ring's time is the event-by-event replay's; the ring
    with symmetry off is the symmetric ring's, every flow simulated (2(p-1) p K)."""
    from simulator.algorithms import build_schedule
    from simulator.cli.bench import Scenario
    from simulator.collective.run import rank_layout, run_schedule
    from simulator.network.faults import apply_faults
    from simulator.topology import ring_graph

    slow = Scenario("s", "", ranks=16, fault="link=gpu5-gpu6:0.5").run()[0]
    graph = apply_faults(ring_graph(16, 150e9, 500e-9), "link=gpu5-gpu6:0.5")
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 64 * 2**20, chunks=4)
    exact = run_schedule(graph, schedule, symmetry="off", events=True)
    assert slow.time_s == pytest.approx(exact.time_s, rel=1e-9)
    assert slow.stats.flows == 2 * 15 * 16 * 4
    whole = Scenario("w", "", ranks=16, symmetry="off").run()[0]
    once = Scenario("o", "", ranks=16).run()[0]
    assert whole.stats.flows == 2 * 15 * 16 * 4 and once.stats.flows * 16 == whole.stats.flows
    assert whole.time_s == pytest.approx(once.time_s, rel=1e-12)
    assert slow.time_s > once.time_s


def test_search_scenario_reports_the_candidates_it_simulated():
    """A search scenario runs ccsim search: its simulated time is the fastest
    candidate's step, as the same search run directly ranks it, and its CPU time
    counts its workers'."""
    from simulator.cli.bench import Scenario, bench_table, run_search_scenario
    from simulator.search import search

    options = (
        ("model", "llama3-8b"),
        ("global_batch", 8),
        ("simulate", 2),
        ("micro_batches", (1,)),
        ("virtual_stages", (1,)),
        ("workers", 1),
    )
    scenario = Scenario("s", "", kind="search", preset="dgx-a100", workload=options)
    row = run_search_scenario(scenario)
    direct = dict(options)
    found = search(direct.pop("model"), "dgx-a100", progress=False, **direct)
    assert row["candidates"] == row["candidates_ok"] == found.ran == 2
    assert row["sim_time_us"] == pytest.approx(found.rows[0]["step_s"] * 1e6, rel=1e-12)
    assert row["best"] == found.rows[0]["label"] and row["ranks"] == 8
    assert row["cpu_s"] > 0 and row["wall_s"] > 0
    assert "2 cand." in bench_table([row])


def test_jobs_scenario_reports_the_slower_jobs_step_together():
    """A jobs scenario (issue 34) places two copies of its step and runs them alone and
    together: its simulated time is the slower job's step together, as run_jobs gives it
    for the same two jobs built whole (every replica and TP rank), and its flows are
    those of the three replays."""
    from simulator.cli.bench import Scenario, run_jobs_scenario
    from simulator.topology import load_topology
    from simulator.workload.generators import megatron
    from simulator.workload.jobs import Job, run_jobs

    params = (("model", "llama3-8b"), ("tp", 4), ("pp", 1), ("dp", 2), ("global_batch", 4))
    section = (("type", "leaf-spine"), ("servers_per_leaf", 2), ("oversubscription", 2))
    scenario = Scenario(
        "tiny", "", kind="jobs", preset="dgx-h100", nodes=2, workload=params,
        fabric_section=section,
    )  # fmt: skip
    row = run_jobs_scenario(scenario)
    whole = megatron(**dict(params))
    graph = load_topology("dgx-h100", 2, fabric=dict(section))
    expected = run_jobs([Job("A", whole, "scattered"), Job("B", whole, "scattered")], graph)
    assert row["ranks"] == 16
    slower = max(job.step_together_s for job in expected.jobs)
    assert row["sim_time_us"] == pytest.approx(slower * 1e6, rel=1e-12)
    assert row["slowdown"] == pytest.approx(max(j.slowdown for j in expected.jobs), rel=1e-12)
    assert row["flows"] > 0 and row["flows_per_s"] == pytest.approx(row["flows"] / row["wall_s"])
