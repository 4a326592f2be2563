"""Transformer Engine's delayed-scaling amax all-reduce as a timed wait
(``megatron(amax_seconds=...)``, :func:`simulator.validate.training.amax_seconds`), and
the published runs it applies to.

Sources: Transformer Engine 1.6 and later reduce every registered fp8 module's amaxes at
each ``fp8_autocast`` exit and after each pass's backward, ``all_reduce(...,
async_op=False)`` over the fp8 group (transformer_engine/pytorch/fp8.py,
``reduce_and_update_fp8_tensors``, v1.6 lines 317-422, v1.10 lines 316-422); Megatron-Core
hands it the stage's TP x DP x CP ranks (``get_amax_reduction_group``). Up to TE 1.5 it
was asynchronous and, with ``NVTE_DP_AMAX_REDUCE_INTERVAL=0`` (which DGX Cloud's v25.01
launchers still export), over TP only (fp8.py lines 357-361 at v1.5)."""

import dataclasses

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.validate.training import (
    AMAX_STAGE_SOURCES_READ,
    amax_seconds,
    generator_options,
    load_runs,
)
from simulator.workload import run_workload
from simulator.workload.generators import AMAX_BYTES_PER_LAYER, Transformer, megatron
from simulator.workload.trace import load_workload

EVEN = dataclasses.replace(Transformer(layers=16, hidden=1024, seq=512, vocab=32000), vocab=0)


def _ring(ranks: int, bandwidth: float, latency: float) -> object:
    graph = ring_graph(ranks, bandwidth, latency)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    return graph


def _alone(graph, ranks: list[int], nbytes: float) -> float:
    """One all-reduce of ``nbytes`` over ``ranks`` replayed on its own (ring)."""
    trace = {
        "format": "ccsim-workload/1",
        "name": "amax",
        "ranks": max(ranks) + 1,
        "groups": {"g": {"kind": "DP", "ranks": ranks}},
        "ops": [
            {
                "id": f"a{r}",
                "rank": r,
                "kind": "collective",
                "op": "all_reduce",
                "group": "g",
                "bytes": nbytes,
                "stream": "compute",
            }
            for r in ranks
        ],
    }
    return run_workload(load_workload(trace), graph, algorithm="ring")[1].step_s


def test_the_wait_adds_each_calls_time_alone_after_every_pass_but_the_last():
    """DP 2, no pipeline: the step is a chain of 4 forwards and 4 backwards, each
    followed by the amax all-reduce, then the gradients' reduce on the DP stream (far
    longer than one call, so the last backward's call hides behind it). With each call a
    wait of its time alone, the step grows by 4 forward and 3 backward calls' times,
    exactly; the spanning collective (the full simulation) by the same plus its last
    call's bytes on the links the gradients share (2 ranks: twice half the buffer each
    way at 1 GB/s)."""
    m = dataclasses.replace(EVEN, layers=2)
    kw = dict(tp=1, pp=1, dp=2, global_batch=8, precision="fp8", fp8_recipe="delayed")
    graph = _ring(2, 1e9, 5e-6)
    forward = _alone(graph, [0, 1], 2 * AMAX_BYTES_PER_LAYER[True])
    backward = _alone(graph, [0, 1], 2 * AMAX_BYTES_PER_LAYER[False])
    assert forward > backward > 5e-6  # latency-bound: two ring steps over 5 us links

    def step(**extra) -> float:
        return run_workload(megatron(m, **kw, **extra), graph, algorithm="ring")[1].step_s

    without = step(amax_reduction="off")
    waited = step(amax_reduction="stage", amax_seconds=(forward, backward))
    collective = step(amax_reduction="stage")
    assert waited - without == pytest.approx(4 * forward + 3 * backward, rel=1e-9)
    last_bytes = 2 * AMAX_BYTES_PER_LAYER[False] / 1e9
    assert collective - waited == pytest.approx(last_bytes, rel=1e-6)


def test_the_wait_is_a_compute_op_and_no_group_spans_the_replicas():
    m = dataclasses.replace(EVEN, layers=4)
    kw = dict(tp=2, pp=2, dp=2, global_batch=8, precision="fp8", fp8_recipe="delayed")
    waited = megatron(m, **kw, amax_reduction="stage", amax_seconds=(3e-5, 2e-5))
    amax = [op for op in waited.ops if ".amax." in op.id]
    assert len(amax) == 8 * 2 * 4  # 8 ranks, a forward and a backward of 4 micro-batches
    for op in amax:
        assert op.kind == "compute" and op.stream == "compute"
        assert op.duration == (3e-5 if ".amax.f" in op.id else 2e-5)
    assert not [name for name in waited.groups if name.startswith("amax.")]
    # The same calls as the collective path builds, one for one.
    spanning = megatron(m, **kw, amax_reduction="stage")
    assert sorted(op.id for op in amax) == sorted(op.id for op in spanning.ops if ".amax." in op.id)
    # Nothing to wait for in bf16 or with current scaling.
    for other in (dict(precision="bf16"), dict(fp8_recipe="tensorwise")):
        args = {**kw, **other, "amax_reduction": "stage", "amax_seconds": (3e-5, 2e-5)}
        assert not [op for op in megatron(m, **args).ops if ".amax." in op.id]


