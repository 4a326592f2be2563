"""``ccsim topology show`` and ``ccsim topology bom``: summarize a topology, draw it, and
count what building it takes.

Registered by :func:`add_topology_commands`, which ``simulator.cli.build_parser`` calls.
"""

from __future__ import annotations

import argparse
import sys

from ..collective.guards import check_flows, cluster_of
from ..library.protocol import calibration_of
from ..topology import FABRICS, load_topology, summarize
from ..topology.bom import bill_of_materials, load_items
from ..viz.tables import FORMATS, bom_table, to_csv, to_json
from .args import add_max_flows_option, add_rates_option, check_outputs, emit, positive_int


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
    _topology_arguments(show)
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

    bom = actions.add_parser(
        "bom",
        help="count the switches, cables, optics, power and cost of a topology",
        description="Print the bill of materials of a topology: servers, GPUs, NICs by "
        "speed, fabric switches by tier (ports used, radix of the cited switch for their "
        "port speed), links by kind (inside servers, server-to-leaf, leaf-to-spine, ...) "
        "and length class (copper DAC to a switch in the server's rack, optical "
        "otherwise), transceivers (two per optical cable), network power in kW (typical "
        "watts of cited datasheets) and, with --prices, the cost. Items are named "
        "server, nic-SPEED, switch-SPEED, transceiver-SPEED, copper-cable-SPEED and "
        "optical-cable-SPEED (SPEED such as 400G).",
    )
    _topology_arguments(bom)
    bom.add_argument(
        "--prices",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of unit prices, item: price (e.g. 'switch-400G: 25000'); "
        "none are bundled",
    )
    bom.add_argument(
        "--watts",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of typical watts per unit, item: watts, overriding or "
        "filling in the cited figures (e.g. 'nic-400G: 25')",
    )
    bom.add_argument(
        "--servers-per-rack",
        type=positive_int,
        default=None,
        metavar="R",
        help="servers a rack holds, which decides copper or optical NIC cables (count; "
        "default: 32 GPUs' worth, at least 1)",
    )
    bom.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: %(default)s)"
    )
    bom.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    add_max_flows_option(bom)
    bom.set_defaults(handler=_cmd_bom)


def _topology_arguments(cmd: argparse.ArgumentParser) -> None:
    """The topology, server count and fabric that ``show`` and ``bom`` take alike."""
    cmd.add_argument(
        "name",
        metavar="NAME",
        help="preset name (see 'ccsim topologies'), preset .yaml file, NCCL topology .xml "
        "(a server: --nodes and --fabric apply), ASTRA-sim network .yml, or .graphml / .json "
        "graph file",
    )
    cmd.add_argument(
        "--nodes",
        type=positive_int,
        default=1,
        metavar="N",
        help="number of servers of the preset (count, default: 1)",
    )
    cmd.add_argument(
        "--fabric",
        choices=sorted(FABRICS),
        default=None,
        metavar="F",
        help="fabric joining the servers (name: " + ", ".join(sorted(FABRICS)) + "; "
        "default: the preset's)",
    )
    add_rates_option(cmd)


def _cmd_show(args: argparse.Namespace) -> None:
    check_outputs(args, "png")
    # Sized from the preset's numbers before it is built (--nodes 100000 is refused).
    cluster = cluster_of(args.name, args.nodes, fabric=args.fabric, max_flows=args.max_flows)
    check_flows(cluster.estimate(), args.max_flows)
    graph = load_topology(args.name, args.nodes, fabric=args.fabric, rates=args.nic_rate)
    calibration_of(graph)  # a preset's nccl section is checked here, as on every run
    summary = summarize(graph, name=args.name)
    sys.stdout.write(summary.text())
    if args.png:
        from ..viz.topology import draw_topology  # matplotlib loads only when asked for

        title = f"{args.name} x{args.nodes}" + (f" ({summary.fabric})" if summary.fabric else "")
        path = draw_topology(graph, args.png, title=title)
        sys.stdout.write(f"drawing written to {path}\n")


def _cmd_bom(args: argparse.Namespace) -> None:
    check_outputs(args, "out")
    # Price and watts files are read first: a bad one fails before anything is built.
    prices = load_items(args.prices, what="price") if args.prices else None
    watts = load_items(args.watts, what="watts") if args.watts else None
    cluster = cluster_of(args.name, args.nodes, fabric=args.fabric, max_flows=args.max_flows)
    check_flows(cluster.estimate(), args.max_flows)
    graph = load_topology(args.name, args.nodes, fabric=args.fabric, rates=args.nic_rate)
    bom = bill_of_materials(
        graph,
        name=f"{args.name} x {args.nodes}",
        servers_per_rack=args.servers_per_rack,
        prices=prices,
        watts=watts,
    )
    if args.format == "json":
        text = to_json([{"rows": bom.rows(), "totals": bom.totals()}])
    elif args.format == "csv":
        text = to_csv(bom.rows())
    else:
        text = bom_table(bom)
    emit(text, args.out)
