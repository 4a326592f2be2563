"""The host's distributed-optimizer step after the gradient norm's ``.item()``
(``megatron(optimizer_host=True)``, :mod:`simulator.workload.optimizer_host`).

Sources: Megatron-LM 25.09-alpha.rc1 (the MLPerf v5.1 Llama 3.1 8B image's
MCORE_REVISION): megatron/core/optimizer/clip_grads.py line 133 (``total_norm.item()``),
distrib_optimizer.py lines 2424-2453 (the fp8 weights cast by ``quantize_param_shard``,
the others copied); Transformer Engine v2.8 transformer_engine/pytorch/tensor/utils.py
lines 227-332 (``_cast_master_weights_to_fp8_current_scaling``: a loop over every fp8
weight of the model). Per operation: TE issue #2053's 13.48 us (x86 DGX) and 37.08 us
(Grace) a launch, NVIDIA/cutlass #3275's 2.15 us a tensor operation on x86
(simulator/workload/host.py). The counts below are worked by hand from those lines."""

import math

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.generators import Transformer, megatron
from simulator.workload.optimizer_host import optimizer_host_ops, shards_met
from tests.test_vocab_buckets import mlperf_8b_step

X86_LAUNCH = 13.48e-6  # TE issue #2053, DGX H100 (Xeon 8480C)
X86_TENSOR = 2.15e-6  # NVIDIA/cutlass issue #3275, x86 B200 host


def test_shards_meet_the_boundaries_they_hold():
    """Four tensors of 10, 20, 30, 40 elements (100) in 4 shards of 25: shard 0 meets
    tensors 0 and 1 (0-25), shard 1 tensors 1 and 2 (25-50), shard 2 tensors 2 and 3
    (50-75), shard 3 tensor 3: 7 in all, 7/4 on average = 1 + 3/4."""
    assert shards_met(4, 4) == 7 / 4
    assert shards_met(1, 64) == 1.0  # one tensor: every shard is part of it


def test_llama_8b_fp8_counts_by_hand():
    """The MLPerf 8B at TP 1, CP 2 x DP 16 (32 shards), 134M-parameter buckets (one
    layer of 218M each): per rank 32 buckets of 4 fp8 weights (QKV, projection, FC1,
    FC2), 35 of them met (32 + 3 boundaries / 32 x 32 buckets), and 67 bf16 tensors
    (64 norms, the final norm, embedding, output), 1 + 66/32 met.
    Launches: Adam's 2 groups, the cast's 4 fixed and 2 x 35, 3.0625 copies, 2 buffers
    zeroed, 1 graph replay. Tensor operations: 3 x 128 + 3 x 35 + 2 x 3.0625."""
    ops = optimizer_host_ops([4] * 32, 67, 32, fp8_current=True)
    assert ops.launches == 2 + 4 + 2 * 35 + (1 + 66 / 32) + 2 + 1
    assert ops.tensors == 3 * 128 + 3 * 35 + 2 * (1 + 66 / 32)
    # On the x86 DGX B200: 82.0625 x 13.48 us + 495.125 x 2.15 us = 2.171 ms.
    assert ops.seconds(X86_LAUNCH) == pytest.approx(82.0625 * 13.48e-6 + 495.125 * 2.15e-6)
    assert ops.seconds(X86_LAUNCH) == pytest.approx(2.1707e-3, rel=1e-4)


def test_bf16_weights_are_copied_not_cast():
    """bf16 weights: two buckets of 6 tensors over 2 shards meet 2 x 3.5 = 7, the
    vocabulary bucket of 3 meets 2; launches 2 (Adam) + 9 copies + 1 buffer + 1 (the
    next step's first), tensor operations 2 x 9."""
    ops = optimizer_host_ops([6, 6], 3, 2, fp8_current=False)
    assert (ops.launches, ops.tensors) == (13.0, 18.0)


