"""A full step's replay watched as it runs (simulator.workload.steady._Watch): where a
pair of steady periods repeats early enough, the replay is ended and the short step
holding that pair replayed and checked instead; else the watched replay is the full
step's, bit for bit. The reference is the full step's replay, unwatched.

The pipeline is tests/test_steady_transient.py's uneven 405B (PP 8 x VP 2, the
embedding and the loss counted as layers), periodic only from steady step ~20.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology import load_topology
from simulator.workload import TimingStore, run_workload
from simulator.workload.generators import megatron
from simulator.workload.steady import (
    NOT_PERIODIC,
    STEP_TOLERANCE,
    _replayed,
    _Watch,
    later_period,
    latest_offset,
    middle_offset,
    run_steady,
    short_micro_batches,
    uneven_stages,
)
from tests.test_steady_transient import PP, SERVERS, UNEVEN, V


def _replay(micro: int):
    return run_workload(megatron(**{**UNEVEN, "global_batch": micro}), "dgx-h100", nodes=SERVERS)


def test_the_watched_full_step_ends_at_a_pair_that_repeats():
    # 80 micro-batches: the shortest step is 32 (its pairs from steady steps 5 to 6, in
    # the transient); the longer one, two periods later (reach 38), would be 48, more
    # than half of 80. So the full step is replayed, watched from steady step 7, every
    # second step (16 / 8); the first pair that repeats in the full replay (read off the
    # full replay itself, the reference) ends it, and the short step holding it is
    # replayed: 22 + 2 x 16 + found + 4 passes, rounded up to whole periods of 8.
    micro = 80
    assert short_micro_batches(micro, PP, V) == 32
    assert short_micro_batches(micro, PP, V, reach=6 + 32) == 48
    full, result = _replay(micro)
    period_s, found, why = later_period(full.workload, full, PP, V, 7, latest_offset(micro, PP, V))
    assert why == "" and (found - 7) % 2 == 0
    sized = short_micro_batches(micro, PP, V, reach=found)
    assert sized is not None and sized * V < micro * V - (22 + found + 32)
    steady = run_steady({**UNEVEN, "global_batch": micro}, "dgx-h100", nodes=SERVERS)
    assert steady.why == "" and steady.simulated == sized
    assert steady.periods == (micro - sized) // PP
    assert steady.tried[0].startswith(f"32 of 80 micro-batches: {NOT_PERIODIC}")
    assert steady.tried[1] == f"the full step watched: steady step {found} repeats"
    assert steady.period_s == pytest.approx(period_s, rel=STEP_TOLERANCE, abs=0)
    assert steady.step_s == pytest.approx(result.step_s, rel=STEP_TOLERANCE, abs=0)


def test_uneven_stages_with_few_micro_batches_replay_the_full_step_first():
    # 48 micro-batches: the shortest step, 32, is more than half of them; the stages are
    # uneven: the full step is replayed first, watched from the shortest step's middle,
    # 5. A pair from there would need a step of 32 micro-batches, 64 passes, where
    # 96 - (22 + 5 + 32) = 37 are left: the watch stops at once and the replay runs on.
    # Every op's issue, start and end are those of the unwatched replay, to the bit.
    micro = 48
    assert short_micro_batches(micro, PP, V) == 32 and middle_offset(32, PP, V) == 5
    assert short_micro_batches(micro, PP, V, reach=5) == 32
    steady = run_steady({**UNEVEN, "global_batch": micro}, "dgx-h100", nodes=SERVERS)
    full, result = _replay(micro)
    assert steady.simulated == micro and steady.period_s is None and steady.tried == ()
    assert steady.why == (
        "uneven stages and the shortest step (32 micro-batches) more than 0.5 of the "
        "step: the full step replayed first; the full step watched from steady step 5: "
        "a short step holding steady step 5 spares nothing"
    )
    assert steady.step_s == result.step_s
    for field in ("issue_s", "start_s", "end_s"):
        np.testing.assert_array_equal(
            getattr(steady.run.records, field), getattr(full.records, field)
        )


def test_even_stages_are_not_replayed_first():
    # The same pipeline without the embedding and the loss counted as layers: even.
    even = {
        **UNEVEN,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False,
    }
    assert uneven_stages(UNEVEN) and not uneven_stages(even)
    assert uneven_stages({"first_stage_layers": 6})


def test_a_refused_short_step_ends_early_with_the_reason_of_its_whole_replay():
    # 32 micro-batches: every pair from steady step 5 (the middle) to 6 (the latest) is
    # in the transient. Watched, the replay ends once the pair from 6 has run, with the
    # reason later_period gives on the whole replay (the reference), some ops unrun.
    micro = 32
    run, _ = _replay(micro)
    reason = later_period(run.workload, run, PP, V, 5, 6)[2]
    assert reason.startswith(NOT_PERIODIC)
    graph = load_topology("dgx-h100", SERVERS)
    watch = _Watch(PP, V, micro, 0, 5, until=6)
    options = {**UNEVEN, "global_batch": micro}
    assert _replayed(options, graph, {"timings": TimingStore(graph)}, watch) is None
    assert watch.refused == reason
    assert watch.replay is not None and np.isnan(watch.replay.records.end_s).any()
    # And so in run_steady's attempt at 64 micro-batches.
    steady = run_steady({**UNEVEN, "global_batch": 64}, "dgx-h100", nodes=SERVERS)
    assert steady.why.startswith(f"32 of 64 micro-batches: {reason}; ")
