"""Faults and stragglers: degraded, slow and failed parts of a cluster.

A *fault spec* lists what is wrong; :func:`load_faults` reads it (inline strings such as
``--fault`` takes, a YAML file, or the same mappings in Python) and :func:`apply_faults`
applies it to a copy of a topology graph. What can be wrong:

========================  ==============================================================
``link=A-B:F``            the link between nodes A and B runs at F of its bandwidth
``node=NAME:F``           every link of node NAME (a NIC, a switch) at F
``kind=TYPE:F``           every link whose type (edge attribute ``link``) is TYPE
``server=S:F``            every link of a node of server S (its GPUs, NICs, switches)
``rail=K:F``              every link of NIC K of each server (its local NIC index)
``fail=NAME``             a NIC or switch is down (removed, with its links)
``fail=A-B``              a link is down (removed)
``gpu=R:compute=X``       rank R (``5``, ``0-7`` or ``1,5``) computes X times slower
``gpu=R:reduce=Y``        rank R reduces at 1/Y of its ``reduce_bandwidth``
``random:q=Q,...``        each link degraded with probability Q (see below)
========================  ==============================================================

Options follow the last ``:`` as a comma list: a bare number is the fraction F
(0 < F <= 1, or a percentage such as ``50%``); ``fraction=F``, ``latency=8us`` (added to
each matched link), ``t0=1ms`` and ``t1=3ms`` (the degradation, or the GPU slowdown,
holds only from t0 to t1 of simulated time; bandwidth only: latencies and failures are
permanent). Random faults take ``q`` (probability that a link is degraded), ``fraction``
(default 0.5), ``seed`` (default 0), ``kind`` (only links of that type; default every
link), ``jitter`` and ``dist``: every compute op's duration is multiplied by a factor
drawn, per op, from ``dist`` with spread ``jitter`` -- ``lognormal`` (default):
exp(jitter z), median 1; ``normal``: max(0, 1 + jitter z); ``uniform``: between
1 - jitter and 1 + jitter; ``exponential``: 1 + jitter e, e ~ Exp(1), slowdowns only.
Names containing ``:`` can only be given in the YAML form.

Examples: ``link=s0/nic0-leaf0:0.5``, ``kind=rdma:0.5,latency=2us``, ``server=3:0.25``,
``rail=2:0.5,t0=1ms,t1=3ms``, ``fail=s1/nic3``, ``gpu=5:compute=2``,
``random:q=0.05,fraction=0.5,seed=1,kind=rdma``.

YAML file: a list of faults (or a mapping with the key ``faults`` holding one), each an
inline string or a mapping with the same keys::

    faults:
      - {link: s0/nic0-leaf0, fraction: 0.5, latency: 8us, t0: 1ms, t1: 3ms}
      - {fail: s1/nic3}
      - {gpu: [0, 5], compute: 1.5}
      - {random: {q: 0.05, fraction: 0.25, seed: 1, kind: rdma, jitter: 0.05}}

How they act. Permanent degradations scale the edge ``bandwidth`` (several faults on one
link multiply) and add to its ``latency``; failures remove edges or nodes, so routes
(:mod:`~simulator.network.routing`) go around them, and a failure that leaves some GPU
without a route, or without a NIC it reaches without passing another GPU, is an error
naming the ranks cut off. A slow reduction divides the GPU's ``reduce_bandwidth``. All of
that happens on a copy of the graph, before simulation. Timed degradations are applied
during the run by :func:`schedule_link_faults` through
:meth:`~simulator.network.flows.FlowNetwork.scale_links` (the flows in flight on the
link take their new rates at t0 and at t1). Compute slowdowns and jitter are applied by
the workload engine through :func:`compute_scaler` (an op slowed by a timed fault is one
that starts between t0 and t1). The faulted graph carries what the run needs in
``graph.graph["faults"]`` (a :class:`FaultPlan`) and marks faulted links and GPUs with a
``fault`` attribute (``"degraded 0.5x"``) that timelines and traces show.

Random faults are seeded: link k (in graph order) is degraded when the k-th draw of
``numpy.random.default_rng(seed)`` is below q, so the same seed degrades the same links,
and a larger q with the same seed degrades a superset of them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import networkx as nx
import numpy as np

from ..errors import CcsimError, shown
from ..files import load_data
from ..topology.graph import gpu_nodes, gpus_without_nic, nodes_of_kind
from ..units import parse_time
from .routing import ecmp_hash

#: How a degradation picks its links.
MATCH_BY = ("link", "node", "kind", "server", "rail")
#: Distributions of compute jitter.
DISTRIBUTIONS = ("lognormal", "normal", "uniform", "exponential")
#: Options of a random fault, which sweeps may vary as ``fault.<option>`` axes.
RANDOM_KEYS = ("q", "fraction", "seed", "kind", "jitter", "dist")
_LINK_KEYS = ("fraction", "latency", "t0", "t1")
_GPU_KEYS = ("compute", "reduce", "t0", "t1")
_EXAMPLE = "link=s0/nic0-leaf0:0.5, kind=rdma:0.5, fail=s1/nic3, gpu=5:compute=2"
#: File suffixes read as fault files (anything else is an inline fault).
FILE_SUFFIXES = (".yaml", ".yml", ".json")


class FaultError(CcsimError):
    """A fault spec is malformed or names parts the topology does not have."""


# -- the spec ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkMatch:
    """Which links a fault acts on: ``by`` one of :data:`MATCH_BY`, and its value (a link
    ``A-B``, a node name, a link type, a server number or a NIC index)."""

    by: str
    value: str | int

    def __str__(self) -> str:
        return f"{self.by}={self.value}"


@dataclass(frozen=True)
class LinkFault:
    """Matched links at ``fraction`` of their bandwidth (0 < fraction <= 1) with
    ``extra_latency`` seconds more, from ``t0`` to ``t1`` seconds of simulated time
    (default: the whole run)."""

    match: LinkMatch
    fraction: float = 1.0
    extra_latency: float = 0.0
    t0: float = 0.0
    t1: float = math.inf

    @property
    def timed(self) -> bool:
        """Whether the fault holds for part of the run only."""
        return self.t0 > 0 or math.isfinite(self.t1)


@dataclass(frozen=True)
class LinkFailure:
    """Matched links are down: removed from the graph."""

    match: LinkMatch


@dataclass(frozen=True)
class NicFailure:
    """A NIC (or a fabric switch) is down: removed with its links."""

    node: str


@dataclass(frozen=True)
class SlowGpu:
    """``ranks`` compute ``compute_factor`` times slower (from ``t0`` to ``t1``) and
    reduce at 1/``reduce_factor`` of their reduce bandwidth (the whole run)."""

    ranks: tuple[int, ...]
    compute_factor: float = 1.0
    reduce_factor: float = 1.0
    t0: float = 0.0
    t1: float = math.inf


@dataclass(frozen=True)
class RandomFaults:
    """Each link (of type ``kind``; default every link) degraded to ``fraction`` with
    probability ``q``; each compute op's duration scaled by a factor drawn from
    ``distribution`` with spread ``jitter`` (see the module docstring). Seeded."""

    q: float = 0.0
    fraction: float = 0.5
    seed: int = 0
    kind: str | None = None
    jitter: float = 0.0
    distribution: str = "lognormal"


Fault = LinkFault | LinkFailure | NicFailure | SlowGpu | RandomFaults


@dataclass(frozen=True)
class FaultSpec:
    """A parsed fault spec: :func:`load_faults` builds it, :func:`apply_faults` applies it.

    >>> spec = load_faults(["kind=rdma:0.5", "gpu=0-1:compute=2"])
    >>> str(spec), spec.data()[1]
    ('kind=rdma:0.5 gpu=0-1:compute=2', {'gpu': [0, 1], 'compute': 2.0})
    >>> load_faults(spec.data()) == spec
    True
    """

    faults: tuple[Fault, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def __str__(self) -> str:
        return " ".join(inline(fault) for fault in self.faults)

    def data(self) -> list[dict[str, Any]]:
        """The spec as plain mappings (JSON data; :func:`load_faults` reads them back)."""
        return [_data(fault) for fault in self.faults]


def inline(fault: Fault) -> str:
    """The inline form of one fault (as ``--fault`` takes it).

    >>> inline(LinkFault(LinkMatch("kind", "rdma"), 0.5, 2e-6, 1e-3))
    'kind=rdma:0.5,latency=2us,t0=1ms'
    """
    data = _data(fault)
    if isinstance(fault, RandomFaults):
        return "random:" + ",".join(f"{k}={_text(k, v)}" for k, v in data["random"].items())
    head, value = next(iter(data.items()))
    if head == "gpu":
        value = _rank_text(value)
    options = [f"{k}={_text(k, v)}" for k, v in list(data.items())[1:]]
    if options and options[0].startswith("fraction="):
        options[0] = options[0].split("=", 1)[1]
    return f"{head}={value}" + (":" + ",".join(options) if options else "")


def _data(fault: Fault) -> dict[str, Any]:
    if isinstance(fault, LinkFault):
        data: dict[str, Any] = {fault.match.by: fault.match.value, "fraction": fault.fraction}
        if fault.extra_latency:
            data["latency"] = fault.extra_latency
        _times(data, fault.t0, fault.t1)
        return data
    if isinstance(fault, LinkFailure):
        return {"fail": fault.match.value}
    if isinstance(fault, NicFailure):
        return {"fail": fault.node}
    if isinstance(fault, SlowGpu):
        data = {"gpu": list(fault.ranks)}
        if fault.compute_factor != 1:
            data["compute"] = fault.compute_factor
        if fault.reduce_factor != 1:
            data["reduce"] = fault.reduce_factor
        _times(data, fault.t0, fault.t1)
        return data
    options: dict[str, Any] = {"q": fault.q, "fraction": fault.fraction, "seed": fault.seed}
    if fault.kind is not None:
        options["kind"] = fault.kind
    if fault.jitter:
        options["jitter"] = fault.jitter
        options["dist"] = fault.distribution
    return {"random": options}


def _times(data: dict[str, Any], t0: float, t1: float) -> None:
    if t0 > 0:
        data["t0"] = t0
    if math.isfinite(t1):
        data["t1"] = t1


def _text(key: str, value: Any) -> str:
    if key in ("latency", "t0", "t1"):
        return _time_text(value).replace(" ", "")
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _time_text(seconds: float) -> str:
    """``8 us``, ``1.5 ms``: a time in the unit that reads best."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:g} {unit}"
    return f"{seconds * 1e9:g} ns"


