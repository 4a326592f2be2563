"""Memory per GPU against Megatron-LM's published accounting, worked by hand."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.viz.tables import breakdown_table
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES, Device
from simulator.workload.generators import megatron
from simulator.workload.memory import layer_activation_bytes, megatron_memory
from simulator.workload.model import MODELS, Transformer

GPT3 = MODELS["gpt3-175b"]  # s 2048, h 12288, a 96, V 51200, 96 layers
SBH = 2048 * 12288


@pytest.mark.parametrize(
    ("tp", "sequence_parallel", "recompute", "per_sbh"),
    [
        # Korthikanti et al. (MLSys 2023), eq. 1: 34 + 5as/h, with 5as/h = 5 x 96 x 2048 /
        # 12288 = 80 for GPT-3.
        (1, False, "none", 34 + 80),
        # Table 2, tensor parallel t = 8: 10 + 24/t + 5as/(ht).
        (8, False, "none", 10 + 24 / 8 + 80 / 8),
        # ... with sequence parallelism: (34 + 5as/h) / t.
        (8, True, "none", (34 + 80) / 8),
        # ... selective recomputation (with sequence parallelism, as Megatron runs it): 34/t.
        (8, True, "selective", 34 / 8),
        # ... full recomputation: the layer's 2-byte input, 2sbh (/ t with SP).
        (8, False, "full", 2.0),
        (8, True, "full", 2 / 8),
    ],
)
def test_layer_activations_follow_korthikanti_table_2(tp, sequence_parallel, recompute, per_sbh):
    got = layer_activation_bytes(
        GPT3, micro_batch=1, tp=tp, sequence_parallel=sequence_parallel, recompute=recompute
    )
    assert got == pytest.approx(per_sbh * SBH, rel=1e-12)


def test_a_gated_mlp_stores_its_gate_and_up_projections():
    """LLaMA-13B's SwiGLU MLP (f = 13824, h = 5120): the inputs of its gate, up and down
    projections are kept, 6f/h in place of GPT's 16: 10 + 8 + 6 x 13824 / 5120 per sbh,
    plus 5as/h = 5 x 40 x 2048 / 5120 = 80."""
    llama = MODELS["llama-13b"]
    got = layer_activation_bytes(llama, micro_batch=2, tp=1)
    sbh = 2048 * 2 * 5120
    assert got == pytest.approx(sbh * (10 + 8 + 6 * 13824 / 5120 + 80), rel=1e-12)


def test_gpt3_on_1024_gpus_by_hand():
    """GPT-3 175B, TP 8, PP 8, DP 16, micro-batch 1, 96 micro-batches, full recompute.
    First stage: 12 layers of 12h^2 and the 51200 x h embedding, over 8 GPUs; 18 bytes
    per parameter (Megatron-LM README: 2 bf16 weights, 4 fp32 gradients, 12 of fp32
    master weights and Adam moments); with the distributed optimizer 6 + 12/16.
    Activations: 8 micro-batches in flight, each 12 layer inputs of 2sbh plus the
    embedding dropout mask, sbh."""
    h = 12288
    params = (12 * 12 * h * h + 51200 * h) / 8
    plain = megatron_memory(GPT3, tp=8, pp=8, dp=16, micro_batch=1, micro_batches=96)
    assert (plain.weights, plain.gradients, plain.optimizer) == pytest.approx(
        (2 * params, 4 * params, 12 * params), rel=1e-12
    )
    assert plain.activations == pytest.approx(8 * (12 * 2 * SBH + SBH), rel=1e-12)
    assert plain.total == pytest.approx(18 * params + 8 * 25 * SBH, rel=1e-12)
    sharded = megatron_memory(
        GPT3, tp=8, pp=8, dp=16, micro_batch=1, micro_batches=96, distributed_optimizer=True
    )
    assert sharded.weights + sharded.gradients + sharded.optimizer == pytest.approx(
        (6 + 12 / 16) * params, rel=1e-12
    )
    # Fewer micro-batches than stages: only those are ever in flight.
    few = megatron_memory(GPT3, tp=8, pp=8, dp=16, micro_batch=1, micro_batches=3)
    assert few.activations == pytest.approx(3 * 25 * SBH, rel=1e-12)
    # Without recomputation the same run needs 23 sbh per layer: 8 x (12 x 23 + 1) sbh
    # = 55.8 GB of activations besides 50.3 GB of model state: more than an A100's 85.9.
    none = megatron_memory(
        GPT3, tp=8, pp=8, dp=16, micro_batch=1, micro_batches=96, recompute="none"
    )
    assert none.activations == pytest.approx(8 * (12 * 23 + 1) * SBH, rel=1e-12)
    assert plain.fits(DEVICES["A100"].memory_bytes)
    assert not none.fits(DEVICES["A100"].memory_bytes)


def test_bad_recompute_and_stages_are_refused():
    with pytest.raises(CcsimError, match="recompute must be one of none, selective, full"):
        layer_activation_bytes(GPT3, micro_batch=1, recompute="some")
    with pytest.raises(CcsimError, match="96 layers do not split into 7"):
        megatron_memory(GPT3, tp=8, pp=7, dp=1, micro_batch=1, micro_batches=8)


def test_the_megatron_generator_reports_its_memory_beside_the_step():
    """The generated workload carries its memory, and the breakdown says whether it fits
    the run's device: a small model on A100s fits; on a made-up 1 GB device it does not."""
    small = Transformer(layers=8, hidden=1024, seq=512, vocab=32000, heads=8)
    workload = megatron(small, tp=1, pp=2, dp=1, micro_batch=1, global_batch=4, defaults="sc21")
    expected = megatron_memory(small, tp=1, pp=2, dp=1, micro_batch=1, micro_batches=4)
    assert workload.memory == expected
    graph = ring_graph(2, 1e18)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    _, result = run_workload(workload, graph, algorithm="ring")
    table = breakdown_table(result, memory=workload.memory, device=DEVICES["A100"])
    assert f"{expected.total / 1e9:12.2f}" in table and "A100 holds 85.90 GB: fits" in table
    tiny = Device("tiny", 1e12, 1e12, 1.0, 1e9)
    assert "tiny holds 1.00 GB: DOES NOT FIT" in breakdown_table(
        result, memory=workload.memory, device=tiny
    )
