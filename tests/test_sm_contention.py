"""Communication holding multiprocessors (``run_workload(sm_contention=True)``).

Sources: NCCL launches one CTA per channel (src/enqueue.cc line 1553 at v2.28.3-1,
``dim3 grid = {(unsigned)nChannels, 1, 1}``), each resident on one SM for the kernel's
life; an H100 SXM has 132 SMs (NVIDIA H100 Tensor Core GPU datasheet). A compute op
that overlaps a call of c channels therefore runs on 132 - c SMs: at (132 - c) / 132 of
its speed, worked by hand below."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.trace import load_workload

H100_SMS = 132  # NVIDIA H100 SXM datasheet


def _graph():
    graph = ring_graph(2, 50e9, 1e-6)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    return graph


def _trace(channels: int, compute_s: float = 0.010) -> dict:
    """Each of 2 ranks computes ``compute_s`` on its compute stream while an all-reduce
    of 64 MB over both runs on the "dp" stream from time 0."""
    ops = []
    for r in (0, 1):
        ops.append(
            {
                "id": f"c{r}",
                "rank": r,
                "kind": "compute",
                "duration": compute_s,
                "stream": "compute",
            }
        )
        ops.append(
            {
                "id": f"a{r}",
                "rank": r,
                "kind": "collective",
                "op": "all_reduce",
                "group": "g",
                "bytes": 64e6,
                "stream": "dp",
                "channels": channels,
            }
        )
    return {
        "format": "ccsim-workload/1",
        "name": "overlap",
        "ranks": 2,
        "groups": {"g": {"kind": "DP", "ranks": [0, 1]}},
        "ops": ops,
    }


@pytest.mark.parametrize("channels", [1, 8, 32])
def test_compute_slows_by_the_calls_ctas(channels):
    """The all-reduce ends at T (its time is the same either way: contention slows
    compute only); the compute op did T (132 - c) / 132 of its 10 ms by then and the
    rest at full speed: it ends at 10 ms + T c / 132."""
    workload = load_workload(_trace(channels))
    plain, _ = run_workload(workload, _graph(), algorithm="ring")
    held, _ = run_workload(
        load_workload(_trace(channels)), _graph(), algorithm="ring", sm_contention=True
    )
    ids = {op.id: op.index for op in workload.ops}
    t = plain.records.end_s[ids["a0"]]
    assert held.records.end_s[ids["a0"]] == pytest.approx(t)
    assert 0 < t < 0.010  # the call ends inside the compute op
    assert plain.records.end_s[ids["c0"]] == pytest.approx(0.010)
    assert held.records.end_s[ids["c0"]] == pytest.approx(0.010 + t * channels / H100_SMS)


def test_a_call_after_the_compute_changes_nothing():
    """The call runs wholly after the compute op (it depends on it): no overlap, so the
    same step to the bit."""
    trace = _trace(16, compute_s=0.001)
    for op in trace["ops"]:
        if op["kind"] == "collective":
            op["deps"] = [f"c{op['rank']}"]
    _, a = run_workload(load_workload(trace), _graph(), algorithm="ring")
    _, b = run_workload(load_workload(trace), _graph(), algorithm="ring", sm_contention=True)
    assert a.step_s == b.step_s


def test_one_way_to_slow_compute():
    with pytest.raises(CcsimError, match="give one"):
        run_workload(load_workload(_trace(1)), _graph(), comm_slowdown=0.1, sm_contention=True)


def _small(**extra):
    from simulator.workload.generators import Transformer

    model = Transformer(layers=4, hidden=1024, seq=2048, vocab=32000, heads=8)
    return dict(
        model=model,
        micro_batch=1,
        precision="bf16",
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        grad_reduce="bf16",
        **extra,
    )


def test_replicas_and_shadows_stand_for_all_ranks_with_contention():
    """TP 2 x CP 2 x DP 4 on two DGX H100s: one replica and the TP/CP masters standing
    for all give the full build's step to the bit, with the SMs held as without."""
    from simulator.workload.generators import megatron

    options = _small(tp=2, pp=1, cp=2, dp=4, global_batch=4)
    full = megatron(**options, replicas=False, shadows=False)
    short = megatron(**options, replicas=True, shadows=True)
    a = run_workload(full, "dgx-h100", nodes=2, sm_contention=True)[1].step_s
    b = run_workload(short, "dgx-h100", nodes=2, sm_contention=True)[1].step_s
    assert a == b
    assert a > run_workload(full, "dgx-h100", nodes=2)[1].step_s  # DP calls overlap compute


