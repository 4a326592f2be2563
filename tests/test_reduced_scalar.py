"""Calls timed on their binding links (simulator.workload.reduced) run on the scalar
replay, and a large one's first round is spared when the beginning of its run already
shows every suspect link over: both held to the reference.

* The scalar run (stand-in routes) gives every transfer's flow start and send and every
  rank's end as the reference StandInReplay does, the same doubles.
* The probe changes no timing (the same doubles with it as without), and where it
  spares a round, the kept links are those the whole round would have found; the timing
  still equals the one that simulates every flow on every link (to 1e-9, as in
  tests/test_reduced.py).

Cases: a data-parallel ring all-gather over a GB200 NVL72 rack pair (a rack's GPUs
behind one NVLink switch, one 400G NIC per GPU, NCCL's channels crossing between racks
through other GPUs' NICs, PXN), its group split evenly and unevenly between the racks;
and the ring of tests/test_reduced.py whose two leaf uplinks carry two NICs' flows from
its first step (closed form).
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.topology.builders import fabric_spec
from simulator.topology.presets import preset, preset_graph
from simulator.workload import WorkloadReplay, load_workload
from simulator.workload import isolated as iso
from tests.test_reduced import Compare, one_gpu_servers, ring_step


def rack_pair(per_rack: int = 16, routing: str | None = None):
    """Two GB200 NVL72 racks of ``per_rack`` GPUs each, joined by the preset's fabric
    (as simulator.validate.training.run_topology builds a GB200 run's cluster), routed
    as ``routing`` says (None: the stack's default, per destination on InfiniBand)."""
    data = preset("gb200-nvl72")
    data = {**data, "server": {**data["server"], "gpus": per_rack}}
    if routing is not None:
        data = {**data, "fabric": {**data["fabric"], "routing": routing}}
    fabric = fabric_spec(data.get("fabric"), None)
    return preset_graph({**data, "fabric": fabric}, 2, name="gb200-nvl72", source="test")


def all_gather(ranks: list[int], total: int, nbytes: float = 256e6):
    """One all-gather of ``nbytes`` over ``ranks`` (of ``total`` ranks)."""
    ops = [
        {"id": f"g{r}", "rank": r, "kind": "collective", "op": "all_gather", "group": "dp",
         "bytes": nbytes}
        for r in ranks
    ]  # fmt: skip
    return load_workload(
        {"format": "ccsim-workload/1", "ranks": total, "ops": ops,
         "groups": {"dp": {"kind": "DP", "ranks": ranks}}}
    )  # fmt: skip


class BothRuns:
    """Wraps IsolatedCalls._run_reduced: each run is made on the scalar replay and on
    the reference StandInReplay, which must agree to the bit; the scalar one is used."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.runs = 0
        run = iso.IsolatedCalls._run_reduced
        both = self

        def twice(self, *args):
            scalar = run(self, *args)
            monkeypatch.setattr(iso, "SCALAR_REDUCED", False)
            try:
                reference = run(self, *args)
            finally:
                monkeypatch.setattr(iso, "SCALAR_REDUCED", True)
            assert (scalar is None) == (reference is None)
            if scalar is not None:
                both.runs += 1
                for name in ("flow_start", "sent", "done_at", "wire", "reducers"):
                    assert np.array_equal(getattr(scalar, name), getattr(reference, name)), name
                assert (scalar.flows, scalar.represented) == (
                    reference.flows,
                    reference.represented,
                )
            return scalar

        monkeypatch.setattr(iso.IsolatedCalls, "_run_reduced", twice)


GB200_GROUPS = {
    # Every other GPU (TP 2's data-parallel group), eight in each rack.
    "even": list(range(1, 32, 2)),
    # Seven in the first rack, eight in the second: a channel's crossing relayed by a
    # GPU's NIC loads that GPU's NVLink port beyond it, which the first round finds.
    "uneven": list(range(3, 32, 2)),
}


@pytest.mark.parametrize("split", sorted(GB200_GROUPS))
def test_scalar_runs_on_binding_links_equal_the_reference_on_a_gb200_rack_pair(monkeypatch, split):
    both = BothRuns(monkeypatch)
    compare = Compare(monkeypatch)
    WorkloadReplay(all_gather(GB200_GROUPS[split], 32), rack_pair(), algorithm="ring").run()
    assert compare.settled == compare.calls == 1
    assert both.runs == compare.reduced_runs >= 1


def timings(monkeypatch, workload, graph, probe: bool) -> tuple[list[iso.Timing], int]:
    """The timings alone of ``workload``'s calls (in order) and the runs on binding
    links made, with the probe on every call (``probe``) or on none."""
    monkeypatch.setattr(iso, "PROBE_OPS", 0 if probe else 1 << 62)
    found: list[iso.Timing] = []
    runs = 0
    time_alone = iso.IsolatedCalls._time_alone

    def record(self, *args, **kwargs):
        nonlocal runs
        before = self.reduced_runs
        timing = time_alone(self, *args, **kwargs)
        runs += self.reduced_runs - before
        found.append(timing)
        return timing

    with monkeypatch.context() as patch:
        patch.setattr(iso.IsolatedCalls, "_time_alone", record)
        WorkloadReplay(workload, graph, algorithm="ring").run()
    return found, runs


def assert_same(a: list[iso.Timing], b: list[iso.Timing]) -> None:
    """The same timings, to the bit."""
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert [(t, p.tolist()) for t, p in x.done] == [(t, p.tolist()) for t, p in y.done]
        for name in ("release_s", "nbytes", "busy_s", "flow_s"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name
        assert (x.flows, x.represented) == (y.flows, y.represented)


def test_the_probe_spares_the_uplinks_round_and_changes_no_timing(monkeypatch):
    """Ring 0 -> 2 -> 1 -> 3 under two leaves of one-GPU servers: both uplinks carry
    two NICs' flows from the first step on, so the probe's first quarter of sends finds
    both over and the whole first round is not run: one run on binding links instead of
    two (tests/test_reduced.py), the same timing to the bit, and the closed form: each
    of the 2 (p - 1) = 6 steps sends S/4 = 16 MB at half an uplink's 12.5 GB/s."""
    monkeypatch.setattr(iso, "PROBE_SHARE", 1 / 4)
    step, graph = ring_step([0, 2, 1, 3]), one_gpu_servers()
    without, runs_without = timings(monkeypatch, step, graph, probe=False)
    with_probe, runs_with = timings(monkeypatch, step, graph, probe=True)
    assert (runs_without, runs_with) == (2, 1)
    assert_same(with_probe, without)
    span = max(offset for offset, _ in with_probe[0].done)
    assert span == pytest.approx(6 * 16e6 / 6.25e9, rel=1e-9)


def test_the_probe_keeps_a_round_when_nothing_is_over_yet(monkeypatch):
    """Ring 0 -> 1 -> 2 -> 3 keeps to its NICs: no dropped link could bind, so there is
    nothing to probe for and the one run is made as before."""
    step, graph = ring_step([0, 1, 2, 3]), one_gpu_servers()
    with_probe, runs = timings(monkeypatch, step, graph, probe=True)
    without, _ = timings(monkeypatch, step, graph, probe=False)
    assert runs == 1
    assert_same(with_probe, without)


@pytest.mark.parametrize("routing", ["ecmp", None])
@pytest.mark.parametrize("split", sorted(GB200_GROUPS))
def test_the_probe_changes_no_timing_on_a_gb200_rack_pair(monkeypatch, split, routing):
    """The all-gathers of the rack pair, the probe on every call or on none: the same
    timings to the bit, and with it, each still the flow-by-flow timing. Under ECMP the
    uneven group's relayed NVLink ports are over from its first sends: its first round
    is spared. (Routed per destination, the probe is still run and the timings are
    still the same.)"""
    step, graph = all_gather(GB200_GROUPS[split], 32), rack_pair(routing=routing)
    without, runs_without = timings(monkeypatch, step, graph, probe=False)
    with_probe, runs_with = timings(monkeypatch, step, graph, probe=True)
    compare = Compare(monkeypatch)  # (its replay uses the flow-by-flow timings)
    timings(monkeypatch, step, graph, probe=True)
    assert compare.settled == compare.calls == 1
    if routing == "ecmp":
        assert (runs_without, runs_with) == ((1, 1) if split == "even" else (2, 1))
    assert runs_with == 1
    assert_same(with_probe, without)
