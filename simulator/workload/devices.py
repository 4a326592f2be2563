"""Accelerator figures for the compute model: peak FLOP/s, memory bandwidth, and the
multiprocessors and GEMM tile that shape-dependent GEMM times need
(:mod:`~simulator.workload.kernels`).

A compute op given as FLOPs and bytes of memory traffic takes
max(flops / (peak x efficiency), bytes / memory bandwidth) — a roofline; one given as
GEMM shapes is timed by the kernel model. ``efficiency`` is the fraction of peak a
GEMM's main loop sustains; it is a property of the device model here, not of a
workload, so that every workload on a device uses the same number.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import networkx as nx

from ..errors import CcsimError, unknown_choice
from ..topology.graph import gpu_nodes
from .kernels import Gemm, gemm_time, gemms_time


@dataclass(frozen=True)
class Device:
    """Peak dense 16-bit tensor FLOP/s, HBM bandwidth (bytes/s), achievable GEMM
    fraction, HBM capacity (bytes), multiprocessors and the largest GEMM output tile."""

    name: str
    peak_flops: float
    memory_bandwidth: float
    efficiency: float = 1.0
    #: HBM capacity in bytes (0: unknown).
    memory_bytes: float = 0.0
    #: Multiprocessors a GEMM's tiles are spread over, one tile each per wave.
    units: int = 1
    #: The output tile (rows, columns) of the library's large GEMM kernels.
    tile: tuple[int, int] = (256, 128)
    #: Peak dense 8-bit floating-point tensor FLOP/s (0: the device has no fp8).
    fp8_flops: float = 0.0
    #: Sustained fraction of the fp8 peak an fp8 GEMM reaches (0: ``efficiency``).
    fp8_efficiency: float = 0.0
    #: Fused causal attention (head size 128) as a fraction of the 16-bit peak, by
    #: sequence length: (tokens, forward, backward) rows, interpolated in log2(tokens)
    #: (:data:`ATTENTION_H100`; () uses H100's fractions).
    attention: tuple[tuple[int, float, float], ...] = ()
    #: The same for FlashAttention-2's kernels (the ``flash-attn`` package), which
    #: Transformer Engine runs where a recipe turns cuDNN's off (``NVTE_FUSED_ATTN=0``):
    #: (:data:`ATTENTION_H100_FA2`; () uses H100's fractions).
    attention_flash2: tuple[tuple[int, float, float], ...] = ()
    #: Time of a fused attention kernel with dropout over its time without, by backend
    #: (cuDNN's, FlashAttention-2's: :data:`~.kernels.ATTENTION_BACKENDS`); (1, 1): not
    #: measured, none (:data:`HOPPER_ATTENTION_DROPOUT`).
    attention_dropout: tuple[float, float] = (1.0, 1.0)
    #: Main-loop time each GEMM output tile costs beyond its ``k``, as K elements at the
    #: 16-bit rate: the pipeline's fill and the epilogue's store, paid per tile whatever
    #: ``k`` is (0: none; :data:`H100_TILE_K_OVERHEAD`).
    tile_k_overhead: int = 0
    #: Seconds each GEMM kernel costs beyond its waves: the first loads' latency and the
    #: last wave's drain (0: none; :data:`H100_GEMM_KERNEL_S`).
    gemm_kernel_s: float = 0.0
    #: Fraction of ``memory_bandwidth`` that streaming kernels (elementwise, norms, casts,
    #: the loss, the optimizer) sustain (1: the datasheet's figure;
    #: :data:`H100_STREAM_FRACTION`).
    memory_efficiency: float = 1.0

    @property
    def stream_bandwidth(self) -> float:
        """Bytes/s a memory-bound kernel moves: the HBM bandwidth times
        :attr:`memory_efficiency`.

        >>> round(DEVICES["H100"].stream_bandwidth / 1e12, 2)  # STREAM copy, measured
        2.9
        """
        return self.memory_bandwidth * self.memory_efficiency

    def attention_rate(
        self, tokens: int, backward: bool = False, backend: int = 0, head_dim: int = 128
    ) -> float:
        """FLOP/s of fused causal attention over sequences of ``tokens`` (forward, or
        ``backward``): the :attr:`attention` table's fraction of the 16-bit peak
        (``backend`` 0, cuDNN's fused attention; 1, FlashAttention-2's,
        :attr:`attention_flash2`), interpolated in log2 of the length and held at the
        table's ends. Those tables are for heads of 128; heads of 64 or less run at the
        fraction H100's measured head-64 kernels reach (:data:`ATTENTION_H100_HD64`,
        :data:`ATTENTION_H100_FA2_HD64`) times the device's head-128 one over H100's,
        sizes between at a linear mix of the two in the head size; larger heads keep the
        head-128 rate (no other size is measured here).

        >>> round(DEVICES["H100"].attention_rate(4096) / 1e12)
        518
        >>> round(DEVICES["H100"].attention_rate(2 ** 20, backward=True) / 1e12)
        467
        >>> round(DEVICES["H100"].attention_rate(2048, backend=1) / 1e12)  # FA2, causal 2k
        298
        >>> round(DEVICES["H100"].attention_rate(4096, head_dim=64) / 1e12)  # cuDNN, head 64
        363
        """
        if backend == 1:
            table, h100, small = (
                self.attention_flash2 or ATTENTION_H100_FA2,
                ATTENTION_H100_FA2,
                ATTENTION_H100_FA2_HD64,
            )
        else:
            table, h100, small = (
                self.attention or ATTENTION_H100,
                ATTENTION_H100,
                ATTENTION_H100_HD64,
            )
        column = 2 if backward else 1
        fraction = _log2_interpolated(table, tokens, column)
        if head_dim < 128:
            # Mix H100's measured head-64 / head-128 ratio in linearly from 128 down to 64.
            ratio = _log2_interpolated(small, tokens, column) / _log2_interpolated(
                h100, tokens, column
            )
            weight = min(1.0, (128 - head_dim) / 64)
            fraction *= 1.0 + weight * (ratio - 1.0)
        return fraction * self.peak_flops

    def peak(self, precision: str = "bf16") -> float:
        """Dense tensor peak FLOP/s of ``precision`` ("bf16"/"fp16", or "fp8"), the
        denominator of model FLOP utilisation for a run in it; a device without fp8 has
        its 16-bit peak.

        >>> DEVICES["H100"].peak("fp8") / DEVICES["H100"].peak("bf16")
        2.001011122345804
        """
        return self.fp8_flops if precision == "fp8" and self.fp8_flops else self.peak_flops

    def compute_time(self, flops: float, mem_bytes: float = 0.0) -> float:
        """Roofline time of a kernel in seconds.

        >>> Device("x", 100e12, 1e12).compute_time(1e12, 1e9)
        0.01
        """
        return max(flops / (self.peak_flops * self.efficiency), mem_bytes / self.stream_bandwidth)


# Sources: NVIDIA A100 datasheet (2020): 312 TFLOP/s dense BF16/FP16 tensor, 2,039 GB/s
# HBM2e (80 GB SXM; nvidia-smi reports 81,920 MiB, so 80 GiB; H100 SXM likewise; the
# 910B's 64 GB taken as GiB too). NVIDIA H100 datasheet (2022): 989 TFLOP/s dense BF16 (SXM),
# 3.35 TB/s HBM3. Ascend 910B: ~376 TFLOP/s FP16 and ~1.6 TB/s HBM2e (third-party
# figures; Huawei publishes 320-400 TFLOP/s depending on the variant). The efficiency of
# 0.7 is the fraction of peak large transformer GEMMs sustain on A100/H100 (Megatron-LM,
# Narayanan et al., SC'21, report 70%+ of peak for the largest GEMMs, with end-to-end
# model FLOP utilisation around 50%).
# Multiprocessors: 108 SMs on A100 (NVIDIA A100 Tensor Core GPU Architecture whitepaper,
# 2020), 132 on H100 SXM5 (NVIDIA H100 whitepaper, 2022); the 910B's 24 AI cores are a
# third-party figure for the 910B2 (Huawei does not publish it per variant). Tile: 256 x
# 128, the largest (most efficient) tensor-core tile in NVIDIA's "Matrix Multiplication
# Background User's Guide" and CUTLASS's Ampere/Hopper bf16 kernels; the 910B's cube
# unit is given the same block (Ascend C's matmul tiling commonly uses 128 x 256).
# fp8: dense E4M3/E5M2 tensor peaks, twice the 16-bit ones on Hopper and Blackwell
# (H100 datasheet: 1,979 TFLOP/s FP8 dense, SXM).
# H200 (NVIDIA H200 datasheet, 2024): H100's compute and 132 SMs, 141 GB HBM3e at
# 4.8 TB/s. B200 (NVIDIA HGX B200 datasheet, 2024: 8 GPUs, 72 PFLOPS FP8 and 36 PFLOPS
# FP16/BF16 with sparsity, 1.4 TB HBM3e at 64 TB/s): per GPU 2.25 PFLOP/s BF16 and
# 4.5 FP8 dense, 180 GB at 8 TB/s; 148 SMs (two dies of 74, NVIDIA Blackwell
# architecture technical brief). GB200 in an NVL72 rack (NVIDIA GB200 NVL72 datasheet:
# 72 GPUs, 360 PFLOPS FP16/BF16 and 720 FP8 with sparsity, 13.4 TB HBM3e at 576 TB/s):
# per GPU 2.5 PFLOP/s BF16 and 5 FP8 dense, 186 GB at 8 TB/s. Capacities as printed
# (GB = 1e9 bytes). GB200 precedes B200 and H200 precedes H100 so that a model string
# finds its own entry first.
# Fused attention on H100 SXM5 (Shah et al., "FlashAttention-3", arXiv 2407.08608, 2024,
# figures 5 and 6: head size 128, bf16, cuDNN, the backend Transformer Engine runs on
# Hopper): causal forward 315, 410, 484, 518, 529, 539 TFLOP/s at 512 to 16k tokens.
# The paper's causal backward panel was not read; the backward is its non-causal figure
# (305, 408, 465, 499, 518, 516) times the forward's causal / non-causal ratio at the same
# length (non-causal forward 497, 574, 617, 609, 600, 595). As fractions of 989 TFLOP/s.
_H100_PEAK = 989e12


def _attention_fractions(
    rows: tuple[tuple[int, float, float, float], ...],
) -> tuple[tuple[int, float, float], ...]:
    """(tokens, forward, backward) fractions of H100's 16-bit peak from a figure's
    (tokens, causal forward, non-causal forward, non-causal backward) TFLOP/s: the causal
    backward is the non-causal one times the forward's causal / non-causal ratio."""
    return tuple(
        (tokens, fwd * 1e12 / _H100_PEAK, bwd * fwd / nc_fwd * 1e12 / _H100_PEAK)
        for tokens, fwd, nc_fwd, bwd in rows
    )


