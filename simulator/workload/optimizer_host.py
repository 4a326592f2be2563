"""The host's side of Megatron-Core's distributed-optimizer step: what the CPU does
between the gradient norm's synchronisation and the next step's first launch.

With gradient clipping (``clip_grad`` > 0: Megatron-Core's default 1.0, and the
MLPerf Llama 3.1 8B ``pretrain.py``'s ``OptimizerConfig(clip_grad=1.0)``) every step
reads the gradient norm on the host: ``get_grad_norm_fp32`` ends with
``total_norm.item()`` (megatron/core/optimizer/clip_grads.py line 133 at Megatron-LM
25.09-alpha.rc1, the release NeMo 25.09's MLPerf image builds), which waits for the
GPU to finish the step's backward, its gradient reduce-scatters and the norm's
all-reduce. From then on the GPU has nothing queued: it waits while the host launches
the optimizer's kernels one by one and, with a whole-step CUDA graph, replays the next
step's graph at the end. Those launches are counted here from the source, one entry per
PyTorch operation or library call that launches work on the GPU, and, apart, the tensor
operations that launch nothing (views, slices, tensor objects), as
:mod:`simulator.workload.host` counts an MoE layer's; each is priced at the host CPU's
measured cost per operation (:data:`~simulator.workload.host.HOST_OP_S_BY_CPU`,
:data:`~simulator.workload.host.HOST_TENSOR_OP_S_BY_CPU`).

Counted (Megatron-LM 25.09-alpha.rc1, Transformer Engine v2.8):

* Adam: Transformer Engine's ``FusedAdam.step`` calls ``multi_tensor_adam`` once per
  parameter group for fp32 parameters (transformer_engine/pytorch/optimizers/
  fused_adam.py lines 640-720): Megatron-Core's groups with and without weight decay
  (megatron/core/optimizer/__init__.py ``_get_param_groups``, lines 88-104), two.
* fp8 weights with per-tensor current scaling (``fp8_param_gather``, recipe
  "tensorwise"): ``DistributedOptimizer._copy_main_params_to_model_params`` calls
  ``quantize_param_shard`` (distrib_optimizer.py lines 2424-2426), Transformer Engine's
  ``_cast_master_weights_to_fp8_current_scaling`` (transformer_engine/pytorch/tensor/
  utils.py lines 227-332 at v2.8). It walks *every* fp8 weight of the rank's model, its
  shard here or not: per weight two views of its scales and one slice of the packed
  amaxes (lines 251, 269-270: three tensor operations); per weight whose shard is here
  one ``compute_amax`` (line 274) and one cast (``update_quantized``, line 332: two
  launches) and its fragment's reshape and slice and the quantizer's empty amax
  (lines 319-324: three tensor operations); once, two buffers (lines 246, 250), the
  amaxes' all-reduce (line 279) and the scales' update (lines 290-297): four launches.
* The other (bf16) weights' shards: one ``copy_`` each and the view and slice of the
  parameter buffer (distrib_optimizer.py lines 2441-2449: one launch, two tensor
  operations).
* The next step before its first kernel: ``zero_grad_buffer`` zeroes each gradient
  buffer (distributed_data_parallel.py lines 573-574, ``grad_data.zero_()``,
  param_and_grad_buffer.py line 874: one launch a buffer, two with fp8 weights: the uint8
  weights' and the bf16 ones') and the step's first launch (the graph's replay).

Not counted, so this is a floor: the clipping's scale (only when the norm exceeds the
clip: clip_grads.py lines 171-177), the learning-rate scheduler, NeMo's and Lightning's
per-step Python (logging, callbacks, the data iterator, the batch's host-to-device
copies) and the norm's and amaxes' all-reduces' own latency (a few tens of
microseconds, a 4-byte and a few-hundred-byte call).

The distributed optimizer shards each gradient bucket evenly over its ``shards`` (DP x
CP) ranks; a bucket of ``n`` parameter tensors meets, on average over the ranks,
1 + (n - 1) / shards of them (each of the n - 1 boundaries between them falls in one
rank's shard), which is what a rank's loops over its shards' pieces walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import CcsimError
from .host import HOST_OP_S, _check_s, tensor_op_s_for

#: Transformer Engine ``multi_tensor_adam`` calls a step: one per Megatron-Core parameter
#: group, with and without weight decay (optimizer/__init__.py lines 88-104 at
#: Megatron-LM 25.09-alpha.rc1; fused_adam.py lines 640-720 at TE v2.8).
ADAM_GROUPS = 2

#: Launches of the current-scaling cast made once a step whatever the weights: the
#: overflow and packed-amax buffers, the amaxes' all-reduce and the scales' update
#: (TE v2.8 transformer_engine/pytorch/tensor/utils.py lines 246, 250, 279, 290-297).
CAST_FIXED_LAUNCHES = 4

#: Launches per fp8 weight shard a rank holds: ``compute_amax`` and the cast
#: (utils.py lines 274 and 332).
CAST_LAUNCHES_PER_SHARD = 2

#: Tensor operations (no launch) per fp8 weight of the model chunk, here or not: its
#: scale's and scale-inverse's views and its slice of the packed amaxes (lines 251,
#: 269-270).
CAST_TENSORS_PER_WEIGHT = 3

#: Tensor operations per fp8 weight shard a rank holds: the fragment's reshape and
#: slice and the quantizer's empty amax tensor (lines 319-324).
CAST_TENSORS_PER_SHARD = 3

#: A bf16 weight shard's copy into the parameter buffer: one launch (``copy_``) and two
#: tensor operations (the buffer's view and slice), distrib_optimizer.py lines 2441-2449.
COPY_LAUNCHES_PER_SHARD = 1
COPY_TENSORS_PER_SHARD = 2

#: The next step's launches before its first kernel: each gradient buffer's zeroing is
#: counted by the caller (one a buffer); this is the step's first launch.
NEXT_STEP_LAUNCHES = 1


@dataclass(frozen=True)
class OptimizerHostOps:
    """Host operations of one rank from the gradient norm's ``.item()`` to the next
    step's first launch: ``launches`` (each launches GPU work or a collective) and
    ``tensors`` (framework tensor operations that launch nothing); means over the ranks
    (fractions where shards split parameters unevenly)."""

    launches: float
    tensors: float

    def seconds(self, op_s: float = HOST_OP_S, tensor_op_s: float | None = None) -> float:
        """Host seconds: ``op_s`` a launch, ``tensor_op_s`` a tensor operation (None:
        the figure of the CPU whose launch costs ``op_s``,
        :func:`~simulator.workload.host.tensor_op_s_for`).

        >>> OptimizerHostOps(10, 4).seconds(1.0, 0.5)
        12.0
        """
        _check_s(op_s, "host_op_s", "host seconds per launched operation")
        t = tensor_op_s_for(op_s) if tensor_op_s is None else tensor_op_s
        _check_s(t, "host_tensor_op_s", "host seconds per framework tensor operation")
        return self.launches * op_s + self.tensors * t


def shards_met(tensors: int, shards: int) -> float:
    """Parameter tensors of a bucket of ``tensors`` that one of ``shards`` equal,
    contiguous shards of it meets, on average over the shards: every shard meets one,
    and each of the ``tensors`` - 1 boundaries between them adds one to the shard it
    falls in.

    >>> shards_met(4, 1), shards_met(4, 32), shards_met(0, 8)
    (4.0, 1.09375, 0.0)
    """
    if tensors <= 0:
        return 0.0
    return 1.0 + (tensors - 1) / shards


def optimizer_host_ops(
    buckets: Sequence[int],
    other_tensors: int,
    shards: int,
    *,
    fp8_current: bool,
) -> OptimizerHostOps:
    """The host's operations of one distributed-optimizer step after the gradient
    norm's synchronisation (see the module docstring), for a rank whose weight buffer's
    buckets hold ``buckets`` parameter tensors each, sharded over ``shards`` (DP x CP)
    ranks. ``fp8_current``: the buckets are fp8 weights (one byte, current scaling, cast
    by Transformer Engine's loop) and ``other_tensors`` the bf16 ones beside them
    (norms, embeddings: one more buffer, its bucket merged into a group, counted as one
    bucket); otherwise every weight is bf16, ``buckets`` all of them and
    ``other_tensors`` more in one bucket of their own (0: none).

    The 8B Llama at TP 1 with fp8 weights on 32 DP x CP ranks, one layer of four fp8
    weights a bucket (32 buckets) and 67 bf16 tensors (two norms a layer, the final
    norm, the embedding and the output layer): each rank meets 1 + 3/32 fp8 weights a
    bucket and 1 + 66/32 bf16 ones, so 2 + 4 + 2 x 35 + 3.0625 + 2 + 1 launches and
    3 x 128 + 3 x 35 + 2 x 3.0625 tensor operations:

    >>> ops = optimizer_host_ops([4] * 32, 67, 32, fp8_current=True)
    >>> ops.launches, ops.tensors
    (82.0625, 495.125)
    """
    if shards < 1:
        raise CcsimError(
            f"shards (DP x CP ranks the optimizer shards over) must be >= 1, not {shards}"
        )
    if any(n < 0 for n in buckets) or other_tensors < 0:
        raise CcsimError("bucket parameter counts must be >= 0")
    met = sum(shards_met(n, shards) for n in buckets)
    other = shards_met(other_tensors, shards)
    launches = ADAM_GROUPS + NEXT_STEP_LAUNCHES
    if fp8_current:
        weights = sum(buckets)
        launches += CAST_FIXED_LAUNCHES + CAST_LAUNCHES_PER_SHARD * met
        launches += COPY_LAUNCHES_PER_SHARD * other + 2  # two gradient buffers zeroed
        tensors = CAST_TENSORS_PER_WEIGHT * weights + CAST_TENSORS_PER_SHARD * met
        tensors += COPY_TENSORS_PER_SHARD * other
    else:
        launches += COPY_LAUNCHES_PER_SHARD * (met + other) + 1  # one gradient buffer
        tensors = COPY_TENSORS_PER_SHARD * (met + other)
    return OptimizerHostOps(float(launches), float(tensors))
