"""Chakra execution traces (``.et``): read them as ccsim workloads, write ccsim's out.

Chakra (MLCommons) is the trace format of ASTRA-sim and of PyTorch's execution-trace
observer (through Chakra's converter). A trace is one file per rank, named
``<prefix>.<rank>.et``; each is a stream of protobuf messages, each preceded by its
length as a varint: first a ``GlobalMetadata``, then ``Node`` messages (the schema is in
:mod:`simulator.workload.chakra_schema`).

What ``ccsim run`` accepts (:func:`chakra_files`)
    a prefix (``traces/step`` for ``traces/step.0.et`` ... ``traces/step.7.et``, as
    ASTRA-sim's ``--workload-configuration`` takes it; ``traces/step.et`` means the same
    when no such file exists), a folder holding one such sequence, or a single ``.et``
    file, which is a *one-rank* workload (rank 0): a trace of one GPU, whose collectives
    can only span itself. A file that is one rank of a sequence is refused with a pointer
    to its prefix, since simulating one rank of a job alone would hang its collectives.
    Ranks must run from 0 without a gap.

How nodes map (:func:`load_chakra`)
    ``COMP_NODE``
        a compute op of ``duration_micros``; with no duration, of the FLOPs in the
        ``num_ops`` (or ``flops``) attribute and memory traffic ``tensor_size`` bytes,
        timed on the topology's GPU (its roofline); neither: zero time.
    ``COMM_COLL_NODE``
        a collective: ``comm_type`` (ALL_REDUCE, REDUCE, ALL_GATHER, BROADCAST,
        ALL_TO_ALL, REDUCE_SCATTER and REDUCE_SCATTER_BLOCK; BARRIER as an all-reduce of
        its ``comm_size``, 0 by default; GATHER and SCATTER are refused), ``comm_size``
        bytes (the whole buffer, nccl-tests' size, as ASTRA-sim uses it), over the
        process group ``pg_name``. Groups are read from PyTorch's ``process_group:init``
        metadata node (a JSON list of ``{"pg_name", "ranks"}`` in its input values, empty
        ranks meaning all, as ASTRA-sim reads it), from ``GlobalMetadata`` attributes
        whose value is a list of ranks (the attribute's name is the group's), or from the
        ``groups`` argument (ASTRA-sim's communicator-group JSON). No ``pg_name``, or
        ``"0"`` when no group "0" is defined, means every rank (ASTRA-sim's default).
    ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``
        a send to ``comm_dst`` / a receive from ``comm_src`` of ``comm_size`` bytes,
        matched by ``comm_tag`` (0 by default), k-th with k-th.
    ``METADATA_NODE``, ``INVALID_NODE``
        no op; their dependencies pass on to the nodes that depend on them.
    ``MEM_LOAD_NODE``, ``MEM_STORE_NODE``
        refused: ccsim does not model ASTRA-sim's remote memory.

    A communication node marked ``is_cpu_op`` is the host side of a call (PyTorch's
    ``c10d::allreduce_``): CPU time like a CPU compute node.

    ``data_deps`` and ``ctrl_deps`` are both dependencies (ASTRA-sim's feeder resolves
    both; ``ctrl_deps=False`` follows data only). Streams: a GPU node's ``stream``
    attribute (the CUDA stream PyTorch recorded) names its stream; otherwise GPU compute
    runs on ``compute``, CPU nodes (``is_cpu_op``) on ``cpu``, collectives and sends on
    ``comm`` and receives on ``recv`` -- ASTRA-sim's one compute, one CPU and one
    communication resource per rank, which lets receives through. A stream runs its
    nodes in dependency order, ties in file order. ``involved_dim`` (ASTRA-sim's choice
    of network dimensions) and ``comm_priority`` are ignored: ccsim routes on the
    topology.

What ccsim writes (:func:`write_chakra`, :func:`write_chakra_schedule`)
    Files ASTRA-sim reads (``GlobalMetadata`` version 0.0.4, the attribute types of
    Chakra's generator and converter, process groups numbered from 1 in a
    ``process_group:init`` node, each stream's order as ``ctrl_deps``) plus attributes
    named ``ccsim_*`` that make the way back exact: exact durations and byte counts
    (Chakra stores whole microseconds and bytes), GEMM shapes, streams, labels, group
    names and kinds. ASTRA-sim ignores attributes it does not know.
"""

from __future__ import annotations

import gzip
import heapq
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..algorithms.schedule import PATH_DEFAULT, Schedule, topological_order
from ..errors import shown
from ..files import write_file
from .chakra_schema import COMM_TYPES, NODE_TYPES, messages, protobuf
from .devices import Device
from .kernels import kernels_time
from .trace import FORMAT, Op, Workload, WorkloadError, parse_workload

#: The ``GlobalMetadata.version`` ccsim writes: Chakra's schema as ASTRA-sim's examples and
#: PyTorch's converter (``1.0.2-chakra.0.0.4``) carry it; later versions kept the fields.
ET_VERSION = "0.0.4"
#: Name of the metadata node holding process groups (PyTorch's execution-trace label).
PG_NODE_NAME = "[pytorch|profiler|execution_trace|process_group:init]"

