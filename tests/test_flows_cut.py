"""Finished flows' incidence entries cut out around them, and a small component's slots
read off its entries (``FlowNetwork.cut_entries``), give the masked copies' and the pass
over the pool's results bit for bit: every flow's send and delivery time and every link
record, on random flows (weights, caps, link classes, timed capacity changes, held links;
two fabrics, three seeds; the scalar and the array event paths), on collectives under
timed faults and on the jobs cases of tests/test_flows_shortcuts.py (those two in
tests/test_flows_scalar.py, beside the scalar events' own). Both ways keep the
entries that stay in their order, the order max-min sums each link's loads in."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_flows_scalar import FABRICS, random_run

from simulator.network import flows
from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology


@pytest.mark.parametrize("kind", ["plain", "weights", "caps", "classes", "faults", "holds"])
@pytest.mark.parametrize("fabric", sorted(FABRICS))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scalar", [True, False])
def test_cut_entries_equal_the_masked_copies(kind, fabric, seed, scalar, monkeypatch):
    results = {}
    for cut in (True, False):
        monkeypatch.setattr(FlowNetwork, "cut_entries", cut)
        results[cut] = random_run(scalar, fabric, seed, kind)
    assert results[True] == results[False]
    sent = sorted(op for log in results[True][0] for op, _ in log)
    assert sent == list(range(results[True][-1]))  # every flow sent, once


def test_drop_entries_keeps_the_rest_in_order(monkeypatch):
    """Cutting entries at given positions leaves the others in their order, with their
    coefficients, as a boolean mask would: checked on many random cuts, up to more entries
    than the cut path takes (where the mask path does it)."""
    network = FlowNetwork(simpy.Environment(), load_topology("dgx-h100", 1))
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(0, 60))
        flow, link, coef = rng.integers(0, 99, n), rng.integers(0, 99, n), rng.random(n)
        gone = np.flatnonzero(rng.random(n) < rng.choice([0.02, 0.1, 0.5]))
        network._inc_flow, network._inc_link, network._inc_coef = flow, link, coef
        network._drop_entries(gone)
        kept = np.ones(n, dtype=bool)
        kept[gone] = False
        assert network._inc_flow.tolist() == flow[kept].tolist()
        assert network._inc_link.tolist() == link[kept].tolist()
        assert network._inc_coef.tobytes() == coef[kept].tobytes()
    assert flows._FEW_GONE < 30  # the random cuts above took both paths


def link_loads_run(cut: bool, seed: int, classes: bool) -> tuple:
    """Waves of one-link flows (:meth:`FlowNetwork.add_link_loads`, as bundles carry a
    call's traffic), with routed flows now and then, on 4 dgx-h100 servers over a 2:1
    leaf-spine: the component of a few links is then often their one-link flows alone.
    Returns the send times, the link records and how often that shortcut was taken."""
    graph = load_topology("dgx-h100", 4, fabric=FABRICS["leaf-spine"])
    env = simpy.Environment()
    network = FlowNetwork(env, graph, flow_seconds=True)
    network.cut_entries = cut
    n_links = len(network.links)
    if classes:
        network.set_link_classes(np.arange(n_links), np.where(np.arange(n_links) % 3, 1, 2))
    rng = np.random.default_rng(seed)
    logs = [Log(env), Log(env)]
    owners = [network.register(log) for log in logs]
    taken = [0]
    found = FlowNetwork._one_link_flows_on

    def counted(self, seeds):
        entries = found(self, seeds)
        taken[0] += entries is not None
        return entries

    def source():
        for index in range(80):
            # A few links drawn from a small pool, so that loads meet on them.
            count = int(rng.integers(1, 4)) if index % 20 != 9 else 30
            links = rng.choice(40, count, replace=False)
            nbytes = rng.uniform(1e5, 3e7, count)
            cap = np.where(rng.random(count) < 0.5, rng.uniform(1e9, 3e10, count), np.inf)
            copies = rng.choice([1.0, 2.0], count)
            network.add_link_loads(owners[index % 2], links, nbytes, cap, count, copies)
            if index % 7 == 3:
                src = rng.integers(0, 32, 3)
                routes = network.route_ids(src, (src + 1 + rng.integers(0, 31, 3)) % 32)
                network.add_flows(owners[0], np.arange(3) + 1000 * index, routes, np.full(3, 4e6))
            yield env.timeout(float(rng.choice([0.0, 1e-6, 3e-5, 2e-4])))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FlowNetwork, "_one_link_flows_on", counted)
        env.process(source())
        env.run()
    network.close_link_records()
    return (
        [log.sent for log in logs],
        network.link_bytes.tobytes(),
        network.link_busy.tobytes(),
        network.link_idle_at.tobytes(),
        network.link_flow_s.tobytes(),
        network.stats,
    ), taken[0]


class Log:
    """An owner that notes when each of its ops is sent."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.sent: list[tuple[int, float]] = []

    def on_sent(self, ops: np.ndarray) -> None:
        self.sent += [(op, self.env.now) for op in ops.tolist()]

    def on_delivered(self, ops: np.ndarray) -> None:
        pass


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("classes", [False, True])
def test_one_link_components_equal_the_search(seed, classes):
    cut, taken = link_loads_run(True, seed, classes)
    plain, never = link_loads_run(False, seed, classes)
    assert cut == plain
    assert taken > 20 and never == 0  # the shortcut was taken (only) where asked for


def test_all_equal_is_numpys_min_equals_max():
    """The few-values test of one owner / one latency says what ``min() == max()`` says,
    NaN included, for short arrays (Python) and long ones (numpy)."""
    rng = np.random.default_rng(7)
    for _ in range(2000):
        n = int(rng.integers(1, 40))
        values = rng.choice([1.0, 2.0, np.nan, np.inf], n, p=[0.7, 0.1, 0.1, 0.1])
        if rng.random() < 0.5:
            values[:] = values[0]
        assert flows._all_equal(values) == (values.min() == values.max())
        ints = np.where(np.isfinite(values), values, 3.0).astype(np.int64)  # owners' ids
        assert flows._all_equal(ints) == (ints.min() == ints.max())
