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
    """TP 2, PP 2, DP 2, 2 micro-batches: a stage's 4 layers hold 4 x 12 x 1024^2 / 2
    parameters per TP rank; each of its 4 passes gathers them (bf16 weights, 2 bytes
    each), each of its 2 backwards reduce-scatters their gradients (fp32, 4 bytes each,
    Megatron-LM's default in bf16)."""
    step = megatron(SMALL, tp=2, pp=2, dp=2, global_batch=4, fsdp=True)
    layer_bytes = 4 * 12 * 1024**2 / 2 * 2
    calls = _fsdp_calls(step)
    gathers = [c for c in calls if c[0] == "all_gather"]
    scatters = [c for c in calls if c[0] == "reduce_scatter"]
    assert len(gathers) == 4 and len(scatters) == 2
    assert {c[1] for c in gathers} == {layer_bytes}
    assert {c[1] for c in scatters} == {2 * layer_bytes}
    assert step.groups[next(op.group for op in step.ops if op.stream == "fsdp.ag")].ranks == [0, 2]


def test_prefetch_hides_all_but_the_first_gather_and_the_last_scatter():
    """DP 2 on a 2-GPU ring at 2 TB/s: a ring all-gather or reduce-scatter of X bytes over
    2 ranks takes X / 2 / 2 TB/s, an all-reduce twice that. With prefetching, only the
    first pass's gather, the last backward's reduce-scatter and then the replicated
    embedding's all-reduce stay outside compute: the step is the plain step's compute
    plus those, with the optimizer over half the layers and the whole embedding. Weights
    are gathered in bf16 (2 bytes a parameter), gradients reduced in fp32 (4)."""
    plain = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4, recompute="none",
                     distributed_optimizer=True)  # fmt: skip
    fsdp = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4, recompute="none", fsdp=True)
    free = _ring(1e18)
    _, compute_only = run_workload(plain, free, algorithm="ring", comm_slowdown=0.0)
    _, sharded = run_workload(fsdp, _ring(2e12), algorithm="ring", comm_slowdown=0.0)
    layers = 8 * 12 * 1024**2 * 2  # bytes of the layers' bf16 weights
    embedding = 32000 * 1024 * 2
    # The plain step's optimizer covers half of everything; FSDP's half the layers and
    # the whole embedding.
    plain_opt = 16 * (8 * 12 * 1024**2 + 32000 * 1024) / 2 / HBM
    fsdp_opt = 16 * (8 * 12 * 1024**2 / 2 + 32000 * 1024) / HBM
    expected = compute_only.step_s - plain_opt + fsdp_opt
    expected += layers / 2 / 2e12  # the first gather
    expected += 2 * layers / 2 / 2e12  # the last backward's reduce-scatter, fp32
    expected += 2 * (2 * embedding / 2) / 2e12  # the embedding's fp32 all-reduce
    assert sharded.step_s == pytest.approx(expected, rel=1e-6)


def test_fsdp_memory_by_hand():
    """TP 1, PP 1, DP 4: per rank 1/4 of the layers' weights (2 bytes), gradients (4) and
    optimizer state (12), the whole embedding, plus two gathered layers' weights (running
    and prefetched: Megatron-FSDP's units are the transformer layers) and one layer's
    unsharded gradients; with virtual stages the unit is a model chunk."""
    got = megatron_memory(SMALL, tp=1, pp=1, dp=4, micro_batch=1, micro_batches=1, fsdp=True)
    layer = 12 * 1024**2
    layers = 8 * layer
    embedding = 32000 * 1024
    assert got.weights == pytest.approx((layers / 4 + embedding + 2 * layer) * 2)
    assert got.gradients == pytest.approx((layers / 4 + embedding + layer) * 4)
    assert got.optimizer == pytest.approx((layers / 4 + embedding) * 12)
    with pytest.raises(CcsimError, match="drop distributed_optimizer"):
        megatron(SMALL, tp=1, pp=1, dp=2, global_batch=2, fsdp=True, distributed_optimizer=True)
