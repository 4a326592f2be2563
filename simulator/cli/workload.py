"""``ccsim run``, ``ccsim generate`` and ``ccsim workloads``: workloads on the command line.

``ccsim run`` also draws the step (``--timeline``, ``--trace``, ``--report DIR``) through
:mod:`simulator.viz.outputs`, imported only when one of them is given so that a plain
run does not load matplotlib.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from ..algorithms import algorithm_names
from ..collective.guards import check_flows, cluster_of
from ..collective.policy import POLICIES, nccl_not_applied
from ..errors import CcsimError
from ..topology import load_topology
from ..units import parse_bandwidth, parse_size, parse_time
from ..viz.progress import simulated_time
from ..viz.tables import FORMATS, breakdown_table, to_csv, to_json
from ..workload import WorkloadReplay, breakdown
from ..workload.chakra import write_chakra
from ..workload.communicators import COMM_CONFIG_KEYS, communicators_from_items
from ..workload.devices import Device, device_for
from ..workload.generators import CP_COMM_TYPES, GENERATORS, MODELS
from ..workload.guards import check_generator, workload_estimate
from ..workload.host import GRAPH_SCOPES, host_op_s_for
from ..workload.kernels import ATTENTION_BACKENDS
from ..workload.memory import OPTIMIZER_STATE, MemoryEstimate
from ..workload.metrics import Breakdown
from ..workload.model import DISPATCHERS
from ..workload.presets import describe_presets, resolve_workload
from ..workload.servers import SERVER_GPUS, server_of_ranks, tp_spread, tp_warning
from .args import (
    Once,
    add_max_flows_option,
    add_trace_options,
    check_outputs,
    emit,
    nccl_env_of,
    nccl_field,
    nccl_title,
    with_faults,
)
from .compare import add_model_options


def add_workload_commands(sub: argparse._SubParsersAction) -> None:
    """Register the workload subcommands on the main parser."""
    run = sub.add_parser(
        "run",
        help="replay a training-step workload and break its step time down",
        description="Replay a workload (a preset name from 'ccsim workloads', a trace file "
        ".json/.yaml, a generator spec, a SimAI/AICB .txt file, or a Chakra trace: a "
        "prefix of <prefix>.<rank>.et files, their folder, or one .et file as a one-rank "
        "workload) on a topology and "
        "print where each rank's step time goes: compute, communication overlapped "
        "with compute, exposed communication, waiting for peers, pipeline bubble. "
        "Times in milliseconds; shares are fractions of the step time.",
    )
    run.add_argument("workload", metavar="WORKLOAD", help="preset name or file")
    run.add_argument(
        "--topology",
        default="dgx-a100",
        metavar="NAME",
        help="topology preset or YAML file (default: %(default)s)",
    )
    run.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="servers (default: as many as the workload's ranks need)",
    )
    run.add_argument(
        "--algo",
        default=None,
        metavar="NAME",
        help="who runs the collectives that do not name an algorithm. Default: the "
        "preset's library (hccl for the Ascend presets, else nccl), the realistic "
        "prediction: each call runs what the library chooses for that operation and size "
        "on its group's own GPUs (nccl: its algorithm, protocol and channels on the "
        "preset's calibrated protocol model; hccl: its algorithm on the ideal model), "
        "decided once per group shape, operation and size; nccl or hccl ask for one. Or "
        "an algorithm, " + ", ".join(algorithm_names()) + ", run as given (the ideal "
        "line-rate model unless --proto is given); or auto: per group, operation and size, "
        "every algorithm with its chunks searched as collective --chunks auto does, the "
        "fastest simulated kept: an ideal scheduler rather than a library",
    )
    run.add_argument(
        "--comm-slowdown",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction (0-1) by which compute slows while communication running "
        "on GPU cores overlaps it on the same rank (default: 0)",
    )
    run.add_argument(
        "--reduce-bw",
        default=None,
        metavar="BW",
        help="local reduction bandwidth per GPU, e.g. 1500GB/s (default: preset's)",
    )
    add_model_options(run)
    run.add_argument(
        "--nccl-comm",
        action="append",
        default=None,
        metavar="GROUP:KEY=VALUE",
        help="NCCL's configuration of one Megatron-Core process group's communicator "
        "(repeatable), as Megatron-Core's --nccl-communicator-config-path sets it: e.g. "
        "cp:max_ctas=1,min_ctas=1 or dp_cp:max_ctas=8 (keys: "
        + ", ".join(COMM_CONFIG_KEYS)
        + "; min_ctas / max_ctas bound that communicator's channels unless --nccl's "
        "NCCL_MIN_CTAS / NCCL_MAX_CTAS replace them, as NCCL does), or that YAML file itself; "
        "applies to the megatron generator's groups (default: NCCL's default configuration)",
    )
    add_max_flows_option(run)
    run.add_argument("--per-rank", action="store_true", help="also print one row per rank")
    run.add_argument(
        "--exact",
        action="store_true",
        help="simulate calls that share links with others (a data-parallel reduce-scatter "
        "beside tensor-parallel collectives) flow by flow: the per-flow reference, often "
        "10x slower (default: as bundles, one flow per link at the pace the call keeps "
        "alone; within a few tenths of a percent of it on training steps)",
    )
    run.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table, json or csv (default: %(default)s)",
    )
    run.add_argument("--out", metavar="FILE", help="write the output to FILE instead of stdout")
    run.add_argument(
        "--timeline",
        action=Once,
        metavar="FILE",
        help="also draw a Gantt chart of the step to FILE.png, .svg or .pdf: a row per "
        "rank and stream with ops on it (beyond 64 rows, one per server and stream, "
        "labelled with its count, e.g. 'server 0 tp (8 ranks)', showing the share of "
        "those ranks busy), ops coloured by "
        "kind (compute, collectives by TP/PP/DP/EP, send/recv, waiting for peers); time "
        "in us/ms/s",
    )
    run.add_argument(
        "--trace",
        action=Once,
        metavar="FILE",
        help="also write a Chrome trace-event JSON of the step to FILE (one process per "
        "server, one thread per rank and stream; ts/dur in microseconds; open it at "
        "ui.perfetto.dev; gzipped if FILE ends in .gz)",
    )
    add_trace_options(run)
    run.add_argument(
        "--report",
        action=Once,
        metavar="DIR",
        help="also write a report folder: the breakdown (text with every rank, CSV, "
        "JSON), the timeline PNG, the trace, the workload and topology files and "
        "run.json with the command, versions and inputs; DIR must be new or empty "
        "unless --force",
    )
    run.add_argument(
        "--force",
        action="store_true",
        help="let --report write into a non-empty folder (its report files are replaced)",
    )
    run.set_defaults(handler=_cmd_run)

    gen = sub.add_parser(
        "generate",
        help="write a workload trace from a generator",
        description="Write a workload trace (JSON, format ccsim-workload/1) from one of the "
        "generators: " + ", ".join(GENERATORS) + ". Models: " + ", ".join(sorted(MODELS)) + ".",
    )
    gen.add_argument(
        "generator",
        choices=sorted(GENERATORS),
        metavar="GENERATOR",
        help="one of: " + ", ".join(sorted(GENERATORS)),
    )
    gen.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="trace file to write: .json (ccsim's format), or .et for a Chakra trace, one "
        "file a rank (x.et writes x.0.et, x.1.et, ...; ASTRA-sim's workload prefix is x)",
    )
    gen.add_argument(
        "--device",
        default=None,
        metavar="GPU",
        help="with --out *.et: also write each compute node's duration_micros as ccsim times "
        "it on this GPU (A100, H100, ...), which ASTRA-sim replays without its roofline; "
        "megatron, any output: MoE layers' host launches at this GPU's host CPU (Grace for "
        "GB200)",
    )
    gen.add_argument(
        "--model", default=None, metavar="NAME", help="model shape: " + ", ".join(sorted(MODELS))
    )
    gen.add_argument(
        "--ranks", type=int, default=None, metavar="N", help="ranks (ddp, zero3, moe; count)"
    )
    gen.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        metavar="B",
        help="sequences per micro-batch (count)",
    )
    gen.add_argument(
        "--global-batch",
        type=int,
        default=None,
        metavar="B",
        help="sequences per step (megatron; count)",
    )
    gen.add_argument(
        "--tp", type=int, default=None, metavar="T", help="tensor parallel size (count)"
    )
    gen.add_argument("--pp", type=int, default=None, metavar="P", help="pipeline stages (count)")
    gen.add_argument("--dp", type=int, default=None, metavar="D", help="data parallel size (count)")
    gen.add_argument(
        "--bucket",
        default=None,
        metavar="SIZE",
        help="DDP gradient bucket size in bytes, e.g. 25MiB",
    )
    gen.add_argument(
        "--cp",
        type=int,
        default=None,
        metavar="N",
        help="megatron: context-parallel ranks per sequence (ring attention; default 1)",
    )
    gen.add_argument(
        "--cp-comm-type",
        choices=CP_COMM_TYPES,
        default=None,
        help="megatron: how CP ranks exchange attention's inputs, as Megatron-Core's "
        "--cp-comm-type: p2p (K/V around a ring beside the attention, the default), "
        "all_gather (K/V all-gathered, blocking), a2a (Q/K/V/O all-to-alls over heads) or "
        "a2a+p2p (both, with --hierarchical-context-parallel-sizes)",
    )
    gen.add_argument(
        "--hierarchical-context-parallel-sizes",
        type=int,
        nargs=2,
        default=None,
        metavar=("A", "P"),
        help="megatron, --cp-comm-type a2a+p2p: CP ranks of each all-to-all group (A, "
        "consecutive) and of each ring (P), A x P = --cp",
    )
    gen.add_argument(
        "--fsdp",
        action="store_true",
        default=None,
        help="megatron: shard weights, gradients and optimizer over DP (FSDP with TP/PP)",
    )
    gen.add_argument(
        "--ep",
        type=int,
        default=None,
        metavar="N",
        help="megatron, MoE models: expert-parallel ranks, consecutive ranks of a stage's "
        "TP x CP x DP (default 1)",
    )
    gen.add_argument(
        "--etp",
        type=int,
        default=None,
        metavar="N",
        help="megatron, MoE models: expert tensor parallelism, 1 or the TP size: each "
        "expert split over that many ranks, the routed tokens gathered over them "
        "(Megatron-Core's expert_tensor_parallel_size) (default: 1)",
    )
    gen.add_argument(
        "--moe-dispatcher",
        choices=tuple(DISPATCHERS),
        default=None,
        help="megatron, MoE models: Megatron-Core's token dispatcher: alltoall (every "
        "routed copy sent), deepep or hybridep (the flex dispatcher: a token sent once to "
        "each rank, and once over RDMA to each NVLink domain, holding its experts) "
        "(default: alltoall)",
    )
    gen.add_argument(
        "--ep-domain",
        type=int,
        default=None,
        metavar="N",
        help="megatron, MoE models with deepep/hybridep: ranks of one NVLink domain (8 on "
        "HGX/DGX servers, the rack's GPUs on NVL72) (default: 8)",
    )
    gen.add_argument(
        "--moe-a2a-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron, MoE models: Megatron-Core's combined 1F1B "
        "(overlap_moe_expert_parallel_comm): each steady forward paired with a backward, "
        "their all-to-alls beside the other's compute (default: off)",
    )
    gen.add_argument(
        "--moe-host-sync",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron, MoE models: each MoE layer's forward waits for the host to read "
        "the tokens each expert got, as dropless dispatchers do; --no-moe-host-sync for "
        "static shapes (token drop with padding, CUDA graphs) (default: on)",
    )
    gen.add_argument(
        "--host-op-s",
        default=None,
        metavar="TIME",
        help="megatron, MoE models: the host's time per launched operation of an MoE "
        "layer, e.g. 37.08us on a Grace host (GB200); 0 leaves the host out (default: "
        "13.48us, one PyTorch op on a DGX H100's x86 CPU as Transformer Engine issue #2053 "
        "measured it; 10us, the middle of the 5-20 us Meta's Holistic Trace Analysis gives "
        "for a launch, was the earlier default)",
    )
    gen.add_argument(
        "--cuda-graphs",
        default=None,
        metavar="SCOPES",
        help="megatron, MoE models: the CUDA-graph scopes the run captures, comma "
        f"separated, from {', '.join(GRAPH_SCOPES)} (Megatron-Bridge's cuda_graph_scope; "
        "a graphed part costs the host one replay) (default: none)",
    )
    gen.add_argument(
        "--precision",
        choices=("bf16", "fp8"),
        default=None,
        help="megatron: linear layers in bf16 or fp8 (Transformer Engine; default: bf16)",
    )
    gen.add_argument(
        "--grad-reduce",
        choices=("fp32", "bf16", "fp16"),
        default=None,
        help="megatron, ddp: the dtype gradients are kept and reduced over DP in: fp32 "
        "(Megatron-LM's default in bf16 and fp8; PyTorch AMP's), bf16 (Megatron's "
        "--grad-reduce-in-bf16; a bf16 model) or fp16 (an --fp16 run) (default: fp32)",
    )
    gen.add_argument(
        "--fp8-param-gather",
        action="store_true",
        default=None,
        help="megatron, fp8: keep the layers' weights in fp8 and gather them over DP in "
        "fp8 (Megatron's --fp8-param-gather; default: off)",
    )
    gen.add_argument(
        "--fp8-recipe",
        default=None,
        metavar="RECIPE",
        help="megatron, fp8: Transformer Engine's scaling: tensorwise (per-tensor current "
        "scaling, Megatron-Bridge's default), delayed (Megatron-LM's and NeMo's) or mxfp8 "
        "(1 x 32 block scales, Blackwell) (default: tensorwise)",
    )
    gen.add_argument(
        "--fp8-transpose",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron, fp8: the GPU's fp8 GEMMs take only K-major operands, so each "
        "per-tensor cast also writes a transpose (Hopper); --no-fp8-transpose on "
        "Blackwell (default: on)",
    )
    gen.add_argument(
        "--optimizer-state",
        choices=tuple(OPTIMIZER_STATE),
        default=None,
        help="megatron: the optimizer's state per parameter: fp32 (Megatron-Core's fp32 "
        "main weights and moments, 12 bytes), bf16 (bf16 moments, no main weights, 4: "
        "NeMo's distributed_fused_adam with optim.dtype bf16) or bf16-master (the same "
        "with a bf16 copy of the weights, 6: with fp8 parameters) (default: fp32)",
    )
    gen.add_argument(
        "--cross-entropy",
        choices=("unfused", "fused", "te"),
        default=None,
        help="megatron: how the loss runs after the logits: unfused (Megatron-Core's "
        "default), fused (--cross-entropy-loss-fusion, NeMo's recipes) or te (Transformer "
        "Engine's kernels, Megatron-Bridge's recipes) (default: unfused)",
    )
    gen.add_argument(
        "--recompute",
        choices=("full", "selective", "none"),
        default=None,
        help="megatron: activation recomputation (default: none, Megatron-LM's; full "
        "with --defaults sc21)",
    )
    gen.add_argument(
        "--defaults",
        choices=("megatron-core", "sc21"),
        default=None,
        help="megatron: what options not given are: megatron-core (what NVIDIA's recipes "
        "run today: no recomputation, flash attention, sequence parallelism with TP, the "
        "distributed optimizer, gradient reduce, parameter gather and TP collectives "
        "overlapped) or sc21 (Megatron-LM as SC'21 ran it: full recomputation, nothing "
        "fused or overlapped) (default: megatron-core)",
    )
    gen.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: sequence parallelism (TP reduce-scatter + all-gather; default: "
        "wherever TP > 1)",
    )
    gen.add_argument(
        "--virtual-stages",
        type=int,
        default=None,
        metavar="V",
        help="megatron: model chunks per pipeline stage, interleaved 1F1B (count; default 1)",
    )
    # Megatron-LM's --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers.
    gen.add_argument(
        "--first-stage-layers",
        type=int,
        default=None,
        metavar="N",
        help="megatron: layers of the first pipeline stage, the rest split evenly over the "
        "others (uneven stages; default: all stages even)",
    )
    gen.add_argument(
        "--last-stage-layers",
        type=int,
        default=None,
        metavar="N",
        help="megatron: layers of the last pipeline stage, the rest split evenly over the "
        "others (uneven stages; default: all stages even)",
    )
    for part in ("embedding", "loss"):
        gen.add_argument(
            f"--account-for-{part}-in-pipeline-split",
            action="store_true",
            default=None,
            help=f"megatron: count the {part} as a layer when splitting the layers over "
            f"the pipeline's stages and chunks, as Megatron-Core's flag of that name: the "
            f"{'first chunk of the first' if part == 'embedding' else 'last chunk of the last'}"
            " stage holds one layer fewer (default: off)",
        )
    gen.add_argument(
        "--flash-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: flash attention (the attention scores never reach HBM) "
        "(default: on; --no-flash-attention turns it off)",
    )
    gen.add_argument(
        "--distributed-optimizer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: shard the optimizer over DP (reduce-scatter, all-gather) "
        "(default: wherever DP > 1; --no-distributed-optimizer turns it off)",
    )
    gen.add_argument(
        "--overlap-grad-reduce",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: reduce gradients bucket by bucket during the last backward "
        "(default: wherever the gradients are reduced; --no-overlap-grad-reduce "
        "turns it off)",
    )
    gen.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: run TP collectives beside the GEMMs (Transformer Engine "
        "overlap) (default: with sequence parallelism; --no-tp-comm-overlap turns "
        "it off)",
    )
    gen.add_argument(
        "--tp-comm-overlap-model",
        choices=("ideal", "userbuffers"),
        default=None,
        help="megatron, with --tp-comm-overlap: 'ideal' (the default) takes the "
        "overlap as free to the GEMMs, a bound; 'userbuffers' runs the linear GEMMs as "
        "Transformer Engine's userbuffers do (chunked, on the SMs the communication "
        "leaves) with what they leave exposed",
    )
    gen.add_argument(
        "--overlap-p2p-comm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron, interleaved (--virtual-stages > 1): post each pass's pipeline "
        "receive when the previous pass of its direction ends, so the transfer runs beside "
        "the pass in between (Megatron-Core's overlap_p2p_comm) (default: on with "
        "interleaving, off with --defaults sc21)",
    )
    gen.add_argument(
        "--p2p-streams",
        choices=("peer", "split"),
        default=None,
        help="megatron: 'peer' runs a rank's pipeline sends to and receives from one "
        "neighbour on one FIFO stream, as PyTorch runs un-batched isend/irecv; 'split' a "
        "stream each (default: peer with --overlap-p2p-comm, else split)",
    )
    gen.add_argument(
        "--p2p-send-wait",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron, with --overlap-p2p-comm: each pass also waits for the send of the "
        "last pass of its direction, as Megatron waits that call's handles (default: on)",
    )
    gen.add_argument(
        "--amax-reduction",
        choices=("stage", "tp", "off"),
        default=None,
        help="megatron, fp8 delayed scaling: Transformer Engine's blocking amax all-reduce "
        "after each pass over the stage's TP x DP x CP ranks ('stage'), the TP group "
        "('tp') or none (default: off)",
    )
    gen.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default=None,
        help="megatron: the fused attention's kernels, cuDNN's (Transformer Engine's choice "
        "on Hopper and later, the default) or FlashAttention-2's (TE with NVTE_FUSED_ATTN=0)",
    )
    gen.add_argument(
        "--attention-dropout",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: the fused attention applies dropout (Megatron-LM's "
        "--attention-dropout, 0.1 by default; 0 in Llama-style recipes), timed at the "
        "device's measured slowdown with it (default: off)",
    )
    gen.add_argument(
        "--overlap-param-gather",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="megatron: all-gather the distributed optimizer's parameters bucket by bucket "
        "during the first forward (default: with the distributed optimizer)",
    )
    add_max_flows_option(gen)
    gen.set_defaults(handler=_cmd_generate)

    lst = sub.add_parser(
        "workloads",
        help="list the bundled workload presets",
        description="List the bundled workload presets.",
    )
    lst.set_defaults(handler=_cmd_workloads)


def _cmd_run(args: argparse.Namespace) -> None:
    check_outputs(args, "out")
    drawing = args.timeline or args.trace or args.report
    if drawing:  # matplotlib loads only when asked for; bad names fail before the replay
        from ..viz.outputs import check_output_options

        check_output_options(
            timeline=args.timeline, trace=args.trace, report=args.report, force=args.force
        )
    env = nccl_env_of(args)
    if env and args.algo not in (None, *POLICIES):
        raise CcsimError(nccl_not_applied(args.algo))
    communicators = communicators_from_items(args.nccl_comm or [])
    workload = resolve_workload(args.workload, max_flows=args.max_flows)
    nodes = args.nodes
    if nodes is None:
        per_server = cluster_of(args.topology, max_flows=args.max_flows).ranks
        nodes = max(1, math.ceil(workload.ranks / per_server))
    cluster = cluster_of(args.topology, nodes, fabric=args.fabric, max_flows=args.max_flows)
    check_flows(cluster.estimate(), args.max_flows)  # before a library's model is consulted
    estimate = workload_estimate(
        workload, args.algo, cluster=cluster, protocol=args.proto, nccl=env
    )
    check_flows(estimate.plus(cluster.estimate()), args.max_flows)
    graph = load_topology(
        args.topology, nodes, fabric=args.fabric, seed=args.seed, routing=args.routing
    )
    warning = tp_warning(tp_spread(workload, server_of_ranks(graph)))
    if warning:  # it runs, as the job would, but slower than the user likely meant
        print(f"ccsim: warning: {workload.name} on {args.topology}: {warning}", file=sys.stderr)
    graph = with_faults(graph, args)
    reduce_bw = parse_bandwidth(args.reduce_bw, field="--reduce-bw") if args.reduce_bw else None
    replay = WorkloadReplay(
        workload,
        graph,
        algorithm=args.algo,
        comm_slowdown=args.comm_slowdown,
        reduce_bandwidth=reduce_bw,
        protocol=args.proto,
        nccl=env,
        bundles=not args.exact,
        communicators=communicators,
    )
    with simulated_time(f"ccsim run {workload.name}") as progress:  # on a terminal, if slow
        run = replay.run(progress)
    result = breakdown(run)
    algorithm = run.algorithm + (" (the preset's library)" if args.algo is None else "")
    title = nccl_title(
        f"ccsim run {workload.name} | topology {args.topology} x{nodes} | "
        f"{workload.ranks} ranks | algorithm {algorithm} | "
        f"comm slowdown {args.comm_slowdown}"
        + (f" | protocol {args.proto}" if args.proto else "")
        + (f" | faults {' '.join(args.fault)}" if args.fault else "")
        + _replicas_note(run.replicas)
        + _bundles_note(run.isolated)
        + (
            "\n# nccl per process group: "
            + "; ".join(f"{name} {config.text}" for name, config in communicators.items())
            if communicators
            else ""
        ),
        env,
    )
    if args.format == "json":
        summary = _flops_row(
            _summary_row(workload.name, result, run.algorithm, workload.memory),
            workload.model_flops,
            workload.ranks,
            replay.device,
            workload.precision,
        )
        text = to_json(
            nccl_field([summary], env) + ([vars(r) for r in result.ranks] if args.per_rank else [])
        )
    elif args.format == "csv":
        text = to_csv(nccl_field([vars(r) for r in result.ranks], env))
    else:
        text = breakdown_table(
            result,
            title=title,
            per_rank=args.per_rank,
            memory=workload.memory,
            device=replay.device,
            model_flops=workload.model_flops,
            precision=workload.precision,
        )
    emit(text, args.out)
    if drawing:
        from ..viz.outputs import write_workload_outputs

        write_workload_outputs(
            run,
            graph,
            # The report keeps every rank's row whatever --per-rank says.
            table=breakdown_table(result, title=title, per_rank=True),
            summary=_summary_row(workload.name, result, run.algorithm, workload.memory),
            ranks=[vars(r) for r in result.ranks],
            timeline=args.timeline,
            trace=args.trace,
            trace_detail=args.trace_detail,
            trace_ranks=args.trace_ranks,
            report=args.report,
            force=args.force,
            argv=getattr(args, "argv", ()),
            inputs={
                "workload": args.workload,
                "topology": args.topology,
                "nodes": nodes,
                "algorithm": run.algorithm,
                "comm_slowdown": args.comm_slowdown,
                "reduce_bandwidth_Bps": reduce_bw,
                "protocol": args.proto,
                "nccl": env.text or None,
                "fabric": args.fabric,
                "seed": args.seed,
                "faults": args.fault,
                # Only where given: a report of a run without them reads as before.
                **(
                    {"nccl_comm": {name: c.text for name, c in communicators.items()}}
                    if communicators
                    else {}
                ),
            },
            topology=args.topology,
            workload=args.workload,
        )


def _summary_row(
    name: str, result: Breakdown, algorithm: str, memory: MemoryEstimate | None = None
) -> dict:
    row = {"workload": name, "algorithm": algorithm, **result.summary()}
    row["exposed_by_kind_s"] = result.exposed_by_kind
    row["exposed_by_call_s"] = result.exposed_by_call
    if memory is not None:
        row["memory_bytes"] = {**dataclasses.asdict(memory), "total": memory.total}
    return row


def _flops_row(
    row: dict, model_flops: float, ranks: int, device: Device | None, precision: str
) -> dict:
    """``row`` with the model's TFLOP/s per GPU (Megatron-LM's count, no recomputation)
    and its MFU against ``device``'s dense peak in ``precision``, where the workload
    knows its FLOPs."""
    if model_flops and row.get("step_s"):
        per_gpu = model_flops / row["step_s"] / ranks
        row["model_tflops_per_gpu"] = per_gpu / 1e12
        if device is not None:
            row["mfu"] = per_gpu / device.peak(precision)
            row["mfu_peak"] = f"{device.name} dense {precision}"
    return row


def _tp_comm_overlap(args: argparse.Namespace) -> bool | str | None:
    """``--[no-]tp-comm-overlap`` with ``--tp-comm-overlap-model``: the generator's
    ``tp_comm_overlap`` (None: Megatron-Core's default, on with sequence parallelism)."""
    model = getattr(args, "tp_comm_overlap_model", None)
    if model is None:
        return args.tp_comm_overlap
    if args.tp_comm_overlap is False:
        raise CcsimError("--tp-comm-overlap-model needs the overlap on: drop --no-tp-comm-overlap")
    return model


def _graph_scopes(text: str) -> tuple[str, ...]:
    """``--cuda-graphs``' comma-separated scopes, each one of :data:`GRAPH_SCOPES`."""
    scopes = tuple(part.strip() for part in text.split(",") if part.strip())
    for scope in scopes:
        if scope not in GRAPH_SCOPES:
            raise CcsimError(
                f"--cuda-graphs: unknown scope {scope!r}; give a comma-separated list of "
                f"{', '.join(GRAPH_SCOPES)}"
            )
    return scopes


def _cmd_generate(args: argparse.Namespace) -> None:
    check_outputs(args, "out")
    options = {
        "model": args.model,
        "ranks": args.ranks,
        "micro_batch": args.micro_batch,
        "global_batch": args.global_batch,
        "tp": args.tp,
        "pp": args.pp,
        "dp": args.dp,
        "recompute": args.recompute,
        "sequence_parallel": args.sequence_parallel,
        "distributed_optimizer": args.distributed_optimizer,
        "virtual_stages": args.virtual_stages,
        "first_stage_layers": args.first_stage_layers,
        "last_stage_layers": args.last_stage_layers,
        "account_for_embedding_in_pipeline_split": args.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": args.account_for_loss_in_pipeline_split,
        "flash_attention": args.flash_attention,
        "overlap_grad_reduce": args.overlap_grad_reduce,
        "tp_comm_overlap": _tp_comm_overlap(args),
        "overlap_param_gather": args.overlap_param_gather,
        "defaults": args.defaults,
        "precision": args.precision,
        "grad_reduce": args.grad_reduce,
        "fp8_param_gather": args.fp8_param_gather,
        "fp8_recipe": args.fp8_recipe,
        "fp8_transpose": args.fp8_transpose,
        "optimizer_state": args.optimizer_state,
        "cross_entropy": args.cross_entropy,
        "cp": args.cp,
        "cp_comm_type": args.cp_comm_type,
        "hierarchical_context_parallel_sizes": args.hierarchical_context_parallel_sizes,
        "ep": args.ep,
        "etp": args.etp,
        "moe_dispatcher": args.moe_dispatcher,
        "ep_domain": args.ep_domain,
        "moe_a2a_overlap": args.moe_a2a_overlap,
        "moe_host_sync": args.moe_host_sync,
        "overlap_p2p_comm": args.overlap_p2p_comm,
        "p2p_streams": args.p2p_streams,
        "p2p_send_wait": args.p2p_send_wait,
        "amax_reduction": args.amax_reduction,
        "attention_backend": args.attention_backend,
        "attention_dropout": args.attention_dropout,
        "fsdp": args.fsdp,
    }
    if args.host_op_s is not None:
        options["host_op_s"] = parse_time(args.host_op_s, field="--host-op-s")
    elif args.device and args.generator == "megatron":
        # The trace is timed on this GPU: its MoE layers' host launches at the CPU that
        # GPU hangs off (x86 or Grace, workload/host.py).
        options["host_op_s"] = host_op_s_for(device_for(args.device).name)
    if args.cuda_graphs is not None:
        options["cuda_graphs"] = _graph_scopes(args.cuda_graphs)
    if args.bucket:
        options["bucket_bytes"] = parse_size(args.bucket, field="--bucket")
    import inspect

    accepted = inspect.signature(GENERATORS[args.generator]).parameters
    given = {k: v for k, v in options.items() if v is not None}
    from ..errors import CcsimError

    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise CcsimError(
            f"--{unknown[0].replace('_', '-')} does not apply to {args.generator}; "
            f"it takes: {', '.join(sorted(accepted))}"
        )
    check_generator(args.generator, given, args.max_flows)
    workload = GENERATORS[args.generator](**given)
    # No topology yet: TP groups are checked against the common 8-GPU server (ccsim run
    # checks them again on the topology the trace runs on).
    spread = tp_spread(workload, [rank // SERVER_GPUS for rank in range(workload.ranks)])
    warning = tp_warning(spread, option="--tp")
    if warning:
        print(
            f"ccsim: warning: on {SERVER_GPUS}-GPU servers (DGX, HGX): {warning}", file=sys.stderr
        )
    if args.out.endswith(".et"):  # a Chakra trace: one file a rank
        device = device_for(args.device) if args.device else None
        files = write_chakra(workload, args.out, device=device)
        print(
            f"wrote {files[0]} ... {files[-1].name} (Chakra): {workload.name}, "
            f"{workload.ranks} ranks, {len(workload.ops)} ops; run it with ccsim run {args.out}"
        )
        return
    if args.device and args.generator != "megatron":
        raise CcsimError(
            "--device applies to Chakra output (--out FILE.et) and to megatron's host launches only"
        )
    workload.save(args.out)
    print(f"wrote {args.out}: {workload.name}, {workload.ranks} ranks, {len(workload.ops)} ops")


def _cmd_workloads(args: argparse.Namespace) -> None:
    presets = describe_presets()
    width = max(len(name) for name, _ in presets)
    sys.stdout.write("".join(f"{name:<{width}}  {text}\n" for name, text in presets))
    # The named models generators take (--model), with where their figures come from.
    width = max(len(name) for name in MODELS)
    sys.stdout.write("\nmodels (workloads/models/):\n")
    for name, model in sorted(MODELS.items()):
        sys.stdout.write(f"{name:<{width}}  {model.params / 1e9:7.1f}B params  {model.source}\n")


def _bundles_note(isolated: dict) -> str:
    """What the title says of calls run as bundles (they shared links with others).

    >>> _bundles_note({"bundled": 12})
    ' | 12 calls sharing links run as bundles (--exact: flow by flow)'
    >>> _bundles_note({"bundled": 0})
    ''
    """
    count = isolated.get("bundled", 0)
    if not count:
        return ""
    return f" | {count} calls sharing links run as bundles (--exact: flow by flow)"


def _replicas_note(replicas: dict) -> str:
    """What the title says of a workload given by one data-parallel replica.

    >>> _replicas_note({"count": 16, "simulated": 1})
    ' | 1 of 16 DP replicas simulated (alike)'
    >>> _replicas_note({"count": 4, "simulated": "all", "why": "faults"})
    ' | all 4 DP replicas simulated (faults)'
    """
    if not replicas:
        return ""
    if replicas.get("simulated") != "all":
        return f" | {replicas['simulated']} of {replicas['count']} DP replicas simulated (alike)"
    return f" | all {replicas['count']} DP replicas simulated ({replicas.get('why', '')})"
