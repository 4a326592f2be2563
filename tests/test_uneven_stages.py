"""Uneven pipeline stages (Megatron-LM's --decoder-first-pipeline-num-layers and
--decoder-last-pipeline-num-layers): each stage's compute, TP collectives, gradient
reductions and memory carry its own layers, against counts worked out by hand."""

import functools
import json

import pytest

from simulator.cli import main
from simulator.errors import CcsimError
from simulator.workload.generators import megatron as megatron_core
from simulator.workload.memory import (
    chunk_layer_range,
    megatron_memory,
    pipeline_chunks,
    pipeline_layers,
)
from simulator.workload.model import MODELS, Transformer
from simulator.workload.pipeline import peak_held, pipeline_order

# The hand-worked steps here are for the options SC'21 ran (full recomputation, unfused
# attention, nothing overlapped) unless a test gives its own; Megatron-Core's defaults
# are tested in tests/test_megatron_defaults.py.
megatron = functools.partial(megatron_core, defaults="sc21")

# GPT-shaped: 12 h^2 per layer (4 h^2 attention, 8 h^2 MLP), 4 heads of 64.
H, S, V = 256, 128, 1000
TEN = Transformer(layers=10, hidden=H, seq=S, vocab=V, heads=4)
LAYER_PARAMS = 12 * H * H
SPLIT = (2, 3, 3, 2)  # 10 layers, first 2 and last 2: the middle 6 over 2 stages


def ops_by_id(workload):
    return {op.id: op for op in workload.ops}


def rank(stage, d=0, t=0, *, tp, dp):
    """Megatron's order: TP fastest, then DP, then PP."""
    return (stage * dp + d) * tp + t


def test_each_stage_computes_and_all_reduces_its_own_layers():
    """Forward of one micro-batch on one TP rank (tp 2, b 1): per layer the linear
    layers' 2 x 12 h^2 / t FLOPs per token and the attention scores' 4 s h / t, over
    b s tokens; the last stage adds the logits, 2 h V / t per token. TP collectives of a
    pass go out as one all-reduce of the summed size: 2 per layer forward (attention
    and MLP outputs, b s h bf16 each), 4 backward with full recomputation."""
    tp = 2
    w = megatron(TEN, tp=tp, pp=4, dp=1, global_batch=4, first_stage_layers=2, last_stage_layers=2)
    ops = ops_by_id(w)
    per_layer = S * (24 * H * H + 4 * S * H) / tp
    logits = 2 * S * H * V / tp
    activation = S * H * 2  # bytes of b s h bf16
    forwards = []
    for stage, layers in enumerate(SPLIT):
        r = rank(stage, tp=tp, dp=1)
        for i in range(4):
            forward = ops[f"r{r}.f{i}"]
            expected = layers * per_layer + (logits if stage == 3 else 0.0)
            assert forward.total_flops == pytest.approx(expected, rel=1e-12)
            assert ops[f"r{r}.tp.f{i}"].op == "all_reduce"
            assert ops[f"r{r}.tp.f{i}"].nbytes == 2 * layers * activation
            assert ops[f"r{r}.tp.b{i}"].nbytes == 4 * layers * activation
        forwards.append(ops[f"r{r}.f0"].total_flops)
    # The middle stages do 3/2 of the first stage's work.
    assert forwards[1] / forwards[0] == pytest.approx(3 / 2, rel=1e-12)
    assert forwards[2] == forwards[1]
    assert "stages of 2/3/3/2 layers" in w.description


