"""``ccsim bench``: a fixed set of scenarios, timed.

Each scenario runs in its own Python process so that its peak memory (the process's
maximum resident set) is its own. Reported per scenario: wall time of the simulation
(topology, schedule and replay; not interpreter start-up), peak memory, flows simulated
and flows per wall second. The trace scenario also reports the wall time and size of the
trace written after the run.

For reference (issue 2): the C++ simulator ASTRA-sim's analytical backend needs 17.5 s
(congestion-unaware) and 24.2 s (congestion-aware) for the 1024-rank ring on this class
of machine, and 786 s at 4096 ranks.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..algorithms import build_schedule
from ..collective import NcclPolicy, simulate_collective
from ..collective.run import rank_layout, run_ring, run_schedule
from ..errors import CcsimError, unknown_choice
from ..network.faults import apply_faults
from ..topology import cluster_graph, load_topology, ring_graph
from ..validate import BUNDLED, case_graph, load_case


@dataclass(frozen=True)
class Scenario:
    """One benchmark case: a ring all-reduce on a 1-D ring or a preset."""

    name: str
    description: str
    ranks: int = 0
    preset: str = ""
    nodes: int = 1
    size_bytes: int = 64 * 2**20
    chunks: int = 4
    channels: int = 1

    #: "ring": one ring all-reduce; "validate": a bundled nccl-tests case, every size as
    #: NCCL would run it (what ``ccsim validate`` does); "auto": the tuner's search of
    #: algorithm, channels and chunks at ``sizes``; "trace": NCCL's all-reduce on the
    #: preset, then its Perfetto trace written as ``ccsim collective --trace x.json.gz``
    #: writes it (:func:`write_trace`).
    kind: str = "ring"
    case: str = ""
    sizes: tuple[int, ...] = ()
    #: "workload": the ``megatron`` generator's parameters of a training step replayed
    #: on ``preset`` x ``nodes`` (each collective as the preset's library runs it);
    #: "search": :func:`simulator.search.search`'s arguments (model, global batch, what
    #: to simulate, workers) on ``preset`` x ``nodes``.
    workload: tuple[tuple[str, object], ...] = ()
    #: Wall time the scenario should stay under (the issue's target), or 0 for none.
    target_s: float = 0.0
    #: Peak memory (MiB) the scenario should stay under, or 0 for none.
    target_mib: float = 0.0
    #: The collective's algorithm ("ring" kind) and, instead of a preset, a server shape
    #: joined by ``fabric`` (a ``server`` section of a preset, as data).
    algorithm: str = "ring"
    server: dict | None = None
    fabric: str | None = None
    #: A fault applied to the topology (``--fault``'s inline form), e.g. one slow link;
    #: and "off" to simulate every rank even where the run is symmetric (issue 35's pairs).
    fault: str = ""
    symmetry: str = "auto"
    #: "jobs": two copies of the ``workload`` step placed by ``placement`` on ``preset``
    #: x ``nodes`` joined by the fabric section ``fabric_section`` (key, value pairs),
    #: each run alone and both together (:func:`~simulator.workload.jobs.run_jobs`).
    placement: str = "scattered"
    fabric_section: tuple[tuple[str, object], ...] = ()
    #: How the fabric spreads connections over equal-cost paths (``--routing``; None:
    #: the preset's stack's, per destination on InfiniBand). The scenarios written to
    #: stress ECMP's hashed collisions keep it.
    routing: str | None = None
    #: "published": the published training run ``case`` (an id of
    #: ``simulator/data/training/published-runs.yaml``) built and replayed as ``ccsim
    #: validate --training`` does (:func:`~simulator.validate.training.simulate_run`'s
    #: path), so the row stays the published configuration; its target is CPU seconds.

    def run(self) -> list:
        """The scenario's simulated collectives."""
        if self.kind == "trace":
            graph = load_topology(self.preset, self.nodes)
            return [simulate_collective(graph, "all_reduce", self.size_bytes, "nccl")]
        if self.kind == "validate":
            case = load_case(BUNDLED / f"{self.case}.yaml")
            graph = case_graph(case)
            policy = NcclPolicy(channels=case.settings.get("channels"))
            op = str(case.settings.get("op", "all_reduce"))
            return [policy.simulate(graph, op, float(size)) for size, _, _ in case.measured]
        if self.kind == "auto":
            return [
                simulate_collective(
                    self.preset, "all_reduce", size, "auto", nodes=self.nodes,
                    chunks="auto", channels="auto", protocol="auto",
                )
                for size in self.sizes
            ]  # fmt: skip
        if self.server is not None:
            topology = cluster_graph(self.server, self.nodes, fabric=self.fabric)
        elif self.preset:
            topology = self.preset
        else:
            # 150 GB/s links and 500 ns per hop, as in the 1-D ring case.
            topology = ring_graph(self.ranks, 150e9, 500e-9)
        if self.fault or self.symmetry != "auto" or (self.preset and self.fabric):
            graph = (
                load_topology(topology, self.nodes, fabric=self.fabric, routing=self.routing)
                if self.preset
                else load_topology(topology)
            )
            graph = apply_faults(graph, self.fault or None)
            if self.symmetry != "auto" and self.algorithm == "ring":
                # Every rank simulated, the ring's schedule built only if its flows meet.
                return [
                    run_ring(
                        graph, "all_reduce", self.size_bytes,
                        chunks=self.chunks, channels=self.channels,
                    )
                ]  # fmt: skip
            if self.symmetry != "auto":
                schedule = build_schedule(
                    self.algorithm, "all_reduce", rank_layout(graph), self.size_bytes,
                    chunks=self.chunks, channels=self.channels,
                )  # fmt: skip
                return [run_schedule(graph, schedule, symmetry=self.symmetry)]
            topology = graph
        return [
            simulate_collective(
                topology,
                "all_reduce",
                self.size_bytes,
                self.algorithm,
                nodes=self.nodes if isinstance(topology, str) else None,
                chunks=self.chunks,
                channels=self.channels,
            )
        ]


