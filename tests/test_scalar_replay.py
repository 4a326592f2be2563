"""A schedule replayed in Python scalars (simulator.collective.scalar_replay): held to the
reference replay (ScheduleReplay on a FlowNetwork, every flow an event) bit for bit,
every op's start, sent and done time and every link's bytes, busy time, last idle
instant and flow-seconds, on NCCL-like rings whose channels share NICs and NVLink ports
under each protocol (the proxies stagger them, so flows meet and change each other's
rates), with slow links, odd channel counts and a quotient on link classes; and shown
to hand over to the reference outside its scope."""

import numpy as np
import pytest
import simpy

from simulator.algorithms import build_schedule
from simulator.collective import scalar_replay as sr
from simulator.collective.replay import ScheduleReplay
from simulator.collective.run import find_symmetry, rank_layout
from simulator.collective.scalar_replay import replay_scalar
from simulator.library.protocol import calibration_of
from simulator.network.faults import apply_faults
from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology
from simulator.topology.graph import gpu_nodes


def _network(graph, protocol):
    """A fresh network as a scratch for calls timed alone is (flow-seconds kept), with
    the calibrated efficiencies when a protocol runs."""
    efficiency = None if protocol is None else calibration_of(graph).efficiency
    return FlowNetwork(simpy.Environment(), graph, link_efficiency=efficiency, flow_seconds=True)


def _compare(graph, schedule, protocol, reduce_bandwidth=None, symmetric=False):
    """Run the reference and the scalar replay of ``schedule`` on fresh networks and
    assert that every time and record is the same double; returns the scalar times."""
    proto = None if protocol is None else calibration_of(graph).protocol(protocol)
    ranks = len(gpu_nodes(graph))
    bandwidth = np.full(ranks, np.inf) if reduce_bandwidth is None else reduce_bandwidth
    reference, network = _network(graph, proto), _network(graph, proto)
    options, scalar_options = {}, {}
    if symmetric:
        quotient, classes = find_symmetry(reference, schedule, bandwidth)
        reference.set_link_classes(classes.link_class, classes.class_size)
        weights = quotient.weights(np.arange(quotient.schedule.n_ops))
        assert (weights == weights[0]).all()
        schedule = quotient.schedule
        options = {"weight": weights, "period": quotient.period}
        scalar_options = {
            "weight": float(weights[0]),
            "period": quotient.period,
            "link_class": classes.link_class,
            "class_size": classes.class_size,
        }
    replay = ScheduleReplay(
        reference, schedule, reduce_bandwidth=bandwidth, protocol=proto, **options
    )
    replay.start()
    reference.env.run()
    assert replay.finished.triggered
    reference.close_link_records()
    times = replay_scalar(
        network, schedule, reduce_bandwidth=bandwidth, protocol=proto, **scalar_options
    )
    assert times is not None
    records = times.records(np.arange(len(reference.links)))
    for ours, theirs in (
        (times.start_s, replay.start_s),
        (times.sent_s, replay.sent_s),
        (times.end_s, replay.end_s),
        (records[0], reference.link_bytes),
        (records[1], reference.link_busy),
        (records[2], reference.link_idle_at),
        (records[3], reference.link_flow_s),
    ):
        np.testing.assert_array_equal(ours, theirs)
    assert times.flows == reference.stats.flows
    assert times.represented == reference.stats.represented_flows
    # The scalar replay leaves the network it reads untouched.
    assert network.stats.flows == 0 and not network.link_bytes.any()
    return times


@pytest.mark.parametrize(
    ("preset", "servers", "size", "channels", "chunks"),
    [
        ("dgx-h100", 2, 64e3, 2, 1),  # LL's range: small blocks, latency-bound
        ("dgx-h100", 3, 6e6, 3, 1),  # odd channel count, three servers
        ("dgx-a100", 2, 1e6, 5, 1),
        ("hgx-b200", 2, 3e7, 4, 2),  # Simple's range: several proxy messages a chunk
    ],
)
@pytest.mark.parametrize("protocol", ["LL", "LL128", "Simple", None])
def test_rings_equal_the_reference_bit_for_bit(preset, servers, size, channels, chunks, protocol):
    """NCCL-like rings over servers (PXN hops through the NICs): every channel's hop
    between servers shares its GPU's NVLink port with another channel's hop inside the
    server, and their sends wait for one proxy, so flows meet at staggered instants."""
    graph = load_topology(preset, servers)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        schedule = build_schedule(
            "ring", op, rank_layout(graph), size, chunks=chunks, channels=channels
        )
        _compare(graph, schedule, protocol)