ATTENTION_H100: tuple[tuple[int, float, float], ...] = _attention_fractions(
    (
        (512, 315, 497, 305),
        (1024, 410, 574, 408),
        (2048, 484, 617, 465),
        (4096, 518, 609, 499),
        (8192, 529, 600, 518),
        (16384, 539, 595, 516),
    )
)
# FlashAttention-2 on H100 SXM5, the same figures (Shah et al. 2024, figures 5 and 6, head
# size 128, bf16, the "FlashAttention-2" bars): causal forward 191, 260, 298, 319, 333,
# 335 TFLOP/s at 512 to 16k tokens, non-causal forward 309, 350, 362, 368, 370, 370,
# non-causal backward 214, 260, 291, 310, 318, 322; the causal backward derived as for
# cuDNN above (0.60-0.66 of cuDNN's rates from 1k tokens on).
ATTENTION_H100_FA2: tuple[tuple[int, float, float], ...] = _attention_fractions(
    (
        (512, 191, 309, 214),
        (1024, 260, 350, 260),
        (2048, 298, 362, 291),
        (4096, 319, 368, 310),
        (8192, 333, 370, 318),
        (16384, 335, 370, 322),
    )
)

# The same figures' head-64 panels (Shah et al. 2024, figure 5 (a) and (d), figure 6 (a):
# H100 SXM5, bf16, head size 64, batch x length 16k tokens, hidden 2,048), cuDNN: causal
# forward 225, 288, 334, 363, 379, 388 TFLOP/s at 512 to 16k tokens, non-causal forward
# 335, 373, 395, 408, 412, 413, non-causal backward 266, 348, 395, 417, 432, 433;
# FlashAttention-2: 180, 229, 262, 284, 295, 299; 282, 306, 318, 321, 322, 324; 198, 238,
# 264, 279, 287, 291. Read from the stored transcriptions of the paper's bar charts (the
# search tool's pages corpus; their head-128 panels give exactly the figures above, which
# is how the panels were matched). A head of 64 halves each tile's work against the same
# softmax and memory traffic: cuDNN's causal forward at 4k runs at 0.70 of its head-128
# rate, its backward at 0.87.
ATTENTION_H100_HD64: tuple[tuple[int, float, float], ...] = _attention_fractions(
    (
        (512, 225, 335, 266),
        (1024, 288, 373, 348),
        (2048, 334, 395, 395),
        (4096, 363, 408, 417),
        (8192, 379, 412, 432),
        (16384, 388, 413, 433),
    )
)
ATTENTION_H100_FA2_HD64: tuple[tuple[int, float, float], ...] = _attention_fractions(
    (
        (512, 180, 282, 198),
        (1024, 229, 306, 238),
        (2048, 262, 318, 264),
        (4096, 284, 321, 279),
        (8192, 295, 322, 287),
        (16384, 299, 324, 291),
    )
)


