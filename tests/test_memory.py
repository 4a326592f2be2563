"""Memory per GPU against Megatron-LM's published accounting, worked by hand."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.viz.tables import breakdown_table
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES, Device
from simulator.workload.generators import megatron
from simulator.workload.memory import (
    fsdp_gathered_units,
    fsdp_gradient_units,
    layer_activation_bytes,
    megatron_memory,
)
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
    # DeepSeek-V3's 25.09 GB200 row as printed (EP 64 over PP 8 of 256 GPUs: 32 ranks a
    # stage): one line, not a division by zero.
    with pytest.raises(CcsimError, match="ep 64 x etp 1 must divide TP x CP x DP"):
        megatron_memory(MODELS["deepseek-v3-like"], tp=1, pp=1, dp=32, ep=64, micro_batch=1,
                        micro_batches=1)  # fmt: skip


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


# Llama 3 70B by hand (Meta's config: h 8192, FFN 28672 SwiGLU, 64 heads of 128, 8 KV
# heads, vocabulary 128256, untied): a layer's Q and O are h x h, K and V h x 1024, its
# MLP three h x FFN matrices (norms left out, as ccsim does).
LLAMA70 = MODELS["llama3-70b"]
LLAMA70_LAYER = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672  # 855,638,016
LLAMA70_VOCAB = 128256 * 8192  # one vocabulary matrix, 1,050,673,152


def test_an_untied_model_holds_its_embedding_and_output_layer():
    """Without pipelining the one stage holds the input embedding and the output layer,
    two vocabulary matrices for an untied model (Llama 3) and one for a tied one (GPT-3);
    with pipelining the first stage holds the embedding and the last the output layer."""
    one = megatron_memory(LLAMA70, tp=8, pp=1, dp=1, micro_batch=1, micro_batches=1)
    assert one.weights == pytest.approx(2 * (80 * LLAMA70_LAYER + 2 * LLAMA70_VOCAB) / 8)
    assert one.optimizer == pytest.approx(12 * (80 * LLAMA70_LAYER + 2 * LLAMA70_VOCAB) / 8)
    tied = megatron_memory(GPT3, tp=8, pp=1, dp=1, micro_batch=1, micro_batches=1)
    assert tied.weights == pytest.approx(2 * (96 * 12 * 12288**2 + 51200 * 12288) / 8)
    # PP 2: the first stage's 40 layers and embedding (the last's 40 layers and output
    # layer weigh the same; the first holds more micro-batches' activations).
    two = megatron_memory(LLAMA70, tp=8, pp=2, dp=1, micro_batch=1, micro_batches=2)
    assert two.weights == pytest.approx(2 * (40 * LLAMA70_LAYER + LLAMA70_VOCAB) / 8)
    # PP 4 with uneven stages (19, 21, 21, 19): the first and last stages hold 19 layers
    # and one vocabulary matrix each; a middle one's 21 layers weigh more than either.
    uneven = dict(tp=8, pp=4, dp=1, micro_batch=1, micro_batches=1, first_stage_layers=19,
                  last_stage_layers=19)  # fmt: skip
    stages = megatron_memory(LLAMA70, **uneven)
    assert stages.weights == pytest.approx(2 * 21 * LLAMA70_LAYER / 8)
    edge = megatron_memory(LLAMA70, **{**uneven, "first_stage_layers": 17, "last_stage_layers": 17})
    # (17, 23, 23, 17): 23 layers against 17 and a matrix, 23 x 855.6M > 17 x 855.6M + 1.05B.
    assert edge.weights == pytest.approx(2 * 23 * LLAMA70_LAYER / 8)


def test_fsdp_shards_every_parameter_and_holds_the_gathered_ones():
    """Megatron-FSDP over 64 ranks, Llama 3 70B at TP 1 as Megatron-Bridge's GB200 recipe
    runs it (communication unit 8e8, double buffers, bf16 gradients): every parameter's
    weights, gradients and optimizer state are a 64th; besides, 2 gathered layers (a
    layer of 855.6M is past the 4e8 prefetch after one), the embedding and output layer
    gathered whole in bf16, and at the start of the backward the output layer's unsharded
    gradient with the first layer's (1.05B + 855.6M, more than two layers' 1.71B)."""
    all_params = 80 * LLAMA70_LAYER + 2 * LLAMA70_VOCAB
    run = dict(tp=1, pp=1, dp=64, micro_batch=2, micro_batches=2, fsdp=True, grad_reduce="bf16",
               fsdp_communication_unit=8e8, fsdp_double_buffer=True)  # fmt: skip
    m = megatron_memory(LLAMA70, **run)
    held = 2 * LLAMA70_VOCAB * 2
    assert m.weights == pytest.approx(all_params / 64 * 2 + 2 * LLAMA70_LAYER * 2 + held)
    assert m.gradients == pytest.approx((all_params / 64 + LLAMA70_VOCAB + LLAMA70_LAYER) * 2)
    assert m.optimizer == pytest.approx(all_params / 64 * 12)
    # fp8 (Transformer Engine casts of the gathered layers, 2 bytes each) ...
    fp8 = megatron_memory(LLAMA70, **run, precision="fp8")
    assert fp8.weights - m.weights == pytest.approx(2 * 2 * LLAMA70_LAYER)
    # ... and fp8 parameters (fp8_param_gather): the layers sharded and gathered as 1-byte
    # fp8, a gathered layer's fp8 transpose beside it; the embeddings stay bf16.
    fp8_params = megatron_memory(LLAMA70, **run, precision="fp8", fp8_params=True)
    assert fp8_params.weights == pytest.approx(
        (80 * LLAMA70_LAYER * 1 + 2 * LLAMA70_VOCAB * 2) / 64 + 2 * LLAMA70_LAYER * 2 + held
    )
    assert (fp8_params.gradients, fp8_params.optimizer) == (fp8.gradients, fp8.optimizer)


def test_fsdp_units_follow_megatron_fsdps_prefetch_and_reduce_queue():
    """Megatron-FSDP's default communication unit is max(1e9, 2 x layer): Llama 3 8B's
    218.1M layers (h 4096, FFN 14336, 8 KV heads of 128) prefetch 3 (3 x 218M >= 5e8)
    beside the one running and queue 4 layers' gradients (4 x 218M <= 1e9) besides the one
    queued last and the one accumulating; double buffers hold 2 of each."""
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert MODELS["llama3-8b"].layer_params == layer
    assert (fsdp_gathered_units(layer), fsdp_gradient_units(layer)) == (4, 6)
    assert fsdp_gathered_units(layer, double_buffer=True) == 2
    assert fsdp_gradient_units(layer, double_buffer=True) == 2
    # Llama 3 70B without the recipe's unit: 2 x 855.6M, one prefetched, two queued.
    assert fsdp_gathered_units(LLAMA70_LAYER) == 2
    assert fsdp_gradient_units(LLAMA70_LAYER) == 4
    # A unit smaller than a layer: nothing waits in the queue, no layer prefetched
    # beyond the next (8e8 / 2 = 4e8 < 855.6M).
    assert fsdp_gradient_units(LLAMA70_LAYER, communication_unit=8e8) == 2
    assert fsdp_gathered_units(LLAMA70_LAYER, communication_unit=8e8) == 2
    # With Llama 3 8B on 8 ranks at the defaults, the GPU holds those units.
    m8 = MODELS["llama3-8b"]
    got = megatron_memory(m8, tp=1, pp=1, dp=8, micro_batch=1, micro_batches=1, fsdp=True,
                          grad_reduce="bf16")  # fmt: skip
    vocab = 128256 * 4096
    params = 32 * layer + 2 * vocab
    assert got.weights == pytest.approx(params / 8 * 2 + 4 * layer * 2 + 2 * vocab * 2)
    # Five layers' gradients and a vocabulary matrix's (5 x 218.1M + 525.3M = 1.62B) are
    # more than six layers' (1.31B): the matrix's sets them.
    assert got.gradients == pytest.approx((params / 8 + 5 * layer + vocab) * 2)


def test_fp8_weights_keep_a_transpose_only_where_the_gemms_need_it():
    """Per-tensor fp8 weights keep a transpose for the backward only on GPUs whose fp8
    GEMMs are TN-only (Hopper): 1 byte per linear parameter less on Blackwell, with or
    without fp8 parameters. MXFP8's columnwise copy is a second quantization, kept on
    every GPU."""
    options = dict(tp=8, pp=8, dp=16, micro_batch=1, micro_batches=64, precision="fp8",
                   distributed_optimizer=True)  # fmt: skip
    linear = GPT3.layers / 8 * GPT3.layer_params / 8
    hopper = megatron_memory(GPT3, **options)
    blackwell = megatron_memory(GPT3, **options, fp8_transpose=False)
    assert hopper.weights - blackwell.weights == pytest.approx(linear, rel=1e-12)
    mxfp8 = megatron_memory(GPT3, **options, fp8_transpose=False, fp8_recipe="mxfp8")
    assert mxfp8.weights == hopper.weights
    # fp8 parameters on Blackwell: 1 byte per linear parameter, no bf16 copy, no
    # transpose; the first stage's embedding stays bf16.
    params = (12 * 12 * 12288**2 + 51200 * 12288) / 8
    fp8_params = megatron_memory(GPT3, **options, fp8_transpose=False, fp8_params=True)
    assert fp8_params.weights == pytest.approx(2 * params - linear, rel=1e-12)


@pytest.mark.parametrize(("in_flight", "held"), [(0, 40), (1, 41)])
def test_offloaded_activations_leave_the_rest_on_the_gpu(in_flight, held):
    """Llama 3 70B as Megatron-Bridge's GB200 fp8 recipe runs it (TP 1, FSDP 64, micro-
    batch 2, 40 of 80 layers offloaded): a layer keeps 29 s b h bytes (fp8 casts of the
    QKV, projection and MLP inputs 1 + 1 + 1 + 3.5, the two norms' bf16 inputs 2 + 2,
    flash attention's Q, K, V and output 2 + 0.5 + 2, SwiGLU's 2 x 3.5h bf16 input 14), and
    the GPU holds 40 layers' (Transformer Engine from v2.10) or 41 (up to v2.9, the last
    offloaded layer not yet freed when the last layer runs)."""
    sbh = 8192 * 2 * 8192
    per_layer = layer_activation_bytes(LLAMA70, micro_batch=2, flash_attention=True,
                                       precision="fp8")  # fmt: skip
    assert per_layer == pytest.approx(29 * sbh, rel=1e-12)
    m = megatron_memory(LLAMA70, tp=1, pp=1, dp=64, micro_batch=2, micro_batches=2,
                        fsdp=True, recompute="none", flash_attention=True, precision="fp8",
                        activation_offload_layers=40,
                        activation_offload_in_flight=in_flight)  # fmt: skip
    assert m.activations == pytest.approx(held * 29 * sbh, rel=1e-12)


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


# Nemotron-4 340B (NeMo's nemotron.py: h 18432, f 73728 squared-ReLU, 96 heads, 8 query
# groups, 96 layers, dropout 0; vocabulary 256,000) at 4096 tokens, as DGX Cloud's
# v25.01 benchmark runs it on 128 H100: TP 8, PP 8, VP 12, DP 2, micro-batch 1, 16
# micro-batches.
NEMOTRON = Transformer(layers=96, hidden=18432, ffn=73728, heads=96, kv_heads=8,
                       seq=4096, vocab=256000, dropout=False)  # fmt: skip
NEMOTRON_RUN = dict(tp=8, pp=8, dp=2, micro_batch=1, micro_batches=16, virtual_stages=12,
                    sequence_parallel=True, recompute="selective", flash_attention=True,
                    distributed_optimizer=True)  # fmt: skip


def _nemotron_first_stage_params() -> tuple[float, float]:
    """(linear, all) parameters of one GPU of the first stage, by Megatron's formula
    (theoretical_memory_usage.py, layer norms left out as ccsim does): attention 2 h^2
    (1 + g/a), MLP 2 h f, 12 layers and the V x h embedding over 8 GPUs."""
    h, f = 18432, 73728
    layer = 2 * h * h * (1 + 8 / 96) + 2 * h * f
    return 12 * layer / 8, (12 * layer + 256000 * h) / 8


def test_nemotron4_340b_fits_with_its_recipes_optimizer_dtypes():
    """The recipe (nemotron4-340b-synth.yaml: distributed_fused_adam, grad_sync_dtype
    bf16, dtype bf16, bf16 weights) keeps bf16 gradients and bf16 moments without fp32
    main weights: 2 + 2 + 4/d bytes per parameter where Megatron's formula counts
    6 + 12/d. Activations: the first stage runs 2(p - 1) + (v - 1)p + 1 = 103 chunk
    passes of one layer, Megatron's L (1 + (p - 1)/(p v)) = 96 x 103/96; each keeps
    (8 + 4 + 4 g/a + 16) s b h / t (Korthikanti's 34 without the two dropout masks and
    with K and V of 8 of 96 heads)."""
    _, params = _nemotron_first_stage_params()
    sbh = 4096 * 18432
    layer = (8 + 4 + 4 * 8 / 96 + 16) * sbh / 8
    m = megatron_memory(NEMOTRON, **NEMOTRON_RUN, grad_reduce="bf16", optimizer_state="bf16")
    assert (m.weights, m.gradients, m.optimizer) == pytest.approx(
        (2 * params, 2 * params, 4 * params / 2), rel=1e-12
    )
    assert m.activations == pytest.approx(103 * layer, rel=1e-12)
    # ... which is Megatron's interleaving penalty, L (1 + (p - 1)/(p v)) layers.
    assert m.activations == pytest.approx(96 * (1 + 7 / (8 * 12)) * layer, rel=1e-12)
    h100 = DEVICES["H100"].memory_bytes  # 80 GiB
    assert m.fits(h100)
    # Megatron's own activation formula (SP + selective: s b h (18 + 4 f/h) / t per
    # layer, L layers x the interleaving penalty, the embedding's input and dropout for
    # p micro-batches) with the recipe's dtypes fits too; with its fp32 defaults it does
    # not: what the recipe's dtypes are worth.
    megatron_activations = (sbh * (18 + 4 * 4) * 96 + 8 * 4096 * 8 + sbh * 8) * (1 + 7 / 96) / 8
    assert m.total <= (2 + 2 + 4 / 2) * params + megatron_activations < h100
    assert (6 + 12 / 2) * params + megatron_activations > h100
    # ccsim's default, fp32 gradients and Megatron-Core's fp32 state: 6 + 12/d.
    default = megatron_memory(NEMOTRON, **NEMOTRON_RUN)
    assert default.weights + default.gradients + default.optimizer == pytest.approx(
        (6 + 12 / 2) * params, rel=1e-12
    )
    assert not default.fits(h100)


def test_nemotron4_340b_fp8_parameters_keep_a_bf16_master_copy():
    """The fp8 run sets fp8_params: the linear weights are fp8 (1 byte) with their fp8
    transposes (1), the embedding stays bf16, and NeMo then stores a bf16 copy of the
    weights as optimizer state (store_params): 6 bytes over d. Activations: the fp8 casts
    of the linear inputs save 5 s b h / t per layer with flash attention (see
    test_fp8_keeps_the_linear_inputs_as_fp8)."""
    linear, params = _nemotron_first_stage_params()
    sbh = 4096 * 18432
    m = megatron_memory(NEMOTRON, **NEMOTRON_RUN, precision="fp8", fp8_params=True,
                        grad_reduce="bf16", optimizer_state="bf16-master")  # fmt: skip
    assert m.weights == pytest.approx(2 * linear + 2 * (params - linear), rel=1e-12)
    assert (m.gradients, m.optimizer) == pytest.approx((2 * params, 6 * params / 2), rel=1e-12)
    layer = (8 + 4 + 4 * 8 / 96 + 16 - 5) * sbh / 8
    assert m.activations == pytest.approx(103 * layer, rel=1e-12)
    assert m.fits(DEVICES["H100"].memory_bytes)


def test_the_optimizer_state_sets_the_optimizer_steps_traffic():
    """The optimizer step reads and writes its state and reads a 4-byte gradient per
    parameter of its shard: 16 bytes with fp32 state, 8 with bf16 moments; the state's
    name is checked."""
    small = Transformer(layers=4, hidden=1024, seq=512, vocab=32000, heads=8)

    def step_bytes(**options):
        w = megatron(small, tp=1, pp=1, dp=2, micro_batch=1, global_batch=4, **options)
        return next(op.mem_bytes for op in w.ops if op.id == "r0.opt")

    shard = (4 * small.layer_params + 2 * 32000 * 1024) / 2  # untied: embedding and output
    assert step_bytes() == pytest.approx(16 * shard, rel=1e-12)
    assert step_bytes(optimizer_state="bf16") == pytest.approx(8 * shard, rel=1e-12)
    with pytest.raises(CcsimError, match="optimizer_state must be one of fp32, bf16"):
        megatron(small, tp=1, pp=1, dp=2, global_batch=4, optimizer_state="fp16")


@pytest.mark.parametrize("v", [1, 2])
def test_combined_1f1b_holds_one_more_micro_batch(v):
    """Megatron-Core's combined 1F1B (overlap_moe_expert_parallel_comm) runs one more
    warm-up forward: plain 1F1B's first stage holds p micro-batches, this one p + 1 (its
    activations (p + 1) / p of plain's); interleaved, one more chunk pass of L / (p v)
    layers held at the peak."""
    from simulator.workload.memory import megatron_memory
    from simulator.workload.model import MODELS
    from simulator.workload.pipeline import peak_held

    pp, micro = 4, 16
    common = dict(tp=1, pp=pp, dp=8, ep=4, micro_batch=1, micro_batches=micro)
    common.update(virtual_stages=v, recompute="none", flash_attention=True)
    model = MODELS["mixtral-8x7b"]
    plain = megatron_memory(model, **common)
    combined = megatron_memory(model, **common, moe_a2a_overlap=True)
    chunks = [model.layers // (pp * v)] * v
    held = peak_held(0, pp, micro, chunks)
    more = peak_held(0, pp, micro, chunks, extra_warmup=1)
    assert more == held + chunks[0]  # one more chunk pass held at the peak
    expected = (pp + 1) / pp if v == 1 else more / held
    assert combined.activations == pytest.approx(plain.activations * expected, rel=1e-12)
    assert combined.weights == plain.weights and combined.optimizer == plain.optimizer


#: Llama 3 405B (Dubey et al. 2024, Table 3): 126 layers, h 16384, f 53248, 128 heads of
#: 128, 8 KV heads, vocabulary 128256, SwiGLU, untied, no dropout; at 8K tokens.
LLAMA3_405B = Transformer(
    layers=126, hidden=16384, seq=8192, vocab=128256, ffn=53248, gated=True, heads=128,
    kv_heads=8, dropout=False,
)  # fmt: skip
#: One layer's parameters by hand: Q and output projections 2 h^2, K and V 2 h (8 x 128),
#: the gated MLP 3 h f.
LLAMA3_405B_LAYER = 2 * 16384**2 + 2 * 16384 * 1024 + 3 * 16384 * 53248
#: One layer's activations per s b h / t at TP 8 with sequence parallelism and flash
#: attention (Korthikanti et al.'s count without the dropout masks and the scores): the
#: two norms' inputs and outputs 8, Q and the attention output 4, K and V 4 x 8/128, the
#: gate and up projections' outputs and the down projection's input 6 f / h.
LLAMA3_405B_PER_SBH = 8 + 4 + 4 * 8 / 128 + 6 * 53248 / 16384


def _llama3_405b_paper(dp: int, micro_batches: int, **options) -> object:
    """The Llama 3 paper's layout (TP 8, PP 16, one-layer chunks, V 8)."""
    return megatron_memory(
        LLAMA3_405B, tp=8, pp=16, dp=dp, micro_batch=1, micro_batches=micro_batches,
        virtual_stages=8, recompute="none", sequence_parallel=True, flash_attention=True,
        distributed_optimizer=True, account_for_embedding=True, account_for_loss=True,
        **options,
    )  # fmt: skip


