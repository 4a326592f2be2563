"""Workload generators and the AICB importer, against counts and timelines worked out by
hand."""

import dataclasses
import functools
import subprocess
import sys

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import load_workload, run_workload
from simulator.workload.aicb import load_aicb
from simulator.workload.devices import DEVICES
from simulator.workload.generators import Transformer, ddp, moe, zero3
from simulator.workload.generators import megatron as megatron_core
from simulator.workload.kernels import gemm_time
from simulator.workload.presets import resolve_workload
from simulator.workload.trace import WorkloadError

# The hand-worked steps here are for the options SC'21 ran (full recomputation, unfused
# attention, nothing overlapped) unless a test gives its own; Megatron-Core's defaults
# are tested in tests/test_megatron_defaults.py.
megatron = functools.partial(megatron_core, defaults="sc21")

SMALL = Transformer(layers=8, hidden=1024, seq=512, vocab=32000)
EVEN = dataclasses.replace(SMALL, vocab=0)  # equal pipeline stages: no embedding, no logits
A100_GEMM = 312e12 * 0.7  # bytes/s and FLOP/s of the device table (A100)
A100_HBM = 2.039e12


def gemm_s(gemms):
    """Seconds of GEMM kernels on an A100 (the kernel model, checked by hand in
    tests/test_kernels.py)."""
    return sum(gemm_time(DEVICES["A100"], g) for g in gemms)


def forward_gemms(model=SMALL, micro_batch=1, tp=1):
    return model.linear_gemms(micro_batch, tp=tp) + model.attention_gemms(micro_batch, tp=tp)


def backward_gemms(model=SMALL, micro_batch=1, tp=1):
    return [grad for g in forward_gemms(model, micro_batch, tp) for grad in g.backward()]


def layer_time(micro_batch=1):
    """One layer's forward on an A100: its GEMMs, then its memory-bound kernels at HBM
    bandwidth."""
    return (
        gemm_s(forward_gemms(SMALL, micro_batch))
        + SMALL.layer_elementwise_bytes(micro_batch * SMALL.seq) / A100_HBM
    )


def layer_backward_time(micro_batch=1):
    """One layer's backward with full recomputation: the forward's GEMMs again, each
    GEMM's two gradient GEMMs, and three times the forward's memory-bound traffic (twice
    for the backward, once for the recomputed forward)."""
    tokens = micro_batch * SMALL.seq
    return (
        gemm_s(forward_gemms(SMALL, micro_batch))
        + gemm_s(backward_gemms(SMALL, micro_batch))
        + 3 * SMALL.layer_elementwise_bytes(tokens) / A100_HBM
    )


