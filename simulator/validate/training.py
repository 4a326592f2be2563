"""Training steps against published runs: what ccsim predicts for a configuration someone
ran and measured, and how far off it is.

The runs are data, ``simulator/data/training/published-runs.yaml``: each with its source,
its model, GPUs, parallel sizes, batch, precision, the settings its source states and
what it measured (seconds per step, tokens per second per GPU or model TFLOP/s per GPU,
read into seconds per step as :func:`measured_step` says). :func:`load_runs` reads them
into :class:`TrainingRun`; :func:`simulate_run` builds the step with the ``megatron``
generator (Megatron-Core's defaults for whatever the source does not state) and replays
it on the GPU's preset as NCCL runs its collectives (GB200: on NVL72 racks holding the
GPUs NVIDIA's launcher places there, :func:`nvl72_racks`).

Every run has a ``use``: ``calibration`` where it set a constant of ccsim's compute model
(:data:`CALIBRATION_SOURCES`; the constant cites it), ``held-out`` where nothing was set
from it. Errors are reported for the two apart; only held-out errors are predictions.
Mixture-of-experts runs are built with their experts, expert parallelism and (DeepSeek-V3)
multi-head latent attention as their data gives them; what ccsim cannot build yet
(hybrid Mamba models, fine-tuning, FP4) is listed as skipped with the reason.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CcsimError
from ..files import load_data
from ..library.nccl_env import CHANNEL_VARIABLES, CommConfig, parse_nccl_env
from ..workload.communicators import parse_communicators
from ..workload.host import GRAPH_SCOPES, host_op_s_for
from ..workload.model import MODELS, Transformer

if TYPE_CHECKING:
    import networkx as nx

#: The bundled published runs.
PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "training" / "published-runs.yaml"

#: Sources whose runs set a constant of the compute model (see
#: :mod:`simulator.workload.devices`): their errors are in-sample, not predictions. A run
#: of another source that set one says so itself (``use: calibration``).
CALIBRATION_SOURCES = ("megatron-lm-readme",)

#: The preset each GPU of the runs trains on: 8 GPUs a server (H100, H200, B200) or an
#: NVL72 rack, 72 GPUs in one NVLink domain (GB200; :func:`nvl72_racks` says how many of
#: them a run is given), one 400G NIC per GPU. H200 (MLPerf Training v5.0's Nebius rows,
#: 8x H200-SXM-141GB a node, its systems/nebius_soperator_8xH200_n64_ngc25.01_nemo.json)
#: trains on the bundled HGX H200 preset and ccsim's H200 device (H100's compute,
#: 141 GB at 4.8 TB/s: simulator.workload.devices); nothing was set from its rows.
PRESETS = {"H100": "dgx-h100", "H200": "hgx-h200", "B200": "hgx-b200", "GB200": "gb200-nvl72"}

#: GPUs per GB200 compute tray (NVIDIA DGX GB200 user guide: two Grace CPUs and four
#: Blackwell GPUs a tray) and trays per NVL72 rack (18: 72 GPUs).
TRAY_GPUS = 4
RACK_TRAYS = 18

#: Replay every row with communication holding its CTAs' SMs (one per NCCL channel,
#: src/enqueue.cc line 1553 at v2.28.3-1) from the rank's overlapping compute
#: (``run_workload(sm_contention=True)``; issue 31, h54a). Off: only the rows whose job
#: pins NCCL's CTA floor (``NCCL_MIN_CTAS`` in their ``nccl`` field, which replaces every
#: communicator's minCTAs: src/init.cc envConfigOverride) replay so, their calls' SM
#: footprint being their configuration's; elsewhere NCCL's own CTA count depends on what
#: ccsim does not model (buffer registration, symmetric and copy-engine collectives), and
#: on a 21-row sample of other rows the switch was mixed by family (median |error| 4.89%
#: -> 2.88%: Nemotron-4 15B 3-4 points closer, but the Bridge Llama 3 70B FSDP, Qwen3 30B
#: and DGX Cloud 405B fp8 rows 1.6-4.8 points further): on for all, it waits for a full
#: validation.
SM_CONTENTION = False

#: Vocabulary where a source leaves it out: NeMo's GPT-3 runs pad GPT-2's 50,257 to
#: 51,200 (their printed TFLOP/s imply it); Nemotron-4 has 256,000 (Nemotron-4 340B
#: technical report, arXiv 2406.11704, table 1).
VOCAB = {"gpt3": 51200, "nemotron4": 256000, "nemotron3": 256000}


@dataclass(frozen=True)
class TrainingRun:
    """One published training run, as ccsim builds it."""

    id: str
    source: str
    kind: str
    gpu: str
    gpus: int
    precision: str
    model: Transformer
    tp: int
    pp: int
    cp: int
    vp: int
    micro_batch: int
    global_batch: int
    #: The generator options the source states (recompute, sequence_parallel, ...).
    options: Mapping[str, Any] = field(default_factory=dict)
    measured_step_s: float = 0.0
    #: How the measured step was read (printed, or from throughput).
    measured_how: str = ""
    use: str = "held-out"
    assumed: str = ""
    #: Expert-parallel ranks (mixture-of-experts runs).
    ep: int = 1
    #: Expert-tensor-parallel ranks (the row's ``etp``; 1 where it states none).
    etp: int = 1
    #: The NCCL channel bounds the run exports (the row's ``nccl``: NCCL_MIN_CTAS, ...),
    #: as NCCL's settings text; "" where the row gives none.
    nccl: str = ""
    #: NCCL's configuration per Megatron-Core process group (the row's
    #: ``nccl_communicators``: its ``--nccl-communicator-config-path`` YAML).
    communicators: Mapping[str, CommConfig] = field(default_factory=dict)

    @property
    def dp(self) -> int:
        """Data-parallel size: the GPUs over TP x PP x CP."""
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def label(self) -> str:
        """A short description of the configuration."""
        vp = f" VP{self.vp}" if self.vp > 1 else ""
        cp = f" CP{self.cp}" if self.cp > 1 else ""
        cp += f" EP{self.ep}" if self.ep > 1 else ""
        return (
            f"TP{self.tp} PP{self.pp}{vp}{cp} DP{self.dp} mb{self.micro_batch} "
            f"gbs{self.global_batch}"
        )


@dataclass(frozen=True)
class TrainingResult:
    """A run and what ccsim predicts for it (``error`` is predicted / measured - 1 of the
    step time), or why it was skipped."""

    run: TrainingRun
    step_s: float | None = None
    skipped: str = ""
    wall_s: float = 0.0
    memory_gb: float | None = None
    fits: bool | None = None

    @property
    def error(self) -> float | None:
        """Relative error of the step time (positive: ccsim is slower than measured)."""
        if self.step_s is None:
            return None
        return self.step_s / self.run.measured_step_s - 1.0


def measured_step(entry: Mapping[str, Any], model: Transformer) -> tuple[float, str]:
    """Seconds per step of a run's measurement: as printed, else global batch x sequence
    over tokens per second per GPU x GPUs, else the model FLOPs of a step over model
    TFLOP/s per GPU x GPUs, with the FLOPs counted as the source does (``flops``:
    "causal" halves the attention scores' term, as Megatron-Bridge's flop_utils does;
    otherwise Megatron-LM's full count)."""
    measured = entry.get("measured") or {}
    gbs, seq, gpus = entry["global_batch"], model.seq, entry["gpus"]
    if measured.get("step_time_s"):
        return float(measured["step_time_s"]), "step time as printed"
    derived = (entry.get("derived") or {}).get("step_time_s_from_block_timestamps")
    if isinstance(derived, Mapping):
        derived = derived.get("value")
    if derived:
        return float(derived), "step time from the log's timestamps"
    if measured.get("tokens_per_s_per_gpu"):
        tokens = float(measured["tokens_per_s_per_gpu"])
        return gbs * seq / (tokens * gpus), "from tokens/s per GPU"
    if measured.get("model_tflops_per_gpu"):
        causal = entry.get("flops") == "causal"
        flops = model.step_flops(gbs, recompute=False, causal=causal)
        tflops = float(measured["model_tflops_per_gpu"])
        return flops / (tflops * 1e12 * gpus), (
            f"from model TFLOP/s per GPU ({'causal' if causal else 'full'} attention count)"
        )
    raise CcsimError(f"published run {entry.get('id')}: no step time, tokens/s or TFLOP/s")


#: A model's features the data file's rows do not carry, taken from the bundled model
#: file of the same name (workloads/models/: gpt-oss-120b.yaml's sliding windows and
#: clamped activation, from Megatron-Bridge's gpt-oss provider; the Qwen3 MoE files'
#: query/key norms, from its Qwen3 MoE bridge); other models' files leave them at their
#: defaults (none).
BUNDLED_FEATURES = ("window", "full_attention_every", "glu_clamp", "yarn_scale", "qk_norm")
#: The first release whose Megatron-Core runs a YaRN model's rotary embedding unfused
#: (core_v0.16.0's rope_utils.py, "Fixes for gpt-oss (#2038)", 2025-11-22; NeMo 26.02
#: ships main:0.16.0, 25.11 dev:0.15.0, whose fused path ignores the concentration
#: factor: docs/releases/software-versions.md of Megatron-Bridge v0.6.0).
YARN_UNFUSED_FROM = (26, 2)


def _model(entry: Mapping[str, Any]) -> Transformer | str:
    """The run's transformer, or why ccsim cannot build it."""
    data = entry.get("model") or {}
    if data.get("mamba") or str(data.get("name", "")).startswith("nemotronh"):
        return "hybrid Mamba models are not modelled"
    moe = _moe_fields(entry) if entry.get("moe") else {}
    if isinstance(moe, str):
        return moe
    for key in ("layers", "hidden", "seq", "heads"):
        if not data.get(key):
            return f"the model's {key} is not known"
    name = str(data.get("name", ""))
    vocab = data.get("vocab") or next((v for k, v in VOCAB.items() if name.startswith(k)), 0)
    if not vocab:
        return "the model's vocabulary is not known"
    head = data.get("head_dim") or 0
    # Dropout: Megatron-LM's own runs keep its default (0.1); the NeMo, Megatron-Bridge,
    # MLPerf and Llama 3 recipes train with 0 (their model configs), unless the row says.
    dropout = data.get("dropout")
    if not isinstance(dropout, bool):
        dropout = entry.get("source_kind") == "megatron-lm-readme"
    fields: dict[str, Any] = dict(
        dropout=dropout,
        layers=int(data["layers"]),
        hidden=int(data["hidden"]),
        seq=int(data["seq"]),
        vocab=int(vocab),
        ffn=int(data.get("ffn") or 0),
        gated=bool(data.get("swiglu")),
        heads=int(data["heads"]),
        kv_heads=int(data.get("kv_heads") or 0),
        head_size=int(head) if head and head != data["hidden"] // data["heads"] else 0,
        tied_embeddings=bool(data.get("tied")),
        name=name,
    )
    fields.update(moe)
    bundled = MODELS.get(name)
    if bundled is not None:
        fields.update({key: getattr(bundled, key) for key in BUNDLED_FEATURES})
    if _mtp_layers(entry):
        fields["layers"] += _mtp_layers(entry)
    return Transformer(**fields)


def _mtp_layers(entry: Mapping[str, Any]) -> int:
    """Multi-token prediction layers a run trains: the row's ``settings.mtp_layers`` where
    its source or recipe states it (Megatron-Bridge 25.11's GB200 DeepSeek-V3 rows are
    labelled "(w/o MTP)": 0; DGX Cloud v25.05.04's DeepSeek-V3 runs build NeMo's
    ``pretrain_recipe()``, whose ``use_mtp`` defaults to True: 1); else Megatron-Bridge's
    DeepSeek-V3 recipes run one (src/megatron/bridge/recipes/deepseek/h100/
    deepseek_v3.py: ``mtp_num_layers`` 1, its layouts end with "mtp" and "loss"; the data
    file's pp_layout "...tmL"); else none. It is built as one more MoE layer at the end
    of the last stage (its own projection, norms and second output head and loss are
    left out)."""
    stated = _count_setting(entry, "mtp_layers", least=0)
    if stated is not None:
        return stated
    data = entry.get("model") or {}
    if entry.get("source_kind") != "megatron-bridge-performance-summary":
        return 0
    return int(data.get("mtp_layers_default") or 0)


def _count_setting(entry: Mapping[str, Any], key: str, least: int) -> int | None:
    """A row's whole-number setting ``key`` (at least ``least``), or None where the row
    does not state it; anything else is a one-line error naming the row and the field."""
    value = (entry.get("settings") or {}).get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise CcsimError(
            f"published run {entry.get('id')}: settings.{key} must be a whole number "
            f"of at least {least}, not {value!r}"
        )
    return value


#: DeepSeek-V3's pipeline layouts, (PP, VP) -> decoder layers of the first and of the
#: last virtual stage, every other one holding the rest evenly: NeMo's performance script
#: (scripts/performance/llm/pretrain_deepseek_v3.py, map_pp_vp_to_layout) and
#: Megatron-Bridge's recipe (_get_deepseek_v3_pipeline_layout) alike, e.g. (16, 1):
#: embedding + 4, 14 x 4, 1 + (MTP) + loss.
DEEPSEEK_V3_LAYOUT = {(4, 1): (16, 13), (8, 1): (8, 5), (4, 2): (8, 5), (16, 1): (4, 1),
                      (8, 2): (4, 1), (4, 4): (4, 1)}  # fmt: skip


def _layout(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The uneven pipeline split a run's recipe sets where its layers do not divide: the
    row's own first and last stage layers (:func:`_stated_ends`), else DeepSeek-V3's
    layouts (:data:`DEEPSEEK_V3_LAYOUT`), the MTP layer on the last stage, as first and
    last stage layers without interleaving. With interleaving the
    generator splits chunks evenly but for the end chunks (``generator_options``)."""
    data = entry.get("model") or {}
    pp, vp = int(entry.get("pp") or 1), int(entry.get("vp") or 1)
    ends = _stated_ends(entry, pp, vp)
    if ends is None:
        ends = DEEPSEEK_V3_LAYOUT.get((pp, vp))
        if data.get("name") != "deepseek-v3" or ends is None or vp > 1:
            return {}
    return {"first_stage_layers": ends[0], "last_stage_layers": ends[1] + _mtp_layers(entry)}


def _stated_ends(entry: Mapping[str, Any], pp: int, vp: int) -> tuple[int, int] | None:
    """The decoder layers of the first and last pipeline stage a row's recipe sets
    (``settings.first_stage_layers`` and ``last_stage_layers``: Megatron-Core's
    ``num_layers_in_first_pipeline_stage`` and ``num_layers_in_last_pipeline_stage``,
    the MTP layer not counted), or None where it states neither. Both together, without
    interleaving, with the middle stages' layers splitting evenly, as Megatron-Core
    asserts (megatron/core/transformer/transformer_block.py lines 61-88 at 7094270,
    get_num_layers_to_build)."""
    first = _count_setting(entry, "first_stage_layers", least=1)
    last = _count_setting(entry, "last_stage_layers", least=1)
    if first is None and last is None:
        return None
    where = f"published run {entry.get('id')}: settings.first_stage_layers / last_stage_layers"
    if first is None or last is None:
        raise CcsimError(f"{where}: give both (the first and the last stage's layers)")
    if vp > 1 or pp < 2:
        raise CcsimError(f"{where}: only for pipelining without interleaving (pp > 1, vp 1)")
    middle = int((entry.get("model") or {}).get("layers") or 0) - first - last
    if middle < 0 or (pp > 2 and middle % (pp - 2)) or (pp == 2 and middle):
        raise CcsimError(
            f"{where}: {first} and {last} leave {middle} layers, which do not split "
            f"evenly over the {pp - 2} middle stages"
        )
    return first, last


#: What ccsim builds for every mixture-of-experts run where its data says nothing else.
#: Megatron-Core's own defaults (megatron/core/transformer/transformer_config.py) are the
#: all-gather dispatcher, no grouped GEMM, no permute fusion, no capacity factor
#: (dropless) and the aux-loss router; every published run here sets the all-to-all
#: dispatcher or a flex one (DeepEP, HybridEP: NeMo's scripts/performance/llm/
#: pretrain_deepseek_v3.py on H100, Megatron-Bridge's MoE recipes), grouped GEMM, permute
#: fusion and forced load balancing (the tables' footnote), which ccsim builds.
MOE_ASSUMED = (
    " | ccsim (MoE): the row's dispatcher (alltoall where unstated; DeepEP/HybridEP sending "
    "a token once to each rank and RDMA domain holding one of its experts), one host "
    "synchronisation per MoE layer forward (none with full-step CUDA graphs or token drop), "
    "the all-to-all beside another micro-batch's pass where the row sets moe_ep_a2a_overlap "
    "(whole passes side by side, not layer by layer), TE grouped GEMM, "
    "dropless and balanced routing (rows dropping tokens: every expert at its capacity), "
    "expert TP as the row states it (1 where it does not)"
)


def _moe_options(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A mixture-of-experts run's dispatcher options for the generator: the row's
    ``moe_dispatcher`` where it states one; else alltoall, what Megatron-Bridge's
    performance scripts set without a flex backend (scripts/performance/utils/
    overrides.py: ``moe_token_dispatcher_type = "alltoall"``) and what DGX Cloud
    v25.05.04's DeepSeek-V3 runs state (NeMo 7a8f1cc's pretrain_deepseek_v3.py).
    A full-step CUDA graph (``cuda_graphs`` "full_iteration") cannot synchronise with
    the host inside it: those rows run static shapes (HybridEP's rank capacity); neither
    do the rows that drop tokens and pad the experts to their capacity (``moe_token_drop``
    true, or labelled "(tokendrop)" by their source). The host's time
    per launched operation is that of the GPU's host CPU (an x86 DGX or a Grace
    superchip, :func:`~simulator.workload.host.host_op_s_for`)."""
    settings = entry.get("settings") or {}
    stated = str(settings.get("moe_dispatcher") or "").lower()
    gpu = str(entry.get("gpu", "")).split("-")[0]
    options: dict[str, Any] = {"moe_dispatcher": "alltoall"}
    if gpu:
        # The host's time per launched operation is its CPU's (an x86 DGX or a Grace
        # superchip: workload/host.py, HOST_OP_S_BY_CPU, Transformer Engine issue #2053).
        options["host_op_s"] = host_op_s_for(gpu)
    if stated in ("alltoall", "deepep", "hybridep"):
        options["moe_dispatcher"] = stated
    token_drop = settings.get("moe_token_drop")
    if token_drop is not None and not isinstance(token_drop, bool):
        raise CcsimError(
            f"published run {entry.get('id')}: settings.moe_token_drop must be true "
            f"(capacity factor 1, experts padded to capacity) or false, not {token_drop!r}"
        )
    graphs = _cuda_graphs(settings)
    if graphs:
        options["cuda_graphs"] = graphs
    if "full_iteration" in graphs:
        options["moe_host_sync"] = False
    if token_drop or "(tokendrop)" in str(entry.get("raw_row") or ""):
        # Token drop with the experts padded to their capacity (NeMo's
        # MegatronTokenDropCallback and Megatron-Bridge's apply_moe_token_drop: capacity
        # factor 1.0, moe_pad_expert_input_to_capacity True; Megatron-Bridge 25.09's table
        # labels such rows "(tokendrop)"): static shapes, nothing for the host to read,
        # and every expert computes exactly its capacity, the mean (no busiest rank).
        options["moe_host_sync"] = False
        options["moe_routing"] = "even"
    if settings.get("moe_ep_a2a_overlap") is True:
        options["moe_a2a_overlap"] = True
    if settings.get("cutedsl_fused_grouped_mlp") is True:
        # Megatron-Bridge's preset turns on Transformer Engine's fused grouped MLP
        # (scripts/performance/utils/overrides.py at v0.5.0: use_transformer_engine_op_fuser;
        # perf_plugins.py: NVTE_CUTEDSL_FUSED_GROUPED_MLP=1).
        options["moe_fused_grouped_mlp"] = True
    return options


def _cuda_graphs(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The CUDA-graph scopes a run's ``cuda_graphs`` setting captures that ccsim's host
    model knows (:data:`~simulator.workload.host.GRAPH_SCOPES`): Megatron-Bridge prints
    it as ``"<impl> scope=[...]"``, e.g. "transformer_engine scope=['attn',
    'moe_router', 'moe_preprocess']" (TE's per-layer graphs) or "full_iteration
    scope=[]" (Megatron-Core's whole-step graph); "none" captures nothing. Scopes of
    layers ccsim does not build (mamba) are dropped.

    >>> _cuda_graphs({"cuda_graphs": "transformer_engine scope=['attn', 'mamba']"})
    ('attn',)
    >>> _cuda_graphs({"cuda_graphs": "full_iteration scope=[]"})
    ('full_iteration',)
    """
    text = str(settings.get("cuda_graphs") or "")
    return tuple(scope for scope in GRAPH_SCOPES if re.search(rf"\b{scope}\b", text))


def _moe_fields(entry: Mapping[str, Any]) -> dict[str, Any] | str:
    """A mixture-of-experts run's expert fields of :class:`Transformer` from its
    ``moe_arch``, or why ccsim cannot build it. Every run here is token-dropless
    (capacity factor 0: Megatron-Core's default ``moe_expert_capacity_factor`` None,
    megatron/core/transformer/transformer_config.py; the Megatron-Bridge table's footnote
    says "all token-dropless"); one shared expert of ``shared_ffn`` where the model has
    one (DeepSeek-V3's ``moe_shared_expert_intermediate_size`` 2048 = 1 x 2048); the
    first ``dense_layers`` layers dense, as DeepSeek-V3's ``moe_layer_freq`` [0]*3 +
    [1]*58 says. Multi-head latent attention (DeepSeek-V3) is read from ``mla``."""
    data = entry.get("model") or {}
    arch = data.get("moe_arch") or {}
    if not arch.get("experts") or not arch.get("topk"):
        return "the model's experts are not known"
    moe_ffn = int(arch.get("moe_ffn") or 0)
    shared = int(arch.get("shared_ffn") or 0)
    if shared and (not moe_ffn or shared % moe_ffn):
        return f"a shared expert of {shared} over experts of {moe_ffn} is not modelled"
    fields: dict[str, Any] = {
        "experts": int(arch["experts"]),
        "top_k": int(arch["topk"]),
        "moe_ffn": moe_ffn,
        "shared_experts": shared // moe_ffn if shared else 0,
        "dense_layers": int(arch.get("dense_layers") or 0),
        # gpt-oss's linear layers have biases (Megatron-Bridge's resolved gpt-oss 120B
        # performance config: ``add_bias_linear: true``, scripts/performance/
        # dryrun_configs/gpt_oss/gpt_oss_120b_pretrain_b200_fp8_mx_v1.yaml, a9497c6)
        "expert_bias": str(data.get("name", "")).startswith("gpt-oss"),
    }
    mla = data.get("mla")
    if isinstance(mla, Mapping):
        fields.update(
            q_lora_rank=int(mla.get("q_lora_rank") or 0),
            kv_lora_rank=int(mla["kv_lora_rank"]),
            qk_rope_dim=int(mla.get("qk_rope_dim") or 0),
            v_head_dim=int(mla.get("v_head_dim") or 0),
            head_size=int(mla.get("qk_head_dim") or 0),
        )
    return fields


#: Settings of a run's ``settings`` mapping that ccsim's generator takes, with the
#: values it reads.
_SETTINGS = {
    "recompute": "recompute",
    "sequence_parallel": "sequence_parallel",
    "tp_comm_overlap": "tp_comm_overlap",
    "overlap_grad_reduce": "overlap_grad_reduce",
    "overlap_param_gather": "overlap_param_gather",
    "distributed_optimizer": "distributed_optimizer",
    "fp8_params": "fp8_param_gather",
    "optimizer_state": "optimizer_state",
    "attention_backend": "attention_backend",
    "lazy_gradients": "lazy_gradients",
    # Megatron-Core's --cp-comm-type (p2p, all_gather, a2a), where a run's source states
    # how its context parallelism exchanges K and V.
    "cp_comm_type": "cp_comm_type",
}


#: Passes over the DDP's gradient buffer (:data:`~simulator.workload.generators.
#: GRAD_BUFFER_PASSES`) by source, where they are turned on. Megatron-LM's own runs
#: (Megatron-Core r0.8.0) make all three (zero every step; before each bucket's
#: reduction the NaN check's norm, on by default for bf16, and the 1 / dp scaling,
#: ``--ddp-average-in-collective`` off), but they are NOT turned on (session h53d,
#: issue 31): on those calibration rows alone they move H100's fitted bf16 fraction
#: from 0.6425 to 0.655 without improving the fit (in-sample median 3.72% -> 3.74%,
#: leave-one-row-out 4.64% -> 4.63%), and that fraction makes the 14 held-out H100 bf16
#: rows 1.7-2.0 points faster, 12 of them further from their measurements, while the
#: held-out stacks most likely run the same passes (zeroing is Megatron-Core DDP's every
#: step; NeMo 2's bf16_ddp_config sets check_for_nan_in_grad=True) but have not been
#: read. Turn them on per source once each stack's DDP configuration is read, then refit.
GRAD_BUFFER_PASSES_BY_SOURCE: dict[str, tuple[str, ...]] = {}

#: Sources whose recipes reduce gradients in bf16 where their rows do not say:
#: Megatron-Bridge's performance scripts (scripts/performance/utils/helpers.py,
#: set_basic_perf_overrides: mixed_precision.grad_reduce_in_fp32 = False and
#: ddp.grad_reduce_in_fp32 = False) ...
BF16_GRADIENTS = (
    "megatron-bridge-performance-summary",
    # NVIDIA's MLPerf GPT-3 submissions (v3.0-v4.1), all on Apex's distributed_fused_adam
    # (USE_DIST_OPTIMIZER=True) with grad_sync_dtype: bf16 (training_results_v3.0
    # NVIDIA/benchmarks/gpt3/implementations/pytorch/conf/megatron_gpt_config.yaml line 228;
    # v3.1 .../pytorch/conf/optim/distributed_fused_adam.yaml line 6; v4.0 and v4.1
    # .../nemo/conf/optim/distributed_fused_adam.yaml line 8, as in b200_n8_preview_nemo).
    "mlperf-training",
)
#: ... and, for fp8 runs only, NeMo 2.0's (scripts/performance/llm/pretrain_*.py: with
#: compute_dtype fp8, bf16_with_fp8_mixed() and grad_reduce_in_fp32 = False), which DGX
#: Cloud's benchmarks and NeMo's performance tables run; their bf16 runs keep NeMo's
#: bf16_mixed() default, fp32.
BF16_GRADIENTS_FP8 = (
    "nvidia-dgxc-benchmarking",
    "nemo-performance-summary",
    "nemo-long-sequence-performance",
)
#: ... and for every precision from DGX Cloud's v25.05 benchmarks on (container
#: nemo:25.04.01, NeMo checked out at 6f2c6fd: dgxc-benchmarking@1f6d9f40e411,
#: llama3.1/setup.sh line 54), whose performance scripts build each model with
#: ``pretrain_recipe(performance_mode=True)`` (scripts/performance/llm/pretrain_*.py, e.g.
#: pretrain_llama31_405b.py line 65), and whose ``pretrain_performance_optimizations``
#: set ``recipe.trainer.plugins.grad_reduce_in_fp32 = False`` (recipes/llama31_405b.py
#: line 253, llama3_70b.py 246, llama3_8b.py 242, nemotron4_15b.py 222,
#: nemotron4_340b.py 226, deepseek_v3.py 160, gpt3_175b.py 244).
#: Grok-1's script builds another recipe, not read: it keeps the rule above.
BF16_GRADIENTS_FROM = {"nvidia-dgxc-benchmarking": (25, 4)}
#: DGX Cloud's earlier benchmarks (v25.01, dgxc-benchmarking@143b90dd91f9: containers
#: before 25.04) ran NeMo 1's hydra configs, which reduce gradients in bf16 in both
#: precisions too (Apex's distributed_fused_adam with ``optim.grad_sync_dtype: bf16``:
#: nemo_megatron/gpt3_175b_hydra.yaml line 155, llama3.1/llama3.1_8b.yaml 157,
#: llama3.1_70b.yaml 161, llama3.1_405b.yaml 164, nemotron/nemotron4-15b-synth.yaml 193,
#: nemotron4-340b-synth.yaml 185). GPT-3 175B's and Nemotron-4's keep their weights in
#: fp8 when they run in fp8 (``model.fp8_params: true``, gpt3_175b_hydra.yaml line 221;
#: ``+model.fp8_params=${FP8_ENABLED}``, nemotron/configure.sh line 109), and the launchers of
#: GPT-3 175B and Nemotron-4 340B turn cuDNN's fused attention off
#: (``NVTE_FUSED_ATTN=0``: nemo_megatron/configure.sh line 31, nemotron/configure.sh line
#: 70 for 340b; Llama 3.1's and Nemotron-4 15B's set it to 1), so Transformer Engine runs
#: FlashAttention-2's kernels.
DGXC_HYDRA_BEFORE = (25, 4)
DGXC_HYDRA_FP8_PARAMS = (
    "gpt3-175b",
    "nemotron4-15b",
    "nemotron4-340b",
    # llama3.1/configure.sh line 122: ``+model.fp8_params=$FP8_ENABLED``.
    "llama31-8b",
    "llama31-70b",
    "llama31-405b",
)
#: The hydra configs that fuse the loss (``cross_entropy_loss_fusion: true``:
#: llama3.1/llama3.1_8b.yaml line 86, llama3.1_70b.yaml 101, llama3.1_405b.yaml 107,
#: nemotron/nemotron4-15b-synth.yaml 122, nemotron4-340b-synth.yaml 216).
#: nemo_megatron/gpt3_175b_hydra.yaml does not set it, and NeMo copies only the keys a
#: config has, so GPT-3 175B ran Megatron-Core's default, unfused (its launcher pulls
#: nemo:24.05, nemo_megatron/launch.sh lines 39-41, though the table's title says 24.11).
DGXC_HYDRA_FUSED_LOSS = (
    "llama31-8b",
    "llama31-70b",
    "llama31-405b",
    "nemotron4-15b",
    "nemotron4-340b",
)
#: DGX Cloud's benchmarks from v25.05 (NeMo 2's performance scripts, NeMo at 6f2c6fd
#: and b4148d2) run fp8 with the scripts' default recipe "ds", bf16_with_fp8_mixed()
#: (scripts/performance/utils.py lines 426-430 at b4148d2), which keeps the weights in
#: fp8 (``cfg.fp8_param_gather = True``, nemo/collections/llm/recipes/precision/
#: mixed_precision.py line 70 at both commits; since NeMo 9d4e41e, 2025-04-10). Grok-1's
#: script builds another recipe, not read.
DGXC_NEMO2_FP8_PARAMS_FROM = (25, 4)
DGXC_HYDRA_FLASH2 = ("gpt3-175b", "nemotron4-340b")
#: DGX Cloud v25.01's hydra configs run Apex's DistributedFusedAdam
#: (``optim.name: distributed_fused_adam``, which NeMo 1 does not hand to Megatron-Core's
#: distributed optimizer: megatron_base_model.py line 148 at NeMo r2.0.0) with
#: overlapped gradient and parameter syncs and these ``bucket_cap_mb``
#: (dgxc-benchmarking@143b90dd91f9: nemo_megatron/gpt3_175b_hydra.yaml line 140,
#: llama3.1/llama3.1_8b.yaml 147, llama3.1_70b.yaml 151, llama3.1_405b.yaml 154,
#: nemotron/nemotron4-15b-synth.yaml 178, nemotron4-340b-synth.yaml 184; no launcher
#: overrides them): ``megatron(apex_bucket_mib=...)``.
DGXC_HYDRA_APEX_BUCKET_MIB = {
    "gpt3-175b": 220,
    "llama31-8b": 75,
    "llama31-70b": 75,
    "llama31-405b": 125,
    "nemotron4-15b": 100,
    "nemotron4-340b": 50,
}


#: Sources whose fp8 runs scale by delayed scaling on Transformer Engine 1.6 or later,
#: which reduces the amaxes of every fp8 module registered on a rank at each
#: ``fp8_autocast`` exit and after each pass's backward, in a blocking all-reduce
#: (``async_op=False``: the compute stream waits) over the group Megatron-Core hands it,
#: the stage's TP x DP x CP ranks (TE v1.6 and v1.10 transformer_engine/pytorch/fp8.py,
#: ``fp8_autocast_exit`` -> ``reduce_and_update_fp8_tensors``, lines 415-422 at v1.6;
#: v2.2 lines 439-448). Up to TE 1.5 the reduction was asynchronous and, with
#: ``NVTE_DP_AMAX_REDUCE_INTERVAL=0``, over the TP group only (fp8.py lines 357-361 at
#: v1.5), which is what DGX Cloud's launchers still set
#: (dgxc-benchmarking@143b90dd91f9 nemo_megatron/configure.sh lines 29-30,
#: llama3.1/configure.sh ``NVTE_DP_AMAX_REDUCE_INTERVAL=0``, ``NVTE_ASYNC_AMAX_REDUCTION=1``):
#: variables TE 1.6 no longer reads. The containers: NeMo 24.05 ships TE 1.6.0.dev0,
#: 24.07 1.8.0.dev0, 24.09 1.10 (NeMo Framework user guide 24.09, "Software Component
#: Versions"); 25.04 TE 2.x. NVIDIA's MLPerf submissions set their own amax handling
#: (v3.1 and v4.0 reduce asynchronously and not over DP) and the long-sequence table's
#: recipes were not read: they keep none.
AMAX_STAGE_SOURCES_READ = ("nvidia-dgxc-benchmarking", "nemo-performance-summary")
#: The sources whose delayed-scaling rows validate runs with that all-reduce: none by
#: default. Applied to all of :data:`AMAX_STAGE_SOURCES_READ`'s (63 rows, each call a
#: wait of its time alone, :func:`amax_seconds`) it moves them by +0.0 to +1.9 points
#: (44 closer, 19 further: the rows already slower than measured get slower), and the
#: held-out median |error| from 4.84% to 4.90% (two rows cross it upward, none down;
#: issue 31, session 2026-11-28, h52h), which the issue's rule does not allow: set it
#: to AMAX_STAGE_SOURCES_READ once the rows' other misses are found.
AMAX_STAGE_SOURCES: tuple[str, ...] = ()


def _dgxc_hydra(entry: Mapping[str, Any]) -> bool:
    """Whether a run is one of DGX Cloud's v25.01 benchmarks (NeMo 1's hydra configs)."""
    return (
        entry.get("source_kind") == "nvidia-dgxc-benchmarking"
        and _release(entry) < DGXC_HYDRA_BEFORE
    )


BF16_GRADIENT_RECIPES = (
    "llama31-405b",
    "llama3-70b",
    "llama3-8b",
    "nemotron4-15b",
    "nemotron4-340b",
    "deepseek-v3",
    "gpt3-175b",
)


def _release(entry: Mapping[str, Any]) -> tuple[int, int]:
    """A run's framework release as (YY, MM) from its container's tag; (0, 0) if none."""
    match = re.search(r"(\d\d)\.(\d\d)", str(entry.get("container", "")))
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


#: The first NeMo container whose Transformer Engine runs fused attention on Blackwell
#: with heads wider than 128. Up to v2.4, ``nvte_get_fused_attn_backend`` refuses every
#: F16 fused backend there: ``!(sm_arch_ >= 100 && (head_dim_qk > 128 || head_dim_v >
#: 128))`` ("special conditions for blackwell", transformer_engine/common/fused_attn/
#: fused_attn.cpp line 221 at v2.2, v2.3 and v2.4), and FlashAttention refuses MLA's
#: unequal query/key and value heads ("Disabling FlashAttention as it does not support
#: MLA", transformer_engine/pytorch/dot_product_attention/utils.py lines 466-470 at
#: bee4649c15a7), so ``DotProductAttention`` runs ``UnfusedDotProductAttention``
#: (transformer_engine/pytorch/attention.py line 3762 at bee4649c15a7): the
#: scores as batched GEMMs through HBM and a separate softmax. TE pull request #1797
#: ("Add support for head_dim > 128", commit 71c76b6ba, 2025-06-14, first in v2.5) lifts
#: it. NeMo's containers build TE at the commit of requirements/manifest.json: v2.3.0 to
#: v2.3.2 (the 25.04 containers) at bee4649c15a7 (2.2.0.dev0, 2025-03-18, before the
#: fix), v2.4.0 (25.07) at f05f12c974b3 (2.5.0, with it). DeepSeek-V3's MLA has query/key
#: heads of 128 + 64 = 192 (v 128): DGX Cloud v25.05.04's GB200 runs (nemo:25.04.01) ran
#: it unfused, as their ``core_attn`` recomputation suits (dgxc-benchmarking@1f6d9f40e411
#: deepseek_v3/pretraining/launch.sh line 119; ``mla_up_proj`` on H100, line 106), and
#: DGX Cloud's next GB200 runs (v25.08 at 59689f5, nemo:25.07.01: deepseek_v3/pretrain/
#: metadata.yaml) no longer recompute it (launch.sh line 123: ``mla_up_proj``).
TE_WIDE_HEADS_FUSED_ON_BLACKWELL_FROM = (25, 7)
#: GPUs of the Blackwell generation (sm100 and later).
BLACKWELL_GPUS = ("B200", "GB200", "B300", "GB300")


#: Models whose NeMo 2 configuration leaves Megatron-Core's rotary embedding unfused in
#: DGX Cloud's runs: NeMo's ``DeepSeekConfig`` sets ``apply_rope_fusion = False``
#: (nemo/collections/llm/gpt/model/deepseek.py line 114 at 7a8f1cc7bc40, the commit
#: DGX Cloud v25.05.04's DeepSeek-V3 runs check out: dgxc-benchmarking@1f6d9f40e411
#: deepseek_v3/pretraining/setup.sh line 54), so its multi-head latent attention takes
#: the PyTorch path (``megatron(mla_fused_rope=False)``). Megatron-Bridge's DeepSeek-V3
#: recipes were not read for it and keep the default.
DGXC_NEMO2_UNFUSED_MLA_ROPE = ("deepseek-v3",)


def _unfused_attention(entry: Mapping[str, Any]) -> bool:
    """Whether a run's attention ran Transformer Engine's unfused path: multi-head
    latent attention with heads over 128 (its query/key head with the rotary part, or its
    value head) on a Blackwell GPU, in a NeMo container older than
    :data:`TE_WIDE_HEADS_FUSED_ON_BLACKWELL_FROM`, without context parallelism (which
    runs no unfused attention)."""
    model = entry.get("model") or {}
    gpu = str(entry.get("gpu", "")).split("-")[0].upper()
    release = _release(entry)
    if gpu not in BLACKWELL_GPUS or release == (0, 0):
        return False
    if release >= TE_WIDE_HEADS_FUSED_ON_BLACKWELL_FROM or int(entry.get("cp") or 1) > 1:
        return False
    mla = model.get("mla")
    if not isinstance(mla, Mapping):
        # Equal heads over 128 (Nemotron-4 340B's 192) leave FlashAttention-2 to TE
        # (utils.py lines 479-497 at bee4649c15a7: up to 256, over 192 on sm80/90/100/120
        # only) where the container installs it: not read, not changed.
        return False
    qk = int(mla.get("qk_head_dim") or 0) + int(mla.get("qk_rope_dim") or 0)
    return max(qk, int(mla.get("v_head_dim") or 0)) > 128


def _cross_entropy(entry: Mapping[str, Any]) -> str | None:
    """How a run's loss ran (:data:`~simulator.workload.model.CROSS_ENTROPY_BYTES`), from
    its settings, else from its framework's release (its container's YY.MM); None for
    Megatron-Core's default (unfused), which the Megatron-LM README's runs (r0.8, whose
    ``--cross-entropy-loss-fusion`` is off unless given), NeMo 24.07's and the others
    ran.

    NeMo 2.0's GPTConfig fuses it from 24.09 on (cross_entropy_loss_fusion = True, NeMo
    commit 1d5de59, 2024-09-06, "Turn on mcore performance optimizations": in
    24.09-beta, not in 24.09-alpha); Megatron-Bridge's GPTModelProvider fuses it too, and
    its performance scripts run Transformer Engine's kernels from 25.11 on
    (scripts/performance/utils/overrides.py: cross_entropy_fusion_impl = "te", commit
    bf75c65, 2025-11-06).
    """
    settings = entry.get("settings") or {}
    if settings.get("cross_entropy") in ("unfused", "fused", "te"):
        return str(settings["cross_entropy"])
    if _dgxc_hydra(entry):
        name = (entry.get("model") or {}).get("name")
        return "fused" if name in DGXC_HYDRA_FUSED_LOSS else None
    release = _release(entry)
    kind = entry.get("source_kind")
    if kind == "megatron-bridge-performance-summary":
        return "te" if release >= (25, 11) else "fused"
    if kind in ("nvidia-dgxc-benchmarking", "nemo-long-sequence-performance"):
        return "fused" if release >= (24, 9) else None
    return None


def _fp8_recipe(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An fp8 run's Transformer Engine recipe and layout for the generator: its
    ``fp8_recipe`` ("mxfp8"; "current" or per-tensor: "tensorwise"), else "delayed",
    Megatron-Core's and NeMo 2.0's default (megatron/core/transformer/transformer_config.py
    and nemo/lightning/pytorch/plugins/mixed_precision.py: ``fp8_recipe = "delayed"``);
    Blackwell's fp8 GEMMs take any layout (no transposed copies)."""
    text = str(entry.get("fp8_recipe") or "").lower()
    if text.startswith("mxfp8"):
        recipe = "mxfp8"
    elif text.startswith(("current", "per-tensor")):
        recipe = "tensorwise"
    else:
        recipe = "delayed"
    gpu = str(entry.get("gpu", "")).split("-")[0]
    return {"fp8_recipe": recipe, "fp8_transpose": gpu not in ("B200", "GB200")}


