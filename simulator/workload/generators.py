"""Generators of training-step workloads: DDP, ZeRO-3, Megatron GPT (TP/PP/DP, 1F1B)
and MoE all-to-all. Each returns a :class:`~simulator.workload.trace.Workload`.

Transformer arithmetic (:mod:`~simulator.workload.model`; Narayanan et al., SC'21,
section 5.1): a layer of hidden size h has about 12 h^2 parameters; its forward pass
costs 24 h^2 + 4 s h FLOPs per token (s the sequence length); the backward pass twice
that; activation recomputation adds one more forward. The Megatron generator also
records the configuration's peak memory per GPU (:mod:`~simulator.workload.memory`).
Compute ops carry FLOPs and are timed by the device roofline at replay time, so the same
trace runs on A100s or H100s.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Generator, Mapping
from typing import Any

from ..errors import CcsimError, unknown_choice
from .host import HOST_OP_S, Launch, moe_forward_launches, moe_layer_host_s, moe_layer_ops
from .kernels import ATTENTION_BACKENDS, Gemm
from .memory import (
    GRAD_REDUCE,
    GRADIENT_BYTES,
    OPTIMIZER_BYTES,
    MemoryEstimate,
    chunk_layer_range,
    fsdp_gathered_units,
    megatron_memory,
    optimizer_state_bytes,
    pipeline_chunks,
)
from .model import DISPATCHERS, MODELS, MXFP8_BLOCK, Transformer, fp8_cast_cost
from .optimizer_host import optimizer_host_ops
from .pipeline import pipeline_order, pipeline_steps
from .trace import (
    FORMAT,
    Op,
    Replicas,
    Shadows,
    Workload,
    parse_workload,
    trusted_op,
    trusted_workload,
)
from .userbuffers import (
    LINEAR_NAMES,
    TP_COMM_OVERLAPS,
    UbOverlap,
    ub_gemm,
    userbuffers_config,
    userbuffers_exposed,
)

BF16 = 2  # bytes per parameter, gradient and activation element


class _Builder:
    """Collects ops with readable ids: in trace format, or, ``trusted`` (this module's
    generators), as :class:`~simulator.workload.trace.Op` objects made as each op comes
    (the workload is then the one :func:`parse_workload` builds from the trace format
    with ``trusted``, without making and reading that plain data)."""

    def __init__(self, name: str, ranks: int, description: str, trusted: bool = False):
        self.channels = 1  # parallel rings per collective (set by generators that take it)
        #: Whether the ops are this module's generators' (built without the trace
        #: format's per-op checks, see parse_workload) rather than read from a file.
        self.trusted = trusted
        self.data: dict[str, Any] = {
            "format": FORMAT,
            "name": name,
            "description": description,
            "ranks": ranks,
            "groups": {},
            "ops": [],
        }
        # Trusted: the ops made so far, each one's dependencies (ids), and the GEMM and
        # attention tuples they share (trusted_op's cache).
        self._ops: list[Op] = []
        self._deps: list[list[str] | None] = []
        # Trusted: each op's index by id, as the ops come: an op's deps made before it
        # (nearly all) are its indices at once, the others (None here) resolved by id
        # at the end (trusted_workload), without a table of every op's id made then.
        self._ids: dict[str, int] = {}
        self._cache: dict[Any, Any] = {}

    def group(self, name: str, kind: str, ranks: list[int]) -> str:
        self.data["groups"][name] = {"kind": kind, "ranks": ranks}
        return name

    def op(
        self, op_id: str, rank: int, kind: str, deps: list[str] | None = None, **fields: Any
    ) -> str:
        if kind == "collective" and self.channels != 1 and "channels" not in fields:
            fields["channels"] = self.channels
        if self.trusted:
            ops = self._ops
            index = len(ops)
            op = trusted_op(index, op_id, rank, kind, fields, self.data["name"], self._cache)
            ops.append(op)
            ids = self._ids
            names = None
            if deps:
                found = [ids.get(d) for d in deps if d]
                if None in found:
                    names = [d for d in deps if d]
                else:
                    op.deps = found
            self._deps.append(names)
            ids[op.id] = index
            return op_id
        entry = {"id": op_id, "rank": rank, "kind": kind, **fields}
        if deps:
            entry["deps"] = [d for d in deps if d]
        self.data["ops"].append(entry)
        return op_id

    def build(self, replicas: Replicas | None = None, shadows: Shadows | None = None) -> Workload:
        if self.trusted:
            if not self._ops:
                # (The checks' message: a generator never builds nothing.)
                return parse_workload(self.data, origin=self.data["name"])
            return trusted_workload(
                self.data, self._ops, self._deps, replicas=replicas, shadows=shadows, ids=self._ids
            )
        return parse_workload(
            self.data,
            origin=self.data["name"],
            replicas=replicas,
            shadows=shadows,
        )


def flash_core_kernels(
    m: Transformer,
    micro_batch: int,
    *,
    tp: int,
    layers: int,
    forward: bool,
    recompute: str = "none",
    cp: int = 1,
    backend: int = 0,
    dropout: bool = False,
) -> list[list[int]]:
    """The flash-attention kernels of one pass over ``layers`` layers on one TP (and CP)
    rank, in the trace's ``attention`` form (:class:`~simulator.workload.kernels.Attention`):
    per layer one causal kernel over the micro-batch's sequences and the rank's heads,
    the b s / cp tokens a CP rank holds queries for against the whole sequence (Megatron
    balances the causal work over CP ranks by giving each two opposite chunks); backward
    its backward kernel, after the forward's again with full or selective recomputation.
    ``backend``: the kernels' library (:data:`~simulator.workload.kernels.ATTENTION_BACKENDS`);
    ``dropout``: the kernels apply attention dropout (Megatron-LM's ``--attention-dropout``).

    Sliding-window attention (``m.window``, gpt-oss): a windowed layer's kernel meets
    :meth:`~simulator.workload.model.Transformer.window_keys` keys a query (cuDNN's
    fused attention runs windows of (left, 0) with causal masks, Transformer Engine
    v2.9-v2.18 ``nvte_get_fused_attn_backend``, so the band's tiles alone). Every
    layer of a pass is built as the model's mean layer: of its sequence-heads, the
    model's share of windowed layers (:attr:`~simulator.workload.model.Transformer.
    windowed_layers`, rounded) run the windowed kernel, the others the full one, which
    is the model's total over its layers exactly, a pipeline stage's to within half a
    layer's difference (gpt-oss's 9-layer stages hold 4 or 5 windowed layers).
    """
    batch = micro_batch * math.ceil(m.attention_heads / tp)
    tail = [backend, 1] if dropout else [backend] if backend else []
    # (MLA: the mean of its query/key and value head sizes, the same FLOPs.)
    shapes = [(batch, m.seq)]
    if m.window and m.window_keys() < m.seq:
        windowed = round(batch * m.windowed_layers / m.layers)
        shapes = [(batch - windowed, m.seq), (windowed, m.window_keys())]
    kernels = [
        [part, m.seq // cp, keys, round(m.core_width), layers] for part, keys in shapes if part
    ]
    if forward:
        return [[*k, 0, *tail] for k in kernels]
    again = [[*k, 0, *tail] for k in kernels] if recompute in ("full", "selective") else []
    return [*again, *([*k, 1, *tail] for k in kernels)]


def pass_work(
    m: Transformer,
    micro_batch: int,
    *,
    tp: int,
    layers: int,
    forward: bool,
    recompute: str = "none",
    flash_attention: bool = False,
    logits: bool = False,
    precision: str = "bf16",
    cp: int = 1,
    core: bool = True,
    moe: bool = False,
    fp8_block: int = 0,
    userbuffers: Mapping[str, UbOverlap] | None = None,
    attention_backend: int = 0,
    attention_dropout: bool = False,
    recompute_up_proj: bool = False,
) -> dict[str, Any]:
    """The GEMMs (and, with flash attention, the fused attention's FLOPs) of one
    forward or backward pass over ``layers`` layers of a micro-batch on one TP rank, as
    compute-op fields.

    Backward runs each forward GEMM's two gradient GEMMs (twice its FLOPs); full
    recomputation runs the forward GEMMs again first, selective recomputation the
    attention core's. The flash-attention kernel (Dao et al. 2022) keeps the scores on
    chip, so its core is timed as FLOPs at the GEMM rate without the scores' HBM
    traffic (:func:`flash_core_kernels`); ``core=False`` leaves it out, for a caller that
    runs it as its own op. ``logits`` adds the output layer's GEMM (forward) or its two
    gradients (backward), once per pass. With ``precision`` "fp8" the linear layers'
    GEMMs (forward and both gradients) run on fp8 operands at the device's fp8 peak, as
    Transformer Engine runs them; the attention core, the logits and an MoE layer's
    router stay bf16
    (``fp8_block`` 32: MXFP8's block-scaled operands, :class:`~.kernels.Gemm`). ``cp``
    context-parallel ranks each run b s / cp of the tokens (flash attention only).
    ``moe`` takes MoE layers' GEMMs that every rank runs itself (attention, shared
    experts, router: :meth:`~simulator.workload.model.Transformer.moe_linear_gemms`);
    their routed experts are the caller's (:func:`megatron` with ``ep``).
    ``userbuffers`` (a dense, non-MLA layer's): its linear GEMMs as Transformer
    Engine's TP overlap runs them (:class:`~.userbuffers.UbOverlap`, :func:`~.userbuffers.ub_gemm`).
    ``attention_backend``: the fused attention's library, ``attention_dropout``: its
    kernels apply dropout (:func:`flash_core_kernels`). ``recompute_up_proj``
    (Megatron-Core's "mla_up_proj"): the backward runs an MLA layer's up projections'
    forward GEMMs again first (:meth:`~simulator.workload.model.Transformer.mla_up_gemms`;
    full recomputation re-runs them anyway).
    """
    if moe:
        linear = list(m.moe_linear_gemms(micro_batch, tp=tp, cp=cp))
    else:
        linear = list(m.linear_gemms(micro_batch, tp=tp, cp=cp))
    if precision == "fp8":
        # An MoE layer's router GEMM (the last of moe_linear_gemms) stays in bf16: it is
        # no TE module under fp8 autocast; Megatron-Core runs it through
        # ``te_general_gemm`` on the unquantized input and weight in the router's dtype
        # (core_v0.16.0 moe/router.py lines 94-100, moe/moe_utils.py lines 1192-1193,
        # RouterGatingLinearFunction).
        quantized = len(linear) - 1 if moe else len(linear)
        linear = [g.in_bits(8, fp8_block) if i < quantized else g for i, g in enumerate(linear)]
    scores = [] if flash_attention else list(m.attention_gemms(micro_batch, tp=tp))
    ub = userbuffers if userbuffers and not moe and len(linear) == 4 else None
    if ub:
        names = LINEAR_NAMES
        fprop = [ub_gemm(g, ub[f"{n}_fprop"], tp) for n, g in zip(names, linear, strict=True)]
        grads = []
        for n, g in zip(names, linear, strict=True):
            dgrad, wgrad = g.backward()
            grads += [
                ub_gemm(dgrad, ub[f"{n}_dgrad"], tp),
                ub_gemm(wgrad, ub.get(f"{n}_wgrad"), tp),
            ]
    else:
        fprop = linear
        grads = [grad for g in linear for grad in g.backward()]
    if forward:
        gemms = fprop + scores
    else:
        gemms = grads + [grad for g in scores for grad in g.backward()]
        if recompute == "full":
            gemms = fprop + scores + gemms
        elif recompute == "selective":
            gemms = scores + gemms
        if recompute_up_proj and recompute != "full":
            up = list(m.mla_up_gemms(micro_batch, tp=tp, cp=cp))
            gemms = [g.in_bits(8, fp8_block) if precision == "fp8" else g for g in up] + gemms
    # A pass over no layers (a chunk holding only the embedding or the loss) runs none.
    gemms = [g.times(layers) for g in gemms] if layers else []
    if logits and m.vocab:
        out = m.logits_gemm(micro_batch, tp=tp, cp=cp)
        gemms += [out] if forward else list(out.backward())
    if not gemms:
        return {"flops": 0.0}  # nothing but the embedding lookup, not timed
    work: dict[str, Any] = {"gemms": [g.as_list() for g in gemms]}
    if flash_attention and core and layers:
        work["attention"] = flash_core_kernels(
            m,
            micro_batch,
            tp=tp,
            layers=layers,
            forward=forward,
            recompute=recompute,
            cp=cp,
            backend=attention_backend,
            dropout=attention_dropout,
        )
    return work


PRECISIONS = ("bf16", "fp8")
#: Where a rank's pipeline sends and receives run (``megatron(p2p_streams=...)``):
#: "peer", one FIFO stream per neighbour carrying both directions' transfers with it,
#: as PyTorch runs an un-batched isend/irecv (ProcessGroupNCCL::pointToPoint: the
#: communicator and stream of key getKeySendRecv(rank, peer), "lowRank:highRank");
#: "split", a stream each for sends to and receives from each neighbour.
P2P_STREAMS = ("peer", "split")
#: Delayed scaling's amax all-reduce (``megatron(amax_reduction=...)``): "stage", over
#: the TP x DP x CP ranks of a pipeline stage (Megatron-Core's fp8 group,
#: parallel_state.get_amax_reduction_group, unless tp_only_amax_red); "tp", over the
#: TP group alone (tp_only_amax_red); "off", none.
AMAX_REDUCTIONS = ("stage", "tp", "off")
#: Context parallelism's attention (``megatron(cp_comm_type=...)``): Megatron-Core's
#: ``--cp-comm-type`` (megatron/training/arguments.py line 3054 at core_v0.19.0, default
#: "p2p"; the values as transformer_config.py lines 987-1000 describe them), each run by
#: Transformer Engine's ``attn_forward_func_with_cp`` (transformer_engine/pytorch/
#: attention/dot_product_attention/context_parallel.py, v2.18): "p2p", K/V blocks
#: passed around the CP ring beside the attention blocks (AttnFuncWithCPAndKVP2P);
#: "all_gather", K and V all-gathered before the attention and dK, dV reduce-scattered
#: after its backward, blocking (AttnFuncWithCPAndKVAllGather, as the Llama 3 paper's
#: section 3.3.2 does); "a2a", DeepSpeed-Ulysses' all-to-alls of Q, K, V (heads split,
#: sequence gathered) and of the output back (AttnFuncWithCPAndQKVOA2A); "a2a+p2p",
#: all-to-alls inside low-level CP groups and the ring between them
#: (AttnFuncWithCPAndKVP2P with two groups; ``hierarchical_context_parallel_sizes``).
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
#: fp32 amaxes a Transformer Engine module reduces per fp8 GEMM: 3 forward (input,
#: weight, output) and 2 backward (output and input gradients)
#: (TransformerEngine v1.12, transformer_engine/pytorch/module/base.py:487,
#: ``num_fp8_tensors``); a Megatron-Core layer has 4 fp8 GEMMs (QKV, projection, FC1,
#: FC2).
AMAX_BYTES_PER_LAYER = {True: 4 * 3 * 4, False: 4 * 2 * 4}

#: Parameter tensors of a dense Megatron-Core layer with Transformer Engine's modules
#: (Llama: no biases): the fp8-capable weights of linear_qkv, linear_proj, linear_fc1
#: and linear_fc2, and the two norms' weights fused into linear_qkv and linear_fc1
#: (TE LayerNormLinear's layer_norm_weight), which stay bf16 beside fp8 weights.
DENSE_FP8_WEIGHTS = 4
DENSE_LAYER_TENSORS = 6


def tp_amax_calls(
    dense: int, moe: int, *, forward: bool, recompute: str, shared_experts: bool = False
) -> int:
    """Blocking TP amax all-reduces a pass of ``dense`` dense and ``moe`` MoE layers
    makes under per-tensor current scaling with sequence parallelism
    (``megatron(tp_amax_seconds=...)``).

    Transformer Engine 2.x's current-scaling quantizer reduces the amax of a tensor it is
    about to all-gather in fp8 over the TP group, so that every rank casts with one scale:
    a column-parallel module's input in the forward and a row-parallel module's output
    gradient in the backward, where the module is sequence parallel
    (transformer_engine/pytorch/module/linear.py ``_customize_quantizers_float8_current_
    scaling``, lines 1649-1656 and 1666-1673 at v2.9; layernorm_linear.py lines 1755-1801;
    layernorm_mlp.py lines 2125-2177; the same since v2.2, linear.py lines 1240-1265).
    The all-reduce is waited before the cast (csrc/quantizer.cpp
    ``Float8CurrentScalingQuantizer::quantize_impl``, lines 521-528 at v2.9:
    ``allreduce(...)->wait()``), so the compute stream stalls for it.

    A Megatron-Core dense layer has two column-parallel modules (QKV, FC1) and two
    row-parallel ones (projection, FC2): two calls forward and two backward. An MoE
    layer's attention has one of each; its routed experts run ``GroupedLinear``, which
    reduces no amax (grouped_linear.py at v2.9 sets no ``with_amax_reduction``), and its
    shared experts (``shared_experts``) are one more column/row pair. Full recomputation
    re-runs the forward's calls in the backward.

    >>> tp_amax_calls(4, 0, forward=True, recompute="none")
    8
    >>> tp_amax_calls(4, 0, forward=False, recompute="full")
    16
    >>> tp_amax_calls(0, 2, forward=True, recompute="none", shared_experts=True)
    4
    """
    pair = 1 + (1 if shared_experts else 0)
    calls = 2 * dense + pair * moe
    if not forward and recompute == "full":
        calls *= 2
    return calls


#: Passes Megatron-Core's data-parallel wrapper makes over its contiguous gradient buffer
#: each step beside the reduction and the optimizer's read (``megatron(grad_buffer_passes
#: =...)``), as buffer elements moved each (memory-bound kernels on the compute stream),
#: at core_r0.8.0: "zero", ``zero_grad_buffer`` at the start of every step
#: (megatron/training/training.py line 585; distributed_data_parallel.py lines 274-283;
#: param_and_grad_buffer.py line 508, ``grad_data.zero_()``: a write); before each
#: bucket's reduction (``Bucket.start_grad_sync``, param_and_grad_buffer.py lines
#: 109-123) "nan_check", ``check_for_nan_in_grad``'s ``grad_data.norm(p=2)`` (a read;
#: on by default, ``--no-check-for-nan-in-loss-and-grad`` turns it off: arguments.py
#: lines 1016-1018, training.py line 450), and "scale", ``grad_data *=
#: gradient_scaling_factor`` (a read and a write), 1 / dp unless
#: ``--ddp-average-in-collective`` (distributed_data_parallel.py lines 146-158).
#: The NaN check's host synchronisation (``assert not norm.isnan()``) is not modelled.
GRAD_BUFFER_PASSES = {"zero": 1, "nan_check": 1, "scale": 2}

#: Rows each expert's tokens are padded to a multiple of before fp8 grouped GEMMs, by
#: whether the recipe is MXFP8: Transformer Engine's ``Fp8Padding`` takes "32 for MXFP8
#: and 16 for others" (transformer_engine/pytorch/module/fp8_padding.py, v2.8), which
#: Megatron-Core's ``TEGroupedMLP`` applies in fp8 (experts.py, core_v0.13.0-0.16.0).
FP8_ALIGN = {False: 16, True: 32}

#: How a dropless MoE layer's tokens pick their experts: "random" (each token's top k a
#: uniform draw, as Megatron-Core's ``moe_router_force_load_balancing`` makes them and the
#: published benchmarks run; the busiest expert-parallel rank sets the pace,
#: :meth:`~simulator.workload.model.Transformer.busiest_rank_copies`) or "even" (every
#: expert exactly the mean: an ideal bound).
MOE_ROUTINGS = ("random", "even")

#: dropless dispatchers read the tokens each expert got on the host before the layer
#: can go on (Megatron-Core's token_dispatcher.py: MoEAlltoAllTokenDispatcher's
#: ``cuda_sync_point`` "before_ep_alltoall", ``d2h_event.synchronize()``; HybridEP's
#: ``tokens_per_expert.sum()`` "CPU sync in dispatch" without a rank capacity;
#: fused_a2a.py: DeepEP's dispatch returns ``num_recv_tokens_per_expert_list`` on the
#: host; Transformer Engine's GroupedLinear takes ``m_splits`` as a host list), so the
#: queue the host had launched ahead drains and the next kernel waits for its launch.
#: NVIDIA's "Getting Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs,
#: A. Gray, 2019, on a V100) timed a short kernel (2.9 us of GPU work) at 9.6 us a
#: launch with a stream synchronisation after each and 3.8 us without: 5.8 us exposed
#: per synchronisation (a C++ host loop; PyTorch's dispatch adds to it, not counted).
#: Those figures are recalled, NOT verified: the search tool's stored copies of the post
#: (checked session 2026-11-26) hold its title and first sentence only, and no other
#: stored page quotes them. What they stand for is the synchronisation's own gap; the
#: host's time to launch the rest of the layer after it, which the same synchronisation
#: exposes, is not in it (``moe_host_layer_s``).
HOST_SYNC_S = 9.6e-6 - 3.8e-6


def _model(model: str | Transformer, generator: str = "", moe_ok: bool = False) -> Transformer:
    if isinstance(model, Transformer):
        m = model
    elif model not in MODELS:
        raise CcsimError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}")
    else:
        m = MODELS[model]
    if m.is_moe and generator and not moe_ok:
        raise CcsimError(
            f"{m.name or 'this model'} is a mixture-of-experts model: expert parallelism is "
            f"not modelled by the {generator} generator yet (the moe generator runs expert "
            "layers alone); pick a dense model"
        )
    return m


def check_tensor_parallel(m: Transformer, tp: object) -> None:
    """Refuse a TP size that does not split the model's attention heads and key/value
    heads (query groups) evenly, as Megatron-LM does (its TransformerConfig:
    ``num_attention_heads`` and ``num_query_groups`` must be multiples of
    ``tensor_model_parallel_size``).

    >>> check_tensor_parallel(MODELS["gpt3-175b"], 8)
    >>> try:
    ...     check_tensor_parallel(MODELS["gpt3-175b"], 7)
    ... except CcsimError as error:
    ...     print(str(error)[:57])
    tp 7 does not split gpt3-175b's 96 attention heads evenly
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CcsimError(f"tp (tensor-parallel ranks) must be a positive integer, not {tp!r}")
    name = m.name or "the model"
    for count, what in (
        (m.attention_heads, "attention heads"),
        (m.query_groups, "key/value heads"),
    ):
        if count % tp:
            divisors = [d for d in range(1, min(count, 16) + 1) if count % d == 0]
            raise CcsimError(
                f"tp {tp} does not split {name}'s {count} {what} evenly, as Megatron-LM "
                f"requires; pick a tp that divides {count} ({', '.join(map(str, divisors))}"
                + (", ...)" if count > 16 else ")")
            )


def ddp(
    model: str | Transformer = "gpt-1.5b",
    *,
    ranks: int = 8,
    micro_batch: int = 4,
    bucket_bytes: float = 25 * 2**20,
    grad_reduce: str = "fp32",
) -> Workload:
    """Data parallel training step with bucketed gradient all-reduce (PyTorch DDP).

    Every rank runs forward then backward layer by layer (each layer its GEMMs, then its
    memory-bound kernels, as in :func:`megatron`); gradients are all-reduced in
    buckets of ``bucket_bytes`` (DDP's default 25 MiB) on a communication stream as soon
    as the layers filling a bucket have finished their backward, overlapping the rest of
    the backward pass. The optimizer step waits for every bucket. ``grad_reduce`` is the
    gradients' dtype: "fp32" (4 bytes a parameter) under PyTorch's automatic mixed
    precision, which computes in bf16 or fp16 but keeps fp32 parameters, hence fp32
    gradients in DDP's buckets; "bf16" or "fp16" (2 bytes) for a model cast to that dtype
    or a compression hook such as DDP's ``bf16_compress_hook``.
    """
    if grad_reduce not in GRAD_REDUCE:
        raise CcsimError(
            f"grad_reduce must be {', '.join(GRAD_REDUCE)} (the gradients' dtype), "
            f"not {grad_reduce!r}"
        )
    if not bucket_bytes > 0:
        raise CcsimError(
            f"the DDP bucket size (--bucket, bucket_bytes) must be a positive number of bytes, "
            f"such as 25MiB; got {bucket_bytes!r}"
        )
    m = _model(model, "ddp")
    b = _Builder(
        f"ddp-{ranks}",
        ranks,
        f"DDP, {m.params / 1e9:.1f}B params, {ranks} ranks, micro-batch {micro_batch}",
        trusted=True,
    )
    dp = b.group("dp", "DP", list(range(ranks)))
    grad_bytes = m.layer_params * GRAD_REDUCE[grad_reduce][0]
    for r in range(ranks):
        prev = None
        for layer in range(m.layers):
            prev = _layer_pass(b, r, m, micro_batch, "fwd", layer, [prev])
        pending = 0.0
        bucket = 0
        last_ar = None
        for layer in reversed(range(m.layers)):
            prev = _layer_pass(b, r, m, micro_batch, "bwd", layer, [prev])
            pending += grad_bytes
            if pending >= bucket_bytes or layer == 0:
                last_ar = b.op(
                    f"r{r}.ar{bucket}",
                    r,
                    "collective",
                    [prev],
                    op="all_reduce",
                    group=dp,
                    bytes=pending,
                    label=f"grad bucket {bucket}",
                )
                bucket += 1
                pending = 0.0
        # Optimizer: read and write weights, gradients and Adam state (memory bound).
        b.op(
            f"r{r}.opt",
            r,
            "compute",
            [prev, last_ar],
            flops=0.0,
            bytes=m.params * 16,
            label="optimizer",
        )
    return b.build()


def _layer_pass(
    b: _Builder, r: int, m: Transformer, micro_batch: int, phase: str, layer: int, deps: list
) -> str:
    """One layer's forward ("fwd") or backward ("bwd") on rank ``r``: its GEMMs and
    flash attention (PyTorch's scaled_dot_product_attention picks the flash kernel by
    default since 2.0; :func:`pass_work`), then its memory-bound kernels
    (:meth:`~simulator.workload.model.Transformer.layer_elementwise_bytes`, backward
    twice the forward's); returns the id of the last op."""
    times = 1 if phase == "fwd" else 2
    tokens = micro_batch * m.seq
    gemm = b.op(
        f"r{r}.{phase}{layer}",
        r,
        "compute",
        deps,
        **pass_work(m, micro_batch, tp=1, layers=1, forward=phase == "fwd", flash_attention=True),
        label=f"{phase} {layer}",
    )
    return b.op(
        f"r{r}.{phase}{layer}.elementwise",
        r,
        "compute",
        [gemm],
        flops=0.0,
        bytes=times * m.layer_elementwise_bytes(tokens, flash_attention=True),
        label=f"{phase} {layer} elementwise",
    )


def zero3(
    model: str | Transformer = "llama-13b",
    *,
    ranks: int = 16,
    micro_batch: int = 1,
    prefetch: int = 1,
    channels: int = 1,
) -> Workload:
    """ZeRO-3 (DeepSpeed / FSDP) step: parameters are sharded over all ranks.

    Before each layer's forward and again before its backward the layer's parameters are
    all-gathered (prefetched ``prefetch`` layers ahead on an ``ag`` stream); after each
    layer's backward its gradients are reduce-scattered on an ``rs`` stream. Compute
    waits for its gather; the step ends when every reduce-scatter is done and the
    sharded optimizer step (1/p of the memory traffic) ran. ``channels`` is the number
    of parallel rings each collective uses (NCCL uses several; more channels leave a
    server through more NICs).
    """
    m = _model(model, "zero3")
    b = _Builder(
        f"zero3-{ranks}",
        ranks,
        f"ZeRO-3, {m.params / 1e9:.1f}B params, {ranks} ranks, micro-batch {micro_batch}",
        trusted=True,
    )
    b.channels = channels
    dp = b.group("dp", "DP", list(range(ranks)))
    layer_bytes = m.layer_params * BF16
    order = [("fwd", layer) for layer in range(m.layers)]
    order += [("bwd", layer) for layer in reversed(range(m.layers))]
    for r in range(ranks):
        gathers = []
        computes: list[str] = []
        last_rs = None
        for k, (phase, layer) in enumerate(order):
            # The gather for step k may start once compute k - prefetch - 1 is done
            # (the buffer it reuses is free), which bounds memory as prefetching does.
            gate = computes[k - prefetch - 1] if k - prefetch - 1 >= 0 else None
            gathers.append(
                b.op(
                    f"r{r}.ag.{phase}{layer}",
                    r,
                    "collective",
                    [gate],
                    op="all_gather",
                    group=dp,
                    bytes=layer_bytes,
                    stream="ag",
                    label=f"gather {phase} {layer}",
                )
            )
            computes.append(_layer_pass(b, r, m, micro_batch, phase, layer, [gathers[k]]))
            if phase == "bwd":
                last_rs = b.op(
                    f"r{r}.rs{layer}",
                    r,
                    "collective",
                    [computes[k]],
                    op="reduce_scatter",
                    group=dp,
                    bytes=layer_bytes,
                    stream="rs",
                    label=f"grad {layer}",
                )
        b.op(
            f"r{r}.opt",
            r,
            "compute",
            [computes[-1], last_rs],
            flops=0.0,
            bytes=m.params * 16 / ranks,
            label="optimizer (shard)",
        )
    return b.build()


#: The options a Megatron step takes when they are not given, by ``defaults``:
#: "megatron-core" is what Megatron-Core runs today as NVIDIA's recipes configure it
#: (Megatron-Bridge / NeMo performance recipes and the Megatron-LM README's H100 runs,
#: which state --overlap-grad-reduce, --overlap-param-gather and --tp-comm-overlap):
#: no activation recomputation (Megatron-LM's default: --recompute-granularity unset),
#: Transformer Engine's fused (flash) attention (--attention-backend auto), sequence
#: parallelism wherever TP > 1 (the recipes' sequence_parallel; TE's TP overlap needs
#: it), the distributed optimizer wherever the weights have replicas
#: (--use-distributed-optimizer, in every recipe), the gradient reduce-scatter and the
#: parameter all-gather overlapped with the backward and the next forward, and TP
#: collectives overlapped with the GEMMs (TE userbuffers). "sc21" is Megatron-LM as
#: Narayanan et al. ran it in 2021 (SC'21): full recomputation, unfused attention, TP
#: all-reduces, a replicated optimizer, nothing overlapped. Both run the loss as
#: Megatron's unfused fp32 cross-entropy (``cross_entropy``: Megatron-Core's default,
#: and the only one in 2021; :data:`~simulator.workload.model.CROSS_ENTROPY_BYTES`).
#: A value given explicitly always wins. ``None`` entries depend on the configuration
#: (:func:`megatron_options`).
MEGATRON_DEFAULTS: dict[str, dict[str, Any]] = {
    "megatron-core": {
        "recompute": "none",
        "flash_attention": True,
        "sequence_parallel": None,
        "distributed_optimizer": None,
        "overlap_grad_reduce": None,
        "overlap_param_gather": None,
        "tp_comm_overlap": None,
        "cross_entropy": "unfused",
    },
    "sc21": {
        "recompute": "full",
        "flash_attention": False,
        "sequence_parallel": False,
        "distributed_optimizer": False,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "tp_comm_overlap": False,
        "cross_entropy": "unfused",
    },
}


def megatron_options(
    defaults: str,
    given: Mapping[str, Any],
    *,
    tp: int,
    dp: int,
    cp: int = 1,
    fsdp: bool = False,
    moe: bool = False,
) -> dict[str, Any]:
    """The options a Megatron step runs with: those ``given`` (not None), else the
    ``defaults`` set's (:data:`MEGATRON_DEFAULTS`), where "megatron-core"'s depend on the
    configuration: sequence parallelism wherever TP > 1; the distributed optimizer
    wherever the weights have replicas (DP x CP > 1) and FSDP does not shard them; the
    gradient reduction overlapped wherever there is one (a mixture-of-experts model's
    dense and expert gradients alike; ``moe`` is kept for callers); the parameter
    all-gather overlapped wherever the distributed optimizer runs one; TP collectives
    overlapped wherever sequence parallelism runs them.

    >>> o = megatron_options("megatron-core", {}, tp=8, dp=4)
    >>> o["recompute"], o["sequence_parallel"], o["distributed_optimizer"], o["tp_comm_overlap"]
    ('none', True, True, True)
    >>> megatron_options("megatron-core", {"recompute": True}, tp=1, dp=1)["recompute"]
    'full'
    """
    options = dict(MEGATRON_DEFAULTS[defaults])
    options.update({k: v for k, v in given.items() if v is not None})
    replicas = dp * cp > 1

    def auto(name: str, value: bool) -> None:
        if options[name] is None:
            options[name] = value

    auto("sequence_parallel", tp > 1)
    auto("distributed_optimizer", replicas and not fsdp)
    auto("overlap_grad_reduce", replicas and not fsdp)
    auto("overlap_param_gather", bool(options["distributed_optimizer"]) and replicas)
    auto("tp_comm_overlap", tp > 1 and bool(options["sequence_parallel"]))
    recompute = options["recompute"]
    if recompute in (True, "full"):
        options["recompute"] = "full"
    elif recompute in (False, "none"):
        options["recompute"] = "none"
    elif recompute != "selective":
        raise CcsimError(
            f"recompute must be true, false, full, selective or none, not {recompute!r}"
        )
    return options


def moe_replicas(unit: int, *, ep: int, tp: int, cp: int, dp: int) -> int:
    """Data-parallel replicas a mixture-of-experts step's ops are built for, standing for
    the next as many (``unit`` asked for): a multiple of the replicas an EP group covers
    where its ``ep`` ranks are whole replicas of TP x CP ranks, so that each EP group
    lies in one such unit (:class:`~simulator.workload.trace.Replicas`: every group lies
    in one or spans them all); ``unit`` itself where an EP group spans every replica
    (its call then runs as its schedule's quotient) or lies within one replica; every
    replica (``dp``) where the EP groups straddle replicas otherwise.

    >>> moe_replicas(1, ep=8, tp=1, cp=1, dp=32), moe_replicas(1, ep=64, tp=2, cp=1, dp=32)
    (8, 1)
    >>> moe_replicas(1, ep=8, tp=4, cp=2, dp=8), moe_replicas(1, ep=4, tp=8, cp=1, dp=4)
    (1, 1)
    >>> moe_replicas(2, ep=8, tp=1, cp=1, dp=12), moe_replicas(1, ep=2, tp=3, cp=1, dp=4)
    (12, 4)
    """
    size = tp * cp  # ranks of a replica in a stage
    if ep == size * dp or size % ep == 0:
        return unit
    if ep % size == 0:
        k = math.lcm(unit, ep // size)
        return k if dp % k == 0 else dp
    return dp


def megatron_step_memory(
    model: str | Transformer = "gpt3-175b",
    *,
    tp: int = 8,
    pp: int = 8,
    dp: int = 1,
    micro_batch: int = 1,
    global_batch: int | None = None,
    virtual_stages: int = 1,
    defaults: str = "megatron-core",
    precision: str = "bf16",
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    fsdp: bool = False,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    grad_reduce: str = "fp32",
    fp8_param_gather: bool = False,
    optimizer_state: str | None = None,
    account_for_embedding_in_pipeline_split: bool = False,
    account_for_loss_in_pipeline_split: bool = False,
    activation_offload_layers: int = 0,
    fp8_recipe: str = "tensorwise",
    fp8_transpose: bool = True,
    fsdp_communication_unit: float | None = None,
    fsdp_double_buffer: bool = False,
    activation_offload_in_flight: int = 0,
    lazy_gradients: bool = False,
    **given: Any,
) -> MemoryEstimate:
    """The memory :func:`megatron` would report for these arguments, without building the
    step (its options resolved alike; the others, which set only its timing, ignored)."""
    if defaults not in MEGATRON_DEFAULTS:
        raise unknown_choice("defaults", defaults, MEGATRON_DEFAULTS)
    m = _model(model, "megatron", moe_ok=True)
    check_tensor_parallel(m, tp)
    names = ("recompute", "sequence_parallel", "distributed_optimizer", "flash_attention")
    chosen = megatron_options(
        defaults,
        {
            name: given.get(name)
            for name in (*names, "overlap_grad_reduce", "tp_comm_overlap", "overlap_param_gather")
        },
        tp=tp,
        dp=dp,
        cp=cp,
        fsdp=fsdp,
        moe=m.is_moe,
    )
    global_batch = global_batch or micro_batch * dp * 4 * pp
    return megatron_memory(
        m,
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch=micro_batch,
        micro_batches=max(1, global_batch // (micro_batch * dp)),
        virtual_stages=virtual_stages,
        precision=precision,
        cp=cp,
        ep=ep,
        etp=etp,
        fsdp=fsdp,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        grad_reduce=grad_reduce,
        fp8_params=fp8_param_gather,
        optimizer_state=optimizer_state,
        account_for_embedding=account_for_embedding_in_pipeline_split,
        account_for_loss=account_for_loss_in_pipeline_split,
        activation_offload_layers=activation_offload_layers,
        moe_a2a_overlap=bool(given.get("moe_a2a_overlap", False)),
        fp8_recipe=fp8_recipe,
        fp8_transpose=fp8_transpose,
        fsdp_communication_unit=fsdp_communication_unit,
        fsdp_double_buffer=fsdp_double_buffer,
        activation_offload_in_flight=activation_offload_in_flight,
        lazy_gradients=lazy_gradients,
        cp_comm_type=str(given.get("cp_comm_type", "p2p")),
        **{name: chosen[name] for name in names},
    )


def megatron(
    model: str | Transformer = "gpt3-175b",
    *,
    tp: int = 8,
    pp: int = 8,
    dp: int = 1,
    micro_batch: int = 1,
    global_batch: int | None = None,
    recompute: bool | str | None = None,
    sequence_parallel: bool | None = None,
    distributed_optimizer: bool | None = None,
    virtual_stages: int = 1,
    flash_attention: bool | None = None,
    overlap_grad_reduce: bool | None = None,
    tp_comm_overlap: bool | str | None = None,
    overlap_param_gather: bool | None = None,
    defaults: str = "megatron-core",
    precision: str = "bf16",
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    fsdp: bool = False,
    replicas: bool | int = False,
    shadows: bool | str = False,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    grad_reduce: str = "fp32",
    fp8_param_gather: bool = False,
    fp8_recipe: str = "tensorwise",
    fp8_transpose: bool = True,
    optimizer_state: str | None = None,
    account_for_embedding_in_pipeline_split: bool = False,
    account_for_loss_in_pipeline_split: bool = False,
    cross_entropy: str | None = None,
    activation_offload_layers: int = 0,
    moe_dispatcher: str = "alltoall",
    ep_domain: int = 8,
    moe_host_sync: bool = True,
    moe_a2a_overlap: bool = False,
    moe_host_layer_s: float | None = None,
    moe_routing: str = "random",
    moe_routed_casts: bool = True,
    moe_fused_grouped_mlp: bool = False,
    recompute_moe_act: bool = False,
    recompute_mla_up_proj: bool = False,
    fused_yarn_rope: bool = False,
    mla_fused_rope: bool = True,
    overlap_p2p_comm: bool | None = None,
    p2p_streams: str | None = None,
    p2p_send_wait: bool | None = None,
    amax_reduction: str | None = None,
    amax_seconds: tuple[float, float] | None = None,
    tp_amax_seconds: float | None = None,
    host_op_s: float = HOST_OP_S,
    host_tensor_op_s: float | None = None,
    cuda_graphs: tuple[str, ...] = (),
    fsdp_communication_unit: float | None = None,
    fsdp_double_buffer: bool = False,
    activation_offload_in_flight: int = 0,
    lazy_gradients: bool = False,
    attention_backend: str = "cudnn",
    attention_dropout: bool = False,
    grad_buffer_passes: tuple[str, ...] = (),
    bucket_size: int | None = None,
    apex_bucket_mib: float | None = None,
    cp_comm_type: str = "p2p",
    hierarchical_context_parallel_sizes: tuple[int, int] | list[int] | None = None,
    optimizer_layers: int | None = None,
    optimizer_host: bool = False,
) -> Workload:
    """Megatron-LM GPT step with tensor, pipeline and data parallelism, 1F1B schedule.

    Ranks are ordered TP fastest, then DP, then PP (Megatron's default), so a TP group of
    8 fills one 8-GPU server. Per micro-batch and stage: forward compute of the stage's
    layers with 2 tensor-parallel all-reduces per layer (blocking, on the compute
    stream); activations sent to the next stage as 1/tp slices per TP rank (Megatron's
    scatter/gather optimisation); backward likewise with 2 all-reduces per layer (4 with
    activation recomputation, which also re-runs the forward). The 1F1B order: stage s
    runs ``pp - s - 1`` warm-up forwards, then alternates one forward and one backward,
    then drains. After the last backward the gradients are all-reduced over DP, then the
    optimizer runs. The last stage also computes the logits (2 h V FLOPs per token
    forward, twice that backward). Each pass is its GEMMs (timed by their shapes,
    :mod:`~simulator.workload.kernels`; the attention scores' GEMMs are memory bound
    there) then its memory-bound kernels
    (:meth:`~simulator.workload.model.Transformer.layer_elementwise_bytes` at HBM
    bandwidth). TP all-reduces of one stage and pass are issued as one call of the
    summed size: they are blocking, so only their count of latencies is lost. Sends and
    receives to and from each neighbour have a stream each, as Megatron batches them
    (one FIFO stream for all of them would deadlock the 1F1B exchange).

    Megatron's options (Korthikanti et al., MLSys 2023; Megatron-LM README):
    ``recompute`` True or "full" re-runs each layer's forward in the backward (and its
    two TP all-reduces); "selective" re-runs only the attention core (its 4 s h FLOPs per
    token, no communication); False or "none" keeps every activation.
    ``sequence_parallel`` splits each TP all-reduce into a reduce-scatter and an
    all-gather of the same buffer (the same bytes on the wire, twice the calls).
    ``distributed_optimizer`` replaces the DP all-reduce by a reduce-scatter of the
    gradients, an optimizer step over 1/dp of the state and an all-gather of the updated
    parameters. ``virtual_stages`` v > 1 runs Megatron's interleaved 1F1B (SC'21,
    section 2.2.2; ``forward_backward_pipelining_with_interleaving``): each rank holds v
    chunks of L/(p v) layers (stage s: chunks s, s + p, ...), runs (p - s - 1) 2 +
    (v - 1) p warm-up forwards of chunk-micro-batches, chunk (k mod p v) // p of
    micro-batch (k // p v) p + k mod p for its k-th, and passes activations from the last
    stage back to the first between chunks; the bubble shrinks to (p - 1)/v passes.
    ``flash_attention`` drops the attention scores' HBM traffic (off by default, as in
    the SC'21 runs the bundled GPT-3 preset follows); ``attention_backend``
    (:data:`~simulator.workload.kernels.ATTENTION_BACKENDS`) times its kernels as
    cuDNN's fused attention ("cudnn", Transformer Engine's choice on Hopper and later)
    or FlashAttention-2's ("flash2", what TE runs under ``NVTE_FUSED_ATTN=0``);
    ``attention_dropout`` times them with dropout (Megatron-LM's ``--attention-dropout``,
    0.1 by default; Llama-style recipes set 0) at the device's measured slowdown
    (:attr:`~simulator.workload.devices.Device.attention_dropout`; off by default).
    ``grad_buffer_passes`` (names in :data:`GRAD_BUFFER_PASSES`) adds Megatron-Core
    DDP's memory-bound passes over its gradient buffer: "nan_check" and "scale" before
    each bucket's reduction, which waits for them, "zero" once a step (with the
    optimizer's op); none by default.
    ``overlap_grad_reduce``
    (Megatron-LM's ``--overlap-grad-reduce``) runs each chunk's last backward bucket by
    bucket (buckets of whole layers holding ``bucket_size`` parameters or more, by
    default max(40M, 1M x dp), Megatron's default size, CP not counted; filled from the
    last layer back; the embedding's gradients join the last one) and starts each
    bucket's DP collective as soon as its layers are done, so all but the last bucket
    hide behind the rest of the backward; without it the gradients are reduced in one
    call after the last backward, as in SC'21. ``bucket_size`` (parameters; Megatron-Core's
    ``DistributedDataParallelConfig.bucket_size``, ``--ddp-bucket-size``) is a run's own
    setting where its recipe gives one (NeMo's ``optim.bucket_size``).
    ``apex_bucket_mib`` (MiB; None: Megatron-Core's buckets) buckets the distributed
    optimizer's gradients and parameters as NeMo 1 runs Apex's DistributedFusedAdam
    (``optim.name: distributed_fused_adam``, its ``bucket_cap_mb``): every layer an
    effective bucket (every model chunk, with interleaving) and every other parameter
    (embedding, output layer; with fp8 weights all but those) in the first layer's (the
    first chunk's), reduced last and gathered first (NeMo r2.0.0 megatron_gpt_model.py
    ``configure_optimizers``, lines 633-662); with interleaving the output layer stays
    with its own chunk's bucket here, the last stage's last. Apex splits an effective
    bucket into buckets of ``1024 * 1024 * bucket_cap_mb / dtype_size`` gradient elements
    (apex/contrib/optimizers/distributed_fused_adam.py lines 719-726 at apex 25.09). It
    reduces an effective bucket's buckets together, one coalesced NCCL group
    (``_start_bucket_grad_sync``, ``_coalescing_manager``, lines 1877-1985), which NCCL
    spreads over its channels by traffic as one call's bytes (src/enqueue.cc
    ``scheduleCollTasksToPlan``, lines 612-700 at v2.22.3-1): one reduce-scatter an
    effective bucket here. It gathers the first effective bucket's together too, as the
    optimizer step ends (``overlap_first_bucket``, lines 2463-2485), and the others one
    Apex bucket at a time, the next as a parameter is first used
    (``_try_start_bucket_param_sync`` starts one bucket, lines 1986-2030): here one
    all-gather an Apex bucket (:func:`_dp_calls`), issued back to back from the step's
    start (a bound: Apex waits for each parameter's first use to start the next).
    ``cp`` > 1 adds Megatron's context parallelism (ring attention): each sequence is
    split over ``cp`` ranks (ordered TP, CP, DP, PP fastest first, as Megatron's
    ``tp-cp-ep-dp-pp``), each holding b s / cp tokens (two opposite chunks, so causal
    work is balanced); every layer's keys and values go around the CP ring while the
    attention blocks run (flash attention, :func:`flash_core_kernels`): per pass the
    layers' K/V exchange, an all-gather of 4 b s g d / t bytes per layer (a gather of
    every rank's K and V blocks), runs on a ``cp`` stream beside the attention core and
    the pass waits for both; backward exchanges K/V again (twice with full
    recomputation) and reduce-scatters their gradients. Gradients are reduced and the
    optimizer sharded over the DP x CP ranks, which hold the same weights.
    ``cp_comm_type`` (:data:`CP_COMM_TYPES`; Megatron-Core's ``--cp-comm-type``) is how
    the CP ranks exchange attention's inputs: "p2p" (the default, Megatron's) as above;
    "all_gather" all-gathers each layer's K and V on the compute stream before the
    attention (4 b s g d / t bytes gathered a layer; again in the backward, and once more
    where it recomputes the attention) and reduce-scatters dK and dV after its backward,
    nothing overlapped (:func:`_gathered_attention`); "a2a" all-to-alls each layer's Q,
    K and V over the CP group before the attention, which then runs the whole sequence
    on a / (t cp) heads, and its output after it; backward the output's gradient before
    and dQ, dK, dV after, all blocking (:func:`_a2a_attention`; the heads and key/value
    heads of a TP rank must split over the CP ranks); "a2a+p2p", with
    ``hierarchical_context_parallel_sizes`` (n, p), n x p = cp (Megatron-Core's
    ``--hierarchical-context-parallel-sizes``), all-to-alls inside each run of n
    consecutive CP ranks and the K/V ring over the p ranks n apart, each rank's
    attention over s / p queries on a / (t n) heads (:func:`_hierarchical_attention`;
    n 1 is p2p, p 1 a2a, as Transformer Engine falls back).
    Mixture-of-experts models (``experts`` > 0) run their MoE layers as Megatron's
    all-to-all token dispatcher does, with ``ep`` expert-parallel ranks laid out as
    Megatron-Core's expert grid with expert_tensor_parallel_size 1: ``ep`` consecutive
    ranks of a stage's TP x CP x DP ones (TP fastest), experts / ep whole experts each.
    Per MoE layer the tokens a rank holds (b s / cp, / t with sequence parallelism,
    which MoE with TP needs) are sent to their ``top_k`` experts and back, an
    all-to-all of tokens x top_k x h x 2 bytes each way over the EP group on the
    compute stream, around the experts' grouped GEMMs
    (:meth:`~simulator.workload.model.Transformer.expert_gemms`); backward both again
    (and the forward's again with full recomputation). The attention, shared experts
    and router run on every rank; an MoE layer keeps its attention's TP collective pair
    (and its shared experts', if any); its memory-bound kernels are the routed copies'
    activation and the dispatcher's permutations
    (:meth:`~simulator.workload.model.Transformer.moe_elementwise_bytes`). Expert
    gradients are reduced (bucket by bucket with ``overlap_grad_reduce``, as the rest)
    and their parameters gathered over the ranks holding the same experts (TP x CP x
    DP / EP), the rest over DP x CP. ``etp`` (Megatron-Core's
    ``expert_tensor_parallel_size``: 1, its default in the runs ccsim models, or the TP
    size, its default before Megatron-Core 0.10 and what DGX Cloud's Grok-1 runs state)
    splits each expert over that many ranks: the expert grid is then "tp-cp-ep-dp-pp"
    with tp = etp (an EP group takes every etp-th rank of a block of ep x etp, the ETP
    group is the TP group), each rank holds 1/etp of experts / ep experts and, after the
    dispatch, all-gathers the routed tokens over the ETP group before its experts and
    reduce-scatters their outputs after (``MoEAlltoAllTokenDispatcher``'s
    ``gather_from_sequence_parallel_region`` and ``reduce_scatter_to_sequence_parallel_region``
    over the expert TP group), backward the same; expert gradients are reduced over
    TP x CP x DP / (EP x ETP) ranks. ``moe_dispatcher`` is Megatron-Core's token
    dispatcher (:data:`~simulator.workload.model.DISPATCHERS`): "alltoall" sends every
    routed copy; "deepep" and "hybridep" (the flex dispatcher's backends) send a token
    once to each rank, and once over RDMA to each NVLink domain of ``ep_domain`` ranks,
    holding one of its experts
    (:meth:`~simulator.workload.model.Transformer.dispatch_copies`). ``moe_host_sync``:
    each MoE layer's forward (and its recomputation) waits for the host to read the
    tokens each expert got, as every dropless dispatcher does before it can size its
    buffers and Transformer Engine's grouped GEMM its splits; the GPU then idles
    :data:`HOST_SYNC_S` a layer (False: static shapes, Megatron-Core's
    ``moe_pad_expert_input_to_capacity`` or HybridEP's rank capacity, which full-step
    CUDA graphs need). ``moe_a2a_overlap`` (Megatron-Core's
    ``overlap_moe_expert_parallel_comm``, Megatron-Bridge's ``moe_a2a_overlap``) runs
    the steady state's forward and backward as one combined step, one warm-up forward
    more (:func:`_a2a_overlap_order`): their passes are issued side by side, the
    all-to-alls on an ``ep`` stream, so one pass's all-to-all runs while the other's
    GEMMs do (ccsim interleaves whole passes, not layer by layer as Megatron-Core does).
    The host's time to launch an MoE layer (a "host" stream beside each pass): by default
    the operations it issues (:func:`~simulator.workload.host.moe_layer_ops`, by
    dispatcher, local experts, fp8 recipe, TP, shared experts and the ``cuda_graphs``
    scopes the run captures, :data:`~simulator.workload.host.GRAPH_SCOPES`) times
    ``host_op_s`` each (:data:`~simulator.workload.host.HOST_OP_S`; 0: not modelled),
    and per local expert the framework tensor operations that launch nothing
    (:func:`~simulator.workload.host.expert_tensor_ops`) ``host_tensor_op_s`` each
    (None: the figure of the CPU whose launch cost ``host_op_s`` is,
    :func:`~simulator.workload.host.tensor_op_s_for`).
    With ``moe_host_sync`` each MoE layer's synchronisation stops the host from running
    ahead: a forward is a flow shop of the host's launches and the GPU's work, part by
    part, the host waiting for the GPU at each synchronisation (:func:`_moe_flow_shop`:
    from one synchronisation to the next a layer takes max over k of the host's time
    for its steps 1..k plus the GPU's for steps k..n); a backward has no
    synchronisation (the splits it needs are saved host lists), its launches one op on
    the host stream from where the host is, the pass ending no earlier (with full
    recomputation, from the pass's start: the recomputed forward synchronises; with
    ``moe_a2a_overlap``, whose passes interleave, each pass's launches from its start).
    Without it (static shapes) the host runs ahead, its passes one after another from
    the step's start, and a pass waits only if the host has not yet launched it.
    ``moe_host_layer_s`` (an experiment, not a default) sets one layer's forward host time
    instead, twice that backward.
    ``moe_routing`` (:data:`MOE_ROUTINGS`): "random", each token's experts drawn at random
    as the published runs force them, so a dropless layer's expert GEMMs take the
    busiest rank's tokens; "even", every expert the mean. fp8 expert GEMMs take each
    expert's tokens padded to :data:`FP8_ALIGN` rows, the alltoall and DeepEP paths
    copying them to pad and unpad (HybridEP pads in its dispatch).
    ``moe_routed_casts`` (fp8): an MoE layer's fp8 casts are its experts' (Transformer
    Engine's GroupedLinear quantizes every routed copy's input and output gradient,
    :meth:`~simulator.workload.model.Transformer.moe_fp8_cast_bytes`); False keeps the
    earlier build, a dense layer's casts in its place (its backward at delayed scaling's
    cost on Hopper, whatever the recipe).
    ``moe_fused_grouped_mlp`` (MXFP8 only; off, as Megatron-Core's
    ``use_transformer_engine_op_fuser`` default): Transformer Engine's fused grouped MLP
    (Megatron-Bridge's ``cutedsl_fused_grouped_mlp``, ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``)
    runs the experts' activation and fc2's input cast in fc1's GEMM and their gradients
    in fc2's (:meth:`~simulator.workload.model.Transformer.fused_grouped_mlp_bytes`).
    ``recompute_moe_act``: Megatron-Core's ``recompute_modules`` "moe_act" (``TEGroupedMLP``
    checkpoints the experts' activation, experts.py core_v0.15.0-0.19.0): its forward
    kernels run again in the backward (:meth:`~simulator.workload.model.Transformer.
    expert_activation_bytes`, and gpt-oss's clamps, :meth:`~simulator.workload.model.
    Transformer.glu_clamp_bytes`); none with full recomputation, which re-runs it anyway.
    ``recompute_mla_up_proj``: Megatron-Core's ``recompute_modules`` "mla_up_proj" (a
    multi-head latent attention model's ``qkv_up_proj_and_rope_apply`` checkpointed):
    each layer's backward runs its up projections' GEMMs (:meth:`~simulator.workload.
    model.Transformer.mla_up_gemms`) and, on the unfused RoPE path, the rotary
    embedding and the query/key/value assembly (:meth:`~simulator.workload.model.
    Transformer.mla_unfused_rope_bytes`) again; nothing more with full recomputation.
    ``fused_yarn_rope``: a YaRN model's rotary embedding runs TE's fused kernel, as
    Megatron-Core before core_v0.16 did (ignoring YaRN's concentration factor); else,
    as since, its unfused PyTorch path (:meth:`~simulator.workload.model.Transformer.
    unfused_rope_bytes`).
    ``mla_fused_rope`` False: a multi-head latent attention model's rotary embedding
    runs Megatron-Core's unfused path (``apply_rope_fusion`` False), with the
    assembly of its query, key and value around it
    (:meth:`~simulator.workload.model.Transformer.mla_unfused_rope_bytes`); True (the
    default) leaves both out, as before.
    ``overlap_p2p_comm`` (None: on unless ``defaults`` is "sc21", as Megatron-LM's
    ``--no-overlap-p2p-communication`` default and Megatron-Bridge's and NeMo's
    comm-overlap config set it; only with ``virtual_stages`` > 1, as Megatron-LM turns it
    off without interleaving) posts each pass's pipeline receive when the rank's
    previous pass of the same direction ends, as Megatron-Core's interleaved 1F1B does
    (``forward_backward_pipelining_with_interleaving``: after a forward,
    ``send_forward_recv_forward(..., overlap_p2p_comm=True)`` posts the next forward's
    receive, waited just before that forward, a backward later), so the transfer runs
    beside the pass in between; off, a receive is posted when the pass before ends.
    The first backward's receive is posted after the last warm-up forward (the same
    schedule's ``send_backward_recv_backward`` at its last warm-up step), and each
    receive is issued right after the send of the pass that posts it, as on the GPU.
    ``p2p_streams`` (:data:`P2P_STREAMS`; None: "peer" with overlap_p2p_comm, else
    "split"): "peer" runs a rank's sends to and receives from one
    neighbour on one FIFO stream, as PyTorch runs each un-batched isend/irecv on the
    stream of its peer pair (ProcessGroupNCCL::pointToPoint), so a receive posted a pass
    ahead holds the next send to that neighbour behind it until its data comes (at PP 2,
    sends and receives on a stream each, as Megatron-Core puts one side on the world
    group); "split", a stream each for sends and receives per neighbour (ccsim before
    2026-11-27). ``p2p_send_wait`` (None: on with overlap_p2p_comm) makes each pass
    also wait for the send of the last pass of its direction, whose handle Megatron
    waits with the receive's.
    ``amax_reduction`` (:data:`AMAX_REDUCTIONS`; None: "off") adds, with fp8 delayed
    scaling, Transformer Engine's blocking all-reduce of the pass's amaxes after each
    pass (at the chunk's fp8_autocast exit and after its backward; TE 1.6 and later
    reduce over Megatron-Core's fp8 group, the stage's TP x DP x CP ranks: "stage"; or
    the TP group with tp_only_amax_red: "tp"). It is off by default for the CPU it
    costs: its small all-reduce's tree breaks the replicas' symmetry (see
    :mod:`~simulator.workload.replicas`).
    ``amax_seconds`` (forward, backward), with ``amax_reduction`` on: each of those
    all-reduces runs as a wait of that many seconds on the compute stream instead of a
    collective over the group: the call's time alone on the cluster, which the caller
    measures on its topology (:func:`~simulator.validate.training.amax_seconds`). That
    is the collective's time in the step where every member reaches it at once (the
    replicas, TP and CP ranks of a stage run the same passes) and its few hundred bytes
    do not feel the other traffic; it keeps the replicas' symmetry.
    ``tp_amax_seconds``, with fp8 per-tensor current scaling ("tensorwise"), sequence
    parallelism and TP > 1: Transformer Engine 2.x's blocking amax all-reduce over the
    TP group before each fp8 cast of a tensor it then all-gathers (:func:`tp_amax_calls`:
    four a dense layer and micro-batch), each a wait of that many seconds on the
    compute stream at the end of its pass: the 4-byte call's time alone on the cluster,
    which the caller measures (:func:`~simulator.validate.training.tp_amax_seconds`).
    None (the default): not modelled. Multi-head latent attention models are left out
    (the parallel modes of their down-projections were not read).
    ``fsdp`` shards the layers' weights, gradients and optimizer state over the DP x CP
    ranks (FSDP / ZeRO-3 with TP and PP, as Megatron-FSDP does): every pass runs layer
    by layer (Megatron-FSDP's units are the transformer layers), each layer after its
    weights' all-gather over those ranks on an ``fsdp.ag`` stream; the gathers run ahead
    of the compute, as many units as Megatron-FSDP prefetches
    (:func:`~simulator.workload.memory.fsdp_gathered_units`: a layer's gather may start
    once the layer that many units before it in the step has run), and after each
    layer's backward its gradients are reduce-scattered on an ``fsdp.rs`` stream; the
    optimizer steps 1/(dp cp) of the state. The embedding stays replicated.
    ``precision`` "fp8" runs the layers' linear GEMMs on fp8 operands (Transformer
    Engine's recipe, :func:`pass_work`) and keeps the fp8 weight copies in memory.
    ``replicas`` builds the ops of the first data-parallel replica only (ranks with
    d = 0; an integer k: the first k, which stand for the next k and so on, for replicas
    smaller than a server), standing for all ``dp``
    (:class:`~simulator.workload.trace.Replicas`): the
    replay simulates one replica where the topology is symmetric under moving every
    rank to the next replica, and the DP groups' collectives by their representatives
    (:mod:`simulator.workload.replicas`; every replica is built and replayed where
    they are not alike). Mixture-of-experts models build as many replicas together as
    keep each EP group inside them, or one where EP groups span every replica
    (:func:`moe_replicas`).
    ``shadows`` (with ``tp`` > 1) builds the ops of TP rank 0 of each TP group only,
    standing for the group's others (:class:`~simulator.workload.trace.Shadows`): the
    replay runs each call of theirs beside their master's and checks that they end
    together (it builds every rank where they do not). With ``cp`` > 1 it stands for
    the CP ranks too; ``shadows="tp"`` builds every CP rank and shadows the TP ranks
    alone (what the replay falls back to where a CP rank's ring position ends apart
    from its master's, :attr:`~simulator.workload.trace.Shadows.tp_only`).
    ``first_stage_layers`` and ``last_stage_layers`` (Megatron-LM's
    ``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers``)
    give the first and last pipeline stages that many layers and split the rest evenly
    over the middle stages (:func:`~simulator.workload.memory.pipeline_layers`), as Llama
    3 405B's 126 layers ran on 8 stages, 15 + 6 x 16 + 15 (Dubey et al. 2024, section
    3.3.2); every stage's passes, TP collectives, gradient buckets and DP reduction then
    carry its own layers. Interleaved, each stage's chunks hold 1/v of its layers.
    ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``
    (Megatron-Core's flags of those names) count the input embedding and the loss as a
    layer each in the split: the first chunk of the first stage and the last chunk of
    the last stage hold one layer fewer (:func:`~simulator.workload.memory.pipeline_chunks`),
    interleaved or not, as Megatron-Bridge runs Llama 3.1 405B (126 layers on 8 stages of
    8 chunks of 2, the two end chunks of 1).
    A model with ``tied_embeddings`` (GPT's) and ``pp`` > 1 all-reduces the shared
    embedding's gradients between the first and last stage of each pipeline after the DP
    reduction, as Megatron-LM does for a weight both stages hold.
    ``grad_reduce`` is the dtype gradients are kept and reduced in over DP
    (:data:`~simulator.workload.memory.GRAD_REDUCE`): "fp32", 4 bytes per parameter, is
    what Megatron-LM does by default in bf16 and fp8 (its arguments.py turns on
    accumulate_allreduce_grads_in_fp32 for bf16, the DDP config's grad_reduce_in_fp32);
    "bf16" is its ``--grad-reduce-in-bf16``; "fp16" an fp16 run's (``--fp16``, as its
    GPT-3 175B example and the SC'21 runs train), 2 bytes each. The updated parameters'
    all-gathers (distributed optimizer, FSDP) move bf16 weights whatever it is, unless
    ``fp8_param_gather`` (Megatron's ``--fp8-param-gather``, an fp8 run's): the layers'
    weights are then kept and gathered in fp8, one byte each (bf16 with ``fp8_recipe``
    "mxfp8": Megatron gathers MXFP8 weights in bf16 into the gradient buffer and
    quantizes them after, ``reuse_grad_buf_for_mxfp8_param_ag``,
    megatron/core/distributed/param_and_grad_buffer.py). With one-byte weights Megatron
    gathers a model chunk's bf16 ones (embedding, output layer) with the bucket of its
    first layers (``partition_buckets``), so an overlapped gather brings the output
    layer before the chunk's first forward. ``fp8_recipe`` is Transformer
    Engine's scaling (:data:`~simulator.workload.model.FP8_RECIPES`): "tensorwise"
    (per-tensor current scaling, Megatron-Bridge's default on every GPU,
    src/megatron/bridge/training/mixed_precision.py), "delayed" (Megatron-LM's and NeMo
    2.0's), "mxfp8" (Blackwell); its casts' traffic is
    :meth:`~simulator.workload.model.Transformer.fp8_cast_bytes`. ``fp8_transpose``:
    the GPU's fp8 GEMMs take only K-major operands, so per-tensor casts also write a
    transpose (Hopper, the default); False on Blackwell. ``optimizer_state``
    (:data:`~simulator.workload.memory.OPTIMIZER_STATE`; default: Megatron-Core's fp32
    main weights and moments) is the optimizer's state where a recipe sets its dtype
    (NeMo's ``optim.dtype: bf16``): its bytes per parameter set the memory and the
    optimizer step's traffic.
    ``cross_entropy`` is how the loss runs after the output layer's GEMM, as memory-bound
    traffic on the last stage (:meth:`~simulator.workload.model.Transformer.cross_entropy_bytes`):
    "unfused" (Megatron-Core's default), "fused" (``--cross-entropy-loss-fusion``, NeMo's
    recipes) or "te" (Transformer Engine's kernels, Megatron-Bridge's recipes).
    ``fsdp_communication_unit``, ``fsdp_double_buffer``,
    ``activation_offload_in_flight`` and ``lazy_gradients`` set the memory estimate only
    (:func:`~simulator.workload.memory.megatron_memory`: Megatron-FSDP's
    ``suggested_communication_unit_size`` and ``fsdp_double_buffer``; offloaded layers
    still on the GPU at the peak; gradients allocated at their first backward, as
    PyTorch's FSDP does, in place of Megatron's buffer held through the step).
    ``activation_offload_layers`` keeps that many layers' activations in host memory
    (Megatron-Core's ``cpu_offloading_num_layers``): it lowers the memory only; the
    copies are taken as hidden behind the passes (Transformer Engine overlaps them on
    their own stream; on GB200 over NVLink-C2C).
    ``tp_comm_overlap`` (Transformer Engine's userbuffer overlap, ``--tp-comm-overlap``)
    runs each pass's TP collectives on their own stream beside its GEMMs instead of
    after them: the pass takes the longer of the two (compute slowed by
    ``comm_slowdown`` while they overlap). True or "ideal" (the default where it is on)
    takes that overlap as free to the GEMMs, a bound; "userbuffers" runs the dense
    layers' linear GEMMs as Transformer Engine's userbuffers do
    (:func:`~.userbuffers.userbuffers_config`: chunked beside the exchange, on the SMs its
    communication kernels leave, :func:`pass_work`) and adds what it leaves exposed
    (:func:`~.userbuffers.userbuffers_exposed`) to the compute stream. The
    workload records its peak memory per GPU
    (:func:`~simulator.workload.memory.megatron_memory`).
    ``optimizer_host`` (dense models with the distributed optimizer sharded over DP x
    CP) adds the host's work from the gradient norm's synchronisation to the next
    step's first launch, on a "host" stream beside the optimizer's GPU work
    (:mod:`simulator.workload.optimizer_host`: counted launches and tensor operations,
    ``host_op_s`` and ``host_tensor_op_s`` each); off by default.
    ``optimizer_layers`` (unpipelined FSDP steps of dense models only) is the layers
    whose sharded state the optimizer step walks, where a step of fewer layers stands
    for the model's (:mod:`simulator.workload.layers`); None: the model's own.
    """
    arguments = dict(locals())  # to build every replica where one cannot stand for all
    if shadows not in (True, False, "tp"):
        raise CcsimError(f"shadows must be true, false or 'tp' (TP ranks only), not {shadows!r}")
    shadows = shadows if shadows == "tp" else bool(shadows)
    if defaults not in MEGATRON_DEFAULTS:
        raise unknown_choice("defaults", defaults, MEGATRON_DEFAULTS)
    m = _model(model, "megatron", moe_ok=True)
    check_tensor_parallel(m, tp)
    if optimizer_layers is not None and (pp != 1 or m.is_moe or not fsdp):
        raise CcsimError(
            "optimizer_layers applies to unpipelined FSDP steps of dense models only "
            f"(here pp {pp}, fsdp {fsdp}, moe {m.is_moe}): drop it"
        )
    given = {
        "recompute": recompute,
        "sequence_parallel": sequence_parallel,
        "distributed_optimizer": distributed_optimizer,
        "flash_attention": flash_attention,
        "overlap_grad_reduce": overlap_grad_reduce,
        "tp_comm_overlap": tp_comm_overlap,
        "overlap_param_gather": overlap_param_gather,
        "cross_entropy": cross_entropy,
    }
    chosen = megatron_options(defaults, given, tp=tp, dp=dp, cp=cp, fsdp=fsdp, moe=m.is_moe)
    recompute = chosen["recompute"]
    sequence_parallel = chosen["sequence_parallel"]
    distributed_optimizer = chosen["distributed_optimizer"]
    flash_attention = chosen["flash_attention"]
    overlap_grad_reduce = chosen["overlap_grad_reduce"]
    tp_comm_overlap = chosen["tp_comm_overlap"]
    if isinstance(tp_comm_overlap, str) and tp_comm_overlap not in TP_COMM_OVERLAPS:
        raise unknown_choice("tp_comm_overlap", tp_comm_overlap, TP_COMM_OVERLAPS)
    if tp_comm_overlap == "userbuffers" and tp > 1 and not chosen["sequence_parallel"]:
        raise CcsimError(
            "tp_comm_overlap userbuffers needs sequence parallelism (Transformer Engine "
            "overlaps its all-gathers and reduce-scatters): set sequence_parallel, or "
            "tp_comm_overlap ideal"
        )
    # Nothing to overlap on one TP rank; True is the ideal overlap (the default's).
    ub = (
        userbuffers_config(m, tp, precision)
        if tp_comm_overlap == "userbuffers" and tp > 1
        else None
    )
    tp_comm_overlap = bool(tp_comm_overlap) and tp > 1
    overlap_param_gather = chosen["overlap_param_gather"]
    cross_entropy = chosen["cross_entropy"]
    v = virtual_stages
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CcsimError(f"virtual_stages must be a positive integer, not {v!r}")
    if overlap_p2p_comm is not None and not isinstance(overlap_p2p_comm, bool):
        raise CcsimError(
            f"overlap_p2p_comm must be true, false or null (Megatron's default), "
            f"not {overlap_p2p_comm!r}"
        )
    # Megatron-LM turns overlap_p2p_comm off without interleaving (arguments.py).
    early_recv = v > 1 and (defaults != "sc21" if overlap_p2p_comm is None else overlap_p2p_comm)
    if attention_backend not in ATTENTION_BACKENDS:
        raise unknown_choice("attention_backend", attention_backend, ATTENTION_BACKENDS)
    backend = ATTENTION_BACKENDS.index(attention_backend)
    if p2p_streams is None:
        # Combined 1F1B (moe_a2a_overlap) too: with each step's transfers issued in
        # Megatron-Core's order (the forward's send and the next forward's receive
        # before the backward's send, see the step loop) one FIFO stream per neighbour
        # runs to its end; with ccsim's earlier order (the backward's send first, both
        # receives after the step) it deadlocked, so such steps ran on "split" streams
        # (8931a81), where a stage's gradient send no longer queued behind its
        # receive from that neighbour (issue 31).
        p2p_streams = "peer" if early_recv else "split"
    if p2p_streams not in P2P_STREAMS:
        raise CcsimError(
            f"p2p_streams must be {' or '.join(P2P_STREAMS)} (null: peer with "
            f"overlap_p2p_comm), not {p2p_streams!r}"
        )
    if p2p_send_wait is not None and not isinstance(p2p_send_wait, bool):
        raise CcsimError(
            f"p2p_send_wait must be true, false or null (on with overlap_p2p_comm), "
            f"not {p2p_send_wait!r}"
        )
    # Only where the receives are posted a pass ahead: without overlap_p2p_comm each
    # exchange is waited as soon as it is posted.
    send_wait = early_recv and (p2p_send_wait is None or p2p_send_wait)

    if amax_reduction is None:
        # Off by default although Transformer Engine 1.6 and later reduce over the
        # stage: the small all-reduce's tree schedule has no replica symmetry, so a
        # step replays every replica (5.7 times the CPU on DGX Cloud's GPT-3 175B at
        # DP 4) for 0.9% of its time there (issue 31's session 2026-11-27). With
        # amax_seconds the calls are waits and the replicas stay symmetric: ccsim
        # validate --training can run so the rows whose TE reduces so
        # (validate.training.AMAX_STAGE_SOURCES; off: see there).
        amax_reduction = "off"
    if amax_reduction not in AMAX_REDUCTIONS:
        raise CcsimError(
            f"amax_reduction must be {', '.join(AMAX_REDUCTIONS)} (null: off), "
            f"not {amax_reduction!r}"
        )
    if amax_reduction != "off" and not (precision == "fp8" and fp8_recipe == "delayed"):
        amax_reduction = "off"  # only delayed scaling keeps amaxes to reduce
    if amax_seconds is not None and (
        isinstance(amax_seconds, str)
        or len(amax_seconds) != 2
        or not all(isinstance(x, (int, float)) and 0 <= x < math.inf for x in amax_seconds)
    ):
        raise CcsimError(
            "amax_seconds must be two times in seconds, (forward, backward), each >= 0, "
            f"not {amax_seconds!r}"
        )

    if tp_amax_seconds is not None and (
        isinstance(tp_amax_seconds, (bool, str))
        or not isinstance(tp_amax_seconds, (int, float))
        or not 0 <= tp_amax_seconds < math.inf
    ):
        raise CcsimError(
            "tp_amax_seconds must be one time in seconds, >= 0 (null: not modelled), "
            f"not {tp_amax_seconds!r}"
        )

    # Current scaling's TP amax all-reduces (tp_amax_calls), where they apply: seconds a
    # call, 0 where none runs (another recipe, no sequence parallelism, TP 1, MLA).
    tp_amax_s = 0.0
    if (
        tp_amax_seconds
        and precision == "fp8"
        and fp8_recipe == "tensorwise"
        and sequence_parallel
        and tp > 1
        and not m.is_mla
    ):
        tp_amax_s = float(tp_amax_seconds)

    def p2p_stream(*, send: bool, forward: bool) -> str:
        """The stream of a pipeline send or receive (see :data:`P2P_STREAMS`)."""
        if p2p_streams == "split":
            if send:
                return "pp.send.next" if forward else "pp.send.prev"
            return "pp.recv.prev" if forward else "pp.recv.next"
        if pp == 2:
            # Both neighbours are one rank: Megatron-Core issues one side's sends and
            # the other's receives on the world group instead, so that they overlap
            # (p2p_communication.py, _p2p_ops, since 3ee489d, May 2024): a rank's
            # sends run on one pair's stream, its receives on the other's.
            return "pp.send" if send else "pp.recv"
        # A forward sends to the next stage and receives from the previous; a
        # backward the other way round.
        return "pp.next" if send == forward else "pp.prev"

    if precision not in PRECISIONS:
        raise CcsimError(f"precision must be bf16 or fp8, not {precision!r}")
    if grad_reduce not in GRAD_REDUCE:
        raise CcsimError(
            f"grad_reduce must be {', '.join(GRAD_REDUCE)} (the gradients' dtype), "
            f"not {grad_reduce!r}"
        )
    grad = GRAD_REDUCE[grad_reduce][0]  # bytes per parameter of a gradient reduction
    # The optimizer step's memory traffic per parameter: its state (12 bytes by default)
    # and a 4-byte gradient read; a recipe's smaller state moves less.
    state = OPTIMIZER_BYTES if optimizer_state is None else optimizer_state_bytes(optimizer_state)
    step_bytes = GRADIENT_BYTES + state
    if fp8_param_gather and precision != "fp8":
        raise CcsimError("fp8_param_gather keeps weights in fp8: it needs precision fp8")
    fp8_cast_cost(fp8_recipe)  # an unknown recipe: one line naming the valid ones
    # The layers' weights as gathered: MXFP8's in bf16 (Megatron's
    # reuse_grad_buf_for_mxfp8_param_ag; Megatron-Bridge's bf16_with_mxfp8_mixed sets it).
    param_bytes = 1 if fp8_param_gather and fp8_recipe != "mxfp8" else BF16
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise CcsimError(f"cp (context-parallel ranks) must be a positive integer, not {cp!r}")
    for name in grad_buffer_passes:
        if name not in GRAD_BUFFER_PASSES:
            raise unknown_choice("grad_buffer_passes entry", name, GRAD_BUFFER_PASSES)
    if fsdp and grad_buffer_passes:
        raise CcsimError(
            "grad_buffer_passes are Megatron-Core DDP's passes over its gradient buffer; "
            "fsdp keeps its own: drop grad_buffer_passes"
        )
    # Elements moved per gradient before each bucket's reduction, and at the step's start.
    bucket_passes = sum(GRAD_BUFFER_PASSES[n] for n in set(grad_buffer_passes) - {"zero"})
    zero_passes = GRAD_BUFFER_PASSES["zero"] if "zero" in grad_buffer_passes else 0
    if fsdp and (distributed_optimizer or overlap_grad_reduce):
        raise CcsimError(
            "fsdp shards the optimizer and reduces gradients pass by pass itself; drop "
            "distributed_optimizer and overlap_grad_reduce"
        )
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise CcsimError(f"ep (expert-parallel ranks) must be a positive integer, not {ep!r}")
    if m.is_moe and fsdp:
        raise CcsimError("fsdp is not modelled for mixture-of-experts models yet")
    if m.is_moe:
        if tp > 1 and not sequence_parallel:
            raise CcsimError(
                "a mixture-of-experts model with tensor parallelism needs sequence "
                "parallelism (sequence_parallel, --sequence-parallel), as Megatron-LM does"
            )
        if isinstance(etp, bool) or etp not in (1, tp):
            raise CcsimError(
                f"etp (expert tensor parallelism) must be 1 or the TP size ({tp}), not "
                f"{etp!r}: other expert TP sizes are not modelled"
            )
        if (tp * cp * dp) % (ep * etp) or m.experts % ep:
            raise CcsimError(
                f"ep {ep} x etp {etp} must divide TP x CP x DP ({tp * cp * dp}) and ep the "
                f"experts ({m.experts}): expert-parallel ranks are carved out of a stage's "
                "ranks, as Megatron-Core's expert grid does"
            )
        if m.expert_ffn % etp:
            raise CcsimError(
                f"etp {etp} must divide the experts' FFN width ({m.expert_ffn}): each expert "
                "is split over the expert TP ranks"
            )
        if etp > 1 and moe_dispatcher != "alltoall":
            raise CcsimError(
                f"etp {etp} with the {moe_dispatcher} dispatcher is not modelled: expert "
                "tensor parallelism runs with the alltoall dispatcher (moe_dispatcher)"
            )
    elif ep > 1 or etp != 1:
        what = f"ep {ep}" if ep > 1 else f"etp {etp}"
        raise CcsimError(
            f"{what} applies to mixture-of-experts models; {m.name or 'this model'} is dense"
        )
    if moe_a2a_overlap and not (m.is_moe and ep > 1 and (pp == 1 or v > 1)):
        raise CcsimError(
            "moe_a2a_overlap overlaps the expert-parallel all-to-all: it needs a "
            "mixture-of-experts model with ep > 1 and, with pipeline stages, virtual "
            "stages (as Megatron-Core's transformer_config.py asserts)"
        )
    if moe_host_layer_s is not None and (
        not isinstance(moe_host_layer_s, (int, float)) or moe_host_layer_s < 0
    ):
        raise CcsimError(
            f"moe_host_layer_s (host seconds per MoE layer forward) must be >= 0, "
            f"not {moe_host_layer_s!r}"
        )
    if moe_dispatcher not in DISPATCHERS:
        raise unknown_choice("moe_dispatcher", moe_dispatcher, DISPATCHERS)
    if moe_routing not in MOE_ROUTINGS:
        raise unknown_choice("moe_routing", moe_routing, MOE_ROUTINGS)
    if moe_fused_grouped_mlp and m.is_moe and (precision != "fp8" or fp8_recipe != "mxfp8"):
        raise CcsimError(
            "moe_fused_grouped_mlp: Transformer Engine's fused grouped MLP runs MXFP8 "
            f"(precision fp8, fp8_recipe mxfp8), not {precision}"
            + (f" with fp8_recipe {fp8_recipe}" if precision == "fp8" else "")
            + ": drop moe_fused_grouped_mlp or run MXFP8"
        )
    if moe_fused_grouped_mlp and not moe_routed_casts:
        raise CcsimError(
            "moe_fused_grouped_mlp takes the experts' casts out of the routed copies' "
            "casts (moe_routed_casts): drop moe_routed_casts=False or the fused MLP"
        )
    if isinstance(ep_domain, bool) or not isinstance(ep_domain, int) or ep_domain < 1:
        raise CcsimError(
            f"ep_domain (GPUs per NVLink domain) must be a positive integer, not {ep_domain!r}"
        )
    if cp_comm_type not in CP_COMM_TYPES:
        raise unknown_choice("cp_comm_type", cp_comm_type, CP_COMM_TYPES)
    hierarchical = hierarchical_context_parallel_sizes
    inner = 1  # a2a+p2p: the CP ranks of an all-to-all group
    if cp_comm_type == "a2a+p2p":
        sizes = list(hierarchical) if isinstance(hierarchical, (list, tuple)) else []
        if (
            len(sizes) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes)
            or sizes[0] * sizes[1] != cp
        ):
            # Megatron-LM asserts the product (arguments.py line 565, core_v0.19.0);
            # Transformer Engine takes two levels (context_parallel.py line 5017, v2.18).
            raise CcsimError(
                "cp_comm_type a2a+p2p needs hierarchical_context_parallel_sizes [n, p]: "
                f"n CP ranks to an all-to-all and p to a ring, n x p = cp ({cp}), not "
                f"{hierarchical!r}"
            )
        inner = sizes[0]
        # Transformer Engine runs a2a+p2p as p2p over one rank's all-to-alls and as a2a
        # over one-rank rings (attn_forward_func_with_cp, context_parallel.py v2.18).
        if cp == 1 or inner == 1:
            cp_comm_type, inner = "p2p", 1
        elif inner == cp:
            cp_comm_type, inner = "a2a", 1
    elif hierarchical is not None:
        raise CcsimError(
            "hierarchical_context_parallel_sizes applies to cp_comm_type a2a+p2p, not "
            f"{cp_comm_type}"
        )
    heads_split = cp if cp_comm_type == "a2a" else inner
    if heads_split > 1 and (
        m.attention_heads % (tp * heads_split) or m.query_groups % (tp * heads_split)
    ):
        # Transformer Engine asserts it (context_parallel.py line 4243, v2.18).
        raise CcsimError(
            f"cp_comm_type {cp_comm_type} splits each TP rank's heads over the all-to-all's "
            f"CP ranks: tp x {heads_split} ({tp * heads_split}) must divide the attention "
            f"heads ({m.attention_heads}) and the key/value heads ({m.query_groups}); pick a "
            "smaller CP (all-to-all) size, or cp_comm_type p2p or all_gather"
        )
    if cp > 1:
        if m.seq % (2 * cp):
            raise CcsimError(
                f"sequence length {m.seq} does not split into 2 x {cp} chunks, as Megatron's "
                "context parallelism needs; pick a cp that divides seq / 2"
            )
        flash_attention = True  # Megatron's CP runs Transformer Engine's fused attention
    # Layers of each pipeline stage's v chunks; uneven with first_stage_layers or
    # last_stage_layers (whole stages) or with the embedding and loss counted as layers
    # (the end chunks), checked as Megatron-Core does.
    chunks = pipeline_chunks(
        m.layers,
        pp,
        virtual_stages=v,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        account_for_embedding=account_for_embedding_in_pipeline_split,
        account_for_loss=account_for_loss_in_pipeline_split,
    )
    # Each chunk's layers (by stage and chunk), found once: every pass of a chunk asks.
    spans = {
        (stage, c): chunk_layer_range(chunks, stage, c)
        for stage in range(pp)
        for c in range(len(chunks[stage]))
    }
    split = tuple(sum(stage) for stage in chunks)
    global_batch = global_batch or micro_batch * dp * 4 * pp
    micro = global_batch // (micro_batch * dp)
    if micro < 1 or global_batch % (micro_batch * dp):
        raise CcsimError(f"global batch {global_batch} is not a multiple of micro-batch x dp")
    if v > 1 and (pp < 2 or micro % pp):
        raise CcsimError(
            f"virtual stages need 2 or more pipeline stages and micro-batches per replica "
            f"({micro}) a multiple of them ({pp}), as Megatron's interleaved schedule does"
        )
    ranks = tp * cp * pp * dp
    # Replicas whose ops are built: a mixture-of-experts model's expert-parallel groups
    # cross the data-parallel replicas, so every one is.
    if isinstance(replicas, bool):
        replicas_built = 1 if replicas else dp
    elif isinstance(replicas, int) and replicas >= 1 and dp % replicas == 0:
        replicas_built = replicas
    else:
        raise CcsimError(
            f"replicas must be true, false or a divisor of dp ({dp}), not {replicas!r}"
        )
    if m.is_moe and replicas_built < dp:
        # (With expert TP, a block of ep x etp ranks holds whole EP groups.)
        replicas_built = moe_replicas(replicas_built, ep=ep * etp, tp=tp, cp=cp, dp=dp)
    # TP ranks whose ops are built: one per TP group with shadows.
    tp_built = 1 if shadows and tp > 1 else tp
    # And CP ranks: Megatron-Core gives CP rank i the sequence chunks i and 2 cp - 1 - i
    # of 2 cp (get_batch_on_this_cp_rank, megatron/core/utils.py), so that causal
    # attention's work is the same on each; every CP rank then runs the same kernels on
    # the same shapes and issues the same calls (the K/V all-gather and reduce-scatter
    # over its CP group, its own pipeline sends), and the first stands for the others.
    # (A mixture-of-experts model's expert groups cut across CP ranks: not there.)
    # (a2a+p2p's groups do not map onto themselves along one shift of the CP ranks:
    # every CP rank is built.)
    # (shadows="tp": every CP rank built, the fallback where CP ranks end apart.)
    cp_built = 1 if shadows is True and cp > 1 and not m.is_moe and inner == 1 else cp
    # Without TP, a mixture-of-experts model's EP group stands for itself the same way:
    # its ranks run the same kernels on the same shapes (routing balanced, as the
    # published runs force it) and issue the same calls; its first rank is built.
    # The shift along an EP group must stay inside the replicas built: where the group
    # reaches past them, both shortcuts would carry the other replicas' traffic (twice),
    # and replicas alone are the cheaper (their flows stand for their images by link
    # class; shadows run each image).
    ep_shadows = shadows is True and tp == 1 and cp == 1 and m.is_moe and ep > 1
    ep_shadows = ep_shadows and replicas_built % ep == 0
    tokens = micro_batch * m.seq // cp  # the tokens one CP rank holds
    # Each pass's GEMMs by shape (the kernel model times them on the device); the last
    # virtual stage also runs the output layer's logits (2 h V / t FLOPs per token
    # forward, twice that backward, not recomputed).
    cache: dict[tuple, dict[str, Any]] = {}

    def part(forward: bool, logits: bool, layers: int, moe: bool = False) -> dict[str, Any]:
        return pass_work(
            m,
            micro_batch,
            tp=tp,
            layers=layers,
            forward=forward,
            recompute=recompute,
            flash_attention=flash_attention,
            logits=logits,
            precision=precision,
            cp=cp,
            core=cp == 1,
            moe=moe,
            fp8_block=MXFP8_BLOCK if fp8_recipe == "mxfp8" else 0,
            userbuffers=ub,
            attention_backend=backend,
            attention_dropout=attention_dropout,
            recompute_up_proj=recompute_mla_up_proj,
        )

    def work(forward: bool, logits: bool, layers: int, moe: int = 0) -> dict[str, Any]:
        """A pass over ``layers`` layers, ``moe`` of them MoE layers (their experts
        apart)."""
        key = (forward, logits, layers, moe)
        if key not in cache:
            if not moe:
                cache[key] = part(forward, logits, layers)
            else:
                parts = [part(forward, logits, moe, moe=True)]
                if layers > moe:
                    parts.append(part(forward, False, layers - moe))
                combined: dict[str, Any] = {"gemms": [g for w in parts for g in w["gemms"]]}
                kernels = [k for w in parts for k in w.get("attention", [])]
                if kernels:
                    combined["attention"] = kernels
                cache[key] = combined
        return cache[key]

    def moe_layers(here: int) -> int:
        """MoE layers of virtual stage ``here`` (chunk here // pp of stage here % pp)."""
        return sum(m.moe_layer(k) for k in spans[(here % pp, here // pp)])

    # Mixture of experts: the tokens a rank dispatches per MoE layer (sequence-parallel
    # shards with TP) and its experts' grouped GEMMs.
    moe_tokens = tokens // (tp if sequence_parallel else 1)
    copies = m.dispatch_copies(ep, dispatcher=moe_dispatcher, domain=ep_domain) if m.is_moe else 0
    a2a_layer = moe_tokens * copies * m.hidden * BF16
    # fp8 expert GEMMs take each expert's tokens padded to a multiple of FP8_ALIGN rows
    # (Transformer Engine's Fp8Padding; HybridEP pads in its dispatch kernel instead);
    # with random routing (the published runs force it) the busiest rank sets the pace.
    fp8_align = FP8_ALIGN[fp8_recipe == "mxfp8"] if precision == "fp8" else 1
    experts = (
        m.expert_gemms(
            moe_tokens, ep=ep, etp=etp, align=fp8_align, random_routing=moe_routing == "random"
        )
        if m.is_moe
        else ()
    )
    expert_cache: dict = {}  # each pass's expert GEMMs, as op fields
    if precision == "fp8":  # Transformer Engine's grouped GEMMs run fp8 like its linears
        experts = tuple(g.in_bits(8) for g in experts)
    # The host's seconds per MoE layer (forward, backward), from the operations it
    # launches (host.py) or, as an experiment, one given forward time.
    host_fwd = host_bwd = 0.0
    flow_launches = None  # the forward's launches around its synchronisation
    if m.is_moe and moe_host_layer_s is not None:
        host_fwd, host_bwd = moe_host_layer_s, 2 * moe_host_layer_s
    elif m.is_moe:
        host_ops = moe_layer_ops(
            local_experts=m.experts // ep,
            dispatcher=moe_dispatcher,
            recipe=fp8_recipe if precision == "fp8" else "bf16",
            tp=tp,
            ep=ep,
            shared_experts=m.shared_experts,
            graphs=cuda_graphs,
            expert_bias=m.expert_bias,
            qk_norm=m.qk_norm,
            # DDP's forward pre-hooks exist with the distributed optimizer's
            # overlap_param_gather (Megatron-Core core_v0.16.0 distributed_data_parallel.py
            # lines 347-349, use_forward_hook).
            param_gather_hooks=bool(overlap_param_gather and distributed_optimizer),
            # gpt-oss's own launches: YaRN's unfused rotary embedding (as its bytes
            # above), the activation's clamps outside the fused kernel (TE's fused
            # grouped MLP takes them in) and again where the activation is recomputed.
            unfused_rope=m.yarn_scale > 1 and not fused_yarn_rope,
            glu_clamp=m.glu_clamp and m.gated and not moe_fused_grouped_mlp,
            recompute_act=recompute_moe_act and recompute != "full",
        )
        host_fwd, host_bwd = moe_layer_host_s(host_ops, host_op_s, host_tensor_op_s)
        if host_fwd and moe_host_sync and not moe_a2a_overlap:
            # Each forward a flow shop of the host's launches and the GPU's work between
            # synchronisations (_moe_flow_shop); combined 1F1B's interleaved passes and
            # the backward (no synchronisation: the host runs ahead) keep one host op
            # a pass.
            flow_launches = moe_forward_launches(
                host_ops,
                host_op_s,
                dispatcher=moe_dispatcher,
                exchanged=ep > 1 or tp > 1,
                tensor_op_s=host_tensor_op_s,
            )

    def flow_gpu(kind: str, k: int) -> dict[str, Any]:
        """A forward flow shop's GPU work over k MoE layers (_moe_flow_shop)."""
        if kind == "dense":
            return work(True, False, k, k)
        return {"gemms": _expert_list(experts, k, True, "none", expert_cache)}

    # Context parallelism: per layer, the K/V blocks of every CP rank (an all-gather
    # of 4 b s g d / t bytes) and, backward, their gradients (a reduce-scatter).
    kv_layer = 4 * micro_batch * m.seq * m.query_groups * m.head_dim / tp
    # cp_comm_type all_gather and a2a, per layer on one TP rank (bf16, as Transformer
    # Engine moves them outside fp8 attention): K and V over the whole sequence (MLA: its
    # key heads with their rotary part, its value heads), and Q, K, V and the output over
    # the rank's b s / cp tokens.
    qk_dim = m.head_dim + (m.qk_rope_dim if m.is_mla else 0)
    v_dim = (m.v_head_dim or m.head_dim) if m.is_mla else m.head_dim
    kv_gathered = micro_batch * m.seq * m.query_groups / tp * (qk_dim + v_dim) * BF16
    q_local = tokens * m.attention_heads / tp * qk_dim * BF16
    o_local = tokens * m.attention_heads / tp * v_dim * BF16
    qkv_local = q_local + kv_gathered / cp

    # The non-GEMM kernels, memory bound: their own ops after each pass's GEMMs (a
    # roofline op would overlap them). Backward reads the saved inputs and the incoming
    # gradient and writes the outgoing one: twice the forward traffic; recomputation
    # runs the forward's again.
    fwd_layer_bytes = m.layer_elementwise_bytes(
        tokens, tp=tp, sequence_parallel=sequence_parallel, flash_attention=flash_attention
    )
    bwd_layer_bytes = (3 if recompute == "full" else 2) * fwd_layer_bytes
    # Selective recomputation of an unfused attention core re-runs its forward in the
    # backward: the scores' GEMMs (pass_work) and the softmax (and dropout) over them
    # (Megatron-Core's checkpointed core attention, recompute_modules "core_attn").
    scores_again = (
        m.scores_elementwise_bytes(tokens, tp=tp)
        if recompute == "selective" and not flash_attention
        else 0.0
    )
    bwd_layer_bytes += scores_again
    # YaRN's unfused rotary embedding (Transformer.unfused_rope_bytes), every layer.
    rope_fwd, rope_bwd = (0.0, 0.0) if fused_yarn_rope else m.unfused_rope_bytes(tokens, tp=tp)
    if not mla_fused_rope:
        # MLA's rotary part and its query/key/value assembly on Megatron-Core's unfused
        # RoPE path (Transformer.mla_unfused_rope_bytes), every layer; again in the
        # backward where "mla_up_proj" recomputes them (full recomputation: below).
        mla_fwd, mla_bwd = m.mla_unfused_rope_bytes(tokens, tp=tp)
        mla_again = mla_fwd if recompute_mla_up_proj and recompute != "full" else 0.0
        rope_fwd, rope_bwd = rope_fwd + mla_fwd, rope_bwd + mla_bwd + mla_again
    rope_bwd += rope_fwd if recompute == "full" else 0.0
    fwd_layer_bytes += rope_fwd
    bwd_layer_bytes += rope_bwd
    # An MoE layer's: its experts' activation over the routed copies and the
    # dispatcher's permutations instead of a dense MLP's (backward alike, twice).
    fwd_moe_bytes = bwd_moe_bytes = 0.0
    if m.is_moe:
        fwd_moe_bytes = m.moe_elementwise_bytes(
            tokens,
            tp=tp,
            sequence_parallel=sequence_parallel,
            flash_attention=flash_attention,
            local_experts=m.experts // ep,
        )
        bwd_moe_bytes = (3 if recompute == "full" else 2) * fwd_moe_bytes + scores_again
        fwd_moe_bytes += rope_fwd
        bwd_moe_bytes += rope_bwd
    if precision == "fp8":  # Transformer Engine's casts to fp8 (and their transposes)
        recipe = {
            "recipe": fp8_recipe,
            "transpose": fp8_transpose,
            "sequence_parallel": sequence_parallel,
        }
        fp8_fwd = m.fp8_cast_bytes(tokens, tp=tp, **recipe)
        fwd_layer_bytes += fp8_fwd
        bwd_layer_bytes += m.fp8_cast_bytes(tokens, tp=tp, backward=True, **recipe)
        bwd_layer_bytes += fp8_fwd if recompute == "full" else 0.0
        if m.is_moe and moe_routed_casts:
            # An MoE layer's: its experts' grouped GEMMs quantize every routed copy's
            # input and output gradient (Transformer.moe_fp8_cast_bytes).
            moe_recipe = {**recipe, "etp": etp}
            moe_fwd = m.moe_fp8_cast_bytes(tokens, tp=tp, **moe_recipe)
            fwd_moe_bytes += moe_fwd
            bwd_moe_bytes += m.moe_fp8_cast_bytes(tokens, tp=tp, backward=True, **moe_recipe)
            bwd_moe_bytes += moe_fwd if recompute == "full" else 0.0
        elif m.is_moe:  # (the earlier build: an MoE layer's casts taken as a dense layer's)
            fwd_moe_bytes += fp8_fwd
            bwd_moe_bytes += m.fp8_cast_bytes(tokens, tp=tp, backward=True)
            bwd_moe_bytes += fp8_fwd if recompute == "full" else 0.0
    if m.is_moe and moe_dispatcher != "hybridep":
        # TEGroupedMLP's fp8 padding and unpadding copies (alltoall and DeepEP; HybridEP's
        # dispatch pads in place: token_dispatcher.py core_v0.16.0, ``pad_multiple``),
        # the same bytes backward (Transformer.expert_padding_bytes).
        pad = m.expert_padding_bytes(
            tokens, ep=ep, etp=etp, tp=tp, sequence_parallel=sequence_parallel, align=fp8_align
        )
        fwd_moe_bytes += pad
        bwd_moe_bytes += (2 if recompute == "full" else 1) * pad
    if m.is_moe and moe_fused_grouped_mlp:
        # TE's fused grouped MLP: the routed activation (gpt-oss's clamps with it), fc2's
        # input cast and, backward, their gradients run in the GEMMs' epilogues
        # (Transformer.fused_grouped_mlp_bytes); recomputing the activation recomputes
        # nothing of its own.
        fused_fwd, fused_bwd = m.fused_grouped_mlp_bytes(
            tokens,
            tp=tp,
            etp=etp,
            sequence_parallel=sequence_parallel,
            recipe=fp8_recipe,
            transpose=fp8_transpose,
        )
        fwd_moe_bytes -= fused_fwd
        bwd_moe_bytes -= fused_bwd + (fused_fwd if recompute == "full" else 0.0)
    elif m.is_moe:
        # gpt-oss's clamped activation (Transformer.glu_clamp_bytes), its clamps again
        # where the backward recomputes the activation; and the activation's own forward
        # again with recompute_moe_act (full recomputation re-runs the whole forward).
        act_again = recompute_moe_act and recompute != "full"
        clamp_fwd, clamp_bwd = m.glu_clamp_bytes(
            tokens, tp=tp, sequence_parallel=sequence_parallel, etp=etp, recompute=act_again
        )
        fwd_moe_bytes += clamp_fwd
        bwd_moe_bytes += clamp_bwd + (clamp_fwd if recompute == "full" else 0.0)
        if act_again:
            bwd_moe_bytes += m.expert_activation_bytes(
                tokens, tp=tp, sequence_parallel=sequence_parallel
            )
    if m.is_moe and m.expert_bias:  # fc2's bias per expert (Transformer.expert_bias_bytes)
        bias_fwd, bias_bwd = m.expert_bias_bytes(
            tokens, tp=tp, sequence_parallel=sequence_parallel, etp=etp
        )
        fwd_moe_bytes += bias_fwd
        bwd_moe_bytes += bias_bwd + (bias_fwd if recompute == "full" else 0.0)
    # The loss after the logits (last virtual stage): its kernels' traffic joins that
    # pass's memory-bound op.
    loss_bytes = {
        forward: m.cross_entropy_bytes(tokens, tp=tp, impl=cross_entropy, backward=not forward)
        for forward in (True, False)
    }
    activation = tokens * m.hidden * BF16
    tp_fwd_layer = 2 * activation
    tp_bwd_layer = (4 if recompute == "full" else 2) * activation
    # Userbuffers' exposed work per dense layer: its reduction kernels (memory traffic
    # on the compute stream) and the reduce-scatter of pipelined GEMMs' last chunks,
    # forward (and in the backward's recomputed forward).
    ub_reduce, ub_rs = userbuffers_exposed(ub, tp, activation) if ub else (0.0, 0.0)
    fwd_layer_bytes += ub_reduce
    bwd_layer_bytes += ub_reduce if recompute == "full" else 0.0
    ub_rs_exposed = {True: ub_rs, False: ub_rs if recompute == "full" else 0.0}
    replicas = dp * cp  # ranks holding the same weights
    sharded = (distributed_optimizer or fsdp) and replicas > 1
    sharded_weights = fsdp and replicas > 1
    # Megatron's gradient buckets (DistributedDataParallelConfig.bucket_size, by default
    # max(40M, 1M x dp) parameters, megatron/core/distributed/
    # distributed_data_parallel.py), here whole layers of a chunk.
    # (MoE: the layer's parameters a rank holds, its experts' and the rest, whose
    # buffers Megatron buckets alike.)
    rank_layer_params = m.layer_params / tp
    if m.is_moe:
        expert_mlp = (3 if m.gated else 2) * m.hidden * m.expert_ffn
        rank_layer_params = (m.moe_layer_params - m.experts * expert_mlp) / tp + (
            m.experts // ep * expert_mlp / etp
        )
    if bucket_size is None:
        # Megatron-Core's default scales with the DP size without CP
        # (distributed_data_parallel.py:62-65 at core_v0.14.0 calls
        # get_data_parallel_world_size(), whose with_context_parallel is False,
        # parallel_state.py:1603).
        bucket_size = max(40_000_000, 1_000_000 * dp)
    elif isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
        raise CcsimError(
            f"bucket_size (parameters per gradient bucket, Megatron's --ddp-bucket-size) "
            f"must be a positive integer or null for Megatron's default, not {bucket_size!r}"
        )
    # A bucket closes once it holds bucket_size parameters or more (Megatron adds a
    # layer's parameters one by one and closes the bucket at the first that reaches it):
    # whole layers here, so ceil(bucket_size / layer).
    bucket_layers = max(1, math.ceil(bucket_size / rank_layer_params))
    if apex_bucket_mib is not None and (
        isinstance(apex_bucket_mib, (bool, str))
        or not isinstance(apex_bucket_mib, (int, float))
        or not 0 < apex_bucket_mib < math.inf
    ):
        raise CcsimError(
            "apex_bucket_mib (Apex DistributedFusedAdam's bucket_cap_mb, MiB) must be a "
            f"positive number or null for Megatron-Core's buckets, not {apex_bucket_mib!r}"
        )
    # NeMo 1's effective buckets with Apex's optimizer: single layers, or whole model
    # chunks with interleaving; apex_elements: parameters an Apex bucket (its
    # bucket_size, in the gradients' dtype), 0 where Megatron-Core's buckets run.
    apex_elements = 0.0
    if apex_bucket_mib is not None and sharded and not sharded_weights:
        apex_elements = 1024 * 1024 * float(apex_bucket_mib) / grad
        bucket_layers = 1 if v == 1 else m.layers

    def buckets(chunk: int) -> list[int]:
        """The layers of each gradient bucket of a chunk of ``chunk`` layers."""
        return [min(bucket_layers, chunk - k) for k in range(0, chunk, bucket_layers)]

    # Megatron-FSDP runs each transformer layer (its FSDP unit) as soon as that layer's
    # weights are gathered, gathering the next ones ahead (fsdp_gathered_units): a
    # layer's gather may start once the layer that many units before it in the step has
    # run, whose buffer it takes.
    fsdp_window = fsdp_gathered_units(m.layer_params / tp)
    dense_params = m.layer_params  # (a property summed anew each time: read once)
    tp_ops = ("reduce_scatter", "all_gather") if sequence_parallel else ("all_reduce",)
    # Megatron's --overlap-param-gather: the distributed optimizer's updated parameters
    # are all-gathered bucket by bucket while the next step's first forward runs (its
    # forward pre-hooks wait for each bucket). In a steady state that is this step's
    # start: the gathers go first on the DP stream and each chunk's first forward waits
    # for its own buckets' (megatron/core/distributed/param_and_grad_buffer.py).
    gathers_overlapped = bool(overlap_param_gather) and sharded and not sharded_weights
    # With fp8 weights (one-byte Float8Tensor parameters: a uint8 buffer beside the
    # bf16 one), Megatron-Core merges every bf16 bucket of a model chunk (its input
    # embedding, output layer and norms) into the chunk's last fp8 bucket group, the one
    # of its first layers (partition_buckets, case 3,
    # megatron/core/distributed/param_and_grad_buffer.py lines 860-960 at core_v0.14.0):
    # the output layer is then gathered with the chunk's first layers, before its first
    # forward, instead of last; its gradients are reduced with the embedding's at the end
    # either way here. (The norms' bytes stay with their layers: a few KiB.) MXFP8
    # weights are gathered in bf16 (no uint8 buffer: each bucket its own group).
    merged_vocab = param_bytes == 1 or apex_elements > 0
    b = _Builder(
        f"megatron-tp{tp}-pp{pp}-dp{dp}" + (f"-cp{cp}" if cp > 1 else ""),
        ranks,
        f"Megatron GPT {m.params / 1e9:.0f}B, TP {tp} PP {pp} DP {dp}"
        + (f" CP {cp}" if cp > 1 else "")
        + f", {micro} micro-batches of {micro_batch}"
        + (f", stages of {'/'.join(map(str, split))} layers" if len(set(split)) > 1 else ""),
        trusted=True,
    )

    def rank_of(stage: int, d: int, t: int, q: int = 0) -> int:
        return ((stage * dp + d) * cp + q) * tp + t

    suffix = (lambda q: f".c{q}") if cp > 1 else (lambda q: "")
    tp_groups = {}
    cp_groups = {}
    for stage in range(pp):
        for d in range(dp):
            for q in range(cp):
                members = [rank_of(stage, d, t, q) for t in range(tp)]
                name = f"tp.s{stage}.d{d}{suffix(q)}"
                tp_groups[(stage, d, q)] = b.group(name, "TP", members)
            if cp > 1:
                for t in range(tp):
                    members = [rank_of(stage, d, t, q) for q in range(cp)]
                    cp_groups[(stage, d, t)] = b.group(f"cp.s{stage}.d{d}.t{t}", "CP", members)
            if inner > 1:
                # a2a+p2p: Megatron-Core's hierarchical CP groups
                # (parallel_state.create_hierarchical_groups, core_v0.19.0 line 378):
                # level 0 each run of ``inner`` consecutive CP ranks (the all-to-alls),
                # level 1 the CP ranks ``inner`` apart (the rings).
                for t, q in itertools.product(range(tp), range(cp)):
                    block, lane = divmod(q, inner)
                    at = f"s{stage}.d{d}.t{t}"
                    if lane == 0:
                        members = [rank_of(stage, d, t, k) for k in range(q, q + inner)]
                        cp_groups[(stage, d, t, "a2a", block)] = b.group(
                            f"cp.a2a.{at}.{block}", "CP", members
                        )
                    if block == 0:
                        members = [rank_of(stage, d, t, k) for k in range(q, cp, inner)]
                        cp_groups[(stage, d, t, "p2p", lane)] = b.group(
                            f"cp.p2p.{at}.{lane}", "CP", members
                        )
    dp_groups = {}
    for stage in range(pp):
        for t in range(tp):
            members = [rank_of(stage, d, t, q) for d in range(dp) for q in range(cp)]
            dp_groups[(stage, t)] = b.group(f"dp.s{stage}.t{t}", "DP", members)
    # Delayed scaling's amax all-reduce: over each stage's TP x DP x CP ranks (in rank
    # order: a replica's ranks, then the next replica's), or each TP group.
    # With amax_seconds the call is a timed wait (None here): no group spans the replicas.
    amax_groups: dict[tuple, str | None] = {}
    if amax_reduction == "stage" and tp * dp * cp > 1:
        for stage in range(pp):
            members = [
                rank_of(stage, d, t, q) for d in range(dp) for q in range(cp) for t in range(tp)
            ]
            group = None if amax_seconds else b.group(f"amax.s{stage}", "DP", members)
            for d, q in itertools.product(range(dp), range(cp)):
                amax_groups[(stage, d, q)] = group
    elif amax_reduction == "tp" and tp > 1:
        amax_groups = {key: None for key in tp_groups} if amax_seconds else dict(tp_groups)
    # Tied embeddings (GPT's; Megatron-LM's default, share_embeddings_and_output_weights):
    # the first stage's input embedding and the last stage's output layer are one weight,
    # whose gradients Megatron all-reduces between those two stages once the DP reduction
    # is done (finalize_model_grads -> _allreduce_word_embedding_grads, in
    # megatron/core/distributed/finalize_model_grads.py), over each pipeline's pair.
    emb_groups: dict[tuple, str] = {}
    vocab_matrix = m.vocab * m.hidden / tp
    # The output layer is a matrix of its own unless the model ties it to the input
    # embedding on one stage (a tied model's last stage keeps a copy at PP > 1).
    output_matrix = 0 if m.tied_embeddings and pp == 1 else 1

    def vocab_matrices(stage: int) -> int:
        """Vocabulary matrices a rank of ``stage`` holds: the input embedding on the
        first, the output layer on the last (both on one stage without pipelining)."""
        return int(stage == 0) + (output_matrix if stage == pp - 1 else 0)

    if m.tied_embeddings and m.vocab and pp > 1:
        for d, t, q in itertools.product(range(dp), range(tp), range(cp)):
            members = [rank_of(0, d, t, q), rank_of(pp - 1, d, t, q)]
            emb_groups[(d, t, q)] = b.group(f"emb.d{d}.t{t}{suffix(q)}", "DP", members)
    # Expert parallelism as Megatron-Core's expert grid orders it
    # (megatron/core/parallel_state.py: the expert RankGenerator's "tp-cp-ep-dp-pp" with
    # cp 1 and tp the expert TP size): a stage's TP x CP x DP ranks, TP fastest, are
    # t + etp (e + ep d) for expert TP rank t, EP rank e and expert-DP rank d. An EP
    # group holds the ranks of one t and d (``ep`` consecutive ones with etp 1); expert
    # gradients are reduced over the ranks of one t and e (the same experts), the
    # expert-data-parallel group; the ETP group (one e and d) is the TP group.
    ep_groups: dict[tuple, str] = {}
    edp_groups: dict[tuple, str] = {}
    width = tp * cp * dp  # ranks of a stage
    edp_size = width // (ep * etp)  # expert-data-parallel ranks

    def expert_coords(local: int) -> tuple[int, int, int]:
        """(t, e, d) of the stage's ``local``-th rank in the expert grid."""
        return local % etp, local // etp % ep, local // (etp * ep)

    if m.is_moe:
        for stage in range(pp):
            base = stage * width
            for t, d in itertools.product(range(etp), range(edp_size)):
                if ep > 1:
                    members = [base + t + etp * (e + ep * d) for e in range(ep)]
                    name = f"ep.s{stage}.{d * etp + t}"
                    ep_groups[(stage, t, d)] = b.group(name, "EP", members)
            for t, e in itertools.product(range(etp), range(ep)):
                members = [base + t + etp * (e + ep * d) for d in range(edp_size)]
                if len(members) > 1:
                    name = f"edp.s{stage}.e{e}" + (f".t{t}" if etp > 1 else "")
                    edp_groups[(stage, t, e)] = b.group(name, "DP", members)
    expert_mlp = (3 if m.gated else 2) * m.hidden * m.expert_ffn
    expert_params = m.experts // ep * expert_mlp / etp if m.is_moe else 0.0
    # An MoE layer's parameters besides its routed experts (attention, shared experts,
    # router), split over TP.
    moe_params = (m.moe_layer_params - m.experts * expert_mlp) / tp
    for stage in range(pp):
        # Parameters one rank of this stage holds (embeddings on the first and last):
        # with MoE layers, the experts' apart (reduced over their own ranks).
        stage_moe = sum(moe_layers(c * pp + stage) for c in range(v))
        stage_params = (split[stage] - stage_moe) * m.layer_params / tp + vocab_matrices(
            stage
        ) * vocab_matrix
        stage_params += stage_moe * moe_params if m.is_moe else 0.0
        stage_layer_params = (split[stage] - stage_moe) * m.layer_params / tp
        stage_experts = stage_moe * expert_params
        # The passes in the order the stage runs them, each group of two one combined
        # step (moe_a2a_overlap).
        if moe_a2a_overlap:
            groups = _a2a_overlap_order(stage, pp, micro, v)
        else:
            groups = [(entry,) for entry in pipeline_order(stage, pp, micro, v)]
        order = [entry for group in groups for entry in group]
        # Each chunk's last backward, which completes its gradients.
        final = {c: entry for entry in order if entry[0] == "b" for c in [entry[1]]}
        for d, q, t in itertools.product(range(replicas_built), range(cp_built), range(tp_built)):
            r = rank_of(stage, d, t, q)
            if ep_shadows and d % ep:
                continue
            after: list[str] = []  # the ops the rank's next op waits for
            reduces: list[str] = []
            experts_reduced = False  # bucket by bucket, with overlap_grad_reduce
            units_done: list[str] = []  # each layer's (FSDP unit's) compute op, in order
            gathers_started: set[int] = set()
            sent: dict[str, str] = {}  # the last send of each direction ("f", "b")

            def post_recv(
                kind: str,
                c: int,
                i: int,
                deps: list[str],
                stage: int = stage,
                r: int = r,
                d: int = d,
                t: int = t,
                q: int = q,
            ) -> str | None:
                """The receive of pass (kind, c, i), posted after ``deps`` (None: the
                first virtual stage's forwards and the last's backwards receive
                nothing)."""
                forward = kind == "f"
                here = c * pp + stage
                source = here - 1 if forward else here + 1
                if not 0 <= source < pp * v:
                    return None
                what = "act" if forward else "grad"
                return b.op(
                    f"r{r}.recv.{kind}{i}" if v == 1 else f"r{r}.recv.{kind}{c}.{i}",
                    r,
                    "recv",
                    deps,
                    peer=rank_of(source % pp, d, t, q),
                    bytes=activation / tp,
                    tag=f"{what}{i}" if v == 1 else f"{what}{min(here, source)}.{i}",
                    stream=p2p_stream(send=False, forward=forward),
                )

            def one_pass(
                kind: str,
                c: int,
                i: int,
                after: list[str],
                posted: str | bool | None = False,
                waits: list[str] | None = None,
                send_later: list[tuple] | None = None,
                # (this rank's, bound now: the pass is built before the loop moves on)
                stage: int = stage,
                r: int = r,
                d: int = d,
                t: int = t,
                q: int = q,
                final: dict = final,
                gathers_started: set[int] = gathers_started,
                units_done: list[str] = units_done,
                reduces: list[str] = reduces,
                sent: dict[str, str] = sent,
            ) -> Generator[None, None, list[str]]:
                """The ops of one pass after ``after``; pauses where a combined step
                runs the other pass's (:func:`_expert_layers`). ``posted``: the pass's
                receive if it was posted already (False: post it now, after
                ``after``); ``waits``: what else the pass's compute waits for (the
                previous send of its direction, :func:`megatron`'s
                ``p2p_send_wait``); ``send_later``: if given, the pass's send is not
                issued but appended to it as (kind, (name, rank, "send", deps, fields)), for
                the caller to issue in Megatron-Core's order (a combined step)."""
                nonlocal experts_reduced
                # One chunk keeps the names of the plain schedule.
                tag = f"{kind}{i}" if v == 1 else f"{kind}{c}.{i}"
                # Forward: activations come from the previous virtual stage and go to
                # the next; backward: gradients come from the next and go to the
                # previous. Virtual stage c p + s runs on stage s.
                forward = kind == "f"
                here = c * pp + stage
                target = here + 1 if forward else here - 1
                what = "act" if forward else "grad"
                recv = post_recv(kind, c, i, after) if posted is False else posted
                sent.pop(kind, None)  # (the send handles waited are the last call's)
                # The last backward of a chunk completes its gradients; with
                # overlap_grad_reduce it runs bucket by bucket, each bucket's DP
                # collective starting as soon as its layers are done.
                last = not forward and (kind, c, i) == final[c]
                bucketed = last and overlap_grad_reduce and replicas > 1
                # With the parameter all-gather overlapped, a chunk's first forward runs
                # bucket by bucket (first layers first), each waiting for its bucket's
                # gather, issued at the start of the step (see param_gathers).
                gathered = forward and gathers_overlapped and c not in gathers_started
                chunk = chunks[stage][c]  # the layers of this model chunk
                # A chunk of no layers (the embedding or the loss alone) still runs its
                # pass: one piece of 0 layers.
                pieces = (buckets(chunk) or [0]) if bucketed else [chunk]
                if gathered:
                    gathers_started.add(c)
                    pieces = (buckets(chunk) or [0])[::-1]
                if sharded_weights and chunk > 1:
                    pieces = [1] * chunk  # Megatron-FSDP: one unit (layer) at a time
                span = spans[(stage, c)]
                for n, layers in enumerate(pieces):
                    # The piece's MoE layers (forward pieces from the chunk's first layer
                    # on, backward ones from its last back), and the parameters it
                    # gathers or reduces: over DP x CP all but the routed experts, theirs
                    # over the expert-data-parallel ranks.
                    moe = moe_layers(here) if m.is_moe and len(pieces) == 1 else 0
                    if m.is_moe and len(pieces) > 1:
                        done = sum(pieces[: n + (0 if forward else 1)])
                        start = span.start + done if forward else span.stop - done
                        moe = sum(m.moe_layer(k) for k in range(start, start + layers))
                    piece_params = (layers - moe) * dense_params / tp + moe * moe_params
                    piece_experts = moe * expert_params
                    t_e, e_e, d_e = expert_coords(r - stage * width)
                    edp = edp_groups.get((stage, t_e, e_e))
                    piece = "unit" if sharded_weights else "bucket"
                    name = tag if len(pieces) == 1 else f"{tag}.{piece}{n}"
                    # The output layer after the last layer forward, before the first
                    # backward.
                    logits = here == pp * v - 1 and n == (len(pieces) - 1 if forward else 0)
                    deps = [recv, *after, *(waits or [])]
                    if gathered:
                        params = piece_params
                        # The embedding before the first piece, the output layer
                        # after the last (with fp8 weights, before the first too:
                        # merged_vocab).
                        if n == 0 and here == 0:
                            params += vocab_matrix
                        if here == pp * v - 1 and n == (0 if merged_vocab else len(pieces) - 1):
                            params += output_matrix * vocab_matrix
                        # (Apex: each of a later effective bucket's own buckets in
                        # a call, the first one's, its first layer's, together.)
                        first = n == 0 and c == 0
                        deps.extend(
                            _dp_calls(
                                b,
                                f"r{r}.dp.params.{c}.{n}",
                                r,
                                [],
                                0.0 if first else params,
                                apex_elements,
                                op="all_gather",
                                group=dp_groups[(stage, t)],
                                bytes=params * BF16 - piece_params * (BF16 - param_bytes),
                                stream="dp",
                                label="DP parameters",
                            )
                        )
                        if piece_experts and edp is not None:
                            deps.append(
                                b.op(
                                    f"r{r}.dp.params.{c}.{n}.experts",
                                    r,
                                    "collective",
                                    [],
                                    op="all_gather",
                                    group=edp,
                                    bytes=piece_experts * param_bytes,
                                    stream="dp",
                                    label="DP expert parameters",
                                )
                            )
                    layer_bytes = layers * dense_params / tp * BF16  # gathered weights
                    layer_grads = layers * dense_params / tp * grad
                    gather = None
                    if sharded_weights and layers:
                        # Prefetched: the gather waits for the layer fsdp_window units
                        # before this one (whose buffer it takes) only.
                        done = len(units_done)
                        gate = units_done[done - fsdp_window] if done >= fsdp_window else None
                        gather = b.op(
                            f"r{r}.fsdp.{name}.gather",
                            r,
                            "collective",
                            [gate],
                            op="all_gather",
                            group=dp_groups[(stage, t)],
                            bytes=layer_bytes,
                            stream="fsdp.ag",
                            label=f"FSDP weights {'fwd' if forward else 'bwd'} mb {i}",
                        )
                        deps = [*deps, gather]
                    # With combined 1F1B a backward runs as Megatron-Core's layers do
                    # there: the combine's gradient all-to-all, the experts, the
                    # dispatch's, then the attention (model_chunk_schedule_plan.py, run).
                    experts_first = moe and moe_a2a_overlap and not forward and recompute != "full"
                    pass_deps = deps  # where the pass starts (the host's launches too)
                    routed = {
                        "group": ep_groups.get((stage, t_e, d_e)),
                        "experts": experts,
                        "layers": moe,
                        "a2a_bytes": moe * a2a_layer,
                        "forward": forward,
                        "recompute": recompute,
                        "label": f"mb {i}",
                        "cache": expert_cache,
                        "sync_s": HOST_SYNC_S if moe_host_sync else 0.0,
                        "stream": "ep" if moe_a2a_overlap else "compute",
                        "paired": moe_a2a_overlap,
                        # Expert TP: the routed tokens gathered over the TP group (the
                        # ETP group) and the experts' outputs reduce-scattered back.
                        "etp_group": tp_groups[(stage, d, q)] if etp > 1 else None,
                        "etp_bytes": etp * moe * a2a_layer,
                    }
                    if experts_first:
                        deps = [(yield from _expert_layers(b, r, name, deps, **routed))]
                    flow = moe and forward and flow_launches is not None
                    if flow and layers == moe and not logits:
                        comp = None  # only MoE layers: all of them in the flow shop
                    else:
                        # The pass's other layers and the logits (whose launches the
                        # host model leaves out), before the MoE layers' flow shop.
                        comp = b.op(
                            f"r{r}.{name}",
                            r,
                            "compute",
                            deps,
                            **work(forward, logits, layers - moe if flow else layers,
                                   0 if flow else moe),
                            label=f"{'fwd' if forward else 'bwd'} mb {i}",
                        )  # fmt: skip
                    if flow:
                        comp = _moe_flow_shop(
                            b, r, name, [comp] if comp else deps, flow_launches, flow_gpu,
                            group=routed["group"], layers=moe, a2a_layer=a2a_layer,
                            sync_s=routed["sync_s"], label=f"mb {i}",
                            etp_group=routed["etp_group"], etp_layer=etp * a2a_layer,
                        )  # fmt: skip
                    units_done.append(comp)
                    if moe and not experts_first and not flow:
                        comp = yield from _expert_layers(b, r, name, [comp], **routed)
                    ready = [comp]
                    host_s = host_fwd if forward else host_bwd
                    host_s += host_fwd if not forward and recompute == "full" else 0.0
                    if moe and host_s and not flow:
                        # The host launching the piece's MoE layers, one after another:
                        # from the pass's start where a synchronisation drained its
                        # queue, else right after its previous launches (the host
                        # stream keeps them in order). With the forwards' flow shops a
                        # backward has no synchronisation of its own (the all-to-alls'
                        # splits and GroupedLinear's m_splits are saved host lists:
                        # token_dispatcher.py, mappings.py _AllToAll.backward) unless it
                        # recomputes the forward.
                        drained = moe_host_sync and (flow_launches is None or recompute == "full")
                        host = b.op(f"r{r}.{name}.host", r, "compute",
                                    pass_deps if drained else [], stream="host",
                                    duration=_dyadic(moe * host_s),
                                    label=f"MoE host mb {i}")  # fmt: skip
                        ready.append(host)
                    # A chunk of no layers (only the embedding or the loss) has no
                    # attention to run and no K/V to exchange.
                    if cp > 1 and layers and cp_comm_type == "p2p":
                        ready = _ring_attention(
                            b,
                            r,
                            name,
                            comp,
                            cp_groups[(stage, d, t)],
                            layers * kv_layer,
                            flash_core_kernels(
                                m,
                                micro_batch,
                                tp=tp,
                                layers=layers,
                                forward=forward,
                                recompute=recompute,
                                cp=cp,
                                backend=backend,
                                dropout=attention_dropout,
                            ),
                            forward=forward,
                            recompute=recompute,
                            label=f"mb {i}",
                        )
                    elif cp > 1 and layers and inner > 1:
                        ready = [
                            _hierarchical_attention(
                                b,
                                r,
                                name,
                                comp,
                                cp_groups[(stage, d, t, "a2a", q // inner)],
                                cp_groups[(stage, d, t, "p2p", q % inner)],
                                layers * qkv_local,
                                layers * o_local,
                                layers * kv_layer / inner,
                                # The ring's s / p queries on a / (t n) heads.
                                flash_core_kernels(
                                    m,
                                    micro_batch,
                                    tp=tp * inner,
                                    layers=layers,
                                    forward=forward,
                                    recompute=recompute,
                                    cp=cp // inner,
                                    backend=backend,
                                    dropout=attention_dropout,
                                ),
                                forward=forward,
                                recompute=recompute,
                                label=f"mb {i}",
                            )
                        ]
                    elif cp > 1 and layers:
                        a2a = cp_comm_type == "a2a"
                        ready = [
                            (_a2a_attention if a2a else _gathered_attention)(
                                b,
                                r,
                                name,
                                comp,
                                cp_groups[(stage, d, t)],
                                *(
                                    (layers * qkv_local, layers * o_local)
                                    if a2a
                                    else (layers * kv_gathered,)
                                ),
                                # a2a: the whole sequence on a / (t cp) heads.
                                flash_core_kernels(
                                    m,
                                    micro_batch,
                                    tp=tp * cp if a2a else tp,
                                    layers=layers,
                                    forward=forward,
                                    recompute=recompute,
                                    cp=1 if a2a else cp,
                                    backend=backend,
                                    dropout=attention_dropout,
                                ),
                                forward=forward,
                                recompute=recompute,
                                label=f"mb {i}",
                            )
                        ]
                    after = [
                        b.op(
                            f"r{r}.{name}.elementwise",
                            r,
                            "compute",
                            ready,
                            flops=0.0,
                            bytes=(layers - moe) * (fwd_layer_bytes if forward else bwd_layer_bytes)
                            + moe * (fwd_moe_bytes if forward else bwd_moe_bytes)
                            + (loss_bytes[forward] if logits else 0.0),
                            label=f"{'fwd' if forward else 'bwd'} elementwise mb {i}",
                        )
                    ]
                    if tp_amax_s and layers:
                        # The pass's blocking TP amax all-reduces (current scaling),
                        # waited on the compute stream: summed at the pass's end, where
                        # only their count of waits matters.
                        calls = tp_amax_calls(
                            layers - moe,
                            moe,
                            forward=forward,
                            recompute=recompute,
                            shared_experts=m.shared_experts > 0,
                        )
                        after = [
                            b.op(
                                f"r{r}.{name}.tpamax",
                                r,
                                "compute",
                                after,
                                duration=calls * tp_amax_s,
                                stream="compute",
                                label=f"fp8 TP amax {'fwd' if forward else 'bwd'} mb {i}",
                            )
                        ]
                    # TP collectives after the pass's kernels on the compute stream,
                    # or (tp_comm_overlap) on their own stream beside its GEMMs.
                    tp_prev = deps if tp_comm_overlap else after
                    # Userbuffers' pipelined last chunks: their reduce-scatter after the
                    # pass's kernels on the compute stream, the rest beside them.
                    exposed = (layers - moe) * ub_rs_exposed[forward]
                    for op_name in tp_ops:
                        tp_prev = [
                            b.op(
                                f"r{r}.tp.{name}" + (f".{op_name}" if sequence_parallel else ""),
                                r,
                                "collective",
                                tp_prev,
                                op=op_name,
                                group=tp_groups[(stage, d, q)],
                                bytes=(layers - (0 if m.shared_experts else moe / 2))
                                * (tp_fwd_layer if forward else tp_bwd_layer)
                                - (exposed if op_name == "reduce_scatter" else 0.0),
                                stream="tp" if tp_comm_overlap else "compute",
                                label=f"TP {'fwd' if forward else 'bwd'} mb {i}",
                            )
                        ]
                    if exposed:
                        after = [
                            b.op(
                                f"r{r}.tp.{name}.exposed",
                                r,
                                "collective",
                                after,
                                op="reduce_scatter",
                                group=tp_groups[(stage, d, q)],
                                bytes=exposed,
                                stream="compute",
                                label=f"TP exposed {'fwd' if forward else 'bwd'} mb {i}",
                            )
                        ]
                    computed = after  # the pass's end on the compute stream
                    after = after + tp_prev if tp_comm_overlap else tp_prev
                    if sharded_weights and not forward and layers:
                        reduces.append(
                            b.op(
                                f"r{r}.fsdp.{name}.reduce",
                                r,
                                "collective",
                                after,
                                op="reduce_scatter",
                                group=dp_groups[(stage, t)],
                                bytes=layer_grads,
                                stream="fsdp.rs",
                                label=f"FSDP gradients mb {i}",
                            )
                        )
                    if last and overlap_grad_reduce and replicas > 1:
                        # Megatron fills buckets from the last parameter back
                        # (_ParamAndGradBuffer walks params[::-1]): the output layer,
                        # registered last, is bucket 0, reduced first, and the
                        # embedding's gradients come with the last bucket; with fp8
                        # weights the output layer's bucket joins the last group
                        # (merged_vocab), reduced at the end.
                        grads = piece_params
                        if n == len(pieces) - 1 and here == 0:
                            grads += vocab_matrix
                        if here == pp * v - 1 and n == (len(pieces) - 1 if merged_vocab else 0):
                            grads += output_matrix * vocab_matrix
                        bucket_name = f"r{r}.dp.{c}.{n}" if v > 1 else f"r{r}.dp.{n}"
                        grads_ready = _grad_buffer_pass(
                            b, r, bucket_name, computed, after, bucket_passes * grad,
                            grads + (piece_experts if edp is not None else 0),
                        )  # fmt: skip
                        if piece_experts and edp is not None:
                            experts_reduced = True
                            reduces.append(
                                b.op(
                                    f"r{r}.dp.{c}.{n}.experts",
                                    r,
                                    "collective",
                                    grads_ready,
                                    op="reduce_scatter" if sharded else "all_reduce",
                                    group=edp,
                                    bytes=piece_experts * grad,
                                    stream="dp",
                                    label="DP expert gradients",
                                )
                            )
                        reduces.append(
                            b.op(
                                bucket_name,
                                r,
                                "collective",
                                grads_ready,
                                op="reduce_scatter" if sharded else "all_reduce",
                                group=dp_groups[(stage, t)],
                                bytes=grads * grad,
                                stream="dp",
                                label="DP gradients",
                            )
                        )
                amax_group = amax_groups.get((stage, d, q))
                if (stage, d, q) in amax_groups and chunk and amax_seconds:
                    after = [
                        b.op(
                            f"r{r}.amax.{tag}",
                            r,
                            "compute",
                            after,
                            duration=amax_seconds[0 if forward else 1],
                            stream="compute",
                            label=f"fp8 amax {'fwd' if forward else 'bwd'} mb {i}",
                        )
                    ]
                elif amax_group is not None and chunk:
                    # Transformer Engine reduces the pass's amaxes as the chunk's fp8
                    # region ends (fp8_autocast exit) and as its first fp8 module's
                    # backward ends, a blocking all-reduce the compute stream waits for
                    # (v1.12 fp8.py, reduce_and_update_fp8_tensors:
                    # all_reduce(..., async_op=False)).
                    after = [
                        b.op(
                            f"r{r}.amax.{tag}",
                            r,
                            "collective",
                            after,
                            op="all_reduce",
                            group=amax_group,
                            bytes=chunk * AMAX_BYTES_PER_LAYER[forward],
                            stream="compute",
                            label=f"fp8 amax {'fwd' if forward else 'bwd'} mb {i}",
                        )
                    ]
                if 0 <= target < pp * v:
                    send = (
                        f"r{r}.send.{tag}",
                        r,
                        "send",
                        after,
                        {
                            "peer": rank_of(target % pp, d, t, q),
                            "bytes": activation / tp,
                            "tag": f"{what}{i}" if v == 1 else f"{what}{min(here, target)}.{i}",
                            "stream": p2p_stream(send=True, forward=forward),
                        },
                    )
                    if send_later is not None:
                        send_later.append((kind, send))
                    else:
                        sent[kind] = b.op(*send[:4], **send[4])
                return after

            # With overlap_p2p_comm, each pass's receive is posted when the rank's last
            # pass of the same direction ends, right after that pass's send (as
            # send_forward_recv_forward and send_backward_recv_backward issue them), so
            # that on a stream per peer it queues between the sends as on the GPU.
            early_ok = {group[0] for group in groups if early_recv and len(group) == 1}
            posts_after: dict[tuple, list[tuple]] = defaultdict(list)
            coming: dict[str, tuple] = {}
            for entry in reversed(order):
                if entry[0] in coming:
                    posts_after[entry].append(coming[entry[0]])
                coming[entry[0]] = entry
            first_b = next((n for n, entry in enumerate(order) if entry[0] == "b"), None)
            if (
                early_recv
                and not moe_a2a_overlap
                and first_b is not None
                and first_b < len(order) - 1
                and order[first_b + 1][0] == "f"
                and first_b >= 2
            ):
                # With a steady state the first backward's receive is posted after the
                # last warm-up forward (the pass before the first steady one), by its
                # send_backward_recv_backward (schedules.py,
                # forward_backward_pipelining_with_interleaving, warm-up loop at
                # k == num_warmup_microbatches - 1).
                posts_after[order[first_b - 2]].append(order[first_b])
            pending: dict[tuple, str | None] = {}  # receives posted a pass ahead
            for group in groups:
                # A combined step's two passes both start after what came before; what
                # comes next waits for both.
                waits = [
                    sent.get(entry[0]) if send_wait and entry in early_ok else None
                    for entry in group
                ]
                # With overlap_p2p_comm a combined step ends as Megatron-Core's does:
                # post_forward (the forward's send and the next forward's receive,
                # send_forward_recv_forward) after the forward's last layer, then
                # post_backward (send_backward_recv_backward) after the backward's
                # (core_v0.16.0 megatron/core/models/common/model_chunk_schedule_plan.py
                # lines 506-517; schedules.py lines 1603-1653 and 1674-1715 post each
                # receive a pass ahead). post_forward's stream waits for the forward
                # chunk's event, which each of its nodes records as it ends (lines
                # 374-382; pipeline_parallel/utils.py lines 120-126): the forward's
                # end, not the backward's. On one FIFO stream per neighbour (the
                # default) the backward's gradient send to the previous stage then
                # queues behind this stage's receive from it. Posting the next
                # receives only after both passes end, the backward's send first,
                # released the previous stage into its next step before this stage's
                # receive from it was posted: that stage's activation send then ran
                # beside its expert all-to-alls (issue 31, Qwen3 235B H100: 0.35 ms
                # -> ~23 ms a step).
                combined = len(group) > 1 and early_recv
                later: list[tuple] | None = [] if combined else None
                ends = _interleave(
                    [
                        one_pass(
                            *entry, after, pending.pop(entry, False), [w] if w else None, later
                        )
                        for entry, w in zip(group, waits, strict=True)
                    ]
                )
                after = [op for end in ends for op in end]
                if later is not None:
                    # Forward first (the group's order, Megatron-Core's post_forward
                    # before post_backward): each pass's send, then the receive of the
                    # next pass of its direction, both after that pass's own end.
                    by_kind = dict(later)
                    for entry, end in zip(group, ends, strict=True):
                        if entry[0] in by_kind:
                            send = by_kind[entry[0]]
                            sent[entry[0]] = b.op(*send[:4], **send[4])
                        for nxt in posts_after[entry]:
                            if nxt not in pending:
                                pending[nxt] = post_recv(*nxt, end)
                    continue
                for entry in group:
                    for nxt in posts_after[entry]:
                        if nxt in early_ok and nxt not in pending:
                            pending[nxt] = post_recv(*nxt, after)
            if sharded_weights and stage in (0, pp - 1) and m.vocab:
                # The replicated embeddings' gradients, reduced once at the end.
                reduces.append(
                    b.op(
                        f"r{r}.dp",
                        r,
                        "collective",
                        after,
                        op="all_reduce",
                        group=dp_groups[(stage, t)],
                        bytes=vocab_matrices(stage) * vocab_matrix * grad,
                        stream="dp",
                        label="DP gradients",
                    )
                )
            if replicas > 1 and not reduces:
                t_e, e_e, _ = expert_coords(r - stage * width)
                held_experts = stage_experts if edp_groups.get((stage, t_e, e_e)) else 0
                passes = bucket_passes * grad
                grads = stage_params + held_experts
                after = _grad_buffer_pass(b, r, f"r{r}.dp", after, after, passes, grads)
                reduces.append(
                    b.op(
                        f"r{r}.dp",
                        r,
                        "collective",
                        after,
                        op="reduce_scatter" if sharded else "all_reduce",
                        group=dp_groups[(stage, t)],
                        bytes=stage_params * grad,
                        stream="dp",
                        label="DP gradients",
                    )
                )
            t_e, e_e, _ = expert_coords(r - stage * width)
            edp = edp_groups.get((stage, t_e, e_e))
            if stage_experts and edp is not None and not experts_reduced:
                reduces.append(
                    b.op(
                        f"r{r}.dp.experts",
                        r,
                        "collective",
                        after,
                        op="reduce_scatter" if sharded else "all_reduce",
                        group=edp,
                        bytes=stage_experts * grad,
                        stream="dp",
                        label="DP expert gradients",
                    )
                )
            if stage in (0, pp - 1) and (d, t, q) in emb_groups:
                reduces = [
                    b.op(
                        f"r{r}.emb",
                        r,
                        "collective",
                        [*after, *reduces],
                        op="all_reduce",
                        group=emb_groups[(d, t, q)],
                        bytes=m.vocab * m.hidden / tp * grad,
                        stream="dp",
                        label="embedding gradients",
                    )
                ]
            expert_replicas = width // ep
            embedding = vocab_matrices(stage) * vocab_matrix
            if sharded_weights:  # FSDP shards the layers; the embedding stays whole
                held = stage_params
                if optimizer_layers is not None:
                    # A shorter step standing for the model's: the model's optimizer
                    # (stage_params' own expression, pp 1 and dense: the same double).
                    held = optimizer_layers * m.layer_params / tp + embedding
                optimizer_params = (held - embedding) / replicas + embedding
            else:
                optimizer_params = stage_params / (replicas if sharded else 1)
            step = b.op(
                f"r{r}.opt",
                r,
                "compute",
                [*after, *reduces],
                flops=0.0,
                bytes=optimizer_params * step_bytes
                + stage_experts * step_bytes / (expert_replicas if sharded else 1)
                # The next step's zeroing of the whole gradient buffer: the same stream
                # between this step's last kernels and the next one's first.
                + zero_passes * grad * (stage_params + stage_experts),
                label="optimizer",
            )
            if optimizer_host and sharded and not sharded_weights and not m.is_moe:
                # The gradient norm's .item() (clip_grads.py line 133 at Megatron-LM
                # 25.09-alpha.rc1) waits for the reduced gradients; from there the host
                # launches the optimizer's kernels and the next step's first one while
                # the GPU has nothing queued (simulator.workload.optimizer_host). On the
                # "host" stream beside the optimizer's GPU work: the step ends when
                # both have.
                fp8_current = param_bytes == 1 and fp8_recipe == "tensorwise"
                per_layer = DENSE_FP8_WEIGHTS if fp8_current else DENSE_LAYER_TENSORS
                layer_buckets = [per_layer * n for chunk in chunks[stage] for n in buckets(chunk)]
                # The stage's vocabulary matrices and, on the last, the final norm.
                others = (vocab_matrices(stage) if m.vocab else 0) + int(stage == pp - 1)
                if fp8_current:
                    others += (DENSE_LAYER_TENSORS - DENSE_FP8_WEIGHTS) * split[stage]
                host_ops = optimizer_host_ops(
                    layer_buckets, others, replicas, fp8_current=fp8_current
                )
                b.op(
                    f"r{r}.opt.host",
                    r,
                    "compute",
                    [*after, *reduces],
                    stream="host",
                    duration=_dyadic(host_ops.seconds(host_op_s, host_tensor_op_s)),
                    label="optimizer host",
                )
            if sharded and not sharded_weights and not gathers_overlapped:
                b.op(
                    f"r{r}.dp.params",
                    r,
                    "collective",
                    [step],
                    op="all_gather",
                    group=dp_groups[(stage, t)],
                    bytes=stage_params * BF16 - stage_layer_params * (BF16 - param_bytes),
                    stream="dp",
                    label="DP parameters",
                )
                if stage_experts and edp is not None:
                    b.op(
                        f"r{r}.dp.params.experts",
                        r,
                        "collective",
                        [step],
                        op="all_gather",
                        group=edp,
                        bytes=stage_experts * param_bytes,
                        stream="dp",
                        label="DP expert parameters",
                    )
    shadowed = None
    if tp_built < tp or cp_built < cp:
        # One TP rank on, and one CP rank on: the permutations that generate the ranks a
        # master stands for (see simulator.workload.trace.Shadows).
        generators = []
        for built, size, step in ((tp_built, tp, (1, 0)), (cp_built, cp, (0, 1))):
            if built == size:
                continue
            shift = list(range(ranks))
            for stage, d, q, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
                shift[rank_of(stage, d, t, q)] = rank_of(
                    stage, d, (t + step[0]) % tp, (q + step[1]) % cp
                )
            generators.append((size, tuple(shift)))
        shadowed = Shadows(
            (tp // tp_built) * (cp // cp_built),
            generators[0][1],
            frozenset(
                rank_of(stage, d, t, q)
                for stage, d, q, t in itertools.product(
                    range(pp), range(dp), range(cp_built), range(tp_built)
                )
            ),
            build=lambda: megatron(**{**arguments, "shadows": False}),
            more=tuple(generators[1:]),
            # Where both TP and CP ranks are shadowed: the build with the TP ranks alone
            # shadowed, for a replay whose CP ranks end apart from their masters.
            tp_only=(
                (lambda: megatron(**{**arguments, "shadows": "tp"}))
                if tp_built < tp and cp_built < cp
                else None
            ),
        )
    if ep_shadows:
        shift = list(range(ranks))
        for stage, d in itertools.product(range(pp), range(dp)):
            shift[rank_of(stage, d, 0)] = rank_of(stage, d - d % ep + (d + 1) % ep, 0)
        shadowed = Shadows(
            ep,
            tuple(shift),
            frozenset(rank_of(stage, d, 0) for stage in range(pp) for d in range(0, dp, ep)),
            build=lambda: megatron(**{**arguments, "shadows": False}),
        )
    replicated = None
    if replicas_built < dp:
        unit = replicas_built
        shift = [0] * ranks
        for stage, d, q, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
            shift[rank_of(stage, d, t, q)] = rank_of(stage, (d + unit) % dp, t, q)
        first = frozenset(
            rank_of(stage, d, t, q)
            for stage, d, q, t in itertools.product(range(pp), range(unit), range(cp), range(tp))
        )
        replicated = Replicas(
            dp // unit,
            tuple(shift),
            first,
            unit=unit,
            # (Shadows only where this build has them: a replay that falls back to more
            # replicas at a time keeps the kind of workload it started with.)
            build=lambda replicas: megatron(
                **{
                    **arguments,
                    "replicas": replicas,
                    "shadows": shadows if shadowed is not None else False,
                }
            ),
        )
    workload = b.build(replicated, shadowed)
    workload.memory = megatron_memory(
        m,
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch=micro_batch,
        micro_batches=micro,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        distributed_optimizer=distributed_optimizer,
        virtual_stages=v,
        precision=precision,
        cp=cp,
        flash_attention=flash_attention,
        ep=ep,
        etp=etp,
        fsdp=fsdp,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        grad_reduce=grad_reduce,
        fp8_params=fp8_param_gather,
        optimizer_state=optimizer_state,
        account_for_embedding=account_for_embedding_in_pipeline_split,
        account_for_loss=account_for_loss_in_pipeline_split,
        activation_offload_layers=activation_offload_layers,
        moe_a2a_overlap=moe_a2a_overlap,
        fp8_recipe=fp8_recipe,
        fp8_transpose=fp8_transpose,
        fsdp_communication_unit=fsdp_communication_unit,
        fsdp_double_buffer=fsdp_double_buffer,
        activation_offload_in_flight=activation_offload_in_flight,
        lazy_gradients=lazy_gradients,
        cp_comm_type=cp_comm_type,
    )
    # Megatron-LM's count (training.py num_floating_point_operations): the model's own
    # FLOPs, not the recomputed forward, so MFU does not credit recomputation.
    workload.model_flops = m.step_flops(global_batch, recompute=False)
    workload.precision = precision
    if pp > 1 and not early_recv:
        # Without overlap_p2p_comm Megatron-Core batches each exchange
        # (batch_p2p_comm = not overlap_p2p_comm: megatron/training/argument_utils.py
        # line 307 at Megatron-LM d98e8a64; Megatron-Bridge's comm_overlap.py lines
        # 453-460 at 067f987d and NeMo's MegatronCommOverlapCallback alike) with
        # batch_isend_irecv over the pipeline group (p2p_communication.py
        # _batched_p2p_ops, core_v0.16.0), which PyTorch runs on that group's
        # communicator; an isend on its own (with overlap_p2p_comm) runs on one of its
        # two ranks (Workload.p2p_comms).
        workload.p2p_comms = tuple(
            tuple(rank_of(stage, d, t, q) for stage in range(pp))
            for d, q, t in itertools.product(range(dp), range(cp), range(tp))
        )
    return workload


def _dp_calls(
    b: _Builder,
    name: str,
    r: int,
    deps: list,
    params: float,
    apex_elements: float,
    **fields: Any,
) -> list[str]:
    """A data-parallel collective of ``params`` parameters (``fields``: its op, group,
    bytes, ...): one call, or where Apex buckets them one at a time (``apex_elements``
    parameters a bucket, ``megatron(apex_bucket_mib=...)``) ``ceil(params /
    apex_elements)`` calls of equal bytes, issued together on the one stream, which runs
    them back to back."""
    calls = math.ceil(params / apex_elements) if apex_elements and params > 0 else 1
    if calls == 1:
        return [b.op(name, r, "collective", deps, **fields)]
    each = {**fields, "bytes": fields["bytes"] / calls}
    return [b.op(f"{name}.a{j}", r, "collective", deps, **each) for j in range(calls)]


def _grad_buffer_pass(
    b: _Builder,
    r: int,
    name: str,
    computed: list,
    after: list,
    bytes_per_param: float,
    params: float,
) -> list:
    """What a bucket's reduction waits for: ``after`` and Megatron-Core DDP's passes over
    its gradients (:data:`GRAD_BUFFER_PASSES`), one memory-bound op on the compute
    stream after ``computed`` (the kernels that made the gradients: the backward hooks
    run them, not waiting for the pass's TP collectives); ``after`` where there are none.
    """
    if not bytes_per_param or not params:
        return after
    passes = b.op(
        f"{name}.passes",
        r,
        "compute",
        computed,
        flops=0.0,
        bytes=bytes_per_param * params,
        label="DP gradient check and scaling",
    )
    return [*after, passes]


def _expert_layers(
    b: _Builder,
    r: int,
    name: str,
    after: list[str],
    group: str | None,
    experts: tuple[Gemm, ...],
    layers: int,
    a2a_bytes: float,
    *,
    forward: bool,
    recompute: str,
    label: str,
    cache: dict | None = None,
    sync_s: float = 0.0,
    stream: str = "compute",
    paired: bool = False,
    etp_group: str | None = None,
    etp_bytes: float = 0.0,
) -> Generator[None, None, str]:
    """The routed experts of ``layers`` MoE layers in one pass on rank ``r``: token
    dispatch (an all-to-all over the EP ``group``; none when every expert is local),
    the experts' grouped GEMMs, and the combine all-to-all back; backward the same with
    the GEMMs' gradients (and the forward again first with full recomputation).
    A forward (and a recomputed one) first holds the compute stream ``sync_s`` a layer:
    the host reading the tokens per expert (:data:`HOST_SYNC_S`). The all-to-alls run
    on ``stream``; a generator that pauses after each all-to-all, where a combined
    step's other pass issues its own (:func:`_interleave`), and returns the last op's id;
    ``cache`` keeps each pass's GEMM list for the next. ``paired`` (combined 1F1B): a
    forward also pauses before its dispatch, so that the trace orders a pair's
    all-to-alls as Megatron-Core issues each layer's (the backward's first, the
    forward's dispatch, the backward's second, the forward's combine). ``etp_group``
    (expert tensor parallelism): after each dispatch the routed tokens are all-gathered
    over it, and before each combine the experts' outputs reduce-scattered, ``etp_bytes``
    each (the whole buffer), on ``stream``."""
    listed = _expert_list(experts, layers, forward, recompute, cache)
    exchanges = 2 if forward else (4 if recompute == "full" else 2)
    what = "fwd" if forward else "bwd"
    prev = list(after)

    def exchange(step: str, k: int) -> list[str]:
        if group is None:  # every expert is local: nothing moves
            return prev
        return [b.op(f"r{r}.ep.{name}.{step}{k}", r, "collective", prev, op="all_to_all",
                     group=group, bytes=a2a_bytes, stream=stream,
                     label=f"EP {step} {what} {label}")]  # fmt: skip

    def expert_tp(step: str, op: str, k: int) -> list[str]:
        if etp_group is None:
            return prev
        return [b.op(f"r{r}.etp.{name}.{step}{k}", r, "collective", prev, op=op,
                     group=etp_group, bytes=etp_bytes, stream=stream,
                     label=f"ETP {step} {what} {label}")]  # fmt: skip

    for k in range(exchanges // 2):
        if sync_s and (forward or k < exchanges // 2 - 1):
            # The dispatcher's device-to-host read of the split sizes: the compute
            # stream idles while the host waits and launches what follows.
            prev = [b.op(f"r{r}.{name}.sync{k}", r, "compute", prev,
                         duration=layers * sync_s, label=f"MoE sync {what} {label}")]  # fmt: skip
        if paired and forward:
            yield
        prev = exchange("dispatch", k)
        yield
        prev = expert_tp("gather", "all_gather", k)
        if k == exchanges // 2 - 1:
            prev = [
                b.op(
                    f"r{r}.{name}.experts",
                    r,
                    "compute",
                    prev,
                    gemms=listed,
                    label=f"{what} experts {label}",
                )
            ]
        prev = expert_tp("scatter", "reduce_scatter", k)
        prev = exchange("combine", k)
        yield
    return prev[0]


def _expert_list(
    experts: tuple[Gemm, ...], layers: int, forward: bool, recompute: str, cache: dict | None
) -> list:
    """The routed experts' GEMMs of ``layers`` MoE layers in one pass, as op fields
    (backward: their gradients, after the forward's again with full recomputation),
    kept in ``cache`` for the next pass of the same shape."""
    key = (layers, forward)
    if cache is None or key not in cache:
        gemms = [g.times(layers) for g in experts]
        if not forward:
            grads = [grad for g in gemms for grad in g.backward()]
            gemms = gemms + grads if recompute == "full" else grads
        listed = [g.as_list() for g in gemms]
        if cache is None:
            return listed
        cache[key] = listed
    return cache[key]


def _moe_flow_shop(
    b: _Builder,
    r: int,
    name: str,
    after: list[str],
    launches: tuple[tuple[Launch, ...], tuple[Launch, ...]],
    gpu: Callable[[str, int], dict[str, Any]],
    *,
    group: str | None,
    layers: int,
    a2a_layer: float,
    sync_s: float,
    label: str,
    etp_group: str | None = None,
    etp_layer: float = 0.0,
) -> str:
    """A forward over ``layers`` MoE layers on rank ``r`` whose every layer synchronises
    the host with the GPU (the dropless dispatcher's read of the token counts), as two
    machines in a flow shop: the host (a "host" stream) issues each step's launches
    (``launches``, :func:`~simulator.workload.host.moe_forward_launches`: before and
    after the synchronisation), each step's GPU work waits for its own launches and the
    GPU's previous work, and at the synchronisation the host waits for the GPU to finish
    everything queued before it (plus ``sync_s``, :data:`HOST_SYNC_S`) before it launches
    anything more. From one synchronisation to the next, then, the layer takes
    max over k of (host time of steps 1..k + GPU time of steps k..n), not the larger of
    the two sums.

    Identical layers repeat the same synchronisation-to-synchronisation segment (the
    steps after one layer's sync, then the next layer's up to its own), and scaling
    every step of a flow shop by c scales its makespan by c, so the ``layers`` - 1 full
    segments are built once with each step ``layers`` - 1 times as long (the GPU's
    GEMMs ``times`` that many layers, the all-to-alls that many layers' bytes), between
    the first layer's steps up to its sync and the last one's after it: the same
    makespan as ``layers`` separate layers, with ops in proportion to the steps, not the
    layers. ``gpu(kind, k)`` gives the op fields of k layers' "dense" work (their own
    GEMMs and attention) or "experts" (the routed experts' GEMMs); the all-to-alls of
    ``a2a_layer`` bytes a layer over the EP ``group`` (none without one) are built here,
    and with expert tensor parallelism (``etp_group``) the routed tokens' all-gather after
    the dispatch and the experts' outputs' reduce-scatter before the combine, ``etp_layer``
    bytes a layer each (:func:`_expert_layers`). Returns the last GPU op's id."""
    before, after_sync = launches
    gpu_prev = list(after)
    n_host = 0

    def step(launch: Launch, k: int, tag: str) -> None:
        nonlocal gpu_prev, n_host
        host = b.op(f"r{r}.{name}.{tag}.host{n_host}", r, "compute", [], stream="host",
                    duration=_dyadic(k * launch.host_s), label=f"MoE host {label}")  # fmt: skip
        n_host += 1
        if launch.gpu in ("dense", "experts"):
            what = "fwd experts" if launch.gpu == "experts" else "fwd"  # (the labels of the
            # passes without the flow shop)
            op = b.op(f"r{r}.{name}.{tag}.{launch.gpu}", r, "compute", [*gpu_prev, host],
                      **gpu(launch.gpu, k), label=f"{what} {label}")  # fmt: skip
        elif launch.gpu in ("dispatch", "combine") and (group is not None or etp_group):
            deps = [*gpu_prev, host]
            if launch.gpu == "combine" and etp_group:  # the experts' outputs back first
                deps = [b.op(f"r{r}.etp.{name}.{tag}.scatter", r, "collective", deps,
                             op="reduce_scatter", group=etp_group, bytes=k * etp_layer,
                             stream="compute", label=f"ETP scatter fwd {label}")]  # fmt: skip
            op = deps[0]
            if group is not None:
                op = b.op(f"r{r}.ep.{name}.{tag}.{launch.gpu}", r, "collective", deps,
                          op="all_to_all", group=group, bytes=k * a2a_layer, stream="compute",
                          label=f"EP {launch.gpu} fwd {label}")  # fmt: skip
            if launch.gpu == "dispatch" and etp_group:  # the routed tokens gathered
                op = b.op(f"r{r}.etp.{name}.{tag}.gather", r, "collective",
                          [op] if group is not None else deps, op="all_gather",
                          group=etp_group, bytes=k * etp_layer, stream="compute",
                          label=f"ETP gather fwd {label}")  # fmt: skip
        else:  # launches with no timed GPU work: the next step's wait covers them
            return
        gpu_prev = [op]

    def sync(k: int, tag: str) -> None:
        # The host waits for the GPU's queue and its own launches so far; what it
        # launches next (stream order on "host") waits for this op.
        nonlocal gpu_prev
        host_last = f"r{r}.{name}.{tag}.host{n_host - 1}" if n_host else None
        op = b.op(f"r{r}.{name}.{tag}.sync", r, "compute", [*gpu_prev, host_last],
                  duration=k * sync_s, label=f"MoE sync fwd {label}")  # fmt: skip
        gpu_prev = [op]
        # The host's next launch waits for it.
        b.op(f"r{r}.{name}.{tag}.wait", r, "compute", [op], stream="host", duration=0.0,
             label=f"MoE host waits {label}")  # fmt: skip

    for launch in before:
        step(launch, 1, "lead")
    sync(1, "lead")
    if layers > 1:
        for launch in (*after_sync, *before):
            step(launch, layers - 1, "cycle")
        sync(layers - 1, "cycle")
    for launch in after_sync:
        step(launch, 1, "tail")
    return gpu_prev[0]


def _dyadic(seconds: float) -> float:
    """``seconds`` to the nearest multiple of 2**-32 s (0.23 ns): the host's launch times
    are products of operation counts and a per-operation cost, whose float sums with
    each other depend on the order the replay adds them in, so that a shortcut
    (replicas, shadows) can differ from the full replay in the last bit. Rounded, the
    host's own sums are exact (tests/test_moe_runs.py's bit-identical steps hold at the
    default cost); sums with the GPU's times can still differ by one bit (seen with
    EP over every replica at 33 us an operation).

    >>> _dyadic(0.5), _dyadic(1e-5) == 1e-5, abs(_dyadic(1e-5) - 1e-5) < 2**-33
    (0.5, False, True)
    """
    return math.ldexp(round(math.ldexp(seconds, 32)), -32)


def _interleave(passes: list[Generator[None, None, list[str]]]) -> list[list[str]]:
    """Build the passes of one step side by side: each runs to its next pause in turn,
    so that their ops go into the trace (and onto each stream) alternately, as
    Megatron-Core's combined 1F1B step issues a forward's and a backward's layers
    (megatron/core/pipeline_parallel/combined_1f1b.py, combined_forward_backward_step);
    returns what each pass ends with."""
    ends: list[list[str]] = [[] for _ in passes]
    live = list(range(len(passes)))
    while live:
        for j in list(live):
            try:
                next(passes[j])
            except StopIteration as stop:
                ends[j] = stop.value
                live.remove(j)
    return ends


def _a2a_overlap_order(stage: int, pp: int, micro: int, v: int) -> list[tuple]:
    """The passes of ``stage`` in Megatron-Core's combined 1F1B schedule
    (``overlap_moe_expert_parallel_comm``), grouped by step: its warm-up forwards one
    more than :func:`~simulator.workload.pipeline.pipeline_order`'s, so that each
    steady step's forward and backward do not depend on each other
    (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches), each
    steady step a pair (forward, backward), then the cool-down backwards; without
    pipelining the first forward alone, then each backward with the next forward
    (combined_1f1b.py, combined_1f1b_schedule_for_no_pipelining).

    >>> _a2a_overlap_order(0, 1, 3, 1)
    [(('f', 0, 0),), (('f', 0, 1), ('b', 0, 0)), (('f', 0, 2), ('b', 0, 1)), (('b', 0, 2),)]
    """
    return pipeline_steps(stage, pp, micro, v, extra_warmup=1)


def _ring_attention(
    b: _Builder,
    r: int,
    name: str,
    after: str,
    group: str,
    kv_bytes: float,
    core: list[list[int]],
    *,
    forward: bool,
    recompute: str,
    label: str,
) -> list[str]:
    """Context parallelism's attention of one pass on rank ``r``: the attention core
    (``core``, its flash-attention kernels) beside the K/V exchange over the CP
    ``group`` on the ``cp`` stream (forward: K/V all-gathered; backward: again, twice
    with full recomputation, and their gradients reduce-scattered), both after ``after``
    (the QKV projections); returns what the pass's next op waits for."""
    kernels = b.op(
        f"r{r}.{name}.attention",
        r,
        "compute",
        [after],
        attention=core,
        label=f"{'fwd' if forward else 'bwd'} attention {label}",
    )
    gathers = 1 if forward else (2 if recompute == "full" else 1)
    exchanges = [("all_gather", gathers * kv_bytes)]
    if not forward:
        exchanges.append(("reduce_scatter", kv_bytes))
    prev = [after]
    for op_name, nbytes in exchanges:
        prev = [
            b.op(
                f"r{r}.cp.{name}.{op_name}",
                r,
                "collective",
                prev,
                op=op_name,
                group=group,
                bytes=nbytes,
                stream="cp",
                label=f"CP K/V {'fwd' if forward else 'bwd'} {label}",
            )
        ]
    return [kernels, *prev]


def _again(forward: bool, recompute: str) -> int:
    """How many more times a backward pass runs the attention's forward (and its CP
    communication): once with full or selective recomputation (Megatron-Core checkpoints
    the core attention, Transformer Engine's CP function with it: attention.py
    ``_checkpointed_attention_forward``, core_v0.19.0 line 445)."""
    return int(not forward and recompute in ("full", "selective"))


def _gathered_attention(
    b: _Builder,
    r: int,
    name: str,
    after: str,
    group: str,
    kv_bytes: float,
    core: list[list[int]],
    *,
    forward: bool,
    recompute: str,
    label: str,
) -> str:
    """Context parallelism by all-gather (``cp_comm_type`` "all_gather") of one pass on
    rank ``r``, as Transformer Engine's AttnFuncWithCPAndKVAllGather runs it
    (context_parallel.py, v2.18): K and V all-gathered over the CP ``group`` (lines
    3213-3214; ``gather_along_first_dim``, synchronous: distributed.py line 1640,
    ``async_op=False``), then the attention of the rank's two query chunks against the
    keys before them (two kernels on two streams, "to resolve wave quantization": their
    causal FLOPs are ``core``'s, one kernel of the rank's b s / cp queries against the
    whole sequence); backward K and V gathered again (lines 3786-3787), the attention's
    backward, and dK, dV reduce-scattered (lines 4120-4121), all on the compute stream
    after ``after`` (the QKV projections). ``kv_bytes``: the pass's gathered K and V (the
    all-gather's whole buffer, as the reduce-scatter's). Returns the pass's last op."""
    calls = 1 + _again(forward, recompute)  # a recomputed forward gathers them again
    gather = b.op(
        f"r{r}.cp.{name}.all_gather",
        r,
        "collective",
        [after],
        op="all_gather",
        group=group,
        bytes=calls * kv_bytes,
        stream="compute",
        label=f"CP K/V {'fwd' if forward else 'bwd'} {label}",
    )
    kernels = b.op(
        f"r{r}.{name}.attention",
        r,
        "compute",
        [gather],
        attention=core,
        label=f"{'fwd' if forward else 'bwd'} attention {label}",
    )
    if forward:
        return kernels
    return b.op(
        f"r{r}.cp.{name}.reduce_scatter",
        r,
        "collective",
        [kernels],
        op="reduce_scatter",
        group=group,
        bytes=kv_bytes,
        stream="compute",
        label=f"CP dK/dV {label}",
    )


def _a2a_sides(
    qkv_bytes: float, out_bytes: float, *, forward: bool, recompute: str
) -> tuple[float, float]:
    """The bytes of a pass's all-to-alls before and after its attention (each side's
    calls as one of their summed size, as the blocking TP ones: their count of latencies
    is lost): forward Q, K, V before and the output after; backward the output's
    gradient before and dQ, dK, dV after, a recomputed forward's with them."""
    if forward:
        return qkv_bytes, out_bytes
    again = _again(forward, recompute)
    return out_bytes + again * qkv_bytes, qkv_bytes + again * out_bytes


def _a2a_call(
    b: _Builder,
    r: int,
    name: str,
    where: str,
    deps: list[str],
    group: str,
    nbytes: float,
    *,
    forward: bool,
    label: str,
) -> str:
    """One side's all-to-all of a pass (``where``: "before" or "after" its attention),
    blocking: on the compute stream."""
    return b.op(
        f"r{r}.cp.{name}.a2a.{where}",
        r,
        "collective",
        deps,
        op="all_to_all",
        group=group,
        bytes=nbytes,
        stream="compute",
        label=f"CP all-to-all {'fwd' if forward else 'bwd'} {label}",
    )


def _a2a_attention(
    b: _Builder,
    r: int,
    name: str,
    after: str,
    group: str,
    qkv_bytes: float,
    out_bytes: float,
    core: list[list[int]],
    *,
    forward: bool,
    recompute: str,
    label: str,
) -> str:
    """Context parallelism by all-to-all (``cp_comm_type`` "a2a", DeepSpeed-Ulysses) of
    one pass on rank ``r``, as Transformer Engine's AttnFuncWithCPAndQKVOA2A runs it
    (context_parallel.py, v2.18): Q, K and V each all-to-all'd over the CP ``group``
    (``flash_attn_a2a_communicate``, line 4336: the sequence gathered, the heads split;
    the compute stream waits for them, line 535), the attention over the whole sequence
    on the rank's a / (t cp) heads (``core``), its output all-to-all'd back (line 4482);
    backward the output's gradient before the attention's backward (line 4674) and dQ,
    dK, dV after it (line 4834), with the forward's again where the backward recomputes
    it (:func:`_a2a_sides`). ``qkv_bytes`` and ``out_bytes``: the pass's Q, K, V and
    output on the rank's b s / cp tokens (each all-to-all's buffer). Returns the pass's
    last op."""
    sides = _a2a_sides(qkv_bytes, out_bytes, forward=forward, recompute=recompute)
    calls = {"forward": forward, "label": label}
    before = _a2a_call(b, r, name, "before", [after], group, sides[0], **calls)
    kernels = b.op(
        f"r{r}.{name}.attention",
        r,
        "compute",
        [before],
        attention=core,
        label=f"{'fwd' if forward else 'bwd'} attention {label}",
    )
    return _a2a_call(b, r, name, "after", [kernels], group, sides[1], **calls)


def _hierarchical_attention(
    b: _Builder,
    r: int,
    name: str,
    after: str,
    a2a_group: str,
    ring_group: str,
    qkv_bytes: float,
    out_bytes: float,
    kv_bytes: float,
    core: list[list[int]],
    *,
    forward: bool,
    recompute: str,
    label: str,
) -> str:
    """Hierarchical context parallelism (``cp_comm_type`` "a2a+p2p") of one pass on rank
    ``r``, as Transformer Engine's AttnFuncWithCPAndKVP2P runs it with two CP groups
    (context_parallel.py, v2.18): Q, K and V all-to-all'd over ``a2a_group`` (line 1492;
    the output's gradient backward, line 2411), blocking, as :func:`_a2a_attention`;
    then the ring over ``ring_group`` beside the attention (:func:`_ring_attention`,
    ``kv_bytes`` its K/V all-gather's buffer); then the output (backward dQ, dK, dV,
    line 2895) all-to-all'd back. A recomputed forward's all-to-alls and K/V exchange come
    with the backward's, as in :func:`_a2a_attention`. Returns the pass's last op."""
    sides = _a2a_sides(qkv_bytes, out_bytes, forward=forward, recompute=recompute)
    calls = {"forward": forward, "label": label}
    before = _a2a_call(b, r, name, "before", [after], a2a_group, sides[0], **calls)
    ready = _ring_attention(
        b,
        r,
        name,
        before,
        ring_group,
        kv_bytes,
        core,
        forward=forward,
        # (_ring_attention gathers again for full recomputation only.)
        recompute="full" if _again(forward, recompute) else recompute,
        label=label,
    )
    return _a2a_call(b, r, name, "after", ready, a2a_group, sides[1], **calls)


def moe(
    *,
    ranks: int = 16,
    experts_per_rank: int = 1,
    layers: int = 4,
    tokens: int = 8192,
    hidden: int = 4096,
    ffn: int = 14336,
    top_k: int = 2,
) -> Workload:
    """Mixture-of-experts layers with expert parallelism over all ranks.

    Per layer: attention compute, all-to-all dispatch of the routed tokens (top-k copies
    of each token's hidden vector, spread evenly over experts), expert MLP compute,
    all-to-all combine; the backward pass mirrors it with twice the compute.
    """
    b = _Builder(
        f"moe-{ranks}",
        ranks,
        f"MoE, {layers} layers, {ranks * experts_per_rank} experts, top-{top_k}",
        trusted=True,
    )
    ep = b.group("ep", "EP", list(range(ranks)))
    routed = tokens * top_k * hidden * BF16  # bytes each rank sends out (and receives)
    attention = tokens * (8 * hidden * hidden + 4 * hidden * 2048)
    expert = tokens * top_k * 6 * hidden * ffn  # SwiGLU: three h x ffn matrices, 2 FLOPs each
    for r in range(ranks):
        prev = None
        for phase, scale in (("fwd", 1), ("bwd", 2)):
            sequence = range(layers) if phase == "fwd" else reversed(range(layers))
            for layer in sequence:
                prev = b.op(
                    f"r{r}.{phase}.attn{layer}",
                    r,
                    "compute",
                    [prev],
                    flops=scale * attention,
                    label=f"{phase} attention {layer}",
                )
                prev = b.op(
                    f"r{r}.{phase}.dispatch{layer}",
                    r,
                    "collective",
                    [prev],
                    op="all_to_all",
                    group=ep,
                    bytes=routed,
                    stream="compute",
                    label=f"{phase} dispatch {layer}",
                )
                prev = b.op(
                    f"r{r}.{phase}.expert{layer}",
                    r,
                    "compute",
                    [prev],
                    flops=scale * expert,
                    label=f"{phase} experts {layer}",
                )
                prev = b.op(
                    f"r{r}.{phase}.combine{layer}",
                    r,
                    "collective",
                    [prev],
                    op="all_to_all",
                    group=ep,
                    bytes=routed,
                    stream="compute",
                    label=f"{phase} combine {layer}",
                )
    return b.build()


GENERATORS = {"ddp": ddp, "zero3": zero3, "megatron": megatron, "moe": moe}
