"""Finished flows' incidence entries cut out around them, and a small component's slots
read off its entries (``FlowNetwork.cut_entries``), give the masked copies' and the pass
over the pool's results bit for bit: every flow's send and delivery time and every link
record, on random flows (weights, caps, link classes, timed capacity changes, held links;
two fabrics, three seeds; the scalar and the array event paths), on collectives under
timed faults and on the jobs cases of tests/test_flows_shortcuts.py. Both ways keep the
entries that stay in their order, the order max-min sums each link's loads in."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_flows_scalar import FABRICS, random_run
from test_flows_shortcuts import CASES, records, run

from simulator.collective.simulate import simulate_collective
from simulator.network import flows
from simulator.network.faults import apply_faults
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


def test_cut_entries_under_timed_faults(monkeypatch):
    """A ring and a hierarchical all-reduce on a leaf-spine whose links slow down and
    recover mid-collective: the same end time and link records either way."""
    graph = load_topology("dgx-h100", 4, fabric=FABRICS["leaf-spine"])
    faulted = apply_faults(
        graph, ["link=leaf0-spine0:0.5,t0=20us,t1=300us", "node=s1/nic0:0.25,t0=50us"]
    )
    results = {}
    for cut in (True, False):
        monkeypatch.setattr(FlowNetwork, "cut_entries", cut)
        results[cut] = [
            simulate_collective(faulted, "all_reduce", 64e6, algorithm, chunks=4)
            for algorithm in ("ring", "hierarchical")
        ]
    for fast, plain in zip(results[True], results[False], strict=True):
        assert fast.time_s == plain.time_s
        assert fast.links == plain.links


@pytest.mark.parametrize("case", sorted(CASES))
def test_cut_entries_change_no_job_record(case, monkeypatch):
    fast = run(case)
    monkeypatch.setattr(FlowNetwork, "cut_entries", False)
    plain = run(case)
    assert records(fast) == records(plain)
    assert [job.step_together_s for job in fast.jobs] == [job.step_together_s for job in plain.jobs]
