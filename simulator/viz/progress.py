"""Progress bars: the one helper every long loop of ccsim uses.

Bars are `tqdm.auto <https://tqdm.github.io>`_ bars (a well-kept library rather than
hand-written terminal code): text on stderr in a terminal, a widget in Jupyter. They are
shown only where a person is watching (:func:`watched`: stderr is a terminal, or the code
runs in a Jupyter kernel), so logs, pipes and tests stay clean, and only once the work
has taken :data:`DELAY_S` seconds, so quick runs print nothing.

* :func:`progress_bar` — a bar over a known amount of work (sweep points, trace events).
* :func:`simulated_time` — a callback for the engines (``run_schedule(...,
  progress=...)``, ``WorkloadReplay(..., progress=...)``) that shows how far simulated
  time has got, and, through its ``again(why)`` where the engine has one to call, that a
  replay started over. The engines never import this module: the command line creates
  the callback and passes it down.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .collective import _time_text

#: Seconds a piece of work runs before its bar appears.
DELAY_S = 2.0

#: Seconds between two updates of a simulated-time bar.
_REFRESH_S = 0.2


def watched(file: TextIO | None = None) -> bool:
    """Whether a person watches ``file`` (default stderr): a terminal, or a Jupyter kernel,
    where ``tqdm.auto`` draws a widget instead (stderr is no terminal there).

    >>> import io
    >>> watched(io.StringIO())
    False
    """
    from tqdm.auto import tqdm

    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return True
    stream = sys.stderr if file is None else file
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(
    total: float | None = None,
    *,
    desc: str = "",
    unit: str = "it",
    initial: float = 0,
    enabled: bool | None = None,
    file: TextIO | None = None,
    delay: float = DELAY_S,
    **options: Any,
) -> Any:
    """A ``tqdm.auto`` bar on stderr, drawn only if ``enabled`` (default: :func:`watched`)
    and only after ``delay`` seconds. Use it as tqdm: ``update(n)``, ``close()``, or as a
    context manager; ``options`` go to tqdm.

    >>> import io
    >>> out = io.StringIO()
    >>> with progress_bar(3, desc="points", file=out, delay=0) as bar:
    ...     bar.update(3)
    >>> out.getvalue()  # not a terminal: nothing drawn
    ''
    """
    from tqdm.auto import tqdm

    stream = sys.stderr if file is None else file
    if enabled is None:
        enabled = watched(stream)
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        file=stream,
        disable=not enabled,
        delay=delay,
        dynamic_ncols=True,
        **options,
    )


class SimulatedTime:
    """The callback :func:`simulated_time` yields: ``report(now_s)`` shows the simulated
    time reached (redrawn at most every :data:`_REFRESH_S` seconds of wall time), and
    ``report.again(why)`` says that the engine starts over from time zero (a replay run
    again), which the bar then shows beside the time."""

    def __init__(self, bar: Any, desc: str):
        self._bar = bar
        self._desc = desc
        self._note = ""
        self._due = time.monotonic()

    def __call__(self, now_s: float) -> None:
        """Show ``now_s``, the simulated time reached (throttled)."""
        clock = time.monotonic()
        if clock < self._due:
            return
        self._due = clock + _REFRESH_S
        text = f"{self._desc}: simulated {_time_text(now_s)}{self._note}"
        self._bar.set_description_str(text, refresh=False)
        self._bar.update(0)  # draws once the delay has passed, as tqdm's own updates do

    def again(self, why: str) -> None:
        """The engine starts over from time zero, because ``why``."""
        self._note = f" (again: {why})"
        self._due = time.monotonic()  # show it at the next report


@contextmanager
def simulated_time(
    desc: str,
    *,
    enabled: bool | None = None,
    file: TextIO | None = None,
    delay: float = DELAY_S,
) -> Iterator[SimulatedTime | None]:
    """A callback ``report(now_s)`` that shows the simulated time reached, for an engine's
    ``progress`` argument (:class:`SimulatedTime`); None when nobody watches (the
    engines then run at full speed).

    >>> import io
    >>> with simulated_time("all_reduce 1 GiB", file=io.StringIO()) as report:
    ...     report is None
    True
    """
    stream = sys.stderr if file is None else file
    if enabled is None:
        enabled = watched(stream)
    if not enabled:
        yield None
        return
    bar = progress_bar(
        desc=desc,
        enabled=True,
        file=stream,
        delay=delay,
        bar_format="{desc} [{elapsed}]",
        miniters=0,  # drawn on every update(0) below, which is throttled here
        mininterval=0,
    )
    try:
        yield SimulatedTime(bar, desc)
    finally:
        bar.close()
