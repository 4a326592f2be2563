"""Reading the mappings of a topology file, with key paths in every error.

A :class:`Spec` wraps one mapping of a preset file (``server``, ``server.nic``,
``fabric``...). Each accessor records the key as known; :meth:`Spec.done` then rejects
whatever key was not asked for, naming its full path (``server.nic.bandwith``) and the
valid keys, so that a typo never silently falls back to a default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import CcsimError, TopologyError, shown
from ..units import parse_bandwidth, parse_time

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgG]?)\s*(?:msg/s|/s)?\s*$")
_RATE_FACTORS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


#: Bytes/s below which a bare number (no unit) in a topology is refused as a forgotten
#: unit: 1 MB/s, slower than any link a cluster has.
MIN_BARE_BANDWIDTH = 1e6


def _bare_number(value: object) -> bool:
    """Whether ``value`` is a number written without a unit (``200``, ``"200"``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return True
    return isinstance(value, str) and re.fullmatch(r"\s*[0-9.eE+-]+\s*", value) is not None


def parse_rate(text: object, *, field: str = "message_rate") -> float:
    """Parse a message rate into messages per second (decimal K, M, G multiples).

    >>> parse_rate("30M"), parse_rate("30e6"), parse_rate("2.5K/s"), parse_rate(1000)
    (30000000.0, 30000000.0, 2500.0, 1000.0)
    """
    if isinstance(text, bool):
        value = math.nan
    elif isinstance(text, int | float):
        value = float(text)
    else:
        match = _RATE.match(str(text))
        value = float(match.group(1)) * _RATE_FACTORS[match.group(2).lower()] if match else math.nan
    if not (value > 0 and math.isfinite(value)):
        raise TopologyError(
            f"invalid {field} {shown(text)}; write a positive number of messages per second, "
            "e.g. 30M or 30e6"
        )
    return value


def parse_ratio(text: object, *, field: str = "oversubscription") -> float:
    """Parse an oversubscription ratio such as ``2``, ``1.5`` or ``"3:1"`` (>= 1).

    >>> parse_ratio("3:1"), parse_ratio(2), parse_ratio("1.5")
    (3.0, 2.0, 1.5)
    """
    value = math.nan
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
        if isinstance(text, int) and text >= 60:
            # YAML 1.1 reads an unquoted 2:1 as the base-60 number 121.
            raise TopologyError(
                f"invalid {field} {shown(text)}; an unquoted ratio such as 2:1 reads as a base-60 "
                "number in YAML: write 2 or '2:1' (quoted)"
            )
    elif isinstance(text, str):
        parts = text.split(":")
        try:
            numbers = [float(part) for part in parts]
        except ValueError:
            numbers = []
        if len(numbers) == 1:
            value = numbers[0]
        elif len(numbers) == 2 and numbers[1] > 0:
            value = numbers[0] / numbers[1]
    if not (value >= 1 and math.isfinite(value)):
        raise TopologyError(
            f"invalid {field} {shown(text)}; write the ratio of downlink to uplink bandwidth, at "
            "least 1, e.g. 2 or '2:1'"
        )
    return value


def expand_names(value: object, *, field: str) -> list[str]:
    """Expand a name, a range such as ``gpu0-3`` or a list of them into names.

    >>> expand_names(["gpu0-2", "cpu0"], field="ends")
    ['gpu0', 'gpu1', 'gpu2', 'cpu0']
    """
    items = value if isinstance(value, list) else [value]
    names: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise TopologyError(
                f"{field}: {shown(item)} is not a node name; write a name such as gpu0, a range "
                "such as gpu0-7, or a list of them"
            )
        match = re.fullmatch(r"(.*?)(\d+)-(\d+)", item)
        if match:
            stem, first, last = match.group(1), int(match.group(2)), int(match.group(3))
            if last < first:
                raise TopologyError(
                    f"{field}: range {shown(item)} runs backwards; write e.g. gpu0-7"
                )
            names.extend(f"{stem}{i}" for i in range(first, last + 1))
        else:
            names.append(item)
    return names


def _bandwidth(value: object, where: str) -> float:
    """``value`` as bytes/s; ``where`` names the field in messages."""
    try:
        result = parse_bandwidth(value, field=where)
    except CcsimError as error:  # the parser's message already names the field
        raise TopologyError(str(error)) from None
    if result < MIN_BARE_BANDWIDTH and _bare_number(value):
        # A bare number is bytes/s, but no link runs below 1 MB/s: "200" meant a unit.
        raise TopologyError(
            f"{where} is {shown(value)} with no unit, which reads as {shown(value)} bytes/s; "
            f"write the unit, e.g. {shown(value)}GB/s (bytes) or {shown(value)}Gbps (bits)"
        )
    return result


class Spec:
    """One mapping of a topology file; rejects unknown keys with their path."""

    def __init__(self, data: Any, path: str, source: str):
        if not isinstance(data, Mapping):
            raise TopologyError(
                f"{source}: '{path}' must be a mapping of keys to values, got {type(data).__name__}"
            )
        self.data = dict(data)
        self.path = path
        self.source = source
        self.used: set[str] = set()

    def field(self, key: str) -> str:
        """Where ``key`` is, for messages: ``file: path.key``."""
        return f"{self.source}: {self.path}.{key}"

    def get(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        """The raw value of ``key`` (marking it as known)."""
        self.used.add(key)
        if key not in self.data:
            if required:
                raise TopologyError(f"{self.field(key)} is missing; add it")
            return default
        return self.data[key]

    def has(self, key: str) -> bool:
        """Whether ``key`` is present (marking it as known)."""
        self.used.add(key)
        return key in self.data

    def bandwidth(self, key: str, default: Any = None, *, required: bool = False) -> float:
        """``key`` as bytes/s (strings such as ``400Gbps`` or ``900GB/s``)."""
        value = self.get(key, default, required=required)
        return _bandwidth(value, self.field(key))

    def bandwidths(self, key: str, count: int, *, what: str) -> list[float]:
        """``key`` as ``count`` bytes/s figures: one value for all, or a list of exactly
        ``count`` values, one per ``what`` (each with its unit, as :meth:`bandwidth`)."""
        value = self.get(key, required=True)
        if not isinstance(value, (list, tuple)):
            return [self.bandwidth(key)] * count
        if len(value) != count:
            raise TopologyError(
                f"{self.field(key)} lists {len(value)} values but there are {count} {what}s; "
                f"give one value per {what} or a single value for all"
            )
        return [_bandwidth(item, f"{self.field(key)}[{i}]") for i, item in enumerate(value)]

    def time(self, key: str, default: Any = 0.0) -> float:
        """``key`` as seconds (strings such as ``8us``), >= 0."""
        value = self.get(key, default)
        try:
            result = parse_time(value, field=self.field(key))
        except CcsimError as error:
            raise TopologyError(str(error)) from None
        if result < 0 or not math.isfinite(result):
            raise TopologyError(
                f"{self.field(key)} is {shown(value)}; latencies are finite and >= 0"
            )
        return result

    def rate(self, key: str) -> float | None:
        """``key`` as messages/s, or None when absent."""
        value = self.get(key)
        return None if value is None else parse_rate(value, field=self.field(key))

    def ratio(self, key: str, default: float = 1.0) -> float:
        """``key`` as a ratio >= 1 (``2`` or ``'2:1'``)."""
        value = self.get(key)
        return default if value is None else parse_ratio(value, field=self.field(key))

    def count(self, key: str, default: int | None = None, *, required: bool = False) -> int | None:
        """``key`` as a positive integer (or ``default`` when absent; None, given, is refused)."""
        value = self.get(key, default, required=required)
        if value is None and key not in self.data:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TopologyError(f"{self.field(key)} must be a positive integer, got {shown(value)}")
        return value

    def text(self, key: str, default: str | None = None) -> str | None:
        """``key`` as a string."""
        value = self.get(key, default)
        if value is not None and not isinstance(value, str):
            raise TopologyError(f"{self.field(key)} must be a string, got {shown(value)}")
        return value

    def sub(self, key: str, *, required: bool = False) -> Spec | None:
        """The mapping under ``key`` as a Spec, or None when absent."""
        value = self.get(key, required=required)
        if value is None:
            return None
        return Spec(value, f"{self.path}.{key}", self.source)

    def items(self, key: str) -> list[Spec]:
        """The list of mappings under ``key`` (``links``), each as a Spec."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise TopologyError(f"{self.field(key)} must be a list, got {type(value).__name__}")
        return [Spec(item, f"{self.path}.{key}[{i}]", self.source) for i, item in enumerate(value)]

    def done(self) -> None:
        """Reject any key no accessor asked for."""
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            raise TopologyError(
                f"{self.source}: unknown key '{self.path}.{unknown[0]}'; valid keys here: "
                + ", ".join(sorted(self.used))
            )