@pytest.mark.parametrize(
    "bad", [(1e-5,), (-1e-5, 1e-5), ("1ms", 1e-5), "fast", (1e-5, float("inf"))]
)
def test_bad_amax_seconds_is_one_clear_error(bad):
    with pytest.raises(CcsimError, match="amax_seconds must be two times in seconds"):
        megatron(
            EVEN,
            tp=2,
            pp=1,
            dp=2,
            global_batch=8,
            precision="fp8",
            fp8_recipe="delayed",
            amax_reduction="stage",
            amax_seconds=bad,
        )


def test_the_measured_call_is_the_stage_groups_all_reduce_alone():
    """amax_seconds replays one all-reduce over the first stage's TP x DP ranks (here 4
    of 8 on a ring of 1 GB/s, 5 us links) of the stage's layers' amaxes: the same as
    that call alone, by hand."""
    m = dataclasses.replace(EVEN, layers=4)
    options = dict(model=m, tp=2, pp=2, dp=2, amax_reduction="stage")
    graph = _ring(8, 1e9, 5e-6)
    fwd, bwd = amax_seconds(options, graph, nccl={"algorithm": "ring"})
    assert fwd == _alone(graph, [0, 1, 2, 3], 2 * AMAX_BYTES_PER_LAYER[True])
    assert bwd == _alone(graph, [0, 1, 2, 3], 2 * AMAX_BYTES_PER_LAYER[False])
    tp_only = amax_seconds({**options, "amax_reduction": "tp"}, graph, nccl={"algorithm": "ring"})
    assert tp_only[0] == _alone(graph, [0, 1], 2 * AMAX_BYTES_PER_LAYER[True])


def test_delayed_scaling_rows_of_te_1_6_sources_reduce_over_the_stage(monkeypatch):
    """With the sources read switched on, DGX Cloud's and NeMo 24.07's delayed-scaling
    fp8 rows reduce their amaxes over the stage; their bf16 twins and every other
    source's rows are built as before. Off by default (AMAX_STAGE_SOURCES empty: the
    held-out median would rise), no row reduces."""
    import simulator.validate.training as training

    assert not [r.id for r in load_runs()[0] if r.options.get("amax_reduction")]
    monkeypatch.setattr(training, "AMAX_STAGE_SOURCES", AMAX_STAGE_SOURCES_READ)
    runs, _ = load_runs()
    seen = {"stage": 0, "none": 0}
    for run in runs:
        options = generator_options(run)
        stage = options.get("amax_reduction") == "stage"
        expected = (
            run.kind in AMAX_STAGE_SOURCES_READ
            and run.precision == "fp8"
            and options.get("fp8_recipe") == "delayed"
        )
        assert stage == expected, run.id
        seen["stage" if stage else "none"] += 1
    assert seen["stage"] >= 60 and seen["none"] >= 200  # 63 and 243 at this commit


def test_the_wait_matches_the_spanning_collective_in_a_pipelined_step():
    """Interleaved PP 2 x VP 2, TP 4, DP 4 on four DGX H100 (the amax group, a stage's 16
    ranks, crosses servers): the step with each call a wait of its time alone (the
    replicas simulated once) lands within a quarter of one call of the full simulation
    (every replica, the spanning all-reduce among the other traffic; its calls carry a
    chunk's 2 layers' amaxes where Transformer Engine's, and the wait's, carry the
    stage's 4): 3.2 us of 16.3 ms here, where the calls add 0.95 ms, 20 to 64 calls
    (a rank's 32 passes, on more than one stage's critical path)."""
    from simulator.workload.steady import run_steady

    m = dataclasses.replace(Transformer(layers=8, hidden=2048, seq=2048, vocab=32000), vocab=0)
    options = dict(
        model=m,
        tp=4,
        pp=2,
        dp=4,
        global_batch=32,
        precision="fp8",
        fp8_recipe="delayed",
        virtual_stages=2,
        replicas=True,
        amax_reduction="stage",
    )
    call = amax_seconds(options, "dgx-h100", nodes=4)
    full = run_steady(dict(options), "dgx-h100", nodes=4, shortcut=False).step_s
    waited = run_steady(dict(options, amax_seconds=call), "dgx-h100", nodes=4).step_s
    off = run_steady(dict(options, amax_reduction="off"), "dgx-h100", nodes=4).step_s
    assert abs(waited - full) < 0.25 * call[0]
    assert 20 * call[0] < full - off < 64 * call[0]
