"""Import of SimAI/AICB workload files (the layer-wise text format SimAI replays).

Format (as SimAI's examples use it): a header line
``HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: T ep: E pp: P ... ga: G
all_gpus: N ...``, a line with the number of layers, then one line per layer::

    name -1 fwd_time fwd_comm fwd_bytes ig_time ig_comm ig_bytes wg_time wg_comm wg_bytes update

What is mapped:

* ranks = ``all_gpus``; TP groups are consecutive blocks of T ranks; DP groups join the
  ranks with the same TP index; EP groups split each DP group into blocks of E;
  ``_EP`` / ``_DP_EP`` suffixes select the EP group / the DP ranks of one EP slot.
* Times are nanoseconds (SimAI's unit), comm sizes bytes. Types ALLREDUCE, ALLGATHER,
  REDUCESCATTER, ALLTOALL map to all_reduce, all_gather, reduce_scatter, all_to_all;
  NONE or size 0 means no communication.
* Per rank and micro-batch (``ga`` of them): every layer's forward compute then its
  forward comm on the TP group (blocking, compute stream); then in reverse order each
  layer's input-gradient compute and comm (TP, blocking) and weight-gradient compute.
  Weight-gradient comm (DP by default) is issued after the last micro-batch's weight
  gradient of that layer, on a ``dp`` stream that overlaps the rest of the backward.
  The update time of each layer runs after all gradient communication.

Not mapped: pipeline parallelism (``pp`` > 1 is rejected with a clear error) and
virtual pipeline stages.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..files import read_text
from .generators import _Builder
from .trace import Workload, WorkloadError

_TYPES = {
    "ALLREDUCE": "all_reduce",
    "ALLGATHER": "all_gather",
    "REDUCESCATTER": "reduce_scatter",
    "ALLTOALL": "all_to_all",
}


def _header_value(header: str, key: str, default: int | None = None) -> int:
    match = re.search(rf"{key}:\s*(\d+)", header)
    if match:
        return int(match.group(1))
    if default is None:
        raise WorkloadError(f"AICB header lacks '{key}:'; got {header[:80]!r}")
    return default


def load_aicb(path: str | Path) -> Workload:
    """Read an AICB/SimAI workload file into a :class:`Workload` (see module docstring)."""
    path = Path(path)
    text = read_text(path, what="AICB workload", error=WorkloadError)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 3:
        raise WorkloadError(f"{path}: an AICB workload has a header, a layer count and layers")
    header = lines[0]
    tp = _header_value(header, "model_parallel_NPU_group")
    ranks = _header_value(header, "all_gpus")
    pp = _header_value(header, "pp", 1)
    ep = _header_value(header, "ep", 1)
    ga = _header_value(header, "ga", 1)
    if pp != 1:
        raise WorkloadError(
            f"{path}: pipeline parallelism (pp: {pp}) is not mapped yet; "
            "generate the workload with pp: 1"
        )
    if tp < 1 or ranks % tp:
        raise WorkloadError(f"{path}: all_gpus {ranks} is not a multiple of the TP group {tp}")
    dp = ranks // tp
    if ep < 1 or dp % ep:
        raise WorkloadError(f"{path}: the DP size {dp} is not a multiple of ep {ep}")
    try:
        count = int(lines[1])
    except ValueError:
        raise WorkloadError(f"{path}: line 2 must be the number of layers") from None
    layers = []
    for number, line in enumerate(lines[2 : 2 + count], start=3):
        fields = line.split()
        if len(fields) != 12:
            raise WorkloadError(f"{path}:{number}: expected 12 fields, found {len(fields)}")
        try:
            layers.append(
                (
                    fields[0],
                    int(fields[2]),
                    fields[3],
                    int(fields[4]),
                    int(fields[5]),
                    fields[6],
                    int(fields[7]),
                    int(fields[8]),
                    fields[9],
                    int(fields[10]),
                    int(fields[11]),
                )
            )
        except ValueError:
            raise WorkloadError(f"{path}:{number}: times and sizes must be integers") from None
    if len(layers) != count:
        raise WorkloadError(f"{path}: header says {count} layers, file has {len(layers)}")

    b = _Builder(path.stem, ranks, f"imported from AICB file {path.name}")

    def tp_of(r: int) -> int:
        return r % tp

    groups: dict[tuple[str, int], str] = {}
    for r in range(ranks):
        block = r // tp
        groups[("TP", r)] = f"tp{block}"
        t = tp_of(r)
        d = r // tp  # index among the ranks with the same TP index
        groups[("DP", r)] = f"dp{t}"
        groups[("EP", r)] = f"ep{t}.{d // ep}"
        groups[("DP_EP", r)] = f"dpep{t}.{d % ep}"
    for r in range(ranks):
        t, d = tp_of(r), r // tp
        b.group(f"tp{r // tp}", "TP", [r // tp * tp + i for i in range(tp)])
        b.group(f"dp{t}", "DP", [i * tp + t for i in range(dp)])
        b.group(f"ep{t}.{d // ep}", "EP", [(d // ep * ep + i) * tp + t for i in range(ep)])
        b.group(f"dpep{t}.{d % ep}", "DP", [(i * ep + d % ep) * tp + t for i in range(dp // ep)])

    def comm(kind: str, default_group: str, r: int) -> tuple[str, str] | None:
        if kind == "NONE":
            return None
        base, group = kind, default_group
        for suffix, name in (("_DP_EP", "DP_EP"), ("_EP", "EP")):
            if kind.endswith(suffix):
                base, group = kind[: -len(suffix)], name
                break
        if base not in _TYPES:
            raise WorkloadError(
                f"{path}: unknown communication type {kind!r}; known: "
                + ", ".join(sorted(_TYPES))
                + " (optionally _EP or _DP_EP)"
            )
        return _TYPES[base], groups[(group, r)]

    ns = 1e-9

    def compute_then_tp(op_id: str, r: int, prev, seconds: float, kind: str, size: int, label: str):
        """A compute op, then (if any) its blocking TP-group comm on the compute stream."""
        prev = b.op(op_id, r, "compute", [prev], duration=seconds, label=label)
        c = comm(kind, "TP", r)
        if c and size:
            prev = b.op(
                f"{op_id}.c",
                r,
                "collective",
                [prev],
                op=c[0],
                group=c[1],
                bytes=size,
                stream="compute",
                label=label,
            )
        return prev

    for r in range(ranks):
        prev = None
        wg_done: list[str | None] = [None] * len(layers)
        for mb in range(ga):
            for i, layer in enumerate(layers):
                name, fwd_t, fwd_c, fwd_b = layer[:4]
                prev = compute_then_tp(
                    f"r{r}.m{mb}.f{i}", r, prev, fwd_t * ns, fwd_c, fwd_b, f"fwd {name}"
                )
            for i in reversed(range(len(layers))):
                name, _, _, _, ig_t, ig_c, ig_b, wg_t, wg_c, wg_b, _ = layers[i]
                prev = compute_then_tp(
                    f"r{r}.m{mb}.ig{i}", r, prev, ig_t * ns, ig_c, ig_b, f"input grad {name}"
                )
                prev = b.op(
                    f"r{r}.m{mb}.wg{i}",
                    r,
                    "compute",
                    [prev],
                    duration=wg_t * ns,
                    label=f"weight grad {name}",
                )
                c = comm(wg_c, "DP", r)
                if mb == ga - 1 and c and wg_b:
                    wg_done[i] = b.op(
                        f"r{r}.wgc{i}",
                        r,
                        "collective",
                        [prev],
                        op=c[0],
                        group=c[1],
                        bytes=wg_b,
                        stream="dp",
                        label=f"weight grad {name}",
                    )
        for i, layer in enumerate(layers):
            prev = b.op(
                f"r{r}.upd{i}",
                r,
                "compute",
                [prev, wg_done[i]],
                duration=layer[10] * ns,
                label=f"update {layer[0]}",
            )
    return b.build()