def fast_ring(p, model="A100"):
    """A ring of p GPUs so fast (1e18 B/s, no latency) that communication is free."""
    graph = ring_graph(p, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = model
    return graph


def test_transformer_arithmetic():
    """12 h^2 parameters per GPT layer (4h^2 attention + 8h^2 MLP); GPT-3 175B has
    96 x 12 x 12288^2 + 51200 x 12288 = 174.6e9 parameters (one embedding, tied to the
    output layer), as SC'21's formula 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)) gives
    less its biases, norms and positions (0.04e9); MT-NLG 530B 105 x 12 x 20480^2 +
    51200 x 20480 = 529.5e9, SC'21 Table 1's 529.6e9 less those (0.07e9)."""
    assert SMALL.layer_params == 12 * 1024**2
    assert resolve_workload("megatron-gpt3-tp8-pp8").ranks == 64
    from simulator.workload.generators import MODELS

    assert MODELS["gpt3-175b"].params == pytest.approx(174.6e9, rel=1e-3)
    assert MODELS["mt-nlg-530b"].params == pytest.approx(529.5e9, rel=1e-3)
    assert MODELS["llama-13b"].params == pytest.approx(13.0e9, rel=0.02)


def test_ddp_buckets_carry_every_gradient_once():
    """fp32 gradients by default (automatic mixed precision keeps fp32 parameters): 4
    bytes a parameter, 12 x 1024^2 x 4 = 48 MiB per layer > 5 MiB, one bucket per layer;
    a bf16 model's gradients are 2 bytes, 24 MiB a layer. 48 MiB buckets then hold two
    layers of bf16 gradients, one of fp32."""
    for grad_reduce, grad in (("fp32", 4), ("bf16", 2)):
        workload = ddp(SMALL, ranks=4, bucket_bytes=5 * 2**20, grad_reduce=grad_reduce)
        per_layer = SMALL.layer_params * grad
        for rank in range(4):
            buckets = [op for op in workload.ops if op.rank == rank and op.kind == "collective"]
            assert sum(op.nbytes for op in buckets) == pytest.approx(SMALL.layers * per_layer)
            assert len(buckets) == SMALL.layers
    wide = 48 * 2**20
    assert len(_collectives(ddp(SMALL, ranks=2, bucket_bytes=wide, grad_reduce="bf16"), 0)) == 4
    assert len(_collectives(ddp(SMALL, ranks=2, bucket_bytes=wide), 0)) == 8


def test_zero3_gathers_twice_and_scatters_once_per_layer():
    workload = zero3(SMALL, ranks=4)
    ops = [op for op in workload.ops if op.rank == 0]
    gathers = [op for op in ops if op.op == "all_gather"]
    scatters = [op for op in ops if op.op == "reduce_scatter"]
    assert len(gathers) == 2 * SMALL.layers and len(scatters) == SMALL.layers
    assert {op.nbytes for op in gathers + scatters} == {SMALL.layer_params * 2}


def test_one_f_one_b_step_time():
    """With free communication and equal stages (no vocabulary: no embedding on the first
    stage, no logits on the last), a 1F1B pipeline of p stages and m
    micro-batches takes (m + p - 1)(t_f + t_b): stage 0 starts first and finishes its last
    backward last. Here t_f = (L/p) x (the layer's GEMMs + its memory-bound kernels'
    bytes / HBM bandwidth), t_b = (L/p) x (the recomputed forward, the gradient GEMMs and
    the backward's kernels); then stage 0's optimizer reads and writes 16 bytes per
    parameter it holds (its layers plus the embedding) at HBM speed."""
    p, m = 4, 8
    workload = megatron(EVEN, tp=1, pp=p, dp=1, micro_batch=1, global_batch=m)
    _, result = run_workload(workload, fast_ring(p), algorithm="ring")
    t_f = EVEN.layers / p * layer_time()
    t_b = EVEN.layers / p * layer_backward_time()
    stage0_params = EVEN.layers / p * EVEN.layer_params + EVEN.vocab * EVEN.hidden
    expected = (m + p - 1) * (t_f + t_b) + stage0_params * 16 / A100_HBM
    assert result.step_s == pytest.approx(expected, rel=1e-6)
    # The bubble of stage p-1 is (p-1)(t_f + t_b) plus the wait for stage 0's optimizer.
    last = result.ranks[p - 1]
    assert last.compute_s == pytest.approx(
        m * (t_f + t_b)
        + (EVEN.layers / p * EVEN.layer_params + EVEN.vocab * EVEN.hidden) * 16 / A100_HBM,
        rel=1e-6,
    )


def test_megatron_sends_match_receives():
    workload = megatron(SMALL, tp=2, pp=4, dp=2, global_batch=16)
    assert workload.ranks == 16
    sends = [op for op in workload.ops if op.kind == "send"]
    assert len(sends) == len(workload.pairs)
    # Every micro-batch crosses p - 1 stage boundaries forward and backward, per TP rank
    # and DP replica: 16 / 2 = 8 micro-batches per replica x 3 x 2 x 2 x 2.
    assert len(sends) == 8 * 3 * 2 * 2 * 2


def test_moe_uses_all_to_all():
    workload = moe(ranks=4, layers=2)
    calls = {op.op for op in workload.ops if op.kind == "collective"}
    assert calls == {"all_to_all"}


HEADER = (
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: {tp} ep: 1 pp: 1 ga: {ga} "
    "all_gpus: {n} checkpoints: 0 checkpoint_initiates: 0\n"
)
AICB_TP = (
    HEADER.format(tp=2, ga=1, n=4)
    + """1
l0 -1 1000000 ALLREDUCE 100000000 2000000 NONE 0 3000000 NONE 0 500000
"""
)

AICB_DP = (
    HEADER.format(tp=1, ga=2, n=2)
    + """1
l0 -1 1000000 NONE 0 1000000 NONE 0 1000000 ALLREDUCE 100000000 0
"""
)


def test_aicb_tensor_parallel_layer(tmp_path):
    """One layer on 4 GPUs in TP pairs (0,1), (2,3), each pair joined by its own 100 GB/s
    link: forward 1 ms, TP all-reduce of 1e8 B (1 ms), input gradient 2 ms, weight
    gradient 3 ms, update 0.5 ms: 7.5 ms."""
    path = tmp_path / "tp.txt"
    path.write_text(AICB_TP)
    workload = load_aicb(path)
    assert workload.ranks == 4
    assert sorted(g.ranks for g in workload.groups.values() if g.kind == "TP") == [[0, 1], [2, 3]]
    _, result = run_workload(workload, ring_graph(4, 100e9, 0.0), algorithm="ring")
    assert result.step_s == pytest.approx(7.5e-3, rel=1e-9)


def test_aicb_gradient_accumulation_and_dp_overlap(tmp_path):
    """Two micro-batches of forward, input- and weight-gradient (1 ms each), then the
    weight-gradient all-reduce of 1e8 B over DP (1 ms on a 100 GB/s pair): 7 ms, of which
    1 ms is exposed communication."""
    path = tmp_path / "dp.txt"
    path.write_text(AICB_DP)
    _, result = run_workload(load_aicb(path), ring_graph(2, 100e9, 0.0), algorithm="ring")
    assert result.step_s == pytest.approx(7e-3, rel=1e-9)
    assert result.mean("exposed_s") == pytest.approx(1e-3, rel=1e-9)


def test_aicb_errors_name_the_problem(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text(AICB_TP.replace("pp: 1", "pp: 4"))
    with pytest.raises(WorkloadError, match="pp: 4"):
        load_aicb(path)
    path.write_text(AICB_TP.replace("ALLREDUCE", "ALLSHUFFLE"))
    with pytest.raises(WorkloadError, match="ALLSHUFFLE"):
        load_aicb(path)


def test_cli_run_and_generate(tmp_path):
    out = tmp_path / "ddp.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator",
            "generate",
            "ddp",
            "--ranks",
            "4",
            "--model",
            "gpt-1.5b",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert load_workload(out).ranks == 4
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "run", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "step time" in done.stdout and "exposed" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "run", "no-such-workload"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "ddp-gpt1.5b-16" in done.stderr
    assert "Traceback" not in done.stderr


def _collectives(workload, rank):
    return [op for op in workload.ops if op.kind == "collective" and op.rank == rank]


def test_sequence_parallel_splits_each_tp_all_reduce_into_two_calls():
    """Megatron's sequence parallelism replaces each TP all-reduce by a reduce-scatter and
    an all-gather of the same buffer (Korthikanti et al. 2023, section 4.2.2): per rank,
    micro-batch and pass, two calls of the bytes the all-reduce had, in that order."""
    plain = megatron(SMALL, tp=2, pp=2, dp=1, global_batch=4)
    split = megatron(SMALL, tp=2, pp=2, dp=1, global_batch=4, sequence_parallel=True)
    before = _collectives(plain, 0)
    after = _collectives(split, 0)
    assert {op.op for op in before} == {"all_reduce"}
    assert len(after) == 2 * len(before)
    assert [op.op for op in after[:2]] == ["reduce_scatter", "all_gather"]
    assert [op.nbytes for op in after[::2]] == [op.nbytes for op in before]
    assert [op.nbytes for op in after[1::2]] == [op.nbytes for op in before]
    # Activations shrink by t where they were not split (Korthikanti Table 2).
    assert split.memory.activations < plain.memory.activations


def test_selective_recompute_reruns_only_the_attention_core():
    """Backward = 2 x forward + the attention core again (4 s h FLOPs per token and layer,
    over TP); its TP all-reduces stay two per layer (full recompute: four)."""
    tp, pp = 2, 2
    full = megatron(SMALL, tp=tp, pp=pp, dp=1, global_batch=4)
    selective = megatron(SMALL, tp=tp, pp=pp, dp=1, global_batch=4, recompute="selective")
    tokens = SMALL.seq  # micro-batch 1
    fwd = SMALL.layers / pp * SMALL.layer_forward_flops(tokens) / tp
    core = SMALL.layers / pp * tokens * 4 * SMALL.seq * SMALL.hidden / tp

    def flops(workload, label):
        return [
            op.total_flops
            for op in workload.ops
            if op.rank == 0 and op.label.startswith(f"{label} mb")
        ]

    assert flops(selective, "fwd") == pytest.approx([fwd] * 4)
    assert flops(selective, "bwd") == pytest.approx([2 * fwd + core] * 4)
    assert flops(full, "bwd") == pytest.approx([3 * fwd] * 4)
    activation = tokens * SMALL.hidden * 2 * SMALL.layers / pp
    bwd_bytes = {op.nbytes for op in _collectives(selective, 0) if "bwd" in op.label}
    assert bwd_bytes == {2 * activation}
    assert {op.nbytes for op in _collectives(full, 0) if "bwd" in op.label} == {4 * activation}
    with pytest.raises(CcsimError, match="recompute must be"):
        megatron(SMALL, tp=2, pp=2, recompute="partial")


def test_distributed_optimizer_shards_the_step():
    """DP 4, no TP or PP, free communication: the gradients are reduce-scattered (fp32,
    4 bytes per parameter, as Megatron-LM reduces them in bf16 by default) and the
    parameters all-gathered (bf16, 2 bytes per parameter), and the
    optimizer reads and writes 16 bytes per parameter for 1/4 of them, so the step is
    m (t_f + t_b) + 16 P / (4 x HBM) with m = 2 micro-batches per replica, the one stage
    also computing the logits (2 s h V FLOPs forward, twice that backward) and the
    unfused loss over them (38 + 14 bytes a logit at HBM bandwidth)."""
    dp, m = 4, 2
    workload = megatron(SMALL, tp=1, pp=1, dp=dp, global_batch=dp * m, distributed_optimizer=True)
    # The layers, the input embedding and the untied output layer: one stage holds all.
    params = SMALL.layers * SMALL.layer_params + 2 * SMALL.vocab * SMALL.hidden
    dp_calls = [op for op in _collectives(workload, 0) if op.label.startswith("DP")]
    assert [(op.op, op.nbytes) for op in dp_calls] == [
        ("reduce_scatter", 4 * params),
        ("all_gather", 2 * params),
    ]
    _, result = run_workload(workload, fast_ring(dp), algorithm="ring")
    passes = SMALL.layers * (layer_time() + layer_backward_time())
    out = SMALL.logits_gemm(1)
    logits = gemm_s([out, *out.backward()])
    assert out.flops == 2 * SMALL.seq * SMALL.hidden * SMALL.vocab
    loss = (38 + 14) * SMALL.seq * SMALL.vocab / A100_HBM
    expected = m * (passes + logits + loss) + 16 * params / dp / A100_HBM
    assert result.step_s == pytest.approx(expected, rel=1e-6)
    assert workload.memory.optimizer == pytest.approx(12 * params / dp)


def test_megatron_reports_model_flops_as_megatron_lm_counts_them():
    """Issue 36: the workload's FLOPs are the model's own, as Megatron-LM counts them
    today (no recomputation): with full recomputation Narayanan et al.'s SC'21 eq. 3,
    96 B s l h^2 (1 + s/6h + V/16lh), counts 4 passes of the layers; Megatron-LM's count
    is 3/4 of its layers' share plus the logits' 6 B s h V, whatever the recomputation.
    The run's TFLOP/s per GPU is that over the step time and the ranks, and its MFU is
    of the dense peak of the precision it runs in (fp8's on H100, twice bf16's)."""
    from simulator.viz.tables import breakdown_table
    from simulator.workload.devices import DEVICES

    B, s, layers, h, V = 8, SMALL.seq, SMALL.layers, SMALL.hidden, SMALL.vocab
    eq3 = B * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h))
    logits = 6 * B * s * h * V
    megatron_lm = 0.75 * (96 * eq3 - logits) + logits
    full = megatron(SMALL, tp=1, pp=2, dp=1, global_batch=B)
    none = megatron(SMALL, tp=1, pp=2, dp=1, global_batch=B, recompute="none")
    assert full.model_flops == pytest.approx(megatron_lm, rel=1e-12)
    assert none.model_flops == full.model_flops
    assert SMALL.step_flops(B, recompute=True) == pytest.approx(96 * eq3, rel=1e-12)
    _, result = run_workload(full, fast_ring(2), algorithm="ring")
    per_gpu = full.model_flops / result.step_s / 2
    table = breakdown_table(result, model_flops=full.model_flops, device=DEVICES["A100"])
    assert f"{per_gpu / 1e12:>12.1f} (MFU {per_gpu / 312e12:.1%} of A100's dense bf16" in table
    fp8 = breakdown_table(
        result, model_flops=full.model_flops, device=DEVICES["H100"], precision="fp8"
    )
    assert f"(MFU {per_gpu / 1979e12:.1%} of H100's dense fp8 peak, 1,979)" in fp8
    assert megatron(SMALL, tp=1, pp=2, dp=1, global_batch=B, precision="fp8").precision == "fp8"


