"""A steady state periodic only after a transient (simulator.workload.steady): the period
found at later steady steps of the short step, or in one longer short step, against the
full step's replay, the reference.

The pipeline: Llama 3.1 405B's 126 layers with the embedding and the loss counted as
layers (Megatron-Bridge's ``account_for_*_in_pipeline_split``), 128 over PP 8 x VP 2,
so the first and last chunks hold 7 layers and the others 8. Its full replays repeat
every 16 steady steps exactly only after a transient, the uneven stages settling first:
from steady step 8 in fp8 (current scaling), from step 33 in bf16; the bridge-26.x rows
on 1,024 H100 do so from step ~136 of 64-step periods.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.steady import (
    NOT_PERIODIC,
    STEP_TOLERANCE,
    later_period,
    latest_offset,
    middle_offset,
    run_steady,
    short_micro_batches,
    steady_period,
)

UNEVEN = {
    "model": "llama3-405b",
    "tp": 8,
    "pp": 8,
    "virtual_stages": 2,
    "dp": 1,
    "micro_batch": 1,
    "precision": "fp8",
    "recompute": "none",
    "sequence_parallel": True,
    "tp_comm_overlap": True,
    "distributed_optimizer": True,
    "fp8_recipe": "tensorwise",
    "account_for_embedding_in_pipeline_split": True,
    "account_for_loss_in_pipeline_split": True,
    "replicas": True,
    "shadows": True,
}
#: The same pipeline in bf16, whose transient outlasts a short step's middle pair.
BF16 = {k: v for k, v in UNEVEN.items() if k != "fp8_recipe"} | {"precision": "bf16"}
SERVERS = 8  # one replica of TP 8 x PP 8
PP, V = 8, 2


def _replay(micro: int, options: dict = UNEVEN):
    return run_workload(megatron(**{**options, "global_batch": micro}), "dgx-h100", nodes=SERVERS)


def test_the_period_is_found_past_the_transient():
    # In bf16 the same pipeline repeats only from steady step 33 (the fp8 build, whose
    # casts make its passes shorter, settles from step 8, before any middle a multiple
    # of 8 micro-batches gives). 56 micro-batches: 112 - 22 warm-up forwards = 90
    # steady steps. The middle pair of periods (steps 29-44 against 45-60) is still in
    # the transient; the latest that keeps the end's margin of 4 starts at 90 - 32 - 4 =
    # 54; every second offset is tried (16 / 8) from 29: 31 not yet periodic, 33 periodic.
    run, result = _replay(56, BF16)
    assert (middle_offset(56, PP, V), latest_offset(56, PP, V)) == (29, 54)
    period, why = steady_period(run.workload, run, PP, V, 29)
    assert np.isnan(period) and why.startswith(NOT_PERIODIC)
    assert steady_period(run.workload, run, PP, V, 31)[1].startswith(NOT_PERIODIC)
    period_s, offset, why = later_period(run.workload, run, PP, V, 29, 54)
    assert why == "" and offset == 33
    assert period_s == steady_period(run.workload, run, PP, V, 33)[0] > 0
    # From there the step of 56 + 2 x 8 micro-batches is that of 56 and two periods:
    # the full replay of 72, the reference.
    _, full = _replay(72, BF16)
    assert result.step_s + 2 * period_s == pytest.approx(full.step_s, rel=STEP_TOLERANCE, abs=0)


def test_no_later_offset_periodic_says_so():
    # 32 micro-batches: 42 steady steps, the middle at 5 and the latest at 6, both in
    # the transient: NaN, the middle's offset and its reason, naming the steps tried.
    run, _ = _replay(32)
    period_s, offset, why = later_period(run.workload, run, PP, V, 5, 6)
    assert np.isnan(period_s) and offset == 5
    assert why.startswith(NOT_PERIODIC) and why.endswith(" s (nor later, up to steady step 6)")
    # With nothing later to try, the middle's reason alone.
    assert (
        later_period(run.workload, run, PP, V, 5, 5)[2]
        == steady_period(run.workload, run, PP, V, 5)[1]
    )


def test_a_longer_short_step_is_the_full_step():
    # 128 micro-batches: the 32 of the shortest step (periods compared from steady step
    # 5 to 6 at the latest) are all in the transient; one longer step whose periods can
    # start two periods (32 steps) later, at 38: 22 + 32 + 38 + 4 = 96 passes, 48
    # micro-batches (128 less 10 periods of 8), no more than half of 128. Its middle,
    # (74 - 32) // 2 = 21, is past the transient.
    micro = 128
    assert short_micro_batches(micro, PP, V) == 32
    assert latest_offset(32, PP, V) == 6
    assert short_micro_batches(micro, PP, V, reach=6 + 32) == 48
    steady = run_steady({**UNEVEN, "global_batch": micro}, "dgx-h100", nodes=SERVERS)
    assert steady.why == "" and steady.simulated == 48 and steady.periods == 10
    assert len(steady.tried) == 1
    assert steady.tried[0].startswith(f"32 of 128 micro-batches: {NOT_PERIODIC}")
    _, full = _replay(micro)
    assert steady.step_s == pytest.approx(full.step_s, rel=STEP_TOLERANCE, abs=0)


def test_a_longer_short_step_that_spares_too_little_is_not_replayed():
    # 64 micro-batches: the shortest step (32) is in the transient and the longer one
    # would be 48, more than half of 64: the full step, bit for bit.
    micro = 64
    assert short_micro_batches(micro, PP, V, reach=6 + 32) == 48
    steady = run_steady({**UNEVEN, "global_batch": micro}, "dgx-h100", nodes=SERVERS)
    assert steady.simulated == steady.micro_batches == micro and steady.period_s is None
    assert steady.why.startswith(f"32 of 64 micro-batches: {NOT_PERIODIC}")
    # Then the full step, watched from steady step 7 (past the shortest step's 6): a
    # pair from there would need 40 micro-batches, 80 passes, where 128 - (22 + 7 + 32)
    # = 67 are left (simulator.workload.steady._Watch).
    assert short_micro_batches(micro, PP, V, reach=7) == 40
    assert steady.why.endswith(
        "; the full step watched from steady step 7: a short step holding steady step 7 "
        "spares nothing"
    )
    assert steady.tried == ()
    _, full = _replay(micro)
    assert steady.step_s == full.step_s