# Fused attention with dropout, MEASURED: Transformer Engine issue #3312
# (github.com/NVIDIA/TransformerEngine/issues/3312, 2026-08-04, "thd + attention_dropout
# routes to the composite cuDNN SDPA engine"): forward + backward of one
# DotProductAttention, bf16, 4,096 tokens, 16 heads of 128, 4 sequences, the fused (cuDNN)
# backend forced, median of 50 runs after 20 warm-ups, in the sbhd layout Megatron-Core
# runs: H200 (sm90, TE 2.15.0) 0.594 ms at dropout 0 and 0.614 ms at 0.1; B300 (sm103,
# TE 2.14.1) 0.480 and 0.525 ms. FlashAttention-2 2.7.4 at dropout 0 and 0.1 on GB200 (TE
# pull request #3313, the same shapes in the thd layout, TE 2.17): 0.695 and 0.728 ms.
# H200 is H100's die (GH100) and B300 taken for B200 and GB200 (one tensor-core
# generation, as TE_LAYER_GEMMS_MS below takes it); FlashAttention-2 builds the same
# kernel templates for Hopper and Blackwell, so its GB200 ratio is taken for both. Not
# measured: the cuDNN of Megatron-Core r0.8's 2024 containers, A100 (no slowdown applied).
HOPPER_ATTENTION_DROPOUT = (0.614 / 0.594, 0.728 / 0.695)
BLACKWELL_ATTENTION_DROPOUT = (0.525 / 0.480, 0.728 / 0.695)


