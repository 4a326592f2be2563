"""A step's time from a shorter step's steady state (simulator.workload.steady) against
the full step's replay, the reference: equal to float rounding of the clock on small
pipelines (interleaved and 1F1B), and the full replay whenever the check fails."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from simulator.workload import run_workload, steady
from simulator.workload.generators import megatron
from simulator.workload.steady import (
    STEP_TOLERANCE,
    run_steady,
    short_micro_batches,
    steady_period,
    warmup_forwards,
)

#: As ``ccsim validate --training`` builds a TP 4 run: two replicas of half a server
#: together, TP masters for their groups (simulator.validate.training).
BASE = {
    "model": "gpt3-175b",
    "tp": 4,
    "micro_batch": 1,
    "precision": "fp8",
    "sequence_parallel": True,
    "tp_comm_overlap": True,
    "distributed_optimizer": True,
    "replicas": 2,
    "shadows": True,
}


def _full(options: dict, servers: int) -> float:
    _, result = run_workload(megatron(**options), "dgx-h100", nodes=servers)
    return result.step_s


@pytest.mark.parametrize(
    ("pp", "v", "dp", "micro", "servers"),
    [
        (4, 2, 2, 32, 4),  # interleaved, TP 4 PP 4 VP 2: 16 micro-batches replayed
        (4, 1, 2, 24, 4),  # 1F1B: 3 warm-up forwards at most, period 1: 9 replayed
        (2, 2, 2, 16, 2),  # interleaved on 2 stages, 2 servers: 8 replayed
    ],
)
def test_steady_step_is_the_full_step(pp: int, v: int, dp: int, micro: int, servers: int):
    options = {**BASE, "pp": pp, "virtual_stages": v, "dp": dp, "global_batch": micro * dp}
    steady = run_steady(options, "dgx-h100", nodes=servers)
    assert steady.why == ""
    # The shortcut ran: fewer micro-batches, the rest as whole periods of pp.
    assert steady.simulated == short_micro_batches(micro, pp, v) < micro
    per = pp if v > 1 else 1  # micro-batches a period
    assert steady.periods * per == micro - steady.simulated
    # The short step's memory is the full step's (as validate --training reports it).
    assert steady.workload.memory == megatron(**options).memory
    full = _full(options, servers)
    assert steady.step_s == pytest.approx(full, rel=STEP_TOLERANCE, abs=0)
    # Linear in the periods: one period fewer is the full step less one period.
    fewer = {**options, "global_batch": (micro - per) * dp}
    assert _full(fewer, servers) == pytest.approx(full - steady.period_s, rel=STEP_TOLERANCE)


def test_too_few_micro_batches_replay_the_full_step():
    # 16 micro-batches on PP 4 VP 2: 10 warm-up forwards, 22 steady steps, fewer than
    # the 2.5 periods of 8 checked: the full step, bit for bit.
    options = {**BASE, "pp": 4, "virtual_stages": 2, "dp": 2, "global_batch": 32}
    assert warmup_forwards(4, 2) == 10
    steady = run_steady(options, "dgx-h100", nodes=4)
    assert steady.why and steady.simulated == steady.micro_batches == 16
    assert steady.period_s is None and steady.periods == 0
    assert steady.step_s == _full(options, 4)


def test_the_collector_is_paused_inside_run_steady_only(monkeypatch):
    """run_steady builds and replays with Python's cyclic collector off (only CPU time
    changes: the step above is bit for bit run_workload's, which keeps it on) and puts
    it back as it was, on or off."""
    seen = []
    build = steady.megatron

    def spy(**options):
        seen.append(gc.isenabled())
        return build(**options)

    monkeypatch.setattr(steady, "megatron", spy)
    options = {**BASE, "pp": 4, "virtual_stages": 2, "dp": 2, "global_batch": 32}
    assert gc.isenabled()
    run_steady(options, "dgx-h100", nodes=4)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        run_steady(options, "dgx-h100", nodes=4)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failed_check_replays_the_full_step(monkeypatch):
    # No shift is close enough to the period under a negative tolerance: the short
    # step is replayed, found not periodic, and the full step replayed, bit for bit.
    monkeypatch.setattr(steady, "PERIOD_TOLERANCE", -1.0)
    options = {**BASE, "pp": 2, "virtual_stages": 2, "dp": 2, "global_batch": 32}
    found = run_steady(options, "dgx-h100", nodes=2)
    assert found.why.startswith("8 of 16 micro-batches: the steady state is not periodic")
    assert found.simulated == found.micro_batches == 16 and found.period_s is None
    full = _full(options, 2)
    assert found.step_s == full
    # The per-flow reference's path (validate --training --exact) asks for the full step.
    asked = run_steady(options, "dgx-h100", nodes=2, shortcut=False)
    assert asked.why == "the full step asked for" and asked.step_s == full


def test_the_first_steady_steps_are_not_periodic_yet():
    # 16 micro-batches on PP 4 VP 2: steady steps 0-7 against 8-15 (the pipeline still
    # filling in the first) fail the check, which run_steady therefore keeps off.
    options = {**BASE, "pp": 4, "virtual_stages": 2, "dp": 2, "global_batch": 32}
    run, _ = run_workload(megatron(**options), "dgx-h100", nodes=4)
    period, why = steady_period(run.workload, run, 4, 2, 0)
    assert np.isnan(period) and "not periodic" in why


def test_an_op_out_of_step_fails_the_check():
    # 32 micro-batches: 64 - 10 = 54 steady steps, steps 19-26 against 27-34 periodic
    # (as run_steady compares them); then one op of the second moved by a microsecond.
    options = {**BASE, "pp": 4, "virtual_stages": 2, "dp": 2, "global_batch": 64}
    run, _ = run_workload(megatron(**options), "dgx-h100", nodes=4)
    period, why = steady_period(run.workload, run, 4, 2, 19)
    assert why == "" and period > 0
    # Steady step 27 of rank 0 runs backward 27: chunk 1 (27 mod 8 = 3 < 4: chunk
    # v - 1 - 0) of micro-batch (27 // 8) 4 + 27 mod 4 = 15.
    index = next(op.index for op in run.workload.ops if op.id == "r0.b1.15")
    end_s = run.records.end_s.copy()
    end_s[index] += 1e-6
    moved = dataclasses.replace(run, records=dataclasses.replace(run.records, end_s=end_s))
    period, why = steady_period(run.workload, moved, 4, 2, 0)
    assert np.isnan(period) and "not periodic" in why
    # A data-parallel gather (one of the step's own ops) moved to run beside the
    # compared steps: those steps are no longer the only thing running.
    gather = next(op.index for op in run.workload.ops if op.id == "r0.dp.params.0.0")
    start_s, end_s = run.records.start_s.copy(), run.records.end_s.copy()
    start_s[gather] = run.records.start_s[index]
    end_s[gather] = run.records.end_s[index]
    beside = dataclasses.replace(
        run, records=dataclasses.replace(run.records, start_s=start_s, end_s=end_s)
    )
    period, why = steady_period(run.workload, beside, 4, 2, 19)
    assert np.isnan(period) and "runs beside" in why


def test_the_period_does_not_depend_on_the_hash_seed():
    # Streams are named; iterating a set of names follows PYTHONHASHSEED, and the period
    # (read off the first op compared) differed by an ulp between processes. The same
    # inputs must give the same bits in every process.
    import os
    import subprocess
    import sys

    code = (
        "from simulator.workload.steady import run_steady\n"
        f"o = {{**{BASE!r}, 'pp': 4, 'virtual_stages': 1, 'dp': 2, 'global_batch': 48}}\n"
        "s = run_steady(o, 'dgx-h100', nodes=4)\n"
        "print(repr(s.period_s), repr(s.step_s))\n"
    )
    outputs = set()
    for seed in ("0", "1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1, outputs
