"""The configurations ``ccsim search`` considers, their memory, and a quick estimate of
their step time used to decide which ones to simulate.

A :class:`Candidate` is one Megatron-LM configuration of a model on a cluster: tensor,
pipeline and data parallel sizes (TP inside a server, as Megatron places it), micro-batch,
recomputation, virtual stages, sequence parallelism and the distributed optimizer.
:func:`candidates` enumerates those Megatron accepts (heads split evenly, layers evenly
or, where the pipeline size does not divide them, with lighter first and last stages,
the global batch a multiple of micro-batch x DP, interleaving with whole chunks) and
:func:`estimate` prices each one analytically:

* compute: the kernel model's time of each pass (the same GEMMs and memory-bound
  kernels the generator emits) over the 1F1B schedule, (m + (p - 1)/v) forward and
  backward passes of the heaviest stage, m the micro-batches per replica;
* TP communication: each pass's collectives at the bandwidth bound 2(t - 1)/t x bytes /
  (per-GPU NVLink bandwidth), or the NICs' share when TP leaves the server;
* PP: the activation of each micro-batch crossing each stage boundary over a NIC;
* DP: the gradients' all-reduce (or reduce-scatter and all-gather) at the NICs'
  per-GPU share, after the last backward, as Megatron runs it without overlap;
* the optimizer step's 16 bytes per parameter (1/d of them when sharded) at HBM speed.

The estimate ignores latencies, contention and overlap (PP transfers do overlap compute
in the simulation), so it only ranks; the search simulates the best few by it and
reports their simulated times.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ..workload.devices import Device
from ..workload.generators import BF16, FP8_ALIGN, HOST_SYNC_S, pass_work
from ..workload.host import HOST_OP_S, moe_layer_host_s, moe_layer_ops
from ..workload.kernels import Attention, Gemm, kernels_time
from ..workload.memory import GRAD_REDUCE, MemoryEstimate, megatron_memory, pipeline_layers
from ..workload.model import Transformer

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Candidate:
    """One Megatron-LM configuration (the ``megatron`` generator's parameters)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    recompute: str = "full"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    precision: str = "bf16"
    cp: int = 1
    ep: int = 1
    fsdp: bool = False
    #: Layers of the first and last pipeline stages when they differ from the others'
    #: (None: the layers split evenly; see :func:`uneven_stages`).
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    @property
    def label(self) -> str:
        """A short name: ``TP8 PP2 DP4 mb1 v2 full SP DO`` (`` fp8`` when it is; uneven
        stages' layers after PP).

        >>> Candidate(8, 2, 4, 1, "selective", 2, True, True).label
        'TP8 PP2 DP4 mb1 v2 selective SP DO'
        >>> Candidate(8, 8, 16, 1, first_stage_layers=15, last_stage_layers=15).label
        'TP8 PP8 (first 15 last 15) DP16 mb1 v1 full'
        """
        text = f"TP{self.tp}" + (f" CP{self.cp}" if self.cp > 1 else "")
        text += f" PP{self.pp}"
        if self.first_stage_layers is not None:
            text += f" (first {self.first_stage_layers} last {self.last_stage_layers})"
        text += f" DP{self.dp} mb{self.micro_batch}"
        text += f" v{self.virtual_stages} {self.recompute}"
        text += f" EP{self.ep}" if self.ep > 1 else ""
        text += " SP" if self.sequence_parallel else ""
        text += " DO" if self.distributed_optimizer else ""
        text += " FSDP" if self.fsdp else ""
        return text + (" fp8" if self.precision == "fp8" else "")

    def params(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~simulator.workload.generators.megatron`."""
        return asdict(self)


@dataclass(frozen=True)
class Hardware:
    """What the estimate needs of the cluster: GPUs per server, the device, the
    per-GPU NVLink bandwidth and the per-GPU share of the NICs (bytes/s)."""

    gpus_per_server: int
    device: Device
    intra_bandwidth: float
    inter_bandwidth: float


@dataclass(frozen=True)
class Estimate:
    """A candidate's analytic step time (seconds) by part, and its memory per GPU."""

    candidate: Candidate
    memory: MemoryEstimate
    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    optimizer_s: float

    @property
    def step_s(self) -> float:
        """The parts added up: nothing overlaps in this estimate."""
        return self.compute_s + self.tp_s + self.pp_s + self.dp_s + self.optimizer_s


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def uneven_stages(layers: int, pp: int) -> tuple[int, int] | None:
    """First and last stages' layers for ``pp`` stages that do not divide ``layers``:
    the middle stages take ceil(layers / pp) each, as many as an even split's stages
    would, and the first and last share what is left, the first the smaller half (the
    first holds the embedding, the last the output layer and loss). Llama 3 405B's 126
    layers on 8 stages are 15, 6 x 16, 15, as Meta trained it (arXiv 2407.21783,
    section 3.3.2). None when ``pp`` divides the layers (even stages) or when what is
    left cannot give both ends a layer and at most a middle stage's.

    >>> uneven_stages(126, 8)
    (15, 15)
    >>> uneven_stages(105, 2), uneven_stages(40, 3), uneven_stages(40, 16), uneven_stages(96, 8)
    ((52, 53), (13, 13), None, None)
    """
    if pp < 2 or layers % pp == 0:
        return None
    middle = -(-layers // pp)
    left = layers - middle * (pp - 2)
    first, last = left // 2, left - left // 2
    if first < 1 or last > middle:
        return None
    return first, last


def candidates(
    model: Transformer,
    gpus: int,
    global_batch: int,
    *,
    gpus_per_server: int,
    micro_batches: Iterable[int] = (1, 2, 4, 8),
    recompute: Iterable[str] = RECOMPUTE,
    virtual_stages: Iterable[int] = (1, 2),
    sequence_parallel: bool = True,
    distributed_optimizer: bool = True,
    precisions: Iterable[str] = ("bf16",),
    context_parallel: Iterable[int] = (1,),
    expert_parallel: Iterable[int] | None = None,
    shardings: Iterable[str] = ("optimizer",),
) -> list[Candidate]:
    """Every configuration of ``model`` on ``gpus`` GPUs that Megatron-LM accepts.

    TP divides the GPUs of a server, the attention heads and the key/value heads; PP
    divides the layers, or does not and the first and last stages take fewer
    (:func:`uneven_stages`, Megatron-LM's ``--decoder-first/last-pipeline-num-layers``;
    not interleaved); with v virtual stages, the layers divide into p v chunks and the
    micro-batches per replica into p, with p >= 2; DP is what is left; the global batch
    is a multiple of micro-batch x DP; CP (context parallelism, from
    ``context_parallel``) splits each sequence into 2 cp chunks and sits between TP and
    DP in the rank order. Sequence parallelism is used wherever TP > 1 and the
    distributed optimizer wherever DP > 1 when asked for (both cost no speed in
    Megatron-LM's guidance, and save memory). Mixture-of-experts models also take EP
    (dividing DP and the experts; ``expert_parallel``, default every such divisor) and
    need sequence parallelism with TP > 1. ``shardings`` says how DP x CP replicas
    shard their state: "optimizer" (the distributed optimizer, if
    ``distributed_optimizer``) and/or "fsdp" (weights, gradients and optimizer; dense
    models).

    >>> m = Transformer(layers=4, hidden=1024, heads=8)
    >>> len(candidates(m, 8, 16, gpus_per_server=8, recompute=["full"], virtual_stages=[1]))
    32
    """
    out = []
    precisions = list(precisions)
    shardings = list(shardings)
    wanted_ep = None if expert_parallel is None else set(expert_parallel)
    pipelines = [pp for pp in divisors(gpus) if pp == 1 or pp <= model.layers]
    pipelines = [pp for pp in pipelines if not model.layers % pp or uneven_stages(model.layers, pp)]
    splits = [
        (tp, cp, pp)
        for tp in divisors(gpus_per_server)
        for cp in context_parallel
        for pp in pipelines
        if not (gpus % (tp * cp * pp) or model.attention_heads % tp or model.query_groups % tp)
        and (cp == 1 or model.seq % (2 * cp) == 0)
    ]
    for tp, cp, pp in splits:
        ends = uneven_stages(model.layers, pp) or (None, None)
        if model.is_moe and tp > 1 and not sequence_parallel:
            continue  # Megatron's MoE with TP needs sequence parallelism
        dp = gpus // (tp * cp * pp)
        eps = [1]
        if model.is_moe:
            eps = [e for e in divisors(dp) if model.experts % e == 0]
            eps = [e for e in eps if wanted_ep is None or e in wanted_ep]
        for mb in micro_batches:
            if global_batch % (mb * dp):
                continue
            micro = global_batch // (mb * dp)
            for v in virtual_stages:
                if v > 1 and (pp < 2 or model.layers % (pp * v) or micro % pp):
                    continue  # (uneven stages are never interleaved here: pp * v divides)
                # FSDP only where there are replicas to shard over, for dense models.
                fsdps = [False] if "optimizer" in shardings else []
                if "fsdp" in shardings and dp * cp > 1 and not model.is_moe:
                    fsdps.append(True)
                for redo, precision, ep, fsdp in itertools.product(
                    recompute, precisions, eps, fsdps
                ):
                    out.append(
                        Candidate(
                            tp,
                            pp,
                            dp,
                            mb,
                            redo,
                            v,
                            sequence_parallel and tp > 1,
                            distributed_optimizer and dp * cp > 1 and not fsdp,
                            precision,
                            cp,
                            ep,
                            fsdp,
                            *ends,
                        )
                    )
    return out


def memory_of(model: Transformer, candidate: Candidate, global_batch: int) -> MemoryEstimate:
    """Peak memory per GPU of a candidate (the generator's own estimate)."""
    c = candidate
    return megatron_memory(
        model,
        tp=c.tp,
        pp=c.pp,
        dp=c.dp,
        micro_batch=c.micro_batch,
        micro_batches=global_batch // (c.micro_batch * c.dp),
        recompute=c.recompute,
        sequence_parallel=c.sequence_parallel,
        distributed_optimizer=c.distributed_optimizer,
        virtual_stages=c.virtual_stages,
        precision=c.precision,
        cp=c.cp,
        flash_attention=True,  # Megatron-Core's fused attention (the generator's default)
        ep=c.ep,
        fsdp=c.fsdp,
        first_stage_layers=c.first_stage_layers,
        last_stage_layers=c.last_stage_layers,
    )


def estimate(
    model: Transformer,
    candidate: Candidate,
    global_batch: int,
    hardware: Hardware,
    *,
    host_op_s: float = HOST_OP_S,
) -> Estimate:
    """The analytic step time of ``candidate`` (see the module docstring); an MoE
    layer's host launches cost ``host_op_s`` an operation (the generator's default), a
    synchronised forward taking the longer of them and the GPU's work (the simulation
    runs the two in series between synchronisations, so it can only be longer)."""
    c, device = candidate, hardware.device
    micro = global_batch // (c.micro_batch * c.dp)
    # Each stage's layers (all its chunks); the heaviest sets the pipeline's pace.
    split = pipeline_layers(
        model.layers,
        c.pp,
        virtual_stages=c.virtual_stages,
        first_stage_layers=c.first_stage_layers,
        last_stage_layers=c.last_stage_layers,
    )
    layers = max(split)
    tokens = c.micro_batch * model.seq // c.cp
    flash = True  # Megatron-Core's fused attention, as the generator runs it by default
    moe_tokens = tokens // (c.tp if c.sequence_parallel else 1)

    # MoE layers per stage (on average: stages may differ by a leading dense layer).
    moe = model.moe_layers * layers // model.layers

    host_fwd = host_bwd = 0.0
    if model.is_moe:
        ops = moe_layer_ops(
            local_experts=model.experts // c.ep,
            recipe="tensorwise" if c.precision == "fp8" else "bf16",
            tp=c.tp,
            ep=c.ep,
            shared_experts=model.shared_experts,
            expert_bias=model.expert_bias,
            qk_norm=model.qk_norm,
            # DDP's forward pre-hooks: the generator's overlap_param_gather default
            # (generators.megatron_options: the distributed optimizer with replicas).
            param_gather_hooks=c.distributed_optimizer and c.dp * c.cp > 1,
            # gpt-oss's own launches, as the generator counts them by default (YaRN's
            # unfused rotary embedding, the activation's clamps).
            unfused_rope=model.yarn_scale > 1,
            glu_clamp=model.glu_clamp and model.gated,
        )
        host_fwd, host_bwd = moe_layer_host_s(ops, host_op_s)

    def pass_s(forward: bool, layers: int = layers) -> float:
        """One micro-batch's pass over a stage of ``layers`` layers."""
        moe = model.moe_layers * layers // model.layers

        def part(n: int, is_moe: bool) -> dict:
            return pass_work(
                model,
                c.micro_batch,
                tp=c.tp,
                layers=n,
                forward=forward,
                recompute=c.recompute,
                precision=c.precision,
                flash_attention=flash,
                cp=c.cp,
                moe=is_moe,
            )

        parts = [part(n, is_moe) for n, is_moe in ((layers - moe, False), (moe, True)) if n]
        gemms = tuple(Gemm(*g) for w in parts for g in w["gemms"])
        attention = tuple(Attention(*k) for w in parts for k in w.get("attention", []))
        if moe:
            # (the generator's default: random routing's busiest rank, fp8 padding)
            align = FP8_ALIGN[False] if c.precision == "fp8" else 1
            routed = model.expert_gemms(moe_tokens, ep=c.ep, align=align, random_routing=True)
            experts = [g.times(moe) for g in routed]
            if c.precision == "fp8":  # the generator's fp8 grouped GEMMs
                experts = [g.in_bits(8) for g in experts]
            if not forward:
                grads = [grad for g in experts for grad in g.backward()]
                experts = experts + grads if c.recompute == "full" else grads
            gemms += tuple(experts)
        kernels = (layers - moe) * model.layer_elementwise_bytes(
            tokens, tp=c.tp, sequence_parallel=c.sequence_parallel, flash_attention=flash
        )
        if moe:  # the generator's MoE layers' kernels (routed activation, permutations)
            kernels += moe * model.moe_elementwise_bytes(
                tokens,
                tp=c.tp,
                sequence_parallel=c.sequence_parallel,
                flash_attention=flash,
                local_experts=model.experts // c.ep,
            )
        kernels *= 1 if forward else (3 if c.recompute == "full" else 2)
        if moe:  # the generator's fp8 padding copies (alltoall) and experts' biases
            align = FP8_ALIGN[False] if c.precision == "fp8" else 1
            pad = model.expert_padding_bytes(
                tokens, ep=c.ep, tp=c.tp, sequence_parallel=c.sequence_parallel, align=align
            )
            bias_fwd, bias_bwd = model.expert_bias_bytes(
                tokens, tp=c.tp, sequence_parallel=c.sequence_parallel
            )
            again = c.recompute == "full"
            kernels += moe * (
                pad * (1 if forward else 1 + again)
                + (bias_fwd if forward else bias_bwd + again * bias_fwd)
            )
        if c.precision == "fp8":  # the generator's fp8 casts, the same bytes
            # (its defaults: per-tensor current scaling, Hopper's transposes; the
            # candidate's sequence parallelism, under which the gathered norm output is
            # transposed in the backward)
            recipe = {"recipe": "tensorwise", "sequence_parallel": c.sequence_parallel}
            # (an MoE layer's: its experts' casts over the routed copies,
            # Transformer.moe_fp8_cast_bytes)
            for n, cast in ((layers - moe, model.fp8_cast_bytes), (moe, model.moe_fp8_cast_bytes)):
                if not n:
                    continue
                casts = cast(tokens, tp=c.tp, **recipe)
                if not forward:
                    again = casts if c.recompute == "full" else 0.0
                    casts = cast(tokens, tp=c.tp, backward=True, **recipe) + again
                kernels += n * casts
        # The host reading each MoE layer's tokens per expert, once a forward (and its
        # recomputation), as the generator's dispatcher does (HOST_SYNC_S).
        syncs = 1 if forward or c.recompute == "full" else 0
        sync = moe * syncs * HOST_SYNC_S
        # The host launching the MoE layers (the generator's default: counted operations,
        # alltoall, per-tensor fp8, no CUDA graphs), beside the GEMMs: with the
        # synchronisation they cannot end before it.
        launch = host_fwd if forward else host_bwd + (host_fwd if c.recompute == "full" else 0)
        gpu = max(kernels_time(device, gemms, attention) + sync, moe * launch)
        # The GEMMs and the flash core, then the memory-bound kernels: separate kernels.
        return gpu + device.compute_time(0.0, kernels)

    passes = micro + (c.pp - 1) / c.virtual_stages
    # Layers passed over on the critical path: even stages, (m + (p - 1)/v) passes of a
    # stage; uneven ones (never interleaved), the first micro-batch through every stage
    # and back, the m - 1 others at the heaviest stage's pace.
    layer_passes = passes * layers
    compute = passes * (pass_s(True) + pass_s(False))
    if len(set(split)) > 1:
        layer_passes = (micro - 1) * layers + sum(split)
        one = {n: pass_s(True, n) + pass_s(False, n) for n in set(split)}
        compute = (micro - 1) * one[layers] + sum(one[n] for n in split)
    activation = tokens * model.hidden * BF16
    tp_s = 0.0
    if c.tp > 1:
        # 2 all-reduces per layer forward, 2 backward (4 with full recomputation).
        calls = 4 + (2 if c.recompute == "full" else 0)  # per layer pass
        bandwidth = (
            hardware.intra_bandwidth
            if c.tp <= hardware.gpus_per_server
            else hardware.inter_bandwidth
        )
        tp_s = layer_passes * calls * 2 * (c.tp - 1) / c.tp * activation / bandwidth
        if c.sequence_parallel:
            # Megatron-Core overlaps them with the GEMMs (TE's userbuffers, the
            # generator's default with sequence parallelism): only what the compute does
            # not cover shows.
            tp_s = max(0.0, tp_s - compute)
    # Each micro-batch's activation (1/t of it per TP rank) crosses each boundary twice
    # (forward and its gradient backward); the critical path sees it once per pass.
    pp_s = 2 * passes * activation / c.tp / hardware.inter_bandwidth if c.pp > 1 else 0.0
    if c.cp > 1:
        # K/V exchange (an all-gather per layer forward; backward two with full
        # recomputation, and a reduce-scatter), counted whole: it overlaps the
        # attention core, which this estimate does not credit.
        kv = 4 * c.micro_batch * model.seq * model.query_groups * model.head_dim / c.tp
        exchanges = 2 + (2 if c.recompute == "full" else 1)
        cp_bandwidth = (
            hardware.intra_bandwidth
            if c.tp * c.cp <= hardware.gpus_per_server
            else hardware.inter_bandwidth
        )
        tp_s += layer_passes * exchanges * (c.cp - 1) / c.cp * kv / cp_bandwidth
    if moe and c.ep > 1:
        # Dispatch and combine all-to-alls: 2 per MoE layer forward, 2 (4 with full
        # recomputation) backward, each tokens x top_k x h x 2 bytes of which
        # (ep - 1)/ep leave the rank.
        a2a = moe * moe_tokens * model.top_k * (model.capacity_factor or 1.0) * model.hidden * 2
        ep_bandwidth = (
            hardware.intra_bandwidth
            if c.tp * c.cp * c.ep <= hardware.gpus_per_server
            else hardware.inter_bandwidth
        )
        exchanges = 4 + (2 if c.recompute == "full" else 0)
        tp_s += passes * exchanges * (c.ep - 1) / c.ep * a2a / ep_bandwidth
    # Parameters a rank holds: the layers' (an MoE layer's attention, shared experts and
    # router) split over TP, the embedding, and experts / ep whole routed experts.
    all_experts = (3 if model.gated else 2) * model.hidden * model.expert_ffn * model.experts
    params = (layers - moe) * model.layer_params / c.tp + model.vocab * model.hidden / c.tp
    params += moe * (model.moe_layer_params - all_experts) / c.tp if moe else 0.0
    experts = moe * all_experts / c.ep if moe else 0.0
    replicas = c.dp * c.cp
    dp_s = 0.0
    if replicas > 1:
        dp_bandwidth = (
            hardware.intra_bandwidth
            if c.tp * replicas <= hardware.gpus_per_server
            else hardware.inter_bandwidth
        )
        # Gradients reduced in fp32 (Megatron-LM's default in bf16): an all-reduce moves
        # 2 (r - 1)/r of them; the distributed optimizer's reduce-scatter (r - 1)/r, and
        # its all-gather (r - 1)/r of the bf16 parameters.
        grad = GRAD_REDUCE["fp32"][0]
        moved = (grad + BF16) if c.distributed_optimizer else 2 * grad
        dp_s = (replicas - 1) / replicas * params * moved / dp_bandwidth
        expert_replicas = replicas // c.ep
        if experts and expert_replicas > 1:
            dp_s += (expert_replicas - 1) / expert_replicas * experts * moved / dp_bandwidth
        elif c.distributed_optimizer and not moe:
            # Megatron-Core overlaps the reduce-scatter with the last backward and the
            # parameter all-gather with the first forward, bucket by bucket (the
            # generator's default): what one backward and one forward pass do not
            # cover shows, and at least one bucket's share.
            # (Megatron sizes buckets by the DP size without CP: the generator's default.)
            buckets = max(1, round(params / max(40e6, 1e6 * c.dp)))
            window = pass_s(True) + pass_s(False)
            dp_s = max(dp_s - window, dp_s / buckets)
    shard = replicas if c.distributed_optimizer else 1
    optimizer = params * 16 / shard + experts * 16 / max(1, shard // c.ep)
    if c.fsdp and replicas > 1:
        # FSDP: the layers sharded, the embedding whole. Each pass gathers its chunk's
        # weights a pass ahead and each backward scatters their gradients: exposed are
        # the first gather, the last scatter, the embedding's all-reduce, and whatever
        # of each pass's traffic its compute does not cover.
        embedding = model.vocab * model.hidden / c.tp
        layer_params = params - embedding
        optimizer = (layer_params / replicas + embedding) * 16
        share = (replicas - 1) / replicas
        # A chunk's weights gathered in bf16, its gradients scattered in fp32.
        gather = layer_params / c.virtual_stages * BF16 * share / dp_bandwidth
        scatter = gather / BF16 * grad
        per_pass = (pass_s(True) + pass_s(False)) / c.virtual_stages / 2
        traffic = 0.75 * (gather + scatter)  # a pass's share: gathers each, scatters back
        hidden_misses = max(0.0, traffic - per_pass) * 2 * passes * c.virtual_stages
        dp_s = gather + scatter + 2 * share * embedding * grad / dp_bandwidth + hidden_misses
    return Estimate(
        candidate=c,
        memory=memory_of(model, c, global_batch),
        compute_s=compute,
        tp_s=tp_s,
        pp_s=pp_s,
        dp_s=dp_s,
        optimizer_s=optimizer / device.stream_bandwidth,
    )
