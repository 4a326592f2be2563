"""``ccsim validate``: simulate measured nccl-tests runs and report the error.

A validation folder holds pairs ``NAME.csv`` + ``NAME.yaml``. The CSV is nccl-tests
output transcribed as ``bytes,time_us_oop,algbw_oop,busbw_oop,time_us_ip,algbw_ip,
busbw_ip``; the YAML sidecar says what ran::

    preset: dgx-a100        # topology preset (or a preset file next to the sidecar)
    nodes: 1
    op: all_reduce
    algorithm: nccl         # nccl: NCCL's own choice per size (the default); a ccsim
                            # algorithm (ring, ...); or auto (the fastest, by simulation)
    nccl_algo: Ring         # optional, with nccl: the algorithms NCCL_ALGO allowed
    nccl: NCCL_PROTO=Simple # optional, with nccl: NCCL's environment settings (text or
                            # a mapping; simulator/library/nccl_env.py)
    nccl_version: 2.28.7    # optional, with nccl: the version that ran, for the rules of
                            # its all-to-all (simulator/library/nccl_p2p.py)
    protocol: auto          # LL, LL128, Simple or auto (the fastest, as NCCL's tuner)
    channels: 24            # optional: forced channel count (NCCL_MIN_CTAS), or auto
    chunks: 1               # optional: pipelining chunks (ccsim's), or auto
    gpus_per_process: 8     # nccl-tests -g: kernel launches one process issues per call
    column: best            # optional: best (the faster of the two runs of a size, the
                            # default), oop (out-of-place) or ip (in-place)

A preset file named by a sidecar may sit in the same folder (it is not a sidecar: it has
a ``server`` section). nccl-tests reports the mean of back-to-back calls: the host issues
call i+1 (one kernel launch per GPU it drives) while the GPUs still run call i, so the
simulated time of a call is the larger of the host's issue time (``gpus_per_process`` x
the preset's ``launch``) and the GPUs' time.

Reported per case: median and max absolute error of busbw for sizes >= 1 MiB and of
time for sizes <= 64 KiB, as percentages of the measured value. The bundled cases are
thirty-four public nccl-tests runs: the four runs of shared/reference/nccl-tests, eight
more (H100 on 1 to 8 servers, A100 on 2 over RoCE), six GB300 runs on parts of an
NVL72 rack (all-reduce and all-to-all on 4, 8 and 64 GPUs), five across servers or on
B300 (all-gather on 2 B200 servers; all-reduce and all-to-all on 1 and 2 B300 servers),
six on GB200 (4, 8, 64 and 72 GPUs of an NVL72 rack), two on Google A3 Mega (H100,
GPUDirect-TCPXO) and three bundled for issue 32 (a DGX H100, an Azure H200 server, 4
Azure GB200 GPUs), each sidecar citing its source. A sidecar's ``algorithm`` defaults
to ``nccl``: what NCCL runs with no environment set.

Raw nccl-tests output (stdout or ``-J`` JSON) needs no sidecar: see :mod:`~.log_cases`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from ..algorithms import build_schedule
from ..collective.guards import check_collective
from ..collective.policy import NcclPolicy
from ..collective.run import COLLECTIVE_OPS, bus_factor, rank_layout, run_schedule
from ..collective.tuner import AutoTuner
from ..errors import CcsimError, shown
from ..files import load_data, read_text
from ..library.nccl import LL_FITTED_TO, NVLS_FITTED_TO
from ..library.nccl_env import NcclEnv, parse_nccl_env
from ..library.nccl_p2p import P2P_FITTED_TO
from ..library.protocol import PROXY_FITTED_TO, Calibration, calibration_of
from ..topology import load_topology
from ..topology.stacks import TCPXO_FITTED_TO
from ..units import MAX_SIZE
from .pool import TaskPool

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "nccl-tests"
_KEYS = {
    "preset",
    "nodes",
    "op",
    "algorithm",
    "protocol",
    "channels",
    "chunks",
    "gpus_per_process",
    "nccl_algo",
    "nccl",
    "nccl_version",
    "column",
    "csv",
}
MIB = 2**20
SMALL = 64 * 2**10


@dataclass
class Case:
    """One measured run and how to simulate it."""

    name: str
    sidecar: Path
    measured: list[tuple[int, float, float]]  # bytes, time (us), busbw (GB/s)
    settings: dict[str, Any]


@dataclass
class CaseResult:
    """Measured and simulated figures of one case, or the error that stopped it."""

    name: str
    sizes: list[int] = field(default_factory=list)
    measured_us: list[float] = field(default_factory=list)
    measured_busbw: list[float] = field(default_factory=list)
    simulated_us: list[float] = field(default_factory=list)
    simulated_busbw: list[float] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=list)
    channels: list[int] = field(default_factory=list)
    #: NCCL's own predicted time (us) of the pair it picked, per size: its tuning model
    #: (latency + bytes / bandwidth, ncclTopoGetAlgoTime), without ccsim's simulation or
    #: the host's issue time; None where NCCL's tuner did not choose (forced ccsim
    #: algorithms, all-to-all). Measured over this tells a miss NCCL's own model shares
    #: from one that is ccsim's.
    nccl_model_us: list[float | None] = field(default_factory=list)
    error: str = ""
    #: The same run predicted without its own measurements: simulated with constants
    #: fitted on the other cases only (see :mod:`simulator.validate.calibrate`). None
    #: where the preset was not fitted to this run: the result above is then already
    #: a prediction.
    loco: CaseResult | None = None
    loco_source: str = ""
    #: Whether the preset's constants were fitted to this run (its ``fitted_to``).
    fitted: bool = False

    def errors(self, what: str) -> np.ndarray:
        """Absolute relative errors: busbw for sizes >= 1 MiB ("busbw") or 1-32 MiB
        ("mid"), time for <= 64 KiB ("time")."""
        sizes = np.array(self.sizes)
        if what in ("busbw", "mid"):
            keep = sizes >= MIB if what == "busbw" else (sizes >= MIB) & (sizes <= 32 * MIB)
            sim, meas = np.array(self.simulated_busbw), np.array(self.measured_busbw)
        else:
            keep = sizes <= SMALL
            sim, meas = np.array(self.simulated_us), np.array(self.measured_us)
        keep &= meas > 0
        return np.abs(sim[keep] - meas[keep]) / meas[keep]

    def summary(self) -> dict[str, Any]:
        """Row of the report: medians and maxima in percent (None where no size applies)."""
        row: dict[str, Any] = {"case": self.name, "error": self.error}
        left_out = self.loco if self.loco is not None else None if self.fitted else self
        for what in ("busbw", "time", "mid"):
            values = self.errors(what) if not self.error else np.zeros(0)
            row[f"{what}_points"] = len(values)
            row[f"{what}_median_pct"] = float(np.median(values) * 100) if len(values) else None
            row[f"{what}_max_pct"] = float(np.max(values) * 100) if len(values) else None
            values = left_out.errors(what) if left_out and not self.error else np.zeros(0)
            row[f"loco_{what}_median_pct"] = float(np.median(values) * 100) if len(values) else None
        row["loco_source"] = self.loco_source or (
            "not computed (ccsim validate --loco)" if self.fitted else "not fitted to this run"
        )
        return row


def load_case(sidecar: Path) -> Case:
    """Read a sidecar and its CSV; errors name the file and the field."""
    settings = load_data(sidecar, what="sidecar", fmt="yaml") or {}
    if not isinstance(settings, dict):
        raise CcsimError(f"{sidecar.name}: a sidecar is a mapping of settings")
    unknown = sorted(set(settings) - _KEYS)
    if unknown:
        raise CcsimError(
            f"{sidecar.name}: unknown key {shown(unknown[0])}; valid: " + ", ".join(sorted(_KEYS))
        )
    if "preset" not in settings:
        raise CcsimError(f"{sidecar.name}: 'preset' is missing; name the topology preset")
    for key in ("preset", "op", "algorithm", "protocol", "csv", "column", "nccl_version"):
        if key in settings and not isinstance(settings[key], str):
            raise CcsimError(f"{sidecar.name}: {key} must be a name, got {shown(settings[key])}")
    if "op" in settings and settings["op"] not in COLLECTIVE_OPS:
        raise CcsimError(
            f"{sidecar.name}: op {shown(settings['op'])} is not an operation ccsim runs; "
            f"valid: {', '.join(COLLECTIVE_OPS)}"
        )
    for key in ("nodes", "gpus_per_process"):
        value = settings.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CcsimError(
                f"{sidecar.name}: {key} must be a positive integer, got {shown(value)}"
            )
    table = sidecar.parent / str(settings.get("csv", sidecar.stem + ".csv"))
    column = str(settings.get("column", "best"))
    if column not in ("oop", "ip", "best"):
        raise CcsimError(f"{sidecar.name}: column must be best, oop or ip, got {shown(column)}")
    measured = []
    text = read_text(table, what=f"nccl-tests table of {sidecar.name}")
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        fields = set(reader.fieldnames or ())
        columns = [column] if column != "best" else ["oop", "ip"]
        if column == "best" and not {"time_us_ip", "busbw_ip"} <= fields:
            columns = ["oop"]
        need = {"bytes"} | {f"{key}_{c}" for c in columns for key in ("time_us", "busbw")}
        if not need <= fields:
            raise CcsimError(f"{table.name}: header must include {', '.join(sorted(need))}")
        for line, row in enumerate(reader, start=2):
            size = _size_cell(row.get("bytes"), f"{table.name}:{line}: bytes")
            try:
                # "best": the faster of the out-of-place and in-place runs of a size. Both
                # run the same algorithm (nccl-tests only changes the output buffer), so
                # the slower one differs by noise: a late warm-up or a busy host (e.g.
                # 317 against 93 us at 1 MiB in H100-4N-AR-default-clusterB).
                measured.append(
                    min(
                        (size, float(row[f"time_us_{c}"]), float(row[f"busbw_{c}"]))
                        for c in columns
                    )
                )
            except (TypeError, ValueError):
                raise CcsimError(f"{table.name}:{line}: not a number in {shown(row)}") from None
    except csv.Error as error:
        raise CcsimError(f"{table.name}: not a CSV table: {error}") from None
    if not measured:
        raise CcsimError(f"{table.name}: no measurements")
    return Case(sidecar.stem, sidecar, measured, settings)


def _size_cell(text: str | None, where: str) -> int:
    """A message size of a measurements table: a whole number of bytes, 1 to 1 TiB (as
    nccl-tests prints them), or an error naming ``where`` (file, line and column)."""
    try:
        size = int(str(text).strip())
    except ValueError:
        raise CcsimError(
            f"{where}: {shown(text)} is not a whole number of bytes (nccl-tests prints "
            "sizes such as 1048576)"
        ) from None
    if not 1 <= size <= MAX_SIZE:
        raise CcsimError(f"{where}: {size} is not a size from 1 byte to 1 TiB")
    return size


def case_topology(case: Case) -> tuple[str | Path, int]:
    """The topology a case ran on (a bundled preset, or a preset file next to the
    sidecar) and its server count."""
    s = case.settings
    preset = str(s["preset"])
    local = case.sidecar.parent / preset
    topology = local if local.suffix in (".yaml", ".yml") and local.is_file() else preset
    return topology, int(s.get("nodes", 1))


def case_graph(case: Case):
    """The topology a case ran on, built."""
    return load_topology(*case_topology(case))


def check_case(case: Case, max_flows: int | None = None, *, nvls_tree_loops: bool = False) -> None:
    """Refuse a case whose runs would pass the resource guard's limit (a sidecar with
    ``nodes: 100000``), before its topology is built (``nvls_tree_loops``: as
    :func:`run_case`)."""
    s = case.settings
    topology, nodes = case_topology(case)
    check_collective(
        topology,
        str(s.get("op", "all_reduce")),
        [size for size, *_ in case.measured],
        [str(s.get("algorithm", "nccl"))],
        nodes=nodes,
        chunks=count_setting(case, "chunks") if "chunks" in s else None,
        channels=count_setting(case, "channels") if "channels" in s else None,
        protocol=str(s.get("protocol", "auto")),
        max_flows=max_flows,
        nccl=_nccl_env(case) if str(s.get("algorithm", "nccl")) == "nccl" else None,
        nvls_tree_loops=nvls_tree_loops,
    )


def run_case(
    case: Case,
    calibration: Calibration | None = None,
    *,
    max_flows: int | None = None,
    progress: Callable[[int], None] | None = None,
    graph: nx.Graph | None = None,
    nvls_tree_loops: bool = False,
) -> CaseResult:
    """Simulate every size of a case with the preset's calibrated model (or with
    ``calibration`` instead of the preset's constants); ``max_flows`` is the resource
    guard's limit (:func:`check_case`); ``progress``, if given, is called with each size
    (bytes) once it has run; ``graph``, if given, replaces the case's topology (built
    with one figure changed, as a leave-one-out fit does; it is copied, not changed);
    ``nvls_tree_loops`` runs NVLSTree as deep as NCCL's loop (:class:`NcclPolicy`)."""
    s = case.settings
    check_case(case, max_flows, nvls_tree_loops=nvls_tree_loops)
    graph = case_graph(case) if graph is None else graph.copy()
    fitted = (
        case.name in calibration_of(graph).fitted_to
        or case.name in PROXY_FITTED_TO
        or case.name in NVLS_FITTED_TO
        or case.name in LL_FITTED_TO
        or case.name in P2P_FITTED_TO
        or case.name in TCPXO_FITTED_TO
    )
    if calibration is None:
        calibration = calibration_of(graph)
    per_process = int(s.get("gpus_per_process", 1))
    # nccl-tests reports the mean of back-to-back calls: the host issues call i+1 (one
    # kernel launch per GPU it drives) while the GPUs still run call i, so a call costs
    # the larger of the host's issue time and the GPUs' time, not their sum.
    issue_s = calibration.launch_s * per_process
    graph.graph["nccl"] = dataclasses.replace(calibration, launch_s=0.0)
    layout = rank_layout(graph)
    op = str(s.get("op", "all_reduce"))
    result = CaseResult(case.name, fitted=fitted)
    algorithm, protocol = str(s.get("algorithm", "nccl")), str(s.get("protocol", "auto"))
    chunks, channels = (count_setting(case, key) for key in ("chunks", "channels"))
    tuner = None
    policy = None
    if algorithm == "nccl":
        # What NCCL runs with no environment set; a forced channel count or protocol
        # (NCCL_MIN_CTAS, NCCL_PROTO) is honoured, chunks follow NCCL's pipeline.
        policy = NcclPolicy(
            protocol=protocol,
            channels=None if channels in ("auto", None) or "channels" not in s else channels,
            chunks=None if "chunks" not in s or chunks == "auto" else chunks,
            algorithms=_nccl_algo(case, op),
            env=_nccl_env(case),
            version=s.get("nccl_version"),
            nvls_tree_loops=nvls_tree_loops,
        )
    elif "auto" in (algorithm, chunks, channels):
        tuner = AutoTuner(channels=channels, protocol=protocol)
    for size, time_us, busbw in case.measured:
        if policy is not None:
            run = policy.simulate(graph, op, float(size))
        elif tuner is not None:
            run = tuner.simulate(graph, op, float(size), algorithm=algorithm, chunks=chunks)
        else:
            schedule = build_schedule(
                algorithm, op, layout, float(size), chunks=chunks, channels=channels
            )
            run = run_schedule(graph, schedule, protocol=protocol)
        seconds = max(run.time_s, issue_s)
        result.sizes.append(size)
        result.measured_us.append(time_us)
        result.measured_busbw.append(busbw)
        result.simulated_us.append(seconds * 1e6)
        result.simulated_busbw.append(size / seconds / 1e9 * bus_factor(op, layout.ranks))
        result.protocols.append(str(run.params.get("protocol")))
        result.algorithms.append(str(run.params.get("nccl_algorithm", run.algorithm)))
        result.channels.append(
            int(run.params.get("channels", channels if channels != "auto" else 1))
        )
        model_us = run.params.get("nccl_time_us")
        result.nccl_model_us.append(None if model_us is None else float(model_us))
        if progress is not None:
            progress(size)
    return result