def _rank_text(ranks: Sequence[int]) -> str:
    """Ranks as short ranges: ``0-3,8``."""
    parts, start = [], None
    for i, rank in enumerate(ranks):
        start = rank if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(f"{start}" if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts)


# -- loading -------------------------------------------------------------------------------


def load_faults(
    specs: str | Path | Mapping | Sequence[str | Path | Mapping] | FaultSpec | None,
) -> FaultSpec:
    """Parse faults: inline strings, YAML/JSON files, mappings, or a list of them.

    A string ending in ``.yaml``, ``.yml`` or ``.json`` is a file (see the module
    docstring for both forms); any other string is one inline fault. Errors name the
    string or the file and entry, and say how to write it.

    >>> load_faults("link=s0/nic0-leaf0:0.5").faults[0]
    LinkFault(match=LinkMatch(by='link', value='s0/nic0-leaf0'), fraction=0.5, \
extra_latency=0.0, t0=0.0, t1=inf)
    >>> load_faults("kind=rdma:1.5")
    Traceback (most recent call last):
    ...
    simulator.network.faults.FaultError: fault 'kind=rdma:1.5': fraction 1.5 is not in \
(0, 1]; give the share of the bandwidth left, e.g. 0.5
    """
    if specs is None:
        return FaultSpec()
    if isinstance(specs, FaultSpec):
        return specs
    if isinstance(specs, str | Path | Mapping):
        specs = [specs]
    faults: list[Fault] = []
    for i, item in enumerate(specs):
        if isinstance(item, FaultSpec):
            faults.extend(item.faults)
        elif isinstance(item, Path) or (
            isinstance(item, str) and item.lower().endswith(FILE_SUFFIXES)
        ):
            faults.extend(_load_file(Path(item)))
        elif isinstance(item, str):
            faults.append(_parse(_inline_mapping(item), repr(item)))
        elif isinstance(item, Mapping):
            faults.append(_parse(item, f"faults[{i}]"))
        else:
            raise FaultError(
                f"faults[{i}]: {shown(item)} is not a fault; give an inline string such as "
                f"{_EXAMPLE}, a mapping, or a YAML file"
            )
    return FaultSpec(tuple(faults))


