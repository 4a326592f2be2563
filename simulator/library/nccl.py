"""NCCL's own decision: which algorithm, protocol and channel count it runs a collective
with, from its tuning model.

NCCL (v2.30.7, ``src/graph/tuning.cc`` and ``src/enqueue.cc``) predicts the time of each
(algorithm, protocol) pair as ``latency + bytes / bandwidth`` from a table built once per
communicator, picks the smallest, then trims the channel count for small messages. This
module re-derives that table from a topology graph so that ``--algo nccl`` runs what the
library would run, not the best schedule ccsim can find. Every constant cites the NCCL
source line it comes from (file:line at v2.30.7, tag ``v2.30.7-1``). A run of an earlier
release from v2.28.3 on (a sidecar's ``nccl_version``, ``--nccl-version``) gets the
figures that release had where they differ (:data:`TUNING_RELEASES`: Blackwell's
per-channel Ring/LL128 and NVLSTree caps, NVLSTree's network latency); earlier releases
get their NVLS / NVLSTree pricing (before v2.28.3) and Tree/Simple and ring latencies
(before v2.23.4), and every release its channel split (:func:`working_channels`).

Inputs NCCL measures on the machine are derived from the graph:

* the GPU generation, from the GPU ``model`` (A100 -> Ampere, H100/H200/H800/H20 ->
  Hopper, B200/GB200/RTX 50xx -> Blackwell, V100 -> Volta);
* NVLink bandwidth as NCCL counts it: per-link figures 20.0 (SM80), 20.6 (SM90), 40.1
  (SM100) GB/s against line rates of 25, 25 and 50 GB/s (``graph/topo.h:17-39``);
* PCIe as ``width x speed / 80`` (Gen4 x16 = 24, Gen5 x16 = 48 GB/s, i.e. 0.76 of the
  31.5 / 63 GB/s line rate; ``graph/topo.cc:545-556``), NICs at line rate
  (``topo.cc:416-418``);
* the topology search's result (channels and per-channel bandwidth), by a simplified
  version of ``ncclTopoCompute`` (``graph/search.cc:1074-1313``): rings at the fastest
  speed of NCCL's speed array the GPU's bandwidth allows, duplicated as
  ``ncclTopoDupChannels`` does. On DGX A100 and DGX H100 it reproduces the channel counts
  in public NCCL logs (24 on one server; 16 across servers).

NCCL's environment settings (NCCL_ALGO and NCCL_PROTO with NCCL's own list syntax,
NCCL_NVLS_ENABLE, the channel bounds NCCL_MIN/MAX_NCHANNELS and NCCL_MIN/MAX_CTAS) are
parsed by :mod:`simulator.library.nccl_env` and reach :func:`nccl_choice` as the
``algorithms`` and ``protocols`` it may pick from per call and as the channels of the
:class:`NcclSystem` (:meth:`~simulator.library.nccl_env.NcclEnv.apply`).

Not modelled: CollNet/SHARP in NCCL's choice (NCCL_COLLNET_ENABLE=1 is refused; the
collnet schedules run as given), tuner plugins but NCCL's example one (its CSV file,
NCCL_TUNER_CONFIG_FILE: :mod:`.nccl_tuner`), symmetric-memory and copy-engine
kernels (v2.27+), the CPU vendor (multi-node LL caps assume Intel), and LL128 forced by
NCCL_PROTO where NCCL would not enable it by default (NCCL then runs it; ccsim keeps it
off without NVLink).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import networkx as nx

from ..errors import CcsimError
from ..topology import servers_of_ranks
from ..topology.graph import gpu_nodes
from ..topology.stacks import stack_of
from .nccl_p2p import version_number
from .nccl_tuner import TunerConfig

#: NCCL's algorithms, in its own index order (include/nccl_common.h:72-90): ties in the
#: predicted time go to the lower index (enqueue.cc:2035-2044). CollNet is not modelled.
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")

# tuning.cc:150-155: base latency (us) per algorithm and protocol (LL, LL128, Simple).
BASE_LATENCY = {
    "Tree": (6.8, 14.0, 8.4),
    "Ring": (6.6, 14.0, 8.4),
    "CollNetDirect": (0.0, 0.0, 0.0),
    "CollNetChain": (0.0, 0.0, 0.0),
    "NVLS": (0.0, 0.0, 0.0),
    "NVLSTree": (0.0, 0.0, 0.0),
    "PAT": (8.0, 8.0, 8.0),
}
# tuning.cc:157-175: hardware latency (us) per hop class, algorithm and protocol.
HW_LATENCY = {
    "nvlink": {
        "Tree": (0.6, 1.25, 4.0),
        "Ring": (0.6, 1.9, 3.4),
        "CollNetDirect": (0.0, 0.0, 3.7),
        "CollNetChain": (0.0, 0.0, 2.8),
        "NVLS": (0.0, 0.0, 25.0),
        "NVLSTree": (0.0, 0.0, 25.0),
        "PAT": (0.0, 0.0, 4.0),
    },
    "pcie": {
        "Tree": (1.0, 1.9, 4.0),
        "Ring": (1.0, 2.5, 5.7),
        "CollNetDirect": (0.0, 0.0, 3.7),
        "CollNetChain": (0.0, 0.0, 2.8),
        "NVLS": (0.0, 0.0, 0.0),
        "NVLSTree": (0.0, 0.0, 0.0),
        "PAT": (0.0, 0.0, 4.0),
    },
    "network": {
        "Tree": (5.0, 8.5, 14.0),
        "Ring": (2.7, 4.0, 14.0),
        "CollNetDirect": (0.0, 0.0, 31.0),
        "CollNetChain": (0.0, 0.0, 30.0),
        "NVLS": (0.0, 0.0, 18.0),
        "NVLSTree": (0.0, 0.0, 20.9),
        "PAT": (0.0, 0.0, 14.0),
    },
}
# The first release whose NVLS / NVLSTree bandwidth model (nvlsEfficiency and
# perChMaxNVLSTreeBws) this module follows; earlier ones: :func:`_nvls_bandwidth_before_2_28`.
NVLS_MODEL_FROM = (28, 3)
# hwLatencies[NET][NVLSTree][Simple] before v2.28.3: 14 us (tuning.cc:77 at v2.22.3-1,
# :155 at v2.27.7-1; TUNING_RELEASES carries it from v2.28.3 on).
NVLS_TREE_NET_US_BEFORE_2_28 = 14.0
# hwLatencies[*][Tree][Simple] before v2.23.4: 28 us on NVLink, PCIe and the network
# (tuning.cc:67-75 at v2.22.3-1), 4 / 4 / 14 us from v2.23.4 (tuning.cc:67-75 at v2.23.4-1).
TREE_SIMPLE_US_BEFORE_2_23 = 28.0
# tuning.cc:178-183: LL bandwidth caps (GB/s), [row][nodes index: 1, 2, >2 nodes]. One
# node: the row of the GPU generation; several: the CPU vendor's row (Intel assumed).
LL_MAX_BW = {
    "volta": (39.0, 39.0, 20.4),
    "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0),
    "blackwell": (2 * 141.0, 2 * 45.0, 2 * 35.0),
}
LL_MAX_BW_INTEL = (39.0, 39.0, 20.4)
# tuning.cc:185-211: per-channel caps (GB/s) by generation and nodes index.
RING_LL128_MAX_BW = {
    "volta": (20.0,) * 3,
    "ampere": (20.0,) * 3,
    "hopper": (36.7,) * 3,
    "blackwell": (40.0,) * 3,
}
TREE_LL128_MAX_BW = {
    "volta": (20.0,) * 3,
    "ampere": (20.0,) * 3,
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
TREE_MAX_BW = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
NVLS_TREE_MAX_BW = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (0.0, 57.7, 45.5),
    "blackwell": (0.0, 96.0, 80.0),
}
# tuning.cc:139-144: share of NVLink bandwidth NVLS reaches.
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
# tuning.cc:226-233: network post overhead (us), x86 Intel.
NET_OVERHEAD_US = 1.0
# tuning.cc:620-655: bandwidth correction of Tree all-reduce by log2(bytes / 64).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}  # fmt: skip
# include/comm.h:49-51 and tuning.cc:587-616: bytes per thread below which NCCL drops
# channels, then threads; the ring LL threshold is multiplied by the rank count.
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# include/device.h:93-118 and tuning.cc:244-257: threads per channel.
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
NVLS_THREADS = 640
# enqueue.cc:585 at v2.30.7-1 (MinTrafficPerChannel): work is spread over channels in
# cells of at least 32 KiB of traffic; 16 KiB from v2.23.4 to v2.28.9 (enqueue.cc:539 at
# v2.27.3-1, :529 at v2.28.9-1), 32 KiB from v2.29.2 (enqueue.cc:576 at v2.29.2-1).
MIN_TRAFFIC_PER_CHANNEL = 32 * 1024
MIN_TRAFFIC_PER_CHANNEL_BEFORE_2_29 = 16 * 1024
# include/device.h:91 (MAXCHANNELS); graph search's ring limit is MAXCHANNELS/2.
MAX_CHANNELS = 64
# include/device.h:213: NVLS heads (channels of the NVLS search graph) at most.
NVLS_MAX_ARITY = 32
# include/device.h:199: CollNet Direct's arity; a server runs it with at most
# NCCL_MAX_DIRECT_ARITY + 1 = 8 GPUs, and CollNet Chain too (enqueue.cc:2000-2003).
NCCL_MAX_DIRECT_ARITY = 7
# tuning.cc:250-251 and 594-595: CollNet runs NCCL_MAX_NTHREADS threads a channel, and
# trims channels below 512 bytes a thread.
COLLNET_THREADS = 640
COLLNET_THREAD_THRESHOLD = 512
# transport/nvls.cc:210-214: NVLS channels (CTAs); across Blackwell servers
# :func:`blackwell_nvls_channels`. Not followed: NVLSTree's largest chunk,
# nvlsTreeMaxChunkSize (64 KiB from 4 servers on, transport/nvls.cc:226-232): with it
# ccsim's 4- and 8-server H100 plateaus fall 25-30% below the bundled runs (the chunk's
# per-message costs were set at 128 KiB), so the policy keeps NCCL_NVLS_CHUNKSIZE (128
# KiB unless the user sets it, simulator.collective.policy.nvls_chunk).
NVLS_CHANNELS = {"hopper": (16, 16), "blackwell": (24, 32)}  # (one node, several)

# NVLS all-reduce inside one NVLink domain, thread block by thread block
# (device/all_reduce.h:390-455 at v2.30.7, the oneNode branch without registered
# buffers): each NVLS channel is one thread block of 640 threads split into roles that
# run as a pipeline over the channel's loops: a scatter group (8 warps) copies the
# channel's nHeads chunks of the loop from the user buffer into the NVLS buffer, the
# head's reduce group (5 warps when nRanks > 6) reduces its chunk in the switch
# (multimem.ld_reduce) and multicasts the sum (multimem.st), and a gather group
# (7 warps) copies the nHeads reduced chunks out. Every step of every role waits for
# its peers' step counters (the reduce group through multimem.ld_reduce.min over every
# rank's counter, prims_simple.h:84-99), copies, and posts its counter after a
# system-scope fence (prims_simple.h:165-172), so a loop costs a role at least one
# synchronisation plus its copy of nHeads x chunk bytes by one thread block; chunks are
# cut to 32 or 16 KiB at middle sizes (enqueue.cc:2262-2274), which is where that cost
# shows. NCCL's model has no such term: its NVLS latency is one figure per call
# (25 us, tuning.cc:157-175).
# FITTED on Blackwell runs: one thread block copies nHeads x chunk at NVLS_CTA_GBPS,
# and a step's synchronisation costs NVLS_STEP_US = a + b x nHeads us (the reduce
# group's counter poll spans every rank: 9.8 us with 8 heads, 30.2 us with 32). The
# values are the grid point (GB/s 24/28.5/33, a 3/5/7, b 0.6/0.85/1.1) with the least
# summed squared log time error over the sizes >= 1 MiB of B200-1N-AR-Vultr and
# GB300-16N-AR-oci-quickstart (ccsim validate); README gives the leave-one-case-out
# errors. FITTED on Hopper likewise, on the sizes the two single-server Hopper runs with
# middle sizes run as NVLS (H100-1N-AR-dgxc, H200-1N-AR-azure-nvls: 1 MiB-1 GiB) over
# GB/s 28.5/33/40/50 x a 1/3/5 x b 0.3/0.6/0.85: the same 28.5 GB/s a block, a shorter
# step (3 + 0.3 us per head: 5.4 us with 8 heads against Blackwell's 9.8); left out, each
# run's choice from the other is 33 GB/s with 1 + 0.6 us (without the H100 run) and 28.5
# GB/s with 5 + 0.3 us (without the H200 run). The surface is flat: eight grid points lie
# within 35% of the least error, which is a third of the error without a bound.
NVLS_CTA_GBPS = {"blackwell": 28.5, "hopper": 28.5}
NVLS_STEP_US = {"blackwell": (3.0, 0.85), "hopper": (3.0, 0.3)}
# Not applied across servers. NVLSTree's kernel splits a block's 20 warps
# (NCCL_MAX_NTHREADS 640, include/device.h:93) otherwise than NVLS's: where the channel's
# head has a tree parent, 6 scatter, 5 gather, 5 reduce and 4 network-receive warps; at
# the tree's root and in one-server NVLS 8, 7, 5 and 0 (device/all_reduce.h:395-399 and
# 538-542 at v2.30.7-1, the same at v2.23.4-1). Scatter and gather each move nHeads x
# chunk a loop, so if a block's copy rate scaled with its warps the gather would bind at
# 5/7 of NVLS_CTA_GBPS (20.4 GB/s). Even so the 2-server loops stay link-bound at large
# sizes: Hopper, 16 channels x 8 heads x 128 KiB, 5.4 + 51.5 = 56.9 us of one block
# against the links' 59.9 us a loop; Blackwell, 32 x 8 x 128 KiB, 61.3 against 70.7
# (512 KiB chunks: 215.8 against 282.7). So that bound cannot explain the 2-server
# NVLSTree plateaus 5-8% below the links' (issue 32, session h50h), and is not modelled.
#: The ``ccsim validate`` runs these constants were chosen on.
NVLS_FITTED_TO = (
    "B200-1N-AR-Vultr",
    "GB300-16N-AR-oci-quickstart",
    "H100-1N-AR-dgxc",
    "H200-1N-AR-azure-nvls",
)

# tuning.cc:331 (v2.30.7; the same line at v2.22.3): a Tree whose search settled on
# NCCL_TOPO_PATTERN_TREE (all of a node's network traffic through one GPU) is credited
# 0.85 of its bandwidth. The search falls back to that pattern from the balanced tree on
# Hopper and later (search.cc:1215-1219, "Try a simpler tree", ccMin >= 90) and with one
# GPU per node (search.cc:1133). Public logs show it across servers on Hopper: the trees
# of NVIDIA/nccl-tests#319 (2 x 8 H100, NCCL 2.26.2) and NVIDIA/nccl#1357 (2 x 8 H100, 4
# NICs) put a node's parent and network child on one GPU, and the times NCCL printed in
# NVIDIA/nccl#1453 (3 x 8 H100, 2.22.3) are the balanced-tree model's at 0.85 bandwidth.
TREE_PATTERN_FACTOR = 0.85

# graph/search.cc:1051-1067: per-channel speeds (GB/s) the topology search tries.
SPEEDS_INTRA = {
    "old": (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
    "hopper": (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3),
    "blackwell": (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18),
}
SPEEDS_INTER = {
    "old": (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
    "hopper": (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
    "blackwell": (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2,
                  0.24, 0.12),
}  # fmt: skip
# graph/topo.h:17-39: NCCL's per-NVLink figure against the link's line rate.
NVLINK_SHARE = {
    "volta": 20.0 / 25,
    "ampere": 20.0 / 25,
    "hopper": 20.6 / 25,
    "blackwell": 40.1 / 50,
}
# NVLink line rate per link (GB/s per direction): NVLink2/3/4 25, NVLink5 50.
NVLINK_LINE_GBPS = {"volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}
# NCCL's per-NVLink figure (GB/s): SM70/SM80_NVLINK_BW, SM90_NVLINK_BW, SM100_NVLINK_BW.
NVLINK_GBPS = {arch: NVLINK_SHARE[arch] * NVLINK_LINE_GBPS[arch] for arch in NVLINK_SHARE}
# graph/topo.cc:545-556: PCIe as width x speed / 80 = 0.762 of the line rate per direction.
PCIE_SHARE = 48.0 / 63.0


@dataclass(frozen=True)
class TuningRelease:
    """Tuning figures that changed between the NCCL releases whose tuning model is
    otherwise the one this module follows (v2.28.3 to v2.30.7: the same formulas in
    tuning.cc, these values differ). ``first`` is the first release (minor, patch) that
    has them."""

    first: tuple[int, int]
    #: perChMaxRingLL128Bws and perChMaxNVLSTreeBws, Blackwell row (GB/s, N1/N2/N4).
    ring_ll128_max_bw: tuple[float, float, float]
    nvls_tree_max_bw: tuple[float, float, float]
    #: hwLatencies[NET][NVLSTree][Simple] (us).
    nvls_tree_net_us: float


#: Each release's figures, oldest first, read at its tag (``vX.Y.Z-1``): tuning.cc lines
#: 179, 197 and 165 at v2.28.3; tuning.cc:179 at v2.28.7 (ring LL128 N2 34.6); tuning.cc
#: 197 and 165 at v2.28.9 (NVLSTree N4 43.8, NET 20.9 us); tuning.cc:179 at v2.29.2 (ring
#: LL128 34.5/34.6/34.5); tuning.cc:180 at v2.29.7 (ring LL128 40); tuning.cc:205 at
#: v2.30.3 (NVLSTree N4 80), unchanged to v2.30.7, the release the tables above follow. A
#: release before v2.28.3 takes these figures from v2.30.7 but prices NVLS and NVLSTree
#: with its own formulas (:func:`_nvls_bandwidth_before_2_28`, NVLSTree's network
#: latency 14 us); before v2.23.4 also Tree/Simple's 28 us steps and a ring all-reduce's
#: 2 x nNodes network steps (:func:`_latency`). Its other differences (e.g. Ring/LL128 at
#: 0.7 with one GPU a node at v2.22.3, tuning.cc:179) are not followed.
#: Not versioned: the search's speed arrays (sm100SpeedArrayInter gained 80 at v2.29.7
#: and 86 at v2.30.3, search.cc:988 and 996; the intra one 45 at v2.29.2, search.cc:986).
#: They act only through :func:`nccl_system`'s simplified search, which keeps every NVLS
#: head across servers where NCCL forces all heads only inside one (minChannels =
#: maxChannels when system->inter == 0, search.cc:1069-1072 at v2.29.2): with v2.28.9's
#: array it would give the 2-server B300 run (2.28.9) 8 heads x 48 GB/s and a Ring where
#: NCCL may keep fewer heads at 96, and its measured NIC-rate plateau (766 GB/s) says
#: NVLSTree.
TUNING_RELEASES = (
    TuningRelease((28, 3), (73.4, 73.4, 73.4), (0.0, 96.0, 43.1), 14.0),
    TuningRelease((28, 7), (73.4, 34.6, 73.4), (0.0, 96.0, 43.1), 14.0),
    TuningRelease((28, 9), (73.4, 34.6, 73.4), (0.0, 96.0, 43.8), 20.9),
    TuningRelease((29, 2), (34.5, 34.6, 34.5), (0.0, 96.0, 43.8), 20.9),
    TuningRelease((29, 7), (40.0, 40.0, 40.0), (0.0, 96.0, 43.8), 20.9),
    TuningRelease((30, 3), RING_LL128_MAX_BW["blackwell"], NVLS_TREE_MAX_BW["blackwell"],
                  HW_LATENCY["network"]["NVLSTree"][2]),
)  # fmt: skip


def tuning_release(version: str | None) -> TuningRelease:
    """The tuning figures of NCCL ``version`` (None: the modelled v2.30.7).

    >>> tuning_release("2.29.2").ring_ll128_max_bw, tuning_release(None).ring_ll128_max_bw
    ((34.5, 34.6, 34.5), (40.0, 40.0, 40.0))
    >>> tuning_release("2.27.3") == tuning_release("2.30.7")  # before v2.28.3: v2.30.7's
    True
    """
    number = version_number(version)
    if number < TUNING_RELEASES[0].first:
        return TUNING_RELEASES[-1]
    return [release for release in TUNING_RELEASES if release.first <= number][-1]


_ARCH_PATTERNS = (
    ("blackwell", r"B100|B200|B300|GB200|GB300|RTX[- ]?50\d\d"),
    ("hopper", r"H100|H200|H800|H20\b|H20-|GH200"),
    ("ampere", r"A100|A800|A30|A40|A10\b|RTX[- ]?30\d\d|RTX[- ]?A\d"),
    ("volta", r"V100"),
)

#: NCCL's algorithm name -> the ccsim schedule that runs it.
SCHEDULES = {
    "Ring": "ring",
    "Tree": "chain-tree",
    "CollNetDirect": "collnet-direct",
    "CollNetChain": "collnet-chain",
    "NVLS": "nvls",
    "NVLSTree": "nvls-tree",
    "PAT": "ring",
}


@dataclass(frozen=True)
class SearchGraph:
    """One result of NCCL's topology search: channels and GB/s per channel."""

    channels: int
    bw_intra: float
    bw_inter: float


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL knows about a communicator when it builds its tuning table."""

    arch: str
    ranks: int
    nodes: int
    nvlink: bool  # GPUs of a server talk over NVLink (typeIntra NVL)
    ring: SearchGraph
    tree: SearchGraph
    nvls: SearchGraph | None  # None: no NVLink SHARP
    channels: int  # execution channels (comm->nChannels)
    nvls_channels: int
    #: NVLinks of a GPU as NCCL counts them (path bandwidth / its per-link figure), and
    #: the NICs of a GPU with their GB/s in all: what NCCL's p2p channels follow.
    nvlinks: int = 0
    net_count: int = 0
    net_gbps: float = 0.0
    #: Whether NCCL's tree search ends on NCCL_TOPO_PATTERN_TREE (see
    #: :data:`TREE_PATTERN_FACTOR`): across servers on Hopper and later, or one GPU a node.
    simple_tree: bool = False
    #: NCCL settings the network stack's vendor setup exports (NCCL's syntax; "" for
    #: none): the defaults a job runs with there (:mod:`simulator.topology.stacks`).
    stack_nccl: str = ""
    #: CollNet's search graphs where the fabric reduces in the network (SHARP) across
    #: servers (None elsewhere), and whether NCCL_COLLNET_ENABLE=1 turns CollNet on
    #: (:meth:`~simulator.library.nccl_env.NcclEnv.apply`; NCCL's default is off).
    collnet_direct: SearchGraph | None = None
    collnet_chain: SearchGraph | None = None
    collnet: bool = False
    #: Local ranks of the NVLS heads across servers, where they are not the first ones
    #: (``()``: local ranks 0..heads-1; :func:`nvls_head_ranks`).
    nvls_head_ranks: tuple[int, ...] = ()
    #: The NCCL release whose tuning figures apply (:func:`tuning_release`; None: v2.30.7).
    version: str | None = None
    #: The hosts' CPU as NCCL classes it (comm->cpuArch): "arm" or "x86" (:func:`host_cpu`).
    cpu: str = "x86"

    @property
    def ppn(self) -> float:
        """Ranks per node."""
        return self.ranks / self.nodes


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's decision for one call, and the predicted times it chose from (us)."""

    algorithm: str
    protocol: str
    channels: int
    threads: int
    time_us: float
    table: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)
    #: The line of the tuner file whose rule made this choice; 0: NCCL's own model.
    tuner_line: int = 0

    @property
    def schedule(self) -> str:
        """The ccsim algorithm that runs NCCL's choice."""
        return SCHEDULES[self.algorithm]


