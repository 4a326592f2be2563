"""Symmetric ranks simulated once (issue 15): the quotient path must give the per-flow
path's times and records, and must fall back where the symmetry breaks."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.algorithms import build_quotient, build_schedule
from simulator.algorithms.base import RankLayout
from simulator.collective import simulate_collective
from simulator.collective.run import (
    AsymmetricNetwork,
    Quotient,
    build_and_run,
    rank_layout,
    run_schedule,
)
from simulator.collective.symmetry import schedule_quotient
from simulator.network.maxmin import max_min_rates
from simulator.topology import load_topology, ring_graph


def both(graph, schedule, protocol=None):
    """The same schedule simulated flow by flow and with symmetry."""
    full = run_schedule(graph, schedule, protocol=protocol, symmetry="off")
    fast = run_schedule(graph, schedule, protocol=protocol)
    return full, fast


def assert_same(full, fast):
    assert fast.time_s == pytest.approx(full.time_s, rel=1e-9)
    for name in ("start_s", "sent_s", "end_s"):
        np.testing.assert_allclose(fast.flows[name], full.flows[name], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(fast.links["bytes"], full.links["bytes"], rtol=1e-9)
    np.testing.assert_allclose(fast.links["busy_s"], full.links["busy_s"], rtol=1e-9, atol=1e-15)
    # Bytes are conserved: every flow of the full run is accounted for.
    assert fast.stats.represented_flows == full.stats.flows


CASES = [
    # (graph, algorithm, op, options, protocol, expected period)
    ("ring16", "ring", "all_reduce", {"chunks": 4}, None, 1),
    ("ring16", "ring", "all_gather", {"chunks": 2}, None, 1),
    # Rings repeat every server (NCCL's: every server alike, PXN hops between them).
    ("h100x4", "ring", "all_reduce", {"chunks": 2, "channels": 4}, "Simple", 8),
    ("h100x4", "ring", "reduce_scatter", {"chunks": 2, "channels": 2}, "LL", 8),
    ("h100x4", "hierarchical", "all_reduce", {"chunks": 2, "channels": 2}, "LL128", 8),
    ("h100x4", "hierarchical", "all_gather", {"chunks": 2}, None, 8),
    ("h100x4", "hierarchical", "reduce_scatter", {"chunks": 1}, "Simple", 8),
    ("h100x4", "pipelined", "all_reduce", {"chunks": 3}, None, 8),
    ("a100x8", "hierarchical", "all_reduce", {"chunks": 2, "channels": 2}, "Simple", 8),
]


def graph_of(name):
    if name == "ring16":
        return ring_graph(16, 150e9, 500e-9)
    preset, nodes = {"h100x4": ("dgx-h100", 4), "a100x8": ("dgx-a100", 8)}[name]
    return load_topology(preset, nodes)


@pytest.mark.parametrize("name, algorithm, op, options, protocol, period", CASES)
def test_quotient_equals_every_flow(name, algorithm, op, options, protocol, period):
    graph = graph_of(name)
    schedule = build_schedule(algorithm, op, rank_layout(graph), 64e6, **options)
    full, fast = both(graph, schedule, protocol)
    assert_same(full, fast)
    # It really ran the quotient: one flow per orbit of len(ranks) / period.
    assert fast.stats.flows * len(schedule.src) == full.stats.flows * (
        len(schedule.src) // (schedule.ranks // period)
    )


def test_ring_256_ranks_one_rank_simulated():
    """A 256-rank ring on a 1-D ring: one rank's flows stand for all, same times; the
    time is the chunked ring's hand count on a contention-free ring: each chunk takes
    t = n/(pKB) on the wire; with a + t <= K t the next step's first chunk has arrived
    before a rank has sent its K chunks, so the channel never idles: 2(p-1) K t of
    sending, then the last hop's latency a."""
    p, K, n, a, B = 256, 4, 64e6, 500e-9, 150e9
    graph = ring_graph(p, B, a)
    schedule = build_schedule("ring", "all_reduce", RankLayout(p), n, chunks=K)
    full, fast = both(graph, schedule)
    assert_same(full, fast)
    assert fast.stats.flows == full.stats.flows // p
    t = n / (p * K * B)
    assert a + t <= K * t
    assert fast.time_s == pytest.approx(2 * (p - 1) * K * t + a, rel=1e-9)


