"""Model descriptions: the transformer shapes generators build training steps for.

Transformer arithmetic (Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", SC'21, section 5.1, generalised as Megatron-LM's
``num_floating_point_operations`` in ``megatron/training/training.py`` does): a layer's
attention has 2 h (a d) + 2 h (g d) parameters (query and output projections over a
heads of size d, key and value over g query groups: grouped-query attention; g = a is
multi-head, g = 1 multi-query attention), its MLP 2 h f (3 h f gated, SwiGLU); its
forward pass costs 2 FLOPs per parameter per token plus 4 s (a d) for the attention
scores and their weighted sum (s the sequence length). A mixture-of-experts layer's MLP
is ``experts`` FFNs of ``moe_ffn`` plus ``shared_experts`` always-on ones, of which each
token runs ``top_k`` routed and every shared one.

Named models live as data in ``workloads/models/*.yaml`` (one file per model, its
source cited); :data:`MODELS` maps their names to :class:`Transformer`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import CcsimError, shown, unknown_choice
from ..files import load_data
from ..topology.presets import data_dir
from .kernels import Gemm

#: HBM bytes the language-model loss moves per logit (one token x one vocabulary entry
#: of a TP rank), (forward, backward), by implementation. The output layer's GEMM writes
#: the logits in bf16 (counted with the GEMM); what follows is memory bound:
#:
#: * "unfused": Megatron-Core's default (``cross_entropy_loss_fusion`` False:
#:   megatron/core/model_parallel_config.py; Megatron-LM's ``--cross-entropy-loss-fusion``
#:   is off unless given, megatron/training/arguments.py at core_r0.8.0), its
#:   ``vocab_parallel_cross_entropy`` (megatron/core/tensor_parallel/cross_entropy.py),
#:   one PyTorch kernel per line: ``logits.float()`` reads 2 and writes 4 bytes, the max
#:   reads 4, the in-place subtraction, ``exp`` and division by the sum read and write 4
#:   each (8 + 8 + 8), the sum reads 4: 38 forward; backward the in-place multiply by
#:   the loss gradient (8) and the cast of the gradient back to bf16 (reads 4, writes 2):
#:   14.
#: * "fused": ``cross_entropy_loss_fusion`` with the native implementation
#:   (megatron/core/fusions/fused_cross_entropy.py: the same steps in three
#:   ``jit_fuser`` kernels forward, one backward): the cast and max (2 + 4), the
#:   subtraction, ``exp`` and sum (4 + 4), the division (4 + 4): 22; backward the
#:   multiply and cast read 4 and write 2: 6. NeMo 2.0's GPTConfig sets it
#:   (nemo/collections/llm/gpt/model/base.py: cross_entropy_loss_fusion = True).
#: * "te": ``cross_entropy_fusion_impl`` "te", Transformer Engine's Triton kernels
#:   (transformer_engine/pytorch/triton/cross_entropy.py): the online softmax reads the
#:   bf16 logits once (2) forward; backward reads them again and writes the gradient in
#:   place (2 + 2). Megatron-Bridge's performance scripts set it
#:   (scripts/performance/utils/overrides.py, since 2025-11).
CROSS_ENTROPY_BYTES: dict[str, tuple[int, int]] = {
    "unfused": (38, 14),
    "fused": (22, 6),
    "te": (2, 4),
}


#: Transformer Engine's fp8 scaling recipes (Megatron-Core's ``--fp8-recipe``):
#: "delayed" scales by an amax history kept from earlier steps (no pass over the
#: tensor), "tensorwise" by the tensor's own amax (current scaling: a pass that reads
#: it before the cast; Megatron-Bridge's MixedPrecisionConfig default,
#: src/megatron/bridge/training/mixed_precision.py, ``fp8_recipe = "tensorwise"``, on
#: every GPU), "mxfp8" by one E8M0 byte per 1 x 32 block (Blackwell only), computed in
#: the cast kernel itself.
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8")

#: MXFP8's block: one 1-byte E8M0 scale per 32 elements along the GEMM's K dimension
#: (TE, pytorch/csrc/quantizer.cpp, ``MXFP8_BLOCK_SIZE`` in MXFP8Quantizer::get_scale_shape;
#: the padding of the scale array to 128 x 4 is left out).
MXFP8_BLOCK = 32


def fp8_cast_cost(recipe: str, *, transpose: bool = True) -> tuple[float, float, float]:
    """HBM bytes per element that casting one bf16 GEMM input to fp8 adds, as
    (a cast of its own, a cast after a LayerNorm, a cast after the activation), from
    Transformer Engine's source (v2.x, pytorch/csrc: quantizer.cpp,
    extensions/normalization.cpp, extensions/activation.cpp).

    An element's quantized copies write W bytes: one fp8 byte per copy, two copies
    (row-wise for one GEMM, column-wise for the other reading it) where the GPU's fp8
    GEMMs take only K-major operands (``transpose``, Hopper) and always with MXFP8,
    whose column-wise copy has its own 1 x 32 scales (not a transpose of the row-wise
    bytes), plus 1/32 byte of scale per element and copy. Then:

    * *a cast of its own* reads the bf16 tensor (2) and writes W; current scaling
      ("tensorwise") first reads it once more for its amax (``nvte_compute_amax``, then
      ``nvte_quantize_v2``: Float8CurrentScalingQuantizer::quantize_impl): 2 more.
    * *after a LayerNorm*: delayed scaling's norm kernel writes the row-wise fp8 copy
      itself (``Impl::FULLY_FUSED``: it replaces the norm's bf16 output) and a transpose
      kernel reads it for the column-wise one (``nvte_transpose`` after the norm,
      common/normalization/layernorm/ln_api.cpp lines 110-115 and rmsnorm_api.cpp
      95-101 at v2.7; TE v1.11 transposes it in the backward, ``tex.fp8_transpose``):
      max(0, W + (copies - 1) - 2);
      current scaling's writes bf16 and the amax, then a cast reads it
      (``FUSED_NORM_AMAX_FP8``: 2 + W); MXFP8's writes bf16, then a cast reads it
      (``UNFUSED`` unless NVTE_NORM_FWD_USE_CUDNN is set: 2 + W).
    * *after the activation*: delayed and MXFP8 scaling quantize in the activation
      kernel (``FULLY_FUSED``: W - 1, its first fp8 byte taken as the bf16 output the
      elementwise model already counts, as ccsim's earlier model did); current scaling
      writes bf16 and the amax, then casts (``FUSED_ACTIVATION_AMAX_FP8``: 2 + W).

    >>> fp8_cast_cost("delayed")  # Hopper: cast_transpose, 2 + 1 + 1; norm 1 + 2 - 2
    (4.0, 1.0, 1.0)
    >>> fp8_cast_cost("tensorwise", transpose=False)  # Blackwell: one copy
    (5.0, 3.0, 3.0)
    >>> fp8_cast_cost("mxfp8", transpose=False)  # two copies of 1 + 1/32 bytes
    (4.0625, 4.0625, 1.0625)
    """
    if recipe not in FP8_RECIPES:
        raise CcsimError(
            f"fp8_recipe must be one of {', '.join(FP8_RECIPES)} (Transformer Engine's "
            f"delayed, per-tensor current or MXFP8 block scaling), not {shown(recipe)}"
        )
    mx = recipe == "mxfp8"
    copies = 2 if (transpose or mx) else 1
    written = copies * (1 + (1 / MXFP8_BLOCK if mx else 0.0))
    if recipe == "delayed":
        return (2 + written, max(0.0, written + (copies - 1) - 2), written - 1)
    if recipe == "tensorwise":
        return (4 + written, 2 + written, 2 + written)
    return (2 + written, 2 + written, written - 1)


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer: layers, hidden size, sequence length, vocabulary.

    ``ffn`` is the dense MLP inner size (4h for GPT; ``gated`` for SwiGLU's three h x ffn
    matrices); ``heads`` the attention heads, ``kv_heads`` the key/value heads
    (grouped-query attention; 0: as many as ``heads``), ``head_size`` their size (0:
    hidden / heads). Mixture of experts: ``experts`` routed FFNs of ``moe_ffn`` (0:
    ``ffn``) per MoE layer, ``top_k`` run per token, ``shared_experts`` run for every
    token, ``capacity_factor`` (0: dropless), ``expert_bias``: the experts' linear layers
    have biases (gpt-oss); the first ``dense_layers`` layers are dense
    and then every ``moe_frequency``-th layer is an MoE layer. ``tied_embeddings``
    shares the input embedding with the output layer. ``dropout``: the model trains with
    hidden and attention dropout (Megatron-LM's default, 0.1; Llama-style recipes set
    both to 0, and a dropout of 0 stores no mask). ``name`` and ``source`` say which
    model it is and where its figures come from. Multi-head latent attention (MLA,
    DeepSeek-V2/V3) where ``kv_lora_rank`` > 0: queries through a ``q_lora_rank``
    bottleneck (0: one projection), keys and values through a ``kv_lora_rank`` one,
    ``head_size`` the query/key head size without its ``qk_rope_dim`` rotary part and
    ``v_head_dim`` the value head size (:meth:`attention_linear_gemms`). Sliding-window
    attention (gpt-oss): ``window`` > 0 tokens a query attends to (itself and the
    window - 1 before it) in every layer but each ``full_attention_every``-th one, which
    attends to the whole causal prefix (0: every layer windowed;
    :meth:`windowed_layers`). ``glu_clamp``: the experts' gated activation clamps its
    two halves first (gpt-oss, :meth:`glu_clamp_bytes`). ``yarn_scale``: YaRN's rotary
    scaling factor (gpt-oss: 32; 0: plain rotary embeddings), whose attention
    concentration Megatron-Core's fused rotary kernel does not take
    (:meth:`unfused_rope_bytes`). ``qk_norm``: each query and key head is normalised
    (RMSNorm over its ``head_size``) before the rotary embedding and attention (Qwen3's
    ``qk_layernorm``, :meth:`layer_elementwise_bytes`).
    """

    layers: int
    hidden: int
    seq: int = 2048
    vocab: int = 51200
    ffn: int = 0
    gated: bool = False
    heads: int = 0
    kv_heads: int = 0
    head_size: int = 0
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    moe_ffn: int = 0
    capacity_factor: float = 0.0
    expert_bias: bool = False
    glu_clamp: bool = False
    dense_layers: int = 0
    moe_frequency: int = 1
    tied_embeddings: bool = False
    dropout: bool = True
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    window: int = 0
    full_attention_every: int = 0
    yarn_scale: float = 0.0
    qk_norm: bool = False
    name: str = ""
    source: str = ""

    @property
    def attention_heads(self) -> int:
        """Attention heads (``heads``; default one per 128 of hidden, GPT-3's head size)."""
        return self.heads or max(1, self.hidden // 128)

    @property
    def query_groups(self) -> int:
        """Key/value heads (``kv_heads``; default every attention head: multi-head)."""
        return self.kv_heads or self.attention_heads

    @property
    def head_dim(self) -> int:
        """Size of an attention head (``head_size``; default hidden / heads)."""
        return self.head_size or self.hidden // self.attention_heads

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank`` > 0)."""
        return self.kv_lora_rank > 0

    @property
    def attention_params(self) -> float:
        """Query, key, value and output projections: 2 h a d + 2 h g d (4 h^2 for
        multi-head attention with d = h / a); with MLA the weights of
        :meth:`attention_linear_gemms` (DeepSeek-V3: 187 M a layer, its layernorms left
        out).

        >>> m = Transformer(layers=1, hidden=7168, heads=128, head_size=128, q_lora_rank=1536,
        ...                 kv_lora_rank=512, qk_rope_dim=64, v_head_dim=128)
        >>> m.attention_params
        187105280.0
        """
        h, d = self.hidden, self.head_dim
        if self.is_mla:  # the weights of attention_linear_gemms
            a, v, rope, q_rank = (
                self.attention_heads,
                self.v_head_dim or d,
                self.qk_rope_dim,
                self.q_lora_rank,
            )
            query = (h * q_rank + q_rank * a * (d + rope)) if q_rank else h * a * (d + rope)
            kv = h * (self.kv_lora_rank + rope) + self.kv_lora_rank * a * (d + v)
            return float(query + kv + a * v * h)
        return 2 * h * self.attention_heads * d + 2 * h * self.query_groups * d

    @property
    def core_width(self) -> float:
        """Per token and head, the attention core's FLOPs over 4 s: the head size (MLA:
        the mean of the query/key head, rotary part included, and the value head)."""
        if self.is_mla:
            return (self.head_dim + self.qk_rope_dim + (self.v_head_dim or self.head_dim)) / 2
        return float(self.head_dim)

    def attention_linear_gemms(
        self, micro_batch: int, *, tp: int = 1, cp: int = 1, tokens: int = 0
    ) -> tuple[Gemm, ...]:
        """The attention's linear GEMMs of one layer's forward on one TP rank over the
        b s / cp tokens it holds (``tokens`` instead, if given): QKV h -> (a + 2g) d / t
        and the projection a d / t -> h. With MLA, as Megatron-Core's
        MultiLatentAttention builds them (megatron/core/transformer/
        multi_latent_attention.py): the down projections h -> q_lora and h -> kv_lora +
        rope are duplicated on every TP rank over its sequence-parallel shard (b s / t
        tokens), the up projections q_lora -> a (d + rope) / t and kv_lora -> a (d + v)
        / t and the projection a v / t -> h are split over TP.

        >>> m = Transformer(layers=1, hidden=64, heads=4, head_size=8, q_lora_rank=16,
        ...                 kv_lora_rank=8, qk_rope_dim=4, v_head_dim=8)
        >>> [g.as_list()[:3] for g in m.attention_linear_gemms(1, tp=2, tokens=4)]
        [[2, 16, 64], [4, 24, 16], [2, 12, 64], [4, 32, 8], [4, 64, 16]]
        """
        h = self.hidden
        tokens = tokens or micro_batch * self.seq // cp
        a, d = self.attention_heads, self.head_dim
        if not self.is_mla:
            query = a * d
            qkv = query + 2 * self.query_groups * d
            return (Gemm(tokens, _split(qkv, tp), h), Gemm(tokens, h, _split(query, tp)))
        v, rope = self.v_head_dim or d, self.qk_rope_dim
        shard = max(1, tokens // tp)  # the duplicated down projections' tokens
        q: tuple[Gemm, ...] = (Gemm(tokens, _split(a * (d + rope), tp), h),)
        if self.q_lora_rank:
            q = (
                Gemm(shard, self.q_lora_rank, h),
                Gemm(tokens, _split(a * (d + rope), tp), self.q_lora_rank),
            )
        kv = (
            Gemm(shard, self.kv_lora_rank + rope, h),
            Gemm(tokens, _split(a * (d + v), tp), self.kv_lora_rank),
        )
        return (*q, *kv, Gemm(tokens, h, _split(a * v, tp)))

    def mla_up_gemms(self, micro_batch: int, *, tp: int = 1, cp: int = 1) -> tuple[Gemm, ...]:
        """The up projections of one MLA layer's forward on one TP rank (of
        :meth:`attention_linear_gemms`): q_lora -> a (d + rope) / t (where the query has
        a low-rank down projection) and kv_lora -> a (d + v) / t, what Megatron-Core's
        ``recompute_modules`` "mla_up_proj" runs again in the backward
        (multi_latent_attention.py, ``qkv_up_proj_and_rope_apply`` under
        ``CheckpointWithoutOutput``: lines 501-505 at Megatron-LM 7094270c6fa1, lines
        838-845 at core_v0.16.0). None without MLA.

        >>> m = Transformer(layers=1, hidden=64, heads=4, head_size=8, q_lora_rank=16,
        ...                 kv_lora_rank=8, qk_rope_dim=4, v_head_dim=8)
        >>> [g.as_list()[:3] for g in m.mla_up_gemms(1, tp=2)]
        [[2048, 24, 16], [2048, 32, 8]]
        """
        if not self.is_mla:
            return ()
        gemms = self.attention_linear_gemms(micro_batch, tp=tp, cp=cp)
        # (q down, q up, kv down, kv up, proj) with a query LoRA; (q, kv down, kv up, proj)
        return (gemms[1], gemms[3]) if self.q_lora_rank else (gemms[2],)

    def _mlp_params(self, inner: int) -> float:
        return (3 if self.gated else 2) * self.hidden * inner

    @property
    def is_moe(self) -> bool:
        """Whether any layer is a mixture of experts."""
        return self.experts > 0

    def moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (from 0) is a mixture-of-experts layer."""
        return (
            self.is_moe
            and index >= self.dense_layers
            and (index - self.dense_layers) % self.moe_frequency == 0
        )

    @property
    def moe_layers(self) -> int:
        """How many layers are mixture-of-experts layers."""
        return sum(self.moe_layer(i) for i in range(self.layers))

    @property
    def layer_params(self) -> float:
        """Parameters of one dense layer: its attention plus its MLP (12 h^2 for GPT)."""
        return self.attention_params + self._mlp_params(self.ffn or 4 * self.hidden)

    @property
    def moe_layer_params(self) -> float:
        """Parameters of one MoE layer: attention, every routed and shared expert, and the
        router (h x experts)."""
        expert = self._mlp_params(self.moe_ffn or self.ffn or 4 * self.hidden)
        return (
            self.attention_params
            + (self.experts + self.shared_experts) * expert
            + self.hidden * self.experts
        )

    @property
    def params(self) -> float:
        """All parameters, with the input and (unless tied) output embeddings."""
        moe = self.moe_layers
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return (self.layers - moe) * self.layer_params + moe * self.moe_layer_params + embeddings

    def _active_params(self, index: int) -> float:
        """Parameters a token runs through in layer ``index`` (routed experts: top_k)."""
        if not self.moe_layer(index):
            return self.layer_params
        expert = self._mlp_params(self.moe_ffn or self.ffn or 4 * self.hidden)
        return self.attention_params + (self.top_k + self.shared_experts) * expert

    def layer_forward_flops(self, tokens: float, *, causal: bool = False, index: int = 0) -> float:
        """Forward FLOPs of layer ``index`` (default a dense one): 2 per parameter a token
        runs through, plus 4 s a d per token for the attention scores and their weighted
        sum (half of it with ``causal``, the masked half skipped as flash attention and
        Megatron-LM's count since 2025 do)."""
        core = 4 * self.seq * self.attention_heads * self.core_width * (0.5 if causal else 1.0)
        return tokens * (2 * self._active_params(index) + core)

    @property
    def expert_ffn(self) -> int:
        """Inner size of one expert (``moe_ffn``, else ``ffn``, else 4h)."""
        return self.moe_ffn or self.ffn or 4 * self.hidden

    def moe_linear_gemms(self, micro_batch: int, *, tp: int = 1, cp: int = 1) -> tuple[Gemm, ...]:
        """The forward GEMMs of an MoE layer that every rank runs on its own tokens: the
        attention's QKV and projection (as :meth:`linear_gemms`), the shared experts'
        MLP (split over TP like a dense MLP) and the router (h -> experts).

        >>> m = Transformer(layers=2, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32)
        >>> [g.as_list() for g in m.moe_linear_gemms(1)]
        [[16, 192, 64, 1, 1], [16, 64, 64, 1, 1], [16, 4, 64, 1, 1]]
        """
        attention = self.attention_linear_gemms(micro_batch, tp=tp, cp=cp)
        tokens = micro_batch * self.seq // cp
        h, f = self.hidden, self.expert_ffn * self.shared_experts
        shared: tuple[Gemm, ...] = ()
        if f:
            up = (2 if self.gated else 1) * f
            shared = (Gemm(tokens, _split(up, tp), h), Gemm(tokens, h, _split(f, tp)))
        return (*attention, *shared, Gemm(tokens, self.experts, h))

    def expert_gemms(
        self,
        tokens: float,
        *,
        ep: int = 1,
        etp: int = 1,
        align: int = 1,
        random_routing: bool = False,
    ) -> tuple[Gemm, ...]:
        """One MoE layer's routed-expert GEMMs on one of ``ep`` expert-parallel ranks, as
        grouped GEMMs over its experts / ep experts: ``tokens`` tokens per rank, each
        routed to ``top_k`` experts (times ``capacity_factor`` when it pads experts to
        capacity), spread evenly, so each expert takes tokens x top_k x ep / experts;
        the experts' GEMMs run in rounds of up to 4 at once (:data:`STREAMS`). With
        ``etp`` expert-tensor-parallel ranks each expert's FFN is split over them
        (Megatron-Core's ``expert_tensor_parallel_size``: the first GEMM by columns, the
        second by rows) and each rank runs its slice on the tokens of all ``etp`` ranks
        (the dispatcher gathers them over the expert TP group): etp times the tokens,
        1/etp of the FFN, the same FLOPs.

        ``random_routing`` (dropless only): each token's experts drawn at random, as the
        published runs force it, so the ranks' loads differ and every all-to-all waits
        for the busiest rank: its experts take :meth:`busiest_rank_copies` / local
        experts each instead of the mean. ``align``: each expert's tokens padded to a
        multiple of it (fp8: Transformer Engine's ``Fp8Padding``, 32 rows for MXFP8, 16
        otherwise, transformer_engine/pytorch/module/fp8_padding.py; HybridEP's
        ``pad_multiple`` the same): a dropless expert's count is not a multiple of it, its
        remainder taken as uniform, so (align - 1) / 2 rows more on average; an expert
        padded to capacity to the next multiple.

        >>> m = Transformer(layers=2, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32)
        >>> [g.as_list() for g in m.expert_gemms(16, ep=2)]
        [[16, 32, 64, 2, 1], [16, 64, 32, 2, 1]]
        >>> [g.as_list() for g in m.expert_gemms(16, ep=2, etp=2)]
        [[32, 16, 64, 2, 1], [32, 64, 16, 2, 1]]
        >>> [g.as_list() for g in m.expert_gemms(16, ep=2, align=16)]  # 16 + 7.5, rounded up
        [[24, 32, 64, 2, 1], [24, 64, 32, 2, 1]]
        """
        if self.capacity_factor:
            routed = tokens * self.top_k * self.capacity_factor
            per_expert = math.ceil(routed * ep * etp / self.experts)
            per_expert = math.ceil(per_expert / align) * align
        else:
            routed = self.busiest_rank_copies(tokens, ep) if random_routing else tokens * self.top_k
            per_expert = math.ceil(routed * ep * etp / self.experts + (align - 1) / 2)
        local = self.experts // ep
        f, h = self.expert_ffn // etp, self.hidden
        up = (2 if self.gated else 1) * f
        # Transformer Engine's grouped GEMM runs one cuBLAS GEMM per expert, round robin
        # over its 4 compute streams (transformer_engine/common/gemm/cublaslt_gemm.cu,
        # nvte_multi_tensor_gemm -> multi_stream_cublas_gemm; util/multi_stream.cpp:
        # num_compute_streams = 4): rounds of up to 4 side by side, each round a kernel
        # of (at most) 4 experts' tiles.
        rounds = [(STREAMS, local // STREAMS)] if local >= STREAMS else []
        if local % STREAMS:
            rounds.append((local % STREAMS, 1))
        return tuple(
            Gemm(per_expert, n, k, side, count)
            for n, k in ((up, h), (h, f))
            for side, count in rounds
        )

    def busiest_rank_copies(self, tokens: float, ep: int) -> float:
        """Expected routed copies the busiest of ``ep`` expert-parallel ranks receives in
        one dropless MoE layer when each of the group's ``tokens`` x ``ep`` tokens picks
        its ``top_k`` experts at random (Megatron-Core's ``moe_router_force_load_balancing``:
        ``RandomSTE`` replaces the router's logits with normal noise, a different seed per
        rank, megatron/core/transformer/moe/moe_utils.py, so the top k are a uniform
        k-subset of the E experts).

        A token's experts on one rank of E / ep are hypergeometric, variance
        k (1/ep)(1 - 1/ep)(E - k)/(E - 1); over N = tokens x ep independent tokens a
        rank gets tokens x k on average. The ranks' counts sum to N k, so their
        covariance is a (I - J/ep) (exchangeable with a fixed sum), which is that of ep
        independent normals of variance a less their mean: the busiest is the mean plus
        sqrt(a) times :func:`expected_max_normal` (ep), a = N k (E - k) / (ep (E - 1))
        (the normal approximation of the counts).

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=128, top_k=8, moe_ffn=32)
        >>> round(m.busiest_rank_copies(4096, 8) / (4096 * 8), 4)  # Qwen3 30B at EP 8
        1.0076
        >>> m.busiest_rank_copies(4096, 1)  # one rank holds every expert
        32768
        """
        mean = tokens * self.top_k
        if ep <= 1:
            return mean
        e, k = self.experts, self.top_k
        spread = tokens * ep * k * (e - k) / (ep * (e - 1))
        return mean + math.sqrt(spread) * expected_max_normal(ep)

    def dispatch_copies(self, ep: int, *, dispatcher: str = "alltoall", domain: int = 8) -> float:
        """Copies of each token's hidden vector one of ``ep`` expert-parallel ranks sends
        in an MoE layer's dispatch (and gets back in its combine), as ccsim's all-to-all
        over the EP group carries them (spread evenly over the group's ranks).

        ``alltoall`` (Megatron-Core's MoEAlltoAllTokenDispatcher): one copy per routed
        expert, ``top_k`` (times the capacity factor). The flex dispatcher's backends,
        ``deepep`` and ``hybridep``, send a token once to each rank holding one of its
        experts and, across NVLink domains of ``domain`` ranks, once over RDMA to each
        other domain holding one, which fans it out over NVLink (Megatron-Core's
        fused_a2a.py: DeepEP's ``get_dispatch_layout`` returns ``num_tokens_per_rank``,
        ``num_tokens_per_rdma_rank`` and ``is_token_in_rank``; the combine reduces in
        the same places). With routing balanced over the ``experts`` (each of a token's
        ``top_k`` distinct experts equally likely, as the published runs force it), a
        token reaches a group of G of the n groups of experts with probability
        1 - C(E - E/n, k) / C(E, k), so it is sent to n (1 - C(E - E/n, k) / C(E, k))
        places: n = ``ep`` ranks inside one domain; n = ``ep / domain`` domains across
        several, of which (n - 1)/n of the all-to-all's bytes cross domains: exactly the
        RDMA copies. (Their NVLink fan-out is then carried as 1/n of the copies, less
        than it is; NVLink is the faster side. DeepSeek-V3's node-limited routing, top
        4 of 8 groups, would lower the count further; not modelled.)

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=256, top_k=8, moe_ffn=32)
        >>> m.dispatch_copies(32)
        8.0
        >>> round(m.dispatch_copies(32, dispatcher="deepep"), 3)  # 4 servers of 8
        3.614
        >>> round(m.dispatch_copies(8, dispatcher="hybridep"), 3)  # one server
        5.295
        """
        if dispatcher not in DISPATCHERS:
            raise unknown_choice("moe_dispatcher", dispatcher, DISPATCHERS)
        if dispatcher == "alltoall" or ep <= 1:
            return self.top_k * (self.capacity_factor or 1.0)
        places = ep if ep <= domain or ep % domain else ep // domain
        held = self.experts - self.experts // places  # experts outside one place
        missed = math.comb(held, self.top_k) / math.comb(self.experts, self.top_k)
        return places * (1.0 - missed)

    def linear_gemms(self, micro_batch: int, *, tp: int = 1, cp: int = 1) -> tuple[Gemm, ...]:
        """The forward GEMMs of one layer's linear layers on one of ``tp`` tensor-parallel
        ranks, over the b s tokens of a micro-batch (Megatron's column- then
        row-parallel split): QKV h -> (a + 2g) d / t, the projection a d / t -> h, the
        MLP's first layer h -> f/t (2f/t gated: gate and up in one GEMM) and second
        f/t -> h. Together 2 (layer parameters / t) FLOPs per token. With context
        parallelism over ``cp`` ranks each holds b s / cp of the tokens.

        >>> m = Transformer(layers=1, hidden=1024, seq=512)
        >>> sum(g.flops for g in m.linear_gemms(2, tp=2)) == 2 * (2 * 512) * m.layer_params / 2
        True
        """
        h, f = self.hidden, self.ffn or 4 * self.hidden
        tokens = micro_batch * self.seq // cp
        up = (2 if self.gated else 1) * f
        return (
            *self.attention_linear_gemms(micro_batch, tp=tp, cp=cp),
            Gemm(tokens, _split(up, tp), h),
            Gemm(tokens, h, _split(f, tp)),
        )

    def attention_gemms(self, micro_batch: int, *, tp: int = 1) -> tuple[Gemm, ...]:
        """The attention core's batched GEMMs of one layer's forward on one TP rank: per
        sequence and local head, the scores Q K^T (s x s over the head size) and their
        weighted sum of V (s x head size over s); 4 s h / t FLOPs per token together.

        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8)
        >>> [g.as_list() for g in m.attention_gemms(2, tp=2)]
        [[512, 512, 128, 8, 1], [512, 128, 512, 8, 1]]
        """
        s, heads = self.seq, self.attention_heads
        size = self.head_dim
        batch = micro_batch * _split(heads, tp)
        if self.is_mla:  # query/key heads with their rotary part; the value heads
            value = self.v_head_dim or size
            return (Gemm(s, s, size + self.qk_rope_dim, batch), Gemm(s, value, s, batch))
        return (Gemm(s, s, size, batch), Gemm(s, size, s, batch))

    def logits_gemm(self, micro_batch: int, *, tp: int = 1, cp: int = 1) -> Gemm:
        """The output layer's forward GEMM on one TP rank: b s / cp tokens x h -> V / t."""
        return Gemm(micro_batch * self.seq // cp, _split(self.vocab, tp), self.hidden)

    def layer_elementwise_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        sequence_parallel: bool = False,
        flash_attention: bool = False,
    ) -> float:
        """HBM bytes the non-GEMM kernels of one layer's forward pass move (bf16, 1-byte
        dropout masks), as Megatron-LM fuses them (megatron/core/fusions: fused
        LayerNorm, scale-mask-softmax, bias-GeLU and bias-dropout-add): per token, two
        LayerNorms read and write h (8h bytes), two bias-dropout-adds read the input and
        the residual and write the sum and a mask (14h), softmax reads and writes the
        a s / t scores (4as/t) and its dropout reads, writes and masks them (5as/t), and
        the bias-GeLU reads and writes f / t (4f/t; a gated MLP reads two, 6f/t). The
        22h part is split over TP only with sequence parallelism. ``flash_attention``
        (Dao et al. 2022) never writes the scores to HBM, so their 9as/t is gone; its
        other traffic (Q, K, V read once, the output written once) is within the 22h.
        A model trained without dropout moves only the softmax's 4as/t
        (:meth:`scores_elementwise_bytes`).
        With ``qk_norm`` (Qwen3) Megatron-Core normalises the query's a / t heads and
        the key's g / t groups of d each with a TE norm kernel apiece, reading and
        writing them in bf16 (4 (a + g) d / t; core_v0.16.0 gpt_layer_specs.py lines
        136-151 and 271, ``q_layernorm`` / ``k_layernorm`` = ``backend.layer_norm(
        for_qk=True)``; attention.py lines 1477-1481 apply them to query and key).

        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8)
        >>> m.layer_elementwise_bytes(1) == 22 * 1024 + 9 * 8 * 512 + 4 * 4096
        True
        >>> q = Transformer(layers=1, hidden=1024, seq=512, heads=8, kv_heads=2, qk_norm=True)
        >>> q.layer_elementwise_bytes(1) - Transformer(**{**q.__dict__, "qk_norm": False}
        ...     ).layer_elementwise_bytes(1) == 4 * (8 + 2) * 128
        True
        """
        h, f = self.hidden, self.ffn or 4 * self.hidden
        per_token = 22 * h / (tp if sequence_parallel else 1)
        if self.qk_norm and not self.is_mla:
            per_token += 4 * (self.attention_heads + self.query_groups) * self.head_dim / tp
        if not flash_attention:
            per_token += self.scores_elementwise_bytes(1, tp=tp)
        per_token += (6 if self.gated else 4) * f / tp
        return tokens * per_token

    def scores_elementwise_bytes(self, tokens: float, *, tp: int = 1) -> float:
        """HBM bytes the unfused attention's kernels on its scores move in one layer's
        forward on one of ``tp`` ranks, over ``tokens`` query tokens (the scores' GEMMs
        are :meth:`attention_gemms`): the scale-mask-softmax reads and writes each token's
        a s / t bf16 scores (4as/t: Megatron-LM's ``FusedScaleMaskSoftmax``, Transformer
        Engine's ``UnfusedDotProductAttention`` alike) and, where the model trains with
        dropout, the dropout reads and writes them and writes a 1-byte mask (5as/t). A
        dropout of 0 moves nothing: PyTorch returns its input (aten/src/ATen/native/
        Dropout.cpp, ``_dropout_impl``: ``if (p == 0 || !train ...) return input``), as
        DeepSeek-V3's ``attention_dropout`` 0.0 (NeMo ``DeepSeekConfig``) runs it.

        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8)
        >>> m.scores_elementwise_bytes(1, tp=2) == 9 * 8 * 512 / 2
        True
        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8, dropout=False)
        >>> m.scores_elementwise_bytes(1, tp=2) == 4 * 8 * 512 / 2
        True
        """
        per_token = (9 if self.dropout else 4) * self.attention_heads * self.seq / tp
        return tokens * per_token

    def moe_elementwise_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        sequence_parallel: bool = False,
        flash_attention: bool = False,
        local_experts: int = 1,
    ) -> float:
        """HBM bytes the non-GEMM kernels of one MoE layer's forward move on one rank:
        the attention's and norms' as a dense layer's (:meth:`layer_elementwise_bytes`
        without its MLP), the shared experts' activation over every token (split over
        TP), and per routed copy of a token (``top_k`` a token, times the capacity
        factor; the rank's b s / t tokens with sequence parallelism) the experts'
        activation (6 f bytes gated: reads gate and up, writes their product; 4 f
        otherwise) and the moves of Megatron-Core's all-to-all dispatcher
        (megatron/core/transformer/moe/token_dispatcher.py,
        MoEAlltoAllTokenDispatcher): ``permute`` before the dispatch reads and writes
        each copy (4 h bytes), ``sort_chunks_by_idxs`` after it and again before the
        combine reorders the received copies by local expert (4 h each, only with more
        than one local expert), and ``unpermute`` reads each copy back (2 h) and writes
        the weighted sum once a token (2 h).

        >>> m = Transformer(layers=1, hidden=64, seq=16, heads=4, experts=4, top_k=2,
        ...                 moe_ffn=32, gated=True)
        >>> extra = m.moe_elementwise_bytes(1, local_experts=2) - m.layer_elementwise_bytes(1)
        >>> extra == 2 * (6 * 32 + 14 * 64) + 2 * 64 - 6 * 4 * 64  # 2 copies, not a 4h MLP
        True
        """
        f, gated = self.expert_ffn, 6 if self.gated else 4
        dense = (
            self.layer_elementwise_bytes(
                tokens, tp=tp, sequence_parallel=sequence_parallel, flash_attention=flash_attention
            )
            - tokens * gated * (self.ffn or 4 * self.hidden) / tp
        )
        shared = tokens * gated * self.shared_experts * f / tp
        routed = tokens / (tp if sequence_parallel else 1)
        copies = routed * self.top_k * (self.capacity_factor or 1.0)
        moves = (14 if local_experts > 1 else 6) * self.hidden
        return dense + shared + copies * (gated * f + moves) + routed * 2 * self.hidden

    def expert_padding_bytes(
        self,
        tokens: float,
        *,
        ep: int = 1,
        etp: int = 1,
        tp: int = 1,
        sequence_parallel: bool = False,
        align: int = 16,
    ) -> float:
        """HBM bytes one MoE layer's forward spends on one rank padding its experts'
        tokens for fp8 GEMMs, as Megatron-Core's ``TEGroupedMLP`` does with Transformer
        Engine's ``Fp8Padding`` and ``Fp8Unpadding`` (megatron/core/transformer/moe/
        experts.py at core_v0.13.0-core_v0.16.0; transformer_engine/pytorch/module/
        fp8_padding.py: ``fused_multi_row_padding`` into a new buffer unless every
        expert's count already is a multiple of ``align``): the routed copies a rank
        holds (b s / t with sequence parallelism, top_k each, etp times with expert TP)
        read and written once padded (4 h bytes) and the experts' output read and
        written once unpadded (4 h), the routing probabilities padded too (fp32: 8); the
        backward the same kernels the other way, as many bytes. None when every
        expert's count is a multiple of ``align`` (capacity padding to such a count); a
        dropless expert's count, with random routing, is not.

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32)
        >>> m.expert_padding_bytes(16) == 16 * 2 * (8 * 64 + 8)
        True
        """
        if align <= 1:
            return 0.0
        if self.capacity_factor:
            routed = tokens * self.top_k * self.capacity_factor
            if math.ceil(routed * ep * etp / self.experts) % align == 0:
                return 0.0
        copies = tokens / (tp if sequence_parallel else 1) * self.top_k * etp
        return copies * (self.capacity_factor or 1.0) * (8 * self.hidden + 8)

    def expert_bias_bytes(
        self, tokens: float, *, tp: int = 1, sequence_parallel: bool = False, etp: int = 1
    ) -> tuple[float, float]:
        """HBM bytes (forward, backward) one MoE layer spends on one rank adding its experts'
        second bias, weighted by the routing probability, when the experts have biases
        (``expert_bias``): Megatron-Core's ``TEGroupedMLP._apply_bias`` (experts.py,
        core_v0.16.0: fc2 returns its biases apart, ``skip_bias_add``) splits the output
        by expert and, per expert, multiplies the bias by the probabilities (writes 2 h
        bytes a routed copy) and adds it (reads 4 h, writes 2 h), then concatenates them
        (reads and writes 2 h): 12 h a copy. Backward, autograd's: the product's two
        gradients, each a multiply (reads 2 h, writes 2 h) and a sum (reads 2 h), and the
        split's gradient, a concatenation (reads and writes 2 h): 16 h. (fc1's bias is
        added inside its GEMM.)

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32,
        ...                 expert_bias=True)
        >>> m.expert_bias_bytes(16) == (16 * 2 * 12 * 64, 16 * 2 * 16 * 64)
        True
        """
        if not self.expert_bias:
            return 0.0, 0.0
        copies = tokens / (tp if sequence_parallel else 1) * self.top_k * etp
        copies *= self.capacity_factor or 1.0
        return copies * 12 * self.hidden, copies * 16 * self.hidden

    def expert_activation_bytes(
        self, tokens: float, *, tp: int = 1, sequence_parallel: bool = False
    ) -> float:
        """HBM bytes of one MoE layer's routed experts' activation forward on one rank, as
        :meth:`moe_elementwise_bytes` counts it: per routed copy (``top_k`` a token,
        times the capacity factor) 6 f bytes gated (reads gate and up, writes their
        product), 4 f otherwise; what recomputing it (Megatron-Core's "moe_act") costs
        again in the backward.

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32,
        ...                 gated=True)
        >>> m.expert_activation_bytes(16) == 16 * 2 * 6 * 32
        True
        """
        if not self.is_moe:
            return 0.0
        copies = tokens / (tp if sequence_parallel else 1) * self.top_k
        copies *= self.capacity_factor or 1.0
        return copies * (6 if self.gated else 4) * self.expert_ffn

    def fused_grouped_mlp_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        etp: int = 1,
        sequence_parallel: bool = False,
        recipe: str = "mxfp8",
        transpose: bool = False,
    ) -> tuple[float, float]:
        """HBM bytes (forward, backward) of one MoE layer's routed experts on one rank that
        Transformer Engine's fused grouped MLP does not spend as kernels of their own: its
        op fuser runs fc1's grouped GEMM with the gated activation, the routing
        probabilities' scaling and the MXFP8 quantization of fc2's input in the GEMM's
        epilogue, and backward fc2's data-gradient GEMM with the activation's gradient
        and the quantization of fc1's output gradient ("GroupGEMM + (d)SwiGLU + quant +
        swizzle": Megatron-Bridge issue #2885; transformer_engine/pytorch/ops/fused/
        grouped_mlp.py at v2.17, ``NVTE_CUTEDSL_FUSED_GROUPED_MLP``, with
        ``ScaledSwiGLU`` and ``ScaledClampedQGeGLU``). What it takes away, per routed
        copy: forward the activation (:meth:`expert_activation_bytes`) and fc2's input
        cast (f / etp elements, a cast of its own: :func:`fp8_cast_cost`); backward the
        activation's gradient (twice the forward's bytes, as the generator counts a
        backward) and fc1's output-gradient cast (2 f / etp gated). gpt-oss's clamps
        (:meth:`glu_clamp_bytes`) go with the activation (the fused op's cuDNN kernels
        take ``ScaledClampedQGeGLU``'s clamp limits, "geglu"/"dgeglu": grouped_mlp.py
        v2.17 lines 839-861); the generator leaves them out where this applies. fc1's
        input cast (``tex.group_quantize``) and fc2's output-gradient cast stay. The
        experts' biases are handed to the cuDNN kernels too
        (``_pack_grouped_linear_bias_for_cudnn``), but :meth:`expert_bias_bytes` is kept:
        whether Megatron-Core's op-fuser path routes gpt-oss's biases there was not read.

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32,
        ...                 gated=True)
        >>> m.fused_grouped_mlp_bytes(1) == (2 * (6 * 32 + 4.0625 * 32),
        ...                                  2 * (12 * 32 + 4.0625 * 64))
        True
        """
        if not self.is_moe:
            return 0.0, 0.0
        standalone = fp8_cast_cost(recipe, transpose=transpose)[0]
        act = self.expert_activation_bytes(tokens, tp=tp, sequence_parallel=sequence_parallel)
        copies = tokens / (tp if sequence_parallel else 1) * self.top_k * etp
        copies *= self.capacity_factor or 1.0
        f = self.expert_ffn / etp
        up = (2 if self.gated else 1) * f
        return act + standalone * copies * f, 2 * act + standalone * copies * up

    def glu_clamp_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        sequence_parallel: bool = False,
        etp: int = 1,
        recompute: bool = False,
    ) -> tuple[float, float]:
        """HBM bytes (forward, backward) one MoE layer spends on one rank clamping its
        experts' gated activation's input (``glu_clamp``: gpt-oss's
        ``activation_func_clamp_value`` 7). Megatron-Core's
        ``weighted_bias_quick_geglu_impl`` (megatron/core/fusions/fused_bias_geglu.py,
        core_v0.15.0 to core_v0.19.0, unchanged) runs, before its fused activation, three
        PyTorch kernels outside it over each routed copy's fc1 output (two halves of f
        bf16 elements): ``x_glu.clamp(max=7)`` and ``x_linear.clamp(-7, 7)`` (each reads
        and writes a half: 4 f bytes) and their ``torch.cat`` (reads and writes both: 8 f):
        16 f bytes a copy. Backward, autograd's (PyTorch FunctionsManual.cpp,
        ``clamp_backward``: ``where(self <= max, grad, 0)`` with max alone,
        ``where((self >= min).logical_and_(self <= max), grad, 0)`` with both; the
        comparisons write 1-byte masks): the first clamp's comparison (reads 2 f, writes f)
        and ``where`` (reads f + 2 f, writes 2 f), 8 f; the second's two comparisons,
        ``logical_and_`` (reads 2 f, writes f) and ``where``, 14 f; the chunk's gradient, a
        concatenation of the two halves' (8 f): 30 f bytes a copy. The cat's own gradient
        is two views (no kernel). ``recompute``: the activation is recomputed in the
        backward (Megatron-Core's ``recompute_modules`` "moe_act": ``TEGroupedMLP`` checkpoints
        ``bias_act_func``, experts.py), so the forward's 16 f run again there.

        >>> m = Transformer(layers=1, hidden=64, seq=16, experts=4, top_k=2, moe_ffn=32,
        ...                 gated=True, glu_clamp=True)
        >>> m.glu_clamp_bytes(16) == (16 * 2 * 16 * 32, 16 * 2 * 30 * 32)
        True
        >>> m.glu_clamp_bytes(16, recompute=True)[1] == 16 * 2 * (30 + 16) * 32
        True
        """
        if not (self.glu_clamp and self.is_moe and self.gated):
            return 0.0, 0.0
        copies = tokens / (tp if sequence_parallel else 1) * self.top_k * etp
        copies *= self.capacity_factor or 1.0
        f = self.expert_ffn / etp  # one half of fc1's output on an expert-TP rank
        forward = copies * 16 * f
        return forward, copies * 30 * f + (forward if recompute else 0.0)

    def unfused_rope_bytes(self, tokens: float, *, tp: int = 1) -> tuple[float, float]:
        """HBM bytes (forward, backward) of one layer's rotary embedding on one TP rank
        where Megatron-Core runs its unfused PyTorch path: YaRN (``yarn_scale`` > 1)
        scales cos and sin by the concentration factor 0.1 ln(scale) + 1 (1.35 for
        gpt-oss's 32, yarn_rotary_pos_embedding.py ``_yarn_get_concentration_factor``
        with yarn_mscale None), which TE's fused kernel cannot take, so
        ``apply_rotary_pos_emb`` falls back to ``_apply_rotary_pos_emb_bshd`` (rope_utils.py,
        core_v0.16.0 on: "mscale ... is not supported by TE's fused RoPE"). Per bf16
        element of q and k (a d / t + g d / t a token): forward ``t * cos`` (reads 2,
        writes 2), ``_rotate_half``'s negation of one half (2 an element on average) and
        concatenation (4), ``* sin`` (4), the sum (reads 4, writes 2) and the final
        ``torch.cat`` with the empty pass-through part (4): 24 bytes. Backward
        (autograd): the two products' gradients (4 each), the negation's (2), the
        chunk's concatenation (4), the empty pass-through slice's zero-filled gradient
        (2) and the three gradients' two sums (6 each): 28 bytes. (The fused kernel's own
        traffic, 4 bytes an element each way, is left out, as for every model.)

        >>> m = Transformer(layers=1, hidden=64, heads=4, kv_heads=2, head_size=16,
        ...                 yarn_scale=32.0)
        >>> m.unfused_rope_bytes(10) == (10 * 96 * 24, 10 * 96 * 28)
        True
        """
        if self.yarn_scale <= 1:
            return 0.0, 0.0
        elements = tokens * (self.attention_heads + self.query_groups) * self.head_dim / tp
        return elements * 24, elements * 28

    def mla_unfused_rope_bytes(self, tokens: float, *, tp: int = 1) -> tuple[float, float]:
        """HBM bytes (forward, backward) of one layer's multi-head latent attention
        between its up projections and its core on one TP rank, over ``tokens`` tokens,
        where Megatron-Core runs its unfused rotary embedding (``apply_rope_fusion``
        False), as ``qkv_up_proj_and_rope_apply`` does at Megatron-LM 7094270c6fa1
        (megatron/core/transformer/multi_latent_attention.py lines 465-499, the commit
        DGX Cloud v25.05.04's DeepSeek-V3 runs check out):

        * the rotary part of every local query head and of the one shared key head
          (a / t + 1 heads of ``qk_rope_dim`` a token, the key's gathered over the
          sequence) through ``_apply_rotary_pos_emb_bshd`` with
          ``multi_latent_attention`` (rope_utils.py lines 89-123): the de-interleave
          ``torch.cat`` of the even and odd halves (reads 2, writes 2 bytes an element),
          then the 24 bytes of :meth:`unfused_rope_bytes`: 28 bytes forward; backward
          that path's 28 and the de-interleave's, each strided slice's gradient a
          zero-filled tensor with half its elements copied in (4 a slice) and the two
          summed (6): 42;
        * per local head the ``torch.cat`` of the query's two parts (reads and writes
          d + r elements, 4 (d + r) bytes), of the key's shared-weight part and the
          expanded rotary part (reads d, writes d + r: 2 (2d + r); the expanded part
          read once a token), and ``value.contiguous()`` of the value split out of
          the kv up projection (4 v); backward the splits' gradients assembled into the
          query (4 (d + r)) and kv (4 (d + v)) up projections' outputs and the expand's
          sum over heads (2 r): the same 1,920 bytes a head for DeepSeek-V3 both ways.

        A model without MLA moves none here. DeepSeek-V3 at TP 2, 4,096 tokens:

        >>> m = Transformer(layers=1, hidden=7168, heads=128, head_size=128,
        ...                 q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64, v_head_dim=128)
        >>> fwd, bwd = m.mla_unfused_rope_bytes(4096, tp=2)
        >>> fwd == 4096 * (64 * 1920 + 65 * 64 * 28), bwd == 4096 * (64 * 1920 + 65 * 64 * 42)
        (True, True)
        """
        if not self.is_mla:
            return 0.0, 0.0
        heads = self.attention_heads / tp
        d, r = self.head_dim, self.qk_rope_dim
        v = self.v_head_dim or d
        rotary = (heads + 1) * r  # elements a token
        copies_fwd = heads * (4 * (d + r) + 2 * (2 * d + r) + 4 * v)
        copies_bwd = heads * (4 * (d + r) + 4 * (d + v) + 2 * r)
        return tokens * (copies_fwd + 28 * rotary), tokens * (copies_bwd + 42 * rotary)

    @property
    def windowed_layers(self) -> int:
        """Layers whose attention is a sliding window of ``window`` tokens: Megatron-Core's
        ``is_layer_window_attention`` (megatron/core/transformer/utils.py, core_v0.16.0)
        windows layer n (from 1) unless n is a multiple of ``window_attn_skip_freq``
        (``full_attention_every``; None, here 0: every layer). gpt-oss 120B: window 128,
        every second layer full, so 18 of 36.

        >>> Transformer(layers=36, hidden=64, window=128, full_attention_every=2).windowed_layers
        18
        >>> Transformer(layers=5, hidden=64, window=128, full_attention_every=3).windowed_layers
        4
        """
        if not self.window:
            return 0
        every = self.full_attention_every
        return sum(1 for n in range(1, self.layers + 1) if not every or n % every)

    def window_keys(self) -> int:
        """Keys per query of a sliding-window layer in :class:`~.kernels.Attention`'s causal
        form (FLOPs 2 q k d, half of a full 4 q k d): query i (from 0) attends to
        min(i + 1, w) keys, s w - w (w - 1) / 2 over the sequence (s >= w), so
        k = 2 w - w (w - 1) / s, rounded; the whole causal prefix (s) where the window
        holds it. gpt-oss at 4,096 tokens: 252 instead of 4,096.

        >>> Transformer(layers=2, hidden=64, seq=4096, window=128).window_keys()
        252
        """
        w, s = self.window, self.seq
        if not w or w >= s:
            return s
        return round(2 * w - w * (w - 1) / s)

    def cross_entropy_bytes(
        self, tokens: float, *, tp: int = 1, impl: str = "unfused", backward: bool = False
    ) -> float:
        """HBM bytes the loss kernels of one pass over ``tokens`` tokens move on one TP
        rank (the rank's V / t logits of each token, :data:`CROSS_ENTROPY_BYTES` each).

        1.7B GPT of the Megatron-LM README (vocabulary 131,072, TP 1), one sequence of
        4,096 tokens, unfused: 4096 x 131072 x (38 + 14) bytes, 27.9 GB, 8.3 ms at
        H100's 3.35 TB/s.

        >>> m = Transformer(layers=24, hidden=2048, seq=4096, vocab=131072, heads=16)
        >>> m.cross_entropy_bytes(4096) + m.cross_entropy_bytes(4096, backward=True)
        27917287424.0
        >>> m.cross_entropy_bytes(4096, tp=2, impl="te")  # 2 bytes a logit, half of V
        536870912.0
        """
        if impl not in CROSS_ENTROPY_BYTES:
            raise CcsimError(
                f"cross_entropy must be one of {', '.join(CROSS_ENTROPY_BYTES)} (the loss "
                f"kernels: Megatron-Core's unfused default, its native fusion, Transformer "
                f"Engine's), not {impl!r}"
            )
        per_logit = CROSS_ENTROPY_BYTES[impl][1 if backward else 0]
        return float(tokens * _split(self.vocab, tp) * per_logit)

    def fp8_cast_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        backward: bool = False,
        recipe: str = "delayed",
        transpose: bool = True,
        sequence_parallel: bool = False,
        te_activation: bool = False,
    ) -> float:
        """HBM bytes Transformer Engine's fp8 casts of one layer's pass move on one TP rank,
        beyond the bf16 kernels' (:meth:`layer_elementwise_bytes`), for the scaling
        ``recipe`` (:data:`FP8_RECIPES`; the bytes per element are :func:`fp8_cast_cost`).

        The GEMM inputs cast, per token: forward, the two LayerNorms' outputs (h, h / t
        with sequence parallelism: TE quantizes the local shard before its all-gather),
        the projection's input (a d / t, flash attention's bf16 output, a cast of its
        own) and the activation before FC2 (f / t, a cast of its own: Megatron-Core runs
        its own fused bias-SwiGLU/GeLU, which writes bf16, and hands it to TE's FC2
        linear: megatron/core/transformer/mlp.py lines 99-129 at core_r0.9.0, and
        ``use_te_activation_func = False`` by default since, transformer_config.py line
        1199 at d98e8a6; ``te_activation``: TE's activation kernel quantizes it itself,
        as with that flag set); backward, every GEMM's output
        gradient, each a cast of its own: QKV's (a + 2g) d / t, the projection's and
        FC2's h (gathered over TP) and FC1's f / t (2f / t gated). ``transpose``: the
        GPU's fp8 GEMMs take only K-major operands (Hopper), so a per-tensor cast also
        writes its transpose for the other GEMM that reads it; Blackwell's take any
        layout (TE's ``nvte_is_non_tn_fp8_gemm_supported``, compute capability 10.x:
        common/transformer_engine.cpp), one copy serves both.

        Where a per-tensor norm output is all-gathered (sequence parallelism over
        ``tp`` > 1 on such a GPU), the norm writes only the row-wise copy (TE v2.7
        layernorm_linear.py lines 186-189: ``supports_only_rowwise_all_gather``; TE v1.11
        lines 125-127, a uint8 ``ln_out``), and the backward transposes the gathered
        tensor for the weight gradient (v1.11 line 591 ``tex.fp8_transpose(ln_out_total)``;
        v2.7 line 800 ``ln_out_total.update_usage(columnwise_usage=True)``): one byte read
        and one written per element of the two gathered inputs, 4h a token. MXFP8 gathers
        its column-wise copy (unchanged).

        The weights' casts are once per step (TE caches them over micro-batches), left
        out. With the defaults (delayed scaling, Hopper, no sequence parallelism) the
        forward is 2h + 4 (a d + f) / t and the backward 4 bytes an element of every
        output gradient.

        >>> m = Transformer(layers=1, hidden=1024, seq=512, heads=8)
        >>> m.fp8_cast_bytes(1), m.fp8_cast_bytes(1, backward=True)
        (22528.0, 36864.0)
        >>> m.fp8_cast_bytes(1, recipe="mxfp8", transpose=False)  # 4.0625 (2h + ad + f)
        29120.0
        >>> m.fp8_cast_bytes(1, tp=4, backward=True, sequence_parallel=True)  # 15360 + 4h
        19456.0
        """
        h, d = self.hidden, self.head_dim
        f = self.ffn or 4 * h
        gathered = sequence_parallel and tp > 1 and transpose and recipe != "mxfp8"
        standalone, norm, act = fp8_cast_cost(recipe, transpose=transpose)
        if gathered:  # the norm's cast writes the row-wise copy alone
            norm = fp8_cast_cost(recipe, transpose=False)[1]
        if not backward:
            normed = 2 * h / (tp if sequence_parallel else 1)  # QKV's and FC1's inputs
            activation = act if te_activation else standalone
            per_token = (
                norm * normed + standalone * self.attention_heads * d / tp + activation * f / tp
            )
        else:
            qkv = (self.attention_heads + 2 * self.query_groups) * d / tp
            up = (2 if self.gated else 1) * f / tp
            per_token = standalone * (qkv + 2 * h + up)
            if gathered:  # the gathered inputs' transposes (1 byte read, 1 written)
                per_token += 2 * (2 * h)
        return float(tokens * per_token)

    def moe_fp8_cast_bytes(
        self,
        tokens: float,
        *,
        tp: int = 1,
        etp: int = 1,
        backward: bool = False,
        recipe: str = "delayed",
        transpose: bool = True,
        sequence_parallel: bool = False,
    ) -> float:
        """HBM bytes Transformer Engine's fp8 casts of one MoE layer's pass move on one TP
        rank: the attention's as a dense layer's (:meth:`fp8_cast_bytes`), and instead of
        a dense MLP's the casts of the experts' GEMM inputs, per routed copy of a token
        and, for shared experts, per token (bytes per element: :func:`fp8_cast_cost`).

        An MoE layer's MLP has no LayerNormLinear: Megatron-Core's MoE layer spec puts a
        separate norm before it (``pre_mlp_layernorm=backend.layer_norm() if
        num_experts``, megatron/core/models/gpt/gpt_layer_specs.py lines 265 and 291 at
        core_v0.16.0), whose bf16 output the router reads and the dispatcher permutes.
        The routed experts are TE ``GroupedLinear`` modules, which quantize their whole
        input, every expert's rows, with ``tex.split_quantize`` (row- and column-wise
        for the weight gradient) and, backward, their output gradient the same way
        (transformer_engine/pytorch/module/grouped_linear.py at v2.8, lines 127 and
        299-310): each a cast of its own. Forward, per routed copy (b s / t tokens with
        sequence parallelism, ``top_k`` copies each, ``etp`` times that with expert
        TP), fc1's input (h) and fc2's (f / etp, the activation's bf16 output);
        backward, fc2's output gradient (h) and fc1's (2 f / etp gated, f otherwise).
        Shared experts (TE linears behind the same norm) cast their input (h, the
        sequence-parallel shard) and the activation (f / t) forward, and their two
        output gradients (h and 2 f / t gated) backward, with the gathered input's
        transpose where a per-tensor norm output would be all-gathered (as
        :meth:`fp8_cast_bytes`).

        Left out: the rows fp8 padding adds to each expert (a few a expert), the router
        (its GEMM runs on bf16 inputs, ``te_general_gemm`` with an fp32 output:
        megatron/core/transformer/moe/moe_utils.py, ``RouterGatingLinearFunction``), and
        the weights' casts (once a step, as for dense layers).

        >>> m = Transformer(layers=1, hidden=64, seq=16, heads=4, ffn=256, experts=4,
        ...                 top_k=2, moe_ffn=32, gated=True)
        >>> # forward: the dense layer's less its FC1 input (norm cast, 64) and FC2 input
        >>> # (own cast, 256), plus 2 copies x (64 + 32) own casts; delayed, Hopper: 4 and 1
        >>> extra = m.moe_fp8_cast_bytes(1) - m.fp8_cast_bytes(1)
        >>> extra == 4 * 2 * (64 + 32) - (1 * 64 + 4 * 256)
        True
        >>> extra = m.moe_fp8_cast_bytes(1, backward=True) - m.fp8_cast_bytes(1, backward=True)
        >>> extra == 4 * 2 * (64 + 2 * 32) - 4 * (64 + 2 * 256)
        True
        """
        h = self.hidden
        dense = self.fp8_cast_bytes(
            tokens,
            tp=tp,
            backward=backward,
            recipe=recipe,
            transpose=transpose,
            sequence_parallel=sequence_parallel,
        )
        if not self.is_moe:
            return dense
        gathered = sequence_parallel and tp > 1 and transpose and recipe != "mxfp8"
        standalone, norm, _ = fp8_cast_cost(recipe, transpose=transpose)
        if gathered:
            norm = fp8_cast_cost(recipe, transpose=False)[1]
        shard = h / (tp if sequence_parallel else 1)  # a token's norm output on this rank

        def mlp(inner: float, normed: float, split: int) -> float:
            """One token's casts through an MLP of ``inner`` split ``split`` ways, its
            input cast at ``normed`` bytes an element (as fp8_cast_bytes counts FC1)."""
            up = (2 if self.gated else 1) * inner / split
            if not backward:
                return normed * shard + standalone * inner / split
            return standalone * (h + up) + (2 * h if gathered else 0.0)

        dense_mlp = mlp(self.ffn or 4 * h, norm, tp)
        shared = (
            mlp(self.shared_experts * self.expert_ffn, standalone, tp)
            if self.shared_experts
            else 0.0
        )
        copies = self.top_k * etp * (self.capacity_factor or 1.0) / (tp if sequence_parallel else 1)
        f = self.expert_ffn / etp
        routed = h + ((2 if self.gated else 1) * f if backward else f)
        per_token = shared - dense_mlp + standalone * copies * routed
        return float(dense + tokens * per_token)

    def step_flops(
        self, sequences: float, *, recompute: bool = True, causal: bool = False
    ) -> float:
        """FLOPs of a training step over ``sequences`` sequences as Megatron-LM counts them:
        forward, backward (2x) and, with ``recompute``, the forward again of every layer,
        plus the logits' forward and backward (6 B s h V). For GPT with full recomputation
        this is Narayanan et al.'s SC'21 eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh);
        without recomputation and with ``causal`` it is Megatron-LM's current
        ``num_floating_point_operations`` (grouped-query attention, SwiGLU and routed
        experts included).

        >>> m = Transformer(layers=96, hidden=12288, seq=2048, vocab=51200)
        >>> B, s, l, h, V = 1536, 2048, 96, 12288, 51200
        >>> m.step_flops(B) / (96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)))
        1.0
        """
        passes = 4 if recompute else 3
        tokens = sequences * self.seq
        layers = sum(
            self.layer_forward_flops(tokens, causal=causal, index=i) for i in range(self.layers)
        )
        return passes * layers + 6 * tokens * self.hidden * self.vocab


