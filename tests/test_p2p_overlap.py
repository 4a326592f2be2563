"""Megatron-Core's overlapped pipeline receives (``overlap_p2p_comm``) in the
interleaved 1F1B schedule: each pass's receive is posted when the rank's previous pass
of the same direction ends, so the transfer runs beside the pass in between
(megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving:
``send_forward_recv_forward(..., overlap_p2p_comm=True)`` after a forward, its handles
waited just before the next forward, a backward later)."""

import dataclasses

import pytest

from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.generators import Transformer, megatron
from simulator.workload.pipeline import pipeline_order

# Equal chunks (no vocabulary): every pass of a direction takes the same time.
EVEN = dataclasses.replace(Transformer(layers=8, hidden=1024, seq=512, vocab=32000), vocab=0)


def _ring(bandwidth: float) -> object:
    graph = ring_graph(2, bandwidth, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"
    return graph


def _step(p2p: bool | None, v: int, bandwidth: float, m: int = 8):
    workload = megatron(
        EVEN, tp=1, pp=2, dp=1, global_batch=m, virtual_stages=v, overlap_p2p_comm=p2p
    )
    return workload, run_workload(workload, _ring(bandwidth), algorithm="ring")[1]


def test_receives_are_posted_a_pass_ahead_in_the_steady_state():
    """Rank 0 of PP 2 x VP 2, 8 micro-batches: where the schedule alternates forward
    and backward, a pass's receive waits for the pass two before it (the last of its
    direction); where passes of one direction follow each other (warm-up, cool-down),
    for the one before it, as without overlap."""
    workload = megatron(EVEN, tp=1, pp=2, dp=1, global_batch=8, virtual_stages=2)
    ops = {op.id: op for op in workload.ops}
    order = pipeline_order(0, 2, 8, 2)  # (kind, chunk, micro-batch), Megatron's order

    def end(kind: str, c: int, i: int) -> int:
        """The last op a pass runs on the compute stream (its GEMMs, memory-bound
        kernels, TP call), named after it: e.g. r0.f1.3, r0.tp.f1.3 (chunk 1, mb 3)."""
        tag = f"{kind}{c}.{i}"
        return max(
            op.index
            for op in workload.ops
            if op.rank == 0
            and op.stream == "compute"
            and (op.id.endswith(f".{tag}") or f".{tag}." in op.id)
        )

    checked = 0
    for n, (kind, c, i) in enumerate(order):
        recv = ops.get(f"r0.recv.{kind}{c}.{i}")
        if recv is None:  # the first virtual stage's forwards receive nothing
            continue
        same = [k for k in range(n) if order[k][0] == kind]
        if not same:
            continue
        if order[n - 1][0] != kind:
            assert same[-1] == n - 2  # steady state: two passes back
        assert list(recv.deps) == [end(*order[same[-1]])]
        checked += 1
    assert checked >= 10


def test_plain_one_f_one_b_is_unchanged():
    """Megatron-LM turns overlap_p2p_comm off without interleaving (arguments.py): the
    plain 1F1B step is the same op for op with the option on or off."""
    on = megatron(EVEN, tp=1, pp=2, dp=1, global_batch=4, overlap_p2p_comm=True)
    off = megatron(EVEN, tp=1, pp=2, dp=1, global_batch=4, overlap_p2p_comm=False)
    assert [(op.id, tuple(op.deps)) for op in on.ops] == [(op.id, tuple(op.deps)) for op in off.ops]


def test_overlapped_receives_hide_slow_transfers_down_to_the_free_step():
    """A link slow enough that a transfer is a sizeable part of a pass: the overlapped
    step is shorter than the one receiving after the pass before, and never shorter
    than the same schedule with free communication (m v + p - 1 chunk passes, SC'21
    section 2.2.2, and the optimizer), which bounds it from below."""
    free_wl, free = _step(True, 2, 1e18)
    _, plain_free = _step(False, 2, 1e18)
    assert free.step_s == pytest.approx(plain_free.step_s, rel=1e-9)
    # 512 tokens x 1024 x 2 bytes = 1 MiB an activation: at 2e9 B/s about 0.5 ms.
    _, on = _step(True, 2, 2e9)
    _, off = _step(False, 2, 2e9)
    assert on.step_s < off.step_s
    assert on.step_s >= free.step_s * (1 - 1e-12)
    assert on.step_parts()["exposed P2P"] < off.step_parts()["exposed P2P"]
    # Default: on with interleaving, as Megatron-LM's --no-overlap-p2p-communication.
    _, default = _step(None, 2, 2e9)
    assert default.step_s == pytest.approx(on.step_s, rel=1e-12)
    assert free_wl.ranks == 2


def test_a_wrong_overlap_value_is_one_clear_error():
    from simulator.errors import CcsimError

    with pytest.raises(CcsimError, match="overlap_p2p_comm must be true, false or null"):
        megatron(EVEN, tp=1, pp=2, global_batch=4, virtual_stages=2, overlap_p2p_comm="yes")
