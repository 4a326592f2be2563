"""The language-model loss as memory traffic (issue 31): bytes per logit counted from each
implementation's kernels, placed on the last stage's passes, and chosen per published run
from its framework's release."""

import pytest

from simulator.errors import CcsimError
from simulator.validate.training import load_runs
from simulator.workload.generators import megatron
from simulator.workload.model import CROSS_ENTROPY_BYTES, Transformer

GPT_1_7B = Transformer(layers=24, hidden=2048, seq=4096, vocab=131072, heads=16)


def test_unfused_loss_of_the_readme_1_7b_row_by_hand():
    """Megatron-Core's unfused cross-entropy, one line of cross_entropy.py a kernel:
    forward .float() (2 read + 4 written), max (4), -= max (4 + 4), exp (4 + 4), sum (4),
    /= sum (4 + 4) = 38 bytes a logit; backward *= grad (4 + 4) and the cast back to bf16
    (4 + 2) = 14. One 4,096-token sequence of the 1.7B row (V = 131,072, TP 1) moves
    4096 x 131072 x 52 bytes, 8.3 ms at H100's 3.35 TB/s."""
    assert CROSS_ENTROPY_BYTES["unfused"] == (2 + 4 + 4 + 8 + 8 + 4 + 8, 8 + 6)
    forward = GPT_1_7B.cross_entropy_bytes(4096)
    backward = GPT_1_7B.cross_entropy_bytes(4096, backward=True)
    assert forward == 4096 * 131072 * 38 and backward == 4096 * 131072 * 14
    assert (forward + backward) / 3.35e12 == pytest.approx(8.33e-3, rel=1e-3)


def test_fused_kernels_move_less_and_tp_splits_the_vocabulary():
    """The native fusion keeps the fp32 copy (22 + 6 bytes a logit); Transformer Engine's
    Triton kernels read the bf16 logits once forward and once backward, writing the
    gradient in place (2 + 4). A TP rank holds V / t of every token's logits."""
    tokens = 4096
    for impl, per_logit in (("fused", 22 + 6), ("te", 2 + 4)):
        both = GPT_1_7B.cross_entropy_bytes(tokens, impl=impl) + GPT_1_7B.cross_entropy_bytes(
            tokens, impl=impl, backward=True
        )
        assert both == tokens * 131072 * per_logit
    assert GPT_1_7B.cross_entropy_bytes(tokens, tp=8) == GPT_1_7B.cross_entropy_bytes(tokens) / 8
    with pytest.raises(CcsimError, match="cross_entropy must be one of"):
        GPT_1_7B.cross_entropy_bytes(tokens, impl="liger")


def _elementwise_bytes(step, rank, kind):
    return {
        op.label: op.mem_bytes
        for op in step.ops
        if op.rank == rank and op.kind == "compute" and op.label.startswith(f"{kind} elementwise")
    }


def test_the_loss_runs_on_the_last_stage_only_once_per_pass():
    """With PP 2 the last stage's forward and backward memory-bound ops carry the loss's
    bytes for its micro-batch (the difference between unfused and TE is 36 and 10 bytes a
    logit of V / t), the first stage's none."""
    model = Transformer(layers=4, hidden=256, seq=512, vocab=4096, heads=4)
    common = dict(tp=2, pp=2, dp=1, micro_batch=2, global_batch=4)
    unfused = megatron(model, cross_entropy="unfused", **common)
    te = megatron(model, cross_entropy="te", **common)
    logits = 2 * 512 * 4096 / 2  # tokens x V / t
    last = 2  # rank order TP, DP, PP: ranks 2 and 3 are the last stage
    for kind, gap in (("fwd", 36), ("bwd", 10)):
        a, b = _elementwise_bytes(unfused, last, kind), _elementwise_bytes(te, last, kind)
        assert a and a.keys() == b.keys()
        assert all(a[k] - b[k] == pytest.approx(logits * gap) for k in a)
        assert _elementwise_bytes(unfused, 0, kind) == _elementwise_bytes(te, 0, kind)
    # Megatron-Core's own default is the unfused loss.
    default = megatron(model, **common)
    assert _elementwise_bytes(default, last, "fwd") == _elementwise_bytes(unfused, last, "fwd")


def test_published_runs_get_their_frameworks_loss():
    """Megatron-LM r0.8 (the README's table) and NeMo 24.07 ran Megatron-Core's default;
    NeMo 2.0 fuses it from 24.09 (DGX Cloud's recipes); Megatron-Bridge's performance
    scripts run Transformer Engine's kernels from 25.11 and the native fusion before."""
    runs = {run.id: run for run in load_runs()[0]}
    loss = {rid: runs[rid].options.get("cross_entropy") for rid in (
        "megatron-lm-readme-gpt-1.7b-h100-bf16-48",
        "nemo-24.07-nemotron3-8b-h100-fp8-64",
        "dgxc-v25.01-llama3-8b-h100-fp8-8",
        "bridge-25.11-llama3-8b-b200-fp8-8",
    )}  # fmt: skip
    assert list(loss.values()) == [None, None, "fused", "te"]
    assert {run.options.get("cross_entropy") for run in runs.values() if "25.09" in run.source
            and run.kind == "megatron-bridge-performance-summary"} == {"fused"}  # fmt: skip
