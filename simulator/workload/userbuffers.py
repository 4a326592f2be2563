"""Transformer Engine's userbuffer TP overlap, as its recipes configure it: which linear
GEMM overlaps its TP all-gather or reduce-scatter how (ring exchange, pipelined chunks,
bulk), on how many SMs, and what that leaves exposed (issue 31).

The facts, from the libraries' source: Transformer Engine's ``initialize_ub``
(transformer_engine/pytorch/module/base.py) and its C++ overlaps
(transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp, TE commit d0067d0):
a ring-exchange all-gather GEMM runs TP chunks, the first on the local shard while the
next moves peer to peer by copy engine (``use_ce``), each chunk on one of up to three
compute streams once its data arrived; a ring-exchange reduce-scatter GEMM sends each
chunk's partial output to its owner and sums the TP received partials in a reduction
kernel on the main stream after the exchange; a pipelined reduce-scatter runs its
``num_splits`` GEMM chunks and reduce-scatters each on ``num_sm`` SMs after it, the last
one with nothing left to hide it; a bulk overlap runs the whole communication on
``num_sm`` SMs beside the whole GEMM; ``set_sm_margin`` launches the GEMM on the SMs
less ``num_sm``. NeMo's performance docs say the same in words
(docs/source/features/communication_overlap.rst: "reduce-scatter is replaced with
multiple steps of GEMM output P2P ring exchanges followed by a reduction of the received
outputs"; the chunked reduce-scatter "exposes one reduce-scatter chunk").

What is left out: a chunk's exchange taking longer than its GEMM chunk (at H100's 450
GB/s per GPU every GEMM chunk of the published GPT-3 175B and Llama 3 70B runs is the
longer, so the exchange hides), the bulk communication's SMs while it runs without a
margin, the all-gathered input's copy for the backward (a copy-engine copy beside the
GEMMs), and a communication kernel on few SMs running slower than NCCL's (the bytes move
at the rate the collective model gives them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .kernels import Gemm
from .model import Transformer


@dataclass(frozen=True)
class UbOverlap:
    """How Transformer Engine's userbuffers overlap one linear GEMM with its TP
    communication (``initialize_ub``'s per-GEMM ``ub_cfgs``, transformer_engine/pytorch/
    module/base.py): ``method`` "ring_exchange" (the GEMM in TP chunks while the next
    chunk moves peer to peer by copy engine; a reduce-scatter then sums the chunks in a
    kernel of its own), "pipeline" (the GEMM in ``num_splits`` chunks, each chunk's
    reduce-scatter on ``num_sm`` multiprocessors after it; the last one exposed) or
    "bulk" (the whole communication beside the whole GEMM on ``num_sm``
    multiprocessors); ``set_sm_margin``: the GEMM leaves those ``num_sm`` to the
    communication (``_math_sms``, comm_gemm_overlap.cpp)."""

    method: str
    num_sm: int = 1
    set_sm_margin: bool = False
    num_splits: int = 4


_RING = UbOverlap("ring_exchange")
_RING_MARGIN = UbOverlap("ring_exchange", 1, True)


def _bulk(num_sm: int) -> UbOverlap:
    return UbOverlap("bulk", num_sm, False)


def _pipeline(num_sm: int) -> UbOverlap:
    return UbOverlap("pipeline", num_sm, True, 4)


#: Transformer Engine's own choice where a recipe gives no ``ub_cfgs`` (Megatron-LM
#: without ``--tp-comm-overlap-cfg``): ring exchange (1 SM, copy engines, TP chunks) for
#: the all-gather GEMMs qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline (16 SMs, 4
#: chunks) for proj_fprop and fc2_fprop; bulk (16 SMs) for qkv_dgrad, qkv_wgrad,
#: fc1_dgrad, fc1_wgrad; none with an SM margin, as in TE v1.9 to v1.13
#: (get_default_config in transformer_engine/pytorch/module/base.py; v1.8's add_ub
#: defaults alike), the releases the Megatron-LM README's and NeMo 24.x's runs used. TE
#: 2.0 on (commit 544dd14, 2025-02) gives pipeline and bulk a margin (``set_sm_margin =
#: not method == "ring_exchange"``); the generator does not know a run's TE release,
#: and the recipes of that era (Megatron-Bridge) give their own configs
#: (:data:`UB_NEMO_H100`). proj_wgrad and fc2_wgrad run plain.
UB_TE_DEFAULT: dict[str, UbOverlap] = {
    "qkv_fprop": _RING,
    "fc1_fprop": _RING,
    "proj_dgrad": _RING,
    "fc2_dgrad": _RING,
    "proj_fprop": UbOverlap("pipeline", 16, False, 4),
    "fc2_fprop": UbOverlap("pipeline", 16, False, 4),
    "qkv_dgrad": _bulk(16),
    "qkv_wgrad": _bulk(16),
    "fc1_dgrad": _bulk(16),
    "fc1_wgrad": _bulk(16),
}


def _nemo(qkv_dgrad: int, qkv_wgrad: int, fc1_dgrad: int, fc1_wgrad: int,
          proj_fprop: UbOverlap, fc2_fprop: UbOverlap) -> dict[str, UbOverlap]:  # fmt: skip
    """One of NeMo's configs: its bulk SMs (no margin) and its two reduce-scatter GEMMs;
    the four all-gather GEMMs ring exchange in every H100 config."""
    return {
        "qkv_fprop": _RING,
        "fc1_fprop": _RING,
        "proj_dgrad": _RING,
        "fc2_dgrad": _RING,
        "proj_fprop": proj_fprop,
        "fc2_fprop": fc2_fprop,
        "qkv_dgrad": _bulk(qkv_dgrad),
        "qkv_wgrad": _bulk(qkv_wgrad),
        "fc1_dgrad": _bulk(fc1_dgrad),
        "fc1_wgrad": _bulk(fc1_wgrad),
    }


#: NeMo's (and Megatron-Bridge's) H100 userbuffer configs by (precision, hidden, TP):
#: nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py (NeMo commit
#: 8cfedd7): userbuffers_{bf16,fp8}_h100_h8192_tp4_mbs1_seqlen8192 (Llama 3 70B),
#: _h16384_tp8_cp2_mbs1_seqlen8192 (Llama 3.1 405B), _h6144_tp2_mbs2_seqlen2048 (GPT-3
#: 20B), _h12288_tp4_mbs1_seqlen2048 (GPT-3 175B). Other shapes take TE's defaults.
UB_NEMO_H100: dict[tuple[str, int, int], dict[str, UbOverlap]] = {
    ("bf16", 8192, 4): _nemo(4, 24, 2, 4, _pipeline(24), _pipeline(16)),
    ("fp8", 8192, 4): _nemo(4, 24, 2, 4, _RING_MARGIN, _RING_MARGIN),
    ("bf16", 16384, 8): _nemo(2, 24, 2, 2, _pipeline(24), _pipeline(8)),
    ("fp8", 16384, 8): _nemo(2, 24, 2, 2, _RING_MARGIN, _RING_MARGIN),
    ("bf16", 6144, 2): _nemo(8, 16, 4, 16, _pipeline(16), _pipeline(24)),
    ("fp8", 6144, 2): _nemo(8, 16, 4, 16, _pipeline(16), _pipeline(24)),
    ("bf16", 12288, 4): _nemo(4, 4, 2, 4, _pipeline(24), _RING_MARGIN),
    ("fp8", 12288, 4): _nemo(4, 4, 2, 4, _RING_MARGIN, _RING_MARGIN),
}

#: The ways ``tp_comm_overlap`` runs TP collectives beside the GEMMs: "ideal" (on their
#: own stream at no cost to the GEMMs: a bound) and "userbuffers" (as Transformer
#: Engine runs them, :func:`userbuffers_config`).
TP_COMM_OVERLAPS = ("ideal", "userbuffers")

#: A transformer layer's linear GEMMs in :meth:`Transformer.linear_gemms` order.
LINEAR_NAMES = ("qkv", "proj", "fc1", "fc2")


def userbuffers_config(m: Transformer, tp: int, precision: str) -> dict[str, UbOverlap]:
    """The userbuffer config a recipe runs ``m`` with on ``tp`` ranks: NeMo's for its
    shape (:data:`UB_NEMO_H100`), else Transformer Engine's defaults
    (:data:`UB_TE_DEFAULT`).

    >>> from .model import MODELS
    >>> userbuffers_config(MODELS["gpt3-175b"], 4, "fp8")["proj_fprop"].method
    'ring_exchange'
    >>> userbuffers_config(MODELS["gpt3-175b"], 8, "bf16")["proj_fprop"].method
    'pipeline'
    """
    return UB_NEMO_H100.get((precision, m.hidden, tp), UB_TE_DEFAULT)


def ub_gemm(g: Gemm, how: UbOverlap | None, tp: int) -> Gemm:
    """``g`` as userbuffers runs it: chunked (ring exchange: into TP chunks; pipeline:
    into its splits) and beside a communication kernel's SMs where it sets a margin."""
    if how is None:
        return g
    splits = {"ring_exchange": tp, "pipeline": how.num_splits}.get(how.method, 1)
    return g.overlapped(splits, how.num_sm if how.set_sm_margin else 0)


