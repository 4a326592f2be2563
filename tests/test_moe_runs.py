"""Mixture-of-experts training steps as the published runs build them: the models against
their published sizes, an all-to-all's bytes and the experts' FLOPs against closed forms,
Megatron-Core's expert grid, and the shortcuts (one replica, one TP rank) against the
full build."""

import pytest

from simulator.algorithms import build_schedule
from simulator.validate.training import load_runs
from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.model import Transformer


@pytest.fixture(scope="module")
def moe_models():
    # Each model without the MTP layer Megatron-Bridge's DeepSeek-V3 runs add (the
    # fewest layers of its runs).
    runs, _ = load_runs()
    models = sorted((r.model for r in runs if r.model.is_moe), key=lambda m: -m.layers)
    return {m.name: m for m in models}


@pytest.mark.parametrize(
    "name, total, active",
    [
        # DeepSeek-V3 technical report (arXiv 2412.19437), abstract: 671B total, 37B
        # activated per token (the MTP module's 14B apart).
        ("deepseek-v3", 671e9, 37e9),
        # Qwen3 technical report (arXiv 2505.09388), table 2: 30B-A3B, 235B-A22B.
        ("qwen3-30b-a3b", 30.5e9, 3.3e9),
        ("qwen3-235b-a22b", 235e9, 22e9),
    ],
)
def test_moe_models_have_their_published_sizes(moe_models, name, total, active):
    """The runs' models (MLA for DeepSeek-V3) hold the parameters their reports give,
    total and activated per token (embeddings counted, as the reports do), within 2%."""
    m = moe_models[name]
    used = sum(m._active_params(i) for i in range(m.layers)) + 2 * m.vocab * m.hidden
    assert m.params == pytest.approx(total, rel=0.02)
    assert used == pytest.approx(active, rel=0.02)


# 4 MoE layers, h 512, 16 SwiGLU experts of 256, top 4 (every layer MoE).
TINY = Transformer(layers=4, hidden=512, seq=1024, vocab=0, heads=8, gated=True, experts=16,
                   top_k=4, moe_ffn=256, dropout=False)  # fmt: skip


def test_all_to_all_bytes_leaving_a_rank_are_the_closed_form():
    """TP 2 with sequence parallelism, EP 8, DP 8: a rank holds 1024 / 2 = 512 tokens of
    its micro-batch and sends each to its 4 experts, (ep - 1) / ep of them off the rank:
    tokens x hidden x top_k x 2 bytes x 7/8 per layer, 4 layers a call. NCCL's
    all-to-all (grouped sends, nccl-p2p) over the EP group carries exactly that."""
    # (The host's launches off: with them a forward's all-to-alls are split around its
    # synchronisations, test_moe_host_flow.py.)
    step = megatron(TINY, tp=2, pp=1, dp=8, ep=8, global_batch=8, host_op_s=0.0)
    calls = [op for op in step.ops if op.rank == 0 and op.op == "all_to_all"]
    group = step.groups[calls[0].group].ranks
    assert len(group) == 8
    schedule = build_schedule("nccl-p2p", "all_to_all", len(group), calls[0].nbytes)
    leaving = sum(
        float(b)
        for s, d, b in zip(schedule.src, schedule.dst, schedule.nbytes, strict=True)
        if s == 0 and d != 0
    )
    assert leaving == pytest.approx(4 * 512 * 512 * 4 * 2 * 7 / 8)


def test_expert_gemm_flops_are_the_models():
    """Balanced routing: the EP group's ranks together run 6 h f FLOPs (SwiGLU's three
    h x f matrices) per token per routed expert forward, top_k of them, over every
    token the group holds."""
    step = megatron(TINY, tp=1, pp=1, dp=8, ep=8, global_batch=8, moe_routing="even")
    fwd = [op for op in step.ops if op.label.startswith("fwd experts")]
    flops = sum(2.0 * g.m * g.n * g.k * g.batch * g.count for op in fwd for g in op.gemms)
    tokens = 8 * 1024  # 8 ranks, one sequence each
    assert flops == pytest.approx(tokens * TINY.top_k * 6 * 512 * 256 * TINY.layers)


def test_expert_groups_follow_megatron_cores_expert_grid():
    """expert_tensor_parallel_size 1 ("tp-cp-ep-dp-pp", megatron/core/parallel_state.py):
    with TP 2, DP 8 and EP 4 a stage's 16 ranks form EP groups of 4 consecutive ranks
    (two TP pairs), and the ranks holding the same experts, every fourth rank, reduce
    their gradients together."""
    step = megatron(TINY, tp=2, pp=1, dp=8, ep=4, global_batch=8)
    ep = {tuple(g.ranks) for g in step.groups.values() if g.kind == "EP"}
    assert ep == {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)}
    reduce = next(op for op in step.ops if op.rank == 0 and op.label == "DP expert gradients")
    assert step.groups[reduce.group].ranks == [0, 4, 8, 12]


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=1, pp=1, dp=16, ep=16),  # EP spans every replica: its call's quotient
        dict(tp=1, pp=2, dp=16, ep=16, nodes=4),  # EP past a server: replicas alone
        dict(tp=1, pp=2, dp=8, ep=8),  # EP shadows (TP 1) inside 8 replicas
        dict(tp=1, pp=2, dp=8, ep=4),  # EP groups of 4 replicas
        dict(tp=2, pp=1, dp=8, ep=16),  # TP shadows inside EP groups
        dict(tp=2, pp=1, dp=8, ep=4),
    ],
)
def test_one_replica_and_one_tp_rank_give_the_full_steps_time(kw):
    """The shortcuts (replicas; TP shadows, or with TP 1 the EP group's first rank
    standing for the group) replay fewer ops and give the same step as every rank built,
    on 2 DGX H100: to rounding, as :mod:`simulator.workload.replicas` promises (a flow of
    weight dp loads each link of its class dp / |class| times, where the full build adds
    the dp images' loads one by one; TP 2 x EP 16 lands one ulp apart)."""
    m = Transformer(layers=4, hidden=1024, seq=1024, vocab=32000, heads=8, kv_heads=2,
                    gated=True, ffn=2048, experts=16, top_k=4, moe_ffn=512,
                    dropout=False)  # fmt: skip
    steps = {}
    nodes = kw.pop("nodes", 2)
    for fast in (False, True):
        step = megatron(m, micro_batch=1, global_batch=4 * kw["dp"], replicas=fast,
                        shadows=fast, **kw)  # fmt: skip
        steps[fast] = (len(step.ops), run_workload(step, "dgx-h100", nodes=nodes)[1].step_s)
    assert steps[True][0] < steps[False][0]
    assert steps[True][1] == pytest.approx(steps[False][1], rel=1e-15, abs=0)
