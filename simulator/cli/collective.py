"""``ccsim collective``: one collective over a range of sizes, as an nccl-tests table."""

from __future__ import annotations

import argparse

from ..algorithms import algorithm_names, build_schedule
from ..algorithms.chain import ROOTED_OPS
from ..collective import (
    COLLECTIVE_OPS,
    POLICIES,
    AutoTuner,
    auto_fraction,
    build_and_run,
    library_of,
    library_policy,
    rank_layout,
    run_schedule,
)
from ..collective.policy import nccl_not_applied
from ..collective.tuner import CHANNEL_CANDIDATES, CHUNK_CANDIDATES
from ..errors import CcsimError, unknown_choice
from ..topology import load_topology
from ..units import parse_bandwidth, parse_sizes
from ..viz.progress import simulated_time
from ..viz.tables import FORMATS, RUN_KEYS, collective_table, to_csv, to_json
from ..workload.chakra import write_chakra_schedule
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
    parse_channels,
    parse_chunks,
    parse_fraction,
    positive_int,
    root_of,
    stack_env,
    with_faults,
)


def add_collective_command(sub: argparse._SubParsersAction) -> None:
    """Add ``ccsim collective`` to the CLI's subcommands."""
    coll = sub.add_parser(
        "collective",
        help="simulate one collective over a range of message sizes",
        description="Simulate a collective over a range of message sizes and print an "
        "nccl-tests-style table (size in bytes, count in fp32 elements, time in "
        "microseconds, algbw and busbw in GB/s = 1e9 bytes/s).",
    )
    coll.add_argument(
        "op", choices=COLLECTIVE_OPS, metavar="OP", help=f"operation: {', '.join(COLLECTIVE_OPS)}"
    )
    coll.add_argument(
        "--topology",
        default="dgx-a100",
        metavar="NAME",
        help="preset name (see 'ccsim topologies') or preset YAML file (default: %(default)s)",
    )
    coll.add_argument(
        "--nodes",
        type=positive_int,
        default=1,
        metavar="N",
        help="number of servers of the preset, on one switch (default: 1)",
    )
    coll.add_argument(
        "--algo",
        default=None,
        metavar="NAME",
        help="nccl: what NCCL runs with its defaults on this machine: its "
        "algorithm, protocol and channels per size, simulated with the preset's calibrated "
        "protocol model (the realistic prediction); hccl: what Huawei's HCCL runs on Ascend "
        "NPUs, its algorithm per size run as the nearest ccsim schedule (ideal model); "
        "default: the preset's library (hccl for the Ascend presets, else nccl); or an "
        "algorithm, "
        f"{', '.join(algorithm_names())}, run as given (the ideal line-rate model unless "
        "--proto is given); or auto: every algorithm that can run OP, each with its chunks "
        "searched as --chunks auto does, the fastest simulated kept: an ideal scheduler "
        "rather than a library",
    )
    coll.add_argument(
        "--sizes",
        default="8:4G",
        metavar="SIZES",
        help="message sizes in bytes: MIN:MAX doubles from MIN to MAX (like "
        "nccl-tests -b MIN -e MAX -f 2), MIN:MAX:F multiplies by F, or a "
        "list such as 1M,64M,1G (default: %(default)s)",
    )
    coll.add_argument(
        "--nvls-tree-loops",
        action="store_true",
        help="with --algo nccl: run NCCL's NVLSTree as many pipeline chunks deep as NCCL's "
        "loop (one per channels x heads x chunk, up to 1,024) rather than at most 32: the "
        "links' bound without ccsim's extra fill; slower (default: off, see README, issue 32)",
    )
    coll.add_argument(
        "--chunks",
        type=parse_chunks,
        default=None,
        metavar="K",
        help="chunks per step, sent back to back on each channel to pipeline (slices for "
        "pipelined; count), or auto: " + ", ".join(map(str, CHUNK_CANDIDATES)) + " simulated "
        "in turn at each size while each is faster than the one before, the fastest kept "
        "(default: the library's own with --algo nccl or hccl, else 1)",
    )
    coll.add_argument(
        "--root",
        type=int,
        default=None,
        metavar="R",
        help="root rank of broadcast and reduce (default: 0; refused for the other operations)",
    )
    coll.add_argument(
        "--channels",
        type=parse_channels,
        default=None,
        metavar="C",
        help="parallel rings, each carrying 1/C of the data (count), or auto: "
        + ", ".join(map(str, CHANNEL_CANDIDATES))
        + " searched at each size as --chunks auto searches chunks, with the algorithm and "
        "chunks (default: the library's count with --algo nccl or hccl, else 1)",
    )
    coll.add_argument(
        "--reduce-bw",
        default=None,
        metavar="BW",
        help="bandwidth of local reductions on every GPU, e.g. 1500GB/s "
        "(default: the preset's, else infinitely fast)",
    )
    coll.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="output format: table (nccl-tests style), json or csv (default: %(default)s)",
    )
    coll.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    coll.add_argument(
        "--timeline",
        action=Once,
        metavar="FILE",
        help="also draw a Gantt chart (GPU streams, link utilisation, phases; time in "
        "us/ms) of the LAST size of the sweep to FILE.png, .svg or .pdf",
    )
    coll.add_argument(
        "--trace",
        action=Once,
        metavar="FILE",
        help="also write a Chrome trace-event JSON (ts/dur in microseconds; open it at "
        "ui.perfetto.dev) of the LAST size of the sweep to FILE (gzipped if FILE ends in .gz)",
    )
    add_trace_options(coll)
    coll.add_argument(
        "--heatmap",
        metavar="FILE",
        help="also draw the LAST size's traffic as heat-maps to FILE.png, .svg or .pdf: "
        "utilisation (bytes sent / capacity; 0-1) per server and per rail (GPU index "
        "across servers), inside servers (scale-up) and between them (scale-out), in "
        "200-500 time bins; above 256 ranks --timeline draws this instead of a row per "
        "rank, and --trace carries these rows as counters (with --trace-detail ranks) and "
        "the slices of one server's ranks (or the simulated representatives) unless "
        "--trace-ranks is given",
    )
    coll.add_argument(
        "--report",
        action=Once,
        metavar="DIR",
        help="also write a report folder: the table (CSV, JSON, text), bandwidth and "
        "timeline plots, the trace (LAST size), the topology file and run.json with the "
        "command, versions and inputs; DIR must be new or empty unless --force",
    )
    coll.add_argument(
        "--force",
        action="store_true",
        help="let --report write into a non-empty folder (its report files are replaced)",
    )
    add_model_options(coll)
    add_max_flows_option(coll)
    coll.add_argument(
        "--fraction",
        default=None,
        metavar="X",
        help="multipath only: share (0-1) of the data on the intra-server links, the rest "
        "over the NICs; auto (default) sizes it by simulating each path",
    )
    coll.add_argument(
        "--chakra",
        metavar="PREFIX",
        help="also write the last size's schedule as a Chakra trace for ASTRA-sim: "
        "PREFIX.<rank>.et, one send/recv node pair a transfer (needs --algo NAME, an "
        "algorithm run as given)",
    )
    coll.set_defaults(handler=_cmd_collective)


