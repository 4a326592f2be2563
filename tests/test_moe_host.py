"""The host's side of an MoE layer (simulator/workload/host.py): its operation count
against a hand count from Megatron-Core's and Transformer Engine's source for one
published configuration, and the timeline of a host-bound layer worked by hand."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.validate.training import _moe_options
from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.host import (
    HOST_OP_S,
    HOST_OP_S_BY_CPU,
    HTA_HOST_OP_S,
    host_cpu,
    host_op_s_for,
    moe_layer_host_s,
    moe_layer_ops,
)
from simulator.workload.model import Transformer

# Megatron-Bridge 26.02's Qwen3 30B-A3B on 8 B200 (the data file's
# bridge-26.02-qwen3-30b-a3b-b200-mxfp8-8): 128 experts over EP 8 = 16 a rank, MXFP8,
# the alltoall dispatcher, TP 1, TE CUDA graphs over the router and the preprocess.
# Its forward, one operation a line, as core_v0.16.0 and TE v2.8 issue them:
QWEN3_FORWARD = [
    # TransformerLayer's attention half (TE modules)
    "input layernorm", "its output's MXFP8 cast", "QKV swizzle A", "QKV swizzle B", "QKV GEMM",
    "rotary on q", "rotary on k", "fused attention",
    "projection input's MXFP8 cast", "projection swizzle A", "projection swizzle B",
    "projection GEMM", "bias-dropout-add",
    "pre-MLP layernorm",
    # TopKRouter.forward and MoEAlltoAllTokenDispatcher.preprocess: one graph each
    "router graph replay", "preprocess graph replay",
    # _maybe_dtoh_and_synchronize("before_ep_alltoall") on the side stream
    "dtoh stream waits for the compute stream", "tokens_per_expert to host",
    "input_splits to host", "output_splits to host", "output_splits_tp to host",
    "d2h event record",
    # dispatch_preprocess: permute(fused=True) = TE moe_permute (mask map)
    "row-id map pass 1", "row-id map pass 2", "row-id map pass 3", "permute kernel",
    # token_dispatch: all_to_all of the tokens and of the probabilities
    "all-to-all tokens", "all-to-all probs",
    # dispatch_postprocess: sort_chunks_by_idxs(fused=True), 16 local experts
    "chunk sort map", "sort chunks",
    # TEGroupedMLP.forward in fp8: Fp8Padding of the tokens and of the probabilities
    # (random routing: the counts are not multiples of 32)
    "pad tokens to 32 rows an expert", "pad probabilities",
    # TEGroupedMLP: fc1 GroupedLinear (split_quantize + 16 cuBLAS GEMMs)
    *[f"fc1 input cast, expert {e}" for e in range(16)],
    "fc1 swizzle A (all experts)", "fc1 swizzle B (all experts)",
    *[f"fc1 GEMM, expert {e}" for e in range(16)],
    "SwiGLU", "probabilities' weighting",
    *[f"fc2 input cast, expert {e}" for e in range(16)],
    "fc2 swizzle A (all experts)", "fc2 swizzle B (all experts)",
    *[f"fc2 GEMM, expert {e}" for e in range(16)],
    "unpad the output (Fp8Unpadding)",
    # combine_preprocess (reverse sort), token_combine, combine_postprocess
    "restore sort", "all-to-all back", "unpermute kernel",
    # TransformerLayer: the MLP's bias-dropout-add
    "bias-dropout-add after the MLP",
]  # fmt: skip


def test_qwen3_30b_count_is_the_hand_count_from_the_source():
    """One row's forward counted op by op above (73 of them the experts': 16 experts x
    (2 casts + 2 GEMMs), 2 swizzles a grouped GEMM, 2 activation kernels, 3 paddings);
    backward:
    each GEMM and its swizzles twice (data and weight gradients), each other kernel and
    cast once, the host copies and the integer bookkeeping not at all, the graphs
    replayed once."""
    settings = {"moe_dispatcher": "alltoall", "cuda_graphs": "transformer_engine "
                "scope=['moe_router', 'moe_preprocess']"}  # fmt: skip
    row = {"moe": True, "gpu": "B200", "model": {"name": "qwen3-30b-a3b"}, "settings": settings}
    graphs = _moe_options(row)["cuda_graphs"]
    ops = moe_layer_ops(local_experts=16, dispatcher="alltoall", recipe="mxfp8", ep=8,
                        graphs=graphs)  # fmt: skip
    assert ops.forward() == len(QWEN3_FORWARD) == 107
    gemms = sum("GEMM" in op or "swizzle" in op for op in QWEN3_FORWARD)
    host_side = sum("host" in op or "stream" in op or "event" in op for op in QWEN3_FORWARD)
    replays = sum("graph replay" in op for op in QWEN3_FORWARD)
    rest = len(QWEN3_FORWARD) - gemms - host_side - replays
    assert ops.backward() == 2 * gemms + rest + replays == 143
    # The launches alone (no tensor operations: tests/test_moe_host_tensors.py) at the
    # default (one PyTorch op on a DGX H100's Xeon 8480C, 13.48 us, Transformer Engine
    # issue #2053) and at the earlier 10 us (HTA's middle), by hand.
    launches = moe_layer_host_s(ops, tensor_op_s=0.0)
    assert launches == pytest.approx((107 * 13.48e-6, 143 * 13.48e-6))
    assert moe_layer_host_s(ops, HTA_HOST_OP_S, 0.0) == pytest.approx((107e-5, 143e-5))


def test_counts_follow_the_configuration():
    """Per local expert the forward adds 2 GEMMs and, in fp8, 2 casts of the recipe's
    kernels (TE's current scaling: amax and cast, 2; MXFP8: 1); a full-step graph
    leaves nothing per layer; graphing the attention replaces its 15 MXFP8 operations
    (2 GEMMs and their 4 swizzles, 7 kernels, 2 casts) by one replay."""
    one = moe_layer_ops(local_experts=1, ep=8, recipe="tensorwise").forward()
    two = moe_layer_ops(local_experts=2, ep=8, recipe="tensorwise").forward()
    # (the sort and its reverse appear with the second local expert: 3 more)
    assert two - one == 2 + 2 * 2 + 3
    bf16 = moe_layer_ops(local_experts=8, ep=8).forward()
    mxfp8 = moe_layer_ops(local_experts=8, ep=8, recipe="mxfp8").forward()
    # the experts' casts, the attention's two, 2 swizzles a GEMM call (2 + 2 calls), and
    # TEGroupedMLP's Fp8Padding of the tokens and probabilities and Fp8Unpadding (3)
    assert mxfp8 - bf16 == 2 * 8 + 2 + 2 * 4 + 3
    full = moe_layer_ops(local_experts=8, ep=8, graphs=["full_iteration"])
    assert (full.forward(), full.backward()) == (0, 0)
    eager = moe_layer_ops(local_experts=8, ep=8, recipe="mxfp8").forward()
    graphed = moe_layer_ops(local_experts=8, ep=8, recipe="mxfp8", graphs=["attn"]).forward()
    assert eager - graphed == 15 - 1


def test_bad_input_names_what_to_fix():
    with pytest.raises(CcsimError, match="CUDA-graph scope 'mamba'"):
        moe_layer_ops(local_experts=4, graphs=["mamba"])
    with pytest.raises(CcsimError, match="recipe"):
        moe_layer_ops(local_experts=4, recipe="nvfp4")
    with pytest.raises(CcsimError, match="dispatcher"):
        moe_layer_ops(local_experts=4, dispatcher="flex")
    with pytest.raises(CcsimError, match="host_op_s"):
        moe_layer_host_s(moe_layer_ops(local_experts=4), -1.0)


def test_host_op_costs_are_the_measured_ones_and_agree_with_htas_range():
    """Transformer Engine issue #2053's table (one torch.nn.Linear forward, bf16, hidden
    2048, 8,192 tokens, CPU time): 13.48 us on a DGX H100's Xeon Platinum 8480C, 37.08 us
    on GB200's Grace. An independent source, Meta's HTA documentation, puts the CPU side
    of a launch at 5-20 us: the x86 figure lies inside it, Grace's above it (the issue's
    point). The earlier default, HTA's geometric middle, stays available."""
    assert HOST_OP_S_BY_CPU == {"x86": 13.48e-6, "grace": 37.08e-6}
    assert HOST_OP_S_BY_CPU["x86"] == HOST_OP_S
    assert 5e-6 <= HOST_OP_S_BY_CPU["x86"] <= 20e-6 < HOST_OP_S_BY_CPU["grace"]
    assert pytest.approx((5e-6 * 20e-6) ** 0.5) == HTA_HOST_OP_S