def test_elementwise_bytes_split_with_tp_and_sequence_parallelism():
    """GPT-3 (h 12288, a 96, s 2048, f 4h) at TP 8: the scores (9as) and the MLP's 4f are
    split over TP; the 22h of LayerNorms and bias-dropout-adds only with sequence
    parallelism. A gated MLP (LLaMA-13B) moves 6f/t instead of 4f/t."""
    from simulator.workload.model import MODELS

    gpt3, h, a, s = MODELS["gpt3-175b"], 12288, 96, 2048
    scores_mlp = (9 * a * s + 4 * 4 * h) / 8
    assert gpt3.layer_elementwise_bytes(2, tp=8) == 2 * (22 * h + scores_mlp)
    assert gpt3.layer_elementwise_bytes(2, tp=8, sequence_parallel=True) == 2 * (
        22 * h / 8 + scores_mlp
    )
    llama = MODELS["llama-13b"]
    assert llama.layer_elementwise_bytes(1) == 22 * 5120 + 9 * 40 * 2048 + 6 * 13824


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (4, 2, 8), (2, 2, 4), (4, 2, 4)])
def test_interleaved_one_f_one_b_shrinks_the_bubble_by_v(p, v, m):
    """Free communication, equal chunks of L/(p v) layers (no vocabulary): Megatron's
    interleaved 1F1B takes m (t_f + t_b) + (p - 1)(t_f + t_b)/v (SC'21, section 2.2.2),
    t_f and t_b a whole stage's forward and backward, i.e. (m v + p - 1) chunk passes;
    then stage 0's optimizer step (its layers and the embedding, 16 bytes each)."""
    workload = megatron(EVEN, tp=1, pp=p, dp=1, micro_batch=1, global_batch=m, virtual_stages=v)
    assert len(workload.pairs) == len([op for op in workload.ops if op.kind == "send"])
    _, result = run_workload(workload, fast_ring(p), algorithm="ring")
    # A chunk's forward and backward.
    chunk = EVEN.layers / (p * v) * (layer_time() + layer_backward_time())
    params = EVEN.layers / p * EVEN.layer_params + EVEN.vocab * EVEN.hidden
    expected = (m * v + p - 1) * chunk + params * 16 / A100_HBM
    assert result.step_s == pytest.approx(expected, rel=1e-6)


