"""Pipeline transfers as PyTorch and Megatron-Core issue them with ``overlap_p2p_comm``
(``megatron(p2p_streams=..., p2p_send_wait=...)``), and Transformer Engine's delayed
scaling amax all-reduce (``megatron(amax_reduction=...)``).

Sources: PyTorch runs an un-batched isend/irecv on the communicator and stream of the
peer pair (ProcessGroupNCCL::pointToPoint, key getKeySendRecv(rank, peer)), so a rank's
sends to and receives from one neighbour queue on one FIFO stream; Megatron-Core's
interleaved schedule (schedules.py at 2e2bdf6, forward_backward_pipelining_with_interleaving)
posts, after each forward, its send and the next forward's receive, after each backward
its send and the next backward's receive, the first backward's receive after the last
warm-up forward, and waits all of a call's handles (its send's too) before the next
pass of that direction; Transformer Engine (v1.12 fp8.py) all-reduces the amaxes over
the fp8 group at each fp8_autocast exit and after each backward, blocking."""

import dataclasses

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.generators import AMAX_BYTES_PER_LAYER, Transformer, megatron
from simulator.workload.pipeline import pipeline_order

# Equal chunks (no vocabulary): every pass of a direction takes the same time.
EVEN = dataclasses.replace(Transformer(layers=16, hidden=1024, seq=512, vocab=32000), vocab=0)


def _transfers(workload, rank: int, stream: str) -> list[tuple[str, str]]:
    """The (kind, tag) of a rank's sends and receives on one stream, in stream order."""
    return [
        (op.kind, op.tag)
        for op in workload.ops
        if op.rank == rank and op.stream == stream and op.kind in ("send", "recv")
    ]


def test_each_neighbour_pair_shares_one_stream_in_the_same_order_on_both_sides():
    """PP 4 x VP 2: a rank's transfers with its next stage (forward sends, backward
    receives) are on one stream, those with its previous stage on another; and the
    pair's transfers come in the same order on both of its ranks (what a FIFO stream
    per pair needs not to deadlock), send matching receive one for one."""
    workload = megatron(EVEN, tp=1, pp=4, dp=1, global_batch=8, virtual_stages=2)
    streams = {op.stream for op in workload.ops if op.kind in ("send", "recv")}
    assert streams == {"pp.next", "pp.prev"}
    for stage in range(4):
        nxt = (stage + 1) % 4
        mine = _transfers(workload, stage, "pp.next")
        theirs = _transfers(workload, nxt, "pp.prev")
        assert {kind for kind, _ in mine} == {"send", "recv"}
        flipped = {"send": "recv", "recv": "send"}
        assert [(flipped[kind], tag) for kind, tag in theirs] == mine
    # Issued in Megatron's order: in the steady state a forward's send, then the next
    # backward's receive, alternately.
    kinds = [kind for kind, _ in _transfers(workload, 0, "pp.next")]
    assert "send,recv,send,recv,send,recv" in ",".join(kinds)


def test_split_streams_keep_the_old_layout():
    workload = megatron(
        EVEN, tp=1, pp=4, dp=1, global_batch=8, virtual_stages=2, p2p_streams="split"
    )
    streams = {op.stream for op in workload.ops if op.kind in ("send", "recv")}
    assert streams == {"pp.send.next", "pp.send.prev", "pp.recv.next", "pp.recv.prev"}
    # Without overlap_p2p_comm the default layout is the old one too.
    plain = megatron(
        EVEN, tp=1, pp=4, dp=1, global_batch=8, virtual_stages=2, overlap_p2p_comm=False
    )
    assert {op.stream for op in plain.ops if op.kind == "send"} == {
        "pp.send.next",
        "pp.send.prev",
    }


