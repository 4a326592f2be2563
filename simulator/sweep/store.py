"""The results file: one CSV row per finished point, appended as it completes.

Why it loses nothing:

* each row is written with one ``write`` of a whole line and flushed to the operating
  system at once, so a process that dies (Ctrl-C, SIGKILL, a crash) leaves every
  finished row in the file; the file is also fsynced at most once a second and on
  close, against the machine stopping;
* a machine that stops mid-write can leave a torn last line; opening the file again
  cuts it off (it has no newline yet), so earlier rows are never touched;
* an exclusive lock (POSIX ``flock``) stops two sweeps from appending to one file.

Columns: ``key`` (the point's hash), the axis columns in canonical units (bytes,
bytes/s, seconds, counts, names), ``status`` (``ok`` or ``error``), ``error`` (one line)
and the metrics. A key that appears twice (a failed point run again with
``retry_failed``) counts by its last row.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..files import check_writable, read_text
from .spec import SweepError

try:  # POSIX only; elsewhere two sweeps on one file are the user's business
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

STATUS_COLUMNS = ("status", "error")
_FSYNC_INTERVAL_S = 1.0


def format_cell(value: Any) -> str:
    """A value as a CSV cell that reads back to the same value.

    Floats use ``repr`` (the shortest text that round-trips exactly); None is empty.

    >>> format_cell(0.1), format_cell(None), format_cell(8), format_cell([1, 2])
    ('0.1', '', '8', '[1, 2]')
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, int | str):
        return " ".join(str(value).splitlines())  # one row, one line
    return json.dumps(value, sort_keys=True)


def parse_cell(text: str) -> Any:
    """The value of a CSV cell written by :func:`format_cell` (int, float, str or None).

    >>> parse_cell("8"), parse_cell("0.1"), parse_cell(""), parse_cell("ring")
    (8, 0.1, None, 'ring')
    """
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def check_results_file(path: str | Path, *, option: str | None = "--out") -> Path:
    """Check that ``path`` can be a results file, before any point runs; return it.

    A results file is appended to and read back (to resume), so it must be a regular
    file or a new name in a writable folder: a device such as ``/dev/null``, a FIFO or a
    folder cannot hold the rows. Raises :class:`~.spec.SweepError` naming the path.

    >>> check_results_file("/dev/null")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simulator.sweep.spec.SweepError: cannot use --out '/dev/null' as the results file: ...
    """
    path = Path(path)
    try:
        status = os.stat(path)
    except OSError:
        status = None  # missing (check_writable says whether it can be made)
    if status is not None and not stat.S_ISREG(status.st_mode):
        kind = "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        shown = f"{option} {str(path)!r}" if option else repr(str(path))
        raise SweepError(
            f"cannot use {shown} as the results file: it is {kind}; a sweep appends its "
            "rows to a regular file and reads them back to resume, so give a file name "
            "such as results.csv"
        )
    check_writable(path, option=option)
    return path


class ResultsStore:
    """Appends result rows to a CSV file; see the module docstring.

    Use as a context manager::

        with ResultsStore(path, columns) as store:
            finished = store.rows()     # rows already in the file, by key
            store.append(row)
    """

    def __init__(self, path: str | Path, columns: Sequence[str]):
        self.path = Path(path)
        self.columns = list(columns)
        self._stream: IO[str] | None = None
        self._last_sync = 0.0
        self._existing: dict[str, dict[str, str]] = {}

    def __enter__(self) -> ResultsStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Open (or create) the file, lock it, drop a torn last line, read the rows."""
        check_results_file(self.path, option=None)
        stream = open(self.path, "a+", newline="", encoding="utf-8")  # noqa: SIM115
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise SweepError(
                        f"{self.path}: another sweep is writing this file; wait for it or "
                        "give another --out"
                    ) from None
            self._existing = self._recover(stream)
        except UnicodeDecodeError:
            stream.close()
            raise SweepError(
                f"{self.path}: not a sweep results file (not UTF-8 text); give another --out"
            ) from None
        except BaseException:
            stream.close()
            raise
        self._stream = stream

    def _recover(self, stream: IO[str]) -> dict[str, dict[str, str]]:
        stream.seek(0)
        text = stream.read()
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(self.columns)
        expected = buffer.getvalue()
        if "\n" not in text and expected.startswith(text):
            text = ""  # empty, or a header torn while it was first written
        elif not text.startswith(expected):
            # Checked before anything is cut: never touch a file this sweep did not write.
            first = text.split("\n", 1)[0][:200]
            raise SweepError(
                f"{self.path}: not this sweep's results file (its first line is {first!r}, "
                f"this sweep writes {expected.strip()!r}); give another --out"
            )
        if text and not text.endswith("\n"):
            # A torn last line (the machine stopped mid-write): cut back to the last
            # complete row. Every earlier byte stays as it was.
            text = text[: text.rfind("\n") + 1]
        stream.truncate(len(text.encode("utf-8")))
        if not text:
            self._write_line(stream, self.columns)
            return {}
        lines = text.splitlines()
        header = self.columns
        rows: dict[str, dict[str, str]] = {}
        for fields in csv.reader(lines[1:]):
            if len(fields) != len(header):
                continue  # not a row this code wrote whole; its point runs again
            row = dict(zip(header, fields, strict=True))
            rows[row["key"]] = row  # the last row of a key wins
        stream.seek(0, os.SEEK_END)
        return rows

    def rows(self) -> dict[str, dict[str, str]]:
        """Rows already in the file when it was opened: key -> column -> cell text."""
        return dict(self._existing)

    @staticmethod
    def _write_line(stream: IO[str], cells: Iterable[str]) -> None:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(list(cells))
        stream.write(buffer.getvalue())  # one write: a crash tears at most this line
        stream.flush()

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row now (flushed; fsynced at most once a second)."""
        if self._stream is None:
            raise SweepError(f"{self.path}: the results file is not open")
        self._write_line(self._stream, (format_cell(row.get(c)) for c in self.columns))
        now = time.monotonic()
        if now - self._last_sync >= _FSYNC_INTERVAL_S:
            os.fsync(self._stream.fileno())
            self._last_sync = now

    def close(self) -> None:
        """Fsync, unlock and close."""
        if self._stream is None:
            return
        try:
            self._stream.flush()
            os.fsync(self._stream.fileno())
        finally:
            self._stream.close()  # closing releases the lock
            self._stream = None


def read_cells(path: str | Path) -> list[dict[str, str]]:
    """Every complete row of a results file as cell texts, the last row per key.

    Rows keep the order of the file (completion order). No lock is taken, so a file a
    running sweep appends to can be read at any time.
    """
    path = Path(path)
    text = read_text(path, what="results file", error=SweepError)
    text = text[: text.rfind("\n") + 1]  # a torn last line is not a row yet
    lines = text.splitlines()
    if not lines:
        return []
    header = next(csv.reader([lines[0]]))
    if "key" not in header:
        raise SweepError(f"{path}: not a sweep results file (no 'key' column)")
    rows: dict[str, dict[str, str]] = {}
    for fields in csv.reader(lines[1:]):
        if len(fields) == len(header):
            row = dict(zip(header, fields, strict=True))
            rows.pop(row["key"], None)  # a later row of a key replaces it, at the end
            rows[row["key"]] = row
    return list(rows.values())


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """:func:`read_cells` with values typed by :func:`parse_cell` (key, status and
    error stay text)."""
    return [
        {
            name: text if name in ("key", *STATUS_COLUMNS) else parse_cell(text)
            for name, text in cells.items()
        }
        for cells in read_cells(path)
    ]
