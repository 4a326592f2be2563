"""``ccsim compare``: several algorithms side by side over a range of sizes."""

from __future__ import annotations

import argparse

from ..algorithms import algorithm_names, build_schedule, get_algorithm
from ..collective import COLLECTIVE_OPS, POLICIES, AutoTuner, compare, library_policy, rank_layout
from ..collective.compare import COMPARE_KEYS, forced_policy, library_algorithms
from ..collective.tuner import CHUNK_CANDIDATES
from ..errors import CcsimError
from ..topology import load_topology
from ..units import parse_bandwidth, parse_sizes
from ..viz.tables import FORMATS, compare_table, to_csv, to_json
from .args import (
    Once,
    add_max_flows_option,
    add_model_options,
    add_trace_options,
    check_outputs,
    check_run_size,
    emit,
    nccl_env_of,
    nccl_field,
    nccl_title,
    parse_chunks,
    positive_int,
    root_of,
    with_faults,
)


def add_compare_command(sub: argparse._SubParsersAction) -> None:
    """Add ``ccsim compare`` to the CLI's subcommands."""
    cmd = sub.add_parser(
        "compare",
        help="compare collective algorithms over a range of message sizes",
        description="Simulate several algorithms for one collective on one topology and "
        "print bus bandwidth (GB/s = 1e9 bytes/s) per algorithm and size, and the fastest "
        "per size. By default: the topology's library's own choice (nccl, hccl) and each "
        "algorithm NCCL can be forced to, run as NCCL runs it when forced (NCCL_ALGO: its "
        "protocol, channels and chunking). Algorithms NCCL does not have, and all with "
        "--ideal, run on the ideal model (line rate, --channels, best chunk count unless "
        "--chunks is given); each row says which model it is.",
    )
    cmd.add_argument(
        "op", choices=COLLECTIVE_OPS, metavar="OP", help=f"operation: {', '.join(COLLECTIVE_OPS)}"
    )
    cmd.add_argument(
        "--topology",
        default="dgx-a100",
        metavar="NAME",
        help="preset name or preset YAML file (default: %(default)s)",
    )
    cmd.add_argument(
        "--nodes", type=positive_int, default=1, metavar="N", help="servers (default: 1)"
    )
    cmd.add_argument(
        "--algos",
        default=None,
        metavar="NAMES",
        help=f"comma-separated algorithms among {', '.join(algorithm_names())}, or "
        f"{' / '.join(POLICIES)} for that library's own choice per size "
        "(default: the library's choice and each algorithm NCCL can be forced to; with "
        "--ideal, every algorithm that can run OP on this topology)",
    )
    cmd.add_argument(
        "--ideal",
        action="store_true",
        help="run every algorithm on the ideal model (line rate, no protocol, --channels, "
        "best chunk count): an upper bound, not what NCCL would do",
    )
    cmd.add_argument(
        "--sizes",
        default="1K:1G",
        metavar="SIZES",
        help="message sizes in bytes: MIN:MAX (doubling), MIN:MAX:F or a list "
        "(default: %(default)s)",
    )
    cmd.add_argument(
        "--chunks",
        type=parse_chunks,
        default="auto",
        metavar="K",
        help="chunks (pipeline slices) per algorithm: a count, or auto: "
        + ", ".join(map(str, CHUNK_CANDIDATES))
        + " simulated in turn while each is faster than the one before, each algorithm's "
        "fastest kept (default: auto)",
    )
    cmd.add_argument(
        "--channels",
        type=positive_int,
        default=1,
        metavar="C",
        help="channels of the algorithms run on the ideal model (default: 1; the library's "
        "runs use the library's)",
    )
    cmd.add_argument(
        "--root",
        type=int,
        default=None,
        metavar="R",
        help="root rank of broadcast/reduce (default: 0; refused for the other operations)",
    )
    cmd.add_argument(
        "--reduce-bw",
        default=None,
        metavar="BW",
        help="bandwidth of local reductions, e.g. 1500GB/s (default: the preset's, else infinite)",
    )
    add_model_options(cmd)
    add_max_flows_option(cmd)
    cmd.add_argument(
        "--plot", metavar="FILE", help="also draw busbw against size into FILE (png, svg, pdf)"
    )
    cmd.add_argument(
        "--timeline",
        action=Once,
        metavar="FILE",
        help="also draw a Gantt chart (time in us/ms) of the winner at the LAST size into "
        "FILE (png, svg, pdf)",
    )
    cmd.add_argument(
        "--trace",
        action=Once,
        metavar="FILE",
        help="also write a Chrome trace-event JSON (ts/dur in microseconds) of the winner "
        "at the LAST size",
    )
    add_trace_options(cmd)
    cmd.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: %(default)s)"
    )
    cmd.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    cmd.set_defaults(handler=_cmd_compare)


