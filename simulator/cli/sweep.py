"""``ccsim sweep`` and ``ccsim size``: parameter sweeps and knee finding on the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import CcsimError
from ..viz.tables import FORMATS, cost_table, to_csv, to_json
from .args import add_max_flows_option, add_nccl_option, check_outputs, positive_int


def parse_tolerance(text: str) -> float:
    """``5%`` or ``0.05`` as a fraction in [0, 1).

    >>> parse_tolerance("5%"), parse_tolerance("0.1")
    (0.05, 0.1)
    """
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a tolerance such as 5% or 0.05 (in [0, 1)), got {text!r}"
        )
    return value


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC.yaml", help="sweep spec (YAML)")
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="local worker processes (count; default: every core; 1 runs in this process)",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run on an existing Dask distributed cluster instead, e.g. tcp://host:8786 "
        "(its workers need ccsim installed)",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the points whose row in the results file records an error",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bar and no summary on stderr"
    )
    add_max_flows_option(parser)
    add_nccl_option(parser, version=False)


def add_sweep_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``sweep`` and ``size`` on the main parser."""
    sweep = sub.add_parser(
        "sweep",
        help="run every point of a parameter sweep, resumably",
        description="Run every point of a sweep spec (a base collective or workload and "
        "axes to vary: topology paths such as server.nic.bandwidth, algorithm, size, "
        "nodes, workload.PARAM) and append each result to a CSV file as it finishes. "
        "A point runs what the topology's library would (NCCL, or HCCL on the Ascend "
        "presets) unless the spec names an algorithm. "
        "Running the same command again skips the points already in the file. Columns: "
        "key, the axes in bytes, bytes/s and seconds, status, error, the metrics "
        "(seconds; GB/s = 1e9 bytes/s).",
    )
    _run_options(sweep)
    sweep.add_argument(
        "--out", required=True, metavar="RESULTS.csv", help="results file (CSV), appended to"
    )
    sweep.set_defaults(handler=_cmd_sweep)

    size = sub.add_parser(
        "size",
        help="find the knee: the smallest setting of an axis as good as the largest",
        description="Run a sweep, then for each group of the other axes find the "
        "smallest value of AXIS at which METRIC is within TOLERANCE of its value at the "
        "largest setting (and stays so above it), print it, and plot METRIC against "
        "AXIS with the knee marked.",
    )
    _run_options(size)
    size.add_argument(
        "--axis",
        default=None,
        metavar="AXIS",
        help="axis to size, e.g. server.nic.bandwidth (default: the only axis); a knee "
        "needs a numeric axis, an axis of names (fabric) is only costed (--prices, --per)",
    )
    size.add_argument(
        "--metric",
        default=None,
        metavar="NAME",
        help="step_s, exposed_s, exposed_share... for workloads (default step_s); "
        "busbw_GBps, time_s... for collectives (default busbw_GBps)",
    )
    size.add_argument(
        "--tolerance",
        type=parse_tolerance,
        default=0.05,
        metavar="X",
        help="how close to the largest setting's value counts, e.g. 5%% or 0.05 (default: 5%%)",
    )
    size.add_argument(
        "--by",
        default=None,
        metavar="AXES",
        help="comma-separated axes to group by (default: the other axes that vary)",
    )
    size.add_argument(
        "--out",
        default=None,
        metavar="RESULTS.csv",
        help="results file (CSV), appended to and resumed from (default: none)",
    )
    size.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="draw the metric and the knee to FILE.png, .svg or .pdf",
    )
    size.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="knee table format: table, json or csv (default: %(default)s); with --prices, "
        "--watts or --per, json is one record of knees, points (each point's cost), per, "
        "power_unknown and target, and csv lists the points",
    )
    size.add_argument(
        "--prices",
        default=None,
        metavar="FILE",
        help="YAML or JSON unit prices (item: price, as 'ccsim topology bom --prices'): cost "
        "every point's topology and print its cost and cost x metric (the cost per step/s; "
        "cost per GB/s for bandwidths); every item a point needs must have a price (0 "
        "leaves one out)",
    )
    size.add_argument(
        "--watts",
        default=None,
        metavar="FILE",
        help="YAML or JSON typical watts per item, filling in or overriding the cited "
        "figures of the network power (e.g. 'nic-400G: 25')",
    )
    size.add_argument(
        "--per",
        choices=("dollar", "watt"),
        default=None,
        help="rank the points by fabric cost (dollar; the default with --prices) or by "
        "network power (watt: switches, NICs and optics at their cited typical watts)",
    )
    size.add_argument(
        "--target",
        default=None,
        metavar="VALUE",
        help="name the cheapest point whose metric meets VALUE, in the metric's unit: a "
        "time for step_s or time_s (e.g. 1.2s, 800ms; at most it), a bandwidth for "
        "busbw_GBps (e.g. 300GB/s; at least it); needs --prices or --per watt",
    )
    size.set_defaults(handler=_cmd_size)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "scheduler": args.scheduler,
        "progress": False if args.quiet else None,
        "retry_failed": args.retry_failed,
    }