_NAMES = {number: name for name, number in NODE_TYPES.items()}
_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")
_PASSTHROUGH = (NODE_TYPES["METADATA_NODE"], NODE_TYPES["INVALID_NODE"])
_MEMORY = (NODE_TYPES["MEM_LOAD_NODE"], NODE_TYPES["MEM_STORE_NODE"])
_CTRL_HINT = (
    "; older PyTorch converters wrote the calling op as one: "
    "load_chakra(..., ctrl_deps=False) follows data_deps only"
)
_COMM_OPS = {
    COMM_TYPES["ALL_REDUCE"]: "all_reduce",
    COMM_TYPES["REDUCE"]: "reduce",
    COMM_TYPES["ALL_GATHER"]: "all_gather",
    COMM_TYPES["BROADCAST"]: "broadcast",
    COMM_TYPES["ALL_TO_ALL"]: "all_to_all",
    COMM_TYPES["REDUCE_SCATTER"]: "reduce_scatter",
    # NCCL's reduce-scatter is the equal-block one.
    COMM_TYPES["REDUCE_SCATTER_BLOCK"]: "reduce_scatter",
    # A barrier synchronises like an all-reduce of (almost) nothing, as NCCL runs it.
    COMM_TYPES["BARRIER"]: "all_reduce",
}
_CHAKRA_OPS = {
    "all_reduce": "ALL_REDUCE",
    "reduce": "REDUCE",
    "all_gather": "ALL_GATHER",
    "broadcast": "BROADCAST",
    "all_to_all": "ALL_TO_ALL",
    "reduce_scatter": "REDUCE_SCATTER",
}


class ChakraError(WorkloadError):
    """A Chakra trace cannot be read, or a workload cannot be written as one."""


@dataclass
class ChakraFile:
    """One rank's trace as read: its ``GlobalMetadata`` and its nodes in file order.

    ``attrs`` maps the metadata's attribute names to their values (lists for the
    ``*_list`` kinds); ``nodes`` are ``ChakraProtoMsg.Node`` messages.
    """

    path: Path
    version: str
    attrs: dict[str, Any]
    nodes: list[Any] = field(repr=False)


# -- reading ------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as problem:
        raise ChakraError(
            f"{path}: cannot read the Chakra trace: {problem.strerror or problem}"
        ) from None
    if data[:2] == b"\x1f\x8b":  # Chakra's own tools read gzipped traces too
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as problem:
            raise ChakraError(f"{path}: a damaged gzip file: {problem}") from None
    return data


def _frames(data: bytes, path: Path, last: list[int | None]) -> Iterable[tuple[int, int, bytes]]:
    """(index, byte offset, message bytes) of each length-delimited message.

    ``last[0]`` is kept by the caller as the id of the last node read, for messages.
    """
    pos, index, size = 0, 0, len(data)
    while pos < size:
        start, value, shift = pos, 0, 0
        while True:
            if pos >= size:
                raise ChakraError(
                    f"{path}: truncated: the file ends inside the length prefix of message "
                    f"{index} (byte {start}){_after(last[0])}"
                )
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 64:
                raise ChakraError(
                    f"{path}: bad varint: the length prefix of message {index} (byte {start}) "
                    f"runs past 10 bytes{_after(last[0])}; not a Chakra trace, or damaged"
                )
        if value > size - pos:
            raise ChakraError(
                f"{path}: truncated: message {index} (byte {start}) declares {value} bytes but "
                f"only {size - pos} remain{_after(last[0])}; the file was cut short, or is "
                "not a Chakra trace"
            )
        yield index, start, data[pos : pos + value]
        pos += value
        index += 1


def _after(node_id: int | None) -> str:
    return f", after node id {node_id}" if node_id is not None else ""


def _attr_value(attr: Any) -> Any:
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    return list(value.values) if kind.endswith("_list") else value


def read_chakra_file(path: str | Path) -> ChakraFile:
    """Decode one rank's ``.et`` file (gzipped or not).

    Raises a :class:`ChakraError` naming the file, the message and the last node id read
    for a bad varint, a truncated message, bytes that are not the message they should
    be, a duplicate node id or a node of unknown type.
    """
    protobuf()
    from google.protobuf.message import DecodeError

    path = Path(path)
    classes = messages()
    data = _read_bytes(path)
    if not data:
        raise ChakraError(f"{path}: empty; a Chakra trace starts with a GlobalMetadata message")
    last: list[int | None] = [None]
    metadata = None
    nodes: list[Any] = []
    seen: set[int] = set()
    for index, start, raw in _frames(data, path, last):
        what = "GlobalMetadata" if index == 0 else "Node"
        # GlobalMetadata's fields are all length-delimited (tags 0x0a, 0x12): any other
        # first byte is a trace without its metadata, which protobuf would read silently.
        if index == 0 and raw and raw[0] not in (0x0A, 0x12):
            raise ChakraError(
                f"{path}: the first message is not a GlobalMetadata; Chakra traces start with "
                "one (ASTRA-sim's feeder reads it first)"
            )
        message = classes.GlobalMetadata() if index == 0 else classes.Node()
        try:
            message.ParseFromString(raw)
        except (DecodeError, RuntimeError, ValueError) as problem:
            raise ChakraError(
                f"{path}: message {index} (byte {start}) is not a valid Chakra {what}"
                f"{_after(last[0])}: {problem}"
            ) from None
        if index == 0:
            metadata = message
            continue
        if message.type not in _NAMES:
            raise ChakraError(
                f"{path}: node id {message.id} has unknown type {message.type}; Chakra's "
                "types are " + ", ".join(f"{n} ({v})" for n, v in NODE_TYPES.items())
            )
        if message.id in seen:
            raise ChakraError(f"{path}: node id {message.id} is used twice")
        seen.add(message.id)
        nodes.append(message)
        last[0] = message.id
    assert metadata is not None  # data is not empty, so message 0 was read
    attrs = {attr.name: _attr_value(attr) for attr in metadata.attr}
    return ChakraFile(path, metadata.version, attrs, nodes)