def _cmd_compare(args: argparse.Namespace) -> None:
    sizes = parse_sizes(args.sizes, element=4, source="--sizes")  # fp32 counts, as nccl-tests
    given = args.algos is not None
    algorithms = [name.strip() for name in (args.algos or "").split(",") if name.strip()]
    if given and not algorithms:
        raise CcsimError("--algos: give at least one algorithm name")
    for name in algorithms:
        if name not in POLICIES:
            get_algorithm(name)
    reduce_bw = parse_bandwidth(args.reduce_bw, field="--reduce-bw") if args.reduce_bw else None
    check_outputs(args, "out", "plot")
    if args.timeline or args.trace:  # a bad name fails before anything is simulated
        from ..viz.outputs import check_output_options

        check_output_options(timeline=args.timeline, trace=args.trace)
    args.root = root_of(args.op, args.root)
    env = nccl_env_of(args)
    if env and args.ideal:
        raise CcsimError(
            "--nccl restricts NCCL's own choice; --ideal runs every algorithm on the ideal "
            "model: leave one of them out"
        )
    check_run_size(args, sizes, algorithms or ["auto"])  # no --algos: all that can run
    healthy = load_topology(
        args.topology, args.nodes, fabric=args.fabric, seed=args.seed, routing=args.routing
    )
    graph = with_faults(healthy, args)
    layout = rank_layout(graph)
    if not given:
        algorithms = library_algorithms(graph, args.op, min(sizes), nccl=env)
        if args.ideal:
            algorithms += [n for n in runnable(graph, args.op, min(sizes)) if n not in algorithms]
    for name in (name for name in algorithms if name not in POLICIES):  # fail early
        reason = get_algorithm(name).unsupported(args.op, layout)
        if reason is not None:
            build_schedule(name, args.op, layout, 1.0)  # raises the standard message
    from ..viz.progress import progress_bar

    # The same settings for the run and, under faults, its healthy baseline.
    settings = dict(
        chunks=args.chunks,
        channels=args.channels,
        reduce_bandwidth=reduce_bw,
        root=args.root,
        protocol=args.proto,
        ideal=args.ideal,
        nccl=env,
    )
    with progress_bar(len(sizes) * len(algorithms), desc="ccsim compare", unit="run") as bar:
        rows = compare(
            graph, args.op, sizes, algorithms, progress=lambda: bar.update(1), **settings
        )
    models = "ideal model" if args.ideal else "as the library runs each"
    title = nccl_title(
        f"ccsim compare {args.op} | topology {args.topology} x{args.nodes} | "
        f"{layout.ranks} ranks | {models} | ideal runs: chunks {args.chunks}, channels "
        f"{args.channels} | busbw" + (f" | faults {' '.join(args.fault)}" if args.fault else ""),
        env,
    )
    keys = (*COMPARE_KEYS, "nccl_env") if env else COMPARE_KEYS
    if graph is not healthy:  # which algorithm degrades least: each against itself healthy
        keys = (*keys, "healthy_busbw_GBps", "busbw_kept")
        names = list(dict.fromkeys(row["algorithm"] for row in rows))
        baseline = compare(healthy, args.op, sizes, names, **settings)
        _add_healthy(rows, baseline)
    rows = nccl_field(rows, env)
    if args.format == "json":
        text = to_json(rows)
    elif args.format == "csv":
        text = to_csv(rows, keys)
    else:
        text = compare_table(rows, title=title)
        if graph is not healthy:
            text += _kept_lines(rows)
    if args.plot:
        from ..viz.plots import save_plot  # matplotlib loads only when a plot is asked for

        save_plot(rows, args.plot, title=title)
    if args.timeline or args.trace:
        # matplotlib and the viz package load only when asked for.
        from ..viz.outputs import write_collective_outputs

        last = [row for row in rows if row["size_bytes"] == rows[-1]["size_bytes"]]
        winner = next((row for row in last if row.get("winner")), last[0])
        tuner = AutoTuner(channels=args.channels, reduce_bandwidth=reduce_bw, protocol=args.proto)
        if winner["algorithm"] in POLICIES or winner["model"].startswith("NCCL_ALGO"):
            if winner["algorithm"] in POLICIES:
                policy = library_policy(
                    winner["algorithm"],
                    graph,
                    protocol=args.proto,
                    reduce_bandwidth=reduce_bw,
                    nccl=env,
                )
            else:
                policy = forced_policy(
                    winner["algorithm"], protocol=args.proto, reduce_bandwidth=reduce_bw, nccl=env
                )
            result = policy.simulate(graph, args.op, float(winner["size_bytes"]), root=args.root)
        else:
            result = tuner.run(
                graph,
                args.op,
                float(winner["size_bytes"]),
                winner["algorithm"],
                int(winner["chunks"]),
                root=args.root,
            )
        write_collective_outputs(
            result,
            graph,
            rows=rows,
            table=text,
            timeline=args.timeline,
            trace=args.trace,
            trace_detail=args.trace_detail,
            trace_ranks=args.trace_ranks,
        )
    emit(text, args.out)