def _interrupted(args: argparse.Namespace, out: str | None, error: BaseException) -> None:
    """Say on the interrupt's own line (printed by ``main``) what the results file kept."""
    if args.quiet or not out:
        return
    from ..sweep.store import read_cells

    try:
        kept = f"{len(read_cells(out))} points written to {out}"
    except CcsimError:  # the file was never created (stopped before the first row)
        kept = f"no points written to {out}"
    error.add_note(f"{kept}; run the same command again to resume")


def _summary(args: argparse.Namespace, run: Any, out: str | None) -> None:
    if args.quiet:
        return
    where = f" in {out}" if out else ""
    text = (
        f"ccsim: {len(run.rows)} points{where}: {run.ran} run now, {run.resumed} already "
        f"there, {run.failed} failed"
    )
    if run.spec.duplicates:
        text += f" ({run.spec.duplicates} duplicate points skipped)"
    print(text, file=sys.stderr)
    errors = [row for row in run.rows if row["status"] != "ok"]
    if errors:
        print(f"ccsim: first failure: {errors[0]['error']}", file=sys.stderr)


def _warn_tp(spec: Any) -> None:
    """One warning line per TP size whose groups would span servers in the sweep's
    Megatron points (they run as asked)."""
    from ..sweep.point import megatron_tp_spread
    from ..workload.servers import tp_warning

    said = set()
    for point in spec.points:
        spread = megatron_tp_spread(point.params)
        if spread is None or (spread.size, spread.gpus_per_server) in said:
            continue
        warning = tp_warning(spread, option="workload.tp")
        if warning:
            said.add((spread.size, spread.gpus_per_server))
            print(f"ccsim: warning: {spec.source}: {warning}", file=sys.stderr)


def _cmd_sweep(args: argparse.Namespace) -> None:
    from ..sweep import execute_sweep, load_spec
    from ..sweep.seeds import SEED_AXIS
    from ..sweep.store import check_results_file

    check_outputs(args, "out")
    check_results_file(args.out)
    spec = load_spec(args.spec, max_flows=args.max_flows, nccl=args.nccl)
    _warn_tp(spec)
    try:
        run = execute_sweep(spec, args.out, **_options(args))
    except KeyboardInterrupt as error:
        _interrupted(args, args.out, error)
        raise
    _summary(args, run, args.out)
    if SEED_AXIS in spec.columns:  # random faults: the typical run and the bad ones
        sys.stdout.write(_seed_table(spec, run.rows))


def _seed_table(spec: Any, rows: list[dict[str, Any]]) -> str:
    """Median and tail of the sweep's default metric over the fault seeds, per setting."""
    from ..sweep import default_metric
    from ..sweep.seeds import SEED_AXIS, STATISTICS, over_seeds

    metric = default_metric(spec)
    groups = over_seeds(rows, metric, spec.columns)
    by = [axis for axis in spec.columns if axis != SEED_AXIS]
    tail = "p10, min: the worst" if metric.endswith("GBps") else "p90, max: the worst"
    header = [*by, "seeds", "failed", *STATISTICS]
    table = [header]
    for group in groups:
        stats = ["-" if group[k] is None else f"{group[k]:.6g}" for k in STATISTICS]
        labels = [spec.label(axis, group[axis]) for axis in by]
        table.append([*labels, str(group["seeds"]), str(group["failed"]), *stats])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [f"# ccsim sweep {spec.name}: {metric} over {SEED_AXIS} ({tail})"]
    for i, row in enumerate(table):
        cells = "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True))
        lines.append(("# " if i == 0 else "  ") + cells.rstrip())
    return "\n".join(lines) + "\n"


