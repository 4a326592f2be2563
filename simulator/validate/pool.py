"""A pool for validation's independent simulations (``ccsim validate --jobs N``).

The sweep layer has its own pool (:mod:`simulator.sweep.runners`), above this one; this
is the small part validation needs: submit tasks, wait for each result, report progress.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections.abc import Callable
from typing import Any

from ..errors import CcsimError

#: ``progress(done, total, label)``: how far the work has got (a command line draws a
#: bar from it).
Progress = Callable[[int, int, str], None]


class TaskPool:
    """Runs independent tasks: at once in this process (``jobs`` = 1), or in ``jobs``
    worker processes (``spawn``: clean interpreters, no forked threads or locks); each
    finished task is reported to ``progress`` as ``(done, total, label)``.

    >>> pool = TaskPool(1, 2, None)
    >>> pool.get(pool.submit(max, (1, 2), "a")), pool.done
    (2, 1)
    """

    def __init__(self, jobs: int, total: int, progress: Progress | None):
        self.jobs, self.total, self.progress, self.done = jobs, total, progress, 0
        self.pending: dict[cf.Future, str] = {}
        self.executor = None
        if jobs > 1:
            self.executor = cf.ProcessPoolExecutor(
                max_workers=jobs, mp_context=multiprocessing.get_context("spawn")
            )

    def submit(self, function: Callable, args: tuple, label: str) -> cf.Future:
        """``function(*args)``, run now (one job) or queued to the workers."""
        if self.executor is None:
            future: cf.Future = cf.Future()
            future.set_result(function(*args))
            self.tick(label)
            return future
        future = self.executor.submit(function, *args)
        self.pending[future] = label
        return future

    def get(self, future: cf.Future) -> Any:
        """The result of a submitted task, reporting the tasks that finish meanwhile."""
        try:
            while future in self.pending:
                done, _ = cf.wait(self.pending, return_when=cf.FIRST_COMPLETED)
                for finished in done:
                    self.tick(self.pending.pop(finished))
            return future.result()
        except cf.BrokenExecutor:
            raise CcsimError(
                f"--jobs {self.jobs}: a worker process stopped (out of memory, or a script "
                "that starts the pool outside `if __name__ == '__main__':`); run with "
                "--jobs 1"
            ) from None

    def tick(self, label: str) -> None:
        """One more task done."""
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
