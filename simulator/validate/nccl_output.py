"""nccl-tests' own output read as data: the stdout of ``all_reduce_perf`` and friends,
and the JSON file that ``-J FILE.json`` writes (nccl-tests 2.17.7 and later).

Formats follow nccl-tests' source (``src/util.cu``). The stdout holds header lines
starting with ``#`` (``# nThread 1 nGpus 8 minBytes ...``, one ``#  Rank  0 Group  0 Pid
... on HOST device  0 [...] GPU NAME`` line per rank, the column header ``#  size  count
type  redop  root  time  algbw  busbw  #wrong  time ...``), one data row per size with
the out-of-place then the in-place figures, and a footer (``# Out of bounds values``,
``# Avg bus bandwidth``). NCCL's own lines that report a setting from the environment
(with ``NCCL_DEBUG=INFO``) are read: ``NCCL INFO NCCL_ALGO set by environment to Ring``
and ``... NCCL_PROTO set by environment to Simple`` (graph/tuning.cc:455 and 460 at
v2.30.7), ``... NCCL_MIN_NCHANNELS set by environment to 24.`` for integer settings
(misc/param.cc:100) and ``NCCL_COLLNET_ENABLE set by environment to 0.`` (init.cc:2156).
Anything else (other NCCL INFO/WARN lines, MPI banners, the command line) is skipped; a
``[1,0]<stdout>:`` (``mpirun --tag-output``) or ``0:`` (``srun -l``) prefix is removed
first. Columns are found by name in the column header, so older
layouts (no ``root`` column, ``error`` for ``#wrong``) and ``-S`` timestamps read alike.

The JSON holds ``config`` (``nthreads``, ``ngpus``, ``devices``: one entry per process,
the first GPU it drives) and ``results`` (``size``, ``count``, ``type``, ``redop``,
``root``, ``out_of_place`` / ``in_place`` with ``time``, ``alg_bw``, ``bus_bw``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CcsimError

#: nccl-tests binary (without ``_perf`` / ``_perf_mpi``) -> ccsim operation.
PROGRAM_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
}
#: Bytes per element of nccl-tests' type names (``-d``), old and new spellings.
TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "half": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "float": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
}

_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:\s)?\s*")
_RANK = re.compile(
    r"^Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+\d+\s+"
    r"\[[^\]]*\]\s*(.*?)\s*$"
)
_THREADS = re.compile(r"\bnThread\s+(\d+)\s+nGpus\s+(\d+)")
_PROGRAM = re.compile(r"\b([a-z]+(?:_[a-z]+)*)_perf(?:_mpi)?\b")
_NOISE = ("NCCL INFO", "NCCL WARN", "NCCL TRACE")
# tuning.cc:455/460 print the value as given; param.cc:100 and init.cc:2156 add a period.
_ENVIRONMENT = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (\S+?)\.?\s*$")


@dataclass(frozen=True)
class Row:
    """One size of an nccl-tests run: out-of-place then in-place figures."""

    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    time_us_ip: float | None = None
    algbw_ip: float | None = None
    busbw_ip: float | None = None


@dataclass
class NcclTestsOutput:
    """What one nccl-tests output says about its run; ``None`` where it does not say."""

    path: Path
    rows: list[Row]
    program: str | None = None  # e.g. "all_reduce_perf"
    threads: int | None = None  # -t
    gpus_per_thread: int | None = None  # -g
    ranks: int | None = None
    hosts: list[str] = field(default_factory=list)  # distinct, in order of appearance
    gpus: list[str] = field(default_factory=list)  # distinct GPU names
    processes: int | None = None
    skipped: list[int] = field(default_factory=list)  # garbled row lines (1-based)
    # NCCL variables the run reported as set by the environment: name -> value.
    environment: dict[str, str] = field(default_factory=dict)

    def op(self) -> str | None:
        """The ccsim operation: from the binary's name, else from the rows (``redop``,
        ``root`` and size / count); None when they cannot tell (all-gather and
        all-to-all print alike)."""
        if self.program is not None:
            name = re.sub(r"_perf(_mpi)?$", "", self.program)
            if name not in PROGRAM_OPS:
                valid = ", ".join(f"{p}_perf" for p in PROGRAM_OPS)
                raise CcsimError(
                    f"{self.path.name}: ccsim does not simulate {self.program}; it reads {valid}"
                )
            return PROGRAM_OPS[name]
        row = next((r for r in self.rows if r.count > 0 and r.type in TYPE_BYTES), None)
        if row is None:
            return None
        if row.root >= 0:
            return "broadcast" if row.redop == "none" else "reduce"
        if row.redop == "none":
            return None
        return "all_reduce" if row.size == row.count * TYPE_BYTES[row.type] else "reduce_scatter"


def read_nccl_output(path: Path | str) -> NcclTestsOutput:
    """Read nccl-tests stdout or ``-J`` JSON, telling them apart by content.

    Examples
    --------
    >>> import tempfile
    >>> log = Path(tempfile.mkdtemp()) / "ar.log"
    >>> _ = log.write_text('''# Collective test starting: all_reduce_perf
    ... # nThread 1 nGpus 8 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20
    ... #  Rank  0 Group  0 Pid   1234 on     node-1 device  0 [0000:07:00] NVIDIA A100-SXM4-80GB
    ... #       size         count      type   redop    root     time   algbw   busbw  #wrong
    ... #        (B)    (elements)                               (us)  (GB/s)  (GB/s)
    ... node-1:1234:1234 [0] NCCL INFO comm 0x5 rank 0 nranks 8 - Init COMPLETE
    ...            8             2     float     sum      -1    40.12    0.00    0.00       0
    ... # Avg bus bandwidth    : 0
    ... ''')
    >>> out = read_nccl_output(log)
    >>> out.op(), out.gpus_per_thread, out.hosts, out.rows[0].time_us
    ('all_reduce', 8, ['node-1'], 40.12)
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as error:
        raise CcsimError(f"{path.name}: cannot read: {error.strerror or error}") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict):
            return _from_json(path, data)
    return _from_stdout(path, text)