@pytest.mark.parametrize(
    ("gpu", "cpu"),
    [("H100-SXM-80GB", "x86"), ("B200-SXM-180GB", "x86"), ("A100", "x86"),
     ("GB200-NVL72", "grace"), ("GH200", "grace"), ("gb200", "grace")],
)  # fmt: skip
def test_each_gpu_is_driven_from_its_servers_cpu(gpu, cpu):
    """DGX H100 and DGX B200 are x86 servers; the Grace Hopper and Grace Blackwell
    superchips put a Grace CPU beside the GPU."""
    assert host_cpu(gpu) == cpu
    assert host_op_s_for(gpu) == HOST_OP_S_BY_CPU[cpu]
    with pytest.raises(CcsimError, match="GPU model"):
        host_cpu("")


@pytest.mark.parametrize(
    ("gpu", "op_s"), [("B200", 13.48e-6), ("GB200", 37.08e-6), ("H100", 13.48e-6)]
)
def test_validation_prices_a_rows_host_by_its_cpu(gpu, op_s):
    """A published MoE row's generator options carry its host CPU's cost per operation:
    the 26.02 Qwen3 30B forward's 107 operations (hand-listed above) take 1.442 ms on an
    x86 DGX and 3.968 ms on a Grace host, by hand from the issue's two figures; its 96
    framework tensor operations (16 experts x 6, tests/test_moe_host_tensors.py) add
    0.206 ms at 2.15 us (x86) and 0.2625 ms at 2.734 us (Grace)."""
    row = {"moe": True, "gpu": gpu, "model": {"name": "qwen3-30b-a3b"},
           "settings": {"moe_dispatcher": "alltoall"}}  # fmt: skip
    options = _moe_options(row)
    assert options["host_op_s"] == op_s
    ops = moe_layer_ops(local_experts=16, dispatcher="alltoall", recipe="mxfp8", ep=8,
                        graphs=["moe_router", "moe_preprocess"])  # fmt: skip
    forward, _ = moe_layer_host_s(ops, options["host_op_s"])
    by_hand = {"B200": 107 * 13.48e-6, "H100": 107 * 13.48e-6, "GB200": 107 * 37.08e-6}
    assert by_hand["B200"] == pytest.approx(1.44236e-3)
    assert by_hand["GB200"] == pytest.approx(3.96756e-3)
    tensors = {"B200": 96 * 2.15e-6, "H100": 96 * 2.15e-6, "GB200": 96 * 350e-6 / 128}
    assert tensors["B200"] == pytest.approx(0.2064e-3)
    assert tensors["GB200"] == pytest.approx(0.2625e-3)
    assert forward == pytest.approx(by_hand[gpu] + tensors[gpu])


