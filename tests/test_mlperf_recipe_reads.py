"""Settings of MLPerf rows read from their submissions' configs (issue 31, session
2026-11-27): the v4.1 GPT-3 runs fuse the loss, and Cisco's v5.1 Llama 3.1 8B runs bucket
gradients by 64 parameters. The rows are held-out; these were read because the rows were
off, so they no longer check what changed for them."""

from simulator.validate.training import generator_options, load_runs
from simulator.workload.generators import megatron

RUNS = {run.id: run for run in load_runs()[0]}


def test_gpt3_v41_fuses_the_loss_and_v40_does_not():
    """v4.1's conf/custom.yaml line 98 sets cross_entropy_loss_fusion to
    CROSS_ENTROPY_LOSS_FUSION, default True, and no config sets the variable; v4.0's
    custom.yaml has no such key (Megatron-Core's default: unfused)."""
    v41 = [r for r in RUNS if r.startswith("mlperf-v4.1-gpt3-")]
    v40 = [r for r in RUNS if r.startswith("mlperf-v4.0-gpt3-")]
    assert len(v41) == 3 and len(v40) == 3
    assert all(generator_options(RUNS[r]).get("cross_entropy") == "fused" for r in v41)
    assert all(generator_options(RUNS[r]).get("cross_entropy") is None for r in v40)


def test_cisco_8b_buckets_64_parameters():
    """Cisco's custom.yaml line 157 defaults optim.bucket_size to 64 parameters (no Cisco
    config sets BUCKET_SIZE): Megatron closes a bucket at every weight. ccsim buckets whole
    layers, so it builds one reduce-scatter a layer (Llama 3.1 8B: 32), as many as
    Megatron-Core's default max(40M, 1M x 64) = 64M gives with 218M-parameter layers."""
    for rid in ("mlperf-v5.1-llama31-8b-h100-fp8-64", "mlperf-v5.1-llama31-8b-h100-fp8-128"):
        assert generator_options(RUNS[rid])["bucket_size"] == 64

    def reduce_scatters(bucket_size):
        workload = megatron(
            "llama3-8b",
            tp=1,
            pp=1,
            dp=64,
            global_batch=64,
            precision="fp8",
            grad_reduce="bf16",
            fp8_param_gather=True,
            replicas=True,
            shadows=True,
            bucket_size=bucket_size,
        )
        return [
            op
            for op in workload.ops
            if op.rank == 0 and op.kind == "collective" and op.op == "reduce_scatter"
        ]

    assert len(reduce_scatters(64)) == len(reduce_scatters(None)) == 32
