"""Data-parallel replicas side by side in one server (issue 31): on GB200 NVL72 racks a
pipeline stage fills a rack with its ``dp`` replicas' ranks, so moving every rank to
the next replica moves GPUs inside their rack, not whole racks. Where that map of the
GPUs extends to a map of the whole cluster onto itself (NICs with their GPUs, rail
leaves with their NICs) one replica still stands for all, and the step is the one with
every replica built: the same ops at the same times, to the clock's rounding. Where it
does not (a slower NIC), or where pipeline sends cross racks over paths ECMP hashes
(the images' routes are then not the routes' images), every replica is built."""

from __future__ import annotations

import pytest

from simulator.network.routing import LinkTable, Router
from simulator.topology import load_topology
from simulator.topology.graph import gpu_nodes, servers_of_ranks
from simulator.topology.symmetry import gpu_permutation
from simulator.workload import WorkloadReplay
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown
from simulator.workload.replicas import _cross_server_pairs
from simulator.workload.shadows import crosses_hashed
from tests.test_shadows_hashed_sends import racks

#: Relative difference allowed between an op's time with one replica standing for all
#: and with every replica built: the aggregated flows' rates are the same sums in
#: another order (a few ulps of the clock).
CLOSE = 1e-12


def run(graph, replicas: bool, shadows: bool, **options):
    """The run of a small Llama 3 8B step of ``options`` on ``graph``."""
    batch = 2 * options["pp"] * options["dp"]
    workload = megatron(
        model="llama3-8b",
        micro_batch=1,
        global_batch=batch,
        replicas=replicas,
        shadows=shadows,
        **options,
    )
    return WorkloadReplay(workload, graph).run()


def same_ops(one, full) -> None:
    """Every op the one-replica run simulated starts and ends when the same op of the
    full build does."""
    index = {op.id: op.index for op in full.workload.ops}
    clock = float(full.records.end_s.max())
    for op in one.workload.ops:
        other = index[op.id]
        for mine, theirs in (
            (one.records.start_s[op.index], full.records.start_s[other]),
            (one.records.end_s[op.index], full.records.end_s[other]),
        ):
            assert abs(mine - theirs) <= CLOSE * clock, op.id


@pytest.mark.parametrize(
    "options",
    [
        {"tp": 2, "pp": 2, "dp": 4},
        {"tp": 4, "pp": 2, "dp": 2, "virtual_stages": 2},
    ],
)
@pytest.mark.parametrize("shadows", [False, True])
def test_replicas_inside_a_rack_stand_for_all(options, shadows):
    """Each stage fills a rack (its replicas side by side); sends go rail to rail over
    one path. One replica stands for all, and its ops run when the full build's do."""
    gpus = options["tp"] * options["dp"]
    graph = racks(gpus, options["pp"])
    one = run(graph, True, shadows, **options)
    full = run(graph, False, False, **options)
    assert one.replicas == {"count": options["dp"], "simulated": 1}
    assert not full.replicas
    step, reference = breakdown(one).step_s, breakdown(full).step_s
    assert abs(step - reference) <= CLOSE * reference
    same_ops(one, full)


def test_a_slower_nic_builds_every_replica():
    """One GPU's NIC at half its bandwidth: no map of the cluster moves it onto the
    others, so every replica is built, and the step is the full build's."""
    options = {"tp": 2, "pp": 2, "dp": 4}
    graph = racks(8, 2)
    for u, v, data in graph.edges(data=True):
        if {str(u), str(v)} == {"s1/gpu3", "s1/nic3"}:
            data["bandwidth"] /= 2
    one = run(graph, True, False, **options)
    full = run(graph, False, False, **options)
    assert one.replicas["simulated"] == "all"
    assert "maps the topology elsewhere" in one.replicas["why"]
    assert breakdown(one).step_s == breakdown(full).step_s


