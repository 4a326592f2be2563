"""An MoE layer's router GEMM in an fp8 run: Megatron-Core computes the gating logits
with ``te_general_gemm`` on the unquantized bf16 input and weight
(core_v0.16.0 megatron/core/transformer/moe/router.py lines 94-100,
moe_utils.py lines 1192-1193: RouterGatingLinearFunction), not through a TE module under
fp8 autocast, so it runs at the 16-bit rate while the attention's linears run in fp8."""

from simulator.workload.generators import pass_work
from simulator.workload.model import MODELS

QWEN3_30B = MODELS["qwen3-30b-a3b"]


def _gemms(model, forward, **kwargs):
    """A one-layer pass's GEMMs as (m, n, k, bits, block) (the trace form: bits 16 and
    block 0 where the list stops before them)."""
    work = pass_work(model, 1, tp=1, layers=1, forward=forward, precision="fp8",
                     flash_attention=True, **kwargs)  # fmt: skip
    return [(g[0], g[1], g[2], g[5] if len(g) > 5 else 16, g[6] if len(g) > 6 else 0)
            for g in work["gemms"]]  # fmt: skip


def test_router_gemm_stays_bf16_in_an_fp8_moe_pass():
    """Qwen3 30B: the 4,096 x 2,048 -> 128 gating GEMM (forward) and its two gradients
    (backward) at 16 bits; QKV and the projection, with theirs, at 8."""
    for block in (0, 32):  # per-tensor scaling and MXFP8
        for forward in (True, False):
            gemms = _gemms(QWEN3_30B, forward, moe=True, fp8_block=block)
            router = [g for g in gemms if sorted(g[:3]) == [128, 2048, 4096]]
            assert len(router) == (1 if forward else 2)
            assert all(g[3:] == (16, 0) for g in router)
            others = [g for g in gemms if g not in router]
            assert len(others) == (2 if forward else 4)
            assert all(g[3:] == (8, block) for g in others)


def test_dense_fp8_pass_quantizes_every_linear():
    """A dense layer has no router: its four linears stay fp8."""
    gemms = _gemms(MODELS["llama3-8b"], True)
    assert len(gemms) == 4 and all(g[3] == 8 for g in gemms)
