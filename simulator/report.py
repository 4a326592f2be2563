"""Writers for result tables: nccl-tests style text, JSON and CSV.

Writers take plain rows (dicts) and return text; :func:`write_atomically` puts text in a
file so that an interrupted run never leaves half a file behind.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FORMATS = ("table", "json", "csv")

#: Keys of a collective row, in ``--format json`` and ``csv``.
COLLECTIVE_KEYS = ("op", "algorithm", "ranks", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps")

_REDOP = {
    "all_reduce": "sum",
    "reduce_scatter": "sum",
    "reduce": "sum",
    "all_gather": "none",
    "broadcast": "none",
    "all_to_all": "none",
}


def element_count(op: str, size_bytes: int, ranks: int, type_size: int = 4) -> int:
    """The ``count`` column as nccl-tests prints it: elements per rank's send buffer.

    For all-gather and reduce-scatter nccl-tests' size is the whole gathered buffer and
    the count is one rank's share of it.
    """
    count = size_bytes // type_size
    return count // ranks if op in ("all_gather", "reduce_scatter", "all_to_all") else count


def collective_table(rows: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """An nccl-tests-like table: size, count, type, redop, time, algbw, busbw."""
    out = io.StringIO()
    if title:
        out.write(f"# {title}\n#\n")
    out.write(
        f"#{'size':>11} {'count':>13} {'type':>7} {'redop':>6} {'time':>11} "
        f"{'algbw':>8} {'busbw':>8}\n"
    )
    out.write(
        f"#{'(B)':>11} {'(elements)':>13} {'':>7} {'':>6} {'(us)':>11} "
        f"{'(GB/s)':>8} {'(GB/s)':>8}\n"
    )
    for row in rows:
        count = element_count(row["op"], row["size_bytes"], row["ranks"])
        out.write(
            f"{row['size_bytes']:>12} {count:>13} {'float':>7} {_REDOP[row['op']]:>6} "
            f"{row['time_us']:>11.2f} {row['algbw_GBps']:>8.2f} {row['busbw_GBps']:>8.2f}\n"
        )
    if rows:
        average = sum(row["busbw_GBps"] for row in rows) / len(rows)
        out.write(f"# Avg bus bandwidth    : {average:.4f} GB/s\n")
    return out.getvalue()


def to_json(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a JSON list; floats printed with repr, so output is byte-reproducible."""
    return json.dumps(list(rows), indent=2) + "\n"


def to_csv(rows: Sequence[dict[str, Any]], keys: Sequence[str] | None = None) -> str:
    """Rows as CSV with a header line."""
    out = io.StringIO()
    keys = list(keys or (rows[0].keys() if rows else []))
    writer = csv.DictWriter(out, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: row[key] for key in keys})
    return out.getvalue()


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
