"""Network stacks: what carries NCCL's traffic between servers, as preset data.

A preset's NICs name their stack (``server.nic.stack``; default ``infiniband``). The
stack is a property of the machine, like its NIC speed: it brings

* ``latency``: the one-way time a message spends in the stack at each NIC it crosses
  beyond the wire (the NIC node's ``latency`` where the preset gives none), and
* ``nccl``: the NCCL environment the vendor's documented setup exports on such machines
  (Google's TCPXO profile turns LL off, for example), which NCCL's choice then honours
  under whatever the user sets (``--nccl`` wins variable by variable), and
* ``routing``: how the fabric's switches spread connections over equal-cost paths
  (:data:`ROUTINGS`): InfiniBand's subnet manager programs each switch's forwarding
  table per destination (``per_destination``); Ethernet switches hash each packet's
  5-tuple (``ecmp``). A topology's ``fabric.routing`` overrides it.

InfiniBand, RoCE and eRDMA are RDMA verbs stacks whose per-message costs NCCL's own
network latencies (tuning.cc) and ccsim's proxy model already describe; their entries add
nothing. GPUDirect-TCPX (Google A3 High) and GPUDirect-TCPXO (A3 Mega) move data over TCP
with the payload placed straight in GPU memory: TCPX runs the TCP stack in the guest,
its receive path managed by a daemon (RxDM); TCPXO offloads it to the NIC (FasTrak).

>>> get_stack("tcpxo").nccl
'NCCL_PROTO=Simple,LL128 NCCL_MIN_NCHANNELS=4'
>>> sorted(STACKS)
['erdma', 'infiniband', 'roce', 'tcpx', 'tcpxo']
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TopologyError, shown

#: The stack a NIC runs when its preset names none.
DEFAULT_STACK = "infiniband"

#: Ways a fabric spreads connections over equal-cost paths (``fabric.routing``; see
#: :class:`~simulator.network.routing.Router`). ``per_destination``: every switch
#: forwards all traffic to one destination port through the same up-port, as the linear
#: forwarding tables an InfiniBand subnet manager programs (OpenSM's fat-tree engine,
#: linux-rdma/opensm at 3.3.24-2-gfa74b98c, opensm/osm_ucast_ftree.c: destinations
#: routed leaf by leaf, ports in index order, ``fabric_route_to_cns`` lines 2789-2800;
#: from the destination's leaf upward each switch takes its least-loaded up-port group,
#: the lowest index among equals, lines 2064-2092 and 2480-2482, which is round robin
#: over the up-ports). ``ecmp``: a seeded hash per connection, as an Ethernet switch
#: hashes a flow's 5-tuple. Not modelled: adaptive routing, where a switch picks among a
#: destination's equal-cost ports by their load, packet by packet. NVIDIA's subnet
#: manager can turn it on ("AR is enabled by default in the opensm.conf file", NVIDIA
#: InfiniBand Cluster Bring-up Procedure v1.0, "Adaptive Routing"), and NCCL marks its
#: InfiniBand transfers adaptive-routing capable by default (NVIDIA/nccl v2.30.7-1
#: src/transport/net_ib/init.cc lines 439-442); ``per_destination`` is the static tables
#: the switches fall back to.
ROUTINGS = ("per_destination", "ecmp")


@dataclass(frozen=True)
class NetworkStack:
    """One network stack and the costs it implies (see the module docstring)."""

    name: str
    description: str
    #: Seconds a message spends in the stack per NIC it crosses (one way), beyond the
    #: wire and the switches.
    latency_s: float = 0.0
    #: NCCL settings (NCCL's syntax, :mod:`simulator.library.nccl_env`) the vendor's
    #: setup exports: the defaults a job on this machine runs with.
    nccl: str = ""
    #: Where the figures come from.
    source: str = ""
    #: How the fabric's switches pick among equal-cost paths (:data:`ROUTINGS`).
    routing: str = "ecmp"


#: TCPXO's stack latency per NIC a message crosses (so twice per network hop). FITTED:
#: nothing public gives it (Google's plugin reports ``latency = 0`` to NCCL,
#: tcpdirect_plugin/fastrak_offload/nccl_shim.cc:966 of google/nccl-plugin-gpudirect-tcpxo
#: v1.0.17, so NCCL's own model does not see it either). It is the value of
#: TCPXO_LATENCY_GRID_S with the least summed squared log time error over the sizes
#: <= 1 MiB (where latency, not rate, sets the time) of the bundled A3 Mega runs
#: (TCPXO_FITTED_TO): 24 us; each run alone would choose 24 (all-reduce) and 20 us
#: (all-gather). ``ccsim validate --loco`` predicts each run with the other's choice.
TCPXO_LATENCY_S = 24e-6
TCPXO_LATENCY_GRID_S = tuple(k * 4e-6 for k in range(9))  # 0, 4, ..., 32 us
TCPXO_FITTED_TO = ("H100-2N-AR-a3mega-tcpxo", "H100-2N-AG-a3mega-tcpxo")

#: Google's TCPXO profile (google/nccl-plugin-gpudirect-tcpxo v1.0.17,
#: tcpxo_scripts/nccl-env-profile.sh, sourced by Google's nccl-tests scripts and the
#: Cluster Toolkit's A3 Mega setup): NCCL_PROTO=Simple,LL128 and NCCL_MIN_NCHANNELS=4
#: are the settings that change NCCL's choice; the others (buffer and chunk sizes,
#: NCCL_CROSS_NIC=0, the FasTrak flags) are not modelled or already ccsim's shape.
TCPXO_NCCL = "NCCL_PROTO=Simple,LL128 NCCL_MIN_NCHANNELS=4"

STACKS: dict[str, NetworkStack] = {
    "infiniband": NetworkStack(
        "infiniband",
        "InfiniBand verbs (GPUDirect RDMA): NCCL's own network figures apply",
        source="NCCL 2.30.7 tuning.cc network latencies",
        # The subnet manager's forwarding tables route per destination LID (ROUTINGS).
        routing="per_destination",
    ),
    "roce": NetworkStack(
        "roce",
        "RDMA over Converged Ethernet: NCCL's IB transport, the same figures as InfiniBand",
        source="NCCL net_ib.cc serves both (one transport, ncclNetIb)",
    ),
    "erdma": NetworkStack(
        "erdma",
        "Alibaba Cloud elastic RDMA: RDMA verbs over the VPC; its ~8 us latency and message "
        "rate are the preset's NIC figures",
        source="Alibaba's public AIGC training talk (shared/reference/README.md)",
    ),
    "tcpx": NetworkStack(
        "tcpx",
        "Google GPUDirect-TCPX (A3 High): TCP in the guest kernel, payloads received into "
        "GPU memory (devmem TCP) by a receive daemon",
        latency_s=TCPXO_LATENCY_S,
        source="google/nccl-plugin-gpudirecttcpx; latency as TCPXO's (no TCPX run bundled)",
    ),
    "tcpxo": NetworkStack(
        "tcpxo",
        "Google GPUDirect-TCPXO (A3 Mega): TCP offloaded to the NIC (FasTrak), payloads "
        "straight to and from GPU memory",
        latency_s=TCPXO_LATENCY_S,
        nccl=TCPXO_NCCL,
        source="google/nccl-plugin-gpudirect-tcpxo v1.0.17 (nccl-env-profile.sh); latency "
        "fitted on the A3 Mega runs",
    ),
}


def get_stack(name: object, *, field: str = "server.nic.stack") -> NetworkStack:
    """The stack called ``name`` (case-insensitive); an unknown one names ``field`` and
    the valid names."""
    stack = STACKS.get(str(name).lower()) if isinstance(name, str) else None
    if stack is None:
        raise TopologyError(
            f"{field}: unknown network stack {shown(name)}; valid: " + ", ".join(sorted(STACKS))
        )
    return stack


def get_routing(name: object, *, field: str = "fabric.routing") -> str:
    """``name`` if it is one of :data:`ROUTINGS`; otherwise an error naming ``field`` and
    the valid values.

    >>> get_routing("ecmp")
    'ecmp'
    """
    if not isinstance(name, str) or name not in ROUTINGS:
        raise TopologyError(
            f"{field}: unknown routing {shown(name)}; valid: " + ", ".join(ROUTINGS) + " "
            "(per_destination: InfiniBand's subnet manager, one up-port per destination; "
            "ecmp: a hash per connection, as Ethernet switches)"
        )
    return name


def stack_of(graph) -> NetworkStack | None:
    """The stack of ``graph``'s NICs (None without NICs); several stacks in one graph are
    refused, as NCCL runs one network plugin per communicator."""
    names = {
        str(data.get("stack", DEFAULT_STACK))
        for _, data in graph.nodes(data=True)
        if data.get("kind") == "nic"
    }
    if not names:
        return None
    if len(names) > 1:
        raise TopologyError(
            "the NICs run different network stacks (" + ", ".join(sorted(names)) + "); NCCL "
            "uses one network plugin per communicator: give every server the same stack"
        )
    return get_stack(names.pop())


def routing_of(graph) -> str:
    """How ``graph``'s fabric picks among equal-cost paths (:data:`ROUTINGS`): its
    ``routing`` attribute (set from ``fabric.routing`` when a preset is built), else its
    NICs' stack's, else ``ecmp`` (a graph without NICs).

    >>> import networkx as nx
    >>> routing_of(nx.Graph()), routing_of(nx.Graph(routing="per_destination"))
    ('ecmp', 'per_destination')
    """
    chosen = graph.graph.get("routing")
    if chosen is not None:
        return get_routing(chosen, field="the graph's 'routing' attribute")
    stack = stack_of(graph)
    return "ecmp" if stack is None else stack.routing