@pytest.mark.parametrize("overlap", [False, True])
def test_each_stage_reduces_the_gradients_of_its_own_layers(overlap):
    """DP 2: each stage all-reduces its layers' parameters (12 h^2 each, over t = 2) and,
    on the first and last stage, the V x h embedding, 4 bytes each (fp32 gradients). With
    overlap_grad_reduce the buckets (max(40M, 1M x dp) parameters, whole layers) hold 1
    layer each at h 2048 and t 1 (12 h^2 = 50.3M), so a stage has one per layer."""
    if overlap:
        h, tp = 2048, 1
        model = Transformer(layers=10, hidden=h, seq=S, vocab=V, heads=16)
    else:
        h, tp, model = H, 2, TEN
    w = megatron(
        model,
        tp=tp,
        pp=4,
        dp=2,
        global_batch=8,
        first_stage_layers=2,
        last_stage_layers=2,
        overlap_grad_reduce=overlap,
    )
    for stage, layers in enumerate(SPLIT):
        embedding = V * h if stage in (0, 3) else 0
        expected = (layers * 12 * h * h + embedding) / tp * 4
        for d in range(2):
            r = rank(stage, d, tp=tp, dp=2)
            reduces = [
                op for op in w.ops if op.rank == r and op.kind == "collective" and op.stream == "dp"
            ]
            assert {op.op for op in reduces} == {"all_reduce"}
            assert len(reduces) == (layers if overlap else 1)
            assert sum(op.nbytes for op in reduces) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("layers", "tp", "dp", "v", "ratio"),
    [(12, 1, 1, 1, 4 / 3), (12, 2, 2, 1, 4 / 3), (16, 1, 1, 2, 6 / 4)],
)
def test_an_uneven_split_does_the_same_total_work(layers, tp, dp, v, ratio):
    """12 layers over 4 stages, 3/3/3/3 or 2/4/4/2 (16 interleaved over 2 chunks a
    stage: 4/4/4/4 or 2/6/6/2), run the same layers, so every rank's FLOPs add up to
    the same step; stage 1 does 4/3 (6/4) of its even share."""
    model = Transformer(layers=layers, hidden=H, seq=S, vocab=V, heads=4)
    options = dict(tp=tp, pp=4, dp=dp, global_batch=4 * dp, virtual_stages=v)
    even = megatron(model, **options)
    uneven = megatron(model, **options, first_stage_layers=2, last_stage_layers=2)

    def total(w):
        return sum(op.total_flops for op in w.ops if op.kind == "compute")

    def stage_flops(w, stage):
        return sum(
            op.total_flops
            for op in w.ops
            if op.kind == "compute" and op.rank == rank(stage, tp=tp, dp=dp)
        )

    assert total(uneven) == pytest.approx(total(even), rel=1e-12)
    assert stage_flops(uneven, 1) == pytest.approx(ratio * stage_flops(even, 1), rel=1e-12)


def test_interleaved_chunks_hold_a_share_of_their_stage_and_its_moe_layers():
    """12 layers, pp 3, v 2, first 2 and last 2: stages of 2/8/2, chunks of 1/4/1
    layers; chunk c of stage s holds layers c x 6 + (those before it) / 2 on
    (Megatron-LM's get_transformer_layer_offset): stage 0 [0] [6], stage 1 [1-4]
    [7-10], stage 2 [5] [11]. Every second layer (0, 2, ...) is MoE: their token
    dispatch (b s top_k h bf16 per MoE layer) shows which."""
    moe = Transformer(
        layers=12, hidden=H, seq=S, vocab=V, heads=4, experts=2, top_k=1, moe_frequency=2
    )
    # (The host's launches off: the forward's host/GPU flow shop splits a pass's ops,
    # and what this test reads is which layers each chunk holds.)
    w = megatron(
        moe, tp=1, pp=3, dp=2, ep=2, global_batch=6, virtual_stages=2,
        first_stage_layers=2, last_stage_layers=2, host_op_s=0.0,
    )  # fmt: skip
    ops = ops_by_id(w)
    token_bytes = S * 1 * H * 2
    expected_moe = {(0, 0): 1, (0, 1): 1, (1, 0): 2, (1, 1): 2, (2, 0): 0, (2, 1): 0}
    chunk_layers = {0: 1, 1: 4, 2: 1}
    per_layer = S * (24 * H * H + 4 * S * H)
    # Outside its experts an MoE layer runs its attention (8 h^2 + 4 s h per token)
    # and its router (2 h x experts).
    moe_layer = S * (8 * H * H + 4 * S * H + 2 * H * 2)
    for (stage, chunk), count in expected_moe.items():
        r = rank(stage, tp=1, dp=2)
        dispatch = ops.get(f"r{r}.ep.f{chunk}.0.dispatch0")
        if count:
            assert dispatch.nbytes == count * token_bytes
        else:
            assert dispatch is None
        logits = 2 * S * H * V if (stage, chunk) == (2, 1) else 0
        dense = chunk_layers[stage] - count
        expected = dense * per_layer + count * moe_layer + logits
        assert ops[f"r{r}.f{chunk}.0"].total_flops == pytest.approx(expected, rel=1e-12)


