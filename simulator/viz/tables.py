"""Markdown tables of result rows, for notebooks and report READMEs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | Mapping[str, str],
    *,
    formats: Mapping[str, str] | None = None,
) -> str:
    """A GitHub-flavoured Markdown table of ``rows``.

    Parameters
    ----------
    rows : sequence of mappings
        One mapping per table row.
    columns : sequence of keys, or mapping of key to header
        Which keys to show, in order (and their headers).
    formats : mapping of key to format spec, optional
        ``format(value, spec)`` for those keys (e.g. ``{"busbw_GBps": ".1f"}``); others
        print with ``str``.

    Examples
    --------
    >>> print(markdown_table([{"size": 1024, "bw": 1.234}], {"size": "size (B)", "bw": "GB/s"},
    ...                      formats={"bw": ".1f"}))
    | size (B) | GB/s |
    |---:|---:|
    | 1024 | 1.2 |
    """
    headers = dict(columns) if isinstance(columns, Mapping) else {key: key for key in columns}
    formats = dict(formats or {})

    def cell(row: Mapping[str, Any], key: str) -> str:
        value = row.get(key, "")
        if value is None or value == "":
            return ""
        return format(value, formats[key]) if key in formats else str(value)

    numeric = {
        key: all(isinstance(row.get(key), int | float) for row in rows if row.get(key) is not None)
        for key in headers
    }
    lines = [
        "| " + " | ".join(headers.values()) + " |",
        "|" + "|".join("---:" if numeric[key] else "---" for key in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(row, key) for key in headers) + " |" for row in rows]
    return "\n".join(lines)