#: Issue 15's 2-D case (as run beside ASTRA-sim's analytical backend): 8 GPUs on a
#: 300 GB/s NVSwitch, one 25 GB/s NIC each.
TWO_D_SERVER = {
    "gpus": 8,
    "intra": {"kind": "nvswitch", "link": "nvlink", "bandwidth": "300GB/s", "latency": "0.5us"},
    "nic": {"gpus_per_nic": 1, "bandwidth": "25GB/s", "link": "rdma"},
}

#: The "trace" scenario's targets: the trace adds less than the run's own wall time
#: (under 2x in all) and is smaller than this.
TRACE_TARGET_MB = 150.0


#: Issue 34's jobs: the Llama 3 70B step of notebooks/07 at 1,024 GPUs (8 micro-batches
#: a pipeline, as there).
LLAMA3_70B_1024 = (
    ("model", "llama3-70b"),
    ("tp", 8),
    ("pp", 4),
    ("dp", 32),
    ("micro_batch", 1),
    ("global_batch", 256),
    ("sequence_parallel", True),
    ("distributed_optimizer", True),
    ("recompute", "selective"),
    ("flash_attention", True),
)

SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("ring-8", "ring all-reduce 64 MiB, 1-D ring of 8 GPUs, 4 chunks", ranks=8),
        Scenario("ring-64", "ring all-reduce 64 MiB, 1-D ring of 64 GPUs, 4 chunks", ranks=64),
        Scenario("ring-512", "ring all-reduce 64 MiB, 1-D ring of 512 GPUs, 4 chunks", ranks=512),
        Scenario(
            "ring-1024", "ring all-reduce 64 MiB, 1-D ring of 1024 GPUs, 4 chunks", ranks=1024
        ),
        Scenario(
            "ring-4096",
            "ring all-reduce 64 MiB, 1-D ring of 4096 GPUs, 4 chunks (issue 15: < 10 s, 2 GiB)",
            ranks=4096,
            target_s=10.0,
            target_mib=2048.0,
        ),
        Scenario(
            "hier-8x512",
            "hierarchical all-reduce 64 MiB, 512 servers of 8 GPUs (300 GB/s NVSwitch, one "
            "25 GB/s NIC per GPU, one switch): the 2-D case of issue 15 (< 5 s, 500 MB)",
            nodes=512,
            chunks=1,
            algorithm="hierarchical",
            server=TWO_D_SERVER,
            fabric="single-switch",
            target_s=5.0,
            target_mib=500e6 / 2**20,
        ),
        # Issue 35: the same runs without symmetry (one slow link, or symmetry off),
        # each beside its symmetric counterpart above.
        Scenario(
            "ring-1024-nosym",
            "ring-1024 with symmetry off: every rank simulated (issue 35: <= 3 s, 400 MB)",
            ranks=1024,
            symmetry="off",
            target_s=3.0,
            target_mib=400.0,
        ),
        Scenario(
            "ring-1024-slow",
            "ring-1024 with one link at half bandwidth (issue 35: < 20 s, 2 GB)",
            ranks=1024,
            fault="link=gpu5-gpu6:0.5",
            target_s=20.0,
            target_mib=2048.0,
        ),
        Scenario(
            "hier-8x512-slow",
            "hier-8x512 with one NIC link at half bandwidth (issue 35: < 20 s, 1 GB)",
            nodes=512,
            chunks=1,
            algorithm="hierarchical",
            server=TWO_D_SERVER,
            fabric="single-switch",
            fault="link=s3/nic0-switch0:0.5",
            target_s=20.0,
            target_mib=1024.0,
        ),
        Scenario(
            "hier-h100x128-fat-tree",
            "hierarchical all-reduce 64 MiB on 128x dgx-h100 on a fat-tree with ECMP "
            "(issue 35: < 10 s)",
            preset="dgx-h100",
            nodes=128,
            chunks=1,
            algorithm="hierarchical",
            fabric="fat-tree",
            routing="ecmp",
            target_s=10.0,
        ),
        Scenario(
            "hierarchical-16384",
            "hierarchical all-reduce 1 GiB on 2048x dgx-h100 (issue 15: < 60 s, 4 GiB)",
            preset="dgx-h100",
            nodes=2048,
            size_bytes=2**30,
            chunks=1,
            algorithm="hierarchical",
            target_s=60.0,
            target_mib=4096.0,
        ),
        Scenario(
            "hierarchical-131072",
            "hierarchical all-reduce 1 GiB on 16384x dgx-h100 (issue 15: < 10 min, 16 GiB)",
            preset="dgx-h100",
            nodes=16384,
            size_bytes=2**30,
            chunks=1,
            algorithm="hierarchical",
            target_s=600.0,
            target_mib=16384.0,
        ),
        Scenario(
            "dgx-a100x4-nic",
            "ring all-reduce 256 MiB, 4x dgx-a100, 16 channels on 8 NICs "
            "(two channels share each NIC), 4 chunks",
            preset="dgx-a100",
            nodes=4,
            size_bytes=256 * 2**20,
            channels=16,
        ),
        Scenario(
            "validate-h100x8",
            "ccsim validate of the bundled 64-GPU case H100-8N-AR-default-clusterB: 14 sizes, "
            "each as NCCL runs it (target 30 s)",
            kind="validate",
            case="H100-8N-AR-default-clusterB",
            target_s=30.0,
        ),
        Scenario(
            "auto-h100x2",
            "--algo auto --channels auto --chunks auto --proto auto on 2x dgx-h100 at 1 MiB, "
            "64 MiB and 1 GiB (target 10 s)",
            kind="auto",
            preset="dgx-h100",
            nodes=2,
            sizes=(2**20, 2**26, 2**30),
            target_s=10.0,
        ),
        Scenario(
            "trace-1024",
            "NCCL's all-reduce 64 MiB on 128x dgx-a100 (1024 ranks), then its trace as "
            "--trace x.json.gz --trace-detail phases,ranks (target: under "
            f"{TRACE_TARGET_MB:g} MB, and adding less than the run's wall time)",
            kind="trace",
            preset="dgx-a100",
            nodes=128,
        ),
        Scenario(
            "gpt3-a100x1024",
            "Megatron GPT-3 175B step, TP 8 PP 8 DP 16 on 128x dgx-a100, batch 1536, fp16 "
            "gradients (SC'21's run; target 10 s, issue 15)",
            kind="workload",
            preset="dgx-a100",
            nodes=128,
            workload=(
                ("model", "gpt3-175b"),
                ("tp", 8),
                ("pp", 8),
                ("dp", 16),
                ("micro_batch", 1),
                ("global_batch", 1536),
                # fp16 gradients, as Megatron-LM's GPT-3 175B example trains (--fp16),
                # and SC'21's options (full recomputation, nothing overlapped).
                ("grad_reduce", "fp16"),
                ("defaults", "sc21"),
            ),
            target_s=10.0,
        ),
        Scenario(
            "mt-nlg-530b-a100x2520",
            "Megatron 530B step, TP 8 PP 35 DP 9 on 315x dgx-a100, batch 2520, fp16 "
            "gradients (SC'21's Table 1 run; target 60 s, issue 15)",
            kind="workload",
            preset="dgx-a100",
            nodes=315,
            workload=(
                ("model", "mt-nlg-530b"),
                ("tp", 8),
                ("pp", 35),
                ("dp", 9),
                ("micro_batch", 1),
                ("global_batch", 2520),
                ("grad_reduce", "fp16"),
                ("defaults", "sc21"),
            ),
            target_s=60.0,
        ),
        Scenario(
            "llama3-405b-h100x16384",
            "Llama 3 405B step, TP 8 PP 8 DP 256 on 2048x dgx-h100 (16,384 GPUs), seq 8192, "
            "batch 4096, bf16; stages of 15/16x6/15 layers as Meta's (arXiv 2407.21783, "
            "3.3.2), sequence parallel, distributed optimizer (issue 20)",
            kind="workload",
            preset="dgx-h100",
            nodes=2048,
            workload=(
                ("model", "llama3-405b"),
                ("tp", 8),
                ("pp", 8),
                ("dp", 256),
                ("micro_batch", 1),
                ("global_batch", 4096),
                ("first_stage_layers", 15),
                ("last_stage_layers", 15),
                ("sequence_parallel", True),
                ("distributed_optimizer", True),
            ),
        ),
        Scenario(
            "gpt3-fp8-h100x1024",
            "Megatron GPT-3 175B step in fp8, TP 4 PP 8 (6 virtual stages) DP 32 on 128x "
            "dgx-h100, micro-batch 1, batch 1024 (issue 20)",
            kind="workload",
            preset="dgx-h100",
            nodes=128,
            workload=(
                ("model", "gpt3-175b"),
                ("tp", 4),
                ("pp", 8),
                ("dp", 32),
                ("virtual_stages", 6),
                ("micro_batch", 1),
                ("global_batch", 1024),
                ("precision", "fp8"),
                ("sequence_parallel", True),
                ("distributed_optimizer", True),
            ),
        ),
        Scenario(
            "search-llama3-405b-h100x16384",
            "ccsim search llama3-405b on 2048x dgx-h100 (16,384 GPUs), global batch 2048, bf16 and "
            "fp8, CP 1 and 2: the 200 best estimates simulated on 2 workers (issue 31: <= 10 min)",
            kind="search",
            preset="dgx-h100",
            nodes=2048,
            workload=(
                ("model", "llama3-405b"),
                ("global_batch", 2048),
                ("precisions", ("bf16", "fp8")),
                ("context_parallel", (1, 2)),
                ("simulate", 200),
                ("workers", 2),
            ),
            target_s=600.0,
        ),
        # Issue 34: two 1,024-GPU jobs together on one fabric in under a minute.
        *(
            Scenario(
                f"jobs-2x1024-{label}",
                "two Llama 3 70B jobs of 1,024 GPUs (TP 8 PP 4 DP 32, batch 256, sequence "
                "parallel, distributed optimizer, selective recomputation) placed scattered "
                f"on 256x hgx-b200, {where}; each alone, then both together (issue 34: < 60 s)",
                kind="jobs",
                preset="hgx-b200",
                nodes=256,
                workload=LLAMA3_70B_1024,
                fabric_section=section,
                target_s=60.0,
            )
            for label, where, section in (
                ("rail", "rail-optimized fabric", (("type", "rail-optimized"),)),
                (
                    "leaf-spine",
                    "2:1 leaf-spine (ECMP)",
                    (("type", "leaf-spine"), ("oversubscription", 2), ("routing", "ecmp")),
                ),
            )
        ),
    )
}

