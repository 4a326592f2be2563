"""``ccsim search``: the fastest Megatron-LM configuration of a model on a cluster."""

from __future__ import annotations

import argparse
import sys

from ..viz.tables import FORMATS, search_table, to_csv, to_json
from ..workload.model import MODELS
from .args import add_max_flows_option, check_outputs, emit, positive_int


def _int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers (``1,2,4``)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers such as 1,2,4, got {text!r}"
        )
    return values


def _recompute_list(text: str) -> list[str]:
    """argparse type: comma-separated recomputation modes."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    bad = [v for v in values if v not in ("none", "selective", "full")]
    if not values or bad:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated none, selective and full, got {text!r}"
        )
    return values


def _precision_list(text: str) -> list[str]:
    """argparse type: comma-separated precisions."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or any(v not in ("bf16", "fp8") for v in values):
        raise argparse.ArgumentTypeError(f"expected bf16, fp8 or bf16,fp8, got {text!r}")
    return values


def _sharding_list(text: str) -> list[str]:
    """argparse type: comma-separated shardings."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or any(v not in ("optimizer", "fsdp") for v in values):
        raise argparse.ArgumentTypeError(
            f"expected optimizer, fsdp or optimizer,fsdp, got {text!r}"
        )
    return values


def add_search_command(sub: argparse._SubParsersAction) -> None:
    """Register ``search`` on the main parser."""
    search = sub.add_parser(
        "search",
        help="rank the TP/PP/DP/micro-batch/recompute choices of a model on a cluster",
        description="Enumerate the Megatron-LM configurations of MODEL on the cluster "
        "(tensor parallel inside a server, pipeline stages, data parallel, micro-batch, "
        "recomputation, interleaved virtual stages; sequence parallelism and the "
        "distributed optimizer where they apply), drop those that do not fit in GPU "
        "memory, rank the rest by an analytic estimate, simulate the best --simulate of "
        "them as the topology's library (NCCL) runs their collectives, and print them "
        "ranked by simulated step time. Times in seconds (exposed communication and "
        "bubble in ms), memory in GB (1e9 bytes). TFLOP/s per GPU count the model's "
        "FLOPs as Megatron-LM does (no recomputation); MFU is of the dense peak of the "
        "precision each candidate runs in. A candidate whose simulation is refused "
        "(resource guard) or fails gets one line on stderr and its reason in the table; "
        "the exit status is 0 when at least one candidate was simulated, 2 when none "
        "could be.",
    )
    search.add_argument("model", choices=sorted(MODELS), metavar="MODEL", help="a named model")
    search.add_argument(
        "--topology", default="dgx-a100", help="preset or file (default: %(default)s)"
    )
    search.add_argument("--nodes", type=positive_int, default=1, help="servers (count; default: 1)")
    search.add_argument(
        "--global-batch",
        type=positive_int,
        required=True,
        metavar="N",
        help="sequences per step (count)",
    )
    search.add_argument(
        "--simulate",
        type=int,
        default=8,
        metavar="K",
        help="simulate the K best estimates (count; 0: estimate only; default: 8)",
    )
    search.add_argument(
        "--top", type=positive_int, default=10, metavar="N", help="rows to print (default: 10)"
    )
    search.add_argument(
        "--micro-batches",
        type=_int_list,
        default=[1, 2, 4, 8],
        metavar="LIST",
        help="micro-batch sizes to consider (default: 1,2,4,8)",
    )
    search.add_argument(
        "--recompute",
        type=_recompute_list,
        default=["none", "selective", "full"],
        metavar="LIST",
        help="activation recomputation to consider (default: none,selective,full)",
    )
    search.add_argument(
        "--virtual-stages",
        type=_int_list,
        default=[1, 2],
        metavar="LIST",
        help="model chunks per pipeline stage to consider (default: 1,2)",
    )
    search.add_argument(
        "--precision",
        type=_precision_list,
        default=["bf16"],
        metavar="LIST",
        help="linear-layer precisions to consider: bf16, fp8 (H100 and later; default: bf16)",
    )
    search.add_argument(
        "--cp",
        type=_int_list,
        default=[1],
        metavar="LIST",
        help="context-parallel sizes to consider (long sequences; default: 1)",
    )
    search.add_argument(
        "--ep",
        type=_int_list,
        default=None,
        metavar="LIST",
        help="expert-parallel sizes to consider for MoE models (default: every one that "
        "divides DP and the experts)",
    )
    search.add_argument(
        "--sharding",
        type=_sharding_list,
        default=["optimizer"],
        metavar="LIST",
        help="how data-parallel replicas shard their state: optimizer (the distributed "
        "optimizer), fsdp (weights, gradients and optimizer), or both (default: optimizer)",
    )
    search.add_argument(
        "--no-sequence-parallel",
        action="store_true",
        help="keep TP all-reduces (default: sequence parallelism wherever TP > 1)",
    )
    search.add_argument(
        "--no-distributed-optimizer",
        action="store_true",
        help="replicate the optimizer (default: shard it over DP wherever DP > 1)",
    )
    search.add_argument(
        "--out",
        default=None,
        metavar="RESULTS.csv",
        help="results file (CSV): simulated candidates are appended and not run again",
    )
    search.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="local worker processes (count; default: every core; 1 runs in this process)",
    )
    search.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run on an existing Dask distributed cluster, e.g. tcp://host:8786",
    )
    search.add_argument(
        "--prices",
        default=None,
        metavar="FILE",
        help="YAML or JSON unit prices (item: price, as 'ccsim topology bom --prices'): "
        "adds the cluster's fabric cost and cost x step time (the cost per step/s)",
    )
    search.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    search.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: %(default)s)"
    )
    add_max_flows_option(search)
    search.set_defaults(handler=_cmd_search)


def _cmd_search(args: argparse.Namespace) -> None:
    from ..errors import CcsimError
    from ..search import COST_KEYS, SEARCH_KEYS, search
    from ..topology.bom import load_items

    if args.simulate < 0:
        raise CcsimError(f"--simulate must be 0 or more, got {args.simulate}")
    check_outputs(args, "out")
    prices = load_items(args.prices) if args.prices else None
    if args.out:
        from ..sweep.store import check_results_file

        check_results_file(args.out)
    result = search(
        args.model,
        args.topology,
        nodes=args.nodes,
        global_batch=args.global_batch,
        simulate=args.simulate,
        micro_batches=args.micro_batches,
        recompute=args.recompute,
        virtual_stages=args.virtual_stages,
        sequence_parallel=not args.no_sequence_parallel,
        distributed_optimizer=not args.no_distributed_optimizer,
        precisions=args.precision,
        context_parallel=args.cp,
        expert_parallel=args.ep,
        shardings=args.sharding,
        out=args.out,
        workers=args.workers,
        scheduler=args.scheduler,
        progress=False if args.quiet else None,
        max_flows=args.max_flows,
        prices=prices,
    )
    rows = result.ranked(args.top)
    keys = (*SEARCH_KEYS, *COST_KEYS) if prices is not None else SEARCH_KEYS
    failed = result.failed
    if not args.quiet:
        print(
            f"ccsim: {result.considered} configurations, {result.fitting} fit in memory; "
            f"simulated {len(result.rows) - len(failed)} ({result.ran} now, "
            f"{result.resumed} from the results file)"
            + (f"; {len(failed)} could not be" if failed else ""),
            file=sys.stderr,
        )
    for row in failed:  # one line each, whatever --quiet says: they are missing rows
        print(f"ccsim: not simulated: {row['label']}: {row['error']}", file=sys.stderr)
    if args.format == "json":
        emit(to_json([{k: row.get(k) for k in keys} for row in rows]), None)
    elif args.format == "csv":
        emit(to_csv(rows, keys), None)
    else:
        title = f"{args.model} on {args.nodes} x {args.topology}, global batch {args.global_batch}"
        emit(search_table(rows, title=title), None)
    if result.rows and len(failed) == len(result.rows):
        raise CcsimError(
            f"none of the {len(failed)} candidates chosen for simulation could be simulated "
            "(each is listed above with why); the table ranks them by estimate only"
        )