def test_llama3_405b_stage_holds_megatrons_warmup_without_stage_outputs():
    """The paper's 405B pipeline on Megatron-Core's interleaved schedule: a middle stage
    (8 one-layer chunks) runs 2 (16 - 1 - 1) + (8 - 1) x 16 = 140 warm-up forwards and one
    more before its first backward (get_pp_rank_microbatches), so at 32 micro-batches it
    holds 141 layers' activations, each 31.75 s b h / 8 bytes, and nothing for the chunks'
    outputs, which Megatron-LM frees once sent (deallocate_pipeline_outputs) and Meta
    frees too (paper p. 11); at 16 micro-batches all 16 x 8 = 128 chunk passes are in the
    warm-up. Model state: 8 layers over TP 8 in bf16 weights and fp32 gradients, Adam's
    12 bytes over DP."""
    sbh_t = 8192 * 16384 / 8
    params = 8 * LLAMA3_405B_LAYER / 8
    for dp, micro, held in ((64, 32, 141), (128, 16, 128)):
        m = _llama3_405b_paper(dp, micro)
        assert m.activations == pytest.approx(held * LLAMA3_405B_PER_SBH * sbh_t, rel=1e-12)
        assert (m.weights, m.gradients, m.optimizer) == pytest.approx(
            (2 * params, 4 * params, 12 * params / dp), rel=1e-12
        )


