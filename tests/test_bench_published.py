"""``ccsim bench``'s published training steps (issue 31): each row is the published run's
configuration, built and replayed as ``ccsim validate --training`` builds and replays it.

The speed targets themselves live in the bench output, not here."""

import pytest

from simulator.cli.bench import (
    PUBLISHED_STEPS,
    SCENARIOS,
    Scenario,
    bench_table,
    run_published_scenario,
)
from simulator.errors import CcsimError
from simulator.validate.training import load_runs, simulate_run


def test_published_rows_are_the_issues_configurations():
    """Issue 31 asks for (a) a 16,384-GPU 405B step, (b) a 3,072-GPU PP 8 step, (c) a
    TP 4 fp8 step and (d) a CP 16 long-context step, and every published step in
    10 s: (e) its slowest, a Megatron-FSDP step on GB200, (f) the slowest on H100, a
    PP 8 x VP 8 step whose steady state repeats only after a transient, and (g) a GB200
    step whose data-parallel replicas share racks and (h) an unpipelined GB200 step whose
    data-parallel rings span 256 ranks; the rows name runs of the data file
    that are those, each with the issue's target of 10 s CPU and 2 GiB."""
    runs = {run.id: run for run in load_runs()[0]}
    (a, b, c, d, e, f, g, h) = (runs[case] for _, case in PUBLISHED_STEPS)
    assert a.gpus == 16384 and a.model.name.startswith("llama3") and a.model.seq == 8192
    assert b.gpus == 3072 and b.pp == 8
    assert c.tp == 4 and c.precision == "fp8"
    assert d.cp == 16 and d.model.seq == 131072
    assert e.gpu == "GB200" and e.options.get("fsdp") is True
    assert f.gpu == "H100" and f.gpus == 1024 and (f.pp, f.vp) == (8, 8)
    assert g.gpu == "GB200" and g.gpus == 512 and g.dp == 8 and g.tp * g.cp * g.dp == 64
    assert h.gpu == "GB200" and h.gpus == 512 and h.pp == 1 and h.cp * h.dp == 256
    for name, case in PUBLISHED_STEPS:
        scenario = SCENARIOS[f"pub-{name}"]
        assert scenario.kind == "published" and scenario.case == case
        assert (scenario.target_s, scenario.target_mib) == (10.0, 2048.0)


def test_published_scenario_replays_the_validated_step():
    """A published row's simulated step is ``simulate_run``'s for the same run (the path
    of ``ccsim validate --training``), to the last bit, also for a row whose NCCL
    settings (channel bounds, communicators, ``NCCL_MIN_CTAS``: SMs held) shape the
    step; its target is judged on CPU."""
    runs = {run.id: run for run in load_runs()[0]}
    for case, ranks in (
        ("dgxc-v25.01-nemotron4-15b-h100-bf16-16", 16),
        ("mlperf-v5.1-llama31-8b-b200-fp8-16", 16),
    ):
        run = runs[case]
        row = run_published_scenario(Scenario("p", "", kind="published", case=case, target_s=1e9))
        assert row["sim_time_us"] == simulate_run(run).step_s * 1e6
        assert row["ranks"] == ranks and row["configuration"] == run.label
    assert row["cpu_s"] > 0 and row["target_on"] == "cpu"
    assert "met (< 1e+09 s CPU" in bench_table([row])


def test_published_scenario_names_a_run_it_cannot_find():
    """An id that is not in the data file is a one-line error naming it."""
    with pytest.raises(CcsimError, match="published run no-such-run: no such id"):
        run_published_scenario(Scenario("p", "", kind="published", case="no-such-run"))
