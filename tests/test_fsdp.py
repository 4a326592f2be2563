"""FSDP (ZeRO-3) with TP and PP in the megatron generator: gather and reduce-scatter
bytes per pass, prefetch hiding the gathers, and memory, by hand."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.memory import megatron_memory
from simulator.workload.model import Transformer

SMALL = Transformer(layers=8, hidden=1024, seq=512, vocab=32000)
HBM = 2.039e12


def _ring(bandwidth):
    graph = ring_graph(2, bandwidth, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    return graph


def _fsdp_calls(step, rank=0):
    return [(op.op, op.nbytes, op.stream) for op in step.ops
            if op.rank == rank and op.stream.startswith("fsdp")]  # fmt: skip


def test_every_pass_gathers_its_layers_and_every_backward_scatters_their_gradients():
    """TP 2, PP 2, DP 2, 2 micro-batches: a stage's 4 layers hold 12 x 1024^2 / 2
    parameters each per TP rank; each of its 4 passes gathers them layer by layer (bf16
    weights, 2 bytes each: Megatron-FSDP's units are the transformer layers), each of its
    2 backwards reduce-scatters each layer's gradients (fp32, 4 bytes each, Megatron-LM's
    default in bf16)."""
    step = megatron(SMALL, tp=2, pp=2, dp=2, global_batch=4, fsdp=True)
    layer_bytes = 12 * 1024**2 / 2 * 2
    calls = _fsdp_calls(step)
    gathers = [c for c in calls if c[0] == "all_gather"]
    scatters = [c for c in calls if c[0] == "reduce_scatter"]
    assert len(gathers) == 4 * 4 and len(scatters) == 2 * 4
    assert {c[1] for c in gathers} == {layer_bytes}
    assert {c[1] for c in scatters} == {2 * layer_bytes}
    assert step.groups[next(op.group for op in step.ops if op.stream == "fsdp.ag")].ranks == [0, 2]


def test_prefetch_hides_all_but_the_first_gather_and_the_last_scatter():
    """DP 2 on a 2-GPU ring at 2 TB/s: a ring all-gather or reduce-scatter of X bytes over
    2 ranks takes X / 2 / 2 TB/s, an all-reduce twice that. With prefetching, only the
    first layer's gather, the last layer's reduce-scatter and then the replicated
    embedding's and (untied) output layer's all-reduce stay outside compute: the step is
    the plain step's compute plus those, with the optimizer over half the layers and the
    whole vocabulary matrices. Weights
    are gathered in bf16 (2 bytes a parameter), gradients reduced in fp32 (4)."""
    plain = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4, recompute="none",
                     distributed_optimizer=True)  # fmt: skip
    fsdp = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4, recompute="none", fsdp=True)
    free = _ring(1e18)
    _, compute_only = run_workload(plain, free, algorithm="ring", comm_slowdown=0.0)
    _, sharded = run_workload(fsdp, _ring(2e12), algorithm="ring", comm_slowdown=0.0)
    layers = 8 * 12 * 1024**2 * 2  # bytes of the layers' bf16 weights
    embedding = 2 * 32000 * 1024 * 2  # bf16 embedding and output layer
    # The plain step's optimizer covers half of everything; FSDP's half the layers and
    # the whole embedding.
    plain_opt = 16 * (8 * 12 * 1024**2 + 2 * 32000 * 1024) / 2 / HBM
    fsdp_opt = 16 * (8 * 12 * 1024**2 / 2 + 2 * 32000 * 1024) / HBM
    expected = compute_only.step_s - plain_opt + fsdp_opt
    expected += layers / 8 / 2 / 2e12  # the first layer's gather
    expected += 2 * layers / 8 / 2 / 2e12  # the last layer's reduce-scatter, fp32
    expected += 2 * (2 * embedding / 2) / 2e12  # the embedding's fp32 all-reduce
    assert sharded.step_s == pytest.approx(expected, rel=1e-6)


def test_fsdp_memory_by_hand():
    """TP 1, PP 1, DP 4: per rank 1/4 of every parameter's weights (2 bytes), gradients
    (4) and optimizer state (12), the embedding and output layer (untied, 32000 x 1024
    each) included; plus the gathered weights of the layer running and those prefetched,
    the embedding and output layer gathered whole, and the unsharded gradients the
    reduce-scatter queue keeps. Megatron-FSDP prefetches until max(1e9, 2 x 12.6M) / 2 =
    500M parameters are on their way and queues up to 1e9 of gradients: more than the 8
    layers there are, so all 8 are gathered; of the gradients, 7 layers' and a vocabulary
    matrix's (the output layer's first in the backward, 32.8M > a layer's 12.6M)."""
    got = megatron_memory(SMALL, tp=1, pp=1, dp=4, micro_batch=1, micro_batches=1, fsdp=True)
    layer = 12 * 1024**2
    vocab = 32000 * 1024
    params = 8 * layer + 2 * vocab
    assert got.weights == pytest.approx((params / 4 + 8 * layer + 2 * vocab) * 2)
    assert got.gradients == pytest.approx((params / 4 + 7 * layer + vocab) * 4)
    assert got.optimizer == pytest.approx(params / 4 * 12)
    with pytest.raises(CcsimError, match="drop distributed_optimizer"):
        megatron(SMALL, tp=1, pp=1, dp=2, global_batch=2, fsdp=True, distributed_optimizer=True)