def _rank_files(folder: Path, prefix: str) -> dict[int, Path]:
    found: dict[int, Path] = {}
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return found
    for child in children:
        match = _RANK_FILE.match(child.name)
        if match and match["prefix"] == prefix and child.is_file():
            rank = int(match["rank"])
            if rank in found:
                raise ChakraError(
                    f"{folder}: both {found[rank].name} and {child.name} claim rank {rank}"
                )
            found[rank] = child
    return found


def _sequence(folder: Path, prefix: str, found: dict[int, Path]) -> list[Path]:
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        shown_missing = ", ".join(f"{prefix}.{rank}.et" for rank in missing[:4])
        raise ChakraError(
            f"{folder / prefix}: rank file{'s' if len(missing) > 1 else ''} {shown_missing}"
            f"{' ...' if len(missing) > 4 else ''} missing from the sequence (found ranks up "
            f"to {max(found)}); a Chakra trace has one file per rank, 0 to N-1"
        )
    return [found[rank] for rank in range(len(found))]


def _prefix_of(path: Path) -> Path:
    return path.with_name(path.name[: -len(".et")]) if path.name.endswith(".et") else path


def is_chakra_source(source: str | Path) -> bool:
    """Whether a workload argument names a Chakra trace: a ``.et`` file or name, a folder,
    or a prefix with a ``<prefix>.0.et`` file (see the module docstring)."""
    path = Path(source)
    if path.is_file():
        return path.suffix == ".et"
    if path.is_dir() or path.suffix == ".et":
        return True
    return bool(_rank_files(path.parent, path.name))


def chakra_files(source: str | Path) -> list[Path]:
    """The rank files of a trace, in rank order (see the module docstring)."""
    path = Path(source)
    if path.is_dir():
        groups: dict[str, dict[int, Path]] = {}
        others = []
        for child in sorted(path.iterdir()):
            if child.suffix != ".et" or not child.is_file():
                continue
            match = _RANK_FILE.match(child.name)
            if not match:
                others.append(child.name)
                continue
            groups.setdefault(match["prefix"], {})
        if not groups:
            raise ChakraError(
                f"{path}: the folder holds no Chakra rank files named <prefix>.<rank>.et"
                + (f" (only {', '.join(others[:3])})" if others else "")
            )
        if len(groups) > 1 or others:
            names = [f"{prefix}.*.et" for prefix in sorted(groups)] + others[:3]
            raise ChakraError(
                f"{path}: the folder holds more than one trace ({', '.join(names)}); pass "
                f"the prefix of one, e.g. {path / sorted(groups)[0]}"
            )
        (prefix,) = groups
        return _sequence(path, prefix, _rank_files(path, prefix))
    if path.is_file():
        match = _RANK_FILE.match(path.name)
        if match:
            siblings = _rank_files(path.parent, match["prefix"])
            if len(siblings) > 1:
                prefix = path.parent / match["prefix"]
                raise ChakraError(
                    f"{path} is rank {match['rank']} of the {len(siblings)}-file trace "
                    f"{prefix}.*.et; pass the prefix {str(prefix)!r} or its folder to "
                    "simulate every rank (a single .et file is a one-rank workload)"
                )
        return [path]
    prefix = _prefix_of(path)
    found = _rank_files(prefix.parent, prefix.name)
    if not found:
        raise ChakraError(
            f"{path}: no Chakra trace here: not a file, a folder, nor a prefix of "
            f"{prefix}.0.et, {prefix}.1.et, ..."
        )
    return _sequence(prefix.parent, prefix.name, found)


@dataclass
class _Group:
    ranks: list[int] | None  # None: every rank
    name: str
    kind: str
    origin: str


def _pg_entries(node: Any, path: Path) -> list[dict]:
    """The process groups of a ``process_group:init`` node: PyTorch stores them as the
    string form of a one-element Python list holding a JSON list, ``['[{...}]']``."""
    text = node.inputs.values.strip()
    if not text:
        return []
    if text[:2] in ("['", '["') and text[-2:] in ("']", '"]'):
        text = text[2:-2]  # as ASTRA-sim's issue_pytorch_pg_metadata strips it
    try:
        entries = json.loads(text)
    except ValueError as problem:
        raise ChakraError(
            f"{path}: node id {node.id} (process_group:init): its input values are not the "
            f"JSON list of process groups: {problem}"
        ) from None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and "pg_name" in e for e in entries
    ):
        raise ChakraError(
            f"{path}: node id {node.id} (process_group:init): expected a list of "
            '{"pg_name": ..., "ranks": [...]} entries'
        )
    return entries


