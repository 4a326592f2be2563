"""gpt-oss's own terms (issue 31): sliding-window attention on alternate layers, heads of
64 at their measured attention rate, and the clamped GLU's extra kernels. Each figure is
counted by hand from the sources the code cites (Megatron-Core, PyTorch's autograd,
the FlashAttention-3 paper's head-64 panels), not read off the code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.validate.training import load_runs
from simulator.workload.devices import DEVICES
from simulator.workload.generators import flash_core_kernels, megatron
from simulator.workload.kernels import Attention, attention_time
from simulator.workload.model import MODELS, Transformer

GPT_OSS = MODELS["gpt-oss-120b"]

TINY = Transformer(layers=4, hidden=512, seq=1024, vocab=0, heads=8, gated=True, experts=16,
                   top_k=4, moe_ffn=256, dropout=False)  # fmt: skip


def test_gpt_oss_model_file_is_megatron_bridges_provider():
    """36 layers, hidden 2880, 64 heads of 64 over 8 groups, 128 experts top-4 of 2880,
    vocabulary 201,088 (GPTOSSProvider120B); 116.8 B parameters by hand: per layer the
    attention 2 x 2880 x 64 x 64 + 2 x 2880 x 8 x 64 = 26,542,080, 128 experts of
    3 x 2880^2 = 24,883,200 each, the router 2880 x 128; two embeddings of 201,088 x 2880
    (biases and norms left out, as ccsim counts)."""
    m = GPT_OSS
    per_layer = 26_542_080 + 128 * 24_883_200 + 2880 * 128
    assert m.params == 36 * per_layer + 2 * 201_088 * 2880
    assert round(m.params / 1e9, 1) == 116.8
    assert (m.window, m.full_attention_every, m.glu_clamp, m.expert_bias) == (128, 2, True, True)
    assert m.yarn_scale == 32.0


def test_published_gpt_oss_runs_take_the_model_files_features():
    runs, _ = load_runs()
    windowed = {r.model.name for r in runs if r.model.window}
    clamped = {r.model.name for r in runs if r.model.glu_clamp}
    assert windowed == clamped == {"gpt-oss-120b"}


def test_windowed_layers_follow_megatron_cores_rule():
    """is_layer_window_attention: layer n (from 1) is windowed unless n is a multiple of
    window_attn_skip_freq: layers 1, 3, ..., 35 of gpt-oss's 36; of 5 layers at every
    third full, 1, 2, 4, 5."""
    assert GPT_OSS.windowed_layers == 18
    five = Transformer(layers=5, hidden=64, window=8, full_attention_every=3)
    assert five.windowed_layers == 4
    assert replace(five, full_attention_every=0).windowed_layers == 5
    assert replace(five, window=0).windowed_layers == 0


@pytest.mark.parametrize("seq, window", [(4096, 128), (1000, 7), (300, 299)])
def test_window_keys_give_the_bands_flops(seq, window):
    """The band's score entries, summed query by query (query i sees min(i + 1, w)
    keys), against Attention's causal count q k / 2 with k = window_keys: equal to
    within the rounding of k (half a key a query). A window holding the whole sequence
    is the causal kernel itself (k = s, as ccsim counts causal attention)."""
    m = Transformer(layers=1, hidden=64, seq=seq, window=window)
    band = sum(min(i + 1, window) for i in range(seq))
    assert abs(seq * m.window_keys() / 2 - band) <= seq / 4
    assert replace(m, window=seq).window_keys() == seq


def test_gpt_oss_attention_kernels_are_the_mean_layer():
    """One micro-batch of gpt-oss on one rank: 64 sequence-heads a layer, half of them
    (18 of 36 layers windowed) against 252 keys, half against 4,096; the pass's FLOPs
    are the model's mean layer's, 64 x 64 x 4096 x 2 x (4096 + 252) / 2 a layer."""
    kernels = flash_core_kernels(GPT_OSS, 1, tp=1, layers=9, forward=True)
    assert kernels == [[32, 4096, 4096, 64, 9, 0], [32, 4096, 252, 64, 9, 0]]
    flops = sum(Attention(*k).flops for k in kernels)
    assert flops == 9 * 64 * 64 * 4096 * 2 * (4096 + 252) / 2
    backward = flash_core_kernels(GPT_OSS, 1, tp=1, layers=9, forward=False)
    assert [k[-1] for k in backward] == [1, 1]
    # Without a window, one kernel as before.
    plain = flash_core_kernels(replace(GPT_OSS, window=0), 1, tp=1, layers=9, forward=True)
    assert plain == [[64, 4096, 4096, 64, 9, 0]]


def test_head_64_attention_runs_at_the_measured_rate():
    """FlashAttention-3 paper, H100 SXM5, head 64, cuDNN: causal forward 363 TFLOP/s at
    4k; backward non-causal 417 times the causal/non-causal forward ratio 363/408;
    head 128 unchanged (518); head 96 halfway between the two forward rates."""
    h100 = DEVICES["H100"]
    assert h100.attention_rate(4096, head_dim=64) == pytest.approx(363e12)
    assert h100.attention_rate(4096, True, head_dim=64) == pytest.approx(417e12 * 363 / 408)
    assert h100.attention_rate(4096, head_dim=128) == pytest.approx(518e12)
    assert h100.attention_rate(4096, head_dim=96) == pytest.approx((363e12 + 518e12) / 2)
    # FlashAttention-2's head-64 panel: causal forward 284 TFLOP/s at 4k.
    assert h100.attention_rate(4096, backend=1, head_dim=64) == pytest.approx(284e12)


def test_a_window_kernel_runs_at_the_short_sequence_rate():
    """A windowed kernel (252 keys) is timed at the table's shortest length (512 tokens:
    cuDNN head 64, 225 TFLOP/s forward); a causal one at its queries' length."""
    h100 = DEVICES["H100"]
    window = Attention(32, 4096, 252, 64)
    assert attention_time(h100, window) == pytest.approx(2 * 32 * 4096 * 252 * 64 / 225e12)
    full = Attention(32, 4096, 4096, 64)
    assert attention_time(h100, full) == pytest.approx(2 * 32 * 4096 * 4096 * 64 / 363e12)


