"""A collective's launch in the engine (simulator.workload.engine): what it keeps from
one launch to the next (per group and call: the images that start with a master's call
and their route checks; per group: the masters' positions), the launch overhead as one
event, and the bookkeeping it skips without ``comm_slowdown``.

References: the replay with every TP rank and every replica built (the shadows'
and replicas' own reference, as tests/test_shadows.py holds it), a launch overhead run
through a plain :class:`simpy.Timeout` and closure (the engine's former path, put back
here), and the kept values made afresh.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology import load_topology
from simulator.workload import WorkloadReplay, engine
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown

#: Steps whose calls and sends have images on the shadows (TP and CP masters), with
#: one replica standing for all where asked, and with interleaved stages.
STEPS = [
    {"tp": 4, "pp": 2, "dp": 4, "cp": 2, "replicas": True},
    {"tp": 2, "pp": 2, "dp": 2, "cp": 2, "virtual_stages": 2},
]


def _step(options: dict, shadows: bool):
    common = dict(model="llama3-8b", micro_batch=1, global_batch=4 * options["dp"], **options)
    return megatron(**common, shadows=shadows)


def _graph(options: dict):
    ranks = options["tp"] * options["pp"] * options["dp"] * options.get("cp", 1)
    return load_topology("dgx-h100", max(1, ranks // 8))


def _same_records(ours, theirs) -> None:
    """Every op of ``ours`` at the same times as the op of the same id in ``theirs``."""
    ids = {op.id: op.index for op in theirs.workload.ops}
    for op in ours.workload.ops:
        j = ids[op.id]
        for name in ("issue_s", "start_s", "end_s"):
            assert getattr(ours.records, name)[op.index] == getattr(theirs.records, name)[j]


@pytest.mark.parametrize("options", STEPS)
def test_launch_overhead_as_one_event_is_the_timeout_it_replaces(options, monkeypatch):
    """The launch overhead's event takes the place of a Timeout of the same delay and a
    closure: the same replay to the bit (every op's times, the links' bytes, the
    breakdown), same-time events included."""
    graph = _graph(options)
    ours = WorkloadReplay(_step(options, True), graph).run()

    def timeout(env, delay, start):
        overhead = env.timeout(delay)
        overhead.callbacks.append(lambda _event: start())

    monkeypatch.setattr(engine, "_Later", timeout)
    theirs = WorkloadReplay(_step(options, True), graph).run()
    _same_records(ours, theirs)
    assert np.array_equal(ours.links["bytes"], theirs.links["bytes"])
    assert breakdown(ours).summary() == breakdown(theirs).summary()


@pytest.mark.parametrize("options", STEPS)
def test_kept_images_and_positions_are_those_made_afresh(options):
    """After a replay, each call's images kept for its later launches, and each group's
    masters' positions, are what a replay that has kept nothing makes for them."""
    graph = _graph(options)
    replay = WorkloadReplay(_step(options, True), graph)
    replay.run()
    assert any(replay._families.values()) and replay._owners
    fresh = WorkloadReplay(_step(options, True), graph)
    workload = replay.workload
    for members in workload.instances:
        first = workload.ops[members[0]]
        key = (first.group, first.op, first.nbytes, first.chunks, first.channels, first.algorithm)
        if key not in replay._families:
            continue
        _, proto, _, _ = fresh._call_schedule(
            first, workload.groups[first.group].ranks, first.group
        )
        kept = replay._families[key]
        made = fresh._family(first, replay._images[first.group], proto, key)
        if kept is None:  # (images that cannot start with their master's call)
            assert made is None
            continue
        assert [(name, period) for name, _, _, period in kept] == [
            (name, period) for name, _, _, period in made
        ]
        for (_, schedule, ranks, _), (_, again, theirs, _) in zip(kept, made, strict=True):
            assert np.array_equal(ranks, theirs)
            assert np.array_equal(schedule.src, again.src)
            assert np.array_equal(schedule.nbytes, again.nbytes)
    tp = options["tp"]
    for (name, size), (owner, slots, apart) in replay._owners.items():
        ranks = workload.groups[name].ranks
        master_of = workload.shadows.master_of()
        position = {ranks[i]: i for i in range(size)}
        assert owner == [position.get(int(master_of[ranks[i]]), i) for i in range(size)]
        assert slots == [i for i in range(size) if ranks[i] in workload.shadows.masters]
        # A master a CP rank away is in another TP group (the generator numbers TP
        # ranks first: a TP group is tp consecutive ranks).
        assert apart == [ranks[i] // tp != ranks[owner[i]] // tp for i in range(size)]


def test_images_routes_checked_once_per_call_and_group():
    """With one replica standing for all, each image's routes are checked against the
    replicas' once, at its call's first launch: never twice for a schedule and ranks."""
    options = STEPS[0]
    replay = WorkloadReplay(_step(options, True), _graph(options))
    assert replay.replicas is not None
    seen: list[tuple] = []
    check = replay.replicas.check_routes

    def spy(network, schedule, ranks):
        seen.append((id(schedule), np.asarray(ranks).tobytes()))
        check(network, schedule, ranks)

    replay.replicas.check_routes = spy  # type: ignore[method-assign]
    replay.run()
    assert seen and len(seen) == len(set(seen))


@pytest.mark.parametrize("slowdown", [0.0, 0.3])
def test_masters_stand_for_their_groups_with_communication_slowing_compute(slowdown):
    """Communication on GPU cores slowing compute (counted only where it is asked for):
    TP masters standing for their groups give every master op the times it has with
    every rank built."""
    options = {"tp": 2, "pp": 2, "dp": 2, "cp": 2}
    graph = _graph(options)
    shadowed = WorkloadReplay(_step(options, True), graph, comm_slowdown=slowdown).run()
    full = WorkloadReplay(_step(options, False), graph, comm_slowdown=slowdown).run()
    assert shadowed.shadows["simulated"] == 1
    _same_records(shadowed, full)