def _nccl_env(case: Case) -> NcclEnv:
    """A case's NCCL settings (a sidecar's ``nccl``, or those a log reports)."""
    try:
        return parse_nccl_env(case.settings.get("nccl"))
    except CcsimError as error:
        raise CcsimError(f"{case.sidecar.name}: nccl: {error}") from None


def _nccl_algo(case: Case, op: str = "all_reduce") -> list[str] | None:
    """A sidecar's ``nccl_algo``: the algorithms NCCL_ALGO allowed (default all); with
    ``nccl``'s NCCL_ALGO too, the two must allow the same for ``op``."""
    value = case.settings.get("nccl_algo")
    if value is None:
        return None
    env = _nccl_env(case)
    if env.algorithms is not None:
        names = [value] if isinstance(value, str) else value
        mine = {str(n).lower() for n in names} if isinstance(names, list) else set()
        theirs = {n.lower() for n in env.algorithms_for(op) or ()}
        if mine != theirs:
            raise CcsimError(
                f"{case.sidecar.name}: nccl_algo {value} disagrees with "
                f"NCCL_ALGO={env.value('NCCL_ALGO')} for {op}: give one of them"
            )
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CcsimError(f"{case.sidecar.name}: nccl_algo must be a name or a list of names")
    return names


def count_setting(case: Case, key: str) -> int | str:
    """A sidecar's ``chunks`` or ``channels``: a positive integer or "auto" (default 1)."""
    value = case.settings.get(key, 1)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise CcsimError(
        f"{case.sidecar.name}: {key} must be a positive integer or auto, not {shown(value)}"
    )


