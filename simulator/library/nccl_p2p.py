"""NCCL's choices for grouped send/receive (its all-to-all): channels, protocol, chunks.

NCCL runs point-to-point operations without its tuner: the channels, the protocol and
the chunk of each peer's message follow fixed rules, which this module reproduces for a
uniform all-to-all of ``size`` bytes per rank (``size / ranks`` per peer). The schedule
that runs them is :mod:`simulator.algorithms.nccl_p2p`, whose docstring says how NCCL
moves the bytes. Lines cite v2.28.7-1 (the bundled GB300 runs' version) and v2.30.7-1
(the mirrored master, commit 5067397c); where the two differ, ``version`` picks.

* p2pnChannels C = pow2Up(comm's channels), at most MAXCHANNELS = 64 (paths.cc:859-885
  at v2.28.7-1);
* channels per peer = the least over peers of: 2 x NVLinks for an NVLink peer (NVLinks
  = path bandwidth / NCCL's per-link figure), 2 for a PCIe peer, and for a network peer
  (v2.28.7) the larger of its NICs and 2 halved while 2 x ranks > 4 C
  (paths.cc:817-852), (v2.30.7) the larger of its NICs and NIC GB/s / 14
  (paths.cc:935-954); pow2Up, at most C (paths.cc:882-886); v2.30.7 then halves it
  across nodes while it x ceil(ranks / 8) > C (paths.cc:993-1001); where the user sets
  NCCL_NCHANNELS_PER_NET_PEER it replaces the network peer's count and v2.30.7 skips
  that halving (paths.cc:943-952 and 993 at v2.30.7-1);
* nChannelsMin: that, halved while x ranks > C (enqueue.cc:1052-1056 at v2.28.7-1);
* the chunk: p2pChunkSize, 512 KiB when every GPU talks over NVLink, 128 KiB across
  nodes or over PCIe (init.cc:704-720 at v2.28.7-1); from v2.29.2 twice that across
  nodes on Arm hosts with Blackwell GPUs, "GBx platforms only have 4 GPUs per host"
  (init.cc:748-752 at v2.29.2-1, 800-804 at v2.30.4-1, 830-834 at v2.30.7-1), at most
  one Simple step (init.cc:812 at v2.30.4-1); LL moves 32 KiB of data per 64 KiB step
  (enqueue.cc:840-857);
* a channel's rate: NCCL gives a peer two channels per NVLink of its path and, since
  2.29, one per 14 GB/s of NIC (NCCL_P2P_PER_CHANNEL_NET_BW): its own sizing of what one
  channel carries, half an NVLink (20.05 GB/s on Blackwell) or 14 GB/s; ccsim holds a
  channel to it (LL to half of it: its lines are half data). NCCL states no such limit
  for p2p: this is the rate its channel counts assume, taken as the thread block's;
* LL below NCCL_P2P_LL_THRESHOLD = 16 KiB per channel: v2.28.7 compares a peer's bytes
  with 16 KiB x channels per peer (enqueue.cc:821, 834), v2.29 and later with 16 KiB x
  the channels that peer's message actually uses (enqueue.cc:932 at v2.30.7-1); network
  connections have no LL buffers by default (NCCL_ALLOC_P2P_NET_LL_BUFFERS=0), so a call
  across nodes is taken as Simple.

Two per-message costs of NCCL's InfiniBand transport are left out, by its source (v2.30.7-1):

* the GPUDirect flush (an RDMA read of the received buffer, ncclIbIflush,
  net_ib/p2p.cc:525-560) runs only where ncclTopoNeedFlush asks for it: on GPUs before
  compute capability 9.0, or with a DataDirect NIC (net_ib/init.cc:554-557), or a NIC
  behind a PCIe switch from a GPU whose CPU link is C2C (graph/paths.cc:575-596). Hopper
  and Blackwell GPUs on ConnectX-7 behind PCIe switches (hgx-b200, dgx-h100) never flush;
* the clear-to-send (the receiver's RDMA write into the sender's FIFO, ncclIbPostFifo,
  net_ib/p2p.cc:364-428, from each irecv, :517) is posted when the receiver's proxy
  takes the op, which an uncaptured launch hands it at enqueue time
  (ncclLaunchKernelAfter_NoCuda, enqueue.cc:1853-1858), ahead of the kernel, with up to
  NCCL_STEPS receives in flight (net.cc:1532, 1590): back-to-back calls, as nccl-tests
  runs them, find it already arrived.

So neither explains the all-to-all floor across two B200 servers (37 us measured, 29.4
us in ccsim), which stays open.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import CcsimError

#: NCCL_P2P_LL_THRESHOLD's default (enqueue.cc:779 at v2.28.7-1).
LL_THRESHOLD = 16 * 1024
#: NCCL_P2P_NVL_CHUNKSIZE and NCCL_P2P_NET_CHUNKSIZE / NCCL_P2P_PCI_CHUNKSIZE defaults
#: (init.cc:704-706 at v2.28.7-1), capped at DEFAULT_BUFFSIZE / NCCL_STEPS = 512 KiB.
NVL_CHUNK = 512 * 1024
NET_CHUNK = 128 * 1024
#: LL's step: DEFAULT_LL_BUFFSIZE / NCCL_STEPS = 8 lines x 512 threads x 16 B
#: (init.cc:697 with device.h:92-93 at v2.28.7-1), half of it data.
LL_STEP = 8 * 512 * 16
#: The first release whose network chunk is doubled on Arm hosts with Blackwell GPUs
#: (computeBuffSizes, init.cc:748-752 at v2.29.2-1; absent at v2.28.9-1), as
#: :func:`version_number` gives it, and that factor (``ratio``).
ARM_NET_CHUNK_SINCE = (29, 2)
ARM_NET_CHUNK_RATIO = 2
#: MAXCHANNELS (device.h:86 at v2.28.7-1).
MAX_CHANNELS = 64
#: NCCL_P2P_PER_CHANNEL_NET_BW (GB/s, paths.cc:920 at v2.30.7-1).
PER_CHANNEL_NET_GBPS = 14
#: Receives one irecv may post at once: NCCL_NET_IB_MAX_RECVS (net_ib.cc:924 at
#: v2.28.9-1, net_ib/common.h:161 at v2.30.7-1), used where connections share one
#: network communicator (NCCL_NET_SHARED_COMMS=1 by default, transport/net.cc:164).
MAX_RECVS = 8
#: Inside one NVLink domain a channel's works run on one thread block whose warps split
#: between the sends and the receives (sendrecv.h:103-112 at v2.28.7-1). On Blackwell
#: NCCL's P2P transport writes (P2P read only between SM80 GPUs, paths.cc:371 at
#: v2.28.9-1): the sender's warps write a chunk into the receiver's buffer over NVLink,
#: the receiver's warps then copy it out into the user buffer (prims_simple.h), so a
#: part's last chunk is copied out after its write ends; earlier chunks' copies overlap
#: later writes (8 slots). FITTED on the bundled GB300 all-to-all runs (4, 8 and 64 GPUs
#: in one NVL72 rack, sizes >= 512 KiB; README gives the leave-one-case-out errors):
#: the copy-out rate of one thread block, P2P_COPY_GBPS, and a call's further cost
#: P2P_CALL_US (the receives' flag checks and a work batch's setup, not in NCCL's
#: model); with LL every 8-byte line is 4 bytes of data and a flag the receiver polls
#: line by line, and the measured LL slopes show one channel moving LL_COPY_SHARE of
#: the half-link rate NCCL sizes it at. NCCL's model has none of the three.
P2P_COPY_GBPS = 50.0
P2P_CALL_US = 2.0
LL_COPY_SHARE = 0.3
#: The ``ccsim validate`` runs these constants were chosen on.
P2P_FITTED_TO = (
    "GB300-1N-A2A-oci-quickstart",
    "GB300-2N-A2A-oci-quickstart",
    "GB300-16N-A2A-oci-quickstart",
)
#: The version whose rules apply when none is given: ccsim's NCCL model (v2.30.7).
DEFAULT_VERSION = "2.30.7"
#: NCCL_P2P_PXN_LEVEL's default, "use PXN as much as possible to maximize aggregation"
#: (0: "don't use PXN for P2P", 1: "use PXN if needed"; search.cc:1273-1274 at
#: v2.28.7-1, search.cc:1398 at v2.30.7-1, the same default since v2.12.7-1,
#: search.cc:943).
P2P_PXN_LEVEL = 2


@dataclass(frozen=True)
class P2pCall:
    """NCCL's plan for one peer's message of a uniform all-to-all."""

    protocol: str
    channels: int  # parts of each peer's message (nChannels)
    p2p_channels: int  # p2pnChannels
    per_peer: int  # p2pnChannelsPerPeer
    chunk_bytes: float  # data bytes of one chunk
    group_size: int  # the peer schedule's group
    channel_gbps: float  # data GB/s one channel moves to one peer, NCCL's sizing


def version_number(version: str | None) -> tuple[int, int]:
    """A NCCL version as (minor, patch), for comparing releases (None: the one modelled,
    :data:`DEFAULT_VERSION`); a version given without its patch counts as its first.

    >>> version_number("2.29.2"), version_number(None), version_number("2.28")
    ((29, 2), (30, 7), (28, 0))
    """
    text = DEFAULT_VERSION if version is None else str(version)
    match = re.fullmatch(r"2\.(\d+)(?:\.(\d+))?(-\d+)?", text.strip())
    if not match:
        raise CcsimError(f"NCCL version must look like 2.28.7, got {version!r}")
    return int(match.group(1)), int(match.group(2) or 0)


def version_rules(version: str | None) -> str:
    """Which rules a NCCL version follows: "2.28" (before 2.29) or "2.29".

    >>> version_rules("2.28.7"), version_rules(None), version_rules("2.29.2")
    ('2.28', '2.29', '2.29')
    """
    return "2.28" if version_number(version)[0] < 29 else "2.29"


def p2p_call(
    *,
    ranks: int,
    nodes: int,
    channels: int,
    nvlinks: int,
    net_count: int,
    net_gbps: float,
    size_bytes: float,
    nvlink_gbps: float = 0.0,
    version: str | None = None,
    steps: Mapping[str, int] | None = None,
    cpu: str = "x86",
    blackwell: bool = False,
    net_peer_channels: int | None = None,
) -> P2pCall:
    """NCCL's channels, protocol and chunk for an all-to-all of ``size_bytes`` per rank
    on a communicator of ``ranks`` over ``nodes`` nodes with ``channels`` channels, GPUs
    of ``nvlinks`` NVLinks (0: PCIe) and ``net_count`` NICs of ``net_gbps`` in all.
    ``steps`` is the data of an LL and a Simple step under the connection buffers the
    user sets (:meth:`simulator.library.nccl_env.NcclEnv.steps`; None: NCCL's defaults):
    the chunk is at most one Simple step (init.cc:841-843 at v2.30.7-1) and LL's step
    is its buffer's eighth. ``cpu`` is the hosts' CPU ("arm" or "x86") and ``blackwell``
    whether the GPUs are Blackwell or later (compute capability >= 10.0): together they
    set the network chunk (:func:`net_chunk`). ``net_peer_channels`` is
    NCCL_NCHANNELS_PER_NET_PEER where the user sets it (None: NCCL's own count): it
    replaces the channels NCCL gives a network peer, and from v2.29 NCCL then skips its
    halving across nodes (paths.cc:943-952 and 993-1003 at v2.30.7-1; paths.cc:837-850
    at v2.28.9-1).

    >>> c = p2p_call(ranks=4, nodes=1, channels=32, nvlinks=18, net_count=2,
    ...              net_gbps=100.0, size_bytes=2**24, nvlink_gbps=40.1, version="2.28.7")
    >>> c.protocol, c.channels, c.p2p_channels, c.per_peer, c.chunk_bytes, c.channel_gbps
    ('Simple', 8, 32, 32, 524288.0, 20.05)
    >>> p2p_call(ranks=4, nodes=1, channels=32, nvlinks=18, net_count=2, net_gbps=100.0,
    ...          size_bytes=2**21, version="2.28.7").protocol
    'LL'
    """
    rules = version_rules(version)
    C = min(pow2_up(min(channels, MAX_CHANNELS)), MAX_CHANNELS)
    local = 2 * max(1, nvlinks) if nvlinks > 0 else 2
    per_peer = local
    net = sized = 0
    if nodes > 1:
        if rules == "2.28":
            most = 2
            while most * ranks > C * 4 and most > 1:
                most //= 2
            net = max(max(1, net_count), most)
        else:
            net = max(max(1, net_count), math.ceil(net_gbps / PER_CHANNEL_NET_GBPS))
        sized = net  # the count NCCL sizes a channel's rate by (below)
        if net_peer_channels is not None:
            # The user's count replaces NCCL's (comm->config.nChannelsPerNetPeer, set
            # from NCCL_NCHANNELS_PER_NET_PEER by envConfigOverride, init.cc:2038-2049
            # at v2.30.7-1, 1684-1692 at v2.28.9-1; the NCCL_PARAM itself before v2.28,
            # paths.cc:818 at v2.27.7-1).
            net = net_peer_channels
        per_peer = min(per_peer, net)
    per_peer = min(pow2_up(per_peer), C)
    if nodes > 1 and rules == "2.29" and net_peer_channels is None:
        # "the user didn't set nChannelsPerNetPeer" (paths.cc:993 at v2.30.7-1).
        while per_peer * math.ceil(ranks / 8) > C and per_peer > 1:
            per_peer //= 2
    least = per_peer
    while least * ranks > C and least > 1:
        least //= 2
    if nodes > 1:
        chunk = net_chunk(version, cpu, blackwell)
    else:
        chunk = NVL_CHUNK if nvlinks > 0 else NET_CHUNK  # PCIe's default equals the net's
    ll_step = LL_STEP
    if steps is not None:
        chunk = min(chunk, steps["Simple"])
        ll_step = 2 * steps["LL"]  # the step's lines, half of them flags
    nbytes = size_bytes / ranks

    def parts(step: int) -> int:
        small, large = (step // 2, step) if nodes > 1 else (step // 8, step * 32)
        n = min(least, max(1, math.ceil(nbytes / small)))
        size = max(small, math.ceil(nbytes / n))
        while size > large and n <= per_peer // 2:
            n *= 2
            size = math.ceil(nbytes / n)
        return n

    if nodes > 1:
        ll = False  # network connections have no LL buffers by default
    elif rules == "2.28":
        ll = nbytes <= per_peer * LL_THRESHOLD
    else:
        ll = nbytes <= parts(chunk) * LL_THRESHOLD
    step = ll_step if ll else chunk
    if nodes > 1 and not ll:
        # Network peers' chunk is tuned down for short messages (enqueue.cc:845-849).
        step = step // 4 if nbytes < step else step // 2 if nbytes < 8 * step else step
    # v2.28.7 sizes the parts with the protocol's step; later versions with Simple's.
    n = parts(ll_step) if ll and rules == "2.28" else parts(chunk)
    data = step / 2 if ll else step
    group = 8 if nodes > 1 or rules == "2.28" else ranks // nodes
    # NCCL sizes a peer's channels to carry its path: two per NVLink (paths.cc:827-831),
    # so one channel carries half a link, NCCL's per-link figure / 2. Across nodes each
    # version sizes them by the GPU's NICs: v2.29 and later one per 14 GB/s of NIC
    # (NCCL_P2P_PER_CHANNEL_NET_BW, paths.cc:920-950 at v2.30.7-1); v2.28 "2 channels
    # per NIC" at most (nNetChannels = max(NICs, 2 halved at scale), paths.cc:838-849 at
    # v2.28.9-1), so one of them carries the NICs' GB/s over that count (50 GB/s of an
    # 800 Gb/s NIC), not 2.29's 14. LL's lines carry half data.
    if nodes > 1:
        # A channel is one thread block: the user's count does not change what it
        # moves, so the rate follows NCCL's own count.
        rate = PER_CHANNEL_NET_GBPS if rules == "2.29" else net_gbps / sized
        rate = rate if rate > 0 else PER_CHANNEL_NET_GBPS  # no NIC figure: 2.29's sizing
    else:
        rate = nvlink_gbps / 2 if nvlinks else math.inf
    rate *= 0.5 if ll else 1.0
    if ll and nodes == 1 and nvlinks:
        rate *= LL_COPY_SHARE  # FITTED, see LL_COPY_SHARE
    return P2pCall("LL" if ll else "Simple", n, C, per_peer, float(data), group, rate)


def net_chunk(version: str | None, cpu: str, blackwell: bool) -> int:
    """NCCL's p2pChunkSize across nodes before the Simple buffer caps it: 128 KiB
    (NCCL_P2P_NET_CHUNKSIZE), twice that from v2.29.2 when the hosts are Arm and every GPU
    is Blackwell or later ("GBx platforms only have 4 GPUs per host, which reduces the
    aggregation factor", init.cc:800-804 at v2.30.4-1).

    >>> net_chunk("2.30.4", "arm", True), net_chunk("2.28.9", "arm", True)
    (262144, 131072)
    >>> net_chunk("2.30.4", "x86", True), net_chunk("2.30.4", "arm", False)
    (131072, 131072)
    """
    if cpu not in ("arm", "x86"):
        raise CcsimError(f"cpu must be 'arm' or 'x86', got {cpu!r}")
    later = version_number(version) >= ARM_NET_CHUNK_SINCE
    return NET_CHUNK * (ARM_NET_CHUNK_RATIO if later and cpu == "arm" and blackwell else 1)


def pow2_up(n: int) -> int:
    """The smallest power of two >= n (NCCL's pow2Up)."""
    return 1 << max(0, int(n) - 1).bit_length()


def channel_share(busy: float, channel_gbps: float, link_gbps: float) -> float:
    """The share of its links' rate a rank's all-to-all sends reach when each of its
    ``busy`` channels is one thread block copying at most ``channel_gbps`` (NCCL's own
    sizing of a channel, :attr:`P2pCall.channel_gbps`) and its links carry
    ``link_gbps``: its sends together move at most ``busy x channel_gbps``. A channel's
    works split its warps (sendrecv.h:103-112 at v2.28.7-1), so their count does not
    change the total. 1 where the links bound it.

    Four GB300 GPUs at 256 MiB: 24 busy channels at 20.05 GB/s (half of NCCL's 40.1
    GB/s per NVLink5 link) against 18 x 40.1 GB/s of NVLink:

    >>> round(channel_share(24, 20.05, 18 * 40.1), 4)
    0.6667
    >>> channel_share(64, 20.05, 18 * 40.1)
    1.0
    """
    if not (busy > 0 and channel_gbps > 0 and link_gbps > 0) or math.isinf(channel_gbps):
        return 1.0
    return min(1.0, busy * channel_gbps / link_gbps)


def proxy_share(grouped: float, max_recvs: int = MAX_RECVS) -> float:
    """The proxy's time per network message of an all-to-all across nodes, as a share
    of a message posted on its own, when receives are posted ``grouped`` at a time.

    With PXN every sender of a node reaches a receiver through the NIC on the
    receiver's rail, so their connections share one network communicator per channel
    (NCCL_NET_SHARED_COMMS, transport/net.cc:830-845 at v2.28.9-1), and the receiver's
    proxy posts the receives of one channel's works that share it with one irecv of
    up to ``max_recvs`` buffers ("group them by same recvComm", recvProxyProgress,
    net.cc:1375-1410 and the irecv at :1482). Sends are posted one message at a time.
    A GPU's proxy posts as many sends as it receives in a uniform all-to-all, so a
    message costs it (1 + 1/g) / 2 of a lone one, g = min(grouped, max_recvs).

    >>> proxy_share(8), proxy_share(1), proxy_share(20)
    (0.5625, 1.0, 0.5625)
    """
    g = min(float(max_recvs), max(1.0, float(grouped)))
    return (1.0 + 1.0 / g) / 2.0


def copy_out_us(
    call: P2pCall,
    part_bytes: float,
    copy_gbps: float | None = None,
    call_us: float | None = None,
) -> float:
    """What an all-to-all inside one NVLink domain adds to the links' time (us): with
    Simple the last chunk of a part (``part_bytes``, at most ``call.chunk_bytes``)
    copied out by the receiver's thread block at ``copy_gbps`` (default
    :data:`P2P_COPY_GBPS`) after it was written; and ``call_us`` per call (default
    :data:`P2P_CALL_US`). LL's lines are copied out as they arrive: the call's cost only.

    >>> call = P2pCall("Simple", 8, 32, 32, 524288.0, 8, 20.05)
    >>> copy_out_us(call, 2**20, copy_gbps=52.4288, call_us=1.0)
    11.0
    >>> copy_out_us(call, 131072, copy_gbps=52.4288, call_us=1.0)
    3.5
    """
    copy_gbps = P2P_COPY_GBPS if copy_gbps is None else copy_gbps
    call_us = P2P_CALL_US if call_us is None else call_us
    if call.protocol != "Simple" or not math.isfinite(copy_gbps):
        return call_us
    return call_us + min(part_bytes, call.chunk_bytes) / (copy_gbps * 1e3)


def p2p_proxy(
    sender: int,
    receiver: int,
    comm: Sequence[int],
    hosts: Sequence[Hashable],
    devices: Sequence[int],
    relays: Callable[[int, int], bool],
    level: int = P2P_PXN_LEVEL,
) -> int | None:
    """The GPU a send between hosts leaves through when it is not the sender's own (NCCL's
    PXN for point-to-point), or None: the sender's NIC.

    ``comm`` is the communicator's ranks (a PyTorch isend/irecv on its own: the two
    ends; a batch_isend_irecv: its process group's), ``hosts[r]`` and ``devices[r]`` a
    rank's operating-system host and its device index there, ``relays(sender, g)``
    whether GPU ``g`` is joined to the sender over NVLink and reaches a NIC of its own
    over PCIe or C2C (NCCL's ``paths[GPU][g1].type <= PATH_NVL`` and ``paths[NET][n].type
    <= PATH_P2C`` with NCCL_PXN_C2C=1, its default; paths.cc:639 at v2.28.7-1).

    NCCL's send side (``ncclTopoGetNetDev`` without a graph, search.cc:1295-1345 at
    v2.28.7-1; the receiver always uses its own NIC, "We don't support PXN on receive
    yet", transport/net.cc:351) looks among *its communicator's* GPUs on *the sender's
    host* (``ncclTopoDevToRank``: "Only consider GPUs on our node", topo.h:247-257; the
    topology holds the communicator's GPUs only, topo.cc:1446-1451 and 1491-1507) for the
    one of the receiver's device index, and sends through that GPU's NIC from that GPU:
    level 2 whenever it is joined to the sender over NVLink (search.cc:1326-1341);
    level 1 where the sender reaches that NIC by PXN at best (search.cc:1316-1325, the
    path paths.cc:719-737 builds through the same GPU, so with a NIC a GPU as in ccsim's
    presets it picks the same one); level 0 (or NCCL_PXN_DISABLE=1) never. None where no
    such GPU is found, or it is the sender.

    Two hosts with two GPUs each; a communicator of ranks 0, 1 and 2; rank 1 sends to
    rank 2 (device 0 of the other host) through rank 0, device 0 of its own host:

    >>> hosts, devices = [0, 0, 1, 1], [0, 1, 0, 1]
    >>> p2p_proxy(1, 2, [0, 1, 2], hosts, devices, lambda a, b: True)
    0
    >>> p2p_proxy(1, 2, [1, 2], hosts, devices, lambda a, b: True) is None  # isend alone
    True
    >>> p2p_proxy(1, 2, [0, 1, 2], hosts, devices, lambda a, b: True, level=0) is None
    True
    """
    if level not in (0, 1, 2):
        raise CcsimError(f"NCCL_P2P_PXN_LEVEL must be 0, 1 or 2, not {level!r}")
    if level == 0 or hosts[sender] == hosts[receiver]:
        return None
    host, device = hosts[sender], devices[receiver]
    via = next((g for g in comm if hosts[g] == host and devices[g] == device), None)
    if via is None or via == sender or not relays(sender, via):
        return None
    return via


def p2p_relays(
    comms: Sequence[Sequence[int]] | None,
    hosts: Sequence[Hashable],
    devices: Sequence[int],
    servers: Sequence[Hashable],
    relays: Callable[[int, int], bool],
    level: int = P2P_PXN_LEVEL,
) -> dict[tuple[int, int], int]:
    """Every send between two ranks of one of ``comms`` on different ``servers`` (NVLink
    domains: within one, NCCL sends over NVLink) that NCCL sends through another GPU
    (:func:`p2p_proxy`), as (sender, receiver) -> that GPU. ``comms`` None: each send on
    its own two ranks' communicator, where no other GPU can relay. A communicator with
    one GPU a host is passed over without a look at its pairs (no GPU of it can relay).

    >>> hosts, devices, servers = [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 1, 1]
    >>> p2p_relays([[0, 1, 2, 3]], hosts, devices, servers, lambda a, b: True)
    {(0, 3): 1, (1, 2): 0, (2, 1): 3, (3, 0): 2}
    >>> p2p_relays([[0, 2], [1, 3]], hosts, devices, servers, lambda a, b: True)
    {}
    """
    found: dict[tuple[int, int], int] = {}
    if comms is None or level == 0:
        return found
    for comm in comms:
        if len({hosts[r] for r in comm}) == len(comm) or len({servers[r] for r in comm}) < 2:
            continue
        for a in comm:
            for b in comm:
                if servers[a] == servers[b]:
                    continue
                via = p2p_proxy(a, b, comm, hosts, devices, relays, level)
                if via is not None:
                    found[(a, b)] = via
    return found