def test_interleaving_needs_whole_chunks_and_micro_batches():
    with pytest.raises(CcsimError, match="8 layers do not split into 4 pipeline stages of 4"):
        megatron(SMALL, tp=1, pp=4, virtual_stages=4, global_batch=8)
    with pytest.raises(CcsimError, match=r"micro-batches per replica \(6\) a multiple"):
        megatron(SMALL, tp=1, pp=4, virtual_stages=2, global_batch=6)


def test_interleaving_keeps_more_activations_on_the_first_stage():
    """Korthikanti et al. (section 5): the first stage of interleaved 1F1B holds
    1 + (p - 1)/(p v) times the activations of the plain schedule (full recompute: 2sbh
    per layer), the embedding dropout's mask aside."""
    p, v = 4, 2
    plain = megatron(SMALL, tp=1, pp=p, global_batch=8)
    chunked = megatron(SMALL, tp=1, pp=p, global_batch=8, virtual_stages=v)
    sbh = SMALL.seq * SMALL.hidden
    layers = plain.memory.activations - p * sbh  # p micro-batches' masks, sbh each
    assert layers == pytest.approx(SMALL.layers * 2 * sbh)
    assert chunked.memory.activations - p * sbh == pytest.approx(layers * (1 + (p - 1) / (p * v)))