def _is_preset(path: Path) -> bool:
    """A topology preset placed beside the sidecars (it has a ``server`` section)."""
    try:
        data = load_data(path, what="sidecar", fmt="yaml")
    except CcsimError:
        return False  # reported when read as a sidecar
    return isinstance(data, dict) and "server" in data and "preset" not in data


def sidecars(folder: Path | str | None = None) -> list[Path]:
    """The sidecar files of a validation folder (default: the bundled cases); topology
    presets the sidecars name may sit beside them."""
    folder = Path(folder) if folder is not None else BUNDLED
    if not folder.is_dir():
        raise CcsimError(f"validation folder {str(folder)!r} not found")
    found = [
        p for p in sorted(folder.iterdir()) if p.suffix in (".yaml", ".yml") and not _is_preset(p)
    ]
    if not found:
        raise CcsimError(f"{folder}: no sidecar .yaml files (each names a .csv and a preset)")
    return found


def validate_folder(
    folder: Path | None = None, *, max_flows: int | None = None
) -> list[CaseResult]:
    """Run every case of a folder (default: the bundled cases).

    A case whose files are malformed, that names an unknown preset or that would pass
    the resource guard's limit gives a result with ``error`` set; the others still run.
    """
    loaders = ((sidecar.stem, partial(load_case, sidecar)) for sidecar in sidecars(folder))
    return run_cases(loaders, max_flows=max_flows)