def test_hashed_pipeline_sends_build_every_replica():
    """Stages of half a rack (TP 4, DP 2 on racks of 16): stage 1 sends from rail 8 + i
    of rack 0 to rail i of rack 1, over the spines, which ECMP picks per pair: every
    replica is built before the run, and the step is the full build's."""
    options = {"tp": 4, "pp": 4, "dp": 2, "virtual_stages": 2}
    graph = racks(16, 2)
    one = run(graph, True, False, **options)
    full = run(graph, False, False, **options)
    assert one.replicas["simulated"] == "all"
    assert "several shortest paths" in one.replicas["why"]
    assert breakdown(one).step_s == breakdown(full).step_s


def test_pipeline_sends_routed_per_destination_keep_one_replica():
    """The same step routed as InfiniBand's subnet manager does (per destination, the
    preset's default): a send from rail 8 + i of rack 0 to rail i of rack 1 climbs to
    the spine of rack 1's port on leaf i, the same for every i, so the second replica's
    sends (rails 12 + i to 4 + i) are the first's moved along the rails. One replica
    and one TP master stand in, and the step is the full build's."""
    options = {"tp": 4, "pp": 4, "dp": 2, "virtual_stages": 2}
    graph = racks(16, 2, "per_destination")
    one = run(graph, True, False, **options)
    both = run(graph, True, True, **options)
    full = run(graph, False, False, **options)
    assert one.replicas == {"count": 2, "simulated": 1}
    assert both.replicas == {"count": 2, "simulated": 1}
    assert both.shadows == {"count": 4, "simulated": 1}
    assert breakdown(one).step_s == breakdown(full).step_s
    assert breakdown(both).step_s == breakdown(full).step_s


def test_gpu_permutation_moves_nics_and_rails_with_their_gpus():
    """On two DGX H100 (a NIC per GPU, a leaf per rail), swapping GPU halves inside each
    server moves NIC i to NIC i + 4 and leaf i to leaf i + 4; the NVSwitch and the
    spines stay. With one NIC link slower, the same move maps the cluster elsewhere."""
    graph = load_topology("dgx-h100", 2)
    gpus = gpu_nodes(graph)
    swap = {gpus[r]: gpus[r - r % 8 + (r % 8 + 4) % 8] for r in range(len(gpus))}
    phi = gpu_permutation(graph, swap)
    assert phi is not None
    assert phi["s0/nic2"] == "s0/nic6" and phi["leaf6"] == "leaf2"
    fixed = [node for node in graph.nodes if phi[node] == node]
    assert fixed and all(not str(node).startswith(("s0/gpu", "s0/nic")) for node in fixed)
    slow = graph.copy()
    for u, v, data in slow.edges(data=True):
        if {str(u), str(v)} == {"s0/gpu1", "s0/nic1"}:
            data["bandwidth"] /= 2
    assert gpu_permutation(slow, swap) is None
    assert gpu_permutation(graph, {gpus[0]: gpus[1]}) is None  # not every GPU


def test_group_pairs_across_racks_are_found_and_hashed():
    """The pairs the up-front check looks at: every two ranks of a group on two racks.
    TP 4 DP 8 on two racks of 16 (no pipeline): a DP group holds the TP position t of
    every replica, ranks t, t + 4, ..., t + 28, half on each rack, so 4 x 4 pairs each
    way; rail t + 4 of rack 0 meets rail t of rack 1 only over the spines (hashed)."""
    graph = racks(16, 2)
    workload = megatron(
        model="llama3-8b", micro_batch=1, global_batch=8, tp=4, pp=1, dp=8, replicas=True
    )
    servers = servers_of_ranks(graph)
    pairs = _cross_server_pairs(workload, servers)
    expected = {
        (a, b)
        for t in range(4)
        for a in range(t, 32, 4)
        for b in range(t, 32, 4)
        if (a < 16) != (b < 16)
    }
    assert set(pairs) == expected
    assert crosses_hashed(pairs, servers, Router(graph, LinkTable(graph)))
