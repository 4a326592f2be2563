"""Every rank built at once where neither TP masters nor one replica would stand in
(issue 31): ``run_steady`` asks :func:`~simulator.workload.replicas.neither_stands_in`
on the masters' build and skips the replay's intermediate build of every TP rank. The
reference is the replay deciding alone (the masters' build handed to it): the same
step, every op's times, the same breakdown and the same reasons reported."""

from __future__ import annotations

import numpy as np
import simpy
from test_shadows_hashed_sends import racks

from simulator.network.flows import FlowNetwork
from simulator.workload import run_workload, steady
from simulator.workload.generators import megatron
from simulator.workload.replicas import neither_stands_in, replica_symmetry
from simulator.workload.shadows import HASHED_SENDS
from simulator.workload.steady import run_steady

# TP 4 PP 4 (two virtual stages) DP 2 on two racks of 16 GPUs: a rack holds two
# stages, each with its two replicas side by side, and stage 1 sends to stage 2 from
# rail 8 + i to rail i over the spines (ECMP), as in tests/test_shadows_hashed_sends.py.
HASHED = dict(
    model="llama3-8b",
    micro_batch=1,
    tp=4,
    pp=4,
    dp=2,
    virtual_stages=2,
    shadows=True,
    replicas=True,
)


def test_neither_stands_in_where_sends_are_hashed_and_replicas_share_racks():
    """Both refused on the masters' build, for the replay's own reasons; and the
    replicas' refusal holds on the build of every TP rank too (the build skipped)."""
    graph = racks(16, 2)
    masters = megatron(**HASHED, global_batch=16)
    network = FlowNetwork(simpy.Environment(), graph)
    refused = neither_stands_in(masters, network)
    assert refused is not None
    assert refused[0] == HASHED_SENDS
    assert "splits server" in refused[1]
    every_tp_rank = masters.shadows.build()
    symmetry, why = replica_symmetry(every_tp_rank, network)
    assert symmetry is None and why == refused[1]


def test_stages_filling_racks_leave_the_decision_to_the_replay():
    """Stages that fill a rack send rail to rail over one path: the masters may stand
    in, so nothing is decided before the replay."""
    graph = racks(8, 2)
    masters = megatron(**{**HASHED, "pp": 2, "virtual_stages": 1}, global_batch=8)
    assert masters.shadows is not None and masters.replicas is not None
    assert neither_stands_in(masters, FlowNetwork(simpy.Environment(), graph)) is None


def test_full_step_equals_the_replay_deciding_alone():
    """The full step (no steady shortcut) built every rank at once: the replay's step,
    op times, breakdown and reports are those of the replay handed the masters' build."""
    graph = racks(16, 2)
    options = {**HASHED, "global_batch": 16}
    fast = run_steady(options, graph, shortcut=False)
    run, result = run_workload(megatron(**options), graph)
    assert fast.run.shadows["simulated"] == "all"  # (the case is the one meant)
    assert fast.run.replicas["simulated"] == "all"
    assert fast.step_s == result.step_s
    assert repr(fast.breakdown) == repr(result)
    for field in ("start_s", "end_s"):
        assert np.array_equal(getattr(fast.run.records, field), getattr(run.records, field))
    assert fast.run.shadows == run.shadows
    assert fast.run.replicas == run.replicas


def test_steady_shortcut_unchanged(monkeypatch):
    """With the steady shortcut (a short step of two periods and more), the step is the
    same double whether the short step's ranks are built at once or by the replay."""
    graph = racks(16, 2)
    options = {**HASHED, "global_batch": 2 * 32}
    fast = run_steady(options, graph)
    monkeypatch.setattr(steady, "neither_stands_in", lambda *_: None)
    slow = run_steady(options, graph)
    assert fast.simulated == slow.simulated < fast.micro_batches  # (the shortcut taken)
    assert fast.run.workload.shadows is None and fast.run.workload.replicas is None
    assert slow.workload.shadows is not None  # (the replay built every rank itself)
    assert fast.step_s == slow.step_s
    assert repr(fast.breakdown) == repr(slow.breakdown)
    assert fast.run.shadows == slow.run.shadows and fast.run.replicas == slow.run.replicas