def userbuffers_exposed(
    how: Mapping[str, UbOverlap], tp: int, activation: float
) -> tuple[float, float]:
    """Per layer forward, what userbuffers leaves exposed on the compute stream beside
    its overlapped GEMMs: (bytes of memory-bound reduction kernels, bytes of
    reduce-scatter). A ring-exchange reduce-scatter GEMM (proj_fprop, fc2_fprop) sums
    the TP partial outputs it received in a kernel of its own after the exchange
    (``reduce_bf16``, CommOverlapP2PBase::split_overlap_rs): it reads TP chunks of
    ``activation`` / TP bytes and writes one. A pipelined one reduce-scatters its last
    chunk after its last GEMM chunk, nothing left to hide it (split_overlap_rs): 1 /
    num_splits of its ``activation`` bytes. The backward's overlaps leave nothing
    exposed: its all-gathers ring-exchange ahead of their chunks and its bulk
    reduce-scatters run beside the weight gradient.

    >>> userbuffers_exposed(UB_NEMO_H100[("fp8", 12288, 4)], 4, 1000.0)
    (2500.0, 0.0)
    >>> userbuffers_exposed(UB_TE_DEFAULT, 8, 1000.0)
    (0.0, 500.0)
    """
    reduce = rs = 0.0
    for name in ("proj_fprop", "fc2_fprop"):
        if how[name].method == "ring_exchange":
            reduce += (tp + 1) / tp * activation
        elif how[name].method == "pipeline":
            rs += activation / how[name].num_splits
    return reduce, rs
