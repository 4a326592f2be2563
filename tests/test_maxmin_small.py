"""The plain-Python path of max-min filling for small incidences gives the numpy path's
rates bit for bit (the same doubles summed in the same order), with weights and caps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.network import maxmin
from simulator.network.maxmin import _small_rates, max_min_rates


def numpy_rates(*args):
    """The numpy path alone (the small path switched off)."""
    before = maxmin.SMALL_ENTRIES
    maxmin.SMALL_ENTRIES = -1
    try:
        return max_min_rates(*args)
    finally:
        maxmin.SMALL_ENTRIES = before


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_small_path_equals_numpy_path_bit_for_bit(data):
    n_links = data.draw(st.integers(1, 6))
    n_flows = data.draw(st.integers(1, 8))
    real = st.floats(0.1, 1e11, allow_nan=False, allow_infinity=False)
    real_or_inf = st.one_of(real, st.just(np.inf))
    capacity = np.array(data.draw(st.lists(real_or_inf, min_size=n_links, max_size=n_links)))
    paths = data.draw(
        st.lists(
            st.lists(st.integers(0, n_links - 1), max_size=n_links, unique=True),
            min_size=n_flows,
            max_size=n_flows,
        )
    )
    inc_flow = np.array([f for f, path in enumerate(paths) for _ in path], dtype=np.int64)
    inc_link = np.array([link for path in paths for link in path], dtype=np.int64)
    weight = None
    if data.draw(st.booleans()):
        weight = np.array(data.draw(st.lists(real, min_size=len(inc_flow), max_size=len(inc_flow))))
    cap = None
    if data.draw(st.booleans()):
        cap = np.array(data.draw(st.lists(real_or_inf, min_size=n_flows, max_size=n_flows)))
    args = (inc_flow, inc_link, n_flows, capacity, weight, cap)
    small = _small_rates(*args)
    assert small is not None
    assert small.tobytes() == numpy_rates(*args).tobytes()
    # And max_min_rates takes the small path here.
    assert max_min_rates(*args).tobytes() == small.tobytes()


def test_equal_shares_within_the_tie_freeze_together():
    """Two links whose shares differ by less than the tie (1e-12 relative) bottleneck in
    the same round on both paths: 3 flows on 30 and 1 flow on 10 + 1e-11."""
    args = (np.array([0, 1, 2, 3]), np.array([0, 0, 0, 1]), 4, np.array([30.0, 10.0 + 1e-11]))
    small = _small_rates(*args, None, None)
    assert small.tolist() == [10.0, 10.0, 10.0, 10.0]
    assert small.tobytes() == numpy_rates(*args).tobytes()


def test_nan_capacity_falls_back_to_numpy():
    assert _small_rates(np.array([0]), np.array([0]), 1, np.array([np.nan]), None, None) is None


@pytest.mark.parametrize("weighted", [False, True])
def test_capped_flow_leaves_the_rest(weighted):
    """Cap 1 on flow 0 of a 10-wide link: flow 1 takes the other 9 (hand-computed)."""
    weight = np.ones(2) if weighted else None
    rates = _small_rates(np.array([0, 1]), np.array([0, 0]), 2, np.array([10.0]), weight,
                         np.array([1.0, np.inf]))  # fmt: skip
    assert rates.tolist() == [1.0, 9.0]
