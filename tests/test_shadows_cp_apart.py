"""Per-communicator channel caps and the TP x CP shadows (issue 31).

A data-parallel ring capped below its ranks per server keeps NCCL's first channels:
channel c enters each server at the GPU of NET c and leaves it through NET c again
(NCCL v2.26.3-1, the version of the rows' NeMo 25.04 container: src/graph/search.cc
lines 600-608, ``ncclTopoSearchRecNet`` tries NET ``nets[(nChannels + i) % netCount]``
first for channel nChannels, the list opening with each GPU's own NIC in GPU order,
``ncclTopoSelectNets`` lines 449-497; lines 660-677, it starts at the GPU closest to
that NET; lines 281-303, on NVSwitch the next GPU is the following one; lines 535-539,
the ring's last GPU goes back to that NET where crossNic is 0; src/graph/connect.cc
lines 439-452 duplicate the search's channels after themselves and line 483,
``comm->nChannels = min(nChannels, maxCTAs)``, keeps channels 0 .. maxCTAs-1). ccsim's
rings do this already (simulator/algorithms/ring.py, ring_orders; PXN through the
receiver's rail, simulator/network/routing.py, pxn_route_ids).
Its positions one CP rank apart then end at different times, so a master does not
stand for its CP shadows; the TP shift still maps each ring onto its image, one rail
on, and the replay falls back to the TP shadows alone (every CP rank built), not to
every rank."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import CcsimError
from simulator.library.nccl_env import CommConfig
from simulator.topology.builders import fabric_spec
from simulator.topology.presets import preset, preset_graph
from simulator.workload import WorkloadReplay
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown
from simulator.workload.trace import parse_workload

RING = "NCCL_ALGO=Ring NCCL_PROTO=Simple"


def gb200(racks: int, per_rack: int):
    """GB200 NVL72 racks holding ``per_rack`` GPUs each, joined rail-optimized (one
    400G NIC per GPU, NIC k of every rack on leaf k), as ``ccsim validate --training``
    builds its GB200 rows (simulator/validate/training.py, run_topology)."""
    data = preset("gb200-nvl72")
    data = {**data, "server": {**data["server"], "gpus": per_rack}}
    spec = {**data, "fabric": fabric_spec(data.get("fabric"), None)}
    return preset_graph(spec, racks, name="gb200-test", source="test")


def _dp_gather(ranks: int, nbytes: float):
    """One all-gather over ``ranks`` GPUs on a group the megatron generator names a DP
    group (its collectives run on Megatron's ``dp_cp`` communicator)."""
    ops = [
        {"id": f"g{r}", "rank": r, "kind": "collective", "op": "all_gather",
         "group": "dp.s0.t0", "bytes": nbytes}
        for r in range(ranks)
    ]  # fmt: skip
    return parse_workload(
        {"format": "ccsim-workload/1", "ranks": ranks,
         "groups": {"dp.s0.t0": {"ranks": list(range(ranks))}}, "ops": ops}
    )  # fmt: skip


def test_a_capped_ring_leaves_each_server_through_its_first_gpus_nics():
    """Two racks of 4 GPUs (one NIC each), an 8-rank ring all-gather of S bytes on
    ``dp_cp`` capped at max_ctas=2. Worked from NCCL's source (module docstring):
    channels 0 and 1 are kept; channel c enters and leaves both servers through NIC c,
    so NICs 0 and 1 of each rack each carry one channel's inter-server hop, outbound,
    which moves the 7 blocks of S/(2 x 8) that cross it: 7/16 S; NICs 2 and 3 carry
    nothing."""
    graph = gb200(2, 4)
    size = 64e6
    run = WorkloadReplay(
        _dp_gather(8, size), graph, nccl=RING, communicators={"dp_cp": CommConfig(max_ctas=2)}
    ).run()
    assert run.choices[0]["channels"] == 2
    links = run.links
    carried = {
        (src, dst): nbytes
        for src, dst, nbytes in zip(links["src"], links["dst"], links["bytes"], strict=True)
    }
    for server in (0, 1):
        for nic in range(4):
            out = carried[(f"s{server}/nic{nic}", f"leaf{nic}")]
            expected = 7 / 16 * size if nic < 2 else 0.0
            assert out == pytest.approx(expected, rel=1e-9, abs=1.0), (server, nic)


def _steps(comm: dict, **options):
    graph = gb200(2, 8)
    common = dict(model="llama3-8b", micro_batch=1, global_batch=2 * options["dp"], **options)
    shadowed = WorkloadReplay(megatron(**common, shadows=True), graph, communicators=comm).run()
    full = WorkloadReplay(megatron(**common), graph, communicators=comm).run()
    return shadowed, full


def _same_timeline(shadowed, full) -> None:
    """Every op the shadowed replay built starts and ends when the full build's does,
    and every link carries the same bytes."""
    assert breakdown(shadowed).step_s == breakdown(full).step_s
    ids = {op.id: op.index for op in full.workload.ops}
    for op in shadowed.workload.ops:
        j = ids[op.id]
        assert shadowed.records.start_s[op.index] == full.records.start_s[j], op.id
        assert shadowed.records.end_s[op.index] == full.records.end_s[j], op.id
    assert np.allclose(shadowed.links["bytes"], full.links["bytes"], rtol=1e-12, atol=1.0)


def test_cp_ranks_apart_fall_back_to_tp_shadows_equal_to_the_full_build():
    """TP 2, CP 2, DP 4 on two racks of 8 GPUs: each DP x CP ring has 4 ranks a rack.
    Capped at 2 channels it enters each rack at its first two positions, so a CP
    shadow's positions end apart from its master's: the replay builds every CP rank
    with the TP shadows alone (2 of each 4 ranks built), and every op it built starts
    and ends as in the full build, to the bit. Uncapped the masters stand for TP x CP
    as before."""
    shadowed, full = _steps({"dp_cp": CommConfig(max_ctas=2)}, tp=2, cp=2, dp=4, pp=1)
    assert shadowed.shadows["count"] == 4
    assert shadowed.shadows["simulated"] == 2
    assert "ended at" in shadowed.shadows["why"]
    _same_timeline(shadowed, full)
    assert len(shadowed.workload.ops) * 2 == len(full.workload.ops)
    plain, _ = _steps({}, tp=2, cp=2, dp=4, pp=1)
    assert plain.shadows == {"count": 4, "simulated": 1}


def test_tp_ranks_apart_still_build_every_rank():
    """Where TP shadows end apart, the TP-only build does not stand in either: a
    slower NIC on rail 1 of the first rack, TP 2 x CP 2 (a CP image meets it first, then
    the TP-only build's TP image): every rank is built, the report still counts the 4
    ranks a master stood for, and the step is the full build's."""
    graph = gb200(2, 8)
    graph.edges["s0/nic1", "leaf1"]["bandwidth"] /= 2
    common = dict(model="llama3-8b", micro_batch=1, global_batch=8, tp=2, cp=2, dp=4, pp=1)
    shadowed = WorkloadReplay(megatron(**common, shadows=True), graph).run()
    full = WorkloadReplay(megatron(**common), graph).run()
    assert shadowed.shadows["simulated"] == "all"
    assert shadowed.shadows["count"] == 4
    assert breakdown(shadowed).step_s == breakdown(full).step_s


def test_shadows_takes_true_false_or_tp():
    """Bad input: a clear error naming the field and its values."""
    with pytest.raises(CcsimError, match="shadows must be true, false or 'tp'"):
        megatron(model="llama3-8b", tp=2, micro_batch=1, global_batch=1, shadows="cp")
    tp_only = megatron(
        model="llama3-8b", tp=2, cp=2, dp=2, micro_batch=1, global_batch=2, shadows="tp"
    )
    assert tp_only.shadows is not None and tp_only.shadows.count == 2
    assert tp_only.shadows.tp_only is None


def test_a_passive_image_found_apart_at_the_end_says_whether_it_is_a_cp_rank_away():
    """Images replayed passively are checked at the run's end (ShadowCheck.settle): the
    first one found apart from its master tells whether it was a CP rank away, so that
    the replay falls back as it does for a shadow heard apart during the run; an image
    flagged as a CP one that agrees does not count."""
    from simulator.workload.shadows import ShadowCheck

    def settled(flags: list[bool], dones: list[list]) -> tuple[str, bool]:
        check = ShadowCheck()
        check.master((3,), [0], 1.5)
        check.master((3,), [1], 1.75)
        family = check.expected_family((3,), flags)
        family.expect(1.0, dones, list(range(len(dones))))
        return check.settle(), check.across_cp

    alike = [(0.5, np.array([0])), (0.75, np.array([1]))]
    apart = [(0.5, np.array([0])), (0.8, np.array([1]))]
    assert settled([False, True], [alike, alike]) == ("", False)
    why, across = settled([False, True], [alike, apart])
    assert "ended at 1.8 s, its master at 1.75 s" in why and across
    why, across = settled([False, True], [apart, alike])
    assert "ended at 1.8 s" in why and not across
    # One record per image (no family), flagged the same way.
    check = ShadowCheck()
    check.master((3,), [0, 1], 2.0)
    check.expected((3,), "a CP image", across_cp=True).expect(1.0, [(1.25, np.array([0]))])
    assert "ended at 2.25 s" in check.settle() and check.across_cp
