"""TP masters' pipeline sends that ECMP hashes (issue 31): on GB200 NVL72 racks joined by
a rail fabric, a pipeline stage smaller than a rack sends from one rack's rail to
another rack's other rail, through the spines, where ECMP hashes each TP rank's send
onto a spine of its own. The replay then builds every rank before running (the shadows
would be found unlike only late in the step); stages that line up with the racks send
rail to rail over one path and the masters still stand in. Either way the step is the
one with every rank built. InfiniBand's subnet manager routes per destination instead
(the preset's default): there every TP rank's send to another rack takes the spine of
its destination's rack, the images are alike, and the masters stand in with the step of
every rank built."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.network.routing import LinkTable, Router
from simulator.topology.builders import fabric_spec
from simulator.topology.graph import servers_of_ranks
from simulator.topology.presets import preset, preset_graph
from simulator.workload import WorkloadReplay, engine
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown
from simulator.workload.shadows import crosses_hashed

WHY = "a master's pipeline send crosses servers over several shortest paths"


def racks(gpus: int, count: int, routing: str = "ecmp"):
    """``count`` GB200 NVL72 racks holding ``gpus`` GPUs each, joined by the preset's
    fabric of one NIC per GPU (as simulator.validate.training.run_topology builds them),
    routed as ``routing`` says (ECMP here unless asked: what these tests are about)."""
    data = preset("gb200-nvl72")
    data = {**data, "server": {**data["server"], "gpus": gpus}}
    fabric = {**fabric_spec(data.get("fabric"), None), "routing": routing}
    return preset_graph({**data, "fabric": fabric}, count, name="nvl", source="nvl (test)")


def step(graph, shadows: bool, **options):
    """The run of a small Llama 3 8B step of ``options`` on ``graph``."""
    common = dict(model="llama3-8b", micro_batch=1, global_batch=2 * options["pp"] * options["dp"])
    return WorkloadReplay(megatron(**common, **options, shadows=shadows), graph).run()


def test_a_send_between_two_racks_other_rails_is_hashed():
    """Rails are per GPU position: the same position on two racks meets at its rail's
    leaf (one path); other positions meet only over the spines, which ECMP chooses
    between; GPUs of one rack (one NVLink domain) do not cross servers at all."""
    graph = racks(16, 2)
    router = Router(graph, LinkTable(graph))
    servers = servers_of_ranks(graph)
    assert sum(str(node).startswith("spine") for node in graph.nodes) > 1
    assert not crosses_hashed([(0, 16), (15, 31)], servers, router)  # rail to rail
    assert not crosses_hashed([(0, 9)], servers, router)  # within a rack
    assert crosses_hashed([(0, 16), (8, 16)], servers, router)  # rail 8 to rail 0


def test_hashed_pipeline_sends_build_every_rank_before_the_run(monkeypatch):
    """TP 4 PP 4 (two virtual stages) DP 2 on two racks of 16: stage 1 (the second half
    of rack 0) sends to stage 2 (the first half of rack 1) from rail 8 + i to rail i, and
    the last stage back to the first likewise. Every rank is built up front and the step
    is the full build's. Without the check, the replay itself finds a shadow's send
    ending apart from its master's (the check predicted a real disagreement)."""
    graph = racks(16, 2)
    options = dict(tp=4, pp=4, dp=2, virtual_stages=2)
    checked = step(graph, True, **options)
    full = step(graph, False, **options)
    assert checked.shadows == {"count": 4, "simulated": "all", "why": WHY}
    assert breakdown(checked).step_s == breakdown(full).step_s
    assert np.array_equal(checked.records.end_s, full.records.end_s)
    monkeypatch.setattr(engine, "sends_hash", lambda *_: False)
    late = step(graph, True, **options)
    assert late.shadows["simulated"] == "all"
    assert "a shadow of" in late.shadows["why"] and "ended at" in late.shadows["why"]
    assert breakdown(late).step_s == breakdown(full).step_s


@pytest.mark.parametrize("options", [{"tp": 4, "pp": 2, "dp": 4}, {"tp": 4, "pp": 2, "dp": 2}])
def test_sends_rail_to_rail_keep_the_masters(options):
    """Each stage fills a rack (16 or 8 GPUs): its sends go from a position to the
    same position on the next rack, rail to rail over one path, so the masters stand
    in, and the step is the full build's."""
    gpus = options["tp"] * options["dp"]
    graph = racks(gpus, options["pp"])
    shadowed = step(graph, True, **options)
    full = step(graph, False, **options)
    assert shadowed.shadows == {"count": 4, "simulated": 1}
    assert breakdown(shadowed).step_s == breakdown(full).step_s


def test_sends_routed_per_destination_keep_the_masters():
    """The hashed case above routed as InfiniBand's subnet manager does (per destination,
    the preset's default): rail 8 + i of rack 0 sends to rail i of rack 1 through the
    spine of rack 1's NICs on their leaves (spine 1 of 2, every i), so every TP rank's
    send is its master's moved along the rails; the masters stand in and the step and
    every op's end are the full build's."""
    graph = racks(16, 2, "per_destination")
    router = Router(graph, LinkTable(graph))
    assert not crosses_hashed([(8, 16), (9, 17)], servers_of_ranks(graph), router)
    spines = [
        router.path_nodes(int(router.route_ids(np.array([8 + i]), np.array([16 + i]))[0]))[3]
        for i in range(8)
    ]
    assert spines == ["spine1"] * 8
    options = dict(tp=4, pp=4, dp=2, virtual_stages=2)
    shadowed = step(graph, True, **options)
    full = step(graph, False, **options)
    assert shadowed.shadows == {"count": 4, "simulated": 1}
    assert breakdown(shadowed).step_s == breakdown(full).step_s
    ids = {op.id: op.index for op in full.workload.ops}
    index = [ids[op.id] for op in shadowed.workload.ops]
    assert np.array_equal(shadowed.records.end_s, full.records.end_s[index])
    assert np.allclose(shadowed.links["bytes"], full.links["bytes"], rtol=1e-12, atol=1.0)
