"""Comparing collective algorithms by simulation, and picking the fastest: ``auto``.

:class:`AutoTuner` finds, for a topology, an operation and a message size, the fastest
registered algorithm and its chunk count by simulating the candidates. It remembers
each choice per (topology, operation, size bucket): sizes within a factor of two of
each other (same ``floor(log2(size))``) share a choice, so a program that issues the
same collective many times pays for the search once. The tuner is an ordinary object
owned by its caller; there is no global cache, so two simulations in one process
never see each other's choices.

:func:`compare` simulates a list of algorithms over a list of sizes on one topology
(loaded once) and returns rows for a table, JSON, CSV or a plot
(:func:`compare_table`, :func:`save_plot`); :func:`add_compare_command` adds
``ccsim compare`` to the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from .algorithms import algorithm_names, build_schedule, get_algorithm
from .algorithms.base import RankLayout
from .algorithms.chain import ROOTED_OPS
from .cli_args import positive_int
from .collective import (
    COLLECTIVE_OPS,
    CollectiveResult,
    auto_fraction,
    rank_layout,
    run_schedule,
)
from .errors import CcsimError
from .report import FORMATS, to_csv, to_json, write_atomically
from .topology import load_topology
from .units import parse_bandwidth, parse_sizes

#: Chunk counts tried, in this order, when chunks are "auto".
CHUNK_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
#: Channel counts tried, in this order, when channels are "auto" (NCCL runs up to 32).
CHANNEL_CANDIDATES = (1, 2, 4, 8, 16, 32)
#: More chunks must save at least this fraction of the time to be chosen: each chunk is
#: more messages, whose fixed costs (kernel steps, headers) the flow model does not charge.
MIN_GAIN = 0.01

#: Keys of a compare row (``--format json`` / ``csv``).
COMPARE_KEYS = (
    "op",
    "algorithm",
    "ranks",
    "size_bytes",
    "chunks",
    "channels",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "winner",
)


def topology_key(graph: nx.Graph) -> str:
    """A digest of ``graph``'s nodes, links and their attributes.

    Two graphs with the same content get the same key, whatever object holds them.
    """
    digest = hashlib.sha256()
    digest.update(b"directed" if graph.is_directed() else b"undirected")
    # Every attribute counts (bandwidth, latency, message rates, servers...): cheaper to
    # hash them all than to know which ones some model version reads.
    nodes = sorted(
        repr((repr(node), sorted(data.items()))) for node, data in graph.nodes(data=True)
    )

    def ends(u, v) -> tuple[str, ...]:
        pair = (repr(u), repr(v))
        return pair if graph.is_directed() else tuple(sorted(pair))

    edges = sorted(
        repr((ends(u, v), sorted(data.items()))) for u, v, data in graph.edges(data=True)
    )
    for line in (*nodes, *edges):
        digest.update(line.encode())
    return digest.hexdigest()[:16]


def size_bucket(size_bytes: float) -> int:
    """Sizes in ``[2^b, 2^(b+1))`` share bucket ``b``.

    >>> size_bucket(1024), size_bucket(1500), size_bucket(2048)
    (10, 10, 11)
    """
    return math.floor(math.log2(size_bytes))


@dataclass(frozen=True)
class Choice:
    """An algorithm, chunk and channel count, with the time it took where it was chosen."""

    algorithm: str
    chunks: int
    time_s: float
    channels: int = 1


class AutoTuner:
    """Picks the fastest algorithm and chunk count per size, by simulation, with a cache.

    Parameters
    ----------
    algorithms : sequence of str, optional
        Candidates for ``algorithm="auto"``; default every registered algorithm that
        supports the operation on the topology's ranks.
    chunk_candidates : sequence of int
        Chunk counts tried for ``chunks="auto"``, in increasing order. The search stops
        at the first count that is not at least :data:`MIN_GAIN` faster than the best so
        far (time as a function of chunks falls while pipelining hides latency and
        transfers overlap, and rises once per-chunk latency dominates).
    channels : int or "auto"
        Channels every candidate runs with, or "auto" to search
        :data:`CHANNEL_CANDIDATES` per algorithm as chunk counts are searched (parallel
        rings spread over more NICs and paths, and cut each message finer).
    reduce_bandwidth : float, optional
        Bytes/s of local reductions (see :func:`simulator.simulate_collective`).
    protocol : str, optional
        Protocol model every candidate runs with (None: ideal; "auto": the fastest).

    Examples
    --------
    >>> from simulator.topology import ring_graph
    >>> tuner = AutoTuner(algorithms=["ring", "direct"], chunk_candidates=(1,))
    >>> graph = ring_graph(8, 100e9, 1e-6)
    >>> tuner.choose(graph, "all_reduce", 8).algorithm  # 2 steps of <= 4 hops, not 14 steps
    'direct'
    >>> tuner.choose(graph, "all_reduce", 2**30).algorithm  # no detours sharing links
    'ring'
    >>> tuner.choose(graph, "all_reduce", 12) is tuner.choose(graph, "all_reduce", 8)
    True
    """

    def __init__(
        self,
        *,
        algorithms: Sequence[str] | None = None,
        chunk_candidates: Sequence[int] = CHUNK_CANDIDATES,
        channels: int = 1,
        reduce_bandwidth: float | None = None,
        protocol: str | None = None,
    ) -> None:
        if algorithms is not None:
            for name in algorithms:
                get_algorithm(name)  # unknown names fail now, listing the valid ones
        if not chunk_candidates or any(
            not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in chunk_candidates
        ):
            raise CcsimError(
                f"chunk candidates must be positive integers, got {chunk_candidates!r}"
            )
        self.algorithms = None if algorithms is None else list(algorithms)
        self.chunk_candidates = tuple(sorted(set(chunk_candidates)))
        if channels != "auto" and (
            isinstance(channels, bool) or not isinstance(channels, int) or channels < 1
        ):
            raise CcsimError(f"channels must be a positive integer or 'auto', got {channels!r}")
        self.channels = channels
        self.reduce_bandwidth = reduce_bandwidth
        self.protocol = protocol
        self._choices: dict[tuple, Choice] = {}
        self._times: dict[tuple, float] = {}
        self.simulations = 0  # how many schedules the tuner has replayed

    def run(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        algorithm: str,
        chunks: int,
        *,
        layout: RankLayout | None = None,
        root: int = 0,
        channels: int | None = None,
    ) -> CollectiveResult:
        """Simulate one configuration (no caching); ``channels`` defaults to the tuner's
        (1 when that is "auto")."""
        layout = layout or rank_layout(graph)
        if channels is None:
            channels = 1 if self.channels == "auto" else self.channels
        options: dict[str, Any] = {"root": root} if op in ROOTED_OPS else {}
        if algorithm == "multipath":
            options["fraction"] = auto_fraction(
                graph, op, size_bytes, chunks=chunks, channels=channels, protocol=self.protocol
            )
        schedule = build_schedule(
            algorithm, op, layout, size_bytes, chunks=chunks, channels=channels, **options
        )
        self.simulations += 1
        return run_schedule(
            graph, schedule, reduce_bandwidth=self.reduce_bandwidth, protocol=self.protocol
        )

    def best_chunks(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        algorithm: str,
        *,
        layout: RankLayout | None = None,
        root: int = 0,
        channels: int | None = None,
    ) -> tuple[CollectiveResult, int]:
        """The fastest chunk count of ``algorithm`` at this size, and its result."""
        layout = layout or rank_layout(graph)
        best: tuple[CollectiveResult, int] | None = None
        for chunks in self.chunk_candidates:
            try:
                result = self.run(
                    graph,
                    op,
                    size_bytes,
                    algorithm,
                    chunks,
                    layout=layout,
                    root=root,
                    channels=channels,
                )
            except CcsimError:
                if best is None:
                    raise
                break  # too many chunks to build (e.g. direct all-reduce's size limit)
            if best is not None and not result.time_s < best[0].time_s * (1 - MIN_GAIN):
                break
            best = (result, chunks)
        assert best is not None  # chunk_candidates is never empty
        return best

    def candidates(self, op: str, layout: RankLayout) -> list[str]:
        """Algorithms ``auto`` considers for ``op`` on ``layout``."""
        names = self.algorithms if self.algorithms is not None else algorithm_names()
        able = [name for name in names if get_algorithm(name).unsupported(op, layout) is None]
        if not able:
            raise CcsimError(
                f"no algorithm among {', '.join(names)} can run {op} on {layout.ranks} ranks"
            )
        return able

    def choose(
        self,
        graph: nx.Graph,
        op: str,
        size_bytes: float,
        *,
        algorithm: str = "auto",
        chunks: int | str = "auto",
        root: int = 0,
    ) -> Choice:
        """The fastest (algorithm, chunks) for ``op`` at this size's bucket on ``graph``.

        ``algorithm`` or ``chunks`` may be fixed; what is "auto" is searched.
        """
        if op not in COLLECTIVE_OPS:
            raise CcsimError(
                f"unknown operation {op!r}; valid choices: {', '.join(COLLECTIVE_OPS)}"
            )
        key = (topology_key(graph), op, size_bucket(size_bytes), algorithm, chunks, root)
        if key in self._choices:
            return self._choices[key]
        layout = rank_layout(graph)
        names = self.candidates(op, layout) if algorithm == "auto" else [algorithm]
        best: Choice | None = None
        channel_counts = CHANNEL_CANDIDATES if self.channels == "auto" else (self.channels,)
        for name in names:
            mine: Choice | None = None  # this algorithm's best over channel counts
            for c in channel_counts:
                try:
                    if chunks == "auto":
                        result, k = self.best_chunks(
                            graph, op, size_bytes, name, layout=layout, root=root, channels=c
                        )
                    else:
                        k = int(chunks)
                        result = self.run(
                            graph, op, size_bytes, name, k, layout=layout, root=root, channels=c
                        )
                except CcsimError:
                    if len(names) == 1 and mine is None:
                        raise
                    break  # e.g. multipath on a server whose NICs reach no switch
                if mine is not None and not result.time_s < mine.time_s * (1 - MIN_GAIN):
                    break  # more channels no longer pay (as with chunks)
                mine = Choice(name, k, result.time_s, c)
            if mine is not None and (best is None or mine.time_s < best.time_s):
                best = mine
        assert best is not None
        self._choices[key] = best
        self._times[(*key[:2], float(size_bytes), *key[3:])] = best.time_s
        return best

    def time_s(self, graph: nx.Graph, op: str, size_bytes: float, **choice: Any) -> float:
        """Simulated time of the chosen configuration at exactly this size (cached)."""
        key = (
            topology_key(graph),
            op,
            float(size_bytes),
            choice.get("algorithm", "auto"),
            choice.get("chunks", "auto"),
            choice.get("root", 0),
        )
        if key not in self._times:
            result = self.simulate(graph, op, size_bytes, **choice)
            self._times[key] = result.time_s
        return self._times[key]

    def simulate(
        self, graph: nx.Graph, op: str, size_bytes: float, *, root: int = 0, **choice: Any
    ) -> CollectiveResult:
        """Simulate the chosen configuration at this size; ``params`` record the choice."""
        picked = self.choose(graph, op, size_bytes, root=root, **choice)
        result = self.run(
            graph,
            op,
            size_bytes,
            picked.algorithm,
            picked.chunks,
            root=root,
            channels=picked.channels,
        )
        result.params.update(chunks=picked.chunks, channels=picked.channels)
        return result


def compare(
    graph: nx.Graph,
    op: str,
    sizes: Sequence[float],
    algorithms: Sequence[str],
    *,
    chunks: int | str = "auto",
    channels: int = 1,
    reduce_bandwidth: float | None = None,
    root: int = 0,
    protocol: str | None = None,
) -> list[dict[str, Any]]:
    """Simulate each algorithm at each size; one row per (size, algorithm).

    Rows have the keys :data:`COMPARE_KEYS`; ``winner`` marks the fastest algorithm at
    each size (ties go to the first listed). With ``chunks="auto"`` each algorithm runs
    with its best chunk count at that size.

    Examples
    --------
    All-gather of 4 MB on a ring of 4 GPUs (100 GB/s, 1 us per link): the ring takes
    3 x (1 us + 10 us); direct sends each 1 MB block straight to its destination, the
    2-hop ones clockwise, so every link carries 3 blocks: 30 us + 2 us.

    >>> from simulator.topology import ring_graph
    >>> graph = ring_graph(4, 100e9, 1e-6)
    >>> rows = compare(graph, "all_gather", [4e6], ["ring", "direct"], chunks=1)
    >>> [(row["algorithm"], round(row["time_us"], 6), row["winner"]) for row in rows]
    [('ring', 33.0, False), ('direct', 32.0, True)]
    """
    if not algorithms:
        raise CcsimError("give at least one algorithm to compare")
    for name in algorithms:
        get_algorithm(name)
    tuner = AutoTuner(channels=channels, reduce_bandwidth=reduce_bandwidth, protocol=protocol)
    layout = rank_layout(graph)
    rows = []
    for size in sizes:
        group = []
        for name in algorithms:
            if chunks == "auto":
                result, k = tuner.best_chunks(
                    graph, op, float(size), name, layout=layout, root=root
                )
            else:
                k = int(chunks)
                result = tuner.run(graph, op, float(size), name, k, layout=layout, root=root)
            group.append({**result.row(), "chunks": k, "channels": channels, "winner": False})
        fastest = min(range(len(group)), key=lambda i: group[i]["time_us"])
        group[fastest]["winner"] = True
        rows.extend(group)
    return rows


def compare_table(rows: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """Bus bandwidth (GB/s) per size (rows) and algorithm (columns), and the winner."""
    algorithms = list(dict.fromkeys(row["algorithm"] for row in rows))
    sizes = list(dict.fromkeys(row["size_bytes"] for row in rows))
    cell = {(row["size_bytes"], row["algorithm"]): row for row in rows}
    width = max([12, *(len(name) + 1 for name in algorithms)])
    lines = [f"# {title}", "#"] if title else []
    lines.append(f"#{'size':>11}" + "".join(f"{name:>{width}}" for name in algorithms) + "  winner")
    lines.append(f"#{'(B)':>11}" + "".join(f"{'(GB/s)':>{width}}" for _ in algorithms))
    for size in sizes:
        line = f"{size:>12}"
        winner = ""
        for name in algorithms:
            row = cell.get((size, name))
            line += f"{row['busbw_GBps']:>{width}.2f}" if row else f"{'-':>{width}}"
            if row and row["winner"]:
                winner = f"{name} (chunks {row['chunks']})"
        lines.append(f"{line}  {winner}")
    return "\n".join(lines) + "\n"


def save_plot(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> None:
    """Bus bandwidth against size (log x), one line per algorithm, written atomically."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    path = Path(path)
    suffix = path.suffix.lower().lstrip(".") or "png"
    figure = Figure(figsize=(8, 5), dpi=100)
    axes = figure.add_subplot()
    for name in dict.fromkeys(row["algorithm"] for row in rows):
        mine = [row for row in rows if row["algorithm"] == name]
        axes.plot(
            [row["size_bytes"] for row in mine],
            [row["busbw_GBps"] for row in mine],
            marker="o",
            markersize=3,
            label=name,
        )
    axes.set_xscale("log", base=2)
    sizes = [row["size_bytes"] for row in rows]
    low, high = math.floor(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    step = max(1, (high - low + 11) // 12)  # at most about 12 labelled ticks
    axes.set_xticks([2.0**e for e in range(low, high + 1, step)])
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: _binary(x)))
    axes.xaxis.set_minor_formatter(FuncFormatter(lambda _x, _pos: ""))
    axes.set_xlabel("message size (bytes; K, M, G = 2^10, 2^20, 2^30)")
    axes.set_ylabel("bus bandwidth (GB/s, 1e9 B/s)")
    axes.set_title(title, fontsize=9)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    folder = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=f".{suffix}")
    os.close(handle)
    try:
        figure.savefig(temporary, format=suffix)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _binary(size: float) -> str:
    """A byte count as nccl-tests users write it: 512, 64K, 1M, 4G."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}"


def parse_channels(text: str) -> int | str:
    """``--channels``: a positive integer or ``auto``."""
    return parse_chunks(text)


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


def add_compare_command(sub: argparse._SubParsersAction) -> None:
    """Add ``ccsim compare`` to the CLI's subcommands."""
    cmd = sub.add_parser(
        "compare",
        help="compare collective algorithms over a range of message sizes",
        description="Simulate several algorithms for one collective on one topology and "
        "print bus bandwidth (GB/s = 1e9 bytes/s) per algorithm and size, and the fastest "
        "per size. Each algorithm runs with its best chunk count unless --chunks is given.",
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
        default="ring,hierarchical,pipelined,tree",
        metavar="NAMES",
        help=f"comma-separated algorithms among {', '.join(algorithm_names())} "
        "(default: %(default)s)",
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
        help="chunks (pipeline slices) per algorithm: a count, or auto for each "
        "algorithm's fastest of " + ", ".join(map(str, CHUNK_CANDIDATES)) + " (default: auto)",
    )
    cmd.add_argument(
        "--channels", type=positive_int, default=1, metavar="C", help="channels (default: 1)"
    )
    cmd.add_argument(
        "--root",
        type=int,
        default=0,
        metavar="R",
        help="root rank of broadcast/reduce (default: 0)",
    )
    cmd.add_argument(
        "--reduce-bw",
        default=None,
        metavar="BW",
        help="bandwidth of local reductions, e.g. 1500GB/s (default: the preset's, else infinite)",
    )
    add_model_options(cmd)
    cmd.add_argument(
        "--plot", metavar="FILE", help="also draw busbw against size into FILE (png, svg, pdf)"
    )
    cmd.add_argument(
        "--timeline",
        metavar="FILE",
        help="also draw a Gantt chart (time in us/ms) of the winner at the LAST size into "
        "FILE (png, svg, pdf)",
    )
    cmd.add_argument(
        "--trace",
        metavar="FILE",
        help="also write a Chrome trace-event JSON (ts/dur in microseconds) of the winner "
        "at the LAST size",
    )
    cmd.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: %(default)s)"
    )
    cmd.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    cmd.set_defaults(handler=_cmd_compare)


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
        "--proto",
        default=None,
        metavar="NAME",
        help="protocol model: LL, LL128, Simple, or auto for the fastest (as NCCL_PROTO); "
        "with it, link efficiencies, per-hop latencies (us) and launch overhead of the preset "
        "apply (default: none, the ideal line-rate model)",
    )


