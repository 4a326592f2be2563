"""HCCL's own decision: which algorithm Huawei's collective library runs an all-reduce,
all-gather or reduce-scatter with on Ascend 910 and 910B servers.

HCCL splits a collective in levels: ``level0`` inside a server (the NPUs of one HCCS
domain) and ``level1`` between servers, among the NPUs of the same local index. Level0
follows the hardware; level1 is chosen per call, or forced by ``HCCL_ALGO``
(``"level0:NA;level1:<algo>"``, or per operation ``"allreduce=level0:NA;level1:ring/..."``).
This module re-derives that decision from a topology graph so that ``--algo hccl`` runs
what the library would run.

Sources (cited beside each constant as file:line):

* [src] Huawei's open-source HCCL, gitee ``ascend/cann-hccl``, files under
  ``src/domain/collective_communication/algorithm/impl/``, as mirrored at
  github ``zhuxy-USTC/HCCL`` commit 3a845e5 (2024-09-27). The functions cited are
  unchanged, in the default mode, in the 2025-08 copy ``HongminTan/ACNC2025-HCCL``
  commit f85b7e6.
* [env] CANN environment variable reference, HCCL_ALGO (8.0.RC1:
  https://www.hiascend.com/document/detail/zh/canncommercial/80RC1/apiref/envvar/envref_07_0083.html),
  HCCL_BUFFSIZE (8.0.0: .../canncommercial/800/apiref/envvar/envref_07_0080.html),
  HCCL_OP_EXPANSION_MODE (8.0.0: .../canncommercial/800/apiref/envvar/envref_07_0096.html).
* [doc] HCCL's algorithm notes with their alpha-beta costs, ``docs/Mesh.md``,
  ``docs/Ring.md``, ``docs/RHD.md`` of [src]; the Pipeline algorithm,
  https://www.hiascend.com/document/detail/zh/canncommercial/900/API/hcclug/hcclug_000124.html.

The decision, with HCCL's defaults (single-operator mode as in PyTorch eager and
hccl_test, HCCL_DETERMINISTIC off, HCCL_OP_EXPANSION_MODE=HOST, data float32 sum):

* level0 (``GetDefaultAlgoLevel0Module``, alg_configurator.cc:364-395): 8 NPUs per server
  -> ``8P_RING`` (four rings in fixed orders, hccl_impl.h:41 and
  topo_info_extractor.cc:1209-1212), 4 -> ``4P_MESH``, 1 or 2 -> ``NP_SINGLE_RING``,
  other -> ``WHOLE_RING``; on 910B an HCCS full mesh -> ``NP_MESH``.
* level1 on 910 (Atlas 800 training server; ``GetDefaultAlgoLevel1V1``,
  alg_configurator.cc:268-282, and [env]): ``H-D_R`` from 8 servers or for a power of
  two, else ``ring``, whatever the size.
* level1 on 910B (Atlas A2; ``GetDefaultAlgoLevel1V2``, coll_alg_operator.cc:265-305):
  ``pipeline`` where the data is large enough (per-rank slice >= 1 MiB for all-reduce,
  per-rank data >= 32 KiB for all-gather and reduce-scatter; 2 MiB for all three
  without RDMA Lite), else the cheapest of ring, NHR and H-D_R by HCCL's own alpha-beta
  model with a fixed 60 us per step (coll_alg_operator.cc:307-450; ties go to ring, then
  NHR): ring on 2 and 3 servers, NHR from 4.

Each HCCL algorithm runs as the nearest ccsim schedule (:data:`SCHEDULES`):

* one server: fullmesh -> ``direct`` (HCCL's Mesh: a reduce-scatter then an all-gather,
  each one step over every HCCS link, [doc] Mesh.md: 2 alpha + 2/p n beta, which
  ``direct`` reproduces); ring -> ``ring``;
* several servers: ``hierarchical`` (level0 reduce-scatter, level1 across servers on one
  plane per local index, level0 all-gather), or ``pipelined`` for HCCL's pipeline, with
  the level0 phases as a full mesh (``intra="mesh"``: every NPU sends to all its server
  peers at once, one step each way) where level0 is fullmesh (910B's NP_MESH, 910's
  4P_MESH), and as a ring for 910's 8P_RING and the single and whole rings;
  one NPU per server: ``ring`` or ``halving-doubling`` over the servers.

Not modelled (the nearest schedule runs instead):

* the level1 algorithms NHR, NHR_V1, NB and AHC, and H-D_R between servers of several
  NPUs: ccsim runs its ring between the servers (NHR and NB move the same bytes as the
  ring in fewer steps, [env], so ccsim overstates their latency as log2(N) -> N - 1
  steps);
* the four differently ordered rings of 910's 8P_RING: ccsim's four channels follow one
  ring order, so they share links HCCL's rings would not;
* the one-shot small all-reduce (``AllReduceMeshSmallCountExecutor``, <= 256 KiB on one
  910B server: each NPU reads every peer's whole buffer and reduces locally) runs as
  the two-step ``direct``; the CCL buffer loops (HCCL_BUFFSIZE, 200 MB: a larger call
  runs in several passes, recorded in :attr:`HcclChoice.loops`); AIV and AI CPU
  expansion, deterministic mode, graph mode, HCCL's task launch costs (no public
  figure found), the Atlas A3 (910_93) and 310P devices, and broadcast, reduce and
  all-to-all.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import networkx as nx

from ..errors import CcsimError, unknown_choice
from ..topology import servers_of_ranks
from ..topology.graph import gpu_nodes

#: Operations whose selection is modelled.
OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: HCCL_ALGO level1 values for these operations ([env]; "pairwise" is all-to-all only).
LEVEL1 = ("ring", "H-D_R", "NHR", "NHR_V1", "NB", "pipeline", "AHC", "AHC_BROKE")
#: HCCL_ALGO's operation names ([env], 8.0.RC2 onwards) -> ccsim's.
ENV_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "scatter": "scatter",
    "alltoall": "all_to_all",
}
#: Level0 shapes whose algorithm is Mesh (common.h:76-89: shown as "fullmesh").
MESH_LEVEL0 = ("NP_MESH", "4P_MESH")

# coll_alg_operator.cc:33: the fixed per-step latency (us) of HCCL's level1 cost model.
STEP_LATENCY_US = 60.0
# coll_alg_operator.cc:34-36: pipeline from 32 KiB per rank (all-gather, reduce-scatter),
# 1 MiB per rank slice (all-reduce), or 2 MiB for all three without RDMA Lite.
PIPELINE_MIN_BYTES = 32 * 1024
PIPELINE_ALLREDUCE_MIN_BYTES = 1024 * 1024
PIPELINE_MIN_BYTES_NO_LITE = 2 * 1024 * 1024
# coll_alg_operator.cc:37: tasks one FFTS+ graph holds; a larger pipeline falls back to HD.
FFTS_CAPACITY = 65535
# inc/common.h:62: from this many servers 910 uses H-D_R whatever the count.
RING_MAX_SERVERS = 8
# inc/common.h:50 and all_reduce_operator.cc:386-401: one-shot all-reduce up to 256 KiB.
SMALL_COUNT_BYTES = 256 * 1024
# [env] HCCL_BUFFSIZE: 200 MB by default (in MB = 2^20 bytes; one such buffer for input
# and one for output per communicator).
BUFFER_BYTES = 200 * 1024 * 1024
# hccl_impl.h:41: 910's 8P_RING runs four rings, each on its own HCCS link of every NPU
# (orders 0-1-2-6-5-4-7-3, 0-3-7-4-5-6-2-1, 0-2-3-1-5-7-6-4, 0-4-6-7-5-1-3-2 by device
# id, topo_info_extractor.cc:1209-1212).
RINGS_8P = 4

#: HCCL's executor per operation (in :data:`OPS` order), for the record, by device and
#: kind: the level0 algorithm ("mesh" or "ring"), on 910B meshes "-one" for one server and
#: "-pipe" for the pipeline (SelectAlgfor910A and SelectAlgfor910B,
#: all_reduce_operator.cc:211-361, all_gather_operator.cc:69-129,
#: reduce_scatter_operator.cc:77-160).
EXECUTORS = {
    ("910", "mesh"): ("AllReduceMeshExecutor", "AllGatherMeshExecutor",
                      "ReduceScatterMeshExecutor"),
    ("910", "ring"): ("AllReduceRingExecutor", "AllGatherRingExecutor",
                      "ReduceScatterRingExecutor"),
    ("910b", "ring"): ("AllReduceRingExecutor", "AllGatherRingExecutor",
                       "ReduceScatterRingExecutor"),
    ("910b", "mesh-one"): ("AllReduceMeshOpbaseLoopExecutor", "AllGatherMeshOpbaseExecutor",
                           "ReduceScatterMeshDmaEliminationExecutor"),
    ("910b", "mesh"): ("AllReduceMeshExecutor", "AllGatherMeshExecutor",
                       "ReduceScatterMeshExecutor"),
    ("910b", "mesh-pipe"): ("AllReduceMeshOpbasePipelineExecutor",
                            "AllGatherMeshOpbasePipelineExecutor",
                            "ReduceScatterMeshOpbasePipelineExecutor"),
}  # fmt: skip
SMALL_COUNT_EXECUTOR = "AllReduceMeshSmallCountExecutor"

#: HCCL's level1 algorithm -> the ccsim schedule between servers of several NPUs.
SCHEDULES = {name: "pipelined" if name == "pipeline" else "hierarchical" for name in LEVEL1}
#: ... and between servers of one NPU each (the level0 part is empty).
FLAT_SCHEDULES = {name: "halving-doubling" if name == "H-D_R" else "ring" for name in LEVEL1}

_DEVICE_PATTERNS = (
    ("910_93", r"910_?93|910C"),
    ("910b", r"910_?B"),
    ("910", r"910"),
)


@dataclass(frozen=True)
class HcclSystem:
    """What HCCL knows about a communicator when it picks algorithms.

    ``bandwidth`` (bytes/s per NPU between servers) enters HCCL's level1 cost model;
    HCCL reads it from the driver (``GetBandWidthPerNPU``, not open source) and the
    choice does not depend on it (ring, NHR and HD move the same bytes; recursive HD
    more). ``rdma_lite``: whether the NPU's RoCE supports RDMA Lite, also a driver query;
    unknown, it takes HCCL's default, false (operator/coll_alg_operator.h:92).
    """

    device: str  # "910" or "910b"
    servers: int
    per_server: int  # NPUs per server (deviceNumPerAggregation)
    level0: str  # "8P_RING", "4P_MESH", "NP_MESH", "NP_SINGLE_RING" or "WHOLE_RING"
    bandwidth: float = 0.0
    rdma_lite: bool = False
    buffer_bytes: int = BUFFER_BYTES

    @property
    def ranks(self) -> int:
        """NPUs in the communicator."""
        return self.servers * self.per_server

    @property
    def mesh(self) -> bool:
        """Level0 is HCCL's Mesh (fullmesh)."""
        return self.level0 in MESH_LEVEL0