def test_pp_two_puts_sends_and_receives_on_two_streams():
    """At PP 2 both neighbours are one rank; Megatron-Core issues one side's transfers
    on the world group (p2p_communication.py, _p2p_ops), so sends and receives have a
    stream each."""
    workload = megatron(EVEN, tp=1, pp=2, dp=1, global_batch=8, virtual_stages=2)
    assert {op.stream for op in workload.ops if op.kind == "send"} == {"pp.send"}
    assert {op.stream for op in workload.ops if op.kind == "recv"} == {"pp.recv"}


def _last_compute(workload, rank: int, tag: str) -> int:
    """The last op of a pass on the compute stream (its kernels or its TP call)."""
    return max(
        op.index
        for op in workload.ops
        if op.rank == rank
        and op.stream == "compute"
        and (op.id.endswith(f".{tag}") or f".{tag}." in op.id)
    )


def test_first_backward_receive_is_posted_after_the_last_warmup_forward():
    """Megatron posts it with send_backward_recv_backward at the last warm-up step
    (k == num_warmup_microbatches - 1): the forward before the first steady one."""
    workload = megatron(EVEN, tp=1, pp=4, dp=1, global_batch=8, virtual_stages=2)
    ops = {op.id: op for op in workload.ops}
    for stage in range(4):
        order = pipeline_order(stage, 4, 8, 2)
        first = next(n for n, entry in enumerate(order) if entry[0] == "b")
        kind, c, i = order[first]
        recv = ops.get(f"r{stage}.recv.{kind}{c}.{i}")
        if recv is None:  # the last virtual stage receives no gradient
            continue
        # Megatron's warm-up: (p - s - 1) 2 + (v - 1) p forwards, then one steady forward.
        assert first == (4 - stage - 1) * 2 + 4 + 1
        k, cc, ii = order[first - 2]
        assert list(recv.deps) == [_last_compute(workload, stage, f"{k}{cc}.{ii}")]


def test_each_pass_waits_for_the_last_send_of_its_direction():
    """The handles waited before a pass are those of the last call of its direction:
    its receive and the send of the pass before (p2p_send_wait); off, only the
    receive."""
    on = megatron(EVEN, tp=1, pp=4, dp=1, global_batch=8, virtual_stages=2)
    off = megatron(EVEN, tp=1, pp=4, dp=1, global_batch=8, virtual_stages=2, p2p_send_wait=False)
    order = pipeline_order(1, 4, 8, 2)
    checked = 0
    for n, (kind, c, i) in enumerate(order):
        before = [e for e in order[:n] if e[0] == kind]
        if not before:
            continue
        k, cc, ii = before[-1]
        send = f"r1.send.{k}{cc}.{ii}"
        first_on = next(op for op in on.ops if op.id == f"r1.{kind}{c}.{i}")
        first_off = next(op for op in off.ops if op.id == f"r1.{kind}{c}.{i}")
        sends_on = {on.ops[d].id for d in first_on.deps if on.ops[d].kind == "send"}
        sends_off = {off.ops[d].id for d in first_off.deps if off.ops[d].kind == "send"}
        assert sends_on == {send}
        assert sends_off == set()
        checked += 1
    assert checked >= 20


def _ring(ranks: int, bandwidth: float, latency: float = 0.0) -> object:
    graph = ring_graph(ranks, bandwidth, latency)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "H100"
    return graph


