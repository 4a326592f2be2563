"""Megatron-Core's ``--cp-comm-type`` in the megatron generator: the bytes each type moves
per layer (Transformer Engine v2.18's context_parallel.py worked by hand), a small step's
exposed CP time against a hand-worked timeline, the all-gather's K/V buffers in the memory
estimate, a2a+p2p's hierarchical groups, the one-CP-rank shortcut's exactness and the
values refused."""

import functools
import json

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron as megatron_core
from simulator.workload.generators import megatron_step_memory
from simulator.workload.guards import generator_estimate
from simulator.workload.kernels import gemm_time
from simulator.workload.memory import cp_gather_buffer_bytes
from simulator.workload.model import Transformer

# SC'21's options (full recomputation, nothing overlapped), as tests/test_context_parallel.py.
megatron = functools.partial(megatron_core, defaults="sc21")

# 4 layers, h 1024, 8 heads of 128 with 2 key/value heads (GQA), s 1024, no vocabulary.
GQA = Transformer(layers=4, hidden=1024, seq=1024, vocab=0, heads=8, kv_heads=2)
A100 = DEVICES["A100"]
HBM = 2.039e12
MIB = 2**20
LINK = 100e9  # bytes/s each way between the two GPUs


def _cp_calls(step, rank=0):
    return [(op.op, op.nbytes) for op in step.ops if op.rank == rank and op.group.startswith("cp")]