@dataclass(frozen=True)
class HcclChoice:
    """HCCL's decision for one call and the ccsim schedule that runs it."""

    level0: str  # HCCL's level0 shape
    level1: str | None  # HCCL's level1 algorithm; None on one server
    executor: str  # HCCL's executor for this call
    schedule: str  # the ccsim algorithm that runs it
    channels: int  # ccsim channels (HCCL's rings of 8P_RING)
    chunks: int  # ccsim chunks (pipelined: slices)
    loops: int  # passes through HCCL's CCL buffer
    #: How the two-level schedule runs level0 ("mesh" or "ring"); None for one level.
    intra: str | None = None

    @property
    def options(self) -> dict[str, str]:
        """The schedule's build options beyond chunks and channels (``intra``)."""
        return {} if self.intra is None else {"intra": self.intra}

    @property
    def algorithm(self) -> str:
        """HCCL's name for the choice, as its logs show it: ``fullmesh+NHR``."""
        inner = "fullmesh" if self.level0 in MESH_LEVEL0 else "ring"
        return f"{inner}+{self.level1}" if self.level1 else inner


def npu_device(model: str | None) -> str | None:
    """HCCL's device type for an NPU model name: "910", "910b", "910_93" or None.

    >>> npu_device("Ascend-910B"), npu_device("Ascend-910"), npu_device("H100-SXM5-80GB")
    ('910b', '910', None)
    """
    for device, pattern in _DEVICE_PATTERNS:
        if model and re.search(pattern, str(model), re.IGNORECASE):
            return device
    return None