def _choice_line(size: int, result) -> str:
    """The library's choice at ``size``, as its policy recorded it in ``result.params``."""
    params = result.params
    if params["policy"] == "hccl":
        loops = params["hccl_loops"]
        what = f"{params['hccl_algorithm']} ({params['hccl_executor']}"
        what += f", {loops} buffer passes)" if loops > 1 else ")"
    else:
        what = f"{params.get('nccl_algorithm', 'send/recv')} {params['protocol']}"
    tuned = params.get("nccl_tuner_line")
    return (
        f"# {size:>11}  {what} channels {params['channels']} "
        f"(ccsim {result.algorithm}, chunks {params['chunks']}"
        + (f"; tuner file line {tuned}" if tuned else "")
        + ")\n"
    )


def _cmd_collective(args: argparse.Namespace) -> None:
    with simulated_time(f"ccsim {args.op}") as progress:  # a bar on a terminal, if slow
        _run_collective(args, progress)


def _run_collective(args: argparse.Namespace, progress) -> None:
    check_outputs(args, "out", "chakra")
    sizes = parse_sizes(args.sizes, element=4, source="--sizes")  # fp32 counts, as nccl-tests
    if args.algo not in (None, "auto", *POLICIES, *algorithm_names()):
        raise unknown_choice("--algo", args.algo, ("auto", *POLICIES, *algorithm_names()))
    if args.chakra and (
        args.algo in (None, "auto", *POLICIES) or "auto" in (args.chunks, args.channels)
    ):
        raise CcsimError(
            "--chakra writes one schedule: give --algo NAME (e.g. ring), not auto or a library"
        )
    reduce_bw = parse_bandwidth(args.reduce_bw, field="--reduce-bw") if args.reduce_bw else None
    env = nccl_env_of(args)
    if env and args.algo not in (None, *POLICIES):
        raise CcsimError(nccl_not_applied(args.algo))
    drawing = args.timeline or args.trace or args.report or args.heatmap
    if drawing:  # matplotlib loads only when asked for; bad names fail before the sweep
        from ..viz.outputs import check_output_options, write_collective_outputs

        check_output_options(
            timeline=args.timeline,
            trace=args.trace,
            report=args.report,
            force=args.force,
            heatmap=args.heatmap,
        )
    args.root = root_of(args.op, args.root)
    check_run_size(args, sizes, [args.algo])
    graph = load_topology(
        args.topology, args.nodes, fabric=args.fabric, seed=args.seed, routing=args.routing
    )
    graph = with_faults(graph, args)
    layout = rank_layout(graph)
    args.algo = args.algo or library_of(graph)
    if args.fraction is not None and args.algo != "multipath":
        raise CcsimError("--fraction applies to --algo multipath only")
    if args.nvls_tree_loops and args.algo != "nccl":
        raise CcsimError(
            f"--nvls-tree-loops applies to --algo nccl (NCCL's NVLSTree) only, not {args.algo}"
        )
    rows = []
    policy = None
    if args.algo in POLICIES:
        policy = library_policy(
            args.algo,
            graph,
            protocol=args.proto,
            channels=args.channels,
            chunks=args.chunks,
            reduce_bandwidth=reduce_bw,
            nccl=env,
            nvls_tree_loops=args.nvls_tree_loops,
        )
    else:
        args.chunks = 1 if args.chunks is None else args.chunks
        args.channels = 1 if args.channels is None else args.channels
    # One tuner per command: "auto" choices are cached for this sweep only.
    tuner = AutoTuner(channels=args.channels or 1, reduce_bandwidth=reduce_bw, protocol=args.proto)
    chosen = []
    tuned_env = getattr(getattr(policy, "env", None), "tuner", None) is not None
    for size in sizes:
        if policy is not None:
            result = policy.simulate(graph, args.op, float(size), root=args.root, progress=progress)
            chosen.append(_choice_line(size, result))
        elif "auto" in (args.algo, args.chunks, args.channels):
            result = tuner.simulate(
                graph, args.op, float(size), algorithm=args.algo, chunks=args.chunks, root=args.root
            )
            protocol = result.params.get("protocol")
            chosen.append(
                f"# {size:>11}  {result.algorithm} chunks {result.params['chunks']} "
                f"channels {result.params['channels']}"
                + (f" protocol {protocol}" if protocol else "")
                + "\n"
            )
        else:
            options: dict = {"root": args.root} if args.op in ROOTED_OPS else {}
            if args.algo == "multipath":
                options["fraction"] = (
                    auto_fraction(
                        graph,
                        args.op,
                        float(size),
                        chunks=args.chunks,
                        channels=args.channels,
                        protocol=args.proto,
                    )
                    if args.fraction in (None, "auto")
                    else parse_fraction(args.fraction)
                )
            if args.chakra and size == sizes[-1]:  # the schedule itself is written
                schedule = build_schedule(
                    args.algo,
                    args.op,
                    layout,
                    float(size),
                    chunks=args.chunks,
                    channels=args.channels,
                    **options,
                )
                result = run_schedule(
                    graph,
                    schedule,
                    reduce_bandwidth=reduce_bw,
                    protocol=args.proto,
                    progress=progress,
                )
                write_chakra_schedule(schedule, args.chakra)
            else:  # a large symmetric schedule is built and run as its quotient
                result = build_and_run(
                    graph,
                    args.algo,
                    args.op,
                    float(size),
                    reduce_bandwidth=reduce_bw,
                    protocol=args.proto,
                    progress=progress,
                    chunks=args.chunks,
                    channels=args.channels,
                    **options,
                )
        params = result.params
        rows.append(
            {
                **result.row(),
                "library_algorithm": params.get("nccl_algorithm")
                or params.get("hccl_algorithm")
                or "-",
                "protocol": params.get("protocol") or "-",
                "channels": params.get("channels", 1),
                "chunks": params.get("chunks", 1),
                # The tuner file's line whose rule chose (0: NCCL's own), with one.
                **({"tuner_line": params.get("nccl_tuner_line", 0)} if tuned_env else {}),
            }
        )
    if args.algo in (None, "nccl"):
        env = stack_env(graph, env)  # the network stack's own settings apply too
    title = nccl_title(
        f"ccsim {args.op} | topology {args.topology} x{args.nodes} | "
        f"{layout.ranks} ranks | algorithm {args.algo} | chunks {args.chunks or args.algo} | "
        f"channels {args.channels or args.algo}"
        + (f" | faults {' '.join(args.fault)}" if args.fault else ""),
        env,
    )
    rows = nccl_field(rows, env)
    if args.format == "json":
        text = to_json(rows)
    elif args.format == "csv":
        text = to_csv(rows, (*RUN_KEYS, "nccl_env") if env else RUN_KEYS)
    else:
        text = collective_table(rows, title=title, root=args.root)
        if chosen:
            what = f"{args.algo.upper()}'s choice" if policy is not None else "what was chosen"
            text += f"# {args.algo}: size (B), then {what}\n" + "".join(chosen)
    emit(text, args.out)
    if drawing:
        write_collective_outputs(
            result,
            graph,
            rows=rows,
            table=collective_table(rows, title=title, root=args.root),
            timeline=args.timeline,
            trace=args.trace,
            heatmap=args.heatmap,
            trace_detail=args.trace_detail,
            trace_ranks=args.trace_ranks,
            report=args.report,
            force=args.force,
            argv=getattr(args, "argv", ()),
            inputs={
                "op": args.op,
                "topology": args.topology,
                "nodes": args.nodes,
                "algorithm": args.algo,
                "sizes_bytes": [int(size) for size in sizes],
                "chunks": args.chunks,
                "channels": args.channels,
                "reduce_bandwidth_Bps": reduce_bw,
                "faults": args.fault,
                "nccl": env.text or None,
            },
            topology=args.topology,
        )
