"""Combined 1F1B (``moe_a2a_overlap``) with interleaved pipelines: its steps' transfers
run on a stream per direction by default, since ccsim's issue order for a step's
forward and backward on one FIFO stream per neighbour deadlocks where the published runs
(Megatron-Bridge 26.06's DeepSeek-V3 on 256 GB200, PP 4 x VP 4) complete."""

import dataclasses

import pytest

from simulator.workload import run_workload
from simulator.workload.generators import megatron
from simulator.workload.model import MODELS
from simulator.workload.trace import WorkloadError

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


def test_combined_1f1b_interleaved_runs_its_transfers_on_a_stream_each():
    """The default is the explicit "split" streams' step, to the bit, and it ends."""
    assert _step() == _step(p2p_streams="split")


def test_one_fifo_stream_per_neighbour_is_what_deadlocks():
    """Asked for explicitly, one stream per neighbour deadlocks, reported with the op
    and the peer it waits for (why it is not the default here)."""
    with pytest.raises(WorkloadError, match="waits for its peer"):
        _step(p2p_streams="peer")