def run_cases(
    loaders: Iterable[tuple[str, Callable[[], Case]]],
    *,
    max_flows: int | None = None,
    progress: Callable[[str, int | None], None] | None = None,
    jobs: int = 1,
    nvls_tree_loops: bool = False,
) -> list[CaseResult]:
    """Load and simulate each (name, loader) case; one that cannot load or run gives a
    result with ``error`` set, and the others still run (``nvls_tree_loops``: as
    :func:`run_case`). ``progress``, if given, is
    called with (name, None) as a case starts and (name, bytes) after each of its sizes
    (the command line draws a bar from it); with ``jobs`` > 1 the cases' sizes run in
    that many processes, and ``progress`` hears (name, bytes) as each size ends and
    (name, None) as a case's last size does."""
    if jobs > 1:
        return _run_cases_pooled(list(loaders), max_flows, progress, jobs, nvls_tree_loops)
    results = []
    for name, load in loaders:
        if progress is not None:
            progress(name, None)
        done = None if progress is None else partial(progress, name)
        try:
            results.append(
                run_case(
                    load(), max_flows=max_flows, progress=done, nvls_tree_loops=nvls_tree_loops
                )
            )
        except CcsimError as error:
            results.append(CaseResult(name, error=str(error)))
    return results


def _run_case_or_error(
    case: Case, max_flows: int | None, nvls_tree_loops: bool = False
) -> CaseResult:
    try:
        return run_case(case, max_flows=max_flows, nvls_tree_loops=nvls_tree_loops)
    except CcsimError as error:
        return CaseResult(case.name, error=str(error))


