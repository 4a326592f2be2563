"""Published runs on GB200 NVL72 racks (issue 31): each run's GPUs placed on racks as
NVIDIA's launcher asks Slurm for them, Megatron's groups where its rank order puts them,
and the recipes' settings a GB200 run needs (activation offload, Megatron-FSDP)."""

import pytest

from simulator.topology.graph import gpu_nodes, servers_of_ranks
from simulator.validate.training import generator_options, load_runs, nvl72_racks, run_topology
from simulator.workload.generators import megatron, megatron_step_memory

RUNS, _ = load_runs()
BY_ID = {run.id: run for run in RUNS}


@pytest.mark.parametrize(
    ("gpus", "placed"),
    [
        (8, (1, 8)),  # 2 trays: one rack
        (64, (1, 64)),  # 16 trays
        (72, (1, 72)),  # the whole rack: 18 trays
        (128, (2, 64)),  # 32 trays: 16 | 32, not 18
        (512, (8, 64)),  # 128 trays
        (144, (2, 72)),  # 36 trays: 18 | 36
        (96, (2, 48)),  # 24 trays: the largest divisor <= 18 is 12
    ],
)
def test_racks_hold_the_largest_segment_of_trays_that_divides_the_job(gpus, placed):
    """dgxc-benchmarking's llmb-run (_compute_segment_size): the greatest divisor of the
    job's 4-GPU trays that fits one rack's 18, worked out by hand."""
    assert nvl72_racks(gpus) == placed


def test_every_bundled_gb200_dense_run_is_built():
    """The data file's 55 dense GB200 pretraining runs in bf16 or fp8 (9 bf16, 46 fp8:
    37, then 9 MLPerf v5.0/v5.1 Llama 3.1 rows) build; none is skipped for want of a
    preset."""
    gb200 = [run for run in RUNS if run.gpu == "GB200" and not run.model.is_moe]
    assert len(gb200) == 55
    assert sum(run.id.startswith("mlperf-v5") for run in gb200) == 9
    assert sum(run.precision == "bf16" for run in gb200) == 9


def test_a_gb200_run_keeps_tp_and_dp_groups_inside_one_nvlink_domain():
    """Nemotron-4 340B on 128 GB200 (TP 8, PP 4, DP 4): two racks of 64 GPUs; Megatron's
    rank order (TP fastest, then DP, then PP) makes a stage 32 consecutive ranks, so
    stages 0-1 fill rack 0 and 2-3 rack 1: every TP and DP group is inside one NVLink
    domain and only the pipeline's sends between stages 1 and 2 cross racks."""
    run = BY_ID["dgxc-v25.05.04-nemotron4-340b-gb200-bf16-128"]
    graph, nodes = run_topology(run)
    assert nodes is None and len(gpu_nodes(graph)) == 128
    servers = servers_of_ranks(graph)
    assert servers == [0] * 64 + [1] * 64
    options = {**generator_options(run), "replicas": False, "shadows": False}
    step = megatron(**options)
    kinds = {}
    for group in step.groups.values():
        racks = {servers[rank] for rank in group.ranks}
        kinds.setdefault(group.kind, set()).add(len(racks))
    assert kinds["TP"] == {1}
    assert kinds["DP"] == {1}


def test_activation_offload_takes_those_layers_off_the_gpu():
    """Megatron-Bridge's Llama 3 70B GB200 recipe (TP 1, Megatron-FSDP over 64, micro-batch
    2) offloads 40 of the 80 layers' activations to the Grace CPU: without pipelining one
    micro-batch is in flight, so the GPU keeps 40 layers' activations where it kept 80;
    Transformer Engine up to 2.9 (Megatron-Bridge 25.11) still holds the last offloaded
    layer while the last layer runs: 41."""
    newer = generator_options(BY_ID["bridge-26.04-llama3-70b-gb200-fp8-64"])
    newer = {k: v for k, v in newer.items() if k not in ("replicas", "shadows")}
    kept = megatron_step_memory(**newer)
    full = megatron_step_memory(**{**newer, "activation_offload_layers": 0})
    assert kept.activations == pytest.approx(full.activations * 40 / 80)
    run = BY_ID["bridge-25.11-llama3-70b-gb200-fp8-64"]
    options = generator_options(run)
    assert options["activation_offload_layers"] == 40
    assert options["fsdp"] is True
    assert "overlap_grad_reduce" not in options  # Megatron-FSDP overlaps its own
    options = {k: v for k, v in options.items() if k not in ("replicas", "shadows")}
    kept = megatron_step_memory(**options)
    full = megatron_step_memory(**{**options, "activation_offload_layers": 0})
    assert kept.activations == pytest.approx(full.activations * 41 / 80)
    assert kept.weights == full.weights
