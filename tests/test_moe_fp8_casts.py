"""An MoE layer's fp8 casts (``Transformer.moe_fp8_cast_bytes``): Transformer Engine's
GroupedLinear quantizes every routed copy's input and output gradient
(transformer_engine/pytorch/module/grouped_linear.py at v2.8, ``tex.split_quantize``),
and the MoE layer's MLP sits behind a separate norm (Megatron-Core's MoE layer spec), so
its casts are the experts', not a dense MLP's; with TE's fused grouped MLP
(``Transformer.fused_grouped_mlp_bytes``) the activation and two of those casts run in
the GEMMs' epilogues. Figures worked by hand from the list of tensors TE quantizes and
the bytes an element of each cast (``fp8_cast_cost``)."""

import pytest

from simulator.errors import CcsimError
from simulator.search.space import Candidate, Hardware, estimate
from simulator.validate.training import load_runs
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron
from simulator.workload.model import MODELS, Transformer

#: Qwen3 30B-A3B as the published rows give it (48 layers, h 2048, 32 heads of 128, 4
#: KV heads, 128 experts of 768, top 8).
QWEN3_30B = Transformer(layers=48, hidden=2048, seq=4096, vocab=151936, ffn=6144, gated=True,
                        heads=32, kv_heads=4, head_size=128, experts=128, top_k=8,
                        moe_ffn=768, dropout=False)  # fmt: skip
TINY = Transformer(layers=4, hidden=512, seq=1024, vocab=0, heads=8, gated=True, experts=16,
                   top_k=4, moe_ffn=256, dropout=False)  # fmt: skip


def test_qwen3_30b_mxfp8_per_token_by_hand():
    """MXFP8 (every cast writes two 1-byte copies with 1/32 byte of scale each, and
    reads bf16: 4.0625 bytes an element, norm-fused or not). Forward a token: QKV's
    input (h = 2048), the projection's (32 x 128 = 4096), and per routed copy (8) fc1's
    input (2048) and fc2's (768): 4.0625 x 28,672 = 116,480 bytes. Backward: QKV's
    output gradient ((32 + 2 x 4) x 128 = 5120), the projection's (2048), per copy fc2's
    (2048) and fc1's (2 x 768): 4.0625 x 35,840 = 145,600."""
    kw = {"recipe": "mxfp8", "transpose": False}
    assert QWEN3_30B.moe_fp8_cast_bytes(1, **kw) == pytest.approx(116_480)
    assert QWEN3_30B.moe_fp8_cast_bytes(1, backward=True, **kw) == pytest.approx(145_600)
    # The dense layer's count it replaces: the MLP's FC1 input once (2048) and FC2's
    # (6144), 4.0625 x 14,336 = 58,240 forward.
    assert QWEN3_30B.fp8_cast_bytes(1, **kw) == pytest.approx(58_240)


def test_hopper_current_scaling_per_token_by_hand():
    """Per-tensor current scaling on Hopper (an amax pass, then a cast writing the
    row-wise copy and its transpose): 6 bytes an element cast on its own, 4 after a
    LayerNorm (the norm writes bf16 and the amax). Forward: 4 x 2048 + 6 x (4096 + 8 x
    (2048 + 768)) = 167,936; backward: 6 x (5120 + 2048 + 8 x (2048 + 1536)) = 215,040."""
    kw = {"recipe": "tensorwise", "transpose": True}
    assert QWEN3_30B.moe_fp8_cast_bytes(1, **kw) == pytest.approx(167_936)
    assert QWEN3_30B.moe_fp8_cast_bytes(1, backward=True, **kw) == pytest.approx(215_040)


def test_shared_experts_and_expert_tp_by_hand():
    """A shared expert of f = 256 (TE linears behind the separate norm: both inputs cast
    on their own) and expert TP 2 (each rank's experts take twice the copies, half the
    FFN). Delayed scaling on Hopper: 4 bytes an element on its own, 1 after a norm.
    TINY with one shared expert, forward a token: QKV's input 1 x 512, the projection's
    4 x 512, the shared expert's 4 x (512 + 256), the routed copies 4 x 4 x 2 x (512 +
    128); backward 4 x (QKV (8 + 16) x 64 + 512 + shared (512 + 512) + 8 copies x (512 +
    256))."""
    m = Transformer(layers=4, hidden=512, seq=1024, vocab=0, heads=8, gated=True,
                    experts=16, top_k=4, moe_ffn=256, shared_experts=1)  # fmt: skip
    fwd = 512 + 4 * 512 + 4 * (512 + 256) + 4 * 4 * 2 * (512 + 128)
    bwd = 4 * (24 * 64 + 512 + (512 + 512) + 8 * (512 + 256))
    assert m.moe_fp8_cast_bytes(1, etp=2) == pytest.approx(fwd)
    assert m.moe_fp8_cast_bytes(1, etp=2, backward=True) == pytest.approx(bwd)


def test_generator_builds_the_routed_casts():
    """TINY on 8 ranks with HybridEP (no fp8 padding copies) and even routing: the fp8
    step's MoE layers move, beyond the bf16 step's, 4 layers x 1,024 tokens x the casts
    a token (MXFP8, by hand as above: forward 4.0625 x (512 + 512 + 4 x (512 + 256)),
    backward 4.0625 x (1536 + 512 + 4 x (512 + 512))); ``moe_routed_casts=False`` keeps
    the earlier build, the dense layer's forward casts (4.0625 x (2 x 512 + 512 +
    2048))."""

    def elementwise(precision: str, **kw) -> tuple[float, float]:
        step = megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0,
                        moe_routing="even", moe_dispatcher="hybridep", precision=precision,
                        fp8_recipe="mxfp8", **kw)  # fmt: skip
        found = {}
        for op in step.ops:
            if op.rank == 0 and op.label.endswith("elementwise mb 0"):
                found[op.label.split()[0]] = op.mem_bytes
        return found["fwd"], found["bwd"]

    bf16 = elementwise("bf16")
    fp8 = elementwise("fp8")
    per = 4 * 1024 * 4.0625
    assert fp8[0] - bf16[0] == pytest.approx(per * (512 + 512 + 4 * (512 + 256)))
    assert fp8[1] - bf16[1] == pytest.approx(per * (1536 + 512 + 4 * (512 + 512)))
    old = elementwise("fp8", moe_routed_casts=False)
    assert old[0] - bf16[0] == pytest.approx(per * (2 * 512 + 512 + 2048))