def test_fillings_met_again_are_reused_and_equal_the_reference(monkeypatch):
    """A ring's events meet the same flows per route again and again (the next chunk on
    the route of the one done): each filling is made once and reused, and the replay,
    with the fillings kept or dropped whenever a new one comes, is the reference's to
    the bit."""
    made, rated = [], []
    fill, recompute = sr._Net._fill, sr._Net._recompute

    def counted_fill(net, groups, level_of):
        made.append(1)
        fill(net, groups, level_of)

    def counted_recompute(net, routes, now):
        rated.append(1)
        recompute(net, routes, now)

    monkeypatch.setattr(sr._Net, "_fill", counted_fill)
    monkeypatch.setattr(sr._Net, "_recompute", counted_recompute)
    graph = load_topology("dgx-h100", 2)
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), 3e7, chunks=2, channels=4)
    _compare(graph, schedule, "Simple")
    kept = len(made)
    assert 0 < kept < len(rated) / 2
    made.clear()
    monkeypatch.setattr(sr, "_FILLS", 1)
    _compare(graph, schedule, "Simple")
    assert len(made) > kept


def test_chunks_of_mixed_sizes_on_one_route_equal_the_reference(monkeypatch):
    """A route's flows are kept in order of bytes left while each joins with no fewer
    than the last has left (a ring's equal chunks); chunks of random sizes (seeded)
    join behind larger ones, the route is then scanned whole, and the replay is still
    the reference's to the bit."""
    out_of_order = []
    settle = sr._Net._settle

    def watched(net, finished, *first):
        settle(net, finished, *first)
        out_of_order.append(not all(net.route_sorted))

    monkeypatch.setattr(sr._Net, "_settle", watched)
    graph = load_topology("dgx-h100", 2)
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), 2e7, chunks=3, channels=3)
    rng = np.random.default_rng(7)
    schedule.nbytes = schedule.nbytes * rng.uniform(0.3, 1.7, schedule.n_ops)
    _compare(graph, schedule, "Simple")
    assert any(out_of_order)


@pytest.mark.parametrize("protocol", ["LL128", "Simple"])
def test_rings_with_slow_links_equal_the_reference(protocol):
    """Random links slowed to 30% (seeded): channels drift apart and queue behind the
    slow hops, so rates change at many distinct instants."""
    graph = apply_faults(load_topology("dgx-h100", 2), "random:q=0.1,fraction=0.3,seed=5")
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 2e7, chunks=2, channels=3)
    _compare(graph, schedule, protocol)


def test_a_quotient_on_link_classes_equals_the_reference():
    """Four servers, symmetric under a one-server shift: the quotient's flows stand for
    four each and load link classes (as the workload's data-parallel calls run); its
    records are the representatives'."""
    graph = load_topology("dgx-h100", 4)
    schedule = build_schedule(
        "ring", "reduce_scatter", rank_layout(graph), 3e7, chunks=2, channels=4
    )
    times = _compare(graph, schedule, "Simple", symmetric=True)
    assert len(times.rank_done_s) < schedule.ranks


def test_rank_done_is_the_last_transfer_of_each_rank():
    """A rank is done when the last transfer it sends or receives is done."""
    graph = load_topology("dgx-h100", 2)
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), 4e6, channels=2)
    times = _compare(graph, schedule, "Simple")
    for rank in range(schedule.ranks):
        mine = (schedule.src == rank) | (schedule.dst == rank)
        assert times.rank_done_s[rank] == times.end_s[mine].max()


def test_outside_its_scope_it_hands_over():
    """Reductions at a finite bandwidth are flows on reducer links, and loads that are
    not short dyadic numbers would make the order of sums matter: None (the caller then
    runs the reference)."""
    graph = load_topology("dgx-h100", 2)
    layout = rank_layout(graph)
    schedule = build_schedule("ring", "reduce_scatter", layout, 4e6, channels=2)
    network = _network(graph, None)
    reducing = np.full(schedule.ranks, 1e12)
    assert replay_scalar(network, schedule, reduce_bandwidth=reducing) is None
    classes = np.arange(len(network.links))
    thirds = np.full(len(network.links), 3.0)
    assert (
        replay_scalar(network, schedule, weight=1.0, link_class=classes, class_size=thirds) is None
    )


def test_a_training_step_is_the_same_with_calls_timed_by_the_scalar_replay(monkeypatch):
    """Megatron-Core's defaults with one replica standing for four: the step's calls
    timed alone by the scalar replay (the data-parallel rings' quotients on link
    classes among them) give every op the times the reference replay of each call
    gives, and the same link records and flows."""
    from simulator.workload import isolated
    from simulator.workload.engine import WorkloadReplay
    from simulator.workload.generators import megatron
    from simulator.workload.model import Transformer

    small = Transformer(layers=8, hidden=2048, seq=1024, vocab=32000, heads=16)
    workload = megatron(
        small, tp=8, pp=2, dp=4, global_batch=16, defaults="megatron-core", replicas=True
    )
    graph = load_topology("dgx-h100", 8)
    used = []
    original = isolated.replay_scalar

    def counted(*args, **kwargs):
        times = original(*args, **kwargs)
        used.append(times is not None and kwargs.get("period") is not None)
        return times

    monkeypatch.setattr(isolated, "replay_scalar", counted)
    fast = WorkloadReplay(workload, graph).run()
    assert any(used)  # a spanning call's quotient went through the scalar replay
    monkeypatch.setattr(isolated, "SCALAR_WIDTH", -1)
    slow = WorkloadReplay(workload, graph).run()
    _assert_same_replay(fast, slow)


