"""The ``ccsim`` command line.

Every subcommand's options name their unit in ``--help``. Errors in the input print one
line naming what is wrong and the valid choices, and exit with code 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..algorithms import algorithm_names, get_algorithm
from ..errors import CcsimError
from ..topology import list_presets
from ..version import __version__
from ..viz.tables import FORMATS, to_csv, to_json
from .args import check_outputs, emit
from .bench import QUICK, SCENARIOS, bench_table, run_bench
from .collective import add_collective_command
from .compare import add_compare_command
from .jobs import add_jobs_command
from .search import add_search_command
from .sweep import add_sweep_commands
from .topology import add_topology_commands
from .validate import add_validate_command
from .workload import add_workload_commands

EXIT_USAGE = 2
#: Signals that stop a command cleanly, as Ctrl-C does: a scheduler's or a supervisor's
#: ``kill`` (SIGTERM), a closed terminal (SIGHUP).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread when a signal of :data:`STOP_SIGNALS` arrives.

    A KeyboardInterrupt, so that everything that cleans up after Ctrl-C (a sweep's
    worker pool stopped, its results file closed, a half-written output removed) does
    the same for ``kill``. A command may add a note (``add_note``) saying what was kept;
    :func:`main` prints it on the same line.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stopping_cleanly() -> Iterator[None]:
    """Turn :data:`STOP_SIGNALS` into :class:`Stopped` while the block runs, then put
    the previous handlers back (``main`` may be called from a test or a script)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread; leave them as they are
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (and exit code 2, as argparse already uses)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = _Parser(
        prog="ccsim",
        description="Discrete-event simulator of GPU clusters and their collective communication. "
        "Sizes: B, K/M/G (binary, as nccl-tests), KiB/MiB/GiB, KB/MB/GB (decimal). "
        "Reports use GB = 1e9 bytes and microseconds, as nccl-tests does.",
    )
    parser.add_argument("--version", action="version", version=f"ccsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    add_collective_command(sub)
    add_compare_command(sub)

    topo = sub.add_parser(
        "topologies",
        help="list the bundled topology presets",
        description="List the bundled topology presets with a description.",
    )
    topo.set_defaults(handler=_cmd_topologies)
    add_topology_commands(sub)

    algos = sub.add_parser(
        "algorithms",
        help="list the collective algorithms",
        description="List the registered collective algorithms.",
    )
    algos.set_defaults(handler=_cmd_algorithms)

    bench = sub.add_parser(
        "bench",
        help="time a fixed set of scenarios",
        description="Run fixed scenarios, each in its own process, and print wall time (s), "
        "peak memory (MiB), simulated flows and flows per wall second. "
        "Scenarios: " + "; ".join(f"{s.name}: {s.description}" for s in SCENARIOS.values()),
    )
    bench.add_argument(
        "--scenarios",
        default=None,
        metavar="NAMES",
        help="comma-separated scenario names (default: all)",
    )
    bench.add_argument(
        "--quick", action="store_true", help=f"run only the small scenarios ({', '.join(QUICK)})"
    )
    bench.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: %(default)s)"
    )
    bench.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    bench.set_defaults(handler=_cmd_bench)
    add_workload_commands(sub)
    add_jobs_command(sub)
    add_validate_command(sub)
    add_sweep_commands(sub)
    add_search_command(sub)
    return parser


def _cmd_topologies(args: argparse.Namespace) -> None:
    presets = list_presets()
    width = max(len(name) for name, _ in presets)
    emit("".join(f"{name:<{width}}  {text}\n" for name, text in presets), None)


def _cmd_algorithms(args: argparse.Namespace) -> None:
    algos = [(name, ", ".join(get_algorithm(name).ops)) for name in algorithm_names()]
    name_width = max(len(name) for name, _ in algos)
    ops_width = max(len(ops) for _, ops in algos)
    lines = [
        f"{name:<{name_width}}  {ops:<{ops_width}}  {get_algorithm(name).description}\n"
        for name, ops in algos
    ]
    emit("".join(lines), None)


def _cmd_bench(args: argparse.Namespace) -> None:
    check_outputs(args, "out")
    if args.scenarios:
        names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    else:
        names = list(QUICK if args.quick else SCENARIOS)
    rows = run_bench(names)
    if args.format == "json":
        text = to_json(rows)
    elif args.format == "csv":
        text = to_csv(rows)
    else:
        text = bench_table(rows)
    emit(text, args.out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ccsim`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded by --report
    try:
        with stopping_cleanly():
            args.handler(args)
    except CcsimError as error:
        return _error(str(error))
    except KeyboardInterrupt as error:
        # One line: what stopped the command and, if it says, what it kept.
        what = f"stopped by {error}" if isinstance(error, Stopped) else "interrupted"
        notes = "; ".join(getattr(error, "__notes__", ()))
        print(f"ccsim: {what}" + (f"; {notes}" if notes else ""), file=sys.stderr)
        return 128 + error.signum if isinstance(error, Stopped) else 130
    except BrokenPipeError:
        return 0
    # What input or the system can cause: one line too, never a traceback.
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        return _error(f"{where}{error.strerror or error}")
    except UnicodeDecodeError as error:
        return _error(f"an input is not UTF-8 text ({error.reason} at byte {error.start})")
    except RecursionError:
        return _error("an input is nested too deeply")
    except MemoryError:
        return _error("out of memory; try a smaller input or fewer sizes")
    return 0


def _error(message: str) -> int:
    """Print ``message`` as one ``ccsim: error:`` line (cut at 2,000 characters); return 2."""
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    if len(line) > 2000:
        line = line[:2000] + " ..."
    print(f"ccsim: error: {line}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
