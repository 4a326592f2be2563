"""Multi-head latent attention on Blackwell before Transformer Engine v2.5 (issue 31, h54g):
DeepSeek-V3's query/key heads of 192 have no fused backend there, so TE runs its unfused
attention (the scores through HBM). Each test checks a count worked by hand from the
sources the code cites, or a rule against the rows it names."""

from collections import Counter

import pytest

from simulator.validate.training import _unfused_attention, load_runs
from simulator.workload.generators import megatron
from simulator.workload.kernels import Gemm
from simulator.workload.model import Transformer

#: A small MLA model with DeepSeek-V3's head sizes (query/key 128 + 64 rotary, value 128)
#: and no dropout, as NeMo's DeepSeekConfig trains it (attention_dropout 0.0).
MLA = Transformer(
    layers=2,
    hidden=512,
    seq=1024,
    vocab=0,
    heads=8,
    head_size=128,
    q_lora_rank=256,
    kv_lora_rank=128,
    qk_rope_dim=64,
    v_head_dim=128,
    dropout=False,
)


def _entry(**changes):
    row = {
        "gpu": "GB200-NVL72",
        "container": "nvcr.io/nvidia/nemo:25.04.01",
        "cp": 1,
        "model": {"mla": {"qk_head_dim": 128, "qk_rope_dim": 64, "v_head_dim": 128}},
    }
    row.update(changes)
    return row


def _op(step, label):
    """Rank 0's op of ``label`` in a built step."""
    return next(o for o in step.ops if o.rank == 0 and o.label == label)


def test_deepseek_v3_softmax_bytes_by_hand():
    """DeepSeek-V3 at TP 2 (64 local heads), one 4,096-token sequence: the softmax reads
    and writes 64 x 4,096 x 4,096 bf16 scores, 2 + 2 bytes each = 4.295 GB a layer's
    forward; no dropout traffic at a dropout of 0 (PyTorch returns the input). With
    dropout (Megatron-LM's 0.1 default) it also reads and writes them and writes a 1-byte
    mask: 9 bytes a score."""
    v3 = next(r for r in load_runs()[0] if r.id == "dgxc-v25.05.04-deepseek-v3-gb200-bf16-128")
    model = v3.model
    assert not model.dropout and model.attention_heads == 128
    scores = 64 * 4096 * 4096
    assert model.scores_elementwise_bytes(4096, tp=2) == 4 * scores == pytest.approx(4.295e9, 1e-3)
    dense = Transformer(layers=1, hidden=1024, seq=4096, heads=128)  # dropout by default
    assert dense.scores_elementwise_bytes(4096, tp=2) == 9 * scores


def test_unfused_layer_runs_the_scores_through_hbm_and_recomputes_them():
    """Unfused, a layer's forward runs the scores as batched GEMMs with MLA's head sizes,
    Q K^T (s x s over 192) and P V (s x 128 over s) per local head, and the softmax over
    them; the backward runs both GEMMs' gradients and, with core_attn (selective)
    recomputation, the forward's GEMMs and softmax again first. Fused, none of it."""
    common = dict(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, sequence_parallel=True)
    unfused = megatron(MLA, flash_attention=False, recompute="selective", **common)
    plain = megatron(MLA, flash_attention=False, recompute="none", **common)
    fused = megatron(MLA, flash_attention=True, recompute="selective", **common)
    qk = Gemm(1024, 1024, 192, 4).times(2)  # 8 heads / TP 2, two layers
    pv = Gemm(1024, 128, 1024, 4).times(2)

    fwd = {tuple(g.as_list()) for g in _op(unfused, "fwd mb 0").gemms}
    assert {tuple(qk.as_list()), tuple(pv.as_list())} <= fwd
    bwd = Counter(tuple(g.as_list()) for g in _op(unfused, "bwd mb 0").gemms)
    kept = Counter(tuple(g.as_list()) for g in _op(plain, "bwd mb 0").gemms)
    grads = Counter(tuple(g.as_list()) for s in (qk, pv) for g in s.backward())
    assert all(kept[g] >= n for g, n in grads.items())  # (dV has P V's own shape)
    assert bwd - kept == Counter([tuple(qk.as_list()), tuple(pv.as_list())])
    assert not {tuple(qk.as_list()), tuple(pv.as_list())} & {
        tuple(g.as_list()) for g in _op(fused, "fwd mb 0").gemms
    }
    # The softmax: 4 bytes a score of the 4 local heads over 1,024 x 1,024, two layers,
    # in the forward; backward twice the forward's traffic, and the recomputed forward's
    # softmax once more with selective recomputation only.
    softmax = 2 * 4 * 4 * 1024 * 1024
    fwd_u, fwd_f = (_op(s, "fwd elementwise mb 0").mem_bytes for s in (unfused, fused))
    assert fwd_u - fwd_f == pytest.approx(softmax)
    bwd_u, bwd_p = (_op(s, "bwd elementwise mb 0").mem_bytes for s in (unfused, plain))
    assert bwd_u - 2 * fwd_u == pytest.approx(softmax)
    assert bwd_p - 2 * _op(plain, "fwd elementwise mb 0").mem_bytes == pytest.approx(0)


