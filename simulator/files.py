"""Writing files: every file ccsim writes goes through this module.

Writing is atomic: a temporary file in the same folder, then a rename.

``os.replace`` within one folder is atomic, so a reader (or the next run) sees either
the previous file or the complete new one, never half of it, even if the writer is
interrupted or the machine stops mid-write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from .errors import CcsimError


def _default_mode() -> int:
    # mkstemp creates files readable by the owner only; give the final file the
    # permissions an ordinary open() would (0o666 less the umask).
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success it replaces ``path``.

    On any exception (including KeyboardInterrupt) the temporary file is removed and
    ``path`` is left as it was.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_open(target) as f:
    ...     _ = f.write("whole")
    >>> target.read_text()
    'whole'
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise CcsimError(f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise CcsimError(f"cannot write {str(path)!r}: it is a folder; give a file name")
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, mode, encoding=encoding) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, _default_mode())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_bytes_atomically(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path, "wb") as stream:
        stream.write(data)


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_open(path, "w", encoding="utf-8") as stream:
        stream.write(text)


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
