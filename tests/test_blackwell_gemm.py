"""Blackwell's compute model (issue 31): its GEMM shape terms fitted to OpenXLA's B200 table,
Hopper's fitted training fractions carried over by measured ratios (fp8: sustained
cuBLASLt rates; bf16: Transformer Engine's bf16-over-fp8 layer times on both
generations), nothing fitted to a Blackwell run."""

from dataclasses import replace

import pytest

from simulator.workload.devices import (
    DEVICES,
    H100_GEMM_EFFICIENCY,
    MAMF_FRACTION,
    hopper_at_best_shape,
    te_layer_gemms,
)
from simulator.workload.kernels import Gemm, gemm_time


def test_mamf_fractions_are_the_published_rates_over_the_peaks():
    """ml-engineering's MAMF table: bf16 H100 SXM 794.5 of 989 TFLOP/s (80.3%), B200 SXM
    1745.0 of 2250 (77.6%); fp8 H100 SXM 1402.6 of 1979 (70.9%), B200 SXM 3432.5 of 4500
    (76.3%)."""
    assert MAMF_FRACTION["H100"][16] == pytest.approx(0.803, abs=5e-4)
    assert MAMF_FRACTION["B200"][16] == pytest.approx(0.776, abs=5e-4)
    assert MAMF_FRACTION["H100"][8] == pytest.approx(0.709, abs=5e-4)
    assert MAMF_FRACTION["B200"][8] == pytest.approx(0.763, abs=5e-4)


# Transformer Engine's GEMM profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst,
# "Manual Shape Mode"), its profiled layer's GEMMs as M x K x N, written out as it prints them.
TE_FPROP = ((15872, 4096, 12288), (15872, 4096, 4096), (15872, 4096, 16384), (15872, 16384, 4096))
TE_DGRAD = ((15872, 12288, 4096), (15872, 4096, 4096), (15872, 16384, 4096), (15872, 4096, 16384))
TE_WGRAD = ((4096, 15872, 12288), (4096, 15872, 4096), (4096, 15872, 16384), (16384, 15872, 4096))


def _te_layer(bits):
    return [Gemm(m, n, k, bits=bits) for m, k, n in TE_FPROP + TE_DGRAD + TE_WGRAD]


def test_te_layer_gemms_are_the_guides_shapes():
    """The 12 GEMMs :func:`te_layer_gemms` builds are the guide's forward, input-gradient
    and weight-gradient shapes (M x K x N as it lists them), 6 x 15872 x 4096 x 49152
    FLOPs in all."""
    ours = sorted((g.m, g.k, g.n) for g in te_layer_gemms(16))
    assert ours == sorted(TE_FPROP + TE_DGRAD + TE_WGRAD)
    assert sum(g.flops for g in te_layer_gemms(8)) == 6 * 15872 * 4096 * 49152


def test_blackwell_bf16_keeps_hoppers_bf16_over_fp8_layer_time_times_the_measured_change():
    """TE's guide (``--pre-quantize``) times that layer's 12 GEMMs at 31.968 ms in bf16 and
    16.785 ms in fp8 (current scaling) on H200 NVL, 13.102 and 6.812 ms on B300. Each
    Blackwell GPU's modelled bf16-over-fp8 time for them is H100's modelled one times
    (13.102 / 6.812) / (31.968 / 16.785), its fp8 fraction set as before (Azure's
    sustained rate, next test)."""
    change = (13.102 / 6.812) / (31.968 / 16.785)
    assert change == pytest.approx(1.0099, abs=1e-4)

    def ratio(device):
        return sum(gemm_time(device, g) for g in _te_layer(16)) / sum(
            gemm_time(device, g) for g in _te_layer(8)
        )

    hopper = ratio(DEVICES["H100"])
    for name in ("GB200", "B200"):
        assert ratio(DEVICES[name]) == pytest.approx(hopper * change, rel=1e-6)
    # Below the short-run chain it replaces (H100's 0.64 times OpenXLA's B200-over-H100
    # main loops, 0.83 / 0.87, and MAMF's GB200-over-B200 bf16 shares): 0.611 and 0.574.
    assert DEVICES["B200"].efficiency < 0.64 * 0.83 / 0.87
    assert DEVICES["GB200"].efficiency < DEVICES["B200"].efficiency


