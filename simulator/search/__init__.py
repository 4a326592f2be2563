"""``ccsim search``: which Megatron-LM configuration of a model trains fastest on a cluster.

Given a model, a topology and a global batch, :func:`search` enumerates the tensor,
pipeline and data parallel sizes, micro-batches, recomputation and virtual stages that
Megatron-LM accepts (:mod:`~simulator.search.space`), drops those whose memory per GPU
does not fit the device, ranks the rest with an analytic estimate, and simulates the
best ``simulate`` of them on the topology as NCCL (or the preset's library) runs their
collectives. Simulation runs as a sweep of explicit points
(:func:`~simulator.sweep.run.execute_sweep`): in this process, a local process pool or
on Dask, with a progress bar, and resumable from its results file.

>>> result = search("gpt-1.5b", "dgx-a100", nodes=1, global_batch=16, simulate=0,
...                 micro_batches=[1], recompute=["full"], virtual_stages=[1])
>>> result.considered, result.fitting, result.estimates[0].candidate.label
(4, 4, 'TP1 PP1 DP8 mb1 v1 full DO')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..collective.guards import check_flows, cluster_of
from ..errors import CcsimError
from ..sweep.cost import per_perf
from ..sweep.point import one_line, simulate_workload_point
from ..sweep.run import execute_sweep
from ..sweep.spec import load_spec
from ..topology import load_topology
from ..topology.bom import bill_of_materials
from ..topology.graph import gpu_nodes
from ..topology.summary import inter_bandwidth, intra_bandwidth
from ..workload.collection import collections_paused
from ..workload.devices import graph_device
from ..workload.host import host_op_s_for
from ..workload.model import MODELS
from .space import RECOMPUTE, Candidate, Estimate, Hardware, candidates, estimate

#: What each simulated candidate reports (the results file's metric columns).
SEARCH_METRICS = (
    "ranks",
    "step_s",
    "tflops_per_gpu",
    "mfu",
    "exposed_s",
    "exposed_tp_s",
    "exposed_pp_s",
    "exposed_dp_s",
    "exposed_cp_s",
    "exposed_ep_s",
    "bubble_s",
    "memory_gb",
)

#: The candidate fields that become sweep axes (``workload.<field>``).
_FIELDS = (
    "tp",
    "pp",
    "dp",
    "micro_batch",
    "recompute",
    "virtual_stages",
    "sequence_parallel",
    "distributed_optimizer",
    "precision",
    "cp",
    "ep",
    "fsdp",
    "first_stage_layers",
    "last_stage_layers",
)


#: Keys of a ranked row (:meth:`SearchResult.ranked`), in ``--format json`` and ``csv``.
SEARCH_KEYS = ("rank", "label", *_FIELDS, "estimate_s", "status", "error", *SEARCH_METRICS)
#: Keys a ranked row adds when the search was given unit prices.
COST_KEYS = ("fabric_cost", "cost_x_step")


@dataclass
class SearchResult:
    """What a search found.

    ``considered`` configurations were enumerated, ``fitting`` of them fit in memory;
    ``estimates`` holds those that fit, fastest estimate first; ``rows`` the simulated
    ones, fastest simulated step first (a row per candidate: its label and fields, its
    estimate, the metrics of :data:`SEARCH_METRICS`, ``status`` and ``error``).
    """

    model: str
    topology: str
    nodes: int
    global_batch: int
    considered: int
    fitting: int
    estimates: list[Estimate]
    rows: list[dict[str, Any]] = field(default_factory=list)
    ran: int = 0
    resumed: int = 0
    #: Cost of the cluster's priced items (:mod:`simulator.topology.bom`), when the
    #: search was given prices; None otherwise.
    fabric_cost: float | None = None

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The simulated rows whose simulation was refused or failed (``error`` says
        why)."""
        return [row for row in self.rows if row["status"] != "ok"]

    def ranked(self, top: int | None = None) -> list[dict[str, Any]]:
        """The simulated rows, fastest first, numbered from 1; when nothing was
        simulated, the best estimates (their simulated columns empty)."""
        if self.rows:
            rows = [dict(row) for row in self.rows]
        else:
            rows = [
                {
                    "label": e.candidate.label,
                    **e.candidate.params(),
                    "estimate_s": e.step_s,
                    "status": "",
                    "error": "estimated only",
                    **dict.fromkeys(SEARCH_METRICS),
                    "memory_gb": e.memory.total / 1e9,
                }
                for e in self.estimates
            ]
        rows = rows[:top] if top is not None else rows
        for rank, row in enumerate(rows, 1):
            row["rank"] = rank
            if self.fabric_cost is not None:
                # Cost x seconds per step = cost per (step/s): lower is better value.
                row["fabric_cost"] = self.fabric_cost
                row["cost_x_step"] = per_perf(self.fabric_cost, "step_s", row.get("step_s"))
        return rows


