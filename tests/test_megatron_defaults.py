"""Megatron-Core's defaults (issue 31): what a step runs with when only the model, the GPUs
and TP/PP/DP are given, and the parameter all-gather overlapped with the first forward."""

import pytest

from simulator.errors import CcsimError
from simulator.topology import ring_graph
from simulator.workload import run_workload
from simulator.workload.generators import BF16, megatron, megatron_options
from simulator.workload.model import Transformer

SMALL = Transformer(layers=8, hidden=1024, seq=512, vocab=0, heads=8)


@pytest.mark.parametrize(
    ("tp", "dp", "expected"),
    [
        # (sequence_parallel, distributed_optimizer, overlap_grad_reduce,
        #  overlap_param_gather, tp_comm_overlap)
        (1, 1, (False, False, False, False, False)),
        (8, 1, (True, False, False, False, True)),
        (1, 4, (False, True, True, True, False)),
        (4, 4, (True, True, True, True, True)),
    ],
)
def test_megatron_core_defaults_follow_the_configuration(tp, dp, expected):
    """Sequence parallelism and TP overlap wherever TP > 1, the distributed optimizer and
    both DP overlaps wherever the weights have replicas; no recomputation and flash
    attention always."""
    o = megatron_options("megatron-core", {}, tp=tp, dp=dp)
    names = ("sequence_parallel", "distributed_optimizer", "overlap_grad_reduce",
             "overlap_param_gather", "tp_comm_overlap")  # fmt: skip
    assert tuple(o[name] for name in names) == expected
    assert o["recompute"] == "none" and o["flash_attention"] is True


def test_given_options_win_and_sc21_keeps_the_2021_behaviour():
    o = megatron_options("megatron-core", {"sequence_parallel": False}, tp=8, dp=4)
    assert o["sequence_parallel"] is False and o["tp_comm_overlap"] is False  # needs SP
    old = megatron_options("sc21", {}, tp=8, dp=4)
    assert old["recompute"] == "full" and not any(
        old[k]
        for k in ("sequence_parallel", "distributed_optimizer", "flash_attention",
                  "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap")
    )  # fmt: skip
    with pytest.raises(CcsimError, match="defaults"):
        megatron(SMALL, tp=1, pp=1, dp=1, global_batch=1, defaults="newest")


def test_fsdp_and_moe_get_what_they_can_run():
    """FSDP shards the optimizer itself (no distributed optimizer, no bucketed
    reduce); mixture-of-experts models overlap it as dense ones do (Megatron-Core's
    expert gradients have buckets of their own in the same DDP wrapper)."""
    fsdp = megatron_options("megatron-core", {}, tp=1, dp=4, fsdp=True)
    assert not fsdp["distributed_optimizer"] and not fsdp["overlap_grad_reduce"]
    moe = megatron_options("megatron-core", {}, tp=2, dp=4, moe=True)
    assert moe["sequence_parallel"] and moe["overlap_grad_reduce"]


def test_parameters_are_gathered_bucket_by_bucket_before_the_first_forward():
    """With the distributed optimizer and overlap_param_gather, each chunk's updated
    parameters are all-gathered at the step's start, one call per gradient bucket (here
    a layer of 12 h^2 = 12.6 M parameters: 4 layers per 40 M-parameter bucket, 2
    buckets), and the first forward runs bucket by bucket, each waiting for its gather;
    the gathers carry the stage's bf16 parameters once, and none follows the optimizer."""
    step = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4)
    ops = [op for op in step.ops if op.rank == 0]
    gathers = [op for op in ops if op.label == "DP parameters"]
    assert [op.op for op in gathers] == ["all_gather", "all_gather"]
    assert all(not op.deps for op in gathers)
    assert sum(op.nbytes for op in gathers) == SMALL.layers * SMALL.layer_params * BF16
    first = [op for op in ops if op.id.startswith("r0.f0.bucket") and op.kind == "compute"]
    first = [op for op in first if not op.id.endswith("elementwise")]
    assert len(first) == 2
    for forward, gather in zip(first, gathers, strict=True):
        assert gather.index in forward.deps
    optimizer = next(op for op in ops if op.label == "optimizer")
    assert all(op.index < optimizer.index for op in gathers)


def test_an_exposed_parameter_gather_delays_the_first_forward_by_its_time():
    """On a 2-GPU ring of 1 GB/s with no latency, the first forward waits for the first
    bucket's gather: 4 layers' bf16 parameters, of which a 2-rank ring all-gather moves
    half over each link, so it starts at exactly that transfer's time; with the gather
    after the optimizer (overlap_param_gather off) it starts at once."""
    graph = ring_graph(2, 1e9, 0.0)
    for node in graph.nodes:
        graph.nodes[node]["model"] = "A100"

    def first_forward_start(**options):
        step = megatron(SMALL, tp=1, pp=1, dp=2, global_batch=4, **options)
        run, _ = run_workload(step, graph, algorithm="ring")
        name = "r0.f0.bucket0" if options.get("overlap_param_gather", True) else "r0.f0"
        index = next(op.index for op in step.ops if op.id == name)
        return run.records.start_s[index]

    bucket = 4 * SMALL.layer_params * BF16
    assert first_forward_start() == pytest.approx(bucket / 2 / 1e9, rel=1e-9)
    assert first_forward_start(overlap_param_gather=False) == 0.0