#: Compute streams Transformer Engine spreads a grouped GEMM's per-expert GEMMs over
#: (transformer_engine/common/util/multi_stream.cpp, num_compute_streams).
STREAMS = 4

#: Megatron-Core's MoE token dispatchers ccsim models
#: (:meth:`Transformer.dispatch_copies`): ``alltoall`` (``moe_token_dispatcher_type``
#: "alltoall") and the "flex" dispatcher's backends (``moe_flex_dispatcher_backend``).
DISPATCHERS = ("alltoall", "deepep", "hybridep")


def expected_max_normal(n: int) -> float:
    """Expected largest of ``n`` independent standard normal draws,
    the integral of x n phi(x) Phi(x)^(n-1) over the line (Simpson's rule on [-12, 12],
    4,800 intervals: the tails beyond hold under 1e-30).

    >>> expected_max_normal(1), round(expected_max_normal(2), 6)  # 0; 1/sqrt(pi)
    (0.0, 0.56419)
    """
    if n <= 1:
        return 0.0
    steps, low, high = 4800, -12.0, 12.0
    width = (high - low) / steps

    def density(x: float) -> float:
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        return x * n * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1)

    total = density(low) + density(high)
    for i in range(1, steps):
        total += (4 if i % 2 else 2) * density(low + i * width)
    return total * width / 3


