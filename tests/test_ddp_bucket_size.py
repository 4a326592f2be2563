"""Megatron's gradient bucket size as a run sets it (``bucket_size``, NeMo's
optim.bucket_size): how many DP reduce-scatters a step issues and what the last one
carries, worked by hand from Llama 3 8B's shapes and checked against the bucket sizes the
MLPerf v5.1 logs print (Oracle's and Verda's result_0.txt of llama31_8b)."""

import math

import pytest

from simulator.errors import CcsimError
from simulator.validate.training import generator_options, load_runs
from simulator.workload.generators import megatron

# Llama 3 8B's layer by hand: QKV 4096 x (32 + 2 x 8) x 128, projection 4096 x 4096,
# SwiGLU fc1 4096 x 2 x 14336 and fc2 14336 x 4096 (norm weights left out).
LAYER = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
VOCAB_MATRIX = 128256 * 4096  # the input embedding, and the untied output layer alike


def dp_reduce_scatters(bucket_size, dp=16):
    """The DP gradient reduce-scatters of rank 0 of Llama 3 8B at CP 2 x ``dp``, one
    micro-batch, bf16 gradients (the MLPerf v5.1 8B runs' layout)."""
    workload = megatron(
        "llama3-8b",
        tp=1,
        pp=1,
        cp=2,
        dp=dp,
        global_batch=dp,
        precision="fp8",
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        grad_reduce="bf16",
        fp8_param_gather=True,
        replicas=True,
        shadows=True,
        bucket_size=bucket_size,
    )
    return [
        op
        for op in workload.ops
        if op.rank == 0
        and op.kind == "collective"
        and op.op == "reduce_scatter"
        and op.stream == "dp"
    ]


def test_the_layer_is_what_the_logs_bucket():
    """Verda's log buckets 218103808 elements at a time at bucket_size 134217728 (one
    layer's worth, straddling two layers), Oracle's 872415232 = 4 layers at 768000000:
    a bucket closes at the first parameter that reaches the size, so ceil(size / layer)
    whole layers here."""
    assert LAYER == 218103808
    assert math.ceil(134217728 / LAYER) == 1 and math.ceil(768000000 / LAYER) == 4
    assert 4 * LAYER == 872415232


@pytest.mark.parametrize(
    ("bucket_size", "layers"),
    [(768000000, 4), (134217728, 1), (None, 1)],  # None: max(40M, 1M x 32) = 40M
)
def test_buckets_follow_the_size(bucket_size, layers):
    """32 layers in buckets of ``layers``: 32 / layers reduce-scatters, each of its
    layers' bf16 gradients; the last (the first layers) also carries the embedding's
    and the output layer's (2 bytes each)."""
    ops = dp_reduce_scatters(bucket_size)
    assert len(ops) == 32 // layers
    assert [op.nbytes for op in ops[:-1]] == [layers * LAYER * 2] * (32 // layers - 1)
    assert ops[-1].nbytes == (layers * LAYER + 2 * VOCAB_MATRIX) * 2


def test_the_default_counts_dp_not_cp():
    """Megatron-Core's default, max(40M, 1M x DP) with DP not counting CP
    (distributed_data_parallel.py:62-65, parallel_state.py:1603 at core_v0.14.0): at CP 2
    x DP 128 it is 128M, one layer a bucket (1M x 256 would make 256M, two)."""
    assert math.ceil(128e6 / LAYER) == 1 and math.ceil(256e6 / LAYER) == 2
    assert len(dp_reduce_scatters(None, dp=128)) == 32


@pytest.mark.parametrize("bad", [0, -5, 1.5e8, "768M", True])
def test_a_bad_bucket_size_names_the_field(bad):
    with pytest.raises(CcsimError, match="bucket_size"):
        megatron("llama3-8b", tp=1, pp=1, cp=2, dp=2, global_batch=2, bucket_size=bad)


def test_validate_reads_the_rows_bucket():
    """Rows that state ddp_bucket_size hand it to the generator; the others keep
    Megatron's default (None)."""
    runs = {run.id: run for run in load_runs()[0]}
    assert (
        generator_options(runs["mlperf-v5.1-llama31-8b-b200-fp8-64-oracle"])["bucket_size"]
        == 768000000
    )
    assert (
        generator_options(runs["mlperf-v5.1-llama31-8b-b200-fp8-64-verda"])["bucket_size"]
        == 134217728
    )
    assert "bucket_size" not in generator_options(runs["mlperf-v5.1-llama31-8b-b200-fp8-16"])