def _log2_interpolated(
    table: tuple[tuple[int, float, float], ...], tokens: int, column: int
) -> float:
    """A table's ``column`` at ``tokens``, linear in log2 of the length between its rows
    and held at its ends."""
    x = math.log2(max(tokens, 1))
    points = [(math.log2(row[0]), row[column]) for row in table]
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


# Hopper's GEMM time by shape beyond tiles and waves, FITTED to a public per-shape
# measurement (not to any training run): OpenXLA's H100 matmul table
# (github.com/openxla/xla, xla/service/gpu/model/matmul_interpolator_data.h, "sm_90",
# bf16 x bf16 -> bf16 FLOP/s by batch, m, n, k), as also held in tensorflow/tensorflow's
# third_party/xla. Over its 66 shapes of at least one wave of 256 x 128 tiles on the 132
# SMs (b m n >= 4096 x 1024) with k >= 512, a kernel's time taken as
#     gemm_kernel_s + waves x (tile FLOPs over k + tile_k_overhead) / (peak x fraction)
# fits with fraction 0.885, tile_k_overhead 136 and gemm_kernel_s 6 us (summed |log
# error| minimised on a grid): median |error| 1.3%, largest 5.1%, both in sample and
# leaving each shape out of the fit in turn (one fraction, tiles and waves alone: 11.4%
# and 68%). Its 36 smaller shapes (under a wave, or k 256) are outside this model
# (median 51%): a training step's GEMMs are not that small. The table's own fraction
# (0.885, boost clock, one kernel alone) is not used: only the shape terms are, and the
# step's sustained fraction below is fitted over them. For Megatron-LM's 1.7B GPT (hidden
# 2048, k 2048 in three of its four forward GEMMs) the overhead is 6% of each tile; for
# the 314B (hidden 16384 over TP 8) under 1%: NVIDIA's README attributes the rising MFU
# of its weak-scaling table to "larger GEMMs ... more efficient to execute".
H100_TILE_K_OVERHEAD = 136
H100_GEMM_KERNEL_S = 6e-6

# What memory-bound kernels sustain of H100 SXM's 3.35 TB/s, MEASURED: BabelStream on
# Azure's ND H100 v5 (github.com/Azure/AI-benchmarking-guide, "Azure Results/
# ND_H100_v5_results.md", HBM Bandwidth: Copy 2.90, Mul 2.90, Add 2.97, Triad 2.97,
# Dot 3.18 TB/s). A training step's elementwise kernels, norms, casts, loss and optimizer
# read one or two streams and write one, as Copy, Mul, Add and Triad do; Copy's 2.90
# TB/s is taken (Add and Triad are 2% faster). Not measured here for A100, H200 or
# Blackwell, which keep their datasheet bandwidth.
H100_STREAM_FRACTION = 2.90 / 3.35