def test_blackwell_fp8_keeps_the_sustained_cublaslt_ratio_at_16k():
    """Azure's harness (cuBLASLt, random inputs, 10,000 warm-ups) runs 16384^3 in fp8 at
    1377.3 TFLOP/s on H100 and 2906.9 on GB200: GB200's modelled share of its fp8 peak at
    that shape is H100's times (2906.9 / 5000) / (1377.3 / 1979); B200's fraction is
    GB200's times their MAMF fp8 ratio (3432.5/4500 over 3615.6/5000)."""
    g = Gemm(16384, 16384, 16384, bits=8)
    h100, gb200, b200 = DEVICES["H100"], DEVICES["GB200"], DEVICES["B200"]
    share_h100 = g.flops / gemm_time(h100, g) / 1979e12
    share_gb200 = g.flops / gemm_time(gb200, g) / 5000e12
    assert share_gb200 / share_h100 == pytest.approx((2906.9 / 5000) / (1377.3 / 1979), rel=1e-6)
    assert b200.fp8_efficiency / gb200.fp8_efficiency == pytest.approx(
        (3432.5 / 4500) / (3615.6 / 5000)
    )
    # Sustained fp8 on Blackwell holds less of its peak than bf16 does (power limit).
    assert gb200.fp8_efficiency < gb200.efficiency


def test_blackwell_shape_terms_reproduce_the_xla_sm100_table():
    """With its fitted terms (352 K elements a tile, 5 us a kernel) and the table's own
    main-loop fraction 0.83, B200's kernel model gives OpenXLA's sm_100 bf16 rates
    (blob 3873df5) within the fit's spread: 4 x 4096^3 at 1690.7 TFLOP/s, 4096^2 x 4096
    at 1416.5 and, with a short K, 4096^2 x 512 at 780.2 (tiles and waves alone would
    give the same rate at every K)."""
    b200 = replace(DEVICES["B200"], efficiency=0.83, memory_efficiency=1.0)
    for (batch, m, n, k), measured in (
        ((4, 4096, 4096, 4096), 1690.7e12),
        ((1, 4096, 4096, 4096), 1416.5e12),
        ((1, 4096, 4096, 512), 780.2e12),
    ):
        g = Gemm(m, n, k, batch=batch)
        assert g.flops / gemm_time(b200, g) == pytest.approx(measured, rel=0.05)


def test_blackwell_device_figures_are_the_datasheets():
    """GB200 (NVL72 datasheet, per GPU): 2.5 PFLOP/s bf16 and 5 fp8 dense, 186 GB HBM3e at
    8 TB/s; B200 (HGX B200 datasheet): 2.25 and 4.5, 180 GB at 8 TB/s; 148 SMs; memory-
    bound kernels at H200's measured HBM3e share (BabelStream Copy 4.01 of 4.8 TB/s)."""
    for name, peak, memory in (("GB200", 2.5e15, 186e9), ("B200", 2.25e15, 180e9)):
        d = DEVICES[name]
        assert (d.peak_flops, d.fp8_flops, d.memory_bytes) == (peak, 2 * peak, memory)
        assert (d.memory_bandwidth, d.units) == (8e12, 148)
        assert d.stream_bandwidth == pytest.approx(8e12 * 4.01 / 4.8)
        assert (d.tile_k_overhead, d.gemm_kernel_s) == (352, 5e-6)


def test_hoppers_share_at_its_best_shape_is_its_gemm_model_there():
    """H100's fraction at the MAMF shape (2048 x 2048 x 13312 in bf16: 8 x 16 = 128 tiles,
    one wave of 132 SMs) is the fitted fraction times the shape terms' cost there: each
    tile pays 136 more K elements and the kernel 6 us (devices.H100_TILE_K_OVERHEAD,
    H100_GEMM_KERNEL_S), worked out by hand."""
    bare = 132 * 2 * 256 * 128 * 13312 / (989e12 * H100_GEMM_EFFICIENCY)
    with_terms = 132 * 2 * 256 * 128 * (13312 + 136) / (989e12 * H100_GEMM_EFFICIENCY) + 6e-6
    assert hopper_at_best_shape(16) == pytest.approx(H100_GEMM_EFFICIENCY * bare / with_terms)


def test_a_large_b200_gemm_runs_at_that_fraction_of_its_peak_plus_the_shape_terms():
    """An 8192 x 9472 x 8192 GEMM fills 32 x 74 = 2368 tiles of 256 x 128, exactly 16
    waves over 148 SMs, each tile's K of 8192 paying 352 more at the 16-bit rate, and the
    kernel 5 us (bf16 2.25, fp8 4.5 PFLOP/s dense), worked out by hand."""
    b200 = DEVICES["B200"]
    tile = 148 * 2 * 256 * 128  # FLOPs a wave does per unit of K
    bf16 = b200.efficiency * 2.25e15
    g = Gemm(8192, 9472, 8192)
    assert gemm_time(b200, g) == pytest.approx(16 * tile * (8192 + 352) / bf16 + 5e-6)
    fp8 = b200.fp8_efficiency * 4.5e15
    g8 = g.in_bits(8)
    assert gemm_time(b200, g8) == pytest.approx(16 * tile * (8192 / fp8 + 352 / bf16) + 5e-6)
