"""NCCL-like protocols and the calibration constants of a machine.

The ideal model (``protocol=None``) moves bytes at line rate with only the links'
propagation latency: that is what closed forms describe. Real libraries add, per step
of an algorithm, a protocol-dependent synchronisation latency, and reach only part of
the line rate. With a protocol chosen, ccsim models (as NCCL's own cost model does,
src/graph/tuning.cc, figures in shared/reference/README.md):

* a per-call overhead: kernel launch (``launch``) plus the protocol's base latency;
* per transfer, a per-hop latency by the class of path it crosses (``nvlink`` for
  NVLink/HCCS/SDMA inside a server, ``pcie`` for PCIe and CPU links, ``network`` for
  NICs and switches), replacing the links' propagation latency when larger;
* a bandwidth factor: LL sends 8-byte lines carrying 4 bytes of data and a flag, and
  its threads poll flags line by line: NCCL models a ring's LL bandwidth at 1/4 of the
  bus bandwidth (1/3 for all-gather and broadcast on one node; ccsim uses 1/4); LL128
  uses 120 of every 128 bytes (NCCL: 0.92), Simple sends data only;
* which protocols the library enables: NCCL turns LL128 on only where GPUs talk over
  NVLink (Volta, Ampere, Hopper), so a PCIe-only box runs LL and Simple;
* link efficiency per link type: the fraction of line rate a link sustains (NCCL models
  an NVLink3 link at 20 GB/s of 25).

Presets carry these constants in an ``nccl`` section; absent values fall back to the
defaults below (NCCL 2.30's tuning constants and link figures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CcsimError, TopologyError
from ..network.routing import PATH_CLASSES
from ..units import parse_time

PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class Protocol:
    """One protocol: base latency per call, per-hop latency by path class (seconds),
    the fraction of link bandwidth that carries data, and whether the library uses it
    on this machine."""

    name: str
    base_s: float
    hop_s: dict[str, float]
    bandwidth: float
    enabled: bool = True
    #: Host time the network proxy spends on one network message (posting it, polling
    #: its completion), and the data bytes one message carries: a transfer that crosses
    #: the network is ceil(bytes / message_bytes) messages through its GPUs' proxies.
    proxy_s: float = 0.0
    message_bytes: float = float("inf")
    #: Whether, once a call spans servers, a step inside one costs at least NCCL's
    #: network post overhead (1 us, x3 for Simple): NCCL's ring latency model says so
    #: (tuning.cc:405-407 at v2.30.7); its Tree, NVLS and NVLSTree branches of the same
    #: function (tuning.cc:384-435) do not. ccsim's own algorithms keep the ring's rule.
    net_floor: bool = True
    #: Data bytes/s one channel's transfer moves over a hop at most: what one thread
    #: block of the protocol reaches (``inf``: only the links limit it).
    channel_rate: float = float("inf")


#: Data bytes NCCL moves per pipeline step and channel, which is also what one network
#: message carries (enqueue.cc:2182-2321 at v2.30.7, buffers from init.cc:810-816): LL
#: 32 KiB (half of a 64 KiB step is flags), LL128 576,000 B (120 of 128 bytes of a
#: 614,400 B step), Simple ring slices of 1 MiB (2 of the 4 steps of 512 KiB in a 2 MiB
#: chunk). NCCL's policy refines it per algorithm (simulator.collective.policy).
STEP_BYTES = {"LL": 32 * 1024, "LL128": 576_000, "Simple": 1 << 20}

# NCCL 2.30 tuning.cc (shared/reference/README.md): base latency LL/LL128/Simple
# 6.6/14.0/8.4 us (ring); per-hop NVLink 0.6/1.9/3.4, PCIe 1.0/2.5/5.7, network
# 2.7/4.0/14 us; bandwidth factor LL 1/4 for a ring all-reduce (tuning.cc up to NCCL
# 2.18: busBw * 1.0/4.0; half of it is the 4-byte flag in every 8-byte line; 2.30's
# model says 0.5, the line's data share, but 1/4 predicts the bundled H100 runs' small-
# message times better: 11.0% and 19.5% median error against 12.5% and 22.2%), LL128
# 0.92 (120/128 = 0.9375 of the lines carry data), Simple 1.0. simulator.library.nccl
# holds 2.30's own model for NCCL's choice; these are the costs ccsim simulates.
DEFAULT_PROTOCOLS = {
    "LL": Protocol(
        "LL",
        6.6e-6,
        {"nvlink": 0.6e-6, "pcie": 1.0e-6, "network": 2.7e-6},
        0.25,
        message_bytes=STEP_BYTES["LL"],
    ),
    "LL128": Protocol(
        "LL128",
        14.0e-6,
        {"nvlink": 1.9e-6, "pcie": 2.5e-6, "network": 4.0e-6},
        0.92,
        message_bytes=STEP_BYTES["LL128"],
    ),
    "Simple": Protocol(
        "Simple",
        8.4e-6,
        {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 14e-6},
        1.0,
        message_bytes=STEP_BYTES["Simple"],
    ),
}

#: Host time of a GPU's network proxy per network message. NCCL gives no figure: one
#: proxy thread per GPU posts every send and receive and polls their completions
#: (transport/net.cc sendProxyProgress / recvProxyProgress; NCCL issues #374, #1459
#: show it bounding small-message rates). FITTED: of PROXY_GRID_S, the value with the
#: least summed squared log time error over the PROXY_FITTED_TO runs (every bundled
#: run that crosses the network); ``ccsim validate --loco`` chooses it again without
#: each of them in turn (README, "How accurate is it?").
PROXY_S = 1.0e-6
PROXY_GRID_S = (0.0, 0.5e-6, 1.0e-6, 1.5e-6)
PROXY_FITTED_TO = (
    "A100-2N-AR-default-roce",
    "H100-2N-AR-default-XE9680",
    "H100-2N-AR-default-clusterB",
    "H100-2N-AR-ring-tuned",
    "H100-4N-AR-default-clusterB",
    "H100-4N-AR-default-vm",
    "H100-8N-AR-MINCTAS24-QPS2-clusterB",
    "H100-8N-AR-default-clusterB",
)


@dataclass(frozen=True)
class Calibration:
    """A machine's constants: launch overhead, link efficiencies, protocols."""

    launch_s: float = 0.0
    efficiency: dict[str, float] = field(default_factory=dict)
    protocols: dict[str, Protocol] = field(default_factory=lambda: dict(DEFAULT_PROTOCOLS))
    #: The measured runs (``ccsim validate`` case names) these constants were fitted
    #: to, and the constants before that fit (NCCL's own and physical figures): what
    #: a leave-one-case-out check predicts those runs with.
    fitted_to: tuple[str, ...] = ()
    unfitted: Calibration | None = None
    #: Host time of the network proxy per network message (see :class:`Protocol`).
    proxy_s: float = PROXY_S

    def protocol(self, name: str) -> Protocol:
        """The protocol called ``name`` (case-insensitive), with the machine's proxy cost."""
        for key, proto in self.protocols.items():
            if key.lower() == str(name).lower():
                return dataclasses.replace(proto, proxy_s=self.proxy_s)
        raise CcsimError(f"unknown protocol {name!r}; valid choices: {', '.join(PROTOCOLS)}, auto")

    def enabled(self) -> list[str]:
        """Protocols the library picks from on this machine (``--proto auto``); a
        disabled one still runs when forced, as NCCL_PROTO can force it."""
        return [name for name in PROTOCOLS if self.protocols[name].enabled]