def _load_file(path: Path) -> list[Fault]:
    if not path.is_file():
        raise FaultError(
            f"fault file {str(path)!r} not found; give a YAML file of faults or an inline "
            f"fault such as {_EXAMPLE}"
        )
    data = load_data(path, what="fault file", error=FaultError)
    if isinstance(data, Mapping):
        unknown = sorted(set(data) - {"faults"}, key=str)
        if unknown:
            raise FaultError(
                f"{path}: unknown key {shown(unknown[0])}; a fault file is a list of faults "
                "or a mapping with the key 'faults'"
            )
        data = data.get("faults")
    if not isinstance(data, list):
        raise FaultError(
            f"{path}: expected a list of faults (or 'faults:' holding one), got "
            f"{type(data).__name__}"
        )
    faults = []
    for i, item in enumerate(data):
        where = f"{path}: faults[{i}]"
        if isinstance(item, str):
            faults.append(_parse(_inline_mapping(item, where), where))
        elif isinstance(item, Mapping):
            faults.append(_parse(item, where))
        else:
            raise FaultError(f"{where}: {shown(item)} is not a fault; give a string or a mapping")
    return faults


def _inline_mapping(text: str, where: str | None = None) -> dict[str, Any]:
    """``WHAT=TARGET[:OPTIONS]`` or ``random:OPTIONS`` as the mapping form."""
    where = where or repr(text)
    text = text.strip()
    if text == "random" or text.startswith("random:"):
        head, colon, options = text.partition(":")
    elif ":" in text:  # options follow the last ':' (node names may hold none)
        head, colon, options = text.rpartition(":")
    else:
        head, colon, options = text, "", ""
    if not head:
        raise FaultError(f"fault {where}: nothing before ':'; write e.g. {_EXAMPLE}")
    items: dict[str, Any] = {}
    if head == "random":
        items["random"] = _options(options, where, allow_number=False) if colon else {}
        return items
    what, equals, target = (part.strip() for part in head.partition("="))
    if not equals or not target or what not in (*MATCH_BY, "fail", "gpu"):
        raise FaultError(
            f"fault {where}: expected WHAT=TARGET[:OPTIONS] with WHAT one of "
            f"{', '.join((*MATCH_BY, 'fail', 'gpu'))}, or random:OPTIONS; e.g. {_EXAMPLE}"
        )
    if what == "fail" and colon:
        raise FaultError(
            f"fault {where}: fail=NAME takes no options (a failure is total and lasts the "
            "whole run); to slow a link instead write link=A-B:FRACTION"
        )
    items[what] = target
    if colon:
        items.update(_options(options, where, allow_number=what in MATCH_BY))
    return items


def _options(text: str, where: str, *, allow_number: bool) -> dict[str, Any]:
    """``0.5,latency=8us`` as ``{"fraction": "0.5", "latency": "8us"}``."""
    out: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise FaultError(f"fault {where}: an empty option; separate options with one ','")
        key, equals, value = part.partition("=")
        if not equals:
            if not allow_number:
                raise FaultError(
                    f"fault {where}: option {part!r} needs a name, e.g. compute=2 or q=0.05"
                )
            key, value = "fraction", part
        key = key.strip()
        if key in out:
            raise FaultError(f"fault {where}: option {key!r} given twice")
        out[key] = value.strip()
    return out


