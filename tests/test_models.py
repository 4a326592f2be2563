"""Named models, grouped-query attention, mixture-of-experts layers and fp8, against the
published checkpoints' parameter counts, Megatron-LM's FLOP formula and hand
calculations."""

import subprocess
import sys

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron
from simulator.workload.kernels import Gemm, gemm_time
from simulator.workload.memory import layer_activation_bytes, megatron_memory
from simulator.workload.model import MODELS, Transformer, transformer_from_data


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # Parameter counts of the released checkpoints (Hugging Face model cards:
        # meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B, mistralai/Mixtral-8x7B-v0.1).
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("mixtral-8x7b", 46_702_792_704),
    ],
)
def test_parameters_match_the_released_checkpoints(name, published):
    """ccsim counts the weight matrices and embeddings; the checkpoints also hold the
    RMSNorm weights, two of h per layer and a final one: (2 L + 1) h."""
    m = MODELS[name]
    assert m.params + (2 * m.layers + 1) * m.hidden == published


def megatron_flops(m: Transformer, batch: int) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, since
    ADLR/megatron-lm!2789, March 2025), transcribed: 12 B s L h^2 x (attention
    ((1 + g/a + s/(2h)) x a d / h) + MLP ((f x dense + (f_moe x topk + f_shared) x moe)
    x (3/2 if SwiGLU) / (L h)) + logits V / (2 L h))."""
    h, s, L = m.hidden, m.seq, m.layers
    a, g, d = m.attention_heads, m.query_groups, m.head_dim
    moe = m.moe_layers
    moe_ffn = m.moe_ffn or m.ffn
    mlp = (m.ffn * (L - moe) + (moe_ffn * m.top_k + moe_ffn * m.shared_experts) * moe) * (
        1.5 if m.gated else 1.0
    )
    return (
        12
        * batch
        * s
        * L
        * h
        * h
        * ((1 + g / a + s / h / 2) * (a * d / h) + mlp / (L * h) + m.vocab / (2 * L * h))
    )


@pytest.mark.parametrize("name", ["llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3-like"])
def test_flops_match_megatrons_formula(name):
    m = MODELS[name]
    assert m.step_flops(64, recompute=False, causal=True) == pytest.approx(
        megatron_flops(m, 64), rel=1e-12
    )


def test_gpt3_keeps_the_sc21_count():
    """SC'21 eq. 3 counts the full attention matrix and recomputation: 96 B s l h^2 (1 +
    s/6h + V/16lh)."""
    m = MODELS["gpt3-175b"]
    B, s, L, h, V = 8, 2048, 96, 12288, 51200
    expected = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    assert m.step_flops(B) == pytest.approx(expected, rel=1e-12)


def test_grouped_query_attention_shrinks_qkv_and_the_kv_activations():
    """Llama 3 70B at TP 8: the QKV GEMM makes (64 + 2 x 8) x 128 / 8 = 1280 columns per
    rank, the output projection reads 64 x 128 / 8 = 1024; attention keeps Q and the
    output projection's input (2 + 2) and K, V at 8/64 of the size (4 x 8/64), so the
    layer stores s b h (8 + (4.5 + 6 x 28672/8192)/8 + 5 a s/(h t)) bytes with TP 8 (8,
    not Korthikanti's 10: Llama trains without dropout, so no masks are kept)."""
    m = MODELS["llama3-70b"]
    qkv, proj, _, _ = m.linear_gemms(1, tp=8)
    assert (qkv.n, qkv.k, proj.k) == (1280, 8192, 1024)
    s, h = 8192, 8192
    expected = s * h * (8 + (4 + 4 * 8 / 64 + 6 * 28672 / 8192) / 8 + 5 * 64 * s / (h * 8))
    assert layer_activation_bytes(m, micro_batch=1, tp=8) == pytest.approx(expected)


def test_llama3_70b_memory_by_hand():
    """TP 8, PP 4, DP 4, micro-batch 1, 16 micro-batches, sequence parallelism, selective
    recomputation, the distributed optimizer. The first stage holds 20 layers of
    (2 h (a + g) d + 3 h f) = 855.6M parameters and the input embedding (128256 x 8192),
    over TP 8: P = (20 x 855,638,016 + 1,050,673,152) / 8. Bytes: weights 2P, gradients
    4P, optimizer 12P / 4. Activations: 4 micro-batches in flight (min(pp, 16)), each
    20 layers of s b h (8 + 4 + 0.5 + 21) / 8 (SP and selective: everything over t; no
    dropout masks, Llama trains without dropout, nor the embedding dropout's)."""
    m = MODELS["llama3-70b"]
    layer = 2 * 8192 * (64 + 8) * 128 + 3 * 8192 * 28672
    assert m.layer_params == layer == 855_638_016
    P = (20 * layer + 128256 * 8192) / 8
    sbh = 8192 * 8192
    activations = 4 * (20 * sbh * 33.5 / 8)
    got = megatron_memory(
        m,
        tp=8,
        pp=4,
        dp=4,
        micro_batch=1,
        micro_batches=16,
        recompute="selective",
        sequence_parallel=True,
        distributed_optimizer=True,
    )
    assert got.weights == pytest.approx(2 * P)
    assert got.gradients == pytest.approx(4 * P)
    assert got.optimizer == pytest.approx(12 * P / 4)
    assert got.activations == pytest.approx(activations)
    fp8 = megatron_memory(
        m,
        tp=8,
        pp=4,
        dp=4,
        micro_batch=1,
        micro_batches=16,
        recompute="selective",
        sequence_parallel=True,
        distributed_optimizer=True,
        precision="fp8",
    )
    # fp8 keeps each linear weight's fp8 copy and transpose: 2 bytes per layer parameter.
    assert fp8.weights - got.weights == pytest.approx(2 * 20 * layer / 8)


def test_fp8_gemms_run_at_the_fp8_peak_and_read_one_byte_operands():
    """An 8192^3 GEMM on H100 in fp8: 2048 tiles in 16 waves of 132 at 1979 TFLOP/s x
    0.552 (H100's fitted fp8 fraction), each tile's fixed cost (136 K elements) at the
    bf16 rate and 6 us a kernel; its operands are 1 byte, its bf16 output 2."""
    fp8 = Gemm(8192, 8192, 8192, bits=8)
    tiles = 16 * 132 * 2 * 256 * 128
    expected = tiles * (8192 / (1979e12 * 0.552) + 136 / (989e12 * 0.64)) + 6e-6
    assert gemm_time(DEVICES["H100"], fp8) == pytest.approx(expected, rel=1e-12)
    assert fp8.hbm_bytes == 2 * 8192**2 * 1 + 8192**2 * 2
    with pytest.raises(CcsimError, match="A100 has no fp8 tensor cores"):
        gemm_time(DEVICES["A100"], fp8)


def test_fp8_megatron_step_runs_linear_gemms_in_fp8_only():
    small = Transformer(layers=4, hidden=1024, seq=512, vocab=0, heads=8, kv_heads=2)
    # Unfused attention, so that the attention core is GEMMs too (and stays bf16).
    step = megatron(small, tp=1, pp=1, dp=1, global_batch=2, precision="fp8", flash_attention=False)
    gemms = [g for op in step.ops if op.gemms for g in op.gemms]
    eight = {(g.m, g.n, g.k) for g in gemms if g.bits == 8}
    linear = {(g.m, g.n, g.k) for g in small.linear_gemms(1)}
    assert linear <= eight
    core = [g for g in gemms if g.batch > 1]  # the attention core
    assert core and all(g.bits == 16 for g in core)
    graph = ring_graph(2, 1e12, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    with pytest.raises(CcsimError, match="no fp8 tensor cores"):
        run_workload(step, graph, algorithm="ring")
    with pytest.raises(CcsimError, match="precision must be bf16 or fp8"):
        megatron(small, tp=1, pp=1, global_batch=2, precision="fp16")


def test_moe_models_are_refused_where_expert_parallelism_is_not_modelled():
    from simulator.workload.generators import ddp, zero3

    for generator in (ddp, zero3):
        with pytest.raises(CcsimError, match="mixture-of-experts model"):
            generator("mixtral-8x7b", ranks=8)
    # DeepSeek-V3-like: 3 dense layers, then 58 MoE layers.
    assert MODELS["deepseek-v3-like"].moe_layers == 58


def test_model_files_name_their_mistakes():
    with pytest.raises(CcsimError, match="unknown field 'hiden'"):
        transformer_from_data({"layers": 2, "hiden": 8}, origin="m.yaml")
    with pytest.raises(CcsimError, match="kv_heads must be a non-negative int"):
        transformer_from_data({"layers": 2, "hidden": 8, "kv_heads": "8"}, origin="m.yaml")
    with pytest.raises(CcsimError, match="hidden must be a positive integer"):
        transformer_from_data({"layers": 2}, origin="m.yaml")


def test_ccsim_workloads_lists_every_model_with_its_source():
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "workloads"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    for name, model in MODELS.items():
        line = next(line for line in done.stdout.splitlines() if line.startswith(name + " "))
        assert model.source in line
    assert {
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "mixtral-8x7b",
        "deepseek-v3-like",
        "gpt3-175b",
    } <= set(MODELS)
