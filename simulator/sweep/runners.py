"""Where points run: in this process, in a local process pool, or on a Dask cluster.

A runner has the same small interface in each case: ``capacity`` (points it takes at
once), ``submit(point)``, ``wait()`` (at least one finished point and its outcome, a
row or the exception that lost it) and ``cancel()`` (drop what is in flight, on an
interrupt). Every runner calls the same point function on the same params, so results
do not depend on the runner.

Lost points (a worker process that died, a Dask worker that was killed) come back as
exceptions for which :func:`is_lost` is true; the sweep loop runs them again.

Before a sweep starts on Dask, :func:`check_workers` makes sure every worker runs the
same ccsim and Python versions as this process (the same point must give the same row
wherever it runs).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import platform
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..version import __version__
from .point import PointCache, point_cache_scope, run_point, use_point_cache
from .spec import Point, SweepError

PointFunction = Callable[[Mapping[str, Any]], dict[str, Any]]
Outcome = dict[str, Any] | BaseException

#: Exception type names that mean "the worker was lost", not "the point failed". (Dask's
#: KilledWorker is not one: Dask raises it after it has already retried the task on
#: other workers, so it names the point that kills them.)
_LOST = {"BrokenProcessPool", "BrokenExecutor", "CommClosedError", "CancelledError"}

#: Seconds to wait for a Dask scheduler to answer: a wrong address fails in a few
#: seconds (Dask's own default retries for 30), a reachable one answers in milliseconds.
CONNECT_TIMEOUT_S = 5


def is_lost(error: BaseException) -> bool:
    """Whether ``error`` says a point was lost with its worker (so it may run again)."""
    return any(cls.__name__ in _LOST for cls in type(error).__mro__)


def default_workers() -> int:
    """Cores this process may use (the local pool's default size)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


class Runner(Protocol):
    """What the sweep loop needs from a place to run points."""

    capacity: int

    def submit(self, point: Point) -> None:
        """Start ``point``."""

    def wait(self) -> list[tuple[Point, Outcome]]:
        """Block until at least one point has finished; return them with outcomes."""

    def cancel(self) -> None:
        """Drop every point in flight (they are lost, not recorded)."""

    def close(self) -> None:
        """Release workers and connections."""


class InlineRunner:
    """Runs each point in this process, one at a time (``workers=1``).

    Interrupts reach the point directly, and no process is started.
    """

    capacity = 1

    def __init__(self, function: PointFunction = run_point):
        self.function = function
        self._pending: list[Point] = []
        # What this runner's points share (graphs, calls' timings): this runner's own,
        # so that two sweeps in one process never share anything.
        self.cache = PointCache()

    def submit(self, point: Point) -> None:
        self._pending.append(point)

    def wait(self) -> list[tuple[Point, Outcome]]:
        point = self._pending.pop(0)
        try:
            with point_cache_scope(self.cache):
                return [(point, self.function(point.params))]
        except Exception as error:  # a custom point function that raised
            return [(point, error)]

    def cancel(self) -> None:
        self._pending.clear()

    def close(self) -> None:
        self._pending.clear()


def _ready() -> bool:
    return True


def _init_worker(parent: int) -> None:
    # Ctrl-C reaches the whole process group: the parent alone decides what to do, and
    # workers stopping mid-point with a traceback each would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The points of this worker (all of one pool, so of one sweep) share graphs and
    # calls' timings (results are the same: see PointCache).
    use_point_cache(PointCache())
    # A parent killed outright (SIGKILL, OOM killer) cannot stop its pool, and idle
    # workers would wait for work forever: leave when the parent is gone.
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


class PoolRunner:
    """A pool of ``workers`` local processes (``spawn``: clean interpreters, no forked
    threads or locks), restarted if a worker dies."""

    def __init__(self, workers: int, function: PointFunction = run_point):
        if workers < 1:
            raise SweepError(f"workers must be a positive integer, got {workers}")
        self.workers = workers
        self.function = function
        self.capacity = 2 * workers  # a queued point per worker hides the hand-off
        self._futures: dict[cf.Future, Point] = {}
        self._executor = self._start()
        try:
            # A pool whose processes cannot even start would lose every point: say why
            # now rather than record each point as lost.
            self._executor.submit(_ready).result()
        except cf.BrokenExecutor:
            self._executor.shutdown(wait=False, cancel_futures=True)
            raise SweepError(
                "the sweep's worker processes could not start. A script that runs a sweep "
                "with several workers must do so under `if __name__ == '__main__':` "
                "(worker processes import it again); or use workers=1"
            ) from None

    def _start(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(os.getpid(),),
        )

    def submit(self, point: Point) -> None:
        try:
            future = self._executor.submit(self.function, point.params)
        except cf.BrokenExecutor:
            # A worker died: the old pool is unusable. Its other futures still report
            # their loss through wait(); new points go to a fresh pool.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._start()
            future = self._executor.submit(self.function, point.params)
        self._futures[future] = point

    def wait(self) -> list[tuple[Point, Outcome]]:
        done, _ = cf.wait(self._futures, return_when=cf.FIRST_COMPLETED)
        out: list[tuple[Point, Outcome]] = []
        for future in done:
            point = self._futures.pop(future)
            error = future.exception() if not future.cancelled() else cf.CancelledError()
            out.append((point, error if error is not None else future.result()))
        return out

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()
        self._futures.clear()
        processes = list(getattr(self._executor, "_processes", {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        # Points in flight are given up: stop their processes rather than wait for them.
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=5)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


Affinity = Callable[[Mapping[str, Any]], Any]


def next_group(current: Any, backlog: Mapping[Any, int], taken: Mapping[Any, int]) -> Any | None:
    """Which group an idle lane of :class:`LanePoolRunner` runs a point of next: its
    ``current`` group while that has points left; else the group with the most points
    left that no lane is on (``taken``: lanes on each group), the largest first so that
    the last groups, which end the sweep, are short; else (every group with points
    left has a lane) the one with the most left, shared rather than leave a core idle.
    None when no point is left.

    >>> next_group("a", {"a": 2, "b": 5}, {"a": 1})
    'a'
    >>> next_group(None, {"a": 2, "b": 5, "c": 3}, {"b": 1})
    'c'
    >>> next_group(None, {"a": 2, "b": 5}, {"a": 1, "b": 1})
    'b'
    """
    if current is not None and backlog.get(current, 0) > 0:
        return current
    left = [(count, key) for key, count in backlog.items() if count > 0]
    free = [item for item in left if not taken.get(item[1])]
    pool = free or left
    if not pool:
        return None
    # The most points left; among equals the first listed (dicts keep insertion order).
    most = max(count for count, _ in pool)
    return next(key for count, key in pool if count == most)


class LanePoolRunner:
    """Local processes (``workers`` lanes of one process each) that keep the points of
    one group together: ``affinity(params)`` names a point's group, and a lane runs one
    group's points one after another, taking another group only when its own has none
    left (:func:`next_group`). Points that share work a worker keeps (a search's
    candidates of one parallel layout share their data-parallel calls' timings alone,
    :class:`~simulator.sweep.point.PointCache`) then do it once, not once in each
    process that happens to take one of them. Results do not depend on where a point
    runs. The runner takes every point at once (its ``capacity``) and hands them to
    lanes as they free up; a lane whose process dies is started again, and the point it
    was running comes back lost, as from :class:`PoolRunner`."""

    capacity = sys.maxsize

    def __init__(self, workers: int, function: PointFunction = run_point, *, affinity: Affinity):
        if workers < 1:
            raise SweepError(f"workers must be a positive integer, got {workers}")
        self.workers = workers
        self.function = function
        self.affinity = affinity
        self._lanes = [self._start() for _ in range(workers)]
        try:
            for lane in self._lanes:  # as PoolRunner checks its processes can start
                lane.submit(_ready).result()
        except cf.BrokenExecutor:
            for lane in self._lanes:
                lane.shutdown(wait=False, cancel_futures=True)
            raise SweepError(
                "the sweep's worker processes could not start. A script that runs a sweep "
                "with several workers must do so under `if __name__ == '__main__':` "
                "(worker processes import it again); or use workers=1"
            ) from None
        self._group: list[Any] = [None] * workers  # each lane's group
        self._running: dict[cf.Future, tuple[int, Point]] = {}
        self._backlog: dict[Any, list[Point]] = {}

    @staticmethod
    def _start() -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(os.getpid(),),
        )

    def submit(self, point: Point) -> None:
        # Queued only: lanes are fed in wait(), once the loop has handed over what it
        # has, so that the groups are known before any is split between lanes.
        self._backlog.setdefault(self.affinity(point.params), []).append(point)

    def _feed(self) -> None:
        busy = {lane for lane, _ in self._running.values()}
        for lane in range(self.workers):
            if lane in busy:
                continue
            taken: dict[Any, int] = {}
            for other in busy:
                taken[self._group[other]] = taken.get(self._group[other], 0) + 1
            backlog = {key: len(points) for key, points in self._backlog.items()}
            group = next_group(self._group[lane], backlog, taken)
            if group is None:
                return
            points = self._backlog[group]
            # A lane sharing a group takes its points from the end (the other from the
            # front), so each keeps a run of neighbours.
            point = points.pop(0 if not taken.get(group) else -1)
            if not points:
                del self._backlog[group]
            self._group[lane] = group
            try:
                future = self._lanes[lane].submit(self.function, point.params)
            except cf.BrokenExecutor:
                self._lanes[lane].shutdown(wait=False, cancel_futures=True)
                self._lanes[lane] = self._start()
                future = self._lanes[lane].submit(self.function, point.params)
            self._running[future] = (lane, point)
            busy.add(lane)

    def wait(self) -> list[tuple[Point, Outcome]]:
        self._feed()
        done, _ = cf.wait(self._running, return_when=cf.FIRST_COMPLETED)
        out: list[tuple[Point, Outcome]] = []
        for future in done:
            lane, point = self._running.pop(future)
            error = future.exception() if not future.cancelled() else cf.CancelledError()
            if error is not None and is_lost(error):
                # Its process is gone: the lane starts afresh for the next point.
                self._lanes[lane].shutdown(wait=False, cancel_futures=True)
                self._lanes[lane] = self._start()
            out.append((point, error if error is not None else future.result()))
        return out

    def cancel(self) -> None:
        self._backlog.clear()
        for future in self._running:
            future.cancel()
        self._running.clear()
        for executor in self._lanes:
            processes = list(getattr(executor, "_processes", {}).values())
            executor.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(timeout=5)

    def close(self) -> None:
        for executor in self._lanes:
            executor.shutdown(wait=True, cancel_futures=True)


def environment() -> dict[str, str]:
    """What must be the same on the client and on every Dask worker: the ccsim and
    Python versions (run on each worker by :func:`check_workers`).

    >>> sorted(environment())
    ['ccsim', 'python']
    """
    return {"ccsim": __version__, "python": platform.python_version()}


def check_workers(client: Any) -> None:
    """Refuse a Dask cluster whose workers run another ccsim or Python than this process.

    Each connected worker runs :func:`environment`; a worker that cannot (ccsim not
    installed there) counts as different. Raises :class:`SweepError` naming the workers
    that differ and how to fix it. Workers that join later are not checked: start the
    sweep once the workers are up (``client.wait_for_workers(n)``).
    """
    mine = environment()
    found = client.run(environment, on_error="return")
    wrong = []
    for worker, theirs in sorted(found.items()):
        if isinstance(theirs, BaseException):
            wrong.append(f"{worker} cannot run ccsim ({type(theirs).__name__}: {theirs})")
        elif theirs != mine:
            wrong.append(f"{worker} has ccsim {theirs.get('ccsim')}, Python {theirs.get('python')}")
    if wrong:
        shown = "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise SweepError(
            f"{len(wrong)} of {len(found)} Dask workers differ from this process (ccsim "
            f"{mine['ccsim']}, Python {mine['python']}): {shown}. Install the same ccsim "
            "and Python on every worker (e.g. one environment on a shared filesystem) and "
            "restart the workers"
        )


def dashboard_link(client: Any) -> str | None:
    """The address of the Dask dashboard of ``client``'s scheduler, or None if it serves
    none (the scheduler's environment lacks ``bokeh``)."""
    try:
        return client.dashboard_link
    except (KeyError, AttributeError):
        return None


class DaskRunner:
    """Points as tasks on a Dask distributed cluster.

    Parameters
    ----------
    client : distributed.Client, optional
        A connected client (left open on close).
    address : str, optional
        Scheduler address such as ``tcp://host:8786``, when no client is given (the
        client made for it is closed on close).

    Workers need ccsim installed (the same version and the same Python: checked by
    :func:`check_workers` before any point is submitted); points carry their topology
    preset and workload spec as data, so workers need no access to the spec's files,
    except graph and trace files, which are read by path. Rows come back to this process
    through Dask, which writes the results file. A client made here prints the Dask
    dashboard's address on stderr.
    """

    def __init__(
        self,
        client: Any = None,
        *,
        address: str | None = None,
        function: PointFunction = run_point,
    ):
        try:
            import distributed
        except ImportError:
            raise SweepError(
                "running on Dask needs the 'distributed' package: pip install 'ccsim[dask]'"
            ) from None
        self._distributed = distributed
        self._own = client is None
        if client is None:
            try:
                client = distributed.Client(address, timeout=f"{CONNECT_TIMEOUT_S}s")
            except (OSError, TimeoutError, ValueError) as error:
                raise SweepError(
                    f"cannot reach the Dask scheduler at {address!r}: {error}"
                ) from None
            link = dashboard_link(client)
            print(
                f"ccsim: Dask dashboard at {link}"
                if link
                else "ccsim: the Dask scheduler serves no dashboard (install bokeh>=3.1 "
                "where it runs)",
                file=sys.stderr,
            )
        try:
            check_workers(client)
        except BaseException:
            if self._own:
                client.close()
            raise
        self.client = client
        self.function = function
        threads = sum(client.nthreads().values()) or 1
        self.capacity = max(4, 2 * threads)
        self._token = uuid.uuid4().hex[:8]
        self._futures: dict[Any, Point] = {}

    def submit(self, point: Point) -> None:
        # A key per run: a cancelled or failed task of an earlier run never answers.
        future = self.client.submit(
            self.function, point.params, key=f"ccsim-point-{point.key}-{self._token}", pure=False
        )
        self._futures[future] = point

    def wait(self) -> list[tuple[Point, Outcome]]:
        done, _ = self._distributed.wait(list(self._futures), return_when="FIRST_COMPLETED")
        out: list[tuple[Point, Outcome]] = []
        for future in done:
            point = self._futures.pop(future)
            if future.status == "finished":
                out.append((point, future.result()))
            elif future.status == "cancelled":
                out.append((point, cf.CancelledError()))
            else:
                out.append((point, future.exception()))
            future.release()
        return out

    def cancel(self) -> None:
        if self._futures:
            self.client.cancel(list(self._futures), force=True)
        self._futures.clear()

    def close(self) -> None:
        self.cancel()
        if self._own:
            self.client.close()
