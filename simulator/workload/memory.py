"""Memory per GPU of a training configuration: weights, gradients, optimizer state and
activations, so that a configuration that cannot fit is known before it is simulated.

Figures follow Megatron-LM's own accounting, for mixed-precision Adam with bf16
parameters and fp32 gradients:

* **model state** (Megatron-LM README, "Distributed Optimizer"): 18 bytes per parameter
  without the distributed optimizer (bf16 weights 2, fp32 main gradients 4, fp32 master
  weights, momentum and variance 12); 6 + 12/d with it, the 12 bytes of optimizer state
  sharded over the d data-parallel ranks. The parameters counted are those of the most
  loaded rank: a pipeline stage's share of the layers split over tensor parallelism,
  plus the input embedding (vocab x hidden / tp) on the first stage (Megatron's
  ``theoretical_memory_usage.py``);
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

FSDP (``fsdp``): the layers' weights, fp32 gradients and optimizer state are sharded
over the DP x CP ranks; each rank also holds two chunks' gathered bf16 weights (running
and prefetched) and one chunk's unsharded gradients; the embedding stays replicated.

Context parallelism over cp ranks divides every activation by cp (each rank holds s / cp
of the tokens; its attention runs flash-style, without stored scores) and shards the
distributed optimizer over the DP x CP ranks.

fp8 (Transformer Engine's recipe): the bf16 weights, fp32 gradients and optimizer state
stay; the linear layers' weights are also kept as fp8 copies and their transposes for
the step (TE casts them at the first micro-batch and reuses them, ``is_first_microbatch``),
2 more bytes per linear parameter. Activations are counted in bf16.

Not counted: temporary buffers (communication buckets, workspace), the allocator's
fragmentation and the CUDA context, which real runs keep a few GB for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import CcsimError
from .model import Transformer

#: Bytes per parameter of mixed-precision Adam (bf16 parameters, fp32 gradients), split
#: as Megatron-LM's README table counts them: weights, main gradients, optimizer state.
WEIGHT_BYTES = 2
GRADIENT_BYTES = 4
OPTIMIZER_BYTES = 12
#: fp8 training keeps each linear weight as fp8 and its fp8 transpose: 2 bytes more.
FP8_COPY_BYTES = 2
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
    # Flash attention never stores the scores (it recomputes them in the backward).
    stored = recompute != "selective" and not flash_attention
    scores = 5 * model.attention_heads * s / h if stored else 0.0
    if sequence_parallel or recompute == "selective":
        return sbh * (10 + split + scores) / t
    return sbh * (10 + split / t + scores / t)


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
    fsdp: bool = False,
) -> MemoryEstimate:
    """Peak bytes per GPU of a Megatron-LM 1F1B configuration: its first pipeline stage,
    which holds the input embedding and the most micro-batches in flight. With v virtual
    stages (interleaved 1F1B) it holds its warm-up's 2(p - 1) + (v - 1)p chunk passes
    and one more, each of L/(p v) layers: L/p (p + (p - 1)/v) layers' activations, the
    1 + (p - 1)/(p v) of Korthikanti et al. (section 5).

    >>> from simulator.workload.model import MODELS
    >>> m = megatron_memory(MODELS["gpt3-175b"], tp=8, pp=8, dp=16, micro_batch=1,
    ...                     micro_batches=96)
    >>> round(m.weights / 2**30, 2), round(m.activations / 2**30, 2)  # GiB
    (5.21, 4.69)
    """
    if model.layers % pp:
        raise CcsimError(f"{model.layers} layers do not split into {pp} pipeline stages")
    v = virtual_stages
    chunk = model.layers // (pp * v)
    # The first stage's layers (chunks 0, p, 2p, ... when interleaved), MoE ones apart.
    moe = sum(model.moe_layer(c * pp * chunk + k) for c in range(v) for k in range(chunk))
    dense = model.layers // pp - moe
    experts = (3 if model.gated else 2) * model.hidden * model.expert_ffn * model.experts
    shared = (model.moe_layer_params - experts) if moe else 0.0
    params = (dense * model.layer_params + moe * shared + model.vocab * model.hidden) / tp
    expert_params = moe * experts / ep
    optimizer = OPTIMIZER_BYTES / (dp * cp if distributed_optimizer else 1)
    expert_optimizer = OPTIMIZER_BYTES / (dp * cp // ep if distributed_optimizer else 1)

    def activation(m: Transformer) -> float:
        return layer_activation_bytes(
            m,
            micro_batch=micro_batch,
            tp=tp,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            flash_attention=flash_attention,
        )

    per_layer = activation(model)
    if moe:
        # An MoE layer keeps its experts' inputs for the tokens routed to them: as a
        # dense layer whose MLP is top_k (x capacity) plus the shared experts wide.
        routed = model.top_k * (model.capacity_factor or 1.0) + model.shared_experts
        wide = replace(model, ffn=round(routed * model.expert_ffn), experts=0)
        per_layer = (dense * per_layer + moe * activation(wide)) / (dense + moe)
    in_flight = min(pp, micro_batches)
    embedding_dropout = model.seq * micro_batch * model.hidden / (tp if sequence_parallel else 1)
    activations = in_flight * (model.layers // pp * per_layer + embedding_dropout)
    if v > 1:
        passes = min(2 * (pp - 1) + (v - 1) * pp + 1, micro_batches * v)
        activations = passes * model.layers / (pp * v) * per_layer + in_flight * embedding_dropout
    linear = (dense * model.layer_params + moe * shared) / tp + expert_params
    fp8_copies = FP8_COPY_BYTES * linear if precision == "fp8" else 0.0
    # Context parallelism: each rank keeps the activations of its s / cp tokens.
    activations /= cp
    if fsdp:
        # The layers' weights, gradients and optimizer state sharded over DP x CP, plus
        # two chunks' gathered weights (the one running and the one prefetched) and one
        # chunk's full gradients before they are reduce-scattered.
        replicas = dp * cp
        layers = dense * model.layer_params / tp
        embedding = model.vocab * model.hidden / tp
        gathered = 2 * layers / v
        return MemoryEstimate(
            weights=(layers / replicas + embedding + gathered) * WEIGHT_BYTES + fp8_copies,
            gradients=(layers / replicas + embedding + layers / v) * GRADIENT_BYTES,
            optimizer=(layers / replicas + embedding) * OPTIMIZER_BYTES,
            activations=activations,
        )
    return MemoryEstimate(
        weights=(params + expert_params) * WEIGHT_BYTES + fp8_copies,
        gradients=(params + expert_params) * GRADIENT_BYTES,
        optimizer=params * optimizer + expert_params * expert_optimizer,
        activations=activations,
    )