# Hopper's sustained GEMM fraction in training, FITTED (with the fp8 one below, the only
# compute constants fitted to training runs): 0.64 of the dense peak, the main loop's rate
# over a long K (the per-shape terms above come on top), minimises the summed |log error|
# of the step over the Megatron-LM README's H100 table (Megatron-Core r0.8, GPT 1.7B-314B
# on 48-3,072 GPUs; the rows marked calibration in
# simulator/data/training/published-runs.yaml), each row's step taken as a + b / fraction
# through two simulated fractions (0.60, 0.68). Re-derived when the per-shape terms and
# the measured stream bandwidth came in (0.615 before, a fraction of every shape alike):
# the optimum is 0.6425 and the summed |log error| is within 1% of it from 0.635 to
# 0.65. In-sample median |error| 5.0% over the eight rows (5.8% before), largest 18.8%
# (the 32B row); leaving each row out of the fit in turn, 5.4% and 19.2% (7.1%, 20%).
# Re-checked when attention dropout's measured cost came in (issue 31, h53d; the rows run
# --attention-dropout 0.1): the optimum 0.6435 (0.6425 without, on the same code), in
# sample median 3.7% and largest 19.7%, leaving each row out 4.5% and 20.3% (3.7%,
# 19.7%, 4.6%, 20.3% without): 0.64 kept.
# Physically: about 630 TFLOP/s on long-K GEMMs, below the 875 the table gives one such
# kernel alone at boost clock, because a training step's GEMMs run at the power limit's
# clock, beside communication kernels, with bias and fp32-accumulating epilogues. H200
# is the same die. A100 keeps 0.7 (SC'21).
H100_GEMM_EFFICIENCY = 0.64
# Hopper's fp8 GEMMs (Transformer Engine on cuBLASLt), FITTED likewise: 0.552 of the fp8
# peak makes the one calibration fp8 run (NVIDIA DGX Cloud benchmarking v25.01, Llama 3
# 8B on 8 H100, 9.67 s a step) come out at 9.670 s (0.50 before the per-shape terms and
# stream bandwidth, which this run's tiles and casts now pay; 0.545 before FC2's input
# cast and the norm outputs' transposes, Transformer.fp8_cast_bytes, which moved the run
# to 9.737 s), with bf16 everything else and TE's casts as memory traffic. One run:
# there is no leave-one-out figure. A lower fraction than bf16's: TE runs the backward
# GEMMs with split (fp32-promoted) accumulation, and an fp8 GEMM's scaling costs time
# per output.
H100_FP8_EFFICIENCY = 0.552

# Maximum achievable matmul FLOP/s (MAMF: the fastest of a sweep of torch.matmul shapes,
# mean of 100 runs after 50 warm-up) as fractions of the dense peak, from S. Bekman's
# "Machine Learning Engineering" (github.com/stas00/ml-engineering,
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"):
# bf16 H100 SXM 794.5 of 989 TFLOP/s (torch 2.7.0+cu126), B200 SXM 1745.0 of 2250 (2.7.1
# +cu128), GB200 1822.0 of 2500; fp8 (e4m3) H100 SXM 1402.6 of 1979, B200 SXM 3432.5 of
# 4500, GB200 3615.6 of 5000.
MAMF_FRACTION: dict[str, dict[int, float]] = {
    "H100": {16: 794.5 / 989, 8: 1402.6 / 1979},
    "B200": {16: 1745.0 / 2250, 8: 3432.5 / 4500},
    "GB200": {16: 1822.0 / 2500, 8: 3615.6 / 5000},
}


#: The shapes (m, n, k) at which those best H100 matmuls were measured, same table.
MAMF_SHAPE_H100: dict[int, tuple[int, int, int]] = {16: (2048, 2048, 13312), 8: (1024, 9216, 14336)}


def _h100(efficiency: float, fp8_efficiency: float) -> Device:
    return Device(
        "H100",
        989e12,
        3.35e12,
        efficiency,
        80 * 2**30,
        132,
        fp8_flops=1979e12,
        fp8_efficiency=fp8_efficiency,
        tile_k_overhead=H100_TILE_K_OVERHEAD,
        gemm_kernel_s=H100_GEMM_KERNEL_S,
        memory_efficiency=H100_STREAM_FRACTION,
        attention_dropout=HOPPER_ATTENTION_DROPOUT,
    )


def hopper_at_best_shape(bits: int) -> float:
    """H100's fitted training GEMM fraction in ``bits``-bit operands (of the dense peak,
    :data:`H100_GEMM_EFFICIENCY`, :data:`H100_FP8_EFFICIENCY`) less what its measured
    per-shape terms (:data:`H100_TILE_K_OVERHEAD`, :data:`H100_GEMM_KERNEL_S`) cost the
    shape of its best measured matmul (:data:`MAMF_SHAPE_H100`): the kernel's time
    without them over its time with them (tiles and waves alike in both).

    >>> round(hopper_at_best_shape(16), 3), round(hopper_at_best_shape(8), 3)
    (0.613, 0.534)
    """
    h100 = _h100(H100_GEMM_EFFICIENCY, H100_FP8_EFFICIENCY)
    bare = replace(h100, tile_k_overhead=0, gemm_kernel_s=0.0)
    gemm = Gemm(*MAMF_SHAPE_H100[bits], bits=bits)
    fitted = H100_GEMM_EFFICIENCY if bits == 16 else H100_FP8_EFFICIENCY
    return fitted * gemm_time(bare, gemm) / gemm_time(h100, gemm)