def _process_groups(
    files: list[ChakraFile], ranks: int, given: Mapping[str, Sequence[int]] | None
) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}

    def add(pg: Any, members: Any, origin: str, name: str = "", kind: str = "") -> None:
        pg = str(pg)
        if not isinstance(members, list | tuple) or any(
            isinstance(r, bool) or not isinstance(r, int) for r in members
        ):
            raise ChakraError(f"{origin}: process group {pg!r}: ranks must be a list of integers")
        group = _Group(list(members) or None, str(name or f"pg{pg}"), str(kind), origin)
        if pg in groups and groups[pg].ranks != group.ranks:
            raise ChakraError(
                f"process group {pg!r} is defined twice with different ranks: "
                f"{shown(groups[pg].ranks)} in {groups[pg].origin}, {shown(group.ranks)} in "
                f"{origin}"
            )
        groups.setdefault(pg, group)

    for pg, members in (given or {}).items():
        add(pg, list(members), "the groups argument")
    for file in files:
        for name, value in file.attrs.items():
            if (
                isinstance(value, list)
                and not name.startswith("ccsim_")
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            ):
                add(name, value, f"{file.path} (GlobalMetadata)")
        for node in file.nodes:
            if node.type == NODE_TYPES["METADATA_NODE"] and "process_group:init" in node.name:
                for entry in _pg_entries(node, file.path):
                    add(
                        entry["pg_name"],
                        entry.get("ranks", []),
                        f"{file.path} node id {node.id}",
                        entry.get("ccsim_name", ""),
                        entry.get("ccsim_kind", ""),
                    )
    return groups


def _integer(attrs: dict, key: str, where: str, default: int | None = None) -> int:
    if key not in attrs:
        if default is None:
            raise ChakraError(f"{where}: lacks the {key!r} attribute, which it needs")
        return default
    value = attrs[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChakraError(f"{where}: attribute {key!r} must be an integer, got {shown(value)}")
    return value


def _topological(count: int, preds: list[list[int]]) -> list[int]:
    """Positions in an order that respects ``preds``, ties in position order; positions
    on a cycle are left out."""
    pending = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in range(count)]
    for pos, deps in enumerate(preds):
        for dep in deps:
            succs[dep].append(pos)
    ready = [pos for pos in range(count) if not pending[pos]]
    heapq.heapify(ready)
    order = []
    while ready:
        pos = heapq.heappop(ready)
        order.append(pos)
        for succ in succs[pos]:
            pending[succ] -= 1
            if not pending[succ]:
                heapq.heappush(ready, succ)
    return order


def _compute_fields(attrs: dict, node: Any, where: str) -> dict[str, Any]:
    if "ccsim_duration_s" in attrs:
        return {"duration": float(attrs["ccsim_duration_s"])}
    if any(
        key in attrs for key in ("ccsim_flops", "ccsim_gemms", "ccsim_attention", "ccsim_bytes")
    ):
        fields: dict[str, Any] = {"flops": float(attrs.get("ccsim_flops", 0.0))}
        if attrs.get("ccsim_bytes"):
            fields["bytes"] = float(attrs["ccsim_bytes"])
        for attr, field_name in (("ccsim_gemms", "gemms"), ("ccsim_attention", "attention")):
            flat = attrs.get(attr) or []
            if len(flat) % 6:
                raise ChakraError(f"{where}: attribute {attr!r} must hold 6 integers a kernel")
            if flat:
                fields[field_name] = [list(flat[i : i + 6]) for i in range(0, len(flat), 6)]
        return fields
    if node.duration_micros:
        return {"duration": node.duration_micros * 1e-6}
    for key in ("num_ops", "flops"):
        if key in attrs:
            flops = attrs[key]
            if isinstance(flops, bool) or not isinstance(flops, int | float) or flops < 0:
                raise ChakraError(f"{where}: attribute {key!r} must be a number of FLOPs")
            fields = {"flops": float(flops)}
            if "tensor_size" in attrs:
                fields["bytes"] = float(_integer(attrs, "tensor_size", where))
            return fields
    return {"duration": 0.0}