def _bridge_fp8_params(entry: Mapping[str, Any]) -> bool:
    """Whether a Megatron-Bridge fp8 row keeps its weights in fp8 (Megatron's
    fp8_param_gather): its precision configs set it, bf16_with_fp8_current_scaling_mixed
    and bf16_with_mxfp8_mixed (src/megatron/bridge/training/mixed_precision.py, e.g.
    lines 308 and 270 at v0.4.2 c8101293; the same at r0.1.0 684a6861 and v0.2.0-v0.5.1),
    except where a model's performance config turns it off: Kimi (from v0.3.1,
    scripts/performance/configs/kimi/kimi_llm_pretrain.py line 44) and gpt-oss (from
    v0.5.0, gpt_oss_llm_pretrain.py line 108). 26.08's flat recipes (v0.6.0) are not
    presets: the rows transcribed from them say ``fp8_params`` in their settings, the
    others are left at Megatron-Core's default (off)."""
    if entry.get("source_kind") != "megatron-bridge-performance-summary":
        return False
    release = _release(entry)
    name = str((entry.get("model") or {}).get("name", ""))
    if release >= (26, 8) or name.startswith("kimi"):
        return False
    return not (name.startswith("gpt-oss") and release >= (26, 6))


def _memory_options(entry: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Recipe settings that set a run's memory only (megatron_memory's), from its sources.

    * Megatron-Bridge's Llama 3 70B and 3.1 405B recipes run Megatron-FSDP with double
      buffers, 70B with a communication unit of 8e8 (scripts/performance/configs/llama/
      llama3_llm_pretrain.py lines 108-112 at v0.4.2 c8101293, the same from v0.2.0;
      25.09: scripts/performance/run_script.py lines 169-177 at r0.1.0 684a6861, which
      also turns on nccl_ub, hence double buffers, for 8B on H100);
    * Transformer Engine up to v2.9 (Megatron-Bridge v0.2.0's uv.lock: 2.9.0, the 25.11
      container; 25.09's earlier) holds one offloaded layer more at the peak
      (memory.megatron_memory's activation_offload_in_flight).
    """
    memory: dict[str, Any] = {}
    if entry.get("source_kind") != "megatron-bridge-performance-summary":
        return memory
    name = str((entry.get("model") or {}).get("name", ""))
    release = _release(entry)
    if options.get("fsdp"):
        if name in ("llama3-70b", "llama31-405b"):
            memory["fsdp_double_buffer"] = True
        if name == "llama3-70b":
            memory["fsdp_communication_unit"] = 8e8
        if name == "llama3-8b" and release == (25, 9) and str(entry.get("gpu")) == "H100":
            memory["fsdp_double_buffer"] = True
    if options.get("activation_offload_layers") and release <= (25, 11):
        memory["activation_offload_in_flight"] = 1
    return memory


def _options(entry: Mapping[str, Any]) -> dict[str, Any]:
    settings = entry.get("settings") or {}
    options: dict[str, Any] = {}
    for key, name in _SETTINGS.items():
        value = settings.get(key)
        if isinstance(value, bool):
            options[name] = value
        elif key == "recompute" and isinstance(value, str):
            word = value.split()[0].strip(",;()").lower()
            if word in ("none", "selective", "full"):
                options[name] = word
            elif word == "selective:":
                # Megatron-Core's recompute_modules: ccsim's "selective" is core_attn;
                # "moe_act" re-runs the experts' activation in the backward
                # (recompute_moe_act), "mla_up_proj" MLA's up projections and what
                # follows them up to the core (recompute_mla_up_proj); the others
                # (layernorm, mlp, moe, ...) are not modelled (none).
                modules = value.split(":", 1)[1].replace(" ", "").split(",")
                options[name] = "selective" if "core_attn" in modules else "none"
                if "moe_act" in modules and entry.get("moe"):
                    options["recompute_moe_act"] = True
                if "mla_up_proj" in modules and (entry.get("model") or {}).get("mla"):
                    options["recompute_mla_up_proj"] = True
        elif key in ("optimizer_state", "attention_backend", "cp_comm_type") and isinstance(
            value, str
        ):
            # Checked by the generator (OPTIMIZER_STATE, ATTENTION_BACKENDS, CP_COMM_TYPES).
            options[name] = value
    offload = settings.get("activation_cpu_offload_layers")
    if isinstance(offload, int) and not isinstance(offload, bool) and offload > 0:
        options["activation_offload_layers"] = offload
    # The distributed data parallel's gradient bucket, in parameters, where the run's
    # recipe sets it (NeMo's optim.bucket_size; Megatron-Core's default otherwise).
    bucket = settings.get("ddp_bucket_size")
    if bucket is not None:
        options["bucket_size"] = bucket  # checked by the generator
    kind = entry.get("source_kind")
    if settings.get("grad_reduce_in_fp32") is False or (
        "grad_reduce_in_fp32" not in settings
        and (
            kind in BF16_GRADIENTS
            or (kind in BF16_GRADIENTS_FP8 and entry.get("precision") == "fp8")
            or _dgxc_hydra(entry)
            or (
                kind in BF16_GRADIENTS_FROM
                and _release(entry) >= BF16_GRADIENTS_FROM[kind]
                and (entry.get("model") or {}).get("name") in BF16_GRADIENT_RECIPES
            )
        )
    ):
        options["grad_reduce"] = "bf16"
    passes = GRAD_BUFFER_PASSES_BY_SOURCE.get(str(kind))
    if passes:
        options["grad_buffer_passes"] = passes
    cross_entropy = _cross_entropy(entry)
    if cross_entropy:
        options["cross_entropy"] = cross_entropy
    model_name = str((entry.get("model") or {}).get("name", ""))
    if entry.get("precision") == "fp8":
        options.update(_fp8_recipe(entry))
        hydra_fp8_params = _dgxc_hydra(entry) and model_name in DGXC_HYDRA_FP8_PARAMS
        nemo2_fp8_params = (
            kind == "nvidia-dgxc-benchmarking"
            and _release(entry) >= DGXC_NEMO2_FP8_PARAMS_FROM
            and not model_name.startswith("grok")
        )
        fp8_params = _bridge_fp8_params(entry) or hydra_fp8_params or nemo2_fp8_params
        if fp8_params and "fp8_param_gather" not in options:
            options["fp8_param_gather"] = True
        if (
            kind in AMAX_STAGE_SOURCES
            and options.get("fp8_recipe") == "delayed"
            and "amax_reduction" not in options
        ):
            options["amax_reduction"] = "stage"
    if _dgxc_hydra(entry) and model_name in DGXC_HYDRA_FLASH2:
        options["attention_backend"] = "flash2"
    if _unfused_attention(entry):
        options["flash_attention"] = False
    if (
        kind == "nvidia-dgxc-benchmarking"
        and not _dgxc_hydra(entry)
        and model_name in DGXC_NEMO2_UNFUSED_MLA_ROPE
    ):
        options["mla_fused_rope"] = False
    if _dgxc_hydra(entry) and model_name in DGXC_HYDRA_APEX_BUCKET_MIB:
        options["apex_bucket_mib"] = DGXC_HYDRA_APEX_BUCKET_MIB[model_name]
    if (entry.get("fsdp") or 0) > 1 or settings.get("megatron_fsdp") is True:
        options["fsdp"] = True
        # Megatron-FSDP shards the optimizer and overlaps its own gathers and reduces
        # (the generator's fsdp models them); the recipes' DDP flags, which later rows
        # print beside it, do not apply.
        for name in ("distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
            options.pop(name, None)
    options.update(_layout(entry))
    gpu = str(entry.get("gpu", "")).split("-")[0]
    if gpu:
        # Every row's Megatron-Core optimizer clips gradients (clip_grad 1.0 by default;
        # the MLPerf 8B's pretrain.py line 317 too), whose norm's .item() leaves the GPU
        # idle while the host launches the optimizer step (simulator.workload.
        # optimizer_host), at its CPU's cost per operation (workload/host.py).
        options["optimizer_host"] = True
        options["host_op_s"] = host_op_s_for(gpu)
    if entry.get("moe"):
        options.update(_moe_options(entry))
    options.update(_memory_options(entry, options))
    model = entry.get("model") or {}
    bundled = MODELS.get(str(model.get("name", "")))
    if bundled is not None and bundled.yarn_scale and _release(entry) < YARN_UNFUSED_FROM:
        options["fused_yarn_rope"] = True
    if model.get("name") == "deepseek-v3" and "tp_comm_overlap" not in settings:
        # Megatron-Bridge's DeepSeek-V3 recipes turn TE's TP overlap off
        # (src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py:
        # CommOverlapConfig(tp_comm_overlap=False)).
        options["tp_comm_overlap"] = False
    return options


def _nccl_fields(entry: Mapping[str, Any], where: str) -> tuple[str, dict[str, CommConfig]]:
    """A run's ``nccl`` (the channel bounds its job exports: :data:`~simulator.library.
    nccl_env.CHANNEL_VARIABLES`) and ``nccl_communicators`` (Megatron-Core's YAML of NCCL
    options per process group), checked: one-line errors name the row, the group and
    what is valid. The two go together: NCCL_MIN_CTAS / NCCL_MAX_CTAS replace a
    communicator's configuration and NCCL_MIN_NCHANNELS raises it (NcclEnv.ctas)."""
    settings = entry.get("nccl")
    text = ""
    if settings is not None:
        if not isinstance(settings, Mapping):
            raise CcsimError(
                f"{where}: nccl must map NCCL variables to values, such as "
                f"{{NCCL_MIN_CTAS: 16}}; valid: {', '.join(CHANNEL_VARIABLES)}"
            )
        other = [name for name in settings if name not in CHANNEL_VARIABLES]
        if other:
            raise CcsimError(
                f"{where}: nccl: {other[0]} is not a channel bound (validation models the "
                f"runs' channel bounds only); valid: {', '.join(CHANNEL_VARIABLES)}"
            )
        try:
            text = parse_nccl_env(settings).text
        except CcsimError as error:
            raise CcsimError(f"{where}: nccl: {error}") from None
    communicators = parse_communicators(
        entry.get("nccl_communicators"), f"{where}: nccl_communicators"
    )
    return text, communicators


def load_runs(path: str | Path = PUBLISHED) -> tuple[list[TrainingRun], list[tuple[str, str]]]:
    """The published runs ccsim can build (``TrainingRun``) and the others as (id, why
    not)."""
    # The bundled file is ccsim's own (9,000 lines): libyaml parses it in 0.26 s of CPU
    # where the limited pure-Python loader a user's file gets takes 1.8 s.
    trusted = Path(path).resolve() == PUBLISHED
    entries = load_data(path, what="published training runs", trusted=trusted)
    if not isinstance(entries, list):
        raise CcsimError(f"{path}: a list of runs expected")
    runs, skipped = [], []
    for entry in entries:
        rid = str(entry.get("id"))
        gpu = str(entry.get("gpu", "")).split("-")[0]
        nccl, communicators = _nccl_fields(entry, f"{path}: run {rid}")
        why = ""
        if entry.get("task", "pretrain") != "pretrain":
            why = f"{entry.get('task')} (fine-tuning) runs are not validated"
        elif gpu not in PRESETS:
            why = f"no bundled preset is validated for {gpu} servers yet"
        elif entry.get("precision") not in ("bf16", "fp8"):
            why = f"precision {entry.get('precision')} is not modelled"
        elif not entry.get("micro_batch"):
            why = "the micro-batch is not known"
        model = _model(entry)
        if isinstance(model, str) and not why:
            why = model
        if why:
            skipped.append((rid, why))
            continue
        assert isinstance(model, Transformer)
        step, how = measured_step(entry, model)
        runs.append(
            TrainingRun(
                id=rid,
                source=str(entry.get("source", "")),
                kind=str(entry.get("source_kind", "")),
                gpu=gpu,
                gpus=int(entry["gpus"]),
                precision=str(entry["precision"]),
                model=model,
                tp=int(entry.get("tp") or 1),
                pp=int(entry.get("pp") or 1),
                cp=int(entry.get("cp") or 1),
                vp=int(entry.get("vp") or 1),
                micro_batch=int(entry["micro_batch"]),
                global_batch=int(entry["global_batch"]),
                options=_options(entry),
                measured_step_s=step,
                measured_how=how,
                use=str(entry.get("use") or _use(entry)),
                assumed=str(entry.get("assumed", "")) + (MOE_ASSUMED if model.is_moe else ""),
                ep=int(entry.get("ep") or 1) if model.is_moe else 1,
                etp=int(entry.get("etp") or 1) if model.is_moe else 1,
                nccl=nccl,
                communicators=communicators,
            )
        )
    return runs, skipped


def _use(entry: Mapping[str, Any]) -> str:
    """A run's use: calibration where its source set a constant, else held-out."""
    return "calibration" if entry.get("source_kind") in CALIBRATION_SOURCES else "held-out"


def generator_options(run: TrainingRun) -> dict[str, Any]:
    """The ``megatron`` generator's arguments for ``run`` (Megatron-Core's defaults for
    what its source leaves out). Layers that do not split into PP x VP chunks are split
    as Megatron-Bridge's and NeMo's Llama 3.1 405B recipes set
    ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``
    (NeMo v2.3.0 nemo/collections/llm/recipes/llama31_405b.py, lines 72-73): the
    embedding and the loss count as a layer each, the first chunk of the first stage and
    the last chunk of the last stage hold one layer fewer, where that makes them split
    (without interleaving, the first and last stages one layer fewer); otherwise the
    interleaving is dropped (said in the result)."""
    options: dict[str, Any] = dict(
        model=run.model,
        tp=run.tp,
        pp=run.pp,
        dp=run.dp,
        cp=run.cp,
        micro_batch=run.micro_batch,
        global_batch=run.global_batch,
        precision=run.precision,
        virtual_stages=run.vp,
        replicas=True,
        shadows=True,
    )
    if run.model.dropout:
        # The model trains with dropout (Megatron-LM's own runs; the rows whose recipes
        # set it): inside the fused attention too (--attention-dropout, as
        # --hidden-dropout, 0.1 by default, megatron/training/arguments.py lines 947-950
        # at core_r0.8.0).
        options["attention_dropout"] = True
    if run.etp > 1:
        options["etp"] = run.etp
    # Replicas of whole 8-GPU servers: a replica of fewer ranks is found during the
    # replay to split a server, and the step is then built again with as many replicas
    # together as fill one (simulator.workload.replicas.replicas_per_server); built so at
    # once, it is the same workload without the first build. (GB200's NVLink domains are
    # racks: only mixture-of-experts runs ask for whole trays there.)
    unit = max(1, 8 // (run.tp * run.cp))
    if unit > 1 and run.dp % unit == 0 and (run.ep > 1 or run.gpu in ("H100", "H200", "B200")):
        options["replicas"] = unit
    if run.ep > 1:
        options["ep"] = run.ep
        # The NVLink domain a flex dispatcher fans out in: a server, or the GPUs of an
        # NVL72 rack the job is given (nvl72_racks).
        options["ep_domain"] = nvl72_racks(run.gpus)[1] if run.gpu == "GB200" else 8
    options.update(run.options)
    layers, chunks = run.model.layers, run.pp * run.vp
    if layers % chunks and "first_stage_layers" not in options:
        if (layers + 2) % chunks == 0 and run.vp == 1 and run.pp > 1:
            per = (layers + 2) // chunks
            options.update(first_stage_layers=per - 1, last_stage_layers=per - 1)
        elif (layers + 2) % chunks == 0 and run.pp > 1:
            options.update(
                account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True,
            )
        elif layers % run.pp == 0:
            options["virtual_stages"] = 1
        elif (layers + 2) % run.pp == 0 and run.pp > 1:
            per = (layers + 2) // run.pp
            options.update(virtual_stages=1, first_stage_layers=per - 1, last_stage_layers=per - 1)
    micro = run.global_batch // (run.micro_batch * run.dp)
    if options["virtual_stages"] > 1 and micro % run.pp:
        options["virtual_stages"] = 1
    if options["virtual_stages"] == 1 and run.pp > 1:
        # Megatron-Core's combined 1F1B needs the interleaved schedule with pipelining.
        options.pop("moe_a2a_overlap", None)
    return options


def nvl72_racks(gpus: int) -> tuple[int, int]:
    """(racks, GPUs per rack) a GB200 NVL72 job of ``gpus`` GPUs is placed on: its trays
    (:data:`TRAY_GPUS` GPUs each) in equal segments of the largest size that divides
    their number and fits one rack's :data:`RACK_TRAYS`, as NVIDIA's benchmark launcher
    asks Slurm for them (dgxc-benchmarking, cli/llmb-run/src/llmb_run/job_launcher.py,
    ``_compute_segment_size``: "for powers of 2 this is min(num_nodes, 16); for multiples
    of 18 it is 18", since v26.02; the earlier releases' and Megatron-Bridge's tables do
    not say, and the same rule is assumed). A job of a power-of-two GPU count over 64 thus
    takes 16 trays (64 GPUs) of each rack, and consecutive ranks fill a rack's NVLink
    domain before the next: Megatron's TP, CP and DP groups of 64 ranks or less stay in
    one.

    >>> nvl72_racks(8), nvl72_racks(64), nvl72_racks(256), nvl72_racks(144)
    ((1, 8), (1, 64), (4, 64), (2, 72))
    """
    trays = math.ceil(gpus / TRAY_GPUS)
    segment = next(d for d in range(min(trays, RACK_TRAYS), 0, -1) if trays % d == 0)
    return trays // segment, segment * TRAY_GPUS


def run_topology(run: TrainingRun) -> tuple[str | nx.Graph, int | None]:
    """The topology ``run`` is replayed on and its server count for
    :func:`~simulator.workload.run_workload`: its GPU's preset on ``ceil(gpus / 8)``
    servers, or, for GB200, the NVL72 preset's graph with each rack holding the GPUs
    :func:`nvl72_racks` places there (the rest of a rack's 72 idle: not built), racks
    joined by the preset's fabric of one 400G NIC per GPU."""
    if run.gpu != "GB200":
        return PRESETS[run.gpu], math.ceil(run.gpus / 8)
    from ..topology.builders import fabric_spec
    from ..topology.presets import preset, preset_graph

    racks, per_rack = nvl72_racks(run.gpus)
    data = preset(PRESETS[run.gpu])
    data = {**data, "server": {**data["server"], "gpus": per_rack}}
    graph = preset_graph(
        {**data, "fabric": fabric_spec(data.get("fabric"), None)},
        racks,
        name=str(data["name"]),
        source=f"{data['name']} ({per_rack} GPUs a rack)",
    )
    return graph, None


def _alone_all_reduce_s(
    ranks: int,
    members: int,
    nbytes: float,
    topology: str | nx.Graph,
    *,
    nodes: int | None,
    nccl: Mapping[str, Any] | None,
) -> float:
    """Seconds of one ``nbytes`` all-reduce over ranks ``0 .. members - 1`` of a
    ``ranks``-rank job, replayed alone on ``topology`` as NCCL runs it (``nccl``: the
    run's settings and communicators)."""
    from ..workload import run_workload
    from ..workload.trace import load_workload

    trace = {
        "format": "ccsim-workload/1",
        "name": "amax",
        "ranks": ranks,
        # Megatron-Core's amax group: communicators.py gives "amax." groups their
        # configuration (tp_dp_cp).
        "groups": {"amax.s0": {"kind": "DP", "ranks": list(range(members))}},
        "ops": [
            {
                "id": f"a{r}",
                "rank": r,
                "kind": "collective",
                "op": "all_reduce",
                "group": "amax.s0",
                "bytes": nbytes,
                "stream": "compute",
            }
            for r in range(members)
        ],
    }
    breakdown = run_workload(load_workload(trace), topology, nodes=nodes, **(nccl or {}))[1]
    return float(breakdown.step_s)


def amax_seconds(
    options: Mapping[str, Any],
    topology: str | nx.Graph,
    *,
    nodes: int | None = None,
    nccl: Mapping[str, Any] | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of one delayed-scaling amax all-reduce of the
    ``megatron(**options)`` step, over its first stage's TP x DP x CP ranks
    (``amax_reduction`` "stage") or its first TP group ("tp"), replayed alone on
    ``topology`` as NCCL runs it (``nccl``: the run's settings and communicators, as
    :func:`~simulator.workload.run_workload` takes them). The buffer is every fp8
    module's amaxes on a rank, as Transformer Engine concatenates its whole buffer
    (``torch.cat(amax_buffer)``, fp8.py at v1.10): the stage's layers
    (:data:`~simulator.workload.generators.AMAX_BYTES_PER_LAYER` a layer; the busiest
    stage's count, a few hundred bytes either way). The generator runs each call as a
    wait this long (``amax_seconds``), which keeps the replicas' symmetry that the
    spanning call's tree schedule breaks (see :func:`~simulator.workload.generators.megatron`).
    """
    from ..workload.generators import AMAX_BYTES_PER_LAYER

    tp, dp, cp = (int(options.get(k) or 1) for k in ("tp", "dp", "cp"))
    pp, model = int(options.get("pp") or 1), options["model"]
    members = tp if options.get("amax_reduction") == "tp" else tp * dp * cp
    layers = max(
        math.ceil(model.layers / pp),
        int(options.get("first_stage_layers") or 0),
        int(options.get("last_stage_layers") or 0),
    )
    ranks = tp * dp * cp * pp
    return (
        _alone_all_reduce_s(
            ranks, members, layers * AMAX_BYTES_PER_LAYER[True], topology, nodes=nodes, nccl=nccl
        ),
        _alone_all_reduce_s(
            ranks, members, layers * AMAX_BYTES_PER_LAYER[False], topology, nodes=nodes, nccl=nccl
        ),
    )


#: Bytes of one current-scaling TP amax all-reduce: one fp32 amax (Transformer Engine's
#: ``Float8CurrentScalingQuantizer`` reduces its one-element ``amax`` tensor,
#: csrc/quantizer.cpp lines 521-528 at v2.9).
TP_AMAX_BYTES = 4


def tp_amax_seconds(
    options: Mapping[str, Any],
    topology: str | nx.Graph,
    *,
    nodes: int | None = None,
    nccl: Mapping[str, Any] | None = None,
) -> float:
    """Seconds of one current-scaling amax all-reduce of the ``megatron(**options)``
    step (:func:`~simulator.workload.generators.tp_amax_calls`): :data:`TP_AMAX_BYTES`
    over its first TP group, replayed alone on ``topology`` as NCCL runs it (``nccl``:
    the run's settings and communicators). The generator waits this long for each call
    (``tp_amax_seconds``)."""
    tp, dp, cp = (int(options.get(k) or 1) for k in ("tp", "dp", "cp"))
    ranks = tp * dp * cp * int(options.get("pp") or 1)
    return _alone_all_reduce_s(ranks, tp, TP_AMAX_BYTES, topology, nodes=nodes, nccl=nccl)


def _tp_amax_applies(options: Mapping[str, Any]) -> bool:
    """Whether a run's step makes current scaling's TP amax all-reduces: fp8 per-tensor
    current scaling with sequence parallelism (Megatron-Core's default with TP > 1:
    megatron_options) over TP > 1, in a model without multi-head latent attention."""
    return (
        options.get("precision") == "fp8"
        and options.get("fp8_recipe") == "tensorwise"
        and int(options.get("tp") or 1) > 1
        and options.get("sequence_parallel", True) is not False
        and not options["model"].is_mla
    )


def replay_run(run: TrainingRun, topology: Any, nodes: Any, bundles: bool = True) -> Any:
    """Build and replay ``run``'s step on ``topology`` (from :func:`run_topology`) as
    ``ccsim validate --training`` does: the row's generator options, its NCCL settings
    and communicators, the blocking amax waits timed alone on this cluster, and the SMs
    communication holds where the row pins NCCL's CTAs; the
    :class:`~simulator.workload.steady.SteadyResult`. ``ccsim bench``'s published rows
    call it too, so they time the validated step itself. Bad input raises
    :class:`CcsimError`."""
    from ..workload.steady import run_steady

    options = generator_options(run)
    # The run's NCCL channel bounds and per-communicator configuration, where its row
    # gives them (simulator.workload.communicators); other rows as before.
    nccl: dict[str, Any] = {}
    if run.nccl:
        nccl["nccl"] = run.nccl
    if run.communicators:
        nccl["communicators"] = dict(run.communicators)
    if options.get("amax_reduction", "off") != "off" and "amax_seconds" not in options:
        # Each blocking amax all-reduce as a wait of its time alone on this cluster.
        options["amax_seconds"] = amax_seconds(options, topology, nodes=nodes, nccl=nccl)
    if _tp_amax_applies(options) and "tp_amax_seconds" not in options:
        # Current scaling's blocking TP amax all-reduces as waits of a call's time alone
        # on this cluster (Transformer Engine 2.x; every current-scaling row runs TE 2.2
        # or later, where the recipe began).
        options["tp_amax_seconds"] = tp_amax_seconds(options, topology, nodes=nodes, nccl=nccl)
    # Identical micro-batches of the pipeline's steady state replayed once where that is
    # checked periodic, else the full step (simulator.workload.steady); the per-flow
    # reference replays the full step. Communication's kernels hold one SM per channel
    # (NCCL's CTAs) that the rank's overlapping compute lacks while they run
    # (simulator.workload.engine).
    return run_steady(
        options,
        topology,
        nodes=nodes,
        shortcut=bundles,
        bundles=bundles,
        sm_contention=SM_CONTENTION or "NCCL_MIN_CTAS" in run.nccl,
        **nccl,
    )


def simulate_run(run: TrainingRun, bundles: bool = True) -> TrainingResult:
    """ccsim's step for ``run`` on its GPU's preset, as NCCL runs the collectives, from a
    shorter step's steady state where it is checked periodic
    (:mod:`simulator.workload.steady`); ``bundles`` False: the per-flow reference, calls
    that share links flow by flow and every micro-batch replayed."""
    import time

    start = time.perf_counter()
    try:
        topology, nodes = run_topology(run)
        result = replay_run(run, topology, nodes, bundles=bundles)
    except CcsimError as error:
        return TrainingResult(run, skipped=str(error))
    # The short step's memory is the full step's: its warm-up is as long.
    memory = result.workload.memory
    fits = None
    if memory is not None:
        from ..workload.devices import DEVICES

        fits = memory.fits(DEVICES[run.gpu].memory_bytes)
    return TrainingResult(
        run,
        step_s=float(result.step_s),
        wall_s=time.perf_counter() - start,
        memory_gb=memory.total / 1e9 if memory is not None else None,
        fits=fits,
    )


def summary(results: Iterable[TrainingResult]) -> dict[str, dict[str, float]]:
    """Median and largest |error| and the count, per use (calibration, held-out)."""
    results = list(results)
    out: dict[str, dict[str, float]] = {}
    for use in ("calibration", "held-out"):
        errors = [abs(r.error) for r in results if r.run.use == use and r.error is not None]
        if errors:
            out[use] = {
                "runs": len(errors),
                "median": statistics.median(errors),
                "max": max(errors),
            }
    return out