#: Issue 31's published training steps, each to be simulated in <= 10 s of CPU and
#: <= 2 GiB: (a) Llama 3 405B pre-training on 16,384 GPUs (arXiv 2407.21783, table 4),
#: (b) the Megatron-LM README's 314B row on 3,072 GPUs (PP 8), (c) MLPerf Training v3.1's
#: GPT-3 175B in fp8 at TP 4 (PP 8, 12 virtual stages), (d) Llama 3 405B's long-context
#: stage, CP 16 at 131,072 tokens.
PUBLISHED_STEPS = (
    ("llama3-405b-16k", "llama3-paper-405b-h100-bf16-16384-seq8192"),
    ("gpt-314b-3072", "megatron-lm-readme-gpt-314b-h100-bf16-3072"),
    ("gpt3-fp8-tp4-512", "mlperf-v3.1-gpt3-175b-h100-fp8-512"),
    ("llama3-405b-cp16", "llama3-paper-405b-h100-bf16-16384-seq131072"),
    # Megatron-FSDP on 128 GB200 NVL72 GPUs: 13 of its 126 layers replayed, the rest
    # added as each pass's checked period (simulator.workload.layers), and a 64-rank,
    # 62-channel DP all-gather timed alone on its binding links (250,000 transfers).
    ("llama31-405b-fsdp-gb200", "bridge-25.09-llama31-405b-gb200-fp8-128"),
    # Megatron-Bridge's Llama 3.1 405B on 1,024 H100 (PP 8 x VP 8, 192 micro-batches):
    # uneven stages, a steady state periodic only after a transient of ~136 steady steps.
    ("llama31-405b-h100-1024", "bridge-26.04.01-llama31-405b-h100-fp8-1024"),
    # DGX Cloud's Llama 3.1 405B on 512 GB200 (8 NVL72 racks of 64): each pipeline
    # stage fills a rack with its 8 data-parallel replicas side by side, one of which
    # stands for all by moving GPUs inside the racks (simulator.workload.replicas).
    ("llama31-405b-gb200-512", "dgxc-v25.05.04-llama31-405b-gb200-fp8-512"),
    # MLPerf v5.1's Llama 3.1 8B on 512 GB200 (TP 2, CP 4, DP 64, PP 1): no pipeline to
    # shorten; its four 256-rank, 32-channel data-parallel rings (261,120 transfers each)
    # are timed alone in the scalar replay, cluster by cluster
    # (simulator.collective.scalar_replay).
    ("llama31-8b-gb200-512", "mlperf-v5.1-llama31-8b-gb200-fp8-512"),
)