def test_bad_shards_are_an_error():
    with pytest.raises(CcsimError, match="shards"):
        optimizer_host_ops([4], 1, 0, fp8_current=True)
    with pytest.raises(CcsimError, match="host_op_s"):
        optimizer_host_ops([4], 1, 1, fp8_current=True).seconds(-1.0)


def _llama_8b_step(**extra):
    """The MLPerf v5.1 8B layout with fp8 parameter gathers (test_vocab_buckets')."""
    return mlperf_8b_step(fp8_param_gather=True, **extra)


def test_the_generator_times_the_hand_count():
    """The MLPerf 8B layout's host op lasts the hand-worked 2.171 ms on x86, after the
    last DP reduce-scatter, on the host stream; Grace's launch (37.08 us) makes it
    82.0625 x 37.08 us + 495.125 x (350/128) us."""
    workload = _llama_8b_step(optimizer_host=True)
    host = [op for op in workload.ops if op.rank == 0 and op.id.endswith(".opt.host")]
    assert len(host) == 1 and host[0].stream == "host"
    assert host[0].duration == pytest.approx(2.1707e-3, rel=1e-4)
    deps = {workload.ops[i].id for i in host[0].deps}
    assert "r0.dp.31" in deps  # the last bucket's reduce-scatter (the embeddings' group)
    grace = _llama_8b_step(optimizer_host=True, host_op_s=37.08e-6)
    host = next(op for op in grace.ops if op.rank == 0 and op.id.endswith(".opt.host"))
    assert host.duration == pytest.approx(82.0625 * 37.08e-6 + 495.125 * 350e-6 / 128)
    assert not [op for op in _llama_8b_step().ops if op.id.endswith(".opt.host")]


def _graph(ranks: int):
    graph = ring_graph(ranks, 100e9, 1e-6)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    return graph


def test_the_step_ends_when_the_host_has():
    """Two DP ranks of a small bf16 model (2 layers, one 40M-parameter bucket: both
    layers): the GPU's optimizer step (1/2 of the state) is far shorter than the host's
    walk at 1 ms a launch, so the step ends at the reduce-scatter's end plus the host's
    count: Adam's 2, the bucket's 12 tensors met 1 + 11/2 times and the final norm once
    (copies), 1 buffer zeroed, 1 next launch."""
    model = Transformer(layers=2, hidden=512, seq=256, vocab=0, heads=8)
    options = dict(
        tp=1,
        pp=1,
        dp=2,
        global_batch=2,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=False,
        grad_reduce="bf16",
    )
    plain = megatron(model, **options)
    timed = megatron(model, **options, optimizer_host=True, host_op_s=1e-3, host_tensor_op_s=0.0)
    run, breakdown = run_workload(timed, _graph(2))
    _, before = run_workload(plain, _graph(2))
    ops = {op.id: op.index for op in timed.ops}
    reduce_end = run.records.end_s[ops["r0.dp.0"]]
    launches = 2 + (1 + 11 / 2) + 1 + 1 + 1
    assert run.records.end_s[ops["r0.opt.host"]] == pytest.approx(reduce_end + launches * 1e-3)
    assert breakdown.step_s == pytest.approx(reduce_end + launches * 1e-3)
    assert breakdown.step_s > before.step_s
    assert math.isfinite(before.step_s)


def test_validation_prices_the_hosts_cpu():
    """Every row asks for the optimizer's host step at its host CPU's launch cost: 37.08
    us on a GB200's Grace, 13.48 us on a DGX B200's x86 (TE issue #2053)."""
    from simulator.validate.training import generator_options, load_runs

    runs = {run.id: run for run in load_runs()[0]}
    grace = generator_options(runs["mlperf-v5.1-llama31-8b-gb200-fp8-72"])
    x86 = generator_options(runs["mlperf-v5.1-llama31-8b-b200-fp8-32"])
    assert grace["optimizer_host"] and x86["optimizer_host"]
    assert (grace["host_op_s"], x86["host_op_s"]) == (37.08e-6, 13.48e-6)