def test_the_last_stage_computes_the_logits():
    """Megatron's output layer sits on the last pipeline stage (its last virtual stage
    when interleaved): 2 s h V / t FLOPs per sequence forward, twice that backward, on
    top of its layers; the first stage has only its layers."""
    tp, pp = 2, 2
    logits = 2 * SMALL.seq * SMALL.hidden * SMALL.vocab / tp
    layers = SMALL.layers / pp * SMALL.layer_forward_flops(SMALL.seq) / tp
    for v in (1, 2):
        workload = megatron(SMALL, tp=tp, pp=pp, global_batch=4, virtual_stages=v)

        def fwd(rank, workload=workload):
            return sum(
                op.total_flops for op in workload.ops if op.rank == rank and op.label[:3] == "fwd"
            )

        last = pp * tp - 1  # a rank of the last stage
        assert fwd(0) == pytest.approx(4 * layers)
        assert fwd(last) == pytest.approx(4 * (layers + logits))


def test_ddp_layers_run_their_gemms_then_flash_attention_kernels():
    """Free communication: a DDP step is every layer's forward and backward, then the
    optimizer's 16 bytes per parameter. A forward is its linear GEMMs, causal flash
    attention (half of the 4 s h FLOPs per token: the masked blocks are skipped; at the
    device's fused-attention rate for the sequence, no scores in HBM) and its
    memory-bound kernels (22h + 4f bytes per token); a backward is the linear GEMMs'
    gradients, flash attention's backward (2.5 times its forward's FLOPs: it recomputes
    the scores, at the backward rate) and twice the kernels' bytes."""
    workload = ddp(SMALL, ranks=2, micro_batch=1)
    _, result = run_workload(workload, fast_ring(2), algorithm="ring")
    h, f, s, tokens = SMALL.hidden, 4 * SMALL.hidden, SMALL.seq, SMALL.seq
    linear = SMALL.linear_gemms(1)
    a100 = DEVICES["A100"]
    attention = tokens * 4 * s * h / 2
    kernels = tokens * (22 * h + 4 * f) / A100_HBM
    forward = gemm_s(linear) + attention / a100.attention_rate(s) + kernels
    backward = gemm_s([grad for g in linear for grad in g.backward()])
    backward += 2.5 * attention / a100.attention_rate(s, backward=True)
    backward += 2 * kernels
    expected = SMALL.layers * (forward + backward) + 16 * SMALL.params / A100_HBM
    assert result.step_s == pytest.approx(expected, rel=1e-6)
    # Without flash attention the scores' 9as bytes per token come back (Megatron's
    # SC'21 kernels).
    a, s = SMALL.attention_heads, SMALL.seq
    assert SMALL.layer_elementwise_bytes(tokens) - SMALL.layer_elementwise_bytes(
        tokens, flash_attention=True
    ) == pytest.approx(tokens * 9 * a * s)


