"""Qwen3's query/key norms (``qk_norm``): the bundled Qwen3 MoE model files against the
released checkpoints' sizes, and the norms' traffic and launches against hand counts
from Megatron-Core's source (core_v0.16.0 attention.py lines 1477-1481: a TE norm on the
query's heads and one on the key's groups)."""

from dataclasses import replace

from simulator.validate.training import _model
from simulator.workload.generators import megatron
from simulator.workload.host import moe_layer_ops
from simulator.workload.model import MODELS

QWEN3_30B = MODELS["qwen3-30b-a3b"]


def test_model_files_are_the_released_checkpoints():
    """ccsim's weight matrices, embeddings and router, plus the RMSNorm weights ((2 L +
    1) h) and the query/key norms' (2 L d): llama.cpp prints Qwen3 30B-A3B's GGUF at
    "model params = 30.53 B" (its load log quoted in ollama/ollama issue #10458); Qwen's
    model cards give 30.5B and 235B in total."""
    sizes = {}
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        m = MODELS[name]
        assert m.qk_norm
        sizes[name] = m.params + (2 * m.layers + 1) * m.hidden + 2 * m.layers * m.head_dim
    assert round(sizes["qwen3-30b-a3b"] / 1e9, 2) == 30.53
    assert round(sizes["qwen3-235b-a22b"] / 1e9) == 235


def test_norms_move_the_query_and_key_heads_once_each_way():
    """Forward, each norm reads and writes its heads in bf16: 4 bytes x (32 query heads
    + 4 key groups) x 128 = 18,432 bytes a token in Qwen3 30B, a quarter of it at TP 4."""
    plain = replace(QWEN3_30B, qk_norm=False)
    for tp in (1, 4):
        extra = QWEN3_30B.layer_elementwise_bytes(4096, tp=tp) - plain.layer_elementwise_bytes(
            4096, tp=tp
        )
        assert extra == 4096 * 4 * (32 + 4) * 128 / tp
        moe_extra = QWEN3_30B.moe_elementwise_bytes(
            4096, tp=tp, local_experts=16
        ) - plain.moe_elementwise_bytes(4096, tp=tp, local_experts=16)
        assert moe_extra == extra


def test_generated_step_carries_the_norms_every_layer():
    """The generator's forward and backward elementwise ops of a 2-layer Qwen3 30B on one
    GPU grow by the hand count: forward 2 layers x 4,096 tokens x 18,432 bytes, backward
    twice that (its input, incoming and outgoing gradients), nothing else moves."""
    small = replace(QWEN3_30B, layers=2)

    def elementwise(model):
        ops = megatron(model=model, tp=1, pp=1, dp=1, ep=1, micro_batch=1, global_batch=1,
                       precision="bf16").ops  # fmt: skip
        out = {}
        for op in ops:
            if op.rank == 0 and "elementwise" in op.label:
                kind = "fwd" if op.label.startswith("fwd") else "bwd"
                out[kind] = out.get(kind, 0.0) + op.mem_bytes
        return out

    with_norms, without = elementwise(small), elementwise(replace(small, qk_norm=False))
    per_layer = 4096 * 4 * (32 + 4) * 128
    assert with_norms["fwd"] - without["fwd"] == 2 * per_layer
    assert with_norms["bwd"] - without["bwd"] == 2 * 2 * per_layer


def test_host_launches_two_more_kernels_each_way():
    """The query's and the key's norm: one kernel each forward, one gradient kernel each
    backward."""
    kwargs = {"local_experts": 8, "ep": 16, "recipe": "tensorwise", "dispatcher": "hybridep"}
    with_norms, without = moe_layer_ops(qk_norm=True, **kwargs), moe_layer_ops(**kwargs)
    assert with_norms.forward() - without.forward() == 2
    assert with_norms.backward() - without.backward() == 2


def test_published_rows_take_the_norms_from_the_bundled_file():
    """A Qwen3 row's inline model has no QK-norm field; the bundled file of its name gives
    it. Another MoE model's row keeps none."""
    qwen = {"moe": True, "gpu": "H100", "model": {"name": "qwen3-30b-a3b", "layers": 48,
            "hidden": 2048, "ffn": 6144, "heads": 32, "kv_heads": 4, "head_dim": 128,
            "vocab": 151936, "seq": 4096, "swiglu": True, "moe_arch": {"experts": 128,
            "topk": 8, "moe_ffn": 768, "shared_ffn": 0, "dense_layers": 0,
            "moe_layers": 48}}}  # fmt: skip
    assert _model(qwen).qk_norm
    other = {**qwen, "model": {**qwen["model"], "name": "mixtral-8x7b"}}
    assert not _model(other).qk_norm
