"""Training-step predictions against published measurements (not fitted to them)."""

import functools

import pytest

from simulator.workload import run_workload
from simulator.workload.generators import megatron as megatron_core
from simulator.workload.model import Transformer

# The hand-worked steps here are for the options SC'21 ran (full recomputation, unfused
# attention, nothing overlapped) unless a test gives its own; Megatron-Core's defaults
# are tested in tests/test_megatron_defaults.py.
megatron = functools.partial(megatron_core, defaults="sc21")


@pytest.mark.parametrize(
    ("layers", "hidden", "heads", "tp", "gpus", "published"),
    [
        # Narayanan et al., SC'21, Table 1: the two smallest GPT rows (TFLOP/s per GPU,
        # batch 512, sequence 2048, full recomputation, DGX A100 servers).
        (24, 2304, 24, 1, 32, 137),
        (30, 3072, 32, 2, 64, 138),
    ],
)
def test_sc21_rows_are_predicted_within_ten_percent(layers, hidden, heads, tp, gpus, published):
    """Nothing in ccsim was fitted to these runs; micro-batch 4 is assumed (the paper does
    not give it), and fp16 gradients (2 bytes, reduced as such), as Megatron-LM's own
    GPT-3 175B example trains (--fp16). The README's table holds the larger rows
    (minutes each)."""
    model = Transformer(layers=layers, hidden=hidden, seq=2048, vocab=51200, heads=heads)
    step = megatron(
        model, tp=tp, pp=1, dp=gpus // tp, micro_batch=4, global_batch=512, grad_reduce="fp16"
    )
    _, result = run_workload(step, "dgx-a100", nodes=gpus // 8)
    # SC'21 counts the recomputed forward too (its eq. 3), unlike Megatron-LM today.
    per_gpu = model.step_flops(512, recompute=True) / result.step_s / gpus / 1e12
    assert per_gpu == pytest.approx(published, rel=0.10)
