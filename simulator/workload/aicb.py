"""Import of SimAI/AICB workload files (the layer-wise text format SimAI replays).

Format (as SimAI's examples use it): a header line
``HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: T ep: E pp: P vpp: V ga: G
all_gpus: N checkpoints: 0 checkpoint_initiates: 0 pp_comm: S``, a line with the number
of layer lines, then one line per layer::

    name -1 fwd_time fwd_comm fwd_bytes ig_time ig_comm ig_bytes wg_time wg_comm wg_bytes update

Sources (SimAI at commit cef83f9d, AICB at 23eec3c4, the generator SimAI's docs point
to): SimAI reads the header as whitespace tokens, each field name followed by its value
(``astra-sim/workload/Workload.cc:1173-1190``; ``pp_comm`` with or without a colon,
:1257-1261). AICB writes one file that every rank replays:

* **A file is one pipeline stage.** AICB divides the model's layers by ``pp`` before it
  builds the mocked model (``utils/utils.py:698-699``) and writes that count as ``vpp``
  (``workload_generator/SimAI_training_workload_generator.py:854-861``), so the layer
  lines are the layers of one stage; SimAI runs the same lines on every rank
  (``Workload.cc:793-866``). ccsim therefore does not split the lines: every one of the
  P stages runs all of them, equal stages of the file's compute. ``vpp`` (AICB's layers
  per stage) is not read; interleaved schedules are not mapped.
* **The lines already hold the ``ga`` micro-batches.** AICB writes the per-micro-batch
  layers ``ga`` times over (``SimAI_training_workload_generator.py:641``, also :270),
  after a few once-per-step lines (the gradients' reduce-scatter and all-gather, the
  optimizer's compute: ``grad_gather``, ``grad_param_comm``, ...) and before a few more
  (``cross_entropy*``, ``optimizer*``); SimAI replays every line forward once, then
  every line backward in reverse (``Workload.cc:820-825``, :850-859), and uses ``ga``
  only in its analytical pipeline bubble, pre-bubble x (P - 1) / (ga V)
  (``astra-sim/workload/Layer.cc:504-507``). When the lines hold ``ga`` consecutive
  blocks alike in their lines' names, comm types and sizes (the longest such; times may
  differ, as AICB measures each line), ccsim takes block i as micro-batch i, the lines
  before the first as the step's *prologue* and those after the last as its
  *epilogue*. A file whose lines do not repeat so (one written by hand) is one
  micro-batch that every micro-batch runs, ``ga`` times (ccsim's reading before P > 1
  was mapped; with ``ga: 1`` both readings agree).
* **pp_comm** is the bytes each rank sends to the next stage per micro-batch: the
  activation, 2 b s h, divided by T with sequence parallelism
  (``SimAI_training_workload_generator.py:844-851``), the same size going back as its
  gradient (SimAI's exposed PP time counts 2 ga V of them, ``Layer.cc:504``). Required
  when P > 1 (SimAI warns without it, ``Workload.cc:1267-1268``).

What is mapped:

* ranks = ``all_gpus``, ordered TP fastest, then DP, then pipeline stage (Megatron's
  order, as :func:`~simulator.workload.generators.megatron`): stage s holds the N / P
  consecutive ranks from s N / P. Within a stage TP groups are consecutive blocks of T
  ranks; DP groups join the stage's ranks with the same TP index (DP = N / (T P), AICB's
  ``dp_num``, ``utils/utils.py:663``; SimAI's own communicators ignore P and span the
  stages, ``astra-sim/system/Sys.cc:1395-1396``, which ccsim does not copy); EP groups
  split each DP group into blocks of E; ``_EP`` / ``_DP_EP`` suffixes select the EP
  group / the DP ranks of one EP slot. With P > 1 group names start with ``s<stage>.``.
* Times are nanoseconds (SimAI's unit), comm sizes bytes. Types ALLREDUCE, ALLGATHER,
  REDUCESCATTER, ALLTOALL map to all_reduce, all_gather, reduce_scatter, all_to_all;
  NONE or size 0 means no communication.
* Per rank: the prologue's forward compute and comm; then the micro-batches in
  Megatron's 1F1B order (:func:`~simulator.workload.pipeline.pipeline_order`: stage s
  runs P - s - 1 warm-up forwards, then one forward and one backward in turn, then the
  rest of the backwards; with P = 1 forward and backward in turn). A micro-batch's
  forward receives the activation from the previous stage (``pp_comm`` bytes, from the
  rank with the same place in its stage), runs every block line's forward compute then
  its comm on the TP group (blocking, compute stream), and sends the activation on;
  its backward receives the gradient from the next stage, runs in reverse order each
  line's input-gradient compute and comm (TP, blocking) and weight-gradient compute,
  and sends the gradient back. Sends and receives have a stream per direction, as the
  Megatron generator's. The epilogue's forward and then its backward run once, right
  after the last micro-batch's forward (where SimAI's serial replay puts them: between
  the last forward and the first backward); the prologue's backward runs once after the
  last micro-batch's backward.
* Weight-gradient comm (DP by default) is issued once per line of the file, on a
  ``dp`` stream that overlaps the rest of the step, after that line's weight gradient
  (in a file of one micro-batch, after the last micro-batch's). The update time of each
  line of the file runs once after all gradient communication (SimAI instead adds it
  as a delay after each of the line's collectives, ``Layer.cc:70-72``, :123).

Not mapped: virtual pipeline stages, ``checkpoints`` / ``checkpoint_initiates``
(forward-in-backward recomputation) and SimAI's rounding of forward comms under 4 KiB up
to 4 KiB (``Workload.cc:813-815``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..collective.guards import OP_FLOWS, Estimate, check_flows
from ..files import read_text
from .generators import _Builder
from .pipeline import pipeline_order
from .trace import Workload, WorkloadError

_TYPES = {
    "ALLREDUCE": "all_reduce",
    "ALLGATHER": "all_gather",
    "REDUCESCATTER": "reduce_scatter",
    "ALLTOALL": "all_to_all",
}
_NS = 1e-9  # SimAI's times are nanoseconds


@dataclass(frozen=True)
class _Line:
    """One layer line: compute times (ns), comm types and sizes (bytes) of its three
    phases, and its update time (ns)."""

    name: str
    fwd_t: int
    fwd_c: str
    fwd_b: int
    ig_t: int
    ig_c: str
    ig_b: int
    wg_t: int
    wg_c: str
    wg_b: int
    update: int

    @property
    def shape(self) -> tuple:
        """What the line is and sends, without its times."""
        return (self.name, self.fwd_c, self.fwd_b, self.ig_c, self.ig_b, self.wg_c, self.wg_b)


def _header_fields(header: str) -> dict[str, str]:
    """The header's ``field: value`` pairs, read as SimAI reads them: whitespace
    tokens, a field name then its value (``pp_comm`` may lack its colon).

    >>> _header_fields("HYBRID_TRANSFORMER_FWD_IN_BCKWD ep: 2 pp: 4 vpp: 8 pp_comm 64")
    {'ep': '2', 'pp': '4', 'vpp': '8', 'pp_comm': '64'}
    """
    tokens = header.split()
    fields = {}
    for i, token in enumerate(tokens[1:-1], start=1):
        if token.endswith(":") or token == "pp_comm":
            fields[token.rstrip(":")] = tokens[i + 1]  # the last one counts, as in SimAI
    return fields


def _header_value(path: Path, fields: dict[str, str], key: str, default: int | None = None) -> int:
    """An integer header field; ``default`` when absent (None: required)."""
    if key not in fields:
        if default is None:
            raise WorkloadError(
                f"{path}: the AICB header lacks '{key}:'; SimAI/AICB headers carry "
                "model_parallel_NPU_group, ep, pp, ga and all_gpus"
            )
        return default
    value = fields[key]
    try:
        # AICB writes pp_comm as a float when it divides it by TP
        # (SimAI_training_workload_generator.py:845-846); SimAI's stoi reads its integer.
        number = float(value) if key == "pp_comm" else int(value)
        if number == int(number):
            return int(number)
    except (ValueError, OverflowError):  # not a number; inf or nan
        pass
    raise WorkloadError(f"{path}: header field '{key}:' must be an integer, got {value!r}")


def _repeated_blocks(lines: list, copies: int) -> tuple[int, int] | None:
    """(start, length) of the longest run of ``copies`` identical consecutive blocks of
    ``lines`` (the earliest of that length), or None when there is none (or
    ``copies`` < 2, when a file's lines are one block either way).

    >>> _repeated_blocks(["grad", "emb", "layer", "emb", "layer", "loss"], 2)
    (1, 2)
    >>> _repeated_blocks(["emb", "layer"], 2) is None
    True
    """
    n = len(lines)
    if copies < 2:
        return None
    for length in range(n // copies, 0, -1):
        for start in range(n - copies * length + 1):
            # Cheap test first: a block must start again one block further on.
            if lines[start] != lines[start + length]:
                continue
            block = lines[start : start + length]
            if all(
                lines[start + k * length : start + (k + 1) * length] == block
                for k in range(1, copies)
            ):
                return start, length
    return None


def _read_lines(path: Path, lines: list[str]) -> list[_Line]:
    try:
        count = int(lines[1])
    except ValueError:
        raise WorkloadError(f"{path}: line 2 must be the number of layers") from None
    if count < 1:
        raise WorkloadError(f"{path}: line 2 must be a number of layers of 1 or more")
    layers = []
    for number, line in enumerate(lines[2 : 2 + count], start=3):
        fields = line.split()
        if len(fields) != 12:
            raise WorkloadError(f"{path}:{number}: expected 12 fields, found {len(fields)}")
        try:
            layers.append(
                _Line(
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
    return layers


#: Ops a rank runs per line of a micro-batch at the most: the forward compute and its
#: comm, the input-gradient compute and its comm, the weight-gradient compute and its
#: comm (the bundled files build 4 to 5.6, with the pipeline's sends and receives).
OPS_PER_LINE = 6


def load_aicb(path: str | Path, *, max_flows: int | None = None) -> Workload:
    """Read an AICB/SimAI workload file into a :class:`Workload` (see module docstring).

    The ops it would build (``all_gpus`` x the lines its ``ga`` micro-batches run x
    :data:`OPS_PER_LINE`) are checked against the resource guard's limit ``max_flows``
    (:func:`~simulator.collective.guards.check_flows`) before any is built.
    """
    path = Path(path)
    text = read_text(path, what="AICB workload", error=WorkloadError)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 3:
        raise WorkloadError(f"{path}: an AICB workload has a header, a layer count and layers")
    fields = _header_fields(lines[0])
    tp = _header_value(path, fields, "model_parallel_NPU_group")
    ranks = _header_value(path, fields, "all_gpus")
    pp = _header_value(path, fields, "pp", 1)
    ep = _header_value(path, fields, "ep", 1)
    ga = _header_value(path, fields, "ga", 1)
    for key, value in (("model_parallel_NPU_group", tp), ("pp", pp), ("ep", ep), ("ga", ga)):
        if value < 1:
            raise WorkloadError(f"{path}: header field '{key}:' must be 1 or more, got {value}")
    if ranks < 1 or ranks % (tp * pp):
        raise WorkloadError(
            f"{path}: all_gpus {ranks} does not split into pp: {pp} pipeline stages of "
            f"model_parallel_NPU_group: {tp} ranks; all_gpus must be a multiple of {tp * pp}"
        )
    pp_bytes = 0
    if pp > 1:
        if "pp_comm" not in fields:
            raise WorkloadError(
                f"{path}: pp: {pp} needs the header field 'pp_comm' (bytes each rank sends "
                "to the next stage per micro-batch, as AICB writes it)"
            )
        pp_bytes = _header_value(path, fields, "pp_comm")
        if pp_bytes < 0:
            raise WorkloadError(f"{path}: header field 'pp_comm' must be >= 0, got {pp_bytes}")
    dp = ranks // (tp * pp)
    if dp % ep:
        raise WorkloadError(f"{path}: the DP size {dp} is not a multiple of ep {ep}")
    layers = _read_lines(path, lines)
    # Micro-batches are told apart by what their lines are and send, not by their times:
    # AICB measures each line's compute, and the first micro-batch's may differ (SimAI's
    # example file, example/workload_analytical.txt, has one embedding_layer weight
    # gradient of 15091072 ns, the other 23 of 875420 ns).
    span = _repeated_blocks([line.shape for line in layers], ga)
    # Lines the step runs: the file's, or its one micro-batch ga times over.
    runs = len(layers) * (ga if span is None else 1)
    ops = ranks * runs * OPS_PER_LINE
    what = (
        f"{path.name}: {ranks:,} ranks (all_gpus) x {runs:,} lines"
        + (f" (ga: {ga:,} micro-batches of {len(layers):,})" if span is None and ga > 1 else "")
        + f", about {ops:,} ops"
    )
    check_flows(Estimate(ops * OP_FLOWS, what), max_flows)
    if span is None:  # one micro-batch, run ga times
        prologue: list[_Line] = []
        blocks, epilogue = [layers] * ga, []
    else:  # AICB's layout: the ga micro-batches written out
        start, length = span
        prologue = layers[:start]
        blocks = [layers[start + k * length : start + (k + 1) * length] for k in range(ga)]
        epilogue = layers[start + ga * length :]
    return _build(path, tp, pp, dp, ep, pp_bytes, prologue, blocks, span is not None, epilogue)


def _build(
    path: Path,
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    pp_bytes: int,
    prologue: list[_Line],
    blocks: list[list[_Line]],
    written: bool,
    epilogue: list[_Line],
) -> Workload:
    """The trace: per stage the micro-batches (micro-batch i runs ``blocks[i]``) in 1F1B
    order, the prologue and epilogue around them (see the module docstring). With
    ``written`` each block is its own lines of the file, each with its own
    weight-gradient comm and update; otherwise the blocks are one list of lines that
    every micro-batch runs, whose comm is issued after the last micro-batch and whose
    updates run once."""
    micro = len(blocks)
    # The micro-batches whose lines are lines of the file, and their id prefixes.
    owners = {i: f"m{i}." for i in range(micro)} if written else {micro - 1: ""}
    ranks = tp * dp * pp
    per_stage = tp * dp
    b = _Builder(path.stem, ranks, f"imported from AICB file {path.name}")

    def rank_of(stage: int, d: int, t: int) -> int:
        return (stage * dp + d) * tp + t

    groups: dict[tuple[str, int], str] = {}
    for r in range(ranks):
        stage, d, t = r // per_stage, r % per_stage // tp, r % tp
        pre = f"s{stage}." if pp > 1 else ""
        members = {
            ("TP", f"{pre}tp{d}"): [rank_of(stage, d, i) for i in range(tp)],
            ("DP", f"{pre}dp{t}"): [rank_of(stage, i, t) for i in range(dp)],
            ("EP", f"{pre}ep{t}.{d // ep}"): [
                rank_of(stage, d // ep * ep + i, t) for i in range(ep)
            ],
            ("DP_EP", f"{pre}dpep{t}.{d % ep}"): [
                rank_of(stage, i * ep + d % ep, t) for i in range(dp // ep)
            ],
        }
        for (role, name), group_ranks in members.items():
            groups[(role, r)] = b.group(name, "DP" if role == "DP_EP" else role, group_ranks)

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

    def compute_then_tp(
        op_id: str, r: int, deps: list, seconds: float, kind: str, size: int, label: str
    ) -> str:
        """A compute op, then (if any) its blocking TP-group comm on the compute stream."""
        prev = b.op(op_id, r, "compute", deps, duration=seconds, label=label)
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

    def forward(tag: str, r: int, deps: list, part: list[_Line]) -> str:
        """Forward compute and comm of ``part``'s lines in order; returns the last op."""
        for i, line in enumerate(part):
            label = f"fwd {line.name}"
            seconds = line.fwd_t * _NS
            op = compute_then_tp(f"r{r}.{tag}f{i}", r, deps, seconds, line.fwd_c, line.fwd_b, label)
            deps = [op]
        return deps[0]

    def backward(
        tag: str, r: int, deps: list, part: list[_Line], grads: str | None, done: dict[str, str]
    ) -> str:
        """Input- and weight-gradient compute (and TP comm) of ``part``'s lines in
        reverse order; with ``grads`` (an id prefix) each line's weight-gradient comm is
        issued on the ``dp`` stream after its compute and recorded in ``done``. Returns
        the last op."""
        for i in reversed(range(len(part))):
            line = part[i]
            label = f"input grad {line.name}"
            seconds = line.ig_t * _NS
            op_id = f"r{r}.{tag}ig{i}"
            prev = compute_then_tp(op_id, r, deps, seconds, line.ig_c, line.ig_b, label)
            prev = b.op(
                f"r{r}.{tag}wg{i}",
                r,
                "compute",
                [prev],
                duration=line.wg_t * _NS,
                label=f"weight grad {line.name}",
            )
            deps = [prev]
            c = comm(line.wg_c, "DP", r)
            if grads is not None and c and line.wg_b:
                done[f"{grads}{i}"] = b.op(
                    f"r{r}.{grads}{i}",
                    r,
                    "collective",
                    [prev],
                    op=c[0],
                    group=c[1],
                    bytes=line.wg_b,
                    stream="dp",
                    label=f"weight grad {line.name}",
                )
        return deps[0]

    def p2p(kind: str, r: int, deps: list, peer: int, what: str, i: int, stream: str) -> str:
        """One pipeline transfer: ``pp_bytes`` of activation or gradient."""
        return b.op(
            f"r{r}.{kind}.{what}{i}",
            r,
            kind,
            deps,
            peer=peer,
            bytes=pp_bytes,
            tag=f"{what}{i}",
            stream=stream,
            label=f"PP {what} mb {i}",
        )

    for r in range(ranks):
        stage = r // per_stage
        wg_done: dict[str, str] = {}
        prev = forward("pre.", r, [], prologue) if prologue else None
        for kind, _, i in pipeline_order(stage, pp, micro, 1):
            if kind == "f":
                deps = [prev]
                if stage > 0:
                    deps.append(p2p("recv", r, [prev], r - per_stage, "act", i, "pp.recv.prev"))
                prev = forward(f"m{i}.", r, deps, blocks[i])
                if stage < pp - 1:
                    p2p("send", r, [prev], r + per_stage, "act", i, "pp.send.next")
                if i == micro - 1 and epilogue:
                    prev = forward("post.", r, [prev], epilogue)
                    prev = backward("post.", r, [prev], epilogue, "post.wgc", wg_done)
            else:
                deps = [prev]
                if stage < pp - 1:
                    deps.append(p2p("recv", r, [prev], r + per_stage, "grad", i, "pp.recv.next"))
                # 1F1B runs the backwards in micro-batch order: the last is the last.
                grads = owners[i] + "wgc" if i in owners else None
                prev = backward(f"m{i}.", r, deps, blocks[i], grads, wg_done)
                if stage > 0:
                    p2p("send", r, [prev], r - per_stage, "grad", i, "pp.send.prev")
        if prologue:
            prev = backward("pre.", r, [prev], prologue, "pre.wgc", wg_done)
        parts = [("pre.", prologue), *((tag, blocks[i]) for i, tag in owners.items())]
        for tag, part in [*parts, ("post.", epilogue)]:
            for i, line in enumerate(part):
                prev = b.op(
                    f"r{r}.{tag}upd{i}",
                    r,
                    "compute",
                    [prev, wg_done.get(f"{tag}wgc{i}")],
                    duration=line.update * _NS,
                    label=f"update {line.name}",
                )
    return b.build()