def gpu_arch(model: str | None) -> str:
    """NCCL's compute-capability class for a GPU model name (Ampere when unknown).

    >>> gpu_arch("H100-SXM5-80GB"), gpu_arch("A100-SXM4-80GB"), gpu_arch("RTX-5090")
    ('hopper', 'ampere', 'blackwell')
    """
    for arch, pattern in _ARCH_PATTERNS:
        if model and re.search(pattern, str(model), re.IGNORECASE):
            return arch
    return "ampere"


#: GPU models that come on a Grace (Arm, Neoverse V2) host: NVIDIA's Grace Hopper and
#: Grace Blackwell superchips pair each GPU with a Grace CPU (GH200, GB200 and GB300
#: datasheets), so NCCL's topology reads an Arm CPU there (NCCL_TOPO_CPU_ARCH_ARM,
#: graph.h:77 at v2.30.4-1).
_ARM_HOSTS = r"GH200|GB200|GB300"


def host_cpu(model: str | None) -> str:
    """The CPU of the host a GPU model comes on, as NCCL classes it: "arm" for NVIDIA's
    Grace superchips, "x86" otherwise (every other bundled preset is an x86 server).

    >>> host_cpu("GB200-NVL72"), host_cpu("B200-SXM"), host_cpu(None)
    ('arm', 'x86', 'x86')
    """
    return "arm" if model and re.search(_ARM_HOSTS, str(model), re.IGNORECASE) else "x86"


