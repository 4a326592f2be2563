"""``ccsim validate --loco``: progress as it goes, each simulation once (a fold whose
left-out constant takes the value the run's own result used reuses that result), and
``--jobs N`` running the independent simulations in N processes with the same answers."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.cli import main
from simulator.validate import BUNDLED, load_case, run_case
from simulator.validate.calibrate import leave_one_case_out, stack_graph

TCPXO = ("H100-2N-AR-a3mega-tcpxo", "H100-2N-AG-a3mega-tcpxo")


def _cases():
    """The two A3 Mega runs cut to their three smallest sizes (seconds to simulate)."""
    cases = [load_case(BUNDLED / f"{name}.yaml") for name in TCPXO]
    return [dataclasses.replace(case, measured=case.measured[:3]) for case in cases]


def test_loco_reports_progress_and_reuses_the_runs_own_result():
    """Grid 20 and 24 us (24 us is the stack's own value): 2 runs x 2 values = 4 steps,
    of which the two at 24 us are the runs' own results, not simulated again. Each run is
    predicted at the value the other prefers on these sizes; whatever it is, the loco
    result is the run simulated at that latency."""
    cases = _cases()
    results = [run_case(case) for case in cases]
    calls = []
    leave_one_case_out(
        cases, results, stack_grid=(20e-6, 24e-6), progress=lambda *call: calls.append(call)
    )
    done = [d for d, _, _ in calls]
    assert done == sorted(done) and done[-1] == 4 and {t for _, t, _ in calls} == {4}
    for case, result in zip(cases, results, strict=True):
        value = float(result.loco_source.split("latency ")[1].split(" us")[0]) * 1e-6
        if value == 24e-6:
            assert result.loco is result  # reused, not run again
        else:
            expected = run_case(case, graph=stack_graph(case, value))
            # Equal up to the summation order of cached routes (1e-16 relative).
            assert result.loco.simulated_us == pytest.approx(expected.simulated_us, rel=1e-12)


def test_jobs_give_the_same_predictions():
    cases = _cases()
    serial = [run_case(case) for case in cases]
    pooled = [run_case(case) for case in cases]
    grid = (16e-6, 24e-6, 32e-6)
    leave_one_case_out(cases, serial, stack_grid=grid)
    leave_one_case_out(cases, pooled, stack_grid=grid, jobs=2)
    for a, b in zip(serial, pooled, strict=True):
        assert a.loco.simulated_us == pytest.approx(b.loco.simulated_us, rel=1e-12)
        assert a.loco_source == b.loco_source


def test_jobs_run_the_cases_alike(tmp_path):
    """The cases themselves in 2 processes: the same results, in the same order."""
    from simulator.validate.nccl_tests import run_cases

    cases = _cases()
    loaders = [(case.name, lambda case=case: case) for case in cases]
    serial = run_cases(loaders)
    pooled = run_cases(loaders, jobs=2)
    assert [r.name for r in pooled] == list(TCPXO)
    for a, b in zip(serial, pooled, strict=True):
        assert a.simulated_us == pytest.approx(b.simulated_us, rel=1e-12)


def test_jobs_with_fit_is_one_line(capsys):
    assert main(["validate", "--fit", "--jobs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--jobs" in err and "--fit" in err