def test_lazy_gradients_are_allocated_by_each_chunks_first_backward():
    """PyTorch FSDP's gradients (lazy_gradients) exist from their module's first backward.
    At 16 micro-batches over 16 stages every forward precedes every backward: the middle
    stage's peak is its first backward's start, all 128 layers' activations beside that
    layer's fp32 gradient, its fresh bf16 one (6 bytes a parameter) and the 8 layers' fp32
    gradients sharded over the 128 DP ranks; Megatron's buffer holds all 8 layers' fp32
    gradients (4 bytes a parameter) there: 10.3 GB more. At 32 micro-batches the 1F1B
    steady state holds 141 layers' activations while chunk 0's first backward allocates
    the last of the 8 layers' gradients: the two agree but for the fresh and sharded
    ones."""
    sbh_t = 8192 * 16384 / 8
    layer = LLAMA3_405B_LAYER / 8
    for dp, micro, held, allocated in ((128, 16, 128, 1), (64, 32, 141, 8)):
        lazy = _llama3_405b_paper(dp, micro, lazy_gradients=True)
        assert lazy.activations == pytest.approx(held * LLAMA3_405B_PER_SBH * sbh_t, rel=1e-12)
        expected = (4 * allocated + 2) * layer + 4 * 8 * layer / dp
        assert lazy.gradients == pytest.approx(expected, rel=1e-12)
        buffer = _llama3_405b_paper(dp, micro)
        assert (lazy.weights, lazy.optimizer) == (buffer.weights, buffer.optimizer)
    saved = (
        _llama3_405b_paper(128, 16).total - _llama3_405b_paper(128, 16, lazy_gradients=True).total
    )
    assert saved == pytest.approx((4 * 8 - 4 - 2 - 4 * 8 / 128) * layer, rel=1e-12)
    assert saved / 1e9 == pytest.approx(10.26, abs=0.01)


