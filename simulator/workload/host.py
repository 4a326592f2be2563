"""The host's side of a mixture-of-experts layer: how many operations the CPU launches
for one MoE layer pass, and how long that takes.

A dropless MoE layer reads the tokens each expert got on the host (the dispatcher's
synchronisation, :data:`~simulator.workload.generators.HOST_SYNC_S`), so the host cannot
run ahead of the GPU there: from that point the GPU waits for every kernel the host
launches until the next layer's synchronisation, and at that synchronisation the host
waits for the GPU. A layer is then a flow shop of two machines (the host launching, the
GPU executing in order): :func:`moe_forward_launches` gives its steps around the
synchronisation, the generator times them (``generators._moe_flow_shop``), the host's
side being the operations it issues times what one costs.

The counts are read from Megatron-Core's source at core_v0.16.0 (the release under
Megatron-Bridge 26.02; the 25.09-26.04 releases the MoE rows ran share the structure of
these functions) and Transformer Engine's (v2.8), one entry per PyTorch operation or
library call that launches work on the GPU (a kernel, an NCCL call, a device-to-host
copy), as the functions named beside each count issue them with the settings the
published rows use: grouped GEMM, permute fusion, router fusion, balanced routing. How
many kernels one fused library call launches is the call's own (TE's ``moe_permute``:
a row-id map in three passes and the permutation), read from the library's Python, not
measured. Beside its launches, each local expert costs the host framework tensor
operations that launch nothing (views, quantized tensors' Python objects, dummy weight
gradients, DDP's per-parameter hooks: :func:`expert_tensor_ops`), priced apart at a
measured allocation's cost (:data:`HOST_TENSOR_OP_S_BY_CPU`). The counts leave out
pure-Python statements without a tensor (quantizer loops, TE's fp8 bookkeeping per
module, Megatron-Core's wrappers), so they are a floor on the host's work.

Per operation the host spends what one PyTorch operation costs on the CPU the GPUs hang
off (:data:`HOST_OP_S_BY_CPU`, :func:`host_op_s_for`): Transformer Engine issue #2053
(github.com/NVIDIA/TransformerEngine/issues/2053, "[PyTorch] High CPU overhead on Grace
systems", 2025-08-11) measured the average CPU time of one ``torch.nn.Linear`` forward
(bf16, hidden 2048, 8,192 tokens: one cuBLAS GEMM behind PyTorch's Python module call
and dispatcher) at 13.48 us on a DGX H100 (Intel Xeon Platinum 8480C), 33.17 us on GH200
and 37.08 us on GB200 (Grace, Neoverse V2): one eager operation, from Python to its
launch, on each host. DGX B200 (Xeon Platinum 8570, the same generation) takes the x86
figure; no measurement of it was found. The earlier value, 10 us (:data:`HTA_HOST_OP_S`:
the geometric middle of the "usually between 5-20 microseconds" Meta's Holistic Trace
Analysis documentation gives for the CPU side of a launch,
github.com/facebookresearch/HolisticTraceAnalysis,
docs/source/features/cuda_kernel_launch_stats.rst), stays as an option (``host_op_s``).
The x86 figure lies inside HTA's range; Grace's is above it, as the issue reports. A
counted operation is priced as one such op: some cost more (Transformer Engine's modules
measured 2.7 times torch's on GB200 in the same table; NCCL calls), some less (integer
bookkeeping), and pure-Python work is not counted at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import CcsimError

#: Host seconds per launched operation before this was measured per host CPU: the
#: geometric middle of the 5-20 us Meta's HTA documentation gives for the CPU side of a
#: launch (docs/source/features/cuda_kernel_launch_stats.rst); kept as an option
#: (``host_op_s=HTA_HOST_OP_S``).
HTA_HOST_OP_S = 10e-6

#: Host seconds per PyTorch eager operation, by host CPU, MEASURED (not fitted):
#: Transformer Engine issue #2053 (2025-08-11), the average CPU time of one
#: ``torch.nn.Linear`` forward in bf16 (hidden 2048, 8,192 tokens): DGX H100's Xeon
#: Platinum 8480C 13.48 us ("x86"; DGX B200's Xeon Platinum 8570 assumed alike), GB200's
#: Grace 37.08 us ("grace"; GH200's Grace 33.17 us in the same table).
HOST_OP_S_BY_CPU = {"x86": 13.48e-6, "grace": 37.08e-6}

#: The default: an x86 DGX host (:data:`HOST_OP_S_BY_CPU`); :func:`host_op_s_for` gives a
#: GPU's own.
HOST_OP_S = HOST_OP_S_BY_CPU["x86"]

#: Host seconds per framework tensor operation that launches no kernel (a tensor made
#: or freed through PyTorch's caching allocator, a view, a Python tensor object built
#: from C++, an autograd accumulation or a Python hook per parameter), by host CPU,
#: MEASURED (not fitted):
#:
#: * "x86": NVIDIA/cutlass issue #3275 (comment of 2026-07-22, "my local x64 B200
#:   machine"): ``torch.empty()``'s allocate and free from Python "stayed around
#:   2.15 us";
#: * "grace": Transformer Engine issue #2897 (2026-04-16, GB200, 64 experts): "wgrad
#:   tensor allocations: 350 us" in the fused grouped MLP's backward, which allocates one
#:   weight gradient an expert in each of its two grouped linears (TE v2.14
#:   transformer_engine/pytorch/ops/fused/backward_grouped_mlp.py lines 125-127, called
#:   for FC2 and FC1): 350 us / 128 = 2.73 us.
#:
#: A view or a hook may cost less than an allocation and a quantized tensor's Python
#: object more; each is priced as one allocation (:func:`moe_layer_ops` lists them).
HOST_TENSOR_OP_S_BY_CPU = {"x86": 2.15e-6, "grace": 350e-6 / 128}

#: The default: an x86 DGX host (:data:`HOST_TENSOR_OP_S_BY_CPU`).
HOST_TENSOR_OP_S = HOST_TENSOR_OP_S_BY_CPU["x86"]

#: GPUs whose host CPU is NVIDIA's Grace (the Grace Hopper and Grace Blackwell
#: superchips); every other GPU ccsim models sits in an x86 server (DGX H100, DGX B200).
GRACE_GPUS = ("GH200", "GB200", "GB300")

#: Quantize kernels per GEMM input in fp8, by Transformer Engine recipe: per-tensor
#: current scaling ("tensorwise") computes the amax, then casts (TE's
#: Float8CurrentScalingQuantizer: two kernels); delayed scaling casts with the amax
#: fused (one); MXFP8 casts with its block scales in one kernel (MXFP8Quantizer).
#: (Current scaling also launches two one-thread kernels a cast from inside the same
#: C++ calls, TE v2.8-v2.17: ``zero_amax_kernel<<<1, 1>>>`` in ``nvte_compute_amax``,
#: common/recipe/current_scaling.cu line 75, and ``compute_scale_from_amax_kernel``,
#: line 258, called from quantizer.cpp ``quantize_impl`` lines 518-535. They are not
#: counted: each counted launch is priced as a whole PyTorch operation
#: (:data:`HOST_OP_S_BY_CPU`), too dear for a bare ``cudaLaunchKernel`` inside a C++
#: loop; counted at that price they put the host-bound token-drop rows 30-40 points
#: slower, session 2026-11-28 h54c.)
QUANTIZE_KERNELS = {"bf16": 0, "delayed": 1, "tensorwise": 2, "mxfp8": 1}

#: Kernels MXFP8 adds to each GEMM call: the swizzles of both operands' block scales
#: into cuBLAS's layout (TE v2.8 transformer_engine/pytorch/csrc/extensions/gemm.cpp,
#: lines 233-236 for a GEMM, ``swizzle_scaling_factors`` of A and of B; lines 480-481
#: for a grouped GEMM, ``multi_tensor_swizzle_scaling_factors`` of all A's and all B's:
#: two launches whatever the experts).
SWIZZLES = {"bf16": 0, "delayed": 0, "tensorwise": 0, "mxfp8": 2}

#: CUDA-graph scopes a run can set (Megatron-Bridge's ``cuda_graph_scope`` with
#: Transformer Engine's per-layer graphs: "attn", "moe_router", "moe_preprocess";
#: "full_iteration": Megatron-Core's whole-step graph).
GRAPH_SCOPES = ("attn", "moe_router", "moe_preprocess", "full_iteration")

#: An MoE layer's parts in the order its forward launches them (Megatron-Core
#: core_v0.16.0: ``TransformerLayer`` runs the attention, then ``MoELayer.forward``,
#: moe_layer.py lines 391-425: ``shared_experts_compute``, ``route``, ``preprocess``,
#: ``dispatch``, ``routed_experts_compute``, ``combine``).
PARTS = ("attention", "shared", "router", "preprocess", "dispatch", "experts", "combine")

#: Kernels of the alltoall dispatcher's fused ``permute`` (TE ``moe_permute``: three
#: passes of the row-id map and the permutation), launched in ``dispatch_preprocess``
#: before the synchronisation (token_dispatcher.py lines 632-642; the sync is at
#: "before_ep_alltoall", line 663), though counted in the dispatch part.
PERMUTE_KERNELS = 4

#: Kernels Megatron-Core's unfused rotary embedding launches on one tensor (q or k),
#: (forward, backward), where YaRN's concentration factor keeps it off TE's fused kernel
#: (core_v0.16.0 on; :meth:`~.model.Transformer.unfused_rope_bytes` counts their bytes).
#: Forward, ``_apply_rotary_pos_emb_bshd`` (megatron/core/models/common/embeddings/
#: rope_utils.py lines 110-126 at core_v0.17.0): ``torch.cos(freqs)``, ``* mscale`` and
#: ``.to(t.dtype)`` (3), the same for ``sin`` (3), ``t * cos_`` (1), ``_rotate_half``'s
#: negation and ``torch.cat`` (lines 82-84: 2; the chunk is a view), ``* sin_`` (1), the
#: sum (1) and the final ``torch.cat`` with the empty pass-through part (1): 12.
#: Backward (autograd): the two products' gradients (2), the negation's (1), the chunk's
#: concatenation (1), the pass-through slice's zero-filled gradient (1) and the three
#: gradients' two sums (2): 7. The fused path is one kernel a tensor each way, as
#: :func:`moe_layer_ops` counts the attention's rotary embedding.
UNFUSED_ROPE_KERNELS = (12, 7)

#: Kernels gpt-oss's clamped activation launches outside its fused kernel on each MoE
#: layer's routed tokens, (forward, backward): Megatron-Core's
#: ``weighted_bias_quick_geglu_impl`` (megatron/core/fusions/fused_bias_geglu.py lines
#: 422-434 at core_v0.17.0; unchanged core_v0.15.0-core_v0.19.0) runs ``x_glu.clamp``,
#: ``x_linear.clamp`` and their ``torch.cat`` (3), then ``torch.tensor(linear_offset,
#: device=input.device)``, a host-to-device copy (1): 4. Backward (PyTorch autograd's
#: ``clamp_backward``, as :meth:`~.model.Transformer.glu_clamp_bytes` counts them): the
#: one-sided clamp's comparison and ``where`` (2), the two-sided one's two comparisons,
#: ``logical_and_`` and ``where`` (4), the chunk's concatenation (1): 7. With the
#: activation recomputed (``recompute_modules`` "moe_act") the forward's 4 run again in
#: the backward. TE's fused grouped MLP takes the clamps into its kernel (none then).
GLU_CLAMP_KERNELS = (4, 7)


def expert_tensor_ops(
    recipe: str = "bf16", *, expert_bias: bool = False, param_gather_hooks: bool = True
) -> tuple[int, int]:
    """Framework tensor operations that launch no kernel, per local expert of one MoE
    layer (its fc1 and fc2 ``GroupedLinear``), as (forward, backward): what the host
    does per expert beside the per-expert launches :func:`moe_layer_ops` counts.

    Read from Transformer Engine v2.8 (``transformer_engine/pytorch/module/
    grouped_linear.py``, ``cpp_extensions/gemm.py``, ``csrc/extensions/gemm.cpp`` and
    ``cast.cpp``) and Megatron-Core core_v0.16.0 (``distributed/
    distributed_data_parallel.py``), with gradient-accumulation fusion (Megatron-Core's
    and Megatron-Bridge's default) and the distributed optimizer, per expert and
    grouped linear:

    * forward: the expert's input, a ``torch.split`` view in bf16 or, in fp8, a
      quantized tensor's Python object built by ``split_quantize`` (grouped_linear.py
      lines 127-129; cast.cpp ``bulk_allocate_mxfp8_tensors`` or the quantizer's
      ``create_tensor``) (1); the grouped GEMM's per-expert output view
      (gemm.cpp line 426, ``at::from_blob`` for ``single_output``) (1); and per
      parameter, with ``overlap_param_gather``, the DDP forward pre-hook's visit
      (distributed_data_parallel.py lines 384-418: ``finish_param_sync`` per
      parameter) (1);
    * backward: the expert's gradient, a ``torch.split`` view or a quantized tensor
      (grouped_linear.py lines 286-317) (1); the data-gradient GEMM's output view (1);
      the dummy weight gradient ``handle_custom_ddp_from_mcore`` allocates (lines
      421-449, ``torch.empty`` of the weight's shape) (1); ``clear_tensor_data`` of
      the saved input (line 419), which sets each kept buffer to
      ``torch.Tensor().cuda()`` (utils.py lines 28-54: two tensors a buffer; MXFP8
      keeps the column-wise data and scales, two buffers; bf16 and per-tensor fp8 one)
      (2 or 4); and per parameter autograd's accumulation of that gradient and the DDP
      backward post-hook (distributed_data_parallel.py lines 420-447: ``param.grad =
      None``, ``register_grad_ready``) (2). With biases (gpt-oss) fc1's bias gradient
      is one more ``torch.empty`` an expert (gemm.py line 191, ``grad_bias``) and each
      expert has four parameters instead of two.

    Pure-Python statements without a tensor (quantizer ``set_usage`` loops,
    ``get_weight_workspace``'s cache look-up, the ``main_grad`` lambdas) are not
    counted, so this is a floor.

    >>> expert_tensor_ops("bf16"), expert_tensor_ops("mxfp8")
    ((6, 14), (6, 18))
    >>> expert_tensor_ops("bf16", expert_bias=True)
    (8, 19)
    """
    if recipe not in QUANTIZE_KERNELS:
        raise CcsimError(
            f"recipe must be one of {', '.join(QUANTIZE_KERNELS)} (bf16 or the fp8 recipe), "
            f"not {recipe!r}"
        )
    params = 4 if expert_bias else 2  # weight (and bias) of fc1 and fc2
    buffers = 2 if recipe == "mxfp8" else 1  # saved input buffers clear_tensor_data frees
    forward = 2 * (1 + 1) + params * bool(param_gather_hooks)
    backward = 2 * (1 + 1 + 1 + 2 * buffers) + 2 * params + bool(expert_bias)
    return forward, backward


@dataclass(frozen=True)
class Part:
    """One part of an MoE layer as the host launches it: ``gemms`` GEMM launches (twice
    backward: data and weight gradients), ``kernels`` other kernels and library calls
    (once backward: each has one gradient kernel), ``quantize`` fp8 casts (again
    backward, for the gradients), ``copies`` device-to-host reads (forward only); a part
    without ``grad`` has no backward."""

    gemms: int = 0
    kernels: int = 0
    quantize: int = 0
    copies: int = 0
    #: Kernels launched with each GEMM call (MXFP8's scale swizzles), as many backward
    #: for each of its two gradient calls.
    per_call: int = 0
    #: False for bookkeeping on integer tensors (token counts), which has no gradient.
    grad: bool = True
    #: Kernels the backward launches instead of ``kernels`` (None: as many).
    grad_kernels: int | None = None
    #: Framework tensor operations that launch nothing (:func:`expert_tensor_ops`),
    #: forward and backward; priced apart from the launches
    #: (:data:`HOST_TENSOR_OP_S_BY_CPU`).
    tensors: int = 0
    grad_tensors: int = 0

    def forward(self) -> int:
        """Operations the forward launches."""
        return self.gemms + self.kernels + self.quantize + self.copies + self.per_call

    def backward(self) -> int:
        """Operations the backward launches."""
        if not self.grad:
            return 0
        kernels = self.kernels if self.grad_kernels is None else self.grad_kernels
        return 2 * self.gemms + kernels + self.quantize + 2 * self.per_call


@dataclass(frozen=True)
class MoeLayerOps:
    """The host's operations for one MoE layer, by part (:func:`moe_layer_ops`)."""

    attention: Part
    router: Part
    preprocess: Part
    dispatch: Part
    experts: Part
    shared: Part
    combine: Part
    #: One graph replay per graphed part (it launches the part's kernels as one).
    graphs: int = 0
    #: The graphed parts by name (:data:`PARTS`), each launched as that one replay.
    graphed: tuple[str, ...] = ()

    @property
    def parts(self) -> tuple[Part, ...]:
        return (self.attention, self.router, self.preprocess, self.dispatch, self.experts,
                self.shared, self.combine)  # fmt: skip

    def forward(self) -> int:
        """Operations of the layer's forward."""
        return sum(p.forward() for p in self.parts) + self.graphs

    def backward(self) -> int:
        """Operations of the layer's backward (its recomputation not included)."""
        return sum(p.backward() for p in self.parts) + self.graphs

    def forward_tensors(self) -> int:
        """Framework tensor operations of the forward that launch nothing."""
        return sum(p.tensors for p in self.parts)

    def backward_tensors(self) -> int:
        """Framework tensor operations of the backward that launch nothing."""
        return sum(p.grad_tensors for p in self.parts if p.grad)


def moe_layer_ops(
    *,
    local_experts: int,
    dispatcher: str = "alltoall",
    recipe: str = "bf16",
    tp: int = 1,
    ep: int = 1,
    shared_experts: int = 0,
    graphs: Iterable[str] = (),
    expert_bias: bool = False,
    param_gather_hooks: bool = True,
    unfused_rope: bool = False,
    glu_clamp: bool = False,
    recompute_act: bool = False,
    qk_norm: bool = False,
) -> MoeLayerOps:
    """What the host launches for one MoE layer on one rank.

    ``recipe`` is "bf16" or the fp8 recipe (:data:`QUANTIZE_KERNELS`); ``graphs`` the
    CUDA-graph scopes the run captures (:data:`GRAPH_SCOPES`): a graphed part costs one
    replay instead of its operations, "full_iteration" leaves nothing per layer.

    Counted from Megatron-Core core_v0.16.0 and Transformer Engine v2.8:

    * attention (``TransformerLayer`` with TE modules): input norm, its output's fp8 cast
      and the QKV GEMM (``TELayerNormColumnParallelLinear``), fused rotary on q and on k
      (2), fused attention (``TEDotProductAttention``, 1), the output projection's input
      cast and GEMM, bias-dropout-add after attention and after the MLP (2), the
      pre-MLP norm (1); with ``qk_norm`` (Qwen3) the query's and the key's norms (2,
      core_v0.16.0 attention.py lines 1477-1481); MXFP8's swizzles with each GEMM; with
      TP and sequence parallelism the all-gather before the QKV GEMM and the
      reduce-scatter after the projection (2);
    * router (``TopKRouter.forward``, router.py): the input's fp32 cast and the gating
      GEMM; ``topk_routing_with_score_function`` fused (1 kernel and its output, 2); the
      aux loss (``_apply_aux_loss``: scores for the aux loss, the routing map's sum,
      ``switch_load_balancing_loss_func`` fused, the tracker's update: 4);
    * preprocess (alltoall: ``MoEAlltoAllTokenDispatcher.preprocess``): the routing map's
      sum and cast (2), the input splits (1), the tokens per expert all-gathered over
      TP x EP (``gather_from_sequence_parallel_region``, 1), the local experts' slice
      made contiguous (1) and its three sums (3); then ``_maybe_dtoh_and_synchronize``
      on its side stream: the wait for the compute stream, the copies of the tokens per
      local expert, the input splits, the output splits and those over TP (4; the global
      tokens per local expert stay on the GPU with permute fusion) and the event (1).
      Without EP or TP the routing map's sum and cast and the one copy with its wait and
      event. HybridEP reads ``tokens_per_expert`` and its sum (2); DeepEP its
      ``num_recv_tokens_per_expert_list`` copied back and ``.sum().item()`` (3);
    * dispatch: alltoall, ``permute`` fused (TE ``moe_permute``: 3 passes of the row-id
      map and the permutation, 4), the tokens' and probabilities' all-to-alls (2), with
      TP their all-gathers (2), with more than one local expert ``sort_chunks_by_idxs``
      fused (tokens and probabilities, 2); HybridEP, the probabilities' fp32 cast and
      ``dispatch_with_permute`` (metadata, dispatch, permute: 4); DeepEP, the top-k and
      ``_indices_to_multihot`` (7), ``get_dispatch_layout`` and ``dispatch`` (3) and the
      fused ``permute`` (4);
    * experts (``TEGroupedMLP``, TE ``GroupedLinear``): ``general_grouped_gemm`` launches
      one cuBLAS GEMM per local expert (``multi_stream_cublas_gemm``, TE v2.8
      transformer_engine/common/gemm/cublaslt_gemm.cu lines 912-951), for fc1 and fc2
      (2 a local expert); in fp8 ``split_quantize`` casts each expert's input to both
      (2 a local expert, each :data:`QUANTIZE_KERNELS` of the recipe; MXFP8 swizzles
      the scales once a grouped GEMM, :data:`SWIZZLES`); the gated activation with the
      routing probabilities (2); in fp8 with the alltoall or DeepEP dispatcher,
      ``Fp8Padding`` of the tokens and of the probabilities and ``Fp8Unpadding`` of the
      output (3; HybridEP pads in its dispatch); with ``expert_bias`` (gpt-oss),
      ``_apply_bias``'s multiply and add per local expert and the concatenation
      (backward: two multiplies and sums per local expert, two concatenations);
    * shared experts (``SharedExpertMLP``): fc1, fc2 and their inputs' casts, the
      activation (1);
    * combine: alltoall, the reverse sort (1), with TP the reduce-scatter and its two
      casts (3), the all-to-all (1), ``unpermute`` fused (1), the shared output's add
      (1 with shared experts); HybridEP ``combine_with_unpermute`` (1); DeepEP
      ``unpermute`` and ``combine`` (2).

    gpt-oss's own launches: ``unfused_rope``, Megatron-Core's unfused rotary embedding
    on q and k (:data:`UNFUSED_ROPE_KERNELS` a tensor instead of the fused kernel's one,
    in the attention part); ``glu_clamp``, the clamps of its activation outside the fused
    kernel (:data:`GLU_CLAMP_KERNELS`, in the experts' part; ``recompute_act``: the
    activation is recomputed, its clamps run again in the backward).

    Beside the launches, the experts' part carries the framework tensor operations
    that launch nothing, :func:`expert_tensor_ops` per local expert
    (``param_gather_hooks``: DDP's forward pre-hooks, registered with the distributed
    optimizer's ``overlap_param_gather``); they are priced apart
    (:func:`moe_layer_host_s`).

    >>> ops = moe_layer_ops(local_experts=16, recipe="mxfp8", ep=8)
    >>> ops.experts.forward(), ops.forward(), ops.backward()
    (73, 121, 150)
    >>> ops.forward_tensors(), ops.backward_tensors()
    (96, 288)
    """
    if recipe not in QUANTIZE_KERNELS:
        raise CcsimError(
            f"recipe must be one of {', '.join(QUANTIZE_KERNELS)} (bf16 or the fp8 recipe), "
            f"not {recipe!r}"
        )
    scopes = set(graphs)
    unknown = scopes - set(GRAPH_SCOPES)
    if unknown:
        raise CcsimError(
            f"unknown CUDA-graph scope {sorted(unknown)[0]!r}; valid: {', '.join(GRAPH_SCOPES)}"
        )
    if isinstance(local_experts, bool) or not isinstance(local_experts, int) or local_experts < 1:
        raise CcsimError(f"local_experts must be a positive integer, not {local_experts!r}")
    q = QUANTIZE_KERNELS[recipe]
    z = SWIZZLES[recipe]
    none = Part()
    if "full_iteration" in scopes:  # one replay a step: nothing per layer
        return MoeLayerOps(none, none, none, none, none, none, none)
    sp = tp > 1  # MoE with TP runs sequence parallelism (the generator checks it)
    attention_kernels = 7 + (2 if sp else 0) + (2 if qk_norm else 0)
    attention_grad_kernels = attention_kernels
    if unfused_rope:  # q and k: the unfused path's kernels instead of one fused each
        attention_kernels += 2 * (UNFUSED_ROPE_KERNELS[0] - 1)
        attention_grad_kernels += 2 * (UNFUSED_ROPE_KERNELS[1] - 1)
    attention = Part(
        gemms=2,
        kernels=attention_kernels,
        quantize=2 * q,
        per_call=2 * z,
        grad_kernels=attention_grad_kernels,
    )
    router = Part(gemms=1, kernels=1 + 2 + 4)
    many = local_experts > 1
    if dispatcher == "alltoall":
        exchanged = ep > 1 or tp > 1
        preprocess = Part(kernels=8 if exchanged else 2, copies=6 if exchanged else 3, grad=False)
        dispatch = Part(kernels=4 + 2 * (ep > 1) + 2 * sp + 2 * many)
        combine = Part(kernels=1 * many + 3 * sp + 1 * (ep > 1) + 1 + (shared_experts > 0))
    elif dispatcher == "hybridep":
        preprocess = Part(copies=2, grad=False)
        dispatch = Part(kernels=1 + 3)
        combine = Part(kernels=1 + (shared_experts > 0))
    elif dispatcher == "deepep":
        preprocess = Part(copies=3, grad=False)
        dispatch = Part(kernels=7 + 3 + 4)
        combine = Part(kernels=2 + (shared_experts > 0))
    else:
        raise CcsimError(f"dispatcher must be alltoall, deepep or hybridep, not {dispatcher!r}")
    # fp8: TEGroupedMLP pads the tokens and the probabilities per expert and unpads the
    # output (Fp8Padding / Fp8Unpadding, one kernel each, experts.py core_v0.16.0); the
    # HybridEP dispatch pads in its own kernel (``pad_multiple``), leaving them no-ops.
    padding = 3 if recipe != "bf16" and dispatcher != "hybridep" else 0
    # Experts with biases (gpt-oss): TEGroupedMLP._apply_bias multiplies and adds fc2's
    # bias per local expert and concatenates (2 a local expert + 1); backward the
    # product's two gradients, a multiply and a sum each (4 a local expert), and the
    # concatenations of the split tokens' and probabilities' gradients (2).
    bias, grad_bias = (2 * local_experts + 1, 4 * local_experts + 2) if expert_bias else (0, 0)
    # Beside its launches, each local expert costs the host framework tensor operations
    # that launch nothing (views, quantized tensors' Python objects, dummy weight
    # gradients, DDP's per-parameter hooks: expert_tensor_ops).
    tensors, grad_tensors = expert_tensor_ops(
        recipe, expert_bias=expert_bias, param_gather_hooks=param_gather_hooks
    )
    clamp, grad_clamp = GLU_CLAMP_KERNELS if glu_clamp else (0, 0)
    grad_clamp += clamp if recompute_act else 0
    experts = Part(
        gemms=2 * local_experts,
        kernels=2 + padding + bias + clamp,
        quantize=2 * local_experts * q,
        per_call=2 * z,
        grad_kernels=2 + padding + grad_bias + grad_clamp,
        tensors=tensors * local_experts,
        grad_tensors=grad_tensors * local_experts,
    )
    shared = Part(gemms=2, kernels=1, quantize=2 * q, per_call=2 * z) if shared_experts else none
    graphed: list[str] = []
    if "attn" in scopes:
        attention = none
        graphed.append("attention")
    if "moe_router" in scopes:
        router = none
        graphed.append("router")
    if "moe_preprocess" in scopes:
        # The graph computes the splits; their copies to the host stay outside it.
        preprocess = Part(copies=preprocess.copies, grad=False)
        graphed.append("preprocess")
    return MoeLayerOps(attention, router, preprocess, dispatch, experts, shared, combine,
                       graphs=len(graphed), graphed=tuple(graphed))  # fmt: skip


def host_cpu(gpu: str) -> str:
    """The host CPU a GPU model is driven from: "grace" for the Grace superchips
    (:data:`GRACE_GPUS`), else "x86" (a GPU name may carry its variant, "GB200-NVL72").

    >>> host_cpu("GB200-NVL72"), host_cpu("B200"), host_cpu("H100-SXM-80GB")
    ('grace', 'x86', 'x86')
    """
    if not isinstance(gpu, str) or not gpu:
        raise CcsimError(f"gpu must name a GPU model (H100, B200, GB200, ...), not {gpu!r}")
    return "grace" if gpu.split("-")[0].upper() in GRACE_GPUS else "x86"


def host_op_s_for(gpu: str) -> float:
    """Host seconds per launched operation for a GPU model's host CPU
    (:data:`HOST_OP_S_BY_CPU`).

    >>> host_op_s_for("GB200"), host_op_s_for("H100")
    (3.708e-05, 1.348e-05)
    """
    return HOST_OP_S_BY_CPU[host_cpu(gpu)]


def _check_s(value: float, name: str, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CcsimError(f"{name} ({what}) must be >= 0, not {value!r}")


def tensor_op_s_for(op_s: float) -> float:
    """Host seconds per framework tensor operation that launches nothing, for a host
    whose launched operation costs ``op_s``: the measured figure of the CPU whose launch
    cost ``op_s`` is (:data:`HOST_OP_S_BY_CPU`, :data:`HOST_TENSOR_OP_S_BY_CPU`); any
    other ``op_s`` (a user's, HTA's 10 us, 0 to leave the host out) scales the x86
    figure in proportion, so ``host_op_s=0`` still turns the host's work off.

    >>> tensor_op_s_for(host_op_s_for("B200")), tensor_op_s_for(host_op_s_for("GB200"))
    (2.15e-06, 2.734375e-06)
    >>> tensor_op_s_for(0.0)
    0.0
    """
    _check_s(op_s, "host_op_s", "host seconds per launched operation")
    for cpu, launch_s in HOST_OP_S_BY_CPU.items():
        # (tolerant: "37.08us" parses to 37.08 * 1e-6, an ulp from 37.08e-6)
        if math.isclose(op_s, launch_s, rel_tol=1e-9):
            return HOST_TENSOR_OP_S_BY_CPU[cpu]
    return op_s * HOST_TENSOR_OP_S / HOST_OP_S


def moe_layer_host_s(
    ops: MoeLayerOps, op_s: float = HOST_OP_S, tensor_op_s: float | None = None
) -> tuple[float, float]:
    """Host seconds of one MoE layer's (forward, backward): ``op_s`` a launched
    operation and ``tensor_op_s`` a framework tensor operation that launches nothing
    (None: :func:`tensor_op_s_for` ``op_s``).

    >>> moe_layer_host_s(moe_layer_ops(local_experts=1, graphs=["full_iteration"]))
    (0.0, 0.0)
    >>> moe_layer_host_s(moe_layer_ops(local_experts=2), 1.0, 0.5)
    (42.0, 52.0)
    """
    _check_s(op_s, "host_op_s", "host seconds per launched operation")
    t = tensor_op_s_for(op_s) if tensor_op_s is None else tensor_op_s
    _check_s(t, "host_tensor_op_s", "host seconds per framework tensor operation")
    return (
        ops.forward() * op_s + ops.forward_tensors() * t,
        ops.backward() * op_s + ops.backward_tensors() * t,
    )


@dataclass(frozen=True)
class Launch:
    """One step of an MoE layer's forward as the host issues it: ``host_s`` seconds of
    launches, then the GPU work that waits for them (``gpu``: "dense", the layer's own
    GEMMs and attention; "dispatch" or "combine", an all-to-all; "experts", the grouped
    GEMMs; None: nothing the replay times, such as the token counts' bookkeeping)."""

    host_s: float
    gpu: str | None


def moe_forward_launches(
    ops: MoeLayerOps,
    op_s: float = HOST_OP_S,
    *,
    dispatcher: str = "alltoall",
    exchanged: bool = True,
    tensor_op_s: float | None = None,
) -> tuple[tuple[Launch, ...], tuple[Launch, ...]]:
    """One MoE layer's forward launches (before, after) its host synchronisation, in
    the order the host issues them, ``op_s`` seconds an operation (and each part's
    framework tensor operations, ``tensor_op_s`` each, None: :func:`tensor_op_s_for`,
    with its launches: the experts' per-expert work with their grouped GEMMs).

    Where the synchronisation falls is the dispatcher's (Megatron-Core core_v0.16.0):
    the alltoall dispatcher copies the token counts to the host before its ``permute``
    (``cuda_dtoh_point`` "before_permutation_1") and waits for them before the
    all-to-all ("before_ep_alltoall" with EP or TP, token_dispatcher.py lines 520-573;
    without either, "before_finish", after the chunk sort); the flex dispatchers read
    the counts the dispatch kernel returns (DeepEP's ``num_recv_tokens_per_expert_list``,
    HybridEP's ``tokens_per_expert``), so theirs follows the dispatch. The GPU's dense
    work waits for the attention's launches only (its shared-expert and router GEMMs,
    launched next, are taken as launched with it: a part-level simplification that can
    only make the GPU start earlier). A graphed part is its one replay.

    >>> ops = moe_layer_ops(local_experts=1, ep=2)
    >>> before, after = moe_forward_launches(ops, 1.0, tensor_op_s=0.5)
    >>> [(s.host_s, s.gpu) for s in before], [(s.host_s, s.gpu) for s in after]
    ([(9.0, 'dense'), (26.0, None)], [(2.0, 'dispatch'), (7.0, 'experts'), (2.0, 'combine')])
    """
    _check_s(op_s, "host_op_s", "host seconds per launched operation")
    t = tensor_op_s_for(op_s) if tensor_op_s is None else tensor_op_s
    _check_s(t, "host_tensor_op_s", "host seconds per framework tensor operation")
    n = {name: getattr(ops, name).forward() + (name in ops.graphed) for name in PARTS}
    # Each part's host seconds: its launches, and its tensor operations at their price.
    sec = {name: n[name] * op_s + getattr(ops, name).tensors * t for name in PARTS}
    if dispatcher == "alltoall" and exchanged:
        permute = min(PERMUTE_KERNELS, n["dispatch"]) * op_s
        before = [
            Launch(sec["attention"], "dense"),
            Launch(sec["shared"] + sec["router"] + sec["preprocess"] + permute, None),
        ]
        after = [Launch(sec["dispatch"] - permute, "dispatch")]
    elif dispatcher == "alltoall":  # nothing to exchange: the sync after the chunk sort
        before = [
            Launch(sec["attention"], "dense"),
            Launch(sec["shared"] + sec["router"] + sec["preprocess"] + sec["dispatch"], None),
        ]
        after = []
    else:  # deepep, hybridep: the counts come back with the dispatch
        before = [
            Launch(sec["attention"], "dense"),
            Launch(sec["shared"] + sec["router"] + sec["dispatch"], "dispatch"),
        ]
        after = [Launch(sec["preprocess"], None)]
    after += [Launch(sec["experts"], "experts"), Launch(sec["combine"], "combine")]
    return tuple(before), tuple(after)