def test_direct_ring_quotient_is_the_full_schedules_quotient():
    """Built without the full schedule, the ring's representatives are exactly those the
    generic reduction finds in the full one (ops, labels and dependencies)."""
    cases = [
        (RankLayout(12), 1, {"chunks": 3}),
        (RankLayout(12), 4, {"chunks": 2, "channels": 2}),
        (rank_layout(load_topology("dgx-h100", 4)), 16, {"chunks": 2, "channels": 4}),
    ]
    fields = ("src", "dst", "nbytes", "segment", "reduce", "dep_ptr", "dep_idx", "dep_sent")
    for layout, period, options in cases:
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            full = build_schedule("ring", op, layout, 1e6, **options)
            generic = schedule_quotient(full, period).schedule
            direct = build_quotient("ring", op, layout, 1e6, period, **options)
            for name in (*fields, "channel", "step", "chunk"):
                assert np.array_equal(getattr(generic, name), getattr(direct, name)), name


def test_direct_quotient_refused_where_the_rings_do_not_repeat():
    # Every server alike (NCCL's rings, PXN between servers): three servers repeat every
    # server, but not every half server; broadcast is a chain, not a ring.
    layout = rank_layout(load_topology("dgx-h100", 3))
    assert build_quotient("ring", "all_reduce", layout, 1e6, 8, channels=4) is not None
    assert build_quotient("ring", "all_reduce", layout, 1e6, 4, channels=4) is None
    assert build_quotient("ring", "broadcast", RankLayout(8), 1e6, 1) is None
    full = build_schedule("ring", "all_reduce", layout, 1e6, channels=4)
    assert schedule_quotient(full, 8) is not None
    assert schedule_quotient(full, 4) is None


def test_large_ring_runs_from_the_direct_quotient():
    """Above the size where schedules are built whole, the ring is built as its quotient
    and gives the same time as the full schedule."""
    graph = ring_graph(64, 100e9, 1e-6)
    kwargs = {"chunks": 2, "channels": 1}
    reference = run_schedule(
        graph, build_schedule("ring", "all_reduce", RankLayout(64), 8e6, **kwargs), symmetry="off"
    )
    reps = build_quotient("ring", "all_reduce", RankLayout(64), 8e6, 1, **kwargs)
    direct = run_schedule(graph, Quotient(reps, 64, 1))
    assert direct.time_s == pytest.approx(reference.time_s, rel=1e-9)
    # Expanded records: every op of the full schedule, with its rank and times.
    order = np.lexsort((direct.flows["step"], direct.flows["chunk"], direct.flows["src"]))
    ref = np.lexsort((reference.flows["step"], reference.flows["chunk"], reference.flows["src"]))
    np.testing.assert_allclose(direct.flows["end_s"][order], reference.flows["end_s"][ref])
    assert np.array_equal(direct.flows["dst"][order], reference.flows["dst"][ref])
    # build_and_run takes the same path (or the full one) with the same answer.
    assert build_and_run(graph, "ring", "all_reduce", 8e6, **kwargs).time_s == pytest.approx(
        reference.time_s, rel=1e-9
    )