def test_memory_follows_the_most_loaded_stage():
    """10 layers, 2/3/3/2, tp 2, no recomputation: a middle stage holds 3 layers (3 x 12
    h^2 / 2 parameters, 2 bytes each) against the first stage's 2 and the 1000 x 256
    embedding, and keeps 3 micro-batches of 3 layers in flight (27 sbh each: 10 + 24/2
    + 5 a s / (h t) = 10 + 12 + 5) against the first's 4 of 2 (and the embedding
    dropout's sbh): 243 sbh against 220. The middle stage is the most loaded."""
    got = megatron_memory(
        TEN, tp=2, pp=4, dp=1, micro_batch=1, micro_batches=8, recompute="none",
        first_stage_layers=2, last_stage_layers=2,
    )  # fmt: skip
    sbh = S * H
    params = 3 * LAYER_PARAMS / 2
    assert (got.weights, got.gradients, got.optimizer) == pytest.approx(
        (2 * params, 4 * params, 12 * params), rel=1e-12
    )
    assert got.activations == pytest.approx(3 * 3 * 27 * sbh, rel=1e-12)
    # The generator records the same estimate.
    w = megatron(
        TEN, tp=2, pp=4, dp=1, global_batch=8, recompute="none",
        first_stage_layers=2, last_stage_layers=2,
    )  # fmt: skip
    assert w.memory == got


def test_llama3_405b_memory_by_hand():
    """Llama 3 405B, 15/16 x 6/15 on 8 stages, TP 8, full recomputation, 18 bytes per
    parameter (no distributed optimizer). The first stage: 15 layers and the 128256 x
    16384 embedding, 8 micro-batches in flight of 15 layer inputs, 2 sbh each (Llama
    trains without dropout: no embedding mask). A middle one: 16 layers, 7 in flight.
    A layer: Q and output 2 h^2, K and V 2 h (8 x 128), the SwiGLU MLP 3 h f. By hand the
    middle stage holds 0.2 GB more (its extra layer's states outweigh the first's extra
    micro-batch), so it is the estimate."""
    h, f, s = 16384, 53248, 8192
    layer = 2 * h * h + 2 * h * 8 * 128 + 3 * h * f
    got = megatron_memory(
        MODELS["llama3-405b"], tp=8, pp=8, dp=256, micro_batch=1, micro_batches=16,
        first_stage_layers=15, last_stage_layers=15,
    )  # fmt: skip
    first = (15 * layer + 128256 * h) / 8 * 18 + 8 * 15 * 2 * s * h
    middle = 16 * layer / 8 * 18 + 7 * 16 * 2 * s * h
    assert middle > first
    assert got.weights == pytest.approx(2 * 16 * layer / 8, rel=1e-12)
    assert got.activations == pytest.approx(7 * 16 * 2 * s * h, rel=1e-12)
    assert got.total == pytest.approx(middle, rel=1e-12)