def test_which_runs_ran_unfused_attention():
    """TE <= v2.4 has no fused attention on sm100 for heads over 128 and no FlashAttention
    for MLA's unequal heads; NeMo's 25.04 containers build TE 2.2.0.dev0, its 25.07 one
    TE 2.5.0. Only DGX Cloud v25.05.04's GB200 DeepSeek-V3 rows qualify: not its H100
    rows (Hopper runs cuDNN's kernel), not Megatron-Bridge's Blackwell rows (25.09 on)."""
    rows = [r.id for r in load_runs()[0] if r.options.get("flash_attention") is False]
    assert sorted(rows) == [f"dgxc-v25.05.04-deepseek-v3-gb200-bf16-{n}" for n in (128, 256, 512)]
    assert _unfused_attention(_entry())
    assert _unfused_attention(_entry(gpu="B200-SXM-180GB"))
    assert not _unfused_attention(_entry(gpu="H100-SXM-80GB"))
    assert not _unfused_attention(_entry(container="nvcr.io/nvidia/nemo:25.07.01"))
    assert not _unfused_attention(_entry(cp=2))  # TE runs no unfused attention with CP
    # Equal heads of 192 (Nemotron-4 340B) may run FlashAttention-2: not this rule's.
    assert not _unfused_attention(_entry(model={"head_dim": 192}))
    # MLA with heads of 128 (qk 64 + 64 rotary) keeps the fused kernel.
    small = {"mla": {"qk_head_dim": 64, "qk_rope_dim": 64, "v_head_dim": 128}}
    assert not _unfused_attention(_entry(model=small))


def test_mla_unfused_rope_bytes_by_hand():
    """DeepSeek-V3 at TP 2 (64 local heads; query/key 128 + 64 rotary, value 128) on
    Megatron-Core's unfused RoPE path, 4,096 tokens. Rotary elements a token: 64 query
    heads and the one shared key head of 64, 4,160. Forward 28 bytes each: de-interleave
    cat 4, t * cos 4, the negated half 2, rotate-half cat 4, * sin 4, sum 6, final cat 4;
    backward 42: the same path's 28 and the two strided slices' gradients (zeros written,
    half copied in: 4 each) summed (6). The assembly, a head: query cat 4 x 192 = 768,
    key cat 2 x (2 x 128 + 64) = 640, value copy 4 x 128 = 512; backward the query's and
    kv's split gradients assembled 4 x 192 + 4 x 256 and the expand's sum 2 x 64: 1,920
    bytes both ways."""
    v3 = next(r for r in load_runs()[0] if r.id == "dgxc-v25.05.04-deepseek-v3-h100-bf16-512")
    fwd, bwd = v3.model.mla_unfused_rope_bytes(4096, tp=2)
    rotary = 64 * 64 + 64
    assert fwd == 4096 * (64 * (768 + 640 + 512) + rotary * 28) == 980_418_560
    assert bwd == 4096 * (64 * (768 + 1024 + 128) + rotary * 42)
    assert Transformer(layers=1, hidden=64, heads=4).mla_unfused_rope_bytes(10) == (0.0, 0.0)


def test_mla_up_proj_recompute_and_unfused_rope_in_the_step():
    """The generator adds the unfused path's bytes to every layer's passes, and with
    "mla_up_proj" recomputation the backward runs the up projections (q_lora 256 -> 4
    heads x 192; kv_lora 128 -> 4 x 256, over 1,024 tokens at TP 2) and that path's
    forward again; with full recomputation nothing more."""
    common = dict(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, sequence_parallel=True)
    base = megatron(MLA, **common)
    rope = megatron(MLA, mla_fused_rope=False, **common)
    up = megatron(MLA, mla_fused_rope=False, recompute_mla_up_proj=True, **common)
    full = megatron(MLA, mla_fused_rope=False, recompute="full", **common)
    full_up = megatron(
        MLA, mla_fused_rope=False, recompute="full", recompute_mla_up_proj=True, **common
    )

    fwd, bwd = (2 * x for x in MLA.mla_unfused_rope_bytes(1024, tp=2))  # two layers
    for kind, extra in (("fwd", fwd), ("bwd", bwd)):
        label = f"{kind} elementwise mb 0"
        assert _op(rope, label).mem_bytes - _op(base, label).mem_bytes == pytest.approx(extra)
    label = "bwd elementwise mb 0"
    assert _op(up, label).mem_bytes - _op(rope, label).mem_bytes == pytest.approx(fwd)
    kept, again = (
        Counter(tuple(g.as_list()) for g in _op(s, "bwd mb 0").gemms) for s in (rope, up)
    )
    q_up, kv_up = Gemm(1024, 4 * 192, 256).times(2), Gemm(1024, 4 * 256, 128).times(2)
    assert again - kept == Counter([tuple(q_up.as_list()), tuple(kv_up.as_list())])
    assert _op(full_up, "bwd mb 0").gemms == _op(full, "bwd mb 0").gemms
    assert _op(full_up, label).mem_bytes == _op(full, label).mem_bytes


def test_rows_reading_mla_settings():
    """DGX Cloud v25.05.04's DeepSeek-V3 runs (NeMo's DeepSeekConfig: apply_rope_fusion
    False) take the unfused RoPE path, no other row; every DeepSeek-V3 row whose
    recompute_modules list mla_up_proj recomputes it."""
    runs = load_runs()[0]
    unfused = sorted(r.id for r in runs if r.options.get("mla_fused_rope") is False)
    assert unfused == sorted(
        [f"dgxc-v25.05.04-deepseek-v3-gb200-bf16-{n}" for n in (128, 256, 512)]
        + [f"dgxc-v25.05.04-deepseek-v3-h100-bf16-{n}" for n in (512, 1024)]
    )
    up = {r.id for r in runs if r.options.get("recompute_mla_up_proj")}
    assert "dgxc-v25.05.04-deepseek-v3-h100-bf16-512" in up
    assert "bridge-26.04.01-deepseek-v3-b200-mxfp8-256" in up
    assert not any("gb200-bf16" in rid and rid.startswith("dgxc") for rid in up)  # core_attn
    assert all(r.model.is_mla for r in runs if r.id in up)