# 2 MoE layers of 16 SwiGLU experts, 2 routed a token; s 256, h 256 (as in
# test_moe_dispatch.py): a few microseconds of GPU work a layer.
SMALL = Transformer(
    layers=2, hidden=256, seq=256, vocab=0, heads=4, gated=True, experts=16, top_k=2, moe_ffn=512
)


def _step(model: Transformer = SMALL, **options) -> float:
    """A 2-GPU step of ``model`` (EP 2 for an MoE model) on a 1e18 B/s ring of H100s."""
    ep = 2 if model.is_moe else 1
    step = megatron(model, tp=1, pp=1, dp=2, ep=ep, micro_batch=1, global_batch=6,
                    recompute="none", overlap_grad_reduce=False, **options)  # fmt: skip
    graph = ring_graph(2, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    _, result = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    return result.step_s


@pytest.mark.parametrize("sync", [True, False])
def test_host_bound_layers_take_the_counted_host_time(sync):
    """At 1 s an operation the host is far slower than the GPU: the step is the host's
    launches end to end (3 micro-batches, each a forward and a backward over 2 MoE
    layers: 3 x 2 x (F + B) operations, F and B this configuration's counts, 8 experts
    a rank, bf16, alltoall over EP 2) plus what the GPU does after the last launch. So
    a second more an operation is 3 x 2 x (F + B) seconds more a step, with the
    synchronisation (each pass's launches from its start) and without it (the host
    running ahead: every launch one after another from the step's start) alike (the
    framework tensor operations held at 0.5 s each in both)."""
    ops = moe_layer_ops(local_experts=8, ep=2)
    f, b = ops.forward(), ops.backward()
    # attention, router, preprocess (+ its 6 host copies), dispatch, experts, combine
    assert f == 9 + 8 + (8 + 6) + 8 + (16 + 2) + 3
    assert b == (2 * 2 + 7) + (2 + 7) + 0 + 8 + (2 * 16 + 2) + 3
    slow = _step(host_op_s=2.0, host_tensor_op_s=0.5, moe_host_sync=sync)
    fast = _step(host_op_s=1.0, host_tensor_op_s=0.5, moe_host_sync=sync)
    assert slow - fast == pytest.approx(3 * 2 * (f + b), rel=1e-9)


def test_without_the_sync_the_host_runs_ahead():
    """Host time just under the GPU's for the whole step but over it for a forward: with
    the synchronisation each forward waits for its own launches; without it the host
    launches the backward's work while the GPU is still on the forward, so the step
    is shorter and no shorter than the GPU alone."""
    gpu = _step(host_op_s=0.0, moe_host_sync=False)
    ops = moe_layer_ops(local_experts=8, ep=2)
    launches = 3 * 2 * (ops.forward() + ops.backward())
    cost = 0.9 * gpu / launches  # all launches take 90% of the GPU's step
    ahead = _step(host_op_s=cost, moe_host_sync=False)
    synced = _step(host_op_s=cost, moe_host_sync=True)
    assert gpu <= ahead < synced
