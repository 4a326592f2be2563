"""Argument types, options and output helpers shared by the ``ccsim`` subcommands."""

from __future__ import annotations

import argparse
import sys

from ..algorithms.chain import ROOTED_OPS
from ..collective.guards import (
    BYTES_PER_FLOW,
    ENVIRONMENT,
    GRAPH_ITEM_FLOWS,
    OP_FLOWS,
    check_collective,
    default_max_flows,
)
from ..errors import CcsimError
from ..files import check_writable, write_file
from ..library.nccl_env import SUPPORTED, NcclEnv, parse_nccl_env
from ..library.nccl_p2p import DEFAULT_VERSION as P2P_DEFAULT_VERSION
from ..network.faults import apply_faults, load_faults
from ..topology import servers_of_ranks
from ..topology.rates import apply_rates, parse_rates
from ..topology.stacks import stack_of


class Once(argparse.Action):
    """argparse action for an option naming one output: given twice (``--timeline a.png
    --timeline b.svg``), it is refused rather than the first silently dropped."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if getattr(namespace, self.dest, None) not in (None, self.default):
            parser.error(
                f"{option_string} given twice ({getattr(namespace, self.dest)} and {values}); "
                "give it once"
            )
        setattr(namespace, self.dest, values)


def positive_int(text: str) -> int:
    """argparse type: a positive integer (argparse reports the error on one line).

    >>> positive_int("4")
    4
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_chunks(text: str) -> int | str:
    """``--chunks``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")
    return value


def parse_channels(text: str) -> int | str:
    """``--channels``: a positive integer or ``auto``."""
    return parse_chunks(text)


def parse_fraction(text: str) -> float:
    """A multipath fraction in [0, 1] (a user-facing error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise CcsimError(f"--fraction must be a number in [0, 1] or auto, got {text!r}")
    return value


def add_model_options(cmd: argparse.ArgumentParser) -> None:
    """Options shared by collective, compare and run: fabric, ECMP seed, protocol model."""
    cmd.add_argument(
        "--fabric",
        default=None,
        metavar="TYPE",
        help="fabric joining the servers: rail-optimized, leaf-spine, fat-tree or single-switch "
        "(default: the preset's; given explicitly, one server also gets its switches)",
    )
    cmd.add_argument(
        "--seed", type=int, default=None, metavar="S", help="ECMP hash seed (default: 0)"
    )
    cmd.add_argument(
        "--routing",
        default=None,
        metavar="MODE",
        help="how switches pick among equal-cost paths: per_destination (InfiniBand's subnet "
        "manager: one up-port per destination NIC) or ecmp (a hash per connection, as "
        "Ethernet) (default: the fabric's routing, else its NICs' stack's)",
    )
    cmd.add_argument(
        "--proto",
        default=None,
        metavar="NAME",
        help="protocol model: LL, LL128, Simple, or auto for the fastest (as NCCL_PROTO); "
        "with it, link efficiencies, per-hop latencies (us) and launch overhead of the preset "
        "apply (default: none, the ideal line-rate model)",
    )
    add_nccl_option(cmd)
    cmd.add_argument(
        "--fault",
        action="append",
        default=None,
        metavar="SPEC",
        help="a fault (repeatable): a YAML file of faults or one inline, e.g. "
        "link=s0/nic0-leaf0:0.5 (that link at half bandwidth), kind=rdma:0.5,latency=2us, "
        "server=3:0.25, rail=2:0.5,t0=1ms,t1=3ms, fail=s1/nic3 or fail=leaf0-spine1 (down; "
        "routes avoid it), gpu=5:compute=2 (a straggler), "
        "random:q=0.05,fraction=0.5,seed=1 (each link degraded with probability q); see "
        "simulator/network/faults.py (default: a healthy cluster)",
    )
    add_rates_option(cmd)


def add_rates_option(cmd: argparse.ArgumentParser) -> None:
    """``--nic-rate``: measured rates of single NICs and links
    (:mod:`simulator.topology.rates`)."""
    cmd.add_argument(
        "--nic-rate",
        action="append",
        default=None,
        metavar="RATES",
        help="measured rates of single NICs or links, as ib_write_bw reports them "
        "(repeatable): s0/nic0=40GB/s,s1/nic3=45GB/s (NIC 3 of server 1), "
        "s0/nic0-leaf0=45GB/s (one link), or a YAML file mapping names to rates; they are "
        "what the bytes see, NCCL's choice still sees the port speed (default: the "
        "preset's rates)",
    )


def add_nccl_option(cmd: argparse.ArgumentParser, *, version: bool = True) -> None:
    """``--nccl``: NCCL's environment settings (:mod:`simulator.library.nccl_env`); and
    ``--nccl-version`` unless ``version`` is False (sweeps take settings as spec text)."""
    cmd.add_argument(
        "--nccl",
        action="append",
        default=None,
        metavar="SETTINGS",
        help="NCCL environment settings, as exported to NCCL (repeatable), e.g. "
        "NCCL_ALGO=Ring,Tree,NCCL_PROTO=^LL128,NCCL_MAX_NCHANNELS=8 (a comma item without = "
        "continues the previous list; NCCL's syntax: ^ excludes, "
        "NCCL_ALGO=allreduce:tree,ring;allgather:ring per function). Supported: "
        + ", ".join(SUPPORTED)
        + "; they restrict NCCL's choice, NCCL_NVLS_CHUNKSIZE sets its NVLS chunk and "
        "NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE its protocols' buffers, in "
        "bytes (default: NCCL's defaults)",
    )
    if not version:
        return
    cmd.add_argument(
        "--nccl-version",
        default=None,
        metavar="V",
        help="the NCCL version that runs, e.g. 2.28.7, where its rules differ from the "
        "modelled one's (all-to-all's send/receive channels and protocol before 2.29) "
        f"(default: {P2P_DEFAULT_VERSION})",
    )


def nccl_env_of(args: argparse.Namespace) -> NcclEnv:
    """The parsed ``--nccl`` settings and ``--nccl-version`` (empty when none given)."""
    env = parse_nccl_env(getattr(args, "nccl", None))
    return env.with_version(getattr(args, "nccl_version", None))


def nccl_title(title: str, env: NcclEnv) -> str:
    """A table title with the NCCL settings on a line of their own (when given)."""
    return f"{title}\n# nccl: {nccl_text(env)}" if env else title


def nccl_text(env: NcclEnv) -> str:
    """The settings as exported, and the version when given (``NCCL_PROTO=Simple,
    version 2.28.7``)."""
    version = f"version {env.version}" if env.version else ""
    return ", ".join(part for part in (env.text, version) if part)


def stack_env(graph, env: NcclEnv) -> NcclEnv:
    """``env`` over the settings the topology's network stack exports when a call spans
    servers (:mod:`simulator.topology.stacks`): what NCCL's choice runs with there, for
    the table's ``# nccl:`` line and the rows' ``nccl_env``."""
    servers = servers_of_ranks(graph)
    stack = stack_of(graph)
    if stack is None or not stack.nccl or servers is None or len(set(servers)) < 2:
        return env
    return env.over(stack.nccl)


def nccl_field(rows: list[dict], env: NcclEnv) -> list[dict]:
    """``rows`` with the NCCL settings as their ``nccl_env`` field (when given)."""
    return [{**row, "nccl_env": nccl_text(env)} for row in rows] if env else rows


def with_faults(graph, args: argparse.Namespace):
    """The topology with ``--nic-rate`` (:func:`simulator.topology.rates.apply_rates`), then
    ``--fault`` (:func:`simulator.network.faults.apply_faults`) applied; the graph itself
    without either."""
    graph = apply_rates(graph, parse_rates(getattr(args, "nic_rate", None)))
    faults = getattr(args, "fault", None)
    return apply_faults(graph, load_faults(faults)) if faults else graph


def add_max_flows_option(cmd: argparse.ArgumentParser) -> None:
    """``--max-flows``: the resource guard's limit (:mod:`simulator.collective.guards`)."""
    cmd.add_argument(
        "--max-flows",
        type=positive_int,
        default=None,
        metavar="N",
        help="refuse, before building anything, a run estimated to create more than N flows "
        f"(about {BYTES_PER_FLOW} bytes each; a topology node or link counts as "
        f"{GRAPH_ITEM_FLOWS}, a trace op as {OP_FLOWS}) (default: ${ENVIRONMENT} if set, "
        f"else a quarter of this machine's memory: {default_max_flows():,})",
    )


def check_run_size(args: argparse.Namespace, sizes: list[int], algorithms: list) -> None:
    """The resource guard for ``collective`` or ``compare``: refuse, before the topology
    is built, a run of ``algorithms`` (None: the topology's library) past the limit."""
    check_collective(
        args.topology,
        args.op,
        sizes,
        algorithms,
        nodes=args.nodes,
        fabric=args.fabric,
        chunks=args.chunks,
        channels=args.channels,
        protocol=args.proto,
        max_flows=args.max_flows,
        nccl=nccl_env_of(args),
        nvls_tree_loops=getattr(args, "nvls_tree_loops", False),
    )


def root_of(op: str, root: int | None) -> int:
    """``--root``: the root rank of a broadcast or reduce (default 0); refused for
    operations that have none rather than silently ignored.

    >>> root_of("broadcast", 3), root_of("all_reduce", None)
    (3, 0)
    """
    if root is None:
        return 0
    if op not in ROOTED_OPS:
        raise CcsimError(
            f"--root applies to {' and '.join(ROOTED_OPS)} only; {op} has no root rank"
        )
    return root


def parse_trace_detail(text: str) -> tuple[str, ...]:
    """``--trace-detail``: a comma list of phases, ranks, links, counters, or all.

    >>> parse_trace_detail("ranks,phases")
    ('ranks', 'phases')
    """
    from ..viz.perfetto import DETAILS

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if names == ("all",):
        return DETAILS
    wrong = [name for name in names if name not in DETAILS]
    if wrong or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(DETAILS)} (or all), got {text!r}"
        )
    return names