@pytest.mark.parametrize(
    "how",
    ["slow link", "reduce bandwidth", "ecmp"],
)
def test_broken_symmetry_falls_back_with_the_same_result(how):
    """Where one part differs the quotient is refused (detected on the routes, the
    capacities or the ranks) and every flow is simulated."""
    options = {"chunks": 2, "channels": 4}
    if how == "slow link":
        graph = load_topology("dgx-h100", 4)
        graph.edges["s2/nic3", "leaf3"]["bandwidth"] /= 2  # one NIC's port trained down
    elif how == "reduce bandwidth":
        graph = load_topology("dgx-h100", 4)
        graph.nodes["s1/gpu5"]["reduce_bandwidth"] = 100e9
    else:
        graph = load_topology("dgx-h100", 4, fabric="leaf-spine")
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 64e6, **options)
    full, fast = both(graph, schedule, "Simple")
    assert_same(full, fast)
    if how != "ecmp":  # ECMP may still hash symmetrically; the others cannot be symmetric
        assert fast.stats.flows == full.stats.flows
    reps = build_quotient("ring", "all_reduce", rank_layout(graph), 64e6, 16, **options)
    if reps is not None and fast.stats.flows == full.stats.flows:
        with pytest.raises(AsymmetricNetwork):
            run_schedule(graph, Quotient(reps, schedule.ranks, 16), protocol="Simple")


def test_symmetry_off_and_bad_mode():
    graph = ring_graph(8, 1e9, 1e-6)
    schedule = build_schedule("ring", "all_gather", RankLayout(8), 8e6)
    assert run_schedule(graph, schedule, symmetry="off").stats.flows == schedule.n_ops
    with pytest.raises(Exception, match="symmetry mode"):
        run_schedule(graph, schedule, symmetry="sometimes")


