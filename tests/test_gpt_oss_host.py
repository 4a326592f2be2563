"""gpt-oss's own host launches (issue 31): YaRN's unfused rotary embedding on q and k and
the clamps of its activation, counted operation by operation from Megatron-Core's source
(rope_utils.py, fused_bias_geglu.py at core_v0.17.0) and PyTorch's autograd, not read
off the code; and a host-bound step that takes exactly that many more launches."""

from __future__ import annotations

import pytest

from simulator.workload.host import (
    GLU_CLAMP_KERNELS,
    UNFUSED_ROPE_KERNELS,
    moe_layer_ops,
)
from simulator.workload.model import MODELS, Transformer
from tests.test_moe_host import _step

# _apply_rotary_pos_emb_bshd on one tensor (q or k), forward, non-interleaved, with
# YaRN's mscale (rope_utils.py lines 110-126 at core_v0.17.0); the slices and the chunk
# are views and launch nothing.
ROPE_FORWARD = [
    "torch.cos(freqs)", "* mscale", ".to(t.dtype)",
    "torch.sin(freqs)", "* mscale", ".to(t.dtype)",
    "t * cos_", "_rotate_half: -x2", "_rotate_half: torch.cat((-x2, x1))", "* sin_",
    "(t * cos_) + (...)", "torch.cat((t, t_pass))",
]  # fmt: skip
# Its gradient with respect to t (freqs needs none): autograd's kernels.
ROPE_BACKWARD = [
    "grad * cos_", "grad * sin_", "neg's gradient", "chunk's gradient (a cat)",
    "t_pass slice's zero-filled gradient", "sum of the two products' paths",
    "sum with the pass-through slice's",
]  # fmt: skip
# weighted_bias_quick_geglu_impl with clamp_value (fused_bias_geglu.py lines 422-434):
# what runs outside the compiled activation.
CLAMP_FORWARD = ["x_glu.clamp(max=7)", "x_linear.clamp(-7, 7)", "torch.cat",
                 "torch.tensor(linear_offset, device=cuda): a host-to-device copy"]  # fmt: skip
# clamp_backward (PyTorch FunctionsManual.cpp): max alone, where(self <= max, grad, 0);
# both, where((self >= min).logical_and_(self <= max), grad, 0); the chunk's gradient.
CLAMP_BACKWARD = ["self <= max", "where", "self >= min", "self <= max", "logical_and_",
                  "where", "chunk's gradient (a cat)"]  # fmt: skip


def test_unfused_rope_launches_counted_op_by_op():
    """12 kernels a tensor forward and 7 backward instead of the fused kernel's one each
    way: on q and k, 22 more forward and 12 more backward in the attention part."""
    assert UNFUSED_ROPE_KERNELS == (len(ROPE_FORWARD), len(ROPE_BACKWARD)) == (12, 7)
    fused = moe_layer_ops(local_experts=16, ep=8)
    unfused = moe_layer_ops(local_experts=16, ep=8, unfused_rope=True)
    assert unfused.attention.forward() - fused.attention.forward() == 2 * (12 - 1)
    assert unfused.attention.backward() - fused.attention.backward() == 2 * (7 - 1)
    # Nothing else moves; a graphed attention launches its one replay either way.
    assert unfused.forward() - fused.forward() == 22
    graphed = dict(local_experts=16, ep=8, graphs=["attn"])
    assert moe_layer_ops(**graphed, unfused_rope=True) == moe_layer_ops(**graphed)


def test_clamp_launches_counted_op_by_op():
    """4 kernels forward (two clamps, their concatenation, the offset's copy) and 7
    backward in the experts' part; the recomputed activation runs the 4 again."""
    assert GLU_CLAMP_KERNELS == (len(CLAMP_FORWARD), len(CLAMP_BACKWARD)) == (4, 7)
    plain = moe_layer_ops(local_experts=2, ep=64, dispatcher="hybridep", expert_bias=True)
    clamped = moe_layer_ops(
        local_experts=2, ep=64, dispatcher="hybridep", expert_bias=True, glu_clamp=True
    )
    again = moe_layer_ops(
        local_experts=2,
        ep=64,
        dispatcher="hybridep",
        expert_bias=True,
        glu_clamp=True,
        recompute_act=True,
    )
    assert clamped.experts.forward() - plain.experts.forward() == 4
    assert clamped.experts.backward() - plain.experts.backward() == 7
    assert again.experts.backward() - plain.experts.backward() == 7 + 4
    assert again.forward() == clamped.forward()
    # A full-iteration CUDA graph launches nothing per layer.
    full = dict(local_experts=2, ep=64, graphs=["full_iteration"])
    assert moe_layer_ops(**full, glu_clamp=True, unfused_rope=True).forward() == 0


# A small gpt-oss: 2 MoE layers of 16 clamped quick-GEGLU experts with biases, 2 routed a
# token, YaRN rotary embeddings; a few microseconds of GPU work a layer, stepped on 2
# H100s (EP 2) by test_moe_host's _step.
SMALL = Transformer(layers=2, hidden=256, seq=256, vocab=0, heads=4, gated=True, experts=16,
                    top_k=2, moe_ffn=512, glu_clamp=True, expert_bias=True,
                    yarn_scale=32.0)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "forward", "backward"),
    [
        ({}, 22 + 4, 12 + 7),
        ({"fused_yarn_rope": True}, 4, 7),
        ({"recompute_moe_act": True}, 22 + 4, 12 + 7 + 4),
    ],
)
def test_host_bound_gpt_oss_step_takes_its_own_launches(options, forward, backward):
    """At 1 s an operation the host is far slower than the GPU: a second more an
    operation is 3 x 2 x (F + B) seconds more a step (3 micro-batches, each a forward
    and a backward over 2 MoE layers), F and B the layer's counts: the configuration's
    without gpt-oss's launches (the same builder, flags off) plus the hand counts above
    (YaRN's rotary embedding only where Megatron-Core runs it unfused; the clamps again
    where the activation is recomputed)."""
    base = moe_layer_ops(local_experts=8, ep=2, expert_bias=True)
    f = base.forward() + forward
    b = base.backward() + backward
    slow = _step(SMALL, host_op_s=2.0, host_tensor_op_s=0.5, **options)
    fast = _step(SMALL, host_op_s=1.0, host_tensor_op_s=0.5, **options)
    assert slow - fast == pytest.approx(3 * 2 * (f + b), rel=1e-9)


def test_gpt_oss_model_file_has_both_terms():
    """The bundled gpt-oss 120B carries YaRN (scale 32) and the clamped activation, so
    its rows get both terms where the run is eager."""
    m = MODELS["gpt-oss-120b"]
    assert m.yarn_scale > 1 and m.glu_clamp and m.gated