def _parse(data: Mapping, where: str) -> Fault:
    """One fault from its mapping form; errors name ``where``."""
    heads = [key for key in (*MATCH_BY, "fail", "gpu", "random") if key in data]
    if len(heads) != 1:
        what = "no" if not heads else "several"
        raise FaultError(
            f"fault {where}: {what} kind of fault ({', '.join(map(str, data)) or 'empty'}); "
            f"give exactly one of {', '.join((*MATCH_BY, 'fail', 'gpu', 'random'))}, "
            f"e.g. {_EXAMPLE}"
        )
    head = heads[0]
    rest = {str(k): v for k, v in data.items() if k != head}
    field_of = _Fields(where)
    if head == "random":
        options = data["random"]
        if options is None:
            options = {}
        if not isinstance(options, Mapping) or rest:
            raise FaultError(
                f"fault {where}: random takes its options in a mapping, e.g. "
                "{random: {q: 0.05, fraction: 0.5, seed: 1}} or random:q=0.05,seed=1"
            )
        options = {str(k): v for k, v in options.items()}
        field_of.check(options, RANDOM_KEYS, "random")
        values = {key: random_option(key, options[key], where) for key in options}
        fault = RandomFaults(
            q=values.get("q", 0.0),
            fraction=values.get("fraction", 0.5),
            seed=values.get("seed", 0),
            kind=values.get("kind"),
            jitter=values.get("jitter", 0.0),
            distribution=values.get("dist", "lognormal"),
        )
        return fault  # q and jitter default to 0: a sweep's fault.q axis may give q
    target = data[head]
    if head == "fail":
        field_of.check(rest, (), "fail")
        name = field_of.name(target, "fail")
        if "-" in name:
            return LinkFailure(LinkMatch("link", name))
        return NicFailure(name)
    if head == "gpu":
        field_of.check(rest, _GPU_KEYS, "gpu")
        ranks = field_of.ranks(target)
        compute = field_of.factor(rest.get("compute", 1.0), "compute")
        reduce = field_of.factor(rest.get("reduce", 1.0), "reduce")
        t0, t1 = field_of.window(rest)
        if "compute" not in rest and "reduce" not in rest:
            raise FaultError(
                f"fault {where}: a GPU fault needs compute=X or reduce=Y (X, Y >= 1: how many "
                "times slower), e.g. gpu=5:compute=2"
            )
        if reduce != 1 and (t0 > 0 or math.isfinite(t1)):
            raise FaultError(
                f"fault {where}: a slow reduction holds for the whole run; drop t0/t1 or give "
                "the reduction its own fault without them"
            )
        return SlowGpu(ranks, compute, reduce, t0, t1)
    field_of.check(rest, _LINK_KEYS, head)
    if head in ("server", "rail"):
        value: str | int = field_of.integer(target, head)
    else:
        value = field_of.name(target, head)
    fraction = field_of.fraction(rest.get("fraction", 1.0))
    latency = field_of.time(rest.get("latency", 0.0), "latency")
    t0, t1 = field_of.window(rest)
    if "fraction" not in rest and "latency" not in rest:
        raise FaultError(
            f"fault {where}: changes nothing; give the share of bandwidth left (e.g. "
            f"{head}={value}:0.5) or latency=8us"
        )
    if latency and (t0 > 0 or math.isfinite(t1)):
        raise FaultError(
            f"fault {where}: added latency holds for the whole run (t0/t1 time bandwidth "
            "only); give the latency in a fault of its own without t0/t1"
        )
    return LinkFault(LinkMatch(head, value), fraction, latency, t0, t1)


def random_option(key: str, raw: Any, where: str) -> Any:
    """One option of a random fault (``q``, ``fraction``, ``seed``, ``kind``, ``jitter``,
    ``dist``) parsed and checked; sweeps parse their ``fault.<option>`` axes with it.

    >>> random_option("q", "5%", "axes.fault.q[0]"), random_option("seed", "3", "x")
    (0.05, 3)
    """
    fields = _Fields(where)
    if key == "q":
        return fields.number(raw, "q", low=0.0, high=1.0, low_open=False)
    if key == "fraction":
        return fields.fraction(raw)
    if key == "seed":
        return fields.integer(raw, "seed")
    if key == "kind":
        return fields.name(raw, "kind")
    if key == "jitter":
        return fields.number(raw, "jitter", low=0.0, high=math.inf, low_open=False)
    if key == "dist":
        if raw not in DISTRIBUTIONS:
            raise FaultError(
                f"fault {where}: unknown distribution {shown(raw)}; valid: "
                + ", ".join(DISTRIBUTIONS)
            )
        return str(raw)
    raise FaultError(
        f"fault {where}: unknown random-fault option {shown(key)}; valid: {', '.join(RANDOM_KEYS)}"
    )


def with_random_option(data: Sequence[Mapping[str, Any]] | None, key: str, value: Any) -> list:
    """A copy of a spec's data (:meth:`FaultSpec.data`) with option ``key`` of its random
    fault set to ``value`` (a random fault is added if it has none): the sweep's
    ``fault.<option>`` axes.

    >>> with_random_option([{"fail": "s1/nic3"}], "q", 0.05)
    [{'fail': 's1/nic3'}, {'random': {'q': 0.05}}]
    """
    out = [dict(item) for item in data or ()]
    for item in out:
        if "random" in item:
            item["random"] = {**(item["random"] or {}), key: value}
            return out
    out.append({"random": {key: value}})
    return out


