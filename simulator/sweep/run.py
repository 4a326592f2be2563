"""Running a sweep: every point not yet in the results file, on a runner, with progress.

The loop keeps at most ``runner.capacity`` points in flight and appends each finished
point's row to the results file as soon as it arrives, so an interrupt loses only the
points in flight; running the same sweep again skips every point whose key is already
in the file. A point lost with its worker runs again (up to ``retries`` times) before
it is recorded as failed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..viz.progress import progress_bar
from .point import METRICS
from .runners import (
    Affinity,
    DaskRunner,
    InlineRunner,
    LanePoolRunner,
    Outcome,
    PointFunction,
    PoolRunner,
    Runner,
    default_workers,
    is_lost,
)
from .spec import Point, SweepError, SweepSpec, load_spec
from .store import STATUS_COLUMNS, ResultsStore, format_cell, parse_cell, read_cells, read_rows


@dataclass
class SweepRun:
    """What :func:`execute_sweep` did.

    Attributes
    ----------
    spec : SweepSpec
    rows : list of dict
        One row per point of the spec, in the spec's order (the sorted view), whether it
        ran now or was already in the results file.
    ran, resumed, failed : int
        Points run now, points found in the results file, rows with ``status: error``.
    """

    spec: SweepSpec
    rows: list[dict[str, Any]] = field(repr=False)
    ran: int = 0
    resumed: int = 0
    failed: int = 0
    #: The metric columns (those of the spec's kind unless a point function set others).
    metrics: tuple[str, ...] | None = None

    def frame(self) -> Any:
        """The rows as a pandas DataFrame (one row per point, spec order)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=result_columns(self.spec, self.metrics))


def result_columns(spec: SweepSpec, metrics: Sequence[str] | None = None) -> list[str]:
    """Columns of a sweep's results: key, axes, status, error, metrics (``metrics``, or
    those of the spec's kind)."""
    chosen = METRICS[spec.kind] if metrics is None else tuple(metrics)
    return ["key", *spec.columns, *STATUS_COLUMNS, *chosen]


def _resolve(spec: SweepSpec | str | Path | Mapping[str, Any]) -> SweepSpec:
    return spec if isinstance(spec, SweepSpec) else load_spec(spec)


def _check_options(workers: int | None, scheduler: str | None, client: Any) -> None:
    if (client is not None or scheduler is not None) and workers is not None:
        raise SweepError("workers applies to the local pool; a Dask cluster has its own workers")
    if client is not None and scheduler is not None:
        raise SweepError("give a Dask client or a scheduler address, not both")
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise SweepError(f"workers must be a positive integer, got {workers}")


def make_runner(
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    function: PointFunction | None = None,
    points: int | None = None,
    affinity: Affinity | None = None,
) -> Runner:
    """The runner for these options: Dask if a client or scheduler is given, else a
    local pool of ``workers`` processes (all cores by default), else, for one worker
    or one point, this process. ``affinity`` (a point's params to its group) keeps a
    group's points on one local process where it can (:class:`LanePoolRunner`)."""
    _check_options(workers, scheduler, client)
    kwargs = {"function": function} if function is not None else {}
    if client is not None or scheduler is not None:
        return DaskRunner(client, address=scheduler, **kwargs)
    workers = default_workers() if workers is None else workers
    if points is not None:
        workers = min(workers, max(points, 1))
    if workers == 1:
        return InlineRunner(**kwargs)
    if affinity is not None:
        return LanePoolRunner(workers, **kwargs, affinity=affinity)
    return PoolRunner(workers, **kwargs)