def test_wide_rings_on_few_routes_take_the_scalar_replay_and_keep_the_step(monkeypatch):
    """Data parallelism alone on two DGX H100 (one replica of 8 standing for 16): the
    data-parallel quotient rings are 16 channels over 8 positions, 128 transfers a step
    (wider than isolated.SCALAR_WIDTH) on 8 distinct routes, so the scalar replay times
    them (its cost follows routes); every op's times, the link records and the flows
    are those of the reference replay of each call (both gates shut)."""
    from simulator.workload import isolated
    from simulator.workload.engine import WorkloadReplay
    from simulator.workload.generators import megatron
    from simulator.workload.model import Transformer

    small = Transformer(layers=4, hidden=2048, seq=1024, vocab=32000, heads=16)
    workload = megatron(
        small, tp=1, pp=1, dp=16, global_batch=16, defaults="megatron-core", replicas=True
    )
    graph = load_topology("dgx-h100", 2)
    wide = []
    original = isolated.replay_scalar

    def counted(network, schedule, **kwargs):
        times = original(network, schedule, **kwargs)
        if times is not None and isolated._step_width(schedule) > isolated.SCALAR_WIDTH:
            wide.append(kwargs.get("period"))
        return times

    monkeypatch.setattr(isolated, "replay_scalar", counted)
    fast = WorkloadReplay(workload, graph).run()
    assert fast.replicas["simulated"] == 8  # (one replica of 8 ranks stood for two)
    assert wide and all(period == 8 for period in wide)
    monkeypatch.setattr(isolated, "SCALAR_WIDTH", -1)
    slow = WorkloadReplay(workload, graph).run()
    _assert_same_replay(fast, slow)


def test_a_rings_routes_count_its_channels_on_one_hop_once():
    """What else picks the scalar replay (isolated._routes): a ring of C channels over
    the 16 GPUs of two DGX H100 takes at most 2 x 16 routes (each position's next, over
    NVLink or a NIC), whatever C, while its step width grows with C."""
    from simulator.workload.isolated import _routes, _step_width
    from simulator.workload.replicas import unique_rows

    layout = rank_layout(load_topology("dgx-h100", 2))
    for channels in (1, 4, 16):
        schedule = build_schedule("ring", "all_gather", layout, 1e6, channels=channels)
        fields = np.stack([schedule.src, schedule.dst, schedule.channel, schedule.path], axis=1)
        rows = unique_rows(fields.astype(np.int64))[0]
        assert _step_width(schedule) == channels * 16
        assert 16 <= _routes(rows) <= 32


def test_a_rings_step_width_is_its_channels_times_its_positions():
    """What picks the scalar replay for a call (isolated.SCALAR_WIDTH): a ring's
    transfers per step and chunk, C channels x p positions."""
    from simulator.workload.isolated import _step_width

    layout = rank_layout(load_topology("dgx-h100", 2))
    for channels, chunks in ((1, 1), (3, 2), (8, 4)):
        schedule = build_schedule(
            "ring", "all_reduce", layout, 1e6, chunks=chunks, channels=channels
        )
        assert _step_width(schedule) == channels * 16


@pytest.mark.parametrize("protocol", ["LL128", "Simple"])
def test_the_searchs_cut_off_equals_the_reference(monkeypatch, protocol):
    """Where the search for connected flows has not closed within its rounds, every flow
    is rated again. Rings this size close within six rounds, so both the network's and
    the scalar replay's cut-off are brought down to one round (the same constant on both
    sides): the scalar replay's search by route must cut off where the network's flow
    search does, and rate the same flows."""
    import simulator.collective.scalar_replay as scalar
    import simulator.network.flows as flows

    monkeypatch.setattr(flows, "_MAX_COMPONENT_ROUNDS", 1)
    monkeypatch.setattr(scalar, "_ROUNDS", 1)
    cut = []
    component = scalar._Net._component

    def counted(self, seeds):
        found = component(self, seeds)
        cut.append(found is self.active)
        return found

    monkeypatch.setattr(scalar._Net, "_component", counted)
    graph = load_topology("dgx-h100", 2)
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 2e7, chunks=2, channels=3)
    _compare(graph, schedule, protocol)
    assert any(cut) and not all(cut)  # both branches taken


def _assert_same_replay(fast, slow) -> None:
    """Every op's issue, start and end, the links' bytes and busy time, and the flow
    count of two replays of one workload, equal to the bit."""
    for name in ("issue_s", "start_s", "end_s"):
        np.testing.assert_array_equal(getattr(fast.records, name), getattr(slow.records, name))
    for name in ("bytes", "busy_s"):
        np.testing.assert_array_equal(fast.links[name], slow.links[name])
    assert fast.stats.flows == slow.stats.flows