def _split(size: int, parts: int) -> int:
    """One rank's share of a dimension split over ``parts`` (rounded up, as padding)."""
    return math.ceil(size / parts)


_FIELDS = {f.name: f.type for f in fields(Transformer)}


def transformer_from_data(data: Any, *, origin: str) -> Transformer:
    """A :class:`Transformer` from a model file's mapping; unknown keys and values of the
    wrong type are named."""
    if not isinstance(data, Mapping):
        raise CcsimError(f"{origin}: a model file is a mapping of fields, got {shown(data)}")
    unknown = sorted(set(data) - set(_FIELDS) - {"description"})
    if unknown:
        raise CcsimError(
            f"{origin}: unknown field {shown(unknown[0])}; valid: {', '.join(_FIELDS)}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "description":
            continue
        kind = _FIELDS[key]
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            "bool": isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool) and value >= 0,
            "str": isinstance(value, str),
        }[kind]
        if not ok:
            raise CcsimError(f"{origin}: {key} must be a non-negative {kind}, got {shown(value)}")
        values[key] = value
    for key in ("layers", "hidden"):
        if not values.get(key):
            raise CcsimError(f"{origin}: {key} must be a positive integer")
    return Transformer(**values)


def load_models(folder: Path) -> dict[str, Transformer]:
    """Every ``*.yaml`` model file of ``folder``, by name (the file's stem unless it names
    itself)."""
    models = {}
    for path in sorted(folder.glob("*.yaml")):
        data = load_data(path, what="model", fmt="yaml")
        model = transformer_from_data(data, origin=str(path))
        name = model.name or path.stem
        models[name] = Transformer(**{**model.__dict__, "name": name})
    return models


#: Named models (``workloads/models/``), by name.
MODELS = load_models(data_dir("workloads") / "models")