def search(
    model: str,
    topology: str | Path = "dgx-a100",
    *,
    nodes: int = 1,
    global_batch: int,
    simulate: int = 8,
    micro_batches: Iterable[int] = (1, 2, 4, 8),
    recompute: Iterable[str] = RECOMPUTE,
    virtual_stages: Iterable[int] = (1, 2),
    sequence_parallel: bool = True,
    distributed_optimizer: bool = True,
    precisions: Iterable[str] = ("bf16",),
    context_parallel: Iterable[int] = (1,),
    expert_parallel: Iterable[int] | None = None,
    shardings: Iterable[str] = ("optimizer",),
    algorithm: str = "library",
    out: str | Path | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: bool | None = None,
    max_flows: int | None = None,
    prices: Mapping[str, float] | None = None,
) -> SearchResult:
    """Search the Megatron-LM configurations of ``model`` on ``nodes`` servers of
    ``topology`` for ``global_batch`` sequences a step (see the module docstring).

    ``simulate`` is how many of the best estimates to simulate (0: estimate only);
    ``out`` a results CSV that makes the search resumable (candidates already in it are
    not simulated again); ``workers``, ``scheduler`` and ``client`` choose where
    simulations run, as for sweeps; ``max_flows`` is the resource guard's limit
    (:mod:`simulator.collective.guards`), asked before the topology is built; ``prices``
    (item to unit price, :func:`~simulator.topology.bom.bill_of_materials`) add each
    row's ``fabric_cost`` and ``cost_x_step`` (cost x step seconds, the cost per step/s).
    """
    if model not in MODELS:
        raise CcsimError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}")
    recompute = list(recompute)
    bad = [r for r in recompute if r not in RECOMPUTE]
    if bad:
        raise CcsimError(f"unknown recompute {bad[0]!r}; valid: {', '.join(RECOMPUTE)}")
    if global_batch < 1:
        raise CcsimError(f"the global batch must be a positive count, not {global_batch}")
    transformer = MODELS[model]
    shardings = list(shardings)
    if not shardings or any(x not in ("optimizer", "fsdp") for x in shardings):
        raise CcsimError(f"shardings must be optimizer and/or fsdp, not {shardings!r}")
    precisions = list(precisions)
    if any(p not in ("bf16", "fp8") for p in precisions) or not precisions:
        raise CcsimError(f"precisions must be bf16 and/or fp8, not {precisions!r}")
    check_flows(cluster_of(topology, nodes, max_flows=max_flows).estimate(), max_flows)
    graph = load_topology(topology, nodes)
    device = graph_device(graph)
    if device is None:
        raise CcsimError(
            f"topology {topology}: its GPUs name no device ccsim knows (A100, H100, 910B), "
            "so their compute cannot be timed; set the GPUs' 'model'"
        )
    if "fp8" in precisions and not device.fp8_flops:
        raise CcsimError(f"{device.name} has no fp8 tensor cores; search bf16 only on {topology}")
    gpus = len(gpu_nodes(graph))
    per_server = gpus // nodes
    hardware = Hardware(per_server, device, intra_bandwidth(graph), inter_bandwidth(graph))
    every = candidates(
        transformer,
        gpus,
        global_batch,
        gpus_per_server=per_server,
        micro_batches=micro_batches,
        recompute=recompute,
        virtual_stages=virtual_stages,
        sequence_parallel=sequence_parallel,
        distributed_optimizer=distributed_optimizer,
        precisions=precisions,
        context_parallel=context_parallel,
        expert_parallel=expert_parallel,
        shardings=shardings,
    )
    if not every:
        raise CcsimError(
            f"no configuration of {model} on {gpus} GPUs takes a global batch of "
            f"{global_batch}: it must be a multiple of micro-batch x data-parallel size "
            "for some split; try a multiple of the GPU count or more --micro-batches"
        )
    # An MoE layer's host launches at the CPU the GPUs hang off (an x86 DGX or a Grace
    # superchip: workload/host.py, Transformer Engine issue #2053), in the estimate and
    # in every simulated candidate.
    host_op_s = host_op_s_for(device.name)
    estimates = [
        estimate(transformer, c, global_batch, hardware, host_op_s=host_op_s) for c in every
    ]
    fitting = [e for e in estimates if e.memory.fits(device.memory_bytes)]
    if not fitting:
        least = min(estimates, key=lambda e: e.memory.total)
        raise CcsimError(
            f"no configuration of {model} on {gpus} GPUs fits in {device.name}'s "
            f"{device.memory_bytes / 1e9:.1f} GB: the smallest, {least.candidate.label}, "
            f"needs {least.memory.total / 1e9:.1f} GB per GPU; add servers"
            + ("" if "full" in recompute else " or allow full recomputation (--recompute full)")
        )
    fitting.sort(key=lambda e: (e.step_s, e.candidate.label))
    result = SearchResult(
        model, str(topology), nodes, global_batch, len(every), len(fitting), fitting
    )
    if prices is not None:
        result.fabric_cost = bill_of_materials(graph, prices=prices).cost
    chosen = fitting[:simulate]
    if not chosen:
        return result
    spec = {
        "name": f"search-{model}",
        "scenario": {
            "workload": {
                "generator": "megatron",
                "model": model,
                "global_batch": global_batch,
                "host_op_s": host_op_s,
            },
            "topology": str(topology),
            "nodes": nodes,
            "algorithm": algorithm,
        },
        # Candidates of one parallel layout run one after another, so that a worker
        # times their common calls (the data-parallel ones) alone once for all of them
        # (see simulator.sweep.point.PointCache); rows are ranked afterwards.
        "points": [
            {f"workload.{name}": getattr(e.candidate, name) for name in _FIELDS}
            for e in sorted(chosen, key=lambda e: _layout(e.candidate))
        ],
    }
    run = execute_sweep(
        # Each candidate's resource check runs with it (a refusal goes into its row);
        # estimated here too, they would cost a generator run each before any starts.
        load_spec(spec, check_points=False),
        out,
        workers=workers,
        scheduler=scheduler,
        client=client,
        progress=progress,
        point_function=search_point,
        metrics=SEARCH_METRICS,
        # A layout's candidates in one worker: its calls are timed alone once there.
        affinity=_layout_of_point,
    )
    by_label = {e.candidate: e for e in chosen}
    rows = []
    for row in run.rows:
        candidate = Candidate(**{name: row[f"workload.{name}"] for name in _FIELDS})
        est = by_label[candidate]
        rows.append(
            {
                "label": candidate.label,
                **{name: getattr(candidate, name) for name in _FIELDS},
                "estimate_s": est.step_s,
                **{k: row[k] for k in ("status", "error", *SEARCH_METRICS)},
            }
        )
        if rows[-1]["memory_gb"] is None:  # not simulated: the memory model's figure
            rows[-1]["memory_gb"] = est.memory.total / 1e9
    rows.sort(key=lambda r: (r["step_s"] is None, r["step_s"] or 0.0, r["label"]))
    result.rows, result.ran, result.resumed = rows, run.ran, run.resumed
    return result