def _add_healthy(rows: list[dict], healthy: list[dict]) -> None:
    """Add each row's busbw on the healthy cluster and the share of it kept under faults."""
    same = {(row["size_bytes"], row["algorithm"]): row for row in healthy}
    for row in rows:
        base = same[(row["size_bytes"], row["algorithm"])]["busbw_GBps"]
        row["healthy_busbw_GBps"] = base
        row["busbw_kept"] = row["busbw_GBps"] / base if base else float("nan")


def _kept_lines(rows: list[dict]) -> str:
    """The table's answer to "which algorithm degrades least": busbw kept at the largest
    size (where bandwidth, which faults take, matters most), most kept first."""
    last = sorted(
        (row for row in rows if row["size_bytes"] == rows[-1]["size_bytes"]),
        key=lambda row: -row["busbw_kept"],
    )
    best = [row["algorithm"] for row in last if row["busbw_kept"] >= last[0]["busbw_kept"] - 1e-3]
    kept = ", ".join(
        f"{row['algorithm']} {row['busbw_kept']:.1%} ({row['healthy_busbw_GBps']:.2f} -> "
        f"{row['busbw_GBps']:.2f} GB/s)"
        for row in last
    )
    return (
        f"# busbw kept under the faults at {last[0]['size_bytes']} B (faulted / healthy): "
        f"{kept}\n# degrades least: {', '.join(best)}\n"
    )


def runnable(graph, op: str, size: float) -> list[str]:
    """Every registered algorithm that runs ``op`` on ``graph``: it implements it for
    these ranks and a run at ``size`` (the smallest asked for) succeeds (nvls needs an
    NVSwitch that reduces, multipath NICs on a switch)."""
    layout = rank_layout(graph)
    tuner = AutoTuner()
    names = []
    for name in algorithm_names():
        if get_algorithm(name).unsupported(op, layout) is not None:
            continue
        try:
            tuner.run(graph, op, float(size), name, 1, layout=layout)
        except CcsimError:
            continue
        names.append(name)
    if not names:
        raise CcsimError(f"no algorithm can run {op} on this topology")
    return names
