"""Parsing of sizes, bandwidths and times given as strings.

Internally ccsim works in bytes, bytes per second and seconds. Users may write
``64MiB``, ``1G``, ``400Gbps``, ``900GB/s`` or ``8us``. Conventions:

* Sizes: ``K``/``M``/``G``/``T`` without ``B`` are binary multiples, as in nccl-tests'
  ``-b 8 -e 4G`` (4G = 4 GiB). ``KiB``/``MiB``/``GiB`` are binary; ``KB``/``MB``/``GB``
  are decimal (10^3, 10^6, 10^9), as in nccl-tests' reports.
* Bandwidths: a small ``b`` is bits, a capital ``B`` bytes, whatever follows:
  ``Gbps``, ``Gb/s``, ``Gbit/s`` are bits per second; ``GBps``, ``GB/s``, ``GByte/s``
  bytes per second (decimal); ``GiB/s`` and friends are binary. A bare number is bytes
  per second.
* Times: ``s``, ``ms``, ``us`` (or ``µs``), ``ns``. A bare number is seconds.
"""

from __future__ import annotations

import math
import re

from .errors import CcsimError, shown

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]*)\s*$")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}

# A rate unit: an optional prefix (k, M, G, T; i for binary), then bits (b, bit, bits)
# or bytes (B, Byte, Bytes), then "ps", "/s" or "/sec". The case of b / B decides:
# vendors write NIC speeds as 400Gb/s (bits) and link speeds as 900GB/s (bytes).
_RATE_UNIT = re.compile(
    r"^(?P<prefix>[kKmMgGtT]?)(?P<binary>i?)"
    r"(?:(?P<bits>b(?:its?)?)|(?P<bytes>B(?:ytes?)?))(?:ps|/s|/sec)$"
)
_RATE_PREFIX = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}

# Divisors rather than factors: 500 / 1e9 is exactly 5e-07, 500 * 1e-9 is not.
_TIME_DIVISORS = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}

#: Largest size a message may have, in bytes: 1 TiB, above any GPU's memory (192 GB on a
#: B200, 288 GB on a B300), so larger is a typo such as 1e30.
MAX_SIZE = 2**40

#: Most sizes one --sizes may list: a sweep of sizes is one simulation per size, and
#: 10,000 of them step by a factor of 1.0045 from 1 B to 16 EiB.
MAX_SIZES = 10_000