def _rank_ops(
    file: ChakraFile,
    rank: int,
    ranks: int,
    pgs: dict[str, _Group],
    groups: dict[str, dict],
    ctrl_deps: bool = True,
) -> list[dict]:
    path, nodes = file.path, file.nodes
    position = {node.id: pos for pos, node in enumerate(nodes)}
    preds: list[list[int]] = []
    for node in nodes:
        deps = []
        for dep in dict.fromkeys([*node.data_deps, *(node.ctrl_deps if ctrl_deps else ())]):
            if dep not in position:
                control = dep not in node.data_deps
                raise ChakraError(
                    f"{path}: node id {node.id} depends on node id {dep}, which the file "
                    "does not hold" + (f" (a control dependency{_CTRL_HINT})" if control else "")
                )
            if dep == node.id:
                raise ChakraError(f"{path}: node id {node.id} depends on itself")
            deps.append(position[dep])
        preds.append(deps)
    order = _topological(len(nodes), preds)
    if len(order) < len(nodes):
        placed = set(order)
        stuck = [nodes[pos].id for pos in range(len(nodes)) if pos not in placed][:6]
        data_only = [[position[d] for d in node.data_deps if d in position] for node in nodes]
        hint = ""
        if ctrl_deps and len(_topological(len(nodes), data_only)) == len(nodes):
            hint = f"; the control dependencies close it{_CTRL_HINT}"
        raise ChakraError(
            f"{path}: the dependencies of node ids {stuck} form a cycle; none can start{hint}"
        )
    op_id = [f"{path.name}:{node.id}" for node in nodes]
    forwarded: dict[int, list[str]] = {}  # metadata and invalid nodes: their deps
    ops = []
    for pos in order:
        node = nodes[pos]
        deps: list[str] = []
        for dep in preds[pos]:
            deps.extend(forwarded[dep] if dep in forwarded else [op_id[dep]])
        deps = list(dict.fromkeys(deps))
        if node.type in _PASSTHROUGH:
            forwarded[pos] = deps
            continue
        where = f"{path}: node id {node.id} ({_NAMES[node.type]})"
        attrs = {attr.name: _attr_value(attr) for attr in node.attr}
        cpu = bool(attrs.get("is_cpu_op", False))
        op: dict[str, Any] = {"id": op_id[pos], "rank": rank}
        if deps:
            op["deps"] = deps
        label = attrs.get("ccsim_label", node.name)
        if label:
            op["label"] = str(label)
        if node.type == NODE_TYPES["COMP_NODE"] or (cpu and node.type not in _MEMORY):
            # A communication node on the CPU is the host side of a call (PyTorch's
            # c10d::allreduce_ launching the NCCL kernel node): its time on the CPU.
            op.update(kind="compute", **_compute_fields(attrs, node, where))
            default = "cpu" if cpu else "compute"
        elif node.type == NODE_TYPES["COMM_COLL_NODE"]:
            op.update(
                kind="collective", **_collective_fields(attrs, where, rank, ranks, pgs, groups)
            )
            default = "comm"
        elif node.type in (NODE_TYPES["COMM_SEND_NODE"], NODE_TYPES["COMM_RECV_NODE"]):
            send = node.type == NODE_TYPES["COMM_SEND_NODE"]
            me, other = ("comm_src", "comm_dst") if send else ("comm_dst", "comm_src")
            if _integer(attrs, me, where, default=rank) != rank:
                raise ChakraError(
                    f"{where}: {me} is {attrs[me]}, but the node is in rank {rank}'s file"
                )
            op.update(
                kind="send" if send else "recv",
                peer=_integer(attrs, other, where),
                bytes=float(attrs.get("ccsim_bytes", _integer(attrs, "comm_size", where))),
                tag=str(attrs.get("ccsim_tag", _integer(attrs, "comm_tag", where, default=0))),
            )
            default = "comm" if send else "recv"
        else:
            raise ChakraError(
                f"{where}: remote-memory nodes (ASTRA-sim's MEM_LOAD/MEM_STORE) are not "
                "modelled by ccsim; remove them or give the time as a COMP_NODE"
            )
        if "ccsim_stream" in attrs:
            op["stream"] = str(attrs["ccsim_stream"])
        elif "stream" in attrs and not cpu:
            op["stream"] = f"stream{attrs['stream']}"
        else:
            op["stream"] = default
        ops.append(op)
    return ops


def _collective_fields(
    attrs: dict, where: str, rank: int, ranks: int, pgs: dict[str, _Group], groups: dict
) -> dict[str, Any]:
    comm_type = _integer(attrs, "comm_type", where)
    if comm_type not in _COMM_OPS:
        names = {v: k for k, v in COMM_TYPES.items()}
        raise ChakraError(
            f"{where}: comm_type {comm_type} ({names.get(comm_type, 'unknown')}) is not "
            "modelled; ccsim runs "
            + ", ".join(sorted(set(_CHAKRA_OPS.values())))
            + ", REDUCE_SCATTER_BLOCK and BARRIER"
        )
    barrier = comm_type == COMM_TYPES["BARRIER"]
    size = attrs.get("ccsim_bytes", _integer(attrs, "comm_size", where, 0 if barrier else None))
    pg = str(attrs.get("pg_name", "") or "")
    if pg in pgs:
        group = pgs[pg]
    elif pg in ("", "0"):
        group = _Group(None, "world", "", "the default group")
    else:
        raise ChakraError(
            f"{where}: process group {pg!r} is not defined (no process_group:init node or "
            "GlobalMetadata attribute names it); define it, or give the groups"
        )
    members = group.ranks if group.ranks is not None else list(range(ranks))
    outside = [r for r in members if not 0 <= r < ranks]
    if outside:
        raise ChakraError(
            f"{where}: process group {pg!r} ({group.origin}) names rank {outside[0]}, but the "
            f"trace has {ranks} rank file{'s' if ranks > 1 else ''}"
        )
    if rank not in members:
        raise ChakraError(
            f"{where}: rank {rank} issues a collective on process group {pg!r}, which holds "
            f"ranks {shown(members)} only"
        )
    name = group.name
    while name in groups and groups[name]["ranks"] != members:
        name += "'"  # two process groups reusing one name
    groups[name] = {"kind": group.kind, "ranks": members}
    fields: dict[str, Any] = {"op": _COMM_OPS[comm_type], "group": name, "bytes": float(size)}
    if attrs.get("ccsim_algorithm"):
        fields["algorithm"] = str(attrs["ccsim_algorithm"])
    for key in ("chunks", "channels"):
        if f"ccsim_{key}" in attrs:
            fields[key] = _integer(attrs, f"ccsim_{key}", where)
    return fields


