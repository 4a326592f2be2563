"""Cases read straight from nccl-tests output: ``ccsim validate LOG [LOG...]``.

A LOG is the stdout of an nccl-tests binary or the JSON file its ``-J`` option writes
(:mod:`~.nccl_output`). What a sidecar would say is read from the file: the operation
(from the binary's name, else from the rows), the hosts (servers), the ranks, the GPUs
each process (each thread, with ``-t``) drives, and the GPU model. What the file cannot
say comes from the command line: ``topology`` (else the one bundled preset whose GPU is
the log's), ``nodes`` (else the number of hosts) and ``op``. Each size is compared by
the faster of its out-of-place and in-place runs (a sidecar's default column, ``best``)
and simulated as NCCL's own choice (``algorithm: nccl``), as in a sidecar that leaves
everything to its defaults, under the NCCL settings the log reports as set by the
environment (``NCCL INFO NCCL_ALGO set by environment to Ring``, with NCCL_DEBUG=INFO;
:mod:`simulator.library.nccl_env` lists those modelled, and the others are named and
ignored); sizes of 0 bytes (all-gather and reduce-scatter below one element per rank)
are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

from ..errors import CcsimError
from ..library.nccl_env import SUPPORTED, parse_nccl_env
from ..topology import gpu_nodes
from ..topology.importers import GRAPH_SUFFIXES
from ..topology.presets import preset_files, preset_size, read_preset
from ..topology.stacks import DEFAULT_STACK
from .nccl_output import read_nccl_output
from .nccl_tests import Case, case_graph, case_topology, load_case, sidecars

_FORMS = re.compile(r"^(SXM\d*|PCIE|NVL\d*)$")
_DROPPED = re.compile(r"^(NVIDIA|GEFORCE|\d+GB|HBM\d*E?)$")


def log_case(
    path: Path | str,
    *,
    topology: str | None = None,
    nodes: int | None = None,
    op: str | None = None,
    notify: Callable[[str], None] | None = None,
) -> Case:
    """A case from an nccl-tests output file; ``notify`` is told the settings it ran with.

    Errors say which option supplies what the file does not.

    Examples
    --------
    >>> log = Path(__file__).parents[2] / "tests/data/nccl-tests/oci-a100-2n-all_reduce.log"
    >>> case = log_case(log, topology="dgx-a100")
    >>> case.settings["nodes"], case.settings["op"], len(case.measured)
    (2, 'all_reduce', 31)
    """
    path = Path(path)
    name = path.name
    out = read_nccl_output(path)
    op = op or out.op()
    if op is None:
        raise CcsimError(
            f"{name}: cannot tell the operation (no *_perf name in the file, and all_gather "
            "and alltoall print alike); pass --op OP"
        )
    preset = _topology_argument(topology) if topology else guess_preset(out.gpus, name)
    if nodes is None:
        if not out.hosts:
            raise CcsimError(
                f"{name}: names no hosts (no '#  Rank ... on HOST' lines); pass --nodes N"
            )
        nodes = len(out.hosts)
    per_process = out.gpus_per_thread
    if per_process is None and out.ranks and out.processes:
        per_process = max(1, out.ranks // out.processes)
    # The faster of the out-of-place and in-place runs of a size, as a sidecar's default
    # column (best): both run the same algorithm, so the slower one differs by noise.
    measured = [
        min((row.size, row.time_us, row.busbw), (row.size, row.time_us_ip, row.busbw_ip))
        if row.time_us_ip is not None and row.busbw_ip is not None
        else (row.size, row.time_us, row.busbw)
        for row in out.rows
        if row.size > 0
    ]
    if not measured:
        raise CcsimError(f"{name}: every row has size 0; nothing to compare")
    settings = {
        "preset": preset,
        "nodes": nodes,
        "op": op,
        "algorithm": "nccl",
        "protocol": "auto",
        "gpus_per_process": per_process or 1,
    }
    # Settings that change what NCCL chooses apply; the rest (NCCL_SOCKET_IFNAME, ...)
    # say how it reaches the network, which the topology already does.
    modelled = {k: v for k, v in out.environment.items() if k in SUPPORTED}
    ignored = sorted(set(out.environment) - set(modelled))
    if modelled:
        try:
            settings["nccl"] = parse_nccl_env(modelled).text
        except CcsimError as error:
            raise CcsimError(f"{name}: the log's NCCL settings: {error}") from None
    case = Case(name, path, measured, settings)
    if out.ranks is not None:
        # Counted from the preset's numbers where it has them: --nodes 100000 is then
        # told that it does not match, not built first.
        topology, servers = case_topology(case)
        size = preset_size(topology)
        gpus = size[0] * servers if size else len(gpu_nodes(case_graph(case)))
        if gpus != out.ranks:
            raise CcsimError(
                f"{name}: {out.ranks} ranks ran on {len(out.hosts) or '?'} host(s), but "
                f"{preset} x {nodes} has {gpus} GPUs; pass --nodes N (or --topology) to match"
            )
    if notify is not None:
        skipped = f"; skipped {len(out.skipped)} garbled row(s)" if out.skipped else ""
        if "nccl" in settings:
            skipped += f"; NCCL settings from the log: {settings['nccl']}"
        if ignored:
            skipped += f"; not modelled, ignored: {', '.join(ignored)}"
        notify(
            f"{name}: {op}, {out.ranks or '?'} ranks, {settings['gpus_per_process']} GPU(s) "
            f"per process, {', '.join(out.gpus) or 'GPU not named'}: --topology {preset} "
            f"--nodes {nodes}{skipped}"
        )
    return case


def guess_preset(gpus: Sequence[str], where: str = "log") -> str:
    """The one bundled preset whose GPU model is ``gpus``' (CUDA's device names).

    A model matches when its chip names agree (``A100``, ``H100``, ``RTX 5090``) and so
    does the form factor where the device names one (``H100 PCIe`` is not an SXM part);
    memory sizes are ignored.

    >>> guess_preset(["NVIDIA H100 80GB HBM3"])
    'dgx-h100'
    >>> guess_preset(["NVIDIA GeForce RTX 5090"])
    'pcie-8gpu'
    """
    option = "pass --topology NAME or a preset file (ccsim topologies lists them)"
    if not gpus:
        raise CcsimError(f"{where}: names no GPU (no '#  Rank' lines); {option}")
    if len(gpus) > 1:
        raise CcsimError(f"{where}: GPUs differ ({', '.join(gpus)}); {option}")
    chip, form = _model(gpus[0])
    found, cloud = [], []
    for name, path in preset_files().items():
        server = read_preset(path)["server"]
        model = server.get("gpu", {}).get("model")
        if model is None:
            continue
        preset_chip, preset_form = _model(str(model))
        if preset_chip == chip and (form == preset_form or (form is None and preset_form)):
            # A cloud machine with its own network stack (Google's A3: TCPX/TCPXO) has
            # the same GPU as the servers it is built like; a log names no stack, so the
            # guess is the InfiniBand server and the cloud preset is asked for by name.
            nic = server.get("nic") or {}
            stack = nic.get("stack", DEFAULT_STACK) if isinstance(nic, dict) else DEFAULT_STACK
            (found if stack == DEFAULT_STACK else cloud).append(name)
    found = found or cloud
    if len(found) != 1:
        which = f"fits presets {', '.join(found)}" if found else "fits no bundled preset"
        raise CcsimError(f"{where}: GPU {gpus[0]!r} {which}; {option}")
    return found[0]


def _model(name: str) -> tuple[frozenset[str], str | None]:
    """(chip tokens, form factor) of a GPU name: 'NVIDIA A100-SXM4-40GB' -> ({A100}, SXM4)."""
    tokens = [t for t in re.split(r"[\s\-_]+", name.upper()) if t and not _DROPPED.match(t)]
    forms = [t for t in tokens if _FORMS.match(t)]
    return frozenset(t for t in tokens if not _FORMS.match(t)), (forms[0] if forms else None)


def _topology_argument(topology: str) -> str:
    """``--topology``: a preset name, or a file made absolute (cases resolve names beside
    their file)."""
    path = Path(topology)
    if path.suffix in (".yaml", ".yml", *GRAPH_SUFFIXES) and path.is_file():
        return str(path.resolve())
    return topology


def case_loaders(
    folder: Path | str | None = None,
    logs: Iterable[Path | str] = (),
    **log_settings,
) -> list[tuple[str, Callable[[], Case]]]:
    """(name, loader) of every case to run: the sidecars of ``folder`` (the bundled cases
    when neither a folder nor a log is given), then each log; ``log_settings`` go to
    :func:`log_case`."""
    logs = [Path(log) for log in logs]
    loaders: list[tuple[str, Callable[[], Case]]] = []
    if folder is not None or not logs:
        loaders += [(s.stem, partial(load_case, s)) for s in sidecars(folder)]
    loaders += [(log.name, partial(log_case, log, **log_settings)) for log in logs]
    return loaders
