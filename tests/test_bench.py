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
    and its ops the generated trace's (a 2-stage Llama 3 8B on one dgx-a100, built here
    and replayed directly for comparison)."""
    from simulator.cli.bench import Scenario, run_workload_scenario
    from simulator.workload import run_workload
    from simulator.workload.generators import megatron

    params = (("model", "llama3-8b"), ("tp", 4), ("pp", 2), ("dp", 1), ("global_batch", 4))
    scenario = Scenario("tiny", "", kind="workload", preset="dgx-a100", workload=params)
    row = run_workload_scenario(scenario)
    step = megatron(**dict(params))
    _, result = run_workload(step, "dgx-a100")
    assert row["ranks"] == 8 and row["ops"] == len(step.ops)
    assert row["sim_time_us"] == pytest.approx(result.step_s * 1e6, rel=1e-12)
    assert row["flows"] > 0 and row["flows_per_s"] == pytest.approx(row["flows"] / row["wall_s"])