class _Fields:
    """Parsers of a fault's fields; errors name the fault (``where``) and the field."""

    def __init__(self, where: str):
        self.where = where

    def error(self, message: str) -> FaultError:
        return FaultError(f"fault {self.where}: {message}")

    def check(self, options: Mapping[str, Any], valid: Sequence[str], head: str) -> None:
        unknown = sorted(set(options) - set(valid), key=str)
        if unknown:
            allowed = f"valid: {', '.join(valid)}" if valid else "it takes none"
            raise self.error(f"unknown option {shown(unknown[0])} for {head}; {allowed}")

    def name(self, raw: Any, field_name: str) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise self.error(f"{field_name} {shown(raw)} is not a name; e.g. {_EXAMPLE}")
        return raw.strip()

    def integer(self, raw: Any, field_name: str) -> int:
        value = raw
        if isinstance(raw, str) and re.fullmatch(r"\s*\d+\s*", raw):
            value = int(raw)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(f"{field_name} {shown(raw)} is not a whole number >= 0")
        return value

    def number(
        self, raw: Any, field_name: str, *, low: float, high: float, low_open: bool
    ) -> float:
        value = raw
        if isinstance(raw, str):
            text = raw.strip()
            try:
                value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
            except ValueError:
                value = None
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise self.error(f"{field_name} {_written(raw)} is not a number")
        value = float(value)
        if (value <= low if low_open else value < low) or value > high:
            bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise self.error(f"{field_name} {_written(raw)} is not in {bounds}")
        return value

    def fraction(self, raw: Any) -> float:
        try:
            return self.number(raw, "fraction", low=0.0, high=1.0, low_open=True)
        except FaultError as error:
            if "is not in" not in str(error):
                raise
            raise self.error(
                f"fraction {_written(raw)} is not in (0, 1]; give the share of the bandwidth "
                "left, e.g. 0.5"
            ) from None

    def factor(self, raw: Any, field_name: str) -> float:
        value = self.number(raw, field_name, low=0.0, high=math.inf, low_open=True)
        if value < 1 or math.isinf(value):
            raise self.error(
                f"{field_name}={shown(raw)}: give how many times slower, a finite number >= 1 "
                f"(e.g. {field_name}=2: twice as slow)"
            )
        return value

    def time(self, raw: Any, field_name: str) -> float:
        try:
            value = parse_time(raw, field=field_name)
        except CcsimError as error:
            raise self.error(str(error)) from None
        if not (value >= 0 and math.isfinite(value)):
            raise self.error(f"{field_name} {shown(raw)} must be a finite time >= 0, e.g. 8us")
        return value

    def window(self, options: Mapping[str, Any]) -> tuple[float, float]:
        t0 = self.time(options.get("t0", 0.0), "t0")
        t1 = self.time(options["t1"], "t1") if "t1" in options else math.inf
        if not t1 > t0:
            raise self.error(f"t1 ({_time_text(t1)}) must come after t0 ({_time_text(t0)})")
        return t0, t1

    def ranks(self, raw: Any) -> tuple[int, ...]:
        items: list[Any]
        if isinstance(raw, str):
            items = [part.strip() for part in raw.split(",")]
        elif isinstance(raw, list | tuple):
            items = list(raw)
        else:
            items = [raw]
        ranks: set[int] = set()
        for item in items:
            if isinstance(item, str) and re.fullmatch(r"\d+\s*-\s*\d+", item):
                first, last = (int(x) for x in item.split("-"))
                if last < first:
                    raise self.error(f"rank range {item!r} runs backwards; write low-high")
                ranks.update(range(first, last + 1))
            else:
                ranks.add(self.integer(item, "gpu rank"))
        if not ranks:
            raise self.error("gpu names no rank; e.g. gpu=5 or gpu=0-7")
        return tuple(sorted(ranks))


# -- applying ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimedLinks:
    """Links (node pairs, as graph edges) at ``fraction`` from ``t0`` to ``t1``."""

    edges: tuple[tuple[Any, Any], ...]
    fraction: float
    t0: float
    t1: float


@dataclass(frozen=True)
class Jitter:
    """Compute jitter: spread, distribution and seed (see the module docstring)."""

    spread: float
    distribution: str
    seed: int

    def factor(self, op: int) -> float:
        """The factor of op ``op`` (a pure function of the seed and the op index)."""
        u = ((ecmp_hash(self.seed, op) >> 11) + 0.5) / 2.0**53  # uniform in (0, 1)
        if self.distribution == "uniform":
            return max(0.0, 1.0 + self.spread * (2.0 * u - 1.0))
        if self.distribution == "exponential":
            return 1.0 - self.spread * math.log1p(-u)
        z = NormalDist().inv_cdf(u)
        if self.distribution == "normal":
            return max(0.0, 1.0 + self.spread * z)
        return math.exp(self.spread * z)


@dataclass(frozen=True)
class FaultPlan:
    """What a faulted graph still needs at run time (``graph.graph["faults"]``): timed
    link degradations, compute slowdowns, compute jitter; and the spec, for reports."""

    spec: str = ""
    timed_links: tuple[TimedLinks, ...] = ()
    slow: tuple[SlowGpu, ...] = ()
    jitter: tuple[Jitter, ...] = ()

    def merged(self, other: FaultPlan) -> FaultPlan:
        """Both plans together (faults applied to an already faulted graph)."""
        return FaultPlan(
            " ".join(filter(None, (self.spec, other.spec))),
            self.timed_links + other.timed_links,
            self.slow + other.slow,
            self.jitter + other.jitter,
        )


def fault_plan(graph: nx.Graph | None) -> FaultPlan | None:
    """The :class:`FaultPlan` a faulted graph carries (None for a healthy graph)."""
    if graph is None:
        return None
    plan = graph.graph.get("faults")
    return plan if isinstance(plan, FaultPlan) else None