# Layers of 12 x 8192^2 = 805M parameters: above Megatron-FSDP's 500M prefetch, so one
# layer is prefetched beside the one running (fsdp_gathered_units: 2). No vocabulary:
# no embedding, logits or embedding all-reduce, so the timeline is the layers' alone.
BIG = Transformer(layers=4, hidden=8192, seq=128, vocab=0, heads=64)


def test_a_layers_gather_waits_for_the_buffer_of_the_layer_two_before():
    """With 2 units gathered at once, layer j's gather (in the step's order: forward 0-3,
    backward 3-0) may start once unit j - 2 has run; the first two start at once. At TP 8
    a layer holds 100.7M parameters per rank: 5 prefetched (5 x 100.7M >= 500M), 6 units
    at once, and a 4-layer stage keeps all 4 gathered."""
    step = megatron(BIG, tp=1, pp=1, dp=2, global_batch=2, recompute="none", fsdp=True)
    ops = {op.id: op for op in step.ops}
    order = [f"f0.unit{k}" for k in range(4)] + [f"b0.unit{k}" for k in range(4)]
    for j, unit in enumerate(order):
        gather = ops[f"r0.fsdp.{unit}.gather"]
        assert [step.ops[d].id for d in gather.deps] == ([f"r0.{order[j - 2]}"] if j >= 2 else [])
        assert f"r0.fsdp.{unit}.gather" in [step.ops[d].id for d in ops[f"r0.{unit}"].deps]
    layer = 12 * 8192**2
    two = megatron_memory(BIG, tp=1, pp=1, dp=2, micro_batch=1, micro_batches=1, fsdp=True)
    assert two.weights == pytest.approx((4 * layer / 2 + 2 * layer) * 2)
    tp8 = megatron_memory(BIG, tp=8, pp=1, dp=2, micro_batch=1, micro_batches=1, fsdp=True)
    assert tp8.weights == pytest.approx((4 * layer / 8 / 2 + 4 * layer / 8) * 2)


def test_a_network_bound_step_keeps_the_network_busy_throughout():
    """DP 2 on a slow 2-GPU ring: a layer's gather takes G = U / 2 / bw alone (U its bf16
    bytes), far longer than its compute, and a layer's fp32 reduce-scatter 2G. The 4
    forward and 4 backward gathers run back to back, each layer as soon as its own is
    in; from the first backward layer on, the reduce-scatters share the ring with the
    remaining gathers. Nothing waits for compute but a layer's compute at a time while
    the other stream still sends, so the network is busy until all 8 G + 4 x 2G = 16G are
    carried: between two bandwidths the step moves by 16 U / 2 x (1/bw1 - 1/bw2)."""
    step = megatron(BIG, tp=1, pp=1, dp=2, global_batch=2, recompute="none", fsdp=True)
    u = 12 * 8192**2 * 2
    steps = {}
    for bw in (1e9, 2e9):
        _, result = run_workload(step, _ring(bw), algorithm="ring", comm_slowdown=0.0)
        steps[bw] = result.step_s
    assert steps[1e9] - steps[2e9] == pytest.approx(16 * u / 2 * (1 / 1e9 - 1 / 2e9), rel=1e-6)