def default_level0(device: str, per_server: int, hccs_mesh: bool) -> str:
    """HCCL's level0 shape (GetDefaultAlgoLevel0Module, alg_configurator.cc:364-395).

    >>> default_level0("910", 8, False), default_level0("910b", 8, True)
    ('8P_RING', 'NP_MESH')
    """
    if device == "910b" and hccs_mesh:
        return "NP_MESH"
    shapes = {8: "8P_RING", 4: "4P_MESH", 2: "NP_SINGLE_RING", 1: "NP_SINGLE_RING"}
    return shapes.get(per_server, "WHOLE_RING")


def hccl_system(graph: nx.Graph, *, rdma_lite: bool = False) -> HcclSystem:
    """HCCL's view of a communicator over every NPU of ``graph``.

    The NPU model names the device (:func:`npu_device`); a server whose NPUs are all
    joined pairwise by HCCS links (``link: hccs`` edges among its nodes, one per pair) is
    a full mesh.

    >>> from simulator.topology import load_topology
    >>> hccl_system(load_topology("ascend-910b", 2)).level0
    'NP_MESH'
    """
    npus = sorted(gpu_nodes(graph), key=lambda node: graph.nodes[node]["rank"])
    if len(npus) < 2:
        raise CcsimError("HCCL's model needs at least 2 NPUs")
    model = graph.nodes[npus[0]].get("model")
    device = npu_device(model)
    if device not in ("910", "910b"):
        raise CcsimError(
            f"the hccl policy models Ascend 910 and 910B NPUs; this topology has "
            f"{model or 'no GPU model'!r} (for NVIDIA GPUs use --algo nccl)"
        )
    servers = servers_of_ranks(graph) or [0] * len(npus)
    counts = {server: servers.count(server) for server in servers}
    if len(set(counts.values())) != 1:
        raise CcsimError(f"HCCL's model needs the same number of NPUs per server, got {counts}")
    per_server = len(npus) // len(counts)
    first = servers[0]
    hccs = sum(
        1
        for u, v, data in graph.edges(data=True)
        if str(data.get("link", "")).lower() == "hccs"
        and graph.nodes[u].get("server", first) == first
        and graph.nodes[v].get("server", first) == first
    )
    nics = [
        data.get("bandwidth", 0.0)
        for _, data in graph.nodes(data=True)
        if data.get("kind") == "nic" and data.get("server") == first
    ]
    return HcclSystem(
        device=device,
        servers=len(counts),
        per_server=per_server,
        level0=default_level0(device, per_server, hccs == per_server * (per_server - 1) // 2),
        bandwidth=sum(nics) / per_server,
        rdma_lite=rdma_lite,
    )


def parse_hccl_algo(text: str | None, op: str) -> str | None:
    """The level1 algorithm HCCL_ALGO forces for ``op``, or None (HCCL chooses).

    Global ``"level0:NA;level1:<algo>"`` or per operation
    ``"allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R"`` ([env]).
    level0 accepts only NA (HCCL ignores anything else); an unknown level1 name is an
    error.

    >>> parse_hccl_algo("level0:NA;level1:NHR", "all_gather")
    'NHR'
    >>> parse_hccl_algo("allreduce=level0:NA;level1:ring", "all_gather") is None
    True
    """
    if not text:
        return None
    chosen = None
    for part in str(text).split("/"):
        target, _, config = part.rpartition("=")
        if target and ENV_OPS.get(target.strip().lower()) is None:
            raise unknown_choice("HCCL_ALGO operation", target.strip(), ENV_OPS)
        if target and ENV_OPS[target.strip().lower()] != op:
            continue
        for item in config.split(";"):
            level, _, name = item.partition(":")
            if level.strip().lower() not in ("level0", "level1", "level2"):
                raise CcsimError(
                    f"HCCL_ALGO {text!r}: expected 'level0:NA;level1:<algo>', got {item!r}"
                )
            if level.strip().lower() == "level1":
                match = [algo for algo in LEVEL1 if algo.lower() == name.strip().lower()]
                if not match:
                    raise unknown_choice("HCCL_ALGO level1 algorithm", name.strip(), LEVEL1)
                chosen = match[0]
    return chosen


def pipeline_contexts(system: HcclSystem, op: str) -> int:
    """FFTS+ tasks HCCL's pipeline needs (CalcContextNumForPipeline,
    coll_alg_operator.cc:234-263): per server step 5 (g-1) HCCS + 7 RoCE + 1 copy, then
    4 for the barrier and 1 copy; twice that for all-reduce.

    >>> pipeline_contexts(HcclSystem("910b", 2, 8, "NP_MESH"), "all_reduce")
    182
    """
    per_step = 5 * (system.per_server - 1) + 7 + 1
    contexts = system.servers * per_step + 4 + 1
    return 2 * contexts if op == "all_reduce" else contexts


def level1_costs(system: HcclSystem, op: str, loop_bytes: float) -> dict[str, float]:
    """HCCL's predicted level1 time (us) of ring, NHR and H-D_R for one pass of
    ``loop_bytes`` (all-reduce: the whole buffer; all-gather / reduce-scatter: one
    rank's part), coll_alg_operator.cc:307-450: all-gather / reduce-scatter move
    ``loop_bytes x ranks`` in ``steps x 60 us``; all-reduce twice ``loop_bytes / g``.
    Recursive HD on a server count that is not a power of two moves (2N-1)/N, not
    (N-1)/N.

    >>> costs = level1_costs(HcclSystem("910b", 4, 8, "NP_MESH", 25e9), "all_gather", 2**20)
    >>> min(costs, key=costs.get), costs["ring"] - costs["NHR"]
    ('NHR', 60.0)
    """
    n = system.servers
    bw = system.bandwidth or 1.0
    if op == "all_reduce":
        factor, data = 2.0, loop_bytes / system.per_server
    else:
        factor, data = 1.0, loop_bytes * system.ranks
    per_byte = 1e6 / bw  # us per byte
    log_steps = math.ceil(math.log2(n))
    ring = factor * ((n - 1) * STEP_LATENCY_US + (n - 1) / n * data * per_byte)
    nhr = factor * (log_steps * STEP_LATENCY_US + (n - 1) / n * data * per_byte)
    share = (n - 1) / n if n & (n - 1) == 0 else (2 * n - 1) / n
    hd = factor * (log_steps * STEP_LATENCY_US + share * data * per_byte)
    return {"ring": ring, "NHR": nhr, "H-D_R": hd}


def default_level1(system: HcclSystem, op: str, size_bytes: float) -> str:
    """HCCL's level1 algorithm with HCCL_ALGO unset (``size_bytes`` as nccl-tests
    counts it: for all-gather and reduce-scatter the whole gathered buffer).

    >>> system = HcclSystem("910b", 2, 8, "NP_MESH", 25e9)
    >>> default_level1(system, "all_reduce", 2**20), default_level1(system, "all_reduce", 2**30)
    ('ring', 'pipeline')
    """
    n = system.servers
    if system.device == "910":
        return "H-D_R" if n >= RING_MAX_SERVERS or n & (n - 1) == 0 else "ring"
    per_rank = size_bytes / system.ranks
    if pipeline_fits(system, op):
        if op == "all_reduce":
            least = PIPELINE_ALLREDUCE_MIN_BYTES if system.rdma_lite else PIPELINE_MIN_BYTES_NO_LITE
            if per_rank >= least:
                return "pipeline"
        elif per_rank >= (PIPELINE_MIN_BYTES if system.rdma_lite else PIPELINE_MIN_BYTES_NO_LITE):
            return "pipeline"
    # One pass of the CCL buffer: all-reduce the whole input buffer, all-gather and
    # reduce-scatter one rank's share of it.
    if op == "all_reduce":
        loop = min(size_bytes, system.buffer_bytes)
    else:
        loop = min(per_rank, system.buffer_bytes / system.ranks)
    costs = level1_costs(system, op, loop)
    # Strict comparisons in HCCL's order: NHR must beat ring, HD the better of the two.
    best = "NHR" if costs["NHR"] < costs["ring"] else "ring"
    return "H-D_R" if costs["H-D_R"] < costs[best] else best


def pipeline_fits(system: HcclSystem, op: str) -> bool:
    """Whether HCCL may pipeline ``op`` here: 910B, a mesh inside servers of more than one
    NPU, and few enough tasks for one FFTS+ graph (coll_alg_operator.cc:277-297)."""
    return (
        system.device == "910b"
        and system.mesh
        and system.per_server > 1
        and pipeline_contexts(system, op) <= FFTS_CAPACITY
    )


def hccl_choice(
    system: HcclSystem, op: str, size_bytes: float, *, algo: str | None = None
) -> HcclChoice:
    """HCCL's algorithm for one call and the ccsim schedule that runs it.

    ``algo`` is an HCCL_ALGO setting (:func:`parse_hccl_algo`); unset, HCCL chooses.

    Examples
    --------
    One 910B server: Mesh, run as ``direct``; two 910 servers: 8P ring inside, H-D_R
    across (a power of two), run as ``hierarchical`` on HCCL's four rings:

    >>> hccl_choice(HcclSystem("910b", 1, 8, "NP_MESH"), "all_reduce", 2**30).schedule
    'direct'
    >>> choice = hccl_choice(HcclSystem("910", 2, 8, "8P_RING", 12.5e9), "all_gather", 2**30)
    >>> choice.algorithm, choice.schedule, choice.channels, choice.intra
    ('ring+H-D_R', 'hierarchical', 4, 'ring')

    Two 910B servers: fullmesh inside, so the two-level schedule runs its level0 phases
    as a full mesh:

    >>> hccl_choice(HcclSystem("910b", 2, 8, "NP_MESH", 25e9), "all_reduce", 2**20).options
    {'intra': 'mesh'}
    """
    if op not in OPS:
        raise CcsimError(
            f"the hccl policy models {', '.join(OPS)} (HCCL's documented selection), not "
            f"{op}; give an algorithm with --algo"
        )
    if not size_bytes > 0:
        raise CcsimError(f"size must be positive, got {size_bytes!r} bytes")
    level1 = None
    if system.servers > 1:
        level1 = parse_hccl_algo(algo, op)
        if level1 == "pipeline" and system.device != "910b":
            level1 = None  # alg_configurator.cc:253-258: pipeline is 910B only
        if level1 == "pipeline" and not pipeline_fits(system, op):
            level1 = "H-D_R"  # all_reduce_operator.cc:282-290: too many tasks -> HD
        level1 = level1 or default_level1(system, op, size_bytes)
    kind = "mesh" if system.mesh else "ring"
    if system.device == "910b" and system.mesh:
        kind += "-pipe" if level1 == "pipeline" else "" if level1 else "-one"
    executor = EXECUTORS[(system.device, kind)][OPS.index(op)]
    if kind == "mesh-one" and op == "all_reduce" and size_bytes <= SMALL_COUNT_BYTES:
        executor = SMALL_COUNT_EXECUTOR
    if level1 is None:
        schedule = "direct" if system.mesh else "ring"
    elif system.per_server == 1:
        schedule = FLAT_SCHEDULES[level1]
    else:
        schedule = SCHEDULES[level1]
    # HCCL's pipeline advances one server step at a time (a slice per step of the ring
    # between servers, [doc] Pipeline); ccsim's pipelined cuts the data in as many slices.
    chunks = max(2, system.servers) if schedule == "pipelined" else 1
    channels = RINGS_8P if system.level0 == "8P_RING" else 1
    loops = max(1, math.ceil(size_bytes / system.buffer_bytes))
    intra = None
    if schedule in ("hierarchical", "pipelined"):
        intra = "mesh" if system.mesh else "ring"
    return HcclChoice(system.level0, level1, executor, schedule, channels, chunks, loops, intra)
