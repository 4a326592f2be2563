"""The shadows' images of point-to-point sends (simulator.workload.engine._ImageSends):
the images of a send arrive together, and the check hears each send once per arrival
instead of once per image; what it concludes is the same (tests/test_shadows.py holds
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
