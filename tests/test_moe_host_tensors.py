"""The host's per-expert work that launches no kernel (simulator/workload/host.py,
``expert_tensor_ops``): its count against a hand list read from Transformer Engine v2.8
and Megatron-Core core_v0.16.0, its price against the two measured figures it cites,
and a host-bound step growing by exactly the counted time."""

import pytest

from simulator.errors import CcsimError
from simulator.workload.host import (
    HOST_OP_S_BY_CPU,
    HOST_TENSOR_OP_S,
    HOST_TENSOR_OP_S_BY_CPU,
    HTA_HOST_OP_S,
    expert_tensor_ops,
    moe_layer_host_s,
    moe_layer_ops,
    tensor_op_s_for,
)
from simulator.workload.model import Transformer

# One local expert's fc1 and fc2 GroupedLinear in a training micro-batch, one framework
# tensor operation a line (gradient-accumulation fusion and the distributed optimizer
# with overlap_param_gather, as the published rows run), MXFP8.
MXFP8_FORWARD = [
    # grouped_linear.py line 127: split_quantize builds the expert's MXFP8 tensor object
    "fc1 input: MXFP8 tensor object", "fc2 input: MXFP8 tensor object",
    # gemm.cpp line 426: at::from_blob view of the expert's rows of the single output
    "fc1 output view", "fc2 output view",
    # distributed_data_parallel.py lines 384-418: the forward pre-hook visits each param
    "DDP pre-hook: fc1 weight", "DDP pre-hook: fc2 weight",
]  # fmt: skip
MXFP8_BACKWARD = [
    # grouped_linear.py lines 299-310: split_quantize of the output gradient
    "fc2 grad output: MXFP8 tensor object", "fc1 grad output: MXFP8 tensor object",
    # the data-gradient grouped GEMM's single output, viewed per expert (gemm.cpp 426)
    "fc2 dgrad view", "fc1 dgrad view",
    # lines 421-449: handle_custom_ddp_from_mcore, torch.empty of the weight's shape
    "fc2 dummy wgrad", "fc1 dummy wgrad",
    # line 419 clear_tensor_data: the saved input keeps its column-wise data and scales;
    # each set to torch.Tensor().cuda() (utils.py lines 28-54): two tensors a buffer
    "fc2 input colwise data: Tensor()", "fc2 input colwise data: .cuda()",
    "fc2 input colwise scales: Tensor()", "fc2 input colwise scales: .cuda()",
    "fc1 input colwise data: Tensor()", "fc1 input colwise data: .cuda()",
    "fc1 input colwise scales: Tensor()", "fc1 input colwise scales: .cuda()",
    # autograd's AccumulateGrad of the dummy and the DDP post-hook (lines 420-447)
    "fc2 weight: accumulate grad", "fc2 weight: DDP post-hook",
    "fc1 weight: accumulate grad", "fc1 weight: DDP post-hook",
]  # fmt: skip


def test_per_expert_count_is_the_hand_count_from_the_source():
    """MXFP8 by the lists above; bf16 saves its input as one plain tensor (one buffer to
    clear: 4 fewer backward) and splits with views (as many); gpt-oss's biases add two
    parameters an expert (a pre-hook each forward, an accumulation and a post-hook each
    backward) and fc1's bias gradient (``grad_bias``, gemm.py line 191, one more
    ``torch.empty``); without overlap_param_gather no pre-hooks."""
    assert expert_tensor_ops("mxfp8") == (len(MXFP8_FORWARD), len(MXFP8_BACKWARD)) == (6, 18)
    assert expert_tensor_ops("bf16") == (6, 18 - 4)
    for recipe in ("delayed", "tensorwise"):  # Float8Tensor keeps one buffer (transpose)
        assert expert_tensor_ops(recipe) == (6, 14)
    assert expert_tensor_ops("bf16", expert_bias=True) == (6 + 2, 14 + 2 * 2 + 1)
    assert expert_tensor_ops("bf16", param_gather_hooks=False) == (6 - 2, 14)
    assert expert_tensor_ops("bf16", expert_bias=True, param_gather_hooks=False) == (4, 19)
    with pytest.raises(CcsimError, match="recipe"):
        expert_tensor_ops("nvfp4")


def test_a_layer_carries_them_per_local_expert_and_graphs_leave_them():
    """The experts' part carries its local experts' operations (the only part that
    does); the router and attention graphs the rows capture leave the experts eager, a
    full-step graph leaves nothing per layer."""
    ops = moe_layer_ops(local_experts=16, recipe="mxfp8", ep=8)
    assert (ops.forward_tensors(), ops.backward_tensors()) == (16 * 6, 16 * 18)
    assert [p.tensors for p in ops.parts].count(0) == len(ops.parts) - 1
    graphed = moe_layer_ops(local_experts=16, recipe="mxfp8", ep=8,
                            graphs=["attn", "moe_router", "moe_preprocess"])  # fmt: skip
    assert graphed.forward_tensors() == ops.forward_tensors()
    full = moe_layer_ops(local_experts=16, recipe="mxfp8", ep=8, graphs=["full_iteration"])
    assert (full.forward_tensors(), full.backward_tensors()) == (0, 0)