SCENARIOS.update(
    (
        f"pub-{name}",
        Scenario(
            f"pub-{name}",
            f"the published training step {case}, built and replayed as ccsim validate "
            "--training does (issue 31: <= 10 s, 2 GiB; CPU seconds)",
            kind="published",
            case=case,
            target_s=10.0,
            target_mib=2048.0,
        ),
    )
    for name, case in PUBLISHED_STEPS
)

QUICK = ("ring-8", "ring-64", "dgx-a100x4-nic")


def write_trace(result, preset: str, nodes: int) -> dict:
    """Write ``result``'s trace as ``ccsim collective --trace x.json.gz`` does (default
    detail, through the same writer) into a temporary folder; its wall time and size."""
    from ..viz.outputs import write_collective_outputs
    from ..viz.perfetto import DEFAULT_DETAIL

    graph = load_topology(preset, nodes)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json.gz"
        start = time.perf_counter()
        write_collective_outputs(
            result, graph, rows=[], table="", trace=str(path), trace_detail=DEFAULT_DETAIL
        )
        wall = time.perf_counter() - start
        return {"trace_s": wall, "trace_MB": path.stat().st_size / 1e6}


def run_workload_scenario(scenario: Scenario) -> dict:
    """Generate and replay a scenario's training step; its figures (the simulated time
    is the step's, no busbw)."""
    from ..workload import run_workload
    from ..workload.generators import megatron

    start = time.perf_counter()
    # One data-parallel replica stands for all where the run is symmetric (else the
    # replay builds every replica: simulator.workload.replicas).
    step = megatron(**dict(scenario.workload), replicas=True, shadows=True)
    run, result = run_workload(step, scenario.preset, nodes=scenario.nodes)
    wall = time.perf_counter() - start
    flows = run.stats.represented_flows
    return {
        "scenario": scenario.name,
        "ranks": step.ranks,
        "flows": flows,
        "simulated_flows": run.stats.flows,
        "sim_time_us": result.step_s * 1e6,
        "busbw_GBps": float("nan"),
        "wall_s": wall,
        "peak_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "flows_per_s": flows / wall,
        "target_s": scenario.target_s or None,
        "ops": len(run.workload.ops),
        # Replicas the step has, and how many were simulated (1: one stood for all).
        "replicas": run.replicas.get("count", 1),
        "replicas_simulated": run.replicas.get("simulated", "all"),
        # TP ranks per group, and those simulated (1: its master stood for the group).
        "tp_ranks": run.shadows.get("count", 1),
        "tp_simulated": run.shadows.get("simulated", "all"),
        # Calls replayed from their timing alone, distinct calls timed, replays run
        # (simulator.workload.isolated).
        **{
            f"isolated_{key}": value
            for key, value in run.isolated.items()
            if key not in ("flow_by_flow", "no_take_over")
        },
        "flow_by_flow_groups": len(run.isolated.get("flow_by_flow", [])),
        "no_take_over_groups": len(run.isolated.get("no_take_over", [])),
    }