def load_chakra(
    source: str | Path,
    *,
    groups: Mapping[str, Sequence[int]] | None = None,
    ctrl_deps: bool = True,
) -> Workload:
    """Read a Chakra trace (a prefix, a folder or one file) as a :class:`Workload`.

    ``groups`` maps process-group names to their ranks, as ASTRA-sim's
    ``--comm-group-configuration`` JSON does, for traces that do not define them.
    ``ctrl_deps=False`` follows ``data_deps`` only, for traces whose control
    dependencies record the calling op rather than an order (older PyTorch converters;
    they can close cycles). See the module docstring for what is mapped and how.
    """
    paths = chakra_files(source)
    files = [read_chakra_file(path) for path in paths]
    ranks = len(files)
    pgs = _process_groups(files, ranks, groups)
    ccsim_groups: dict[str, dict] = {}
    ops: list[dict] = []
    for rank, file in enumerate(files):
        ops.extend(_rank_ops(file, rank, ranks, pgs, ccsim_groups, ctrl_deps))
    if not ops:
        raise ChakraError(f"{source}: the trace holds no compute or communication node")
    first = files[0]
    stem = _prefix_of(paths[0]).name if ranks == 1 else _RANK_FILE.match(paths[0].name)["prefix"]
    data = {
        "format": FORMAT,
        "name": str(first.attrs.get("ccsim_name") or stem),
        "description": str(
            first.attrs.get("ccsim_description")
            or f"imported from the Chakra trace {source} (version {first.version or '?'})"
        ),
        "ranks": ranks,
        "groups": ccsim_groups,
        "ops": ops,
    }
    workload = parse_workload(data, origin=str(source))
    workload.model_flops = float(first.attrs.get("ccsim_model_flops", 0.0) or 0.0)
    workload.precision = str(first.attrs.get("ccsim_precision") or "bf16")
    return workload


# -- writing ------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _framed(message: Any) -> bytes:
    raw = message.SerializeToString()
    return _varint(len(raw)) + raw


def _attr(classes: Any, name: str, kind: str, value: Any) -> Any:
    if kind.endswith("_list"):
        list_class = getattr(classes, kind[0].upper() + kind[1:-5] + "List")
        return classes.AttributeProto(name=name, **{kind: list_class(values=value)})
    return classes.AttributeProto(name=name, **{f"{kind}_val": value})


def _exact(attrs: list, name: str, value: float) -> int:
    """``value`` rounded to an integer for Chakra; the exact one as a ``ccsim_`` double
    when they differ."""
    whole = round(value)
    if whole != value:
        attrs.append((name, "double", float(value)))
    return whole


def _metadata(classes: Any, attrs: list[tuple[str, str, Any]]) -> Any:
    return classes.GlobalMetadata(
        version=ET_VERSION, attr=[_attr(classes, *entry) for entry in attrs]
    )


def _pg_node(classes: Any, node_id: int, entries: list[dict]) -> Any:
    text = json.dumps(entries, separators=(", ", ": ")).replace("'", "\\u0027")
    node = classes.Node(id=node_id, name=PG_NODE_NAME, type=NODE_TYPES["METADATA_NODE"])
    node.inputs.values = f"['{text}']"  # the form ASTRA-sim strips (see _pg_entries)
    node.inputs.types = "['String']"
    return node


def chakra_traces(workload: Workload, *, device: Device | None = None) -> list[bytes]:
    """The bytes of each rank's ``.et`` file for ``workload`` (see :func:`write_chakra`)."""
    classes = messages()
    pg_of = {name: str(k + 1) for k, name in enumerate(workload.groups)}
    entries = [
        {
            "pg_name": pg_of[g.name],
            "pg_desc": g.name,
            "ranks": g.ranks,
            "group_size": len(g.ranks),
            "ccsim_name": g.name,
            "ccsim_kind": g.kind,
        }
        for g in workload.groups.values()
    ]
    tags = {tag: k for k, tag in enumerate(sorted({op.tag for op in workload.ops}))}
    meta = [("ccsim_name", "string", workload.name)]
    if workload.description:
        meta.append(("ccsim_description", "string", workload.description))
    if workload.model_flops:
        meta.append(("ccsim_model_flops", "double", float(workload.model_flops)))
        meta.append(("ccsim_precision", "string", workload.precision))
    header = _framed(_metadata(classes, meta))
    per_rank: list[list[Op]] = [[] for _ in range(workload.ranks)]
    for op in workload.ops:
        per_rank[op.rank].append(op)
    files = []
    for rank, ops in enumerate(per_rank):
        local = {op.index: k for k, op in enumerate(ops)}
        preds: list[list[int]] = []
        stream_pred: list[int | None] = []
        last: dict[str, int] = {}
        for k, op in enumerate(ops):
            deps = []
            for dep in op.deps:
                if dep not in local:
                    other = workload.ops[dep]
                    raise ChakraError(
                        f"{workload.name}: op {op.id!r} (rank {rank}) depends on op "
                        f"{other.id!r} of rank {other.rank}; Chakra dependencies stay within "
                        "one rank's file, so this workload cannot be written as Chakra"
                    )
                deps.append(local[dep])
            stream_pred.append(last.get(op.stream))
            last[op.stream] = k
            preds.append(deps + ([stream_pred[k]] if stream_pred[k] is not None else []))
        order = _topological(len(ops), preds)
        node_id = {k: n + 1 for n, k in enumerate(order)}  # 0 is the groups' node
        chunks = [header]
        if entries:
            chunks.append(_framed(_pg_node(classes, 0, entries)))
        for k in order:
            op = ops[k]
            node = _op_node(classes, op, rank, workload, pg_of, tags, device)
            node.id = node_id[k]
            data_deps = [node_id[d] for d in dict.fromkeys(preds[k][: len(op.deps)])]
            node.data_deps.extend(data_deps)
            if stream_pred[k] is not None and node_id[stream_pred[k]] not in data_deps:
                node.ctrl_deps.append(node_id[stream_pred[k]])
            chunks.append(_framed(node))
        files.append(b"".join(chunks))
    return files


