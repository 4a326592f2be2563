"""``ccsim validate``: compare simulated collectives with measured nccl-tests runs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from ..collective import COLLECTIVE_OPS
from ..errors import CcsimError
from ..validate.log_cases import case_loaders
from ..validate.nccl_tests import BUNDLED, run_cases
from ..viz.progress import DELAY_S, progress_bar, watched
from ..viz.tables import detail_rows, report_table, to_json, validation_detail
from .args import add_max_flows_option, check_outputs, positive_int


def add_validate_command(sub: argparse._SubParsersAction) -> None:
    """Register ``ccsim validate`` on the main parser."""
    cmd = sub.add_parser(
        "validate",
        help="simulate measured nccl-tests runs and print the error",
        description="For every NAME.yaml sidecar (preset, nodes, op, algorithm, protocol, "
        "channels, gpus_per_process) and NAME.csv (nccl-tests output: bytes, "
        "time_us_oop, algbw_oop, busbw_oop, ...) in a folder, simulate the same runs "
        "with the preset's calibrated protocol model and print the median and max "
        "absolute error (percent of the measured value) of busbw for sizes >= 1 MiB "
        "and of time for sizes <= 64 KiB. A malformed case is reported as an error; "
        "the others still run. LOG files (nccl-tests stdout, or the JSON of its -J "
        "option) need no sidecar: the operation, hosts, ranks, GPUs per process and GPU "
        "model are read from the file, and --topology / --nodes / --op supply what it "
        "does not say.",
    )
    cmd.add_argument(
        "logs",
        nargs="*",
        metavar="LOG",
        help="nccl-tests output files (stdout as printed, with its # header lines, or "
        "-J JSON) to compare against, each size by the faster of its out-of-place and "
        "in-place runs; without --data only these run",
    )
    cmd.add_argument(
        "--topology",
        default=None,
        metavar="NAME|FILE",
        help="with LOG: the preset or preset file the runs used (default: the one bundled "
        "preset whose GPU is the log's)",
    )
    cmd.add_argument(
        "--nodes",
        type=positive_int,
        default=None,
        metavar="N",
        help="with LOG: servers the runs used (count; default: the hosts in the log)",
    )
    cmd.add_argument(
        "--op",
        choices=COLLECTIVE_OPS,
        default=None,
        help="with LOG: the operation (default: from the *_perf name in the file, else "
        "from its rows)",
    )
    cmd.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help=f"folder of cases (default: the bundled public runs, {BUNDLED})",
    )
    cmd.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="also draw measured vs simulated busbw (GB/s) against size (bytes)",
    )
    cmd.add_argument(
        "--fit",
        action="store_true",
        help="instead, fit each case's preset constants (link efficiency, per-protocol hop "
        "latency and bandwidth, launch) to the measurements, on every other size, and "
        "print the error on the sizes left out before and after, and the fitted nccl "
        "section to paste into the preset",
    )
    cmd.add_argument(
        "--no-holdout",
        action="store_true",
        help="with --fit: fit on every size (the errors are then in-sample)",
    )
    cmd.add_argument(
        "--loco",
        action="store_true",
        help="also predict each run a constant was fitted to without its own measurements "
        "(leave one case out): refit its preset's unfitted constants on the preset's other "
        "runs, choose the network proxy's cost (and TCPXO's stack latency) again on the "
        "other runs it was chosen on, and simulate it; a progress bar in a terminal. Runs "
        "nothing was fitted to are already predictions",
    )
    cmd.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="run the cases, and with --loco its fits and runs, in N processes (count; "
        "default: 2 with --loco on a machine with 2 or more cores, its one long fit "
        "beside the other runs, else 1)",
    )
    cmd.add_argument(
        "--detail",
        action="store_true",
        help="also print every size of every case: measured and simulated time (us) and "
        "busbw (GB/s), and the algorithm, protocol and channels it ran with",
    )
    cmd.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table or json (default: %(default)s)",
    )
    cmd.add_argument(
        "--training",
        nargs="?",
        const="",
        default=None,
        metavar="MATCH",
        help="instead, simulate the bundled published training runs (Megatron-LM, "
        "Megatron-Bridge, NeMo, DGX Cloud benchmarking, MLPerf, Llama 3; "
        "simulator/data/training/published-runs.yaml) whose id contains MATCH (all "
        "without it: hours), one line on stderr as each ends, then the step-time error "
        "of each, calibration and held-out runs scored apart",
    )
    cmd.add_argument(
        "--exact",
        action="store_true",
        help="with --training: calls that share links simulated flow by flow (the "
        "per-flow reference; default: as bundles, see ccsim run --exact)",
    )
    cmd.add_argument(
        "--nvls-tree-loops",
        action="store_true",
        help="run NCCL's NVLSTree as many pipeline chunks deep as NCCL's loop (one per "
        "channels x heads x chunk, up to 1,024) rather than at most 32: the links' bound "
        "without ccsim's extra fill; slower (default: off, see README, issue 32)",
    )
    add_max_flows_option(cmd)
    cmd.set_defaults(handler=_cmd_validate)


def _cmd_validate(args: argparse.Namespace) -> None:
    check_outputs(args, "plot")
    if args.jobs is None:
        # --loco's longest task (a preset refitted on another run) runs beside the grid
        # runs: two processes halve its wall time where two cores are free.
        alone = args.fit or args.training is not None
        args.jobs = 2 if args.loco and not alone and (os.cpu_count() or 1) >= 2 else 1
    if args.jobs != 1 and (args.fit or args.training is not None):
        raise CcsimError(
            "--jobs runs the cases and --loco in processes; not with --fit or --training"
        )
    if args.nvls_tree_loops and (args.fit or args.loco or args.training is not None):
        raise CcsimError(
            "--nvls-tree-loops applies to the cases' runs; not with --fit, --loco or --training"
        )
    if args.training is not None:
        _cmd_training(args)
        return
    if args.fit:
        _cmd_fit(args)
        return
    if args.no_holdout:
        raise CcsimError("--no-holdout goes with --fit")
    clock = _Clock()
    loaders = _loaders(args)
    # A bar on stderr, drawn only in a terminal (the one progress helper): cases done,
    # and the case and the size that last finished. Elsewhere (a log, a pipe) one line
    # as each case ends, once the run has taken the bar's delay.
    lines = None if watched() else clock.lines("validate")
    pooled = args.jobs > 1  # cases then report as each ends, not as each starts
    with progress_bar(len(loaders), desc="ccsim validate", unit="case") as bar:
        started: list[str] = []
        ended: list[str] = []

        def end(name: str) -> None:
            ended.append(name)
            bar.update(1)
            if lines is not None:
                lines(len(ended), len(loaders), name)

        def report(name: str, size: int | None) -> None:
            if size is None and pooled:
                end(name)
            elif size is None:  # a case starts: the one before it is done
                if started:
                    end(started[-1])
                started.append(name)
                bar.set_description_str(f"ccsim validate {name}", refresh=False)
            else:
                bar.set_postfix_str(f"{size:,} B", refresh=False)
            bar.update(0)

        results = run_cases(
            loaders,
            max_flows=args.max_flows,
            progress=report,
            jobs=args.jobs,
            nvls_tree_loops=args.nvls_tree_loops,
        )
        if started and len(ended) < len(started):
            end(started[-1])
    if args.loco:
        from ..validate.calibrate import leave_one_case_out

        pairs = zip(loaders, results, strict=True)
        cases = [None if result.error else load() for (_, load), result in pairs]
        # Its own bar (the one progress helper): simulations and fits done, and the last.
        # Elsewhere, one line as each fit or grid run ends (a few dozen in all).
        folds = None if watched() else clock.lines("validate --loco", delay=0.0)
        with progress_bar(None, desc="ccsim validate --loco", unit="run") as bar:

            def step(done: int, total: int, label: str) -> None:
                bar.total = total
                bar.set_postfix_str(label, refresh=False)
                bar.update(done - bar.n)
                if folds is not None:
                    folds(done, total, label)

            leave_one_case_out(cases, results, jobs=args.jobs, progress=step)
    if args.format == "json":
        rows = [r.summary() for r in results]
        if args.detail:
            for row, result in zip(rows, results, strict=True):
                row["sizes"] = detail_rows(result)
        sys.stdout.write(to_json(rows))
    else:
        sys.stdout.write(report_table(results))
        if args.detail:
            sys.stdout.write(validation_detail(results))
    if args.plot:
        from ..viz.plots import plot_validation  # matplotlib loads only when asked for

        plot_validation(results, args.plot)
    failed = [r for r in results if r.error]
    if not failed:  # (a failed run ends on its one error line)
        sys.stderr.write(f"ccsim: validate: {len(results)} case(s){' and --loco' * args.loco}"
                         f" in {clock.text()}\n")  # fmt: skip
    if len(failed) == 1:  # its own message says what to pass or fix
        name, error = failed[0].name, failed[0].error
        raise CcsimError(error if error.startswith(name) else f"{name}: {error}")
    if failed:
        names = ", ".join(r.name for r in failed)
        raise CcsimError(f"{len(failed)} case(s) could not run: {names}")


class _Clock:
    """Wall and CPU time since a command started: this process's CPU and that of the
    worker processes it has waited for (``--jobs``: the pools join theirs on closing)."""

    def __init__(self) -> None:
        self.wall = time.monotonic()
        self.cpu = self._cpu()

    @staticmethod
    def _cpu() -> float:
        t = os.times()  # children's figures count processes already waited for
        return t.user + t.system + t.children_user + t.children_system

    def text(self) -> str:
        """The time so far, as "12.3 s wall, 20.1 s CPU (all processes)"."""
        wall, cpu = time.monotonic() - self.wall, self._cpu() - self.cpu
        return f"{wall:.1f} s wall, {cpu:.1f} s CPU (all processes)"

    def lines(self, what: str, delay: float = DELAY_S) -> Callable[[int, int, str], None]:
        """``report(done, total, label)`` writing one line on stderr per call, once the
        command has run ``delay`` seconds (quick runs stay quiet, as the bars do)."""

        def report(done: int, total: int, label: str) -> None:
            elapsed = time.monotonic() - self.wall
            if elapsed >= delay:
                sys.stderr.write(f"ccsim: {what} [{done}/{total}] {label} ({elapsed:.0f} s)\n")
                sys.stderr.flush()

        return report


def _loaders(args: argparse.Namespace) -> list:
    """The cases to run: the --data folder's sidecars (the bundled ones when no folder and
    no LOG is given), then the LOG files with the settings given for them."""
    given = [f"--{name}" for name in ("topology", "nodes", "op") if getattr(args, name)]
    if given and not args.logs:
        raise CcsimError(
            f"{', '.join(given)}: only with LOG files (a --data folder's sidecars name "
            "their own settings)"
        )
    return case_loaders(
        args.data,
        args.logs,
        topology=args.topology,
        nodes=args.nodes,
        op=args.op,
        notify=lambda line: sys.stderr.write(f"ccsim: {line}\n"),
    )


def _cmd_fit(args: argparse.Namespace) -> None:
    from ..validate.calibrate import fit_case
    from ..viz.tables import fit_report

    holdout = not args.no_holdout
    fits, failed = [], []
    for name, load in _loaders(args):
        try:
            fits.append(fit_case(load(), holdout=holdout))
        except CcsimError as error:
            failed.append(name)
            sys.stderr.write(f"ccsim: {name}: {error}\n")
    if args.format == "json":
        rows = [
            {
                "case": f.case,
                "preset": f.preset,
                "before": f.before,
                "after": f.after,
                "factors": f.factors,
                "nccl": f.nccl_section(),
            }
            for f in fits
        ]
        sys.stdout.write(to_json(rows))
    else:
        sys.stdout.write(fit_report(fits, holdout=holdout))
    if failed:
        raise CcsimError(f"{len(failed)} case(s) could not be fitted: {', '.join(failed)}")


def _cmd_training(args: argparse.Namespace) -> None:
    from ..validate.training import load_runs, simulate_run
    from ..viz.tables import training_table

    runs, skipped = load_runs()
    chosen = [run for run in runs if args.training in run.id]
    if not chosen:
        raise CcsimError(
            f"no published training run ccsim can build has {args.training!r} in its id; "
            f"{len(runs)} can (ids like {runs[0].id}), {len(skipped)} cannot"
        )
    results = []
    for k, run in enumerate(chosen, 1):
        result = simulate_run(run, bundles=not args.exact)
        results.append(result)
        shown = f"{result.error:+.1%}" if result.error is not None else result.skipped
        print(f"ccsim: [{k}/{len(chosen)}] {run.id}: {shown} ({result.wall_s:.1f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
    if args.format == "json":
        sys.stdout.write(
            to_json(
                [
                    {
                        "id": r.run.id,
                        "use": r.run.use,
                        "configuration": r.run.label,
                        "measured_step_s": r.run.measured_step_s,
                        "measured_how": r.run.measured_how,
                        "step_s": r.step_s,
                        "error": r.error,
                        "memory_gb": r.memory_gb,
                        "fits": r.fits,
                        "skipped": r.skipped,
                    }
                    for r in results
                ]
            )
        )
    else:
        sys.stdout.write(training_table(results))