def _cmd_size(args: argparse.Namespace) -> None:
    from ..sweep import default_metric, load_spec, size
    from ..sweep.cost import parse_target
    from ..sweep.store import check_results_file
    from ..topology.bom import load_items

    check_outputs(args, "out", "plot")
    if args.per == "dollar" and not args.prices:
        raise CcsimError("--per dollar needs --prices FILE (the unit prices to cost with)")
    if args.target is not None and not (args.prices or args.watts or args.per == "watt"):
        raise CcsimError(
            "--target needs --prices FILE (the cheapest by cost) or --per watt (the least "
            "network power)"
        )
    # Price and watts files are read first: a bad one fails before anything runs.
    prices = load_items(args.prices, what="price") if args.prices else None
    watts = load_items(args.watts, what="watts") if args.watts else None
    if args.out:
        check_results_file(args.out)
    spec = load_spec(args.spec, max_flows=args.max_flows, nccl=args.nccl)
    _warn_tp(spec)
    metric = args.metric or default_metric(spec)
    target = parse_target(metric, args.target) if args.target is not None else None
    by = [name.strip() for name in args.by.split(",") if name.strip()] if args.by else None
    if args.plot:  # a bad file name fails before the sweep, not after it
        from ..sweep.plot import _FORMATS

        if args.plot.rsplit(".", 1)[-1].lower() not in _FORMATS:
            raise CcsimError(f"cannot draw {args.plot!r}: give a .png, .svg or .pdf file name")
    try:
        found = size(
            spec,
            args.axis,
            args.metric,
            args.tolerance,
            by=by,
            out=args.out,
            plot=args.plot,
            prices=prices,
            watts=watts,
            per=args.per,
            target=target,
            prices_source=str(args.prices),
            **_options(args),
        )
    except KeyboardInterrupt as error:
        _interrupted(args, args.out, error)
        raise
    _summary(args, found.run, args.out)
    rows = [knee.row() for knee in found.knees]
    if found.per and args.format == "json":
        text = to_json(
            [
                {
                    "knees": rows,
                    "points": found.points,
                    "per": found.per,
                    "power_unknown": found.unpowered,
                    "target": found.choice.summary() if found.choice else None,
                }
            ]
        )
    elif found.per and args.format == "csv":
        text = to_csv(found.points)
    elif args.format == "json":
        text = to_json(rows)
    elif args.format == "csv":
        text = to_csv(rows)
    else:
        if found.knees:
            text = _knee_text(spec, found.knees, metric, args.tolerance)
        else:
            axis = args.axis or spec.columns[0]
            text = f"# ccsim size {spec.name}: {axis} is not numeric, so it has no knee\n"
        if found.per:
            text += _cost_block(spec, found, metric)
    if args.plot and not args.quiet:
        print(f"ccsim: wrote {args.plot}", file=sys.stderr)
    sys.stdout.write(text)


def _knee_text(spec: Any, knees: list[Any], metric: str, tolerance: float) -> str:
    """The knee of each group as a table."""
    from ..sweep import format_value

    axis = knees[0].axis
    lines = [
        f"# ccsim size {spec.name}: knee of {metric} against {axis} = the smallest "
        f"value within {tolerance:.1%} of the value at the largest setting (and "
        "staying within above it)",
    ]
    group_names = list(knees[0].group)
    header = [*group_names, "knee", metric, "reference", f"{metric} there", "ratio"]
    table = [header]
    for knee in knees:
        table.append(
            [
                *(format_value(k, v) for k, v in knee.group.items()),
                spec.label(axis, knee.knee),
                f"{knee.knee_metric:.6g}",
                spec.label(axis, knee.reference),
                f"{knee.reference_metric:.6g}",
                f"{knee.knee_metric / knee.reference_metric:.4f}" if knee.reference_metric else "",
            ]
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        cells = "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True))
        lines.append(("# " if i == 0 else "  ") + cells.rstrip())
    return "\n".join(lines) + "\n"


def _cost_block(spec: Any, found: Any, metric: str) -> str:
    """The points' costs under the knee table, cheapest first, and the target's answer."""
    from ..sweep.cost import MEASURES, describe_choice

    measure = MEASURES[found.per]
    ranked = "fabric cost" if measure == "fabric_cost" else "network power"
    head = (
        f"# every point, by {ranked}: cost of the priced items and network kW at the cited "
        "typical watts (ccsim topology bom);\n# cost x time is the cost per step/s, cost per "
        "GB/s for a bandwidth: lower is better value\n"
    )
    return head + cost_table(
        found.points,
        spec.columns,
        metric=metric,
        measure=measure,
        label=spec.label,
        answer=describe_choice(found.choice, spec) if found.choice else None,
        unpowered=found.unpowered,
    )


__all__ = ["add_sweep_commands", "parse_tolerance"]
