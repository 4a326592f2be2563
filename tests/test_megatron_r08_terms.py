"""Two terms read from how Megatron-LM's own H100 table ran (Megatron-Core r0.8.0, its
defaults): attention dropout inside the fused attention kernel, and the data-parallel
wrapper's passes over its gradient buffer. Each against a figure worked out by hand
from its source: Transformer Engine's measured kernel times, Megatron-Core's code."""

import pytest

from simulator.errors import CcsimError
from simulator.validate.training import generator_options, load_runs
from simulator.workload import load_workload, run_workload
from simulator.workload.devices import DEVICES
from simulator.workload.generators import megatron
from simulator.workload.kernels import Attention, attention_time
from simulator.workload.trace import WorkloadError


def _step(**options) -> float:
    base = dict(tp=1, pp=1, dp=1, global_batch=1)
    return run_workload(megatron("llama3-8b", **{**base, **options}), "dgx-h100", nodes=1)[1].step_s


@pytest.mark.parametrize(
    ("backend", "forward", "backward", "measured"),
    [
        # Shah et al. 2024 (figures 5, 6) at 8k as in test_generators: cuDNN and FA2.
        ("cudnn", 529e12, 518e12 * 529 / 600, 0.614 / 0.594),
        ("flash2", 333e12, 318e12 * 333 / 370, 0.728 / 0.695),
    ],
)
def test_attention_dropout_slows_each_kernel_by_the_measured_ratio(
    backend, forward, backward, measured
):
    """On one H100 (every kernel on one stream) attention dropout lengthens the step by
    the attention's time times the measured slowdown less one: TE issue #3312, H200 sbhd
    cuDNN fwd+bwd 0.594 ms at dropout 0 and 0.614 ms at 0.1; TE PR #3313, FA2 2.7.4
    0.695 and 0.728 ms. Llama 3 8B: 32 layers of 32 heads of 128 over 8,192 tokens."""
    plain = _step(attention_backend=backend)
    dropped = _step(attention_backend=backend, attention_dropout=True)
    s, heads, d, layers = 8192, 32, 128, 32
    fwd = 2 * s * s * d * heads  # causal: half of 4 s^2 d per head
    attention = layers * (fwd / forward + 2.5 * fwd / backward)
    assert dropped - plain == pytest.approx(attention * (measured - 1), rel=1e-9)
    assert plain == _step(attention_backend=backend, attention_dropout=False)


def test_attention_dropout_is_not_applied_where_it_was_not_measured():
    """A100 has no measured slowdown: its kernels take the same time either way."""
    a100 = DEVICES["A100"]
    kernel = Attention(8, 4096, 4096, 128)
    assert attention_time(a100, Attention(8, 4096, 4096, 128, dropout=1)) == attention_time(
        a100, kernel
    )


def test_attention_dropout_round_trips_through_a_trace(tmp_path):
    """The generated trace marks the kernels (backend then dropout: an 8th entry, 1) and
    loads back; a dropout other than 0 or 1 is refused with the field's usage."""
    from simulator.cli import main

    out = tmp_path / "dropout.json"
    argv = ["generate", "megatron", "--model", "llama3-8b", "--tp", "1", "--pp", "1"]
    argv += ["--dp", "1", "--global-batch", "1", "--attention-dropout", "--out", str(out)]
    assert main(argv) == 0
    kernels = [k for op in load_workload(out).ops for k in op.attention]
    assert len(kernels) == 2 and all(k.as_list()[6:] == [0, 1] for k in kernels)
    bad = {
        "format": "ccsim-workload/1",
        "ranks": 1,
        "ops": [
            {"id": "a", "rank": 0, "kind": "compute", "attention": [[1, 8, 8, 64, 1, 0, 0, 2]]}
        ],
    }
    with pytest.raises(WorkloadError, match=r"and dropout \(0 or 1\)"):
        load_workload(bad)