# Blackwell's GEMM time by shape beyond tiles and waves, FITTED to a public per-shape
# measurement (not to any training run), as Hopper's above: OpenXLA's B200 matmul table
# (xla/service/gpu/model/matmul_interpolator_data.h, "sm_100", bf16 x bf16 -> bf16, the
# version mirrored in github.com/ROCm/xla, blob 3873df5, branches of 2025-12 to 2026-01,
# which holds "sm_90" and "sm_100" side by side: 375 shapes each, b 1-4, m n k 256-4096).
# Over its 76 shapes of at least one wave of 256 x 128 tiles on B200's 148 SMs with
# k >= 512, the same kernel model fits with main-loop fraction 0.83, tile_k_overhead 352
# and gemm_kernel_s 5 us (summed |log error| on a grid): median |error| 1.5%, largest
# 13.3% in sample, and the same (1.5%, 13.3%) leaving each shape out of the fit in turn
# (one fraction with tiles and waves alone: 20.6% and 123%). A tile's fixed cost is 2.6
# times Hopper's 136 K elements: Blackwell's tensor cores do twice Hopper's work per SM
# and clock (2.25 vs 0.99 PFLOP/s over 148 vs 132 SMs at similar clocks), so the same
# fill and epilogue latency costs about twice the K. The same fit on that file's
# "sm_90" table gives 0.87, 128 and 6 us (the constants above are from an earlier
# version of it: 0.885, 136, 6 us). GB200 is the same die: it takes B200's terms.
BLACKWELL_TILE_K_OVERHEAD = 352
BLACKWELL_GEMM_KERNEL_S = 5e-6

# fp8 matmuls at the power limit, MEASURED with one harness on both generations: Azure's
# AI-benchmarking-guide (github.com/Azure/AI-benchmarking-guide, Azure_Results/
# ND_H100_v5_results.md and ND_GB200_v6_results.md, "GEMM CuBLASLt (FP8)": cuBLASLt, random
# inputs, 10,000 warm-up iterations, i.e. at the clock the GPU holds under sustained
# load): 16384 x 16384 x 16384 at 1377.3 TFLOP/s on H100 SXM (69.6% of 1979) and 2906.9
# on GB200 (58.1% of 5000; 2876.6 at 8192^3, 2895.6 at 6144 x 12288 x 12288). The MAMF
# table above (torch, 50 warm-ups) has H100 at 70.9% and GB200 at 72.3%: the two harnesses
# agree on Hopper and part on Blackwell, whose fp8 tensor cores at twice the bf16 rate
# draw more power than its limit sustains for long. A training step runs at the
# sustained clock, as H100's fitted fraction says of Hopper, so the sustained ratio is
# taken (MAMF's was before: B200 fp8 0.568 of its peak).
AZURE_FP8_16K = {"H100": (1377.3e12, 1979e12), "GB200": (2906.9e12, 5000e12)}

# bf16 against fp8 on one harness on both generations, MEASURED: Transformer Engine's GEMM
# profiling guide (github.com/NVIDIA/TransformerEngine, docs/examples/gemm_profiling/
# gemm_profiling.rst, ``benchmarks/gemm/benchmark_gemm.py --pre-quantize``: the casts
# outside the timed region, CUDA events, 10 warm-ups and 100 timed runs) times the 12
# GEMMs of one layer (hidden 4096, FFN 16384, 32 heads, 31 x 512 = 15,872 tokens: the
# forward's 15872 x 4096 x {12288, 4096, 16384} and 15872 x 16384 x 4096, the input and
# weight gradients of each) in bf16 and in fp8 with per-tensor current scaling: NVIDIA
# H200 NVL 31.968 and 16.785 ms (1.905x), NVIDIA B300 13.102 and 6.812 ms (1.923x). The
# two generations' fp8 kernels gain the same over their bf16 ones, within 1%. Blackwell's
# fp8 fraction above is set at the clock its fp8 GEMMs sustain (Azure's 10,000 warm-ups,
# 20% under the short-run MAMF rate), while the OpenXLA and MAMF tables its bf16 fraction
# came from before were short runs at boost clock: with these, Blackwell's bf16 fraction
# is set from its fp8 one so that its modelled bf16-over-fp8 time for these 12 GEMMs is
# H100's modelled one times the measured B300-over-H200 change (:func:`blackwell_fraction`).
# That assumes bf16 GEMMs lose as much to Blackwell's power limit as fp8 ones do (no
# sustained bf16 Blackwell rate was found), and takes H200 NVL for Hopper and B300 for
# B200 and GB200 (same tensor-core generations, their bf16 and fp8 peaks in a 1:2 ratio).
# The modelled bf16-over-fp8 times for these GEMMs were 1.68 on H100 against 1.57 (GB200)
# and 1.56 (B200): Blackwell's bf16 was 7% fast for its fp8. Now GB200 0.528 (0.574 before)
# and B200 0.558 (0.611), fp8 0.465 and 0.490 (0.463, 0.489: solved with the bf16 rate);
# since H100's fp8 refit to 0.552 (issue 31, h48b's casts): GB200 0.528 and 0.471, B200
# 0.557 and 0.496.
TE_LAYER_GEMMS_MS = {"H200": (31.968, 16.785), "B300": (13.102, 6.812)}
#: The forward GEMMs (m, n, k) of that layer: QKV, attention output, FFN up and down.
TE_LAYER_SHAPES = (
    (15872, 12288, 4096),
    (15872, 4096, 4096),
    (15872, 16384, 4096),
    (15872, 4096, 16384),
)


