"""NCCL's environment settings, as users write them: parsed once, then handed down.

``NCCL_ALGO=Ring NCCL_PROTO=^LL128 NCCL_MAX_NCHANNELS=8`` restricts what NCCL chooses
from; :func:`parse_nccl_env` reads such settings with NCCL's own syntax (v2.30.7, tag
``v2.30.7-1``) into an :class:`NcclEnv`, which :class:`~simulator.collective.policy.
NcclPolicy` applies to every call. Supported variables (:data:`SUPPORTED`):

* ``NCCL_ALGO`` / ``NCCL_PROTO``: a comma list of NCCL's names (case-insensitive); a
  leading ``^`` enables every name but the listed ones; entries separated by ``;`` with a
  function prefix (``allreduce:tree,ring;allgather:ring``) set that function's list, and
  only the first entry may go without one (``parseList``, graph/tuning.cc:35-135).
  Functions: Broadcast, Reduce, AllGather, ReduceScatter, AllReduce (``ncclFuncStr``,
  init.cc:52); algorithms and protocols as ``ncclAlgoStr`` / ``ncclProtoStr``
  (init.cc:53-55). CollNet algorithms run only with NCCL_COLLNET_ENABLE=1 (below), as NCCL
  disables them without it (tuning.cc:504-506).
* ``NCCL_NVLS_ENABLE``: 0 turns NVLink SHARP off, so NVLS and NVLSTree are never chosen
  (transport/nvls.cc:262); 1 and 2 (the default: where supported) leave it to the machine.
* ``NCCL_NVLS_CHUNKSIZE``: the largest chunk (bytes) of NVLS and NVLSTree, default 128
  KiB (``NCCL_PARAM(NvlsChunkSize, ...)``, transport/nvls.cc:160, read whenever the user
  sets it, nvls.cc:206-224; the same variable since v2.21). It does not enter NCCL's
  tuning model (tuning.cc never reads it), so the algorithm NCCL picks is unchanged; it
  moves the chunk each NVLS loop moves (enqueue.cc:2258-2285):
  :func:`simulator.collective.policy.nvls_chunk`. NCCL reads it with ``strtoll`` (decimal
  or 0x hex) and rounds the chunk down to the 512-byte Simple grain (enqueue.cc:2321,
  device.h:328-333); ccsim refuses a value below one grain, which would leave NCCL no
  chunk at all, and one above 2^31 - 1, which NCCL's ``int nvlsChunkSize`` (comm.h:631)
  cannot hold.
* ``NCCL_BUFFSIZE``, ``NCCL_LL_BUFFSIZE``, ``NCCL_LL128_BUFFSIZE``: each protocol's
  connection buffer in bytes (Simple 4 MiB, LL 512 KiB, LL128 4,915,200 B by default;
  ``computeBuffSizes``, init.cc:810-827 at v2.30.7-1), cut into NCCL_STEPS = 8 steps. A
  step is the data a channel moves at a time (LL's lines half data, LL128's 120 of 128
  bytes; enqueue.cc:2222-2227) and what one network message carries: a Ring/Simple slice
  is two steps (1 MiB by default), a Tree/Simple chunk one, NVLS starts from one Simple
  step, and send/receive's chunk is at most one (init.cc:841-843). The tuning model never
  reads them (tuning.cc), so NCCL's choice is unchanged; ccsim's pipeline grain and its
  proxy's messages follow them (:meth:`NcclEnv.step_bytes`). NCCL stores them as ``int``
  (comm.h:629): ccsim refuses values above 2^31 - 1 and below 8 steps of the protocol's
  grain (16, 1,920 or 512 bytes of data, device.h:328-333), which would leave a step
  no data.
* ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS`` and ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS``:
  the communicator's channels become ``max(min(n, MAX_NCHANNELS, MAX_CTAS),
  MIN_NCHANNELS, MIN_CTAS)`` (graph/connect.cc:501-505) and NVLS's ``max(MIN_CTAS,
  min(MAX_CTAS, n))`` (transport/nvls.cc:234-235); NCCL still trims a small call's
  channels below that (enqueue.cc:2068-2113). The tuning table is built from the
  topology search's channels, which these do not change (tuning.cc:305-383), so the
  algorithm and protocol NCCL picks stay the same. NCCL silently caps values above
  MAXCHANNELS = 64 and ignores values below 1 or a minimum above the maximum
  (init.cc:2013-2194, connect.cc:334-360); ccsim refuses them instead, since a user who
  writes them expects something else.
* A communicator's own configuration (``ncclConfig_t``'s ``minCTAs`` / ``maxCTAs``, which
  Megatron-Core sets per process group from ``--nccl-communicator-config-path``:
  :class:`CommConfig`, :meth:`NcclEnv.with_communicator`) bounds that communicator's
  channels as NCCL_MIN_CTAS / NCCL_MAX_CTAS do, and NCCL_MIN_CTAS / NCCL_MAX_CTAS, where
  set, replace it (``envConfigOverride``, init.cc:1528-1542 at v2.27.7-1, 2013-2035 at
  v2.30.7-1: "Comm config maxCTAs reset to NCCL_MAX_CTAS"), a minimum above the maximum
  then lowered to it (init.cc:1590-1593 at v2.27.7-1).
* ``NCCL_COLLNET_ENABLE``: 1 puts CollNet Direct and CollNet Chain into NCCL's choice for
  all-reduce where the fabric reduces in the network (``sharp: true``) across servers,
  with NCCL's tuning model for them (tuning.cc:305-435, enqueue.cc:2068-2113;
  :func:`~simulator.library.nccl.collnet_graphs`); elsewhere NCCL turns CollNet off
  itself (init.cc:1164-1166), and so does ccsim. Not modelled: CollNet for all-gather and
  reduce-scatter (it needs the plugin's iallgather / ireducescatter) and NVLS across
  servers, which NCCL enables with CollNet (tuning.cc:503-506).
* ``NCCL_PXN_DISABLE``: 0 only; ccsim's rings always leave a server as PXN sends.
* ``NCCL_P2P_PXN_LEVEL``: whether a send between servers may leave through another GPU
  of its communicator on the sender's host, the one of the receiver's device index
  (search.cc:1273-1345 at v2.28.7-1): 0 never, 1 where the sender reaches that NIC
  through it, 2 (the default since v2.12.7-1) as much as possible; with one NIC a GPU,
  1 and 2 pick the same GPU (:func:`simulator.library.nccl_p2p.p2p_proxy`).
* ``NCCL_NCHANNELS_PER_NET_PEER``: the channels send/receive (so the all-to-all) gives
  each peer on another server, replacing NCCL's own count (v2.30.7: one per NIC, or one
  per 14 GB/s of NIC if more, then halved while they x ceil(ranks / 8) exceed the p2p
  channels, a halving NCCL skips when the user sets it, paths.cc:940-952 and 993-1003;
  v2.23-v2.28: 2, halved while 2 x ranks > 4 x p2p channels, at least one per NIC,
  paths.cc:818-829 at v2.27.7-1). Read by ``NCCL_PARAM(NChannelsPerNetPeer, ...)``
  (paths.cc:796 at v2.27.7-1, init.cc:1729 and 2038-2049 at v2.30.7-1); a peer's
  channels are then the least over its peers, rounded up to a power of two, at most the
  p2p channels (:func:`simulator.library.nccl_p2p.p2p_call`). NCCL ignores a value
  below 1 and a communicator configuration above MAXCHANNELS = 64 is invalid
  (init.cc:2369-2371): ccsim accepts 1 to 64. (NCCL has no NCCL_NCHANNELS_PER_PEER: an
  NVLink peer's channels are always 2 per NVLink, paths.cc:933-936.)
* ``NCCL_TUNER_CONFIG_FILE``: the CSV file of NCCL's example tuner plugin (the plugin
  loaded with it, as ``NCCL_TUNER_PLUGIN`` does): per call, its first matching rule
  whose algorithm and protocol the settings above leave picks them, and its channels
  (:mod:`simulator.library.nccl_tuner`). The file is read when the settings are parsed;
  its path may hold neither spaces nor commas on the command line.

Examples
--------
>>> env = parse_nccl_env("NCCL_ALGO=Ring,Tree,NCCL_PROTO=^LL128")
>>> env.text
'NCCL_ALGO=Ring,Tree NCCL_PROTO=^LL128'
>>> env.algorithms_for("all_reduce"), env.protocols_for("all_reduce")
(('Tree', 'Ring'), ('LL', 'Simple'))
>>> parse_nccl_env("NCCL_ALGO=ring;allgather:nvls").algorithms_for("all_gather")
('NVLS',)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import CcsimError, shown
from .nccl import ALGORITHMS, MAX_CHANNELS, PROTOCOLS, NcclSystem
from .nccl_p2p import P2P_PXN_LEVEL, version_rules
from .nccl_tuner import TunerConfig, load_tuner_config

#: The settings ccsim models, in the order it prints them.
SUPPORTED = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_BUFFSIZE",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_COLLNET_ENABLE",
    "NCCL_PXN_DISABLE",
    "NCCL_P2P_PXN_LEVEL",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_TUNER_CONFIG_FILE",
)
#: NCCL's function names (``ncclFuncStr``, init.cc:52) by ccsim operation.
FUNCTIONS = {
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "all_reduce": "AllReduce",
}
#: NCCL_ALGO's names (``ncclAlgoStr``, init.cc:53-54), CollNet's included.
ENV_ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
#: The channel bounds, as :attr:`NcclEnv.channel_bounds` names them.
CHANNEL_VARIABLES = ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS")
#: NCCL_NVLS_CHUNKSIZE's bounds: the Simple protocol's grain (``ncclProtoGrainSize``,
#: device.h:328-333 at v2.30.7; NCCL rounds every chunk down to a multiple of it,
#: enqueue.cc:2321) and the largest ``int`` (``nvlsChunkSize``, comm.h:631).
NVLS_CHUNK_RANGE = (512, 2**31 - 1)
#: NCCL's protocols in its own order (NCCL_PROTO_LL, LL128, SIMPLE: device.h), the
#: variables setting their buffers, and the defaults (init.cc:810-813 at v2.30.7-1): LL 8
#: lines x 512 threads x 8 steps x 16 B, LL128 120 elements x 640 threads x 8 steps x 8 B
#: (device.h:92-93, 103-106), Simple 4 MiB.
BUFFER_PROTOCOLS = ("LL", "LL128", "Simple")
BUFFER_VARIABLES = ("NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_BUFFSIZE")
DEFAULT_BUFFERS = (8 * 512 * 8 * 16, 120 * 640 * 8 * 8, 4 << 20)
#: Steps a connection buffer is cut into (NCCL_STEPS, device.h:26).
NCCL_STEPS = 8
#: The data grain each chunk is rounded down to (``ncclProtoGrainSize``, device.h:328-333):
#: LL 16 B; LL128 32 threads x 8 elements / 16 x 15 x 8 B = 1,920 B; Simple 512 B.
PROTOCOL_GRAINS = {"LL": 16, "LL128": 1920, "Simple": 512}
_SYNTAX = "a comma list, ^ to exclude, per function as allreduce:tree,ring;allgather:ring"
_START = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

Lists = tuple[tuple[str, tuple[str, ...]], ...]

#: The keys of a communicator's configuration that Megatron-Core reads from
#: ``--nccl-communicator-config-path`` (``get_nccl_options``, megatron/core/
#: parallel_state.py lines 131-161 at core_v0.14.0, 168-200 at core_v0.19.0) into
#: PyTorch's ProcessGroupNCCL options, which hand them to ``ncclCommInitRankConfig``.
COMM_CONFIG_KEYS = (
    "min_ctas",
    "max_ctas",
    "cga_cluster_size",
    "net_name",
    "is_high_priority_stream",
)
#: NCCL's largest CGA cluster (``NCCL_MAX_CGA_CLUSTER_SIZE``, init.cc:1288 at v2.27.7-1).
MAX_CGA_CLUSTER_SIZE = 8


@dataclass(frozen=True)
class CommConfig:
    """One communicator's NCCL configuration, as Megatron-Core's per-group YAML gives it
    (build one with :func:`parse_comm_config`).

    ``min_ctas`` / ``max_ctas`` bound the communicator's channels (NCCL's ``minCTAs`` /
    ``maxCTAs``: graph/connect.cc:497-505 and transport/nvls.cc at v2.30.7-1; its
    send/receive channels follow, paths.cc:977-985, "here we already honor
    comm->max/minCTAs for p2pnChannels"); None leaves NCCL's default (1 and
    MAXCHANNELS). ``cga_cluster_size`` (a kernel launch attribute), ``net_name`` and
    ``is_high_priority_stream`` (a CUDA stream priority) are checked and kept, not
    modelled.
    """

    min_ctas: int | None = None
    max_ctas: int | None = None
    cga_cluster_size: int | None = None
    net_name: str | None = None
    is_high_priority_stream: bool = False

    @property
    def text(self) -> str:
        """The keys given, as the YAML writes them (``max_ctas=1 min_ctas=1``)."""
        items = [(key, getattr(self, key)) for key in COMM_CONFIG_KEYS]
        return " ".join(
            f"{key}={value}"
            for key, value in items
            if value is not None and not (key == "is_high_priority_stream" and not value)
        )


def parse_comm_config(data: Any, where: str) -> CommConfig:
    """A communicator's configuration from a mapping of :data:`COMM_CONFIG_KEYS`, checked
    as NCCL's ``parseCommConfig`` checks it (init.cc:1673-1693 at v2.27.7-1: minCTAs and
    maxCTAs at least 1, minCTAs not above maxCTAs, else the communicator fails with
    ncclInvalidArgument). ``where`` names the mapping in errors (the file, row and
    group). ccsim also refuses CTAs above NCCL's MAXCHANNELS (64), which NCCL caps
    silently, as it does for the environment variables.

    >>> parse_comm_config({"min_ctas": 1, "max_ctas": 8}, "cp").text
    'min_ctas=1 max_ctas=8'
    >>> parse_comm_config({"max_cta": 8}, "row x, group cp")
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: row x, group cp: unknown key 'max_cta'; valid: min_ctas, ...
    """
    if not isinstance(data, Mapping):
        raise CcsimError(
            f"{where}: expected a mapping of {', '.join(COMM_CONFIG_KEYS)}, got {shown(data)}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in COMM_CONFIG_KEYS:
            raise CcsimError(
                f"{where}: unknown key {shown(key)}; valid: {', '.join(COMM_CONFIG_KEYS)}"
            )
        if key in ("min_ctas", "max_ctas", "cga_cluster_size"):
            low, high, what = (
                (1, MAX_CHANNELS, f"of CTAs from 1 to {MAX_CHANNELS} (NCCL's MAXCHANNELS)")
                if key != "cga_cluster_size"
                else (0, MAX_CGA_CLUSTER_SIZE, f"from 0 to {MAX_CGA_CLUSTER_SIZE}")
            )
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise CcsimError(
                    f"{where}: {key} must be a whole number {what}, got {shown(value)}"
                )
        elif key == "net_name":
            # Megatron accepts "IB" and "socket" (parallel_state.py line 156 at
            # core_v0.14.0); ccsim's fabrics are RDMA: sockets are not modelled.
            if not isinstance(value, str) or value.lower() != "ib":
                raise CcsimError(
                    f"{where}: net_name {shown(value)} is not modelled; valid: IB (Megatron "
                    "also takes socket, which ccsim does not model)"
                )
        elif not isinstance(value, bool):
            raise CcsimError(f"{where}: {key} must be true or false, got {shown(value)}")
        values[key] = value
    low, high = values.get("min_ctas"), values.get("max_ctas")
    if low is not None and high is not None and low > high:
        raise CcsimError(
            f"{where}: min_ctas {low} is above max_ctas {high} (NCCL refuses such a "
            "communicator): a minimum must not exceed the maximum"
        )
    return CommConfig(**values)


@dataclass(frozen=True)
class NcclEnv:
    """NCCL settings, parsed and checked (build one with :func:`parse_nccl_env`).

    Attributes
    ----------
    settings : tuple of (name, value)
        The variables given, as written (values stripped), in :data:`SUPPORTED` order.
    algorithms, protocols : tuple of (function, names), or None
        NCCL_ALGO / NCCL_PROTO: per NCCL function, the names it enables, in NCCL's order;
        None where the variable is not set.
    nvls : bool
        Whether NVLink SHARP may be used (NCCL_NVLS_ENABLE not 0).
    nvls_chunk : int or None
        NCCL_NVLS_CHUNKSIZE in bytes; None: NCCL's default (128 KiB).
    channel_bounds : tuple of four int or None
        NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, NCCL_MIN_CTAS, NCCL_MAX_CTAS.
    buffers : tuple of three int or None
        NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE, NCCL_BUFFSIZE in bytes (None: NCCL's
        default, :data:`DEFAULT_BUFFERS`).
    version : str or None
        The NCCL version that runs (``--nccl-version``, not an environment variable),
        whose rules differ where ccsim models both (send/receive, see
        :func:`simulator.library.nccl_p2p.version_rules`); None: the one modelled.
    """

    settings: tuple[tuple[str, str], ...] = ()
    algorithms: Lists | None = None
    protocols: Lists | None = None
    nvls: bool = True
    nvls_chunk: int | None = None
    channel_bounds: tuple[int | None, ...] = (None, None, None, None)
    buffers: tuple[int | None, ...] = (None, None, None)
    version: str | None = None
    #: NCCL_COLLNET_ENABLE=1: CollNet (SHARP) joins NCCL's choice where the fabric
    #: reduces in the network.
    collnet: bool = False
    #: NCCL_P2P_PXN_LEVEL (:data:`~simulator.library.nccl_p2p.P2P_PXN_LEVEL` unless
    #: set): whether sends between servers may go through a GPU on the receiver's rail.
    p2p_pxn_level: int = P2P_PXN_LEVEL
    #: NCCL_NCHANNELS_PER_NET_PEER: send/receive's channels per peer on another server
    #: (None: NCCL's own count, :func:`simulator.library.nccl_p2p.p2p_call`).
    net_peer_channels: int | None = None
    #: NCCL_TUNER_CONFIG_FILE: the example tuner plugin's rules, read from the file.
    tuner: TunerConfig | None = None
    #: The communicator's own configuration (:class:`CommConfig`), under these settings.
    communicator: CommConfig | None = None

    def __bool__(self) -> bool:
        return bool(self.settings) or self.version is not None or self.communicator is not None

    def with_communicator(self, config: CommConfig | None) -> NcclEnv:
        """These settings on a communicator configured with ``config`` (None: NCCL's
        default configuration).

        >>> env = parse_nccl_env("NCCL_MIN_NCHANNELS=2")
        >>> env.with_communicator(CommConfig(max_ctas=1)).channels(16)
        2
        >>> env = parse_nccl_env("NCCL_MAX_CTAS=32")  # the variable replaces the config's 1
        >>> env.with_communicator(CommConfig(max_ctas=1)).channels(16)
        16
        """
        return replace(self, communicator=config)

    def ctas(self) -> tuple[int | None, int | None]:
        """The communicator's (minCTAs, maxCTAs) as NCCL sets them (None: its default, 1
        and MAXCHANNELS): the configuration's, each replaced by NCCL_MIN_CTAS /
        NCCL_MAX_CTAS where set, and a minimum above the maximum lowered to it
        (``envConfigOverride``, init.cc:1528-1542 and 1590-1593 at v2.27.7-1).

        >>> parse_nccl_env("NCCL_MIN_CTAS=16").with_communicator(CommConfig(1, 1)).ctas()
        (1, 1)
        """
        _, _, low, high = self.channel_bounds
        config = self.communicator
        if config is not None:
            low = config.min_ctas if low is None else low
            high = config.max_ctas if high is None else high
        if low is not None and high is not None and low > high:
            low = high
        return low, high

    @property
    def text(self) -> str:
        """The settings as one would export them (``NCCL_ALGO=Ring NCCL_PROTO=Simple``);
        empty when none. :func:`parse_nccl_env` reads it back."""
        return " ".join(f"{name}={value}" for name, value in self.settings)

    def with_version(self, version: str | None) -> NcclEnv:
        """These settings for NCCL ``version`` (checked: it must look like 2.28.7).

        >>> NcclEnv().with_version("2.28.7").version
        '2.28.7'
        >>> NcclEnv().with_version("two")
        Traceback (most recent call last):
        ...
        simulator.errors.CcsimError: --nccl-version: NCCL version must look like 2.28.7, got 'two'
        """
        if version is None:
            return self
        try:
            version_rules(version)
        except CcsimError as error:
            raise CcsimError(f"--nccl-version: {error}") from None
        return replace(self, version=str(version).strip())

    def value(self, name: str) -> str | None:
        """The value given for variable ``name``, or None."""
        return dict(self.settings).get(name)

    def step_bytes(self, protocol: str) -> int:
        """The data one pipeline step of ``protocol`` carries on a channel: its buffer
        over NCCL_STEPS, of which LL's lines carry half and LL128's 15 of 16 words,
        rounded down to the protocol's grain (enqueue.cc:2222-2227 and 2321 at
        v2.30.7-1).

        >>> [NcclEnv().step_bytes(p) for p in BUFFER_PROTOCOLS]
        [32768, 576000, 524288]
        >>> parse_nccl_env("NCCL_BUFFSIZE=16777216").step_bytes("Simple")
        2097152
        """
        i = BUFFER_PROTOCOLS.index(protocol)
        buffer = self.buffers[i] if self.buffers[i] is not None else DEFAULT_BUFFERS[i]
        step = buffer // NCCL_STEPS
        if protocol == "LL":
            step //= 2
        elif protocol == "LL128":
            step = step // 16 * 15
        grain = PROTOCOL_GRAINS[protocol]
        return step // grain * grain

    def steps(self) -> dict[str, int]:
        """:meth:`step_bytes` of every protocol, by name."""
        return {protocol: self.step_bytes(protocol) for protocol in BUFFER_PROTOCOLS}

    def algorithms_for(self, op: str) -> tuple[str, ...] | None:
        """The algorithms ccsim models (:data:`~simulator.library.nccl.ALGORITHMS`) that
        these settings leave NCCL for ``op``, in NCCL's order; None: no restriction."""
        names = _lookup(self.algorithms, op)
        if names is None and self.nvls:
            return None
        allowed = ALGORITHMS if names is None else names
        return tuple(
            a
            for a in ALGORITHMS
            if a in allowed
            and (self.nvls or a not in ("NVLS", "NVLSTree"))
            and (self.collnet or not a.startswith("CollNet"))  # off unless enabled
        )

    def protocols_for(self, op: str) -> tuple[str, ...] | None:
        """The protocols NCCL_PROTO leaves for ``op``; None: no restriction."""
        return _lookup(self.protocols, op)

    def channels(self, channels: int) -> int:
        """The communicator's channel count under the bounds (connect.cc:501-505):
        ``max(min(n, MAX_NCHANNELS, MAX_CTAS), MIN_NCHANNELS, MIN_CTAS)``.

        >>> parse_nccl_env("NCCL_MIN_NCHANNELS=24").channels(16)
        24
        >>> parse_nccl_env("NCCL_MAX_CTAS=4,NCCL_MIN_NCHANNELS=2").channels(16)
        4
        """
        low_n, high_n, _, _ = self.channel_bounds
        low_c, high_c = self.ctas()
        for high in (high_n, high_c):
            if high is not None:
                channels = min(channels, high)
        for low in (low_n, low_c):
            if low is not None:
                channels = max(channels, low)
        return channels

    def nvls_channels(self, channels: int) -> int:
        """NVLS's channels under NCCL_MIN_CTAS / NCCL_MAX_CTAS (transport/nvls.cc:234-235;
        NCCL_MIN/MAX_NCHANNELS do not bound them)."""
        low, high = self.ctas()
        if high is not None:
            channels = min(channels, high)
        if low is not None:
            channels = max(channels, low)
        return channels

    def apply(self, system: NcclSystem) -> NcclSystem:
        """``system`` as NCCL builds it under these settings: without NVLink SHARP where
        NCCL_NVLS_ENABLE=0, with the channel bounds applied."""
        if not self:
            return system
        nvls = system.nvls if self.nvls else None
        nvls_channels = self.nvls_channels(system.nvls_channels) if nvls is not None else 0
        return dataclasses.replace(
            system,
            nvls=nvls,
            nvls_channels=nvls_channels,
            channels=self.channels(system.channels),
            collnet=self.collnet,
        )

    def allows_channels(self, channels: int) -> bool:
        """Whether a forced channel count lies within every bound given."""
        low_n, high_n, _, _ = self.channel_bounds
        low_c, high_c = self.ctas()
        lows = [b for b in (low_n, low_c) if b is not None]
        highs = [b for b in (high_n, high_c) if b is not None]
        return all(channels >= b for b in lows) and all(channels <= b for b in highs)

    def over(self, defaults: NcclEnv | str | None) -> NcclEnv:
        """These settings on top of ``defaults`` (e.g. a network stack's profile,
        :mod:`simulator.topology.stacks`): each variable given here replaces the
        default's, the defaults' others stay.

        >>> parse_nccl_env("NCCL_PROTO=Simple").over("NCCL_PROTO=LL128 NCCL_MIN_NCHANNELS=4").text
        'NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=4'
        """
        base = parse_nccl_env(defaults)
        if not base:
            return self
        mine = dict(self.settings)
        merged = {k: v for k, v in base.settings if k not in mine} | mine
        try:
            merged_env = parse_nccl_env(merged).with_version(self.version)
            return merged_env.with_communicator(self.communicator)
        except CcsimError as error:
            raise CcsimError(
                f"{error} (with the network stack's own settings {base.text}: give the "
                "variable that clashes yourself)"
            ) from None

    def without(self, *names: str) -> NcclEnv:
        """These settings without the variables ``names`` (re-parsed)."""
        return parse_nccl_env({k: v for k, v in self.settings if k not in names})


