"""Reading and writing files: every file ccsim reads or writes goes through this module.

Writing (:func:`write_file`, :func:`write_with`)
    A regular file (or a path that does not exist yet) is written atomically: a
    temporary file in the same folder, then a rename. ``os.replace`` within one folder
    is atomic, so a reader (or the next run) sees either the previous file or the
    complete new one, never half of it. A new file gets the mode an ordinary ``open``
    gives (``0o666`` less the umask); a replaced file keeps its mode.

    Anything else is opened and written in place, never replaced or removed: a
    character or block device (``/dev/stdout``), a FIFO or pipe (``>(cat)``, a
    ``/dev/fd/N``), and a symbolic link, whose target is written and which stays a link.

    :func:`check_writable` says whether a path can be written (its folder exists and is
    writable, it is not a folder); the command line calls it before simulating, so a
    bad output name fails at once instead of after a long run.

Reading (:func:`read_text`, :func:`load_data`, :func:`parse_data`)
    Text is UTF-8; a binary or undecodable file, a missing or unreadable one, is a
    :class:`~simulator.errors.CcsimError` naming the file. YAML is read with PyYAML's
    safe loader, and refused before any Python object is built when it nests deeper
    than :data:`MAX_DEPTH`, uses more than :data:`MAX_ALIASES` aliases, refers to itself
    or would expand (aliases followed) past :data:`MAX_NODES` values: a "billion laughs"
    file costs nothing. Deep JSON is refused the same way. ccsim's own bundled data
    (``trusted``) skips the limits and is parsed by libyaml's safe loader where PyYAML
    has it: the same values, seven times faster on the 9,000-line published-runs file.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from .errors import CcsimError

#: Deepest nesting of lists and mappings a YAML or JSON file may have.
MAX_DEPTH = 100
#: Most aliases (``*name``) a YAML file may use.
MAX_ALIASES = 100
#: Most values (scalars, lists and mappings) a YAML file may expand to, aliases followed.
MAX_NODES = 1_000_000


# -- writing -----------------------------------------------------------------------------


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask would, for every thread)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _shown(path: Path, option: str | None) -> str:
    return f"{option} {str(path)!r}" if option else repr(str(path))


def check_writable(path: str | Path, *, option: str | None = None, folder: bool = False) -> Path:
    """Check that ``path`` can be written, before anything is computed; return it.

    A file: it is not a folder, its folder exists and is writable, and if it exists it is
    writable. A device, FIFO or symbolic link to one must be writable. With ``folder``,
    ``path`` is a folder to fill (it may not exist yet: its nearest existing parent must
    then be a writable folder). Raises :class:`~simulator.errors.CcsimError` naming the
    path (and ``option``, the command-line option that gave it) and the fix.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> check_writable(folder / "out.txt") == folder / "out.txt"
    True
    >>> check_writable(folder / "missing" / "out.txt", option="--out")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: cannot write --out '...': folder '...' does not exist; ...
    """
    path = Path(path)
    name = _shown(path, option)
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        status = None
    except OSError as error:  # a parent that cannot be searched, a symlink loop
        raise CcsimError(f"cannot write {name}: {error.strerror or error}") from None
    if folder:
        if status is not None and not stat.S_ISDIR(status.st_mode):
            raise CcsimError(f"cannot write {name}: it is a file; give a folder name")
        if status is None:
            parent = path.absolute().parent
            while not parent.exists() and parent != parent.parent:
                parent = parent.parent
            _check_folder(parent, name)
        elif not os.access(path, os.W_OK | os.X_OK):
            raise CcsimError(
                f"cannot write {name}: the folder is not writable; fix its permissions "
                "(chmod u+w) or give another folder"
            )
        return path
    if status is not None:
        if stat.S_ISDIR(status.st_mode):
            raise CcsimError(f"cannot write {name}: it is a folder; give a file name")
        if stat.S_ISSOCK(status.st_mode):
            raise CcsimError(f"cannot write {name}: it is a socket; give a file name")
        if not os.access(path, os.W_OK):
            raise CcsimError(
                f"cannot write {name}: permission denied; fix its permissions (chmod u+w) "
                "or give another file"
            )
        if not stat.S_ISREG(status.st_mode) or os.path.islink(path):
            return path  # written in place: its folder does not matter
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    _check_folder(target.parent, name)
    return path


def _check_folder(folder: Path, name: str) -> None:
    folder = folder if str(folder) else Path(".")
    if not folder.exists():
        raise CcsimError(
            f"cannot write {name}: folder {str(folder)!r} does not exist; create it "
            f"(mkdir -p {folder}) or give another path"
        )
    if not folder.is_dir():
        raise CcsimError(f"cannot write {name}: {str(folder)!r} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CcsimError(
            f"cannot write {name}: folder {str(folder)!r} is not writable; fix its "
            "permissions or give another path"
        )


def _in_place(path: Path) -> bool:
    """Whether ``path`` is written in place: it exists and is not a regular file, or it
    is a symbolic link (whose target is written; the link stays)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISLNK(status.st_mode) or not stat.S_ISREG(status.st_mode)


