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


def test_no_dropout_stores_no_masks():
    """The two dropout masks (after attention and after the MLP, s b h bytes each) are
    Korthikanti et al.'s; a model trained with dropout 0 has 2 s b h fewer per layer,
    replicated without sequence parallelism and split with it."""
    plain = Transformer(**{**GPT3.__dict__, "dropout": False})
    for tp, sp, masks in ((1, False, 2.0), (8, False, 2.0), (8, True, 2 / 8)):
        with_masks = layer_activation_bytes(GPT3, micro_batch=1, tp=tp, sequence_parallel=sp)
        without = layer_activation_bytes(plain, micro_batch=1, tp=tp, sequence_parallel=sp)
        assert with_masks - without == pytest.approx(masks * SBH, rel=1e-12)


@pytest.mark.parametrize(("flash", "saved"), [(True, 1 + 4), (False, 3 + 4)])
def test_fp8_keeps_the_linear_inputs_as_fp8(flash, saved):
    """Worked by hand for GPT-3 (f = 4h) at TP 1: in bf16 the QKV input, the first MLP
    input and the output projection's input take 2 bytes each and the second MLP input
    2f/h = 8; Transformer Engine keeps them as fp8 (half). With flash attention the
    projection's input is also flash's bf16 output, kept anyway: its fp8 cast adds 1
    instead of saving 1. Saved: 1 + 1 + 4 - 1 = 5 s b h, or 1 + 1 + 4 + 1 = 7 unfused."""
    bf16 = layer_activation_bytes(GPT3, micro_batch=1, flash_attention=flash)
    fp8 = layer_activation_bytes(GPT3, micro_batch=1, flash_attention=flash, precision="fp8")
    assert bf16 - fp8 == pytest.approx(saved * SBH, rel=1e-12)


def test_fsdp_holds_two_gathered_layers_and_one_layers_gradients():
    """Megatron-FSDP gathers one layer at a time (and prefetches the next): sharded
    states plus 2 layers' bf16 weights and one layer's gradients, not the whole model."""
    dp = 64
    m = megatron_memory(GPT3, tp=1, pp=1, dp=dp, micro_batch=1, micro_batches=1, fsdp=True,
                        recompute="full", grad_reduce="bf16")  # fmt: skip
    layers = GPT3.layers * GPT3.layer_params
    embedding = GPT3.vocab * GPT3.hidden
    assert m.weights == pytest.approx((layers / dp + embedding + 2 * GPT3.layer_params) * 2)
    assert m.gradients == pytest.approx((layers / dp + embedding + GPT3.layer_params) * 2)


def test_fp8_parameters_replace_the_bf16_weights():
    """--fp8-param-gather: each linear weight is 1 byte plus its 1-byte fp8 transpose, in
    place of 2 (bf16) + 2 (fp8 copy and transpose): 2 bytes less per linear parameter; the
    parameters' DP all-gathers move 1 byte per layer parameter instead of 2."""
    options = dict(tp=8, pp=8, dp=16, micro_batch=1, micro_batches=64, precision="fp8",
                   distributed_optimizer=True)  # fmt: skip
    plain = megatron_memory(GPT3, **options)
    fp8 = megatron_memory(GPT3, **options, fp8_params=True)
    linear = GPT3.layers / 8 * GPT3.layer_params / 8
    assert plain.weights - fp8.weights == pytest.approx(2 * linear, rel=1e-12)
    steps = [
        megatron(
            model="gpt3-175b",
            tp=8,
            pp=8,
            dp=2,
            global_batch=16,
            precision="fp8",
            fp8_param_gather=gather,
        )
        for gather in (False, True)
    ]
    gathered = [
        sum(op.nbytes for op in step.ops if op.label == "DP parameters" and op.rank == 8)
        for step in steps
    ]
    stage_layers = GPT3.layers / 8 * GPT3.layer_params / 8  # a middle stage's, rank 8
    assert gathered[0] - gathered[1] == pytest.approx(stage_layers, rel=1e-12)
    with pytest.raises(CcsimError, match="needs precision fp8"):
        megatron(model="gpt3-175b", tp=8, pp=8, dp=2, global_batch=16, fp8_param_gather=True)
