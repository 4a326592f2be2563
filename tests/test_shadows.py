"""Tensor-parallel ranks simulated once (simulator.workload.shadows): one rank per TP
group stands for the group. On a symmetric cluster the step is the one with every rank
built, to the last digit (every master op at the same times, the same bytes on every
link); where the TP ranks are not alike the replay says so and builds every rank."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology import load_topology
from simulator.workload import WorkloadReplay
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown


def steps(options: dict, graph, **replay):
    """The step with TP masters standing for their groups and with every rank built."""
    common = dict(model="llama3-8b", micro_batch=1, global_batch=4 * options["dp"], **options)
    shadowed = WorkloadReplay(megatron(**common, shadows=True), graph, **replay).run()
    full = WorkloadReplay(megatron(**common), graph, **replay).run()
    return shadowed, full


@pytest.mark.parametrize(
    "options",
    [
        {"tp": 4, "pp": 2, "dp": 2},
        {"tp": 2, "pp": 1, "dp": 8},
        {"tp": 8, "pp": 2, "dp": 2, "virtual_stages": 2},
        {"tp": 4, "pp": 2, "dp": 4, "replicas": True},
        {"tp": 2, "pp": 2, "dp": 2, "cp": 2},
        {"tp": 1, "pp": 2, "dp": 2, "cp": 4},
        {"tp": 4, "pp": 2, "dp": 4, "cp": 2, "replicas": True},
        {"tp": 2, "pp": 2, "dp": 2, "cp": 2, "virtual_stages": 2, "recompute": "full"},
    ],
)
def test_masters_stand_for_their_tp_groups_exactly(options):
    """Megatron-Core's defaults (overlapped DP reduce-scatters and gathers, TP
    collectives beside the GEMMs, pipeline sends, context parallelism): the same step,
    every master op at the same times as in the full build, the same bytes on every
    link (the shadows' calls and sends carried beside the masters'), and 1/tp of the
    ops processed (1/(tp cp) with context parallelism: a master stands for its TP
    group's ranks on every CP rank)."""
    ranks = options["tp"] * options["pp"] * options["dp"] * options.get("cp", 1)
    graph = load_topology("dgx-h100", max(1, ranks // 8))
    shadowed, full = steps(options, graph)
    count = options["tp"] * options.get("cp", 1)
    assert shadowed.shadows == {"count": count, "simulated": 1}
    assert breakdown(shadowed).step_s == breakdown(full).step_s
    ids = {op.id: op.index for op in full.workload.ops}
    for op in shadowed.workload.ops:
        j = ids[op.id]
        assert shadowed.records.start_s[op.index] == full.records.start_s[j]
        assert shadowed.records.end_s[op.index] == full.records.end_s[j]
    assert np.allclose(shadowed.links["bytes"], full.links["bytes"], rtol=1e-12, atol=1.0)
    assert len(shadowed.workload.ops) * count == len(full.workload.ops)
    # The breakdown (compute, exposed, bubble, ...) is every rank's: the shadows, which
    # hold no ops, are not counted as idle ranks.
    # The images of calls (those of the DP and CP groups on the other TP ranks) ran
    # passively, no events for their ends; with TP and CP some were met and went on as
    # bundles, ending with their masters all the same. (With TP 1 every group a master
    # is in maps onto itself: only sends have images.)
    if options["tp"] > 1:
        assert shadowed.isolated["passive"] > 0
        if options.get("cp", 1) > 1:
            assert shadowed.isolated["passive_met"] > 0
    mine, theirs = breakdown(shadowed), breakdown(full)
    for key, value in theirs.summary().items():
        assert mine.summary()[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    for kind, value in theirs.exposed_by_kind.items():
        assert mine.exposed_by_kind[kind] == pytest.approx(value, rel=1e-9, abs=1e-12), kind


def test_a_slower_nic_on_one_rail_builds_every_rank():
    """Two DGX H100 with rail 1's NIC link at half speed on the first server: the
    data-parallel calls of TP rank 1 (images of TP rank 0's) end later than their
    masters', so the replay builds every rank and runs again; the step is the full
    build's."""
    graph = load_topology("dgx-h100", 2)
    graph.edges["s0/nic1", "leaf1"]["bandwidth"] /= 2
    shadowed, full = steps({"tp": 4, "pp": 1, "dp": 4}, graph)
    assert shadowed.shadows["simulated"] == "all"
    assert "ended at" in shadowed.shadows["why"]
    assert breakdown(shadowed).step_s == breakdown(full).step_s


def test_faults_build_every_rank_from_the_start():
    """A faulted cluster singles out ranks: every rank is built before the run."""
    from simulator.network.faults import apply_faults

    graph = apply_faults(load_topology("dgx-h100", 2), "link=s0/nic1-leaf1:0.5")
    shadowed, full = steps({"tp": 4, "pp": 1, "dp": 4}, graph)
    assert shadowed.shadows == {"count": 4, "simulated": "all", "why": "the topology has faults"}
    assert breakdown(shadowed).step_s == breakdown(full).step_s


def test_two_jobs_with_tp_and_cp_masters_merge_both_shifts():
    """Two jobs given by masters standing for TP x CP ranks, placed scattered on one
    leaf-spine (one spine: no ECMP choice) so that their traffic meets: the merged
    workload moves both shifts onto each job's GPUs, and the steps alone and together,
    every master op's times and every link's bytes are those of every rank built."""
    from simulator.workload.jobs import Job, run_jobs

    def step(shadows):
        return megatron(
            "llama3-8b", tp=2, cp=2, pp=2, dp=2, micro_batch=1, global_batch=4,
            shadows=shadows,
        )  # fmt: skip

    fabric = {"type": "leaf-spine", "oversubscription": 2, "servers_per_leaf": 2, "spines": 1}
    graph = load_topology("dgx-h100", 4, fabric=fabric)
    one = run_jobs([Job("A", step(True), "scattered"), Job("B", step(True), "scattered")], graph)
    every = run_jobs(
        [Job("A", step(False), "scattered"), Job("B", step(False), "scattered")], graph
    )
    assert one.together.shadows == {"count": 4, "simulated": 1}
    assert one.shared  # they meet
    for a, b in zip(one.jobs, every.jobs, strict=True):
        assert a.step_alone_s == b.step_alone_s
        assert a.step_together_s == b.step_together_s
    ids = {op.id: op.index for op in every.together.workload.ops}
    for op in one.together.workload.ops:
        j = ids[op.id]
        assert one.together.records.end_s[op.index] == every.together.records.end_s[j]
    assert np.allclose(one.together.links["bytes"], every.together.links["bytes"], atol=1.0)
    assert len(one.together.workload.ops) * 4 == len(every.together.workload.ops)


def test_a_replay_started_over_leaves_no_cyclic_garbage():
    """The slower-NIC case starts over with every rank built: the replay it started is
    closed with the first, so neither is left for the cycle collector, and the step is
    still the full build's."""
    import gc

    from simulator.network.flows import FlowNetwork

    graph = load_topology("dgx-h100", 2)
    graph.edges["s0/nic1", "leaf1"]["bandwidth"] /= 2
    common = dict(model="llama3-8b", micro_batch=1, global_batch=16, tp=4, pp=1, dp=4)
    full = breakdown(WorkloadReplay(megatron(**common), graph).run()).step_s
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        replay = WorkloadReplay(megatron(**common, shadows=True), graph)
        run = replay.run()
        assert run.shadows["simulated"] == "all"  # (it did start over)
        assert breakdown(run).step_s == full
        replay.close()
        del replay, run
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(t).__name__ for t in gc.garbage if isinstance(t, WorkloadReplay | FlowNetwork)]
        assert left == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