def _from_stdout(path: Path, text: str) -> NcclTestsOutput:
    out = NcclTestsOutput(path, [])
    columns: list[str] | None = None
    ranks: dict[int, tuple[str, str]] = {}  # rank -> (host, pid)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw, count=1)
        if setting := _ENVIRONMENT.search(line):
            _setting(out, setting[1], setting[2], number)
            continue
        tokens = line.split()
        if columns is not None and tokens and tokens[0].isdigit():
            try:
                out.rows.append(_row(columns, tokens))
            except (ValueError, IndexError):
                out.skipped.append(number)  # e.g. cut by another rank's NCCL INFO line
            continue
        if not tokens or any(noise in line for noise in _NOISE):
            continue
        if line.startswith("#"):
            body = line[1:].strip()
            if rank := _RANK.match(body):
                ranks[int(rank[1])] = (rank[3], rank[2])
                _add(out.hosts, rank[3])
                _add(out.gpus, rank[4])
            elif threads := _THREADS.search(body):
                out.threads, out.gpus_per_thread = int(threads[1]), int(threads[2])
            elif body.split()[:2] == ["size", "count"]:
                columns = body.split()
            elif out.program is None and (program := _PROGRAM.search(body)):
                out.program = program[0]
            continue
        if out.program is None and (program := _PROGRAM.search(line)):
            out.program = program[0]  # e.g. the command line, echoed
    if columns is None:
        raise CcsimError(
            f"{path.name}: not nccl-tests output: no column header ('#  size  count  type  "
            "redop ...') and not an nccl-tests -J JSON file"
        )
    if ranks:
        out.ranks = len(ranks)
        out.processes = len(set(ranks.values()))
    return _checked(out)


def _setting(out: NcclTestsOutput, name: str, value: str, number: int) -> None:
    """Record a setting NCCL reported; every rank reports it, all alike."""
    known = out.environment.get(name)
    if known is not None and known != value:
        raise CcsimError(
            f"{out.path.name}:{number}: {name} set to {value} here but {known} earlier: ranks "
            "ran with different settings"
        )
    out.environment[name] = value