def _split(text: object, what: str, example: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise CcsimError(
            f"invalid {what} {shown(text)}; write a number with a unit, e.g. {example}"
        )
    if isinstance(text, int | float):
        return float(text), ""
    match = _PATTERN.match(str(text))
    if not match:
        if _PATTERN.match(str(text).strip().removeprefix("-")):
            raise CcsimError(f"invalid {what} {shown(text)}: it must be positive, e.g. {example}")
        raise CcsimError(
            f"invalid {what} {shown(text)}; write a number with a unit, e.g. {example}"
        )
    return float(match.group(1)), match.group(2)


def parse_size(text: str | float, *, field: str = "size") -> float:
    """Parse a size in bytes.

    >>> parse_size("64MiB"), parse_size("4G"), parse_size("1GB"), parse_size(8)
    (67108864.0, 4294967296.0, 1000000000.0, 8.0)
    """
    value, unit = _split(text, field, "64MiB, 4G or 1GB")
    key = unit.lower()
    if len(unit) == 2 and unit[1] == "b" and key in _SIZE_UNITS:
        # "1Mb": a small b is bits in a rate (400Gbps), so in a size it is ambiguous.
        raise CcsimError(
            f"invalid {field} {shown(text)}: {shown(unit)} could be bits or bytes; write "
            f"{value:g}{unit[0].upper()}B (bytes, decimal) or {value:g}{unit[0].upper()}iB "
            "(binary); sizes are in bytes"
        )
    if key not in _SIZE_UNITS:
        raise CcsimError(
            f"invalid {field} {shown(text)}: unknown unit {shown(unit)}; "
            "use B, K, M, G, KiB, MiB, GiB, KB, MB or GB"
        )
    result = value * _SIZE_UNITS[key]
    if not math.isfinite(result):
        raise CcsimError(f"invalid {field} {shown(text)}: a size must be finite")
    if result > MAX_SIZE:
        raise CcsimError(
            f"invalid {field} {shown(text)}: {result:.3g} bytes is more than 1 TiB, more than "
            "any GPU's memory (a B200 has 192 GB); give a size of at most 1T"
        )
    return result


def parse_bandwidth(text: str | float, *, field: str = "bandwidth") -> float:
    """Parse a bandwidth into bytes per second.

    >>> parse_bandwidth("400Gbps"), parse_bandwidth("900GB/s"), parse_bandwidth("25GBps")
    (50000000000.0, 900000000000.0, 25000000000.0)
    >>> parse_bandwidth("200Gb/s"), parse_bandwidth("400Gbit/s")  # bits, as NIC speeds
    (25000000000.0, 50000000000.0)
    """
    value, unit = _split(text, field, "400Gbps or 900GB/s")
    if unit == "":
        scale = 1.0  # a bare number is bytes per second
    else:
        match = _RATE_UNIT.match(unit)
        if match is None:
            raise CcsimError(
                f"invalid {field} {shown(text)}: unknown unit {shown(unit)}; use bits per second "
                "(Gbps, Gb/s, Gbit/s) or bytes per second (GB/s, GBps, GiB/s)"
            )
        power = _RATE_PREFIX[match["prefix"].lower()]
        scale = (1024.0 if match["binary"] else 1000.0) ** power
        if match["bits"]:
            scale /= 8
    result = value * scale
    if not result > 0 or math.isinf(result):
        raise CcsimError(f"invalid {field} {shown(text)}: a bandwidth must be positive and finite")
    return result


def parse_time(text: str | float, *, field: str = "time") -> float:
    """Parse a duration into seconds.

    >>> parse_time("8us"), parse_time("500ns"), parse_time(0.5)
    (8e-06, 5e-07, 0.5)
    """
    value, unit = _split(text, field, "8us or 500ns")
    key = unit.lower() if unit != "µs" else unit
    if key not in _TIME_DIVISORS:
        raise CcsimError(
            f"invalid {field} {shown(text)}: unknown unit {shown(unit)}; use s, ms, us or ns"
        )
    return value / _TIME_DIVISORS[key]


def parse_sizes(text: str, *, element: int = 1, source: str | None = None) -> list[int]:
    """Parse a list of message sizes for a sweep, in bytes, each at least one
    ``element`` (bytes of the data type: 4 for nccl-tests' fp32 counts).

    ``"8:4G"`` means powers of two from 8 B to 4 GiB (like nccl-tests ``-b 8 -e 4G -f 2``);
    ``"1M:1G:4"`` multiplies by 4 each time; ``"1M,64M,1G"`` is an explicit list. An
    error names ``source`` first (the option or file field the sizes came from).

    >>> parse_sizes("8:64")
    [8, 16, 32, 64]
    >>> parse_sizes("1K,1M")
    [1024, 1048576]
    >>> parse_sizes("1Mb", source="--sizes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: --sizes: invalid size '1Mb': 'Mb' could be bits or bytes; ...
    """
    try:
        return _sizes(text, element)
    except CcsimError as error:
        if source is None:
            raise
        raise CcsimError(f"{source}: {error}") from None


def _sizes(text: str, element: int) -> list[int]:
    """:func:`parse_sizes` without the source."""
    text = str(text).strip()
    if not text:
        raise CcsimError("no sizes given; write e.g. 8:4G or 1M,64M,1G")
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise CcsimError(
                f"invalid sizes {shown(text)}; a range is MIN:MAX or MIN:MAX:FACTOR, e.g. 8:4G"
            )
        low, high = (_positive_size(p, text, element) for p in parts[:2])
        factor = 2.0
        if len(parts) == 3:
            try:
                factor = float(parts[2])
            except ValueError:
                factor = 0.0
            if not factor > 1 or math.isinf(factor):
                raise CcsimError(
                    f"invalid sizes {shown(text)}: the factor must be a number above 1"
                )
        if high < low:
            raise CcsimError(f"invalid sizes {shown(text)}: the maximum is below the minimum")
        _check_count(math.floor(math.log(high / low) / math.log(factor) + 1e-9) + 1, text)
        sizes = []
        size = low
        while size <= high * (1 + 1e-12):
            sizes.append(round(size))
            size *= factor
        return sizes
    parts = text.split(",")
    _check_count(len(parts), text)
    return [round(_positive_size(p, text, element)) for p in parts]


def _check_count(count: int, text: str) -> None:
    if count > MAX_SIZES:
        raise CcsimError(
            f"invalid sizes {shown(text)}: {count:,} sizes, more than {MAX_SIZES:,}; "
            "use a larger factor or fewer values (e.g. 1M:1G:2)"
        )


def _positive_size(part: str, whole: str, element: int = 1) -> float:
    size = parse_size(part.strip(), field="size")
    if not size >= 1:
        raise CcsimError(
            f"invalid sizes {shown(whole)}: {shown(part)} is not a positive number of bytes"
        )
    if size < element:
        raise CcsimError(
            f"invalid sizes {shown(whole)}: {shown(part.strip())} bytes is less than one "
            f"{element}-byte element (a count of 0); give at least {element}"
        )
    return size
