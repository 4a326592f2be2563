"""NVLSTree as deep as NCCL's loop (``NcclPolicy(nvls_tree_loops=True)``, issue 32).

NCCL's NVLSTree kernel loops over ``nHeads x chunkCount`` elements a channel
(src/device/all_reduce.h:535 and 562-632 at v2.30.7-1), so a call of n bytes on C
channels runs n / (C x heads x chunk) loops: ~1,024 at 16 GiB on two 8-GPU servers,
where ccsim's schedule stops at 32 chunks. Expected values are worked out here from
NCCL's chunk rule (enqueue.cc:2276-2285), the links' closed form n(g+1)/(g B_v) of the
NVSwitch phases (simulator.algorithms.nvls_tree), and the pipeline's fill law.
"""

import pytest

from simulator import simulate_collective
from simulator.collective.policy import MAX_CHUNKS, NVLS_TREE_MAX_CHUNKS, NcclPolicy
from simulator.collective.run import bus_factor
from simulator.topology import load_topology
from simulator.topology.builders import cluster_graph

GiB = 2**30


@pytest.mark.parametrize(
    ("size", "chunk", "loops"),
    [(16 * GiB, 131072, 1024), (GiB, 131072, 64), (4 * 2**20, 32768, 1), (32 * GiB, 131072, 2048)],
)
def test_chunks_are_nccls_loops_by_hand(size, chunk, loops):
    """Two DGX H100: NVLSTree on 16 channels x 8 heads. NCCL keeps 128 KiB chunks from
    16 x 128 x 128 KiB = 256 MiB and cuts them to 32 KiB below 128 x 64 KiB = 8 MiB, so
    4 MiB is one loop; 16 GiB is 16 GiB / (16 x 8 x 128 KiB) = 1,024 loops, 32 GiB twice
    that, past the cap. Without the option the pipeline stays at most 32 deep."""
    graph = load_topology("dgx-h100", 2)
    deep, default = NcclPolicy(nvls_tree_loops=True), NcclPolicy()
    plan = deep.plan(deep.system(graph), "all_reduce", size)
    assert (plan.params["nccl_algorithm"], plan.channels) == ("NVLSTree", 16)
    assert plan.params["message_bytes"] == chunk
    assert plan.chunks == min(loops, NVLS_TREE_MAX_CHUNKS)
    assert default.plan(default.system(graph), "all_reduce", size).chunks == min(loops, MAX_CHUNKS)


def test_other_algorithms_keep_their_depth():
    """One server runs NVLS, four servers Ring at 16 GiB: the option leaves both alone."""
    deep, default = NcclPolicy(nvls_tree_loops=True), NcclPolicy()
    for nodes, algorithm in ((1, "NVLS"), (4, "Ring")):
        graph = load_topology("dgx-h100", nodes)
        plans = [p.plan(p.system(graph), "all_reduce", 16 * GiB) for p in (deep, default)]
        assert plans[0].params["nccl_algorithm"] == algorithm
        assert plans[0].chunks == plans[1].chunks == MAX_CHUNKS


def test_a_deeper_pipeline_leaves_the_fill_over_its_depth():
    """Two servers of 8 GPUs, no latency, NVLink B_v = 400 GB/s the bottleneck (a NIC of
    100 GB/s carries n/g = 128 MiB each way, 1.34 ms, against 1.125 x 2^30 / 400 GB/s =
    3.02 ms on every NVLink): the pipeline's time is T(K) = T_inf (1 + F/K), T_inf the
    links' closed form and F a fixed number of chunk-times of fill and drain. So what 32
    chunks pay over T_inf, 256 chunks (NCCL's loops at 4 GiB) pay an eighth of."""
    g, n, b_v = 8, float(GiB), 400e9
    spec = {
        "gpus": g,
        "intra": {"kind": "nvswitch", "bandwidth": b_v, "nvls": True},
        "nic": {"bandwidth": 100e9, "gpus_per_nic": 1},
    }
    graph = cluster_graph(spec, 2, fabric={"type": "single-switch", "latency": 0})
    t_inf = n * (g + 1) / (g * b_v)
    shallow, deep = (
        simulate_collective(graph, "all_reduce", n, "nvls-tree", chunks=k).time_s
        for k in (MAX_CHUNKS, 256)
    )
    assert shallow > t_inf * 1.08  # the fill the 32-chunk cap pays: > 2.5 chunk-times
    assert deep == pytest.approx(t_inf + (shallow - t_inf) * MAX_CHUNKS / 256, rel=1e-9)


def test_two_dgx_h100_reach_the_links_closed_form():
    """16 GiB on two DGX H100 (NCCL: 1,024 loops a channel): every GPU's NVLinks carry
    n (g+1)/g each way at the preset's NVLS share of 450 GB/s (0.686), so busbw tends to
    2 (p-1)/p x 450 x 0.686 x 8/9 = 514.5 GB/s with p = 16. 1,024 chunks deep, ccsim is
    within 1% of it (a fill of ~3.7 chunk-times is 0.36%, the call's latencies ~0.1%);
    32 deep, over 8% below (11%: the fill the cap pays)."""
    graph = load_topology("dgx-h100", 2)
    bound = bus_factor("all_reduce", 16) * 450 * 0.686 * 8 / 9
    busbw = {}
    for deep in (True, False):
        run = NcclPolicy(nvls_tree_loops=deep).simulate(graph, "all_reduce", 16 * GiB)
        assert run.params["nccl_algorithm"] == "NVLSTree"
        busbw[deep] = run.busbw_GBps
    assert bound * 0.99 < busbw[True] <= bound * 1.001
    assert busbw[False] < bound * 0.92


def test_validate_refuses_the_option_where_it_would_be_ignored(capsys):
    from simulator.cli import main

    assert main(["validate", "--loco", "--nvls-tree-loops"]) == 2
    assert "--nvls-tree-loops applies to the cases' runs" in capsys.readouterr().err


def test_the_resource_guard_counts_the_deeper_pipeline():
    """The guard estimates a run's flows as transfers x chunks x channels built, so at
    16 GiB on two DGX H100 the option's 1,024 chunks count 32 times the default's 32; the
    topology's own share is the same in both."""
    from simulator.collective.guards import check_collective, cluster_of

    def estimate(size: float, loops: bool = False):
        return check_collective(
            "dgx-h100", "all_reduce", [size], ["nccl"], nodes=2, chunks=None, channels=None,
            nvls_tree_loops=loops,
        )  # fmt: skip

    topology = cluster_of("dgx-h100", 2).estimate().flows
    default, deep = estimate(16 * GiB), estimate(16 * GiB, True)
    assert "1024 chunks" in deep.what and "32 chunks" in default.what
    assert deep.flows - topology > 0
    assert (deep.flows - topology) == 32 * (default.flows - topology)


def test_collective_command_runs_as_deep_as_nccl(capsys):
    """``ccsim collective --nvls-tree-loops``: 1 GiB on two DGX H100 is 64 NCCL loops a
    channel (1 GiB / (16 x 8 x 128 KiB)), so 64 chunks; refused for other algorithms."""
    from simulator.cli import main

    argv = ["collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "2"]
    assert main([*argv, "--sizes", "1G", "--nvls-tree-loops"]) == 0
    assert "NVLSTree Simple channels 16 (ccsim nvls-tree, chunks 64)" in capsys.readouterr().out
    assert main([*argv, "--sizes", "1M", "--algo", "ring", "--nvls-tree-loops"]) == 2
    assert "--nvls-tree-loops applies to --algo nccl" in capsys.readouterr().err
