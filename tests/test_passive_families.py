"""The images of a master's call replayed together (IsolatedCalls.run_family) hold one
record for the family: the calls met are made one by one only then, and the ends
expected are one ExpectedFamily. The replay is the one where each image is replayed
on its own (IsolatedCalls.run, one record per image), bit for bit, and the check
settles the same (tests/test_shadows.py holds both to every rank built)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology import load_topology
from simulator.workload import WorkloadReplay
from simulator.workload import isolated as iso
from simulator.workload.generators import megatron
from simulator.workload.shadows import ShadowCheck


@pytest.mark.parametrize(
    "options", [{"tp": 2, "pp": 2, "dp": 2, "cp": 2}, {"tp": 4, "pp": 2, "dp": 2}]
)
def test_a_family_replayed_together_is_its_images_one_by_one(options, monkeypatch):
    """With families the replay is the one with every image on its own: the same
    times of every op, bytes on every link, flows and counts, and some images of a
    family were met (made then, and gone on as bundles)."""
    ranks = options["tp"] * options["pp"] * options["dp"] * options.get("cp", 1)
    graph = load_topology("dgx-h100", ranks // 8)

    def step():
        return megatron(
            model="llama3-8b", micro_batch=1, global_batch=4 * options["dp"], shadows=True,
            **options,
        )  # fmt: skip

    made = []
    real = iso._Passives.made

    def spy(self, calls, holder):
        call = real(self, calls, holder)
        made.append(call is not None)
        return call

    monkeypatch.setattr(iso._Passives, "made", spy)
    together = WorkloadReplay(step(), graph).run()
    assert any(made)  # families' images met
    monkeypatch.setattr(iso.IsolatedCalls, "run_family", lambda self, *args: False)
    alone = WorkloadReplay(step(), graph).run()
    assert np.array_equal(together.records.start_s, alone.records.start_s)
    assert np.array_equal(together.records.end_s, alone.records.end_s)
    assert np.array_equal(together.links["bytes"], alone.links["bytes"])
    assert together.stats == alone.stats
    for key in ("passive", "passive_met", "bundled", "met", "replayed"):
        assert together.isolated[key] == alone.isolated[key], key
    assert together.isolated["passive_met"] > 0


DONE = [(0.5, np.array([0])), (0.75, np.array([1]))]
OTHER = [(0.25, np.array([0])), (0.75, np.array([1]))]


def _settled(family: bool, cuts: dict[int, float], master_ends: dict[int, float]) -> str:
    """settle() of call 3's four images starting at 1.0 s (timings DONE, DONE, OTHER,
    DONE; image i cut at ``cuts[i]``), expected as one family or one record each."""
    check = ShadowCheck()
    for position, end in master_ends.items():
        check.master((3,), [position], end)
    dones = [DONE, DONE, OTHER, DONE]
    if family:
        expected = check.expected_family((3,))
        expected.expect(1.0, dones, [0, 2])
        for i, after in cuts.items():
            expected.retract(i, after)
    else:
        for i, done in enumerate(dones):
            one = check.expected((3,), "an image")
            one.expect(1.0, done)
            if i in cuts:
                one.retract(cuts[i])
    return check.settle()


@pytest.mark.parametrize(
    ("cuts", "master_ends", "verdict"),
    [
        # DONE's position 0 ends at 1.5 s, OTHER's at 1.25 s: against a master ending
        # at 1.5 s there, OTHER's image is unlike.
        ({}, {0: 1.5, 1: 1.75}, "a shadow of (3,) ended at 1.25 s, its master at 1.5 s"),
        # OTHER's image cut at 1.1 s (before its first end): nothing of it is checked.
        ({2: 1.1}, {0: 1.5, 1: 1.75}, ""),
        # Every DONE image cut at 1.6 s: their 1.75 s ends are not checked, OTHER's is.
        ({0: 1.6, 1: 1.6, 3: 1.6, 2: 1.1}, {0: 1.5, 1: 9.0}, ""),
        # One DONE image cut, the others not: their 1.75 s end is still checked.
        ({0: 1.6, 2: 1.1}, {0: 1.5, 1: 9.0}, "a shadow of (3,) ended at 1.75 s, its master at 9 s"),
        # A master that never ended at position 1.
        ({2: 1.1}, {0: 1.5}, "a shadow of (3,) ended where its master never did"),
    ],
)
def test_a_family_settles_as_one_record_per_image(cuts, master_ends, verdict):
    """Hand-worked verdicts of settle() on a family's images (two timings, some cut),
    the same as with one ExpectedEnds per image."""
    assert _settled(True, cuts, master_ends) == verdict
    assert _settled(False, cuts, master_ends) == verdict
