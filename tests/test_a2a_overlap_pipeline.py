"""Combined 1F1B (``moe_a2a_overlap``) with interleaved pipelines: each step issues its
transfers in Megatron-Core's order, on one FIFO stream per neighbour by default as
PyTorch runs an un-batched isend/irecv (ccsim's earlier order deadlocked there, so such
steps ran on a stream per direction, where the published runs, Megatron-Bridge 26.06's
DeepSeek-V3 on 256 GB200, PP 4 x VP 4, complete)."""

import dataclasses

from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.model import MODELS

SMALL_MOE = dataclasses.replace(
    MODELS["mixtral-8x7b"],
    layers=16,
    seq=512,
    hidden=512,
    ffn=1024,
    moe_ffn=1024,
    heads=8,
    kv_heads=8,
    vocab=8000,
)


def _step(**options) -> float:
    workload = megatron(
        model=SMALL_MOE,
        tp=1,
        pp=4,
        dp=2,
        ep=2,
        micro_batch=1,
        global_batch=2 * 8,
        virtual_stages=4,
        moe_a2a_overlap=True,
        replicas=False,
        **options,
    )
    return run_workload(workload, "dgx-h100", nodes=1)[1].step_s


def test_combined_1f1b_interleaved_runs_its_transfers_on_a_stream_per_neighbour():
    """The default is the explicit "peer" streams' step, to the bit, and it ends."""
    assert _step() == _step(p2p_streams="peer")


def test_a_stream_per_direction_still_runs():
    """Asked for explicitly, "split" streams (the default before) run to their end too
    (a deadlock raises WorkloadError)."""
    assert _step(p2p_streams="split") > 0


def test_combined_steps_post_receives_in_megatron_core_order():
    """Stage 1 of 3, VP 2, 6 micro-batches, hand-worked from Megatron-Core core_v0.16.0:
    warm-up (pp - rank - 1) * 2 + (vp - 1) * pp + 1 = 6 forwards (schedules.py,
    get_pp_rank_microbatches, one more for combined 1F1B); steady steps pair forwards
    f0.3 f0.4 f0.5 f1.3 f1.4 f1.5 with backwards b1.0 b1.1 b1.2 b0.0 b0.1 b0.2. Each
    step ends with post_forward (the forward's send, then the next forward's receive)
    before post_backward (the backward's send, then the next backward's receive)
    (model_chunk_schedule_plan.py lines 506-517), each after its own pass's end."""
    small = dataclasses.replace(SMALL_MOE, layers=12)
    workload = megatron(
        model=small,
        tp=1,
        pp=3,
        dp=2,
        ep=2,
        micro_batch=1,
        global_batch=2 * 6,
        virtual_stages=2,
        moe_a2a_overlap=True,
        replicas=False,
    )
    ops = workload.ops
    rank = 2  # stage 1 (ranks 2 and 3: DP 2)
    p2p = [o for o in ops if o.rank == rank and o.kind in ("send", "recv")]
    names = [o.id.removeprefix(f"r{rank}.") for o in p2p]
    steps = [("f0.3", "b1.0", "f0.4", "b1.1"), ("f0.4", "b1.1", "f0.5", "b1.2")]
    steps += [("f0.5", "b1.2", "f1.3", "b0.0"), ("f1.3", "b0.0", "f1.4", "b0.1")]
    steps += [("f1.4", "b0.1", "f1.5", "b0.2")]
    for f, bw, next_f, next_b in steps:
        at = names.index(f"send.{f}")
        assert names[at : at + 4] == [
            f"send.{f}",
            f"recv.{next_f}",
            f"send.{bw}",
            f"recv.{next_b}",
        ]
        by_id = {o.id: o for o in p2p}
        # The next forward's receive waits for the forward's end only, not the
        # backward's (and the next backward's for the backward's).
        assert by_id[f"r{rank}.recv.{next_f}"].deps == by_id[f"r{rank}.send.{f}"].deps
        assert by_id[f"r{rank}.recv.{next_b}"].deps == by_id[f"r{rank}.send.{bw}"].deps
        assert by_id[f"r{rank}.send.{f}"].deps != by_id[f"r{rank}.send.{bw}"].deps
        # The receive from the previous stage and the gradient send to it share that
        # neighbour's FIFO stream (ProcessGroupNCCL::pointToPoint's pair), so the send
        # queues behind the receive.
        assert by_id[f"r{rank}.recv.{next_f}"].stream == "pp.prev"
        assert by_id[f"r{rank}.send.{bw}"].stream == "pp.prev"
    # The last steady step: no forward left to receive for; the first cool-down
    # backward's receive follows the backward's send.
    at = names.index("send.f1.5")
    assert names[at : at + 3] == ["send.f1.5", "send.b0.2", "recv.b1.3"]
    # And the step runs to its end (no deadlock).
    assert run_workload(workload, "dgx-h100", nodes=1)[1].step_s > 0