def test_prices_are_the_cited_measurements():
    """x86: NVIDIA/cutlass issue #3275 (2026-07-22, an x64 B200 host): torch.empty's
    allocate and free from Python "stayed around 2.15 us". Grace: Transformer Engine
    issue #2897 (GB200, 64 experts): "wgrad tensor allocations: 350 us" for the fused
    grouped MLP's backward, which allocates one weight gradient an expert in each of its
    two grouped linears (TE v2.14 backward_grouped_mlp.py lines 125-127): 128 of them.
    Each is well under one launched PyTorch op on the same CPU (TE issue #2053's
    torch.nn.Linear forward, which also allocates its output and launches cuBLAS)."""
    assert HOST_TENSOR_OP_S_BY_CPU["x86"] == HOST_TENSOR_OP_S == 2.15e-6
    assert HOST_TENSOR_OP_S_BY_CPU["grace"] == pytest.approx(350e-6 / (64 * 2))
    for cpu, launch in HOST_OP_S_BY_CPU.items():
        assert HOST_TENSOR_OP_S_BY_CPU[cpu] < launch / 5


def test_price_follows_the_hosts_launch_price():
    """A row's launch price selects its CPU's tensor figure; another (HTA's 10 us, a
    user's) scales the x86 one, and 0 leaves the host out entirely."""
    assert tensor_op_s_for(13.48e-6) == 2.15e-6
    assert tensor_op_s_for(37.08e-6) == 350e-6 / 128
    assert tensor_op_s_for(HTA_HOST_OP_S) == pytest.approx(10e-6 * 2.15 / 13.48)
    assert tensor_op_s_for(0.0) == 0.0
    ops = moe_layer_ops(local_experts=4)
    assert moe_layer_host_s(ops, 0.0) == (0.0, 0.0)
    with pytest.raises(CcsimError, match="host_tensor_op_s"):
        moe_layer_host_s(ops, 1e-5, -1.0)
    with pytest.raises(CcsimError, match="host_op_s"):
        tensor_op_s_for(-1.0)


def test_qwen3_30b_row_by_hand():
    """bridge-26.02-qwen3-30b-a3b-b200-mxfp8-8 (16 experts a rank, MXFP8, alltoall,
    router and preprocess graphed): 107 launches forward and 143 backward
    (tests/test_moe_host.py) at 13.48 us, plus 16 x 6 and 16 x 18 tensor operations at
    2.15 us: 1.649 ms and 2.547 ms a layer, +14% and +32% over the launches alone."""
    ops = moe_layer_ops(local_experts=16, dispatcher="alltoall", recipe="mxfp8", ep=8,
                        graphs=["moe_router", "moe_preprocess"])  # fmt: skip
    forward, backward = moe_layer_host_s(ops, 13.48e-6)
    assert forward == pytest.approx(107 * 13.48e-6 + 96 * 2.15e-6) == pytest.approx(1.64876e-3)
    assert backward == pytest.approx(143 * 13.48e-6 + 288 * 2.15e-6) == pytest.approx(2.54684e-3)


# 2 MoE layers of 16 SwiGLU experts, 2 routed a token, stepped on 2 GPUs.
from tests.test_moe_host import _step  # noqa: E402


@pytest.mark.parametrize("sync", [True, False])
def test_host_bound_step_grows_by_the_counted_tensor_time(sync):
    """At 1 s a launch the host sets the pace: a second a tensor operation more is
    3 micro-batches x 2 layers x 8 local experts x (6 + 14) seconds more a step (bf16,
    the distributed optimizer's pre-hooks on: DP 2), with the synchronisation's flow
    shop and with the host running ahead alike."""
    with_tensors = _step(host_op_s=1.0, host_tensor_op_s=1.0, moe_host_sync=sync)
    without = _step(host_op_s=1.0, host_tensor_op_s=0.0, moe_host_sync=sync)
    assert with_tensors - without == pytest.approx(3 * 2 * 8 * (6 + 14), rel=1e-9)


def test_dense_models_and_bad_values():
    """A dense model has no experts: the price changes nothing. A negative price is a
    clear error naming the option."""
    dense = Transformer(layers=2, hidden=256, seq=256, vocab=0, heads=4, gated=True)
    assert _step(dense, host_tensor_op_s=1.0) == _step(dense)
    with pytest.raises(CcsimError, match="host_tensor_op_s"):
        _step(host_tensor_op_s=-1.0)