def test_amax_all_reduce_follows_every_pass_in_delayed_scaling():
    """fp8 with delayed scaling: one all-reduce after each pass over the stage's TP x DP
    ranks, of the pass's amaxes (3 fp32 per fp8 GEMM forward, 2 backward, 4 GEMMs a
    layer); none in bf16 or with current scaling; "tp" over the TP group."""
    m = dataclasses.replace(EVEN, layers=4)
    kw = dict(tp=2, pp=2, dp=2, global_batch=8, precision="fp8", fp8_recipe="delayed")
    workload = megatron(m, **kw, amax_reduction="stage")
    amax = [op for op in workload.ops if ".amax." in op.id]
    passes = 2 * 4  # forwards and backwards of 4 micro-batches a rank
    assert len(amax) == 8 * passes  # 8 ranks
    for op in amax:
        group = workload.groups[op.group]
        stage = op.rank // 4
        assert sorted(group.ranks) == list(range(4 * stage, 4 * stage + 4))
        forward = ".amax.f" in op.id
        assert op.nbytes == 2 * AMAX_BYTES_PER_LAYER[forward]  # 2 layers a stage
        assert op.nbytes == 2 * 4 * (3 if forward else 2) * 4
        assert op.stream == "compute"
    tp_only = megatron(m, **kw, amax_reduction="tp")
    assert {tp_only.groups[op.group].kind for op in tp_only.ops if ".amax." in op.id} == {"TP"}
    # Off by default (see megatron's docstring); nothing to reduce without delayed
    # scaling's amax histories.
    for other in (dict(precision="bf16"), dict(fp8_recipe="tensorwise")):
        args = {**kw, **other, "amax_reduction": "stage"}
        assert not [op for op in megatron(m, **args).ops if ".amax." in op.id]
    assert not [op for op in megatron(m, **kw).ops if ".amax." in op.id]


def test_amax_all_reduce_adds_its_time_to_every_pass_without_pipelining():
    """DP 2, no pipeline: the step is a chain of passes, each followed by the blocking
    amax all-reduce, then the gradient reduction and the optimizer. So the step with it
    is the step without plus, per pass but the last, the time of that all-reduce alone
    on the same two GPUs (replayed on its own)."""
    m = dataclasses.replace(EVEN, layers=2)
    kw = dict(tp=1, pp=1, dp=2, global_batch=8, precision="fp8", fp8_recipe="delayed")
    graph = _ring(2, 1e9, 5e-6)
    with_amax = run_workload(megatron(m, **kw, amax_reduction="stage"), graph, algorithm="ring")[1]
    without = run_workload(megatron(m, **kw, amax_reduction="off"), graph, algorithm="ring")[1]

    def alone(nbytes: float) -> float:
        ops = [
            {
                "id": f"a{r}",
                "rank": r,
                "kind": "collective",
                "op": "all_reduce",
                "group": "g",
                "bytes": nbytes,
                "stream": "compute",
            }
            for r in (0, 1)
        ]
        trace = {
            "format": "ccsim-workload/1",
            "name": "amax",
            "ranks": 2,
            "groups": {"g": {"kind": "DP", "ranks": [0, 1]}},
            "ops": ops,
        }
        from simulator.workload.trace import load_workload

        return run_workload(load_workload(trace), graph, algorithm="ring")[1].step_s

    micro = 4  # 8 sequences over DP 2, micro-batch 1
    # The last backward's all-reduce runs beside the gradients' (issued on the DP stream
    # as its layers end), which take far longer: it adds only its bytes on the links
    # they share (a ring all-reduce on 2 ranks sends twice half its buffer each way).
    forward = alone(2 * AMAX_BYTES_PER_LAYER[True])
    backward = alone(2 * AMAX_BYTES_PER_LAYER[False])
    assert forward > backward > 5e-6  # latency-bound: two ring steps of 5 us links
    expected = micro * forward + (micro - 1) * backward + 2 * AMAX_BYTES_PER_LAYER[False] / 1e9
    assert with_amax.step_s - without.step_s == pytest.approx(expected, rel=1e-9)


def test_bad_values_are_one_clear_error():
    with pytest.raises(CcsimError, match="p2p_streams must be peer or split"):
        megatron(EVEN, tp=1, pp=2, global_batch=4, virtual_stages=2, p2p_streams="one")
    with pytest.raises(CcsimError, match="p2p_send_wait must be true, false or null"):
        megatron(EVEN, tp=1, pp=2, global_batch=4, virtual_stages=2, p2p_send_wait="yes")
    with pytest.raises(CcsimError, match="amax_reduction must be stage, tp, off"):
        megatron(EVEN, tp=1, pp=2, global_batch=4, amax_reduction="dp")
