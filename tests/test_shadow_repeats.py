"""Shadows' ends heard once where they repeat: the images of a send arrive together
and the check hears each send once per arrival (simulator.workload.engine._ImageSends);
passive images of a call sharing its timing and start are settled once
(ShadowCheck.settle). What the check concludes is the same (tests/test_shadows.py holds
the whole step to the full build, and a slower rail to a rebuild)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.workload.engine import _ImageSends
from simulator.workload.shadows import ShadowCheck, ShadowsUnlike


def test_each_send_is_heard_once_per_arrival_in_first_arrival_order():
    """Flows [7, 7, 3, 7, 3, 9] (images of sends 7, 3 and 9) arriving together are
    heard as sends 7, 3, 9: once each, in the order their first image came."""
    heard: list[int] = []
    _ImageSends(heard.append).on_delivered(np.array([7, 7, 3, 7, 3, 9]))
    assert heard == [7, 3, 9]


@pytest.mark.parametrize("master_end, agrees", [(2.5, True), (2.75, False)])
def test_one_image_end_decides_as_every_image_end_does(master_end, agrees):
    """A send's images ending at 2.5 s: the check heard once says what it says when
    heard once per image (agree with a master ending at 2.5 s, not at 2.75 s), both at
    the time and at the end of the run."""
    verdicts = []
    for images in (1, 5):
        check = ShadowCheck()
        check.master(("send", 4), [0], master_end)
        try:
            check.shadow(("send", 4), [0] * images, 2.5, "a shadow")
            verdicts.append(check.settle())
        except ShadowsUnlike as unlike:
            verdicts.append(str(unlike))
    assert verdicts[0] == verdicts[1]
    assert (verdicts[0] == "") is agrees


def _settled(images: list[tuple[float, list]], master_ends: dict[int, float]) -> str:
    """settle() after call 3's master ended at ``master_ends`` and passive images
    (start, done) were expected."""
    check = ShadowCheck()
    for position, end in master_ends.items():
        check.master((3,), [position], end)
    for start, done in images:
        check.expected((3,), "an image").expect(start, done)
    return check.settle()


def test_images_sharing_a_timing_and_start_are_checked_as_one():
    """Twelve images of call 3 sharing one timing (ends at 1.0 + 0.5 s and 1.0 + 0.75
    s) agree with a master ending there; the same images against a master whose
    position 1 ended at 1.5 s are found unlike, with the message of the first."""
    done = [(0.5, np.array([0])), (0.75, np.array([1]))]
    assert _settled([(1.0, done)] * 12, {0: 1.5, 1: 1.75}) == ""
    assert _settled([(1.0, done)] * 12, {0: 1.5, 1: 1.5}) == (
        "a shadow of (3,) ended at 1.75 s, its master at 1.5 s"
    )


def test_an_image_with_the_same_timing_but_another_start_is_still_checked():
    """An image sharing the timing (the same list) but starting 0.25 s later is not a
    repeat: it ends at 1.75 + 0.5 s, unlike the master, and settle says so."""
    done = [(0.5, np.array([0]))]
    assert _settled([(1.0, done), (1.0, done)], {0: 1.5}) == ""
    assert _settled([(1.0, done), (1.25, done)], {0: 1.5}) == (
        "a shadow of (3,) ended at 1.75 s, its master at 1.5 s"
    )