def _two_a100s(bandwidth):
    graph = ring_graph(2, bandwidth, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    return graph


def test_all_gather_moves_k_and_v_of_the_whole_sequence():
    """TP 2, CP 2. A TP rank's K and V over the whole sequence are 2 x b s x (g / t) d x
    2 bytes = 2 x 1024 x 1 x 128 x 2 = 512 KiB a layer: the all-gather's buffer, of which
    each rank receives the (cp - 1) / cp it does not hold. Forward one gather a layer
    (TE: gather_along_first_dim of K and of V); backward with full recomputation the
    recomputed forward's and its own, then dK, dV reduce-scattered; all on the compute
    stream (TE's gathers are synchronous and nothing overlaps them)."""
    step = megatron(GQA, tp=2, cp=2, pp=1, dp=1, global_batch=1, cp_comm_type="all_gather")
    per_layer = 2 * 1024 * 1 * 128 * 2
    assert per_layer == 512 * 1024
    assert _cp_calls(step) == [
        ("all_gather", 4 * per_layer),
        ("all_gather", 2 * 4 * per_layer),
        ("reduce_scatter", 4 * per_layer),
    ]
    cp_ops = [op for op in step.ops if op.group.startswith("cp")]
    assert {op.stream for op in cp_ops} == {"compute"}


def test_all_gather_without_recomputation_gathers_once_a_pass():
    """Megatron-Core's defaults (no recomputation here): the backward gathers K and V
    once (TE's backward gathers them again: only the local chunks are saved)."""
    step = megatron_core(
        GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1, cp_comm_type="all_gather", recompute="none"
    )
    kv = 2 * 1024 * 2 * 128 * 2  # K and V, 2 key/value heads, the whole sequence
    assert _cp_calls(step) == [
        ("all_gather", 4 * kv),
        ("all_gather", 4 * kv),
        ("reduce_scatter", 4 * kv),
    ]


def test_a2a_moves_q_k_v_and_the_output():
    """CP 2, a2a (DeepSpeed-Ulysses, TE's AttnFuncWithCPAndQKVOA2A): per layer the rank's
    512 tokens' Q (8 heads of 128: 1 MiB), K and V (2 heads each: 0.5 MiB) go out in
    all-to-alls before the attention and its output (8 heads: 1 MiB) after. Backward
    with full recomputation: the recomputed forward's Q, K, V and the output's gradient
    before the attention's backward, dQ, dK, dV and the recomputed output after."""
    step = megatron(GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1, cp_comm_type="a2a")
    q = 512 * 8 * 128 * 2
    kv = 2 * 512 * 2 * 128 * 2
    o = 512 * 8 * 128 * 2
    assert (q, kv, o) == (MIB, MIB // 2, MIB)
    assert _cp_calls(step) == [
        ("all_to_all", 4 * (q + kv)),
        ("all_to_all", 4 * o),
        ("all_to_all", 4 * (o + q + kv)),
        ("all_to_all", 4 * (q + kv + o)),
    ]


def test_a2a_runs_the_whole_sequence_on_a_share_of_the_heads():
    """After the all-to-all a rank holds the whole sequence of 8 / 2 = 4 heads: its causal
    kernel is 1024 queries against 1024 keys, 4 x 4 layers' sequence-heads; the ring's
    (and all_gather's) is 512 queries against the sequence on 8 heads: the same FLOPs."""
    a2a = megatron(GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1, cp_comm_type="a2a")
    ring = megatron(GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1)
    gathered = megatron(GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1, cp_comm_type="all_gather")
    forward = {
        name: next(op for op in step.ops if op.rank == 0 and op.attention).attention[0]
        for name, step in (("a2a", a2a), ("ring", ring), ("gathered", gathered))
    }
    assert (forward["a2a"].batch, forward["a2a"].queries, forward["a2a"].keys) == (4, 1024, 1024)
    assert (forward["ring"].batch, forward["ring"].queries, forward["ring"].keys) == (8, 512, 1024)
    assert forward["gathered"] == forward["ring"]
    assert forward["a2a"].flops == forward["ring"].flops == 4 * 2 * 512 * 1024 * 8 * 128


@pytest.mark.parametrize("kind", ["all_gather", "a2a"])
def test_small_step_by_hand(kind):
    """CP 2 on two A100s joined by a 100 GB/s link, no TP, DP or PP, one micro-batch:
    everything runs one after another on the compute stream, so the step is its kernels
    (as tests/test_context_parallel.py works them by hand), the CP collectives, the
    distributed optimizer's reduce-scatter of the fp32 gradients and all-gather of the
    bf16 parameters over the 2 CP ranks, and the optimizer step. Each collective over 2
    ranks sends half of its buffer across the link. all_gather: (4 + 8 + 4) MiB of K/V
    buffers; a2a: (6 + 4 + 10 + 10) MiB of Q/K/V/O buffers, its kernels the whole
    sequence on 4 heads."""
    step = megatron(
        GQA,
        tp=1,
        cp=2,
        pp=1,
        dp=1,
        global_batch=1,
        distributed_optimizer=True,
        cp_comm_type=kind,
    )
    _, result = run_workload(step, _two_a100s(LINK), algorithm="ring")
    linear = GQA.linear_gemms(1, cp=2)
    fwd_gemms = sum(gemm_time(A100, g) for g in linear)
    bwd_gemms = sum(gemm_time(A100, grad) for g in linear for grad in g.backward())
    if kind == "all_gather":
        core, span, cp_bytes = 2 * 512 * 1024 * 8 * 128, 512, (4 + 8 + 4) * MIB
    else:
        core, span, cp_bytes = 2 * 1024 * 1024 * 4 * 128, 1024, (6 + 4 + 10 + 10) * MIB
    core_fwd = core / A100.attention_rate(span)
    core_bwd = core / A100.attention_rate(span, True)
    kernels = GQA.layer_elementwise_bytes(512, flash_attention=True) / HBM
    forward = fwd_gemms + core_fwd + kernels
    backward = fwd_gemms + bwd_gemms + core_fwd + 2.5 * core_bwd + 3 * kernels
    params = 4 * GQA.layer_params
    optimizer = params * 16 / 2 / HBM
    cp_s = cp_bytes / 2 / LINK
    dp_s = params * (4 + 2) / 2 / LINK
    assert result.exposed_by_kind["CP"] == pytest.approx(cp_s, rel=1e-9)
    assert result.step_s == pytest.approx(
        4 * (forward + backward) + optimizer + cp_s + dp_s, rel=1e-6
    )


def test_ring_hides_what_the_attention_covers():
    """p2p (the default), the same step at 10 GB/s: the K/V exchange runs on its own
    stream beside the pass's attention kernels, so only what outlasts them is exposed:
    forward 4 MiB gathered (2 MiB cross) against 4 layers' forward kernels; backward 8
    MiB gathered and 4 MiB reduce-scattered (6 MiB cross) against the recomputed forward
    and backward kernels."""
    link = 10e9
    step = megatron(GQA, tp=1, cp=2, pp=1, dp=1, global_batch=1, distributed_optimizer=True)
    _, result = run_workload(step, _two_a100s(link), algorithm="ring")
    core = 2 * 512 * 1024 * 8 * 128
    core_fwd = core / A100.attention_rate(512)
    core_bwd = core / A100.attention_rate(512, True)
    attention_fwd = 4 * core_fwd
    attention_bwd = 4 * (core_fwd + 2.5 * core_bwd)
    exposed = max(0.0, 2 * MIB / link - attention_fwd) + max(0.0, 6 * MIB / link - attention_bwd)
    assert exposed > 0
    assert result.exposed_by_kind["CP"] == pytest.approx(exposed, rel=1e-6)


def test_all_gather_holds_the_gathered_k_and_v():
    """The all-gather's backward holds K and V gathered, dK and dV over the sequence and
    their reordered copies, and its two kernels' dK, dV over i + 1 and 2 cp - i chunks of
    keys: (3 + 1 / 4) x 1 MiB for CP 2 (K and V of 1024 tokens on 2 heads: 1 MiB). The
    memory estimate adds it to the activations; the estimate without building agrees."""
    kv = 2 * 1024 * 2 * 128 * 2
    assert cp_gather_buffer_bytes(GQA, micro_batch=1, tp=1, cp=2) == pytest.approx(3.25 * kv)
    options = dict(tp=1, cp=2, pp=1, dp=1, global_batch=1)
    ring = megatron(GQA, **options).memory
    gathered = megatron(GQA, **options, cp_comm_type="all_gather").memory
    assert gathered.activations - ring.activations == pytest.approx(3.25 * kv)
    assert gathered.weights == ring.weights and gathered.optimizer == ring.optimizer
    alone = megatron_step_memory(GQA, defaults="sc21", **options, cp_comm_type="all_gather")
    assert alone == gathered


def test_the_default_is_megatrons_p2p():
    """Megatron-LM's --cp-comm-type defaults to p2p (arguments.py, core_v0.19.0): the
    default step is the p2p one, call for call."""
    default = megatron(GQA, tp=2, cp=2, pp=1, dp=1, global_batch=1)
    ring = megatron(GQA, tp=2, cp=2, pp=1, dp=1, global_batch=1, cp_comm_type="p2p")
    assert default.to_dict() == ring.to_dict()
    assert {op.stream for op in default.ops if op.group.startswith("cp")} == {"cp"}


def test_a2a_p2p_all_to_alls_in_pairs_and_rings_across_them():
    """CP 4 as hierarchical_context_parallel_sizes [2, 2]: Megatron-Core's level-0 groups
    are runs of 2 consecutive CP ranks (0, 1 and 2, 3), its level-1 groups the ranks 2
    apart (0, 2 and 1, 3). Rank 1's 256 tokens: Q (8 heads: 512 KiB a layer) and K, V
    (2 heads each: 256 KiB) all-to-all'd in its pair, then K and V of 2 x 256 = 512
    tokens on 2 / 2 = 1 head passed around its ring (the whole sequence's K, V on that
    head, 2 x 1024 x 128 x 2 = 512 KiB a layer, gathered), then its output (512 KiB)
    back. Its kernel: 4 heads, 512 queries against the 1024 keys. Backward with full
    recomputation: the forward's all-to-alls, the output's gradient and dQ, dK, dV, and
    the ring's two gathers and reduce-scatter."""
    step = megatron(
        GQA,
        tp=1,
        cp=4,
        pp=1,
        dp=1,
        global_batch=1,
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=[2, 2],
    )
    groups = {name: g.ranks for name, g in step.groups.items() if name.startswith("cp.")}
    assert sorted(v for k, v in groups.items() if ".a2a." in k) == [[0, 1], [2, 3]]
    assert sorted(v for k, v in groups.items() if ".p2p." in k) == [[0, 2], [1, 3]]
    kib = 1024
    qkv, o, kv = 4 * (512 + 256) * kib, 4 * 512 * kib, 4 * 512 * kib
    calls = [
        (op.op, len(step.groups[op.group].ranks), op.nbytes, op.stream)
        for op in step.ops
        if op.rank == 1 and op.group.startswith("cp")
    ]
    assert calls == [
        ("all_to_all", 2, qkv, "compute"),
        ("all_gather", 2, kv, "cp"),
        ("all_to_all", 2, o, "compute"),
        ("all_to_all", 2, o + qkv, "compute"),
        ("all_gather", 2, 2 * kv, "cp"),
        ("reduce_scatter", 2, kv, "cp"),
        ("all_to_all", 2, qkv + o, "compute"),
    ]
    pair = {
        step.groups[op.group].ranks[0] for op in step.ops if op.rank == 1 and op.op == "all_to_all"
    }
    ring = {
        tuple(step.groups[op.group].ranks)
        for op in step.ops
        if op.rank == 1 and op.op == "all_gather"
    }
    assert pair == {0} and ring == {(1, 3)}
    kernel = next(op for op in step.ops if op.rank == 1 and op.attention).attention[0]
    assert (kernel.batch, kernel.queries, kernel.keys) == (4, 512, 1024)


def test_a2a_p2p_with_a_level_of_one_is_p2p_or_a2a():
    """Transformer Engine runs a2a+p2p as p2p where the all-to-all group is one rank and
    as a2a where the ring is (attn_forward_func_with_cp): the steps are those, op for op."""
    m = Transformer(layers=2, hidden=1024, seq=1024, vocab=0, heads=8, kv_heads=4)
    options = dict(tp=1, cp=4, pp=1, dp=1, global_batch=1)
    for sizes, kind in (([1, 4], "p2p"), ([4, 1], "a2a")):
        nested = megatron(
            m, **options, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=sizes
        )
        assert nested.to_dict() == megatron(m, **options, cp_comm_type=kind).to_dict()


@pytest.mark.parametrize("kind", ["all_gather", "a2a", "a2a+p2p"])
def test_one_cp_rank_standing_for_the_others_is_exact(kind):
    """With ``shadows`` one CP rank is built for its group where every CP rank issues the
    same calls (all_gather, a2a); a2a+p2p's groups do not map onto themselves along one
    shift of the CP ranks, so every CP rank is built: either way the step is the full
    build's, to the bit."""
    m = Transformer(layers=2, hidden=1024, seq=1024, vocab=0, heads=8, kv_heads=4)
    options = dict(tp=1, cp=4, pp=1, dp=1, global_batch=1, cp_comm_type=kind)
    if kind == "a2a+p2p":
        options["hierarchical_context_parallel_sizes"] = [2, 2]
    full = megatron(m, **options)
    shadowed = megatron(m, **options, shadows=True)
    built = {op.rank for op in shadowed.ops}
    assert built == ({0, 1, 2, 3} if kind == "a2a+p2p" else {0})
    graph = ring_graph(4, LINK, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    _, expected = run_workload(full, graph, algorithm="ring")
    _, result = run_workload(shadowed, graph, algorithm="ring")
    assert result.step_s == expected.step_s
    assert result.exposed_by_kind == expected.exposed_by_kind


def test_values_refused_say_what_to_do():
    valid = "valid choices: a2a, a2a\\+p2p, all_gather, p2p"
    with pytest.raises(CcsimError, match=f"cp_comm_type .*{valid}"):
        megatron(GQA, tp=1, cp=2, pp=1, global_batch=1, cp_comm_type="ring")
    with pytest.raises(CcsimError, match="a2a\\+p2p needs hierarchical_context_parallel_sizes"):
        megatron(GQA, tp=1, cp=2, pp=1, global_batch=1, cp_comm_type="a2a+p2p")
    with pytest.raises(CcsimError, match="n x p = cp \\(4\\), not \\[2, 4\\]"):
        megatron(
            GQA,
            tp=1,
            cp=4,
            pp=1,
            global_batch=1,
            cp_comm_type="a2a+p2p",
            hierarchical_context_parallel_sizes=[2, 4],
        )
    with pytest.raises(CcsimError, match="applies to cp_comm_type a2a\\+p2p, not all_gather"):
        megatron(
            GQA,
            tp=1,
            cp=4,
            pp=1,
            global_batch=1,
            cp_comm_type="all_gather",
            hierarchical_context_parallel_sizes=[2, 2],
        )
    # TE asserts num_heads % cp_size == 0 for Q, K and V: 2 key/value heads over CP 4.
    with pytest.raises(CcsimError, match="tp x 4 \\(4\\) must divide .* key/value heads \\(2\\)"):
        megatron(GQA, tp=1, cp=4, pp=1, global_batch=1, cp_comm_type="a2a")


def test_the_estimate_keeps_both_levels_of_a2a_p2p():
    """The resource estimate runs a small step (each count at 2 or less) and scales its
    ops per rank: for a2a+p2p both levels stay (2 x 2 CP ranks for [2, 4]), and every
    rank issues as many ops as in the real step, so the count is the real one; sizes
    that do not multiply to cp are left to the generator to refuse."""
    m = Transformer(layers=2, hidden=1024, seq=1024, vocab=0, heads=8, kv_heads=4)
    options = dict(
        model=m,
        tp=1,
        cp=8,
        pp=1,
        dp=1,
        global_batch=1,
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=[2, 4],
    )
    estimate = generator_estimate("megatron", options)
    assert estimate.what == f"megatron on 8 ranks: {len(megatron_core(**options).ops)} ops"
    wrong = {**options, "hierarchical_context_parallel_sizes": [2, 2]}
    assert generator_estimate("megatron", wrong) is None


def test_generate_takes_the_cp_comm_type(tmp_path, capsys):
    """`ccsim generate megatron --cp-comm-type ...` builds the step the keyword builds;
    a2a+p2p without its sizes is one line and exit 2."""
    from simulator.cli import main

    args = ["generate", "megatron", "--model", "llama3-8b", "--tp", "1", "--pp", "1",
            "--dp", "1", "--cp", "4", "--global-batch", "1"]  # fmt: skip
    out = tmp_path / "a2a-p2p.json"
    nested = ["--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"]
    assert main([*args, *nested, "--out", str(out)]) == 0
    trace = json.loads(out.read_text())
    step = megatron_core(
        "llama3-8b",
        tp=1,
        pp=1,
        dp=1,
        cp=4,
        global_batch=1,
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=[2, 2],
    )
    assert len(trace["ops"]) == len(step.ops)
    assert sorted(trace["groups"]) == sorted(step.groups)
    assert main([*args, "--cp-comm-type", "a2a+p2p", "--out", str(out)]) == 2
    assert "needs hierarchical_context_parallel_sizes" in capsys.readouterr().err