def _lookup(lists: Lists | None, op: str) -> tuple[str, ...] | None:
    if lists is None or op not in FUNCTIONS:
        return None  # all-to-all is grouped send/receive: not through NCCL's tuner
    return dict(lists)[FUNCTIONS[op]]


def parse_nccl_env(
    settings: str | Sequence[str] | Mapping[str, Any] | NcclEnv | None,
) -> NcclEnv:
    """Parse NCCL settings: ``NAME=VALUE`` items separated by commas or spaces, a comma
    token without ``=`` continuing the previous variable's list (so
    ``NCCL_ALGO=Ring,Tree,NCCL_PROTO=Simple`` sets two variables); a list of such
    strings (repeated ``--nccl`` options); or a mapping of names to values (a spec's
    ``nccl:`` key). A variable given twice must have the same value.

    Raises
    ------
    CcsimError
        One line naming the variable and what it accepts.

    Examples
    --------
    >>> parse_nccl_env(["NCCL_PROTO=LL,LL128", "NCCL_NVLS_ENABLE=0"]).text
    'NCCL_PROTO=LL,LL128 NCCL_NVLS_ENABLE=0'
    >>> parse_nccl_env("NCCL_ALGO=Rign")
    Traceback (most recent call last):
    ...
    simulator.errors.CcsimError: NCCL_ALGO: unknown algorithm 'Rign'; valid: Tree, ...
    """
    if isinstance(settings, NcclEnv):
        return settings
    pairs = _pairs(settings)
    given: dict[str, str] = {}
    for name, value in pairs:
        if name not in SUPPORTED:
            raise CcsimError(
                f"unknown NCCL setting {shown(name)}; supported: {', '.join(SUPPORTED)}"
            )
        if not value:
            raise CcsimError(f"{name} is empty: give {name}=VALUE")
        if name in given and given[name] != value:
            raise CcsimError(f"{name} given twice ({given[name]} and {value}): give it once")
        given[name] = value
    algorithms = protocols = None
    if "NCCL_ALGO" in given:
        algorithms = _parse_list("NCCL_ALGO", given["NCCL_ALGO"], ENV_ALGORITHMS, "algorithm")
        collnet_off = "NCCL_COLLNET_ENABLE" not in given or given["NCCL_COLLNET_ENABLE"] == "0"
        for function, names in algorithms:
            if not names or (collnet_off and set(names) <= {"CollNetDirect", "CollNetChain"}):
                raise CcsimError(
                    f"NCCL_ALGO={given['NCCL_ALGO']} leaves no algorithm for {function} (NCCL "
                    "fails such a call; CollNet is off without NCCL_COLLNET_ENABLE=1): "
                    f"enable one of {', '.join(a for a in ALGORITHMS if 'CollNet' not in a)}"
                )
    if "NCCL_PROTO" in given:
        protocols = _parse_list("NCCL_PROTO", given["NCCL_PROTO"], PROTOCOLS, "protocol")
        for function, names in protocols:
            if not names:
                raise CcsimError(
                    f"NCCL_PROTO={given['NCCL_PROTO']} leaves no protocol for {function}: "
                    f"enable one of {', '.join(PROTOCOLS)}"
                )
    nvls = _flag(given, "NCCL_NVLS_ENABLE", (0, 1, 2)) != 0
    collnet = _flag(given, "NCCL_COLLNET_ENABLE", (0, 1)) == 1
    if _flag(given, "NCCL_PXN_DISABLE", (0, 1)) == 1:
        raise CcsimError(
            "NCCL_PXN_DISABLE=1 is not modelled (ccsim's rings always leave a server as "
            "PXN sends); valid: 0. To send point-to-point without PXN: NCCL_P2P_PXN_LEVEL=0"
        )
    pxn_level = _flag(given, "NCCL_P2P_PXN_LEVEL", (0, 1, 2))
    nvls_chunk = _nvls_chunk(given)
    # A step must hold one grain of data: LL's lines are half flags, and LL128's grain
    # is 15/16 of 2,048 bytes of lines.
    least = {"LL": 2 * 16, "LL128": 2048, "Simple": 512}
    buffers = tuple(
        _bytes(given, name, NCCL_STEPS * least[protocol], 2**31 - 1, default)
        for protocol, name, default in zip(
            BUFFER_PROTOCOLS, BUFFER_VARIABLES, DEFAULT_BUFFERS, strict=True
        )
    )
    bounds = tuple(_channels(given, name) for name in CHANNEL_VARIABLES)
    tuner = None
    if "NCCL_TUNER_CONFIG_FILE" in given:
        tuner = load_tuner_config(given["NCCL_TUNER_CONFIG_FILE"])
    for low, high in ((0, 1), (2, 3), (0, 3), (2, 1)):
        if bounds[low] is not None and bounds[high] is not None and bounds[low] > bounds[high]:
            raise CcsimError(
                f"{CHANNEL_VARIABLES[low]}={bounds[low]} is above "
                f"{CHANNEL_VARIABLES[high]}={bounds[high]}: a minimum must not exceed the maximum"
            )
    return NcclEnv(
        settings=tuple((name, given[name]) for name in SUPPORTED if name in given),
        algorithms=algorithms,
        protocols=protocols,
        nvls=nvls,
        nvls_chunk=nvls_chunk,
        channel_bounds=bounds,
        buffers=buffers,
        collnet=collnet,
        p2p_pxn_level=P2P_PXN_LEVEL if pxn_level is None else pxn_level,
        tuner=tuner,
        net_peer_channels=_channels(given, "NCCL_NCHANNELS_PER_NET_PEER"),
    )