def run_published_scenario(scenario: Scenario) -> dict:
    """Build and replay a published training run's step as ``ccsim validate --training``
    does (the run's generator options and topology); its figures, with the CPU seconds
    (this process's, from the step's generation to the end of its replay) that its target
    is on. Reading the runs' data file is not counted."""
    from ..validate.training import load_runs, replay_run, run_topology

    runs, skipped = load_runs()
    run = next((run for run in runs if run.id == scenario.case), None)
    if run is None:
        why = dict(skipped).get(scenario.case, "no such id")
        raise CcsimError(f"bench scenario {scenario.name}: published run {scenario.case}: {why}")
    start, cpu = time.perf_counter(), time.process_time()
    topology, nodes = run_topology(run)
    # The validated step itself: a shorter step's steady state stands for the identical
    # micro-batches where it is checked periodic (simulator.workload.steady), with the
    # row's NCCL settings, amax waits and SMs held (simulator.validate.training).
    steady = replay_run(run, topology, nodes)
    step, replay = steady.workload, steady.run
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - start
    flows = replay.stats.represented_flows
    return {
        "scenario": scenario.name,
        "ranks": step.ranks,
        "flows": flows,
        "simulated_flows": replay.stats.flows,
        "sim_time_us": steady.step_s * 1e6,
        "busbw_GBps": float("nan"),
        "wall_s": wall,
        "cpu_s": cpu,
        # Micro-batches a replica, and those replayed (the rest: steady periods added).
        "micro_batches": steady.micro_batches,
        "micro_batches_simulated": steady.simulated,
        "peak_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "flows_per_s": flows / wall,
        "target_s": scenario.target_s or None,
        "target_mib": scenario.target_mib or None,
        "target_on": "cpu",
        "configuration": run.label,
        "ops": len(replay.workload.ops),
        "replicas": replay.replicas.get("count", 1),
        "replicas_simulated": replay.replicas.get("simulated", "all"),
        "tp_ranks": replay.shadows.get("count", 1),
        "tp_simulated": replay.shadows.get("simulated", "all"),
        "attempts": replay.isolated.get("attempts", 1),
    }