def te_layer_gemms(bits: int) -> tuple[Gemm, ...]:
    """The 12 GEMMs of Transformer Engine's profiled layer (:data:`TE_LAYER_SHAPES`):
    each forward GEMM and its two backward ones, in ``bits``-bit operands.

    >>> round(sum(g.flops for g in te_layer_gemms(16)) / 1e12, 2)  # 6 x 15872 x 4096 x 49152
    19.17
    """
    out: list[Gemm] = []
    for m, n, k in TE_LAYER_SHAPES:
        forward = Gemm(m, n, k, bits=bits)
        out += [forward, *forward.backward()]
    return tuple(out)


def te_layer_ratio(device: Device) -> float:
    """``device``'s modelled bf16 time over its fp8 time for :func:`te_layer_gemms`."""
    return gemms_time(device, te_layer_gemms(16)) / gemms_time(device, te_layer_gemms(8))


# HBM3e stream bandwidth: not measured on Blackwell in any source found; Azure's harness
# (BabelStream, as H100's above) measures H200's HBM3e at Copy 4.01, Mul 4.00, Add and
# Triad 4.15 TB/s of 4.8 (Azure_Results/ND_H200_v5_results.md): Copy's 0.835 of the
# datasheet is taken for B200's and GB200's HBM3e too (an assumption: the same memory
# generation, not the same part).
HBM3E_STREAM_FRACTION = 4.01 / 4.8


def _blackwell(
    name: str, peak: float, memory_bytes: float, efficiency: float, fp8: float
) -> Device:
    return Device(
        name,
        peak,
        8e12,
        efficiency,
        memory_bytes,
        148,
        fp8_flops=2 * peak,
        fp8_efficiency=fp8,
        tile_k_overhead=BLACKWELL_TILE_K_OVERHEAD,
        gemm_kernel_s=BLACKWELL_GEMM_KERNEL_S,
        memory_efficiency=HBM3E_STREAM_FRACTION,
        attention_dropout=BLACKWELL_ATTENTION_DROPOUT,
    )


def blackwell_fraction(name: str, bits: int) -> float:
    """A Blackwell GPU's sustained training GEMM fraction (of its dense ``bits``-bit peak,
    the main loop's rate; Blackwell's shape terms come on top), carried over from H100's
    fitted ones by measured ratios; nothing fitted to a Blackwell run.

    fp8: GB200 such that its training GEMM model at 16384^3 keeps the share of H100's
    that Azure's sustained cuBLASLt rates measure (:data:`AZURE_FP8_16K`); B200 at
    GB200's times their MAMF fp8 fractions' ratio (76.3% vs 72.3%). bf16: such that the
    GPU's modelled bf16-over-fp8 time for Transformer Engine's profiled layer
    (:func:`te_layer_gemms`) is H100's modelled one times B300's measured ratio over
    H200's (:data:`TE_LAYER_GEMMS_MS`). GB200's two fractions are solved together (an fp8
    tile's fixed cost is timed at the bf16 rate).

    >>> round(blackwell_fraction("GB200", 16), 3), round(blackwell_fraction("B200", 16), 3)
    (0.528, 0.557)
    >>> round(blackwell_fraction("GB200", 8), 3), round(blackwell_fraction("B200", 8), 3)
    (0.471, 0.496)
    """
    gb200_bf16, gb200_fp8 = _gb200_fractions()
    if name == "GB200":
        return gb200_bf16 if bits == 16 else gb200_fp8
    fp8 = gb200_fp8 * MAMF_FRACTION[name][8] / MAMF_FRACTION["GB200"][8]
    return fp8 if bits == 8 else _bf16_fraction(name, 2.25e15, fp8)