def execute_sweep(
    spec: SweepSpec | str | Path | Mapping[str, Any],
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: bool | None = None,
    retry_failed: bool = False,
    retries: int = 2,
    point_function: PointFunction | None = None,
    metrics: Sequence[str] | None = None,
    affinity: Affinity | None = None,
) -> SweepRun:
    """Run every point of ``spec`` that ``out`` does not hold yet; see :func:`run_sweep`.
    A ``point_function`` that returns other metrics than :func:`run_point` names them
    in ``metrics`` (the results' metric columns); ``affinity`` groups points to run in
    one local process where they can (:func:`make_runner`)."""
    _check_options(workers, scheduler, client)  # before the file is touched
    spec = _resolve(spec)
    columns = result_columns(spec, metrics)
    chosen = METRICS[spec.kind] if metrics is None else tuple(metrics)
    # A Dask cluster is reached before the results file is created or locked: a
    # scheduler that cannot be reached leaves no header-only file behind.
    remote = (
        make_runner(scheduler=scheduler, client=client, function=point_function)
        if scheduler is not None or client is not None
        else None
    )
    store = ResultsStore(out, columns) if out is not None else None
    existing: dict[str, dict[str, str]] = {}
    try:
        if store is not None:
            store.open()
            existing = store.rows()
    except BaseException:
        if remote is not None:
            remote.close()
        raise
    try:
        keys = {point.key for point in spec.points}
        done = {
            key: cells
            for key, cells in existing.items()
            if key in keys and (cells.get("status") == "ok" or not retry_failed)
        }
        todo = [point for point in spec.points if point.key not in done]
        known = cell_values(spec)
        rows: dict[str, dict[str, Any]] = {
            key: typed_row(spec, cells, known) for key, cells in done.items()
        }
        bar = _progress_bar(spec, len(spec.points), len(done), progress)
        try:
            if todo:
                runner = remote or make_runner(
                    workers=workers, function=point_function, points=len(todo), affinity=affinity
                )
                try:
                    for point, result in _loop(todo, runner, retries):
                        row = _row(point, result, chosen)
                        if store is not None:
                            store.append(row)
                        # Read back through the file's text form: the same types whether
                        # a row was computed now or resumed from the file.
                        cells = {c: format_cell(row.get(c)) for c in columns}
                        rows[point.key] = typed_row(spec, cells, known)
                        bar.update(1)
                except BaseException:
                    runner.cancel()
                    raise
                finally:
                    if runner is not remote:
                        runner.close()
        finally:
            bar.close()
    finally:
        if remote is not None:
            remote.close()
        if store is not None:
            store.close()
    ordered = [rows[point.key] for point in spec.points]
    return SweepRun(
        spec=spec,
        rows=ordered,
        ran=len(todo),
        resumed=len(done),
        failed=sum(row["status"] != "ok" for row in ordered),
        metrics=None if metrics is None else tuple(metrics),
    )


def _loop(todo: Sequence[Point], runner: Runner, retries: int):
    """Yield (point, row or exception) as points finish; keep the runner full.

    When a worker dies every point in flight on the pool is lost with it, and only one
    of them may be the cause. Lost points become suspects: no new point starts until the
    pool has drained, then each suspect runs alone. A suspect lost alone again (more
    than ``retries`` times) is the cause, and its row records the error; the others
    complete normally.
    """
    queue = deque(todo)
    suspects: deque[Point] = deque()
    in_flight = 0
    alone: Point | None = None
    attempts: dict[str, int] = {}
    while queue or suspects or in_flight:
        if suspects:
            if in_flight == 0:
                alone = suspects.popleft()
                runner.submit(alone)
                in_flight = 1
        else:
            alone = None
            while queue and in_flight < runner.capacity:
                runner.submit(queue.popleft())
                in_flight += 1
        for point, outcome in runner.wait():
            in_flight -= 1
            if isinstance(outcome, KeyboardInterrupt | SystemExit):
                raise outcome
            if isinstance(outcome, BaseException) and is_lost(outcome):
                if point is not alone:
                    suspects.append(point)
                    continue
                attempts[point.key] = attempts.get(point.key, 0) + 1
                if attempts[point.key] <= retries:
                    suspects.appendleft(point)
                    continue
            yield point, outcome


def _row(point: Point, outcome: Outcome, metrics: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"key": point.key, **point.values}
    if isinstance(outcome, BaseException):
        text = " ".join(str(outcome).split())
        row.update(dict.fromkeys(metrics))
        row["status"] = "error"
        row["error"] = f"{type(outcome).__name__}: {text}" if text else type(outcome).__name__
        if is_lost(outcome):
            row["error"] = f"worker lost while running this point ({row['error']})"
    else:
        row.update(outcome)
    return row