def apply_faults(
    graph: nx.Graph, faults: FaultSpec | str | Sequence[Any] | Mapping | None
) -> nx.Graph:
    """A copy of ``graph`` with ``faults`` (a :class:`FaultSpec` or anything
    :func:`load_faults` reads) applied; ``graph`` itself is never changed (and is returned
    as is when there are no faults).

    Raises :class:`FaultError` for names the graph does not have (listing valid ones) and
    for failures that cut some ranks off (naming them).

    Examples
    --------
    >>> from simulator.topology import ring_graph
    >>> g = apply_faults(ring_graph(4, 100e9), "link=gpu0-gpu1:0.25")
    >>> g.edges["gpu0", "gpu1"]["bandwidth"], g.edges["gpu0", "gpu1"]["fault"]
    (25000000000.0, 'degraded 0.25x')
    >>> apply_faults(ring_graph(4, 100e9), ["fail=gpu0-gpu1", "fail=gpu2-gpu3"])
    Traceback (most recent call last):
    ...
    simulator.network.faults.FaultError: faults fail=gpu0-gpu1 fail=gpu2-gpu3 cut off \
ranks 1-2 (gpu1, gpu2) from ranks 0,3 (gpu0, gpu3): no route remains between them; \
remove a failure or add links
    """
    spec = load_faults(faults)
    if not spec:
        return graph
    resolve = _Resolver(graph, spec)
    out = graph.copy()
    scale: dict[tuple, float] = defaultdict(lambda: 1.0)
    extra: dict[tuple, float] = defaultdict(float)
    marks: dict[tuple, list[str]] = defaultdict(list)
    gone_edges: set[tuple] = set()
    gone_nodes: set = set()
    timed: list[TimedLinks] = []
    slow: list[SlowGpu] = []
    jitter: list[Jitter] = []
    gpu_marks: dict[Any, list[str]] = defaultdict(list)
    for fault in spec.faults:
        if isinstance(fault, LinkFault):
            edges = resolve.edges(fault.match, fault)
            if fault.timed:
                timed.append(TimedLinks(tuple(edges), fault.fraction, fault.t0, fault.t1))
                text = f"degraded {fault.fraction:g}x {_window_text(fault.t0, fault.t1)}"
            else:
                text = f"degraded {fault.fraction:g}x" if fault.fraction != 1 else ""
                if fault.extra_latency:
                    text = f"{text} +{_time_text(fault.extra_latency)}".strip()
            for edge in edges:
                if not fault.timed:
                    scale[edge] *= fault.fraction
                    extra[edge] += fault.extra_latency
                marks[edge].append(text)
        elif isinstance(fault, LinkFailure):
            node = resolve.failed_node(fault.match)
            if node is not None:
                gone_nodes.add(node)
            else:
                gone_edges.update(resolve.edges(fault.match, fault))
        elif isinstance(fault, NicFailure):
            gone_nodes.add(resolve.failed_node(LinkMatch("node", fault.node), required=True))
        elif isinstance(fault, SlowGpu):
            nodes = resolve.gpus(fault)
            if fault.compute_factor != 1:
                slow.append(fault)
            for node in nodes:
                if fault.compute_factor != 1:
                    window = _window_text(fault.t0, fault.t1)
                    gpu_marks[node].append(f"compute {fault.compute_factor:g}x {window}".strip())
                if fault.reduce_factor != 1:
                    bandwidth = graph.nodes[node].get("reduce_bandwidth")
                    if bandwidth is None:
                        raise resolve.error(
                            fault,
                            f"GPU {node!r} has no reduce_bandwidth (its reductions take no "
                            "time), so reduce= cannot slow them; give the topology's GPUs a "
                            "reduce bandwidth or leave reduce= out",
                        )
                    out.nodes[node]["reduce_bandwidth"] = bandwidth / fault.reduce_factor
                    gpu_marks[node].append(f"reduce {fault.reduce_factor:g}x")
        else:  # RandomFaults
            for edge in resolve.random_edges(fault):
                scale[edge] *= fault.fraction
                marks[edge].append(f"degraded {fault.fraction:g}x")
            if fault.jitter:
                jitter.append(Jitter(fault.jitter, fault.distribution, fault.seed))
    for edge, factor in scale.items():
        out.edges[edge]["bandwidth"] = float(graph.edges[edge]["bandwidth"]) * factor
    for edge, added in extra.items():
        out.edges[edge]["latency"] = float(graph.edges[edge].get("latency", 0.0)) + added
    for edge, texts in marks.items():
        _mark(out.edges[edge], texts)
    for node, texts in gpu_marks.items():
        _mark(out.nodes[node], texts)
    if gone_edges or gone_nodes:
        out.remove_edges_from(gone_edges)
        out.remove_nodes_from(gone_nodes)
        _check_reach(out, graph, f"faults {spec}")
    plan = FaultPlan(str(spec), tuple(timed), tuple(slow), tuple(jitter))
    before = fault_plan(graph)
    out.graph["faults"] = plan if before is None else before.merged(plan)
    return out


def _mark(data: dict, texts: list[str]) -> None:
    """Add fault descriptions to a node's or edge's ``fault`` attribute."""
    kept = [text for text in [data.get("fault", ""), *texts] if text]
    data["fault"] = "; ".join(dict.fromkeys(kept))


def _window_text(t0: float, t1: float) -> str:
    if t0 == 0 and math.isinf(t1):
        return ""
    if math.isinf(t1):
        return f"from {_time_text(t0)}"
    return f"from {_time_text(t0)} to {_time_text(t1)}"