H100 = Hardware(8, DEVICES["H100"], 450e9, 50e9)


def test_estimate_and_generator_ask_for_the_same_moe_casts(monkeypatch):
    """The search's estimate asks for the MoE layers' casts the generator builds (the
    same ``moe_fp8_cast_bytes`` calls), so the two cannot drift apart."""
    model = MODELS["mixtral-8x7b"]
    seen: dict[str, set] = {"estimate": set(), "generator": set()}
    original = Transformer.moe_fp8_cast_bytes
    where = "estimate"

    def spy(self, tokens, **kwargs):
        k = {"recipe": "delayed", "transpose": True, **kwargs}
        seen[where].add((tokens, k["tp"], k.get("backward", False), k["recipe"],
                         k["transpose"], k.get("sequence_parallel", False)))  # fmt: skip
        return original(self, tokens, **kwargs)

    monkeypatch.setattr(Transformer, "moe_fp8_cast_bytes", spy)
    c = Candidate(2, 1, 4, 1, "none", sequence_parallel=True, precision="fp8", ep=4)
    estimate(model, c, 8, H100)
    where = "generator"
    megatron(model=model, global_batch=8, **c.params())
    assert seen["estimate"] and seen["estimate"] == seen["generator"]


def _moe_elementwise(model: Transformer, **kw) -> tuple[float, float]:
    """Rank 0's first micro-batch's memory-bound bytes (forward, backward)."""
    step = megatron(model, tp=1, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0,
                    moe_routing="even", moe_dispatcher="hybridep", precision="fp8",
                    fp8_recipe="mxfp8", **kw)  # fmt: skip
    found = {}
    for op in step.ops:
        if op.rank == 0 and op.label.endswith("elementwise mb 0"):
            found[op.label.split()[0]] = op.mem_bytes
    return found["fwd"], found["bwd"]


def test_fused_grouped_mlp_drops_the_activation_and_its_casts():
    """Transformer Engine's fused grouped MLP (GEMM + SwiGLU + MXFP8 quantization in the
    epilogue; backward dSwiGLU + quantization in fc2's data-gradient GEMM) leaves, per
    routed copy, no activation kernel (6 f bytes forward: reads gate and up, writes the
    product; twice backward) and no cast of fc2's input (4.0625 f) or of fc1's output
    gradient (4.0625 x 2 f). TINY: 4 layers x 1,024 tokens x 4 copies, f = 256."""
    plain = _moe_elementwise(TINY)
    fused = _moe_elementwise(TINY, moe_fused_grouped_mlp=True)
    copies = 4 * 1024 * 4
    assert plain[0] - fused[0] == pytest.approx(copies * (6 * 256 + 4.0625 * 256))
    assert plain[1] - fused[1] == pytest.approx(copies * (12 * 256 + 4.0625 * 512))


def test_fused_grouped_mlp_takes_gpt_oss_clamps_with_it():
    """gpt-oss's clamps before its activation (16 f bytes a copy forward, 30 f backward:
    ``Transformer.glu_clamp_bytes``) run inside the fused kernel's activation too."""
    clamped = Transformer(**{**TINY.__dict__, "glu_clamp": True})
    plain = _moe_elementwise(clamped)
    fused = _moe_elementwise(clamped, moe_fused_grouped_mlp=True)
    copies = 4 * 1024 * 4
    assert plain[0] - fused[0] == pytest.approx(copies * (6 * 256 + 4.0625 * 256 + 16 * 256))
    assert plain[1] - fused[1] == pytest.approx(copies * (12 * 256 + 4.0625 * 512 + 30 * 256))


def test_fused_grouped_mlp_is_mxfp8_only():
    with pytest.raises(CcsimError, match="runs MXFP8"):
        megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, precision="bf16",
                 moe_fused_grouped_mlp=True)  # fmt: skip
    with pytest.raises(CcsimError, match="moe_routed_casts"):
        megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, precision="fp8",
                 fp8_recipe="mxfp8", moe_fused_grouped_mlp=True,
                 moe_routed_casts=False)  # fmt: skip


def test_rows_whose_preset_fuses_the_grouped_mlp():
    """The 26.06, 26.06.01 and 26.08 GB200 MXFP8 rows of the four MoE models whose presets
    set ``cutedsl_fused_grouped_mlp`` (Megatron-Bridge v0.5.0 / v0.5.1) or whose flat
    recipes set NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (v0.6.0 perf_recipes/*/gb200/) build it;
    no other row does."""
    runs, _ = load_runs()
    fused = {r.id for r in runs if r.options.get("moe_fused_grouped_mlp")}
    expected = {f"bridge-{release}-{model}-gb200-mxfp8-{gpus}"
                for release in ("26.06", "26.06.01", "26.08")
                for model, gpus in (("deepseek-v3", 256), ("gpt-oss-120b", 64),
                                    ("qwen3-235b-a22b", 256), ("qwen3-30b-a3b", 8))}  # fmt: skip
    assert fused == expected
