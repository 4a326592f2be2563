"""``ccsim topology show``: summarize a topology and optionally draw it.

Registered by :func:`add_topology_commands`, which ``simulator.cli.build_parser`` calls.
"""

from __future__ import annotations

import argparse
import sys

from ..collective.guards import check_flows, cluster_of
from ..library.protocol import calibration_of
from ..topology import FABRICS, load_topology, summarize
from .args import add_max_flows_option, check_outputs, positive_int


def add_topology_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``topology show`` to the ``ccsim`` subcommands ``sub``."""
    topology = sub.add_parser(
        "topology",
        help="inspect one topology (see 'ccsim topology show --help')",
        description="Inspect one topology: a preset, a preset YAML file, an NCCL topology "
        "XML (NCCL_TOPO_DUMP_FILE, one server), an ASTRA-sim network YAML, or a GraphML / "
        "node-link JSON graph file.",
    )
    actions = topology.add_subparsers(dest="action", metavar="ACTION", parser_class=type(topology))
    actions.required = True
    show = actions.add_parser(
        "show",
        help="print counts and bandwidths of a topology, optionally draw it",
        description="Print the GPU, NIC and switch counts, the per-GPU intra-node and "
        "inter-node bandwidth and the bisection bandwidth (GB/s = 1e9 bytes/s, one "
        "direction) of a topology; with --png, also draw it.",
    )
    show.add_argument(
        "name",
        metavar="NAME",
        help="preset name (see 'ccsim topologies'), preset .yaml file, NCCL topology .xml "
        "(a server: --nodes and --fabric apply), ASTRA-sim network .yml, or .graphml / .json "
        "graph file",
    )
    show.add_argument(
        "--nodes",
        type=positive_int,
        default=1,
        metavar="N",
        help="number of servers of the preset (count, default: 1)",
    )
    show.add_argument(
        "--fabric",
        choices=sorted(FABRICS),
        default=None,
        metavar="F",
        help="fabric joining the servers (name: " + ", ".join(sorted(FABRICS)) + "; "
        "default: the preset's)",
    )
    show.add_argument(
        "--png",
        metavar="FILE",
        default=None,
        help="also draw the graph into FILE (path of a PNG image, written atomically): "
        "nodes in rows by role, links coloured by class, and a legend of node kinds "
        "(with counts) and link classes (with bandwidth per direction); names on the "
        "first server only",
    )
    add_max_flows_option(show)
    show.set_defaults(handler=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> None:
    check_outputs(args, "png")
    # Sized from the preset's numbers before it is built (--nodes 100000 is refused).
    cluster = cluster_of(args.name, args.nodes, fabric=args.fabric, max_flows=args.max_flows)
    check_flows(cluster.estimate(), args.max_flows)
    graph = load_topology(args.name, args.nodes, fabric=args.fabric)
    calibration_of(graph)  # a preset's nccl section is checked here, as on every run
    summary = summarize(graph, name=args.name)
    sys.stdout.write(summary.text())
    if args.png:
        from ..viz.topology import draw_topology  # matplotlib loads only when asked for

        title = f"{args.name} x{args.nodes}" + (f" ({summary.fabric})" if summary.fabric else "")
        path = draw_topology(graph, args.png, title=title)
        sys.stdout.write(f"drawing written to {path}\n")