def _run_cases_pooled(
    loaders: list[tuple[str, Callable[[], Case]]],
    max_flows: int | None,
    progress: Callable[[str, int | None], None] | None,
    jobs: int,
    nvls_tree_loops: bool = False,
) -> list[CaseResult]:
    """:func:`run_cases` in ``jobs`` processes: cases load here (their loaders may not
    travel to another process), run there, and come back in order. A case with several
    sizes runs as ``jobs`` parts (:func:`case_parts`), so that one long case, such as 20
    NVL72 racks, spreads over every process; each size is simulated exactly as in one
    process. ``progress`` hears (name, bytes) for each size of a part as it ends and
    (name, None) as the case's last part does."""
    cases: list[Case | CaseResult] = []
    for name, load in loaders:
        try:
            cases.append(load())
        except CcsimError as error:
            cases.append(CaseResult(name, error=str(error)))
    parts = {k: case_parts(case, jobs) for k, case in enumerate(cases) if isinstance(case, Case)}
    left = {k: len(split) for k, split in parts.items()}

    def ended(_done: int, _total: int, label: str) -> None:
        k, i = (int(v) for v in label.split(":"))
        left[k] -= 1
        if progress is not None:
            name = cases[k].name
            for size, *_ in parts[k][i].measured:
                progress(name, size)
            if not left[k]:
                progress(name, None)

    pool = TaskPool(jobs, sum(left.values()), ended)
    try:
        futures = {
            (k, i): pool.submit(_run_case_or_error, (part, max_flows, nvls_tree_loops), f"{k}:{i}")
            for k, split in parts.items()
            for i, part in enumerate(split)
        }
        results = []
        for k, case in enumerate(cases):
            if isinstance(case, CaseResult):
                results.append(case)
                continue
            done = [pool.get(futures[k, i]) for i in range(len(parts[k]))]
            results.append(join_results(case, done))
        return results
    finally:
        pool.close()