def _op_node(
    classes: Any,
    op: Op,
    rank: int,
    workload: Workload,
    pg_of: dict[str, str],
    tags: dict[str, int],
    device: Device | None,
) -> Any:
    attrs: list[tuple[str, str, Any]] = [("is_cpu_op", "bool", False)]
    node = classes.Node(name=op.id)
    if op.kind == "compute":
        node.type = NODE_TYPES["COMP_NODE"]
        if op.duration is not None:
            node.duration_micros = round(op.duration * 1e6)
            attrs.append(("ccsim_duration_s", "double", float(op.duration)))
        else:
            hbm = op.mem_bytes + sum(gemm.hbm_bytes for gemm in op.gemms)
            attrs += [
                ("num_ops", "int64", round(op.total_flops)),
                ("tensor_size", "uint64", round(hbm)),
                ("ccsim_flops", "double", float(op.flops)),
            ]
            if op.mem_bytes:
                attrs.append(("ccsim_bytes", "double", float(op.mem_bytes)))
            if op.gemms:
                flat = [v for g in op.gemms for v in (g.m, g.n, g.k, g.batch, g.count, g.bits)]
                attrs.append(("ccsim_gemms", "int64_list", flat))
            if op.attention:
                flat = [v for kernel in op.attention for v in kernel.as_list()]
                attrs.append(("ccsim_attention", "int64_list", flat))
            if device is not None:
                seconds = kernels_time(device, op.gemms, op.attention)
                seconds += device.compute_time(op.flops, op.mem_bytes)
                node.duration_micros = round(seconds * 1e6)
    elif op.kind == "collective":
        node.type = NODE_TYPES["COMM_COLL_NODE"]
        if op.op not in _CHAKRA_OPS:
            raise ChakraError(f"{workload.name}: op {op.id!r}: Chakra has no collective {op.op!r}")
        size = _exact(attrs, "ccsim_bytes", op.nbytes)
        attrs += [
            ("comm_type", "int64", COMM_TYPES[_CHAKRA_OPS[op.op]]),
            ("comm_size", "int64", size),
            ("pg_name", "string", pg_of[op.group]),
        ]
        if op.algorithm:
            attrs.append(("ccsim_algorithm", "string", op.algorithm))
        if op.chunks != 1:
            attrs.append(("ccsim_chunks", "int64", op.chunks))
        if op.channels != 1:
            attrs.append(("ccsim_channels", "int64", op.channels))
    else:
        send = op.kind == "send"
        node.type = NODE_TYPES["COMM_SEND_NODE" if send else "COMM_RECV_NODE"]
        src, dst = (rank, op.peer) if send else (op.peer, rank)
        size = _exact(attrs, "ccsim_bytes", op.nbytes)
        attrs += [
            ("comm_src", "int32", src),
            ("comm_dst", "int32", dst),
            ("comm_size", "int64", size),
            ("comm_tag", "int32", tags[op.tag]),
        ]
        if op.tag:
            attrs.append(("ccsim_tag", "string", op.tag))
    attrs.append(("ccsim_stream", "string", op.stream))
    if op.label:
        attrs.append(("ccsim_label", "string", op.label))
    node.attr.extend(_attr(classes, *entry) for entry in attrs)
    return node


def _check_prefix(prefix: str | Path, ranks: int) -> Path:
    """The prefix to write ``ranks`` files under (``x.et`` means ``x``); refuses one whose
    folder holds rank files past ``ranks`` from an earlier export, which a reader would
    take as part of the new trace."""
    path = _prefix_of(Path(prefix))
    stale = sorted(r for r in _rank_files(path.parent, path.name) if r >= ranks)
    if stale:
        raise ChakraError(
            f"{path}.{stale[0]}.et exists (from an earlier, larger trace?) and would be read "
            f"as rank {stale[0]} of this {ranks}-rank one; remove "
            f"{path}.{{{stale[0]}..{stale[-1]}}}.et or choose another prefix"
        )
    return path


def _write_all(path: Path, traces: list[bytes]) -> list[Path]:
    return [write_file(f"{path}.{rank}.et", data) for rank, data in enumerate(traces)]


def write_chakra(
    workload: Workload, prefix: str | Path, *, device: Device | None = None
) -> list[Path]:
    """Write ``workload`` as a Chakra trace, ``<prefix>.<rank>.et`` per rank.

    ``prefix`` may end in ``.et`` (``step.et`` writes ``step.0.et``, ...). Compute ops
    timed by FLOPs or GEMM shapes carry ``num_ops`` and ``tensor_size`` (ASTRA-sim's
    roofline inputs); with ``device`` they also get ``duration_micros`` as ccsim times
    them on it, which is what ASTRA-sim replays without its roofline. A dependency
    between ranks cannot be written (Chakra's stay in one file) and is refused. Returns
    the files written.
    """
    path = _check_prefix(prefix, workload.ranks)
    return _write_all(path, chakra_traces(workload, device=device))