def test_the_splits_megatron_allows():
    assert pipeline_layers(126, 8, first_stage_layers=15, last_stage_layers=15) == (
        (15,) + (16,) * 6 + (15,)
    )
    # Either end alone: the other stages share the rest.
    assert pipeline_layers(10, 3, first_stage_layers=2) == (2, 4, 4)
    assert pipeline_layers(10, 2, last_stage_layers=3) == (7, 3)
    # Two stages, both given: nothing is left for middle stages, and none are.
    assert pipeline_layers(10, 2, first_stage_layers=4, last_stage_layers=6) == (4, 6)
    # Interleaved: every stage's count a multiple of v.
    assert pipeline_layers(12, 3, virtual_stages=2, first_stage_layers=2, last_stage_layers=2) == (
        2,
        8,
        2,
    )


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (dict(pp=4, first_stage_layers=6, last_stage_layers=6), "leave -2 of the 10 layers"),
        (dict(pp=4, first_stage_layers=1, last_stage_layers=2), "do not split evenly over the 2"),
        (dict(pp=4, first_stage_layers=0), "first_stage_layers must be a positive"),
        (dict(pp=4, last_stage_layers=True), "last_stage_layers must be a positive"),
        (dict(pp=1, first_stage_layers=10), "with pp 1 drop it"),
        (dict(pp=2, first_stage_layers=4, last_stage_layers=4), "leave 2 of the 10 layers for 0"),
        (dict(pp=3, first_stage_layers=2, last_stage_layers=8), "leave 0 of the 10 layers for 1"),
        (
            dict(pp=4, virtual_stages=2, first_stage_layers=3, last_stage_layers=3),
            "first_stage_layers 3 does not split into 2 virtual stages",
        ),
        (
            dict(pp=4, virtual_stages=2, first_stage_layers=2, last_stage_layers=2),
            "middle pipeline stages of 2 virtual stages",
        ),
        (dict(pp=4), "10 layers do not split into 4 pipeline stages; pick a pp"),
    ],
)
def test_bad_splits_name_the_parameter_and_the_fix(options, needle):
    with pytest.raises(CcsimError) as caught:
        megatron(TEN, tp=1, dp=1, global_batch=12, **options)
    message = str(caught.value)
    assert needle in message and "\n" not in message
    assert "first_stage_layers" in message or "last_stage_layers" in message
    with pytest.raises(CcsimError):
        megatron_memory(
            TEN, tp=1, dp=1, micro_batch=1, micro_batches=12, **options
        )  # fmt: skip


def test_llama3_405b_builds_on_eight_stages():
    """The Llama 3 paper's split (Dubey et al. 2024, section 3.3.2: one layer fewer on
    the first and last stages), small DP and batch: the middle stages run 16/15 of the
    first stage's forward GEMMs (no logits on either); the replica build holds exactly
    the first replica's ops of the full build."""
    options = dict(tp=8, pp=8, dp=2, micro_batch=1, global_batch=16)
    with pytest.raises(CcsimError, match="first_stage_layers"):
        megatron("llama3-405b", **options)
    full = megatron("llama3-405b", **options, first_stage_layers=15, last_stage_layers=15)
    ops = ops_by_id(full)
    first, middle = ops["r0.f0"].total_flops, ops[f"r{rank(1, tp=8, dp=2)}.f0"].total_flops
    assert middle / first == pytest.approx(16 / 15, rel=1e-12)
    one = megatron(
        "llama3-405b", **options, first_stage_layers=15, last_stage_layers=15, replicas=True
    )
    assert one.replicas is not None and one.replicas.count == 2
    first_replica = {
        r for s in range(8) for r in range(rank(s, tp=8, dp=2), rank(s, tp=8, dp=2) + 8)
    }
    assert [op.id for op in one.ops] == [op.id for op in full.ops if op.rank in first_replica]
    assert one.memory == full.memory


def test_cli_takes_first_and_last_stage_layers(tmp_path):
    out = tmp_path / "w.json"
    argv = ["generate", "megatron", "--tp", "1", "--pp", "4", "--dp", "1"]
    argv += ["--global-batch", "4", "--out", str(out)]
    argv += ["--model", "gpt-1.5b", "--first-stage-layers", "11", "--last-stage-layers", "11"]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert "stages of 11/13/13/11 layers" in data["description"]


def test_cli_counts_the_embedding_and_loss_as_layers(tmp_path, capsys):
    """GPT-2 1.5B's 48 layers with both counted make 50: 5 stages of 2 chunks of 5, the
    end chunks 4: stages of 9/10/10/10/9. Counting only the embedding (49) on 4 stages
    splits nothing: one line, exit 2."""
    out = tmp_path / "w.json"
    argv = ["generate", "megatron", "--model", "gpt-1.5b", "--tp", "1", "--dp", "1"]
    argv += ["--global-batch", "5", "--out", str(out), "--virtual-stages", "2"]
    argv += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    assert main([*argv, "--pp", "5"]) == 0
    assert "stages of 9/10/10/10/9 layers" in json.loads(out.read_text())["description"]
    capsys.readouterr()
    bad = ["generate", "megatron", "--model", "gpt-1.5b", "--tp", "1", "--pp", "4"]
    bad += ["--account-for-embedding-in-pipeline-split", "--out", str(out)]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "49, which do not split into 4 pipeline stages" in err and "Traceback" not in err


# --- The embedding and the loss counted as layers (Megatron-Core's
# account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split), with
# virtual stages, and the interleaved schedule's warm-up.


