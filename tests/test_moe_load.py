"""An MoE layer's load as the published runs route it (simulator/workload/model.py,
generators.py): the busiest expert-parallel rank under random top-k routing against
closed forms and a seeded simulation of the routing, and fp8's per-expert padding (rows
and copies) against hand-worked figures from Transformer Engine's ``Fp8Padding``."""

import math
import random
from dataclasses import replace

import pytest

from simulator.errors import CcsimError
from simulator.validate.training import load_runs
from simulator.workload.generators import megatron
from simulator.workload.host import moe_layer_ops
from simulator.workload.model import Transformer, expected_max_normal

TINY = Transformer(layers=4, hidden=512, seq=1024, vocab=0, heads=8, gated=True, experts=16,
                   top_k=4, moe_ffn=256, dropout=False)  # fmt: skip


def test_expected_max_of_normals_is_the_closed_form():
    """E[max] of 2, 3 and 4 standard normals: 1/sqrt(pi), 3/(2 sqrt(pi)) and
    3/(2 sqrt(pi)) (1 + (2/pi) asin(1/3)) (order statistics of the normal); 8: 1.4236
    (the tabulated expected largest of 8, Harter 1961)."""
    root_pi = math.sqrt(math.pi)
    assert expected_max_normal(2) == pytest.approx(1 / root_pi, abs=1e-9)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * root_pi), abs=1e-9)
    four = 3 / (2 * root_pi) * (1 + 2 / math.pi * math.asin(1 / 3))
    assert expected_max_normal(4) == pytest.approx(four, abs=1e-9)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-4)


def test_busiest_rank_matches_a_simulation_of_random_routing():
    """Seeded: 1,024 tokens (256 a rank over 4 ranks) each pick 4 of 16 experts
    uniformly (RandomSTE's top 4 of normal noise), 4 experts a rank; the busiest rank's
    count averaged over 600 draws is the closed form's within 3 (its standard error is
    under 1; the normal approximation of the counts adds a fraction of a token)."""
    m = Transformer(layers=1, hidden=64, seq=16, experts=16, top_k=4, moe_ffn=32)
    rng = random.Random(31)
    draws = 600
    total = 0
    for _ in range(draws):
        counts = [0] * 4
        for _ in range(1024):
            for expert in rng.sample(range(16), 4):
                counts[expert // 4] += 1
        total += max(counts)
    assert m.busiest_rank_copies(256, 4) == pytest.approx(total / draws, abs=3.0)
    assert m.busiest_rank_copies(256, 4) > 256 * 4 + 25  # ~29.5 over the mean


def test_expert_gemm_rows_by_routing_and_fp8_recipe():
    """TINY at EP 8, one sequence of 1,024 tokens a rank: 1,024 x 4 x 8 / 16 = 2,048
    tokens an expert evenly; MXFP8 pads each expert to 32 rows, 15.5 more on average
    (2,064 rounded up), the other fp8 recipes to 16 (2,056); random routing's busiest
    rank gets 4,096 + sqrt(1,024 x 8 x 4 x 12 / (8 x 15)) x 1.4236 = 4,177.5 copies, so
    its experts 2,089 each."""

    def rows(**kw):
        step = megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0, **kw)
        fwd = [op for op in step.ops if op.rank == 0 and op.label.startswith("fwd experts")]
        return {g.m for op in fwd for g in op.gemms}

    assert rows(moe_routing="even") == {2048}
    assert rows(moe_routing="even", precision="fp8", fp8_recipe="mxfp8") == {2064}
    assert rows(moe_routing="even", precision="fp8", fp8_recipe="delayed") == {2056}
    busiest = 4096 + math.sqrt(1024 * 8 * 4 * 12 / (8 * 15)) * 1.4236
    assert rows() == {math.ceil(busiest * 8 / 16)} == {2089}