def _priced_ring(p, bandwidth):
    """A ring of p A100s with links of ``bandwidth`` bytes/s and no latency."""
    graph = ring_graph(p, bandwidth, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    return graph


def test_overlap_grad_reduce_hides_all_but_the_last_bucket():
    """DP 2 on a 2-GPU ring at 1 TB/s (a ring all-reduce of X bytes takes X / 1 TB/s).
    SMALL's layers hold 12.6M parameters, so Megatron's 40M-parameter buckets are 4
    layers: the last backward runs as two buckets of 4 layers (the first with the
    logits' backward). Megatron fills buckets from the last parameter back
    (param_and_grad_buffer.py lines 628-650 at core_v0.14.0), so the untied output layer
    goes with the first bucket, whose all-reduce (4 layers and the output layer x 4 bytes
    of fp32 gradients, 0.33 ms) hides behind the second bucket's backward (0.8 ms); only
    the last bucket (4 layers and the embedding) is left after the backward. So the step
    shrinks by exactly the first bucket's all-reduce, and the same bytes are reduced."""
    plain = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4)
    overlap = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4, overlap_grad_reduce=True)

    def reduced(workload):
        return [op.nbytes for op in _collectives(workload, 0) if op.label.startswith("DP")]

    first = (4 * SMALL.layer_params + SMALL.vocab * SMALL.hidden) * 4
    last = (4 * SMALL.layer_params + SMALL.vocab * SMALL.hidden) * 4
    assert first / 1e12 < 0.8e-3  # hidden behind the second bucket's backward
    assert reduced(overlap) == [first, last]
    assert sum(reduced(plain)) == first + last
    graph = _priced_ring(2, 1e12)
    _, slow = run_workload(plain, graph, algorithm="ring", comm_slowdown=0.0)
    _, fast = run_workload(overlap, graph, algorithm="ring", comm_slowdown=0.0)
    assert slow.step_s - fast.step_s == pytest.approx(first / 1e12, rel=1e-6)


