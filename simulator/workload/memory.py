"""Memory per GPU of a training configuration: weights, gradients, optimizer state and
activations, so that a configuration that cannot fit is known before it is simulated.

Figures follow Megatron-LM's own accounting, for mixed-precision Adam with bf16
parameters and fp32 gradients:

* **model state** (Megatron-LM README, "Distributed Optimizer"): 18 bytes per parameter
  without the distributed optimizer (bf16 weights 2, fp32 main gradients 4, fp32 master
  weights, momentum and variance 12); 6 + 12/d with it, the 12 bytes of optimizer state
  sharded over the d data-parallel ranks. The parameters counted are those of the most
  loaded rank: a pipeline stage's share of the layers split over tensor parallelism,
  plus the input embedding (vocab x hidden / tp) on the first stage and the output layer
  (another vocab x hidden / tp) on the last (Megatron's ``theoretical_memory_usage.py``):
  both on the one stage without pipelining, unless the model ties them (one matrix;
  ``Transformer.tied_embeddings``, GPT's). Llama 3 70B at PP 1 thus holds 80 layers and
  2 x 128256 x 8192 vocabulary parameters. Recipes that keep gradients or the optimizer's
  state in other dtypes say so (``grad_reduce``, ``optimizer_state``): NeMo's Nemotron-4
  340B recipe, bf16 gradients and bf16 moments without main weights, holds 2 + 2 + 4/d
  bytes per parameter where Megatron's formula (which assumes fp32 for both) counts
  6 + 12/d;
* **activations** (Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models", MLSys 2023, section 4 and Table 2): per layer and micro-batch,
  s b h (10 + 24/t + 5 a s / (h t)) bytes with tensor parallelism t, s b h (34 + 5 a s /
  h) / t with sequence parallelism, s b h 34 / t with selective recomputation (the
  attention core, 5 a s^2 b, recomputed; Megatron runs it with sequence parallelism),
  and 2 s b h (the layer's input; / t with sequence parallelism) with full
  recomputation. The 24 = 8 (attention: Q, K, V, output projection input) + 16 (MLP:
  the two 4h-wide inputs); an MLP of inner size f stores 4f/h (gated: 6f/h, its gate and
  up projections both feed the product) in place of 16, and grouped-query attention
  with g of a heads stores K and V of g/a the size (4 + 4g/a in place of 8). The first
  stage of a 1F1B pipeline keeps min(pp, micro-batches) micro-batches in flight over its layers/pp
  layers, which is the most any stage holds, plus the embedding dropout's mask (s b h
  bytes per micro-batch in flight).

Mixture of experts: an MoE layer holds its attention, shared experts and router like a
dense layer (split over TP) and experts / ep of its routed experts whole; their
optimizer state is sharded over the DP x CP / EP ranks that hold the same experts. Its
activations are counted as a dense layer's whose MLP is top_k x capacity plus the shared
experts wide (the tokens each expert receives).

Uneven pipeline stages (``first_stage_layers``, ``last_stage_layers``; Megatron-LM's
``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers``,
:func:`pipeline_layers`): every stage is counted with its own layers (the last stage
holds the output layer's vocab x hidden / tp as well) and the estimate is that of the
stage with the largest total, which need not be the first once a middle stage holds more
layers.

FSDP (``fsdp``, Megatron-FSDP's optim_grads_params): every parameter's weights, main
gradients and optimizer state are sharded over the DP x CP ranks, the embedding and
output layer included. Each rank also holds the gathered weights of the unit running
and those Megatron-FSDP prefetches (:func:`fsdp_gathered_units`; a unit is a
transformer layer), at most its stage's layers; the unsharded gradients of the units
its reduce-scatter queue keeps (:func:`fsdp_gradient_units`); and the embedding and
output layer whole in bf16, which are not units and stay gathered through the step.
With ``fp8_params`` the layers' weights are sharded and gathered as 1-byte fp8 (and a
gathered unit's columnwise copy for its backward where the GPU needs one); without, in
bf16 with fp8 casts of the gathered units. ``fsdp_communication_unit`` and
``fsdp_double_buffer`` are Megatron's ``suggested_communication_unit_size`` and
``fsdp_double_buffer`` (Megatron-Bridge's Llama 3 70B recipes set 8e8 and True).

Context parallelism over cp ranks divides every activation by cp (each rank holds s / cp
of the tokens; its attention runs flash-style, without stored scores) and shards the
distributed optimizer over the DP x CP ranks.

fp8 (Transformer Engine's recipe): the bf16 weights, fp32 gradients and optimizer state
stay; the linear layers' weights are also kept as fp8 copies and their transposes for
the step (TE casts them at the first micro-batch and reuses them, ``is_first_microbatch``),
2 more bytes per linear parameter (1 where the GPU's fp8 GEMMs need no transpose and the
recipe is per-tensor, :func:`fp8_weight_bytes`). The inputs of the linear layers are
kept as their fp8 casts (1 byte per element) for the weight gradients, except that flash
attention keeps its bf16 output too (see :func:`layer_activation_bytes`).

Dropout (``Transformer.dropout``): Korthikanti et al.'s count includes the masks of the
two dropouts after attention and after the MLP (s b h bytes each); models trained with
dropout 0 (Llama-style) store none (PyTorch returns the input unchanged for p = 0).

Pipeline stages' inputs and outputs: a chunk's output is not counted, as Megatron-LM
frees its data once it is sent to the next stage (``deallocate_pipeline_outputs``:
Megatron-Core's ModelParallelConfig leaves it False, model_parallel_config.py line 405,
but Megatron-LM's training sets it True, megatron/training/argument_utils.py line 305,
and Megatron-Bridge's GPT provider too, src/megatron/bridge/models/gpt_provider.py line
162, at NVIDIA/Megatron-LM@d98e8a64dd and NVIDIA-NeMo/Megatron-Bridge@067f987df); a
chunk's input is its first layer's input, counted once as the normalization's saved input
(its backward needs it). Meta's Llama 3 405B pipeline, which "proactively deallocate[s]
tensors that will not be used for future computation, including the input and output
tensors of each pipeline stage" (Dubey et al. 2024, arXiv 2407.21783, section 3.3.2,
p. 11), thus holds what this count holds: the phrase frees nothing more here.

Gradients (``lazy_gradients``): Megatron's distributed data parallel allocates its main
gradient buffer once, for every parameter of the rank, and zeroes it each step
(``_ParamAndGradBuffer``: ``self.grad_data = torch.zeros(...)`` in
megatron/core/distributed/param_and_grad_buffer.py line 1190, ``reset`` line 1621, at
d98e8a64dd): held through the whole step, beside the activations' peak. PyTorch's FSDP
allocates a module's gradient when its first backward of the step produces it (FSDP2
keeps it as ``unsharded_accumulated_grad``, the first gradient cast to the reduce dtype:
``FSDPParam.to_accumulated_grad_if_needed`` in
torch/distributed/fsdp/_fully_shard/_fsdp_param.py at pytorch/pytorch@010ae4a8) and frees
it after its reduce-scatter; ``Optimizer.zero_grad`` sets gradients to None. With
``lazy_gradients`` the peak is then found over the stage's schedule
(:func:`lazy_gradient_peak`): the activations held and the gradients of the model chunks
whose backward has run, plus the fresh bf16 gradient of the layer running its backward,
and the sharded fp32 gradients. Where all micro-batches are in the warm-up (16 of them
over 16 stages) the activations' peak comes before any gradient exists; in a long 1F1B
steady state every chunk's gradient is allocated while the activations stay at their
peak, and the two figures agree.

Not counted: temporary buffers (communication buckets, workspace), the allocator's
fragmentation and the CUDA context, which real runs keep a few GB for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import CcsimError
from .model import Transformer
from .pipeline import peak_held, pipeline_order

#: Bytes per parameter of mixed-precision Adam (bf16 parameters, fp32 gradients), split
#: as Megatron-LM's README table counts them: weights, main gradients, optimizer state.
WEIGHT_BYTES = 2
GRADIENT_BYTES = 4
OPTIMIZER_BYTES = 12
#: The dtype gradients are kept and reduced in, and (main gradient, optimizer state)
#: bytes per parameter with it. "fp32": Megatron-LM's bf16 default (its arguments.py
#: sets accumulate_allreduce_grads_in_fp32 for bf16, which becomes the DDP config's
#: grad_reduce_in_fp32); "bf16": ``--grad-reduce-in-bf16``; "fp16": fp16 training, whose
#: gradients are fp16 and whose optimizer keeps fp32 copies of parameters and gradients
#: (the README table's 20 bytes: 4 + 16/d with the distributed optimizer).
GRAD_REDUCE = {"fp32": (GRADIENT_BYTES, OPTIMIZER_BYTES), "bf16": (2, 12), "fp16": (2, 16)}
#: Bytes per parameter of the optimizer's state where a recipe sets its dtype (in place of
#: :data:`GRAD_REDUCE`'s, which are Megatron-Core's defaults):
#:
#: * "fp32": fp32 main weights, first and second moments, 12 (Megatron-Core's default;
#:   its ``--main-params-dtype``, ``--exp-avg-dtype`` and ``--exp-avg-sq-dtype`` all fp32);
#: * "bf16": bf16 first and second moments and no main weights, 4. NeMo's
#:   ``distributed_fused_adam`` (Apex's DistributedFusedAdam, ``dtype``: "datatype for
#:   optimizer state") with ``optim.dtype: bf16`` over bf16 weights: NeMo sets
#:   ``store_params`` False when the optimizer's dtype is the model's, so the bf16 weights
#:   are the ones updated (NeMo v2.0.0 megatron_base_model.py, setup_optimization);
#: * "bf16-master": the same with a bf16 copy of the weights as optimizer state
#:   (``store_params``: "store a distributed copy of the parameters as optimizer state"),
#:   6: what NeMo sets whenever ``fp8_params`` keeps the model's weights in fp8.
OPTIMIZER_STATE = {"fp32": OPTIMIZER_BYTES, "bf16": 4, "bf16-master": 6}


def fp8_weight_bytes(*, fp8_transpose: bool = True, fp8_recipe: str = "tensorwise") -> int:
    """Bytes per linear parameter of a weight's fp8 copies: its rowwise fp8 data and,
    where the GEMMs need it, a columnwise copy for the backward. A per-tensor fp8 weight
    keeps a transpose only where the GPU's fp8 GEMMs are TN-only (``fp8_transpose``:
    Hopper; Transformer Engine v2.14, transformer_engine/pytorch/csrc/quantizer.cpp line
    265: ``with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported``); MXFP8
    scales blocks along each axis, so its columnwise copy is a second quantization on
    every GPU (Megatron-FSDP's ``fp8_need_transpose_data`` is true for MXFP8 tensors,
    megatron_fsdp/mixed_precision.py lines 183-185 at NVIDIA/Megatron-LM@2edffadb).
    Block scales (1 byte per 32) are left out.

    >>> fp8_weight_bytes(), fp8_weight_bytes(fp8_transpose=False)
    (2, 1)
    >>> fp8_weight_bytes(fp8_transpose=False, fp8_recipe="mxfp8")
    2
    """
    return 1 + int(fp8_transpose or fp8_recipe == "mxfp8")


RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one GPU holds at its peak, by kind (the most loaded rank)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        """All of it, in bytes."""
        return self.weights + self.gradients + self.optimizer + self.activations

    def fits(self, capacity: float) -> bool:
        """Whether it fits in ``capacity`` bytes."""
        return self.total <= capacity


def layer_activation_bytes(
    model: Transformer,
    *,
    micro_batch: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash_attention: bool = False,
    precision: str = "bf16",
) -> float:
    """Activation bytes one layer keeps for its backward pass, per micro-batch (see the
    module docstring).

    >>> from simulator.workload.model import MODELS
    >>> gpt3 = MODELS["gpt3-175b"]  # s 2048, h 12288, a 96: 10 + 24/8 + 5 x 96 x 2048/(12288 x 8)
    >>> layer_activation_bytes(gpt3, micro_batch=1, tp=8) / (2048 * 12288)
    23.0
    >>> layer_activation_bytes(gpt3, micro_batch=1, tp=8, recompute="full") / (2048 * 12288)
    2.0
    """
    if recompute not in RECOMPUTE:
        raise CcsimError(f"recompute must be one of {', '.join(RECOMPUTE)}, not {recompute!r}")
    s, b, h, t = model.seq, micro_batch, model.hidden, tp
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    f = model.ffn or 4 * model.hidden
    kv = model.query_groups / model.attention_heads
    split = 4 + 4 * kv + (6 if model.gated else 4) * f / h  # 24 for GPT's 4h MLP
    # The two dropout masks (after attention, after the MLP): none with dropout 0.
    rest = 10 if model.dropout else 8
    if precision == "fp8":
        # Transformer Engine keeps the fp8 cast of each GEMM input for the weight
        # gradient, not the bf16 tensor: the QKV and first MLP inputs (counted in
        # ``rest``), the second MLP input (2f/h) and the output projection's input take
        # half. With flash attention that input is also flash's output, which flash
        # keeps in bf16 for its own backward: the fp8 cast then comes on top.
        saved = 3 + f / h - (2 if flash_attention else 0)
        rest -= 2
        split -= saved - 2
    # Flash attention never stores the scores (it recomputes them in the backward).
    stored = recompute != "selective" and not flash_attention
    scores = 5 * model.attention_heads * s / h if stored else 0.0
    if sequence_parallel or recompute == "selective":
        return sbh * (rest + split + scores) / t
    return sbh * (rest + split / t + scores / t)


#: Megatron-FSDP's communication unit, in parameters, where the configuration leaves it
#: unset (``suggested_communication_unit_size`` None): twice the mean FSDP unit's
#: parameters but at least 1e9; the all-gather prefetch is half the unit and the
#: gradients' reduce-scatter queue holds up to a unit (NVIDIA/Megatron-LM@2edffadb,
#: megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py lines 383-408).
FSDP_MIN_COMMUNICATION_UNIT = 1e9
#: FSDP units the double buffers hold (``fsdp_double_buffer``: ``UB_BUFFER_NUM = 2`` in
#: megatron_fsdp/param_and_grad_buffer.py line 2115 at the same commit): weights,
#: transposes and gradients each get a fixed pool of two units' buffers, and gathers that
#: would need a third unit are not prefetched.
FSDP_DOUBLE_BUFFER_UNITS = 2


def cp_gather_buffer_bytes(model: Transformer, *, micro_batch: int, tp: int, cp: int) -> float:
    """Bytes one TP rank holds for a layer's backward with context parallelism by
    all-gather (``cp_comm_type`` "all_gather"), besides the saved activations, at its
    peak, the reduce-scatter of dK (Transformer Engine's AttnFuncWithCPAndKVAllGather
    .backward, context_parallel.py v2.18, which frees none of them before it returns):
    K and V gathered over the whole sequence (``k_ag``, ``v_ag``, lines 3786-3787),
    their gradients over it (``dk``, ``dv``, zero-filled, lines 3766-3775, then
    reordered by ``index_select`` into new tensors that replace them, lines 4114-4115),
    and the two attention kernels' dK and dV over the keys each met (``dk_per_step``:
    the rank's chunks i and 2 cp - 1 - i of 2 cp meet i + 1 and 2 cp - i chunks of
    keys, s (1 + 1 / (2 cp)) tokens together): (3 + 1 / (2 cp)) x 2 b s (g / t) d
    bytes of bf16 K and V (MLA: its key heads with their rotary part and its value
    heads). The forward holds fewer (the gathered K and V and the kernels' outputs);
    ring ("p2p") CP's buffers are blocks of s / cp tokens, not counted.

    >>> from dataclasses import replace
    >>> from simulator.workload.model import MODELS
    >>> m = replace(MODELS["llama3-405b"], seq=131072)  # 8 key/value heads of 128
    >>> round(cp_gather_buffer_bytes(m, micro_batch=1, tp=8, cp=16) / 2**20)  # MiB
    194
    """
    qk = model.head_dim + (model.qk_rope_dim if model.is_mla else 0)
    v = (model.v_head_dim or model.head_dim) if model.is_mla else model.head_dim
    kv = micro_batch * model.seq * model.query_groups / tp * (qk + v) * 2  # bf16
    return (3 + 1 / (2 * cp)) * kv


def fsdp_communication_unit(unit_params: float, communication_unit: float | None = None) -> float:
    """Megatron-FSDP's communication unit in parameters: ``communication_unit`` where the
    configuration sets it (its ``suggested_communication_unit_size``, taken as is), else
    max(1e9, 2 x ``unit_params``) (:data:`FSDP_MIN_COMMUNICATION_UNIT`).

    >>> fsdp_communication_unit(855.6e6), fsdp_communication_unit(855.6e6, 8e8)
    (1711200000.0, 800000000.0)
    """
    if communication_unit is not None:
        return float(communication_unit)
    return max(FSDP_MIN_COMMUNICATION_UNIT, 2 * unit_params)


def fsdp_gathered_units(
    unit_params: float, *, communication_unit: float | None = None, double_buffer: bool = False
) -> int:
    """FSDP units (transformer layers of ``unit_params`` parameters per rank) gathered at
    once: the one running and those prefetched. A unit's pre-forward (pre-backward) hook
    all-gathers it and then the next units in pass order, one at a time, until those
    prefetched hold at least the prefetch size, half the communication unit
    (:func:`fsdp_communication_unit`; ``AllGatherPipeline.all_gather_params`` in
    megatron_fsdp/param_and_grad_buffer.py); units gathered already are skipped, so in a
    steady state each hook gathers one new unit, k ahead of the one running. With
    ``double_buffer`` no more than two units are gathered (``need_skip_prefetch``).

    >>> fsdp_gathered_units(218e6)  # Llama 3 8B's layer: 3 x 218M >= 500M prefetched
    4
    >>> fsdp_gathered_units(2e9)  # a layer above 1e9 / 2: one prefetched
    2
    >>> fsdp_gathered_units(218e6, double_buffer=True)
    2
    """
    prefetch = fsdp_communication_unit(unit_params, communication_unit) // 2
    units = 1 + math.ceil(prefetch / unit_params)
    return min(units, FSDP_DOUBLE_BUFFER_UNITS) if double_buffer else units


def fsdp_gradient_units(
    unit_params: float, *, communication_unit: float | None = None, double_buffer: bool = False
) -> int:
    """FSDP units whose unsharded gradients are held at once in the backward pass: the
    unit accumulating its gradients, the one just handed to the reduce-scatter queue, and
    those already queued. Before a unit's reduce-scatter is queued the oldest queued ones
    are waited for and freed while the queue holds more than a communication unit of
    parameters (``GradReducePipeline.wait_for_previous_grad_reduce`` in
    megatron_fsdp/param_and_grad_buffer.py, NVIDIA/Megatron-LM@2edffadb lines 3479-3503),
    so floor(unit / layer) stay queued. With ``double_buffer`` the gradients' pool holds
    two units (``_enforce_double_buffer_limit``, lines 3511-3531). Buckets' padding is
    left out.

    >>> fsdp_gradient_units(855.6e6, communication_unit=8e8)  # Llama 3 70B's recipe
    2
    >>> fsdp_gradient_units(218e6)  # Llama 3 8B: four 218M layers queued within 1e9
    6
    """
    queued = math.floor(fsdp_communication_unit(unit_params, communication_unit) / unit_params)
    units = queued + 2
    return min(units, FSDP_DOUBLE_BUFFER_UNITS) if double_buffer else units


def optimizer_state_bytes(name: str) -> int:
    """Bytes per parameter of optimizer state ``name`` (:data:`OPTIMIZER_STATE`).

    >>> optimizer_state_bytes("bf16")
    4
    """
    if name not in OPTIMIZER_STATE:
        raise CcsimError(
            f"optimizer_state must be one of {', '.join(OPTIMIZER_STATE)} (the dtype of "
            f"the optimizer's state), not {name!r}"
        )
    return OPTIMIZER_STATE[name]


def _positive_layers(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CcsimError(
            f"{name} must be a positive number of layers (Megatron-LM rejects 0 too), not {value!r}"
        )
    return value


#: One model chunk's parts in the order its backward runs them, for
#: :func:`lazy_gradient_peak`: (activation bytes a forward of it keeps, bytes of its
#: accumulated gradient, bytes of the fresh gradient its backward produces).
ChunkPart = tuple[float, float, float]


def lazy_gradient_peak(
    order: Sequence[tuple[str, int, int]], parts: Sequence[Sequence[ChunkPart]]
) -> tuple[float, float]:
    """(activations, gradients) a pipeline stage holds at the peak of their sum, when each
    model chunk's gradients are allocated by its first backward of the step and kept to
    the step's end (PyTorch FSDP's accumulated gradients; see the module docstring).
    ``order`` is the stage's (pass, chunk, micro-batch) order
    (:func:`~simulator.workload.pipeline.pipeline_order`); ``parts[c]`` chunk c's parts in
    backward order (:data:`ChunkPart`). A forward adds its chunk's activations; a backward
    runs its parts in turn, each allocating its accumulated gradient (the chunk's first
    backward only) and its fresh gradient beside the activations still held, then freeing
    its activations. The fresh gradient of the part running is counted in the gradients.

    Two one-layer chunks, two micro-batches all in the warm-up. With 10 activation bytes
    and 1 gradient byte a layer (0.5 fresh), the peak is the first backward's start:
    all 40 bytes of activations, chunk 1's gradient and its fresh one. With 1 and 10
    (5 fresh) it is chunk 0's first backward: 2 bytes still held beside both chunks'
    gradients and a fresh one.

    >>> order = [("f", 0, 0), ("f", 1, 0), ("f", 0, 1), ("f", 1, 1),
    ...          ("b", 1, 0), ("b", 1, 1), ("b", 0, 0), ("b", 0, 1)]
    >>> lazy_gradient_peak(order, [[(10.0, 1.0, 0.5)], [(10.0, 1.0, 0.5)]])
    (40.0, 1.5)
    >>> lazy_gradient_peak(order, [[(1.0, 10.0, 5.0)], [(1.0, 10.0, 5.0)]])
    (2.0, 25.0)
    """
    held = allocated = 0.0
    started: set[int] = set()
    peak, best = -1.0, (0.0, 0.0)
    for kind, chunk, _ in order:
        if kind == "f":
            held += sum(part[0] for part in parts[chunk])
            if held + allocated > peak:
                peak, best = held + allocated, (held, allocated)
            continue
        first = chunk not in started
        started.add(chunk)
        for activation, gradient, fresh in parts[chunk]:
            if first:
                allocated += gradient
            if held + allocated + fresh > peak:
                peak, best = held + allocated + fresh, (held, allocated + fresh)
            held -= activation
    return best


def pipeline_layers(
    layers: int,
    pp: int,
    *,
    virtual_stages: int = 1,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
) -> tuple[int, ...]:
    """Transformer layers each of ``pp`` pipeline stages holds (over all its
    ``virtual_stages`` model chunks, which hold a ``1 / virtual_stages`` share each, or
    as :func:`pipeline_chunks` says with ``account_for_embedding`` or
    ``account_for_loss``).

    Without ``first_stage_layers`` and ``last_stage_layers`` the layers split evenly and
    must divide into ``pp x virtual_stages`` chunks. With either (Megatron-LM's
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``)
    that stage holds that many and the rest split evenly over the other stages, as
    Megatron-LM checks them (``TransformerConfig.__post_init__``, "Uneven PP", in
    megatron/core/transformer/transformer_config.py) and builds them
    (``get_num_layers_to_build`` in megatron/core/transformer/transformer_block.py):
    each given count positive and, interleaved, a multiple of ``virtual_stages``, as is
    each middle stage's; middle layers left exactly when middle stages are.

    >>> pipeline_layers(126, 8, first_stage_layers=15, last_stage_layers=15)  # Llama 3 405B
    (15, 16, 16, 16, 16, 16, 16, 15)
    >>> pipeline_layers(12, 4)
    (3, 3, 3, 3)
    >>> pipeline_layers(10, 3, last_stage_layers=2)
    (4, 4, 2)
    """
    v = virtual_stages
    if account_for_embedding or account_for_loss:
        chunks = pipeline_chunks(
            layers,
            pp,
            virtual_stages=v,
            first_stage_layers=first_stage_layers,
            last_stage_layers=last_stage_layers,
            account_for_embedding=account_for_embedding,
            account_for_loss=account_for_loss,
        )
        return tuple(sum(stage) for stage in chunks)
    if first_stage_layers is None and last_stage_layers is None:
        if layers % (pp * v):
            raise CcsimError(
                f"{layers} layers do not split into {pp} pipeline stages"
                + (f" of {v} virtual stages" if v > 1 else "")
                + "; pick a pp that divides them, or give the first and last stages their own "
                "counts (first_stage_layers, last_stage_layers; --first-stage-layers, "
                "--last-stage-layers), as Megatron-LM's --decoder-first-pipeline-num-layers "
                "and --decoder-last-pipeline-num-layers do"
            )
        return (layers // pp,) * pp
    given = {
        name: _positive_layers(value, name)
        for name, value in (
            ("first_stage_layers", first_stage_layers),
            ("last_stage_layers", last_stage_layers),
        )
        if value is not None
    }
    names = " and ".join(given)
    if pp < 2:
        raise CcsimError(
            f"{names} set the layers of the first and last of 2 or more pipeline stages; "
            f"with pp {pp} drop {'them' if len(given) > 1 else 'it'}"
        )
    for name, count in given.items():
        if count % v:
            raise CcsimError(
                f"{name} {count} does not split into {v} virtual stages (Megatron-LM needs "
                f"a multiple of them); pick a multiple of {v}"
            )
    middle_stages = pp - len(given)
    middle = layers - sum(given.values())
    where = ", ".join(f"{name} {count}" for name, count in given.items())
    if middle < 0 or bool(middle) != bool(middle_stages):
        raise CcsimError(
            f"{where} leave {middle} of the {layers} layers for {middle_stages} middle "
            f"pipeline stages; pick {names} that leave "
            + ("none" if not middle_stages else "some for each")
        )
    if middle_stages and middle % (middle_stages * v):
        raise CcsimError(
            f"{where} leave {middle} layers, which do not split evenly over the "
            f"{middle_stages} middle pipeline stages"
            + (f" of {v} virtual stages" if v > 1 else "")
            + f"; pick {names} so that {layers} minus them is a multiple of "
            f"{middle_stages * v}"
        )
    split = [middle // middle_stages if middle_stages else 0] * pp
    if first_stage_layers is not None:
        split[0] = first_stage_layers
    if last_stage_layers is not None:
        split[-1] = last_stage_layers
    return tuple(split)


def pipeline_chunks(
    layers: int,
    pp: int,
    *,
    virtual_stages: int = 1,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of each of the ``virtual_stages`` model chunks of each of the
    ``pp`` pipeline stages, as Megatron-Core builds them (``get_num_layers_to_build`` in
    megatron/core/transformer/transformer_block.py): a stage's layers
    (:func:`pipeline_layers`) split evenly over its chunks, except that
    ``account_for_embedding`` / ``account_for_loss`` (its
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``)
    count the input embedding / the loss as one more layer in the split, which the first
    chunk of the first stage / the last chunk of the last stage then builds one fewer of.
    Megatron-Core needs the layers with them to divide into the stages and each stage's
    into its chunks, and refuses them with uneven first or last stages.

    >>> pipeline_chunks(126, 8, virtual_stages=8, account_for_embedding=True,
    ...                 account_for_loss=True)[0]  # Llama 3.1 405B on Megatron-Bridge
    (1, 2, 2, 2, 2, 2, 2, 2)
    >>> pipeline_chunks(12, 2, virtual_stages=2, first_stage_layers=4)
    ((2, 2), (4, 4))
    """
    v = virtual_stages
    extra = int(account_for_embedding) + int(account_for_loss)
    if not extra:
        split = pipeline_layers(
            layers,
            pp,
            virtual_stages=v,
            first_stage_layers=first_stage_layers,
            last_stage_layers=last_stage_layers,
        )
        return tuple((count // v,) * v for count in split)
    if first_stage_layers is not None or last_stage_layers is not None:
        raise CcsimError(
            "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
            "do not go with first_stage_layers or last_stage_layers (Megatron-Core refuses "
            "uneven stages with them); drop one or the other"
        )
    counted = layers + extra
    if counted % (pp * v):
        raise CcsimError(
            f"{layers} layers with the embedding and/or loss counted as layers make "
            f"{counted}, which do not split into {pp} pipeline stages"
            + (f" of {v} virtual stages" if v > 1 else "")
            + f" as Megatron-Core needs; pick a pp (x virtual stages) that divides {counted}"
        )
    per = counted // (pp * v)
    chunks = [[per] * v for _ in range(pp)]
    if account_for_embedding:
        chunks[0][0] -= 1
    if account_for_loss:
        chunks[-1][-1] -= 1
    return tuple(tuple(stage) for stage in chunks)


def chunk_layer_range(chunks: Sequence[Sequence[int]], stage: int, chunk: int) -> range:
    """Indices (from 0) of the layers of model chunk ``chunk`` on pipeline ``stage``,
    ``chunks`` the layers of each stage's chunks (:func:`pipeline_chunks`): the layers
    after those of every virtual stage before it, virtual stage c p + s being chunk c of
    stage s (Megatron-LM's ``get_transformer_layer_offset``,
    megatron/core/transformer/transformer_layer.py).

    >>> chunk_layer_range(((2,), (3,), (3,), (2,)), 1, 0)
    range(2, 5)
    >>> list(chunk_layer_range(((2, 2), (2, 2), (1, 1)), 2, 1))
    [9]
    """
    pp = len(chunks)
    here = chunk * pp + stage
    start = sum(chunks[s][c] for c in range(len(chunks[0])) for s in range(pp) if c * pp + s < here)
    return range(start, start + chunks[stage][chunk])


def megatron_memory(
    model: Transformer,
    *,
    tp: int,
    pp: int,
    dp: int,
    micro_batch: int,
    micro_batches: int,
    recompute: str = "full",
    sequence_parallel: bool = False,
    distributed_optimizer: bool = False,
    virtual_stages: int = 1,
    precision: str = "bf16",
    cp: int = 1,
    flash_attention: bool = False,
    ep: int = 1,
    etp: int = 1,
    fsdp: bool = False,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    grad_reduce: str = "fp32",
    fp8_params: bool = False,
    optimizer_state: str | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    activation_offload_layers: int = 0,
    moe_a2a_overlap: bool = False,
    fsdp_communication_unit: float | None = None,
    fsdp_double_buffer: bool = False,
    fp8_transpose: bool = True,
    fp8_recipe: str = "tensorwise",
    activation_offload_in_flight: int = 0,
    lazy_gradients: bool = False,
    cp_comm_type: str = "p2p",
) -> MemoryEstimate:
    """Peak bytes per GPU of a Megatron-LM 1F1B configuration: its first pipeline stage,
    which holds the input embedding and the most micro-batches in flight. With v virtual
    stages (interleaved 1F1B) it holds its warm-up's 2(p - 1) + (v - 1)p chunk passes
    and one more, each of L/(p v) layers: L/p (p + (p - 1)/v) layers' activations, the
    1 + (p - 1)/(p v) of Korthikanti et al. (section 5). With ``first_stage_layers`` or
    ``last_stage_layers`` (uneven stages, :func:`pipeline_layers`), or
    ``account_for_embedding`` / ``account_for_loss`` (uneven chunks,
    :func:`pipeline_chunks`), every stage is worked out (stage s keeps min(p - s,
    micro-batches) in flight, interleaved the most layers its schedule holds at once,
    :func:`~simulator.workload.pipeline.peak_held`) and the one with the largest total
    is returned.
    A mixture-of-experts model's routed experts are split over ``ep`` x ``etp`` ranks
    (expert and expert-tensor parallelism) and their optimizer state over the
    TP x CP x DP / (EP x ETP) ranks holding the same slices.
    ``grad_reduce`` is the gradients' dtype (:data:`GRAD_REDUCE`); ``fp8_params``
    (Megatron's ``--fp8-param-gather``): the linear layers' weights are kept in fp8 only,
    with their fp8 transposes, 2 bytes per parameter in place of bf16's 2 and the fp8
    copies' 2. ``optimizer_state`` (:data:`OPTIMIZER_STATE`), where a recipe sets the
    optimizer's dtype, replaces the optimizer bytes per parameter ``grad_reduce`` implies.
    ``cp_comm_type`` "all_gather" adds a layer's gathered K/V buffers
    (:func:`cp_gather_buffer_bytes`) to a stage holding layers.
    ``activation_offload_layers`` (Megatron-Core's ``cpu_offloading_num_layers``, which
    Megatron-Bridge's GB200 recipes set as ``activation_cpu_offload_layers``): the
    activations of that many of a stage's layers go to host memory after their forward
    and come back for their backward (Transformer Engine's ``get_cpu_offload_context``);
    each micro-batch in flight keeps the rest on the GPU, at least one layer.
    ``moe_a2a_overlap`` (Megatron-Core's combined 1F1B): one more warm-up forward a
    stage, so one more micro-batch's activations held. ``fsdp_communication_unit`` (in
    parameters; None: Megatron-FSDP's default, :func:`fsdp_communication_unit`) and
    ``fsdp_double_buffer`` set how many FSDP units are gathered and how many units'
    gradients wait for their reduce-scatter (:func:`fsdp_gathered_units`,
    :func:`fsdp_gradient_units`). ``fp8_transpose`` and ``fp8_recipe`` say which fp8
    copies a weight keeps (:func:`fp8_weight_bytes`: the transpose only on TN-only GPUs,
    MXFP8's columnwise copy everywhere). ``activation_offload_in_flight``: offloaded
    layers whose activations are still on the GPU at the peak. Transformer Engine from
    v2.10 frees offloaded layer i before layer L - k + i runs and reloads it after, so
    that exactly L - k layers' are held (``DefaultOffloadSynchronizer``,
    transformer_engine/pytorch/cpu_offload.py lines 586-610 at v2.13): 0, the default.
    Up to v2.9 (``AsyncDoubleBufferGroupOffloadHandler``, cpu_offload.py lines 340-350
    and 516-531 at v2.9) offloaded layer i is freed only when layer 2i + 1 (L = 2k)
    commits, so the last offloaded layer is still held while the last layer runs: 1.
    ``lazy_gradients``: each model chunk's gradients are allocated by its first backward
    (PyTorch FSDP's), not held through the step (Megatron's buffer, the default), and
    every stage's peak is found over its schedule (see the module docstring and
    :func:`lazy_gradient_peak`); it needs the distributed optimizer, and neither FSDP's
    units nor offloading.

    >>> from simulator.workload.model import MODELS
    >>> m = megatron_memory(MODELS["gpt3-175b"], tp=8, pp=8, dp=16, micro_batch=1,
    ...                     micro_batches=96)
    >>> round(m.weights / 2**30, 2), round(m.activations / 2**30, 2)  # GiB
    (5.21, 4.69)
    """
    if lazy_gradients and (fsdp or activation_offload_layers or not distributed_optimizer):
        raise CcsimError(
            "lazy_gradients (gradients allocated at their first backward and sharded after "
            "their reduce-scatter, as PyTorch's FSDP does) is modelled with the distributed "
            "optimizer only, without Megatron-FSDP (fsdp) or activation offloading; drop "
            "lazy_gradients or those options"
        )
    v = virtual_stages
    chunks = pipeline_chunks(
        model.layers,
        pp,
        virtual_stages=v,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        account_for_embedding=account_for_embedding,
        account_for_loss=account_for_loss,
    )
    split = tuple(sum(stage) for stage in chunks)
    experts = (3 if model.gated else 2) * model.hidden * model.expert_ffn * model.experts
    gradient_bytes, optimizer_bytes = GRAD_REDUCE[grad_reduce]
    if optimizer_state is not None:
        optimizer_bytes = optimizer_state_bytes(optimizer_state)
    optimizer = optimizer_bytes / (dp * cp if distributed_optimizer else 1)
    # Experts are sharded over the expert-data-parallel ranks: TP x CP x DP / (EP x ETP)
    # (the generator's expert grid, Megatron-Core's).
    if model.experts and (tp * dp * cp) % (ep * etp):
        raise CcsimError(
            f"ep {ep} x etp {etp} must divide TP x CP x DP ({tp * cp * dp}): expert-parallel "
            "ranks are carved out of a stage's ranks, as Megatron-Core's expert grid does; "
            "pick an ep that divides them"
        )
    expert_dp = tp * dp * cp // (ep * etp)
    expert_optimizer = optimizer_bytes / (expert_dp if distributed_optimizer else 1)

    def activation(m: Transformer) -> float:
        return layer_activation_bytes(
            m,
            micro_batch=micro_batch,
            tp=tp,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            flash_attention=flash_attention,
            precision=precision,
        )

    fp8_copy = fp8_weight_bytes(fp8_transpose=fp8_transpose, fp8_recipe=fp8_recipe)
    dense_layer = activation(model)
    embedding_dropout = model.seq * micro_batch * model.hidden / (tp if sequence_parallel else 1)
    if not model.dropout:
        embedding_dropout = 0.0  # dropout 0: no mask

    def fsdp_stage(layers: int, dense: int, vocab: float, activations: float) -> MemoryEstimate:
        # Megatron-FSDP (optim_grads_params) shards every parameter over the DP x CP
        # ranks, the embedding and output layer included: weights, main gradients and
        # optimizer state (ParamAndGradBuffer's buffers are built for every parameter
        # group, megatron_fsdp/param_and_grad_buffer.py lines 2237-2320 at
        # NVIDIA/Megatron-LM@2edffadb). Its units are the transformer layers
        # (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py line 126: fsdp_unit_modules =
        # [TransformerLayer]).
        replicas = dp * cp
        linear = dense * model.layer_params / tp
        embedding = vocab / tp
        unit = model.layer_params / tp
        sizes = dict(communication_unit=fsdp_communication_unit, double_buffer=fsdp_double_buffer)
        gathered = min(fsdp_gathered_units(unit, **sizes), max(layers, 1)) * unit
        # fp8 parameters are kept (and sharded) as 1-byte fp8 data (the weight buffer
        # of an fp8 parameter group is uint8, lines 2209-2211), MXFP8's with a sharded
        # columnwise buffer beside it (line 2256); embeddings stay bf16.
        linear_bytes = (1 + int(fp8_recipe == "mxfp8")) if fp8_params else WEIGHT_BYTES
        sharded_weights = (linear * linear_bytes + embedding * WEIGHT_BYTES) / replicas
        if fp8_params:
            # The gathered units' fp8 data and the columnwise copy made for their
            # backward where the GPU needs one (fp8_create_transpose_cache in
            # megatron_fsdp.py line 462), dropped after (keep_fp8_transpose_cache off,
            # as Megatron-Bridge sets it).
            unit_weights = fp8_copy * gathered
        else:
            unit_weights = WEIGHT_BYTES * gathered
            if precision == "fp8":
                # bf16 weights gathered afresh each micro-batch: fp8 casts (and their
                # columnwise copies) of the gathered units only.
                unit_weights += fp8_copy * gathered
        # The embedding and output layer are not FSDP units: gathered at their first
        # forward, they stay so until the next step's parameter sync ("Non-unit modules
        # should remain persistently allocated", AllGatherPipeline.release_bucket, line
        # 4157; its reset() in start_param_sync, megatron_fsdp.py line 1242), in bf16.
        held = embedding * WEIGHT_BYTES
        # Unsharded gradients: the units' (fsdp_gradient_units); where the stage holds
        # a vocabulary matrix, its gradient (the output layer's first in the backward,
        # the embedding's last) takes the place of the unit accumulating, if larger.
        units = min(fsdp_gradient_units(unit, **sizes), max(layers, 1))
        matrix = model.vocab * model.hidden / tp if vocab else 0.0
        unsharded = max(units * unit, (units - 1) * unit + matrix)
        # Optimizer state: fp32 main weights (megatron_fsdp_main_params_dtype, fp32 by
        # default: distributed_data_parallel_config.py line 176) and Adam's moments; main
        # gradients in the compute dtype (bf16, also for fp8 parameters: lines 2209-2211)
        # unless grad_reduce_in_fp32 (mcore_fsdp_adapter.py lines 90-100).
        return MemoryEstimate(
            weights=sharded_weights + unit_weights + held,
            gradients=((linear + embedding) / replicas + unsharded) * gradient_bytes,
            optimizer=(linear + embedding) / replicas * optimizer_bytes,
            activations=activations,
        )

    def stage_memory(stage: int) -> MemoryEstimate:
        # The stage's layers (chunks s, s + p, ... when interleaved), MoE ones apart.
        layers = split[stage]
        moe = sum(model.moe_layer(k) for c in range(v) for k in chunk_layer_range(chunks, stage, c))
        dense = layers - moe
        shared = (model.moe_layer_params - experts) if moe else 0.0
        # The input embedding on the first stage, the output layer on the last: both on
        # one stage without pipelining unless they are tied (one matrix); Megatron keeps a
        # copy of a tied embedding on the last stage (shared_embedding_or_output_weight).
        matrices = int(stage == 0) + int(stage == pp - 1)
        if model.tied_embeddings:
            matrices = min(matrices, 1)
        vocab = matrices * model.vocab * model.hidden
        params = (dense * model.layer_params + moe * shared + vocab) / tp
        expert_params = moe * experts / (ep * etp)
        per_layer = dense_layer
        if moe:
            # An MoE layer keeps its experts' inputs for the tokens routed to them: as a
            # dense layer whose MLP is top_k (x capacity) plus the shared experts wide.
            routed = model.top_k * (model.capacity_factor or 1.0) + model.shared_experts
            wide = replace(model, ffn=round(routed * model.expert_ffn), experts=0)
            per_layer = (dense * per_layer + moe * activation(wide)) / (dense + moe)
        # Megatron-Core's combined 1F1B (moe_a2a_overlap) runs one more warm-up forward
        # (see simulator.workload.pipeline.pipeline_steps): one more micro-batch held.
        extra = 1 if moe_a2a_overlap else 0
        in_flight = min(pp - stage + extra, micro_batches)
        dropout = embedding_dropout if stage == 0 else 0.0  # the input embedding's mask
        activations = in_flight * (layers * per_layer + dropout)
        if v > 1:
            # The most layers' activations the interleaved schedule holds at once (the
            # warm-up's 2(p - s - 1) + (v - 1)p chunk passes and one more, with even
            # chunks).
            held = peak_held(stage, pp, micro_batches, chunks[stage], extra)
            activations = held * per_layer + in_flight * dropout
        linear = (dense * model.layer_params + moe * shared) / tp + expert_params
        fp8_copies = fp8_copy * linear if precision == "fp8" else 0.0
        if fp8_params:
            # The fp8 weight (1 byte) and its columnwise copy where kept replace the bf16
            # weight counted in ``weights`` and the copies.
            fp8_copies = (fp8_copy - WEIGHT_BYTES) * linear
        if activation_offload_layers > 0:
            # Offloaded layers' activations live in host memory between their passes,
            # but for those Transformer Engine still holds at the peak.
            offloaded = min(activation_offload_layers, max(layers - 1, 0))
            offloaded -= min(max(activation_offload_in_flight, 0), offloaded)
            activations -= in_flight * offloaded * per_layer
        # Context parallelism: each rank keeps the activations of its s / cp tokens.
        activations /= cp
        # all_gather CP's gathered K/V buffers, live while one layer's attention runs.
        gathered = 0.0
        if cp > 1 and cp_comm_type == "all_gather" and layers:
            gathered = cp_gather_buffer_bytes(model, micro_batch=micro_batch, tp=tp, cp=cp)
        activations += gathered
        if fsdp:
            return fsdp_stage(layers, dense, vocab, activations)
        gradients = (params + expert_params) * gradient_bytes
        if lazy_gradients:
            activations, gradients = lazy_stage_peak(stage, linear, per_layer, dropout, extra)
            activations += gathered
            # The sharded gradients the reduce-scatters leave for the optimizer, held
            # from the previous step's end (an upper bound: they are made at this one's).
            gradients += params * gradient_bytes / (dp * cp)
            gradients += expert_params * gradient_bytes / expert_dp
        return MemoryEstimate(
            weights=(params + expert_params) * WEIGHT_BYTES + fp8_copies,
            gradients=gradients,
            optimizer=params * optimizer + expert_params * expert_optimizer,
            activations=activations,
        )

    def lazy_stage_peak(
        stage: int, linear: float, per_layer: float, dropout: float, extra: int
    ) -> tuple[float, float]:
        # Each chunk's parts in backward order: the output layer first (the last stage's
        # last chunk), then its layers, the input embedding last (the first stage's first
        # chunk, with its dropout mask); the layers share the stage's linear parameters
        # evenly. Fresh gradients come in the parameters' dtype (bf16).
        layers = split[stage]
        grad = linear / layers * gradient_bytes if layers else 0.0
        fresh = linear / layers * WEIGHT_BYTES if layers else 0.0
        matrix = model.vocab * model.hidden / tp
        parts: list[list[ChunkPart]] = []
        for c, count in enumerate(chunks[stage]):
            chunk: list[ChunkPart] = [(per_layer / cp, grad, fresh)] * count
            last = stage == pp - 1 and c == v - 1
            if last and not (model.tied_embeddings and stage == 0):
                chunk.insert(0, (0.0, matrix * gradient_bytes, matrix * WEIGHT_BYTES))
            if stage == 0 and c == 0:
                chunk.append((dropout / cp, matrix * gradient_bytes, matrix * WEIGHT_BYTES))
            parts.append(chunk)
        order = pipeline_order(stage, pp, micro_batches, v, extra)
        return lazy_gradient_peak(order, parts)

    if len(set(chunks)) == 1 and not lazy_gradients:
        # Even stages: the first holds the most (the embedding, the most in flight).
        return stage_memory(0)
    # The first of the largest: a middle stage with more layers may outweigh the first.
    return max((stage_memory(stage) for stage in range(pp)), key=lambda e: e.total)
