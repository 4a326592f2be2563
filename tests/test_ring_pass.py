"""A ring timed step by step without its schedule (simulator.collective.ring_pass): held
to the event-by-event replay of every flow (op times, per-link bytes and busy time) on
asymmetric rings of a few hundred ranks, to the ring's closed form, and shown to hand
over to the full schedule where its flows could meet."""

import numpy as np
import pytest

from simulator.algorithms import build_schedule
from simulator.collective import run as run_module
from simulator.collective.run import rank_layout, run_ring, run_schedule
from simulator.network.faults import apply_faults
from simulator.topology import load_topology, ring_graph
from tests.test_routing import ecmp


def _reference(graph, op, size, chunks=1, channels=1, reduce_bandwidth=None):
    """Every flow of the ring's schedule replayed event by event (the reference)."""
    schedule = build_schedule(
        "ring", op, rank_layout(graph), size, chunks=chunks, channels=channels
    )
    return run_schedule(
        graph, schedule, reduce_bandwidth=reduce_bandwidth, symmetry="off", events=True
    )


def _assert_same(result, reference):
    """Every op's times, each link's bytes and busy time, and the flows, to 1e-9."""
    assert result.time_s == pytest.approx(reference.time_s, rel=1e-9)
    for key in ("start_s", "sent_s", "end_s"):
        np.testing.assert_allclose(result.flows[key], reference.flows[key], rtol=1e-9, atol=1e-18)
    for key in ("src", "dst", "step", "chunk", "channel"):
        assert np.array_equal(result.flows[key], reference.flows[key])
    assert list(result.links["src"]) == list(reference.links["src"])
    assert list(result.links["dst"]) == list(reference.links["dst"])
    for key in ("bytes", "busy_s"):
        np.testing.assert_allclose(result.links[key], reference.links[key], rtol=1e-9, atol=1e-18)
    assert result.stats.flows == reference.stats.flows


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_ring_steps_equal_the_event_replay_with_one_slow_link(op):
    """256 ranks on a 1-D ring, one link at half speed, 2 chunks: the slow hop holds up
    every block behind it, so ranks finish at different times."""
    graph = apply_faults(ring_graph(256, 150e9, 500e-9), "link=gpu5-gpu6:0.5")
    result = run_ring(graph, op, 4 * 2**20, chunks=2)
    assert result.params["timing"] == "ring steps"
    _assert_same(result, _reference(graph, op, 4 * 2**20, chunks=2))


def test_ring_steps_equal_the_event_replay_on_random_slow_links_with_reducers():
    """A 192-rank ring whose links are each slowed with probability 0.2 (seeded) and
    whose GPUs reduce at 1e12 B/s (faster than any link, so reductions of one hop never
    overlap): the reductions are flows on the receivers' reducer links."""
    graph = apply_faults(ring_graph(192, 150e9, 500e-9), "random:q=0.2,fraction=0.3,seed=3")
    result = run_ring(graph, "all_reduce", 2**21, chunks=3, reduce_bandwidth=1e12)
    assert result.params["timing"] == "ring steps"
    reference = _reference(graph, "all_reduce", 2**21, chunks=3, reduce_bandwidth=1e12)
    _assert_same(result, reference)
    # A reduction flow per reduce-scatter op besides the transfers.
    assert result.stats.flows == 2 * 191 * 192 * 3 + 191 * 192 * 3


def test_ring_steps_follow_servers_nics_and_pxn_hops():
    """4 DGX H100 (32 ranks) with one NIC link at half speed: the hop between servers
    is sent as PXN (NVLink to the receiver's rail, then its NIC)."""
    graph = apply_faults(load_topology("dgx-h100", 4), "link=s1/nic0-leaf0:0.5")
    result = run_ring(graph, "all_reduce", 2**22, chunks=2)
    assert result.params["timing"] == "ring steps"
    _assert_same(result, _reference(graph, "all_reduce", 2**22, chunks=2))


def test_ring_steps_on_a_fat_tree_with_ecmp():
    """8 DGX H100 (64 ranks) on a fat-tree with ECMP and one slow uplink: the hops
    between servers are hashed onto the uplinks, one channel's each on its own rail,
    so no two hops share a link and the steps are timed alone."""
    graph = apply_faults(
        ecmp(load_topology("dgx-h100", 8, fabric="fat-tree")), "link=pod0/edge0-pod0/agg2:0.5"
    )
    result = run_ring(graph, "all_reduce", 2**22, chunks=2)
    assert result.params["timing"] == "ring steps"
    ends = list(zip(result.links["src"], result.links["dst"], strict=True))
    assert result.links["bytes"][ends.index(("pod0/edge0", "pod0/agg2"))] > 0  # hashed on
    _assert_same(result, _reference(graph, "all_reduce", 2**22, chunks=2))


def test_ring_steps_follow_a_failed_links_detour():
    """gpu10 -> gpu11 is down: that hop goes the other way round the ring, over the
    backward links, which no other hop uses (each is one hop's alone), so the steps are
    still timed alone, with the reference's results."""
    graph = apply_faults(ring_graph(96, 150e9, 500e-9), "fail=gpu10-gpu11")
    result = run_ring(graph, "all_reduce", 2**20, chunks=2)
    assert result.params["timing"] == "ring steps"
    _assert_same(result, _reference(graph, "all_reduce", 2**20, chunks=2))


