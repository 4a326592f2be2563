"""Blackwell's sustained GEMM fractions (issue 31): Hopper's fitted fractions carried over
by the ratio of the two GPUs' measured best-shape matmul rates, nothing fitted to a
Blackwell run."""

import pytest

from simulator.workload.devices import (
    DEVICES,
    H100_FP8_EFFICIENCY,
    H100_GEMM_EFFICIENCY,
    MAMF_FRACTION,
    hopper_at_best_shape,
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


def test_b200_keeps_hoppers_share_of_its_best_matmul():
    """B200's training fraction over its MAMF fraction equals H100's at its own best
    shape, per dtype: bf16 0.776 x (H100's / 0.803), fp8 0.763 x (H100's / 0.709)."""
    b200 = DEVICES["B200"]
    assert b200.efficiency / MAMF_FRACTION["B200"][16] == pytest.approx(
        hopper_at_best_shape(16) / MAMF_FRACTION["H100"][16]
    )
    assert b200.fp8_efficiency / MAMF_FRACTION["B200"][8] == pytest.approx(
        hopper_at_best_shape(8) / MAMF_FRACTION["H100"][8]
    )
    # fp8 holds more of its best matmul on Blackwell than on Hopper (76.3% vs 70.9%).
    assert b200.fp8_efficiency / b200.efficiency > H100_FP8_EFFICIENCY / H100_GEMM_EFFICIENCY


def test_hoppers_share_at_its_best_shape_is_its_gemm_model_there():
    """H100's fraction at the MAMF shape (2048 x 2048 x 13312 in bf16: 8 x 16 = 128 tiles,
    one wave of 132 SMs) is the fitted fraction times the shape terms' cost there: each
    tile pays 136 more K elements and the kernel 6 us (devices.H100_TILE_K_OVERHEAD,
    H100_GEMM_KERNEL_S), worked out by hand."""
    bare = 132 * 2 * 256 * 128 * 13312 / (989e12 * H100_GEMM_EFFICIENCY)
    with_terms = 132 * 2 * 256 * 128 * (13312 + 136) / (989e12 * H100_GEMM_EFFICIENCY) + 6e-6
    assert hopper_at_best_shape(16) == pytest.approx(H100_GEMM_EFFICIENCY * bare / with_terms)


def test_a_large_b200_gemm_runs_at_that_fraction_of_its_peak():
    """An 8192 x 9472 x 8192 GEMM fills 32 x 74 = 2368 tiles of 256 x 128, exactly 16
    waves over 148 SMs: its time is its FLOPs at the peak times the fraction (bf16 2.25,
    fp8 4.5 PFLOP/s dense)."""
    b200 = DEVICES["B200"]
    g = Gemm(8192, 9472, 8192)
    assert gemm_time(b200, g) == pytest.approx(g.flops / (2.25e15 * b200.efficiency))
    g8 = g.in_bits(8)
    assert gemm_time(b200, g8) == pytest.approx(g8.flops / (4.5e15 * b200.fp8_efficiency))
