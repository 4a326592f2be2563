"""Workload generators and the AICB importer, against counts and timelines worked out by
hand."""

import subprocess
import sys

import pytest

from simulator.topology import ring_graph
from simulator.workload import load_workload, run_workload
from simulator.workload.aicb import load_aicb
from simulator.workload.generators import Transformer, ddp, megatron, moe, zero3
from simulator.workload.presets import resolve_workload
from simulator.workload.trace import WorkloadError

SMALL = Transformer(layers=8, hidden=1024, seq=512, vocab=32000)
A100_GEMM = 312e12 * 0.7  # bytes/s and FLOP/s of the device table (A100)
A100_HBM = 2.039e12


def fast_ring(p, model="A100"):
    """A ring of p GPUs so fast (1e18 B/s, no latency) that communication is free."""
    graph = ring_graph(p, 1e18, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = model
    return graph


def test_transformer_arithmetic():
    """12 h^2 parameters per GPT layer (4h^2 attention + 8h^2 MLP); GPT-3 175B has
    96 x 12 x 12288^2 + 2 x 51200 x 12288 = 175.2e9 parameters."""
    assert SMALL.layer_params == 12 * 1024**2
    assert resolve_workload("megatron-gpt3-tp8-pp8").ranks == 64
    from simulator.workload.generators import MODELS

    assert MODELS["gpt3-175b"].params == pytest.approx(175.2e9, rel=1e-3)
    assert MODELS["llama-13b"].params == pytest.approx(13.0e9, rel=0.02)


def test_ddp_buckets_carry_every_gradient_once():
    workload = ddp(SMALL, ranks=4, bucket_bytes=5 * 2**20)
    per_layer = SMALL.layer_params * 2
    for rank in range(4):
        buckets = [op for op in workload.ops if op.rank == rank and op.kind == "collective"]
        assert sum(op.nbytes for op in buckets) == pytest.approx(SMALL.layers * per_layer)
        # 2 MiB x 12 / 2 = 24 MiB per layer > 5 MiB: one bucket per layer.
        assert len(buckets) == SMALL.layers


def test_zero3_gathers_twice_and_scatters_once_per_layer():
    workload = zero3(SMALL, ranks=4)
    ops = [op for op in workload.ops if op.rank == 0]
    gathers = [op for op in ops if op.op == "all_gather"]
    scatters = [op for op in ops if op.op == "reduce_scatter"]
    assert len(gathers) == 2 * SMALL.layers and len(scatters) == SMALL.layers
    assert {op.nbytes for op in gathers + scatters} == {SMALL.layer_params * 2}


def test_one_f_one_b_step_time():
    """With free communication and equal stages, a 1F1B pipeline of p stages and m
    micro-batches takes (m + p - 1)(t_f + t_b): stage 0 starts first and finishes its last
    backward last. Here t_f = (L/p) x layer forward FLOPs / A100 GEMM rate, t_b = 3 t_f
    (backward plus recomputation); then stage 0's optimizer reads and writes 16 bytes per
    parameter it holds (its layers plus the embedding) at HBM speed."""
    p, m = 4, 8
    workload = megatron(SMALL, tp=1, pp=p, dp=1, micro_batch=1, global_batch=m)
    _, result = run_workload(workload, fast_ring(p), algorithm="ring")
    t_f = SMALL.layers / p * SMALL.layer_forward_flops(SMALL.seq) / A100_GEMM
    t_b = 3 * t_f
    stage0_params = SMALL.layers / p * SMALL.layer_params + SMALL.vocab * SMALL.hidden
    expected = (m + p - 1) * (t_f + t_b) + stage0_params * 16 / A100_HBM
    assert result.step_s == pytest.approx(expected, rel=1e-6)
    # The bubble of stage p-1 is (p-1)(t_f + t_b) plus the wait for stage 0's optimizer.
    last = result.ranks[p - 1]
    assert last.compute_s == pytest.approx(
        m * (t_f + t_b)
        + (SMALL.layers / p * SMALL.layer_params + SMALL.vocab * SMALL.hidden) * 16 / A100_HBM,
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