def _bisect(too_low: Callable[[float], bool]) -> float:
    """The fraction in (0.05, 1) where ``too_low`` turns False (it is True below it)."""
    low, high = 0.05, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if too_low(mid):
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _bf16_fraction(name: str, peak: float, fp8: float) -> float:
    """The bf16 fraction at which a Blackwell GPU of ``peak`` with fp8 fraction ``fp8``
    has the bf16-over-fp8 layer time :data:`TE_LAYER_GEMMS_MS` carries over from H100."""
    (h_bf16, h_fp8), (b_bf16, b_fp8) = TE_LAYER_GEMMS_MS["H200"], TE_LAYER_GEMMS_MS["B300"]
    h100 = _h100(H100_GEMM_EFFICIENCY, H100_FP8_EFFICIENCY)
    target = te_layer_ratio(h100) * (b_bf16 / b_fp8) / (h_bf16 / h_fp8)
    # A faster bf16 main loop lowers the ratio: below the answer it is above the target.
    return _bisect(lambda f: te_layer_ratio(_blackwell(name, peak, 0.0, f, fp8)) > target)


@functools.cache
def _gb200_fractions() -> tuple[float, float]:
    """GB200's (bf16, fp8) fractions: each solved given the other until both settle (the
    coupling, an fp8 tile's fixed cost at the bf16 rate, is weak: the 8th round moves
    either by under 1e-10; about 0.1 s, once per process)."""
    gemm = Gemm(16384, 16384, 16384, bits=8)
    h100 = _h100(H100_GEMM_EFFICIENCY, H100_FP8_EFFICIENCY)
    share = gemm.flops / gemm_time(h100, gemm) / h100.fp8_flops
    (h_rate, h_peak), (g_rate, g_peak) = AZURE_FP8_16K["H100"], AZURE_FP8_16K["GB200"]
    target = share * (g_rate / g_peak) / (h_rate / h_peak)

    def fp8_share(bf16: float, fp8: float) -> float:
        gb200 = _blackwell("GB200", 2.5e15, 0.0, bf16, fp8)
        return gemm.flops / gemm_time(gb200, gemm) / gb200.fp8_flops

    bf16, fp8 = H100_GEMM_EFFICIENCY, H100_FP8_EFFICIENCY
    for _ in range(8):
        fp8 = _bisect(lambda f, b=bf16: fp8_share(b, f) < target)
        bf16 = _bf16_fraction("GB200", 2.5e15, fp8)
    return bf16, fp8


DEVICES = {
    device.name: device
    for device in (
        Device("A100", 312e12, 2.039e12, 0.7, 80 * 2**30, 108),
        Device(
            "H200",
            989e12,
            4.8e12,
            H100_GEMM_EFFICIENCY,
            141e9,
            132,
            fp8_flops=1979e12,
            fp8_efficiency=H100_FP8_EFFICIENCY,
            tile_k_overhead=H100_TILE_K_OVERHEAD,
            gemm_kernel_s=H100_GEMM_KERNEL_S,
            attention_dropout=HOPPER_ATTENTION_DROPOUT,
        ),
        _h100(H100_GEMM_EFFICIENCY, H100_FP8_EFFICIENCY),
        # GB200 in an NVL72 rack and B200 (HGX): see the sources above.
        _blackwell(
            "GB200", 2.5e15, 186e9, blackwell_fraction("GB200", 16), blackwell_fraction("GB200", 8)
        ),
        _blackwell(
            "B200", 2.25e15, 180e9, blackwell_fraction("B200", 16), blackwell_fraction("B200", 8)
        ),
        Device("910B", 376e12, 1.6e12, 0.7, 64 * 2**30, 24),
    )
}


def device_for(model: str) -> Device:
    """The device whose name appears in a GPU model string (``A100-SXM4-80GB`` -> A100).

    >>> device_for("GB200-NVL72").name, device_for("H200-SXM-141GB").name
    ('GB200', 'H200')
    """
    text = model.upper()
    for name, device in DEVICES.items():
        if name.upper() in text:
            return device
    raise unknown_choice("device model", model, DEVICES)


def graph_device(graph: nx.Graph) -> Device | None:
    """The device of a topology's GPUs (their ``model`` attribute), or None if no GPU
    names one ccsim knows."""
    models = {graph.nodes[node].get("model", "") for node in gpu_nodes(graph)}
    for model in sorted(models):
        try:
            return device_for(str(model))
        except CcsimError:
            continue
    return None