def _cmd_compare(args: argparse.Namespace) -> None:
    sizes = parse_sizes(args.sizes)
    algorithms = [name.strip() for name in args.algos.split(",") if name.strip()]
    for name in algorithms:
        get_algorithm(name)
    reduce_bw = parse_bandwidth(args.reduce_bw, field="--reduce-bw") if args.reduce_bw else None
    if args.plot:
        folder = Path(args.plot).parent
        if str(folder) and not folder.is_dir():
            raise CcsimError(f"--plot {args.plot!r}: folder {str(folder)!r} does not exist")
    graph = load_topology(args.topology, args.nodes, fabric=args.fabric, seed=args.seed)
    layout = rank_layout(graph)
    for name in algorithms:  # fail before simulating anything
        reason = get_algorithm(name).unsupported(args.op, layout)
        if reason is not None:
            build_schedule(name, args.op, layout, 1.0)  # raises the standard message
    rows = compare(
        graph,
        args.op,
        sizes,
        algorithms,
        chunks=args.chunks,
        channels=args.channels,
        reduce_bandwidth=reduce_bw,
        root=args.root,
        protocol=args.proto,
    )
    title = (
        f"ccsim compare {args.op} | topology {args.topology} x{args.nodes} | "
        f"{layout.ranks} ranks | chunks {args.chunks} | channels {args.channels} | busbw"
    )
    if args.format == "json":
        text = to_json(rows)
    elif args.format == "csv":
        text = to_csv(rows, COMPARE_KEYS)
    else:
        text = compare_table(rows, title=title)
    if args.plot:
        save_plot(rows, args.plot, title=title)
    if args.timeline or args.trace:
        # matplotlib and the viz package load only when asked for.
        from .viz.outputs import check_output_options, write_collective_outputs

        check_output_options(timeline=args.timeline, trace=args.trace, report=None, force=False)
        last = [row for row in rows if row["size_bytes"] == rows[-1]["size_bytes"]]
        winner = next((row for row in last if row.get("winner")), last[0])
        tuner = AutoTuner(channels=args.channels, reduce_bandwidth=reduce_bw, protocol=args.proto)
        result = tuner.run(
            graph,
            args.op,
            float(winner["size_bytes"]),
            winner["algorithm"],
            int(winner["chunks"]),
            root=args.root,
        )
        write_collective_outputs(
            result, graph, rows=rows, table=text, timeline=args.timeline, trace=args.trace
        )
    if args.out:
        write_atomically(args.out, text)
    else:
        sys.stdout.write(text)