def _speeds(arch: str, inter: bool) -> tuple[float, ...]:
    table = SPEEDS_INTER if inter else SPEEDS_INTRA
    return table["blackwell" if arch == "blackwell" else "hopper" if arch == "hopper" else "old"]


def _search(speeds, max_bw: float, total_bw: float, per_ring: float, rings_cap: int, arch: str,
            dup: bool = True) -> SearchGraph:  # fmt: skip
    """Simplified ncclTopoCompute for a ring: the speed s with the most ``channels x s``
    (ties to the faster one; search.cc:445-468), trying lower speeds while they stay above
    0.49 of the first (search.cc:1196-1252), then ncclTopoDupChannels (search.cc:1036-1049).
    ``per_ring`` is how much of ``total_bw`` one ring at speed s uses per s."""
    # NCCL's bandwidths are floats; 1e-6 keeps 48/63 x 63 GB/s at 48.
    start = next(
        (s for s in speeds if s <= max_bw + 1e-6 and s * per_ring <= total_bw + 1e-6), speeds[-1]
    )
    best = (0.0, 0, start)
    for s in speeds:
        if s > start or s / start <= 0.49:
            continue
        n = min(rings_cap, max(1, math.floor(total_bw / (s * per_ring) + 1e-6)))
        if n * s > best[0] + 1e-9:
            best = (n * s, n, s)
    _, n, s = best
    if dup and s >= 25.0 and not (arch in ("hopper", "blackwell") and s < 50.0 and n > 4):
        doubled = min(2 * n, MAX_CHANNELS // 2)
        s, n = s / math.ceil(doubled / n), doubled
    return SearchGraph(n, float(s), float(s))


def nccl_system(graph: nx.Graph, version: str | None = None) -> NcclSystem:
    """The inputs of NCCL's tuning model for a communicator over every GPU of ``graph``,
    as NCCL ``version`` builds them (None: v2.30.7; :func:`tuning_release`)."""
    gpus = sorted(gpu_nodes(graph), key=lambda node: graph.nodes[node]["rank"])
    if len(gpus) < 2:
        raise CcsimError("NCCL's model needs at least 2 GPUs")
    servers = servers_of_ranks(graph)
    nodes = len(set(servers)) if servers is not None else 1
    arch = gpu_arch(graph.nodes[gpus[0]].get("model"))
    first = gpus[0]
    nvlink = pcie = 0.0
    for _, _, data in graph.edges(first, data=True):
        kind = str(data.get("link", "")).lower()
        if kind in ("nvlink", "hccs"):
            nvlink += data["bandwidth"] / 1e9
        elif kind == "pcie":
            pcie = max(pcie, data["bandwidth"] / 1e9)
    nvlink *= NVLINK_SHARE[arch]
    pcie *= PCIE_SHARE
    has_nvlink = nvlink > 0
    total = max(nvlink, pcie)
    per_server = len(gpus) // nodes
    net_max_bw = 0.0  # the network's fastest path a GPU has, NCCL's system->maxBw
    if nodes == 1:
        max_bw = nvlink if has_nvlink else pcie
        ring = _search(_speeds(arch, False), max_bw, total, 1.0, MAX_CHANNELS // 2, arch)
    else:
        # Every rank searches its own server's graph, and the communicator keeps the least
        # channel count and speeds any rank found (init.cc:1439-1442), so a server whose
        # NICs' ports are slower sets the rings of all; servers alike are searched once.
        share = (per_server - 1) / per_server if per_server > 1 else 1.0
        rings = []
        for nics in sorted(set(map(tuple, _nics_by_server(graph).values()))):
            if not nics or not any(nics):
                raise CcsimError("a server has no NIC: NCCL cannot run across servers")
            max_bw = min(max(nics), pcie) if pcie else max(nics)
            net_max_bw = min(net_max_bw, max_bw) if net_max_bw else max_bw
            # One ring per NIC (graph search over NETs, search.cc:1155-1184).
            # A ring crosses each GPU's NVLinks on all hops but the one to the NIC.
            found = _search(_speeds(arch, True), max_bw, total, share, len(nics), arch)
            count = min(found.channels, len(nics) * max(1, found.channels // len(nics)))
            rings.append(SearchGraph(count, found.bw_intra, found.bw_inter))
        ring = SearchGraph(min(r.channels for r in rings), min(r.bw_intra for r in rings),
                           min(r.bw_inter for r in rings))  # fmt: skip
    # The tree search is forced to the ring's channel count (init.cc:1184-1185).
    tree = SearchGraph(ring.channels, ring.bw_intra, ring.bw_inter)
    nvls = None
    nvls_switch = any(
        data.get("kind") == "nvswitch" and data.get("nvls") for _, data in graph.nodes(data=True)
    )
    if nvls_switch and arch in ("hopper", "blackwell") and has_nvlink:
        # NVLS search: one head per GPU, at most NCCL_MAX_NVLS_ARITY = 32 of them
        # (include/device.h:213; search.cc:1126-1127); each head's channel loads every
        # GPU's NVLink with bw and its own head's twice (search.cc:410-428), so a GPU
        # moves (heads + 1) x bw through its NVLinks.
        # Across servers a head is a GPU with a NIC of its own: the search pairs each NIC
        # with its local GPU, at most one head per GPU and one per NIC (search.cc:754-771,
        # "NVLS search only tries to find NIC:GPU combinations to compute the heads"), so
        # a server with 4 NICs for 8 GPUs has 4 heads (the "NVLS Head 0-3" of the 2 x 8
        # H100, 4-NIC log in NVIDIA/nccl#1357).
        # Its own search (init.cc:1209-1215), from the network's speed as every search
        # starts (search.cc:1172-1179), not the ring's: the ring's channel duplication,
        # which halves its speed, skips the NVLS graph (ncclTopoDupChannels,
        # search.cc:1038, all at v2.30.7-1).
        speeds = _speeds(arch, nodes > 1)
        cap = net_max_bw if nodes > 1 else max(speeds)
        heads = min(per_server, NVLS_MAX_ARITY)
        if nodes > 1:
            heads = min(heads, len(_server_nics(graph, graph.nodes[first].get("server"))))
        intra = next(
            (s for s in speeds if s * (heads + 1) <= nvlink + 1e-6 and s <= cap + 1e-6), 0.0
        )
        inter = min(cap, max(s for s in speeds if s <= 2 * intra + 1e-6)) if intra else 0.0
        nvls = SearchGraph(heads, float(intra), float(inter)) if intra else None
    head_ranks: tuple[int, ...] = ()
    if nvls is not None and nodes > 1:
        head_ranks = nvls_head_ranks(graph, graph.nodes[first].get("server"), nvls.channels)
    channels = min(MAX_CHANNELS, 2 * min(ring.channels, tree.channels))  # connect.cc:460
    if arch in ("hopper", "blackwell") and nodes > 1 and ring.bw_intra > 45.0 and channels < 16:
        channels = min(MAX_CHANNELS, 2 * channels)  # connect.cc:480-483
    server = graph.nodes[first].get("server")
    nics = _server_nics(graph, server)
    nvls_channels = NVLS_CHANNELS.get(arch, (0, 0))[nodes > 1] if nvls else 0
    if nvls and arch == "blackwell" and nodes > 1:
        # By the slowest NIC of any rank (comm->minNetBw, init.cc:1433-1450).
        slowest = min(min(rates) for rates in _nics_by_server(graph).values())
        nvls_channels = blackwell_nvls_channels(nodes, per_server, slowest, version)
    net_count = max(1, round(len(nics) / per_server)) if nics else 0
    net_gbps = sum(nics) / per_server  # a GPU's share of its server's NICs
    # NCCL counts NVLinks as path bandwidth over its per-link figure (paths.cc:827-831).
    nvlinks = int(nvlink / NVLINK_GBPS[arch] + 1e-6)
    # The tree search's pattern (search.cc:1133, 1215-1219): the balanced tree is kept
    # within one server (no network to balance) and before Hopper.
    simple_tree = nodes > 1 and (arch in ("hopper", "blackwell") or per_server == 1)
    # The vendor's profile of the network stack is what jobs across servers export
    # (Google's TCPXO scripts source it for multi-VM runs); one server runs NCCL's own.
    stack = stack_of(graph) if nodes > 1 else None
    direct = chain = None
    sharp = any(data.get("sharp") for _, data in graph.nodes(data=True))
    if nodes > 1 and sharp:
        nvswitch = any(data.get("kind") == "nvswitch" for _, data in graph.nodes(data=True))
        direct, chain = collnet_graphs(arch, ring, total, per_server, len(nics), nvswitch)
    return NcclSystem(arch, len(gpus), nodes, has_nvlink, ring, tree, nvls, channels,
                      nvls_channels, nvlinks, net_count, net_gbps, simple_tree,
                      stack.nccl if stack is not None else "", direct, chain,
                      nvls_head_ranks=head_ranks, version=version,
                      cpu=host_cpu(graph.nodes[first].get("model")))  # fmt: skip


def nvls_head_ranks(graph: nx.Graph, server, heads: int) -> tuple[int, ...]:
    """Local ranks of ``server``'s NVLS heads across servers: NCCL's NVLS search pairs
    each NIC, in order, with the first GPU next to it, one head per GPU
    (``ncclTopoGetLocalGpu``, graph/topo.cc:1477-1500 at v2.26.2-1; search.cc
    ``ncclTopoSearchRecNet``, "NVLS search only tries to find NIC:GPU combinations"), so
    a server of 8 GPUs with a NIC for every two has heads 0, 2, 4 and 6 ("NVLS Head 0-3"
    on ranks 0, 2, 4, 6 in the 2 x 8 H100, 4-NIC log of NVIDIA/nccl#1357). ``()`` where
    they are the first ``heads`` local ranks (a NIC per GPU), or where a NIC is not
    linked to a GPU of its own (behind a PCIe switch: not resolved here).

    >>> from simulator.topology import load_topology
    >>> graph = load_topology("a3-high", 2)
    >>> nvls_head_ranks(graph, graph.nodes["s0/gpu0"]["server"], 4)
    (0, 2, 4, 6)
    >>> graph = load_topology("dgx-h100", 2)
    >>> nvls_head_ranks(graph, graph.nodes["s0/gpu0"]["server"], 8)
    ()
    """
    ranks = sorted(
        data["rank"] for _, data in graph.nodes(data=True)
        if data.get("kind") == "gpu" and data.get("server") == server
    )  # fmt: skip
    local = {rank: index for index, rank in enumerate(ranks)}
    found: list[int] = []
    for node, data in graph.nodes(data=True):
        if data.get("kind") != "nic" or data.get("server") != server:
            continue
        near = [
            local[graph.nodes[other]["rank"]]
            for other in graph.neighbors(node)
            if graph.nodes[other].get("kind") == "gpu" and graph.nodes[other]["rank"] in local
        ]
        if not near:
            return ()
        for index in sorted(near):
            if index not in found:
                found.append(index)
                break
    found = found[:heads]
    return () if found == list(range(len(found))) or len(found) < heads else tuple(found)


def collnet_graphs(
    arch: str, ring: SearchGraph, nvlink_gbps: float, per_server: int, nics: int, nvswitch: bool
) -> tuple[SearchGraph | None, SearchGraph | None]:
    """CollNet's search graphs across servers whose fabric reduces in the network
    (init.cc:1189-1206 at v2.30.7), simplified as :func:`_search` is: (CollNet Direct,
    CollNet Chain).

    Both search at the inter-node speeds (search.cc:1051-1067) with the ring's network
    speed, and raise their NVLink speed while it stays below twice that and the links
    allow it ("increase bwIntra for trees (2 nodes or collnet)", search.cc:1280-1284).
    Chain: the tree pattern on the ring's channels (minChannels = maxChannels = the
    ring's), each channel's chain entering and leaving every GPU once. Direct: one
    channel (head) per NIC with a local GPU, at most NCCL_MAX_DIRECT_ARITY + 1 = 8 and one
    per GPU (search.cc:754-771, 1129-1131); a head sends its channel's data to, and
    receives it from, every other GPU of its server at 1/(n - 1) of the speed each
    (ncclTopoSearchTryCollnetDirect, search.cc:373-407), so a GPU's NVLinks carry
    (1 + (heads - 1)/(n - 1)) x the speed. Direct needs an NVSwitch (tuning.cc:508-509)
    and more than one GPU a server.

    >>> direct, chain = collnet_graphs("hopper", SearchGraph(16, 24.0, 24.0), 370.8, 8, 8, True)
    >>> (direct.channels, direct.bw_intra), (chain.channels, chain.bw_intra)
    ((8, 48), (16, 22))
    """
    speeds = _speeds(arch, True)
    inter = ring.bw_inter

    def raised(load: float) -> float:
        # The largest speed up to twice the network's that the NVLinks carry at ``load``
        # times the speed (the slowest speed where none does).
        fits = [s for s in speeds if s <= 2 * inter + 1e-6 and s * load <= nvlink_gbps + 1e-6]
        return max(fits) if fits else min(speeds)

    chain = SearchGraph(ring.channels, raised(ring.channels), inter)
    direct = None
    heads = min(nics, per_server, NCCL_MAX_DIRECT_ARITY + 1)
    if nvswitch and per_server > 1 and heads >= 1:
        direct = SearchGraph(heads, raised(1 + (heads - 1) / (per_server - 1)), inter)
    return direct, chain


def _server_nics(graph: nx.Graph, server) -> list[float]:
    """The GB/s of each NIC of ``server`` as NCCL sees it (:func:`_port_gbps`)."""
    return _nics_by_server(graph).get(server, [])


def _nics_by_server(graph: nx.Graph) -> dict:
    """Each server's NIC speeds (GB/s, in graph order) as NCCL sees them: a NIC's port
    speed, which it reads from ``ibv_query_port`` (transport/net_ib/init.cc:405-411 at
    v2.30.7), so a measured rate set on the topology (``port_bandwidth`` kept beside it,
    :mod:`simulator.topology.rates`) does not change NCCL's choice."""
    out: dict = {}
    for _, data in graph.nodes(data=True):
        if data.get("kind") == "nic":
            rate = data.get("port_bandwidth", data.get("bandwidth"))
            out.setdefault(data.get("server"), []).append((rate or 0.0) / 1e9)
    return out


# The first release that sizes NVLSTree's channels across Blackwell servers by the NICs
# (ncclNvlsTreeSm100Tuning: absent at v2.29.7-1, transport/nvls.cc:158 and 211 at
# v2.30.3-1). Before it every Blackwell communicator spanning several nodes runs
# NVLS_NCHANNELS_SM100 = 32 (transport/nvls.cc:148 and 193 at v2.27.3-1, the same rule
# at v2.26.2-1 and v2.29.7-1).
NVLS_SM100_TUNING_FROM = (30, 3)


def blackwell_nvls_channels(
    nodes: int, ppn: int, nic_gbps: float, version: str | None = None
) -> int:
    """NVLS channels (CTAs) of NVLSTree across Blackwell servers, by the slowest NIC
    (GB/s) and GPUs per server (ncclNvlsTreeSm100Tuning, transport/nvls.cc:164-200 at
    v2.30.7; 32 when no rule applies, NVLS_NCHANNELS_SM100), at NCCL ``version`` (None:
    the modelled v2.30.7; a release before v2.30.3 has no such rule and runs 32,
    :data:`NVLS_SM100_TUNING_FROM`). The chunk sizes the same function sets are not
    followed (see :data:`NVLS_CHANNELS`).

    >>> blackwell_nvls_channels(2, 8, 50.0), blackwell_nvls_channels(4, 8, 50.0)
    (32, 24)
    >>> blackwell_nvls_channels(4, 8, 100.0), blackwell_nvls_channels(4, 72, 100.0)
    (24, 32)
    >>> blackwell_nvls_channels(3, 64, 48.0, "2.27.3"), blackwell_nvls_channels(3, 64, 48.0)
    (32, 24)
    """
    if version_number(version) < NVLS_SM100_TUNING_FROM:
        return NVLS_CHANNELS["blackwell"][1]
    if nodes == 2 and nic_gbps >= 48.0:
        return 32
    if nic_gbps >= 96.0:
        return 24 if ppn <= 8 else 32
    if nic_gbps >= 48.0:
        return 24
    return NVLS_CHANNELS["blackwell"][1]


def _index2(nodes: int) -> int:
    return 0 if nodes == 1 else 1 if nodes == 2 else 2  # tuning.cc:267


def _enabled(system: NcclSystem, op: str, algorithm: str, protocol: str) -> bool:
    """tuning.cc:288-304 and 498-536, enqueue.cc:1989-2026."""
    if algorithm in ("CollNetDirect", "CollNetChain"):
        # Only with NCCL_COLLNET_ENABLE=1 on a SHARP fabric (tuning.cc:503-509), Simple
        # only (tuning.cc:338-339), at most 8 GPUs a server (enqueue.cc:2000-2003), and
        # for all-reduce: broadcast and reduce run rings only (tuning.cc:293), and
        # all-gather / reduce-scatter need the CollNet plugin's iallgather /
        # ireducescatter and a NIC per GPU (tuning.cc:351-373), not modelled.
        graph = system.collnet_direct if algorithm == "CollNetDirect" else system.collnet_chain
        return (
            system.collnet
            and graph is not None
            and protocol == "Simple"
            and op == "all_reduce"
            and system.ppn <= NCCL_MAX_DIRECT_ARITY + 1
        )
    if op in ("broadcast", "reduce") and algorithm != "Ring":
        return False
    if op in ("all_gather", "reduce_scatter") and algorithm not in ("PAT", "Ring", "NVLS"):
        return False
    if op == "all_reduce" and algorithm == "PAT":
        return False
    if algorithm in ("NVLS", "NVLSTree", "PAT") and protocol != "Simple":
        return False
    if algorithm in ("NVLS", "NVLSTree") and system.nvls is None:
        return False
    if algorithm == "NVLS" and system.nodes > 1:
        return False  # multi-node NVLS needs CollNet (SHARP), not modelled
    if algorithm == "NVLSTree" and system.nodes == 1:
        return False
    if algorithm == "PAT" and system.nodes != system.ranks:
        return False  # ncclPatEnable: one GPU per node (tuning.cc:215-223)
    # LL128 only where GPUs talk over NVLink (tuning.cc:514-536).
    return not (protocol == "LL128" and not system.nvlink)


def _ring_ll128_max_bw(system: NcclSystem) -> tuple[float, float, float]:
    """perChMaxRingLL128Bws for the system's GPUs, at its NCCL release on Blackwell."""
    if system.arch == "blackwell":
        return tuning_release(system.version).ring_ll128_max_bw
    return RING_LL128_MAX_BW[system.arch]


def _nvls_tree_max_bw(system: NcclSystem) -> tuple[float, float, float]:
    """perChMaxNVLSTreeBws for the system's GPUs, at its NCCL release on Blackwell."""
    if system.arch == "blackwell":
        return tuning_release(system.version).nvls_tree_max_bw
    return NVLS_TREE_MAX_BW[system.arch]


def _nvls_bandwidth_before_2_28(
    system: NcclSystem, op: str, algorithm: str, graph: SearchGraph
) -> float:
    """NVLS and NVLSTree algorithm bandwidth (GB/s) before v2.28.3, which had neither
    nvlsEfficiency nor perChMaxNVLSTreeBws: the NVLS search graph's speed, min(bwIntra,
    bwInter) for NVLS and min(bwIntra, bwInter / 2 beyond two nodes) for NVLSTree, times
    its channels and 5/6 for every operation (tuning.cc:173-174 and 214 at v2.22.3-1, the
    same lines to v2.26.2-1 :251-252 and 293); from v2.27.3 NVLS all-gather and
    reduce-scatter take min(bwIntra (ppn - 1) / ppn, 0.9 bwInter) (tuning.cc:267-275 at
    v2.27.3-1).

    >>> system = NcclSystem("hopper", 24, 3, True, SearchGraph(8, 24.0, 24.0),
    ...                     SearchGraph(8, 24.0, 24.0), SearchGraph(8, 24.0, 25.0), 16, 16,
    ...                     version="2.22.3")
    >>> round(_nvls_bandwidth_before_2_28(system, "all_reduce", "NVLSTree", system.nvls), 2)
    83.33
    """
    if algorithm == "NVLS":
        if op != "all_reduce" and version_number(system.version) >= (27, 3):
            bw = min(graph.bw_intra * (system.ppn - 1) / system.ppn, graph.bw_inter * 0.9)
        else:
            bw = min(graph.bw_intra, graph.bw_inter)
    else:
        bw = min(graph.bw_intra, graph.bw_inter if system.nodes <= 2 else graph.bw_inter / 2)
    return graph.channels * bw * 5.0 / 6.0


def _bandwidth(system: NcclSystem, op: str, algorithm: str, protocol: str) -> float:
    """Algorithm bandwidth (GB/s) NCCL assigns, tuning.cc:305-383."""
    graph = {
        "Ring": system.ring,
        "Tree": system.tree,
        "PAT": system.ring,
        "CollNetDirect": system.collnet_direct,
        "CollNetChain": system.collnet_chain,
    }.get(algorithm, system.nvls)
    assert graph is not None
    i2 = _index2(system.nodes)
    arch = system.arch
    collnet = algorithm in ("CollNetDirect", "CollNetChain")
    bw = graph.bw_intra if system.nodes <= 2 or collnet else graph.bw_inter
    channels = graph.channels
    if algorithm in ("NVLS", "NVLSTree"):
        if channels < 2:
            return 0.0
        if version_number(system.version) < NVLS_MODEL_FROM:
            return _nvls_bandwidth_before_2_28(system, op, algorithm, graph)
        intra = graph.bw_intra * NVLS_EFFICIENCY[arch] * (channels - 1) / channels
        intra *= 2.0 if op == "all_reduce" else (system.ppn - 1) / system.ppn
        inter = graph.bw_inter * (2 if system.nodes <= 2 and algorithm == "NVLSTree" else 1)
        bw = min(intra, inter)
        if algorithm == "NVLSTree":
            bw = min(bw, _nvls_tree_max_bw(system)[i2])
    bus = channels * bw
    ll_max = LL_MAX_BW[arch][i2] if system.nodes == 1 else LL_MAX_BW_INTEL[i2]
    if algorithm == "Ring" and protocol == "LL":
        bus = min(ll_max, bus * 0.5)
    if algorithm == "Ring" and protocol == "LL128":
        bus = min(bus * 0.92, channels * _ring_ll128_max_bw(system)[i2])
    if algorithm == "Tree" and op == "all_reduce":
        bus = min(bus * 0.92, channels * TREE_MAX_BW[arch][i2])
    if algorithm == "Tree" and protocol == "LL":
        bus = min(bus / 3.8, ll_max)
    if algorithm == "Tree" and protocol == "LL128":
        share = 7.0 / 9.0 if system.nodes == 1 else 120.0 / 128.0
        bus = min(bus * share, channels * TREE_LL128_MAX_BW[arch][i2])
    if algorithm == "Tree" and system.simple_tree:
        bus *= TREE_PATTERN_FACTOR
    if algorithm == "PAT":
        bus *= 0.75
    if algorithm == "CollNetDirect":
        # "Collnet+Direct requires all GPUs to have a local NIC to work at full speed"
        # (tuning.cc:340-349): GPUs per head f, counted as (f + 1) / 2; x 0.85 on Hopper
        # and later.
        factor = system.ppn / channels
        factor -= (factor - 1) / 2
        bus /= factor
        if arch in ("hopper", "blackwell"):
            bus *= 0.85
    if algorithm == "Ring" or op == "all_reduce" or op in ("broadcast", "reduce"):
        steps = _steps(op, system.ranks)
        bus *= system.ranks / steps if algorithm in ("Ring", "NVLS", "NVLSTree") else 0.5
    return bus


def ll_channel_rate(system: NcclSystem, algorithm: str, channels: int) -> float:
    """Data bytes/s one channel's LL transfer moves over one hop, in NCCL's model: the
    channel's share of the search graph's bandwidth at LL's factor (Ring 0.5, Tree 1/3.8,
    tuning.cc:305-383 at v2.30.7), within LL's cap for all channels together (llMaxBws,
    the CPU vendor's row across servers). A Tree channel's hop carries half its rate:
    NCCL's Tree algorithm bandwidth is half its bus bandwidth (both directions of every
    edge carry the data once). NCCL's 0.85 for a tree whose network traffic meets on one
    GPU (:data:`TREE_PATTERN_FACTOR`) is left out: it stands for that GPU's links, which
    ccsim's tree routes already load. ``inf`` for algorithms that do not run LL.

    >>> from simulator.topology import load_topology
    >>> round(ll_channel_rate(nccl_system(load_topology("dgx-h100", 2)), "Tree", 1) / 1e9, 2)
    6.32
    """
    if algorithm not in ("Ring", "Tree"):
        return math.inf
    graph = system.ring if algorithm == "Ring" else system.tree
    bw = graph.bw_intra if system.nodes <= 2 else graph.bw_inter
    rate = bw * (0.5 if algorithm == "Ring" else 1 / 3.8)
    return rate * (0.5 if algorithm == "Tree" else 1.0) * 1e9


def ring_channel_rate(system: NcclSystem, protocol: str) -> float:
    """Data bytes/s one channel's Ring transfer moves over one hop on a call that spans
    servers, in NCCL's model: its Ring bus bandwidth for the protocol, the search graph's
    channels x bw for Simple and x min(0.92 x bw, perChMaxRingLL128Bw) for LL128
    (tuning.cc:266-280 at v2.27.3-1, the same lines at v2.30.7), shared by the channels
    the communicator runs: NCCL duplicates the graph's rings (connect.cc:452 at
    v2.27.3-1, ``nChannels*2``), so each runtime channel's thread block carries its share
    of that figure. ``inf`` on one server (ccsim's steps already match the bundled
    single-server runs) and for LL (:func:`ll_channel_rate`).

    Across servers a ring channel's step is moved whole: a ring all-gather or reduce-
    scatter whose slice per rank and channel is one step or less (every size up to 32 MiB
    on 16 ranks under LL128, up to 256 MiB under Simple) sends it as one step a hop, so a
    channel's hops run one after another at this rate rather than behind the links'
    bandwidth. The NCCL policy applies it to those two operations only (see
    :class:`simulator.collective.policy.NcclPolicy`).

    >>> from simulator.topology import load_topology
    >>> system = nccl_system(load_topology("hgx-b200", 2))
    >>> [round(ring_channel_rate(system, p) / 1e9, 2) for p in ("LL128", "Simple")]
    [20.0, 24.0]
    """
    if system.nodes < 2 or protocol not in ("LL128", "Simple"):
        return math.inf
    graph = system.ring
    bw = graph.bw_intra if system.nodes <= 2 else graph.bw_inter
    if protocol == "LL128":
        bw = min(bw * 0.92, _ring_ll128_max_bw(system)[_index2(system.nodes)])
    return graph.channels * bw / system.channels * 1e9


@dataclass(frozen=True)
class NvlsLoops:
    """How NCCL's NVLS all-reduce loops over one call (see :data:`NVLS_CTA_GBPS`):
    ``loops`` of ``channels x heads x chunk`` bytes, each taking ``step_us`` as the
    channels' thread blocks allow and ``link_us`` as NCCL's NVLS bandwidth allows;
    ``factor`` is the share of the link-bound rate the call reaches (1 when the links
    bound it) and ``latency_us`` what its last, partial loop's synchronisation adds."""

    loops: float
    step_us: float
    link_us: float
    factor: float
    latency_us: float


def nvls_loops(
    system: NcclSystem, op: str, size_bytes: float, channels: int, heads: int, chunk: float
) -> NvlsLoops | None:
    """The thread-block bound of an NVLS all-reduce inside one NVLink domain, or None
    where ccsim has no such figure (another operation, several nodes, no fitted
    constants for the GPU generation).

    A loop moves ``channels x heads x chunk`` bytes; each channel's thread block spends
    ``a + b x heads`` us synchronising and copies its ``heads x chunk`` bytes at
    :data:`NVLS_CTA_GBPS`. A call runs ``ceil(loops)`` synchronisations.

    >>> system = NcclSystem("blackwell", 8, 1, True, SearchGraph(12, 40.0, 40.0),
    ...                     SearchGraph(12, 40.0, 40.0), SearchGraph(8, 80.0, 80.0), 24, 24,
    ...                     nvlinks=18)
    >>> loops = nvls_loops(system, "all_reduce", 64 * 2**20, 24, 8, 32768)
    >>> round(loops.loops, 3), round(loops.step_us, 2), round(loops.link_us, 2)
    (10.667, 19.0, 13.25)
    """
    if op != "all_reduce" or system.nodes != 1 or system.arch not in NVLS_CTA_GBPS:
        return None
    # The links' bound: a GPU's NVLinks as NCCL counts them (nvlinks x its per-link
    # figure, graph/topo.h:17-39) at NVLS's share of them (nvlsEfficiency,
    # tuning.cc:139-144), each moving n (p + 1) / p bytes per direction
    # (simulator.algorithms.nvls).
    p = system.ranks
    bw = system.nvlinks * NVLINK_GBPS[system.arch] * NVLS_EFFICIENCY[system.arch] * p / (p + 1)
    if bw <= 0 or chunk <= 0:
        return None
    per_loop = channels * heads * chunk
    loops = size_bytes / per_loop
    a, b = NVLS_STEP_US[system.arch]
    sync_us = a + b * heads
    step_us = sync_us + heads * chunk / (NVLS_CTA_GBPS[system.arch] * 1e3)
    link_us = per_loop / (bw * 1e3)
    factor = min(1.0, link_us / step_us)
    # The bandwidth factor charges loops x max(step, link); the last loop, however
    # short, pays a whole synchronisation.
    blocks_us = math.ceil(loops) * sync_us + loops * (step_us - sync_us)
    latency_us = max(0.0, blocks_us - loops * max(step_us, link_us))
    return NvlsLoops(loops, step_us, link_us, factor, latency_us)


#: The NVLS operations whose one-domain kernels wait, every step, on a counter that
#: spans every rank, as the all-reduce's reduce group does (:data:`NVLS_STEP_US`): at
#: v2.30.4-1 the all-gather's broadcast group sends through ``nvls->down`` on send[0]
#: and the reduce-scatter's reduce group receives from it on recv[0]
#: (device/all_gather.h:277-285, device/reduce_scatter.h:247-255; connIndex 0 is the
#: constructor's default, prims_simple.h:583-587), the two connections
#: transport/nvls.cc:525 and 540 flag NCCL_NVLS_MIN_POLL, whose counters the kernel
#: reads with multimem.ld_reduce.min over every rank (prims_simple.h:96-104, flag set
#: at 503 and 552).
NVLS_SYNCED_OPS = ("all_gather", "reduce_scatter")


def nvls_sync_us(system: NcclSystem, op: str, heads: int) -> float | None:
    """The synchronisation one NVLS all-gather or reduce-scatter inside one NVLink
    domain pays before its first chunk lands: one step's wait on a counter that spans
    every rank (:data:`NVLS_SYNCED_OPS`), at the all-reduce's per-step figure
    ``a + b x heads`` (:data:`NVLS_STEP_US`, set on all-reduce runs and used here
    unchanged). Later steps overlap the links' work and are left out, so this is the
    call's floor, not its middle sizes. None where ccsim has no such figure: the
    all-reduce (:func:`nvls_loops` prices it), several nodes (NCCL runs neither
    operation as NVLS there without CollNet, tuning.cc:332-337 at v2.30.4-1), or a
    generation without NVLS_STEP_US.

    >>> system = NcclSystem("blackwell", 32, 1, True, SearchGraph(12, 40.0, 40.0),
    ...                     SearchGraph(12, 40.0, 40.0), SearchGraph(32, 80.0, 80.0), 24, 24,
    ...                     nvlinks=18)
    >>> round(nvls_sync_us(system, "all_gather", 32), 2)  # 3.0 + 0.85 x 32
    30.2
    >>> nvls_sync_us(system, "all_reduce", 32) is None
    True
    """
    if op not in NVLS_SYNCED_OPS or system.nodes != 1 or system.arch not in NVLS_STEP_US:
        return None
    a, b = NVLS_STEP_US[system.arch]
    return a + b * heads


# An LL step over NVLink and LL's share of the links' rate, per GPU generation, where
# NCCL's model has one figure for every generation (hwLatencies NVLink LL 0.6 us,
# tuning.cc:157-175 at v2.30.7, no Blackwell entry; ccsim's LL share 0.25,
# simulator.library.protocol). FITTED on Blackwell: of the grid step 1.0-1.3 us (0.1 us)
# x share 0.25/0.3/0.35/0.4/0.5, (1.2 us, 0.35) gives the least summed squared log time
# error over the sizes LL_FITTED_TO run with LL (8 B-4 MiB: B200-1N-AR-Vultr's 19-26 us
# floor against NCCL's 15 us, and the GB300 runs' 0.5-4 MiB). Left out, each run's
# choice from the other two: (1.2, 0.35) without B200-1N-AR-Vultr (the GB300 runs' LL
# sizes alone pick the same step) and without GB300-2N-AR-oci-quickstart, (1.2, 0.4)
# without GB300-1N-AR-oci-quickstart (README gives the errors). For comparison,
# dgx-a100's own fit put A100's LL NVLink step at 1.21 us. Presets that set their own
# LL NVLink hop or share keep them.
LL_NVLINK_HOP_US = {"blackwell": 1.2}
LL_BANDWIDTH = {"blackwell": 0.35}
#: The ``ccsim validate`` runs LL_NVLINK_HOP_US and LL_BANDWIDTH were chosen on.
LL_FITTED_TO = (
    "B200-1N-AR-Vultr",
    "GB300-1N-AR-oci-quickstart",
    "GB300-2N-AR-oci-quickstart",
)


#: Chunk-times of pipeline fill in ccsim's one-server NVLS all-reduce schedule
#: (simulator.algorithms.nvls): a call with K chunks takes (1 + NVLS_FILL / K) of its
#: link-bound time, the first chunk's reduce-scatter having nothing to overlap on the
#: links out of the switch and the last chunk's multicast nothing on the links into it.
#: A property of ccsim's schedule, not of a measurement: its simulated 16 GiB call on 8
#: and on 64 GPUs gives 1.92-1.97 between K = 8, 16 and 32.
NVLS_FILL = 2.0


def nvls_fill_factor(chunks: int, loops: float) -> float:
    """How much faster NCCL's NVLS all-reduce runs than ccsim's schedule of ``chunks``
    pipeline chunks where NCCL runs ``loops`` loops a channel: ccsim caps its chunks
    (:data:`simulator.collective.policy.MAX_CHUNKS`, for simulation cost) and so pays
    NVLS_FILL / chunks of fill where NCCL's pipeline, ``loops`` deep, pays NVLS_FILL /
    loops. 1 where the two pipelines are as deep.

    >>> round(nvls_fill_factor(32, 1024), 4), nvls_fill_factor(2, 2.0)
    (1.0604, 1.0)
    """
    if chunks <= 0 or loops <= chunks:
        return 1.0
    return (1.0 + NVLS_FILL / chunks) / (1.0 + NVLS_FILL / loops)


def _steps(op: str, ranks: int) -> int:
    if op == "all_reduce":
        return 2 * (ranks - 1)
    if op in ("all_gather", "reduce_scatter"):
        return ranks - 1
    return ranks


def _latency(system: NcclSystem, op: str, algorithm: str, protocol: str) -> float:
    """Latency (us) NCCL assigns, tuning.cc:384-435."""
    p = PROTOCOLS.index(protocol)
    intra_hw = "nvlink" if system.nvlink else "pcie"
    hw = intra_hw if system.nodes == 1 else "network"
    lat = BASE_LATENCY[algorithm][p]
    intra = HW_LATENCY[intra_hw][algorithm][p]
    net_algo = "Tree" if system.ppn == 1 else algorithm
    inter = HW_LATENCY["network"][net_algo][p]
    if net_algo == "NVLSTree" and protocol == "Simple":
        inter = tuning_release(system.version).nvls_tree_net_us
        if version_number(system.version) < NVLS_MODEL_FROM:
            inter = NVLS_TREE_NET_US_BEFORE_2_28
    if (algorithm, protocol) == ("Tree", "Simple") and version_number(system.version) < (23, 4):
        intra = TREE_SIMPLE_US_BEFORE_2_23
        inter = TREE_SIMPLE_US_BEFORE_2_23 if net_algo == "Tree" else inter
    log_nodes = int(math.log2(system.nodes))
    if algorithm == "Ring":
        if op in ("broadcast", "reduce"):
            return lat + HW_LATENCY[hw]["Ring"][p]  # sameChannels: one chunk latency
        overhead = NET_OVERHEAD_US * (3 if protocol == "Simple" else 1) if system.nodes > 1 else 0
        intra = max(intra, overhead)
        steps = _steps(op, system.ranks)
        inter_steps = 0
        if system.nodes > 1:
            inter_steps = 2 * (system.nodes - 1) if op == "all_reduce" else system.nodes - 1
            if op == "all_reduce" and version_number(system.version) < (23, 4):
                # Counted as 2 x nNodes before v2.23.4 (tuning.cc:159 at v2.22.3-1;
                # 2 x (nNodes - 1) from tuning.cc:258 at v2.23.4-1).
                inter_steps = 2 * system.nodes
        return lat + (steps - inter_steps) * intra + inter_steps * inter
    if algorithm == "Tree":
        per_node = system.ranks // system.nodes
        return lat + 2 * ((per_node - 1) * intra + log_nodes * inter)
    if algorithm == "NVLS":
        return intra + (inter if system.nodes > 1 else 0.0)
    if algorithm == "NVLSTree":
        return lat + intra + 2 * log_nodes * inter
    per_node = system.ranks // system.nodes
    if algorithm == "CollNetDirect":  # 0.4 us arity serialization a GPU (tuning.cc:418-421)
        return lat + 2 * (min(1, per_node - 1) * intra + (per_node - 1) * 0.4) + inter
    if algorithm == "CollNetChain":
        return lat + 2 * (per_node - 1) * intra + inter
    return lat + log_nodes * (inter / 3.5) + system.ranks * 2.8  # PAT


def hop_scale(algorithm: str, protocol: str) -> dict[str, float]:
    """How much a step of ``algorithm`` costs against a ring's step, per path class, in
    NCCL's latency table (hwLatencies, tuning.cc:157-175 at v2.30.7): a Tree step over
    the network costs 8.5 us with LL128 where a Ring step costs 4.0, so 2.125. ccsim's
    protocol hop latencies are the ring's (presets may fit them); other algorithms scale
    them by these ratios. NVLS's NVLink entry (25 us) is a whole call's latency, not a
    step's, so NVLink steps of NVLS and NVLSTree keep the ring's cost.

    >>> hop_scale("Tree", "LL128")["network"]
    2.125
    >>> hop_scale("Ring", "Simple")
    {'nvlink': 1.0, 'pcie': 1.0, 'network': 1.0}
    """
    index = PROTOCOLS.index(protocol)
    scale = {}
    for cls, table in HW_LATENCY.items():
        ring, mine = table["Ring"][index], table[algorithm][index]
        whole_call = algorithm in ("NVLS", "NVLSTree") and cls == "nvlink"
        scale[cls] = mine / ring if ring > 0 and mine > 0 and not whole_call else 1.0
    return scale


def tree_correction(
    op: str, algorithm: str, protocol: str, size_bytes: float, arch: str = ""
) -> float:
    """The share of its modelled bandwidth NCCL's Tree all-reduce reaches at this size
    (``treeCorrectionFactor``, tuning.cc:620-655 at v2.30.7: NCCL's own record of the
    tree's slower middle sizes), and NVLSTree's on Blackwell with x86 hosts (the same
    table up to log2(bytes / 64) = 23, tuning.cc:643-646; ccsim assumes x86 hosts); 1
    for every other algorithm.

    >>> tree_correction("all_reduce", "Tree", "LL128", 2**20)
    0.6
    >>> tree_correction("all_reduce", "Ring", "LL128", 2**20)
    1.0
    >>> tree_correction("all_reduce", "NVLSTree", "Simple", 2**20, "blackwell")
    0.5
    >>> tree_correction("all_reduce", "NVLSTree", "Simple", 2**20, "hopper")
    1.0
    """
    log_size = int(math.log2(size_bytes // 64)) if size_bytes >= 64 else -1
    if algorithm == "Tree" and op == "all_reduce" and 0 <= log_size < 23:
        return TREE_CORRECTION[protocol][log_size]
    blackwell_nvls_tree = algorithm == "NVLSTree" and arch == "blackwell"
    if blackwell_nvls_tree and op == "all_reduce" and 0 <= log_size < 24:
        return TREE_CORRECTION[protocol][log_size]
    return 1.0


def predicted_time_us(
    system: NcclSystem, op: str, size_bytes: float, algorithm: str, protocol: str
) -> float | None:
    """NCCL's predicted time (us) of one pair, or None when NCCL would not run it
    (ncclTopoGetAlgoTime, tuning.cc:620-655). ``size_bytes`` counts as nccl-tests does
    (all-gather / reduce-scatter: the whole gathered buffer), which is NCCL's nBytes."""
    if not _enabled(system, op, algorithm, protocol):
        return None
    bw = _bandwidth(system, op, algorithm, protocol)
    if bw <= 0:
        return None
    lat = _latency(system, op, algorithm, protocol)
    bw *= tree_correction(op, algorithm, protocol, size_bytes, system.arch)
    if (
        algorithm == "Ring"
        and protocol == "Simple"
        and system.nodes > 1
        and op == "all_reduce"
        and size_bytes / (system.channels * system.ranks) >= 64
    ):
        lat *= 1.9 if system.arch == "volta" else 1.4  # "plateau effect of ring"
    return lat + size_bytes / (1000 * bw)


def nccl_choice(
    system: NcclSystem,
    op: str,
    size_bytes: float,
    *,
    algorithms: tuple[str, ...] | None = None,
    protocols: tuple[str, ...] | None = None,
    settings: str = "",
    tuner: TunerConfig | None = None,
) -> NcclChoice:
    """NCCL's (algorithm, protocol) for one call, and the channels and threads it runs on.

    ``algorithms`` / ``protocols`` restrict the choice as NCCL_ALGO / NCCL_PROTO do;
    ``settings``, the NCCL settings they come from, is named if nothing is left.
    ``tuner`` (NCCL_TUNER_CONFIG_FILE's rules) overrides the pick, and the channels,
    where one of its rules matches a pair that is left (:mod:`.nccl_tuner`).

    Examples
    --------
    Eight A100s on NVSwitch: ring search 12 channels x 20 GB/s, run on 24 channels. At
    256 MiB the Simple ring wins (latency 8.4 + 14 x 3.4 = 56 us, algorithm bandwidth
    12 x 20 x 8/14 = 137.1 GB/s); at 8 bytes LL on a single channel:

    >>> system = NcclSystem("ampere", 8, 1, True, SearchGraph(12, 20.0, 20.0),
    ...                     SearchGraph(12, 20.0, 20.0), None, 24, 0)
    >>> big = nccl_choice(system, "all_reduce", 2**28)
    >>> big.algorithm, big.protocol, big.channels, round(big.time_us, 1)
    ('Ring', 'Simple', 24, 2013.3)
    >>> small = nccl_choice(system, "all_reduce", 8)
    >>> small.algorithm, small.protocol, small.channels
    ('Ring', 'LL', 1)
    """
    if op == "all_to_all":
        raise CcsimError("NCCL runs all-to-all as grouped send/receive, not through its tuner")
    table: dict[tuple[str, str], float] = {}
    for algorithm in algorithms or ALGORITHMS:
        for protocol in protocols or PROTOCOLS:
            time = predicted_time_us(system, op, size_bytes, algorithm, protocol)
            if time is not None:
                table[(algorithm, protocol)] = time
    if not table:
        # NCCL itself fails such a call ("No algorithm/protocol available", enqueue.cc:2063).
        raise CcsimError(
            f"NCCL has no algorithm for {op} here among {', '.join(algorithms or ALGORITHMS)} "
            f"with {', '.join(protocols or PROTOCOLS)}"
            + (f" (under {settings})" if settings else "")
        )
    rule = tuner.rule_for(op, size_bytes, system.nodes, system.ranks, table) if tuner else None
    if rule is not None:  # the plugin made its pair free: NCCL's minimum is that pair
        algorithm, protocol = rule.algorithm, rule.protocol
        time = table[(algorithm, protocol)]
    else:
        # Strict minimum in NCCL's index order: the first of equal times wins.
        (algorithm, protocol), time = min(
            table.items(), key=lambda item: (item[1], ALGORITHMS.index(item[0][0]),
                                             PROTOCOLS.index(item[0][1]))
        )  # fmt: skip
    channels, threads = launch_size(system, op, size_bytes, algorithm, protocol)
    if rule is not None and rule.channels != -1:
        # The plugin's count replaces NCCL's trimmed one (enqueue.cc:2178), within the
        # communicator's channels (enqueue.cc:583-599); the threads stay NCCL's.
        nvls = algorithm in ("NVLS", "NVLSTree")
        most = system.nvls_channels if nvls else system.channels
        channels = working_channels(
            op,
            size_bytes,
            protocol,
            min(rule.channels, most),
            ranks=system.ranks,
            max_channels=most,
            version=system.version,
        )
    return NcclChoice(
        algorithm, protocol, channels, threads, time, table, rule.line if rule is not None else 0
    )


def _collnet_launch(
    system: NcclSystem, op: str, size_bytes: float, algorithm: str
) -> tuple[int, int]:
    """CollNet's channels and threads (enqueue.cc:2068-2113 at v2.30.7): Direct trims
    channels by ``bytes < nc x nt x nHeads x threshold`` in halving bands (from 16 down,
    halving the threshold at 1.5 x each band's floor) and keeps its 640 threads; Chain
    trims channels, then threads, as a ring does, at a threshold of 512 bytes a thread.
    A CollNet call then runs on all of them: NCCL gives it channels 0..nMaxChannels-1
    without dealing its traffic out in cells (the isCollnet branch of
    scheduleCollTasksToPlan, enqueue.cc:624-654 at v2.30.7-1, :578-607 at v2.27.3-1)."""
    nc, nt, threshold = system.channels, COLLNET_THREADS, COLLNET_THREAD_THRESHOLD
    if algorithm == "CollNetDirect":
        heads = system.collnet_direct.channels if system.collnet_direct else 1
        switch, trimming = 16, True
        while switch >= 1 and trimming:
            while (trimming := size_bytes < nc * nt * heads * threshold) and nc > switch:
                if nc == switch + switch // 2:
                    threshold //= 2
                nc -= 1
            switch //= 2
    else:
        while size_bytes < nc * nt * threshold and nc >= 2:
            nc -= 1
        while size_bytes < nc * nt * threshold and nt % 128 == 0:
            nt //= 2
    return nc, max(nt, 96)


def launch_size(
    system: NcclSystem, op: str, size_bytes: float, algorithm: str, protocol: str
) -> tuple[int, int]:
    """Channels and threads per channel for one call (enqueue.cc:2068-2113), then the
    channels that actually get work (:func:`working_channels`). NVLS and NVLSTree start
    from the communicator's NVLS channels and share their cells over those alone
    (nMaxChannels[isNvls] = comm->nvlsChannels, enqueue.cc:583-584 at v2.30.7-1)."""
    if algorithm in ("NVLS", "NVLSTree"):
        nc = system.nvls_channels
        return working_channels(
            op, size_bytes, protocol, nc, ranks=system.ranks, max_channels=nc,
            version=system.version,
        ), NVLS_THREADS  # fmt: skip
    if algorithm in ("CollNetDirect", "CollNetChain"):
        return _collnet_launch(system, op, size_bytes, algorithm)
    nc = system.channels
    if protocol == "Simple" and algorithm == "Ring":
        max_threads = 256 if system.ring.bw_intra * system.ring.channels <= 12 else 512
    else:
        max_threads = MAX_THREADS[protocol] if algorithm != "Tree" or protocol != "Simple" else 512
    nt = max_threads
    threshold = THREAD_THRESHOLD[protocol] * (system.ranks if (algorithm, protocol) == (
        "Ring", "LL") else 1)  # fmt: skip
    while size_bytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    while size_bytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    if protocol == "Simple":
        nt += 32 if algorithm == "Ring" else 128 if algorithm == "Tree" else 0
    nt = max(nt, 96)
    if algorithm in ("Tree", "PAT"):
        nt = 640
    return working_channels(
        op,
        size_bytes,
        protocol,
        nc,
        ranks=system.ranks,
        max_channels=system.channels,
        version=system.version,
    ), nt


def working_channels(
    op: str,
    size_bytes: float,
    protocol: str,
    channels: int,
    *,
    ranks: int,
    max_channels: int | None = None,
    version: str | None = None,
) -> int:
    """Of a call's ``channels`` (its trimmed count, NCCL's ``task->nMaxChannels``), the
    ones NCCL gives work when the call is alone in its kernel plan: what enqueue.cc's
    ``scheduleCollTasksToPlan`` does (enqueue.cc:575-700 at v2.30.7-1, the same steps at
    v2.27.3-1 :529-690). The call's traffic (bytes x 2 for all-reduce, x ranks for
    all-gather / reduce-scatter, x 4 more with LL: enqueue.cc:74-81 and 461) is shared
    over ``channels`` (``trafficPerChannel``, rounded up to 16 bytes from v2.29.2, at
    least MinTrafficPerChannel before), then the buffer is cut into cells of
    MinTrafficPerChannel of traffic and each channel takes whole cells: the first
    ``ceil(trafficPerChannel / traffic per cell)``, each next one as many, the last the
    rest; past ``max_channels`` (the communicator's, comm->nChannels) the cells left are
    spread over the rest. So a call can get fewer channels than ``channels`` (182,092
    bytes of LL all-reduce on 4 GPUs, 11 channels: 9 cells of 16 KiB traffic a channel,
    89 cells, 10 channels at v2.27.3, as printed by the 4 x A100 log of
    tests/data/nccl_choices.yaml).

    ``size_bytes`` counts as nccl-tests does (all-gather / reduce-scatter: the whole
    buffer, NCCL's per-rank count times ``ranks``). Releases before v2.23.4 split work
    otherwise (16-byte cells at v2.22.3, enqueue.cc:614-680); they get v2.23.4's rule.

    One MiB of Simple all-reduce on 24 channels: 64 cells of 32 KiB traffic, 3 a
    channel (87,392 bytes of traffic each), so 22 channels get work:

    >>> working_channels("all_reduce", 2**20, "Simple", 24, ranks=8)
    22
    >>> working_channels("all_reduce", 2**24, "Simple", 24, ranks=8)
    24
    >>> working_channels("all_reduce", 64 * 2**10, "Simple", 24, ranks=8)
    4
    >>> working_channels("all_reduce", 182092, "LL", 11, ranks=4, max_channels=24,
    ...                  version="2.27.3")
    10
    """
    if channels <= 1 or size_bytes <= 0:
        return 1
    max_channels = max(channels, max_channels or channels)
    new_rules = version_number(version) >= (29, 0)
    min_traffic = MIN_TRAFFIC_PER_CHANNEL if new_rules else MIN_TRAFFIC_PER_CHANNEL_BEFORE_2_29
    # The call's own bytes (NCCL's count x element size) and traffic per byte.
    per_byte = {"all_reduce": 2, "all_gather": ranks, "reduce_scatter": ranks}.get(op, 1)
    count = math.ceil(size_bytes / ranks if op in ("all_gather", "reduce_scatter") else size_bytes)
    if protocol == "LL":
        per_byte *= 4
    traffic = max(min_traffic, count * per_byte)
    if new_rules:
        per_channel = _div_up(traffic // channels, 16) * 16
    else:
        per_channel = max(min_traffic, traffic // channels)
    cell = _div_up(_div_up(min_traffic, per_byte), 16) * 16  # bytes of the buffer
    cells = _div_up(count, cell)
    per_cell = cell * per_byte
    cells_per_channel = min(cells, _div_up(per_channel, per_cell))
    lo = cells if max_channels == 1 else cells_per_channel
    mid, hi = divmod(cells - lo, cells_per_channel)
    if max_channels < (lo != 0) + mid + (hi != 0):  # overflowed the communicator's
        mid = max_channels - 2
        cells_per_channel = (cells - lo) // (mid + 1)
        hi = cells_per_channel + (cells - lo) % (mid + 1)
    if hi == 0 and mid != 0:
        hi, mid = cells_per_channel, mid - 1
    return max(1, (lo != 0) + mid + (hi != 0))


def _div_up(a: int, b: int) -> int:
    """NCCL's divUp for non-negative integers."""
    return -(-a // b)