def test_tp_comm_overlap_runs_tp_collectives_beside_the_gemms():
    """TP 2 on a 2-GPU ring at 20 TB/s: each pass's TP all-reduce (2 or 4 activations per
    layer, b s h x 2 bytes each; a 2-rank ring all-reduce of X bytes takes X / 20 TB/s)
    follows its kernels without overlap, and runs beside them with it, where it is the
    shorter: the step loses exactly the TP time."""
    m = 2
    plain = megatron(SMALL, tp=2, pp=1, dp=1, global_batch=m)
    overlap = megatron(SMALL, tp=2, pp=1, dp=1, global_batch=m, tp_comm_overlap=True)
    graph = _priced_ring(2, 20e12)
    _, slow = run_workload(plain, graph, algorithm="ring", comm_slowdown=0.0)
    _, fast = run_workload(overlap, graph, algorithm="ring", comm_slowdown=0.0)
    activation = SMALL.seq * SMALL.hidden * 2
    tp_time = m * SMALL.layers * (2 + 4) * activation / 20e12
    assert slow.step_s - fast.step_s == pytest.approx(tp_time, rel=1e-6)
    assert {op.stream for op in _collectives(overlap, 0)} == {"tp"}


@pytest.mark.parametrize(
    ("grad_reduce", "grad", "state"), [("fp32", 4, 18), ("bf16", 2, 16), ("fp16", 2, 20)]
)
def test_gradients_are_reduced_in_their_dtype(grad_reduce, grad, state):
    """DP 4, no TP or PP: the DP all-reduce moves 4 bytes a parameter by default (fp32
    gradients: Megatron-LM's arguments.py turns accumulate_allreduce_grads_in_fp32 on for
    bf16), 2 with --grad-reduce-in-bf16 or in an fp16 run. Model state per parameter as
    Megatron-LM's README table ("Distributed Optimizer") counts it: 18 bytes for bf16
    parameters with fp32 gradients, 20 for fp16 ones (fp32 master weights and gradients
    in the optimizer), 16 with bf16 gradients; with the distributed optimizer over d = 4
    ranks, 6 + 12/d and 4 + 16/d (4 + 12/d)."""
    # The layers, the input embedding and the untied output layer: one stage holds all.
    params = SMALL.layers * SMALL.layer_params + 2 * SMALL.vocab * SMALL.hidden
    step = megatron(SMALL, tp=1, pp=1, dp=4, global_batch=4, grad_reduce=grad_reduce)
    (reduce,) = [op for op in _collectives(step, 0) if op.label.startswith("DP")]
    assert (reduce.op, reduce.nbytes) == ("all_reduce", grad * params)
    memory = step.memory
    held = params
    assert memory.weights + memory.gradients + memory.optimizer == pytest.approx(state * held)
    sharded = megatron(
        SMALL, tp=1, pp=1, dp=4, global_batch=4, grad_reduce=grad_reduce, distributed_optimizer=True
    ).memory
    kept = 2 + grad  # bf16 weights and the gradients stay whole
    total = sharded.weights + sharded.gradients + sharded.optimizer
    assert total == pytest.approx((kept + (state - kept) / 4) * held)


def test_an_unknown_gradient_dtype_is_refused():
    with pytest.raises(CcsimError, match="grad_reduce must be fp32, bf16, fp16"):
        megatron(SMALL, tp=1, pp=1, dp=2, global_batch=2, grad_reduce="fp8")


def test_tied_embeddings_are_all_reduced_between_the_first_and_last_stage():
    """A GPT with tied embeddings on 2 pipeline stages: after its DP reduction each
    pipeline's first and last stage all-reduce the shared V x h embedding's gradients
    (4 bytes each, fp32), as Megatron-LM's finalize_model_grads does; untied models and
    single stages do not. On a 2-GPU ring at 1 TB/s that all-reduce (a 2-rank ring of X
    bytes takes X / 1 TB/s) is the whole difference in the step."""
    tied = dataclasses.replace(SMALL, tied_embeddings=True)
    step = megatron(tied, tp=1, pp=2, dp=1, global_batch=2)
    calls = [op for op in step.ops if op.label == "embedding gradients"]
    assert sorted(op.rank for op in calls) == [0, 1]
    assert {(op.op, op.nbytes) for op in calls} == {("all_reduce", SMALL.vocab * SMALL.hidden * 4)}
    assert step.groups[calls[0].group].ranks == [0, 1]
    untied = megatron(SMALL, tp=1, pp=2, dp=1, global_batch=2)
    assert not [op for op in untied.ops if op.label == "embedding gradients"]
    single = megatron(tied, tp=1, pp=1, dp=2, global_batch=2)
    assert not [op for op in single.ops if op.label == "embedding gradients"]
    graph = _priced_ring(2, 1e12)
    _, with_it = run_workload(step, graph, algorithm="ring", comm_slowdown=0.0)
    _, without = run_workload(untied, graph, algorithm="ring", comm_slowdown=0.0)
    x = SMALL.vocab * SMALL.hidden * 4
    assert with_it.step_s - without.step_s == pytest.approx(x / 1e12, rel=1e-6)


