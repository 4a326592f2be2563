"""Transformer Engine 2.x current scaling's blocking amax all-reduce over the TP group
(``megatron(tp_amax_seconds=...)``, :func:`simulator.workload.generators.tp_amax_calls`,
:func:`simulator.validate.training.tp_amax_seconds`).

Sources: a sequence-parallel column-parallel module's input quantizer and a row-parallel
module's output-gradient quantizer reduce their amax over the TP group
(transformer_engine/pytorch/module/linear.py ``_customize_quantizers_float8_current_
scaling``, lines 1649-1673 at v2.9; layernorm_linear.py 1755-1801; layernorm_mlp.py
2125-2177), and the quantizer waits for that all-reduce before casting
(csrc/quantizer.cpp lines 521-528 at v2.9: ``allreduce(...)->wait()``). Megatron-Core's
dense layer is QKV and FC1 column-parallel, projection and FC2 row-parallel: two calls a
layer forward, two backward; GroupedLinear (routed experts) reduces none."""

import dataclasses

import pytest
from test_amax_wait import _alone, _ring

from simulator.errors import CcsimError
from simulator.validate.training import (
    TP_AMAX_BYTES,
    _tp_amax_applies,
    generator_options,
    load_runs,
    tp_amax_seconds,
)
from simulator.workload import run_workload
from simulator.workload.generators import Transformer, megatron, tp_amax_calls

EVEN = dataclasses.replace(Transformer(layers=4, hidden=1024, seq=512, vocab=32000), vocab=0)
FP8 = dict(precision="fp8", fp8_recipe="tensorwise")


def _tp_amax_ops(workload) -> list:
    return [op for op in workload.ops if op.id.endswith(".tpamax")]


@pytest.mark.parametrize(
    "dense, moe, forward, recompute, shared, calls",
    [
        (1, 0, True, "none", False, 2),  # QKV and FC1 inputs
        (1, 0, False, "none", False, 2),  # projection and FC2 output gradients
        (1, 0, False, "selective", False, 2),  # the attention core re-runs no linear
        (1, 0, False, "full", False, 4),  # the forward's two again
        (0, 1, True, "none", False, 1),  # QKV only: the experts are GroupedLinear
        (0, 1, False, "none", True, 2),  # projection and the shared experts' FC2
        (3, 2, True, "none", False, 8),
    ],
)
def test_calls_a_pass_makes_by_hand(dense, moe, forward, recompute, shared, calls):
    got = tp_amax_calls(dense, moe, forward=forward, recompute=recompute, shared_experts=shared)
    assert got == calls


def test_the_waits_lengthen_a_serial_step_by_their_sum():
    """TP 2, no pipeline or data parallelism, TP collectives after the GEMMs on the
    compute stream (no overlap): every op of a rank is on one chain, so the step grows
    by the calls' time exactly: 4 micro-batches x 4 layers x (2 forward + 2 backward)
    calls of 10 us = 640 us; with full recomputation the backward makes 4 a layer,
    4 x 4 x 6 x 10 us = 960 us."""
    graph = _ring(2, 100e9, 1e-6)
    kw = dict(tp=2, pp=1, dp=1, global_batch=4, tp_comm_overlap=False, **FP8)

    def step(**extra) -> float:
        return run_workload(megatron(EVEN, **kw, **extra), graph)[1].step_s

    assert step(tp_amax_seconds=1e-5) - step() == pytest.approx(640e-6, rel=1e-9)
    full = step(recompute="full", tp_amax_seconds=1e-5) - step(recompute="full")
    assert full == pytest.approx(960e-6, rel=1e-9)


def test_one_wait_a_pass_on_the_compute_stream_of_the_pass_layers_calls():
    """TP 2 x PP 2 (2 layers a stage), 4 micro-batches: 4 ranks x 4 micro-batches x a
    forward and a backward = 32 waits, each 2 layers x 2 calls x 10 us = 40 us."""
    waited = megatron(EVEN, tp=2, pp=2, dp=1, global_batch=4, **FP8, tp_amax_seconds=1e-5)
    ops = _tp_amax_ops(waited)
    assert len(ops) == 32
    for op in ops:
        assert op.kind == "compute" and op.stream == "compute"
        assert op.duration == pytest.approx(4e-5, rel=1e-12)


@pytest.mark.parametrize(
    "other",
    [
        dict(precision="bf16", fp8_recipe="tensorwise"),
        dict(fp8_recipe="delayed"),  # the amaxes of the history: amax_reduction's
        dict(fp8_recipe="mxfp8"),  # block scales, no per-tensor amax
        dict(sequence_parallel=False),  # nothing gathered in fp8
        dict(tp=1, dp=2),
    ],
)
def test_no_wait_where_no_amax_is_reduced_over_tp(other):
    kw = dict(tp=2, pp=1, dp=1, global_batch=4, **FP8, tp_amax_seconds=1e-5)
    assert not _tp_amax_ops(megatron(EVEN, **{**kw, **other}))


def test_without_seconds_the_step_is_unchanged():
    kw = dict(tp=2, pp=2, dp=1, global_batch=4, **FP8)
    plain, zero = megatron(EVEN, **kw), megatron(EVEN, **kw, tp_amax_seconds=0.0)
    assert not _tp_amax_ops(plain) and not _tp_amax_ops(zero)
    assert [op.id for op in plain.ops] == [op.id for op in zero.ops]


@pytest.mark.parametrize("bad", [-1e-6, float("inf"), float("nan"), "10us", True, (1e-5,)])
def test_bad_tp_amax_seconds_is_one_clear_error(bad):
    with pytest.raises(CcsimError, match="tp_amax_seconds must be one time in seconds"):
        megatron(EVEN, tp=2, pp=1, dp=1, global_batch=4, **FP8, tp_amax_seconds=bad)


def test_the_measured_call_is_one_fp32_all_reduce_over_the_first_tp_group():
    """tp_amax_seconds replays one 4-byte all-reduce over ranks 0 and 1 (the first TP
    group; TP is the fastest rank index) of an 8-rank TP 2 x PP 2 x DP 2 job on a ring
    of 5 us links: the same as that call on its own, built by test_amax_wait's helper;
    latency-bound (more than one link's latency, under a microsecond of its 4 bytes'
    wire time)."""
    graph = _ring(8, 1e9, 5e-6)
    options = dict(model=EVEN, tp=2, pp=2, dp=2, **FP8)
    measured = tp_amax_seconds(options, graph, nccl={"algorithm": "ring"})
    assert TP_AMAX_BYTES == 4
    assert measured == _alone(graph, [0, 1], 4)
    assert measured > 5e-6


def test_current_scaling_rows_with_tp_make_the_calls():
    """The published rows whose TE reduces over TP: fp8 rows stating current (per-tensor)
    scaling with TP > 1 and sequence parallelism, other than multi-head latent
    attention models; no delayed-scaling, MXFP8 or bf16 row."""
    runs, _ = load_runs()
    applies = []
    for run in runs:
        options = generator_options(run)
        stated = str(run.options.get("fp8_recipe", ""))
        if _tp_amax_applies(options):
            assert run.precision == "fp8" and stated == "tensorwise", run.id
            assert run.tp > 1 and not run.model.is_mla, run.id
            applies.append(run.id)
        elif run.precision == "fp8" and stated == "tensorwise" and run.tp > 1:
            assert run.model.is_mla or options.get("sequence_parallel") is False, run.id
    assert "bridge-25.11-llama31-405b-h100-fp8-1024" in applies
    assert not [i for i in applies if "dgxc" in i or "bf16" in i]
