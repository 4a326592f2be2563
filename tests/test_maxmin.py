"""Max-min fairness by progressive filling, against hand-computed allocations and the
defining property (every flow has a saturated link on which it has the largest rate)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.network.maxmin import max_min_rates


def rates(paths, capacity):
    flows = [f for f, path in enumerate(paths) for _ in path]
    links = [link for path in paths for link in path]
    return max_min_rates(
        np.array(flows, dtype=int),
        np.array(links, dtype=int),
        len(paths),
        np.array(capacity, dtype=float),
    )


def test_two_flows_on_one_link_get_half_each():
    assert rates([[0], [0]], [10.0]).tolist() == [5.0, 5.0]


def test_progressive_filling_with_an_upstream_bottleneck():
    """Flow 0 crosses link 0 (capacity 2) then link 1 (capacity 10); flows 1 and 2 cross
    link 1 only. Equal split would give 10/3 each on link 1; progressive filling freezes
    flow 0 at 2 (link 0 full), then flows 1 and 2 share the remaining 8: 4 each."""
    assert rates([[0, 1], [1], [1]], [2.0, 10.0]).tolist() == [2.0, 4.0, 4.0]


def test_three_levels():
    """Link capacities 3, 7, 20. Flows: a on {0,2}, b on {0,1}, c on {1,2}, d on {2}.
    Level 1: link 0 share 1.5, link 1 share 3.5, link 2 share 20/3 -> a, b = 1.5.
    Level 2: link 1 has 7 - 1.5 = 5.5 for c alone; link 2 has 20 - 1.5 = 18.5 for c, d
    (9.25 each) -> c = 5.5. Level 3: d gets 18.5 - 5.5 = 13."""
    assert rates([[0, 2], [0, 1], [1, 2], [2]], [3.0, 7.0, 20.0]).tolist() == [1.5, 1.5, 5.5, 13.0]


def test_flow_without_links_is_unbounded():
    result = max_min_rates(np.array([0]), np.array([0]), 2, np.array([4.0]))
    assert result[0] == 4.0 and np.isinf(result[1])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_max_min_property(data):
    n_links = data.draw(st.integers(1, 6))
    capacity = data.draw(st.lists(st.integers(1, 100), min_size=n_links, max_size=n_links))
    paths = data.draw(
        st.lists(
            st.lists(st.integers(0, n_links - 1), min_size=1, max_size=n_links, unique=True),
            min_size=1,
            max_size=8,
        )
    )
    rate = rates(paths, capacity)
    load = np.zeros(n_links)
    for f, path in enumerate(paths):
        load[path] += rate[f]
    # Feasible: no link carries more than its capacity.
    assert np.all(load <= np.array(capacity) * (1 + 1e-9))
    # Max-min: every flow crosses a saturated link where no other flow gets more.
    for f, path in enumerate(paths):
        assert any(
            load[link] >= capacity[link] * (1 - 1e-9)
            and all(
                rate[g] <= rate[f] * (1 + 1e-9) for g, other in enumerate(paths) if link in other
            )
            for link in path
        ), (paths, capacity, rate)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_equal_flows_on_a_shared_link(n):
    assert np.allclose(rates([[0]] * n, [12.0]), 12.0 / n)
