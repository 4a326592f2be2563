"""Calls that share links run as bundles (simulator.workload.bundles): one flow per
link at the pace the call keeps alone. Checked against hand-computed max-min timelines,
the call alone, conservation of bytes, and the per-flow reference."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.network.flows import FlowNetwork
from simulator.network.maxmin import max_min_rates
from simulator.topology import load_topology, ring_graph
from simulator.workload import WorkloadReplay, parse_workload
from simulator.workload.generators import megatron
from simulator.workload.metrics import breakdown

MiB = 2**20


def test_max_min_with_caps_gives_the_rest_to_the_others():
    """Three flows on a 12-unit link, the first capped at 2 and the second at 7: water
    filling gives the first its cap, and the other two split the 10 left (5 each, under
    the second's cap). A fourth flow alone on a second link keeps its cap."""
    rate = max_min_rates(
        np.array([0, 1, 2, 3]),
        np.array([0, 0, 0, 1]),
        4,
        np.array([12.0, 100.0]),
        cap=np.array([2.0, 7.0, np.inf, 30.0]),
    )
    assert rate.tolist() == [2.0, 5.0, 5.0, 30.0]


class _Ends:
    def __init__(self, env):
        self.env, self.sent = env, {}

    def on_sent(self, ops):
        for op in ops.tolist():
            self.sent[op] = self.env.now

    def on_delivered(self, ops):
        pass


def test_a_capped_flow_and_a_plain_one_share_a_link_by_hand():
    """On one 10 GB/s link, a 4 GB flow capped at 2 GB/s and a plain 8 GB flow: 2 and 8
    GB/s until the plain one ends at 1 s (8 GB), then the capped one keeps its cap: it
    ends at 2 s. Bytes on the link: 12 GB."""
    graph = ring_graph(2, 10e9, 0.0)
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    ends = _Ends(env)
    owner = network.register(ends)
    link = network.links.index[("gpu0", "gpu1")]
    route = network.router.route_over((link,))
    network.add_flows(owner, np.array([0]), np.array([route]), np.array([4e9]), cap=np.array([2e9]))
    network.add_flows(owner, np.array([1]), np.array([route]), np.array([8e9]))
    env.run()
    assert ends.sent[1] == pytest.approx(1.0, rel=1e-12)
    assert ends.sent[0] == pytest.approx(2.0, rel=1e-12)
    assert network.link_bytes[link] == pytest.approx(12e9, rel=1e-12)


def ring_and_send(send_at: str, send_bytes: float, n: float, p: int = 4, channels: int = 1):
    """A ring all-reduce of ``n`` bytes over ``p`` ranks (on ``channels`` rings) after 1
    ms of compute, and a ``send_bytes`` send from rank 0 to rank 1 on another stream
    ``send_at`` into the step (over the ring's link 0 -> 1)."""
    ops = []
    for rank in range(p):
        ops.append({"id": f"c{rank}", "rank": rank, "kind": "compute", "duration": "1ms"})
        ops.append({"id": f"a{rank}", "rank": rank, "kind": "collective", "op": "all_reduce",
                    "group": "all", "bytes": n, "channels": channels,
                    "deps": [f"c{rank}"]})  # fmt: skip
    for rank, kind, peer in ((0, "send", 1), (1, "recv", 0)):
        ops.append({"id": f"w{rank}", "rank": rank, "kind": "compute", "duration": send_at,
                    "stream": "x"})  # fmt: skip
        ops.append({"id": f"{kind}{rank}", "rank": rank, "kind": kind, "peer": peer,
                    "bytes": send_bytes, "stream": "x", "deps": [f"w{rank}"]})  # fmt: skip
    return parse_workload(
        {
            "format": "ccsim-workload/1",
            "ranks": p,
            "groups": {"all": {"ranks": list(range(p))}},
            "ops": ops,
        }
    )


@pytest.mark.parametrize("channels", [1, 3])
def test_a_ring_all_reduce_beside_a_send_by_hand(channels):
    """A ring all-reduce of n over 4 ranks on a 1-D ring (B, alpha per hop) from t0 = 1
    ms, on k channels, and a send of m on link 0 -> 1 from ts = 1.1 ms. Alone the call
    takes 2(p-1) steps of n/(pB) + alpha (k flows of n/(kp) at B/k each); each link
    carries b = 2(p-1)n/p, last used R = 2(p-1)s - alpha after the start, with k flows
    on it whenever busy. The call is replayed from its timing until the send meets it
    at ts; from then it is a bundle of what it has left (b spread evenly up to R: b -
    c(ts - t0), with c = b/R): on link 0 -> 1 its flow counts as k flows capped at c/k
    each, and with the send they share B max-min, B/(k+1) a flow (c/k > B/(k+1)), until
    the send ends at ts + (k+1)m/B, the bundle moving km meanwhile; then the bundle runs
    at c. The call ends alpha after its last flow; the send arrives alpha after it is
    sent. One attempt: nothing is run again."""
    p, n, m, bandwidth, alpha = 4, 64 * MiB, 8 * MiB, 100e9, 2e-6
    k = channels
    graph = ring_graph(p, bandwidth, alpha)
    workload = ring_and_send("1.1ms", m, n, channels=k)
    run = WorkloadReplay(workload, graph, algorithm="ring").run()
    t0, ts = 1e-3, 1.1e-3
    step = n / p / bandwidth + alpha
    b = 2 * (p - 1) * n / p
    last_use = 2 * (p - 1) * step - alpha
    cap = b / last_use
    assert cap / k > bandwidth / (k + 1)
    send_sent = ts + (k + 1) * m / bandwidth
    left = b - cap * (ts - t0) - k * m  # the bundle's bytes on link 0 -> 1 after the send
    end = send_sent + left / cap + alpha
    ids = [op.id for op in run.workload.ops]
    for rank in range(p):
        assert run.records.end_s[ids.index(f"a{rank}")] == pytest.approx(end, rel=1e-12)
    assert run.records.end_s[ids.index("recv1")] == pytest.approx(send_sent + alpha, rel=1e-12)
    assert run.isolated["bundled"] == run.isolated["met"] == 1
    assert run.isolated["attempts"] == 1
    # Bytes are the call's and the send's: b on every ring link, m more on 0 -> 1.
    assert sum(run.links["bytes"]) == pytest.approx(p * b + m, rel=1e-12)


def test_a_bundle_alone_ends_when_the_call_does_alone():
    """With the send long after the call, the call is replayed; forced to run as a
    bundle (every call flow by flow excluded from replays), it ends at the same times,
    since alone each of its flows runs at its cap and ends at the call's last use of its
    link: every rank at t0 + 2(p-1)(n/(pB) + alpha), the closed form."""
    p, n, bandwidth, alpha = 4, 64 * MiB, 100e9, 2e-6
    graph = ring_graph(p, bandwidth, alpha)
    workload = ring_and_send("100s", 8 * MiB, n)
    replayed = WorkloadReplay(workload, graph, algorithm="ring").run()
    bundled = WorkloadReplay(
        workload, graph, algorithm="ring", _excluded=frozenset({"every call"})
    ).run()
    assert bundled.isolated["bundled"] == 1 and replayed.isolated["bundled"] == 0
    ids = [op.id for op in workload.ops]
    closed = 1e-3 + 2 * (p - 1) * (n / p / bandwidth + alpha)
    for rank in range(p):
        i = ids.index(f"a{rank}")
        assert replayed.records.end_s[i] == pytest.approx(closed, rel=1e-12)
        assert bundled.records.end_s[i] == pytest.approx(closed, rel=1e-12)
    assert np.allclose(bundled.links["bytes"], replayed.links["bytes"], rtol=1e-12)


@pytest.mark.parametrize(
    ("preset", "options"),
    [
        ("dgx-h100", {"tp": 4, "pp": 2, "dp": 2}),
        ("dgx-h100", {"tp": 2, "pp": 1, "dp": 8}),
    ],
)
def test_a_megatron_step_with_bundles_is_near_the_per_flow_step(preset, options):
    """Megatron-Core's defaults overlap the data-parallel reduce-scatters and gathers
    with tensor-parallel collectives on the same NVLink ports: those calls run as
    bundles. The step is within 1% of the per-flow reference's, the bytes on the links
    are the reference's (conservation: bundles carry each call's bytes per link), and
    a tenth of the flow rates are computed."""
    ranks = options["tp"] * options["pp"] * options["dp"]
    workload = megatron(model="llama3-8b", micro_batch=1, global_batch=4 * options["dp"], **options)
    graph = load_topology(preset, max(1, ranks // 8))
    fast = WorkloadReplay(workload, graph).run()
    reference = WorkloadReplay(workload, graph, bundles=False).run()
    assert fast.isolated["bundled"] > 0
    assert breakdown(fast).step_s == pytest.approx(breakdown(reference).step_s, rel=0.01)
    assert sum(fast.links["bytes"]) == pytest.approx(sum(reference.links["bytes"]), rel=1e-9)
    # Work: flow rates computed (replayed calls' flows are counted, not simulated).
    assert fast.stats.recomputed_flows * 10 < reference.stats.recomputed_flows


def test_no_overlap_no_bundle_and_the_same_step():
    """Calls that are always alone are replayed exactly: bundles or not, the same run."""
    workload = megatron(model="llama3-8b", tp=8, pp=1, dp=1, micro_batch=1, global_batch=2)
    graph = load_topology("dgx-h100", 1)
    fast = WorkloadReplay(workload, graph).run()
    reference = WorkloadReplay(workload, graph, bundles=False).run()
    assert fast.isolated["bundled"] == 0
    assert np.array_equal(fast.records.end_s, reference.records.end_s)


def test_ccsim_run_exact_is_the_per_flow_reference(tmp_path, capsys):
    """`ccsim run` of a TP 2 x DP 8 step (its data-parallel rings share NVLink with the
    tensor-parallel calls): by default its title says how many calls ran as bundles;
    with --exact none does, and the step is the per-flow replay's (WorkloadReplay with
    bundles=False), within 1% of the default's."""
    import json

    from simulator.cli import main

    spec = (
        "format: ccsim-workload-spec/1\ngenerator: megatron\nmodel: llama3-8b\n"
        "tp: 2\npp: 1\ndp: 8\nmicro_batch: 1\nglobal_batch: 32\n"
    )
    path = tmp_path / "step.yaml"
    path.write_text(spec)
    assert main(["run", str(path), "--topology", "dgx-h100"]) == 0
    assert "calls sharing links run as bundles (--exact: flow by flow)" in capsys.readouterr().out
    assert main(["run", str(path), "--topology", "dgx-h100", "--exact"]) == 0
    assert "as bundles" not in capsys.readouterr().out
    steps = {}
    for flag in ([], ["--exact"]):
        assert main(["run", str(path), "--topology", "dgx-h100", "--format", "json", *flag]) == 0
        steps[bool(flag)] = json.loads(capsys.readouterr().out)[0]["step_s"]
    workload = megatron(model="llama3-8b", tp=2, pp=1, dp=8, micro_batch=1, global_batch=32)
    reference = WorkloadReplay(workload, load_topology("dgx-h100", 2), bundles=False).run()
    assert steps[True] == pytest.approx(breakdown(reference).step_s, rel=1e-12)
    assert steps[False] == pytest.approx(steps[True], rel=0.01)