def _pairs(settings: str | Sequence[str] | Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(name, value) items of the accepted forms, in the order given."""
    if settings is None:
        return []
    if isinstance(settings, Mapping):
        pairs = []
        for name, value in settings.items():
            if isinstance(value, (list, tuple)):
                value = ",".join(str(item) for item in value)
            elif isinstance(value, bool) or not isinstance(value, (str, int)):
                raise CcsimError(f"{name}: expected a string or an integer, got {shown(value)}")
            pairs.append((str(name), str(value).strip()))
        return pairs
    texts = [settings] if isinstance(settings, str) else list(settings)
    pairs = []
    for text in texts:
        if not isinstance(text, str):
            raise CcsimError(f"NCCL settings: expected NAME=VALUE text, got {shown(text)}")
        first = True
        for token in (t for part in text.split() for t in part.split(",")):
            if _START.match(token):
                name, _, value = token.partition("=")
                pairs.append((name, value))
            elif first:
                raise CcsimError(
                    f"NCCL settings: expected NAME=VALUE such as NCCL_ALGO=Ring, got "
                    f"{shown(token)}; supported: {', '.join(SUPPORTED)}"
                )
            else:  # the previous variable's list goes on
                name, value = pairs[-1]
                pairs[-1] = (name, f"{value},{token}")
            first = False
    return pairs


def _parse_list(variable: str, text: str, elements: Sequence[str], what: str) -> Lists:
    """NCCL's ``parseList`` (graph/tuning.cc:55-135): per function, the names enabled."""
    lower = {name.lower(): name for name in elements}
    functions = {name.lower(): name for name in FUNCTIONS.values()}
    enabled = {function: tuple(elements) for function in FUNCTIONS.values()}
    entries = [entry for entry in text.split(";") if entry]  # strtok skips empty ones
    if not entries:
        raise CcsimError(f"{variable} is empty: give {_SYNTAX}")
    for i, entry in enumerate(entries):
        prefix, colon, names = entry.partition(":")
        if not colon:
            if i > 0:
                raise CcsimError(
                    f"{variable}={text}: every entry after the first needs a function prefix "
                    f"({', '.join(FUNCTIONS.values())}), as in {_SYNTAX}"
                )
            prefix, names = "", entry
        if prefix and prefix.lower() not in functions:
            raise CcsimError(
                f"{variable}={text}: unknown function {shown(prefix)}; valid: "
                f"{', '.join(FUNCTIONS.values())}"
            )
        exclude = names.startswith("^")
        listed = set()
        for name in (n for n in names.lstrip("^").split(",") if n):
            if name.lower() not in lower:
                raise CcsimError(
                    f"{variable}: unknown {what} {shown(name)}; valid: {', '.join(elements)} "
                    f"({_SYNTAX})"
                )
            listed.add(lower[name.lower()])
        chosen = tuple(e for e in elements if (e in listed) != exclude)
        for function in FUNCTIONS.values():
            if not prefix or function.lower() == prefix.lower():
                enabled[function] = chosen
    return tuple(enabled.items())


def _flag(given: Mapping[str, str], name: str, valid: tuple[int, ...]) -> int | None:
    if name not in given:
        return None
    text = given[name]
    if text.strip().lstrip("-").isdigit() and int(text) in valid:
        return int(text)
    raise CcsimError(f"{name}={text}: valid values: {', '.join(map(str, valid))}")


def _nvls_chunk(given: Mapping[str, str]) -> int | None:
    """NCCL_NVLS_CHUNKSIZE in bytes, within :data:`NVLS_CHUNK_RANGE` (the lower bound:
    the Simple protocol's grain)."""
    low, high = NVLS_CHUNK_RANGE
    return _bytes(given, "NCCL_NVLS_CHUNKSIZE", low, high, 131072)


def _bytes(given: Mapping[str, str], name: str, low: int, high: int, default: int) -> int | None:
    """Variable ``name`` in bytes, read as NCCL's ``strtoll(value, NULL, 0)`` reads it
    (decimal or 0x hex; param.cc:95), from ``low`` to ``high``; None when not given.
    ``default`` is NCCL's, shown as the example in the error."""
    if name not in given:
        return None
    text = given[name]
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise CcsimError(
            f"{name}={text}: expected a whole number of bytes from {low} to {high}, such "
            f"as {name}={default} (NCCL's default)"
        )
    return value


def _channels(given: Mapping[str, str], name: str) -> int | None:
    if name not in given:
        return None
    text = given[name]
    if text.isdigit() and 1 <= int(text) <= MAX_CHANNELS:
        return int(text)
    raise CcsimError(
        f"{name}={text}: expected a whole number of channels from 1 to {MAX_CHANNELS} "
        "(NCCL's MAXCHANNELS)"
    )