def _dp2(**options):
    base = dict(tp=1, pp=1, dp=2, global_batch=4, distributed_optimizer=True)
    return megatron("llama3-8b", **{**base, **options})


def test_grad_buffer_passes_move_what_each_bucket_reduces():
    """Conservation, from Megatron-Core r0.8.0's Bucket.start_grad_sync: the NaN check's
    norm reads the bucket's gradients once and the 1/dp scaling reads and writes them, so
    each bucket's passes move 3 times the bytes its reduce-scatter is given (fp32 and bf16
    buffers alike), and the reduce waits for them; zeroing the buffer writes every reduced
    gradient once more, in the optimizer's op."""
    for grad_reduce in ("fp32", "bf16"):
        plain = _dp2(grad_reduce=grad_reduce, overlap_grad_reduce=True)
        work = _dp2(
            grad_reduce=grad_reduce,
            overlap_grad_reduce=True,
            grad_buffer_passes=("zero", "nan_check", "scale"),
        )
        ops = {op.id: op for op in work.ops if op.rank == 0}
        reduces = [op for op in ops.values() if op.label == "DP gradients"]
        assert len(reduces) > 1  # bucket by bucket
        for reduce in reduces:
            (passes,) = [work.ops[i] for i in reduce.deps if work.ops[i].id.endswith(".passes")]
            assert passes.stream == "compute"
            assert passes.mem_bytes == pytest.approx(3 * reduce.nbytes, rel=1e-12)
        before = next(op for op in plain.ops if op.rank == 0 and op.label == "optimizer")
        after = ops["r0.opt"]
        reduced = sum(op.nbytes for op in reduces)
        assert after.mem_bytes - before.mem_bytes == pytest.approx(reduced, rel=1e-12)


def test_grad_buffer_passes_wait_for_the_gradients_not_the_tp_collectives():
    """The passes run from the backward hooks once a bucket's gradients are made: on the
    compute stream after the pass's kernels, not after its overlapped TP collectives
    (waiting for those would hold the next layers' backward)."""
    work = _dp2(
        tp=2,
        sequence_parallel=True,
        tp_comm_overlap=True,
        overlap_grad_reduce=True,
        grad_buffer_passes=("nan_check", "scale"),
    )
    passes = [op for op in work.ops if op.rank == 0 and op.id.endswith(".passes")]
    assert len(passes) > 1
    for op in passes:
        assert all(work.ops[i].stream == "compute" for i in op.deps)


def test_grad_buffer_passes_default_off_and_checked():
    """None by default (the same ops as before); an unknown pass names the valid ones,
    and FSDP, which keeps its own buffers, refuses them."""
    plain = _dp2()
    explicit = _dp2(grad_buffer_passes=())
    assert [op.id for op in plain.ops] == [op.id for op in explicit.ops]
    assert not any(op.id.endswith(".passes") for op in plain.ops)
    with pytest.raises(CcsimError, match="valid choices: nan_check, scale, zero"):
        _dp2(grad_buffer_passes=("zeros",))
    with pytest.raises(CcsimError, match="fsdp keeps its own"):
        megatron("llama3-8b", tp=1, pp=1, dp=2, fsdp=True, grad_buffer_passes=("zero",))


def test_megatron_lm_rows_take_attention_dropout_and_llama_recipes_do_not():
    """Megatron-LM's table (Megatron-Core r0.8.0 defaults: dropout 0.1) runs attention
    dropout; a Megatron-Bridge Llama recipe (dropout 0) does not. The DDP's passes are
    turned on for no source yet (GRAD_BUFFER_PASSES_BY_SOURCE says why)."""
    runs = {run.id: run for run in load_runs()[0]}
    mlm = generator_options(runs["megatron-lm-readme-gpt-1.7b-h100-bf16-48"])
    assert mlm["attention_dropout"] is True
    bridge = generator_options(runs["bridge-25.09-llama3-8b-h100-fp8-8"])
    assert "attention_dropout" not in bridge
    assert not any("grad_buffer_passes" in generator_options(run) for run in runs.values())
