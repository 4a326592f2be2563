"""A topology's bill of materials: servers, NICs, switches, cables, optics, power, cost.

:func:`bill_of_materials` counts what it takes to build a topology graph, from the graph
alone, so that it holds for every fabric ccsim builds and for users' graphs:

* **servers, GPUs, NICs** (by line rate) and the devices inside servers (NVSwitch and
  PCIe switch nodes, counted apart from the fabric);
* **fabric switches by tier** (``tier`` of each ``kind: switch`` node: leaf, spine,
  edge, aggregation, core, switch), each with the ports it uses (one per cable) and the
  radix of the switch that :data:`SWITCHES` picks for its port speed;
* **links by kind and length class**. Kinds: inside a server by link type (``nvlink
  in server``, ``pcie in server``), server-to-``tier`` (a NIC's cable to its switch)
  and ``tier``-to-``tier`` (between switches). A fabric edge may stand for several
  cables (a leaf's uplinks to one spine are one edge of their summed bandwidth; the
  edge's ``cables`` says how many). Length classes:

  - ``in-server``: links inside a server (board traces, NVLink cartridges): no cable;
  - ``copper``: a NIC's cable to a switch *in its rack*, a passive copper cable (DAC):
    the switch is in the rack when every NIC on it belongs to servers of one rack;
  - ``optical``: every other cable: NIC to a switch outside its rack (a rail leaf, a
    single switch for many racks) and every switch-to-switch cable (switches sit in
    their own network racks), each with two transceivers, one at each end.

  Servers fill racks in order, ``servers_per_rack`` to a rack; by default as many as
  hold 32 GPUs, as the DGX SuperPOD racks four 8-GPU DGX H100 (RA-11333-001: 127 DGX in
  32 compute racks), and one server a rack for servers of 32 GPUs or more (an NVL72 is
  a rack);
* **power** of the network: switches, NICs and transceivers at the typical watts of
  the parts :data:`SWITCHES`, :data:`NICS` and :data:`TRANSCEIVERS` cite (a part
  without a cited figure is left out of the total, and the rows say so); ``watts``
  overrides or adds figures per item;
* **cost**, when unit ``prices`` are given (none are bundled): price x count per item
  and the total, the items without a price listed.

Items are named for prices and watts as ``server``, ``nic-400G``, ``switch-400G``,
``transceiver-400G``, ``copper-cable-400G`` and ``optical-cable-400G`` (any speed).

What it does not model: twin-port optics (one 2x400G module serving two cables at a
switch counts as two transceivers here), breakout cables, management and storage
networks, and splitting a switch that needs more ports than its radix (ccsim's rail
leaf of 128 servers is one switch of 256 ports; the rows flag it as over the radix).

Examples
--------
>>> from simulator.topology import load_topology
>>> bom = bill_of_materials(load_topology("dgx-h100", 8, fabric="leaf-spine"),
...                         prices={"switch-400G": 25000})
>>> bom.switches_by_tier
{'leaf': 2, 'spine': 32}
>>> bom.cables_by_kind["leaf-to-spine"], bom.transceivers
(64, 128)
>>> bom.cost
850000.0
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import CcsimError, shown
from ..files import load_data
from .graph import gpu_nodes

# -- cited parts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """A part the bill of materials picks for a port speed."""

    #: Model name shown in the rows.
    model: str
    #: Port speed it serves (bits/s per direction).
    speed_bps: float
    #: Typical watts, or None when no cited figure was found.
    watts: float | None
    #: Ports (switches only).
    radix: int | None = None


#: The switch taken for a port speed: the first whose ``speed_bps`` is at least the port's.
SWITCHES = (
    # NVIDIA Quantum-2 QM9700 in split mode: its 32 OSFP cages carry 64 logical NDR ports
    # (QM97xx user manual, Interfaces: "each OSFP port consists of 2 logical InfiniBand
    # ports") that split to 128 ports of NDR200 200 Gb/s. 747 W typical with passive
    # cables (QM97x0 hardware user manual, Specifications; 1,720 W maximum with active
    # cables).
    Part("Quantum-2 QM9700 (split)", 200e9, 747.0, 128),
    # NVIDIA Quantum-2 QM9700: 64 ports of NDR 400 Gb/s, 51.2 Tb/s, 1U; 747 W typical with
    # passive cables (QM97x0 hardware user manual, Specifications).
    Part("Quantum-2 QM9700", 400e9, 747.0, 64),
    # NVIDIA Spectrum-4 SN5600: 64 ports of 800GbE (SN5000 user manual, Data Interfaces:
    # 64 x 800GbE, 128 x 400GbE, 256 x 200GbE); 940 W typical with passive cables
    # (SN5000 hardware user manual, Specifications).
    Part("Spectrum-4 SN5600", 800e9, 940.0, 64),
)

#: The NIC taken for a NIC line rate.
NICS = (
    # NVIDIA ConnectX-7: one port of NDR/400GbE or two of NDR200/200GbE, PCIe Gen5 x16
    # (ConnectX-7 user manual, Introduction). Its typical power is in the manual's
    # Specifications chapter, which we could not read: no figure is assumed (give one
    # with ``watts={"nic-400G": W}``).
    Part("ConnectX-7", 400e9, None),
    # NVIDIA ConnectX-8 SuperNIC, 800 Gb/s (as the gb200-nvl72 preset cites for GB300);
    # no cited power figure.
    Part("ConnectX-8", 800e9, None),
)

#: The transceiver at each end of an optical cable of a port speed.
TRANSCEIVERS = (
    # NVIDIA MMS4X00-NS400 400G OSFP DR4 in 200 Gb/s mode (2 channels): 5 W maximum
    # (its product specifications, Overview).
    Part("OSFP 200G (MMS4X00-NS400, 2 lanes)", 200e9, 5.0),
    # NVIDIA MMS4X00-NS400 400 Gb/s single-port OSFP single-mode DR4, 100 m: 9 W typical
    # (its product specifications, Overview).
    Part("OSFP 400G DR4 (MMS4X00-NS400)", 400e9, 9.0),
    # 800G twin-port OSFP: no typical figure found; the Quantum-2 OSFP cage takes Class 8
    # modules of up to 17 W (QM97xx user manual, Interfaces), used here as the bound.
    Part("OSFP 800G twin-port (Class 8 cage limit)", 800e9, 17.0),
)

#: GPUs a rack holds by default: four 8-GPU DGX H100 per rack in the DGX SuperPOD
#: (RA-11333-001, Appendix A: 127 DGX in 32 compute racks).
GPUS_PER_RACK = 32

#: Line rates items are named by (``400G``), bits/s.
_SPEEDS = (25e9, 50e9, 100e9, 200e9, 400e9, 800e9, 1600e9)
#: Item kinds a prices or watts file may name, before the ``-SPEED`` suffix.
ITEM_KINDS = ("nic", "switch", "transceiver", "copper-cable", "optical-cable")
_ITEM = re.compile(r"^(" + "|".join(ITEM_KINDS) + r")-(\d+(?:\.\d+)?)([GT])$")


def speed_label(bps: float) -> str:
    """The line-rate class of a bandwidth in bits/s: the smallest standard rate at or above
    it (a share of a port rounds up to the port), ``400G``, ``1.6T``.

    >>> speed_label(400e9), speed_label(388e9), speed_label(1.6e12)
    ('400G', '400G', '1.6T')
    """
    rate = next((s for s in _SPEEDS if s >= bps * (1 - 1e-9)), bps)
    return f"{rate / 1e12:g}T" if rate >= 1e12 else f"{rate / 1e9:g}G"


def _label_bps(label: str) -> float:
    return float(label[:-1]) * (1e12 if label.endswith("T") else 1e9)


def _part(parts: tuple[Part, ...], label: str) -> Part | None:
    bps = _label_bps(label)
    return next((p for p in parts if p.speed_bps >= bps * (1 - 1e-9)), None)


# -- the result ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SwitchGroup:
    """Fabric switches of one tier and port speed."""

    tier: str
    speed: str
    count: int
    model: str | None
    radix: int | None
    #: Fewest and most ports any one of them uses.
    ports_min: int
    ports_max: int
    #: Ports they use together (one per cable end).
    ports_used: int
    #: How many use more ports than the radix (ccsim's logical switch; see the module).
    over_radix: int


@dataclass(frozen=True)
class LinkGroup:
    """Links of one kind, length class, link type and speed."""

    kind: str
    length: str
    link: str
    speed: str
    count: int


@dataclass(frozen=True)
class BillOfMaterials:
    """What building a topology takes (see the module docstring); ``rows()`` for tables.

    Counts are physical: ``links`` count cables (an edge standing for several counts
    each), ``transceivers`` two per optical cable. Power in watts; ``cost`` the sum of
    the priced items (None without prices), ``unpriced`` the items present without one.
    """

    name: str
    fabric: str | None
    servers: int
    gpus: int
    gpus_per_server: int
    servers_per_rack: int
    gpu_model: str | None
    nics: dict[str, int]
    devices: dict[str, int]
    switches: tuple[SwitchGroup, ...]
    links: tuple[LinkGroup, ...]
    transceivers_by_speed: dict[str, int]
    watts: dict[str, float | None] = field(repr=False)
    prices: dict[str, float] = field(default_factory=dict, repr=False)

    # -- totals ---------------------------------------------------------------------------

    @property
    def switches_by_tier(self) -> dict[str, int]:
        """Fabric switches per tier."""
        counts: Counter[str] = Counter()
        for group in self.switches:
            counts[group.tier] += group.count
        return dict(counts)

    @property
    def cables_by_kind(self) -> dict[str, int]:
        """Cables (and in-server links) per kind: ``server-to-leaf``, ``leaf-to-spine``..."""
        counts: Counter[str] = Counter()
        for group in self.links:
            counts[group.kind] += group.count
        return dict(counts)

    @property
    def cables_by_length(self) -> dict[str, int]:
        """Links per length class: ``in-server``, ``copper``, ``optical``."""
        counts: Counter[str] = Counter()
        for group in self.links:
            counts[group.length] += group.count
        return dict(counts)

    @property
    def transceivers(self) -> int:
        """Optical transceivers: two per optical cable."""
        return sum(self.transceivers_by_speed.values())

    def items(self) -> dict[str, int]:
        """Count of each priced-by-name item (``switch-400G``: 32, ...)."""
        counts: Counter[str] = Counter({"server": self.servers})
        for speed, count in self.nics.items():
            counts[f"nic-{speed}"] += count
        for group in self.switches:
            counts[f"switch-{group.speed}"] += group.count
        for group in self.links:
            if group.length != "in-server":
                counts[f"{group.length}-cable-{group.speed}"] += group.count
        for speed, count in self.transceivers_by_speed.items():
            counts[f"transceiver-{speed}"] += count
        return dict(counts)

    def power_w(self) -> dict[str, float]:
        """Watts of the network by part kind (switch, nic, transceiver), counting only
        the items with a figure (see :attr:`unpowered`)."""
        total: Counter[str] = Counter()
        for item, count in self.items().items():
            watts = self.watts.get(item)
            if watts is not None:
                total[item.split("-")[0]] += watts * count
        return {kind: float(total[kind]) for kind in ("switch", "nic", "transceiver")}

    @property
    def power_kw(self) -> float:
        """Network power, kW (switches, NICs and transceivers with a figure)."""
        return sum(self.power_w().values()) / 1e3

    @property
    def unpowered(self) -> list[str]:
        """Items present whose power is unknown (left out of :attr:`power_kw`)."""
        return sorted(
            item
            for item in self.items()
            if item.split("-")[0] in ("switch", "nic", "transceiver")
            and self.watts.get(item) is None
        )

    @property
    def cost(self) -> float | None:
        """Sum of price x count over the priced items; None when no prices were given."""
        if not self.prices:
            return None
        return float(
            sum(self.prices[item] * n for item, n in self.items().items() if item in self.prices)
        )

    @property
    def unpriced(self) -> list[str]:
        """Items present without a price (empty when every item has one)."""
        return sorted(item for item in self.items() if item not in self.prices)

    # -- rows -----------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per line of the bill: ``section``, ``item`` (the price key, or
        empty), ``description``, ``count``, ``watts_each``, ``power_kw``, ``price_each``,
        ``cost`` (None where unknown or not applicable)."""
        rows: list[dict[str, Any]] = []

        def add(section: str, item: str, description: str, count: int) -> None:
            watts = self.watts.get(item) if item else None
            price = self.prices.get(item) if item else None
            rows.append(
                {
                    "section": section,
                    "item": item,
                    "description": description,
                    "count": count,
                    "watts_each": watts,
                    "power_kw": None if watts is None else watts * count / 1e3,
                    "price_each": price,
                    "cost": None if price is None else price * count,
                }
            )

        add("servers", "server", f"servers, {self.gpus_per_server} GPUs each", self.servers)
        add("servers", "", f"GPUs ({self.gpu_model or 'model not given'})", self.gpus)
        for kind, count in self.devices.items():
            add("servers", "", f"{kind} inside servers (nodes as modelled)", count)
        for speed, count in self.nics.items():
            part = _part(NICS, speed)
            add("nics", f"nic-{speed}", f"{speed} NICs ({part.model if part else 'NIC'})", count)
        for g in self.switches:
            model = f"{g.model}, {g.radix} ports" if g.model else "no switch cited"
            used = str(g.ports_min)
            if g.ports_max != g.ports_min:
                used += f"-{g.ports_max}"
            text = f"{g.tier} switches ({model}); ports used {used}"
            if g.over_radix:
                text += f"; {g.over_radix} over the radix"
            add("switches", f"switch-{g.speed}", text, g.count)
        for g in self.links:
            if g.length == "in-server":
                add("links", "", f"{g.link} links inside servers, {g.speed} each", g.count)
            else:
                where = "copper DAC, in rack" if g.length == "copper" else "optical"
                add("links", f"{g.length}-cable-{g.speed}", f"{g.kind} ({where})", g.count)
        for speed, count in self.transceivers_by_speed.items():
            part = _part(TRANSCEIVERS, speed)
            name = part.model if part else f"{speed} transceivers"
            add("optics", f"transceiver-{speed}", f"{name}, 2 per optical cable", count)
        return rows

    def totals(self) -> dict[str, Any]:
        """The summary figures: switches by tier, cables by kind and length, transceivers,
        power (kW, and what it leaves out), cost (and what has no price)."""
        return {
            "servers": self.servers,
            "gpus": self.gpus,
            "nics": sum(self.nics.values()),
            "switches": sum(self.switches_by_tier.values()),
            "switches_by_tier": self.switches_by_tier,
            "cables_by_kind": self.cables_by_kind,
            "cables_by_length": self.cables_by_length,
            "transceivers": self.transceivers,
            "power_kw": self.power_kw,
            "power_kw_by_part": {k: v / 1e3 for k, v in self.power_w().items()},
            "power_unknown": self.unpowered,
            "cost": self.cost,
            "unpriced": self.unpriced if self.prices else [],
        }