def cell_values(spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """Axis name -> cell text -> the value it stands for, for every value of the spec."""
    return {axis.name: {format_cell(value): value for value in axis.values} for axis in spec.axes}


def typed_row(
    spec: SweepSpec,
    cells: Mapping[str, str],
    known: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A row of cell texts as values: axis values as the spec has them, metrics as
    numbers (``ranks`` an int, others floats, None when the point failed).

    ``known`` is :func:`cell_values` of the spec, computed once for many rows.
    """
    known = cell_values(spec) if known is None else known
    row: dict[str, Any] = {}
    for column, text in cells.items():
        if column in ("key", *STATUS_COLUMNS):
            row[column] = text
        elif column in known:
            row[column] = known[column].get(text, parse_cell(text))
        elif text == "":
            row[column] = None
        elif column == "ranks":
            row[column] = int(text)
        else:
            row[column] = float(text)
    return row


def _progress_bar(spec: SweepSpec, total: int, initial: int, enabled: bool | None) -> Any:
    # On for people watching a terminal or a notebook, off in logs and pipes.
    return progress_bar(
        total, initial=initial, desc=spec.name, unit="pt", enabled=enabled, smoothing=0.1
    )


def run_sweep(
    spec: SweepSpec | str | Path | Mapping[str, Any],
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: bool | None = None,
    retry_failed: bool = False,
    records: bool = False,
    point_function: PointFunction | None = None,
) -> Any:
    """Run a sweep and return its results, one row per point in the spec's order.

    Parameters
    ----------
    spec : SweepSpec, path or mapping
        The sweep (see :mod:`simulator.sweep.spec`).
    out : path, optional
        Results CSV. Each finished point is appended at once; points already in it are
        skipped (resume). Without it, results stay in memory.
    workers : int, optional
        Local worker processes (default: every core; 1 runs in this process).
    scheduler : str, optional
        Address of a Dask scheduler (``tcp://host:8786``) to run on instead.
    client : distributed.Client, optional
        A Dask client to run on instead (left open).
    progress : bool, optional
        Show a progress bar (``tqdm.auto``: on stderr, or a widget in Jupyter; default:
        when stderr is a terminal or this runs in a notebook).
    retry_failed : bool
        Run again the points whose row in ``out`` records an error.
    records : bool
        Return a list of dicts instead of a pandas DataFrame.
    point_function : callable, optional
        Runs one point's params (default :func:`~simulator.sweep.point.run_point`);
        must be importable by workers.

    Returns
    -------
    pandas.DataFrame or list of dict
        Columns ``key``, the axes (canonical units: bytes, bytes/s, seconds), ``status``,
        ``error`` and the metrics (collectives: ``ranks, time_s, time_us, algbw_GBps,
        busbw_GBps``; workloads: ``ranks, step_s, compute_s, comm_s, overlapped_s,
        exposed_s, waiting_s, bubble_s, exposed_share, comm_share``).

    Examples
    --------
    >>> rows = run_sweep({"scenario": {"collective": "all_reduce", "size": "1M"},
    ...                   "axes": {"algorithm": ["ring", "direct"]}}, workers=1, records=True)
    >>> [(row["algorithm"], row["status"]) for row in rows]
    [('ring', 'ok'), ('direct', 'ok')]
    """
    run = execute_sweep(
        spec,
        out,
        workers=workers,
        scheduler=scheduler,
        client=client,
        progress=progress,
        retry_failed=retry_failed,
        point_function=point_function,
    )
    return run.rows if records else run.frame()


def read_results(
    path: str | Path,
    spec: SweepSpec | str | Path | Mapping[str, Any] | None = None,
    *,
    records: bool = False,
) -> Any:
    """Read a results file (also while its sweep is still running).

    With ``spec``, only that sweep's points, in its order, typed as :func:`run_sweep`
    returns them; without, every row, sorted by the columns after ``key``.
    """
    import pandas as pd

    if spec is None:
        rows = read_rows(path)
        names = list(rows[0]) if rows else []
        frame = pd.DataFrame(rows, columns=names)
        sort = [c for c in names if c not in ("key", *STATUS_COLUMNS) and c in frame]
        axes = sort[: next((i for i, c in enumerate(sort) if c in _ALL_METRICS), len(sort))]
        if axes and not frame.empty:
            frame = frame.sort_values(axes, kind="stable", na_position="first")
            frame = frame.reset_index(drop=True)
        return frame.to_dict("records") if records else frame
    spec = _resolve(spec)
    columns = result_columns(spec)
    by_key = {}
    known = cell_values(spec)
    for cells in read_cells(path):
        by_key[cells["key"]] = typed_row(spec, {c: cells.get(c, "") for c in columns}, known)
    ordered = [by_key[p.key] for p in spec.points if p.key in by_key]
    return ordered if records else pd.DataFrame(ordered, columns=columns)


_ALL_METRICS = {name for names in METRICS.values() for name in names}
