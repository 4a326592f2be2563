"""The small max-min path's rounds (each link's load summed again only when it loses
entries, caps taken in sorted order) give the numpy path's rates bit for bit where its
shortcuts matter: many distinct caps (one round each), caps within the tie of one
another or of a link's share, zero caps and zero weights, flows over several links."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_maxmin_small import numpy_rates

from simulator.network import maxmin
from simulator.network.maxmin import _small_rates


def same_as_numpy(inc_flow, inc_link, n_flows, capacity, weight=None, cap=None):
    args = (np.asarray(inc_flow), np.asarray(inc_link), n_flows, np.asarray(capacity, float),
            None if weight is None else np.asarray(weight, float),
            None if cap is None else np.asarray(cap, float))  # fmt: skip
    small = _small_rates(*args)
    assert small is not None
    assert small.tobytes() == numpy_rates(*args).tobytes()
    return small


def test_caps_below_the_link_each_take_their_own_round():
    """Five one-link flows capped at 1..5 on a link of 100: each runs at its cap (the
    link never binds: 15 < 100), hand-computed; and a sixth uncapped one takes the
    rest, 85."""
    rates = same_as_numpy([0, 1, 2, 3, 4, 5], [0] * 6, 6, [100.0], None,
                          [1.0, 2.0, 3.0, 4.0, 5.0, np.inf])  # fmt: skip
    assert rates.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 85.0]


def test_a_link_that_binds_between_caps():
    """Caps 1, 2, 10, 10 on a link of 9: rounds 1 and 2 freeze the small caps, then the
    link's share (9 - 3) / 2 = 3 is below 10 (hand-computed)."""
    rates = same_as_numpy([0, 1, 2, 3], [0] * 4, 4, [9.0], [1.0, 1.0, 1.0, 1.0],
                          [1.0, 2.0, 10.0, 10.0])  # fmt: skip
    assert rates.tolist() == [1.0, 2.0, 3.0, 3.0]


def test_caps_within_the_tie_freeze_at_the_least():
    """A cap 1e-13 relative above another freezes in its round, at the lesser level (the
    tie is 1e-12), on both paths; one 1e-11 above gets a round of its own (the link of
    100e9 never binds: 4 x 12e9 on it)."""
    low = 12e9
    rates = same_as_numpy([0, 1, 2], [0, 0, 0], 3, [100e9], [1.0, 2.0, 1.0],
                          [low, low * (1 + 1e-13), low * (1 + 1e-11)])  # fmt: skip
    assert rates[0] == rates[1] == low
    assert rates[2] == low * (1 + 1e-11)


def test_zero_caps_zero_weights_and_infinite_links():
    same_as_numpy([0, 1, 2, 3], [0, 0, 1, 2], 4, [10.0, np.inf, 5.0], [0.0, 1.0, 2.0, 0.0],
                  [0.0, np.inf, 3.0, np.inf])  # fmt: skip
    same_as_numpy([0, 1], [0, 0], 2, [np.inf], None, [np.inf, np.inf])
    same_as_numpy([0, 1], [0, 0], 3, [4.0], None, [-1.0, np.inf, 2.0])


def test_nan_cap_falls_back_to_numpy():
    args = (np.array([0]), np.array([0]), 1, np.array([1.0]), None, np.array([np.nan]))
    assert _small_rates(*args) is None


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_bundles_like_problems_equal_numpy(data):
    """Random flows over 1-3 of up to 6 links, most capped from a few levels (some
    nudged within or just beyond the tie), weighted or not: bit for bit."""
    n_links = data.draw(st.integers(1, 6))
    n_flows = data.draw(st.integers(1, 12))
    capacity = [data.draw(st.sampled_from([48e9, 25e9, 12.5e9, np.inf])) for _ in range(n_links)]
    paths = [
        data.draw(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=3, unique=True))
        for _ in range(n_flows)
    ]
    inc_flow = [f for f, path in enumerate(paths) for _ in path]
    inc_link = [link for path in paths for link in path]
    levels = [11.97e9, 11.98e9, 3e9, 0.0]
    nudges = [1.0, 1 + 1e-13, 1 + 2e-12, 1 - 1e-13]
    cap = [
        data.draw(st.sampled_from(levels)) * data.draw(st.sampled_from(nudges))
        if data.draw(st.integers(0, 4)) else np.inf
        for _ in range(n_flows)
    ]  # fmt: skip
    weight = None
    if data.draw(st.booleans()):
        weight = [data.draw(st.sampled_from([1.0, 2.0, 1.9986716635195307, 0.5]))
                  for _ in inc_flow]  # fmt: skip
    same_as_numpy(inc_flow, inc_link, n_flows, capacity, weight, cap)


@pytest.mark.parametrize("weighted", [False, True])
def test_remaining_list_is_the_only_input_changed(weighted):
    """The caller's flows, links and weights are left as they were."""
    flows, links = [0, 1, 1], [0, 0, 1]
    weight = [1.0, 1.0, 2.0] if weighted else None
    kept = (list(flows), list(links), None if weight is None else list(weight))
    maxmin.small_rates_list(flows, links, 2, [4.0, 6.0], weight, [1.0, np.inf])
    assert (flows, links, weight) == kept
