"""``ccsim jobs``: several workloads placed on one cluster, run alone and together.

A command of its own rather than ``ccsim run --job``: ``run`` takes one positional
workload and prints one step's breakdown, whereas this takes several workloads with a
placement each and prints per job its step alone and together, its slowdown, the
links where the jobs met and, with ``--seeds``, the slowdown's distribution over ECMP
seeds. It shares ``run``'s topology, model and output options.
"""

from __future__ import annotations

import argparse
import math

from ..collective.guards import check_flows, cluster_of
from ..collective.policy import POLICIES, nccl_not_applied
from ..errors import CcsimError
from ..topology import load_topology
from ..viz.jobs import job_rows, jobs_table, seeds_rows, seeds_table, shared_rows
from ..viz.progress import simulated_time
from ..viz.tables import FORMATS, to_csv, to_json
from ..workload.guards import workload_estimate
from ..workload.jobs import Job, job_names, run_jobs
from ..workload.placement import POLICIES as PLACEMENTS
from ..workload.placement import PlacementError, parse_ranks
from ..workload.presets import resolve_workload
from .args import (
    Once,
    add_max_flows_option,
    check_outputs,
    emit,
    nccl_env_of,
    nccl_title,
    with_faults,
)
from .compare import add_model_options


def add_jobs_command(sub: argparse._SubParsersAction) -> None:
    """Register ``ccsim jobs`` on the main parser."""
    cmd = sub.add_parser(
        "jobs",
        help="place several workloads on one cluster and run them together",
        description="Place two or more workloads (each a preset name or file, as ccsim run "
        "takes) on disjoint GPUs of one topology and replay them together on its shared "
        "fabric, in one simulation; each also runs alone on the same GPUs. Prints per job "
        "its step alone and together (ms) and the slowdown, and the links where the jobs "
        "met (links that carried bytes of more than one job, with each job's bytes). "
        "ECMP collisions follow the topology's seeded hash: --seeds gives the slowdown's "
        "median and p90 over several seeds (on fabrics routed by ECMP: Ethernet stacks, or "
        "--routing ecmp; InfiniBand routes per destination, the same for every seed).",
    )
    cmd.add_argument(
        "--job",
        action="append",
        required=True,
        metavar="WORKLOAD[@PLACE]",
        help="a job (repeat for each; named A, B, C, ... in order): a workload, optionally "
        "with its placement after @: " + ", ".join(PLACEMENTS) + " or ranks=LIST (its GPUs "
        "in rank order, e.g. ranks=0-7,16-23); default --placement",
    )
    cmd.add_argument(
        "--placement",
        default="packed",
        metavar="POLICY",
        help="placement of jobs that give none: packed (lowest free GPUs, server after "
        "server), scattered (whole servers spread evenly over the free ones), rail (the "
        "same local GPUs on every server) (default: %(default)s)",
    )
    cmd.add_argument(
        "--topology", default="dgx-a100", metavar="NAME", help="topology preset or YAML file "
        "(default: %(default)s)",
    )  # fmt: skip
    cmd.add_argument(
        "--nodes", type=int, default=None, metavar="N",
        help="servers (default: as many as the jobs' ranks need together)",
    )  # fmt: skip
    cmd.add_argument(
        "--algo", default=None, metavar="NAME",
        help="who runs the collectives, as for ccsim run (default: the preset's library)",
    )  # fmt: skip
    cmd.add_argument(
        "--comm-slowdown", type=float, default=0.0, metavar="F",
        help="fraction (0-1) by which compute slows while communication overlaps it (default: 0)",
    )  # fmt: skip
    add_model_options(cmd)
    cmd.add_argument(
        "--seeds",
        default=None,
        metavar="LIST",
        help="run once per ECMP seed, e.g. 0-9, and report each job's slowdown per seed and "
        "its median, p90, min and max (instead of --seed)",
    )
    add_max_flows_option(cmd)
    cmd.add_argument("--format", choices=FORMATS, default="table", help="table, json or csv")
    cmd.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    cmd.add_argument(
        "--timeline", action=Once, metavar="FILE",
        help="also draw the jobs together to FILE.png, .svg or .pdf, one row group per job "
        "(of the first seed with --seeds)",
    )  # fmt: skip
    cmd.add_argument(
        "--trace", action=Once, metavar="FILE",
        help="also write a Chrome trace-event JSON of the jobs together (one process per job)",
    )  # fmt: skip
    cmd.set_defaults(handler=_cmd_jobs)