def write_with(path: str | Path, write: Callable[[IO], Any], *, binary: bool = True) -> Path:
    """Call ``write(stream)`` to write ``path``; return the path.

    ``stream`` is a binary stream, or a UTF-8 text stream if not ``binary``. A regular
    file (or a new one) is written atomically: ``write`` fills a temporary file in the
    same folder, which replaces ``path`` only once ``write`` has returned; on any
    exception (KeyboardInterrupt included) ``path`` is left as it was. Devices, FIFOs,
    pipes and symbolic links are written in place (see the module docstring).

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> _ = write_with(target, lambda stream: stream.write("whole"), binary=False)
    >>> target.read_text()
    'whole'
    """
    path = check_writable(path)
    mode, encoding = ("wb", None) if binary else ("w", "utf-8")
    if _in_place(path):
        try:
            with open(path, mode, encoding=encoding) as stream:
                write(stream)
        except BrokenPipeError:
            raise  # the reader went away, as when stdout is piped into head
        except OSError as error:
            raise CcsimError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
        return path
    try:
        keep = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        keep = 0o666 & ~_umask()
    folder = path.parent if str(path.parent) else Path(".")
    try:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise CcsimError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, mode, encoding=encoding) as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, keep)
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, BrokenPipeError):
            raise CcsimError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
        raise
    return path