def test_weighted_max_min_equals_expanded_flows():
    """One flow standing for k copies spread over a class of c links loads each link
    k/c: the same rates as the k copies on the full network."""
    rng = np.random.default_rng(5)
    # Full network: 4 symmetric links (a class), 8 copies of flow A (2 per link) and one
    # flow B per link; plus a private link of A's copies with capacity 3 each.
    cap = rng.uniform(5, 10)
    inc_flow, inc_link = [], []
    for copy in range(8):
        inc_flow += [copy, copy]
        inc_link += [copy // 2, 4 + copy]
    for b in range(4):
        inc_flow.append(8 + b)
        inc_link.append(b)
    capacity = np.array([cap] * 4 + [3.0] * 8)
    full = max_min_rates(np.array(inc_flow), np.array(inc_link), 12, capacity)
    # Quotient: A (weight 8) on class 0 (4 links) and class 1 (8 links); B (weight 4).
    rates = max_min_rates(
        np.array([0, 0, 1]),
        np.array([0, 1, 0]),
        2,
        np.array([cap, 3.0]),
        np.array([8 / 4, 8 / 8, 4 / 4]),
    )
    np.testing.assert_allclose(rates, [full[0], full[8]], rtol=1e-12)
    assert np.allclose(full[:8], full[0]) and np.allclose(full[8:], full[8])


def test_simulate_collective_hierarchical_same_as_per_flow():
    """simulate_collective's default path (symmetry found) gives the per-flow time."""
    graph = load_topology("dgx-a100", 4)
    result = simulate_collective(graph, "all_reduce", 64e6, "hierarchical")
    schedule = build_schedule("hierarchical", "all_reduce", rank_layout(graph), 64e6)
    full = run_schedule(graph, schedule, symmetry="off")
    assert result.time_s == pytest.approx(full.time_s, rel=1e-9)


@pytest.mark.parametrize(
    "nodes, period, options",
    [
        (2, 8, {}),
        (4, 8, {"chunks": 2}),
        (4, 16, {"chunks": 2, "channels": 2}),
        (6, 16, {"chunks": 3}),
    ],
)
def test_direct_hierarchical_quotient_is_the_full_schedules_quotient(nodes, period, options):
    """The hierarchical all-reduce's representatives built from closed-form indices equal,
    array by array, the generic reduction of the schedule built whole."""
    layout = rank_layout(load_topology("dgx-a100", nodes))
    full = build_schedule("hierarchical", "all_reduce", layout, 1e6, **options)
    generic = schedule_quotient(full, period).schedule
    direct = build_quotient("hierarchical", "all_reduce", layout, 1e6, period, **options)
    fields = ("src", "dst", "nbytes", "segment", "reduce", "dep_ptr", "dep_idx", "dep_sent")
    for name in (*fields, "channel", "step", "chunk", "segment_owner"):
        assert np.array_equal(getattr(generic, name), getattr(direct, name)), name
    # Not built directly: other operations, pipelined slices, a mesh inside servers.
    assert build_quotient("hierarchical", "all_gather", layout, 1e6, period) is None
    assert build_quotient("pipelined", "all_reduce", layout, 1e6, period, chunks=2) is None
    assert build_quotient("hierarchical", "all_reduce", layout, 1e6, period, intra="mesh") is None


def test_representative_records_past_the_expansion_limit(monkeypatch):
    """Past EXPAND_FLOWS the result keeps the representatives' records (ranks of one
    period), says so, and the timeline carries the note; the time is the full run's."""
    import simulator.collective.run as run_module
    from simulator.viz.collective import collective_timeline

    monkeypatch.setattr(run_module, "DIRECT_QUOTIENT_OPS", 0)
    monkeypatch.setattr(run_module, "EXPAND_FLOWS", 0)
    graph = load_topology("dgx-h100", 4)
    result = build_and_run(graph, "hierarchical", "all_reduce", 64e6, chunks=2)
    full = run_schedule(
        graph,
        build_schedule("hierarchical", "all_reduce", rank_layout(graph), 64e6, chunks=2),
        symmetry="off",
    )
    assert result.time_s == pytest.approx(full.time_s, rel=1e-9)
    assert result.params["flows"] == "representatives"
    assert result.params["symmetry_period"] == 8
    assert result.flows["src"].max() < 8
    assert len(result.flows["src"]) * 4 == full.stats.flows
    timeline = collective_timeline(result, graph)
    assert "rank r does what rank r mod 8 does" in timeline.meta["symmetry"]


def test_flow_guard_counts_the_simulated_ranks():
    """The --max-flows guard sizes a hierarchical all-reduce on 2048 servers by the one
    server it simulates: 1/2048 of the transfers (the ring repeats every 2 servers)."""
    from simulator.collective.guards import check_collective, cluster_of, symmetric_orbit

    estimate = check_collective("dgx-h100", "all_reduce", [2**30], ["hierarchical"], nodes=2048)
    assert "1 in 2048" in estimate.what
    assert symmetric_orbit("ring", "all_reduce", cluster_of("dgx-h100", 2048)) == 1024
    assert symmetric_orbit("ring", "all_reduce", cluster_of("dgx-h100", 3)) == 1
    assert symmetric_orbit("tree", "all_reduce", cluster_of("dgx-h100", 64)) == 1


@pytest.mark.parametrize("directed", [False, True])
def test_a_server_permutation_is_refused_where_one_link_differs(directed):
    """Swapping servers 0 and 2 of four H100s maps the graph onto itself; with one
    NIC link of server 2 at half its bandwidth, or its latency changed, it does not
    (either end of the link, either direction); a key the map ignores (a label) does
    not matter."""
    from simulator.topology.symmetry import server_permutation

    def graph(**change):
        g = load_topology("dgx-h100", 4)
        g.edges["s2/nic3", "leaf3"].update(change)
        return g.to_directed() if directed else g

    swap = [2, 1, 0, 3]
    assert server_permutation(graph(), swap) is not None
    assert server_permutation(graph(label="x"), swap) is not None
    assert server_permutation(graph(bandwidth=25e9), swap) is None
    assert server_permutation(graph(latency=9e-6), swap) is None
    assert server_permutation(graph(bandwidth=25e9), [0, 1, 2, 3]) is not None
