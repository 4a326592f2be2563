"""Transformer Engine's userbuffer TP overlap (issue 31): GEMMs chunked beside their
exchange and on the SMs a communication kernel leaves, against waves counted by hand;
the exposed reduction and last chunk against their bytes; "ideal" as before."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron
from simulator.workload.kernels import Gemm, gemm_time
from simulator.workload.model import Transformer
from simulator.workload.trace import WorkloadError, parse_workload
from simulator.workload.userbuffers import UB_NEMO_H100, UB_TE_DEFAULT, userbuffers_exposed

H100 = DEVICES["H100"]
# One H100 wave of 256 x 128 tiles over k: every SM one tile at its share of the
# sustained rate (989 TFLOP/s x 0.64), each tile paying 136 K elements more
# (tests/test_kernels.py works these out); each kernel 6 us.
KERNEL_S = 6e-6


def wave_s(k: int) -> float:
    return 132 * 2 * 256 * 128 * (k + 136) / (989e12 * 0.64)


def test_a_gemm_beside_24_sms_takes_132_over_108_as_long():
    """6912 x 5632 outputs are 27 x 44 = 1188 tiles of 256 x 128 (54 x 22 of 128 x 256):
    exactly 9 waves on 132 SMs and 11 on the 108 a 24-SM communication kernel leaves,
    so the compute part grows by 11 / 9 = 132 / 108."""
    gemm = Gemm(6912, 5632, 8192)
    alone = gemm_time(H100, gemm)
    beside = gemm_time(H100, gemm.overlapped(margin=24))
    assert alone == pytest.approx(9 * wave_s(8192) + KERNEL_S, rel=1e-12)
    assert beside == pytest.approx(11 * wave_s(8192) + KERNEL_S, rel=1e-12)
    assert (beside - KERNEL_S) / (alone - KERNEL_S) == pytest.approx(132 / 108, rel=1e-12)


def test_tp_chunks_share_waves_and_pay_a_kernel_each():
    """GPT-3 175B's QKV on TP 4 (2048 tokens, 12288 -> 9216) in the 4 chunks of a ring
    exchange: each chunk is 512 x 9216 = 2 x 72 tiles, 576 in all, 5 waves on 132 SMs
    (4.36, as the whole GEMM's 8 x 72); the chunks pay 4 kernels' fixed time instead of
    one. Beside one SM (NeMo's fp8 set_sm_margin on ring exchange): 576 / 131 -> 5."""
    gemm = Gemm(2048, 9216, 12288)
    whole = 5 * wave_s(12288)
    assert gemm_time(H100, gemm) == pytest.approx(whole + KERNEL_S, rel=1e-12)
    chunked = gemm.overlapped(splits=4)
    assert gemm_time(H100, chunked) == pytest.approx(whole + 4 * KERNEL_S, rel=1e-12)
    assert gemm_time(H100, gemm.overlapped(4, 1)) == gemm_time(H100, chunked)
    # count layers of it: count times one
    assert gemm_time(H100, chunked.times(3)) == pytest.approx(
        3 * gemm_time(H100, chunked), rel=1e-12
    )


def test_a_chunk_rereads_the_other_operand():
    """A memory-bound GEMM (k 64) in 4 chunks reads the 64 x 4096 operand 4 times:
    (4096 x 64 + 4 x 64 x 4096) x 2 + 4096 x 4096 x 2 bytes at H100's streaming rate."""
    gemm = Gemm(4096, 4096, 64)
    memory = ((4096 * 64 + 4 * 64 * 4096) * 2 + 4096 * 4096 * 2) / H100.stream_bandwidth
    assert gemm_time(H100, gemm.overlapped(splits=4)) == pytest.approx(
        memory + 4 * KERNEL_S, rel=1e-12
    )


def test_the_exposed_work_per_layer():
    """NeMo's fp8 GPT-3 175B config ring-exchanges both reduce-scatter GEMMs: each sums
    its 4 received chunks of a / 4 bytes into one, 5/4 a of traffic, 2.5 a a layer. TE's
    defaults pipeline them in 4 splits: a / 4 each of reduce-scatter left after the last
    GEMM chunk, a / 2 a layer."""
    a = 2048 * 12288 * 2
    assert userbuffers_exposed(UB_NEMO_H100[("fp8", 12288, 4)], 4, a) == (2.5 * a, 0.0)
    assert userbuffers_exposed(UB_TE_DEFAULT, 4, a) == (0.0, a / 2)


SMALL = Transformer(layers=4, hidden=1024, seq=512, vocab=0, heads=8)


def ring(n: int):
    graph = ring_graph(n, 100e9, 1e-6)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    return graph


def _ops(step, rank=0):
    return {op.id: op for op in step.ops if op.rank == rank}


def test_ideal_is_todays_step_bit_for_bit():
    """True, "ideal" and the default build the same ops and replay to the same step."""
    graph = ring(4)
    steps = []
    for value in (None, True, "ideal"):
        step = megatron(SMALL, tp=4, pp=1, dp=1, global_batch=2, tp_comm_overlap=value)
        _, result = run_workload(step, graph)
        steps.append((result.step_s, [(o.id, o.gemms, o.mem_bytes, o.nbytes) for o in step.ops]))
    assert steps[0] == steps[1] == steps[2]


def test_userbuffers_moves_the_pipelined_last_chunks_onto_the_compute_stream():
    """TE's defaults on this shape: the forward's two reduce-scatters of a = 512 x 1024 x
    2 bytes per layer keep 3/4 beside the GEMMs and put 1/4 each on the compute stream
    after them; the bytes on the wire are the ideal's. Its GEMMs are the ideal's, chunked
    (all-gather GEMMs in TP chunks, pipelined ones in 4), on every SM (TE 1.x sets no
    margin by default)."""
    ideal = _ops(megatron(SMALL, tp=4, pp=1, dp=1, global_batch=2, tp_comm_overlap="ideal"))
    ub = _ops(megatron(SMALL, tp=4, pp=1, dp=1, global_batch=2, tp_comm_overlap="userbuffers"))
    a = 512 * 1024 * 2
    layers = SMALL.layers
    hidden = ub["r0.tp.f0.reduce_scatter"].nbytes
    exposed = ub["r0.tp.f0.exposed"]
    assert exposed.stream == "compute"
    assert exposed.nbytes == pytest.approx(layers * 2 * a / 4)
    assert hidden + exposed.nbytes == pytest.approx(ideal["r0.tp.f0.reduce_scatter"].nbytes)
    assert "r0.tp.b0.exposed" not in ub  # no recomputation: the backward leaves none
    plain = ideal["r0.f0"].gemms
    chunked = ub["r0.f0"].gemms
    assert [(g.m, g.n, g.k, g.count) for g in chunked] == [(g.m, g.n, g.k, g.count) for g in plain]
    # qkv ring exchange, proj pipeline, fc1 ring exchange, fc2 pipeline
    assert [(g.splits, g.margin) for g in chunked[:4]] == [(4, 0)] * 4
    # backward: per GEMM (dgrad, wgrad): qkv bulk both, proj ring + plain, fc1 bulk, fc2 ring
    grads = [(g.splits, g.margin) for g in ub["r0.b0"].gemms[:8]]
    assert grads == [(1, 0), (1, 0), (4, 0), (1, 0), (1, 0), (1, 0), (4, 0), (1, 0)]
    # NeMo's bf16 Llama 3 70B config pipelines proj_fprop beside 24 SMs with a margin
    model = Transformer(layers=1, hidden=8192, seq=1024, vocab=0, heads=64)
    nemo = _ops(megatron(model, tp=4, pp=1, dp=1, global_batch=1, tp_comm_overlap="userbuffers"))
    assert [(g.splits, g.margin) for g in nemo["r0.f0"].gemms[:4]] == [
        (4, 0),
        (4, 24),
        (4, 0),
        (4, 16),
    ]


def test_userbuffers_reduction_kernels_are_memory_traffic():
    """NeMo's fp8 GPT-3 175B shape (hidden 12288, TP 4): the forward's elementwise op
    carries 2.5 a more bytes a layer (the two reduction kernels), the backward none."""
    model = Transformer(layers=2, hidden=12288, seq=2048, vocab=0, heads=96)
    kwargs = dict(tp=4, pp=1, dp=1, global_batch=2, precision="fp8")
    ideal = _ops(megatron(model, tp_comm_overlap="ideal", **kwargs))
    ub = _ops(megatron(model, tp_comm_overlap="userbuffers", **kwargs))
    a = 2048 * 12288 * 2
    fwd = ub["r0.f0.elementwise"].mem_bytes - ideal["r0.f0.elementwise"].mem_bytes
    assert fwd == pytest.approx(2 * 2.5 * a)
    assert ub["r0.b0.elementwise"].mem_bytes == ideal["r0.b0.elementwise"].mem_bytes
    assert "r0.tp.f0.exposed" not in ub


def test_userbuffers_is_never_faster_than_ideal():
    graph = ring(4)
    steps = {}
    for value in ("ideal", "userbuffers"):
        step = megatron(SMALL, tp=4, pp=1, dp=1, global_batch=2, tp_comm_overlap=value)
        steps[value] = run_workload(step, graph)[1].step_s
    assert steps["userbuffers"] > steps["ideal"]


def test_bad_tp_comm_overlap_is_one_line():
    with pytest.raises(CcsimError, match="tp_comm_overlap.*ideal, userbuffers"):
        megatron(SMALL, tp=4, pp=1, dp=1, global_batch=2, tp_comm_overlap="nccl")
    with pytest.raises(CcsimError, match="needs sequence parallelism"):
        megatron(
            SMALL,
            tp=4,
            pp=1,
            dp=1,
            global_batch=2,
            tp_comm_overlap="userbuffers",
            sequence_parallel=False,
        )


def test_chunked_gemms_in_the_trace_format():
    """A GEMM's nine-field form parses back to the same kernel; a negative margin or a
    block scale without fp8 is refused."""

    def trace(gemm):
        return {
            "format": "ccsim-workload/1",
            "ranks": 1,
            "ops": [{"id": "a", "rank": 0, "kind": "compute", "gemms": [gemm]}],
        }

    gemm = Gemm(512, 256, 128).in_bits(8).overlapped(4, 16)
    (op,) = parse_workload(trace(gemm.as_list())).ops
    assert op.gemms == (gemm,)
    for bad in ([8, 4, 2, 1, 1, 16, 0, 4, -1], [8, 4, 2, 1, 1, 16, 32, 4, 0]):
        with pytest.raises(WorkloadError, match="splits >= 1, margin >= 0"):
            parse_workload(trace(bad))
