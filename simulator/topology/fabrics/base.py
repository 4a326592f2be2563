"""The interface every fabric implements, their shared parameters, and helpers.

A fabric joins the NICs of N servers. Each variant is a :class:`Fabric` subclass in its
own module with a frozen dataclass of parameters (``Config``); every parameter's
``help`` names its unit and feeds ``topologies/README.md`` and ``--help``.

Latency model: ``latency`` is the time one switch adds to a message. It is split in
half on each link of the switch, so a path through h switches gets exactly h x latency
from them, whichever links it uses. A NIC's own ``latency`` sits on its fabric-facing
link, so a message pays it once per NIC it crosses.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import networkx as nx

from ...errors import TopologyError
from ..spec import Spec
from ..stacks import get_routing


@dataclass(frozen=True)
class FabricConfig:
    """Parameters every fabric has."""

    latency: float = field(
        default=0.5e-6,
        metadata={"unit": "time", "help": "latency one switch adds to a message, e.g. 500ns"},
    )
    port_bandwidth: float | None = field(
        default=None,
        metadata={
            "unit": "bandwidth",
            "help": "bandwidth of one switch port per direction, e.g. 400Gbps "
            "(default: the NICs' bandwidth)",
        },
    )
    link: str = field(
        default="rdma", metadata={"unit": "text", "help": "link type of fabric cables"}
    )
    seed: int = field(
        default=0,
        metadata={"unit": "seed", "help": "seed of the ECMP hash that spreads flows over paths"},
    )
    routing: str | None = field(
        default=None,
        metadata={
            "unit": "routing",
            "help": "how switches pick among equal-cost paths: per_destination (an "
            "InfiniBand subnet manager's tables, one up-port per destination) or ecmp "
            "(a hash per connection, as Ethernet; uses seed) (default: the NICs' "
            "network stack's, per_destination for infiniband)",
        },
    )
    sharp: bool = field(
        default=False,
        metadata={
            "unit": "flag",
            "help": "true: the switches reduce in the network (SHARP), which the collnet "
            "algorithms need (default false)",
        },
    )
    single_server: bool = field(
        default=False,
        metadata={
            "unit": "flag",
            "help": "true: one server gets this fabric too, so traffic inside it can also "
            "leave through its NICs, which multipath needs (default false: one server's "
            "NICs stay unlinked)",
        },
    )


COMMON_KEYS = tuple(f.name for f in fields(FabricConfig))


class Fabric(ABC):
    """A way of joining servers' NICs with switches."""

    #: Registry key, as written in ``fabric.type`` and ``--fabric``.
    name: ClassVar[str] = ""
    #: One line for listings.
    description: ClassVar[str] = ""
    #: The dataclass of this fabric's parameters.
    Config: ClassVar[type[FabricConfig]] = FabricConfig

    @abstractmethod
    def build(self, graph: nx.Graph, nics: list[list[str]], config: FabricConfig) -> None:
        """Add switches and links to ``graph`` joining ``nics[s]``, the NICs of server s."""

    def parse(self, spec: Spec) -> FabricConfig:
        """Read this fabric's parameters from a ``fabric`` section (unknown keys rejected)."""
        values: dict[str, Any] = {}
        for f in fields(self.Config):
            if not spec.has(f.name) or spec.get(f.name) is None:
                continue
            unit = f.metadata.get("unit")
            if unit == "time":
                values[f.name] = spec.time(f.name)
            elif unit == "bandwidth":
                values[f.name] = spec.bandwidth(f.name)
            elif unit == "ratio":
                values[f.name] = spec.ratio(f.name)
            elif unit == "count":
                values[f.name] = spec.count(f.name)
            elif unit == "seed":
                seed = spec.get(f.name)
                if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                    raise TopologyError(
                        f"{spec.field(f.name)} must be a non-negative integer, got {seed!r}"
                    )
                values[f.name] = seed
            elif unit == "routing":
                values[f.name] = get_routing(spec.get(f.name), field=spec.field(f.name))
            elif unit == "flag":
                flag = spec.get(f.name)
                if not isinstance(flag, bool):
                    raise TopologyError(f"{spec.field(f.name)} must be true or false, got {flag!r}")
                values[f.name] = flag
            else:
                values[f.name] = spec.text(f.name)
        spec.done()
        config = self.Config(**values)
        self.check(config, spec)
        return config

    def check(self, config: FabricConfig, spec: Spec) -> None:
        """Reject parameter values this fabric cannot build (extend in variants)."""
        check_positive(config.port_bandwidth, spec.field("port_bandwidth"))


def port_bandwidth(graph: nx.Graph, nics: list[list[str]], config: FabricConfig) -> float:
    """The switch port bandwidth: the configured one, else the fastest NIC's."""
    if config.port_bandwidth is not None:
        return config.port_bandwidth
    return max(float(graph.nodes[nic]["bandwidth"]) for server in nics for nic in server)


def add_switch(graph: nx.Graph, name: str, tier: str) -> str:
    """Add a fabric switch node (``kind='switch'``) of a tier (leaf, spine, ...)."""
    graph.add_node(name, kind="switch", tier=tier)
    return name


def mark_sharp(graph: nx.Graph) -> None:
    """Mark every fabric switch (``kind='switch'``) as reducing in the network (SHARP):
    node attribute ``sharp=True``, which the router's in-network reduction looks for."""
    for _, data in graph.nodes(data=True):
        if data.get("kind") == "switch":
            data["sharp"] = True


def attach_nic(graph: nx.Graph, nic: str, switch: str, config: FabricConfig, port: float) -> None:
    """Cable a NIC to a switch port: the NIC's fabric-facing link.

    Its bandwidth is the slower of the NIC and the port; its latency is the NIC's own
    plus half the switch's (see the module docstring); the NIC's ``message_rate``, if
    any, goes on this link, where the router charges 1/message_rate per message.
    """
    data = graph.nodes[nic]
    attrs = {
        "bandwidth": min(float(data["bandwidth"]), port),
        "latency": float(data.get("latency", 0.0)) + config.latency / 2,
        "link": config.link,
    }
    if data.get("message_rate") is not None:
        attrs["message_rate"] = float(data["message_rate"])
    graph.add_edge(nic, switch, **attrs)


def join_switches(
    graph: nx.Graph, a: str, b: str, bandwidth: float, config: FabricConfig, cables: int = 1
) -> None:
    """Cable two switches; the link carries half of each switch's latency.

    ``cables`` is how many physical cables the one edge stands for (a leaf's uplinks to
    one spine are bundled into one edge of their summed bandwidth); the bill of
    materials (:mod:`~simulator.topology.bom`) counts ports, cables and optics from it.
    """
    graph.add_edge(
        a, b, bandwidth=bandwidth, latency=config.latency, link=config.link, cables=cables
    )


def check_positive(value: float | None, where: str) -> None:
    """Reject a non-positive or non-finite parameter."""
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise TopologyError(f"{where} must be positive, got {value!r}")