def write_file(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` with :func:`write_with`.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> write_file(target, "whole").read_text()
    'whole'
    """
    return write_with(path, lambda stream: stream.write(data), binary=isinstance(data, bytes))


# -- reading -----------------------------------------------------------------------------


def read_text(path: str | Path, *, what: str = "file", error: type = CcsimError) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark dropped).

    A missing, unreadable, binary or non-UTF-8 file raises ``error`` (a
    :class:`~simulator.errors.CcsimError` class) naming the file and ``what`` it is.

    >>> read_text("/no/such/spec.yaml", what="sweep spec")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: /no/such/spec.yaml: cannot read the sweep spec: No such file...
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as problem:
        raise error(f"{path}: cannot read the {what}: {problem.strerror or problem}") from None
    if b"\0" in data:
        raise error(f"{path}: the {what} is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as problem:
        raise error(
            f"{path}: the {what} is not UTF-8 text (byte 0x{data[problem.start]:02x} at "
            f"offset {problem.start})"
        ) from None


class _Refused(Exception):
    """A YAML document refused by :class:`_LimitedLoader` (message, line)."""


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses, while composing (before any object is built),
    deep nesting, many aliases, recursive aliases and large expansions."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth below)

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # Caught in the scanner too: it reads far ahead of the composer in [[[[...
        if self.flow_level >= MAX_DEPTH:
            line = self.get_mark().line + 1
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep", line)
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Any, index: Any) -> Any:
        line = self.peek_event().start_mark.line + 1
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(f"more than {MAX_ALIASES} aliases (*name)", line)
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise _Refused("an alias refers to a value that contains it", line)
            count, below = self._sizes[id(node)]
        else:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep", line)
            node = super().compose_node(parent, index)
            self._depth -= 1
            if isinstance(node, yaml.ScalarNode):
                children: list = []
            elif isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            else:
                children = node.value
            sizes = [self._sizes[id(child)] for child in children]
            count = 1 + sum(size[0] for size in sizes)
            below = 1 + max((size[1] for size in sizes), default=-1)
            self._sizes[id(node)] = (count, below)
        if self._depth + below > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep (aliases followed)", line)
        if count > MAX_NODES:
            raise _Refused(f"expands to more than {MAX_NODES:,} values (aliases followed)", line)
        return node


def parse_data(
    text: str,
    *,
    source: str = "<text>",
    fmt: str = "yaml",
    error: type = CcsimError,
    trusted: bool = False,
) -> Any:
    """Parse YAML (``fmt="yaml"``) or JSON text safely (see the module docstring).

    ``source`` names the text in messages; a problem raises ``error``. ``trusted``: the
    text is ccsim's own bundled data, never a user's: YAML is parsed by PyYAML's C safe
    loader (libyaml; its pure-Python one where PyYAML was built without it) and without
    the size and alias limits, which cost more than the parse itself in Python.

    >>> parse_data("a: [1, 2]")
    {'a': [1, 2]}
    >>> parse_data("[" * 10_000, source="deep.json", fmt="json")
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: deep.json: not valid JSON: nested too deeply
    >>> bomb = 'a: &a ["lol","lol"]\\n' + "".join(
    ...     f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\\n"
    ...     for i in range(9))
    >>> parse_data(bomb, source="bomb.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: bomb.yaml: refused YAML: expands to more than 1,000,000 values...
    """
    if fmt == "json":
        try:
            return json.loads(text)
        except RecursionError:
            raise error(f"{source}: not valid JSON: nested too deeply") from None
        except ValueError as problem:  # JSONDecodeError; an integer too long to convert
            raise error(f"{source}: not valid JSON: {problem}") from None
    loader = None
    try:
        if trusted:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
        else:
            loader = _LimitedLoader(text)  # checks the characters first
        return loader.get_single_data()
    except yaml.reader.ReaderError as problem:
        raise error(
            f"{source}: not valid YAML: character #x{problem.character:04x} at position "
            f"{problem.position} is not allowed"
        ) from None
    except _Refused as refused:
        message, line = refused.args
        raise error(f"{source}: refused YAML: {message} (line {line})") from None
    except yaml.MarkedYAMLError as problem:
        mark = problem.problem_mark or problem.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = " ".join(str(problem.problem or problem.context or "").split())
        raise error(f"{source}: not valid YAML: {what}{where}") from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as problem:
        # ValueError: a date such as 2024-13-45, an integer too long to convert
        text = " ".join(str(problem).split())[:200]
        raise error(f"{source}: not valid YAML: {text}") from None
    except RecursionError:
        raise error(f"{source}: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_data(
    path: str | Path,
    *,
    what: str = "file",
    fmt: str | None = None,
    error: type = CcsimError,
    trusted: bool = False,
) -> Any:
    """Read a YAML or JSON file safely: :func:`read_text`, then :func:`parse_data`.

    ``fmt`` is ``"yaml"`` or ``"json"``; by default a ``.json`` file is JSON and any
    other is YAML. Problems raise ``error`` naming the file and ``what`` it is.
    ``trusted``: a file ccsim ships (see :func:`parse_data`).
    """
    path = Path(path)
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "yaml")
    return parse_data(
        read_text(path, what=what, error=error),
        source=str(path),
        fmt=fmt,
        error=error,
        trusted=trusted,
    )