def _job_specs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(workload, placement) of each ``--job``."""
    specs = []
    for text in args.job:
        workload, _, place = text.partition("@")
        if not workload:
            raise PlacementError(f"--job {text!r}: give a workload, e.g. --job my-step.yaml@packed")
        specs.append((workload, place or args.placement))
    return specs


def _cmd_jobs(args: argparse.Namespace) -> None:
    check_outputs(args, "out")
    if args.timeline or args.trace:
        from ..viz.outputs import check_output_options

        check_output_options(timeline=args.timeline, trace=args.trace)
    if args.seeds is not None and args.seed is not None:
        raise CcsimError("give --seed or --seeds, not both")
    seeds = parse_ranks(args.seeds, field="--seeds") if args.seeds is not None else [args.seed]
    env = nccl_env_of(args)
    if env and args.algo not in (None, *POLICIES):
        raise CcsimError(nccl_not_applied(args.algo))
    specs = _job_specs(args)
    names = job_names(len(specs))
    workloads = {}
    for source, _ in specs:  # a workload named twice is read once (jobs never modify it)
        if source not in workloads:
            # One replica and one rank per TP group stand for the rest where the replay
            # checks that they may (the same steps; every rank is built where not).
            workloads[source] = resolve_workload(source, max_flows=args.max_flows, stand_ins=True)
    jobs = [Job(n, workloads[w], p) for n, (w, p) in zip(names, specs, strict=True)]
    nodes = args.nodes
    if nodes is None:
        per_server = cluster_of(args.topology, max_flows=args.max_flows).ranks
        nodes = max(1, math.ceil(sum(job.workload.ranks for job in jobs) / per_server))
    cluster = cluster_of(args.topology, nodes, fabric=args.fabric, max_flows=args.max_flows)
    estimate = cluster.estimate()
    for job in jobs:  # together they hold every job's flows at once
        estimate = estimate.plus(
            workload_estimate(
                job.workload, args.algo, cluster=cluster, protocol=args.proto, nccl=env
            )
        )
    check_flows(estimate, args.max_flows)
    graph = with_faults(
        load_topology(args.topology, nodes, fabric=args.fabric, routing=args.routing), args
    )
    options = dict(
        algorithm=args.algo, comm_slowdown=args.comm_slowdown, protocol=args.proto, nccl=env
    )
    runs = []
    for seed in seeds:
        with simulated_time(f"ccsim jobs (seed {seed if seed is not None else 0})") as bar:
            runs.append(run_jobs(jobs, graph, seed=seed, progress=lambda _what: bar, **options))
    fabric = graph.graph.get("fabric", "")
    title = nccl_title(
        f"ccsim jobs | topology {args.topology} x{nodes}"
        + (f" ({fabric})" if fabric else "")
        + f" | algorithm {runs[0].together.algorithm}"
        + ("" if len(runs) > 1 else f" | seed {runs[0].seed}"),
        env,
    )
    if args.format == "json":
        text = to_json(
            [row for run in runs for row in job_rows(run)]
            + (seeds_rows(runs) if len(runs) > 1 else [])
            + [{"seed": run.seed, **row} for run in runs for row in shared_rows(run)]
        )
    elif args.format == "csv":
        text = to_csv([row for run in runs for row in job_rows(run)])
    elif len(runs) > 1:
        text = seeds_table(runs, title=title)
    else:
        text = jobs_table(runs[0], title=title)
    emit(text, args.out)
    if args.timeline or args.trace:
        from ..files import write_file
        from ..viz.jobs import jobs_timeline
        from ..viz.perfetto import save_trace
        from ..viz.timeline import figure_bytes, image_format
        from ..viz.workload import workload_figure

        timeline = jobs_timeline(runs[0], graph)
        if args.timeline:
            fig = workload_figure(timeline)
            write_file(args.timeline, figure_bytes(fig, image_format(args.timeline)))
        if args.trace:
            save_trace(timeline, args.trace)