@pytest.mark.parametrize(
    "fault, channels, reduce_bandwidth",
    [
        (None, 4, None),  # four channels on one ring of links share them
        (None, 1, 5e9),  # reductions slower than the links pile up on the reducers
    ],
)
def test_ring_whose_flows_could_meet_runs_its_schedule(fault, channels, reduce_bandwidth):
    """Where two flows could share a link (channels on the same links, a slow
    reducer), the steps are not timed alone: the schedule is built
    and run, with the reference's results."""
    graph = ring_graph(64, 150e9, 500e-9)
    if fault:
        graph = apply_faults(graph, fault)
    result = run_ring(graph, "all_reduce", 2**20, chunks=2, channels=channels,
                      reduce_bandwidth=reduce_bandwidth)  # fmt: skip
    assert result.params.get("timing") != "ring steps"
    reference = _reference(graph, "all_reduce", 2**20, 2, channels, reduce_bandwidth)
    _assert_same(result, reference)


@pytest.mark.parametrize("latency", [500e-9, 10e-9])
def test_uniform_ring_meets_its_closed_form(latency):
    """Alike links of bandwidth B and latency a, K chunks of c bytes (t = c / B): chunk
    k of step s is sent at S(s, k) = max(S(s - 1, k) + a, S(s, k - 1)) + t, so the ring
    ends at steps (a + t) + (K - 1) t when a > (K - 1) t (each step waits for its
    block), and at steps K t + a otherwise (the chunks stream); every link carries
    steps K c bytes, busy steps K t."""
    p, K, size, bandwidth = 64, 4, 2**22, 150e9
    graph = ring_graph(p, bandwidth, latency)
    result = run_ring(graph, "all_reduce", size, chunks=K)
    steps, chunk = 2 * (p - 1), size / (p * K)
    t = chunk / bandwidth
    expected = (
        steps * (latency + t) + (K - 1) * t if latency > (K - 1) * t else steps * K * t + latency
    )
    assert result.time_s == pytest.approx(expected, rel=1e-12)
    ends = zip(result.links["src"], result.links["dst"], strict=True)
    forward = {(f"gpu{r}", f"gpu{(r + 1) % p}") for r in range(p)}
    gpu_links = np.array([pair in forward for pair in ends])
    assert gpu_links.sum() == p
    assert np.allclose(np.asarray(result.links["bytes"])[gpu_links], steps * K * chunk, rtol=1e-12)
    assert np.allclose(np.asarray(result.links["busy_s"])[gpu_links], steps * K * t, rtol=1e-9)


def test_large_ring_lists_each_rank_not_each_op(monkeypatch):
    """Past EXPAND_FLOWS ops the result lists each rank's first start and last done,
    which are those of the reference's ops that rank sends or receives; the links'
    records are in full."""
    monkeypatch.setattr(run_module, "EXPAND_FLOWS", 1000)
    graph = apply_faults(ring_graph(128, 150e9, 500e-9), "link=gpu40-gpu41:0.3")
    result = run_ring(graph, "all_reduce", 2**21, chunks=2)
    reference = _reference(graph, "all_reduce", 2**21, chunks=2)
    assert result.params["flows"] == "ranks"
    assert set(result.flows) == {"rank", "start_s", "end_s"}
    p = 128
    end, start = np.full(p, -np.inf), np.full(p, np.inf)
    for ranks in (reference.flows["src"], reference.flows["dst"]):
        np.maximum.at(end, ranks, reference.flows["end_s"])
        np.minimum.at(start, ranks, reference.flows["start_s"])
    np.testing.assert_allclose(result.flows["end_s"], end, rtol=1e-9, atol=1e-18)
    np.testing.assert_allclose(result.flows["start_s"], start, rtol=1e-9, atol=1e-18)
    for key in ("bytes", "busy_s"):
        np.testing.assert_allclose(result.links[key], reference.links[key], rtol=1e-9, atol=1e-18)
    assert result.time_s == pytest.approx(reference.time_s, rel=1e-9)
    assert result.stats.flows == reference.stats.flows == 2 * 127 * 128 * 2


def test_a_large_ring_on_an_asymmetric_cluster_is_timed_by_steps(monkeypatch):
    """What users run (simulate_collective, build_and_run): a ring too large for per-op
    records on a cluster with a slow link is timed by the ring pass, with the same
    time, link bytes and busy time as the event-by-event replay of every flow. (The
    threshold is lowered so that a 128-rank ring is "large".)"""
    from simulator.collective import simulate_collective

    monkeypatch.setattr(run_module, "EXPAND_FLOWS", 1000)
    graph = apply_faults(ring_graph(128, 150e9, 500e-9), "link=gpu7-gpu8:0.5")
    result = simulate_collective(graph, "all_reduce", 2**20, "ring", chunks=2)
    assert result.params["timing"] == "ring steps"
    assert result.params["flows"] == "ranks"
    reference = _reference(graph, "all_reduce", 2**20, chunks=2)
    assert result.time_s == pytest.approx(reference.time_s, rel=1e-9)
    for key in ("bytes", "busy_s"):
        np.testing.assert_allclose(result.links[key], reference.links[key], rtol=1e-9, atol=1e-18)
    # Each rank's last op ends when the reference's last op of that rank does.
    ends = np.zeros(128)
    np.maximum.at(ends, reference.flows["src"], reference.flows["end_s"])
    np.maximum.at(ends, reference.flows["dst"], reference.flows["end_s"])
    np.testing.assert_allclose(result.flows["end_s"], ends, rtol=1e-9)
