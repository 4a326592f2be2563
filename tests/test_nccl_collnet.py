"""CollNet in NCCL's choice (issue 32): with NCCL_COLLNET_ENABLE=1 on a fabric that reduces
in the network (``sharp: true``), NCCL's tuning model prices CollNet Direct and CollNet
Chain beside Ring, Tree and NVLSTree (src/graph/tuning.cc, src/enqueue.cc at v2.30.7).
The figures below are NCCL's model computed by hand from the source's constants.
"""

from __future__ import annotations

import pytest

from simulator.cli import main
from simulator.collective.policy import NcclPolicy
from simulator.errors import CcsimError
from simulator.library.nccl import launch_size, nccl_choice, predicted_time_us
from simulator.library.nccl_env import parse_nccl_env
from simulator.topology.builders import fabric_spec
from simulator.topology.presets import preset, preset_files, preset_graph

GIB4 = 2**32


def _h100(nodes, sharp=True):
    """DGX H100 servers (8 GPUs, 8 x 400 Gb/s NICs) on a rail-optimized fabric whose
    switches reduce in the network (SHARP) when ``sharp``."""
    data = preset("dgx-h100")
    data["fabric"] = {**data["fabric"], "sharp": sharp}
    return preset_graph(
        {**data, "fabric": fabric_spec(data["fabric"])}, nodes, name="h100-sharp", source="t"
    )


def _system(nodes, env="NCCL_COLLNET_ENABLE=1", sharp=True):
    return NcclPolicy(env=env).system(_h100(nodes, sharp))


def test_collnet_search_graphs_by_hand():
    """Direct: one head per NIC-GPU pair, 8 (NCCL_MAX_DIRECT_ARITY + 1 = 8); a GPU's NVLinks
    (18 x 20.6 = 370.8 GB/s as NCCL counts them) carry 1 + 7/7 = 2x the speed, so the
    speed rises to Hopper's fastest inter-node speed, 48 GB/s (<= 2 x the ring's 48).
    Chain: the ring's 8 channels, each through every GPU once: 8 x s <= 370.8 -> 45."""
    system = _system(2)
    assert (system.collnet_direct.channels, system.collnet_direct.bw_intra) == (8, 48)
    assert (system.collnet_chain.channels, system.collnet_chain.bw_intra) == (8, 45)


def test_collnet_predicted_times_by_hand():
    """tuning.cc, all-reduce, Simple, 2 x 8 H100:
    CollNet Direct: latency 2 x (min(1, 7) x 3.7 + 7 x 0.4) + 31 = 44.0 us; bandwidth
    8 heads x 48 GB/s, / ((8/8) - 0) = 384, x 0.85 (Hopper) x 0.5 (bus to algorithm)
    = 163.2 GB/s. CollNet Chain: 2 x 7 x 2.8 + 30 = 69.2 us; 8 x 45 x 0.5 = 180 GB/s.
    LL and LL128 are not priced (busBw 0)."""
    system = _system(2)
    direct = predicted_time_us(system, "all_reduce", GIB4, "CollNetDirect", "Simple")
    chain = predicted_time_us(system, "all_reduce", GIB4, "CollNetChain", "Simple")
    assert direct == pytest.approx(44.0 + GIB4 / (1000 * 163.2), rel=1e-9)
    assert chain == pytest.approx(69.2 + GIB4 / (1000 * 180.0), rel=1e-9)
    assert predicted_time_us(system, "all_reduce", 2**20, "CollNetDirect", "LL") is None
    assert predicted_time_us(system, "all_gather", 2**20, "CollNetDirect", "Simple") is None


def test_collnet_direct_channels_by_hand():
    """enqueue.cc:2073-2083: from 16 channels, trim while bytes < nc x 640 threads x 8
    heads x threshold (512, halved at nc = 12, 6, 3): 64 KiB -> 1; 1 MiB stops at 2
    (2 x 640 x 8 x 64 = 655,360 < 1 MiB); 16 MiB stops at 11 (11 x 640 x 8 x 256 =
    14.4 MB < 16.8 MB)."""
    system = _system(4)
    for size, channels in ((2**16, 1), (2**20, 2), (2**24, 11)):
        assert launch_size(system, "all_reduce", size, "CollNetDirect", "Simple")[0] == channels


def test_nccl_picks_collnet_where_its_model_says():
    """On 16 servers NCCL's table puts CollNet Direct first from 1 KiB to 16 MiB (44 us
    against Tree/LL's 2 x (7 x 0.6 + 4 x 5) + 6.8 = 55.2 us at the smallest sizes)."""
    graph = _h100(16)
    policy = NcclPolicy(env="NCCL_COLLNET_ENABLE=1")
    for size in (2**10, 2**16, 2**20, 2**24):
        assert policy.choose(graph, "all_reduce", size).algorithm == "CollNetDirect"
    small = nccl_choice(policy.system(graph), "all_reduce", 2**10)
    assert small.table[("Tree", "LL")] > small.table[("CollNetDirect", "Simple")]


def test_collnet_stays_off_unless_enabled_on_a_sharp_fabric():
    """NCCL's default is off; with NCCL_COLLNET_ENABLE=1 but no SHARP it turns CollNet off
    itself (init.cc:1164-1166); on one server there is no network to reduce in."""
    for system in (_system(16, env=None), _system(16, sharp=False), _system(1)):
        for size in (2**10, 2**20, 2**30):
            choice = nccl_choice(system, "all_reduce", size)
            assert "CollNet" not in choice.algorithm


def test_collnet_forced_and_bad_settings():
    system = _system(2, env="NCCL_COLLNET_ENABLE=1,NCCL_ALGO=CollNetChain")
    env = parse_nccl_env("NCCL_COLLNET_ENABLE=1,NCCL_ALGO=CollNetChain")
    choice = nccl_choice(system, "all_reduce", 2**30, algorithms=env.algorithms_for("all_reduce"))
    assert choice.algorithm == "CollNetChain"
    with pytest.raises(CcsimError, match="NCCL_COLLNET_ENABLE=1"):
        parse_nccl_env("NCCL_ALGO=CollNetDirect")


def test_collnet_runs_end_to_end(tmp_path, capsys):
    """The CLI runs NCCL's CollNet choice with ccsim's collnet-direct schedule."""
    text = preset_files()["dgx-h100"].read_text()
    path = tmp_path / "h100-sharp.yaml"
    path.write_text(text.replace("  type: rail-optimized", "  type: rail-optimized\n  sharp: true"))
    argv = ["collective", "all_reduce", "--topology", str(path), "--nodes", "4", "--sizes", "1M"]
    assert main([*argv, "--nccl", "NCCL_COLLNET_ENABLE=1"]) == 0
    assert "CollNetDirect Simple channels 2 (ccsim collnet-direct" in capsys.readouterr().out