def test_lazy_gradients_refuse_what_they_do_not_model():
    small = Transformer(layers=8, hidden=1024, seq=512, vocab=32000, heads=8)
    common = dict(tp=1, pp=2, dp=2, micro_batch=1, micro_batches=4, lazy_gradients=True)
    for options in ({}, {"distributed_optimizer": True, "fsdp": True},
                    {"distributed_optimizer": True, "activation_offload_layers": 1}):  # fmt: skip
        with pytest.raises(CcsimError, match="lazy_gradients .* distributed optimizer only"):
            megatron_memory(small, **common, **options)


def test_lazy_gradients_allocate_the_output_layer_first_and_the_embedding_last():
    """Without pipelining a micro-batch's backward runs the output layer first and the
    input embedding last; its forward keeps two layers' activations, s b h (8 + 24 + 5 a
    s / h) = 37 s b h each (no dropout, no recomputation). With a vocabulary large beside
    the layers (100,000 x 64 against two layers of 12 x 64^2) the first micro-batch's
    backward allocates every fp32 gradient by its end; the peak is the second one's start:
    its activations, all fp32 gradients, the output layer's fresh bf16 gradient, and all
    fp32 gradients sharded over DP 2."""
    small = Transformer(layers=2, hidden=64, seq=16, vocab=100_000, heads=4, dropout=False)
    matrix, layer = 100_000 * 64, 12 * 64 * 64
    common = dict(tp=1, pp=1, dp=2, micro_batch=1, micro_batches=2, recompute="none")
    lazy = megatron_memory(small, **common, distributed_optimizer=True, lazy_gradients=True)
    assert lazy.activations == 2 * 37 * 16 * 64
    expected = 4 * (2 * matrix + 2 * layer) + 2 * matrix + 4 * (2 * matrix + 2 * layer) / 2
    assert lazy.gradients == pytest.approx(expected, rel=1e-12)