@pytest.mark.parametrize(
    ("model", "tp", "message"),
    [
        ("gpt3-175b", 7, "tp 7 does not split gpt3-175b's 96 attention heads evenly"),
        ("llama3-70b", 16, "tp 16 does not split llama3-70b's 8 key/value heads evenly"),
    ],
)
def test_a_tp_that_does_not_split_the_heads_is_refused(model, tp, message, tmp_path, capsys):
    """Issue 33: Megatron-LM asserts that TP divides the attention heads and the query
    groups; --tp 7 on GPT-3's 96 heads generated a trace of 7-way heads."""
    from simulator.cli import main
    from simulator.workload.generators import megatron

    with pytest.raises(CcsimError, match=message):
        megatron(model, tp=tp, pp=1, dp=1, global_batch=1)
    out = tmp_path / "step.json"
    argv = ["generate", "megatron", "--model", model, "--tp", str(tp), "--out", str(out)]
    assert main(argv) == 2 and not out.exists()
    assert message in capsys.readouterr().err


def test_flash_attention_2_costs_its_kernels_time_at_the_fa3_papers_h100_rates():
    """One H100 running Llama 3 8B's step (8,192 tokens, 32 heads of 128, 32 layers):
    with FlashAttention-2's kernels instead of cuDNN's the step grows by exactly the
    attention FLOPs at the two libraries' rates, read off Shah et al. 2024 (figures 5 and
    6, head size 128, causal forward at 8k: FA2 333 and cuDNN 529 TFLOP/s; backward, the
    non-causal 318 and 518 scaled by causal / non-causal forward, 333/370 and 529/600)."""
    steps = {
        backend: run_workload(
            megatron_core("llama3-8b", tp=1, pp=1, dp=1, global_batch=1, attention_backend=backend),
            "dgx-h100",
            nodes=1,
        )[1].step_s
        for backend in ("cudnn", "flash2")
    }
    s, heads, d, layers = 8192, 32, 128, 32
    forward = 2 * s * s * d * heads  # half of 4 s^2 d: the causal mask's skipped blocks
    fa2 = forward / 333e12 + 2.5 * forward / (318e12 * 333 / 370)
    cudnn = forward / 529e12 + 2.5 * forward / (518e12 * 529 / 600)
    assert steps["flash2"] - steps["cudnn"] == pytest.approx(layers * (fa2 - cudnn), rel=1e-9)
    with pytest.raises(CcsimError, match="unknown attention_backend 'fa3'; valid choices: cudnn"):
        megatron_core("llama3-8b", tp=1, pp=1, dp=1, global_batch=1, attention_backend="fa3")


def test_generate_names_the_attention_backend_in_the_trace(tmp_path, capsys):
    """``ccsim generate megatron --attention-backend flash2`` marks every attention kernel
    of the trace FlashAttention-2's (a 7th entry, 1); cuDNN's, the default, adds none."""
    from simulator.cli import main

    for backend, tail in (("flash2", [1]), ("cudnn", [])):
        out = tmp_path / f"{backend}.json"
        argv = ["generate", "megatron", "--model", "llama3-8b", "--tp", "1", "--pp", "1"]
        argv += ["--dp", "1", "--global-batch", "1", "--attention-backend", backend]
        assert main([*argv, "--out", str(out)]) == 0
        kernels = [k for op in load_workload(out).ops for k in op.attention]
        assert len(kernels) == 2 and all(k.as_list()[6:] == tail for k in kernels)
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "megatron", "--attention-backend", "fa3"])
    assert exit_.value.code == 2 and "invalid choice: 'fa3'" in capsys.readouterr().err
