"""A call's routes found once per distinct (src, dst, channel, path) row of its schedule
(simulator.workload.isolated.IsolatedCalls._rows): the rows give back every op, and the
footprint and signature found from them are those of the call's routes op by op."""

import numpy as np
import simpy

from simulator.algorithms import build_schedule
from simulator.collective.replay import route_ops, route_pairs
from simulator.collective.run import rank_layout
from simulator.network.flows import FlowNetwork
from simulator.topology import load_topology
from simulator.workload.isolated import IsolatedCalls


def test_rows_give_back_every_op_and_its_first_use():
    graph = load_topology("dgx-h100", 4)
    network = FlowNetwork(simpy.Environment(), graph)
    calls = IsolatedCalls(network, np.full(32, np.inf), set())
    schedule = build_schedule("ring", "all_reduce", rank_layout(graph), 2**24, chunks=3, channels=4)
    rows, op_row, row_first = calls._rows(schedule)
    path = schedule.path if schedule.path.any() else np.zeros(schedule.n_ops, np.int8)
    fields = np.stack([schedule.src, schedule.dst, schedule.channel, path], axis=1)
    assert np.array_equal(rows[op_row], fields)
    # Each row's first op is the first op with its fields; the rows are distinct.
    assert np.array_equal(op_row[row_first], np.arange(len(rows)))
    assert all(r not in op_row[: row_first[r]] for r in range(len(rows)))
    assert len(rows) < schedule.n_ops
    # The routes by row are those of every op (a shifted set of ranks: another call).
    ranks = np.roll(np.arange(32), 8)
    by_row = route_pairs(network.router, ranks[rows[:, 0]], ranks[rows[:, 1]], rows[:, 2],
                         rows[:, 3].astype(np.int8))[op_row]  # fmt: skip
    by_op = route_ops(network.router, schedule, np.arange(schedule.n_ops),
                      ranks[schedule.src], ranks[schedule.dst])  # fmt: skip
    assert np.array_equal(by_row, by_op)


def test_footprint_is_the_links_of_every_ops_route_in_first_use_order():
    """The footprint begins with the links of the call's routes, op by op, each link
    where first used (then its reducers, none here), computed here from every op's
    route; a call over the same servers' GPUs in another order of servers (alike on
    this cluster) has the same signature."""
    graph = load_topology("dgx-h100", 4)
    network = FlowNetwork(simpy.Environment(), graph)
    calls = IsolatedCalls(network, np.full(32, np.inf), set())
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), 2**24, chunks=2, channels=4)
    ranks = np.arange(32)
    footprint, signature = calls._footprint(schedule, None, ranks, None)
    routes = route_ops(network.router, schedule, np.arange(schedule.n_ops))
    ptr, flat, _ = network.router.arrays()
    expected: list[int] = []
    for route in routes.tolist():
        for link in flat[ptr[route] : ptr[route + 1]].tolist():
            if link not in expected:
                expected.append(link)
    assert footprint.tolist() == expected
    moved = np.concatenate([ranks[8:], ranks[:8]])
    assert calls._footprint(schedule, None, moved, None)[1] == signature


def test_signature_tells_apart_calls_whose_routes_differ():
    """The signature holds each row's route (the schedule's digest fixing which ops are
    on which row): the same ring over ranks interleaved across the servers crosses the
    network on every hop, so its routes, and its timing, differ, and so does its
    signature; the same call twice has one signature."""
    graph = load_topology("dgx-h100", 4)
    network = FlowNetwork(simpy.Environment(), graph)
    calls = IsolatedCalls(network, np.full(32, np.inf), set())
    schedule = build_schedule("ring", "all_gather", rank_layout(graph), 2**24, chunks=2, channels=4)
    ranks = np.arange(32)
    interleaved = ranks.reshape(4, 8).T.reshape(-1)  # 0, 8, 16, 24, 1, 9, ...
    _, signature = calls._footprint(schedule, None, ranks, None)
    _, other = calls._footprint(schedule, None, interleaved, None)
    assert other != signature
    assert calls._footprint(schedule, None, interleaved.copy(), None)[1] == other