def case_parts(case: Case, count: int) -> list[Case]:
    """A case cut into at most ``count`` cases, each simulated as :func:`run_case`
    simulates its sizes within the whole (sizes share no state): the largest size goes
    to the first part, the next largest to the second, and so on round, so that the
    parts take about as long; each keeps the case's order.

    >>> case = Case("c", Path("c.yaml"), [(s, 1.0, 1.0) for s in (8, 64, 512, 4096)], {})
    >>> [[row[0] for row in part.measured] for part in case_parts(case, 2)]
    [[64, 4096], [8, 512]]
    """
    rows = case.measured
    rank = sorted(range(len(rows)), key=lambda i: -rows[i][0])
    share = {i: position % count for position, i in enumerate(rank)}
    parts = [[row for i, row in enumerate(rows) if share[i] == j] for j in range(count)]
    return [dataclasses.replace(case, measured=part) for part in parts if part]


def join_results(case: Case, parts: list[CaseResult]) -> CaseResult:
    """The result of ``case`` from those of its :func:`case_parts`, size by size in the
    case's order; the first part's error, if any part has one."""
    failed = [part for part in parts if part.error]
    if failed:
        return CaseResult(case.name, error=failed[0].error)
    keys = (
        "sizes", "measured_us", "measured_busbw", "simulated_us", "simulated_busbw",
        "protocols", "algorithms", "channels", "nccl_model_us",
    )  # fmt: skip
    joined = CaseResult(case.name, fitted=parts[0].fitted)
    at = [0] * len(parts)
    for size, time_us, busbw in case.measured:
        j = next(
            j
            for j, part in enumerate(parts)
            if at[j] < len(part.sizes)
            and (part.sizes[at[j]], part.measured_us[at[j]], part.measured_busbw[at[j]])
            == (size, time_us, busbw)
        )
        for key in keys:
            getattr(joined, key).append(getattr(parts[j], key)[at[j]])
        at[j] += 1
    return joined