class _Resolver:
    """Resolves a spec's names against a graph; errors list a few valid names."""

    def __init__(self, graph: nx.Graph, spec: FaultSpec):
        self.graph = graph
        self.spec = spec
        self.directed = graph.is_directed()
        self.edge_list = list(graph.edges)
        self.kinds = {str(data.get("link", "")) for *_, data in graph.edges(data=True)}
        self.gpu_list = gpu_nodes(graph)
        self._nic_index: dict | None = None
        self._canon: dict[tuple, tuple] | None = None

    def error(self, fault: Fault, message: str) -> FaultError:
        return FaultError(f"fault {inline(fault)}: {message}")

    def key(self, a: Any, b: Any) -> tuple:
        """The edge as ``graph.edges`` lists it (an undirected edge in either order)."""
        if self._canon is None:
            self._canon = {}
            for u, v in self.edge_list:
                self._canon[(u, v)] = (u, v)
                if not self.directed:
                    self._canon.setdefault((v, u), (u, v))
        return self._canon[(a, b)]

    def edges(self, match: LinkMatch, fault: Fault) -> list[tuple]:
        """The graph edges ``match`` names (at least one)."""
        graph = self.graph
        if match.by == "link":
            return [self.link(str(match.value), fault)]
        if match.by == "node":
            node = self.node(str(match.value), fault)
            return list(dict.fromkeys(self.key(*edge) for edge in self._node_edges(node)))
        if match.by == "kind":
            found = [
                (u, v)
                for u, v, d in graph.edges(data=True)
                if str(d.get("link", "")) == match.value
            ]
            if not found:
                raise self.error(
                    fault, f"no link of type {match.value!r}; types here: {_few(self.kinds)}"
                )
            return found
        if match.by == "server":
            servers = {d.get("server") for _, d in graph.nodes(data=True)} - {None}
            if match.value not in servers:
                have = f"0-{max(servers)}" if servers else "none (no node has 'server')"
                raise self.error(fault, f"no server {match.value}; servers here: {have}")
            inside = {n for n, d in graph.nodes(data=True) if d.get("server") == match.value}
            return [(u, v) for u, v in self.edge_list if u in inside or v in inside]
        nics = [node for node, index in self.nic_index().items() if index == match.value]
        if not nics:
            rails = sorted(set(self.nic_index().values()))
            have = f"0-{rails[-1]}" if rails else "none (no NICs)"
            raise self.error(fault, f"no NIC with local index {match.value}; rails here: {have}")
        return [(u, v) for u, v in self.edge_list if u in nics or v in nics]

    def _node_edges(self, node: Any) -> list[tuple]:
        if self.directed:
            return list(self.graph.in_edges(node)) + list(self.graph.out_edges(node))
        return list(self.graph.edges(node))

    def nic_index(self) -> dict:
        """Each NIC's local index: its position among its server's NICs, in graph order."""
        if self._nic_index is None:
            count: dict[Any, int] = defaultdict(int)
            self._nic_index = {}
            for node in nodes_of_kind(self.graph, "nic"):
                server = self.graph.nodes[node].get("server")
                self._nic_index[node] = count[server]
                count[server] += 1
        return self._nic_index

    def link(self, text: str, fault: Fault) -> tuple:
        """The edge named ``A-B`` (node names may contain '-': every split is tried)."""
        nodes = {str(node): node for node in self.graph.nodes}
        pairs = []
        for found in re.finditer("-", text):
            a, b = text[: found.start()], text[found.end() :]
            if a in nodes and b in nodes:
                pairs.append((nodes[a], nodes[b]))
        for a, b in pairs:
            if self.graph.has_edge(a, b):
                return self.key(a, b)
        if pairs:
            a, b = pairs[0]
            links = [f"{u}-{v}" for u, v in self._node_edges(a)]
            raise self.error(
                fault, f"{a!r} and {b!r} are not linked; links of {a!r}: {_few(links)}"
            )
        examples = [f"{u}-{v}" for u, v in self._examples()]
        raise self.error(
            fault,
            f"no link {text!r} in the topology; name a link by its end nodes, A-B, e.g. "
            f"{_few(examples)}",
        )

    def _examples(self) -> list[tuple]:
        """A few edges, one per link type and end-node kinds (for messages)."""
        seen: dict[tuple, tuple] = {}
        kind = nx.get_node_attributes(self.graph, "kind")
        for u, v, data in self.graph.edges(data=True):
            seen.setdefault((data.get("link"), kind.get(u), kind.get(v)), (u, v))
        return list(seen.values())

    def node(self, name: str, fault: Fault) -> Any:
        nodes = {str(node): node for node in self.graph.nodes}
        if name not in nodes:
            kind = nx.get_node_attributes(self.graph, "kind")
            others = [str(n) for n in self.graph.nodes if kind.get(n) in ("nic", "switch")]
            raise self.error(
                fault,
                f"no node {name!r} in the topology; e.g. {_few(others or list(nodes))}",
            )
        return nodes[name]

    def failed_node(self, match: LinkMatch, *, required: bool = False) -> Any:
        """The node a ``fail=`` names (None when it names a link instead)."""
        name = str(match.value)
        fault: Fault = NicFailure(name)
        if not required and name not in {str(n) for n in self.graph.nodes}:
            return None
        node = self.node(name, fault)
        kind = self.graph.nodes[node].get("kind")
        if kind == "gpu":
            raise self.error(
                fault,
                f"{name!r} is a GPU: a collective cannot run without one of its ranks; fail "
                "its NIC or links instead, or slow it down with gpu=RANK:compute=X",
            )
        return node

    def gpus(self, fault: SlowGpu) -> list:
        wrong = [rank for rank in fault.ranks if rank >= len(self.gpu_list)]
        if wrong:
            raise self.error(
                fault, f"no rank {wrong[0]}; the topology has ranks 0-{len(self.gpu_list) - 1}"
            )
        return [self.gpu_list[rank] for rank in fault.ranks]

    def random_edges(self, fault: RandomFaults) -> list[tuple]:
        if fault.q == 0:
            return []
        candidates = self.edge_list
        if fault.kind is not None:
            candidates = [
                (u, v)
                for u, v in candidates
                if str(self.graph.edges[u, v].get("link", "")) == fault.kind
            ]
            if not candidates:
                raise self.error(
                    fault, f"no link of type {fault.kind!r}; types here: {_few(self.kinds)}"
                )
        draws = np.random.default_rng(fault.seed).random(len(candidates))
        return [edge for edge, draw in zip(candidates, draws, strict=True) if draw < fault.q]


def _written(raw: Any) -> str:
    """A value as the user wrote it: strings bare, anything else as its repr (cut short)."""
    return raw if isinstance(raw, str) and len(raw) <= 80 else shown(raw)


def _few(names: Iterable[Any], count: int = 4) -> str:
    names = sorted(map(str, names))
    more = ", ..." if len(names) > count else ""
    return ", ".join(names[:count]) + more


def _check_reach(out: nx.Graph, graph: nx.Graph, what: str) -> None:
    """Every GPU of ``out`` reaches every other, and a NIC (where ``graph`` had NICs)
    without passing another GPU; else a :class:`FaultError` naming the ranks cut off."""
    gpus = gpu_nodes(graph)
    rank = {node: r for r, node in enumerate(gpus)}
    if out.is_directed():
        components = list(nx.strongly_connected_components(out))
    else:
        components = list(nx.connected_components(out))
    groups = [sorted(rank[n] for n in c if n in rank) for c in components]
    groups = sorted((g for g in groups if g), key=lambda g: (-len(g), g))
    if len(groups) > 1:
        cut = sorted(r for g in groups[1:] for r in g)
        raise FaultError(
            f"{what} cut off {_ranks_named(cut, gpus)} from {_ranks_named(groups[0], gpus)}: "
            "no route remains between them; remove a failure or add links"
        )
    if "nic" not in nx.get_node_attributes(graph, "kind").values():
        return
    # A failed NIC is gone from ``out``: its GPU then reaches none (or none at all).
    lost = sorted(rank[n] for n in gpus_without_nic(out) if n in rank)
    if "nic" not in nx.get_node_attributes(out, "kind").values():
        lost = sorted(rank.values())
    if lost:
        raise FaultError(
            f"{what} cut off {_ranks_named(lost, gpus)} from the network: no NIC is left "
            "that it reaches without passing another GPU (GPUs do not forward traffic); "
            "remove the failure, or fail a link beyond the NIC instead"
        )