def run_search_scenario(scenario: Scenario) -> dict:
    """Run a scenario's search; its wall and CPU time (this process and its workers'),
    the candidates simulated, and the best one's step as the simulated time."""
    from ..search import search

    options = dict(scenario.workload)
    model = str(options.pop("model"))
    start = time.perf_counter()
    found = search(model, scenario.preset, nodes=scenario.nodes, progress=False, **options)
    wall = time.perf_counter() - start
    me = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    simulated = [row for row in found.rows if row["status"] == "ok"]
    best = simulated[0] if simulated else None
    return {
        "scenario": scenario.name,
        "ranks": best["ranks"] if best else 0,
        "flows": float("nan"),
        "simulated_flows": float("nan"),
        "sim_time_us": best["step_s"] * 1e6 if best else float("nan"),
        "busbw_GBps": float("nan"),
        "wall_s": wall,
        "peak_MiB": max(me.ru_maxrss, workers.ru_maxrss) / 1024,
        "flows_per_s": float("nan"),
        "target_s": scenario.target_s or None,
        "candidates": len(found.rows),
        "candidates_ok": len(simulated),
        "cpu_s": me.ru_utime + me.ru_stime + workers.ru_utime + workers.ru_stime,
        "best": best["label"] if best else "",
    }


def run_jobs_scenario(scenario: Scenario) -> dict:
    """Generate a scenario's training step, place two copies of it on the cluster and run
    each alone and both together (issue 34's speed target); the simulated time is the
    slower job's step together."""
    from ..workload.generators import megatron
    from ..workload.jobs import Job, run_jobs

    start = time.perf_counter()
    # One replica and one rank per TP group stand for the rest where the replay checks
    # that they may, as `ccsim jobs` builds a spec (every rank is built where not).
    step = megatron(**dict(scenario.workload), replicas=True, shadows=True)
    fabric = dict(scenario.fabric_section) or scenario.fabric
    graph = load_topology(scenario.preset, scenario.nodes, fabric=fabric, routing=scenario.routing)
    jobs = [Job(name, step, scenario.placement) for name in ("A", "B")]
    result = run_jobs(jobs, graph)
    wall = time.perf_counter() - start
    runs = [*result.alone, result.together]
    flows = sum(run.stats.represented_flows for run in runs)
    return {
        "scenario": scenario.name,
        "ranks": sum(len(job.gpus) for job in result.jobs),
        "flows": flows,
        "simulated_flows": sum(run.stats.flows for run in runs),
        "sim_time_us": max(job.step_together_s for job in result.jobs) * 1e6,
        "busbw_GBps": float("nan"),
        "wall_s": wall,
        "peak_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "flows_per_s": flows / wall,
        "target_s": scenario.target_s or None,
        "slowdown": max(job.slowdown for job in result.jobs),
        "shared_links": len(result.shared),
        # What the run together simulated: one replica / one TP rank for all, or "all".
        "replicas_simulated": result.together.replicas.get("simulated", "all"),
        "tp_simulated": result.together.shadows.get("simulated", "all"),
    }