def test_fp8_padding_copies_are_8h_bytes_a_routed_copy_each_way():
    """With the alltoall dispatcher TEGroupedMLP pads and unpads by copying: per MoE layer
    and routed copy, 4 h bytes in, 4 h out, 8 for the fp32 probability; HybridEP pads in
    its dispatch. TINY's 4 layers x 1,024 tokens x 4 copies x (8 x 512 + 8) bytes, the
    same backward; bf16 pads nothing."""

    def elementwise(dispatcher: str, precision: str) -> tuple[float, float]:
        step = megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0,
                        moe_routing="even", moe_dispatcher=dispatcher, precision=precision,
                        fp8_recipe="mxfp8")  # fmt: skip
        found = {}
        for op in step.ops:
            if op.rank == 0 and op.label.endswith("elementwise mb 0"):
                found[op.label.split()[0]] = op.mem_bytes
        return found["fwd"], found["bwd"]

    pad = 4 * 1024 * 4 * (8 * 512 + 8)
    fwd, bwd = elementwise("alltoall", "fp8")
    fwd_h, bwd_h = elementwise("hybridep", "fp8")
    assert (fwd - fwd_h, bwd - bwd_h) == pytest.approx((pad, pad))
    plain, plain_h = elementwise("alltoall", "bf16"), elementwise("hybridep", "bf16")
    assert plain == pytest.approx(plain_h)


def test_fp8_padding_kernels_on_the_host():
    """Three kernels each way (pad the tokens, pad the probabilities, unpad the output;
    backward their gradients) with alltoall or DeepEP in fp8; none in bf16 or with
    HybridEP."""
    for dispatcher, extra in (("alltoall", 3), ("deepep", 3), ("hybridep", 0)):
        fp8 = moe_layer_ops(local_experts=4, ep=4, dispatcher=dispatcher, recipe="delayed")
        bf16 = moe_layer_ops(local_experts=4, ep=4, dispatcher=dispatcher)
        # (beyond the 8 casts of the 4 experts' two GEMMs and the attention's 2)
        assert fp8.experts.forward() - bf16.experts.forward() == 8 + extra
        assert fp8.experts.backward() - bf16.experts.backward() == 8 + extra


def test_unknown_routing_names_the_choices():
    with pytest.raises(CcsimError, match="moe_routing"):
        megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, moe_routing="balanced")


def test_expert_bias_kernels_and_bytes():
    """gpt-oss's experts have biases: Megatron-Core's ``_apply_bias`` launches a multiply
    and an add per local expert and one concatenation (16 local experts: 33), backward
    two multiplies and two sums per expert and two concatenations (66); its bytes per
    routed copy are 12 h forward and 16 h backward, TINY's 4 layers x 1,024 tokens x 4
    copies x 512."""
    plain = moe_layer_ops(local_experts=16, ep=8)
    biased = moe_layer_ops(local_experts=16, ep=8, expert_bias=True)
    assert biased.forward() - plain.forward() == 2 * 16 + 1
    assert biased.backward() - plain.backward() == 4 * 16 + 2

    def elementwise(model: Transformer) -> tuple[float, float]:
        step = megatron(model, tp=1, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0,
                        moe_routing="even", recompute="none")  # fmt: skip
        found = {}
        for op in step.ops:
            if op.rank == 0 and op.label.endswith("elementwise mb 0"):
                found[op.label.split()[0]] = op.mem_bytes
        return found["fwd"], found["bwd"]

    fwd, bwd = elementwise(TINY)
    fwd_b, bwd_b = elementwise(replace(TINY, expert_bias=True))
    copies = 4 * 1024 * 4
    assert (fwd_b - fwd, bwd_b - bwd) == pytest.approx((copies * 12 * 512, copies * 16 * 512))


def test_gpt_oss_runs_have_expert_biases():
    runs, _ = load_runs()
    biased = {r.model.name for r in runs if r.model.expert_bias}
    assert biased == {"gpt-oss-120b"}
