"""Expert parallelism in the megatron generator: all-to-all bytes per MoE layer, expert
GEMM shapes, a step with free communication and the memory of its experts, by hand."""

import functools

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import HOST_SYNC_S
from simulator.workload.generators import megatron as megatron_core
from simulator.workload.kernels import gemm_time
from simulator.workload.model import MODELS, Transformer

# The hand-worked steps here are for the options SC'21 ran (full recomputation, unfused
# attention, nothing overlapped) unless a test gives its own; Megatron-Core's defaults
# are tested in tests/test_megatron_defaults.py.
megatron = functools.partial(megatron_core, defaults="sc21")

# 2 MoE layers, h 256, 4 heads, s 256, 4 SwiGLU experts of 512 with 2 routed per token.
TINY = Transformer(
    layers=2, hidden=256, seq=256, vocab=0, heads=4, gated=True, experts=4, top_k=2, moe_ffn=512
)
A100 = DEVICES["A100"]
HBM = 2.039e12


def _gemm_s(gemms):
    return sum(gemm_time(A100, g) for g in gemms)


def test_mixtral_dispatches_tokens_times_top_k_times_hidden_per_layer():
    """Mixtral 8x7B, TP 2 with sequence parallelism, EP 4: a rank holds 4096 / 2 = 2048
    tokens of its sequence and sends each to 2 experts, 2048 x 2 x 4096 x 2 bytes =
    33.6 MB per layer each way; its stage's 16 MoE layers make one call of 16 times that.
    Its 2 experts each take 2048 x 2 x 4 / 8 = 2048 tokens: grouped GEMMs of 2 experts,
    2048 x 28672 over 4096 (gate and up) and 2048 x 4096 over 14336 (down)."""
    # (The host's launches off: with them a forward's all-to-alls are split around its
    # synchronisations, test_moe_host_flow.py.)
    step = megatron("mixtral-8x7b", tp=2, pp=2, dp=4, ep=4, global_batch=16,
                    sequence_parallel=True, recompute="none", host_op_s=0.0,
                    moe_routing="even")  # fmt: skip
    per_layer = 2048 * 2 * 4096 * 2
    calls = [op for op in step.ops if op.rank == 0 and op.op == "all_to_all"]
    assert len(calls) == 4 * 4  # 4 micro-batches x (dispatch, combine) x (fwd, bwd)
    assert {op.nbytes for op in calls} == {16 * per_layer}
    # Megatron-Core's expert grid with expert_tensor_parallel_size 1 ("tp-cp-ep-dp-pp",
    # megatron/core/parallel_state.py): EP groups of consecutive ranks, TP fastest.
    assert step.groups[calls[0].group].ranks == [0, 1, 2, 3]
    experts = next(op for op in step.ops if op.rank == 0 and op.label.startswith("fwd experts"))
    assert [g.as_list() for g in experts.gemms] == [
        [2048, 28672, 4096, 2, 16],
        [2048, 4096, 14336, 2, 16],
    ]


def test_moe_step_with_free_communication_by_hand():
    """TINY on DP 2 with EP 2, no recomputation, communication free: forward is each
    layer's attention, router and scores GEMMs, the 2 local experts' grouped GEMMs
    (256 x 2 x 2 / 4 = 256 tokens each) and the memory-bound kernels; backward twice
    the GEMMs (each one's two gradients) and kernels; then the optimizer's 16 bytes per
    parameter a rank holds: per layer the attention's 2 x 256 x (4 + 4) x 64 and the
    router's 256 x 4, and 2 of the 4 experts of 3 x 256 x 512. Each MoE layer's forward
    also idles the GPU for the host's read of the tokens per expert (HOST_SYNC_S). (The
    host's launch time off: this is the GPU's work by hand; test_moe_host.py times the
    host's.)"""
    step = megatron(TINY, tp=1, pp=1, dp=2, ep=2, global_batch=2, recompute="none",
                    host_op_s=0.0, moe_routing="even")  # fmt: skip
    graph = ring_graph(2, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    own = list(TINY.moe_linear_gemms(1)) + list(TINY.attention_gemms(1))
    experts = TINY.expert_gemms(256, ep=2)
    assert [g.as_list() for g in experts] == [[256, 1024, 256, 2, 1], [256, 256, 512, 2, 1]]
    # The memory-bound kernels: a dense layer's without its MLP (6 x 4h a token gated),
    # and per routed copy (2 a token) the experts' activation (6 x 512) and the
    # dispatcher's permute, two chunk sorts and unpermute (14 h), 2 h a token more.
    moe_bytes = 256 * (2 * (6 * 512 + 14 * 256) + 2 * 256 - 6 * 4 * 256)
    kernels = (TINY.layer_elementwise_bytes(256) + moe_bytes) / HBM
    forward = _gemm_s(own) + _gemm_s(experts) + kernels + HOST_SYNC_S  # (per layer)
    backward = _gemm_s([grad for g in own + list(experts) for grad in g.backward()])
    backward += 2 * kernels
    params = 2 * (2 * 256 * 8 * 64 + 256 * 4 + 2 * 3 * 256 * 512)
    expected = 2 * (forward + backward) + 16 * params / HBM
    # (1e18 B/s transfers still take ~1e-11 s each: rel 1e-6 leaves room for them.)
    assert result.step_s == pytest.approx(expected, rel=1e-6)
    assert step.memory.weights == pytest.approx(2 * params)


def test_expert_gradients_are_reduced_over_the_ranks_holding_the_same_experts():
    """DP 4 with EP 2: ranks 0 and 2 hold experts 0-1, ranks 1 and 3 experts 2-3; each
    pair reduces its experts' gradients (2 layers x 2 experts x 3 x 256 x 512 x 4 bytes
    of fp32 gradients), and all four reduce the rest."""
    step = megatron(TINY, tp=1, pp=1, dp=4, ep=2, global_batch=4, recompute="none")
    reduce = next(op for op in step.ops if op.rank == 0 and op.label == "DP expert gradients")
    assert step.groups[reduce.group].ranks == [0, 2]
    assert reduce.nbytes == 2 * 2 * 3 * 256 * 512 * 4
    rest = next(op for op in step.ops if op.rank == 0 and op.label == "DP gradients")
    assert step.groups[rest.group].ranks == [0, 1, 2, 3]


def test_expert_parallelism_errors_say_what_to_change():
    with pytest.raises(CcsimError, match="needs sequence parallelism"):
        megatron("mixtral-8x7b", tp=2, pp=1, dp=4, ep=4, global_batch=8)
    with pytest.raises(CcsimError, match="must divide TP x CP x DP"):
        megatron(TINY, tp=1, pp=1, dp=3, ep=2, global_batch=6)
    with pytest.raises(CcsimError, match="applies to mixture-of-experts models"):
        megatron(MODELS["llama3-8b"], tp=8, pp=1, dp=2, ep=2, global_batch=4)