def run_scenario(name: str) -> dict:
    """Run one scenario in this process and measure it."""
    scenario = SCENARIOS[name]
    if scenario.kind == "workload":
        return run_workload_scenario(scenario)
    if scenario.kind == "search":
        return run_search_scenario(scenario)
    if scenario.kind == "jobs":
        return run_jobs_scenario(scenario)
    if scenario.kind == "published":
        return run_published_scenario(scenario)
    start = time.perf_counter()
    results = scenario.run()
    wall = time.perf_counter() - start
    last = results[-1]  # several runs: the largest size's figures
    trace = write_trace(last, scenario.preset, scenario.nodes) if scenario.kind == "trace" else {}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    # Flows the runs stand for, and those simulated (fewer where symmetric ranks were
    # simulated once, see simulator.collective.symmetry).
    flows = int(sum(result.stats.represented_flows for result in results))
    simulated = sum(result.stats.flows for result in results)
    return {
        "scenario": name,
        "ranks": last.ranks,
        "flows": flows,
        "simulated_flows": simulated,
        "sim_time_us": last.time_us,
        "busbw_GBps": last.busbw_GBps,
        "wall_s": wall,
        "peak_MiB": peak_kib / 1024,
        "flows_per_s": flows / wall,
        "target_s": scenario.target_s or None,
        "target_mib": scenario.target_mib or None,
        **trace,
    }


