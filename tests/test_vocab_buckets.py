"""Where Megatron-Core gathers and reduces the vocabulary matrices. Buckets are filled
from the last parameter back (``_ParamAndGradBuffer`` walks ``params[::-1]``): the output
layer, registered last, is bucket 0, its gradients reduced first and its weights gathered
last; the embedding comes with the last bucket. With fp8 weights every bf16 bucket of a
model chunk (embedding, output layer, norms) joins the chunk's last fp8 bucket group, the
one of its first layers (``partition_buckets``, case 3): the output layer is gathered
before the first forward and reduced at the end (megatron/core/distributed/
param_and_grad_buffer.py lines 628-650 and 860-960 at core_v0.14.0). Worked by hand from
Llama 3 8B's shapes, one layer a bucket (MLPerf v5.1's 134,217,728-parameter buckets)."""

import pytest

from simulator.workload.generators import megatron

# Llama 3 8B's layer by hand: QKV 4096 x (32 + 2 x 8) x 128, projection 4096 x 4096,
# SwiGLU fc1 4096 x 2 x 14336 and fc2 14336 x 4096 (norm weights left out, as
# tests/test_ddp_bucket_size.py).
LAYER = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
VOCAB_MATRIX = 128256 * 4096  # the input embedding, and the untied output layer alike
NORMS = 2 * 4096  # a layer's two RMSNorm weights


def mlperf_8b_step(**options):
    """Llama 3 8B at CP 2 x DP 16, one micro-batch, fp8 with bf16 gradients over the
    distributed optimizer's overlapped buckets of 128 Mi parameters (the MLPerf v5.1 8B
    runs' layout), with ``options`` on top."""
    return megatron(
        "llama3-8b",
        tp=1,
        pp=1,
        cp=2,
        dp=16,
        global_batch=16,
        precision="fp8",
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        grad_reduce="bf16",
        replicas=True,
        shadows=True,
        bucket_size=134217728,
        **options,
    )


def dp_calls(op_name, **options):
    """Rank 0's overlapped DP ``op_name`` calls' bytes (parameter all-gathers, gradient
    reduce-scatters) of :func:`mlperf_8b_step`, in the order they are issued."""
    workload = mlperf_8b_step(**options)
    return [
        op.nbytes
        for op in workload.ops
        if op.rank == 0 and op.kind == "collective" and op.op == op_name and op.stream == "dp"
    ]


def parameter_gathers(**options):
    """The DP parameter all-gathers' bytes (:func:`dp_calls`)."""
    return dp_calls("all_gather", **options)


def gradient_reduces(**options):
    """The DP gradient reduce-scatters' bytes (:func:`dp_calls`), bf16: 2 bytes each."""
    return dp_calls("reduce_scatter", **options)


def _layer_bytes(gathers, per_param):
    """The one layer's weights each middle gather moves, norms included or not."""
    middle = gathers[1:-1]
    assert len(set(middle)) == 1
    (moved,) = set(middle)
    assert moved in (LAYER * per_param, (LAYER + NORMS) * per_param)
    return moved


def test_fp8_weights_gather_the_output_layer_first():
    """fp8 weights (one byte each): the first gather carries the embedding and the
    output layer in bf16 besides the first layer in fp8; the last carries its layer
    alone; 32 gathers, one a layer."""
    gathers = parameter_gathers(fp8_param_gather=True)
    assert len(gathers) == 32
    layer = _layer_bytes(gathers, 1)
    assert gathers[0] == pytest.approx(2 * VOCAB_MATRIX * 2 + layer)
    assert gathers[-1] == pytest.approx(layer)


def test_bf16_weights_gather_the_output_layer_last():
    """bf16 weights (no uint8 buffer: each bucket its own group, Megatron's case 2):
    the embedding first and the output layer last, as before."""
    gathers = parameter_gathers(fp8_param_gather=False)
    layer = _layer_bytes(gathers, 2)
    assert gathers[0] == pytest.approx(VOCAB_MATRIX * 2 + layer)
    assert gathers[-1] == pytest.approx(VOCAB_MATRIX * 2 + layer)


def test_mxfp8_weights_are_gathered_as_bf16_buckets():
    """MXFP8 weights are gathered in bf16 into the gradient buffer
    (reuse_grad_buf_for_mxfp8_param_ag): no fp8 buffer, so no merged group."""
    gathers = parameter_gathers(fp8_param_gather=True, fp8_recipe="mxfp8")
    layer = _layer_bytes(gathers, 2)
    assert gathers[0] == pytest.approx(VOCAB_MATRIX * 2 + layer)
    assert gathers[-1] == pytest.approx(VOCAB_MATRIX * 2 + layer)


def test_the_bytes_gathered_are_conserved():
    """Moving the output layer changes which gather carries it, not what a step moves."""
    fp8 = parameter_gathers(fp8_param_gather=True)
    assert sum(fp8) == pytest.approx(2 * VOCAB_MATRIX * 2 + 32 * _layer_bytes(fp8, 1))


def test_bf16_weights_reduce_the_output_layer_first():
    """bf16 weights: the output layer's gradients go with the first reduce-scatter (bucket
    0), the embedding's with the last; the layers' in between, 2 bytes each."""
    reduces = gradient_reduces(fp8_param_gather=False)
    assert len(reduces) == 32
    layer = _layer_bytes(reduces, 2)
    assert reduces[0] == pytest.approx(VOCAB_MATRIX * 2 + layer)
    assert reduces[-1] == pytest.approx(VOCAB_MATRIX * 2 + layer)


def test_fp8_weights_reduce_both_vocabulary_matrices_last():
    """fp8 weights: the merged group (first layers, embedding, output layer) is reduced
    once all its gradients are ready, at the end of the backward."""
    reduces = gradient_reduces(fp8_param_gather=True)
    layer = _layer_bytes(reduces, 2)
    assert reduces[0] == pytest.approx(layer)
    assert reduces[-1] == pytest.approx(2 * VOCAB_MATRIX * 2 + layer)
    assert sum(reduces) == pytest.approx(sum(gradient_reduces(fp8_param_gather=False)))