def parse_rank_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """``--trace-ranks``: ranks and ranges such as ``0-7,64``, as ``(first, last)`` pairs.

    >>> parse_rank_ranges("0-7,64")
    ((0, 7), (64, 64))
    """
    ranges = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            pair = (int(first), int(last or first))
        except ValueError:
            pair = (0, -1)
        if not 0 <= pair[0] <= pair[1]:
            raise argparse.ArgumentTypeError(
                f"expected ranks such as 0-7,64 (whole numbers from 0, ranges low-high), "
                f"got {text!r}"
            )
        ranges.append(pair)
    return tuple(ranges)


def add_trace_options(cmd: argparse.ArgumentParser) -> None:
    """``--trace-detail`` and ``--trace-ranks``: what ``--trace`` (and a report's
    trace.json) holds."""
    from ..viz.perfetto import DEFAULT_DETAIL

    cmd.add_argument(
        "--trace-detail",
        type=parse_trace_detail,
        default=DEFAULT_DETAIL,
        metavar="LIST",
        help="what --trace holds: a comma list of phases, ranks (each GPU stream's "
        "transfers or ops; above 256 ranks also the heat-map's utilisation per server "
        "and per rail, as counter tracks), links (each link's busy spans), counters (link "
        "utilisation over time; the bulk of a large trace), or all (default: "
        + ",".join(DEFAULT_DETAIL)
        + ": a 1024-rank collective is then tens of MB as .json.gz)",
    )
    cmd.add_argument(
        "--trace-ranks",
        type=parse_rank_ranges,
        default=None,
        metavar="RANKS",
        help="keep only these ranks in --trace, e.g. 0-7,64: their streams and the links "
        "into and out of their GPUs (default: every rank)",
    )


def check_outputs(args: argparse.Namespace, *names: str) -> None:
    """Check the files that the options ``names`` (``out``, ``plot``, ...) name, before
    anything is simulated: a missing folder fails at once, not after a long run."""
    for name in names:
        value = getattr(args, name, None)
        if value:
            check_writable(value, option=f"--{name}")


def emit(text: str, out: str | None) -> None:
    """Write a command's output to the file ``out``, or to stdout if none is given."""
    if out:
        write_file(out, text)
    else:
        sys.stdout.write(text)