def test_the_steady_state_shortcut_holds_with_contention():
    """PP 2, 16 micro-batches: the steady state replayed once is the full step within
    the shortcut's own tolerance (float sums in another order), as without contention."""
    from simulator.workload.generators import megatron
    from simulator.workload.steady import STEP_TOLERANCE, run_steady

    options = _small(tp=2, pp=2, dp=2, global_batch=32)
    full = run_workload(
        megatron(**options, replicas=False, shadows=False),
        "dgx-h100",
        nodes=1,
        sm_contention=True,
    )[1].step_s
    steady = run_steady(
        {**options, "replicas": True, "shadows": True},
        "dgx-h100",
        nodes=1,
        shortcut=True,
        sm_contention=True,
    )
    assert steady.simulated < 16
    assert steady.step_s == pytest.approx(full, rel=STEP_TOLERANCE, abs=0)


def test_host_work_is_not_slowed_by_held_sms():
    """An op on the "host" stream is the CPU's work (launches, Python): a call in flight
    holding 32 SMs leaves its 10 ms as they are, while the GPU's compute slows."""
    trace = _trace(32)
    trace["ops"].append(
        {"id": "h0", "rank": 0, "kind": "compute", "duration": 0.010, "stream": "host"}
    )
    workload = load_workload(trace)
    run, _ = run_workload(workload, _graph(), algorithm="ring", sm_contention=True)
    ids = {op.id: op.index for op in workload.ops}
    assert run.records.end_s[ids["h0"]] == 0.010
    assert run.records.end_s[ids["c0"]] > 0.010


def test_validation_holds_sms_where_the_run_pins_nccls_cta_floor(monkeypatch):
    """The MLPerf v5.1 8B rows export NCCL_MIN_CTAS=16 (config_common.sh line 85): they
    replay with contention; a row without the floor (DGX Cloud's Llama 3 8B) without."""
    import simulator.workload.steady as steady
    from simulator.validate.training import load_runs, simulate_run

    seen = {}

    def fake(options, topology, **arguments):
        seen["sm"] = arguments.get("sm_contention")
        raise CcsimError("stop here")

    monkeypatch.setattr(steady, "run_steady", fake)
    runs = {run.id: run for run in load_runs()[0]}
    simulate_run(runs["mlperf-v5.1-llama31-8b-b200-fp8-32"])
    assert seen["sm"] is True
    simulate_run(runs["dgxc-v25.01-llama3-8b-h100-fp8-8"])
    assert seen["sm"] is False


def test_point_to_point_transfers_are_left_out():
    """A send on its own stream beside a 10 ms compute op leaves it at 10 ms (see
    WorkloadReplay's sm_contention: one CTA, under 1%, left out)."""
    trace = {
        "format": "ccsim-workload/1",
        "name": "p2p",
        "ranks": 2,
        "ops": [
            {"id": "c0", "rank": 0, "kind": "compute", "duration": 0.010},
            {"id": "s", "rank": 0, "kind": "send", "peer": 1, "bytes": 64e6, "stream": "p2p"},
            {"id": "r", "rank": 1, "kind": "recv", "peer": 0, "bytes": 64e6, "stream": "p2p"},
        ],
    }
    workload = load_workload(trace)
    run, _ = run_workload(workload, _graph(), algorithm="ring", sm_contention=True)
    ids = {op.id: op.index for op in workload.ops}
    assert 0 < run.records.end_s[ids["s"]] < 0.010  # the transfer overlaps the compute
    assert run.records.end_s[ids["c0"]] == 0.010