def _ranks_named(ranks: Sequence[int], gpus: Sequence[Any]) -> str:
    names = (
        _few([gpus[r] for r in ranks], 4)
        if len(ranks) > 4
        else ", ".join(str(gpus[r]) for r in ranks)
    )
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {_rank_text(list(ranks))} ({names})"


# -- during a run --------------------------------------------------------------------------


def schedule_link_faults(network: Any, faults: Sequence[TimedLinks] | None = None) -> None:
    """Schedule timed link degradations on a :class:`~simulator.network.flows.FlowNetwork`.

    ``faults`` default to those of the network's graph (:func:`fault_plan`). At each t0
    and t1 (seconds from the network's creation) a SimPy timeout calls
    :meth:`~simulator.network.flows.FlowNetwork.scale_links` with, for every link any
    of them covers, the product of the fractions of the faults holding then: flows in
    flight take their new rates at that instant. Links the network's graph lacks (a
    group's own view) are skipped.
    """
    if faults is None:
        plan = fault_plan(network.graph)
        faults = plan.timed_links if plan is not None else ()
    index = network.links.index
    both = not network.graph.is_directed()  # an edge is a link each way
    covered = []
    for fault in faults:
        pairs = [*fault.edges, *((b, a) for a, b in fault.edges if both)]
        ids = np.array([index[pair] for pair in pairs if pair in index], dtype=np.int64)
        covered.append((np.unique(ids), fault))
    links = np.unique(np.concatenate([ids for ids, _ in covered])) if covered else []
    if len(links) == 0:
        return

    def at(now: float) -> None:
        factor = np.ones(len(links))
        for ids, fault in covered:
            if fault.t0 <= now < fault.t1:
                factor[np.searchsorted(links, ids)] *= fault.fraction
        network.scale_links(links, factor)

    times = sorted({f.t0 for f in faults} | {f.t1 for f in faults if math.isfinite(f.t1)})
    for when in times:
        event = network.env.timeout(when)
        event.callbacks.append(lambda _event, when=when: at(when))


def compute_scaler(graph: nx.Graph | None) -> Callable[[int, int, float], float] | None:
    """The factor on compute durations that a faulted graph asks for, as a function of
    (rank, op index, start time in seconds); None when it asks for none (a healthy graph).

    >>> from simulator.topology import ring_graph
    >>> scale = compute_scaler(apply_faults(ring_graph(4, 1e9), "gpu=1:compute=2,t0=1ms"))
    >>> scale(1, 0, 0.0), scale(1, 0, 2e-3), scale(0, 0, 2e-3)
    (1.0, 2.0, 1.0)
    """
    plan = fault_plan(graph)
    if plan is None or not (plan.slow or plan.jitter):
        return None
    slow: dict[int, list[SlowGpu]] = defaultdict(list)
    for fault in plan.slow:
        for rank in fault.ranks:
            slow[rank].append(fault)
    jitter = plan.jitter

    def scale(rank: int, op: int, now: float) -> float:
        factor = 1.0
        for fault in slow.get(rank, ()):
            if fault.t0 <= now < fault.t1:
                factor *= fault.compute_factor
        for item in jitter:
            factor *= item.factor(op)
        return factor

    return scale


# -- marks for timelines and traces --------------------------------------------------------


def link_mark(graph: nx.Graph | None, a: Any, b: Any) -> str:
    """``" [degraded 0.5x]"``: what is wrong with link a-b, for its row's name ("" when
    healthy).

    >>> from simulator.topology import ring_graph
    >>> g = apply_faults(ring_graph(4, 1e9), "link=gpu0-gpu1:0.5,t0=1ms,t1=2ms")
    >>> link_mark(g, "gpu1", "gpu0"), link_mark(g, "gpu1", "gpu2")
    (' [degraded 0.5x from 1 ms to 2 ms]', '')
    """
    if graph is None or not graph.has_edge(a, b):
        return ""
    text = graph.edges[a, b].get("fault")
    return f" [{text}]" if text else ""


def rank_marks(graph: nx.Graph | None) -> list[str]:
    """``" [compute 2x]"`` per rank: what is wrong with each rank's GPU, for its rows'
    names ("" when healthy; an empty list without a graph).

    >>> from simulator.topology import ring_graph
    >>> rank_marks(apply_faults(ring_graph(3, 1e9), "gpu=2:compute=1.5"))
    ['', '', ' [compute 1.5x]']
    """
    if graph is None:
        return []
    texts = (graph.nodes[node].get("fault") for node in gpu_nodes(graph))
    return [f" [{text}]" if text else "" for text in texts]


__all__ = [
    "DISTRIBUTIONS",
    "MATCH_BY",
    "RANDOM_KEYS",
    "Fault",
    "FaultError",
    "FaultPlan",
    "FaultSpec",
    "Jitter",
    "LinkFailure",
    "LinkFault",
    "LinkMatch",
    "NicFailure",
    "RandomFaults",
    "SlowGpu",
    "TimedLinks",
    "apply_faults",
    "compute_scaler",
    "fault_plan",
    "inline",
    "link_mark",
    "load_faults",
    "random_option",
    "rank_marks",
    "schedule_link_faults",
    "with_random_option",
]