def _layout_of_point(params: Mapping[str, Any]) -> tuple:
    """What of a candidate's point (its sweep params) sets its communicating groups and
    data-parallel calls (the first part of :func:`_layout`)."""
    workload = params.get("workload") or {}
    return tuple(
        workload.get(name)
        for name in (
            "tp", "cp", "ep", "pp", "dp", "fsdp", "distributed_optimizer",
            "sequence_parallel", "first_stage_layers", "last_stage_layers", "virtual_stages",
        )
    )  # fmt: skip


def _layout(candidate: Candidate) -> tuple:
    """What sets a candidate's communicating groups and their data-parallel calls, then
    the rest: candidates that share it share most of their calls' timings alone."""
    c = candidate
    return (
        c.tp, c.cp, c.ep, c.pp, c.dp, c.fsdp, c.distributed_optimizer,
        c.sequence_parallel, c.first_stage_layers or 0, c.last_stage_layers or 0,
        c.virtual_stages, c.micro_batch, c.precision, c.recompute,
    )  # fmt: skip


def search_point(params: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one candidate (a sweep point's params); the metrics of
    :data:`SEARCH_METRICS`, ``status`` and ``error``."""
    row: dict[str, Any] = {"status": "ok", "error": ""}
    row.update(dict.fromkeys(SEARCH_METRICS))
    try:
        # The collector paused until the candidate's workload (its hundreds of
        # thousands of ops) has been freed, not only while it is simulated
        # (simulate_workload_point pauses it too): the first collection after it is back
        # walks every object made while it was off that still lives, ~0.5 s a 405B
        # candidate when the ops are still there, and they are not garbage.
        with collections_paused():
            row.update(_candidate_metrics(params))
    except Exception as error:
        # A failing candidate is recorded in its row; the search goes on.
        row["status"] = "error"
        row["error"] = one_line(error)
    return row


def _candidate_metrics(params: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`search_point`'s metrics of a candidate that simulates."""
    workload, graph, result = simulate_workload_point(params)
    device = graph_device(graph)
    # Model FLOPs as Megatron-LM counts them (no recomputation, so configurations
    # that recompute are not credited for it; Chowdhery et al., PaLM, appendix B),
    # and MFU against the dense peak of the precision the GEMMs run in.
    per_gpu = workload.model_flops / result.step_s / workload.ranks
    by_kind = result.exposed_by_kind
    return dict(
        ranks=workload.ranks,
        step_s=float(result.step_s),
        tflops_per_gpu=per_gpu / 1e12,
        mfu=per_gpu / device.peak(workload.precision) if device else None,
        exposed_s=float(result.mean("exposed_s")),
        exposed_tp_s=float(by_kind.get("TP", 0.0)),
        exposed_pp_s=float(by_kind.get("PP", 0.0)),
        exposed_dp_s=float(by_kind.get("DP", 0.0)),
        exposed_cp_s=float(by_kind.get("CP", 0.0)),
        exposed_ep_s=float(by_kind.get("EP", 0.0)),
        bubble_s=float(result.mean("bubble_s")),
        memory_gb=workload.memory.total / 1e9 if workload.memory else None,
    )