def test_embedding_and_loss_counted_as_layers_take_a_layer_from_the_end_chunks():
    """Llama 3.1 405B on Megatron-Bridge: 126 layers, PP 8, VP 8, both flags. Megatron-
    Core's get_num_layers_to_build: (126 + 2) / 8 = 16 a stage, 16 / 8 = 2 a chunk, the
    first chunk of stage 0 and the last of stage 7 one fewer. get_transformer_layer_offset:
    chunk c of stage s starts at c x 128/8 + s x 2, less 1 but for chunk 0 of stage 0:
    stage 3 chunk 2 at 2 x 16 + 3 x 2 - 1 = 37; stage 7 chunk 7 at 7 x 16 + 14 - 1 = 125."""
    chunks = pipeline_chunks(
        126, 8, virtual_stages=8, account_for_embedding=True, account_for_loss=True
    )
    assert chunks[0] == (1,) + (2,) * 7 and chunks[7] == (2,) * 7 + (1,)
    assert all(stage == (2,) * 8 for stage in chunks[1:7])
    assert pipeline_layers(
        126, 8, virtual_stages=8, account_for_embedding=True, account_for_loss=True
    ) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert chunk_layer_range(chunks, 0, 0) == range(0, 1)
    assert chunk_layer_range(chunks, 1, 0) == range(1, 3)
    assert chunk_layer_range(chunks, 3, 2) == range(37, 39)
    assert chunk_layer_range(chunks, 7, 7) == range(125, 126)
    # Every layer once, in virtual-stage order.
    order = [k for c in range(8) for s in range(8) for k in chunk_layer_range(chunks, s, c)]
    assert order == list(range(126))
    # Without interleaving: the first and last stages one layer fewer, as
    # --decoder-first/last-pipeline-num-layers 15 would give.
    assert pipeline_layers(126, 8, account_for_embedding=True, account_for_loss=True) == (
        pipeline_layers(126, 8, first_stage_layers=15, last_stage_layers=15)
    )


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (dict(virtual_stages=3, account_for_embedding=True), "make 13, which do not split"),
        (
            dict(first_stage_layers=2, account_for_loss=True),
            "do not go with first_stage_layers",
        ),
    ],
)
def test_embedding_in_the_split_is_refused_where_megatron_refuses_it(options, needle):
    """Megatron-Core asserts that the layers with the embedding and loss divide into the
    stages' chunks, and refuses them with uneven first or last stages."""
    with pytest.raises(CcsimError, match=needle):
        pipeline_chunks(12, 2, **options)


def test_interleaved_warm_up_counts_are_megatrons():
    """get_pp_rank_microbatches: stage s of p runs 2 (p - s - 1) + (v - 1) p warm-up
    forwards before its first backward (capped at the step's m v): p 4, v 3, m 8 gives
    14, 12, 10, 8; with m 2, stage 0's 14 exceed the step's 6 chunk-passes: all
    forwards first."""
    for stage, warmup in enumerate((14, 12, 10, 8)):
        order = pipeline_order(stage, 4, 8, 3)
        first_backward = next(n for n, (kind, _, _) in enumerate(order) if kind == "b")
        # The warm-up and the first forward of the steady state.
        assert first_backward == warmup + 1
        assert len(order) == 2 * 8 * 3
    assert [kind for kind, _, _ in pipeline_order(0, 4, 2, 3)] == ["f"] * 6 + ["b"] * 6


def test_interleaved_order_follows_megatrons_schedule_table():
    """p 2, v 2, m 4, stage 0, by hand from get_schedule_table (groups of p micro-
    batches, every chunk of a group in turn): forwards (micro-batch, chunk) (0,0) (1,0)
    (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backwards the same with the chunks reversed;
    warm-up 2 x 1 + 1 x 2 = 4."""
    got = [f"{kind}{c}.{i}" for kind, c, i in pipeline_order(0, 2, 4, 2)]
    assert got == [
        *("f0.0", "f0.1", "f1.0", "f1.1"),
        *("f0.2", "b1.0", "f0.3", "b1.1", "f1.2", "b0.0", "f1.3", "b0.1"),
        *("b1.2", "b1.3", "b0.2", "b0.3"),
    ]