def parse_calibration(data: Any, *, source: str) -> Calibration:
    """Read a preset's ``nccl`` section (see topologies/README.md)."""
    if not isinstance(data, Mapping):
        raise TopologyError(f"{source}: 'nccl' must be a mapping")
    keys = {"launch", "efficiency", "protocols", "fitted_to", "unfitted", "proxy"}
    unknown = sorted(set(data) - keys)
    if unknown:
        raise TopologyError(
            f"{source}: unknown key 'nccl.{unknown[0]}'; valid keys: " + ", ".join(sorted(keys))
        )
    fitted_to = data.get("fitted_to", [])
    if not isinstance(fitted_to, list) or not all(isinstance(n, str) for n in fitted_to):
        raise TopologyError(f"{source}: nccl.fitted_to must be a list of case names")
    unfitted = None
    if "unfitted" in data:
        if not fitted_to:
            raise TopologyError(
                f"{source}: nccl.unfitted goes with nccl.fitted_to (the cases fitted to)"
            )
        unfitted = parse_calibration(data["unfitted"], source=f"{source}: nccl.unfitted")
    launch = _time(data.get("launch", 0), f"{source}: nccl.launch")
    efficiency = {}
    for kind, value in dict(data.get("efficiency", {})).items():
        if not isinstance(value, int | float) or not 0 < value <= 1:
            raise TopologyError(
                f"{source}: nccl.efficiency.{kind} must be in (0, 1], got {value!r}"
            )
        efficiency[str(kind)] = float(value)
    protocols = dict(DEFAULT_PROTOCOLS)
    for name, spec in dict(data.get("protocols", {})).items():
        if name not in PROTOCOLS:
            raise TopologyError(
                f"{source}: nccl.protocols.{name}: unknown protocol; valid: " + ", ".join(PROTOCOLS)
            )
        base = DEFAULT_PROTOCOLS[name]
        spec = dict(spec)
        unknown = sorted(set(spec) - {"base", "hop", "bandwidth", "enabled"})
        if unknown:
            raise TopologyError(
                f"{source}: unknown key 'nccl.protocols.{name}.{unknown[0]}'; "
                "valid keys: bandwidth, base, enabled, hop"
            )
        enabled = spec.get("enabled", True)
        if not isinstance(enabled, bool):
            raise TopologyError(
                f"{source}: nccl.protocols.{name}.enabled must be true or false, got {enabled!r}"
            )
        hop = dict(base.hop_s)
        for cls, value in dict(spec.get("hop", {})).items():
            if cls not in PATH_CLASSES:
                raise TopologyError(
                    f"{source}: nccl.protocols.{name}.hop.{cls}: path classes are "
                    + ", ".join(PATH_CLASSES)
                )
            hop[cls] = _time(value, f"{source}: nccl.protocols.{name}.hop.{cls}")
        bandwidth = float(spec.get("bandwidth", base.bandwidth))
        if not 0 < bandwidth <= 1:
            raise TopologyError(f"{source}: nccl.protocols.{name}.bandwidth must be in (0, 1]")
        protocols[name] = dataclasses.replace(
            base,
            base_s=_time(spec.get("base", base.base_s), f"{source}: nccl.protocols.{name}.base"),
            hop_s=hop,
            bandwidth=bandwidth,
            enabled=enabled,
        )
    if not any(proto.enabled for proto in protocols.values()):
        raise TopologyError(f"{source}: nccl.protocols disables every protocol; keep one")
    proxy = _time(data.get("proxy", PROXY_S), f"{source}: nccl.proxy")
    return Calibration(launch, efficiency, protocols, tuple(fitted_to), unfitted, proxy)


def _time(value: Any, field_name: str) -> float:
    try:
        result = parse_time(value, field=field_name)
    except CcsimError as error:
        raise TopologyError(str(error)) from None
    if result < 0:
        raise TopologyError(f"{field_name} must be >= 0")
    return result


def calibration_of(graph) -> Calibration:
    """The calibration attached to a topology graph (defaults when it has none).

    A preset loaded by :func:`simulator.topology.load_topology` carries its ``nccl``
    section as read from the file (the topology layer does not know what the library
    makes of it); it is parsed here, its errors naming the preset file.
    """
    value = graph.graph.get("nccl")
    if isinstance(value, Calibration):
        return value
    if value is None:
        return Calibration()
    return parse_calibration(value, source=str(graph.graph.get("nccl_source", "topology")))