def test_clamped_glu_bytes_counted_kernel_by_kernel():
    """Per routed copy with halves of f bf16 elements (2 f bytes each): forward
    x_glu.clamp (reads 2f, writes 2f), x_linear.clamp (the same), torch.cat (reads 4f,
    writes 4f); backward le + where for the first clamp (2f + f, then f + 2f + 2f), ge,
    le, logical_and_, where for the second (2f + f, 2f + f, f + f + f, f + 2f + 2f), and
    the chunk's gradient cat (4f + 4f)."""
    m = replace(TINY, glu_clamp=True)
    f = 256
    forward = (2 + 2) * f + (2 + 2) * f + (4 + 4) * f
    backward = (3 + 5) * f + (3 + 3 + 3 + 5) * f + 8 * f
    copies = 1024 * 4
    assert m.glu_clamp_bytes(1024) == (copies * forward, copies * backward)
    assert m.glu_clamp_bytes(1024, recompute=True)[1] == copies * (backward + forward)
    assert TINY.glu_clamp_bytes(1024) == (0.0, 0.0)


def _elementwise(model: Transformer, **options) -> tuple[float, float]:
    step = megatron(model, tp=1, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0,
                    moe_routing="even", recompute="none", **options)  # fmt: skip
    found = {}
    for op in step.ops:
        if op.rank == 0 and op.label.endswith("elementwise mb 0"):
            found[op.label.split()[0]] = op.mem_bytes
    return found["fwd"], found["bwd"]


def test_generator_adds_the_clamps_and_the_recomputed_activation():
    """TINY's 4 MoE layers x 1,024 tokens x 4 copies: the clamps' 16 f and 30 f bytes a
    copy; with moe_act recomputed, the clamps' 16 f and the fused activation's 6 f
    (reads gate and up, writes their product) again in the backward."""
    copies = 4 * 1024 * 4
    f = 256
    fwd, bwd = _elementwise(TINY)
    fwd_c, bwd_c = _elementwise(replace(TINY, glu_clamp=True))
    assert (fwd_c - fwd, bwd_c - bwd) == pytest.approx((copies * 16 * f, copies * 30 * f))
    fwd_r, bwd_r = _elementwise(replace(TINY, glu_clamp=True), recompute_moe_act=True)
    assert fwd_r == fwd_c
    assert bwd_r - bwd_c == pytest.approx(copies * (16 + 6) * f)
    # Without the clamps the recompute is the activation's 6 f alone.
    _, bwd_plain = _elementwise(TINY, recompute_moe_act=True)
    assert bwd_plain - bwd == pytest.approx(copies * 6 * f)


def test_unfused_yarn_rope_bytes_counted_op_by_op():
    """gpt-oss's q and k: 64 x 64 + 8 x 64 = 4,608 bf16 elements a token. Forward
    (rope_utils._apply_rotary_pos_emb_bshd): t * cos (2 + 2), the negated half (2 + 2 on
    half the elements), the rotated concatenation (2 + 2), * sin (2 + 2), the sum
    (4 + 2), the final concatenation (2 + 2); backward: two products' gradients
    (2 + 2 each), the negation's (1 + 1), the chunk's concatenation (2 + 2), the empty
    slice's zeros (2) and two gradient sums (4 + 2 each)."""
    forward = 4 + 2 + 4 + 4 + 6 + 4
    backward = 4 + 4 + 2 + 4 + 2 + 6 + 6
    assert (forward, backward) == (24, 28)
    elements = 4096 * 4608
    assert GPT_OSS.unfused_rope_bytes(4096) == (elements * forward, elements * backward)
    assert replace(GPT_OSS, yarn_scale=0.0).unfused_rope_bytes(4096) == (0.0, 0.0)


def test_generator_adds_yarns_unfused_rope_unless_fused():
    """TINY with YaRN: 8 heads + 8 groups of 64 = 1,024 elements a token; 4 layers x
    1,024 tokens of 24 bytes an element forward, 28 backward, none with the fused
    kernel (Megatron-Core before core_v0.16)."""
    yarn = replace(TINY, yarn_scale=32.0)
    fwd, bwd = _elementwise(TINY)
    fwd_y, bwd_y = _elementwise(yarn)
    elements = 4 * 1024 * 1024
    assert (fwd_y - fwd, bwd_y - bwd) == pytest.approx((elements * 24, elements * 28))
    assert _elementwise(yarn, fused_yarn_rope=True) == (fwd, bwd)


def test_only_gpt_oss_25_11_runs_fuse_yarns_rope():
    runs, _ = load_runs()
    fused = {r.id for r in runs if r.options.get("fused_yarn_rope")}
    assert fused == {r.id for r in runs if r.id.startswith("bridge-25.11-gpt-oss")}