def schedule_traces(schedule: Schedule) -> list[bytes]:
    """The bytes of each rank's ``.et`` file for ``schedule`` (see
    :func:`write_chakra_schedule`)."""
    classes = messages()
    n = schedule.n_ops
    src, dst = schedule.src.tolist(), schedule.dst.tolist()
    rerouted = [i for i in range(n) if schedule.path[i] != PATH_DEFAULT]
    if rerouted:
        i = rerouted[0]
        raise ChakraError(
            f"{schedule.algorithm} {schedule.op}: op {i} takes path {schedule.path[i]} (the "
            "NICs' route, or into or out of a reducing switch), which Chakra send/recv nodes "
            "cannot express; export an algorithm whose transfers take the default route"
        )
    order = topological_order(schedule).tolist()
    if len(order) < n:
        raise ChakraError(f"{schedule.algorithm} {schedule.op}: the schedule has a cycle")
    # Node ids per rank: op i is a send in src[i]'s file and a receive in dst[i]'s.
    next_id = [1] * schedule.ranks
    send_id, recv_id = [0] * n, [0] * n
    for i in order:
        send_id[i], next_id[src[i]] = next_id[src[i]], next_id[src[i]] + 1
        recv_id[i], next_id[dst[i]] = next_id[dst[i]], next_id[dst[i]] + 1
    send_deps: list[list[int]] = [[] for _ in range(n)]
    recv_deps: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        ends = (src[i], dst[i])
        for k in range(schedule.dep_ptr[i], schedule.dep_ptr[i + 1]):
            j, sent = int(schedule.dep_idx[k]), bool(schedule.dep_sent[k])
            # Where op j's completion is seen: its receive ("done": delivered) or its send
            # (which ends when delivered too, a little late for a "sent" dependency); the
            # dependency goes on whichever side of op i lives in that rank. A transfer
            # starts once both its send and its receive are issued, so a dependency on the
            # receiving side holds op i back as well.
            seen = [(src[j], send_id[j]), (dst[j], recv_id[j])]
            if not sent:
                seen.reverse()
            for where, node in seen:
                if where in ends:
                    (send_deps if where == src[i] else recv_deps)[i].append(node)
                    break
            else:
                raise ChakraError(
                    f"{schedule.algorithm} {schedule.op}: op {i} ({src[i]} -> {dst[i]}) waits "
                    f"for op {j} ({src[j]} -> {dst[j]}), which neither of its ranks takes "
                    "part in; Chakra dependencies stay within one rank"
                )
    per_rank: list[list[tuple[int, Any]]] = [[] for _ in range(schedule.ranks)]
    label = f"{schedule.algorithm} {schedule.op}"
    for i in order:
        for send in (True, False):
            rank = src[i] if send else dst[i]
            node = classes.Node(
                id=send_id[i] if send else recv_id[i],
                name=f"{label} op {i} {'send' if send else 'recv'}",
                type=NODE_TYPES["COMM_SEND_NODE" if send else "COMM_RECV_NODE"],
                data_deps=sorted(set(send_deps[i] if send else recv_deps[i])),
            )
            attrs: list[tuple[str, str, Any]] = [("is_cpu_op", "bool", False)]
            size = _exact(attrs, "ccsim_bytes", float(schedule.nbytes[i]))
            attrs += [
                ("comm_src", "int32", src[i]),
                ("comm_dst", "int32", dst[i]),
                ("comm_size", "int64", size),
                ("comm_tag", "int32", i),
                # Every transfer its own stream: a schedule's ops wait for their
                # dependencies only, as ccsim replays schedules.
                ("ccsim_stream", "string", f"{'send' if send else 'recv'}.{i}"),
                (
                    "ccsim_label",
                    "string",
                    f"{label} step {schedule.step[i]} channel {schedule.channel[i]}",
                ),
            ]
            node.attr.extend(_attr(classes, *entry) for entry in attrs)
            per_rank[rank].append((node.id, node))
    header = _framed(
        _metadata(
            classes,
            [
                ("ccsim_name", "string", f"{schedule.algorithm}-{schedule.op}"),
                (
                    "ccsim_description",
                    "string",
                    f"ccsim's {label} schedule of {schedule.size_bytes:.0f} bytes on "
                    f"{schedule.ranks} ranks as send/recv nodes (local reductions not timed)",
                ),
            ],
        )
    )
    return [
        header + b"".join(_framed(node) for _, node in sorted(nodes, key=lambda e: e[0]))
        for nodes in per_rank
    ]


def write_chakra_schedule(schedule: Schedule, prefix: str | Path) -> list[Path]:
    """Write a collective schedule as a Chakra trace of send/recv nodes, one file a rank.

    Op ``i`` of the schedule becomes a ``COMM_SEND_NODE`` in rank ``src[i]``'s file and
    a ``COMM_RECV_NODE`` in ``dst[i]``'s, both with ``comm_tag`` ``i``. Its dependencies
    become ``data_deps`` on whichever of its two nodes lives in the rank that sees the
    awaited op complete, so ASTRA-sim (or ``ccsim run``) replays the verified algorithm
    step by step. Not carried: the local reductions' time (ASTRA-sim's send/recv do not
    reduce), the difference between "sent" and "delivered" dependencies (both wait for
    delivery), and routes other than the default (refused). Returns the files written.

    >>> import pathlib, tempfile
    >>> from simulator.algorithms import build_schedule
    >>> prefix = pathlib.Path(tempfile.mkdtemp()) / "ring"
    >>> files = write_chakra_schedule(build_schedule("ring", "all_gather", 4, 4e6), prefix)
    >>> [f.name for f in files]
    ['ring.0.et', 'ring.1.et', 'ring.2.et', 'ring.3.et']
    >>> workload = load_chakra(prefix)  # 3 steps of 4 transfers: 12 sends, 12 receives
    >>> workload.ranks, len(workload.ops), len(workload.pairs)
    (4, 24, 12)
    """
    path = _check_prefix(prefix, schedule.ranks)
    return _write_all(path, schedule_traces(schedule))


__all__ = [
    "ET_VERSION",
    "ChakraError",
    "ChakraFile",
    "chakra_files",
    "chakra_traces",
    "is_chakra_source",
    "load_chakra",
    "read_chakra_file",
    "schedule_traces",
    "write_chakra",
    "write_chakra_schedule",
]