def _row(columns: list[str], tokens: list[str]) -> Row:
    """A data row, its tokens matched to the column header's names."""
    if len(tokens) < len(columns):
        raise ValueError("short row")
    where: dict[str, list[int]] = {}
    for index, name in enumerate(columns):
        where.setdefault("time" if name == "cputime" else name, []).append(index)

    def value(name: str, nth: int = 0) -> float | None:
        spots = where.get(name, [])
        return float(tokens[spots[nth]]) if nth < len(spots) else None

    return _make_row(
        int(tokens[0]),
        int(tokens[1]),
        tokens[where["type"][0]] if "type" in where else "float",
        tokens[where["redop"][0]] if "redop" in where else "none",
        int(tokens[where["root"][0]]) if "root" in where else -1,
        [value(name, nth) for nth in (0, 1) for name in ("time", "algbw", "busbw")],
    )


def _make_row(
    size: int, count: int, dtype: str, redop: str, root: int, figures: list[float | None]
) -> Row:
    """A row from its fields; ``figures``: time, algbw, busbw out-of-place then in-place."""
    if size < 0 or count < 0 or None in figures[:3]:
        raise ValueError("negative size or missing out-of-place figures")
    if any(f is not None and not (math.isfinite(f) and f >= 0) for f in figures):
        raise ValueError("a figure is negative or not finite")
    return Row(size, count, dtype, redop, root, *figures)


def _from_json(path: Path, data: dict[str, Any]) -> NcclTestsOutput:
    results = data.get("results")
    if not isinstance(results, list):
        raise CcsimError(f"{path.name}: not nccl-tests -J JSON: no 'results' list")
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    out = NcclTestsOutput(path, [])
    args = data.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        program = _PROGRAM.search(Path(args[0]).name)
        out.program = program[0] if program else None
    out.threads = _positive(config.get("nthreads"))
    out.gpus_per_thread = _positive(config.get("ngpus"))
    devices = config.get("devices")
    if isinstance(devices, list) and devices and all(isinstance(d, dict) for d in devices):
        out.processes = len(devices)
        for device in devices:
            _add(out.hosts, str(device.get("hostname", "")))
            _add(out.gpus, str(device.get("device_info", "")).strip())
        out.hosts = [h for h in out.hosts if h]
        out.gpus = [g for g in out.gpus if g]
        if out.threads and out.gpus_per_thread:
            out.ranks = out.processes * out.threads * out.gpus_per_thread
    for index, entry in enumerate(results):
        try:
            oop, ip = entry["out_of_place"], entry.get("in_place")
            if oop is None:
                continue  # nccl-tests writes null when only in-place ran
            figures = [
                _json_number(part, key) if isinstance(part, dict) else None
                for part in (oop, ip)
                for key in (("time", "cpu_time"), ("alg_bw",), ("bus_bw",))
            ]
            out.rows.append(
                _make_row(
                    _json_int(entry["size"]),
                    _json_int(entry["count"]),
                    str(entry.get("type", "float")),
                    str(entry.get("redop", "none")),
                    int(str(entry.get("root", -1)).strip()),
                    figures,
                )
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            raise CcsimError(
                f"{path.name}: results[{index}] is not an nccl-tests result "
                "(size, count, out_of_place: time, alg_bw, bus_bw)"
            ) from None
    return _checked(out)


def _json_number(part: dict, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in part:
            value = part[key]
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise TypeError(key)
            return float(value)
    return None


def _json_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("not an integer")
    return value


def _positive(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _checked(out: NcclTestsOutput) -> NcclTestsOutput:
    """One table per file: a single data type, reduction and root, each size once."""
    if not out.rows:
        raise CcsimError(f"{out.path.name}: the nccl-tests table has no rows")
    kinds = sorted({f"{r.type} {r.redop} root {r.root}" for r in out.rows})
    if len(kinds) > 1:
        raise CcsimError(
            f"{out.path.name}: holds several tables ({'; '.join(kinds)}); ccsim reads one "
            "per file: run nccl-tests with one -d, -o and -r, or split the file"
        )
    seen: set[int] = set()
    for row in out.rows:
        if row.size in seen:
            raise CcsimError(
                f"{out.path.name}: size {row.size} appears twice (several runs in one file?); "
                "keep one run per file"
            )
        seen.add(row.size)
    return out