def test_uneven_chunks_hold_what_the_schedule_holds():
    """6 layers, p 2, v 2, both flags: 8 counted, 2 a chunk; stage 0 chunks (1, 2), stage
    1 (2, 1). Stage 0's order (above) holds 1, 2, 4, 6, 7 layers after its five
    forwards, then frees 2: peak 7. Stage 1 (warm-up 2: f0.0 f0.1, then f1.0 b1.0 f1.1
    b1.1 f0.2 b0.0 ...) holds 2, 4, 5, 4, 5, 4, 6: peak 6. With even chunks of 1.5
    layers the first stage's count would be Korthikanti's (warm-up + 1) x L/(p v)."""
    chunks = pipeline_chunks(6, 2, virtual_stages=2, account_for_embedding=True,
                             account_for_loss=True)  # fmt: skip
    assert chunks == ((1, 2), (2, 1))
    assert peak_held(0, 2, 4, chunks[0]) == 7
    assert peak_held(1, 2, 4, chunks[1]) == 6
    assert peak_held(0, 2, 4, (3, 3)) == (4 + 1) * 3
    model = Transformer(layers=6, hidden=H, seq=S, vocab=V, heads=4)
    options = dict(tp=1, pp=2, dp=1, micro_batch=1, micro_batches=4, virtual_stages=2,
                   recompute="full")  # fmt: skip
    m = megatron_memory(model, **options, account_for_embedding=True, account_for_loss=True)
    # Full recomputation keeps each layer's 2 s b h input; stage 0 also the embedding's
    # dropout mask (s b h) for its 2 micro-batches in flight; stage 0 holds the most.
    assert m.activations == pytest.approx(7 * 2 * S * H + 2 * S * H, rel=1e-12)


def test_the_generator_builds_the_end_chunks_one_layer_short():
    """6 layers, p 2, v 2, both flags: forward passes of stage 0 run 1 layer (chunk 0)
    and 2 (chunk 1); stage 1 runs 2 (chunk 0) and 1 plus the logits (chunk 1), at 24 h^2
    + 4 s h FLOPs per token a layer and 2 h V for the logits (tp 1, b 1)."""
    model = Transformer(layers=6, hidden=H, seq=S, vocab=V, heads=4)
    w = megatron(model, tp=1, pp=2, dp=1, global_batch=4, virtual_stages=2,
                 account_for_embedding_in_pipeline_split=True,
                 account_for_loss_in_pipeline_split=True)  # fmt: skip
    ops = ops_by_id(w)
    per_layer = S * (24 * H * H + 4 * S * H)
    logits = 2 * S * H * V
    for r, chunk, layers, extra in ((0, 0, 1, 0), (0, 1, 2, 0), (1, 0, 2, 0), (1, 1, 1, logits)):
        for i in range(4):
            got = ops[f"r{r}.f{chunk}.{i}"].total_flops
            assert got == pytest.approx(layers * per_layer + extra, rel=1e-12)


def test_a_chunk_of_no_layers_runs_only_its_embedding_or_loss():
    """6 layers, p 4, v 2, both flags: 8 counted, 1 a chunk, so the first chunk of stage
    0 holds only the embedding (no FLOPs counted) and the last of stage 3 only the loss
    (the logits, 2 h V per token); Megatron-Core allows such chunks (it asserts >= 0
    layers). The step builds and replays."""
    from simulator.topology import ring_graph
    from simulator.workload import run_workload

    model = Transformer(layers=6, hidden=H, seq=S, vocab=V, heads=4)
    w = megatron(model, tp=1, pp=4, dp=1, global_batch=4, virtual_stages=2,
                 account_for_embedding_in_pipeline_split=True,
                 account_for_loss_in_pipeline_split=True)  # fmt: skip
    ops = ops_by_id(w)
    per_layer = S * (24 * H * H + 4 * S * H)
    assert ops["r0.f0.0"].total_flops == 0.0
    assert ops["r0.f1.0"].total_flops == pytest.approx(per_layer, rel=1e-12)
    assert ops["r3.f1.0"].total_flops == pytest.approx(2 * S * H * V, rel=1e-12)
    graph = ring_graph(4, 1e11)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    _, result = run_workload(w, graph, algorithm="ring")
    assert result.step_s > 0