# -- counting ------------------------------------------------------------------------------


def _tier(data: Mapping) -> str:
    return str(data.get("tier") or "switch")


#: Order of tiers in link kinds (``leaf-to-spine``, never ``spine-to-leaf``).
_TIER_ORDER = ("switch", "leaf", "edge", "aggregation", "spine", "core")


def _rank(tier: str) -> tuple[int, str]:
    return (_TIER_ORDER.index(tier) if tier in _TIER_ORDER else len(_TIER_ORDER), tier)


def bill_of_materials(
    graph: nx.Graph,
    *,
    name: str | None = None,
    servers_per_rack: int | None = None,
    prices: Mapping[str, float] | None = None,
    watts: Mapping[str, float] | None = None,
) -> BillOfMaterials:
    """Count what it takes to build ``graph`` (see the module docstring for the rules).

    Parameters
    ----------
    graph : networkx.Graph
        A validated topology (:func:`~simulator.topology.load_topology`).
    name : str, optional
        Name in the rows (default: the graph's).
    servers_per_rack : int, optional
        Servers a rack holds, which decides copper or optical for NIC cables (default:
        32 GPUs' worth, at least one server).
    prices : mapping of item to price, optional
        Unit prices (``{"switch-400G": 25000, ...}``, see :func:`check_items`); items
        without a price are listed in ``unpriced``.
    watts : mapping of item to watts, optional
        Typical watts per unit that override or fill in the cited ones.

    Examples
    --------
    >>> from simulator.topology import load_topology
    >>> bom = bill_of_materials(load_topology("dgx-h100", 4, fabric="fat-tree"))
    >>> bom.switches_by_tier  # 32 NICs: k = 6, 6 pods x (3 edge + 3 aggregation), 9 cores
    {'edge': 18, 'aggregation': 18, 'core': 9}
    """
    prices = check_items(prices or {}, what="price")
    watts_given = check_items(watts or {}, what="watts")
    kinds = nx.get_node_attributes(graph, "kind")
    gpus = gpu_nodes(graph)
    servers = sorted({graph.nodes[g].get("server") for g in gpus}, key=str)
    per_server = max(1, len(gpus) // max(1, len(servers)))
    if servers_per_rack is None:
        servers_per_rack = max(1, GPUS_PER_RACK // per_server)
    elif isinstance(servers_per_rack, bool) or servers_per_rack < 1:
        raise CcsimError(f"servers per rack must be a positive integer, got {servers_per_rack!r}")
    models = sorted({str(graph.nodes[g].get("model")) for g in gpus if graph.nodes[g].get("model")})
    devices = Counter(k for k in kinds.values() if k in ("nvswitch", "pcie_switch"))

    switches = [n for n, k in kinds.items() if k == "switch"]
    nics: Counter[str] = Counter()
    for node, kind in kinds.items():
        if kind == "nic":
            bandwidth = graph.nodes[node].get("bandwidth")
            if bandwidth is None:  # a user's graph: the NIC's fabric links say its rate
                bandwidth = max(
                    (float(d["bandwidth"]) for _, _, d in graph.edges(node, data=True)),
                    default=0.0,
                )
            nics[speed_label(float(bandwidth) * 8)] += 1

    # Which switches sit in one rack: every NIC on them is of servers of one rack.
    racks: dict[Any, set] = {s: set() for s in switches}
    for u, v in graph.edges():
        for a, b in ((u, v), (v, u)):
            if kinds.get(a) == "switch" and kinds.get(b) == "nic":
                server = graph.nodes[b].get("server")
                racks[a].add(None if server is None else int(server) // servers_per_rack)

    links: Counter[tuple[str, str, str, str]] = Counter()
    ports: Counter = Counter()
    port_speed: dict[Any, str] = {}
    for u, v, data in graph.edges(data=True):
        cables = int(data.get("cables", 1))
        speed = speed_label(float(data["bandwidth"]) * 8 / cables)
        link = str(data.get("link", "link"))
        ku, kv = kinds.get(u), kinds.get(v)
        if ku == "switch" or kv == "switch":
            for end in (u, v):
                if kinds.get(end) == "switch":
                    ports[end] += cables
                    known = port_speed.get(end)
                    if known is None or _label_bps(speed) > _label_bps(known):
                        port_speed[end] = speed
        if ku == "switch" and kv == "switch":
            a, b = sorted((_tier(graph.nodes[u]), _tier(graph.nodes[v])), key=_rank)
            links[(f"{a}-to-{b}", "optical", link, speed)] += cables
        elif ku == "switch" or kv == "switch":
            switch = u if ku == "switch" else v
            other = v if switch == u else u
            who = "server" if kinds.get(other) == "nic" else str(kinds.get(other))
            in_rack = len(racks[switch]) == 1 and None not in racks[switch]
            length = "copper" if in_rack else "optical"
            links[(f"{who}-to-{_tier(graph.nodes[switch])}", length, link, speed)] += cables
        else:  # inside a server: no cable to buy; its own bandwidth, not a port's class
            links[
                (f"{link} in server", "in-server", link, f"{data['bandwidth'] / 1e9:g} GB/s")
            ] += cables

    groups: dict[tuple[str, str], list] = {}
    for switch in switches:
        key = (_tier(graph.nodes[switch]), port_speed.get(switch, "?"))
        groups.setdefault(key, []).append(ports[switch])
    switch_groups = []
    for (tier, speed), used in sorted(groups.items(), key=lambda kv: (_rank(kv[0][0]), kv[0][1])):
        part = None if speed == "?" else _part(SWITCHES, speed)
        radix = part.radix if part else None
        switch_groups.append(
            SwitchGroup(
                tier=tier,
                speed=speed,
                count=len(used),
                model=part.model if part else None,
                radix=radix,
                ports_min=min(used),
                ports_max=max(used),
                ports_used=sum(used),
                over_radix=sum(1 for n in used if radix is not None and n > radix),
            )
        )

    link_groups = tuple(
        LinkGroup(kind, length, link, speed, count)
        for (kind, length, link, speed), count in sorted(
            links.items(), key=lambda kv: (kv[0][1] != "in-server", kv[0])
        )
    )
    transceivers: Counter[str] = Counter()
    for group in link_groups:
        if group.length == "optical":
            transceivers[group.speed] += 2 * group.count  # one at each end

    watts_table: dict[str, float | None] = {}
    for speed in nics:
        watts_table[f"nic-{speed}"] = getattr(_part(NICS, speed), "watts", None)
    for group in switch_groups:
        watts_table[f"switch-{group.speed}"] = getattr(_part(SWITCHES, group.speed), "watts", None)
    for speed in transceivers:
        part = _part(TRANSCEIVERS, speed)
        watts_table[f"transceiver-{speed}"] = part.watts if part else None
    for group in link_groups:
        if group.length == "copper":
            # Passive copper draws next to nothing: 0.1 W maximum (NVIDIA MCP1650-V
            # 200GbE QSFP56 DAC product specifications, power consumption).
            watts_table[f"copper-cable-{group.speed}"] = 0.0
    watts_table.update(watts_given)

    return BillOfMaterials(
        name=name or str(graph.graph.get("name", "graph")),
        fabric=graph.graph.get("fabric"),
        servers=len(servers),
        gpus=len(gpus),
        gpus_per_server=per_server,
        servers_per_rack=servers_per_rack,
        gpu_model=", ".join(models) or None,
        nics=dict(sorted(nics.items(), key=lambda kv: _label_bps(kv[0]))),
        devices=dict(sorted(devices.items())),
        switches=tuple(switch_groups),
        links=link_groups,
        transceivers_by_speed=dict(sorted(transceivers.items(), key=lambda kv: _label_bps(kv[0]))),
        watts=watts_table,
        prices=dict(prices),
    )


# -- prices and watts ----------------------------------------------------------------------


def check_items(
    values: Mapping[str, Any], *, what: str = "price", source: str = "prices"
) -> dict[str, float]:
    """``values`` checked: every key an item name (``server``, ``switch-400G``, ...) and
    every value a finite number >= 0; raises :class:`~simulator.errors.CcsimError`
    naming ``source`` and the item.

    >>> check_items({"switch-400G": 25000, "server": 3e5})
    {'switch-400G': 25000.0, 'server': 300000.0}
    >>> check_items({"swich-400G": 1}, source="p.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: p.yaml: unknown item 'swich-400G'; items are server, nic-SPEED, ...
    """
    if not isinstance(values, Mapping):
        raise CcsimError(
            f"{source}: expected a mapping of item to {what}, e.g. 'switch-400G: 25000', "
            f"got {type(values).__name__}"
        )
    checked: dict[str, float] = {}
    for item, value in values.items():
        if not isinstance(item, str) or not (item == "server" or _ITEM.match(item)):
            raise CcsimError(
                f"{source}: unknown item {shown(item)}; items are server, "
                + ", ".join(f"{kind}-SPEED" for kind in ITEM_KINDS)
                + " with SPEED such as 400G or 1.6T"
            )
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if isinstance(value, str):  # YAML 1.1 reads 3.0e5 (no sign after e) as a string
            try:
                number = float(value)
            except ValueError:
                number = None
        if number is None or not math.isfinite(number):
            raise CcsimError(f"{source}: {item} has {what} {shown(value)}; write a number")
        if number < 0:
            raise CcsimError(f"{source}: {item} has a negative {what} {number:g}; write 0 or more")
        checked[item] = float(number)
    return checked


def load_items(path: str | Path, *, what: str = "price") -> dict[str, float]:
    """Read a YAML or JSON file mapping items to a price (or watts), checked by
    :func:`check_items`; a missing or malformed file is a one-line
    :class:`~simulator.errors.CcsimError` naming it."""
    data = load_data(path, what=f"{what} file")
    return check_items(data if data is not None else {}, what=what, source=str(path))


__all__ = [
    "GPUS_PER_RACK",
    "ITEM_KINDS",
    "NICS",
    "SWITCHES",
    "TRANSCEIVERS",
    "BillOfMaterials",
    "LinkGroup",
    "Part",
    "SwitchGroup",
    "bill_of_materials",
    "check_items",
    "load_items",
    "speed_label",
]