def run_bench(names: list[str]) -> list[dict]:
    """Run each scenario in a fresh process; return one row per scenario."""
    rows = []
    for name in names:
        if name not in SCENARIOS:
            raise unknown_choice("bench scenario", name, SCENARIOS)
        done = subprocess.run(
            [sys.executable, "-m", "simulator.cli.bench", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise CcsimError(f"bench scenario {name} failed: {done.stderr.strip()[-500:]}")
        rows.append(json.loads(done.stdout))
    return rows


def bench_table(rows: list[dict]) -> str:
    """Human-readable table of bench rows (a training step has no busbw: ``-``)."""
    lines = [
        f"{'scenario':<22} {'ranks':>6} {'flows':>12} {'simulated':>10} {'sim time':>12} "
        f"{'busbw':>8} {'wall':>8} {'peak mem':>9} {'flows/s':>11}  target",
        f"{'':<22} {'':>6} {'':>12} {'':>10} {'(us)':>12} {'(GB/s)':>8} {'(s)':>8} "
        f"{'(MiB)':>9} {'':>11}",
    ]
    for row in rows:
        busbw = row["busbw_GBps"]
        busbw_text = "-" if busbw is None or busbw != busbw else f"{busbw:.2f}"  # NaN
        if "candidates" in row:  # a search: candidates and CPU instead of flows
            lines.append(
                f"{row['scenario']:<22} {row['ranks']:>6} "
                f"{str(row['candidates']) + ' cand.':>12} {'-':>10} "
                f"{row['sim_time_us']:>12.2f} {busbw_text:>8} {row['wall_s']:>8.2f} "
                f"{row['peak_MiB']:>9.0f} {'-':>11}  {_target(row)}; CPU {row['cpu_s']:.0f} s"
            )
            continue
        lines.append(
            f"{row['scenario']:<22} {row['ranks']:>6} {round(row['flows']):>12} "
            f"{round(row.get('simulated_flows', row['flows'])):>10} "
            f"{row['sim_time_us']:>12.2f} {busbw_text:>8} {row['wall_s']:>8.2f} "
            f"{row['peak_MiB']:>9.0f} {row['flows_per_s']:>11.0f}  {_target(row)}"
        )
    return "\n".join(lines) + "\n"


def _target(row: dict) -> str:
    if "trace_s" in row:
        met = row["trace_s"] <= row["wall_s"] and row["trace_MB"] <= TRACE_TARGET_MB
        return (
            f"{'met' if met else 'MISSED'} (trace {row['trace_MB']:.0f} MB in "
            f"{row['trace_s']:.1f} s: < {TRACE_TARGET_MB:g} MB, < the run's wall)"
        )
    target, memory = row.get("target_s"), row.get("target_mib")
    if not target:
        return ""
    on_cpu = row.get("target_on") == "cpu"
    seconds = row["cpu_s"] if on_cpu else row["wall_s"]
    met = seconds <= target and (not memory or row["peak_MiB"] <= memory)
    limit = f"< {target:g} s{' CPU' if on_cpu else ''}" + (
        f", < {memory:.0f} MiB" if memory else ""
    )
    if on_cpu:
        return f"{'met' if met else 'MISSED'} ({limit}; CPU {seconds:.1f} s)"
    return f"{'met' if met else 'MISSED'} ({limit})"


if __name__ == "__main__":  # one scenario per process, see run_bench
    print(json.dumps(run_scenario(sys.argv[1])))
