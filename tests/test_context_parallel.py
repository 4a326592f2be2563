"""Megatron's context parallelism (ring attention) in the megatron generator: rank order,
K/V exchange bytes per layer, step time with free communication, memory."""

import functools

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron as megatron_core
from simulator.workload.kernels import gemm_time
from simulator.workload.memory import megatron_memory
from simulator.workload.model import Transformer

# The hand-worked steps here are for the options SC'21 ran (full recomputation, unfused
# attention, nothing overlapped) unless a test gives its own; Megatron-Core's defaults
# are tested in tests/test_megatron_defaults.py.
megatron = functools.partial(megatron_core, defaults="sc21")

# 4 layers, h 1024, 8 heads of 128 with 2 key/value heads (GQA), s 1024, no vocabulary.
GQA = Transformer(layers=4, hidden=1024, seq=1024, vocab=0, heads=8, kv_heads=2)
A100 = DEVICES["A100"]
RATE = 312e12 * 0.7
HBM = 2.039e12


def _free(ranks):
    graph = ring_graph(ranks, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    return graph


def test_cp_groups_follow_megatrons_rank_order():
    """Ranks are TP fastest, then CP, then DP, then PP: with TP 2, CP 2, DP 2 the CP group
    of TP rank 1 in replica 0 is ranks 1 and 3, and DP groups span DP x CP."""
    step = megatron(GQA, tp=2, cp=2, pp=1, dp=2, global_batch=4)
    assert step.ranks == 8
    assert step.groups["cp.s0.d0.t1"].ranks == [1, 3]
    assert step.groups["tp.s0.d1.c1"].ranks == [6, 7]
    assert step.groups["dp.s0.t0"].ranks == [0, 2, 4, 6]


def test_kv_exchange_bytes_per_layer():
    """Per layer and micro-batch, a CP rank's K and V blocks are 2 x (b s / cp) x (g d / t)
    x 2 bytes; the ring moves every rank's blocks to every other, an all-gather whose
    whole buffer is cp times that: 4 b s g d / t = 4 x 1024 x 2 x 128 / 2 = 524,288 bytes.
    Forward: one gather per layer; backward with full recomputation: two gathers and a
    reduce-scatter of their gradients."""
    step = megatron(GQA, tp=2, cp=2, pp=1, dp=1, global_batch=1)
    per_layer = 4 * 1024 * 2 * 128 / 2
    calls = [(op.op, op.nbytes) for op in step.ops if op.rank == 0 and op.group.startswith("cp")]
    assert calls == [
        ("all_gather", 4 * per_layer),
        ("all_gather", 2 * 4 * per_layer),
        ("reduce_scatter", 4 * per_layer),
    ]


def test_cp_step_with_free_communication_by_hand():
    """CP 2, no TP, DP or PP, communication free: each rank runs its 512 tokens' linear
    GEMMs, the causal flash attention of its queries against the whole sequence
    (2 x 512 x 1024 x 8 x 128 FLOPs per layer forward, 2.5 times that backward and once
    more for recomputation) and its kernels' bytes; the step is forward + backward of 4
    layers plus the optimizer over the parameters, sharded over the 2 CP ranks."""
    step = megatron(GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1, distributed_optimizer=True)
    _, result = run_workload(step, _free(2), algorithm="ring", comm_slowdown=0.0)
    linear = GQA.linear_gemms(1, cp=2)
    assert linear[0].m == 512
    fwd_gemms = sum(gemm_time(A100, g) for g in linear)
    bwd_gemms = sum(gemm_time(A100, grad) for g in linear for grad in g.backward())
    # At A100's fused-attention rates for a 512-token query block (forward, backward).
    core = 2 * 512 * 1024 * 8 * 128
    core_fwd, core_bwd = core / A100.attention_rate(512), core / A100.attention_rate(512, True)
    kernels = GQA.layer_elementwise_bytes(512, flash_attention=True) / HBM
    forward = fwd_gemms + core_fwd + kernels
    backward = fwd_gemms + bwd_gemms + core_fwd + 2.5 * core_bwd + 3 * kernels
    optimizer = 4 * GQA.layer_params * 16 / 2 / HBM
    # (1e18 B/s transfers still take ~1e-11 s each: rel 1e-6 leaves room for them.)
    assert result.step_s == pytest.approx(4 * (forward + backward) + optimizer, rel=1e-6)


def test_cp_divides_activations_and_needs_whole_chunks():
    """Each CP rank keeps its s / cp tokens' activations (flash attention: no scores)."""
    plain = megatron_memory(GQA, tp=1, pp=1, dp=1, micro_batch=1, micro_batches=1,
                            recompute="none", flash_attention=True)  # fmt: skip
    split = megatron_memory(GQA, tp=1, pp=1, dp=1, micro_batch=1, micro_batches=1,
                            recompute="none", flash_attention=True, cp=4)  # fmt: skip
    assert split.activations == pytest.approx(plain.activations / 4)
    with pytest.raises(CcsimError, match="does not split into 2 x 3 chunks"):
        megatron(GQA, tp=1, cp=3, pp=1, global_batch=1)
    with pytest.raises(CcsimError, match="cp .* must be a positive integer"):
        megatron(GQA, tp=1, cp=0, pp=1, global_batch=1)


def test_cp_chunks_holding_only_the_embedding_or_the_loss_run_no_attention():
    """4 layers with the embedding and the loss counted as layers on PP 2 x VP 3: (4 + 2)
    / 6 = one layer a chunk, stage 0's first chunk only the embedding and stage 1's last
    only the loss (as the Llama 3 paper splits 126 layers over PP 16 x VP 8). With CP 2 a
    chunk of no layers runs no attention and exchanges no K/V: over 2 micro-batches rank
    0 (stage 0, layers in 2 of its 3 chunks) runs 2 x 2 forward and 2 x 2 backward
    attention ops of one layer each, and 2 x 2 x (1 + 2) K/V collectives (full
    recomputation: a gather forward, two gathers and a reduce-scatter backward)."""
    step = megatron(
        GQA,
        tp=1,
        cp=2,
        pp=2,
        dp=1,
        global_batch=2,
        virtual_stages=3,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    attention = [op for op in step.ops if op.rank == 0 and op.attention]
    assert len(attention) == 8
    assert all(kernel.count == 1 for op in attention for kernel in op.attention)
    exchanges = [op for op in step.ops if op.rank == 0 and op.group.startswith("cp")]
    assert len(exchanges) == 12 and all(op.nbytes > 0 for op in exchanges)
